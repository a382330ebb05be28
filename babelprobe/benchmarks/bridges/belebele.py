"""Belebele (Bandarkar et al. 2024): 900 reading-comprehension questions on FLORES passages in 122 language
variants, as lm-evaluation-harness scores them (`lm_eval/tasks/belebele/_default_template_yaml`: the
context below, choices A–D after the delimiter " ", the `test` split of hub `facebook/belebele`, one config
per variant, `deu_Latn`).

**Release layout** (docs/datasets.md "Belebele"; the hub repository's `data/README`): one JSON Lines file per
variant, `data/<config>.jsonl`, records `link, question_number, flores_passage, question, mc_answer1–4,
correct_answer_num` (1-based, a string) and `dialect` (the config; else the file's name says it).

**Context** (the harness's `doc_to_text`, character for character):

    P: {flores_passage}\\nQ: {question.strip()}\\nA: {mc_answer1}\\nB: {mc_answer2}\\nC: {mc_answer3}\\nD: {mc_answer4}\\nAnswer:

The options are one letter each, so `acc_norm` ≡ `acc` (and `acc_bytes`). The context is run once for its
four options (KV cache). `parallel_id` = link (split first where the records have one) + question number:
one question in every variant. The item language is ISO 639-1 (else 639-3), with the script where
Belebele has the language twice (`hi-Latn`, `zh-Hant`; data/bridges/configs.csv).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from babelprobe.benchmarks import bridges
from babelprobe.benchmarks.bridges import Release, Settings, answerer
from babelprobe.errors import BabelprobeError
from babelprobe.languages import bridge_configs

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NAME", "TITLE", "Settings", "load", "run", "summarize", "format_summary", "answerer", "release"]

NAME = "belebele"
TITLE = "Belebele: reading comprehension in 122 language variants, scored as lm-evaluation-harness does"
HUB_ID = "facebook/belebele"
ANSWERS = ("mc_answer1", "mc_answer2", "mc_answer3", "mc_answer4")
REQUIRED = ("link", "question_number", "flores_passage", "question", *ANSWERS, "correct_answer_num")
TEMPLATE = "P: {flores_passage}\nQ: {question}\nA: {a}\nB: {b}\nC: {c}\nD: {d}\nAnswer:"
CHOICES = ["A", "B", "C", "D"]


def _configs() -> pd.DataFrame:

    table = bridge_configs()
    return table[table["dataset"] == NAME].set_index("config")


def language_of(config: str) -> str:
    return _configs().at[config, "language"]


def context(record: dict) -> str:
    """The harness's prompt for one record (module docstring)."""
    a, b, c, d = (str(record[k]) for k in ANSWERS)
    return TEMPLATE.format(flores_passage=record["flores_passage"], question=str(record["question"]).strip(),
                           a=a, b=b, c=c, d=d)


def questions(frame: pd.DataFrame, config: str) -> pd.DataFrame:
    """The release's records as questions: the passage, question and answers as context, A–D as choices."""
    import pandas as pd

    bridges.require(frame, REQUIRED, "Belebele")
    problem = bridges.problems(frame, ("flores_passage", "question", *ANSWERS))
    number = frame["correct_answer_num"].astype(str).str.strip().str.removesuffix(".0")
    wrong = ~number.isin(["1", "2", "3", "4"]) & (problem == "")
    if wrong.any():
        row = frame[wrong].iloc[0]
        raise BabelprobeError(f"{row['_source']}: correct_answer_num {row['correct_answer_num']!r} is not 1, 2, 3 "
                              "or 4")
    split = frame["split"].astype(str) + ":" if "split" in frame.columns else ""
    parallel = split + frame["link"].astype(str) + "#" + frame["question_number"].astype(str)
    records = frame.to_dict("records")
    return pd.DataFrame({"id": parallel.values, "parallel_id": parallel.values, "subset": "all",
                         "context": [context(r) if p == "" else "" for r, p in zip(records, problem)],
                         "delimiter": " ", "choices": [CHOICES] * len(frame),
                         "gold": [int(n) - 1 if n in ("1", "2", "3", "4") else -1 for n in number],
                         "problem": problem.values, "_source": frame["_source"].values})


@cache
def release() -> Release:
    """How this bridge reads its release (built when first used: the config table is read then)."""
    return Release(name=NAME, title="Belebele", hub_id=HUB_ID, split="test", configs=tuple(_configs().index),
                   file_split=("test",), questions=questions, language_of=language_of,
                   config_column="dialect", harness_metrics=("acc", "acc_norm"))


def load(source: str | Path = "belebele-sample", languages: list[str] | None = None,
         limit: int | None = None) -> pd.DataFrame:
    """The benchmark contract's loader (`bridges.load`): `languages` are configs (`deu_Latn`) or item
    languages (`de`)."""

    return bridges.load(release(), source, languages, limit)


def run(data: pd.DataFrame, models, settings: Settings | None = None, out: Path | None = None,
        progress: bool = True) -> pd.DataFrame:

    return bridges.run(NAME, data, models, settings or Settings(), out, progress)


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    return bridges.summarize(rows)


def format_summary(summary: pd.DataFrame) -> str:
    return bridges.format_summary(summary)
