"""The StingrayBench metrics, from the rows alone (§3.3): accuracy in L1 and in L2 per pair × subset ×
task, cognate bias and comprehension, the paper's aggregates over tasks (Figs. 5–6) and over pairs and
tasks (Fig. 4), with Wilson and bootstrap intervals (`summarize`); its wide view and the printed summary."""

from __future__ import annotations

import warnings
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from babelprobe.benchmarks.base import metric_row
from babelprobe.benchmarks.base import wide as wide_table
from babelprobe.benchmarks.stingray.settings import TASKS
from babelprobe.stats import wilson

BOOTSTRAP = 1000


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
        long, points[key] = _cell(dict(zip(CELL, key, strict=True)), group, seed)
        out += long
    out += _task_means(points) + _overall(points) + _skipped_counts(rows)
    summary = pd.DataFrame(out)
    for column in CARRIED:
        if column in rows.columns:
            summary[column] = rows[column].iloc[0]
    return summary


def _wilson_row(cell: dict, metric: str, values) -> dict:
    values = np.asarray(values, float)
    values = values[~np.isnan(values)]
    n, k = len(values), int(values.sum())
    return metric_row(cell, metric, k / n if n else np.nan, *(wilson(k, n) if n else (np.nan, np.nan)), n, "wilson")


def _cell(cell: dict, group: pd.DataFrame, seed: int) -> tuple[list[dict], _Point]:
    """One cell's long rows and its point."""
    sides = per_language(group)
    long = [_wilson_row(cell, "accuracy", group["correct"]), _wilson_row(cell, "accuracy_l1", sides["l1"]),
            _wilson_row(cell, "accuracy_l2", sides["l2"])]
    point = _Point(long[1]["value"], long[2]["value"], *_resample(sides, seed, "|".join(cell.values())),
                   n=len(group))
    for metric, formula in (("bias", cognate_bias), ("comprehension", cognate_comprehension)):
        long.append(metric_row(cell, metric, formula(point.x, point.y),
                               *_percentiles(formula(point.boot_x, point.boot_y)), len(group), "bootstrap over records"))
    if "valid" in group.columns:
        long.append(_wilson_row(cell, "valid", group["valid"].astype(float)))
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
        out += [metric_row(where, "comprehension", _nanmean(comprehension), *_percentiles(boot_comprehension), n,
                           AGGREGATE),
                metric_row(where, "bias", bias, *_percentiles(boot_bias), n, AGGREGATE),
                metric_row(where, "abs_bias", abs(bias), *_percentiles(np.abs(boot_bias)), n, AGGREGATE)]
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
        out += [metric_row(where, "accuracy_l1", x, *_percentiles(boot_x), n, AGGREGATE),
                metric_row(where, "accuracy_l2", y, *_percentiles(boot_y), n, AGGREGATE),
                metric_row(where, "bias", cognate_bias(x, y), *_percentiles(cognate_bias(boot_x, boot_y)), n,
                           AGGREGATE),
                metric_row(where, "comprehension", cognate_comprehension(x, y),
                           *_percentiles(cognate_comprehension(boot_x, boot_y)), n, AGGREGATE)]
    return out


def _skipped_counts(rows: pd.DataFrame) -> list[dict]:
    if "records_skipped" not in rows.columns:
        return []
    counts = rows.groupby(["pair", "subset"], sort=True)[["records_read", "records_skipped"]].first()
    return [metric_row({"pair": pair, "subset": subset, "task": "all"}, "records_skipped", row["records_skipped"],
                       n=row["records_read"], interval="count")
            for (pair, subset), row in counts.iterrows()]


# ------------------------------------------------------------------------------------- views and printing

def wide(summary: pd.DataFrame) -> pd.DataFrame:
    """The long summary as one row per pair × subset × task (`base.wide`): a column per metric, its
    interval as `<metric>_low`, `<metric>_high` and its count as `<metric>_n` (for figures and printing)."""
    return wide_table(summary[summary["metric"] != "records_skipped"], CELL)


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
