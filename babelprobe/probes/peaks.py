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


def pair_draws(pair_ids: np.ndarray, n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The replicates' draws: each item's pair (its index among the sorted pair ids) and how often each pair
    is drawn in each of `n_boot` replicates, [n_boot, pairs]. They need nothing but the pairs, so a sweep draws
    them while the group's probes are fitted (numpy's multinomial, a binomial per pair and replicate, releases
    the GIL: at XCOMPS's 3,592 pairs a group it costs more than the rest of the bootstrap)."""
    _, pair_of = np.unique(pair_ids, return_inverse=True)
    n_pairs = pair_of.max() + 1
    return pair_of, rng.multinomial(n_pairs, np.full(n_pairs, 1 / n_pairs), size=n_boot)


def bootstrap_f1(pred: np.ndarray, labels: np.ndarray, fold: np.ndarray, n_folds: int, pair_ids: np.ndarray,
                 n_boot: int, rng: np.random.Generator | None, draws: tuple | None = None) -> np.ndarray:
    """Fold-averaged F1 of every layer in `n_boot` pair-resampled replicates.

    Parameters
    ----------
    pred : bool [L, n] out-of-fold predictions (score > 0).
    labels : 0/1 [n]; fold : held-out fold of each item [n]; pair_ids : [n].
    draws : `pair_draws(pair_ids, n_boot, rng)` made beforehand (then `rng` is not used).

    Returns
    -------
    float [n_boot, L]; a fold left without items in a replicate is skipped in its average.
    """
    pair_of, counts = draws if draws is not None else pair_draws(pair_ids, n_boot, rng)  # counts: [B, pairs]
    n_pairs = counts.shape[1]
    # F1 = 2tp / (2tp + fp + fn): each item adds 2·truth·pred to the numerator and truth + pred to the denominator.
    # A fold's sums over its items, weighted by how often their pair was drawn, are two products per fold (numerator,
    # denominator) of its draws and its terms summed per pair (a pair's items come along together: half the length).
    # Counts and terms are small integers, so every sum is exact in float32 while below 2**24, whatever its order.
    cell_of_item = np.asarray(fold, dtype=np.int64) * n_pairs + pair_of  # its (fold, pair) cell
    cell, at = np.unique(cell_of_item, return_inverse=True)  # the cells that hold items
    exact = np.float32 if 2 * len(labels) * max(int(counts.max(initial=0)), 1) < 2**24 else np.float64
    truth, p = (labels == 1)[:, None].astype(exact), pred.T.astype(exact)  # p: [n, L]
    cell_fold, cell_pair = np.divmod(cell, n_pairs)
    drawn = counts.astype(exact)
    numerator_terms, denominator_terms = (np.zeros((len(cell), len(pred)), dtype=exact) for _ in range(2))  # per cell
    np.add.at(numerator_terms, at, 2 * truth * p)
    np.add.at(denominator_terms, at, truth + p)
    numerator, denominator = (np.empty((n_folds, n_boot, len(pred)), dtype=exact) for _ in range(2))
    for k in range(n_folds):
        mine = cell_fold == k
        weights = drawn[:, cell_pair[mine]]
        np.dot(weights, numerator_terms[mine], out=numerator[k])  # 2-D: np.dot, 5x np.matmul's speed on small folds
        np.dot(weights, denominator_terms[mine], out=denominator[k])
    numerator, denominator = numerator.astype(float), denominator.astype(float)
    # a denominator of 0 has a numerator of 0 (F1 0, sklearn's zero_division); any other is at least 1
    f1 = np.divide(numerator, np.maximum(denominator, 1), out=numerator)
    used = np.count_nonzero(denominator, axis=0)  # a fold without weight (or nothing to score) is left out
    with np.errstate(all="ignore"):
        return np.where(used > 0, f1.sum(0) / used, np.nan)


def f1_intervals(replicates: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval per layer from `replicates` [n_boot, L]."""
    alpha = (1 - level) / 2
    if not np.isnan(replicates).any():  # the same quantiles, computed for all layers at once
        low, high = linear_quantiles(replicates, (alpha, 1 - alpha))
        return low, high
    return np.nanquantile(replicates, alpha, axis=0), np.nanquantile(replicates, 1 - alpha, axis=0)


def linear_quantiles(values: np.ndarray, qs) -> list[np.ndarray]:
    """`np.quantile(values, q, axis=0)` for each q (its default method, Hyndman & Fan's type 7, and its
    interpolation) from one partition of `values` (no NaN) at the order statistics they need: numpy partitions
    anew on every call, and a full sort took four times as long on a group's bootstrap [1,000 × layers]
    (`tests/test_probe_folds.py` checks equality)."""
    last = len(values) - 1
    places = [(last * q, int(np.floor(last * q))) for q in qs]
    needed = sorted({k for _, below in places for k in (below, min(below + 1, last))})
    ordered = np.partition(values, needed, axis=0)
    out = []
    for at, below in places:
        a, b, t = ordered[below], ordered[min(below + 1, last)], at - below
        out.append(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t)  # numpy's _lerp: exact at both ends
    return out


def lower_and_higher(values: np.ndarray, low: float, high: float) -> tuple[int, int]:
    """`np.quantile(values, low, method="lower")` and `np.quantile(values, high, method="higher")` of a 1-D
    array (numpy's order statistics at floor and ceil of (n - 1) × q) from one partition: two `np.quantile`
    calls took longer than the rest of a small group's peak."""
    last = len(values) - 1
    at = (int(np.floor(last * low)), int(np.ceil(last * high)))
    ordered = np.partition(values, at)
    return int(ordered[at[0]]), int(ordered[at[1]])


def peak_summary(layers: np.ndarray, f1_mean: np.ndarray, f1_se: np.ndarray, replicates: np.ndarray,
                 n_layers: int, level: float = 0.95) -> dict:
    """The peak layer of one group and its uncertainty.

    Returns a dict: peak_layer, peak_f1, peak_layer_low/high (bootstrap interval of the best layer's
    position), peak_relative_depth (peak_layer / L), f1_se_at_peak, first_within_1se (the shallowest
    layer whose F1 is within one standard error of the peak) and its relative depth."""
    layers = np.asarray(layers)
    best = int(np.argmax(f1_mean))  # first maximum: the shallowest on ties
    if np.isnan(replicates).any():
        boot_peaks = layers[np.nanargmax(np.nan_to_num(replicates, nan=-np.inf), axis=1)]
    else:  # the same without the copy
        boot_peaks = layers[replicates.argmax(1)]
    alpha = (1 - level) / 2
    low, high = lower_and_higher(boot_peaks, alpha, 1 - alpha)
    within = np.flatnonzero(f1_mean >= f1_mean[best] - f1_se[best])
    first = int(layers[within[0]])
    return {"peak_layer": int(layers[best]), "peak_f1": float(f1_mean[best]),
            "peak_layer_low": low, "peak_layer_high": high,
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
