"""MultiBLiMP 1.0 (Jumelet, Weissweiler & Bisazza 2025): linguistic minimal pairs in 101 languages, as
lm-evaluation-harness scores them (`lm_eval/tasks/multiblimp/_template_yaml`: choices `[sen, wrong_sen]`,
gold 0, no context, delimiter ""; split `train` of hub `jumelet/multiblimp`, one config per language,
named by its ISO 639-3 code).

**Release layout** (docs/datasets.md "MultiBLiMP"): one TSV per config as the authors write it (pandas
`to_csv(sep="\\t")`, read back with `read_csv(sep="\\t")` as their `src/lm_eval/score.py` does): `sen`,
`wrong_sen`, `phenomenon` (the subset: SV-#, SV-G, SV-P, SP-#, ...), `prefix` (the sentence up to the changed
word; not always filled) and the rest, kept. A file is named after its config (`eng.tsv`) or sits in a folder
named so (`eng/data.tsv`, `eng/train-00000-of-00001.parquet`); .jsonl/.csv/.parquet exports read too.

**Scores.** The LL of each sentence is its log-probability given BOS: the authors' delta is
ll_0 − ll_1 (= ΣNLL(wrong_sen) − ΣNLL(sen)), and their verdict, delta > 0, is `correct` (`--reduction mean`:
the per-token variant). `acc` and `acc_norm` are what the harness reports (its `acc_norm` divides by
characters; `acc_bytes` by bytes).

**Items.** A pair of items per record (label 1 `sen`, 0 `wrong_sen`; `text` the sentence): they go through
`compare`, `score direct` and `extract` unchanged. Where `prefix` begins both sentences the items' `prefix` is
it and `continuation` the rest (`score direct --conditional` scores from the changed word on); elsewhere
the two fields are empty.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from babelprobe.benchmarks import bridges
from babelprobe.benchmarks.bridges import Release, Settings, answerer
from babelprobe.languages import bridge_configs

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NAME", "TITLE", "Settings", "load", "run", "summarize", "format_summary", "answerer", "release"]

NAME = "multiblimp"
TITLE = "MultiBLiMP: linguistic minimal pairs in 101 languages, scored as lm-evaluation-harness does"
HUB_ID = "jumelet/multiblimp"
REQUIRED = ("sen", "wrong_sen")


def _configs() -> pd.DataFrame:

    table = bridge_configs()
    return table[table["dataset"] == NAME].set_index("config")


def language_of(config: str) -> str:
    return _configs().at[config, "language"]


def questions(frame: pd.DataFrame, config: str) -> pd.DataFrame:
    """The release's records as questions: two choices, the grammatical sentence first."""
    import pandas as pd

    bridges.require(frame, REQUIRED, "MultiBLiMP")
    problem = bridges.problems(frame, REQUIRED)
    ids = frame["id"] if "id" in frame.columns else frame.get("Unnamed: 0", pd.Series(range(1, len(frame) + 1)))
    subset = frame["phenomenon"].where(~bridges.blank(frame["phenomenon"]), "all") if "phenomenon" in frame else "all"
    good, bad = frame["sen"].fillna("").astype(str), frame["wrong_sen"].fillna("").astype(str)
    prefixes = frame["prefix"].fillna("").astype(str) if "prefix" in frame.columns else pd.Series("", index=frame.index)
    splits = [[(p, s[len(p):]) for s in (g, b)] if p.strip() and g.startswith(p) and b.startswith(p) and
              len(p) < min(len(g), len(b)) else [(None, None), (None, None)]
              for p, g, b in zip(prefixes, good, bad)]
    return pd.DataFrame({"id": [str(i) for i in ids], "subset": subset, "context": "", "delimiter": "",
                         "choices": [[g, b] for g, b in zip(good, bad)], "gold": 0, "splits": splits,
                         "problem": problem.values, "_source": frame["_source"].values})


@cache
def release() -> Release:
    """How this bridge reads its release (built when first used: the config table is read then)."""
    return Release(name=NAME, title="MultiBLiMP", hub_id=HUB_ID, split="train",
                   configs=tuple(_configs().index), file_split=("train", "data"), questions=questions,
                   language_of=language_of, read_tsv=bridges.read_pandas_tsv,
                   harness_metrics=("acc", "acc_norm"))


def load(source: str | Path = "multiblimp-sample", languages: list[str] | None = None,
         limit: int | None = None) -> pd.DataFrame:
    """The benchmark contract's loader (`bridges.load`): `languages` are configs (`eng`) or item languages (`en`)."""

    return bridges.load(release(), source, languages, limit)


def run(data: pd.DataFrame, models, settings: Settings | None = None, out: Path | None = None,
        progress: bool = True) -> pd.DataFrame:

    return bridges.run(NAME, data, models, settings or Settings(), out, progress)


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    return bridges.summarize(rows)


def format_summary(summary: pd.DataFrame) -> str:
    return bridges.format_summary(summary)
