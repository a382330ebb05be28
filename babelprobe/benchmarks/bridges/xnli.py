"""XNLI (Conneau et al. 2018): natural language inference in 15 languages, as lm-evaluation-harness scores it
(`lm_eval/tasks/xnli/xnli_<lang>.yaml`, made by its `utils.py`; the `validation` split of hub `facebook/xnli`,
one config per language).

**Template.** No context; the three choices are whole sentences, after the default delimiter " ":

    premise + ", " + QUESTION_WORD + "? " + LABEL + ", " + hypothesis

with LABEL the language's entailment, neutral and contradiction word (labels 0, 1, 2; `WORDS`, the harness's
`utils.LANGUAGES`; English ", right? Yes, ", ", right? Also, ", ", right? No, "). The harness reports `acc`
only. Its Arabic contradiction word is رقم ("number", not "no"): kept as the harness has it and flagged
(`template_note`, printed with the summary).

**Release layout** (docs/datasets.md "XNLI"): XNLI-1.0's `xnli.dev.tsv` (tab-separated, unquoted; `language`,
`gold_label` as a word, `sentence1`, `sentence2`, `pairID`, ...) or the hub's per-language files (`premise`,
`hypothesis`, `label`) named after their language (`de/validation-00000-of-00001.parquet`, `de.jsonl`).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from babelprobe.benchmarks import bridges
from babelprobe.benchmarks.bridges import Release, Settings, answerer

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NAME", "TITLE", "Settings", "load", "run", "summarize", "format_summary", "answerer", "release"]

NAME = "xnli"
TITLE = "XNLI: natural language inference in 15 languages, scored as lm-evaluation-harness does"
HUB_ID = "facebook/xnli"
LABELS = ("entailment", "neutral", "contradiction")
# lm_eval/tasks/xnli/utils.py LANGUAGES: QUESTION_WORD, ENTAILMENT_LABEL, NEUTRAL_LABEL, CONTRADICTION_LABEL
WORDS = {
    "ar": ("صحيح", "نعم", "لذا", "رقم"),
    "bg": ("правилно", "да", "така", "не"),
    "de": ("richtig", "Ja", "Auch", "Nein"),
    "el": ("σωστός", "Ναί", "Έτσι", "όχι"),
    "en": ("right", "Yes", "Also", "No"),
    "es": ("correcto", "Sí", "Asi que", "No"),
    "fr": ("correct", "Oui", "Aussi", "Non"),
    "hi": ("सही", "हाँ", "इसलिए", "नहीं"),
    "ru": ("правильно", "Да", "Так", "Нет"),
    "sw": ("sahihi", "Ndiyo", "Hivyo", "Hapana"),
    "th": ("ถูกต้อง", "ใช่", "ดังนั้น", "ไม่"),
    "tr": ("doğru", "Evet", "Böylece", "Hayır"),
    "ur": ("صحیح", "جی ہاں", "اس لئے", "نہیں"),
    "vi": ("đúng", "Vâng", "Vì vậy", "Không"),
    "zh": ("正确", "是的", "所以", "不是的"),
}
NOTES = {"ar": "the harness's Arabic contradiction word is رقم ('number', not 'no'); kept as the harness has it"}


def choices(language: str, premise: str, hypothesis: str) -> list[str]:
    """The three choices of one record (module docstring)."""
    question, *labels = WORDS[language]
    return [f"{premise}, {question}? {label}, {hypothesis}" for label in labels]


def questions(frame: pd.DataFrame, config: str) -> pd.DataFrame:
    """The release's records as questions: no context, the three sentences as choices, gold = the label."""
    import pandas as pd

    if {"gold_label", "sentence1", "sentence2"} <= set(frame.columns):  # the XNLI-1.0 release
        frame = frame.rename(columns={"sentence1": "premise", "sentence2": "hypothesis"})
        frame["label"] = frame["gold_label"].map(lambda g: LABELS.index(g) if g in LABELS else g)
    bridges.require(frame, ("premise", "hypothesis", "label"), "XNLI")
    problem = bridges.problems(frame, ("premise", "hypothesis"))
    label = pd.to_numeric(frame["label"], errors="coerce")
    problem = problem.mask((problem == "") & ~label.isin([0, 1, 2]), "label " + frame["label"].astype(str) +
                           " is not 0, 1 or 2")
    ids = next((frame[c] for c in ("pairID", "id") if c in frame.columns), pd.Series(range(1, len(frame) + 1)))
    gold = [int(v) if p == "" else -1 for v, p in zip(label, problem)]
    return pd.DataFrame({"id": [str(i) for i in ids], "subset": [LABELS[g] if g >= 0 else "" for g in gold],
                         "context": "", "delimiter": " ",
                         "choices": [choices(config, str(p), str(h)) for p, h in zip(frame["premise"], frame["hypothesis"])],
                         "gold": gold, "template_note": NOTES.get(config, ""),
                         "problem": problem.values, "_source": frame["_source"].values})


@cache
def release() -> Release:
    """How this bridge reads its release (built when first used: the config table is read then)."""
    return Release(name=NAME, title="XNLI", hub_id=HUB_ID, split="validation", configs=tuple(WORDS),
                   file_split=("dev", "validation"), questions=questions, language_of=lambda config: config,
                   config_column="language", harness_metrics=("acc",))


def load(source: str | Path = "xnli-sample", languages: list[str] | None = None,
         limit: int | None = None) -> pd.DataFrame:
    """The benchmark contract's loader (`bridges.load`)."""

    return bridges.load(release(), source, languages, limit)


def run(data: pd.DataFrame, models, settings: Settings | None = None, out: Path | None = None,
        progress: bool = True) -> pd.DataFrame:

    return bridges.run(NAME, data, models, settings or Settings(), out, progress)


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    return bridges.summarize(rows)


def format_summary(summary: pd.DataFrame) -> str:
    return bridges.format_summary(summary)
