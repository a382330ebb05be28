"""Cross-Lingual Pitfalls (Xu et al., ACL 2025): questions a model answers in English but not in the
target language; evaluation, metrics and the Relative Affinity Score. The weakness search that makes
such questions is `pitfalls.search` (`babelprobe bench pitfalls-search`).

**Data.** `load_pitfalls(source, languages, limit)` reads the released bilingual questions: a directory of
`<Language>.json` files (`<Language>_results.json` holds the paper's per-model counts, `source/` the
English seed questions), one such file, or the bundled `pitfalls-sample`. Every question has four variants:

    English, original     oriquestion,   choices,      answer
    English, perturbed    question,      choices,      answer        (prequestion + oriquestion + sufquestion)
    target,  original     transori,      transchoices, transanswer
    target,  perturbed    transquestion, transchoices, transanswer

The release has broken records (docs/datasets.md): choices wrapped in literal quotes while the answer is
not (`'Alter Sparky'` vs `Alter Sparky`), records with `"transanswer": "None", "transchoices": []`. The
authors' evaluation keeps them and scores by exact match, so the first kind is always wrong and the second
unanswerable. Here quotes are normalised the same way on choices and answer (`normalise_side`) and a
record that still cannot be scored is skipped with its reason; every file is validated whole before
`limit`, one bad record never rejects a file and an unreadable file never stops the other languages.
Per language, the records read, normalised and skipped are printed, kept in `data.attrs["load_report"]`,
carried on every row and reported in the summary.

**Answering** (`Settings.answer`):
  - `likelihood` (default): the paper's simulation instruction in the question's language
    (data/prompts/pitfalls.tsv), the question, the choices one per line and an answer label; each choice
    is scored as a continuation (`choices.option_scores`, reduced per UTF-8 byte by default) and the best
    one is the answer. Method `likelihood`.
  - `generate` (`--protocol paper`): the paper's protocol (App. E): the generator answers zero-shot with
    chain of thought ("Template for Answering ... Questions (Zero-Shot + CoT)" in the question's
    language; English where App. E has none) and an extractor LLM picks the choice ("Template for
    Extracting Answer"); exact match with the gold choice. Method `cot-extract`.
Rows, summary and run.json record the protocol and method.

**Metrics.** Accuracy per language × version (× category) with Wilson intervals; the drop English →
target on the same questions with a paired bootstrap interval; `en_only`, the share right in English and
wrong in the target language (the paper's cross-lingual weakness). `simulation_score` is the paper's V
(§2.3). `relative_affinity` is the Relative Affinity Score D of §3.3 on an accuracy matrix A[x, y]
(`affinity_accuracy`: accuracy on language x of the expanded pairs from seed language y, averaged over
models; `search.expand_pairs` makes those pairs).

**Runs** (`babelprobe bench pitfalls`, `run`) resume: likelihood scoring keeps chunks of questions beside
`items.csv` (`runs.score_resumably`); generated answers and extractions are kept in `generations.jsonl`.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.benchmarks.core.choices import option_scores
from babelprobe.benchmarks.core.generate import SPEC_HELP
from babelprobe.benchmarks.core.logprobs import REDUCTIONS
from babelprobe.bundled import bundled_sets
from babelprobe.errors import BabelprobeError
from babelprobe.languages import codes_by_name, language_code, separator
from babelprobe.models import LoadedModel, load_model
from babelprobe.prompts import check_placeholders, read_prompts
from babelprobe.runs import score_resumably
from babelprobe.settings import option
from babelprobe.stats import paired_bootstrap, wilson

NAME = "pitfalls"
TITLE = "Cross-Lingual Pitfalls: English vs target-language weakness"
BUNDLED = bundled_sets(NAME)
FIELDS = ("question", "choices", "answer", "oriquestion", "transori", "transquestion", "transchoices", "transanswer")
LABELS = ("category", "source")  # kept; "unknown" when a record lacks them
KEPT = ("prequestion", "sufquestion", "transpre", "transsuf", "value", "rate_ori", "rate_trans", "subject")
VARIANTS = {  # (side, version): (question field, choices field, answer field)
    ("en", "original"): ("oriquestion", "choices", "answer"),
    ("en", "perturbed"): ("question", "choices", "answer"),
    ("target", "original"): ("transori", "transchoices", "transanswer"),
    ("target", "perturbed"): ("transquestion", "transchoices", "transanswer"),
}
CARRIED = ("seed_language", "normalised", "records_read", "records_normalised", "records_skipped")
COUNTS = ("records_read", "records_normalised", "records_skipped")
QUOTES = (("'", "'"), ('"', '"'), ("‘", "’"), ("“", "”"))  # literal quotes the release wraps choices in
BOOTSTRAP = 2000
CHUNK_QUESTIONS = 32  # questions scored between two checkpoints of a resumable run
C_AFFINITY = -1.0  # c of the Relative Affinity Score (App. B.1)
METHODS = {"likelihood": "likelihood", "generate": "cot-extract"}


@dataclass(frozen=True)
class Settings:
    """How a Cross-Lingual Pitfalls evaluation answers (recorded in run.json)."""

    protocol: str = option("default", help="settings preset: 'paper' answers as App. E does (zero-shot chain of "
                           "thought, the choice extracted by an LLM)")
    answer: str = option("likelihood", choices=tuple(METHODS),
        help="likelihood: score each choice as a continuation; generate: the generator answers with chain of "
        "thought and the extractor picks the choice (the paper's protocol)")
    reduction: str = option("per_byte",
        choices=REDUCTIONS, help="likelihood: how a choice's token log-probs are combined (choices differ in length)")
    prompts: str | None = option(None,
        metavar="FILE", help="likelihood: prompt table TSV instead of the paper's instructions (data/prompts/pitfalls.tsv)")
    generator: str = option("local", metavar="SPEC", help=f"generate: who answers: {SPEC_HELP}")
    extractor: str = option("generator", metavar="SPEC",
        help="generate: who extracts the chosen option from the answer ('generator': the same; the paper: gpt-4o-mini)")
    max_new_tokens: int = option(1024, budget=True, help="generate: longest answer or extraction (App. B.1: 1,024)")
    chat_template: bool = option(False, help="generate with 'local': wrap each prompt in the model's chat template")
    templates: str | None = option(None, metavar="FILE",
        help="generate: prompt table TSV instead of the paper's App. E templates (data/prompts/pitfalls_paper.tsv)")


PROTOCOLS = {"paper": {"answer": "generate", "max_new_tokens": 1024}}


# ------------------------------------------------------------------------------------------------ data

def resolve_source(source: str | Path) -> Path:
    """A bundled set's directory, or the path given."""
    return BUNDLED[str(source)].location if str(source) in BUNDLED else Path(source).expanduser()


def available_languages(source: str | Path) -> dict[str, Path]:
    """Language name -> question file, for a Pitfalls directory, a single `<Language>.json` or a bundled set."""
    path = resolve_source(source)
    if not path.exists():
        raise BabelprobeError(f"Cross-Lingual Pitfalls data {source!r} does not exist; pass the directory with "
                              f"<Language>.json files (e.g. Chinese.json), one such file, or {', '.join(BUNDLED)}")
    if path.is_file():
        return {path.stem: path}
    # <Language>_results.json and files not named after a language (run.json) are not question files
    found = {p.stem: p for p in sorted(path.glob("*.json")) if p.stem.lower() in codes_by_name()}
    if not found:
        raise BabelprobeError(f"{source}: no <Language>.json question files")
    return found


def select_languages(source: str | Path, languages: list[str] | None = None) -> dict[str, Path]:
    """The requested languages (names or ISO codes, any case) -> their files; all when None."""
    found = available_languages(source)
    if not languages:
        return found
    by_key = {name.lower(): name for name in found}
    by_key.update({language_code(name): name for name in found if name.lower() in codes_by_name()})
    chosen = {}
    for wanted in languages:
        name = by_key.get(wanted.lower())
        if name is None:
            raise BabelprobeError(f"{source}: no Cross-Lingual Pitfalls language {wanted!r}; available: "
                                  f"{', '.join(found)}")
        chosen[name] = found[name]
    return chosen


def load_pitfalls(source: str | Path, languages: list[str] | None = None, limit: int | None = None,
                  report: bool = True) -> pd.DataFrame:
    """Questions, one row per scorable bilingual question: `question_id` (Language-index in the file),
    `language_name`, `language` (ISO code), the released fields (quotes normalised), `answer_index`,
    `transanswer_index`, `normalised` and the file's `records_read`/`records_normalised`/`records_skipped`.
    Each file is validated whole, then `limit` keeps its first N scorable questions. Records that cannot be
    scored and unreadable files are skipped and reported (printed when `report`); `attrs["load_report"]`
    has one row per language, `attrs["skipped"]` one per skipped record. Only when nothing at all can be
    loaded is it an error."""
    frames, reports, skipped = [], [], []
    for name, path in select_languages(source, languages).items():
        questions, summary, dropped = _read_language(name, path)
        reports.append(summary)
        skipped += dropped
        if questions is not None and len(questions):
            frames.append(questions.head(limit) if limit is not None else questions)
    load_report = pd.DataFrame(reports)
    if report:
        _print_report(load_report)
    if not frames:
        problems = [p for p in load_report["problem"] if p]
        raise BabelprobeError(problems[0] if len(problems) == 1 else
                              f"{source}: no scorable Cross-Lingual Pitfalls question in "
                              f"{', '.join(load_report['language_name'])} ({'; '.join(problems)})")
    data = pd.concat(frames, ignore_index=True)
    data.attrs["load_report"] = load_report
    data.attrs["skipped"] = pd.DataFrame(skipped, columns=["language_name", "file", "record", "reason"])
    return data


load = load_pitfalls  # the benchmark contract's loader


def _read_language(name: str, path: Path) -> tuple[pd.DataFrame | None, dict, list[dict]]:
    """(questions or None, the language's report row, its skipped records)."""
    summary = {"language_name": name, "file": str(path), "records_read": 0, "records_normalised": 0,
               "records_skipped": 0, "problem": "", "reasons": ""}
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
        code = language_code(name)
    except json.JSONDecodeError as err:
        return None, {**summary, "problem": f"{path}:{err.lineno}: malformed JSON ({err.msg})"}, []
    except (OSError, UnicodeDecodeError) as err:
        return None, {**summary, "problem": f"{path}: cannot read ({err})"}, []
    except BabelprobeError as err:
        return None, {**summary, "problem": f"{path}: {err}"}, []
    if not isinstance(records, list):
        return None, {**summary, "problem": f"{path}: expected a list of question objects, found a "
                                            f"{type(records).__name__}"}, []
    rows, skipped, reasons = [], [], Counter()
    for i, record in enumerate(records):
        row, reason = check_record(record)
        if reason:
            reasons[reason] += 1
            skipped.append({"language_name": name, "file": str(path), "record": i + 1, "reason": reason})
            continue
        rows.append({"question_id": f"{name}-{i:04d}", "language_name": name, "language": code, **row})
    summary.update(records_read=len(records), records_normalised=sum(r["normalised"] for r in rows),
                   records_skipped=len(skipped), reasons="; ".join(f"{n} × {r}" for r, n in reasons.most_common()))
    if not rows:
        summary["problem"] = f"{path}: none of its {len(records)} records can be scored" + (
            f" ({summary['reasons']})" if reasons else "")
        return None, summary, skipped
    questions = pd.DataFrame(rows)
    for column in COUNTS:
        questions[column] = summary[column]
    return questions, summary, skipped


def check_record(record) -> tuple[dict | None, str]:
    """(the question's fields, "") for a scorable record, else (None, why it cannot be scored). Literal
    quotes are normalised on each side (`normalise_side`); `normalised` says whether that changed it."""
    if not isinstance(record, dict):
        return None, "not a JSON object"
    for field in FIELDS:
        value = record.get(field)
        if field.endswith("choices"):
            if value == [] and field == "transchoices":  # released as "transanswer": "None", "transchoices": []
                return None, f"'transchoices' is empty (transanswer {record.get('transanswer')!r})"
            if not isinstance(value, list) or len(value) < 2:
                return None, f"{field!r} is not a list of at least two choices"
            if not all(isinstance(c, str) and c.strip() for c in value):
                return None, f"{field!r} holds an empty or non-text choice"
        elif not isinstance(value, str) or not value.strip():
            return None, f"{field!r} is missing or empty"
    row = {field: record[field] for field in FIELDS}
    normalised = False
    for choices, answer in (("choices", "answer"), ("transchoices", "transanswer")):
        fixed = normalise_side(record[choices], record[answer])
        if fixed is None:
            return None, f"{answer} is not among its {choices}, even with quotes normalised"
        row[choices], row[answer] = fixed
        normalised |= fixed != (record[choices], record[answer])
    row.update({field: record.get(field) or "unknown" for field in LABELS})
    row.update({field: record.get(field) for field in KEPT})
    row["answer_index"] = row["choices"].index(row["answer"])
    row["transanswer_index"] = row["transchoices"].index(row["transanswer"])
    row["normalised"] = normalised
    return row, ""


def normalise_side(choices: list[str], answer: str) -> tuple[list[str], str] | None:
    """One side (English or target) of a record with literal quotes removed the same way from its choices
    and its answer, or None when the answer is not among the choices even then.

    When every choice is wrapped in the same pair of quotes (the release's `'Der Gartenstaat'` artifact),
    one layer is removed from every choice and from the answer if it is wrapped too; otherwise, only if the
    answer is not among the choices, surrounding spaces and one layer of quotes are removed from every
    choice and from the answer. Nothing else is changed."""
    if all(_wrapped(c) for c in choices) and len({(c[0], c[-1]) for c in choices}) == 1:
        choices, answer = [c[1:-1] for c in choices], answer[1:-1] if _wrapped(answer) else answer
    if answer not in choices:
        choices, answer = [_unwrap(c) for c in choices], _unwrap(answer)
    return (list(choices), answer) if answer in choices else None


def _wrapped(text: str) -> bool:
    return len(text) >= 2 and (text[0], text[-1]) in QUOTES


def _unwrap(text: str) -> str:
    text = text.strip()
    return text[1:-1].strip() if _wrapped(text) else text


def _print_report(report: pd.DataFrame) -> None:
    """One line per language whose file was normalised, skipped from, or unreadable (stderr)."""
    for row in report.to_dict("records"):
        if row["problem"]:
            print(f"pitfalls: skipped {row['language_name']}: {row['problem']}", file=sys.stderr)
        elif row["records_normalised"] or row["records_skipped"]:
            print(f"pitfalls: {row['language_name']}: {row['records_read']} records, {row['records_normalised']} with "
                  f"quotes normalised, {row['records_skipped']} skipped"
                  + (f" ({row['reasons']})" if row["reasons"] else ""), file=sys.stderr)


def load_paper_results(source: str | Path, name: str) -> pd.DataFrame | None:
    """The paper's results for one language (`<Language>_results.json`): per model, the accuracy on the
    perturbed questions in English and in the target language; None when the file is absent."""
    source = resolve_source(source)
    path = (source if source.is_dir() else source.parent) / f"{name}_results.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        total = float(data["Total Questions"])
        return pd.DataFrame({"model": list(data["English"]),
                             "en_accuracy": [data["English"][m] / total for m in data["English"]],
                             "target_accuracy": [data[name].get(m, math.nan) / total for m in data["English"]],
                             "n": int(total)})
    except (json.JSONDecodeError, KeyError, TypeError, ZeroDivisionError) as err:
        raise BabelprobeError(f"{path}: not a Cross-Lingual Pitfalls results file ({err!r})") from err


# --------------------------------------------------------------------------------------------- prompts

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


# --------------------------------------------------------------------------------------------- scoring

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
    lm = load_model(model) if isinstance(model, str) else model
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
    """The paper's answering protocol (App. E): `generator` answers each variant zero-shot with chain of
    thought ("Template for Answering ... Questions (Zero-Shot + CoT)" in the question's language, the
    English one where App. E has none), then `extractor` (default: the generator) picks its final answer
    from the choices ("Template for Extracting Answer"). A pick that is not exactly one of the choices is
    wrong, as in the released code. Generations go through the resumable `cache` (JSONL) when given.
    One row per question × variant (method 'cot-extract') with the response, the extraction and `correct`."""
    from babelprobe.benchmarks.core.generate import generate_cached

    templates = load_templates() if templates is None else templates
    extractor = extractor or generator
    rows = variant_rows(questions, variants)
    asked = [template_for(templates, "answer", lang) for lang in rows["language"]]
    prompts = [t.format(question=q, choices=format_choices(c))
               for (t, _), q, c in zip(asked, rows["question"], rows["choices"], strict=True)]
    responses = generate_cached(generator, prompts, cache, max_new_tokens=max_new_tokens, progress=progress,
                                desc="answering")
    extract, _ = template_for(templates, "extract", "en")
    picks = generate_cached(extractor, [extract.format(question=q, answer=r, choices=format_choices(c))
                                        for q, r, c in zip(rows["question"], responses, rows["choices"], strict=True)],
                            cache, max_new_tokens=max_new_tokens, progress=progress, desc="extracting")
    parsed = [parse_choice(p, c) for p, c in zip(picks, rows["choices"], strict=True)]
    rows.insert(4, "method", METHODS["generate"])
    rows["template_language"] = [lang for _, lang in asked]
    rows["n_choices"] = rows["choices"].map(len)
    rows["response"], rows["extraction"] = responses, picks
    rows["extracted"] = [text for _, text in parsed]
    rows["predicted"] = [index for index, _ in parsed]
    rows["correct"] = rows["predicted"] == rows["gold"]
    rows["generator"], rows["extractor"] = generator.name, extractor.name
    rows["choices"] = rows["choices"].map(lambda c: json.dumps(c, ensure_ascii=False))
    return rows


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
    cleaned = [_unwrap(c) for c in choices]
    return (cleaned.index(_unwrap(picked)) if _unwrap(picked) in cleaned else -1), picked


def _generator(models, spec: str, chat_template: bool):
    """A generator by spec; 'local' with the chat template when asked (instruction-tuned local models)."""
    if spec == "local" and chat_template:
        from babelprobe.benchmarks.core.generate import local_generator

        return local_generator(models.lm, batch_size=models.batch_size, chat_template=True, progress=models.progress)
    return models.generator(spec)


def run(data: pd.DataFrame, models, settings: Settings = Settings(), out: Path | None = None,
        progress: bool = True) -> pd.DataFrame:
    """The benchmark contract's run: every variant of every question, by likelihood (in chunks of questions
    kept in `out`, so an interrupted run resumes) or by the paper's protocol (generations kept in
    `out/generations.jsonl`). Writes `load-report.csv` (records read/normalised/skipped per language, and
    every skipped record with its reason) into `out`."""
    from babelprobe.benchmarks.base import as_models
    from babelprobe.settings import settings_record
    from babelprobe.tables import write_table

    models = as_models(models)
    if out is not None and "load_report" in data.attrs:
        write_table(_load_table(data), Path(out) / "load-report.csv")
    if settings.answer == "generate":
        answerer_ = _generator(models, settings.generator, settings.chat_template)
        extractor = answerer_ if settings.extractor == "generator" else _generator(models, settings.extractor,
                                                                                     settings.chat_template)
        rows = answer_cot(data, answerer_, extractor, load_templates(settings.templates),
                          max_new_tokens=settings.max_new_tokens,
                          cache=Path(out) / "generations.jsonl" if out is not None else None, progress=progress)
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
                                   progress=progress, desc="questions", unit="question_id")
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
    if settings.answer == "generate":
        templates = load_templates(settings.templates)
        for name in ("answer", "extract"):
            template_for(templates, name, "en")
    else:
        prompts = load_prompts(settings.prompts)
        for language in sorted({"en", *data["language"]}):
            if language not in prompts.index:
                raise BabelprobeError(f"no Cross-Lingual Pitfalls prompt for language {language!r} in "
                                      f"{settings.prompts or 'pitfalls.tsv'}; add a line for it")


# --------------------------------------------------------------------------------------------- metrics

def simulation_score(en_accuracy, target_accuracy, gamma: float = 2.0):
    """The paper's simulation score V = (mean English accuracy over the simulation models)^γ − (mean
    target accuracy), γ = 2 (§2.3, Eq. 8): high only when English is (nearly) always right and the target
    language wrong; γ > 1 punishes English mistakes more than the target accuracy rewards.

    The released code (run.py `evaluate_function`) ranks by log(1 + (β^E)² / ((β^T)² + 0.001)) −
    20·(1 − β^E)³ instead; it keeps only children with β^E = 1, where both order candidates alike. The
    `value` field of the released <Language>.json records is that quantity (3.2 for β^T = 0.2), not V."""
    return np.asarray(en_accuracy, float) ** gamma - np.asarray(target_accuracy, float)


def question_scores(rows: pd.DataFrame, gamma: float = 2.0) -> pd.DataFrame:
    """Per question × version: β^E and β^T, the mean correctness over the models in `rows` (the
    `score_pitfalls` tables of several models, concatenated; told apart by `model`), and V."""
    wide_rows = pd.concat([paired(part).assign(model=name) for name, part in rows.groupby("model", sort=False)])
    keys = ["target", "target_name", "pair_id", "subset", "version"]
    out = wide_rows.groupby(keys, sort=False).agg(models=("model", "nunique"), en_accuracy=("en_correct", "mean"),
                                                  target_accuracy=("target_correct", "mean")).reset_index()
    out["value"] = simulation_score(out["en_accuracy"], out["target_accuracy"], gamma)
    return out


def paired(rows: pd.DataFrame) -> pd.DataFrame:
    """English and target correctness side by side: one row per question × version."""
    wide_rows = rows.pivot_table(index=["target", "target_name", "pair_id", "subset", "version"], columns="side",
                                 values="correct", aggfunc="first")
    wide_rows = wide_rows.rename(columns={"en": "en_correct", "target": "target_correct"}).reset_index()
    wide_rows.columns.name = None
    if "question" in rows.columns:  # the English question text: released sets repeat originals
        english = rows[rows["side"] == "en"].set_index(["pair_id", "version"])["question"]
        wide_rows["question"] = [english.get((p, v)) for p, v in zip(wide_rows["pair_id"], wide_rows["version"],
                                                                     strict=True)]
    missing = wide_rows.reindex(columns=["en_correct", "target_correct"]).isna().any(axis=1)
    if missing.any():
        raise BabelprobeError(f"question {wide_rows.loc[missing, 'pair_id'].iloc[0]} lacks its English or target row")
    return wide_rows.astype({"en_correct": bool, "target_correct": bool})


def pitfalls_summary(rows: pd.DataFrame, by_category: bool = True, seed: int = 0) -> pd.DataFrame:
    """Per target language × version (× category, and 'all'): n questions (n_unique distinct English
    texts: the released sets hold several perturbations of one original), English and target accuracy
    (Wilson 95%), drop = English − target (paired bootstrap 95%) and en_only = right in English, wrong
    in the target language."""
    wide_rows = paired(rows)
    groups = [("all", wide_rows)]
    if by_category:
        groups += [(category, part) for category, part in wide_rows.groupby("subset", sort=True)]
    out = []
    rng = np.random.default_rng(seed)
    for category, part in groups:
        for (target, name, version), g in part.groupby(["target", "target_name", "version"], sort=False):
            en, tg = g["en_correct"].to_numpy(), g["target_correct"].to_numpy()
            row = {"target": target, "target_name": name, "version": version, "subset": category, "n": len(g),
                   "n_unique": g["question"].nunique() if "question" in g else np.nan}
            for side, values in (("en", en), ("target", tg)):
                low, high = wilson(values.sum(), len(values))
                row.update({f"{side}_accuracy": values.mean(), f"{side}_ci_low": low, f"{side}_ci_high": high})
            row["drop"] = en.mean() - tg.mean()
            row["drop_ci_low"], row["drop_ci_high"] = paired_bootstrap(en.astype(float) - tg.astype(float), rng, BOOTSTRAP)
            row["en_only"] = float(np.mean(en & ~tg))
            out.append(row)
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------- Relative Affinity Score

def affinity_accuracy(rows: pd.DataFrame) -> pd.DataFrame:
    """A[x, y]: accuracy on language x (`language`, the rows) of the expanded pairs from seed language y
    (`seed_language`, the columns), computed per `model` and averaged over the models (§3.3, App. B.2:
    "the average accuracy of these models"). English rows are left out."""
    for column in ("seed_language", "language", "correct"):
        if column not in rows.columns:
            raise BabelprobeError(f"affinity rows need a {column!r} column (evaluation rows of expanded pairs)")
    rows = rows[rows["language"] != "en"]
    models = rows["model"] if "model" in rows.columns else pd.Series("model", index=rows.index)
    per_model = [part.pivot_table(index="language", columns="seed_language", values="correct", aggfunc="mean")
                 for _, part in rows.assign(model=models).groupby("model", sort=False)]
    accuracy = sum(per_model) / len(per_model)
    accuracy.index.name, accuracy.columns.name = "language", "seed_language"
    return accuracy


def relative_affinity(accuracy: pd.DataFrame, c: float = C_AFFINITY) -> pd.DataFrame:
    """The Relative Affinity Score of §3.3, D[x, y] = ((A[x, y] − Ā_x) / Ā_x) · exp(c · |Ā_y − Ā_x|), with
    A[x, y] the accuracy on language x of the expanded pairs from seed language y (rows x, columns y, as
    `affinity_accuracy` returns it), Ā_x the mean of row x over every seed language (its own included)
    and c = −1 (App. B.1). Lower values mean stronger affinity: y's weaknesses persist in x. Same index
    and columns as `accuracy`; NaN where a cell or a mean is missing."""
    languages = list(accuracy.index)
    if sorted(accuracy.columns) != sorted(languages):
        raise BabelprobeError(f"the affinity accuracy matrix must have the same languages as rows (evaluation) and "
                              f"columns (seed): rows {languages}, columns {list(accuracy.columns)}")
    a = accuracy[languages].to_numpy(float)
    mean = np.nanmean(a, axis=1)  # Ā_x
    with np.errstate(divide="ignore", invalid="ignore"):
        d = (a - mean[:, None]) / mean[:, None] * np.exp(c * np.abs(mean[None, :] - mean[:, None]))
    return pd.DataFrame(d, index=accuracy.index, columns=languages)


# --------------------------------------------------------------------------------------------- summary

CELL = ["target", "target_name", "version", "subset"]
METRICS = {"en_accuracy": ("en", "wilson"), "target_accuracy": ("target", "wilson"),
           "drop": ("drop", "paired bootstrap over questions"), "en_only": (None, "")}


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """The benchmark contract's long summary: per target language × version × category (and `all`),
    `metric` en_accuracy, target_accuracy, drop (English − target) and en_only, with `value`, `ci_low`,
    `ci_high`, `n` (questions) and `n_unique` (distinct English texts); per target language (version
    `file`) the records read, normalised and skipped when loading. Every row names the `method` and
    `protocol` that answered."""
    out = []
    for cell in pitfalls_summary(rows).to_dict("records"):
        where = {k: cell[k] for k in CELL}
        for metric, (prefix, interval) in METRICS.items():
            low, high = (cell[f"{prefix}_ci_low"], cell[f"{prefix}_ci_high"]) if prefix else (np.nan, np.nan)
            out.append({**where, "metric": metric, "value": cell[metric], "ci_low": low, "ci_high": high,
                        "n": cell["n"], "n_unique": cell["n_unique"], "interval": interval})
    if set(COUNTS) <= set(rows.columns):
        for (target, name), part in rows.groupby(["target", "target_name"], sort=False):
            for metric in COUNTS:
                out.append({"target": target, "target_name": name, "version": "file", "subset": "all",
                            "metric": metric, "value": int(part[metric].iloc[0]), "ci_low": np.nan, "ci_high": np.nan,
                            "n": int(part["records_read"].iloc[0]), "n_unique": np.nan, "interval": ""})
    summary = pd.DataFrame(out)
    for column in ("method", "protocol"):
        summary[column] = ",".join(map(str, rows[column].unique())) if column in rows.columns else ""
    return summary


def wide(summary: pd.DataFrame) -> pd.DataFrame:
    """The long summary's accuracy cells back in `pitfalls_summary`'s one-row-per-cell form (figures, printing)."""
    out = []
    for _, cell in summary[summary["metric"].isin(list(METRICS))].groupby(CELL, sort=False):
        by = cell.set_index("metric")
        row = {k: cell[k].iloc[0] for k in CELL} | {"n": cell["n"].iloc[0], "n_unique": cell["n_unique"].iloc[0]}
        for metric, (prefix, _) in METRICS.items():
            row[metric] = by.at[metric, "value"]
            if prefix:
                row[f"{prefix}_ci_low"], row[f"{prefix}_ci_high"] = by.at[metric, "ci_low"], by.at[metric, "ci_high"]
        out.append(row)
    return pd.DataFrame(out)


def load_counts(summary: pd.DataFrame) -> pd.DataFrame:
    """Per target language: records read, normalised and skipped when loading (empty if not recorded)."""
    counts = summary[summary["metric"].isin(COUNTS)]
    if counts.empty:
        return pd.DataFrame(columns=["language", *COUNTS])
    table = counts.pivot_table(index="target_name", columns="metric", values="value", aggfunc="first", sort=False)
    return table.reindex(columns=list(COUNTS)).astype(int).rename_axis("language").reset_index()


def format_summary(summary: pd.DataFrame) -> str:
    """The overall rows as printed by the CLI: value [95% interval], then the records per language."""
    method = summary["method"].iloc[0] if "method" in summary and len(summary) else ""
    cells = wide(summary)
    table = cells[cells["subset"] == "all"]

    def interval(value: str, prefix: str) -> list[str]:
        return [f"{v:.3f} [{lo:.3f}, {hi:.3f}]" for v, lo, hi in
                zip(table[value], table[f"{prefix}_ci_low"], table[f"{prefix}_ci_high"], strict=True)]

    text = pd.DataFrame({"language": table["target_name"], "version": table["version"], "n": table["n"],
                         "distinct": table["n_unique"], "English": interval("en_accuracy", "en"),
                         "target": interval("target_accuracy", "target"), "drop": interval("drop", "drop"),
                         "en_only": table["en_only"].map(lambda v: f"{v:.3f}")})
    lines = ([f"answered by: {method}"] if method else []) + [text.to_string(index=False)]
    counts = load_counts(summary)
    if len(counts):
        counts.columns = ["language", "records read", "quotes normalised", "skipped (cannot be scored)"]
        lines += ["", counts.to_string(index=False)]
    return "\n".join(lines)
