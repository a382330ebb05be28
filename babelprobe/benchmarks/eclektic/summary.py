"""The ECLeKTiC metrics, from the rows alone (§3.2): source accuracy, overall success and transfer score
per source × target cell, per margin (pooled and, as the paper reports them, macro) and overall, with
intervals that respect questions and Table 2's independent-example ones (`summarize`); the matrices,
the margins and the printed summary."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from babelprobe.benchmarks.base import metric_row
from babelprobe.stats import Z95, proportion


def transfer_pairs(rows: pd.DataFrame, diagonal: bool = False) -> pd.DataFrame:
    """One row per (question, target language ≠ source): source_correct, target_correct, success.
    `diagonal` adds each question's source-language row as the pair (q, s, s), whose success is the
    source answer's correctness (the paper's matrices, Fig. 3 and 5)."""
    source = rows[rows["subset"] == "source"].set_index("q_id")["correct"].astype(bool)
    target = rows if diagonal else rows[rows["subset"] == "target"]
    pairs = pd.DataFrame({"q_id": target["q_id"].values, "source_language": target["source_language"].values,
                          "target_language": target["language"].values,
                          "source_correct": source.reindex(target["q_id"]).fillna(False).astype(bool).values,
                          "target_correct": target["correct"].astype(bool).values})
    pairs["success"] = pairs["source_correct"] & pairs["target_correct"]
    return pairs


def wald(k, n) -> tuple[float, float]:
    """The normal-approximation 95% interval of k/n, every example independent (Table 2's ±)."""
    if not n:
        return np.nan, np.nan
    p = k / n
    half = Z95 * np.sqrt(p * (1 - p) / n)
    return p - half, p + half


def macro_proportion(pairs: pd.DataFrame, cell: str, hit: str, counted: str | None = None, n_boot: int = 2000,
                     seed: int = 0) -> dict:
    """The mean over the values of column `cell` (e.g. target languages) of each cell's share of `hit`
    among the `counted` pairs. Intervals: a percentile bootstrap resampling questions within each source
    language (a question's pairs stay together; every source keeps its number of questions) and the
    normal approximation with independent examples and cells (`wald_low`, `wald_high`)."""
    counted_mask = pairs[counted].to_numpy(bool) if counted else np.ones(len(pairs), bool)
    question, questions = pd.factorize(pairs["q_id"])
    column, _ = pd.factorize(pairs[cell])
    k = np.zeros((len(questions), column.max() + 1))  # hits and counted pairs per question and cell
    n = np.zeros_like(k)
    np.add.at(k, (question, column), pairs[hit].to_numpy(bool) & counted_mask)
    np.add.at(n, (question, column), counted_mask)
    strata = np.empty(len(questions), object)
    strata[question] = pairs["source_language"].to_numpy()
    kc, nc = k.sum(axis=0), n.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = kc / nc
    used = nc > 0
    out = {"n": int(nc.sum()), "k": int(kc.sum()), "value": float(np.mean(ratios[used])) if used.any() else np.nan,
           "ci_low": np.nan, "ci_high": np.nan, "interval": "", "wald_low": np.nan, "wald_high": np.nan}
    if not used.any():
        return out
    half = Z95 * np.sqrt(np.sum(ratios[used] * (1 - ratios[used]) / nc[used])) / used.sum()
    out.update(wald_low=out["value"] - half, wald_high=out["value"] + half)
    rng = np.random.default_rng(seed)
    kb, nb = np.zeros((n_boot, k.shape[1])), np.zeros((n_boot, k.shape[1]))
    for stratum in pd.unique(strata):  # how often each question of this source is drawn, per resample
        rows = np.flatnonzero(strata == stratum)
        counts = rng.multinomial(len(rows), np.full(len(rows), 1 / len(rows)), size=n_boot)
        kb += counts @ k[rows]
        nb += counts @ n[rows]
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a resample without any counted pair: NaN, left out
        means = np.nanmean(np.where(used, kb / nb, np.nan), axis=1)
    low, high = np.nanpercentile(means, [2.5, 97.5])
    out.update(ci_low=float(low), ci_high=float(high), interval="bootstrap over questions within source languages")
    return out


def _pooled(units, hits, counted=None, n_boot: int = 2000, seed: int = 0) -> dict:
    """`stats.proportion` (clustered interval) plus the interval with independent examples."""
    result = proportion(units, hits, counted, n_boot, seed, unit="questions")
    low, high = wald(result["k"], result["n"])
    return {**result, "wald_low": low, "wald_high": high}


def run_info(rows: pd.DataFrame) -> dict:
    """Which protocol, closed-book condition and judge produced the rows (for the summary)."""
    info = {}
    for column, key in (("protocol", "protocol"), ("method", "prompt_set"), ("judge", "judge")):
        values = sorted(set(rows[column].astype(str))) if column in rows.columns else []
        info[key] = ",".join(values)
    return info


def eclektic_summary(rows: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Source accuracy, overall success and transfer score per cell, per margin (pooled and, as the
    paper reports them, macro) and overall, in one long table (see the module docstring)."""
    pairs = transfer_pairs(rows)
    source = rows[rows["subset"] == "source"].assign(correct=lambda d: d["correct"].astype(bool))
    out = []
    for s, group in [*source.groupby("source_language"), ("all", source)]:
        where = {"source_language": s, "target_language": s, "average": "pooled"}
        out.append(metric_row(where, "source_accuracy", **_pooled(group["q_id"], group["correct"], n_boot=n_boot,
                                                                 seed=seed)))
    selections = [(s, t, g) for (s, t), g in pairs.groupby(["source_language", "target_language"])]
    selections += [(s, "all", g) for s, g in pairs.groupby("source_language")]
    selections += [("all", t, g) for t, g in pairs.groupby("target_language")]
    selections += [("all", "all", pairs)]
    for s, t, group in selections:
        where = {"source_language": s, "target_language": t, "average": "pooled"}
        out.append(metric_row(where, "overall_success", **_pooled(group["q_id"], group["success"], n_boot=n_boot,
                                                                 seed=seed)))
        out.append(metric_row(where, "transfer_score", **_pooled(group["q_id"], group["target_correct"],
                                                                group["source_correct"], n_boot, seed)))
    # The paper's margins: means of the matrix cells, diagonal included (Fig. 5's bottom row, §4.2).
    cells = transfer_pairs(rows, diagonal=True)
    for fixed, over in (("source_language", "target_language"), ("target_language", "source_language")):
        for language, group in cells.groupby(fixed):
            where = {"source_language": "all", "target_language": "all", fixed: language, "average": "macro"}
            out.append(metric_row(where, "overall_success",
                                  **macro_proportion(group, over, "success", n_boot=n_boot, seed=seed)))
            out.append(metric_row(where, "transfer_score",
                                  **macro_proportion(group, over, "target_correct", "source_correct", n_boot, seed)))
    summary = pd.DataFrame(out)
    for key, value in run_info(rows).items():
        summary[key] = value
    return summary


def transfer_matrices(summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Source × target matrices: success (diagonal: source accuracy, elsewhere overall success) and transfer."""
    cells = summary[(summary["source_language"] != "all") & (summary["target_language"] != "all")]
    langs = sorted(set(cells["source_language"]) | set(cells["target_language"]))
    success = cells[cells["metric"].isin(["overall_success", "source_accuracy"])].pivot(
        index="source_language", columns="target_language", values="value").reindex(index=langs, columns=langs)
    transfer = cells[cells["metric"] == "transfer_score"].pivot(
        index="source_language", columns="target_language", values="value").reindex(index=langs, columns=langs)
    return success, transfer


def macro_margins(summary: pd.DataFrame, direction: str) -> pd.DataFrame:
    """The paper's per-`direction` ("source" or "target") margins: metrics down, languages across."""
    column = f"{direction}_language"
    other = "target_language" if direction == "source" else "source_language"
    rows = summary[(summary["average"] == "macro") & (summary[other] == "all") & (summary[column] != "all")]
    return rows.pivot(index="metric", columns=column, values="value")


summarize = eclektic_summary  # the benchmark contract's summary (already long)


def _percent(row) -> str:
    """value±half-width in points, the way Table 2 prints it."""
    return f"{100 * row['value']:.1f}±{100 * (row['wald_high'] - row['wald_low']) / 2:.1f}"


def format_summary(summary: pd.DataFrame) -> str:
    """The protocol, the headline numbers and the paper's margins, then the matrices, as text."""
    first = summary.iloc[0] if len(summary) else {}
    lines = [f"ECLeKTiC, protocol {first.get('protocol') or '?'}: prompt {first.get('prompt_set') or '?'}, "
             f"judge {first.get('judge') or '?'}",
             "value [95% interval respecting questions]  value±half-width with independent examples (as Table 2)"]
    for metric in ("source_accuracy", "overall_success", "transfer_score"):
        row = summary[(summary["metric"] == metric) & (summary["source_language"] == "all")
                      & (summary["target_language"] == "all") & (summary["average"] == "pooled")]
        if not row.empty:
            r = row.iloc[0]
            lines.append(f"  {metric:16s} {r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]  {_percent(r)}  "
                         f"({r['k']}/{r['n']}, {r['interval']})")
    for direction, over in (("source", "targets"), ("target", "sources")):
        margins = macro_margins(summary, direction)
        if not margins.empty:
            lines.append(f"per {direction} language (mean over {over}, diagonal included, as the paper's margins):")
            lines.append(margins.to_string(float_format=lambda v: f"{v:.2f}", na_rep="-"))
    success, transfer = transfer_matrices(summary)
    lines.append("overall success (rows: source, columns: target; diagonal: source accuracy):")
    lines.append(success.to_string(float_format=lambda v: f"{v:.2f}", na_rep="-"))
    lines.append("transfer score:")
    lines.append(transfer.to_string(float_format=lambda v: f"{v:.2f}", na_rep="-"))
    return "\n".join(lines)
