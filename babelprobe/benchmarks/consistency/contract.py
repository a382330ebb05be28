"""The benchmark contract of self-consistency (babelprobe/benchmarks/base.py) over its steps: `check`
(settings, prompts and label words usable before a model loads), `run` (senses, answers, metrics per row:
`run_consistency`) and `answerer`. `load` and `prepare` are in `data`, `summarize` and `format_summary`
in `summary`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from babelprobe.benchmarks.base import as_models
from babelprobe.benchmarks.consistency.answers import (
    answer_generate,
    answer_likelihood,
    condition_requests,
    make_senses,
    sense_requests,
)
from babelprobe.benchmarks.consistency.data import Data, Records, prepare
from babelprobe.benchmarks.consistency.quality import item_translation_quality, with_comet
from babelprobe.benchmarks.consistency.settings import Settings
from babelprobe.benchmarks.consistency.summary import with_consistency
from babelprobe.benchmarks.consistency.task import PARTS
from babelprobe.benchmarks.core.generate import Generator, with_chat_template
from babelprobe.errors import BabelprobeError


def check_settings(data: Data, settings: Settings) -> None:
    """Settings that cannot run, and prompts or label words missing for the languages asked."""
    if settings.baseline in ("rerun", "both") and not (settings.answer == "generate" and settings.temperature > 0):
        raise BabelprobeError("the rerun baseline (Table 5) compares two sampled runs: use --answer generate with "
                              "--temperature above 0 (as --protocol paper does), or --baseline paraphrase|none")
    if not data.targets:
        raise BabelprobeError("no target language other than the items' own; give them with --languages (e.g. de,zh)")
    for lang in sorted(set(data.targets) | set(data.items["language"])):
        data.task.words(lang, " (needed to read answers in it)")
        if settings.mixed and lang in data.targets:
            data.prompts.instruction(data.task.name, lang)  # condition M asks the native instruction
        if settings.cue:
            data.prompts.question(dict.fromkeys(PARTS, ""), ["", ""], lang, cue=True)
    sense_requests(Data(data.items.head(1), data.task, data.prompts, data.skipped, data.targets), settings)


def run_consistency(data: Data, generator: Generator, settings: Settings = Settings(), lm=None,  # noqa: B008 (frozen)
                    cache: str | Path | None = None, progress: bool = False) -> pd.DataFrame:
    """Translate/paraphrase with `generator`, answer every condition; one row per question asked, and
    one per skipped record."""
    if settings.answer == "likelihood" and lm is None:
        raise BabelprobeError("likelihood answers need a local model (--model); or use --answer generate")
    check_settings(data, settings)
    senses = make_senses(generator, sense_requests(data, settings), settings, cache=cache, progress=progress)
    questions = condition_requests(data, senses, settings)
    if settings.answer == "likelihood":
        answered = answer_likelihood(lm, questions, data.task, progress=progress)
    else:
        answered = answer_generate(generator, questions, data.task, settings, cache=cache, progress=progress)
    rows = with_consistency(item_translation_quality(answered))
    if settings.comet:
        rows = with_comet(rows, data.items)
    rows.insert(0, "pair_id", rows["item_id"])
    rows.insert(3, "subset", data.task.name)
    skipped = data.skipped.rename(columns={"reason": "skip_reason", "source": "record"}).assign(
        pair_id=data.skipped["item_id"], subset=data.task.name, condition="skipped")
    rows = pd.concat([rows, skipped], ignore_index=True)
    rows["generator"] = generator.name
    rows["protocol"] = settings.protocol
    return rows


def _prepared(data: Data | Records | pd.DataFrame, settings: Settings) -> Data:
    return data if isinstance(data, Data) else prepare(data, settings)


def check(data: Data | Records, settings: Settings) -> None:
    """Items, task, prompts and settings are usable: fails before any model is loaded."""
    check_settings(_prepared(data, settings), settings)


def run(data: Data | Records, models, settings: Settings = Settings(), out: Path | None = None,  # noqa: B008 (frozen)
        progress: bool = True) -> pd.DataFrame:
    """The benchmark contract's run: translate with the generator, answer every condition (generations
    kept in `out/generations.jsonl`, so a rerun resumes)."""
    models = as_models(models)
    prepared = _prepared(data, settings)
    lm = models.lm if settings.answer == "likelihood" else None
    return run_consistency(prepared, _generator(models, settings), settings, lm=lm,
                           cache=Path(out) / "generations.jsonl" if out is not None else None, progress=progress)


def _generator(models, settings: Settings) -> Generator:
    """The generator that translates (and answers); a local one through its chat template as asked."""
    return with_chat_template(models.generator(settings.generator), settings.chat_template)


def answerer(settings: Settings) -> str:
    return "model" if settings.answer == "likelihood" else settings.generator
