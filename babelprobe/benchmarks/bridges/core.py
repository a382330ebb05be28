"""What the bridges share: reading a release, its items, scoring as lm-evaluation-harness does, the
summary (the package docstring, `babelprobe.benchmarks.bridges`, says how)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.benchmarks.base import metric_row
from babelprobe.benchmarks.base import wide as wide_table
from babelprobe.benchmarks.bridges.settings import BRIDGES, REDUCTIONS, Release, Settings, answerer  # noqa: F401
from babelprobe.bundled import bundled_sets
from babelprobe.errors import BabelprobeError
from babelprobe.items import READERS, read_records
from babelprobe.questions import options, report_skipped, text_script  # noqa: F401  (text_script: read here before)
from babelprobe.stats import paired_bootstrap, wilson

METRICS = ("acc", "acc_norm", "acc_bytes", "correct")
# what a question's rows carry from its items where they have it (lm-eval tasks: the harness's names)
QUESTION_FIELDS = ("parallel_id", "task", "task_version", "doc_id", "split", "harness_metrics")
CHUNK_QUESTIONS = 200  # questions scored between two checkpoints of a resumable run
BOOTSTRAP = 2000


def load(release: Release, source: str | Path, languages: list[str] | None = None,
         limit: int | None = None, report: bool = True) -> pd.DataFrame:
    """The benchmark contract's loader: `source` (a bundled sample, a file or directory in the release's
    layout, `hf:ID[:CONFIG]` when online) as items, one per option. `languages` keeps configs by their
    name or their items' language; `limit` keeps the first N questions per language. `attrs["read"]` and
    `attrs["skipped"]` count the records read and skipped per language; `report` prints the skipped."""
    source = str(source)
    wanted = set(languages or [])
    parts, read, skipped, seen = [], Counter(), [], set()
    for config, frame in _read(release, source, wanted):
        language = release.language_of(config)
        seen |= {config, language}
        if wanted and not ({config, language} & wanted):
            continue
        questions = release.questions(frame, config)
        bad = questions["problem"] != ""
        read[language] += len(questions)
        skipped += [{"language": language, "config": config, "source": s, "reason": r}
                    for s, r in questions.loc[bad, ["_source", "problem"]].itertuples(index=False)]
        parts.append(questions[~bad].assign(config=config, language=language))
    missing = sorted(wanted - seen)
    if missing:
        raise BabelprobeError(f"{source}: no {release.title} language or config {', '.join(missing)}; it has "
                              f"{', '.join(sorted(seen)) or 'none'}")
    questions = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if questions.empty:
        first = f"; first: {skipped[0]['source']}: {skipped[0]['reason']}" if skipped else ""
        raise BabelprobeError(f"{source}: no {release.title} record can be scored ({len(skipped)} skipped{first})")
    if limit is not None:
        questions = questions.groupby("language", sort=False).head(limit)
    twice = questions[questions.duplicated(["config", "id"], keep=False)]
    if len(twice):
        raise BabelprobeError(f"{release.title} record {twice['id'].iloc[0]!r} of {twice['config'].iloc[0]} appears twice "
                              f"({twice['_source'].iloc[0]} and {twice['_source'].iloc[1]}); give one file per config")
    items = options(release.name, questions)
    items.attrs.update(read=dict(read), skipped=skipped)
    if report:
        report_skipped(items, f"{release.title} {source}")
    return items


def _read(release: Release, source: str, wanted: set[str]) -> list[tuple[str, pd.DataFrame]]:
    """(config, records with `_source`) for every config of the source."""
    bundled = bundled_sets(release.name)
    if source in bundled:
        return _read_local(release, bundled[source].location)
    if source.startswith("hf:") or source == release.hub_id or source.startswith(release.hub_id + ":"):
        return _read_hub(release, source.removeprefix("hf:"), wanted)
    path = Path(source).expanduser()
    if not path.exists():
        raise BabelprobeError(f"{release.title} source {source!r} is neither a bundled set "
                              f"({', '.join(bundled) or 'none'}), a file, a directory nor hf:{release.hub_id}[:CONFIG]")
    return _read_local(release, path)


def _read_hub(release: Release, spec: str, wanted: set[str]) -> list[tuple[str, pd.DataFrame]]:
    name, _, config = spec.partition(":")
    if name != release.hub_id:
        raise BabelprobeError(f"{release.title} is {release.hub_id} on the hub, not {name!r}")
    if config and config not in release.configs:
        raise release.unknown(config)
    configs = [config] if config else [c for c in release.configs
                                       if not wanted or {c, release.language_of(c)} & wanted]
    out = []
    for chosen in configs:
        try:
            import datasets

            frame = datasets.load_dataset(name, chosen, split=release.split).to_pandas()
        except Exception as err:  # offline, renamed dataset: all user-facing
            raise BabelprobeError(f"cannot load hub dataset {name!r} config {chosen!r} ({str(err).splitlines()[0]}); "
                                  "when offline, download its files and pass them (or their directory) to --items") from err
        out.append((chosen, frame.assign(_source=[f"hf:{name}:{chosen} row {i + 1}" for i in range(len(frame))])))
    return out


PREFERRED = (".tsv", ".jsonl", ".parquet", ".json", ".csv")
GENERIC_STEMS = re.compile(r"^(data|train|test|dev|validation|.*[-_](train|test|dev|validation)|"
                           r"(train|test|dev|validation)[-_].*|test_2k|dev_2k)$")


def _read_local(release: Release, path: Path) -> list[tuple[str, pd.DataFrame]]:
    """A file, or a directory's data files (those naming the split the harness evaluates where some do)."""
    files = [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in READERS)
        of_split = [p for p in files if any(word in p.name for word in release.file_split)]
        files = of_split or files
        if not files:
            raise BabelprobeError(f"directory {path} has no {', '.join(READERS)} files")
        chosen = {}  # one format per file name (XNLI-1.0 ships xnli.dev.tsv and xnli.dev.jsonl)
        for file in sorted(files, key=lambda p: PREFERRED.index(p.suffix)):
            chosen.setdefault(file.with_suffix(""), file)
        files = sorted(chosen.values())
    out = []
    for file in files:
        frame = release.read_tsv(file) if file.suffix == ".tsv" and release.read_tsv else read_records(file)
        if release.config_column and release.config_column in frame.columns:
            for config, part in frame.groupby(release.config_column, sort=False):
                if str(config) not in release.configs:
                    raise release.unknown(str(config))
                out.append((str(config), part.reset_index(drop=True)))
            continue
        config = file.parent.name if GENERIC_STEMS.match(file.stem) else file.stem
        if config not in release.configs:
            raise release.unknown(config)
        out.append((config, frame))
    return out


def read_pandas_tsv(path: Path) -> pd.DataFrame:
    """A TSV as pandas writes and reads it (quoted fields; the MultiBLiMP release is written by `to_csv(sep="\\t")`
    and read by `read_csv(sep="\\t")`), every field a string."""
    try:
        frame = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    except Exception as err:  # pandas raises several types for a broken file
        raise BabelprobeError(f"{path}: not a readable TSV file ({str(err).splitlines()[0]})") from err
    return frame.assign(_source=[f"{path}:{i + 2}" for i in range(len(frame))])


def require(frame: pd.DataFrame, columns: tuple[str, ...], title: str) -> None:
    """A one-line error naming the first missing column and the file."""
    for column in columns:
        if column not in frame.columns:
            where = str(frame["_source"].iloc[0]).rsplit(":", 1)[0] if len(frame) else "the records"
            raise BabelprobeError(f"{where}: no column {column!r}; {title} records need {', '.join(columns)}")


def blank(values: pd.Series) -> pd.Series:
    return values.isna() | (values.astype(str).str.strip() == "")


def problems(frame: pd.DataFrame, columns: tuple[str, ...]) -> pd.Series:
    """Why each record cannot be scored ('' when it can): the first of `columns` it leaves empty."""
    out = pd.Series("", index=frame.index)
    for column in columns:
        out = out.mask((out == "") & blank(frame[column]), f"empty {column!r}")
    return out


# ---------------------------------------------------------------------------------------------- items

def convert(name: str, source: str | Path, out: str | Path | None = None, languages: list[str] | None = None,
            limit: int | None = None, overwrite: bool = False) -> pd.DataFrame:
    """Bridge `name`'s release at `source` as items (`babelprobe items convert NAME SRC --out F`), written to
    `out` (.jsonl, .json, .csv, .parquet) when given. The output is checked before anything is read, and an
    existing file is kept unless `overwrite`."""
    from babelprobe.benchmarks.base import benchmark
    from babelprobe.inputs import check_input
    from babelprobe.items import check_limit, validate, write_items
    from babelprobe.tables import check_output

    if name not in BRIDGES:
        raise BabelprobeError(f"unknown bridge {name!r}; use one of {', '.join(BRIDGES)}")
    check_input("source", source, "items")
    check_limit(limit)
    if out is not None:
        check_output(out, (".jsonl", ".json", ".csv", ".parquet"))
        if Path(out).exists() and not overwrite:
            raise BabelprobeError(f"{out} exists; pass --overwrite to replace it")
    items = benchmark(name).load(source, languages=languages, limit=limit)
    validate(items.copy(), str(source))  # what load_items will ask of the file
    if out is not None:
        write_items(items, out)
    return items


# -------------------------------------------------------------------------------------------- scoring

def harness_requests(lm, contexts: list[str], continuations: list[str]) -> tuple[list[str], list[int]]:
    """The text each (context, continuation) request runs and the character its scored tokens start at, as
    the harness splits it: the context's trailing whitespace joins the continuation; the continuation's
    tokens are those of the whole text after as many tokens as the context alone has (where the two
    tokenisations differ at the join, a token across it is the continuation's and a context token that
    grew into the continuation is not scored); an empty context is BOS (babelprobe's encoding puts it
    first) or, for a tokenizer without one, EOS. Exact except where one character's bytes are split
    between the last context token and the first continuation token (the core scores whole characters)
    and where the whole text has no token after the context's count (the harness scores none; here the
    tokens that end after the context are scored)."""
    texts, starts, joined = [], [], {}
    for i, (context, continuation) in enumerate(zip(contexts, continuations)):
        moved = context[len(context.rstrip()):]
        context, continuation = context.rstrip(), moved + continuation
        if not context:
            prefix = "" if lm.bos_policy == "bos" else _eos_text(lm)
            texts.append(prefix + continuation)
            starts.append(len(prefix))
        else:
            texts.append(context + continuation)
            starts.append(len(context))
            joined[i] = context
    if joined:
        keys = list(joined)
        own = lm.tokenizer([joined[i] for i in keys], add_special_tokens=False)["input_ids"]
        whole = lm.tokenizer([texts[i] for i in keys], add_special_tokens=False, return_offsets_mapping=True)
        for i, n, offsets in zip(keys, (len(ids) for ids in own), whole["offset_mapping"]):
            if 0 < n < len(offsets):  # score what follows the whole text's first n tokens
                starts[i] = offsets[n - 1][1]
    return texts, starts


def _eos_text(lm) -> str:
    eos = lm.tokenizer.eos_token
    ids = lm.tokenizer(eos or "", add_special_tokens=False)["input_ids"] if eos else []
    if ids != [lm.tokenizer.eos_token_id]:
        raise BabelprobeError(f"model {lm.name} has neither a BOS nor an EOS token to condition an empty context on")
    return eos


def decide(lls, choices: list[str], gold: int, reduced=None) -> dict:
    """The harness's predictions and metrics of one question (api/task.py `process_results`), and the
    strict `correct` on `reduced` (default: the LLs themselves)."""
    lls = np.asarray(lls, float)
    chars = np.array([float(len(c)) for c in choices])
    nbytes = np.array([float(len(c.encode("utf-8"))) for c in choices])
    pred, pred_norm, pred_bytes = int(np.argmax(lls)), int(np.argmax(lls / chars)), int(np.argmax(lls / nbytes))
    reduced = lls if reduced is None else np.asarray(reduced, float)
    others = np.delete(reduced, gold)
    return {"gold": gold, "pred": pred, "pred_norm": pred_norm, "pred_bytes": pred_bytes,
            "acc": float(pred == gold), "acc_norm": float(pred_norm == gold), "acc_bytes": float(pred_bytes == gold),
            "correct": bool(reduced[gold] > others.max()) if len(others) else True}


SHARED_ENOUGH = 0.5  # a question's context shared by its options saves at least this share of its characters


def scored_requests(lm, data: pd.DataFrame, texts: list[str], starts: list[int], batch_tokens: int,
                    progress: bool) -> list:
    """Each request's scored tokens (`core.logprobs`; the same numbers either way): the questions whose one
    context is most of what their options run (Belebele, MMLU: a passage and one-letter answers) from a KV
    cache, each context run once (`shared_prefix_logprobs`); the others (XCOPA's short premise before a
    sentence, XWinograd's context per option) as plain batches (`token_logprobs`), where the prefix tree's
    level-by-level passes cost more than the few tokens it would save."""
    from babelprobe.benchmarks.core.logprobs import token_logprobs
    from babelprobe.benchmarks.core.prefix import shared_prefix_logprobs

    contexts = data.groupby("pair_id", sort=False)["context"].agg(["nunique", "first", "size"])
    length = pd.Series([len(t) for t in texts], index=data.index).groupby(data["pair_id"], sort=False).sum()
    saved = (contexts["size"] - 1) * contexts["first"].str.len() * (contexts["nunique"] == 1)
    shared = set(contexts.index[saved >= SHARED_ENOUGH * length.loc[contexts.index]])
    out: list = [None] * len(texts)
    names = data["item_id"].tolist()
    for use_tree in (True, False):
        where = [i for i, pair in enumerate(data["pair_id"]) if (pair in shared) == use_tree]
        if not where:
            continue
        score = shared_prefix_logprobs if use_tree else token_logprobs
        part = score(lm, [texts[i] for i in where], [starts[i] for i in where], names=[names[i] for i in where],
                     batch_tokens=batch_tokens, progress=progress)
        for i, result in zip(where, part):
            out[i] = result
    return out


def score(lm, data: pd.DataFrame, settings: Settings | None = None, batch_tokens: int = 4096,
          progress: bool = True) -> pd.DataFrame:
    """One row per question of `data` (items, one per option): the options' LLs, token counts and metrics."""
    settings = settings or Settings()
    targets = data["target"] if "target" in data.columns else data["choice"]  # items converted before `target`
    texts, starts = harness_requests(lm, data["context"].tolist(), (data["delimiter"] + targets).tolist())
    scored = scored_requests(lm, data, texts, starts, batch_tokens, progress)
    data = data.assign(_ll=[float(np.sum(s.logprobs)) for s in scored], _n=[s.n_tokens for s in scored])
    rows = []
    width = int(data["n_options"].max())
    for pair_id, group in data.groupby("pair_id", sort=False):
        group = group.sort_values("option")
        lls, counts = group["_ll"].to_numpy(), group["_n"].to_numpy()
        reduced = lls if settings.reduction == "sum" else lls / np.maximum(counts, 1)
        first = group.iloc[0]
        row = {"pair_id": pair_id, "language": first["language"], "subset": first["subset"], "method": "likelihood",
               "script": first["script"], "config": first["config"], "n_options": len(group)}
        row.update({field: first[field] for field in QUESTION_FIELDS if field in group.columns})
        row.update({f"ll_{i}": (lls[i] if i < len(lls) else np.nan) for i in range(width)})
        row.update({f"n_tokens_{i}": (int(counts[i]) if i < len(counts) else pd.NA) for i in range(width)})
        row.update(decide(lls, group["choice"].tolist(), int(first["gold"]), reduced))
        row.update(reduction=settings.reduction, template_note=first["template_note"])
        rows.append(row)
    return pd.DataFrame(rows)


def run(name: str, data: pd.DataFrame, models, settings: Settings | None = None, out: Path | None = None,
        progress: bool = True) -> pd.DataFrame:
    """The benchmark contract's run: every question, in chunks kept in `out` (an interrupted run resumes)."""
    settings = settings or Settings()
    from babelprobe.benchmarks.base import as_models
    from babelprobe.runs import score_resumably
    from babelprobe.settings import settings_record

    models = as_models(models)

    def chunk(part: pd.DataFrame) -> pd.DataFrame:
        return score(models.lm, part, settings, batch_tokens=models.batch_tokens, progress=False)

    if out is None:
        rows = score(models.lm, data, settings, batch_tokens=models.batch_tokens, progress=progress)
    else:
        key = {"benchmark": name, "fingerprint": models.lm.fingerprint, **settings_record(settings)}
        rows = score_resumably(chunk, data, Path(out) / "items.csv", key, chunk_pairs=CHUNK_QUESTIONS,
                               progress=progress, desc="questions", unit="pair_id", model=models.lm)
    read, skipped = data.attrs.get("read"), Counter(s["language"] for s in data.attrs.get("skipped", []))
    if read:
        rows["records_read"] = rows["language"].map(read).astype("Int64")
        rows["records_skipped"] = rows["language"].map(lambda lang: skipped.get(lang, 0)).astype("Int64")
    rows["bos_policy"] = models.lm.bos_policy
    return rows


# -------------------------------------------------------------------------------------------- summary

CELL = ["language", "subset"]


def summarize(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """The benchmark contract's long summary (module docstring): per language × subset, and per language
    over its subsets (`subset` = all) where it has several."""
    out = []
    cells = [((language, subset), group) for (language, subset), group in rows.groupby(CELL, sort=True)]
    several = rows.groupby("language")["subset"].nunique()
    cells += [((language, "all"), group) for language, group in rows.groupby("language", sort=True)
              if several[language] > 1]
    rng = np.random.default_rng(seed)
    for (language, subset), group in cells:
        where = {"language": language, "subset": subset, "script": group["script"].iloc[0]}
        n = len(group)
        for metric in METRICS:
            k = int(group[metric].astype(float).sum())
            low, high = wilson(k, n)
            out.append(metric_row(where, metric, k / n, low, high, n, "wilson"))
        gap = group["acc_norm"].astype(float) - group["acc_bytes"].astype(float)
        out.append(metric_row(where, "norm_gap", gap.mean(), *paired_bootstrap(gap, rng, BOOTSTRAP), n,
                              "paired bootstrap over questions"))
        k = int((group["pred_norm"] != group["pred_bytes"]).sum())
        out.append(metric_row(where, "norm_disagree", k / n, *wilson(k, n), n, "wilson"))
        if "records_skipped" in group.columns and subset == _last_cell(rows, language):
            out.append(metric_row({**where, "subset": "all"}, "records_skipped", group["records_skipped"].iloc[0],
                                  n=group["records_read"].iloc[0], interval="count"))
    summary = pd.DataFrame(out)
    summary["method"] = "likelihood"
    notes = rows.groupby("language")["template_note"].first() if "template_note" in rows.columns else {}
    summary["note"] = summary["language"].map(lambda lang: notes.get(lang, "") or "")
    return summary


def _last_cell(rows: pd.DataFrame, language: str) -> str:
    """The cell of `language` that carries its records count (once per language)."""
    subsets = sorted(rows.loc[rows["language"] == language, "subset"].unique())
    return "all" if len(subsets) > 1 else subsets[0]


def wide(summary: pd.DataFrame, subset: str | None = "all") -> pd.DataFrame:
    """One row per language (its `all` cell, or its only subset), by language: `base.wide`'s column per
    metric with `<metric>_low`, `<metric>_high`, `<metric>_n`, and `n` (the questions)."""
    cells = summary[(summary["metric"] != "records_skipped") & ~summary["metric"].str.contains(",", regex=False)]
    if subset == "all":
        several = cells.groupby("language")["subset"].transform(lambda s: s.nunique() > 1)
        cells = cells[(cells["subset"] == "all") | ~several]
    table = wide_table(cells.sort_values("language", kind="stable"), ["language", "script"])
    return table.assign(n=table["acc_n"])


def format_summary(summary: pd.DataFrame) -> str:
    """Per language: n, acc, acc_norm, acc_bytes, correct and the normalisation gap; then skipped records
    and template notes."""
    table = wide(summary)
    columns = ["language", "script", "n", "acc", "acc_norm", "acc_bytes", "correct", "norm_gap", "norm_disagree"]
    parts = [table[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}")]
    skipped = summary[(summary["metric"] == "records_skipped") & (summary["value"] > 0)]
    if len(skipped):
        parts.append("records skipped (cannot be scored): " + ", ".join(
            f"{r.language} {int(r.value)} of {int(r.n)}" for r in skipped.itertuples()))
    notes = summary.drop_duplicates("language")
    for row in notes[notes["note"] != ""].itertuples():
        parts.append(f"note [{row.language}]: {row.note}")
    return "\n".join(parts)
