"""Reading and preparing the self-consistency data. `read_source` brings every layout to one shape: the
bundled samples, babelprobe's item records, PAWS-X and XNLI as released or exported to the hub (a file, a
directory of test files or `hf:NAME:CONFIG`). `prepare` chooses the task and source language, attaches
the other languages' rows as reference translations, chooses the target languages and keeps the records
that cannot be scored aside with their reason (`Data`). `load` (the benchmark contract's) only reads, and
`prepare` applies the settings; `load_consistency` does both for a notebook."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from babelprobe.benchmarks.consistency.settings import Settings
from babelprobe.benchmarks.consistency.task import Prompts, Task, get_task, load_prompts, load_spec
from babelprobe.bundled import bundled_sets
from babelprobe.errors import BabelprobeError
from babelprobe.items import read_records
from babelprobe.languages import iso_codes
from babelprobe.tables import read_text

BUNDLED = bundled_sets("consistency")
XNLI_LABELS = {"entailment": 0, "neutral": 1, "contradiction": 2}  # the hub's numbering of XNLI's gold_label
READABLE = (".tsv", ".jsonl", ".json", ".csv", ".parquet")


def read_source(source: str) -> pd.DataFrame:
    """The records of a bundled set, a file, a directory (its test files) or `hf:NAME:CONFIG`, each
    with `item_id`, `id`, `language` (empty where the file does not say), the input fields, a raw
    `label`, `task` where the layout tells it, and `_source` (file:line)."""
    if source in BUNDLED:
        return _normalize(read_records(BUNDLED[source].location), BUNDLED[source].location)
    if source.startswith("hf:"):
        return _from_hub(source[3:])
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in READABLE and p.is_file() and "test" in p.name)
        if not files:
            raise BabelprobeError(f"directory {source} has no test files (x-final/<lang>/test_2k.tsv, xnli.test.tsv, "
                                  "<lang>/test-*.parquet); give a file")
        return pd.concat([_read_file(p) for p in files], ignore_index=True)
    if path.is_file():
        return _read_file(path)
    raise BabelprobeError(f"self-consistency data {source!r} is neither {', '.join(BUNDLED)}, a file (.tsv, .jsonl, "
                          ".json, .csv, .parquet), a directory nor hf:NAME:CONFIG")


def _read_file(path: Path) -> pd.DataFrame:
    if path.suffix not in READABLE:
        raise BabelprobeError(f"{path}: unknown file type {path.suffix!r}; use {', '.join(READABLE)}")
    return _normalize(_read_tsv(path) if path.suffix == ".tsv" else read_records(path), path)


def _read_tsv(path: Path) -> pd.DataFrame:
    """A tab-separated file with a header and no quoting (PAWS-X and XNLI quote nothing: a `"` is text).
    A line with the wrong number of fields is kept as a broken record (`_problem`)."""
    lines = read_text(path).splitlines()
    if not lines:
        raise BabelprobeError(f"{path}: the file is empty")
    reader = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(reader)
    records = []
    for number, fields in enumerate(reader, start=2):
        if not fields:
            continue
        record = dict(zip(header, fields))
        if len(fields) != len(header):
            record["_problem"] = f"{len(fields)} tab-separated fields, the header has {len(header)}"
        records.append({**record, "_source": f"{path}:{number}"})
    if not records:
        raise BabelprobeError(f"{path}: no records under the header")
    return pd.DataFrame(records)


def _from_hub(spec: str) -> pd.DataFrame:
    """`NAME:CONFIG[:SPLIT]` from the hub (e.g. google-research-datasets/paws-x:de, facebook/xnli:de); the
    config names the language. Needs the internet."""
    name, _, rest = spec.partition(":")
    config, _, split = rest.partition(":")
    try:
        import datasets

        data = datasets.load_dataset(name, config or None, split=split or "test")
    except Exception as err:  # network, missing dataset, bad config: all user-facing
        raise BabelprobeError(f"cannot load hub dataset {spec!r}: {str(err).splitlines()[0]}") from err
    frame = data.to_pandas()
    frame["_source"] = [f"hf:{spec} row {i + 1}" for i in range(len(frame))]
    return _normalize(frame, Path(config or name.split("/")[-1]) / "test")


def _language_from_path(path: Path) -> str:
    """The language a path names: its folder (`x-final/de/test_2k.tsv`, `de/test-….parquet`) or one code
    among the parts of its name (`test_de.tsv`); '' when it names none."""
    codes = iso_codes()
    if path.parent.name in codes:
        return path.parent.name
    named = [part for part in re.split(r"[-_.]", path.stem) if part in codes]
    return named[0] if len(named) == 1 else ""


def _normalize(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Released layouts -> one shape. XNLI release: `gold_label` names the label, `sentence1/2` are
    premise/hypothesis, `pairID` the id. XNLI hub: `premise, hypothesis, label`. PAWS-X (release and
    hub): `id, sentence1, sentence2, label`. The id of a record without one is its row number in the file
    (the hub's per-language XNLI files are parallel row by row)."""
    frame = frame.copy()
    if "_source" not in frame.columns:
        frame["_source"] = [f"{path}: row {i + 1}" for i in range(len(frame))]
    if "gold_label" in frame.columns and "sentence1" in frame.columns:
        frame = frame.rename(columns={"sentence1": "premise", "sentence2": "hypothesis"})
        frame["label"] = frame["gold_label"].map(lambda g: XNLI_LABELS.get(str(g).strip(), g))
        frame["task"] = frame.get("task", "xnli")
    elif "task" not in frame.columns:
        if {"premise", "hypothesis"} <= set(frame.columns):
            frame["task"] = "xnli"
        elif {"sentence1", "sentence2"} <= set(frame.columns):
            frame["task"] = "paws-x"
    ids = next((frame[c] for c in ("item_id", "id", "pairID") if c in frame.columns), None)
    ids = ids.astype(str) if ids is not None else pd.Series([str(i + 1) for i in range(len(frame))], index=frame.index)
    frame["id"] = frame["id"].astype(str) if "id" in frame.columns else ids
    frame["item_id"] = ids
    language = frame["language"] if "language" in frame.columns else pd.Series("", index=frame.index)
    frame["language"] = language.fillna("").astype(str).str.strip().replace("", _language_from_path(path))
    return frame


@dataclass
class Data:
    """What a run needs: the items in the source language (with reference translations `{field}_{L}`),
    the task, the prompts, the records skipped (item_id, id, language, reason, source) and the target
    languages."""

    items: pd.DataFrame
    task: Task
    prompts: Prompts
    skipped: pd.DataFrame
    targets: list[str]


@dataclass(frozen=True)
class Records:
    """What the benchmark contract's `load` read: the records as read (`read_source`), and the target
    languages and the number of source items asked for, which `prepare` applies: they depend on the
    source language, a setting."""

    frame: pd.DataFrame
    targets: tuple[str, ...] = ()
    limit: int | None = None

    def __len__(self) -> int:
        return len(self.frame)


def load(source: str | Path, languages: list[str] | None = None, limit: int | None = None) -> Records:
    """The benchmark contract's loader: the records of `source` as read (`read_source`); `languages` are
    the target languages (default: those with references) and `limit` the number of source items, both
    applied by `prepare` with the settings (broken records are counted over the whole file, whatever the
    limit)."""
    return Records(read_source(str(source)), tuple(languages or ()), limit)


def prepare(data: Records | pd.DataFrame, settings: Settings, targets: list[str] | None = None,
            limit: int | None = None) -> Data:
    """The benchmark contract's `prepare`: choose the task and source language, skip (and keep count of)
    records that cannot be scored, attach the other languages' rows as references, keep the first
    `limit` source items. `data` is what `load` returned (its targets and limit unless others are
    given) or a frame of records (`read_source`)."""
    if isinstance(data, Records):
        targets, limit = targets or list(data.targets) or None, data.limit if limit is None else limit
        data = data.frame
    frame = data
    spec = load_spec(settings.spec)
    task = get_task(_task_name(frame, settings, spec), spec)
    prompts = load_prompts(settings.instructions, settings.prompts)
    frame = frame.copy()
    unknown = frame["language"] == ""
    if unknown.any():
        if not settings.language:
            where = frame.loc[unknown, "_source"].iloc[0].rsplit(":", 1)[0]
            raise BabelprobeError(f"{where}: cannot tell the language of its records (the file has no 'language' "
                                  "column); put it in a folder named after its language (x-final/de/test_2k.tsv, "
                                  "de/test-00000-of-00001.parquet) or give --language de")
        frame.loc[unknown, "language"] = settings.language
    frame["_problem"] = _problems(frame, task)
    skipped = frame[frame["_problem"] != ""]
    good = frame[frame["_problem"] == ""].copy()
    good["label"] = pd.to_numeric(good["label"]).astype(int)
    twice = good[good.duplicated(["language", "item_id"], keep=False)]
    if not twice.empty:
        first = twice.iloc[0]
        raise BabelprobeError(f"id {first['item_id']} appears twice in language {first['language']} "
                              f"({', '.join(twice[twice['item_id'] == first['item_id']]['_source'])}); give one split")
    source = _source_language(good, settings, skipped)
    items = good[good["language"] == source].copy()
    for lang in sorted(set(good["language"]) - {source}):
        other = good[good["language"] == lang].set_index("item_id")
        for name in task.fields:
            items[f"{name}_{lang}"] = items["item_id"].map(other[name])
    if limit is not None:
        items = items.head(limit)
    skipped = pd.DataFrame({"item_id": skipped["item_id"], "id": skipped["id"], "language": skipped["language"],
                            "reason": skipped["_problem"], "source": skipped["_source"]})
    references = reference_languages(items, task)
    chosen = [t for t in (targets or references) if t != source]
    return Data(items.drop(columns=["_problem"]).reset_index(drop=True), task, prompts,
                skipped.reset_index(drop=True), chosen)


def _task_name(frame: pd.DataFrame, settings: Settings, spec: dict) -> str:
    if settings.task:
        return settings.task
    names = frame["task"].dropna().unique() if "task" in frame.columns else []
    if len(names) != 1:
        raise BabelprobeError(f"say which task the items are with --task ({', '.join(spec['tasks'])}), or give "
                              "every item the same 'task' field")
    return str(names[0])


def _problems(frame: pd.DataFrame, task: Task) -> pd.Series:
    """Why each record cannot be scored ('' when it can): a broken line, a missing or empty input text,
    a label the task does not have, a language that is not an ISO 639-1 code."""
    problems = frame["_problem"].fillna("").astype(str) if "_problem" in frame.columns else \
        pd.Series("", index=frame.index)
    for name in task.fields:
        if name not in frame.columns:
            raise BabelprobeError(f"{frame['_source'].iloc[0].rsplit(':', 1)[0]}: records lack the field {name!r} "
                                  f"(task {task.name} needs {', '.join(task.fields)} and label)")
        empty = frame[name].isna() | (frame[name].astype(str).str.strip() == "")
        problems = problems.mask((problems == "") & empty, f"empty {name}")
    if "label" not in frame.columns:
        raise BabelprobeError(f"{frame['_source'].iloc[0].rsplit(':', 1)[0]}: records lack the field 'label'")
    label = pd.to_numeric(frame["label"], errors="coerce")
    bad = ~label.isin(task.labels)
    problems = problems.mask((problems == "") & bad,
                             "label " + frame["label"].astype(str) + f" not among {task.labels}")
    bad_language = ~frame["language"].isin(iso_codes())
    problems = problems.mask((problems == "") & bad_language,
                             "language " + frame["language"].astype(str) + " is not an ISO 639-1 code")
    return problems


def _source_language(good: pd.DataFrame, settings: Settings, skipped: pd.DataFrame) -> str:
    languages = sorted(good["language"].unique())
    if settings.language:
        if settings.language not in languages:
            lost = len(skipped[skipped["language"] == settings.language])
            raise BabelprobeError(f"no usable records in the source language {settings.language!r} ({lost} skipped); "
                                  f"the data has {', '.join(languages) or 'none'}")
        return settings.language
    if len(languages) == 1:
        return languages[0]
    if "en" in languages:
        return "en"
    raise BabelprobeError(f"the data holds {', '.join(languages) or 'no usable records'}; say which is the source "
                          "language with --language")


def reference_languages(items: pd.DataFrame, task: Task) -> list[str]:
    """Languages in which at least one item has a reference translation of every field."""
    found = {m.group(1) for c in items.columns if (m := re.fullmatch(rf"(?:{'|'.join(task.fields)})_([a-z]{{2}})", c))}
    return sorted(lang for lang in found if all(f"{f}_{lang}" in items.columns for f in task.fields)
                  and items[[f"{f}_{lang}" for f in task.fields]].notna().all(axis=1).any())


def load_consistency(source: str | Path, task: str | None = None, limit: int | None = None,
                     language: str | None = None, targets: list[str] | None = None) -> Data:
    """Read and prepare `source` for a notebook (the CLI goes through `load` and `run`)."""
    return prepare(read_source(str(source)), Settings(task=task, language=language), targets=targets, limit=limit)
