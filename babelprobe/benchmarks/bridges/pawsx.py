"""PAWS-X (Yang et al. 2019): paraphrase identification in 7 languages, as lm-evaluation-harness scores it
(`lm_eval/tasks/paws-x/paws_<lang>.yaml`; the `test` split of hub `google-research-datasets/paws-x`, one config
per language).

**Template.** No context and no delimiter; two choices, labels 0 (not a paraphrase) and 1:

    sentence1 + ", " + QUESTION + "? " + NO|YES + ", " + sentence2          (`WORDS`: English ", right? No, ")

For de, en, es and fr the harness first prepares the sentences (`utils.process_docs_paraphrases`):
detokenised (`detokenise`), stripped, sentence1's final `.`, `,` or `;` dropped, sentence2's first letter
lower-cased; ``prepare_sentences` does the same. The harness reports `acc` only.

**Release layout** (docs/datasets.md "PAWS-X"): `x-final/<lang>/test_2k.tsv` (tab-separated, unquoted: `id`,
`sentence1`, `sentence2`, `label`), or the hub's per-language files (`de/test-00000-of-00001.parquet`).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from babelprobe.benchmarks import bridges
from babelprobe.benchmarks.bridges import Release, Settings, answerer

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NAME", "TITLE", "Settings", "load", "run", "summarize", "format_summary", "answerer", "release"]

NAME = "pawsx"
TITLE = "PAWS-X: paraphrase identification in 7 languages, scored as lm-evaluation-harness does"
HUB_ID = "google-research-datasets/paws-x"
SUBSETS = ("not_paraphrase", "paraphrase")
# lm_eval/tasks/paws-x/paws_<lang>.yaml doc_to_choice: the question and the words for label 0 and 1
WORDS = {
    "de": ("richtig", "Nein", "Ja"),
    "en": ("right", "No", "Yes"),
    "es": ("verdad", "No", "Sí"),
    "fr": ("n'est-ce pas", "Non", "Oui"),
    "ja": ("ですね", "いいえ", "はい"),
    "ko": ("맞죠", "아니요", "예"),
    "zh": ("对吧", "不是", "是"),
}
PREPARED = ("de", "en", "es", "fr")  # the configs whose yaml has process_docs: utils.process_docs_paraphrases
# utils.general_detokenize, in its order: five literal replacements, then a space before ' . , is dropped
DETOKENISE = ((" n't", "n't"), (" )", ")"), ("( ", "("), ('" ', '"'), (' "', '"'))
SPACE_BEFORE = re.compile(r" (['.,])")


def detokenise(text: str) -> str:
    for old, new in DETOKENISE:
        text = text.replace(old, new)
    return SPACE_BEFORE.sub(r"\1", text)


def prepare_sentences(sentence1: str, sentence2: str) -> tuple[str, str]:
    """The harness's preparation of a de/en/es/fr record (module docstring)."""
    first, second = detokenise(sentence1).strip(), detokenise(sentence2).strip()
    if first.endswith((".", ",", ";")):
        first = first[:-1]
    return first, second[:1].lower() + second[1:]


def choices(language: str, sentence1: str, sentence2: str) -> list[str]:
    if language in PREPARED:
        sentence1, sentence2 = prepare_sentences(sentence1, sentence2)
    question, no, yes = WORDS[language]
    return [f"{sentence1}, {question}? {word}, {sentence2}" for word in (no, yes)]


def questions(frame: pd.DataFrame, config: str) -> pd.DataFrame:
    """The release's records as questions: no context, the two sentences as choices, gold = the label."""
    import pandas as pd

    bridges.require(frame, ("sentence1", "sentence2", "label"), "PAWS-X")
    problem = bridges.problems(frame, ("sentence1", "sentence2"))
    label = pd.to_numeric(frame["label"], errors="coerce")
    problem = problem.mask((problem == "") & ~label.isin([0, 1]), "label " + frame["label"].astype(str) +
                           " is not 0 or 1")
    ids = frame["id"] if "id" in frame.columns else pd.Series(range(1, len(frame) + 1))
    gold = [int(v) if p == "" else -1 for v, p in zip(label, problem)]
    return pd.DataFrame({"id": [str(i) for i in ids], "subset": [SUBSETS[g] if g >= 0 else "" for g in gold],
                         "context": "", "delimiter": "",
                         "choices": [choices(config, str(a), str(b)) for a, b in zip(frame["sentence1"], frame["sentence2"])],
                         "gold": gold, "problem": problem.values, "_source": frame["_source"].values})


@cache
def release() -> Release:
    """How this bridge reads its release (built when first used: the config table is read then)."""
    return Release(name=NAME, title="PAWS-X", hub_id=HUB_ID, split="test", configs=tuple(WORDS),
                   file_split=("test",), questions=questions, language_of=lambda config: config,
                   harness_metrics=("acc",))


def load(source: str | Path = "pawsx-sample", languages: list[str] | None = None,
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
