"""StingrayBench (Cahyawijaya et al., Findings of NAACL 2025): can a model tell which language's sense
of a false friend fits a sentence, and does it lean towards one language of the pair?

**Data.** `load_stingray(source)` reads StingrayBench in the forms it is published in: the hub
configs (`StingrayBench/StingrayBench`: `en_de`, `id_ms`, `id_tl`, `zh_ja` with false friends and
`<pair>_common` with true cognates; fields `word`, `lang1_sentence`, ...) from the hub when online
(`hf:StingrayBench/StingrayBench`) or from local .jsonl/.json/.csv/.parquet files named after their
config; the raw CSVs of the hub repository's `data/` directory (`en_de.csv`, `en_de_common_words.csv`,
... with columns `Cognates` or `Cognates_L1`/`Cognates_L2`, `L1`, `L2`, `Meaning in L1`, `Meaning in
L2`, the semantic-appropriateness column and two `Is the usage ...` columns; docs/datasets.md); and
the bundled `stingray-sample` (our own sentences, en_de and zh_ja). One row per entry: the same
sentence in L1 and L2 using the word; for a false friend exactly one is appropriate (A = L1, B = L2),
for a true cognate both (C). A record that cannot be scored (a sentence or the word missing, an
answer that is not Yes/No, a label that contradicts its subset) is counted, reported on stderr and
in the summary (`records_skipped`), listed in the run's `skipped_records.csv`, and skipped.

**Tasks** (§3.2; prompts in data/prompts/stingray.tsv, the released code's): semantic appropriateness
(A/B/C) and usage correction (Yes/No, once per language).

**Inference** (§4.3; `Settings.inference`). `likelihood` (the released `likelihood_eval.py`): the
label with the highest log-probability after the prompt; plain text ends with "\\nAnswer:" and the
labels " A", " B", " C" / " Yes", " No" follow it. `generation`: a generator (`--generator local` or
an OpenAI-compatible endpoint) answers the bare prompt (`max_new_tokens`, 3 in the released code) and
`parse_answer` applies the paper's post-processing ("A and B" -> C, §4.3; rules in its docstring);
an unreadable answer counts as wrong. `chat` wraps the prompt in the model's chat template as the
user turn (§4.3: "each of the corresponding chat formats"); `auto` does so when the model has one.
`PROTOCOLS["paper"]` = likelihood, chat `auto`, the released prompts, summed label log-probs.

**Metrics** (§3.3; per language pair × subset × task): accuracy in L1 and in L2. Usage: the questions
about that language's sentence. Semantic, false friends: the entries whose appropriate sentence is in
that language. Semantic, true cognates (both sentences appropriate; not defined in the paper, ours):
an answer is right in L1 when it names the L1 sentence (A or C) and right in L2 when it names the L2
sentence (B or C). The point (acc L1, acc L2) gives
    cognate bias          = (atan2(acc L2, acc L1) − π/4) / (π/4)   ∈ [−1, 1], −1 = all towards L1;
    cognate comprehension = √(acc L1² + acc L2²) / √2              ∈ [0, 1].
The paper's aggregates: task `mean` (per pair × subset, Figs. 5 and 6): comprehension and bias averaged
over the tasks, `abs_bias` = |mean bias| (Fig. 6 drops the sign); pair `all`, task `all` (per subset,
Fig. 4): the mean of the (acc L1, acc L2) points over pairs × tasks and its bias and comprehension.
Intervals: Wilson for accuracies, percentile bootstrap over records (resampled within each cell) for
everything else.

**Rows**: one per question, with `pair_id` (the entry), `language` (ISO code of the language asked
about; `l1-l2` for the semantic question on a true cognate), `subset`, `method` (likelihood /
generation), `task`, `side` (L1/L2/both), `prompt` (the text the model saw), `gold`, `predicted`,
`correct`, label `scores` (likelihood) or `response` and `valid` (generation), `protocol`,
`prompt_format` (plain/chat), and `records_read`/`records_skipped` of the entry's config.

**Figures** (`analysis.benchmarks.plot_stingray`): the stingray plot per task, Fig. 4 and Figs. 5–6.
"""

from __future__ import annotations

import json
import math
import re
import sys
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.benchmarks.core.choices import option_scores
from babelprobe.benchmarks.core.logprobs import REDUCTIONS
from babelprobe.bundled import bundled_sets
from babelprobe.errors import BabelprobeError
from babelprobe.items import READERS, read_records
from babelprobe.languages import iso_codes
from babelprobe.models import LoadedModel, load_model
from babelprobe.prompts import check_placeholders, read_prompts
from babelprobe.settings import option
from babelprobe.stats import wilson
from babelprobe.tables import write_table

NAME = "stingray"
TITLE = "StingrayBench: cross-lingual false friends and true cognates"
HUB_ID = "StingrayBench/StingrayBench"
PAIRS = ("en_de", "id_ms", "id_tl", "zh_ja")
BUNDLED = bundled_sets("stingray")
SUBSETS = {"": "false_friend", "_common": "true_cognate"}
TASKS = ("semantic", "usage")
PROMPT_KEYS = ("semantic", "usage_l1", "usage_l2")
REQUIRED = ("word", "lang1_sentence", "lang2_sentence", "usage_correctness_lang1_answer",
            "usage_correctness_lang2_answer")
OPTIONAL = ("lang_en_sentence", "language_flag", "meaning_l1", "meaning_l2")
SEMANTIC_LABELS = {"0": "A", "1": "B", "2": "C", "a": "A", "b": "B", "c": "C",
                   "l1": "A", "l2": "B", "both": "C"}
CONFIG_NAME = re.compile(r"^([a-z]{2})_([a-z]{2})(_common)?$")
# The raw CSVs of the hub repository's data/ directory (docs/datasets.md "StingrayBench").
RAW_SEMANTIC = "Which sentence is more semantically appropriate?"  # the start of the label column's name
RAW_USAGE = "Is the usage"  # the start of the two usage columns' names
BOOTSTRAP = 1000
SKIPPED = "skipped_records.csv"
INFERENCE = ("likelihood", "generation")
CHAT = ("off", "auto", "on")

# §4.3: zero-shot, each model's chat format, likelihood-based inference for the open models (generation
# as a robustness check: `--protocol paper --inference generation`); prompts and the summed label
# log-probabilities of the released likelihood_eval.py.
PROTOCOLS = {"paper": {"inference": "likelihood", "chat": "auto", "reduction": "sum", "prompts": None,
                       "tasks": TASKS}}


@dataclass(frozen=True)
class Settings:
    """What a StingrayBench run asks and how it reads the answers (recorded in run.json)."""

    protocol: str = option("default", help="settings preset: 'paper' = §4.3 (likelihood, each model's chat "
                           "format where it has one, the released prompts)")
    tasks: tuple[str, ...] = option(TASKS, help="semantic, usage")
    inference: str = option("likelihood", choices=INFERENCE,
        help="likelihood: the best-scoring answer label; generation: the generator's answer, post-processed (§4.3)")
    chat: str = option("off", choices=CHAT,
        help="the model's chat template around the prompt: off, auto (when the model has one; §4.3), on")
    reduction: str = option("sum",
        choices=REDUCTIONS, help="likelihood: how an answer label's token log-probs are combined")
    generator: str = option("local", metavar="SPEC",
        help="generation: who answers ('local' = --model, or an OpenAI-compatible endpoint)")
    max_new_tokens: int = option(3, budget=True, help="generation: answer length in tokens (3 in the released code)")
    prompts: str | None = option(None,
        metavar="FILE", help="prompt file instead of the released one (data/prompts/stingray.tsv)")


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
    by_config: dict[str, list[dict]] = {}
    for problem in records.attrs.get("skipped", []):
        by_config.setdefault(problem["config"], []).append(problem)
    for config, problems in by_config.items():
        reasons = "; ".join(f"{p['source']}: {p['reason']}" for p in problems[:3])
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        print(f"babelprobe: StingrayBench {source} [{config}]: skipped {len(problems)} of "
              f"{records.attrs['read'][config]} records that cannot be scored ({reasons}{more})", file=sys.stderr)


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


# --------------------------------------------------------------------------------------------- prompts

PLACEHOLDERS = {"semantic": ("lang1_sentence", "lang2_sentence"), "usage_l1": ("lang1_sentence",),
                "usage_l2": ("lang2_sentence",)}
WORD_FIELDS = ("word", "word_l1", "word_l2", "meaning_l1", "meaning_l2", "lang_en_sentence")


def load_prompts(path: str | Path | None = None) -> dict:
    """The prompt set: {task: {"template", "answer", "options", "line"}} for semantic, usage_l1, usage_l2,
    from a prompt file (`prompts.read_prompts`; default the released one, data/prompts/stingray.tsv)
    with columns task, template, options (labels separated by |) and optionally answer (the cue after
    the template in plain-text likelihood scoring). Usage options are [yes, no]; semantic [A, B, C]."""
    rows = read_prompts(path or "stingray", ("task", "template", "options"), optional=("answer",))
    prompts = {r["task"]: {"template": r["template"], "answer": r.get("answer") or "",
                           "options": r["options"].split("|"), "line": r["line"]} for r in rows.to_dict("records")}
    for key, n_options in zip(PROMPT_KEYS, (3, 2, 2), strict=True):
        if key not in prompts:
            raise BabelprobeError(f"{rows['line'].iloc[0].rsplit(':', 1)[0]}: no row for task {key!r}")
        if len(prompts[key]["options"]) != n_options:
            raise BabelprobeError(f"{prompts[key]['line']}: task {key!r} needs {n_options} options separated by |")
        other = [p for p in PLACEHOLDERS["semantic"] if p not in PLACEHOLDERS[key]]
        check_placeholders(prompts[key]["template"], prompts[key]["line"], PLACEHOLDERS[key],
                           allowed=WORD_FIELDS + tuple(other), once=False)
    return prompts


def build_requests(records: pd.DataFrame, prompts: dict | None = None,
                   tasks: tuple[str, ...] = TASKS) -> pd.DataFrame:
    """One row per record × question: the `question` (the filled template), the plain likelihood
    `prompt` (question + answer cue), its answer options, the gold option and the side it is about."""
    prompts = prompts or load_prompts()
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise BabelprobeError(f"unknown StingrayBench task {', '.join(unknown)}; use {', '.join(TASKS)}")
    rows = []
    for record in records.to_dict("records"):
        fields = {k: record.get(k) or "" for k in ("lang1_sentence", "lang2_sentence", *WORD_FIELDS)}
        if "semantic" in tasks:
            answer = record["semantic_answer"]
            side = {"A": "L1", "B": "L2", "C": "both"}[answer]
            rows.append(_request(record, "semantic", side, prompts["semantic"], fields, "ABC".index(answer)))
        if "usage" in tasks:
            for side in ("L1", "L2"):
                gold = 0 if record[f"usage_{side.lower()}"] == "Yes" else 1
                rows.append(_request(record, "usage", side, prompts[f"usage_{side.lower()}"], fields, gold))
    return pd.DataFrame(rows)


def _request(record: dict, task: str, side: str, prompt: dict, fields: dict, gold: int) -> dict:
    language = {"L1": record["l1"], "L2": record["l2"], "both": f"{record['l1']}-{record['l2']}"}[side]
    question = prompt["template"].format(**fields)
    return {"item_id": f"{record['record_id']}-{task}" + ("" if task == "semantic" else f"-{side.lower()}"),
            "pair_id": record["record_id"], "language": language, "subset": record["subset"],
            "pair": record["pair"], "task": task, "side": side, "word": record["word"],
            "question": question, "prompt": question + prompt["answer"], "options": list(prompt["options"]),
            "gold": gold}


def chat_renderer(lm: LoadedModel, chat: str):
    """How a question becomes the model's text: (render or None, prompt_format). `chat` off: plain
    text; auto: the chat template when the tokenizer has one, else plain; on: the chat template or a
    one-line error. The question is the user turn and the assistant turn is opened (its first tokens
    are the answer); a BOS the template writes is dropped because encoding puts BOS first anyway."""
    if chat not in CHAT:
        raise BabelprobeError(f"unknown chat setting {chat!r}; use {', '.join(CHAT)}")
    template = getattr(lm.tokenizer, "chat_template", None)
    if chat == "off" or (chat == "auto" and not template):
        return None, "plain"
    if not template:
        raise BabelprobeError(f"model {lm.name} has no chat template (a base model?); use --chat auto or --chat off")
    bos = lm.tokenizer.bos_token if lm.bos_policy == "bos" else None

    def render(question: str) -> str:
        try:
            text = lm.tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                    add_generation_prompt=True)
        except Exception as err:  # templates that reject the role or fail to render: user-facing
            raise BabelprobeError(f"cannot render the chat template of {lm.name}: {str(err).splitlines()[0]}") from err
        return text[len(bos):] if bos and text.startswith(bos) else text

    return render, "chat"


# --------------------------------------------------------------------------------------------- scoring

def score_stingray(model: LoadedModel | str, records: pd.DataFrame | str = "stingray-sample",
                   tasks: tuple[str, ...] = TASKS, reduction: str = "sum", prompts: dict | None = None,
                   chat: str = "off", batch_tokens: int = 4096, progress: bool = True) -> pd.DataFrame:
    """Ask every question of `records` by likelihood; one row per question with the option scores, the
    chosen and gold labels and `correct` (docs/design.md results conventions, method 'likelihood').
    Plain text: the question, the answer cue, then each label; chat: the labels open the assistant turn."""
    if reduction not in REDUCTIONS:
        raise BabelprobeError(f"unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}")
    records = load_stingray(records) if isinstance(records, (str, Path)) else records
    lm = load_model(model) if isinstance(model, str) else model
    requests = build_requests(records, prompts, tasks)
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
        raise BabelprobeError(f"--chat on needs a chat template, which generator {generator.name} cannot apply; "
                              "use its chat endpoint (openai:MODEL@URL) or --chat auto")
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
    """Settings that cannot run, before a model is loaded."""
    unknown = sorted(set(settings.tasks) - set(TASKS))
    if unknown:
        raise BabelprobeError(f"unknown StingrayBench task {', '.join(unknown)}; use {', '.join(TASKS)}")
    if settings.inference not in INFERENCE:
        raise BabelprobeError(f"unknown inference {settings.inference!r}; use {', '.join(INFERENCE)}")
    if settings.chat not in CHAT:
        raise BabelprobeError(f"unknown chat setting {settings.chat!r}; use {', '.join(CHAT)}")
    if settings.max_new_tokens < 1:
        raise BabelprobeError(f"max_new_tokens must be at least 1, got {settings.max_new_tokens}")
    load_prompts(settings.prompts)


def run(data: pd.DataFrame, models, settings: Settings = Settings(), out: Path | None = None,
        progress: bool = True) -> pd.DataFrame:
    """The benchmark contract's run: every question of `data`, by likelihood of the local model or
    answered by `settings.generator`; rows carry the protocol and the records skipped at loading
    (also listed in `out/skipped_records.csv`)."""
    from babelprobe.benchmarks.base import as_models

    models = as_models(models)
    prompts = load_prompts(settings.prompts)
    if settings.inference == "likelihood":
        rows = score_stingray(models.lm, data, tasks=tuple(settings.tasks), reduction=settings.reduction,
                              prompts=prompts, chat=settings.chat, batch_tokens=models.batch_tokens, progress=progress)
    else:
        cache = Path(out) / "generations.jsonl" if out is not None else None
        rows = generate_stingray(models.generator(settings.generator), data, tuple(settings.tasks), prompts,
                                 chat=settings.chat, max_new_tokens=settings.max_new_tokens, cache=cache,
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
    return "model" if settings.inference == "likelihood" else settings.generator


# --------------------------------------------------------------------------------------------- metrics

def cognate_bias(acc_l1, acc_l2):
    """Signed angle of (acc L1, acc L2) from the 45° line, scaled from [−π/4, π/4] to [−1, 1] (§3.3):
    −1 = right only in L1 (biased towards L1), +1 = only in L2, 0 = balanced; NaN at (0, 0)."""
    a1, a2 = np.asarray(acc_l1, float), np.asarray(acc_l2, float)
    with np.errstate(invalid="ignore"):
        bias = (np.arctan2(a2, a1) - np.pi / 4) / (np.pi / 4)
    return np.where((a1 == 0) & (a2 == 0), np.nan, bias)


def cognate_comprehension(acc_l1, acc_l2):
    """Length of the (acc L1, acc L2) point divided by √2 (§3.3): 1 = right in both languages, 0 = in neither."""
    return np.hypot(np.asarray(acc_l1, float), np.asarray(acc_l2, float)) / np.sqrt(2)


def per_language(rows: pd.DataFrame) -> pd.DataFrame:
    """Per record (`pair_id`) of one cell: right in L1 and right in L2 (NaN where the record has no
    question about that language). A question about one side counts for it; the semantic question on
    a true cognate (side "both") is right in L1 when the answer names the L1 sentence (A or C) and
    right in L2 when it names the L2 sentence (B or C)."""
    side, correct = rows["side"].to_numpy(), rows["correct"].to_numpy(float)
    predicted = rows.get("predicted", pd.Series("", index=rows.index)).fillna("").astype(str).to_numpy()
    right_l1 = np.where(side == "L1", correct, np.where(side == "both", np.isin(predicted, ["A", "C"]), np.nan))
    right_l2 = np.where(side == "L2", correct, np.where(side == "both", np.isin(predicted, ["B", "C"]), np.nan))
    record = rows["pair_id"].to_numpy() if "pair_id" in rows.columns else np.arange(len(rows))
    frame = pd.DataFrame({"record": record, "l1": right_l1, "l2": right_l2})
    return frame.groupby("record", sort=False).mean()  # at most one question per record and side


CELL = ["pair", "subset", "task"]
CARRIED = ("protocol", "method", "prompt_format")  # constant over a run; every summary row names them
AGGREGATE = "bootstrap over records within each cell"


@dataclass
class _Point:
    """One cell's (acc L1, acc L2), its bootstrap resamples and its number of questions."""

    x: float
    y: float
    boot_x: np.ndarray
    boot_y: np.ndarray
    n: int


def summarize(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """The benchmark contract's long summary. Per pair × subset × task: `accuracy`, `accuracy_l1`,
    `accuracy_l2` (Wilson), `bias`, `comprehension` (bootstrap) and, for generation, `valid` (the share
    of answers `parse_answer` could read). Task `mean` per pair × subset (Figs. 5–6): `comprehension`,
    `bias` averaged over the tasks and `abs_bias` (|mean bias|). Pair `all`, task `all` per subset
    (Fig. 4): the mean `accuracy_l1`, `accuracy_l2` over pairs × tasks, and the `bias` and
    `comprehension` of that point. `records_skipped` (task `all`) per pair × subset when the rows carry
    it. Every row has `metric`, `value`, `ci_low`, `ci_high`, `n`, `interval` and the run's protocol,
    method and prompt_format."""
    out, points = [], {}
    for key, group in rows.groupby(CELL, sort=True):
        long, points[key] = _cell(group, seed, "|".join(key))
        out += [{**dict(zip(CELL, key, strict=True)), **row} for row in long]
    out += _task_means(points) + _overall(points) + _skipped_counts(rows)
    summary = pd.DataFrame(out)
    for column in CARRIED:
        if column in rows.columns:
            summary[column] = rows[column].iloc[0]
    return summary


def _metric(metric: str, value, interval: tuple[float, float], n: int, kind: str) -> dict:
    return {"metric": metric, "value": float(value), "ci_low": float(interval[0]), "ci_high": float(interval[1]),
            "n": int(n), "interval": kind}


def _wilson_row(metric: str, values) -> dict:
    values = np.asarray(values, float)
    values = values[~np.isnan(values)]
    n, k = len(values), int(values.sum())
    return _metric(metric, k / n if n else np.nan, wilson(k, n) if n else (np.nan, np.nan), n, "wilson")


def _cell(group: pd.DataFrame, seed: int, name: str) -> tuple[list[dict], _Point]:
    """One cell's long rows and its point."""
    sides = per_language(group)
    long = [_wilson_row("accuracy", group["correct"]), _wilson_row("accuracy_l1", sides["l1"]),
            _wilson_row("accuracy_l2", sides["l2"])]
    point = _Point(long[1]["value"], long[2]["value"], *_resample(sides, seed, name), n=len(group))
    for metric, formula in (("bias", cognate_bias), ("comprehension", cognate_comprehension)):
        long.append(_metric(metric, formula(point.x, point.y), _percentiles(formula(point.boot_x, point.boot_y)),
                            len(group), "bootstrap over records"))
    if "valid" in group.columns:
        long.append(_wilson_row("valid", group["valid"].astype(float)))
    return long, point


def _resample(sides: pd.DataFrame, seed: int, cell: str) -> tuple[np.ndarray, np.ndarray]:
    """BOOTSTRAP resamples of the records, within the strata of records that have the same sides (a
    false friend's semantic question is about one language, so each language keeps its count; the two
    usage questions of a record stay together): each resample's mean right-in-L1 and right-in-L2. Each
    cell has its own stream (the seed and the cell's name), so aggregates over cells combine
    independent resamples."""
    rng = np.random.default_rng([seed, zlib.crc32(cell.encode())])
    values = sides[["l1", "l2"]].to_numpy(float)
    strata = (~np.isnan(values)) @ np.array([1, 2])
    picks = np.concatenate([rng.choice(np.flatnonzero(strata == s), size=(BOOTSTRAP, int((strata == s).sum())))
                            for s in np.unique(strata)], axis=1)
    return _nanmean(values[picks, 0], axis=1), _nanmean(values[picks, 1], axis=1)


def _nanmean(values, axis=None):
    """Mean over the values that are not NaN; NaN (without a warning) where there are none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.asarray(values, float), axis=axis)


def _percentiles(values) -> tuple[float, float]:
    values = np.asarray(values, float)
    values = values[~np.isnan(values)]  # resamples without a direction (at the origin) or without a side
    return tuple(np.percentile(values, [2.5, 97.5])) if len(values) else (np.nan, np.nan)


def _task_means(points: dict) -> list[dict]:
    """Per pair × subset, averaged over the tasks (Fig. 5: comprehension; Fig. 6: |bias|)."""
    out = []
    for pair, subset in sorted({key[:2] for key in points}):
        cells = [points[key] for key in sorted(points) if key[:2] == (pair, subset)]
        n = sum(c.n for c in cells)
        where = {"pair": pair, "subset": subset, "task": "mean"}
        comprehension = [cognate_comprehension(c.x, c.y) for c in cells]
        boot_comprehension = _nanmean([cognate_comprehension(c.boot_x, c.boot_y) for c in cells], axis=0)
        bias = _nanmean([cognate_bias(c.x, c.y) for c in cells])
        boot_bias = _nanmean([cognate_bias(c.boot_x, c.boot_y) for c in cells], axis=0)
        out += [{**where, **_metric("comprehension", _nanmean(comprehension), _percentiles(boot_comprehension), n,
                                    AGGREGATE)},
                {**where, **_metric("bias", bias, _percentiles(boot_bias), n, AGGREGATE)},
                {**where, **_metric("abs_bias", abs(bias), _percentiles(np.abs(boot_bias)), n, AGGREGATE)}]
    return out


def _overall(points: dict) -> list[dict]:
    """Per subset, the mean point over pairs × tasks (Fig. 4) and its bias and comprehension."""
    out = []
    for subset in sorted({key[1] for key in points}):
        cells = [points[key] for key in sorted(points) if key[1] == subset]
        n = sum(c.n for c in cells)
        x, y = _nanmean([c.x for c in cells]), _nanmean([c.y for c in cells])
        boot_x, boot_y = _nanmean([c.boot_x for c in cells], axis=0), _nanmean([c.boot_y for c in cells], axis=0)
        where = {"pair": "all", "subset": subset, "task": "all"}
        out += [{**where, **_metric("accuracy_l1", x, _percentiles(boot_x), n, AGGREGATE)},
                {**where, **_metric("accuracy_l2", y, _percentiles(boot_y), n, AGGREGATE)},
                {**where, **_metric("bias", cognate_bias(x, y), _percentiles(cognate_bias(boot_x, boot_y)), n,
                                    AGGREGATE)},
                {**where, **_metric("comprehension", cognate_comprehension(x, y),
                                    _percentiles(cognate_comprehension(boot_x, boot_y)), n, AGGREGATE)}]
    return out


def _skipped_counts(rows: pd.DataFrame) -> list[dict]:
    if "records_skipped" not in rows.columns:
        return []
    counts = rows.groupby(["pair", "subset"], sort=True)[["records_read", "records_skipped"]].first()
    return [{"pair": pair, "subset": subset, "task": "all",
             **_metric("records_skipped", row["records_skipped"], (np.nan, np.nan), row["records_read"], "count")}
            for (pair, subset), row in counts.iterrows()]


# ------------------------------------------------------------------------------------- views and printing

def wide(summary: pd.DataFrame) -> pd.DataFrame:
    """The long summary as one row per pair × subset × task: a column per metric, its interval as
    `<metric>_low`, `<metric>_high` and its count as `<metric>_n` (for figures and printing)."""
    cells = summary[summary["metric"] != "records_skipped"]
    table = cells.groupby(CELL + ["metric"], sort=False)[["value", "ci_low", "ci_high", "n"]].first().unstack("metric")
    out = pd.DataFrame(index=table.index)
    for metric in dict.fromkeys(cells["metric"]):
        out[metric] = table[("value", metric)]
        out[f"{metric}_low"], out[f"{metric}_high"] = table[("ci_low", metric)], table[("ci_high", metric)]
        out[f"{metric}_n"] = table[("n", metric)].astype("Int64")
    return out.reset_index()


def stingray_summary(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """`summarize` in the wide form of `wide`."""
    return wide(summarize(rows, seed=seed))


def format_summary(summary: pd.DataFrame) -> str:
    """Per cell, then the paper's aggregates (Figs. 5–6 per pair, Fig. 4 over pairs and tasks)."""
    table = wide(summary)
    number = {"float_format": lambda v: f"{v:.3f}", "na_rep": "—", "index": False}
    cells = table[table["task"].isin(TASKS)].rename(columns={"accuracy_n": "n"})
    columns = ["pair", "subset", "task", "n", "accuracy", "accuracy_l1", "accuracy_l2", "bias", "comprehension"]
    parts = [cells[columns + (["valid"] if "valid" in cells else [])].to_string(**number)]
    if {"method", "prompt_format"} <= set(summary.columns) and len(summary):
        how = {"likelihood": "the likelihood of the answer labels", "generation": "generated answers, post-processed"}
        method, prompt_format = summary["method"].iloc[0], summary["prompt_format"].iloc[0]
        parts.insert(0, f"answers: {how.get(method, method)}; prompts: {prompt_format} text")
    means = table[table["task"] == "mean"]
    if len(means):
        parts.append("averaged over the tasks (Figs. 5, 6):\n"
                     + means[["pair", "subset", "comprehension", "bias", "abs_bias"]].to_string(**number))
    overall = table[table["pair"] == "all"]
    if len(overall):
        parts.append("averaged over pairs and tasks (Fig. 4):\n"
                     + overall[["subset", "accuracy_l1", "accuracy_l2", "bias", "comprehension"]].to_string(**number))
    skipped = summary[(summary["metric"] == "records_skipped") & (summary["value"] > 0)]
    if len(skipped):
        parts.append("records skipped (cannot be scored): " + ", ".join(
            f"{r.pair} {r.subset} {int(r.value)} of {int(r.n)}" for r in skipped.itertuples()))
    return "\n".join(parts)
