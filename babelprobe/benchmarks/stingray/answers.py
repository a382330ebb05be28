"""StingrayBench answers: every question asked by likelihood of the answer labels (`score_stingray`) or
answered by a generator and read by `parse_answer` (`generate_stingray`), and the benchmark contract's
`check`, `run` and `answerer`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.benchmarks.base import as_models
from babelprobe.benchmarks.core.choices import option_scores
from babelprobe.benchmarks.core.options import REDUCTIONS
from babelprobe.benchmarks.stingray.data import load_stingray
from babelprobe.benchmarks.stingray.prompts import build_requests, chat_renderer, load_prompts
from babelprobe.benchmarks.stingray.settings import TASKS, Settings
from babelprobe.errors import BabelprobeError
from babelprobe.models import LoadedModel
from babelprobe.runtime import Runtime
from babelprobe.tables import write_table

SKIPPED = "skipped_records.csv"


def score_stingray(model: LoadedModel | str, records: pd.DataFrame | str = "stingray-sample",
                   tasks: tuple[str, ...] = TASKS, reduction: str = "sum", prompts: dict | None = None,
                   chat: str = "off", batch_tokens: int = 4096, progress: bool = True) -> pd.DataFrame:
    """Ask every question of `records` by likelihood; one row per question with the option scores, the
    chosen and gold labels and `correct` (docs/design.md results conventions, method 'likelihood').
    Plain text: the question, the answer cue, then each label; chat: the labels open the assistant turn.
    A true cognate's usage question names the record's unsplit "L1 word, L2 word", as the released
    likelihood script does (generation names the word of each language, as the generation script does)."""
    if reduction not in REDUCTIONS:
        raise BabelprobeError(f"unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}")
    records = load_stingray(records) if isinstance(records, (str, Path)) else records
    lm = Runtime(model=model).lm  # a spec through the one door, a loaded model as it is
    requests = build_requests(records, prompts, tasks, split_words=False)  # "w1, w2", as likelihood_eval.py
    render, prompt_format = chat_renderer(lm, chat)
    texts = [render(q) for q in requests["question"]] if render else list(requests["prompt"])
    options = [[o.lstrip() for o in opts] if render else opts for opts in requests["options"]]
    scores = option_scores(lm, texts, options, reduction=reduction, share_prefix=True, batch_tokens=batch_tokens,
                           progress=progress)
    chosen = [int(np.argmax(s)) for s in scores]
    rows = _rows(requests, "likelihood", texts, prompt_format)
    rows["predicted"] = [o[c].strip() for o, c in zip(options, chosen, strict=True)]
    rows["correct"] = rows["gold"] == rows["predicted"]
    rows["scores"] = [json.dumps([round(float(x), 6) for x in s]) for s in scores]
    rows["options"] = [json.dumps([o.strip() for o in opts], ensure_ascii=False) for opts in options]
    rows["reduction"] = reduction
    rows["model"] = lm.name
    rows["fingerprint"] = lm.fingerprint
    return rows


def generate_stingray(generator, records: pd.DataFrame, tasks: tuple[str, ...] = TASKS, prompts: dict | None = None,
                      chat: str = "off", max_new_tokens: int = 3, cache: str | Path | None = None,
                      progress: bool = True) -> pd.DataFrame:
    """Ask every question of `records` of a `Generator` (core.generate) and read its answers with
    `parse_answer`; one row per question with the `response`, whether it could be read (`valid`), the
    `predicted` and gold labels and `correct`. The prompt is the bare question (the released
    generation_baseline.py: no answer cue, stripped), in the local model's chat template when `chat`
    asks for it; an OpenAI chat endpoint always wraps it as a user message. `cache`: a JSONL file of
    generated text, so an interrupted run resumes."""
    from babelprobe.benchmarks.core.generate import generate_cached

    requests = build_requests(records, prompts, tasks)
    render, prompt_format = _generation_format(generator, chat)
    questions = [q.strip() for q in requests["question"]]
    texts = [render(q) for q in questions] if render else questions
    responses = generate_cached(generator, texts, cache, max_new_tokens=max_new_tokens, progress=progress,
                                desc="StingrayBench answers")
    rows = _rows(requests, "generation", texts, prompt_format)
    rows["response"] = responses
    parsed = [parse_answer(r, task) for r, task in zip(responses, rows["task"], strict=True)]
    rows["valid"] = [p is not None for p in parsed]
    rows["predicted"] = [p or "" for p in parsed]
    rows["correct"] = rows["gold"] == rows["predicted"]
    rows["generator"] = generator.name
    return rows


def _generation_format(generator, chat: str):
    """(render or None, prompt_format) for a generator: local models get their chat template here (so
    the generation cache keys on the text the model saw); an OpenAI chat endpoint is chat by itself."""
    lm = getattr(generator, "lm", None)
    if isinstance(lm, LoadedModel):
        return chat_renderer(lm, chat)
    if generator.name.startswith("openai:"):
        return None, "chat"
    if chat == "on":
        raise BabelprobeError(f"--chat-template on needs a chat template, which generator {generator.name} cannot "
                              "apply; use its chat endpoint (openai:MODEL@URL) or --chat-template auto")
    return None, "plain"


def _rows(requests: pd.DataFrame, method: str, texts: list[str], prompt_format: str) -> pd.DataFrame:
    rows = requests.drop(columns=["options", "question", "prompt"])
    rows.insert(4, "method", method)
    rows["prompt"] = texts
    rows["prompt_format"] = prompt_format
    rows["gold"] = [o[g].strip() for o, g in zip(requests["options"], requests["gold"], strict=True)]
    return rows


def parse_answer(response: str, task: str) -> str | None:
    """The label a generated answer gives, or None (§4.3's post-processing; the paper names one rule,
    "A and B" -> C, the others are ours). Semantic: an answer that says "both", or names both A and B
    (and not C), is C; otherwise the first standalone capital A, B or C ("A.", "(B)", "C.Both"). Usage:
    the first "yes" or "no" as a word (any case); else "incorrect"/"not correct" is No and "correct"
    is Yes. The released generation_eval.py only strips the answer and compares it with the label."""
    text = response.strip()
    if task == "semantic":
        letters = re.findall(r"(?<![A-Za-z])([ABC])(?![A-Za-z])", text)
        if re.search(r"\bboth\b", text, re.IGNORECASE) or ({"A", "B"} <= set(letters) and "C" not in letters):
            return "C"
        return letters[0] if letters else None
    if task == "usage":
        word = re.search(r"\b(yes|no)\b", text, re.IGNORECASE)
        if word:
            return word.group(1).capitalize()
        if re.search(r"\b(incorrect|not correct)\b", text, re.IGNORECASE):
            return "No"
        return "Yes" if re.search(r"\bcorrect\b", text, re.IGNORECASE) else None
    raise BabelprobeError(f"unknown StingrayBench task {task!r}; use {', '.join(TASKS)}")


def check(data: pd.DataFrame, settings: Settings) -> None:
    """The prompt file loads, before a model is loaded (the settings checked themselves)."""
    load_prompts(settings.prompts)


def run(data: pd.DataFrame, models, settings: Settings = Settings(), out: Path | None = None,  # noqa: B008 (frozen)
        progress: bool = True) -> pd.DataFrame:
    """The benchmark contract's run: every question of `data`, by likelihood of the local model or
    answered by `settings.generator`; rows carry the protocol and the records skipped at loading
    (also listed in `out/skipped_records.csv`)."""
    models = as_models(models)
    prompts = load_prompts(settings.prompts)
    if settings.answer == "likelihood":
        rows = score_stingray(models.lm, data, tasks=settings.tasks, reduction=settings.reduction, prompts=prompts,
                              chat=settings.chat_template, batch_tokens=models.batch_tokens, progress=progress)
    else:
        cache = Path(out) / "generations.jsonl" if out is not None else None
        rows = generate_stingray(models.generator(settings.generator), data, settings.tasks, prompts,
                                 chat=settings.chat_template, max_new_tokens=settings.max_new_tokens, cache=cache,
                                 progress=progress)
    rows["protocol"] = settings.protocol
    rows = _with_skipped(rows, data)
    if out is not None:
        skipped = pd.DataFrame(data.attrs.get("skipped", []), columns=["config", "pair", "subset", "source", "reason"])
        write_table(skipped, Path(out) / SKIPPED)
    return rows


def _with_skipped(rows: pd.DataFrame, data: pd.DataFrame) -> pd.DataFrame:
    """`records_read` and `records_skipped` of each row's config, from the loader's attrs."""
    read = data.attrs.get("read", {})
    skipped: dict[str, int] = {}
    for problem in data.attrs.get("skipped", []):
        skipped[problem["config"]] = skipped.get(problem["config"], 0) + 1
    config = rows["pair"] + np.where(rows["subset"] == "true_cognate", "_common", "")
    rows["records_read"] = [read.get(c, 0) for c in config]
    rows["records_skipped"] = [skipped.get(c, 0) for c in config]
    return rows


def answerer(settings: Settings) -> str:
    return "model" if settings.answer == "likelihood" else settings.generator
