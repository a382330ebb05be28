"""The closed-book prompts of ECLeKTiC (data/prompts/eclektic.tsv: the paper's App. A.3 sets and
babelprobe's `qa` frame; `prompt_templates`, `closed_book_prompts`) and which of them a run uses
(`condition`, `first_line`)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from babelprobe.benchmarks.eclektic.data import field_text
from babelprobe.benchmarks.eclektic.settings import Settings
from babelprobe.errors import BabelprobeError
from babelprobe.languages import language_names
from babelprobe.prompts import check_placeholders, placeholders, read_prompts

PROMPT_FILE = "eclektic"  # data/prompts/eclektic.tsv: closed-book sets and the judge prompt (set `judge`)
# What a closed-book template may use, and the record field each comes from (for error messages).
FILLED_FROM = {"question": "L_q", "in_lang": "original_lang", "original_title": "title",
               "original_context": "content"}


def prompt_templates(prompt_set: str = "qa", path: str | Path | None = None) -> dict[str, str]:
    """Templates by language (`*`: any language) of a set in data/prompts/eclektic.tsv (columns set,
    language, template), or of a prompt file of your own with columns language and template (a `set`
    column, if any, is ignored: the whole file is the set)."""
    rows = read_prompts(path or PROMPT_FILE, ("language", "template"), optional=("set",))
    if not path:
        chosen = rows[rows["set"] == prompt_set]
        if chosen.empty:
            sets = sorted(set(rows["set"]) - {"judge"})
            raise BabelprobeError(f"{PROMPT_FILE}: no prompt set {prompt_set!r}; available: {', '.join(sets)}")
        rows = chosen
    for row in rows.to_dict("records"):
        check_placeholders(row["template"], f"{row['line']}: the template for {row['language']}", ("question",),
                           allowed=tuple(FILLED_FROM)[1:])
    return dict(zip(rows["language"], rows["template"]))


def closed_book_prompts(questions: pd.DataFrame, templates: dict[str, str]) -> list[str]:
    """Each question in its language's template (or the `*` template), with {in_lang} (English name of
    the source language), {original_title} and {original_context} filled in."""
    missing = sorted(set(questions["language"]) - set(templates)) if "*" not in templates else []
    if missing:
        raise BabelprobeError(f"no closed-book prompt for language {', '.join(missing)}; add it to the prompt "
                              "file (--prompt-file) or use --prompt-set closed-book")
    names = language_names()
    prompts = []
    for row in questions.to_dict("records"):
        template = templates.get(row["language"], templates.get("*", ""))
        values = {"question": row["question"], "in_lang": names.get(row["source_language"], row["source_language"]),
                  "original_title": field_text(row.get("title")), "original_context": field_text(row.get("original_context"))}
        for name in placeholders(template):
            if not values[name]:
                raise BabelprobeError(f"the prompt uses {{{name}}} but question {row['q_id']} has none "
                                      f"(field {FILLED_FROM[name]!r} of its record)")
        prompts.append(fill_template(template, values))
    return prompts


def fill_template(template: str, values: dict[str, str]) -> str:
    """Placeholders replaced in one pass (a question that contains '{context}' stays as it is)."""
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), template)


def chat_answerer(settings: Settings) -> bool | None:
    """Does the answerer read chat turns, as far as the settings tell: an `openai:` endpoint or
    `--chat-template on` yes, `off` no; `auto` on a local model: None (it depends on the model)."""
    if settings.generator.startswith("openai:") or settings.chat_template == "on":
        return True
    return None if settings.chat_template == "auto" else False


def condition(settings: Settings, chat: bool | None = None) -> str:
    """The closed-book condition a run uses: the prompt set (`auto` resolved: closed-book for a chat
    answerer, qa otherwise) or your file's name. `chat`: whether the answerer reads chat turns (known
    once its generator is made); None: as the settings tell (`chat_answerer`)."""
    if settings.prompt_file:
        return Path(settings.prompt_file).stem
    if settings.prompt_set != "auto":
        return settings.prompt_set
    chat = chat_answerer(settings) if chat is None else chat
    if chat is None:
        raise BabelprobeError("with --chat-template auto the prompt set depends on whether the model has a chat "
                              "template: say whether it reads chat turns (condition(settings, chat=...))")
    return "closed-book" if chat else "qa"


def first_line(settings: Settings, chat: bool | None = None) -> bool:
    """Is the answer cut at its first line?"""
    if settings.answer_cut == "auto":
        return condition(settings, chat) == "qa"
    return settings.answer_cut == "first-line"
