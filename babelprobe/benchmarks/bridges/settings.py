"""The light part of the bridges: their settings, `Release` (how a bridge reads its release) and the
contract's `answerer`; no pandas, so `babelprobe bench NAME --help` stays fast."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from babelprobe.errors import BabelprobeError
from babelprobe.settings import one_of, option

if TYPE_CHECKING:
    import pandas as pd

BRIDGES = ("multiblimp", "belebele", "xnli", "pawsx")
HARNESS_SCORED = (*BRIDGES, "lm-eval")  # every benchmark scored as lm-evaluation-harness scores (likelihood only)
REDUCTIONS = ("sum", "mean")


@dataclass(frozen=True)
class Settings:
    """What changes a bridge's numbers (recorded in run.json). The harness's metrics are fixed; only the
    strict `correct` column has a choice."""

    reduction: str = option("sum", choices=REDUCTIONS,
        help="how `correct` reads an option's token log-probs: sum (the harness's LL; the MultiBLiMP authors' "
        "delta) or mean per token (the per-token variant); acc, acc_norm, acc_bytes are always the harness's")

    def __post_init__(self):
        one_of(self, "reduction", REDUCTIONS)


@dataclass(frozen=True)
class Release:
    """How a bridge reads its release: `name` (the benchmark), `title`, the hub id and split the harness
    evaluates, the configs it has, the split's name in file names, and `questions(frame, config)`: the
    release's records as questions (module docstring of each bridge)."""

    name: str
    title: str
    hub_id: str
    split: str
    configs: tuple[str, ...]
    file_split: tuple[str, ...]                       # words naming the split in a release's file names
    questions: Callable[[pd.DataFrame, str], pd.DataFrame]
    language_of: Callable[[str], str]                 # config -> item language
    config_column: str | None = None                  # a column that names each record's config
    read_tsv: Callable[[Path], pd.DataFrame] | None = None
    harness_metrics: tuple[str, ...] = ("acc",)

    def unknown(self, config: str) -> BabelprobeError:
        return BabelprobeError(f"no {self.title} config {config!r}; available: {', '.join(self.configs)}")


def answerer(settings: Settings) -> str:
    return "model"
