"""Folds, controls and bootstrap peaks: checked against scikit-learn and direct computations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.dummy import DummyClassifier
from sklearn.metrics import f1_score
from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

from babelprobe.errors import BabelprobeError
from babelprobe.probes.controls import (
    concept_labels,
    concepts_for,
    group_rng,
    majority_baseline,
    shuffled_labels,
)
from babelprobe.probes.folds import inner_train_masks, make_folds, train_masks
from babelprobe.probes.peaks import (
    bootstrap_f1,
    f1_intervals,
    linear_quantiles,
    lower_and_higher,
    pair_draws,
    peak_summary,
)


def pairs(n_pairs):
    labels = np.tile([1, 0], n_pairs)
    pair_ids = np.repeat([f"p{i}" for i in range(n_pairs)], 2)
    return labels, pair_ids


def test_grouped_folds_keep_pairs_together_and_match_sklearn():
    labels, pair_ids = pairs(23)
    fold = make_folds(labels, pair_ids, 5, "grouped", seed=3)
    assert (pd.Series(fold).groupby(pair_ids).nunique() == 1).all()
    expected = np.empty(len(labels), int)
    splitter = StratifiedGroupKFold(5, shuffle=True, random_state=3)
    for k, (_, test) in enumerate(splitter.split(np.zeros(len(labels)), labels, pair_ids)):
        expected[test] = k
    np.testing.assert_array_equal(fold, expected)
    assert not np.array_equal(fold, make_folds(labels, pair_ids, 5, "grouped", seed=4))


def test_plain_folds_are_xcomps_stratified_kfold():
    labels, pair_ids = pairs(20)
    fold = make_folds(labels, pair_ids, 5, "plain", seed=1)
    for k, (_, test) in enumerate(StratifiedKFold(5, shuffle=True, random_state=1).split(labels, labels)):
        assert set(np.flatnonzero(fold == k)) == set(test)


@pytest.mark.parametrize("labels, pair_ids, message", [
    (np.ones(20, int), np.repeat(np.arange(10), 2), "only label 1"),
    (np.tile([1, 0], 4), np.repeat(np.arange(4), 2), "4 pairs, fewer than --folds 5"),
    (np.r_[np.ones(18, int), 0, 0], np.arange(20), "only 2 items with label 0"),
])
def test_unfoldable_groups_are_named(labels, pair_ids, message):
    with pytest.raises(BabelprobeError, match=message) as err:
        make_folds(labels, pair_ids, 5, group="language=de subset=random")
    assert "language=de subset=random" in str(err.value)


def test_inner_folds_stay_inside_outer_training_rows():
    labels, pair_ids = pairs(30)
    train = train_masks(make_folds(labels, pair_ids, 5), 5)
    inner = inner_train_masks(labels, pair_ids, train, 3, "grouped", 0, "g")
    assert inner.shape == (5, 3, 60)
    for k in range(5):
        assert not (inner[k] & ~train[k]).any()
        held_out = train[k] & ~inner[k]  # each outer-training row is validated exactly once
        np.testing.assert_array_equal(held_out.sum(0), train[k].astype(int))


def test_majority_baseline_is_sklearn_dummy():
    rng = np.random.default_rng(0)
    labels = (rng.random(40) < 0.6).astype(int)
    fold = rng.integers(0, 4, 40)
    f1, accuracy = majority_baseline(labels, fold, 4)
    for k in range(4):
        dummy = DummyClassifier(strategy="most_frequent").fit(np.zeros((np.sum(fold != k), 1)), labels[fold != k])
        pred = dummy.predict(np.zeros((np.sum(fold == k), 1)))
        assert f1[k] == pytest.approx(f1_score(labels[fold == k], pred, zero_division=0))
        assert accuracy[k] == pytest.approx(np.mean(pred == labels[fold == k]))


def test_shuffled_labels_permute_only_training_rows():
    labels, pair_ids = pairs(25)
    train = train_masks(make_folds(labels, pair_ids, 5), 5)
    shuffled = shuffled_labels(labels, train, group_rng(0, "g", "shuffle"))
    for k in range(5):
        np.testing.assert_array_equal(shuffled[k, ~train[k]], labels[~train[k]])
        assert shuffled[k, train[k]].sum() == labels[train[k]].sum()
    assert not np.array_equal(shuffled[0, train[0]], labels[train[0]])
    again = shuffled_labels(labels, train, group_rng(0, "g", "shuffle"))
    np.testing.assert_array_equal(shuffled, again)


def test_concept_control_labels_follow_concepts():
    concepts = np.array(["dog", "cat", "dog", "eagle", "cat", "chair", "dog"])
    control = concept_labels(concepts, np.random.default_rng(0))
    for name in np.unique(concepts):
        assert len(set(control[concepts == name])) == 1
    assert set(control) == {0, 1}


def test_concepts_from_xcomps_fields_and_errors():
    keys = pd.DataFrame({"item_id": ["a", "b", "c"], "label": [1, 0, 1]})
    items = pd.DataFrame({"item_id": ["a", "b", "c"], "label": [1, 0, 1],
                          "acceptable_concept": ["dog", "dog", "cat"], "unacceptable_concept": ["x", "chair", "y"]})
    assert list(concepts_for(keys, items)) == ["dog", "chair", "cat"]
    with pytest.raises(BabelprobeError, match="--items"):
        concepts_for(keys, None)
    with pytest.raises(BabelprobeError, match="no concept column"):
        concepts_for(keys, items.drop(columns=["acceptable_concept"]))
    with pytest.raises(BabelprobeError, match="item_id 'c'"):
        concepts_for(keys, items.iloc[:2])


def test_bootstrap_replicates_recompute_fold_f1():
    rng = np.random.default_rng(1)
    labels, pair_ids = pairs(30)
    fold = make_folds(labels, pair_ids, 5)
    pred = rng.random((3, 60)) < np.array([[0.5], [0.7], [0.6]])
    pred[1] = labels == 1  # a perfect layer
    reps = bootstrap_f1(pred, labels, fold, 5, pair_ids, 200, np.random.default_rng(2))
    assert reps.shape == (200, 3)
    assert np.allclose(reps[:, 1], 1.0)
    # one replicate by hand: weights = how often each pair was drawn
    rng2 = np.random.default_rng(2)
    counts = rng2.multinomial(30, np.full(30, 1 / 30), size=200)[0]
    w = counts[np.unique(pair_ids, return_inverse=True)[1]]
    by_hand = []
    for k in range(5):
        test = (fold == k) & (w > 0)
        if test.any():
            by_hand.append(f1_score(labels[test], pred[0, test], sample_weight=w[test], zero_division=0))
    assert reps[0, 0] == pytest.approx(np.mean(by_hand))
    summary = peak_summary(np.array([0, 1, 2]), np.array([0.5, 0.9, 0.88]), np.array([0.05, 0.03, 0.04]), reps, 2)
    assert summary["peak_layer"] == 1 and summary["peak_layer_low"] == summary["peak_layer_high"] == 1
    assert summary["first_within_1se"] == 1 and summary["peak_relative_depth"] == 0.5
    near = peak_summary(np.array([4, 5, 6]), np.array([0.85, 0.9, 0.7]), np.array([0.1, 0.06, 0.1]), reps, 12)
    assert near["first_within_1se"] == 4


@pytest.mark.parametrize("scheme, n_pairs, n_folds", [("grouped", 3, 3), ("plain", 7, 3), ("grouped", 12, 5)])
def test_every_bootstrap_replicate_is_sklearn_weighted_f1(scheme, n_pairs, n_folds):
    """All replicates and layers, small groups included, where a replicate often leaves a fold without
    weight (skipped in the average, as is a fold with nothing true or predicted positive)."""
    rng = np.random.default_rng(n_pairs)
    labels, pair_ids = pairs(n_pairs)
    fold = make_folds(labels, pair_ids, n_folds, scheme, seed=1)
    pred = rng.random((4, len(labels))) < 0.6
    pred[3] = False  # a layer that never predicts positive: F1 0 where anything is true
    reps = bootstrap_f1(pred, labels, fold, n_folds, pair_ids, 60, np.random.default_rng(7))
    counts = np.random.default_rng(7).multinomial(n_pairs, np.full(n_pairs, 1 / n_pairs), size=60)
    weights = counts[:, np.unique(pair_ids, return_inverse=True)[1]]
    for b, w in enumerate(weights):
        for layer in range(len(pred)):
            f1s = [f1_score(labels[test], pred[layer, test], sample_weight=w[test], zero_division=0)
                   for test in (fold == k for k in range(n_folds))
                   if (w[test] * ((labels[test] == 1) | pred[layer, test])).sum() > 0]
            expected = np.mean(f1s) if f1s else np.nan
            np.testing.assert_allclose(reps[b, layer], expected, rtol=1e-12, atol=0)
    assert np.isfinite(reps).mean() > 0.5


def test_bootstrap_draws_made_beforehand_and_counts_past_float32s_exact_integers():
    """The draws a sweep makes while the probes are fitted (`pair_draws`) give the replicates the generator would;
    draws heavy enough that float32 would round the weighted sums (past 2**24) still give scikit-learn's F1."""
    rng = np.random.default_rng(3)
    labels, pair_ids = pairs(9)
    fold = make_folds(labels, pair_ids, 3, "grouped", seed=2)
    pred = rng.random((3, len(labels))) < 0.5
    drawn_here = bootstrap_f1(pred, labels, fold, 3, pair_ids, 40, np.random.default_rng(11))
    draws = pair_draws(pair_ids, 40, np.random.default_rng(11))
    np.testing.assert_array_equal(bootstrap_f1(pred, labels, fold, 3, pair_ids, 40, None, draws=draws), drawn_here)
    pair_of, _ = draws
    heavy = rng.integers(4_000_000, 9_000_000, size=(5, 9))  # 2 × 18 items × 9e6 > 2**24
    reps = bootstrap_f1(pred, labels, fold, 3, pair_ids, 5, None, draws=(pair_of, heavy))
    for b, w in enumerate(heavy[:, pair_of]):
        for layer in range(len(pred)):
            expected = np.mean([f1_score(labels[test], pred[layer, test], sample_weight=w[test], zero_division=0)
                                for test in (fold == k for k in range(3))])
            np.testing.assert_allclose(reps[b, layer], expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("n_boot", [1, 2, 7, 1000])
def test_interval_quantiles_are_numpys(n_boot):
    """One partition, then numpy's interpolation: the values np.quantile gives, ties (F1 of few items) included;
    the peak's interval (numpy's "lower" and "higher" order statistics) from one partition too."""
    rng = np.random.default_rng(n_boot)
    for values in (rng.integers(0, 5, size=(n_boot, 6)) / 4.0, rng.random((n_boot, 6))):
        for qs in ((0.025, 0.975), (0.0, 0.5, 1.0), (0.1, 0.9)):
            for got, q in zip(linear_quantiles(values, qs), qs, strict=True):
                np.testing.assert_allclose(got, np.quantile(values, q, axis=0), rtol=1e-15, atol=0)
        low, high = f1_intervals(values, 0.9)
        np.testing.assert_allclose(low, np.quantile(values, 0.05, axis=0), rtol=1e-15, atol=0)
        np.testing.assert_allclose(high, np.quantile(values, 0.95, axis=0), rtol=1e-15, atol=0)
    for peaks in (rng.integers(0, 19, size=n_boot), rng.integers(3, 5, size=n_boot)):
        for low, high in ((0.025, 0.975), (0.0, 1.0), (0.5, 0.5), (0.1, 0.7)):
            assert lower_and_higher(peaks, low, high) == (int(np.quantile(peaks, low, method="lower")),
                                                          int(np.quantile(peaks, high, method="higher")))
    with_nan = rng.random((max(n_boot, 3), 4))
    with_nan[0, 1] = np.nan
    np.testing.assert_allclose(f1_intervals(with_nan)[0], np.nanquantile(with_nan, 0.025, axis=0))
