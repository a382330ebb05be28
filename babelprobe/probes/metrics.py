"""Probe metrics computed for all layers at once: F1 (positive class), accuracy and ROC AUC per fold.

They equal scikit-learn's `f1_score` (zero_division → 0), `accuracy_score` and `roc_auc_score` (tests
check this); they are vectorised over layers because a sweep needs thousands of them.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def f1_from_counts(tp, fp, fn):
    """F1 of the positive class from counts; 0 where there is nothing to score (sklearn's zero_division)."""
    tp, fp, fn = (np.asarray(v, dtype=float) for v in (tp, fp, fn))
    denominator = 2 * tp + fp + fn
    return np.divide(2 * tp, denominator, out=np.zeros(np.broadcast(tp, denominator).shape), where=denominator > 0)


def f1_scores(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """F1 of each row of `scores` [..., k] (predict 1 where score > 0) against `labels` [k]."""
    pred, truth = scores > 0, np.asarray(labels) == 1
    return f1_from_counts((pred & truth).sum(-1), (pred & ~truth).sum(-1), (~pred & truth).sum(-1))


def accuracies(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return ((scores > 0) == (np.asarray(labels) == 1)).mean(-1)


PAIRWISE_MAX = 64  # positive × negative pairs up to which the AUC counts pairs instead of ranking (same value)


def aucs(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """ROC AUC of each row of `scores` [..., k] (Mann–Whitney with tied ranks); NaN if one class is absent."""
    truth = np.asarray(labels) == 1
    n_pos, n_neg = truth.sum(), (~truth).sum()
    if n_pos == 0 or n_neg == 0:
        return np.full(scores.shape[:-1], np.nan)
    if n_pos * n_neg <= PAIRWISE_MAX:  # few items (a fold of a small group): count the pairs, ties as halves
        positive, negative = scores[..., truth, None], scores[..., None, ~truth]
        wins = (positive > negative).sum((-2, -1)) + 0.5 * (positive == negative).sum((-2, -1))
        return wins / (n_pos * n_neg)
    ranks = rankdata(scores, axis=-1)
    return (ranks[..., truth].sum(-1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def fold_metrics(scores: np.ndarray, labels: np.ndarray, fold: np.ndarray, n_folds: int) -> dict:
    """Per fold and layer, on each fold's held-out rows.

    Parameters
    ----------
    scores : [n_folds, L, n] decision scores of the probe trained for each fold (or [L, n] out-of-fold
        scores, used for every fold).
    labels : [n] (or [n_folds, n]) 0/1 labels to score against.
    fold : [n] held-out fold of each row.

    Returns
    -------
    dict of arrays [n_folds, L]: f1, accuracy, auc, and n_test [n_folds].
    """
    labels = np.asarray(labels)
    out = {"f1": [], "accuracy": [], "auc": [], "n_test": []}
    for k in range(n_folds):
        test = fold == k
        s = (scores[k] if scores.ndim == 3 else scores)[:, test]
        y = (labels[k] if labels.ndim == 2 else labels)[test]
        out["f1"].append(f1_scores(s, y))
        out["accuracy"].append(accuracies(s, y))
        out["auc"].append(aucs(s, y))
        out["n_test"].append(len(y))
    return {key: np.array(value) for key, value in out.items()}


def out_of_fold(scores: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """[L, n] scores of each row from the probe of the fold that held it out (scores [n_folds, L, n])."""
    return np.take_along_axis(scores, fold[None, None, :], axis=0)[0]
