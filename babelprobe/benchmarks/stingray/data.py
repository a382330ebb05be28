"""Reading StingrayBench: `load_stingray` brings every published form to one row per entry (the hub
configs, local files named after their config, the raw CSVs of the hub repository's data/ directory, the
bundled sample) and sets aside, counts and reports the records that cannot be scored."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from babelprobe import questions
from babelprobe.bundled import bundled_sets
from babelprobe.errors import BabelprobeError
from babelprobe.items import READERS, read_records
from babelprobe.languages import iso_codes

HUB_ID = "StingrayBench/StingrayBench"
PAIRS = ("en_de", "id_ms", "id_tl", "zh_ja")
BUNDLED = bundled_sets("stingray")
SUBSETS = {"": "false_friend", "_common": "true_cognate"}
REQUIRED = ("word", "lang1_sentence", "lang2_sentence", "usage_correctness_lang1_answer",
            "usage_correctness_lang2_answer")
OPTIONAL = ("lang_en_sentence", "language_flag", "meaning_l1", "meaning_l2")
SEMANTIC_LABELS = {"0": "A", "1": "B", "2": "C", "a": "A", "b": "B", "c": "C",
                   "l1": "A", "l2": "B", "both": "C"}
CONFIG_NAME = re.compile(r"^([a-z]{2})_([a-z]{2})(_common)?$")
# The raw CSVs of the hub repository's data/ directory (docs/datasets.md "StingrayBench").
RAW_SEMANTIC = "Which sentence is more semantically appropriate?"  # the start of the label column's name
RAW_USAGE = "Is the usage"  # the start of the two usage columns' names


# ------------------------------------------------------------------------------------------------ data

def load(source: str | Path, languages: list[str] | None = None, limit: int | None = None) -> pd.DataFrame:
    """The benchmark contract's loader: `load_stingray` with `languages` as language pairs (en_de)."""
    return load_stingray(source, pairs=languages, limit=limit)


def load_stingray(source: str | Path = "stingray-sample", pairs: list[str] | None = None,
                  limit: int | None = None, report: bool = True) -> pd.DataFrame:
    """StingrayBench records, one row per entry: `record_id`, `pair` (en_de), `l1`, `l2` (ISO codes),
    `subset` (false_friend / true_cognate), `word`, `word_l1`, `word_l2`, both sentences,
    `semantic_answer` (A/B/C), `usage_l1`/`usage_l2` (Yes/No) and the optional public fields.
    `pairs` keeps some language pairs; `limit` keeps the first N entries per pair × subset (after
    unscorable records are set aside). `attrs["skipped"]` lists the records skipped (source, reason),
    `attrs["read"]` counts the records read per config; `report` prints the skipped ones to stderr."""
    read, skipped, frames = {}, [], []
    for config, frame, names in _read_configs(str(source)):
        records, problems = _normalise(frame, config, names)
        read[config] = len(frame)
        skipped += problems
        frames.append(records)
    frames = [f for f in frames if len(f)]
    records = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["pair", "subset"])
    if pairs:
        wanted = [p.replace("-", "_") for p in pairs]
        available = sorted({_pair_of(config) for config in read})
        unknown = sorted(set(wanted) - set(available))
        if unknown:
            raise BabelprobeError(f"{source}: no language pair {', '.join(unknown)}; available: {', '.join(available)}")
        records = records[records["pair"].isin(wanted)]
        read = {c: n for c, n in read.items() if _pair_of(c) in wanted}
        skipped = [s for s in skipped if s["pair"] in wanted]
    if records.empty:
        first = f"; first: {skipped[0]['source']}: {skipped[0]['reason']}" if skipped else ""
        raise BabelprobeError(f"{source}: no StingrayBench record can be scored ({len(skipped)} skipped{first})")
    if limit is not None:
        records = records.groupby(["pair", "subset"], sort=False).head(limit)
    records = records.reset_index(drop=True)
    records.attrs.update(read=read, skipped=skipped)
    if report:
        report_skipped(records, str(source))
    return records


def report_skipped(records: pd.DataFrame, source: str = "") -> None:
    """One line per config with skipped records on stderr: how many of how many, and why."""
    questions.report_skipped(records, f"StingrayBench {source}", by="config")


def _pair_of(config: str) -> str:
    return config.removesuffix("_common")


def _read_configs(source: str) -> list[tuple[str, pd.DataFrame, dict]]:
    """(config name, records in the hub-config fields, {field: the column it came from}) per config."""
    if source in BUNDLED:
        return _read_local(BUNDLED[source].location)
    if source in (HUB_ID, f"hf:{HUB_ID}") or source.startswith("hf:"):
        return [(config, frame, {}) for config, frame in _read_hub(source.removeprefix("hf:"))]
    path = Path(source).expanduser()
    if not path.exists():
        raise BabelprobeError(f"StingrayBench source {source!r} is neither a bundled set ({', '.join(BUNDLED)}), "
                              f"a file, a directory nor hf:{HUB_ID}")
    return _read_local(path)


def _read_local(path: Path) -> list[tuple[str, pd.DataFrame, dict]]:
    files = _data_files(path)
    configs, seen = [], {}
    for file in files:
        frame = read_records(file)
        if "config" in frame.columns:  # one file holding several configs
            parts = [(str(name), part.drop(columns="config")) for name, part in frame.groupby("config", sort=False)]
        elif _config_of(file.stem):
            parts = [(_config_of(file.stem), frame)]
        else:
            raise BabelprobeError(f"{file}: cannot tell the StingrayBench config; name the file after it "
                                  f"(en_de.jsonl, en_de_common.jsonl, en_de_common_words.csv, ...) or add a "
                                  "'config' field")
        for config, part in parts:
            if config in seen:
                raise BabelprobeError(f"{file}: config {config!r} again (also in {seen[config]}); keep one file per config")
            seen[config] = file
            records, names = _from_raw(part, config, file) if _is_raw(part) else (part, {})
            configs.append((config, records, names))
    return configs


def _data_files(path: Path) -> list[Path]:
    """The data files of a file or directory; a directory without any, but with a `data/` folder (a
    copy of the hub repository), is read from there."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.suffix in READERS)
    if not files and (path / "data").is_dir():
        files = sorted(p for p in (path / "data").iterdir() if p.suffix in READERS)
    if not files:
        raise BabelprobeError(f"directory {path} has no .jsonl, .json, .csv or .parquet files")
    return files


def _config_of(stem: str) -> str | None:
    """'en_de', 'zh_ja_common', also 'en_de_common_words' (the raw CSV), 'stingray-en_de_common' or
    'en_de_common-test' -> the config name."""
    match = re.search(r"(?:^|[^a-z])([a-z]{2}_[a-z]{2}(?:_common)?)(?:$|[^a-z])", stem.lower())
    return match.group(1) if match else None


def _read_hub(name: str) -> list[tuple[str, pd.DataFrame]]:
    try:
        import datasets

        configs = []
        for pair in PAIRS:
            for suffix in SUBSETS:
                split = datasets.load_dataset(name, pair + suffix, split="test")
                frame = split.to_pandas()
                configs.append((pair + suffix, frame.assign(
                    _source=[f"hf:{name}[{pair + suffix}] row {i + 1}" for i in range(len(frame))])))
        return configs
    except Exception as err:  # offline, renamed dataset, missing config: all user-facing
        raise BabelprobeError(f"cannot load hub dataset {name!r} ({str(err).splitlines()[0]}); when offline, "
                              "download its files (the raw CSVs of its data/ directory work too) and pass "
                              "their directory to --items") from err


# ------------------------------------------------------------------------------------- raw CSV layout

def _is_raw(frame: pd.DataFrame) -> bool:
    return "L1" in frame.columns and bool({"Cognates", "Cognates_L1"} & set(frame.columns))


def _from_raw(frame: pd.DataFrame, config: str, file: Path) -> tuple[pd.DataFrame, dict]:
    """A raw CSV of the hub's data/ directory in the hub-config fields, and {field: raw column} for
    messages. `Cognates` (false friends) or `Cognates_L1`, `Cognates_L2` (true cognates) give the word,
    without a gloss in parentheses; `L1`, `L2` the sentences; the column starting with RAW_SEMANTIC the
    label (L1 / L2 / Both); the two starting with RAW_USAGE the usage answers (the one naming L1 first).
    A true-cognate file without usage columns is Yes in both languages (App. A.4)."""
    common = config.endswith("_common")
    out = pd.DataFrame(index=frame.index)
    names = {"lang1_sentence": "L1", "lang2_sentence": "L2"}
    if "Cognates_L1" in frame.columns:
        _require_raw(frame, ["Cognates_L2", "L2"], file)
        out["word"] = [f"{_bare(a)}, {_bare(b)}" if _bare(a) and _bare(b) else ""
                       for a, b in zip(frame["Cognates_L1"], frame["Cognates_L2"], strict=True)]
        names["word"] = "Cognates_L1/Cognates_L2"
    else:
        _require_raw(frame, ["L2"], file)
        out["word"] = frame["Cognates"].map(_bare)
        names["word"] = "Cognates"
    out["lang1_sentence"], out["lang2_sentence"] = frame["L1"], frame["L2"]
    for column, field in (("Meaning in L1", "meaning_l1"), ("Meaning in L2", "meaning_l2")):
        if column in frame.columns:
            out[field] = frame[column]
    english = [c for c in frame.columns if str(c).strip().lower().startswith("english")]
    if english:
        out["lang_en_sentence"] = frame[english[0]]
    semantic = _columns_starting(frame, RAW_SEMANTIC, file, at_most=1)
    if semantic:
        out["semantic_appropriate_answer"] = frame[semantic[0]]
        names["semantic_appropriate_answer"] = semantic[0]
        if not common:  # a false friend's label names the language its word is used correctly in
            out["language_flag"] = frame[semantic[0]]
    usage = _columns_starting(frame, RAW_USAGE, file, at_most=2)
    if len(usage) == 1:
        raise BabelprobeError(f"{file}: one usage column ({usage[0]!r}); the raw layout has two, for L1 and L2")
    if usage:
        named = {_side_named(c): c for c in usage}
        first, second = (named["L1"], named["L2"]) if {"L1", "L2"} <= set(named) else usage
        for field, column in (("usage_correctness_lang1_answer", first), ("usage_correctness_lang2_answer", second)):
            out[field], names[field] = frame[column], column
    elif common:
        out["usage_correctness_lang1_answer"] = out["usage_correctness_lang2_answer"] = "Yes"
    if "_source" in frame.columns:
        out["_source"] = frame["_source"]
    return out, names


def _bare(value) -> str:
    """A `Cognates` cell without its gloss: 'Gift (poison)' -> 'Gift'."""
    return "" if _missing(value) else re.split(r"[(（]", str(value))[0].strip()


def _side_named(column: str) -> str | None:
    """'L1' or 'L2' when the column name refers to exactly one of them ('... {L1}')."""
    sides = set(re.findall(r"(?<![A-Za-z0-9])L([12])(?![0-9])", str(column)))
    return f"L{sides.pop()}" if len(sides) == 1 else None


def _columns_starting(frame: pd.DataFrame, prefix: str, file: Path, at_most: int) -> list[str]:
    found = [c for c in frame.columns if str(c).strip().startswith(prefix)]
    if len(found) > at_most:
        raise BabelprobeError(f"{file}: {len(found)} columns start with {prefix!r} ({', '.join(map(repr, found))}); "
                              f"expected at most {at_most}")
    return found


def _require_raw(frame: pd.DataFrame, columns: list[str], file: Path) -> None:
    for column in columns:
        if column not in frame.columns:
            raise BabelprobeError(f"{file}: missing column {column!r} of the raw StingrayBench layout")


# -------------------------------------------------------------------------------------- normalising

class _Unscorable(ValueError):
    """A record that cannot be scored: counted, reported and skipped."""


def _normalise(frame: pd.DataFrame, config: str, names: dict) -> tuple[pd.DataFrame, list[dict]]:
    """One config's records in the row format of `load_stingray`, and the records set aside."""
    match = CONFIG_NAME.match(config)
    where = frame["_source"].iloc[0].rsplit(":", 1)[0] if "_source" in frame.columns and len(frame) else config
    if not match:
        raise BabelprobeError(f"{where}: unknown StingrayBench config {config!r}; use <l1>_<l2> or "
                              f"<l1>_<l2>_common with ISO 639-1 codes (e.g. {', '.join(PAIRS)})")
    l1, l2, common = match.groups()
    for code in (l1, l2):
        if code not in iso_codes():
            raise BabelprobeError(f"{where}: config {config!r}: {code!r} is not an ISO 639-1 language code")
    subset = SUBSETS[common or ""]
    for field in REQUIRED:
        if field not in frame.columns:
            raise BabelprobeError(f"{where}: missing field {_shown(field, names)}")
    rows, skipped = [], []
    for i, record in enumerate(frame.to_dict("records")):
        at = record.get("_source", f"{config} record {i + 1}")
        try:
            rows.append(_row(record, f"{config}-{i + 1:03d}", at, l1, l2, subset, names))
        except _Unscorable as why:
            skipped.append({"config": config, "pair": f"{l1}_{l2}", "subset": subset, "source": at, "reason": str(why)})
    return pd.DataFrame(rows), skipped


def _row(record: dict, record_id: str, at: str, l1: str, l2: str, subset: str, names: dict) -> dict:
    for field in REQUIRED:
        if _missing(record.get(field)):
            raise _Unscorable(f"missing field {_shown(field, names)}")
    word_l1, word_l2 = _words(str(record["word"]), subset)
    return {
        "record_id": record_id, "pair": f"{l1}_{l2}", "l1": l1, "l2": l2, "subset": subset,
        "word": str(record["word"]).strip(), "word_l1": word_l1, "word_l2": word_l2,
        "lang1_sentence": str(record["lang1_sentence"]), "lang2_sentence": str(record["lang2_sentence"]),
        "semantic_answer": _semantic_answer(record, subset, names),
        "usage_l1": _yes_no(record["usage_correctness_lang1_answer"], "usage_correctness_lang1_answer", names),
        "usage_l2": _yes_no(record["usage_correctness_lang2_answer"], "usage_correctness_lang2_answer", names),
        **{field: None if _missing(record.get(field)) else str(record[field]) for field in OPTIONAL},
        "_source": at,
    }


def _shown(field: str, names: dict) -> str:
    return f"{names[field]!r} ({field})" if field in names else repr(field)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value).strip() == ""


def _words(word: str, subset: str) -> tuple[str, str]:
    """True-cognate records give 'L1 word, L2 word'; a false friend is one word in both languages."""
    if subset == "true_cognate" and "," in word:
        first, second = (w.strip() for w in word.split(",", 1))
        return first, second
    return word.strip(), word.strip()


def _semantic_answer(record: dict, subset: str, names: dict) -> str:
    for field in ("semantic_appropriate_label", "semantic_appropriate_answer"):
        value = record.get(field)
        if not _missing(value):
            key = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value).strip().lower()
            if key not in SEMANTIC_LABELS:
                raise _Unscorable(f"{_shown(field, names)} is {value!r}; expected 0/1/2 (A/B/C) or L1/L2/Both")
            answer = SEMANTIC_LABELS[key]
            if (answer == "C") != (subset == "true_cognate"):
                kind = "true cognate" if subset == "true_cognate" else "false friend"
                raise _Unscorable(f"{_shown(field, names)} is {value!r}, but a {kind} has "
                                  f"{'both sentences' if answer != 'C' else 'exactly one sentence'} appropriate")
            return answer
    if subset == "true_cognate":
        return "C"  # a true cognate fits both sentences by definition
    raise _Unscorable("missing field 'semantic_appropriate_label'")


def _yes_no(value, field: str, names: dict) -> str:
    text = str(value).strip().lower()
    if text not in ("yes", "no"):
        raise _Unscorable(f"{_shown(field, names)} is {value!r}; expected Yes or No")
    return text.capitalize()
