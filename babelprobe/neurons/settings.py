"""The settings of `babelprobe neurons` (and `bp.language_neurons`): what changes which neurons LAPE
selects, declared once (babelprobe.settings); the CLI builds its flags from them. Importing this module
imports no model code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from babelprobe.errors import BabelprobeError
from babelprobe.settings import as_tuple, at_least, option

# Tang et al.'s released activation.py: the corpus's token stream cut into rows of the model's context
# (window 0 = the model's context here); `--protocol paper` also needs --corpus
PROTOCOLS = {"paper": {"window": 0}}


@dataclass(frozen=True)
class Settings:
    """LAPE's rates (Tang et al. 2024, released identify.py) and how a corpus is cut into rows."""

    PROTOCOLS: ClassVar[dict] = PROTOCOLS

    top_rate: tuple[float, ...] = option((0.01,), "share of all L·I neurons selected, lowest LAPE first (identify.py "
                                         "top_rate); a list selects at each rate, lape.csv's `selected` is the first",
                                         metavar="LIST")
    filter_rate: float = option(0.95, "τ, the quantile of all activation probabilities a neuron must exceed in some "
                                "language to be selected (identify.py filter_rate)", metavar="RATE")
    bar_ratio: float = option(0.95, "a selected neuron belongs to each language whose activation probability "
                              "exceeds this quantile of all probabilities (identify.py activation_bar_ratio)",
                              metavar="RATE")
    window: int = option(512, "--corpus: each language's text is tokenised, joined and cut into rows of this many "
                         "tokens (BOS added to each); 0: the model's context (--protocol paper, activation.py)",
                         metavar="N")
    tokens: int | None = option(None, "--corpus: at most N tokens of each language (activation.py: 99,999,744)",
                                metavar="N")
    protocol: str = option("default", "paper: Tang et al.'s counting (--corpus in rows of the model's context); "
                           "default: rows of --window")

    def __post_init__(self):
        try:
            rates = tuple(float(r) for r in as_tuple(self.top_rate))
        except ValueError as err:
            raise BabelprobeError(f"--top-rate: cannot read {self.top_rate!r}; use rates like 0.01 or 0.01,0.05") from err
        if not rates or not all(0 < r <= 1 for r in rates):
            raise BabelprobeError(f"--top-rate must lie in (0, 1], got {','.join(map(str, rates)) or 'nothing'}")
        object.__setattr__(self, "top_rate", tuple(dict.fromkeys(rates)))
        for name in ("filter_rate", "bar_ratio"):
            value = float(getattr(self, name))
            if not 0 < value <= 1:
                raise BabelprobeError(f"--{name.replace('_', '-')} must lie in (0, 1], got {value}")
            object.__setattr__(self, name, value)
        if self.window != 0:
            at_least(self, "window", 2)
        if self.tokens is not None:
            at_least(self, "tokens", 1)
