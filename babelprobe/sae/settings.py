"""The settings of `babelprobe sae` and `babelprobe sae train`: the options that change their numbers,
declared once (`babelprobe.settings.option`), without importing torch (the CLI builds its flags from them).
"""

from __future__ import annotations

from dataclasses import dataclass

from babelprobe.errors import BabelprobeError
from babelprobe.settings import as_tuple, at_least, option

DEFAULT_KS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Settings:
    """What changes the numbers of `babelprobe sae` (recorded in sae.json)."""

    layers: str | None = option(None, "the layer the SAE reads when its folder does not say (N: block N's output)",
                                metavar="N", flag="--layers", aliases=("--layer",))
    top: int = option(100, "features.csv: every language's row of each feature among some language's TOP most "
                      "specific (0: every feature)", metavar="TOP")
    ks: tuple[int, ...] = option(DEFAULT_KS, "numbers of features of the sparse probes", metavar="LIST")
    folds: int = option(5, "cross-validation folds of the sparse and dense probes", metavar="K")
    seed: int = option(0, "seed of the folds and the random feature sets")
    ablate: int = option(8, "features removed per language: its most specific by ν (0: no ablation)", metavar="N")
    n_random: int = option(3, "random feature sets of the same size, as controls", metavar="N", flag="--random")

    def __post_init__(self):
        try:
            object.__setattr__(self, "ks", tuple(sorted({int(k) for k in as_tuple(self.ks)})))
        except ValueError as err:
            raise BabelprobeError(f"--ks: cannot read {self.ks!r}; use numbers like 1,8,64") from err
        if not self.ks or self.ks[0] < 1:
            raise BabelprobeError(f"--ks needs numbers of at least 1, got {self.ks}")
        at_least(self, "folds", 2)
        for name in ("top", "ablate", "n_random"):
            at_least(self, name, 0)
        if self.layers is not None:
            object.__setattr__(self, "layers", str(self.layers))


@dataclass(frozen=True)
class TrainSettings:
    """What changes the weights of `babelprobe sae train` (recorded in OUT/training.json)."""

    layers: str | None = option(None, "the one layer whose states to train on (6: block 6's output)", metavar="N",
                                flag="--layers", aliases=("--layer",))
    width: int = option(2048, "number of features (d_sae)", metavar="N")
    l1: float = option(1.0, "L1 coefficient λ (larger: sparser codes, worse reconstruction)", metavar="λ")
    steps: int = option(1000, "optimiser steps", metavar="N")
    batch_size: int = option(256, "states per step", metavar="N")
    lr: float = option(3e-3, "Adam learning rate", metavar="LR")
    seed: int = option(0, "seed of the initialisation and the batches")

    def __post_init__(self):
        for name, minimum in (("width", 1), ("steps", 1), ("batch_size", 1)):
            at_least(self, name, minimum)
        if self.l1 < 0 or self.lr <= 0:
            raise BabelprobeError(f"--l1 must be 0 or more and --lr positive, got {self.l1} and {self.lr}")
