"""The Cross-Lingual Pitfalls prompts: the likelihood instructions per language (data/prompts/pitfalls.tsv;
`load_prompts`, `format_prompt`), the paper's App. E templates (data/prompts/pitfalls_paper.tsv;
`load_templates`, `template_for`), the prompts the released code sends (data/prompts/pitfalls_release.tsv:
the no-CoT simulation prompt of every language, the extraction prompt, the native seed-translation template
of every language; `load_release`, `release_template`), and the requests: every question in its four variants (English/target ×
original/perturbed; `variant_rows`, `build_requests`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.languages import separator
from babelprobe.prompts import check_placeholders, read_prompts

VARIANTS = {  # (side, version): (question field, choices field, answer field)
    ("en", "original"): ("oriquestion", "choices", "answer"),
    ("en", "perturbed"): ("question", "choices", "answer"),
    ("target", "original"): ("transori", "transchoices", "transanswer"),
    ("target", "perturbed"): ("transquestion", "transchoices", "transanswer"),
}
CARRIED = ("seed_language", "normalised", "records_read", "records_normalised", "records_skipped")


def load_prompts(path: str | Path | None = None) -> pd.DataFrame:
    """Likelihood prompts: instruction and answer label per language, indexed by ISO code (default: the
    paper's simulation instructions, data/prompts/pitfalls.tsv)."""
    table = read_prompts(path or "pitfalls", ("language", "code", "instruction", "answer"))
    return table.set_index("code")


def format_prompt(question: str, choices: list[str], language: str, prompts: pd.DataFrame) -> tuple[str, list[str]]:
    """(prompt, options): the instruction, question, choices one per line and the answer label; each
    option is a choice preceded by the language's word separator (a space, none in Chinese/Japanese)."""
    if language not in prompts.index:
        raise BabelprobeError(f"no Cross-Lingual Pitfalls prompt for language {language!r}; add a line to the "
                              f"prompt table (have: {', '.join(prompts.index)})")
    line = prompts.loc[language]
    listed = "\n".join(f"- {choice}" for choice in choices)
    prompt = f"{line['instruction']}\n{question}\n{listed}\n{line['answer']}"
    return prompt, [separator(language) + choice for choice in choices]


TEMPLATE_FIELDS = {  # name: placeholders it must have (App. E, and the released code where App. E has none)
    "answer": ("question", "choices"),
    "extract": ("question", "answer", "choices"),
    "perturb": ("question", "answer", "wrong_answer"),
    "translate": ("question", "choices", "ground_truth"),
    "translate_text": ("target", "text"),
    "check": ("ori_question", "question"),
    "check_extract": ("prompt",),
    "direct_perturb": ("question",),
}


def load_templates(path: str | Path | None = None) -> pd.DataFrame:
    """The paper's templates (data/prompts/pitfalls_paper.tsv, or your own file with the columns name,
    language, template), checked for their placeholders; indexed by (name, language)."""
    table = read_prompts(path or "pitfalls_paper", ("name", "language", "template"), optional=("origin",))
    for row in table.to_dict("records"):
        if row["name"] in TEMPLATE_FIELDS:
            allowed = ("language",) if row["name"] == "translate" else ()
            check_placeholders(row["template"], row["line"], TEMPLATE_FIELDS[row["name"]], allowed, once=False)
    return table.set_index(["name", "language"])


def template_for(templates: pd.DataFrame, name: str, language: str) -> tuple[str, str]:
    """(template, the language of the row used): the language's own row, else `*`, else English."""
    for key in (language, "*", "en"):
        if (name, key) in templates.index:
            return templates.at[(name, key), "template"], key
    raise BabelprobeError(f"the Cross-Lingual Pitfalls templates have no {name!r} row (language {language!r}, * or en)")


RELEASE_FIELDS = {"simulate": ("question", "choices"), "extract": ("question", "answer", "choices"),
                  "translate": ("question", "choices", "ground_truth")}


def load_release(path: str | Path | None = None) -> pd.DataFrame:
    """The released code's prompts (data/prompts/pitfalls_release.tsv, or your own file with the columns
    name, language, template), checked for their placeholders; indexed by (name, language)."""
    table = read_prompts(path or "pitfalls_release", ("name", "language", "template"), optional=("origin",))
    for row in table.to_dict("records"):
        if row["name"] in RELEASE_FIELDS:
            check_placeholders(row["template"], row["line"], RELEASE_FIELDS[row["name"]], (), once=False)
    return table.set_index(["name", "language"])


def release_template(table: pd.DataFrame, name: str, language: str) -> str:
    """The release's `name` prompt for `language` (an ISO code; `*` rows serve every language). A language
    the release has no prompt for is an error: the released evaluation is defined for its languages only."""
    for key in (language, "*"):
        if (name, key) in table.index:
            return table.at[(name, key), "template"]
    have = sorted(lang for n, lang in table.index if n == name)
    instead = "--translation paper" if name == "translate" else "--answer likelihood or --answer cot"
    raise BabelprobeError(f"the Cross-Lingual Pitfalls release has no {name!r} prompt for language {language!r} "
                          f"(it has {', '.join(have)}); use {instead} for other languages")


def format_choices(choices: list[str]) -> str:
    """The `{choices}` of a template: the list as the released code's f-strings print it (`['a', 'b']`)."""
    return str(list(choices))


# -------------------------------------------------------------------------------------------- requests

def variant_rows(questions: pd.DataFrame, variants: tuple[tuple[str, str], ...] = tuple(VARIANTS)) -> pd.DataFrame:
    """One row per question × variant (English/target × original/perturbed): its text, choices and gold."""
    rows = []
    for q in questions.to_dict("records"):
        for side, version in variants:
            question, choices, answer = VARIANTS[(side, version)]
            rows.append({"item_id": f"{q['question_id']}-{side}-{version}", "pair_id": q["question_id"],
                         "language": "en" if side == "en" else q["language"],
                         "language_name": "English" if side == "en" else q["language_name"],
                         "subset": q["category"], "side": side, "version": version, "target": q["language"],
                         "target_name": q["language_name"], "source": q["source"], "question": q[question],
                         "choices": list(q[choices]), "gold": list(q[choices]).index(q[answer]),
                         **{c: q[c] for c in CARRIED if c in q}})
    return pd.DataFrame(rows)


def build_requests(questions: pd.DataFrame, prompts: pd.DataFrame | None = None,
                   variants: tuple[tuple[str, str], ...] = tuple(VARIANTS)) -> pd.DataFrame:
    """`variant_rows` with the likelihood prompt and the options scored after it."""
    prompts = load_prompts() if prompts is None else prompts
    requests = variant_rows(questions, variants)
    formatted = [format_prompt(q, c, lang, prompts)
                 for q, c, lang in zip(requests["question"], requests["choices"], requests["language"], strict=True)]
    requests["prompt"] = [p for p, _ in formatted]
    requests["options"] = [o for _, o in formatted]
    return requests.drop(columns="choices")
