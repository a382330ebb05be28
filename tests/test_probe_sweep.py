"""The probe sweep on activation stores: parity with an independent scikit-learn cross-validation,
table contracts, out-of-fold scores, peaks, controls, nested C, transfer and bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score
from sklearn.model_selection import GridSearchCV, StratifiedGroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from babelprobe.errors import BabelprobeError
from babelprobe.extract import open_store, write_store
from babelprobe.probes import (
    ArrayStore,
    ProbeResult,
    at_peaks,
    fit_predict,
    load_probes,
    synthetic_activations,
    transfer,
    transfer_matrix,
)
from babelprobe.probes import probe as run_probes
from babelprobe.probes.folds import inner_train_masks, make_folds, train_masks
from babelprobe.probes.run import choose_C, group_workers
from babelprobe.tables import read_table

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: threads only add overhead


@pytest.fixture(scope="module")
def real_shaped(tmp_path_factory):
    """One group of the realistic size: 60 pairs (120 items) x 19 layers (0..18) x 640 dims, as a store."""
    keys, X = synthetic_activations(n_pairs=60, n_layers=18, d_model=640, signal=6, seed=11)
    path = write_store(tmp_path_factory.mktemp("acts") / "acts", keys, last=X, n_layers=18)
    return keys, X, path


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """2 languages x 2 subsets x 20 pairs x 7 layers x 32 dims, with concepts, last and mean pooling."""
    keys, X = synthetic_activations(n_pairs=20, n_layers=6, d_model=32, languages=("en", "de"),
                                    subsets=("taxonomic", "random"), signal=8, peak_layer=4, seed=3)
    path = write_store(tmp_path_factory.mktemp("acts") / "small", keys, last=X, mean=X * 0.5 + 1, n_layers=6)
    return keys, X, path


def sklearn_cv_f1(X, labels, pair_ids, seed, tol=1e-6):
    """Independent reference: StratifiedGroupKFold on pairs + StandardScaler + LogisticRegression per layer."""
    splitter = StratifiedGroupKFold(5, shuffle=True, random_state=seed)
    f1, acc = [], []
    for train, test in splitter.split(X[:, 0], labels, pair_ids):
        model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, tol=tol, max_iter=5000))
        per_layer = [model.fit(X[train, j].astype(np.float64), labels[train]).predict(X[test, j].astype(np.float64))
                     for j in range(X.shape[1])]
        f1.append([f1_score(labels[test], p) for p in per_layer])
        acc.append([accuracy_score(labels[test], p) for p in per_layer])
    return np.mean(f1, 0), np.std(f1, 0), np.mean(acc, 0)


def test_torch_sweep_matches_sklearn_cross_validation_at_every_layer(real_shaped):
    keys, X, path = real_shaped
    result = run_probes(path, folds=5, seed=7)
    table = result.table.sort_values("layer")
    assert list(table["layer"]) == list(range(19))
    ref_f1, ref_std, ref_acc = sklearn_cv_f1(X, keys["label"].to_numpy(), keys["pair_id"].to_numpy(), seed=7)
    assert np.abs(table["f1_mean"].to_numpy() - ref_f1).max() <= 0.01
    assert np.abs(table["accuracy"].to_numpy() - ref_acc).max() <= 0.01
    assert np.abs(table["f1_std"].to_numpy() - ref_std).max() <= 0.02
    assert (table["n"] == 120).all() and (table["n_pairs"] == 60).all()
    # the planted signal peaks at layer 12: the probe should find a peak near it, with a sane interval
    peak = result.peaks.iloc[0]
    assert 9 <= peak["peak_layer"] <= 15 and peak["peak_layer_low"] <= peak["peak_layer"] <= peak["peak_layer_high"]
    assert peak["peak_f1"] > table.loc[table["layer"] == 0, "f1_ci_high"].iloc[0]
    assert peak["peak_relative_depth"] == pytest.approx(peak["peak_layer"] / 18)


def test_table_contract_out_of_fold_scores_and_pairs(small):
    keys, X, path = small
    result = run_probes(path, layers="0,2-4,6", n_boot=200)
    table = result.table
    expected = {(lang, sub, layer) for lang in ("en", "de") for sub in ("taxonomic", "random")
                for layer in (0, 2, 3, 4, 6)}
    assert set(zip(table["language"], table["subset"], table["layer"], strict=True)) == expected
    for column in ("method", "f1_mean", "f1_std", "accuracy", "auc", "n", "n_pairs", "f1_ci_low", "f1_ci_high",
                   "majority_f1", "pool", "solver", "C", "fold_scheme", "seed"):
        assert column in table.columns, column
    assert (table["f1_ci_low"] <= table["f1_ci_high"]).all()
    # the fold table's F1 is sklearn's f1_score of the out-of-fold predictions
    oof, folds = result.oof, result.folds
    assert len(oof) == len(keys) * 5
    for (lang, sub, layer, k), row in folds.set_index(["language", "subset", "layer", "fold"]).iloc[::7].iterrows():
        part = oof[(oof["language"] == lang) & (oof["subset"] == sub) & (oof["layer"] == layer) & (oof["fold"] == k)]
        assert row["f1"] == pytest.approx(f1_score(part["label"], part["score"] > 0))
        assert row["n_test"] == len(part)
    # grouped folds: the two sentences of a pair share a fold; pair view is score_good > score_bad
    assert (oof.groupby(["pair_id", "layer"])["fold"].nunique() == 1).all()
    pairs = result.pair_scores(layer=4)
    assert len(pairs) == 80 and (pairs["correct"] == (pairs["score_good"] > pairs["score_bad"])).all()
    assert pairs["correct"].mean() > 0.8  # the planted layer separates the pairs
    with pytest.raises(BabelprobeError, match="layer 5"):
        result.pair_scores(layer=5)


@pytest.mark.parametrize("beside_from", [0, 10**12], ids=["keys-beside-the-fits", "keys-taken-at-the-end"])
def test_out_of_fold_rows_carry_their_items_keys(small, monkeypatch, beside_from):
    """Each out-of-fold row's key columns are its own item's, whatever the order of the store's rows (groups
    interleaved) and whether the keys are Arrow strings or Python objects; every item once per layer. Both ways of
    taking them: every group's on the sweep's thread, and every group's at the end."""
    import babelprobe.probes.run as run

    monkeypatch.setattr(run, "BACKGROUND_OOF_ROWS", beside_from)
    keys, X, _ = small
    order = np.random.default_rng(0).permutation(len(keys))
    mixed = keys.iloc[order].reset_index(drop=True)
    as_objects = mixed.astype({column: object for column in ("item_id", "pair_id", "language", "subset")})
    truth = keys.set_index("item_id")
    for frame in (mixed, as_objects):
        oof = run_probes(ArrayStore(frame, last=X[order]), layers="0,3", n_boot=0).oof
        assert list(oof.columns) == ["method", "item_id", "pair_id", "language", "subset", "label", "layer", "fold",
                                     "score"]
        assert (oof["method"] == "neuro").all() and oof["item_id"].dtype == pd.Series(["x"]).dtype
        for layer in (0, 3):
            assert sorted(oof.loc[oof["layer"] == layer, "item_id"]) == sorted(keys["item_id"])
        expected = truth.loc[oof["item_id"]]
        for column in ("pair_id", "language", "subset", "label"):
            assert (oof[column].to_numpy() == expected[column].to_numpy()).all(), column


def test_out_of_fold_key_parts_keep_the_groups_order(small):
    """Groups whose keys were taken on a thread (futures) between runs of groups given by their places: the parts
    joined are the keys at all the places in order, as one take gives them."""
    from concurrent.futures import Future

    from babelprobe.probes.run import _joined, _oof_key_parts, _oof_keys

    keys = small[0]
    places = np.array_split(np.random.default_rng(1).permutation(len(keys)), 6)

    def beside(place):
        future = Future()
        future.set_result(_oof_keys(keys, place))
        return future

    pending = [places[0], beside(places[1]), places[2], places[3], beside(places[4]), places[5]]
    parts = _oof_key_parts(keys, pending)
    assert len(parts) == 5  # the two neighbours given by places taken at once
    whole = _oof_keys(keys, np.concatenate(places))
    for column, expected in whole.items():
        joined = _joined([part[column] for part in parts])
        assert list(joined) == list(expected), column


def test_controls_and_selectivity(small):
    keys, X, path = small
    result = run_probes(path, layers=[0, 4], controls="all", items=keys, n_boot=0)
    at_peak = result.table[result.table["layer"] == 4]
    assert (at_peak["f1_mean"] > 0.75).all()
    assert (at_peak["shuffle_f1"] < at_peak["f1_mean"] - 0.2).all()
    assert np.allclose(at_peak["selectivity"], at_peak["f1_mean"] - at_peak["control_f1"])
    assert (result.table["majority_accuracy"].between(0.3, 0.7)).all()
    again = run_probes(path, layers=[0, 4], controls="all", items=keys, n_boot=0)
    pd.testing.assert_frame_equal(result.table, again.table)  # seeded


def test_hewitt_without_concepts_says_so(small):
    keys, X, path = small
    with pytest.raises(BabelprobeError, match="--items"):
        run_probes(path, layers=[4], controls="hewitt")


def test_nested_C_matches_grid_search(small):
    keys, X, _ = small
    part = keys[(keys["language"] == "en") & (keys["subset"] == "random")]
    Xg = X[part.index][:, [2]]
    labels, pair_ids = part["label"].to_numpy(int), part["pair_id"].to_numpy()
    train = train_masks(make_folds(labels, pair_ids, 5, seed=0), 5)
    grid = [0.003, 0.03, 0.3]
    fit = dict(solver="torch", device=None, dtype=None, max_iter=None, n_jobs=None, memory_gb=1.0)
    chosen = choose_C(Xg, labels, pair_ids, train, grid, 3, "grouped", 0, "g", fit)
    inner = inner_train_masks(labels, pair_ids, train, 3, "grouped", 0, "g")
    for k in range(2):  # two outer folds are enough to compare choices
        rows = np.flatnonzero(train[k])
        splits = [(np.flatnonzero(inner[k, j, rows]), np.flatnonzero(~inner[k, j, rows])) for j in range(3)]
        search = GridSearchCV(make_pipeline(StandardScaler(), LogisticRegression(tol=1e-8, max_iter=10_000)),
                              {"logisticregression__C": grid}, cv=splits, scoring="f1", refit=False)
        search.fit(Xg[rows, 0], labels[rows])
        assert chosen[k, 0] == search.best_params_["logisticregression__C"]
    result = run_probes(ArrayStore(keys, last=X), layers=[2], C="0.003,0.03,0.3", n_boot=0)
    assert set(result.table["C_selected"]) <= set(grid) and result.table["C"].iloc[0].startswith("nested:")


def test_transfer_matrix_against_sklearn(tmp_path):
    keys, X = synthetic_activations(n_pairs=20, n_layers=4, d_model=24, languages=("en", "de", "zh"),
                                    subsets=("taxonomic",), signal=8, peak_layer=3, shared_direction=True, seed=5)
    store = ArrayStore(keys, last=X)
    table = transfer(store, layers=[3])
    assert len(table) == 6 and set(table["kind"]) == {"transfer"}
    row = table[(table["train_language"] == "en") & (table["test_language"] == "zh")].iloc[0]
    en, zh = (keys["language"] == "en").to_numpy(), (keys["language"] == "zh").to_numpy()
    model = make_pipeline(StandardScaler(), LogisticRegression(tol=1e-10, max_iter=10_000))
    model.fit(X[en, 3], keys["label"][en])
    assert row["f1"] == pytest.approx(f1_score(keys["label"][zh], model.predict(X[zh, 3])), abs=1e-9)
    assert table["f1"].min() > 0.8  # one shared direction: probes transfer
    result = run_probes(store, layers=[2, 3], transfer=True, n_boot=0)
    full = result.transfer
    diagonal = full[full["kind"] == "cv"]
    assert len(diagonal) == 6 and (diagonal["train_language"] == diagonal["test_language"]).all()
    cv = result.table.set_index(["language", "layer"])["f1_mean"]
    assert np.allclose(diagonal["f1"], [cv[(lang, layer)] for lang, layer in zip(diagonal["train_language"],
                                                                                  diagonal["layer"], strict=True)])
    peaks = at_peaks(full, result.peaks)
    assert len(peaks) == 9 and set(peaks["layer"]) <= {2, 3}
    assert transfer_matrix(peaks, layer=None).shape == (3, 3)


def test_write_puts_every_table_next_to_out(small, tmp_path):
    keys, X, path = small
    result = run_probes(path, layers=[1, 4], n_boot=50, transfer=True)
    paths = result.write(tmp_path / "neuro.csv")
    assert {p.name for p in paths.values()} == {"neuro.csv", "neuro.folds.csv", "neuro.oof.parquet", "neuro.peaks.csv",
                                                "neuro.transfer.csv", "neuro.settings.json", "neuro.probes.h5"}
    assert len(read_table(paths["table"])) == len(result.table)
    assert len(read_table(paths["oof"])) == len(result.oof)
    assert not list(tmp_path.glob(".*.tmp"))


def test_kept_probes_reapplied_reproduce_the_fit(small, tmp_path):
    """The probe kept for each group × layer is the one fitted on all of the group's items: re-applied to
    the store's activations after a round trip through NAME.probes.h5 it gives scikit-learn's pipeline
    decision function (an independent fit on the same rows) and the scores the solver computed."""
    keys, X, path = small
    result = run_probes(path, layers=[2, 4], n_boot=0)
    result.write(tmp_path / "neuro.csv")
    probes = load_probes(tmp_path / "neuro.probes.h5")
    assert probes.layers == [2, 4] and probes.by == ("language", "subset") and probes.d_model == 32
    assert len(probes.groups) == 4 and (probes.groups["n_train"] == 40).all()
    assert probes.settings["pool"] == "last" and (probes.C == 1.0).all()
    assert ProbeResult.read(tmp_path / "neuro.csv").probes.coef.tolist() == probes.coef.tolist()
    store = open_store(path)
    for language, subset in (("en", "taxonomic"), ("de", "random")):
        rows = np.flatnonzero(((store.keys["language"] == language) & (store.keys["subset"] == subset)).to_numpy())
        part = store.keys.iloc[rows]
        acts = store.read_layers([2, 4], rows=rows)  # [n, 2, d] raw activations
        both = probes.score(acts, (language, subset))  # every layer at once: [n, 2]
        solver, _ = fit_predict(acts, part["label"].to_numpy()[None], np.ones((1, len(rows)), bool), 1.0,
                                return_fit=True)
        for j, layer in enumerate([2, 4]):
            scores = probes.score(acts[:, j], {"language": language, "subset": subset}, layer=layer)
            model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, tol=1e-10, max_iter=10_000))
            model.fit(acts[:, j].astype(np.float64), part["label"])
            reference = model.decision_function(acts[:, j].astype(np.float64))
            np.testing.assert_allclose(scores, reference, atol=2e-3 * np.abs(reference).max())
            np.testing.assert_allclose(scores, solver[0, j], atol=1e-5 * np.abs(reference).max())
            np.testing.assert_allclose(both[:, j], scores, rtol=1e-12, atol=1e-12)
            probe = probes.probe((language, subset), layer)
            np.testing.assert_allclose(probe.mean, model[0].mean_, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(probe.scale, model[0].scale_, rtol=1e-5)
            direction = probes.direction((language, subset), layer)
            assert np.linalg.norm(direction) == pytest.approx(1)
            # a step of 1 along the direction raises every score by |coef|
            np.testing.assert_allclose(probes.score(acts[:, j] + direction, (language, subset), layer) - scores,
                                       np.linalg.norm(probe.coef))
    with pytest.raises(BabelprobeError, match="no probe for group .*'xx'.* the groups are"):
        probes.score(acts[:, 0], ("xx", "random"), layer=2)
    with pytest.raises(BabelprobeError, match="no probe at layer 3"):
        probes.direction(("en", "random"), 3)
    with pytest.raises(BabelprobeError, match="not a babelprobe probe file"):
        load_probes(path / "shard-00000.h5")


def test_sweep_on_the_large_size_path_matches_sklearn(real_shaped):
    """With the automatic threshold lowered, the sweep solves its groups with L-BFGS (as at research scale)
    and still equals an independent scikit-learn cross-validation."""
    keys, X, path = real_shaped
    layers = [0, 6, 12, 18]
    result = run_probes(path, layers=layers, folds=5, seed=7, n_boot=0, exact_max=16)
    assert set(result.probes.groups["method"]) == {"lbfgs"}
    ref_f1, _, ref_acc = sklearn_cv_f1(X[:, layers], keys["label"].to_numpy(), keys["pair_id"].to_numpy(), seed=7)
    table = result.table.sort_values("layer")
    assert np.abs(table["f1_mean"].to_numpy() - ref_f1).max() <= 0.01
    assert np.abs(table["accuracy"].to_numpy() - ref_acc).max() <= 0.01
    exact = run_probes(path, layers=layers, folds=5, seed=7, n_boot=0)
    assert set(exact.probes.groups["method"]) == {"newton"}
    assert np.abs(exact.table["f1_mean"].to_numpy() - result.table["f1_mean"].to_numpy()).max() <= 0.01


def test_mean_pooling_and_sklearn_solver(small):
    keys, X, path = small
    torch_mean = run_probes(path, layers=[4], pool="mean", n_boot=0).table
    sk_mean = run_probes(path, layers=[4], pool="mean", solver="sklearn", n_boot=0, n_jobs=1).table
    assert np.abs(torch_mean["f1_mean"] - sk_mean["f1_mean"]).max() <= 0.05
    assert (sk_mean["solver"] == "sklearn").all()


def test_groups_side_by_side_give_the_same_tables(small):
    """Groups solved in parallel threads (the CPU default) give the tables of one group at a time, in
    the same order; an error in one group is raised with its name, and torch's threads are restored."""
    keys, X, path = small
    one = run_probes(path, n_boot=50, controls="shuffle", workers=1)
    many = run_probes(path, n_boot=50, controls="shuffle", workers=3)
    for name in ("table", "folds", "oof", "peaks"):
        pd.testing.assert_frame_equal(getattr(one, name), getattr(many, name), check_exact=False, atol=1e-6)
    threads = torch.get_num_threads()
    bad = X.copy()
    bad[keys.index[keys["language"] == "de"][3], 2, 5] = np.inf
    with pytest.raises(BabelprobeError, match=r"group language=de subset=\w+: last activations of layer 2"):
        run_probes(ArrayStore(keys, last=bad), n_boot=0, workers=2)
    assert torch.get_num_threads() == threads
    with pytest.raises(BabelprobeError, match="workers must be at least 1"):
        run_probes(path, workers=0)
    # by default: every CPU thread a group; on an accelerator two groups (one read while the other is solved)
    assert group_workers(None, "torch", "cpu", 68) == torch.get_num_threads()
    assert group_workers(None, "torch", "meta", 68) == 2 and group_workers(None, "torch", "meta", 1) == 1
    assert group_workers(None, "sklearn", "cpu", 68) == 1


def test_bootstrap_draws_beside_the_fits_are_the_groups_own(small, monkeypatch):
    """The bootstrap's draws made on a thread while the probes are fitted (every group here) give the intervals
    and peak ranges the draws made in line do: bit for bit with one worker, as the sibling test with three."""
    import babelprobe.probes.run as run

    _, _, path = small
    monkeypatch.setattr(run, "BACKGROUND_DRAWS", 10**12)
    in_line = run_probes(path, n_boot=200, workers=1)
    monkeypatch.setattr(run, "BACKGROUND_DRAWS", 0)
    for workers in (1, 3):
        beside = run_probes(path, n_boot=200, workers=workers)
        for name in ("table", "peaks"):
            pd.testing.assert_frame_equal(getattr(beside, name), getattr(in_line, name), check_exact=workers == 1,
                                          atol=1e-6)
    assert in_line.table["f1_ci_low"].lt(in_line.table["f1_ci_high"]).any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_groups_side_by_side_in_a_fresh_process_on_cuda(small):
    """Two threads that first use CUDA's solver library at once fail in torch ("lazy wrapper should be called at
    most once", pytorch/pytorch#90613; perf/probe_phase.py on an H200, 2026-11-29): the sweep loads it before its
    groups' threads start. In a process of its own, where nothing has loaded it yet; the CPU's peaks."""
    keys, X, path = small
    code = ("import sys; from babelprobe.probes import probe; "
            f"probe({str(path)!r}, device='cuda', workers=4, n_boot=0).peaks.to_csv(sys.stdout, index=False)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    on_cuda = pd.read_csv(io.StringIO(done.stdout))
    on_cpu = run_probes(path, n_boot=0, workers=1).peaks
    assert on_cuda[["language", "subset"]].values.tolist() == on_cpu[["language", "subset"]].values.tolist()
    # float32 on another device may move an item across the boundary: F1 within one test item's change
    np.testing.assert_allclose(on_cuda["peak_f1"], on_cpu["peak_f1"], atol=0.1)


def test_bad_input_is_named(small, tmp_path):
    keys, X, path = small
    with pytest.raises(BabelprobeError, match="no 'mean' pooling"):
        run_probes(ArrayStore(keys, last=X), pool="mean")
    bad = X.copy()
    bad[keys.index[keys["language"] == "de"][3], 2, 5] = np.nan
    with pytest.raises(BabelprobeError, match=r"group language=de subset=\w+: last activations of layer 2 are NaN"):
        run_probes(ArrayStore(keys, last=bad), n_boot=0)
    unlabelled = keys.assign(label=np.where(keys["language"] == "de", -1, keys["label"]))
    with pytest.raises(BabelprobeError, match="group language=de subset=random has no items labelled 0 or 1"):
        run_probes(ArrayStore(unlabelled, last=X))
    with pytest.raises(BabelprobeError, match="group language=de has no items labelled 0 or 1"):
        run_probes(ArrayStore(unlabelled, last=X), by=("language",))
    with pytest.raises(BabelprobeError, match="no 'label' field"):
        run_probes(ArrayStore(keys.drop(columns="label"), last=X))
    one_class = keys[keys["label"] == 1].reset_index(drop=True)
    with pytest.raises(BabelprobeError, match="only label 1"):
        run_probes(ArrayStore(one_class, last=X[keys["label"] == 1]))
    with pytest.raises(BabelprobeError, match="group language=de subset=random has 20 pairs, fewer than --folds 25"):
        run_probes(path, folds=25)
    with pytest.raises(BabelprobeError, match="layer 9"):
        run_probes(path, layers="9")
    assert open_store(path).pools == ("last", "mean")


@pytest.mark.slow
def test_real_activations_match_sklearn_and_pairs_join_items(default_lm, tmp_path):
    """Gemma-3-270M activations of bundled items (massive-activation dimensions and all): the probe's F1
    equals an independent scikit-learn cross-validation at every layer."""
    from babelprobe.extract import extract
    from babelprobe.items import load_items

    items = load_items("xcomps-sample", languages=["en", "de"], subsets=["taxonomic"], limit=20)
    extract(default_lm, items, tmp_path / "acts", pool="last", progress=False,
            source={"source": "xcomps-sample", "languages": ["en", "de"], "subsets": ["taxonomic"], "limit": 20})
    store = open_store(tmp_path / "acts")
    result = run_probes(store, n_boot=100, controls="hewitt")  # concepts come from the manifest's item source
    for language in ("en", "de"):
        rows = np.flatnonzero((store.keys["language"] == language).to_numpy())
        X, part = store.read_layers(rows=rows), store.keys.iloc[rows]
        ref_f1, _, _ = sklearn_cv_f1(X, part["label"].to_numpy(), part["pair_id"].to_numpy(), seed=0)
        ours = result.table[result.table["language"] == language].sort_values("layer")["f1_mean"].to_numpy()
        assert np.abs(ours - ref_f1).max() <= 0.01, language
    pairs = result.pair_scores(layer=int(result.peaks["peak_layer"].iloc[0]), items=items)
    assert len(pairs) == 40 and pairs["text_good"].notna().all()
    assert "selectivity" in result.table.columns


def test_solver_choice_and_iterations_are_recorded(small, tmp_path):
    """The kept probes carry the method and iteration count of their fit (through NAME.probes.h5), and the
    settings what the solvers did over the sweep. For the scikit-learn solver the count is scikit-learn's
    own `n_iter_` of the same pipeline fitted on the group's rows; the Gram-preconditioned L-BFGS, asked
    for by name, gives scikit-learn's F1 and records its iterations and conditioning estimate."""
    keys, X, path = small
    store = open_store(path)
    reference = run_probes(path, layers=[2, 4], n_boot=0, solver="sklearn", n_jobs=1)
    reference.write(tmp_path / "sk.csv")
    kept = load_probes(tmp_path / "sk.probes.h5")
    assert set(kept.groups["method"]) == {"sklearn"}
    for g, row in kept.groups.iterrows():
        rows = np.flatnonzero(((store.keys["language"] == row["language"])
                               & (store.keys["subset"] == row["subset"])).to_numpy())
        labels = store.keys["label"].to_numpy()[rows]
        for j, layer in enumerate([2, 4]):
            acts = store.read_layers([layer], rows=rows)[:, 0].astype(np.float64)
            model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0)).fit(acts, labels)
            assert kept.n_iter[g, j] == model[-1].n_iter_[0]
    result = run_probes(path, layers=[2, 4], n_boot=0, solver="plbfgs")
    result.write(tmp_path / "pl.csv")
    kept = load_probes(tmp_path / "pl.probes.h5")
    assert set(kept.groups["method"]) == {"plbfgs"} and (kept.n_iter >= 1).all()
    assert np.isfinite(kept.conditioning).all() and (kept.conditioning > 0).all()
    record = result.settings["solver_record"]
    assert record["methods"] == {"plbfgs": 4} and record["n_iter_max"] >= kept.n_iter.max()
    written = json.loads((tmp_path / "pl.settings.json").read_text())
    assert written["solver_record"] == record
    both = reference.table.merge(result.table, on=["language", "subset", "layer"])
    assert np.abs(both["f1_mean_x"] - both["f1_mean_y"]).max() <= 0.01


def test_groups_read_to_the_solvers_device_give_the_same_tables(small, monkeypatch):
    """On an accelerator each group is read straight to the solver's device (`run.accelerator`): stood in
    for by the CPU as a torch device here, the tables equal those of the host's numpy reads."""
    import babelprobe.probes.run as run

    keys, X, path = small
    tiny = dict(n_boot=50, controls="shuffle", workers=1, memory_gb=1e-4)  # read group by group, not all at once
    host = run_probes(path, **tiny)
    monkeypatch.setattr(run, "accelerator", lambda device: torch.device("cpu"))
    read, reads = run.read_checked, []

    def spying(*args, device=None):
        reads.append(read(*args, device=device))
        return reads[-1]

    monkeypatch.setattr(run, "read_checked", spying)
    on_device = run_probes(path, **tiny)
    assert reads and all(isinstance(X, torch.Tensor) for X in reads)
    for name in ("table", "folds", "oof", "peaks"):
        pd.testing.assert_frame_equal(getattr(host, name), getattr(on_device, name), check_exact=False, atol=1e-6)


def test_the_solvers_default_memory_follows_the_device(monkeypatch):
    """2 GB on a CPU; on a GPU half of its free memory, counting the blocks torch's allocator holds unused (a
    compare run's model phases leave tens of GB cached there), and never less than a CPU's."""
    from babelprobe.probes.run import HOST_MEMORY_GB, solver_memory_gb

    assert solver_memory_gb(None) == solver_memory_gb(torch.device("cpu")) == HOST_MEMORY_GB
    gb = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (60 * gb, 141 * gb))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 70 * gb)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 30 * gb)
    assert solver_memory_gb(torch.device("cuda")) == (60 + 40) / 2
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1 * gb, 80 * gb))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 0)
    assert solver_memory_gb(torch.device("cuda")) == HOST_MEMORY_GB
