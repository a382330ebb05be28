"""The linguistic-affinity experiment of Cross-Lingual Pitfalls (§3.3, App. B.2, Fig. 7), its steps:
the found pairs of every seed language y are expanded into every other language x
(`search.expand_pairs`), the expanded pairs' perturbed target-language questions are answered
(`answer_pairs`, with any of the evaluation's answerers: likelihood, the released evaluation, App. E's
chain of thought), and the accuracy matrix A[x, y] (averaged over models) gives the Relative Affinity
Score D[x, y] (`summary.affinity_accuracy`, `summary.relative_affinity`). `babelprobe bench
pitfalls-affinity` runs them and draws the heat map (`analysis.benchmarks.run_affinity`)."""

from __future__ import annotations

import json

import pandas as pd

from babelprobe.benchmarks.pitfalls.answers import _generator, answer_cot, answer_release, score_pitfalls
from babelprobe.benchmarks.pitfalls.prompts import load_release, load_templates, release_template
from babelprobe.benchmarks.pitfalls.settings import AffinitySettings
from babelprobe.languages import language_code

ASKED = (("target", "perturbed"),)  # the expanded pairs' target-language question, with its added context


def check_languages(names: list[str], settings: AffinitySettings) -> None:
    """Every language has the release's prompts the settings need: a one-line error before any work."""
    release = load_release()
    for name in names:
        code = language_code(name)
        if settings.translation == "release":
            release_template(release, "translate", code)
        if settings.answer == "generate":
            release_template(release, "simulate", code)


def answer_pairs(pairs: pd.DataFrame, models, settings: AffinitySettings, cache=None, progress: bool = False) -> pd.DataFrame:
    """Evaluation rows of the expanded pairs (their perturbed target-language question), answered as
    `settings.answer` says; `model` names who answered (`affinity_accuracy` averages over models)."""
    if settings.answer == "likelihood":
        return score_pitfalls(models.lm, pairs, reduction=settings.reduction, batch_tokens=models.batch_tokens,
                              progress=progress, variants=ASKED)
    generator = _generator(models, settings.generator, settings.chat_template)
    extractor = generator if settings.extractor == "generator" else _generator(models, settings.extractor,
                                                                                 settings.chat_template)
    if settings.answer == "generate":
        rows = answer_release(pairs, generator, extractor, max_new_tokens=settings.max_new_tokens, cache=cache,
                              progress=progress, variants=ASKED)
    else:
        rows = answer_cot(pairs, generator, extractor, load_templates(), max_new_tokens=settings.max_new_tokens,
                          cache=cache, progress=progress, variants=ASKED)
    return rows.assign(model=generator.name)


def pairs_table(pairs: pd.DataFrame) -> pd.DataFrame:
    """The expanded pairs as a flat table (choices as JSON)."""
    if pairs.empty:
        return pd.DataFrame(columns=["question_id", "seed_language", "language", "transquestion", "transchoices",
                                     "transanswer"])
    table = pairs[["question_id", "seed_language", "language", "transpre", "transori", "transsuf", "transquestion",
                   "transchoices", "transanswer"]].copy()
    table["transchoices"] = table["transchoices"].map(lambda c: json.dumps(list(c), ensure_ascii=False))
    return table
