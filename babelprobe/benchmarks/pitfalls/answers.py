"""Cross-Lingual Pitfalls answers: every variant of every question by likelihood of its choices
(`score_pitfalls`), as the released evaluation asks (`answer_release`: the language's simulation
instruction without chain of thought, then an extractor), or with App. E's chain of thought then an
extractor (`answer_cot`); `parse_choice` reads an extraction; `ReleaseAnswerer` is a simulation model of
the search that answers the release's way; and the benchmark contract's `check`, `run` and `answerer`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.benchmarks.base import as_models
from babelprobe.benchmarks.core.choices import option_scores
from babelprobe.benchmarks.core.generate import with_chat_template
from babelprobe.benchmarks.core.options import REDUCTIONS
from babelprobe.benchmarks.pitfalls.data import COUNTS, unwrap_quotes
from babelprobe.benchmarks.pitfalls.prompts import (
    VARIANTS,
    build_requests,
    format_choices,
    load_prompts,
    load_release,
    load_templates,
    release_template,
    template_for,
    variant_rows,
)
from babelprobe.benchmarks.pitfalls.settings import METHODS, NAME, Settings
from babelprobe.errors import BabelprobeError
from babelprobe.models import LoadedModel
from babelprobe.runs import score_resumably
from babelprobe.runtime import Runtime
from babelprobe.settings import settings_record
from babelprobe.tables import write_table

CHUNK_QUESTIONS = 32  # questions scored between two checkpoints of a resumable run


def score_pitfalls(model: LoadedModel | str, questions: pd.DataFrame, reduction: str = "per_byte",
                   prompts: pd.DataFrame | None = None, batch_tokens: int = 4096, progress: bool = True,
                   share_prefix: bool = True, variants: tuple[tuple[str, str], ...] = tuple(VARIANTS),
                   memo: dict | None = None) -> pd.DataFrame:
    """Answer every variant of every question by likelihood; one row per question × variant with the
    choice scores, the chosen and gold index and `correct` (method 'likelihood'). `memo` (a dict kept
    across calls) holds the scores of prompts already asked: the released sets repeat their original
    questions, so each distinct prompt is scored once."""
    if reduction not in REDUCTIONS:
        raise BabelprobeError(f"unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}")
    lm = Runtime(model=model).lm  # a spec through the one door, a loaded model as it is
    requests = build_requests(questions, prompts, variants)
    memo = {} if memo is None else memo
    keys = [(p, tuple(o)) for p, o in zip(requests["prompt"], requests["options"], strict=True)]
    new = list(dict.fromkeys(k for k in keys if k not in memo))
    if new:
        fresh = option_scores(lm, [p for p, _ in new], [list(o) for _, o in new], reduction=reduction,
                              share_prefix=share_prefix, batch_tokens=batch_tokens, progress=progress)
        memo.update(zip(new, fresh, strict=True))
    scores = [memo[k] for k in keys]
    rows = requests.drop(columns=["prompt", "options"])
    rows.insert(4, "method", METHODS["likelihood"])
    rows["n_choices"] = [len(o) for o in requests["options"]]
    rows["predicted"] = [int(np.argmax(s)) for s in scores]
    rows["correct"] = rows["predicted"] == rows["gold"]
    rows["scores"] = [json.dumps([round(float(x), 6) for x in s]) for s in scores]
    rows["reduction"] = reduction
    rows["model"] = lm.name
    rows["fingerprint"] = lm.fingerprint
    return rows


def answer_cot(questions: pd.DataFrame, generator, extractor=None, templates: pd.DataFrame | None = None,
               max_new_tokens: int = 1024, cache: str | Path | None = None, progress: bool = True,
               variants: tuple[tuple[str, str], ...] = tuple(VARIANTS)) -> pd.DataFrame:
    """App. E's answering (`--answer cot`): `generator` answers each variant zero-shot with chain of thought
    ("Template for Answering ... Questions (Zero-Shot + CoT)" in the question's language, the English one
    where App. E has none), then `extractor` (default: the generator) picks its final answer from the
    choices ("Template for Extracting Answer"). One row per question × variant (method 'cot-extract')."""
    templates = load_templates() if templates is None else templates
    rows = variant_rows(questions, variants)
    asked = [template_for(templates, "answer", lang) for lang in rows["language"]]
    prompts = [t.format(question=q, choices=format_choices(c))
               for (t, _), q, c in zip(asked, rows["question"], rows["choices"], strict=True)]
    extract, _ = template_for(templates, "extract", "en")
    rows = _generate_and_extract(rows, prompts, extract, generator, extractor or generator, max_new_tokens, cache,
                                 progress)
    rows.insert(4, "method", METHODS["cot"])
    rows.insert(rows.columns.get_loc("n_choices"), "template_language", [lang for _, lang in asked])
    return rows


def answer_release(questions: pd.DataFrame, generator, extractor=None, release: pd.DataFrame | None = None,
                   max_new_tokens: int = 1024, cache: str | Path | None = None, progress: bool = True,
                   variants: tuple[tuple[str, str], ...] = tuple(VARIANTS)) -> pd.DataFrame:
    """The released evaluation (eva.py -> utils/answers.py `simulate`; `--answer generate`, the paper
    preset): `generator` answers each variant prompted with its language's simulation instruction, the
    question and the choices, without chain of thought (data/prompts/pitfalls_release.tsv `simulate`);
    `extractor` (the release: gpt-4o-mini; default: the generator) picks the choice with the release's
    `extract_answer_dk` prompt. A pick that is not one of the choices is wrong (eva.py, one model per
    call: no extracted answer scores 0). One row per question × variant (method 'simulate-extract')."""
    release = load_release() if release is None else release
    rows = variant_rows(questions, variants)
    prompts = [release_template(release, "simulate", lang).format(question=q, choices=format_choices(c))
               for lang, q, c in zip(rows["language"], rows["question"], rows["choices"], strict=True)]
    extract = release_template(release, "extract", "*")
    rows = _generate_and_extract(rows, prompts, extract, generator, extractor or generator, max_new_tokens, cache,
                                 progress)
    rows.insert(4, "method", METHODS["generate"])
    return rows


def _generate_and_extract(rows: pd.DataFrame, prompts: list[str], extract: str, generator, extractor,
                          max_new_tokens: int, cache, progress: bool) -> pd.DataFrame:
    """Generate the answers of `prompts`, then ask `extractor` for the choice (the extraction template is
    filled with the question, the response and the choices); the rows gain the response, the extraction,
    the pick, `correct` and who generated and extracted. Generations go through the resumable `cache`."""
    from babelprobe.benchmarks.core.generate import generate_cached

    responses = generate_cached(generator, prompts, cache, max_new_tokens=max_new_tokens, progress=progress,
                                desc="answering")
    picks = generate_cached(extractor, [extract.format(question=q, answer=r, choices=format_choices(c))
                                        for q, r, c in zip(rows["question"], responses, rows["choices"], strict=True)],
                            cache, max_new_tokens=max_new_tokens, progress=progress, desc="extracting")
    parsed = [parse_choice(p, c) for p, c in zip(picks, rows["choices"], strict=True)]
    rows = rows.copy()
    rows["n_choices"] = rows["choices"].map(len)
    rows["response"], rows["extraction"] = responses, picks
    rows["extracted"] = [text for _, text in parsed]
    rows["predicted"] = [index for index, _ in parsed]
    rows["correct"] = rows["predicted"] == rows["gold"]
    rows["generator"], rows["extractor"] = generator.name, extractor.name
    rows["choices"] = rows["choices"].map(lambda c: json.dumps(c, ensure_ascii=False))
    return rows


class ReleaseAnswerer:
    """A simulation model of the search that answers as the released run.py does (utils/answers.py
    `simulate`: no chain of thought, then an extraction); `answer(questions, choices, languages)` gives
    the chosen indices, None where nothing usable was extracted (no final answer, or one that is not a
    choice): the release returns None there and leaves that model out of β's denominator
    (`search.simulate`)."""

    def __init__(self, generator, extractor=None, release: pd.DataFrame | None = None, max_new_tokens: int = 1024,
                 cache: str | Path | None = None):
        self.generator, self.extractor = generator, extractor or generator
        self.release = load_release() if release is None else release
        self.max_new_tokens, self.cache, self.name = max_new_tokens, cache, generator.name

    def answer(self, questions: list[str], choices: list[list[str]], languages: list[str]) -> list[int]:
        if not questions:
            return []
        rows = pd.DataFrame({"question": questions, "choices": [list(c) for c in choices], "gold": -1})
        prompts = [release_template(self.release, "simulate", lang).format(question=q, choices=format_choices(c))
                   for q, c, lang in zip(questions, choices, languages, strict=True)]
        extract = release_template(self.release, "extract", "*")
        done = _generate_and_extract(rows, prompts, extract, self.generator, self.extractor, self.max_new_tokens,
                                     self.cache, progress=False)
        return [int(i) if int(i) >= 0 else None for i in done["predicted"]]


def parse_choice(output: str, choices: list[str]) -> tuple[int, str]:
    """(index of the chosen option or −1, the extracted text) from an extractor's output
    `{"final_answer": ...}` (JSON, or the template's unquoted form). The pick must be one of the choices
    exactly, or after removing surrounding spaces and quotes; anything else is −1 (counted wrong)."""
    text = re.sub(r"^```(?:json)?|```$", "", output.strip()).strip()
    picked = None
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            value = json.loads(text[start:end + 1])
            picked = value.get("final_answer") if isinstance(value, dict) else None
        except json.JSONDecodeError:
            pass
    if picked is None:
        match = re.search(r'"?final_answer"?\s*:\s*(.*?)\s*(?:}|$)', text, re.S)
        picked = match.group(1) if match else None
    if picked is None:
        return -1, ""
    picked = str(picked)
    if picked in choices:
        return choices.index(picked), picked
    cleaned = [unwrap_quotes(c) for c in choices]
    return (cleaned.index(unwrap_quotes(picked)) if unwrap_quotes(picked) in cleaned else -1), picked


def _generator(models, spec: str, chat_template: str):
    """A generator by spec; a local one through its model's chat template as `chat_template` says
    (instruction-tuned local models); other generators as they are."""
    generator = models.generator(spec)
    return with_chat_template(generator, chat_template) if spec.startswith("local") else generator


def run(data: pd.DataFrame, models, settings: Settings = Settings(), out: Path | None = None,  # noqa: B008 (frozen)
        progress: bool = True) -> pd.DataFrame:
    """The benchmark contract's run: every variant of every question, by likelihood (in chunks of questions
    kept in `out`, so an interrupted run resumes) or by the paper's protocol (generations kept in
    `out/generations.jsonl`). Writes `load-report.csv` (records read/normalised/skipped per language, and
    every skipped record with its reason) into `out`."""
    models = as_models(models)
    if out is not None and "load_report" in data.attrs:
        write_table(_load_table(data), Path(out) / "load-report.csv")
    if settings.answer in ("generate", "cot"):
        answerer_ = _generator(models, settings.generator, settings.chat_template)
        extractor = answerer_ if settings.extractor == "generator" else _generator(models, settings.extractor,
                                                                                     settings.chat_template)
        cache = Path(out) / "generations.jsonl" if out is not None else None
        if settings.answer == "generate":
            rows = answer_release(data, answerer_, extractor, load_release(settings.release),
                                  max_new_tokens=settings.max_new_tokens, cache=cache, progress=progress)
        else:
            rows = answer_cot(data, answerer_, extractor, load_templates(settings.templates),
                              max_new_tokens=settings.max_new_tokens, cache=cache, progress=progress)
    else:
        prompts, memo = load_prompts(settings.prompts), {}

        def score(chunk: pd.DataFrame) -> pd.DataFrame:
            return score_pitfalls(models.lm, chunk, reduction=settings.reduction, prompts=prompts,
                                  batch_tokens=models.batch_tokens, progress=False, memo=memo)

        if out is None:
            rows = score(data)
        else:
            key = {"benchmark": NAME, "fingerprint": models.lm.fingerprint, **settings_record(settings)}
            rows = score_resumably(score, data, Path(out) / "items.csv", key, chunk_pairs=CHUNK_QUESTIONS,
                                   progress=progress, desc="questions", unit="question_id", model=models.lm)
    rows["protocol"] = settings.protocol
    return rows


def _load_table(data: pd.DataFrame) -> pd.DataFrame:
    """Per language (kind 'language') the counts, then every skipped record (kind 'skipped')."""
    report = data.attrs["load_report"].assign(kind="language")
    skipped = data.attrs.get("skipped", pd.DataFrame()).assign(kind="skipped")
    table = pd.concat([report, skipped], ignore_index=True)
    return table.astype({column: "Int64" for column in (*COUNTS, "record") if column in table})  # no 424.0


def answerer(settings: Settings) -> str:
    return "model" if settings.answer == "likelihood" else settings.generator


def check(data: pd.DataFrame, settings: Settings) -> None:
    """Prompt tables load and have what the questions need, before any model is loaded."""
    if settings.answer == "generate":  # the release's languages only (a one-line error naming the language)
        release = load_release(settings.release)
        release_template(release, "extract", "*")
        for language in sorted({"en", *data["language"]}):
            release_template(release, "simulate", language)
    elif settings.answer == "cot":
        templates = load_templates(settings.templates)
        for name in ("answer", "extract"):
            template_for(templates, name, "en")
    else:
        prompts = load_prompts(settings.prompts)
        for language in sorted({"en", *data["language"]}):
            if language not in prompts.index:
                raise BabelprobeError(f"no Cross-Lingual Pitfalls prompt for language {language!r} in "
                                      f"{settings.prompts or 'pitfalls.tsv'}; add a line for it")
