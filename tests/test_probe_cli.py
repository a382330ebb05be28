"""`babelprobe probe` end to end, and its one-line errors for bad input (nothing written, no traceback)."""

from __future__ import annotations

import h5py
import numpy as np
import pandas as pd
import pytest

from babelprobe.cli import main
from babelprobe.extract import write_store
from babelprobe.probes import load_probes, synthetic_activations
from babelprobe.tables import read_table

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: threads only add overhead


@pytest.fixture(scope="module")
def acts(tmp_path_factory):
    """A store of 2 languages x 2 subsets x 15 pairs x 5 layers x 24 dims, and its items (with concepts)."""
    root = tmp_path_factory.mktemp("probe_cli")
    keys, X = synthetic_activations(n_pairs=15, n_layers=4, d_model=24, languages=("en", "de"),
                                    subsets=("taxonomic", "random"), signal=8, peak_layer=3, seed=2)
    items = keys.assign(text=[f"sentence {i}" for i in range(len(keys))])
    items.to_csv(root / "items.csv", index=False)
    return root, keys, X, write_store(root / "acts", keys, last=X, n_layers=4)


def run(capsys, *argv):
    code = main(["probe", *map(str, argv), "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def test_probe_writes_tables_and_prints_peaks(acts, capsys, tmp_path):
    root, keys, X, store = acts
    out = tmp_path / "neuro.csv"
    code, stdout, err = run(capsys, "--acts", store, "--out", out, "--control", "all", "--items", root / "items.csv",
                            "--transfer", "--n-boot", 100)
    assert code == 0, err
    table = read_table(out)
    assert set(zip(table["language"], table["subset"], table["layer"], strict=True)) == {
        (lang, sub, layer) for lang in ("en", "de") for sub in ("taxonomic", "random") for layer in range(5)}
    assert table[["f1_mean", "f1_std", "n"]].notna().all().all()
    for side in ("neuro.folds.csv", "neuro.oof.parquet", "neuro.peaks.csv", "neuro.transfer.csv", "neuro.settings.json",
                 "neuro.probes.h5"):
        assert (tmp_path / side).exists(), side
    assert "peak layer per group" in stdout and "selectivity" in stdout and "transfer F1" in stdout
    assert len(pd.read_parquet(tmp_path / "neuro.oof.parquet")) == len(keys) * 5


def test_lbfgs_solver_keeps_probes_that_load(acts, capsys, tmp_path):
    """--solver lbfgs (the research-scale method) gives the exact solver's F1, and its kept probes load."""
    _, keys, X, store = acts
    code, stdout, err = run(capsys, "--acts", store, "--out", tmp_path / "lb.csv", "--solver", "lbfgs", "--n-boot", 0,
                            "--layers", "3")
    assert code == 0, err
    assert "lb.probes.h5" in stdout
    code, _, err = run(capsys, "--acts", store, "--out", tmp_path / "nt.csv", "--solver", "newton", "--n-boot", 0,
                       "--layers", "3")
    assert code == 0, err
    assert np.abs(read_table(tmp_path / "lb.csv")["f1_mean"] - read_table(tmp_path / "nt.csv")["f1_mean"]).max() <= 0.01
    probes = load_probes(tmp_path / "lb.probes.h5")
    assert set(probes.groups["method"]) == {"lbfgs"} and probes.settings["solver"] == "lbfgs"
    en = (keys["language"] == "en").to_numpy() & (keys["subset"] == "random").to_numpy()
    scores = probes.score(X[en, 3], ("en", "random"), layer=3)
    assert ((scores > 0) == (keys["label"][en] == 1)).mean() > 0.9  # the all-items probe fits its items


def test_plain_folds_sklearn_solver_and_layers(acts, capsys, tmp_path):
    _, _, _, store = acts
    out = tmp_path / "plain.parquet"
    code, _, err = run(capsys, "--acts", store, "--out", out, "--fold-scheme", "plain", "--solver", "sklearn",
                       "--layers", "2-3", "--by", "language", "--folds", "3", "--n-boot", 0)
    assert code == 0, err
    table = read_table(out)
    assert set(table["layer"]) == {2, 3} and set(table["subset"]) == {"all"} and (table["n"] == 60).all()
    assert (table["fold_scheme"] == "plain").all() and (table["solver"] == "sklearn").all()


def tamper(store, row, layer, value):
    """Write a value into the first shard, as a corrupted store would hold it."""
    with h5py.File(store / "shard-00000.h5", "r+") as f:
        f["last"][row, layer, 0] = value


@pytest.mark.parametrize("case, expected", [
    ("one_class", "group language=de subset=random has only label 1"),
    ("few_pairs", "has 15 pairs, fewer than --folds 20"),
    ("nan", "shard-00000.h5/last changed after it was written (checksum mismatch)"),
    ("no_labels", "group language=en subset=taxonomic has no items labelled 0 or 1"),
    ("no_pool", "has no 'mean' pooling"),
    ("no_concepts", "hewitt control needs"),
    ("bad_out", "unknown table format '.txt'; use .csv, .parquet"),
    ("bad_layer", "layer 7 is not in the store"),
])
def test_bad_input_is_one_line_and_writes_nothing(acts, capsys, tmp_path, case, expected):
    root, keys, X, store = acts
    out = tmp_path / "neuro.csv"
    out.write_text("an earlier result\n")
    argv = ["--acts", store, "--out", out]
    if case == "one_class":
        keep = ~((keys["language"] == "de") & (keys["subset"] == "random") & (keys["label"] == 0))
        store = write_store(tmp_path / "acts", keys[keep], last=X[keep.to_numpy()], n_layers=4)
        argv[1] = store
    elif case == "few_pairs":
        argv += ["--folds", 20]
    elif case == "nan":
        store = write_store(tmp_path / "acts", keys, last=X, n_layers=4)
        tamper(store, 3, 2, np.nan)
        argv[1] = store
    elif case == "no_labels":
        labels = np.where((keys["language"] == "en") & (keys["subset"] == "taxonomic"), -1, keys["label"])
        argv[1] = write_store(tmp_path / "acts", keys.assign(label=labels), last=X, n_layers=4)
    elif case == "no_pool":
        argv += ["--pool", "mean"]
    elif case == "no_concepts":
        argv += ["--control", "hewitt"]
    elif case == "bad_out":
        argv[3] = out = tmp_path / "neuro.txt"
    elif case == "bad_layer":
        argv += ["--layers", "0,7"]
    code, stdout, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("babelprobe: error:") and expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    if out.suffix == ".csv":
        assert out.read_text() == "an earlier result\n"  # untouched
    assert not (tmp_path / "neuro.folds.csv").exists() and not list(tmp_path.glob(".*.tmp"))
