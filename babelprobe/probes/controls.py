"""Baselines and control tasks that say how much of a probe's F1 is more than chance or memorisation.

- majority: always predict the training fold's most frequent label (scikit-learn's
  `DummyClassifier(strategy="most_frequent")`; ties go to label 0, like it);
- shuffle: the same probe trained on labels permuted within the training fold (seeded), tested on the
  true labels; what a probe reaches when the labels carry no information;
- hewitt: Hewitt & Liang's (2019) control task: every concept gets a random label and every sentence
  inherits its concept's label; a probe that scores well on it memorises concept identity.
  Selectivity = F1 − control F1.

For XCOMPS-style items the concept of a sentence is `acceptable_concept` when label == 1 and
`unacceptable_concept` when label == 0; a `concept` column, if present, is used as is.
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.probes.metrics import f1_from_counts

CONTROLS = ("shuffle", "hewitt")


def group_rng(seed: int, group: str, purpose: str) -> np.random.Generator:
    """A generator that depends only on the seed, the group's name and what it is for (so results do not
    change when other groups are added or removed)."""
    return np.random.default_rng([seed, zlib.crc32(group.encode()), zlib.crc32(purpose.encode())])


def majority_baseline(labels: np.ndarray, fold: np.ndarray, n_folds: int) -> tuple[np.ndarray, np.ndarray]:
    """F1 and accuracy per fold of predicting the training fold's majority label for every held-out item
    (with balanced minimal pairs that is label 0, so F1 is 0 and accuracy about 0.5)."""
    f1, accuracy = np.empty(n_folds), np.empty(n_folds)
    for k in range(n_folds):
        train, test = labels[fold != k], labels[fold == k]
        predict_one = (train == 1).sum() > (train == 0).sum()
        tp = (test == 1).sum() if predict_one else 0
        fp = (test == 0).sum() if predict_one else 0
        fn = 0 if predict_one else (test == 1).sum()
        f1[k] = f1_from_counts(tp, fp, fn)
        accuracy[k] = np.mean(test == int(predict_one))
    return f1, accuracy


def shuffled_labels(labels: np.ndarray, train: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[n_folds, n] labels with each fold's training labels permuted among its training rows."""
    out = np.tile(labels, (len(train), 1))
    for k, rows in enumerate(train):
        where = np.flatnonzero(rows)
        out[k, where] = labels[rng.permutation(where)]
    return out


def concept_labels(concepts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """0/1 control label of each item: its concept's random label, half the concepts getting 1."""
    names = np.unique(concepts)
    assigned = rng.permutation(np.arange(len(names)) % 2)
    return assigned[np.searchsorted(names, concepts)]


def concepts_for(keys: pd.DataFrame, items: pd.DataFrame | None) -> np.ndarray:
    """The concept of each stored item (rows of `keys`), looked up in `items` by item_id.

    Uses `items["concept"]` if present, else `acceptable_concept` for label 1 and `unacceptable_concept`
    for label 0 (XCOMPS). Raises BabelprobeError naming what is missing."""
    if items is None:
        raise BabelprobeError("the hewitt control needs each sentence's concept: pass the items (--items NAME|PATH, "
                              "with a concept column or acceptable_concept/unacceptable_concept)")
    if "concept" in items.columns:
        concept = items.set_index("item_id")["concept"]
    elif {"acceptable_concept", "unacceptable_concept"} <= set(items.columns):
        by_label = np.where(items["label"].to_numpy() == 1, items["acceptable_concept"].to_numpy(),
                            items["unacceptable_concept"].to_numpy())
        concept = pd.Series(by_label, index=items["item_id"].to_numpy())
    else:
        raise BabelprobeError("the hewitt control needs each sentence's concept, but the items have no concept column "
                              "nor acceptable_concept/unacceptable_concept columns")
    found = keys["item_id"].map(concept)
    missing = found.isna() | (found.astype(str).str.strip() == "")
    if missing.any():
        raise BabelprobeError(f"no concept for {int(missing.sum())} stored item(s), e.g. item_id "
                              f"{keys['item_id'][missing].iloc[0]!r}: are these the items the store was extracted from?")
    return found.astype(str).to_numpy()
