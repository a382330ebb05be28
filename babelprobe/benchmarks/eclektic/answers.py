"""ECLeKTiC answers: the closed-book questions answered by a generator (`answer_questions`), judged by
babelprobe's containment match (`judge_match`) or the paper's LLM judge (`judge_llm`, App. A.2), and the
benchmark contract's `check`, `run` and `answerer`."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pandas as pd

from babelprobe.benchmarks.base import as_models
from babelprobe.benchmarks.core.generate import Generator, generate_cached, with_chat_template
from babelprobe.benchmarks.eclektic.prompts import (
    PROMPT_FILE,
    chat_answerer,
    closed_book_prompts,
    condition,
    fill_template,
    first_line,
    prompt_templates,
)
from babelprobe.benchmarks.eclektic.settings import Settings
from babelprobe.errors import BabelprobeError
from babelprobe.languages import language_names
from babelprobe.prompts import check_placeholders, read_prompts

STOP = ["\n"]
JUDGE_TOKENS = 4  # the judge answers one word (App. A.2)
# Scripts written without spaces between words: a gold answer may be followed or preceded by anything.
NO_SPACE_SCRIPT = re.compile("[\u0e00-\u0e7f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def answer_questions(generator: Generator, questions: pd.DataFrame, templates: dict[str, str] | None = None,
                     max_new_tokens: int = 256, first_line: bool = False, cache: str | Path | None = None,
                     progress: bool = False) -> pd.DataFrame:
    """The questions with `prompt` and `prediction` (the continuation, stripped; only its first line
    when `first_line`)."""
    prompts = closed_book_prompts(questions, templates or prompt_templates("qa"))
    outputs = generate_cached(generator, prompts, cache, max_new_tokens=max_new_tokens,
                              stop=STOP if first_line else None, progress=progress, desc="answering")
    return questions.assign(prompt=prompts, prediction=[o.strip() for o in outputs], generator=generator.name,
                            max_new_tokens=max_new_tokens, answer_cut="first-line" if first_line else "none")


# ------------------------------------------------------------------------------------------------ judge

def normalize_answer(text: str) -> str:
    """NFKC, case-folded, digit-group separators dropped (1,269 -> 1269), punctuation and symbols -> space."""
    text = unicodedata.normalize("NFKC", str(text)).casefold()
    text = re.sub(r"(?<=\d)[,.'’\u00a0 ](?=\d{3}(?!\d))", "", text)
    text = "".join(" " if unicodedata.category(c)[0] in "PSZ" else c for c in text)
    return " ".join(text.split())


def answer_found(answer: str, prediction: str) -> bool:
    """Is the normalised answer in the normalised prediction (at a word start, unless in a spaceless script)?"""
    gold, pred = normalize_answer(answer), normalize_answer(prediction)
    if not gold:
        return False
    if NO_SPACE_SCRIPT.search(gold):
        return gold in pred
    return re.search(r"(?<!\w)" + re.escape(gold), pred) is not None


def word_recall(answer: str, prediction: str) -> float:
    """Share of the gold answer's words (characters, in spaceless scripts) that occur in the prediction:
    a diagnostic of babelprobe's own (the paper has no string metric)."""
    gold, pred = normalize_answer(answer), normalize_answer(prediction)
    units = [c for c in gold if not c.isspace()] if NO_SPACE_SCRIPT.search(gold) else gold.split()
    return sum(u in pred for u in units) / len(units) if units else 0.0


def judge_match(rows: pd.DataFrame) -> pd.DataFrame:
    """babelprobe's containment judge: `correct` by normalised containment, plus `exact` and `recall`."""
    return rows.assign(
        correct=[answer_found(a, p) for a, p in zip(rows["answer"], rows["prediction"])],
        exact=[normalize_answer(a) == normalize_answer(p) for a, p in zip(rows["answer"], rows["prediction"])],
        recall=[round(word_recall(a, p), 4) for a, p in zip(rows["answer"], rows["prediction"])],
        judge="match", judge_output="")


def judge_template(path: str | Path | None = None) -> str:
    """The judge prompt: set `judge` of data/prompts/eclektic.tsv (App. A.2), or the `template` of your file."""
    rows = read_prompts(path or PROMPT_FILE, ("template",), optional=("set", "language"))
    if not path:
        rows = rows[rows["set"] == "judge"]
    template = rows["template"].iloc[0]
    check_placeholders(template, f"judge prompt {rows['line'].iloc[0]}", ("context", "question", "predicted_answer"),
                       allowed=("target_language",), once=False)
    return template


def judge_prompts(rows: pd.DataFrame, template: str) -> list[str]:
    """The judge template filled with each row's language name, context, question and prediction."""
    names = language_names()
    return [fill_template(template, {"target_language": names.get(lang, lang), "context": c, "question": q,
                             "predicted_answer": p})
            for lang, c, q, p in zip(rows["language"], rows["context"], rows["question"], rows["prediction"])]


def check_contexts(rows: pd.DataFrame) -> None:
    """The LLM judge reads the target-language context: every row needs one."""
    without = rows[rows["context"].fillna("") == ""]
    if not without.empty:
        row = without.iloc[0]
        raise BabelprobeError(f"the LLM judge needs the context: question {row['q_id']} has none in "
                              f"{row['language']} (field '{row['language']}_c'); use --judge match")


def judge_llm(rows: pd.DataFrame, generator: Generator, prompt_file: str | Path | None = None,
              cache: str | Path | None = None, progress: bool = False, label: str | None = None) -> pd.DataFrame:
    """`correct` when the judge answers YES to the judge prompt (context, question, prediction); the rows'
    `judge` is `label` (default `llm:<judge's name>`; `self` when the answering model judges itself)."""
    check_contexts(rows)
    prompts = judge_prompts(rows, judge_template(prompt_file))
    outputs = generate_cached(generator, prompts, cache, max_new_tokens=JUDGE_TOKENS, stop=STOP, progress=progress,
                              desc="judging")
    verdicts = [_verdict(o) for o in outputs]
    return rows.assign(correct=[v == "YES" for v in verdicts], judge=label or f"llm:{generator.name}",
                       judge_output=[o.strip() for o in outputs])


def _verdict(output: str) -> str:
    """YES, NO or '' (neither: counted as not correct) from a judge's answer."""
    match = re.search(r"\b(YES|NO)\b", output.upper())
    return match.group(1) if match else ""


# ------------------------------------------------------------------------------------------------- runs

def run_eclektic(generator: Generator, questions: pd.DataFrame, templates: dict[str, str] | None = None,
                 max_new_tokens: int = 256, first_line: bool = False, judge: str = "match",
                 judge_generator: Generator | None = None, judge_prompt: str | Path | None = None,
                 cache: str | Path | None = None, progress: bool = False, method: str = "closed-book") -> pd.DataFrame:
    """Answer every question and judge it: one row per (question, language) in docs/design.md's
    conventions; `method` names the closed-book condition (the prompt set)."""
    if judge != "match":
        check_contexts(questions)  # before any answer is generated
    rows = answer_questions(generator, questions, templates, max_new_tokens=max_new_tokens, first_line=first_line,
                            cache=cache, progress=progress)
    rows = judge_match(rows)
    if judge != "match":
        if judge_generator is None:
            raise BabelprobeError(f"judge {judge!r} needs a judge generator")
        rows = judge_llm(rows.drop(columns=["correct", "judge", "judge_output"]), judge_generator, judge_prompt,
                         cache=cache, progress=progress, label="self" if judge == "self" else None)
    rows.insert(list(rows.columns).index("subset") + 1, "method", method)
    rows["correct"] = rows["correct"].astype(bool)
    return rows.drop(columns=["_source"])


def check(data: pd.DataFrame, settings: Settings) -> None:
    """Every question has a prompt (and a context, for the LLM judge): fails before any model is loaded.
    With `--chat-template auto` on a local model, both prompt sets it may use are checked."""
    chat = chat_answerer(settings)
    for reads_chat in (True, False) if chat is None else (chat,):
        closed_book_prompts(data, prompt_templates(condition(settings, reads_chat), settings.prompt_file))
    if settings.judge != "match":
        check_contexts(data)
        judge_template(settings.judge_prompt)


def answering_generator(models, settings: Settings) -> Generator:
    """The generator that answers; a local one through its chat template as `chat_template` says."""
    return with_chat_template(models.generator(settings.generator), settings.chat_template)


def run(data: pd.DataFrame, models, settings: Settings = Settings(), out: Path | None = None,  # noqa: B008 (frozen)
        progress: bool = True) -> pd.DataFrame:
    """The benchmark contract's run: answer and judge every question (generations kept in
    `out/generations.jsonl`, so a rerun resumes)."""
    models = as_models(models)
    generator = answering_generator(models, settings)
    chat = settings.generator.startswith("openai:") or getattr(generator, "chat_template", False)
    judge = None  # `match` needs no model
    if settings.judge == "self":
        judge = generator
    elif settings.judge.startswith("llm:"):
        judge = models.generator(settings.judge[4:])
    rows = run_eclektic(generator, data, prompt_templates(condition(settings, chat), settings.prompt_file),
                        max_new_tokens=settings.max_new_tokens, first_line=first_line(settings, chat),
                        judge=settings.judge, judge_generator=judge, judge_prompt=settings.judge_prompt,
                        cache=Path(out) / "generations.jsonl" if out is not None else None, progress=progress,
                        method=condition(settings, chat))
    rows["protocol"] = settings.protocol
    return rows


def answerer(settings: Settings) -> str:
    return settings.generator
