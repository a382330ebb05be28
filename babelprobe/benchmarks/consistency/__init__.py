"""Multilingual self-consistency (Ohmer, Bruni & Hupkes 2023, "Evaluating task understanding through
multilingual consistency: A ChatGPT case study"): does a model give the same answer to a task when it
reads the task in another language, translated by itself?

**Task and data.** A classification task (PAWS-X paraphrase identification, XNLI inference) is an
instruction around two input texts. Task definitions (input fields, labels, label words per language)
are in data/prompts/consistency.json; the prompts are prompt files: `consistency_instructions.tsv`
(App. B, Table 6: instruction prefix, the word for "sentence", suffix, per task and language) and
`consistency_prompts.tsv` (the App. B task template, App. C's translation prompts, babelprobe's
one-shot translation and paraphrase prompts and answer cues). Data: the bundled samples, babelprobe's
item records, or PAWS-X and XNLI as released (`read_source`, docs/datasets.md): PAWS-X
`x-final/<lang>/test_2k.tsv` and the hub export (`id, sentence1, sentence2, label`); XNLI
`XNLI-1.0/xnli.test.tsv|jsonl` (`gold_label`, `sentence1/2`, `language`, `pairID`) and the hub
per-language export (`premise, hypothesis, label`). A file that does not say its language gets it from
its folder (`de/…`) or `--language`. Rows of other languages with the same id are reference
translations (`{field}_{L}`). Records that cannot be scored (an empty text, an unknown label) are
skipped, counted per language and reason, and kept in the rows as condition `skipped`.

**Senses** (§3.3). The model (a `Generator`) translates, in separate requests, the instruction prefix,
the word for "sentence", the suffix (recomposed by the task template) and each input text. Conditions,
for each target language L:
    orig   instruction and input in the source language (the reference answers);
    T      both translated by the model into L (Table 1, column T);
    I      only the instruction translated (column I);
    X      only the input translated (column X);
    R      instruction translated, input = the reference translation (babelprobe's addition: it
           separates the model's translation errors from its language-dependent task understanding);
    P      instruction and input paraphrased by the model in the source language (babelprobe's
           paraphrase baseline, not in the paper);
    rerun  the orig prompts answered by a second sampled run (Table 5's run-to-run baseline; needs
           generated answers at a temperature above 0).
The answer is given in the instruction's language.

**Protocols.** `default` suits small local base models: likelihood answers (each label's words scored
as continuations of the task prompt plus an answer cue), babelprobe's one-shot translation prompt,
greedy decoding, the first line of every output, the paraphrase baseline. `paper` (`--protocol paper`)
is §3.1-§3.3: generated answers to the bare App. B prompt, App. C translation prompts, temperature 0.25,
at most 256 tokens per answer and 2048 per translation, whole outputs, the rerun baseline.

**Answers.** A generated response is valid when it matches a label word or contains it, ignoring case
(§3.2): `map_answer` takes the label word it matches or starts with, else the one label whose words
it contains; a response with none or with words of several labels is invalid (-1), a label of its own
as in the paper (footnote 3). Translations keep what is inside one pair of surrounding quotes.

**Metrics.** Accuracy per condition; consistency = share of items answered as in orig, overall and
among items orig got right / wrong (Table 5); App. D: consistency among items whose input translation
has BLEU >= 50, and their share. Translation quality of the model's input translations against the
references (§4.3, Table 2): corpus BLEU (sacrebleu, Chinese tokenizer for zh) and chrF, ROUGE-1/2/L
(`rouge-score`, mean sentence F-measure), COMET-22 with `--comet` (optional extra); per item BLEU and
chrF (mean over the two texts) and their Pearson correlation with consistency (Table 3). Intervals:
Wilson per language; a bootstrap over items where languages are pooled. Small models often return
degenerate senses (empty, a copy of the source, the prompt's example); their share is in the summary
(`sense_*`) and each row says what its instruction and input were (`*_status`).

**Modules**, each importing only those before it: `settings` (`Settings`, the paper preset), `task`
(task definitions and prompt files), `data` (reading and preparing the data), `answers` (senses,
condition prompts, answers), `quality` (translation quality), `summary` (metrics, `summarize`); this one
holds the benchmark contract of `babelprobe.benchmarks.base` and re-exports the public names.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from babelprobe.benchmarks.consistency.answers import (
    CONDITIONS,
    SENSES,
    answer_generate,
    answer_likelihood,
    condition_requests,
    make_senses,
    map_answer,
    sense_requests,
    unquote,
)
from babelprobe.benchmarks.consistency.data import Data, load_consistency, prepare, read_source
from babelprobe.benchmarks.consistency.quality import (
    corpus_translation_quality,
    item_translation_quality,
    rouge_scores,
    with_comet,
)
from babelprobe.benchmarks.consistency.settings import PROTOCOLS, Settings
from babelprobe.benchmarks.consistency.summary import (
    BLEU_HIGH,
    consistency_summary,
    summarize,
    with_consistency,
)
from babelprobe.benchmarks.consistency.task import PARTS, Prompts, Task, get_task, load_prompts, load_spec
from babelprobe.benchmarks.core.generate import Generator
from babelprobe.errors import BabelprobeError

__all__ = [
    # the benchmark contract (babelprobe/benchmarks/base.py)
    "NAME", "TITLE", "PROTOCOLS", "Settings", "LEGEND", "load", "check", "run", "summarize", "format_summary",
    "answerer",
    # the steps, for notebooks and tests
    "BLEU_HIGH", "CONDITIONS", "PARTS", "SENSES", "Data", "Prompts", "Task", "answer_generate",
    "answer_likelihood", "check_settings", "condition_requests", "consistency_summary",
    "corpus_translation_quality", "get_task", "item_translation_quality", "load_consistency",
    "load_prompts", "load_spec", "make_senses", "map_answer", "prepare", "read_source", "rouge_scores",
    "run_consistency", "sense_requests", "unquote", "with_comet", "with_consistency",
]

NAME = "consistency"
TITLE = "multilingual self-consistency (Ohmer, Bruni & Hupkes)"


def check_settings(data: Data, settings: Settings) -> None:
    """Settings that cannot run, and prompts or label words missing for the languages asked."""
    if settings.baseline in ("rerun", "both") and not (settings.answer == "generate" and settings.temperature > 0):
        raise BabelprobeError("the rerun baseline (Table 5) compares two sampled runs: use --answer generate with "
                              "--temperature above 0 (as --protocol paper does), or --baseline paraphrase|none")
    if not data.targets:
        raise BabelprobeError("no target language other than the items' own; give them with --languages (e.g. de,zh)")
    for lang in sorted(set(data.targets) | set(data.items["language"])):
        data.task.words(lang, " (needed to read answers in it)")
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


def load(source: str | Path, languages: list[str] | None = None, limit: int | None = None) -> pd.DataFrame:
    """The benchmark contract's loader: the records of `source` as read (`read_source`); `languages` are
    the target languages (default: those with references) and `limit` the number of source items, both
    applied when the records are prepared with the settings (broken records are counted over the whole
    file, whatever the limit)."""
    frame = read_source(str(source))
    frame.attrs.update(targets=list(languages or []), limit=limit)
    return frame


def _prepared(data: pd.DataFrame, settings: Settings) -> Data:
    return prepare(data, settings, targets=data.attrs.get("targets") or None, limit=data.attrs.get("limit"))


def check(data: pd.DataFrame, settings: Settings) -> None:
    """Items, task, prompts and settings are usable: fails before any model is loaded."""
    check_settings(_prepared(data, settings), settings)


def run(data: pd.DataFrame, models, settings: Settings = Settings(), out: Path | None = None,  # noqa: B008 (frozen)
        progress: bool = True) -> pd.DataFrame:
    """The benchmark contract's run: translate with the generator, answer every condition (generations
    kept in `out/generations.jsonl`, so a rerun resumes)."""
    from babelprobe.benchmarks.base import as_models

    models = as_models(models)
    prepared = _prepared(data, settings)
    lm = models.lm if settings.answer == "likelihood" else None
    return run_consistency(prepared, _generator(models, settings), settings, lm=lm,
                           cache=Path(out) / "generations.jsonl" if out is not None else None, progress=progress)


def _generator(models, settings: Settings) -> Generator:
    """The generator that translates (and answers); a local one through its chat template when asked."""
    from babelprobe.benchmarks.core.generate import LocalGenerator, local_generator

    generator = models.generator(settings.generator)
    if settings.chat_template:
        if not isinstance(generator, LocalGenerator):
            raise BabelprobeError(f"--chat-template applies to local generators, not {settings.generator!r} "
                                  "(openai: chat endpoints always send a user turn)")
        generator = local_generator(generator.lm, batch_size=generator.batch_size, chat_template=True,
                                    progress=generator.progress)
    return generator


def answerer(settings: Settings) -> str:
    return "model" if settings.answer == "likelihood" else settings.generator


LEGEND = ("conditions: T/I/X = instruction and input / instruction only / input only translated by the model "
          "(Table 1); R = translated instruction, reference input (babelprobe's); P = paraphrase baseline "
          "(babelprobe's addition); rerun = second sampled run of the source task (Table 5)")


def format_summary(summary: pd.DataFrame) -> str:
    """Accuracy and consistency per condition × language, translation quality, skipped records, as text."""
    def table(metric: str, group: str = "all", digits: int = 3) -> str:
        part = summary[(summary["metric"] == metric) & (summary["group"] == group)]
        if part.empty:
            return "  (none)"
        pivot = part.pivot(index="condition", columns="language", values="value")
        return pivot.to_string(float_format=lambda v: f"{v:.{digits}f}", na_rep="-")

    protocol = summary["protocol"].iloc[0] if "protocol" in summary.columns and len(summary) else "default"
    lines = [f"protocol: {protocol}; {LEGEND}",
             "accuracy (rows: condition, columns: language):", table("accuracy"),
             "consistency with orig answers:", table("consistency"),
             "  among items orig got right:", table("consistency", "orig_correct"),
             "  among items orig got wrong:", table("consistency", "orig_incorrect")]
    if (summary["metric"] == "valid").any():
        lines += ["valid answers (matching or containing a label word, §3.2):", table("valid")]
    high = f"bleu>={BLEU_HIGH:g}"
    if (summary["group"] == high).any():
        lines += [f"App. D: consistency among items with input BLEU >= {BLEU_HIGH:g}:", table("consistency", high),
                  "  share of items included:", table(f"share_{high}")]
    quality = summary[summary["metric"].isin(["bleu", "chrf", "rouge1", "rouge2", "rougeL", "comet"])]
    if not quality.empty:
        lines += ["translation quality of the model against the references (corpus BLEU, chrF; mean ROUGE F; COMET):",
                  quality.pivot_table(index=["group", "metric"], columns="language", values="value", sort=False)
                  .to_string(float_format=lambda v: f"{v:.2f}")]
    degenerate = summary[summary["metric"].str.startswith("sense_") & (summary.get("k", 0) > 0)]
    if not degenerate.empty:
        lines += ["degenerate senses of the model (share of its translations/paraphrases; see rows' "
                  "instruction_status and input_status):",
                  degenerate.pivot_table(index=["condition", "group", "metric"], columns="language", values="value")
                  .to_string(float_format=lambda v: f"{v:.2f}", na_rep="-")]
    corr = summary[summary["metric"] == "corr_bleu_consistent"]
    if not corr.empty:
        lines += ["Pearson r between an item's BLEU and its consistency (Table 3):",
                  corr.pivot(index="condition", columns="language", values="value")
                  .to_string(float_format=lambda v: f"{v:.2f}", na_rep="-")]
    skipped = summary[summary["metric"] == "skipped"]
    if not skipped.empty:
        lines += [f"skipped {int(skipped['n'].sum())} records that cannot be scored (rows of condition 'skipped'):"]
        lines += [f"  {r.language}: {int(r.n)} × {r.group}" for r in skipped.itertuples(index=False)]
    return "\n".join(lines)
