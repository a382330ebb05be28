"""Items: the one schema every stage reads, with validation and file formats.

An item is one text unit (docs/design.md): `item_id` (unique), `pair_id` (its minimal pair or parallel
group), `language` (ISO 639-1), `subset`, `label` (1 acceptable, 0 unacceptable, -1 not applicable)
and `text`; COMPS-style pairs also carry `prefix` and `continuation` (text = prefix + separator +
continuation). Unknown fields are kept.

`load_items(source)` takes a bundled set name (`xcomps-sample`), a file (.jsonl, .json, .csv, .tsv,
.parquet), a directory of such files, a hub id `hf:ORG/NAME[:config[:split]]`, or lm-evaluation-harness
multiple-choice tasks `lm-eval:TASK[,TASK...][@DIR]` (`babelprobe.lmeval`: one item per option). A file in the item
schema is the user's own: every mistake raises `BabelprobeError` naming the file, line and field.

**Released layouts** (docs/datasets.md "Minimal pairs") are read as their authors publish them, one
record per minimal pair, and converted to two items sharing a `pair_id`:
- COMPS (github.com/kanishkamisra/comps `data/comps/comps_base.jsonl`, `comps_wugs*.jsonl`; hub
  `kanishka/comps`): `prefix_acceptable`, `prefix_unacceptable`, `property_phrase`; text = prefix +
  separator + property phrase.
- Full sentences: `acceptable_sent`/`unacceptable_sent` (XCOMPS: hub `fpadovani/xcomps-dataset`, one
  split `comps_<lang>` per language; github.com/LinyangHe/XCOMPS `data/comps_<lang>.json`, a JSON
  object keyed by record id), also `sentence_good`/`sentence_bad` (BLiMP). When the record carries a
  property phrase in its language (`property_phrase`, else `property`) that ends both sentences, the
  items also get `prefix`/`continuation`, so `--conditional` can score the property given the concept.
The subset is `negative_sample_type` (or `condition`), else "all"; the language is the records'
`language`/`lang` field, else `language=` (`--language`), else the name (`comps_de.json`, split
`comps_de`, `items_de.csv`; COMPS's own release names are English). The release's `id` (for the
XCOMPS JSON object: its key) is kept as a field, so it reaches every result table. Every other field
of the record is kept too, except the sentence and prefix fields the items' texts are made from.
A released record that cannot be scored (an empty sentence, prefix or phrase; two identical
sentences) is skipped, counted and reported on stderr (and in `items.attrs["skipped"]`), never
dropped silently.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pandas as pd

from babelprobe.bundled import DATA, bundled_sets
from babelprobe.errors import BabelprobeError
from babelprobe.languages import iso_codes, language_codes, language_table, separator
from babelprobe.paths import check_readable
from babelprobe.tables import decode_json_lists, read_text, write_table

REQUIRED = ("item_id", "pair_id", "language", "subset", "label", "text")
NEEDS = f"; every item needs {', '.join(REQUIRED)}"
KEYS = ("item_id", "pair_id", "language", "subset", "label")
PREFIX_FIELDS = ("prefix_acceptable", "prefix_unacceptable", "property_phrase")
FULL_SENTENCE_FIELDS = [("acceptable_sent", "unacceptable_sent"), ("sentence_good", "sentence_bad"),
                        ("acceptable_sentence", "unacceptable_sentence")]
SUBSET_FIELDS = ("negative_sample_type", "condition")  # COMPS/XCOMPS data files; COMPS result files
PROPERTY_FIELDS = ("property_phrase", "property")      # a full-sentence record's property, if it has one
FINAL_PUNCTUATION = ".。．!?！？"
# The COMPS release's own file names (github.com/kanishkamisra/comps README: data/comps/comps_base.jsonl,
# comps_wugs.jsonl, comps_wugs_dist.jsonl) and its hub id `kanishka/comps`: COMPS is English.
COMPS_RELEASE = re.compile(r"kanishka/comps|comps_(base|wugs)([_\-.].*)?")
LANGUAGE_IN_NAME = (re.compile(r"(?:^|[_\-./])comps_([a-z]{2})(?=$|[_\-./])"),  # comps_de, comps_de-00000-of-00001
                    re.compile(r"(?:^|[_\-.])([a-z]{2})$"))                      # items_de, a config named de


# --------------------------------------------------------------------------------------------- loading

def check_limit(limit: int | None) -> None:
    """`--limit` is a count of pairs (or questions) to keep: at least 1 (pandas' `head(-1)` would silently
    drop each group's last one, `head(0)` keep nothing)."""
    if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 1):
        raise BabelprobeError(f"--limit must be at least 1, got {limit}")


def load_items(source: str | Path | pd.DataFrame, languages: list[str] | None = None,
               subsets: list[str] | None = None, limit: int | None = None,
               language: str | None = None) -> pd.DataFrame:
    """Read and validate items; optionally keep some languages/subsets and at most `limit` pairs per
    language × subset (the first ones in file order). `language` is the language of a single-language
    source that does not say (a file without a `language` field, e.g. `comps_base.jsonl` renamed); a
    source whose own language field says otherwise is an error. `items.attrs["skipped"]` lists the
    released records that were skipped (module docstring)."""
    if isinstance(source, pd.DataFrame):
        items = validate(_with_language(source.copy(), language, "<DataFrame>"), "<DataFrame>")
        skipped = list(source.attrs.get("skipped", []))
    elif _is_harness(source):
        items, skipped = _from_harness(str(source), languages, limit, language)
    else:
        items, skipped = _read_source(str(source), language)
    if languages:
        _check_selection("language", languages, items)
        items = items[items["language"].isin(languages)]
    if subsets:
        _check_selection("subset", subsets, items)
        items = items[items["subset"].isin(subsets)]
    check_limit(limit)
    if limit is not None:
        first = items.drop_duplicates("pair_id").groupby(["language", "subset"], sort=False).head(limit)
        items = items[items["pair_id"].isin(first["pair_id"])]
    if items.empty:
        raise BabelprobeError(f"no items left in {source} after selecting languages={languages} subsets={subsets}")
    items = items.reset_index(drop=True)
    items.attrs["skipped"] = skipped
    return items


def _is_harness(source) -> bool:
    # babelprobe.lmeval, in this layer (docs/design.md "Layers"), reads lm-evaluation-harness tasks
    from babelprobe.lmeval import is_source

    return is_source(source)


def _from_harness(source: str, languages: list[str] | None, limit: int | None,
                  language: str | None) -> tuple[pd.DataFrame, list[dict]]:
    """`lm-eval:TASK[,TASK...][@DIR]`: the harness's tasks as items (`babelprobe.lmeval`), the languages and
    the first `limit` documents of each task chosen before the data sets are read; skipped documents
    reported per task as a released file's records are."""
    from babelprobe.lmeval import load

    frame = load(source, languages=languages, limit=limit, language=language)
    per_task: dict[str, list[dict]] = {}
    for problem in frame.attrs.get("skipped", []):
        per_task.setdefault(problem["config"], []).append(problem)
    counts = frame.groupby("config")["pair_id"].nunique()
    skipped = [{"source": task, "records": int(counts.get(task, 0)) + len(problems), "skipped": len(problems),
                "reasons": dict(Counter(p["reason"] for p in problems))} for task, problems in per_task.items()]
    return validate(frame, source), skipped


def _check_selection(field: str, wanted: list[str], items: pd.DataFrame) -> None:
    missing = sorted(set(wanted) - set(items[field]))
    if missing:
        raise BabelprobeError(f"{field} {', '.join(missing)} not in the items; available: "
                              f"{', '.join(sorted(items[field].unique()))}")


def _read_source(source: str, language: str | None) -> tuple[pd.DataFrame, list[dict]]:
    """The validated items of a source and the skip reports of its released records."""
    if source in bundled_sets("xcomps"):
        return validate(_with_language(build_xcomps_sample(), language, source), source), []
    if source.startswith("hf:"):
        frame = _from_hub(source[3:], language)
        return validate(frame, source), frame.attrs.get("skipped", [])
    path = Path(source).expanduser()
    if path.exists():  # an unreadable file or folder: one line, not the reader's PermissionError
        check_readable(path, f"item source {source}")
    if path.is_dir():
        parts = [read_records(p, language) for p in sorted(path.iterdir()) if p.suffix in READERS]
        if not parts:
            raise BabelprobeError(f"directory {source} has no {', '.join(READERS)} files")
        skipped = [s for part in parts for s in part.attrs.get("skipped", [])]
        return validate(pd.concat(parts, ignore_index=True), source), skipped
    if not path.exists():
        raise BabelprobeError(f"item source {source!r} is neither a bundled set ({', '.join(bundled_sets('xcomps'))}), "
                              "a file, a directory, hf:ORG/NAME nor lm-eval:TASK")
    frame = read_records(path, language)
    return validate(frame, source), frame.attrs.get("skipped", [])


def read_records(path: Path, language: str | None = None) -> pd.DataFrame:
    """Read one file into a frame of items (released layouts converted); `_source` keeps file:line.
    A released record that cannot be scored is skipped and reported (`attrs["skipped"]`)."""
    if path.suffix not in READERS:
        raise BabelprobeError(f"{path}: unknown item file type {path.suffix!r}; use {', '.join(READERS)}")
    frame = READERS[path.suffix](path)
    if frame.empty:
        raise BabelprobeError(f"{path}: the item file is empty")
    return _from_native(frame, str(path), [path.stem], language)


def _read_jsonl(path: Path) -> pd.DataFrame:
    records, lines = [], []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise BabelprobeError(f"{path}:{number}: malformed JSON ({_json_problem(err)}); fix or remove the line") from err
        if not isinstance(record, dict):
            raise BabelprobeError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        records.append(record)
        lines.append(f"{path}:{number}")
    return pd.DataFrame(records).assign(_source=lines) if records else pd.DataFrame()


def _read_json(path: Path) -> pd.DataFrame:
    """A list of records, {"items"|"data"|"examples": [...]}, an object of records keyed by id (XCOMPS's
    data/comps_<lang>.json), pandas' {field: {row: value}}, or JSON Lines saved as .json (hub exports)."""
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        if err.msg == "Extra data" and err.lineno > 1:  # one object per line: JSON Lines under a .json name
            return _read_jsonl(path)
        raise BabelprobeError(f"{path}:{err.lineno}: malformed JSON ({_json_problem(err)}); fix or remove the line") from err
    if isinstance(data, dict):
        listed = next((data[k] for k in ("items", "data", "examples") if isinstance(data.get(k), list)), None)
        if listed is None and data and all(isinstance(v, dict) for v in data.values()):
            return _keyed_records(data, path)
        data = listed
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise BabelprobeError(f"{path}: expected a list of JSON objects, {{\"items\": [...]}} or an object of "
                              "records keyed by id")
    return pd.DataFrame(data).assign(_source=[f"{path}: record {i + 1}" for i in range(len(data))])


def _keyed_records(data: dict, path: Path) -> pd.DataFrame:
    """{id: record} (XCOMPS) -> records with the key as `id` (unless they have one); {field: {row: value}}
    (pandas' default `to_json`) -> its table."""
    fields = {*REQUIRED, *PREFIX_FIELDS, *(f for pair in FULL_SENTENCE_FIELDS for f in pair)}
    if fields & set(data):
        frame = pd.DataFrame(data)
        return frame.reset_index(drop=True).assign(_source=[f"{path}: row {key}" for key in frame.index])
    frame = pd.DataFrame.from_dict(data, orient="index")
    if "id" not in frame.columns:
        frame.insert(0, "id", list(data))
    return frame.reset_index(drop=True).assign(_source=[f"{path}: record {key!r}" for key in data])


def _read_csv(path: Path, sep: str = ",") -> pd.DataFrame:
    """CSV (fields quoted as spreadsheets and pandas write them), or TSV (`sep="\\t"`: no quoting, as the
    PAWS-X and XNLI releases write it). A row with more fields than the header is an error (never a
    silent index column, as pandas would make it); fields missing at the end of a row are missing values."""
    kind = "CSV" if sep == "," else "TSV"
    quoting = csv.QUOTE_MINIMAL if sep == "," else csv.QUOTE_NONE
    reader = csv.reader(io.StringIO(read_text(path).removeprefix("\ufeff"), newline=""), delimiter=sep,
                        quoting=quoting, strict=True)
    rows, lines = [], []
    try:
        header = next(reader, None)
        for row in reader:
            if not row:  # blank line
                continue
            if len(row) > len(header):
                raise BabelprobeError(f"{path}:{reader.line_num}: {len(row)} fields where the header has "
                                      f"{len(header)}; fix or remove the line")
            rows.append(row + [None] * (len(header) - len(row)))  # fields missing at the end: missing values
            lines.append(f"{path}:{reader.line_num}")
    except csv.Error as err:
        raise BabelprobeError(f"{path}:{reader.line_num}: malformed {kind} ({err})") from err
    if not rows:
        return pd.DataFrame()
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise BabelprobeError(f"{path}:1: column {repeated[0]!r} appears twice in the header")
    frame = decode_json_lists(pd.DataFrame(rows, columns=header), keep=REQUIRED)  # list fields as write_table writes them
    return frame.assign(_source=lines)


def _read_tsv(path: Path) -> pd.DataFrame:
    return _read_csv(path, sep="\t")


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several types for a broken file
        raise BabelprobeError(f"{path}: not a readable Parquet file ({str(err).splitlines()[0]})") from err
    return frame.assign(_source=[f"{path}: row {i + 1}" for i in range(len(frame))])


READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv, ".tsv": _read_tsv,
           ".parquet": _read_parquet}


# ---------------------------------------------------------------------------- released COMPS / XCOMPS

def _from_native(frame: pd.DataFrame, where: str, names: list[str], language: str | None) -> pd.DataFrame:
    """Convert a released layout to items; give other frames `language` where they have none.
    `names` (file stem; or hub split, config, dataset) tell the language when the records do not;
    the first one names the pairs."""
    if "prefix_acceptable" in frame.columns:
        return _comps_pairs(frame, where, names, language, full_sentences=None)
    for good, bad in FULL_SENTENCE_FIELDS:
        if good in frame.columns and "text" not in frame.columns:
            return _comps_pairs(frame, where, names, language, full_sentences=(good, bad))
    return _with_language(frame, language, where)


def _with_language(frame: pd.DataFrame, language: str | None, where: str) -> pd.DataFrame:
    """Items in the schema: `language` fills a missing or empty `language` field; a different one is an error."""
    if not language:
        return frame
    if "language" not in frame.columns:
        return frame.assign(language=language)
    own = frame["language"].where(~_blank(frame["language"]))
    _check_override(own, language, where, "language")
    frame["language"] = own.fillna(language)
    return frame


def _check_override(own: pd.Series, language: str, where: str, field: str) -> None:
    other = sorted(set(own.dropna().astype(str)) - {language})
    if other:
        raise BabelprobeError(f"{where}: --language {language} given, but its {field!r} field says "
                              f"{', '.join(other[:5])}; drop --language (or use --languages to select)")


def language_from_name(name: str) -> str | None:
    """The language a released file, split or config name gives (`comps_de` -> de, `comps_base` -> en)."""
    name = name.lower()
    for pattern in LANGUAGE_IN_NAME:
        match = pattern.search(name)
        if match and match.group(1) in iso_codes():
            return match.group(1)
    return "en" if COMPS_RELEASE.fullmatch(name) else None


def _languages(frame: pd.DataFrame, where: str, names: list[str], language: str | None) -> pd.Series:
    """Each record's language: its own field, else `language`, else the name; None where none says."""
    fallback = language or next((code for code in map(language_from_name, filter(None, names)) if code), None)
    field = next((f for f in ("language", "lang") if f in frame.columns), None)
    if field is None:
        if fallback is None:
            raise BabelprobeError(f"{where}: cannot tell the language of these records; pass --language CODE "
                                  "(e.g. --language en), add a 'language' field, or name the file like comps_de.jsonl")
        return pd.Series(fallback, index=frame.index)
    own = frame[field].where(~_blank(frame[field])).astype(object)
    if language:
        _check_override(own, language, where, field)
    return own.fillna(fallback) if fallback else own


def _blank(values: pd.Series) -> pd.Series:
    """Missing, empty or whitespace-only cells."""
    return values.isna() | (values.astype(str).str.strip() == "")


def _comps_pairs(frame: pd.DataFrame, where: str, names: list[str], language: str | None,
                 full_sentences: tuple[str, str] | None) -> pd.DataFrame:
    """One released record (a minimal pair) -> two items sharing a pair_id; records that cannot be
    scored are skipped and reported."""
    needed = list(full_sentences or PREFIX_FIELDS)
    for column in needed:
        if column not in frame.columns:
            raise BabelprobeError(f"{where}: missing field {column!r}")
    frame = frame.reset_index(drop=True)
    frame["language"] = _languages(frame, where, names, language)
    subset_field = next((f for f in SUBSET_FIELDS if f in frame.columns), None)
    subset = frame[subset_field].where(~_blank(frame[subset_field]), "all") if subset_field else "all"
    frame["subset"] = pd.Series(subset, index=frame.index).astype(str)
    frame = _skip_unscorable(frame, where, needed, full_sentences)

    ids = frame["id"].astype(str) if "id" in frame.columns else None
    key = ids if ids is not None and ids.is_unique else pd.Series([str(i) for i in frame.index], index=frame.index)
    pair_ids = names[0] + "-" + key + "-" + frame["subset"] + "-" + frame["language"]
    seps = frame["language"].map({language: separator(language) for language in frame["language"].unique()})
    if full_sentences:
        texts = [frame[field].astype(str) for field in full_sentences]
        phrases = _property_phrases(frame).tolist()
        splits = [[_split_at_property(t, p, sep) for t, p, sep in zip(text, phrases, seps)] for text in texts]
        whole = [bool(good and bad) for good, bad in zip(*splits)]  # a prefix for both sentences, or for neither
        parts = [[part if ok else (None, None) for part, ok in zip(split, whole)] for split in splits] if any(whole) else None
    else:
        phrase = frame["property_phrase"].astype(str)
        prefixes = [frame[field].astype(str) for field in ("prefix_acceptable", "prefix_unacceptable")]
        texts = [prefix + seps + phrase for prefix in prefixes]
        parts = [list(zip(prefix, phrase)) for prefix in prefixes]
    base = frame.drop(columns=needed)  # the texts are made from these; not repeated in every row
    sides = []
    for label, side, text, part in zip((1, 0), ("good", "bad"), texts, parts or [None, None]):
        item = base.assign(pair_id=pair_ids, item_id=pair_ids + f"-{side}", label=label, text=text)
        if part is not None:
            item["prefix"], item["continuation"] = [p for p, _ in part], [c for _, c in part]
        sides.append(item)
    pairs = pd.concat(sides).sort_index(kind="stable").reset_index(drop=True)  # each pair: good, then bad
    pairs.attrs["skipped"] = frame.attrs.get("skipped", [])
    return pairs


def _skip_unscorable(frame: pd.DataFrame, where: str, needed: list[str],
                     full_sentences: tuple[str, str] | None) -> pd.DataFrame:
    """Drop the records that cannot be scored, count them per reason and report them (stderr and
    `attrs["skipped"]`); all of them unscorable is an error."""
    reasons = pd.Series("", index=frame.index)
    for column in needed:
        reasons[_blank(frame[column]) & (reasons == "")] = f"empty {column!r}"
    reasons[frame["language"].isna() & (reasons == "")] = "no language"
    first, second = full_sentences or ("prefix_acceptable", "prefix_unacceptable")  # what tells the two apart
    same = frame[first].astype(str).str.strip() == frame[second].astype(str).str.strip()
    reasons[same & (reasons == "")] = "identical sentences"
    bad = reasons != ""
    if not bad.any():
        return frame
    counts = reasons[bad].value_counts()
    details = "; ".join(f"{n} with {reason} (first: {frame.loc[reasons == reason, '_source'].iloc[0]})"
                        for reason, n in counts.items())
    if bad.all():
        raise BabelprobeError(f"{where}: none of its {len(frame)} records can be scored: {details}")
    report = {"source": where, "records": len(frame), "skipped": int(bad.sum()), "reasons": counts.to_dict()}
    print(f"{where}: skipped {report['skipped']} of {len(frame)} records that cannot be scored ({details}); "
          f"the other {len(frame) - report['skipped']} are read", file=sys.stderr)
    kept = frame[~bad].copy()
    kept.attrs["skipped"] = [report]
    return kept


def _property_phrases(frame: pd.DataFrame) -> pd.Series:
    """Each full-sentence record's property phrase in its language (the first of PROPERTY_FIELDS it
    fills), None where it has none."""
    phrases = pd.Series(None, index=frame.index, dtype=object)
    for field in reversed(PROPERTY_FIELDS):
        if field in frame.columns:
            phrases = frame[field].astype(object).where(~_blank(frame[field]), phrases)
    return phrases


def _split_at_property(sentence: str, phrase, sep: str) -> tuple[str, str] | None:
    """(prefix, continuation) of a full sentence that ends with its property phrase (final punctuation
    aside), the continuation starting at a word boundary where the language separates words (`sep`,
    languages.separator); None when it does not."""
    if not isinstance(phrase, str):
        return None
    core = phrase.strip().rstrip(FINAL_PUNCTUATION).rstrip()
    body = sentence.rstrip().rstrip(FINAL_PUNCTUATION).rstrip()
    if not core or not body.endswith(core):
        return None
    start = len(body) - len(core)
    prefix = sentence[:start].rstrip()
    if not prefix or (sep and not sentence[start - 1].isspace()):
        return None
    return prefix, sentence[start:]


def _json_problem(err) -> str:
    """json's message with its position, e.g. 'Unterminated string starting at column 12'."""
    return f"{err.msg.removesuffix(' at')} at column {err.colno}"


def _from_hub(spec: str, language: str | None) -> pd.DataFrame:
    """hf:ORG/NAME[:config[:split]]; each split converted on its own, so a split named comps_de gives
    its records the language de."""
    name, _, rest = spec.partition(":")
    config, _, split = rest.partition(":")
    try:
        import datasets

        data = datasets.load_dataset(name, config or None, split=split or None)
    except Exception as err:  # network, missing dataset, bad config or split: all user-facing
        raise BabelprobeError(f"cannot load hub dataset {spec!r}: {str(err).splitlines()[0]}") from err
    splits = {split: data} if split else dict(data.items())
    frames = []
    for key, part in splits.items():
        frame = part.to_pandas().assign(_source=[f"hf:{spec}[{key}] row {i + 1}" for i in range(len(part))])
        frames.append(_from_native(frame, f"hf:{spec}[{key}]", [key, config, name.split("/")[-1], name], language))
    skipped = [s for frame in frames for s in frame.attrs.get("skipped", [])]
    frame = pd.concat(frames, ignore_index=True)
    frame.attrs["skipped"] = skipped
    return frame


# ------------------------------------------------------------------------------------------ validation

def validate(items: pd.DataFrame, source: str) -> pd.DataFrame:
    """Check the docs/design.md schema; return items with normalised types (label int, strings stripped of
    nothing). Raises BabelprobeError naming the line and field of the first problem."""
    if items.empty:
        raise BabelprobeError(f"{source}: no items")
    if "_source" not in items.columns:
        items["_source"] = [f"{source}: row {i + 1}" for i in range(len(items))]
    for field in REQUIRED:
        if field not in items.columns:
            raise BabelprobeError(f"{items['_source'].iloc[0]}: missing field {field!r}{NEEDS}")
        missing = items[field].isna()
        if field != "text":  # an empty text gets its own message below
            missing |= items[field].astype(str) == ""
        if missing.any():
            raise BabelprobeError(f"{items['_source'][missing].iloc[0]}: missing field {field!r}{NEEDS}")
    for field in ("item_id", "pair_id", "language", "subset", "text"):
        items[field] = items[field].astype(str)
    blank = items["text"].str.strip() == ""
    if blank.any():
        row = items[blank].iloc[0]
        raise BabelprobeError(f"{row['_source']}: item {row['item_id']} has an empty or whitespace-only text; give it a text or remove the item")
    items["label"] = _labels(items)
    unknown = ~items["language"].map(lambda c: c.split("-")[0] in language_codes())
    if unknown.any():
        row = items[unknown].iloc[0]
        raise BabelprobeError(f"{row['_source']}: unknown language code {row['language']!r} "
                              "(use ISO 639-1, e.g. en, de, zh; ISO 639-3 for a MultiBLiMP or Belebele language "
                              "without one, e.g. aln)")
    dup = items["item_id"].duplicated(keep=False)
    if dup.any():
        first = items[dup].iloc[:2]
        raise BabelprobeError(f"duplicate item_id {first['item_id'].iloc[0]!r} at "
                              f"{first['_source'].iloc[0]} and {first['_source'].iloc[1]}; item ids must be unique")
    return items.drop(columns="_source").reset_index(drop=True)


def _labels(items: pd.DataFrame) -> pd.Series:
    mapping = {"1": 1, "0": 0, "-1": -1, "true": 1, "false": 0, "1.0": 1, "0.0": 0, "-1.0": -1}
    labels = items["label"].astype(str).str.lower().map(mapping)
    bad = labels.isna()
    if bad.any():
        row = items[bad].iloc[0]
        raise BabelprobeError(f"{row['_source']}: label {row['label']!r} of item {row['item_id']} is not "
                              "1 (acceptable), 0 (unacceptable) or -1 (not applicable)")
    return labels.astype("int8")


def items_hash(items: pd.DataFrame) -> str:
    """A short hash of the keys and texts, so stores and results can tell which item set made them."""
    import hashlib

    cols = [c for c in (*REQUIRED, "prefix", "continuation") if c in items.columns]
    payload = items[cols].to_json(orient="values", force_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def write_items(items: pd.DataFrame, path: str | Path) -> None:
    """Write items as .jsonl, .json, .csv or .parquet (by extension), atomically."""
    write_table(items, path)


# ------------------------------------------------------------------------------------------------ pairs

def to_pairs(items: pd.DataFrame, distractor: pd.Series | None = None) -> pd.DataFrame:
    """One row per minimal pair: keys plus `item_id_good/bad`, `text_good/bad` (and prefix/continuation
    and concept fields when present). Every pair must have exactly one label-1 and one label-0 item, or,
    given `distractor` (pair_id -> item_id of one of its label-0 items, as `strongest_distractor` gives),
    one label-1 item and one or more label-0 items: a multiple-choice question (Belebele, XNLI), whose
    unacceptable side is then the named distractor."""
    label = items["label"]
    counts = pd.DataFrame({"good": label == 1, "bad": label == 0}).groupby(items["pair_id"]).sum()
    broken = counts[(counts["good"] != 1) | ((counts["bad"] != 1) if distractor is None else (counts["bad"] < 1))]
    if len(broken):
        pid = broken.index[0]
        several = broken.loc[pid, "good"] == 1 and broken.loc[pid, "bad"] > 1
        hint = ("; a multiple-choice question is read by direct scoring and probes (compare, intervene), not here"
                if several else "")
        raise BabelprobeError(f"pair {pid!r} needs exactly one item with label 1 and one with label 0 "
                              f"(has {broken.loc[pid, 'good']} and {broken.loc[pid, 'bad']}){hint}")
    order = items.drop_duplicates("pair_id")["pair_id"]
    # each side's rows in pair order, looked up once for all columns (a lookup per column is slow at scale)
    good = items[items["label"] == 1].set_index("pair_id").loc[order]
    if distractor is None:
        bad = items[items["label"] == 0].set_index("pair_id").loc[order]
    else:
        bad = items.set_index("item_id").loc[distractor.loc[order].to_numpy()].reset_index()
    extra = [c for c in items.columns if c not in (*REQUIRED, "prefix", "continuation")]
    columns = {"pair_id": order.to_numpy()}
    columns.update({col: good[col].array for col in ("language", "subset", *extra)})
    for col in ("item_id", "text", "prefix", "continuation"):
        if col in items.columns:
            columns[f"{col}_good"] = good[col].array
            columns[f"{col}_bad"] = bad[col].array
    pairs = pd.DataFrame(columns)
    if (counts["bad"] > 1).any():  # only multiple-choice questions: minimal pairs' tables stay as they were
        pairs["n_options"] = (counts["good"] + counts["bad"]).loc[order].to_numpy()
    return pairs


def strongest_distractor(items: pd.DataFrame, scores: pd.Series | None = None) -> pd.Series:
    """pair_id -> item_id of the label-0 item with the highest score (`scores`, by item_id; the first one
    on a tie; without scores, the first label-0 item). Pairing each question's gold item with its
    strongest distractor makes `score_good > score_bad` mean that the gold item has the strict maximum,
    as the bridges' `correct` (and a minimal pair's only distractor is its own)."""
    bad = items.loc[items["label"] == 0, ["pair_id", "item_id"]].reset_index(drop=True)
    if scores is None:
        return bad.drop_duplicates("pair_id").set_index("pair_id")["item_id"]
    values = bad["item_id"].map(scores).astype(float)
    return bad.loc[values.groupby(bad["pair_id"], sort=False).idxmax()].set_index("pair_id")["item_id"]


def probe_target(items: pd.DataFrame) -> str:
    """What probes on these items learn to tell apart, in words (compare.json records it): a minimal pair's
    acceptable and unacceptable sentence, or a question's gold option and its other options (items with a
    `gold` field: the bridges', lm-evaluation-harness tasks')."""
    if "gold" in items.columns or (items.groupby("pair_id")["item_id"].size() > 2).any():
        return ("multiple choice: the state of each question's gold option (label 1) against each of its other "
                "options' (label 0); grouped folds keep a question's options (one pair_id: a harness document) "
                "together; a question is right where its gold option has the highest probe score")
    return ("minimal pairs: the acceptable sentence's state (label 1) against the unacceptable one's (label 0); "
            "grouped folds keep a pair together; a pair is right where the acceptable one scores higher")


# ------------------------------------------------------------------------------- bundled: xcomps-sample

def build_xcomps_sample() -> pd.DataFrame:
    """Build the bundled `xcomps-sample` items from its data tables (data/xcomps_sample/*.csv):
    for each property, the acceptable concept against one negative concept per subset, per language."""
    folder = DATA / "xcomps_sample"
    read = lambda name: pd.read_csv(folder / name, dtype=str, keep_default_na=False)  # noqa: E731
    concepts = read("concepts.csv").set_index(["concept_id", "language"])
    phrases = read("properties.csv").set_index(["property_id", "language"])["phrase"]
    table = language_table()
    rows = []
    for _, pair in read("pairs.csv").iterrows():
        pid = pair["property_id"]
        for language in phrases.loc[pid].index:
            sep, stop = table.at[language, "separator"], table.at[language, "full_stop"]
            phrase = phrases.loc[(pid, language)]
            good = concepts.loc[(pair["acceptable"], language)]
            for subset in ("taxonomic", "overlap", "co-occurrence", "random"):
                bad = concepts.loc[(pair[subset], language)]
                pair_id = f"{pid}-{subset}-{language}"
                common = {"pair_id": pair_id, "language": language, "subset": subset, "stem": f"{pid}-{subset}",
                          "property": phrase, "continuation": phrase + stop,
                          "acceptable_concept": good["word"], "unacceptable_concept": bad["word"]}
                for label, concept in ((1, good), (0, bad)):
                    rows.append({**common, "item_id": f"{pair_id}-{'good' if label else 'bad'}", "label": label,
                                 "prefix": concept["subject"], "text": concept["subject"] + sep + phrase + stop,
                                 "parallel_id": f"{pid}-{concept.name[0]}"})  # property + concept: same in every language
    columns = [*REQUIRED, "prefix", "continuation", "stem", "property", "acceptable_concept", "unacceptable_concept",
               "parallel_id"]
    return pd.DataFrame(rows)[columns]
