"""Cross-validation folds for probes: stratified, grouped by minimal pair, seeded.

The default scheme keeps both sentences of a pair on the same side of every split (scikit-learn's
`StratifiedGroupKFold` with `groups = pair_id`), so a probe is never tested on a sentence whose
minimal-pair partner it was trained on. `scheme="plain"` is the XCOMPS paper's stratified 5-fold
(`StratifiedKFold`), for reproducing its numbers. Both shuffle with a recorded seed.

`StratifiedGroupKFold` places pairs one at a time in Python, which is slow next to the probes; but its
answer depends only on the label counts of each pair (in sorted pair order), k and the seed, not on the
pair names. So it runs once per distinct layout and the answer is reused: every language × subset of
an item set usually has the same layout.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from babelprobe.errors import BabelprobeError

SCHEMES = ("grouped", "plain")


def check_labels(labels: np.ndarray, pair_ids: np.ndarray, n_folds: int, group: str) -> None:
    """Raise a one-line BabelprobeError when `group` cannot be cross-validated with `n_folds` folds."""
    labels = np.asarray(labels)
    if len(labels) == 0:
        raise BabelprobeError(f"group {group} has no items with label 0 or 1 to probe")
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < 2:
        raise BabelprobeError(f"group {group} has only label {int(classes[0])} ({counts[0]} items); a probe needs "
                              "acceptable (1) and unacceptable (0) items; check the label field or group more "
                              "broadly (--by)")
    n_pairs = len(np.unique(pair_ids))
    if n_pairs < n_folds:
        raise BabelprobeError(f"group {group} has {n_pairs} pairs, fewer than --folds {n_folds}; use fewer folds "
                              "or group more broadly (--by)")
    if counts.min() < n_folds:
        raise BabelprobeError(f"group {group} has only {counts.min()} items with label {int(classes[counts.argmin()])}, "
                              f"fewer than --folds {n_folds}; use fewer folds or group more broadly (--by)")


def make_folds(labels: np.ndarray, pair_ids: np.ndarray, n_folds: int = 5, scheme: str = "grouped",
               seed: int = 0, group: str = "") -> np.ndarray:
    """Fold number (0..n_folds-1) of each item: the fold in which it is held out.

    Parameters
    ----------
    labels : 0/1 labels of the items.
    pair_ids : the pair each item belongs to (kept together when `scheme="grouped"`).
    n_folds : number of folds (k).
    scheme : "grouped" (StratifiedGroupKFold on pair_id) or "plain" (StratifiedKFold).
    seed : shuffling seed (`random_state`).
    group : name of the group for error messages.
    """
    from sklearn.model_selection import StratifiedKFold

    if scheme not in SCHEMES:
        raise BabelprobeError(f"unknown fold scheme {scheme!r}; use {' or '.join(SCHEMES)}")
    if n_folds < 2:
        raise BabelprobeError(f"--folds must be at least 2, got {n_folds}")
    labels, pair_ids = np.asarray(labels), np.asarray(pair_ids)
    check_labels(labels, pair_ids, n_folds, group)
    if scheme == "grouped":
        classes, label_index = np.unique(labels, return_inverse=True)
        _, pair_index = np.unique(pair_ids, return_inverse=True)
        counts = np.zeros((pair_index.max() + 1, len(classes)), dtype=np.int64)
        np.add.at(counts, (pair_index, label_index), 1)
        fold = _grouped_fold_of_pairs(counts.tobytes(), counts.shape, n_folds, seed)[pair_index]
    else:
        fold = np.full(len(labels), -1, dtype=np.int64)
        splits = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed).split(np.zeros(len(labels)), labels)
        for k, (_, test) in enumerate(splits):
            fold[test] = k
    for k in range(n_folds):
        train_labels = labels[fold != k]
        if len(np.unique(train_labels)) < 2 or not (fold == k).any():
            raise BabelprobeError(f"group {group}: fold {k} cannot be built with both classes in training; "
                                  "use fewer folds")
    return fold


@lru_cache(maxsize=256)
def _grouped_fold_of_pairs(counts: bytes, shape: tuple[int, int], n_folds: int, seed: int) -> np.ndarray:
    """The fold of each pair from `StratifiedGroupKFold`, given only the label counts [pairs, classes] of
    the pairs in sorted order: it is run on stand-in items with that layout (pair i named by its rank)."""
    from sklearn.model_selection import StratifiedGroupKFold

    counts = np.frombuffer(counts, dtype=np.int64).reshape(shape)
    pairs = np.repeat(np.arange(shape[0]), counts.sum(1))
    labels = np.concatenate([np.repeat(np.arange(shape[1]), row) for row in counts])
    splitter = StratifiedGroupKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    fold = np.full(shape[0], -1, dtype=np.int64)
    for k, (_, test) in enumerate(splitter.split(np.zeros(len(labels)), labels, groups=pairs)):
        fold[pairs[test]] = k
    fold.flags.writeable = False  # shared by every caller with this layout
    return fold


def train_masks(fold: np.ndarray, n_folds: int) -> np.ndarray:
    """Boolean [n_folds, n]: the training rows of each fold (everything not held out in it)."""
    return np.stack([fold != k for k in range(n_folds)])


def inner_train_masks(labels: np.ndarray, pair_ids: np.ndarray, outer_train: np.ndarray, n_inner: int,
                      scheme: str, seed: int, group: str) -> np.ndarray:
    """Nested CV: boolean [n_outer, n_inner, n] training rows of inner folds built inside each outer
    training set (same scheme), and their complement inside it is the inner validation set."""
    masks = np.zeros((len(outer_train), n_inner, len(labels)), dtype=bool)
    for k, rows in enumerate(outer_train):
        where = np.flatnonzero(rows)
        inner = make_folds(labels[where], pair_ids[where], n_inner, scheme, seed + 1 + k,
                           f"{group} (inner folds of outer fold {k})")
        for j in range(n_inner):
            masks[k, j, where[inner != j]] = True
    return masks
