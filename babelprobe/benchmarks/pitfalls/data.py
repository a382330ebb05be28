"""Reading Cross-Lingual Pitfalls: the released bilingual questions (`<Language>.json` files, one such
file, or the bundled sample) with literal quotes normalised and unscorable records skipped, counted and
reported (`load_pitfalls`), and the paper's per-model results (`load_paper_results`)."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import pandas as pd

from babelprobe.benchmarks.pitfalls.settings import NAME
from babelprobe.bundled import bundled_sets
from babelprobe.errors import BabelprobeError
from babelprobe.languages import codes_by_name, language_code

BUNDLED = bundled_sets(NAME)
FIELDS = ("question", "choices", "answer", "oriquestion", "transori", "transquestion", "transchoices", "transanswer")
LABELS = ("category", "source")  # kept; "unknown" when a record lacks them
KEPT = ("prequestion", "sufquestion", "transpre", "transsuf", "value", "rate_ori", "rate_trans", "subject")
COUNTS = ("records_read", "records_normalised", "records_skipped")
QUOTES = (("'", "'"), ('"', '"'), ("‘", "’"), ("“", "”"))  # literal quotes the release wraps choices in


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
        choices, answer = [unwrap_quotes(c) for c in choices], unwrap_quotes(answer)
    return (list(choices), answer) if answer in choices else None


def _wrapped(text: str) -> bool:
    return len(text) >= 2 and (text[0], text[-1]) in QUOTES


def unwrap_quotes(text: str) -> str:
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
