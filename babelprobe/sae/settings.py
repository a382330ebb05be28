"""The settings of `babelprobe sae` and `babelprobe sae train`: the options that change their numbers,
declared once (`babelprobe.settings.option`), without importing torch (the CLI builds its flags from them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from babelprobe.errors import BabelprobeError
from babelprobe.settings import as_tuple, at_least, one_of, option

DEFAULT_KS = (1, 2, 4, 8, 16, 32, 64, 128)


ABLATE_MODES = ("subtract", "projection")
# Deng et al.'s ablation (released SAE/inference.py): each decoder direction's projection removed, of the
# language's single most specific feature (the first of the release README's Section 5 runs, `--start_idx 0
# --topk_feature_num 1`; the other two, top 2 and the second alone, are --ablate 2 and --ablate 1 --ablate-from 1
# with --ablate-mode projection)
PROTOCOLS = {"paper": {"ablate_mode": "projection", "ablate": 1, "ablate_from": 0}}


@dataclass(frozen=True)
class Settings:
    """What changes the numbers of `babelprobe sae` (recorded in sae.json)."""

    PROTOCOLS: ClassVar[dict] = PROTOCOLS
    protocol: str = option("default", "paper: Deng et al.'s projection ablation of each language's most specific "
                           "feature; default: babelprobe's subtraction of its 8 most specific")

    layers: str | None = option(None, "the layer the SAE reads when its folder does not say (N: block N's output)",
                                metavar="N", flag="--layers", aliases=("--layer",))
    top: int = option(100, "features.csv: every language's row of each feature among some language's TOP most "
                      "specific (0: every feature)", metavar="TOP")
    ks: tuple[int, ...] = option(DEFAULT_KS, "numbers of features of the sparse probes", metavar="LIST")
    folds: int = option(5, "cross-validation folds of the sparse and dense probes", metavar="K")
    seed: int = option(0, "seed of the folds and the random feature sets")
    ablate: int = option(8, "features removed per language: its most specific by ν (0: no ablation)", metavar="N")
    ablate_from: int = option(0, "features skipped before those removed: --ablate N removes ranks R+1 .. R+N by ν "
                              "(Deng et al.'s start_idx)", metavar="R")
    n_random: int = option(3, "random feature sets of the same size, as controls", metavar="N", flag="--random")
    ablate_mode: str = option("subtract", "the ablation: remove f_s(x)·W_dec[s] at every token but BOS (subtract) or "
                              "the projection of x onto each W_dec[s] at every token (projection: Deng et al.)",
                              choices=ABLATE_MODES)

    def __post_init__(self):
        try:
            object.__setattr__(self, "ks", tuple(sorted({int(k) for k in as_tuple(self.ks)})))
        except ValueError as err:
            raise BabelprobeError(f"--ks: cannot read {self.ks!r}; use numbers like 1,8,64") from err
        if not self.ks or self.ks[0] < 1:
            raise BabelprobeError(f"--ks needs numbers of at least 1, got {self.ks}")
        at_least(self, "folds", 2)
        one_of(self, "ablate_mode", ABLATE_MODES)
        one_of(self, "protocol", ("default", *PROTOCOLS))
        for name in ("top", "ablate", "ablate_from", "n_random"):
            at_least(self, name, 0)
        if self.layers is not None:
            object.__setattr__(self, "layers", str(self.layers))


TRAIN_ARCHITECTURES = ("topk", "jumprelu", "standard")


@dataclass(frozen=True)
class TrainSettings:
    """What changes the weights of `babelprobe sae train` (recorded in OUT/training.json; `sae.train`)."""

    layers: str | None = option(None, "the one layer whose states to train on (6: block 6's output)", metavar="N",
                                flag="--layers", aliases=("--layer",))
    architecture: str = option("topk", "topk, jumprelu or standard (L1 ReLU), trained as SAELens trains them",
                               choices=TRAIN_ARCHITECTURES)
    width: int = option(4096, "number of features (d_sae)", metavar="N")
    k: int = option(64, "topk: features active per token", metavar="K")
    l1: float = option(5.0, "sparsity coefficient λ: the L1 penalty (standard) or the L0 penalty (jumprelu); topk "
                       "has none", metavar="λ")
    tokens: int = option(2_000_000, "token states trained on (the corpus runs again when it runs out)", metavar="N")
    batch_size: int = option(1024, "token states per optimiser step", metavar="N")
    lr: float = option(1e-3, "Adam learning rate (constant, then decayed linearly to a tenth over the last fifth "
                       "of steps)", metavar="LR")
    window: int = option(128, "text tokens per row the corpus is packed into (BOS added to each; SAELens' "
                         "context_size)", metavar="N")
    seed: int = option(0, "seed of the initialisation and the order of the token states")
    dead_feature_window: int = option(200, "steps without firing after which a feature counts as dead (its "
                                      "auxiliary loss, topk)", cli=False)

    def __post_init__(self):
        one_of(self, "architecture", TRAIN_ARCHITECTURES)
        for name, minimum in (("width", 1), ("k", 1), ("tokens", 1), ("batch_size", 1), ("window", 1),
                              ("dead_feature_window", 1)):
            at_least(self, name, minimum)
        if self.architecture == "topk" and self.k > self.width:
            raise BabelprobeError(f"--k {self.k} must not exceed --width {self.width}")
        if self.tokens < self.batch_size:
            raise BabelprobeError(f"--tokens {self.tokens} is less than one --batch-size {self.batch_size}")
        if self.l1 < 0 or self.lr <= 0:
            raise BabelprobeError(f"--l1 must be 0 or more and --lr positive, got {self.l1} and {self.lr}")
        if self.layers is not None:
            object.__setattr__(self, "layers", str(self.layers))
