"""Peak-layer analysis: typology join, subset-averaged curves and their bootstrap (checked against an
explicit resampling written here), language and typology peaks, and model differences."""

import numpy as np
import pandas as pd
import pytest

from babelprobe.analysis.peaks import (
    language_curves,
    language_order,
    language_peaks,
    peak_difference,
    subset_peaks,
    typology_peaks,
    with_typology,
)
from babelprobe.errors import BabelprobeError
from babelprobe.languages import language_table
from babelprobe.probes import ArrayStore, synthetic_activations
from babelprobe.probes import probe as run_probes

PLANTED = {"en": 2, "de": 6, "ja": 10}  # planted peak layer of each language's signal (L = 12)


@pytest.fixture(scope="module")
def probe():
    keys, arrays = [], []
    for i, (language, peak) in enumerate(PLANTED.items()):
        k, x = synthetic_activations(n_pairs=30, n_layers=12, d_model=8, languages=(language,),
                                     subsets=("taxonomic", "random"), signal=3.0, peak_layer=peak, seed=i)
        keys.append(k)
        arrays.append(x)
    store = ArrayStore(pd.concat(keys, ignore_index=True), last=np.concatenate(arrays), n_layers=12)
    return run_probes(store, folds=5, n_boot=200, seed=0)


def test_typology_comes_from_the_language_table():
    frame = with_typology(pd.DataFrame({"language": ["ja", "en", "xx"], "value": [1, 2, 3]}))
    table = language_table()
    assert frame.set_index("language").loc["ja", "typology"] == table.loc["ja", "typology"] == "agglutinative"
    assert frame.set_index("language").loc["en", "name"] == "English"
    assert frame.set_index("language").loc["xx", "typology"] == "other"
    assert frame["value"].tolist() == [1, 2, 3]
    assert language_order(["tr", "de", "zh", "xx", "en"]) == ["en", "zh", "de", "tr", "xx"]


def test_subset_peaks_are_the_sweeps_peaks_with_typology(probe):
    peaks = subset_peaks(probe)
    best = probe.table.loc[probe.table.groupby(["language", "subset"])["f1_mean"].idxmax()]
    merged = peaks.merge(best[["language", "subset", "layer"]], on=["language", "subset"])
    assert (merged["peak_layer"] == merged["layer"]).all()
    assert set(peaks["typology"]) == {"analytic", "inflectional", "agglutinative"}


def test_language_curve_is_the_mean_of_the_subset_curves(probe):
    curves = language_curves(probe, n_boot=50)
    expected = probe.table.groupby(["language", "layer"])["f1_mean"].mean()
    got = curves.set_index(["language", "layer"])["f1_mean"]
    pd.testing.assert_series_equal(got.sort_index(), expected.sort_index(), check_names=False)
    assert (curves["f1_ci_low"] <= curves["f1_ci_high"]).all()
    assert (curves["relative_depth"] == curves["layer"] / 12).all()


def test_language_peak_is_the_argmax_of_the_mean_curve_and_follows_the_planted_depth(probe):
    peaks = language_peaks(probe, n_boot=200).set_index("language")
    mean_curve = probe.table.groupby(["language", "layer"])["f1_mean"].mean().unstack()
    for language in PLANTED:
        assert peaks.loc[language, "peak_layer"] == mean_curve.loc[language].idxmax()
        assert peaks.loc[language, "peak_layer_low"] <= peaks.loc[language, "peak_layer_high"]
        assert peaks.loc[language, "peak_f1"] == pytest.approx(mean_curve.loc[language].max())
    # the signal planted shallow peaks shallower than the one planted deep
    assert peaks.loc["en", "peak_layer"] < peaks.loc["ja", "peak_layer"]
    assert peaks.loc["en", "peak_layer_high"] < peaks.loc["ja", "peak_layer_high"]


def test_bootstrap_interval_matches_an_explicit_resampling_of_pairs(probe):
    """Resample pairs (with their two sentences) within each subset by hand, recompute fold-averaged F1
    from the out-of-fold scores, average over subsets: the 95% band must agree with language_curves."""
    n_boot = 1000
    curves = language_curves(probe, n_boot=n_boot).set_index(["language", "layer"])
    rng = np.random.default_rng(123)
    oof = probe.oof[probe.oof["language"] == "de"]
    per_subset = []
    for _, rows in oof.groupby("subset"):
        wide = rows.pivot_table(index=["pair_id", "item_id", "label", "fold"], columns="layer", values="score")
        pair_ids = wide.index.get_level_values("pair_id").to_numpy()
        unique = np.unique(pair_ids)
        rows_of = {p: np.flatnonzero(pair_ids == p) for p in unique}
        reps = np.empty((n_boot, wide.shape[1]))
        for b in range(n_boot):
            drawn = rng.choice(unique, size=len(unique), replace=True)
            index = np.concatenate([rows_of[p] for p in drawn])
            labels = wide.index.get_level_values("label").to_numpy()[index]
            folds = wide.index.get_level_values("fold").to_numpy()[index]
            pred = wide.to_numpy()[index] > 0
            f1s = []
            for k in range(5):
                t, p = labels[folds == k] == 1, pred[folds == k]
                if len(t) == 0:
                    continue
                tp, fp, fn = (p & t[:, None]).sum(0), (p & ~t[:, None]).sum(0), (~p & t[:, None]).sum(0)
                with np.errstate(invalid="ignore", divide="ignore"):
                    f1s.append(np.where(2 * tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn), 0.0))
            reps[b] = np.mean(f1s, axis=0)
        per_subset.append(reps)
    mean = np.mean(per_subset, axis=0)
    low, high = np.quantile(mean, 0.025, axis=0), np.quantile(mean, 0.975, axis=0)
    ours = curves.loc["de"]
    np.testing.assert_allclose(ours["f1_ci_low"], low, atol=0.03)
    np.testing.assert_allclose(ours["f1_ci_high"], high, atol=0.03)


def test_no_bootstrap_collapses_the_interval_onto_the_peak(probe):
    peaks = language_peaks(probe, n_boot=0)
    assert (peaks["peak_layer_low"] == peaks["peak_layer"]).all()
    assert (peaks["peak_layer_high"] == peaks["peak_layer"]).all()


def test_typology_averages_and_spread_across_languages():
    peaks = pd.DataFrame({"language": ["de", "fr", "es", "ja", "en"], "peak_layer": [4, 8, 9, 12, 6],
                          "peak_relative_depth": [4 / 18, 8 / 18, 9 / 18, 12 / 18, 6 / 18],
                          "peak_f1": [0.7, 0.8, 0.9, 0.6, 0.75]})
    out = typology_peaks(peaks).set_index("typology")
    assert list(out.index) == ["inflectional", "agglutinative"]  # en is not in XCOMPS Table 3: left out
    assert out.loc["inflectional", "peak_layer_mean"] == pytest.approx(np.mean([4, 8, 9]))
    assert out.loc["inflectional", "peak_layer_sd"] == pytest.approx(np.std([4, 8, 9], ddof=1))
    assert (out.loc["inflectional", "peak_layer_min"], out.loc["inflectional", "peak_layer_max"]) == (4, 9)
    assert out.loc["inflectional", "languages"] == "de, es, fr"
    assert out.loc["agglutinative", "n_languages"] == 1


def test_peak_difference_between_two_models():
    base = pd.DataFrame({"language": ["en", "de"], "peak_layer": [6, 9], "peak_relative_depth": [6 / 18, 9 / 18],
                         "peak_f1": [0.7, 0.8]})
    other = pd.DataFrame({"language": ["en", "de"], "peak_layer": [20, 16], "peak_relative_depth": [20 / 32, 0.5],
                          "peak_f1": [0.9, 0.8]})
    diff = peak_difference(base, other).set_index("language")
    assert diff.loc["en", "peak_layer_difference"] == 14
    assert diff.loc["en", "peak_relative_depth_difference"] == pytest.approx(20 / 32 - 6 / 18)
    assert diff.loc["de", "peak_relative_depth_difference"] == pytest.approx(0)
    with pytest.raises(BabelprobeError, match="no column 'peak_f1'"):
        peak_difference(base.drop(columns="peak_f1"), other)
    with pytest.raises(BabelprobeError, match="share no language"):
        peak_difference(base, other.assign(language=["fr", "es"]))
