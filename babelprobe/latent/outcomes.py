"""A compare directory's outcomes, for the lens and alignment to be joined with, and the correlation both use.

`language_accuracy(cmp)`: per language, meta and direct accuracy (mean over subsets) and the probe's peak
layer and F1; `probe_curve(cmp)`: probe F1 per language and layer (subsets averaged); `correlate(a, b)`:
Pearson and Spearman with p-values, NaN when there are fewer than three points or a constant.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.runs import LAYOUTS
from babelprobe.tables import read_table


def check_compare_dir(compare_dir: str | Path) -> Path:
    """The directory, or the one-line error of `runs.LAYOUTS["compare"]` naming the first file it lacks."""
    return LAYOUTS["compare"].check(compare_dir, "--compare")


def language_accuracy(compare_dir: str | Path) -> pd.DataFrame:
    """Per language from a compare directory: meta and direct accuracy (mean over subsets) and the probe's
    peak layer and peak F1 of the subset-averaged F1 curve (`probe_curve`)."""
    summary = read_table(check_compare_dir(compare_dir) / "summary.csv")
    accuracy = summary[(summary["metric"] == "accuracy") & summary["method"].isin(["meta", "direct"])]
    out = accuracy.pivot_table(index="language", columns="method", values="value").add_suffix("_accuracy")
    curve = probe_curve(compare_dir)
    peak = curve.loc[curve.groupby("language")["f1_mean"].idxmax()].set_index("language")
    out["probe_peak_layer"], out["probe_peak_f1"] = peak["layer"], peak["f1_mean"]
    return out.reset_index()


def probe_curve(compare_dir: str | Path) -> pd.DataFrame:
    """Per language × layer: probe F1 averaged over subsets (a compare directory's layers.csv)."""
    layers = read_table(check_compare_dir(compare_dir) / "layers.csv")
    return layers.groupby(["language", "layer"], as_index=False)["f1_mean"].mean()


def correlate(a: pd.Series, b: pd.Series) -> dict:
    """`n` (rows where both are known), Pearson's r and Spearman's ρ with their p-values."""
    from scipy import stats  # imported here: scipy is slow to import and only needed for correlations

    ok = a.notna() & b.notna()
    a, b = a[ok].astype(float), b[ok].astype(float)
    out = {"n": int(ok.sum()), "pearson_r": np.nan, "pearson_p": np.nan, "spearman_rho": np.nan, "spearman_p": np.nan}
    if out["n"] < 3 or a.nunique() < 2 or b.nunique() < 2:
        return out
    r = stats.pearsonr(a, b)
    rho = stats.spearmanr(a, b)
    out.update(pearson_r=float(r.statistic), pearson_p=float(r.pvalue), spearman_rho=float(rho.statistic),
               spearman_p=float(rho.pvalue))
    return out
