"""Sparse probes: logistic probes on the k features whose mean activation differs most between the
acceptable and unacceptable items, against the dense probe on the same states.

The states are each text's last-token state at the SAE's layer (a store's `last`, or the ones the stats
pass keeps; never mean-pooled states, which are not states the SAE was made for), encoded offline into
a sparse matrix of codes (`encode_states`). For every probe group (language × subset, as the probe
sweep) the probe sweep's folds are made (`probes.folds.make_folds`: grouped by pair, same seed), and in
each fold, on its training rows only:

    gap_s = | mean of f_s over acceptable items − mean of f_s over unacceptable items |
    S_k   = the k features of largest gap (ties: lower index first)

then the sweep's solver (`probes.solvers.fit_predict`, standardised features, same C) fits a probe on
the codes of S_k and scores the held-out rows; F1 (label 1) is averaged over the folds, as the sweep's
`f1_mean`. `dense_f1` is the sweep's F1 on the dense states of the same rows, with the same folds.

All folds and every k of a group are fitted in one batched call: the feature sets are the "layers"
of one array, each zero-padded to the largest k (a zero column changes neither the fit nor the score).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.sae.settings import DEFAULT_KS
from babelprobe.sae.weights import SAE


def encode_states(sae: SAE, X: np.ndarray, chunk_bytes: int = 256 * 2**20) -> sp.csr_matrix:
    """The SAE codes of states X [n, d_in] as a float32 CSR matrix [n, d_sae], a chunk of rows at a time
    (only the non-zero codes are kept)."""
    X = np.asarray(X, dtype=np.float32)
    rows = max(1, chunk_bytes // (3 * 4 * sae.d_sae))
    parts = []
    with torch.inference_mode():
        for start in range(0, len(X), rows):
            f = sae.encode(torch.as_tensor(X[start:start + rows], device=sae.device))
            parts.append(sp.csr_matrix(f.cpu().numpy()))
    return sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, sae.d_sae), dtype=np.float32)


def sparse_probes(codes: sp.csr_matrix, states: np.ndarray, keys: pd.DataFrame, layer: int,
                  ks=DEFAULT_KS, folds: int = 5, seed: int = 0, C: float = 1.0) -> pd.DataFrame:
    """One row per group × k: group, language, subset, layer, k, f1_mean, f1_std, dense_f1, n (module
    docstring). `codes` [n, d_sae] and `states` [n, d] are row-aligned with `keys` (item_id, pair_id,
    language, subset, label); rows labelled -1 are left out."""
    from babelprobe.probes.folds import make_folds
    from babelprobe.probes.metrics import f1_scores
    from babelprobe.probes.solvers import fit_predict

    keys = keys.reset_index(drop=True)
    labelled = keys["label"].isin([0, 1]).to_numpy()
    ks = sorted({min(int(k), codes.shape[1]) for k in ks})
    if not ks or ks[0] < 1:
        raise BabelprobeError(f"sparse probes need k of at least 1, got {ks}")
    dense = dense_f1(states, keys, layer, folds, seed, C)
    rows = []
    for (language, subset), part in keys[labelled].groupby(["language", "subset"], sort=True):
        index = part.index.to_numpy()
        name = f"{language}/{subset}"
        labels, pair_ids = part["label"].to_numpy(int), part["pair_id"].astype(str).to_numpy()
        fold = make_folds(labels, pair_ids, folds, "grouped", seed, f"language={language} subset={subset}")
        F = codes[index]
        width = ks[-1]
        X = np.zeros((len(index), folds * len(ks), width), dtype=np.float32)
        for f in range(folds):
            train = fold != f
            gap = np.abs(_class_mean(F, train & (labels == 1)) - _class_mean(F, train & (labels == 0)))
            order = np.argsort(-gap, kind="stable")[:width]
            chosen = F[:, order].toarray()
            for j, k in enumerate(ks):
                X[:, f * len(ks) + j, :k] = chosen[:, :k]
        train = np.stack([fold != f for f in range(folds)])
        scores = fit_predict(X, np.tile(labels, (folds, 1)), train, C)  # [folds, folds × len(ks), n]
        for j, k in enumerate(ks):
            f1 = [f1_scores(scores[f, f * len(ks) + j][fold == f], labels[fold == f]) for f in range(folds)]
            rows.append({"group": name, "language": language, "subset": subset, "layer": layer, "k": k,
                         "f1_mean": float(np.mean(f1)), "f1_std": float(np.std(f1)),
                         "dense_f1": dense.get((language, subset), np.nan), "n": len(index)})
    return pd.DataFrame(rows)


def _class_mean(F: sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
    return np.asarray(F[rows].mean(axis=0)).ravel() if rows.any() else np.zeros(F.shape[1])


def dense_f1(states: np.ndarray, keys: pd.DataFrame, layer: int, folds: int, seed: int, C: float) -> dict:
    """{(language, subset): the probe sweep's f1_mean} on the dense states (same folds, solver and C)."""
    from babelprobe.probes.run import probe
    from babelprobe.probes.source import ArrayStore

    store = ArrayStore(keys[["item_id", "pair_id", "language", "subset", "label"]],
                       last=np.asarray(states, dtype=np.float32)[:, None, :], layers=[layer], n_layers=max(layer, 1))
    table = probe(store, folds=folds, seed=seed, C=C, n_boot=0).table
    return {(row.language, row.subset): float(row.f1_mean) for row in table.itertuples()}
