"""The one grammar for choosing layers, used by `extract`, `probe` and every command with `--layers`.

Layers are numbered as in docs/design.md: 0 is the embedding output, i (1..L) the output of block i,
before the final norm. A selection is `all` (or None), a number, a list of numbers, or a string of
numbers and ranges such as `0-4,12`. Where probe results give each group a peak layer, `peak` selects it
(`layer_choice`: the one place `peak` is parsed; the caller looks the peak up per group).
"""

from __future__ import annotations

import numpy as np

from babelprobe.errors import BabelprobeError


def parse_layers(spec, available, stored: bool = False) -> list[int]:
    """The sorted, distinct layers that `spec` selects, checked against `available`.

    `available` is L (meaning 0..L: a model's layers) or a list of layer numbers; `stored=True` says
    they are a store's layers, which the error message then names."""
    available = list(range(available + 1)) if isinstance(available, (int, np.integer)) else [int(x) for x in available]
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        return available
    wanted = check_spec(spec)
    missing = [x for x in wanted if x not in available]
    if missing and stored:
        raise BabelprobeError(f"--layers {spec!r}: layer {missing[0]} is not in the store; stored layers: "
                              f"{_describe(available)}")
    if missing:
        raise BabelprobeError(f"--layers {spec!r}: layers must lie in 0..{available[-1]} (0 = embeddings, "
                              f"{available[-1]} = last block)")
    return sorted(set(wanted))


def check_spec(spec, peak: bool = False) -> list[int] | str:
    """The layers `spec` names, before any model or store says which exist: a one-line error for a spec
    that cannot be read or selects nothing (`5-2`, `x`, `-1`); "all" (and "peak" when `peak` allows it)
    as given."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        return "all"
    if peak and is_peak(spec):
        return PEAK
    wanted = _read(spec) if isinstance(spec, str) else [int(x) for x in np.atleast_1d(spec)]
    if not wanted:
        raise BabelprobeError(f"--layers {spec!r} selects no layer")
    if min(wanted) < 0:
        raise BabelprobeError(f"--layers {spec!r}: layers are numbered from 0 (the embeddings)")
    return wanted


PEAK = "peak"


def is_peak(spec) -> bool:
    """Whether `spec` asks for each group's peak layer (`peak`; `max`, the XCOMPS wording, too)."""
    return isinstance(spec, str) and spec.strip().lower() in (PEAK, "max")


def layer_choice(spec, available, stored: bool = False) -> str | list[int]:
    """`"peak"` when `spec` asks for each group's peak layer, else the layers it selects (`parse_layers`)."""
    return PEAK if is_peak(spec) else parse_layers(spec, available, stored)


def _read(spec: str) -> list[int]:
    out = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        try:
            if "-" in part[1:]:  # a range; a leading minus is a (bad) negative number, not a range
                lo, hi = part.split("-", 1) if not part.startswith("-") else (part, part)
                if int(hi) < int(lo):
                    raise BabelprobeError(f"--layers {spec!r}: the range {part} runs backwards; write {hi}-{lo}")
                out += list(range(int(lo), int(hi) + 1))
            else:
                out.append(int(part))
        except ValueError as err:
            raise BabelprobeError(f"--layers {spec!r}: {part!r} is not a layer number or range like 0-18") from err
    return out


def _describe(layers: list[int]) -> str:
    if layers and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}"
    return ",".join(map(str, layers)) or "none"
