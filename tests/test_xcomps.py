"""XCOMPS as published: the paper protocol (its folds are scikit-learn's StratifiedKFold, computed here
independently; it is recorded in every output), the paper's tables against pandas / scipy computations
written here, and the report's paper figures, the two-model ones included."""

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from sklearn.model_selection import StratifiedKFold

from babelprobe.analysis import xcomps
from babelprobe.analysis.peaks import language_peaks, subset_peaks
from babelprobe.analysis.report import FIGURES, write_report
from babelprobe.cli import main
from babelprobe.comparison import PROTOCOLS, CompareSettings, compare
from babelprobe.errors import BabelprobeError
from babelprobe.probes import ProbeResult
from babelprobe.settings import settings_for
from tests.test_figures import items_frame
from tests.tiny import tiny_lm


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny models (a "base" and an "other") compared on the same items with the paper protocol."""
    root = tmp_path_factory.mktemp("paper")
    for name, seed in (("base", 0), ("other", 1)):
        compare(tiny_lm("llama", seed=seed), items_frame(), root / name, protocol="paper", progress=False)
    return root


# ------------------------------------------------------------------------------------------- protocol

def test_paper_folds_are_stratified_kfold_and_may_split_pairs(runs):
    oof = pd.read_parquet(runs / "base" / "neuro.oof.parquet")
    split_pairs = 0
    for (language, subset), group in oof[oof["layer"] == 0].groupby(["language", "subset"], sort=False):
        labels = group["label"].to_numpy()
        expected = np.empty(len(labels), int)
        for k, (_, test) in enumerate(StratifiedKFold(5, shuffle=True, random_state=0).split(labels, labels)):
            expected[test] = k
        np.testing.assert_array_equal(group["fold"].to_numpy(), expected, err_msg=f"{language} {subset}")
        split_pairs += int((group.groupby("pair_id")["fold"].nunique() > 1).sum())
    assert split_pairs > 0  # unlike the default, the two sentences of a pair can land in different folds


def test_the_protocol_is_recorded_in_every_output(runs):
    out = runs / "base"
    manifest = json.loads((out / "compare.json").read_text())
    assert manifest["protocol"] == "paper"
    recorded = manifest["settings"]
    assert (recorded["protocol"], recorded["fold_scheme"], recorded["folds"], recorded["layers"]) == \
        ("paper", "plain", 5, "peak")
    settings = json.loads((out / "neuro.settings.json").read_text())
    assert (settings["protocol"], settings["fold_scheme"], settings["folds"]) == ("paper", "plain", 5)
    assert (pd.read_csv(out / "summary.csv")["protocol"] == "paper").all()
    layers = pd.read_csv(out / "layers.csv")
    assert (layers["protocol"] == "paper").all() and (layers["fold_scheme"] == "plain").all()


def test_the_paper_protocol_refuses_a_contradicting_option_and_the_default_takes_it(runs, tmp_path, capsys):
    with pytest.raises(BabelprobeError, match="--protocol paper runs --fold-scheme plain; drop --fold-scheme grouped"):
        compare(tiny_lm("llama"), items_frame(), tmp_path / "x", protocol="paper", fold_scheme="grouped")
    assert not (tmp_path / "x").exists()
    default = settings_for(CompareSettings, "default", PROTOCOLS, folds=3)
    assert (default.fold_scheme, default.folds, default.layers) == ("grouped", 3, "peak")
    code = main(["compare", "--items", "xcomps-sample", "--languages", "en", "--limit", "5", "--protocol", "paper",
                 "--folds", "3", "--out", str(tmp_path / "y"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--protocol paper runs --folds 5" in err
    assert not (tmp_path / "y").exists()


def test_probe_cli_protocol_paper(tmp_path, capsys):
    from babelprobe.extract import write_store
    from babelprobe.probes import synthetic_activations

    keys, X = synthetic_activations(n_pairs=10, n_layers=3, d_model=16, languages=("de",), subsets=("random",),
                                    signal=6, peak_layer=2, seed=1)
    store = write_store(tmp_path / "acts", keys, last=X, n_layers=3)
    assert main(["probe", "--acts", str(store), "--out", str(tmp_path / "n.csv"), "--protocol", "paper",
                 "--n-boot", "0", "--no-progress"]) == 0
    assert "protocol paper" in capsys.readouterr().out
    settings = json.loads((tmp_path / "n.settings.json").read_text())
    assert (settings["protocol"], settings["fold_scheme"], settings["folds"]) == ("paper", "plain", 5)
    code = main(["probe", "--acts", str(store), "--out", str(tmp_path / "m.csv"), "--protocol", "paper",
                 "--fold-scheme", "grouped", "--no-progress"])
    assert code == 2 and "--protocol paper runs --fold-scheme plain" in capsys.readouterr().err
    assert not (tmp_path / "m.csv").exists()


# --------------------------------------------------------------------------------------------- tables

def test_method_cells_are_accuracy_and_the_maximum_over_layers(runs):
    items, layers = pd.read_csv(runs / "base" / "items.csv"), pd.read_csv(runs / "base" / "layers.csv")
    cells = xcomps.method_cells(pd.read_csv(runs / "base" / "summary.csv"), layers)
    for (language, subset), pairs in items.groupby(["language", "subset"]):
        cell = cells[(cells["language"] == language) & (cells["subset"] == subset)].set_index("method")
        for method in ("meta", "direct"):
            assert cell.loc[method, "value"] == pytest.approx(pairs[f"{method}_correct"].mean())
        group = layers[(layers["language"] == language) & (layers["subset"] == subset)].sort_values("layer")
        assert cell.loc["neuro", "value"] == pytest.approx(group["f1_mean"].max())
        assert cell.loc["neuro", "layer"] == group["layer"].iloc[int(np.argmax(group["f1_mean"].to_numpy()))]
    table = xcomps.method_table(cells)
    assert table["language"].tolist() == ["en", "zh", "de", "ja"] and table["typology"].iloc[0] == "not in Table 3"
    de = cells[(cells["language"] == "de") & (cells["method"] == "direct")]["value"].mean()
    assert table.set_index("language").loc["de", "direct mean"] == pytest.approx(de)


def synthetic_cells(languages=("en", "vi", "zh", "de", "fr", "ja", "ko"), seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [{"language": lang, "subset": subset, "method": method, "metric": "f1" if method == "neuro" else "accuracy",
             "value": rng.uniform(0.3, 1.0)}
            for lang in languages for subset in ("taxonomic", "random") for method in ("meta", "direct", "neuro")]
    return pd.DataFrame(rows)


def test_typology_means_average_the_table3_languages_and_leave_english_out():
    cells = synthetic_cells()
    means = xcomps.typology_means(cells).set_index(["typology", "method", "subset"])
    analytic = cells[cells["language"].isin(["vi", "zh"]) & (cells["method"] == "meta")]
    row = means.loc[("analytic", "meta", "taxonomic")]
    expected = analytic[analytic["subset"] == "taxonomic"]["value"]
    assert row["value"] == pytest.approx(expected.mean()) and row["sd"] == pytest.approx(expected.std(ddof=1))
    per_language = analytic.groupby("language")["value"].mean()
    assert means.loc[("analytic", "meta", "all"), "value"] == pytest.approx(per_language.mean())
    assert not means["languages"].str.contains("en").any()
    table = xcomps.typology_table(xcomps.typology_means(cells)).set_index("typology")
    assert list(table.index) == ["analytic", "inflectional", "agglutinative"]
    assert table.loc["analytic", "meta mean"] == pytest.approx(per_language.mean())
    assert xcomps.left_out(cells["language"]) == ["en"]


def test_correlations_by_subset_match_scipy():
    cells = synthetic_cells()
    out = xcomps.correlations_by_subset(cells).set_index(["subset", "method_a", "method_b"])
    wide = cells[cells["subset"] == "random"].pivot_table(index="language", columns="method", values="value")
    row = out.loc[("random", "meta", "neuro")]
    assert row["n_cells"] == 7
    assert row["pearson_r"] == pytest.approx(stats.pearsonr(wide["meta"], wide["neuro"]).statistic)
    assert row["spearman_rho"] == pytest.approx(stats.spearmanr(wide["meta"], wide["neuro"]).statistic)


def test_peak_readings_average_languages_or_language_subset_groups(runs):
    probe = ProbeResult.read(runs / "base" / "neuro.csv")
    per_language, per_cell = language_peaks(probe, n_boot=0), subset_peaks(probe)
    readings = xcomps.peak_readings(per_language, per_cell).set_index(["reading", "typology"])
    zh_cells = per_cell[per_cell["language"] == "zh"]["peak_layer"]
    assert readings.loc[("per language × negative type", "analytic"), "peak_layer_mean"] == pytest.approx(zh_cells.mean())
    assert readings.loc[("per language × negative type", "analytic"), "n"] == 2
    zh = per_language.set_index("language").loc["zh", "peak_layer"]
    assert readings.loc[("per language", "analytic"), "peak_layer_mean"] == zh
    assert "en" not in ", ".join(readings["languages"])


def test_layer_difference_is_the_f1_difference_with_a_paired_interval(runs):
    base, other = ProbeResult.read(runs / "base" / "neuro.csv"), ProbeResult.read(runs / "other" / "neuro.csv")
    same = xcomps.layer_difference(base, base, n_boot=50)
    assert (same["difference"] == 0).all() and (same["ci_low"] == 0).all() and (same["ci_high"] == 0).all()
    diff = xcomps.layer_difference(base, other, n_boot=50).set_index(["language", "subset", "layer"])
    a, b = base.table.set_index(["language", "subset", "layer"]), other.table.set_index(["language", "subset", "layer"])
    np.testing.assert_allclose(diff["difference"], (b["f1_mean"] - a["f1_mean"]).loc[diff.index])
    assert (diff["ci_low"] <= diff["ci_high"]).all()


# --------------------------------------------------------------------------------------------- report

def test_report_with_a_second_model_draws_every_xcomps_figure(runs, tmp_path):
    report = write_report(runs / "base", tmp_path / "rep", other=runs / "other", protocol="paper", n_boot=50)
    assert set(report.skipped) == {"transfer"}  # not an XCOMPS figure: needs `probe --transfer`
    assert set(report.figures) == set(FIGURES) - {"transfer"}
    for name in ("xcomps_table4", "xcomps_table5", "xcomps_cells", "xcomps_peak_readings",
                 "xcomps_correlations_by_subset", "xcomps_model_difference", "xcomps_layer_difference", "difference"):
        assert (tmp_path / "rep" / f"{name}.csv").exists(), name
    text = (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")
    assert "Protocol of these results: **paper**" in text and "| Fig. 13 " in text and "Table 5 style" in text
    cells = pd.read_csv(tmp_path / "rep" / "xcomps_model_difference.csv")
    mine = [pd.read_csv(runs / n / "items.csv").query("language == 'de' and subset == 'random'")["direct_correct"].mean()
            for n in ("base", "other")]
    row = cells.query("language == 'de' and subset == 'random' and method == 'direct'").iloc[0]
    assert row["value"] == pytest.approx(mine[1] - mine[0])


def test_report_protocol_check_and_two_models_of_other_items(runs, tmp_path):
    relabelled = tmp_path / "relabelled"
    shutil.copytree(runs / "base", relabelled, ignore=shutil.ignore_patterns("acts"))
    manifest = json.loads((relabelled / "compare.json").read_text())
    (relabelled / "compare.json").write_text(json.dumps({**manifest, "protocol": "default"}))
    with pytest.raises(BabelprobeError, match="made with protocol 'default'.*--protocol paper"):
        write_report(relabelled, tmp_path / "r1", protocol="paper")
    (relabelled / "compare.json").write_text(json.dumps({**manifest, "items_hash": "another"}))
    with pytest.raises(BabelprobeError, match="were run on different items"):
        write_report(relabelled, tmp_path / "r2", other=runs / "other")
    assert not (tmp_path / "r1" / "report.md").exists() and not (tmp_path / "r2" / "report.md").exists()


def test_xcomps_paper_protocol_runs_float16_on_cuda(monkeypatch):
    import torch

    from babelprobe.analysis.xcomps import protocol_dtype
    from babelprobe.errors import BabelprobeError

    assert protocol_dtype("paper", None, "cuda:0") == "float16"  # §4.1
    assert protocol_dtype("paper", None, "cpu") is None and protocol_dtype("default", None, "cuda") is None
    with pytest.raises(BabelprobeError, match="--protocol paper runs --model-dtype float16 on CUDA"):
        protocol_dtype("paper", "bfloat16", "cuda")
    monkeypatch.setattr("babelprobe.models.auto_device", lambda: torch.device("cuda"))
    assert protocol_dtype("paper", None, None) == "float16"  # no --device: the device babelprobe picks


def test_compare_from_python_loads_the_paper_dtype_too(monkeypatch, tmp_path):
    """`bp.compare(model_spec, ..., protocol="paper")` loads float16 on CUDA, as `compare --protocol paper` does."""
    import torch

    from babelprobe.comparison import compare

    loaded = []

    def load_model(spec, dtype=None, **kw):
        loaded.append(dtype)
        raise KeyboardInterrupt  # stop before any model work

    monkeypatch.setattr("babelprobe.models.auto_device", lambda: torch.device("cuda"))
    monkeypatch.setattr("babelprobe.models.load_model", load_model)
    # the store's room is checked with the model's config before the weights load: the hub's files, offline here
    monkeypatch.setattr("babelprobe.models.model_info", lambda spec, **kw: SimpleNamespace(n_layers=2, d_model=8))
    for protocol in ("paper", "default"):
        with pytest.raises(KeyboardInterrupt):
            compare("org/model", "xcomps-sample", tmp_path / protocol, protocol=protocol)
    assert loaded == ["float16", None]
