"""The settings of a probe sweep (`babelprobe probe`, `bp.probe`) and its protocol presets.

`ProbeSettings` holds every option that changes the numbers; `babelprobe probe` makes one flag per field
(`cli.common.add_settings_options`) and `NAME.settings.json` records them. Two protocols:

- `default` (babelprobe's): k-fold cross-validation stratified by label and grouped by pair, so a probe is
  never tested on a sentence whose partner it was trained on;
- `paper` (XCOMPS, He, Nie et al. 2025, §4.2 and the Fig. 2 caption): 5-fold cross-validation stratified
  by label (ours: §4.2 does not say), the two sentences of a pair may fall in different folds; F1 averaged
  over the folds, neuro = the maximum over layers. A flag that contradicts it is an error.

This module imports nothing heavy: the CLI builds its flags from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from babelprobe.errors import BabelprobeError
from babelprobe.settings import as_tuple, at_least, flag, one_of, option

PROTOCOLS = {
    "default": {"fold_scheme": "grouped", "folds": 5},
    "paper": {"fold_scheme": "plain", "folds": 5},  # XCOMPS §4.2, Fig. 2 caption
}
DESCRIPTIONS = {
    "default": "babelprobe default: {folds}-fold cross-validation stratified and grouped by pair, F1 averaged "
               "over folds, neuro at each language × subset's peak layer",
    "paper": "XCOMPS paper (§4.2, Fig. 2): 5-fold cross-validation, stratified by label (ours: §4.2 does not say; "
             "the two sentences of a pair may fall in different folds), F1 averaged over the folds, neuro = the "
             "maximum over layers",
}
SOLVERS = ("torch", "newton", "lbfgs", "plbfgs", "sklearn")  # = solvers.SOLVERS (tested); here without importing torch
CONTROLS = ("shuffle", "hewitt")  # = controls.CONTROLS
POOLS = ("last", "mean")
FOLD_SCHEMES = ("grouped", "plain")


@dataclass(frozen=True)
class ProbeSettings:
    """What changes the numbers of a probe sweep (recorded in NAME.settings.json)."""

    PROTOCOLS: ClassVar[dict] = PROTOCOLS
    protocol: str = option("default", help="paper: XCOMPS's protocol (stratified 5-fold, pairs may be split, F1 "
                           "over folds, max over layers); default: folds that keep each pair together")
    by: tuple[str, ...] = option(("language", "subset"), metavar="LIST",
                                 help="key columns that define the groups")
    layers: str = option("all", metavar="SPEC", help="layers to probe: all, or e.g. 0,6,12-18")
    pool: str = option("last", choices=POOLS, help="pooling to read")
    folds: int = option(5, metavar="K", help="number of cross-validation folds")
    fold_scheme: str = option("grouped", choices=FOLD_SCHEMES,
                              help="grouped: stratified, pairs kept together; plain: XCOMPS's stratified k-fold")
    seed: int = option(0, help="seed of folds, controls and bootstrap")
    n_boot: int = option(1000, metavar="N", help="bootstrap replicates over pairs for intervals (0: none)")
    solver: str = option("torch", choices=SOLVERS,
                         help="torch: batched, all layers and folds of a group at once (exact Newton for small groups, "
                         "L-BFGS for large ones, preconditioned by each layer's Gram when the activations are "
                         "ill-conditioned); newton, lbfgs, plbfgs: that one; sklearn: the reference")
    C: tuple[float, ...] = option((1.0,), flag="--C", metavar="C", type=str,
                                  help="inverse regularisation (scikit-learn's C); a list like 0.01,0.1,1 chooses C per "
                                  "fold and layer by inner cross-validation")
    inner_folds: int = option(3, metavar="K", help="inner folds for a C list")
    controls: tuple[str, ...] = option((), flag="--control", metavar="NAME", type=str,
                                       help="none, shuffle, hewitt or all (the majority baseline is always reported)")
    transfer: bool = option(False, help="also train on each language and test on every other (same subset)")
    dtype: str | None = option(None, flag="--solver-dtype", choices=("float32", "float64"), aliases=("--dtype",),
                                      help="torch dtype of the solver (default float32, scores within ~3e-4 of "
                                      "float64's; float64 for the exact optimum)")
    max_iter: int | None = option(None, cli=False, help="solver iterations (default: the solver's)")
    tol: float | None = option(None, cli=False, help="solver tolerance (default: the solver's)")

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "by", as_tuple(self.by))
        set_(self, "layers", ",".join(map(str, self.layers)) if isinstance(self.layers, (list, tuple)) else
             str(self.layers))
        set_(self, "C", parse_C(self.C))
        set_(self, "controls", parse_controls(self.controls))
        one_of(self, "protocol", list(PROTOCOLS))
        one_of(self, "pool", POOLS)
        one_of(self, "fold_scheme", FOLD_SCHEMES)
        one_of(self, "solver", SOLVERS)
        one_of(self, "dtype", ("float32", "float64"), allow_none=True)
        at_least(self, "folds", 2)
        at_least(self, "inner_folds", 2)
        at_least(self, "n_boot", 0)

    @property
    def description(self) -> str:
        return describe(self)


def describe(settings) -> str:
    """The protocol's description with the folds actually used (the default protocol lets --folds vary)."""
    return protocol_text(settings.protocol, settings.folds)


def protocol_text(protocol: str, folds: int | None = None, otherwise: str = "not one of the presets") -> str:
    """`DESCRIPTIONS[protocol]` with `folds` (5 when unknown) filled in; `otherwise` for an unknown protocol."""
    return DESCRIPTIONS[protocol].format(folds=folds or 5) if protocol in DESCRIPTIONS else otherwise


def parse_C(C) -> tuple[float, ...]:
    """A number, a list, or "0.01,0.1,1" -> sorted tuple of distinct positive floats (more than one:
    nested choice)."""
    values = C.split(",") if isinstance(C, str) else (list(C) if isinstance(C, (list, tuple)) else [C])
    try:
        values = sorted({float(v) for v in values if str(v).strip()})
    except (TypeError, ValueError) as err:
        raise BabelprobeError(f"--C: cannot read {C!r}; use a positive number or a list like 0.01,0.1,1") from err
    if not values or min(values) <= 0 or any(v != v or v == float("inf") for v in values):
        raise BabelprobeError(f"--C must be positive and finite, got {C!r}")
    return tuple(values)


def parse_controls(controls) -> tuple[str, ...]:
    """"none"/None, "all", a name, "shuffle,hewitt" or a list -> tuple of control names."""
    if controls in (None, "none", "", ()):
        return ()
    if controls == "all" or controls == ("all",):
        return CONTROLS
    names = [n for n in as_tuple(controls) if n != "none"]
    unknown = [n for n in names if n not in CONTROLS]
    if unknown:
        raise BabelprobeError(f"{flag(ProbeSettings, 'controls')}: unknown control {unknown[0]!r}; use none, "
                              "shuffle, hewitt or all")
    return tuple(n for n in CONTROLS if n in names)
