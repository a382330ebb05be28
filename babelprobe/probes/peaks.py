"""Uncertainty of probe F1 and of the peak layer, by bootstrap over minimal pairs.

A replicate resamples the group's pairs with replacement (both sentences of a drawn pair come along,
with the pair's multiplicity as weight) and recomputes the fold-averaged F1 of every layer from the
out-of-fold predictions; the probes are not refitted. From the replicates: a 95% percentile interval
for F1 at each layer, and the distribution of the best layer, whose 2.5–97.5% range is the interval for
the peak's position. The "first layer within one standard error of the peak" uses the fold standard
error (f1_std / √k) of the peak layer, the usual one-standard-error rule.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from babelprobe.probes.metrics import f1_from_counts


def bootstrap_f1(pred: np.ndarray, labels: np.ndarray, fold: np.ndarray, n_folds: int, pair_ids: np.ndarray,
                 n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Fold-averaged F1 of every layer in `n_boot` pair-resampled replicates.

    Parameters
    ----------
    pred : bool [L, n] out-of-fold predictions (score > 0).
    labels : 0/1 [n]; fold : held-out fold of each item [n]; pair_ids : [n].

    Returns
    -------
    float [n_boot, L]; a fold left without items in a replicate is skipped in its average.
    """
    _, pair_of = np.unique(pair_ids, return_inverse=True)
    n_pairs = pair_of.max() + 1
    counts = rng.multinomial(n_pairs, np.full(n_pairs, 1 / n_pairs), size=n_boot)  # [B, pairs]
    weight = counts[:, pair_of].astype(float)  # [B, n]
    truth = labels == 1
    per_fold = []
    for k in range(n_folds):
        test = fold == k
        w, p, t = weight[:, test], pred[:, test].T.astype(float), truth[test]  # p: [n_k, L]
        tp, fp, fn = w[:, t] @ p[t], w[:, ~t] @ p[~t], w[:, t] @ (1 - p[t])
        f1 = f1_from_counts(tp, fp, fn)
        f1[(2 * tp + fp + fn) == 0] = np.nan  # no weight on this fold (or nothing to score) in this replicate
        per_fold.append(f1)
    with np.errstate(all="ignore"):
        return np.nanmean(np.stack(per_fold), axis=0)


def f1_intervals(replicates: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval per layer from `replicates` [n_boot, L]."""
    alpha = (1 - level) / 2
    if not np.isnan(replicates).any():  # the same quantiles, computed for all layers at once
        low, high = np.quantile(replicates, [alpha, 1 - alpha], axis=0)
        return low, high
    return np.nanquantile(replicates, alpha, axis=0), np.nanquantile(replicates, 1 - alpha, axis=0)


def peak_summary(layers: np.ndarray, f1_mean: np.ndarray, f1_se: np.ndarray, replicates: np.ndarray,
                 n_layers: int, level: float = 0.95) -> dict:
    """The peak layer of one group and its uncertainty.

    Returns a dict: peak_layer, peak_f1, peak_layer_low/high (bootstrap interval of the best layer's
    position), peak_relative_depth (peak_layer / L), f1_se_at_peak, first_within_1se (the shallowest
    layer whose F1 is within one standard error of the peak) and its relative depth."""
    layers = np.asarray(layers)
    best = int(np.argmax(f1_mean))  # first maximum: the shallowest on ties
    boot_peaks = layers[np.nanargmax(np.nan_to_num(replicates, nan=-np.inf), axis=1)]
    alpha = (1 - level) / 2
    within = np.flatnonzero(f1_mean >= f1_mean[best] - f1_se[best])
    first = int(layers[within[0]])
    return {"peak_layer": int(layers[best]), "peak_f1": float(f1_mean[best]),
            "peak_layer_low": int(np.quantile(boot_peaks, alpha, method="lower")),
            "peak_layer_high": int(np.quantile(boot_peaks, 1 - alpha, method="higher")),
            "peak_relative_depth": layers[best] / n_layers, "f1_se_at_peak": float(f1_se[best]),
            "first_within_1se": first, "first_within_1se_relative_depth": first / n_layers}


def peak_table(table: pd.DataFrame, group_columns: list[str]) -> pd.DataFrame:
    """Peaks of a per-layer table that already carries the bootstrap columns (see `sweep`):
    one row per group. Used to re-derive peaks from a saved table (without the replicates the
    peak-position interval is unavailable, so it is left out)."""
    rows = []
    for key, part in table.groupby(group_columns, sort=True):
        part = part.sort_values("layer")
        f1, se, layers = part["f1_mean"].to_numpy(), part["f1_se"].to_numpy(), part["layer"].to_numpy()
        best = int(np.argmax(f1))
        first = int(layers[np.flatnonzero(f1 >= f1[best] - se[best])[0]])
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(group_columns, key, strict=True)), "peak_layer": int(layers[best]),
                     "peak_f1": float(f1[best]), "first_within_1se": first})
    return pd.DataFrame(rows)
