"""A proportion k/n with a 95% interval that respects clustering.

Benchmarks often count several rows per unit (an ECLeKTic question asked in eleven target languages, a
self-consistency item translated into three): those rows are not independent, and a Wilson interval
over them is too narrow. `proportion(units, hits)` gives the Wilson interval when every unit
contributes one counted row, and otherwise a percentile bootstrap that resamples whole units (the
ratio of summed hits to summed counted rows in each resample).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from babelprobe.analysis.summary import wilson


def proportion(units, hits, counted=None, n_boot: int = 2000, seed: int = 0, unit: str = "units") -> dict:
    """`n`, `k`, `value` = k/n, `ci_low`, `ci_high` and `interval` (how the interval was made) over the
    counted rows (all rows by default); `units` names each row's unit (e.g. the question id), `unit` what
    a unit is (for the `interval` text)."""
    units = np.asarray(units)
    hits = np.asarray(hits, bool)
    counted = np.ones(len(hits), bool) if counted is None else np.asarray(counted, bool)
    k, n = int((hits & counted).sum()), int(counted.sum())
    out = {"n": n, "k": k, "value": k / n if n else np.nan, "ci_low": np.nan, "ci_high": np.nan, "interval": ""}
    if not n:
        return out
    if not pd.Series(units[counted]).duplicated().any():
        low, high = wilson(k, n)
        out.update(ci_low=float(low), ci_high=float(high), interval="wilson")
        return out
    per_unit = pd.DataFrame({"unit": units, "k": hits & counted, "n": counted}).groupby("unit")[["k", "n"]].sum()
    ku, nu = per_unit["k"].to_numpy(float), per_unit["n"].to_numpy(float)
    draws = np.random.default_rng(seed).integers(0, len(ku), size=(n_boot, len(ku)))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = ku[draws].sum(axis=1) / nu[draws].sum(axis=1)
    low, high = np.nanpercentile(ratios, [2.5, 97.5])
    out.update(ci_low=float(low), ci_high=float(high), interval=f"bootstrap over {unit}")
    return out
