"""Reading ECLeKTiC: the released record layout (one record per question, translations as `L_q`, `L_a`,
`L_c`) or a long file, from the bundled samples, a local file or directory or the hub, as one row per
(question, language) (`load_eclektic`)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.bundled import bundled_sets
from babelprobe.errors import BabelprobeError
from babelprobe.items import read_records
from babelprobe.languages import iso_codes

BUNDLED = bundled_sets("eclektic")
HUB_FILE = "eclektic_main.jsonl"


def load(source: str | Path, languages: list[str] | None = None, limit: int | None = None) -> pd.DataFrame:
    """The benchmark contract's loader (`load_eclektic`)."""
    return load_eclektic(source, languages=languages, limit=limit)


def load_eclektic(source: str | Path, languages: list[str] | None = None, limit: int | None = None) -> pd.DataFrame:
    """One row per (question, language); `languages` keeps questions whose source language is listed
    and their rows in listed languages; `limit` keeps the first N questions per source language."""
    frame, origin = _read_source(str(source))
    questions = _long_rows(frame, origin)
    if languages:
        unknown = sorted(set(languages) - set(questions["language"]))
        if unknown:
            raise BabelprobeError(f"language {', '.join(unknown)} not in {origin}; available: "
                                  f"{', '.join(sorted(questions['language'].unique()))}")
        questions = questions[questions["source_language"].isin(languages) & questions["language"].isin(languages)]
    if limit is not None:
        keep = questions.drop_duplicates("q_id").groupby("source_language", sort=False).head(limit)["q_id"]
        questions = questions[questions["q_id"].isin(keep)]
    if questions.empty:
        raise BabelprobeError(f"no ECLeKTic questions left in {origin} after selecting languages={languages}")
    return questions.reset_index(drop=True)


def _read_source(source: str) -> tuple[pd.DataFrame, str]:
    if source in BUNDLED:
        return read_records(BUNDLED[source].location), source
    if source.startswith("hf:"):
        return read_records(_download(source[3:])), source
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".json", ".csv", ".parquet"))
        if not files:
            raise BabelprobeError(f"directory {source} has no .jsonl, .json, .csv or .parquet file")
        return pd.concat([read_records(p) for p in files], ignore_index=True), source
    if path.is_file():
        return read_records(path), source
    raise BabelprobeError(f"ECLeKTic data {source!r} is neither {', '.join(BUNDLED)}, a file, a directory nor "
                          "hf:ORG/NAME[:FILE]; the release is eclektic_main.jsonl (kaggle.com/datasets/omergoldman/eclektic)")


def _download(spec: str) -> Path:
    repo, _, filename = spec.partition(":")
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo, filename or HUB_FILE, repo_type="dataset"))
    except Exception as err:  # offline, missing repo or file: all user-facing
        raise BabelprobeError(f"cannot download {filename or HUB_FILE} from dataset {repo!r}: "
                              f"{str(err).splitlines()[0]}; download it yourself and pass its path") from err


def field_text(value) -> str:
    """A field as a stripped string; missing (None/NaN) is empty."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    return str(value).strip()


def _long_rows(frame: pd.DataFrame, origin: str) -> pd.DataFrame:
    columns = set(frame.columns)
    wide = sorted(c[:-2] for c in columns if re.fullmatch(r"[a-z]{2}_q", c))
    if wide:
        rows = [row for record in frame.to_dict("records") for row in _wide_record(record, wide)]
    elif {"original_lang", "question", "answer"} <= columns and ({"lang", "language"} & columns):
        rows = [_long_record(record) for record in frame.to_dict("records")]
    else:
        needed = "q_id, original_lang and L_q/L_a[/L_c] per language (or lang, question, answer)"
        raise BabelprobeError(f"{origin}: not ECLeKTic records; expected fields {needed}, got "
                              f"{', '.join(sorted(c for c in columns if c != '_source'))}")
    long = pd.DataFrame(rows)
    _check_questions(long)
    long["subset"] = np.where(long["language"] == long["source_language"], "source", "target")
    long["pair_id"] = long["q_id"]
    long["item_id"] = long["q_id"] + ":" + long["language"]
    long["label"] = -1
    long["text"] = long["question"]
    # The source-language context of each question (the cross-lingual open-book hint, App. A.3).
    source_context = long[long["subset"] == "source"].set_index("q_id")["context"]
    long["original_context"] = long["q_id"].map(source_context).fillna("")
    order = ["item_id", "pair_id", "q_id", "language", "source_language", "subset", "label", "text", "question",
             "answer", "context", "original_context", "title", "url", "_source"]
    return long[order].sort_values(["source_language", "q_id", "subset", "language"], kind="stable")


def _required(record: dict, field: str) -> str:
    value = field_text(record.get(field))
    if not value:
        raise BabelprobeError(f"{record.get('_source', '?')}: missing field {field!r}")
    return value


def _wide_record(record: dict, languages: list[str]) -> list[dict]:
    """One released record -> one row per language that has a question."""
    where = record.get("_source", "?")
    q_id, source = _required(record, "q_id"), _required(record, "original_lang")
    rows = []
    for lang in sorted(set(languages) | {source}):
        fallback = lang == source  # the source fields may be given only as question/answer/content
        question = field_text(record.get(f"{lang}_q")) or (field_text(record.get("question")) if fallback else "")
        if not question:
            continue
        answer = field_text(record.get(f"{lang}_a")) or (field_text(record.get("answer")) if fallback else "")
        if not answer:
            raise BabelprobeError(f"{where}: question {q_id} has {lang}_q but no answer in field '{lang}_a'")
        context = field_text(record.get(f"{lang}_c")) or (field_text(record.get("content")) if fallback else "")
        rows.append({"q_id": q_id, "language": lang, "source_language": source, "question": question,
                     "answer": answer, "context": context, "title": field_text(record.get("title")),
                     "url": field_text(record.get("url")), "_source": where})
    if not any(r["language"] == source for r in rows):
        raise BabelprobeError(f"{where}: question {q_id} has no question in its source language {source!r} "
                              f"(field '{source}_q' or 'question')")
    return rows


def _long_record(record: dict) -> dict:
    language = field_text(record.get("lang")) or field_text(record.get("language"))
    return {"q_id": _required(record, "q_id"), "language": language,
            "source_language": _required(record, "original_lang"), "question": _required(record, "question"),
            "answer": _required(record, "answer"), "context": field_text(record.get("content")),
            "title": field_text(record.get("title")), "url": field_text(record.get("url")),
            "_source": record.get("_source", "?")}


def _check_questions(long: pd.DataFrame) -> None:
    codes = iso_codes()
    for field, name in (("source_language", "original_lang"), ("language", "language")):
        bad = long[~long[field].isin(codes)]
        if not bad.empty:
            row = bad.iloc[0]
            raise BabelprobeError(f"{row['_source']}: {name} {row[field]!r} of question {row['q_id']} is not an "
                                  "ISO 639-1 code (like en, de, ja)")
    duplicated = long[long.duplicated(["q_id", "language"], keep=False)]
    if not duplicated.empty:
        row = duplicated.iloc[-1]
        raise BabelprobeError(f"{row['_source']}: question {row['q_id']} appears twice in language {row['language']}")
    sources = long.groupby("q_id")["source_language"].nunique()
    if (sources > 1).any():
        raise BabelprobeError(f"question {sources[sources > 1].index[0]} has rows with different original_lang")
    has_source = long[long["language"] == long["source_language"]]["q_id"]
    missing = sorted(set(long["q_id"]) - set(has_source))
    if missing:
        raise BabelprobeError(f"question {missing[0]} has no row in its source language")
