"""The model's senses and answers (§3.2, §3.3). Senses: every text the model translates or paraphrases
(`sense_requests`) and what it made of them (`make_senses`, quotes removed by `unquote`, degenerate senses
marked). Questions: the task prompt of every item × condition × language (`condition_requests`). Answers:
the likelihood of each label's words (`answer_likelihood`) or a generated response mapped to a label
(`answer_generate`, `map_answer`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.benchmarks.consistency.data import Data
from babelprobe.benchmarks.consistency.settings import Settings
from babelprobe.benchmarks.consistency.task import PARTS, Task
from babelprobe.benchmarks.core.generate import Generator, generate_cached
from babelprobe.languages import separator

CONDITIONS = ("orig", "T", "I", "X", "R", "M", "P", "rerun")
# Which version of the instruction and of the input each condition uses.
SENSES = {"orig": ("source", "source"), "T": ("translated", "translated"), "I": ("translated", "source"),
          "X": ("source", "translated"), "R": ("translated", "reference"), "M": ("native", "source"), "P": ("paraphrased", "paraphrased"),
          "rerun": ("source", "source")}
STOP = ["\n"]


# ---------------------------------------------------------------------------------------------- senses

def sense_requests(data: Data, settings: Settings) -> pd.DataFrame:
    """Every text the model translates or paraphrases: kind, item_id ('' for the instruction), field
    (an instruction part or an input field), source language, language it goes into, the source text,
    the prompt, and the prompt's example answer (to recognise a copy of it)."""
    items, task, prompts = data.items, data.task, data.prompts
    texts = []
    for source in sorted(items["language"].unique()):
        texts += [("", part, source, text) for part, text in prompts.instruction(task.name, source).items()]
    for item in items.itertuples(index=False):
        texts += [(item.item_id, name, item.language, getattr(item, name)) for name in task.fields]
    rows = []
    for item_id, name, source, text in texts:
        for target in data.targets:
            prompt, example = prompts.translation(text, source, target, settings.translation_prompt)
            rows.append(("translated", item_id, name, source, target, text, prompt, example))
        if settings.baseline in ("paraphrase", "both"):
            prompt, example = prompts.paraphrase_prompt(text, source)
            rows.append(("paraphrased", item_id, name, source, source, text, prompt, example))
    return pd.DataFrame(rows, columns=["kind", "item_id", "field", "source", "language", "source_text", "prompt",
                                       "example"])


def make_senses(generator: Generator, requests: pd.DataFrame, settings: Settings = Settings(),  # noqa: B008 (frozen)
                cache: str | Path | None = None, progress: bool = False) -> pd.DataFrame:
    """The requests with `text` (the model's translation/paraphrase, inside one pair of surrounding
    quotes removed) and its `status`: ok, or a degenerate sense a small model often produces: empty, a
    copy of the source text (nothing translated), or a copy of the prompt's one-shot example."""
    outputs = generate_cached(generator, list(requests["prompt"]), cache, max_new_tokens=settings.max_new_tokens,
                              stop=STOP if settings.first_line else None, progress=progress, desc="translating",
                              temperature=settings.temperature, seed=settings.seed)
    senses = requests.assign(text=[unquote(plain_lines(o)) for o in outputs])
    senses["status"] = [_sense_status(t, src, ex) for t, src, ex in
                        zip(senses["text"], senses["source_text"], senses["example"])]
    return senses


def plain_lines(text: str) -> str:
    """Line breaks as "\\n" only: a bare carriage return in generated text would end a CSV row when the
    rows are read back (pandas quotes fields with "\\n" but not with "\\r")."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


QUOTES = {'"': '"', "'": "'", "“": "”", "„": "“", "«": "»", "「": "」", "『": "』", "‘": "’"}


def unquote(text: str) -> str:
    """`text` stripped, without one pair of quotes around all of it (App. C asks for "[text]" in quotes,
    and models often answer in quotes; the authors' release strips them too)."""
    text = text.strip()
    if len(text) < 2 or QUOTES.get(text[0]) != text[-1]:
        return text
    inner = text[1:-1]
    opener, closer = text[0], text[-1]
    if opener == closer:  # the first quote inside must open a quotation: '"ja" oder "nein"' is two texts
        first = inner.find(opener)
        one_text = first < 0 or first == 0 or not inner[first - 1].isalnum()
    else:
        one_text = inner.count(opener) == inner.count(closer)
    return inner.strip() if one_text else text


def _sense_status(text: str, source: str, example: str) -> str:
    def norm(value: str) -> str:
        return " ".join(str(value).casefold().split())

    if not text:
        return "empty"
    if norm(text) == norm(source):
        return "copy of source"
    if example and norm(text) == norm(example):
        return "copy of example"
    return "ok"


# -------------------------------------------------------------------------------------------- questions

def condition_requests(data: Data, senses: pd.DataFrame, settings: Settings) -> pd.DataFrame:
    """One row per item × condition × language with the instruction, the input and the full prompt."""
    items, task, prompts = data.items, data.task, data.prompts
    texts = {(r.kind, r.item_id, r.field, r.language): r.text for r in senses.itertuples(index=False)}
    status = {(r.kind, r.item_id, r.field, r.language): r.status for r in senses.itertuples(index=False)}
    rows = []
    for item in items.itertuples(index=False):
        src = item.language
        item_dict = item._asdict()
        has_reference = {t: all(pd.notna(item_dict.get(f"{f}_{t}")) for f in task.fields) for t in data.targets}
        plans = [("orig", src)] + [(c, t) for t in data.targets for c in ("T", "I", "X")]
        plans += [("R", t) for t in data.targets if has_reference[t]]
        plans += [("M", t) for t in data.targets] if settings.mixed else []  # Table 9: native instruction of t
        plans += [("P", src)] if settings.baseline in ("paraphrase", "both") else []
        plans += [("rerun", src)] if settings.baseline in ("rerun", "both") else []
        for condition, lang in plans:
            instruction_sense, input_sense = SENSES[condition]
            if instruction_sense in ("source", "native"):
                parts = prompts.instruction(task.name, src if instruction_sense == "source" else lang)
                part_status = dict.fromkeys(PARTS, "original")
            else:
                keys = {part: (instruction_sense, "", part, lang) for part in PARTS}
                parts = {part: texts[key] for part, key in keys.items()}
                part_status = {part: status[key] for part, key in keys.items()}
            instruction_status = next((s for s in part_status.values() if s != "ok"), "ok")
            if input_sense == "source":
                values, field_status = {f: item_dict[f] for f in task.fields}, dict.fromkeys(task.fields, "original")
            elif input_sense == "reference":
                values = {f: item_dict[f"{f}_{lang}"] for f in task.fields}
                field_status = dict.fromkeys(task.fields, "reference")
            else:
                keys = {f: (input_sense, item.item_id, f, lang) for f in task.fields}
                values = {f: texts[key] for f, key in keys.items()}
                field_status = {f: status[key] for f, key in keys.items()}
            input_status = next((s for s in field_status.values() if s != "ok"), "ok") \
                if input_sense in ("translated", "paraphrased") else next(iter(field_status.values()))
            answer_language = src if instruction_sense == "source" else lang
            reference_parts = prompts.instructions.get((task.name, lang)) if lang != src else None
            rows.append({"item_id": item.item_id, "id": item.id, "condition": condition, "language": lang,
                         "source_language": src, "instruction_language": answer_language,
                         "input_language": src if input_sense == "source" else lang,
                         "label": item.label, "instruction_status": instruction_status,
                         **{f"instruction_status_{p}": st for p, st in part_status.items()},
                         "input_status": input_status,
                         "instruction": " ".join(parts[p] for p in PARTS),
                         **{f"input_{f}": v for f, v in values.items()},
                         **{f"status_{f}": s for f, s in field_status.items()},
                         **{f"reference_{f}": item_dict.get(f"{f}_{lang}") if lang != src else None
                            for f in task.fields},
                         "instruction_reference": " ".join(reference_parts[p] for p in PARTS)
                         if reference_parts else None,
                         "prompt": prompts.question(parts, [values[f] for f in task.fields], answer_language,
                                                    settings.cue)})
    return pd.DataFrame(rows)


def answer_likelihood(lm, requests: pd.DataFrame, task: Task, progress: bool = False) -> pd.DataFrame:
    """Score every label's words after each prompt; the answer is the label with the highest
    log-sum-exp over its word variants."""
    from babelprobe.benchmarks.core.prefix import shared_prefix_logprobs

    texts, starts, owners = [], [], []
    for prompt, lang in zip(requests["prompt"], requests["instruction_language"]):
        words, sep = task.words(lang), separator(lang)
        for label in task.labels:
            for word in words[label]:
                texts.append(prompt + sep + word)
                starts.append(len(prompt))
        owners.append([label for label in task.labels for _ in words[label]])
    # Sum of the word's token log-probs given the prompt (boundary-safe); each prompt is run once and
    # all its words continue from its KV cache.
    flat = np.array([t.logprobs.sum() for t in shared_prefix_logprobs(lm, texts, score_from=starts, progress=progress)])
    scores = np.split(flat, np.cumsum([len(o) for o in owners])[:-1])
    predictions, tables = [], []
    for s, owner in zip(scores, owners):
        per_label = {label: float(np.logaddexp.reduce(s[np.array(owner) == label])) for label in task.labels}
        predictions.append(max(per_label, key=per_label.get))
        tables.append(json.dumps({str(k): round(v, 5) for k, v in per_label.items()}))
    return requests.assign(prediction=predictions, scores=tables, response="", match="likelihood",
                           method="likelihood")


# Characters of scripts written without spaces between words: a label word in them is found as a substring.
UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u0e00-\u0e7f]")
OPENERS = "\"'“”„«»「『（(*[‘`"
CLOSERS = "\"'“”«»」』）)*]’`.,!?。，！？:：;；"


def _occurrences(text: str, word: str) -> list[tuple[int, int]]:
    """Where `word` stands in `text` as a word of its own: (start, end) spans. Case is ignored, except
    for one-letter options (A, B, C), which must be upper case and not read as the article: "(A)", "A.",
    "is A" count, "A sentence" does not."""
    if len(word) == 1 and word.isalpha():
        spans = []
        for m in re.finditer(rf"(?<![^\W\d_]){re.escape(word.upper())}(?![^\W\d_])", text):
            delimited = m.start() > 0 and text[m.start() - 1] in OPENERS
            if word.upper() in "AI" and not delimited and re.match(r"\s+[^\W\d_]*[a-z]", text[m.end():]):
                continue  # "A sentence ...", "I think ...": the article, the pronoun
            spans.append(m.span())
        return spans
    pattern = re.escape(word.casefold()) if UNSPACED.search(word) else rf"(?<!\w){re.escape(word.casefold())}(?!\w)"
    return [m.span() for m in re.finditer(pattern, text.casefold())]


def map_answer(response: str, words: dict[int, list[str]]) -> tuple[int, str]:
    """The label of a generated response and how it was found (§3.2: the response matches the label word
    or contains it, ignoring case): 'match' (the response is the word, give or take quotes and
    punctuation), 'start' (it begins with the word), 'contains' (it contains the words of exactly one
    label). -1 with 'none' or 'ambiguous' (words of several labels) otherwise, or 'empty'."""
    text = response.strip()
    if not text:
        return -1, "empty"
    bare = text.strip(OPENERS + CLOSERS + " ").casefold()
    for label, variants in words.items():
        if any(bare == w.casefold() for w in variants):
            return label, "match"
    spans = [(start, end, label) for label, variants in words.items() for w in variants
             for start, end in _occurrences(text, w)]
    # A word inside a longer label word is not an answer of its own ("是" in "不是").
    spans = [s for s in spans if not any(o[0] <= s[0] and s[1] <= o[1] and o[1] - o[0] > s[1] - s[0] for o in spans)]
    opening = len(text) - len(text.lstrip(OPENERS + " "))
    first = [s for s in spans if s[0] == opening]
    if first:
        return max(first, key=lambda s: s[1] - s[0])[2], "start"
    labels = {s[2] for s in spans}
    if len(labels) == 1:
        return labels.pop(), "contains"
    return -1, "ambiguous" if labels else "none"


def answer_generate(generator: Generator, requests: pd.DataFrame, task: Task, settings: Settings = Settings(),  # noqa: B008 (frozen)
                    cache: str | Path | None = None, progress: bool = False) -> pd.DataFrame:
    """The generator answers and each answer is mapped to a label. Rerun rows are a second run of the
    orig prompts, sampled with seed + 1."""
    answered = []
    for rerun, part in requests.groupby(requests["condition"] == "rerun", sort=False):
        responses = generate_cached(generator, list(part["prompt"]), cache, max_new_tokens=settings.answer_tokens,
                                    stop=STOP if settings.first_line else None, progress=progress,
                                    desc="answering (rerun)" if rerun else "answering",
                                    temperature=settings.temperature, seed=settings.seed + int(rerun))
        mapped = [map_answer(r, task.words(lang)) for r, lang in zip(responses, part["instruction_language"])]
        answered.append(part.assign(prediction=[m[0] for m in mapped], scores="",
                                    response=[plain_lines(r).strip() for r in responses],
                                    match=[m[1] for m in mapped], method="generate"))
    return pd.concat(answered).loc[requests.index]
