"""Figures: each one draws the numbers of its input table (checked against independent computations),
fits a one- or two-column page with its legend inside, and has no overlapping tick labels."""

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy import stats

from babelprobe.analysis import figures, style
from babelprobe.analysis.peaks import language_curves, language_peaks, subset_peaks
from babelprobe.comparison import compare
from babelprobe.items import load_items
from babelprobe.probes import ProbeResult
from babelprobe.probes import probe as run_probes
from tests.tiny import tiny_lm

LANGUAGES = ("en", "zh", "de", "ja")  # not in XCOMPS Table 3, analytic, inflectional, agglutinative
CONCEPTS = [("dog", "cat", "can bark"), ("eagle", "chair", "can fly"), ("fish", "tree", "can swim"),
            ("cat", "spoon", "can climb trees"), ("horse", "cup", "has four legs"), ("bird", "stone", "has wings")]


ARTICLES = {"en": "A", "zh": "一只", "de": "Ein", "ja": "この"}  # so that each cell has its own texts


def items_frame():
    rows = []
    for language in LANGUAGES:
        for s, subset in enumerate(("taxonomic", "random")):
            for i, (good, _, prop) in enumerate(CONCEPTS):
                bad = CONCEPTS[(i + 1 + s) % len(CONCEPTS)][0]
                pair = f"p{i}-{subset}-{language}"
                for label, concept in ((1, good), (0, bad)):
                    rows.append({"item_id": f"{pair}-{label}", "pair_id": pair, "language": language,
                                 "subset": subset, "label": label, "text": f"{ARTICLES[language]} {concept} {prop}.",
                                 "property": prop, "acceptable_concept": good, "unacceptable_concept": bad})
    return load_items(pd.DataFrame(rows))


def make_results(out):
    """A compare directory of a tiny random model (4 languages × 2 subsets × 6 pairs) with a transfer
    sweep in `out/transfer/`, as `make demo` leaves it."""
    compare(tiny_lm("llama", seed=0), items_frame(), out, folds=3, progress=False)
    run_probes(out / "acts", folds=3, n_boot=200, transfer=True).write(out / "transfer" / "neuro.csv")
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from babelprobe.comparison import CompareResult

    out = make_results(tmp_path_factory.mktemp("results"))
    return {"compare": CompareResult.read(out), "probe": ProbeResult.read(out / "transfer" / "neuro.csv")}


def saved_size(fig, tmp_path, name):
    """Pixel size of the saved PNG and the figure's own size in pixels at 300 dpi."""
    width, height = fig.get_size_inches() * 300
    paths = style.save(fig, tmp_path / name)
    assert [p.suffix for p in paths] == [".pdf", ".png"]
    assert paths[0].read_bytes()[:4] == b"%PDF"
    with Image.open(paths[1]) as image:
        assert image.info["dpi"][0] == pytest.approx(300, abs=1)
        return image.size, (width, height)


def assert_fits_and_no_overlap(fig, tmp_path, name, column):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            boxes = [t.get_window_extent(renderer) for t in labels if t.get_text() and t.get_visible()]
            for i, a in enumerate(boxes):
                for b in boxes[i + 1:]:
                    assert not a.overlaps(b), f"{name}: tick labels overlap"
    (w, h), (fw, fh) = saved_size(fig, tmp_path, name)
    # bbox "tight" only grows the image when something sticks out of the figure (e.g. a legend)
    assert w <= fw + 15 and h <= fh + 15, f"{name}: something spills outside the {fw:.0f}×{fh:.0f} px figure"
    assert w <= style.WIDTHS[column] * 300 + 15


def test_layer_curves_draw_the_table_per_subset_with_bands(results, tmp_path):
    table = results["probe"].table
    fig = figures.plot_layer_curves(table)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["taxonomic", "random"]
    ax = panels[0]
    line = next(line for line in ax.get_lines() if line.get_label() == "ja")
    expected = table[(table["subset"] == "taxonomic") & (table["language"] == "ja")].sort_values("layer")
    np.testing.assert_allclose(line.get_ydata(), expected["f1_mean"])
    np.testing.assert_array_equal(line.get_xdata(), expected["layer"])
    assert len(ax.collections) == len(LANGUAGES)  # one interval band per language
    assert_fits_and_no_overlap(fig, tmp_path, "curves", "two")


def test_layer_curves_of_the_subset_average_in_relative_depth(results, tmp_path):
    probe = results["probe"]
    curves = language_curves(probe, n_boot=100)
    fig = figures.plot_layer_curves(curves, x="relative_depth")
    assert len(fig.axes) == 1
    line = next(line for line in fig.axes[0].get_lines() if line.get_label() == "en")
    mean = probe.table[probe.table["language"] == "en"].groupby("layer")["f1_mean"].mean()
    np.testing.assert_allclose(line.get_ydata(), mean.to_numpy())
    np.testing.assert_allclose(line.get_xdata(), mean.index / probe.settings["n_layers"])
    assert_fits_and_no_overlap(fig, tmp_path, "curves-mean", "one")


def test_peak_typology_points_and_class_means_without_english(results, tmp_path):
    peaks = language_peaks(results["probe"], n_boot=100)
    fig = figures.plot_peak_typology(peaks)
    ax = fig.axes[0]
    drawn = {t.get_text(): t.xy[1] for t in ax.texts}
    table3 = peaks[peaks["language"] != "en"]  # XCOMPS Table 3 does not list English
    assert drawn == dict(zip(table3["language"], table3["peak_layer"], strict=True))
    means = {"analytic": peaks[peaks["language"] == "zh"]["peak_layer"].iloc[0],
             "inflectional": peaks[peaks["language"] == "de"]["peak_layer"].iloc[0],
             "agglutinative": peaks[peaks["language"] == "ja"]["peak_layer"].iloc[0]}
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"{k}\nmean {v:.1f}" for k, v in means.items()]
    assert ax.get_xlabel() == "left out (not in XCOMPS Table 3): en"
    assert_fits_and_no_overlap(fig, tmp_path, "typology", "one")


def test_peak_heatmap_cells_are_the_peak_layers(results, tmp_path):
    peaks = subset_peaks(results["probe"])
    fig = figures.plot_peak_heatmap(peaks)
    ax = fig.axes[0]
    image = ax.get_images()[0].get_array()
    rows = [t.get_text() for t in ax.get_yticklabels()]
    cols = [t.get_text() for t in ax.get_xticklabels()]
    assert rows == ["en", "zh", "de", "ja"] and cols == ["taxonomic", "random"]
    table = results["probe"].table
    for i, language in enumerate(rows):
        for j, subset in enumerate(cols):
            group = table[(table["language"] == language) & (table["subset"] == subset)]
            assert image[i, j] == group.loc[group["f1_mean"].idxmax(), "layer"]
    assert len(ax.texts) == len(rows) * len(cols)
    assert_fits_and_no_overlap(fig, tmp_path, "heatmap", "one")


def test_method_bars_are_pair_accuracies_with_wilson_intervals(results, tmp_path):
    items = results["compare"].items
    fig = figures.plot_method_bars(items)
    ax = fig.axes[0]
    groups = [t.get_text() for t in ax.get_xticklabels()]
    assert groups == ["en", "zh", "de", "ja", "all"]
    bars = {}
    for container in ax.containers:
        if hasattr(container, "patches") and container.get_label() in ("meta", "direct", "neuro"):
            bars[container.get_label()] = [p.get_height() for p in container.patches]
    assert set(bars) == {"meta", "direct", "neuro"}
    for method, heights in bars.items():
        expected = [items.loc[items["language"] == g, f"{method}_correct"].mean() for g in groups[:-1]]
        expected.append(items[f"{method}_correct"].mean())
        np.testing.assert_allclose(heights, expected)
    # the whiskers: scipy's Wilson interval of the "all" meta bar
    k, n = int(items["meta_correct"].sum()), len(items)
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
    segments = np.concatenate([c.get_segments() for c in ax.collections if hasattr(c, "get_segments")])
    verticals = {(round(s[0, 1], 6), round(s[1, 1], 6)) for s in segments if s[0, 0] == s[1, 0]}
    assert (round(ci.low, 6), round(ci.high, 6)) in verticals
    assert any(line.get_ydata()[0] == 0.5 for line in ax.get_lines())  # the chance line
    assert_fits_and_no_overlap(fig, tmp_path, "bars", "two")


def test_method_correlations_show_scipys_statistics(results, tmp_path):
    summary = results["compare"].summary
    fig = figures.plot_method_correlations(summary, results["compare"].correlations)
    assert len(fig.axes) == 3
    cells = summary[((summary["method"] == "direct") & (summary["metric"] == "accuracy"))
                    | ((summary["method"] == "neuro") & (summary["metric"] == "f1"))]
    wide = cells.pivot_table(index=["language", "subset"], columns="method", values="value")
    r = stats.pearsonr(wide["direct"], wide["neuro"]).statistic
    rho = stats.spearmanr(wide["direct"], wide["neuro"]).statistic
    title = fig.axes[2].get_title(loc="left")
    assert f"Pearson r = {r:.2f}" in title and f"Spearman ρ = {rho:.2f}" in title
    assert fig.axes[2].get_xlabel() == "direct accuracy" and fig.axes[2].get_ylabel() == "neuro F1 (peak layer)"
    offsets = np.concatenate([c.get_offsets() for c in fig.axes[2].collections])
    assert len(offsets) == len(wide)
    assert_fits_and_no_overlap(fig, tmp_path, "correlations", "two")


def test_transfer_heatmap_at_the_training_languages_peak(results, tmp_path):
    probe = results["probe"]
    fig = figures.plot_transfer(probe.transfer, probe.peaks)
    ax = fig.axes[0]
    image = ax.get_images()[0].get_array()
    order = [t.get_text() for t in ax.get_yticklabels()]
    assert order == [t.get_text() for t in ax.get_xticklabels()] == ["en", "zh", "de", "ja"]
    transfer, peaks = probe.transfer, probe.peaks
    for i, train in enumerate(order):
        for j, test in enumerate(order):
            values = []
            for subset in ("taxonomic", "random"):
                peak = peaks.loc[(peaks["language"] == train) & (peaks["subset"] == subset), "peak_layer"].iloc[0]
                row = transfer[(transfer["train_language"] == train) & (transfer["test_language"] == test)
                               & (transfer["subset"] == subset) & (transfer["layer"] == peak)]
                assert len(row) == 1
                values.append(row["f1"].iloc[0])
            assert image[i, j] == pytest.approx(np.mean(values))
    assert_fits_and_no_overlap(fig, tmp_path, "transfer", "one")


def test_languages_keep_their_typology_colour():
    styles = figures.language_styles(["tr", "en", "zh", "de", "ja", "ko", "ru", "xx", "vi"])
    # languages XCOMPS Table 3 does not list (English, unknown codes) first and grey, as in the paper's Fig. 2
    assert list(styles) == ["en", "xx", "vi", "zh", "de", "ru", "ja", "ko", "tr"]
    assert styles["en"]["color"] == styles["xx"]["color"] == style.TYPOLOGY_COLORS["other"]
    assert styles["en"]["typology"] == "not in Table 3"
    assert styles["vi"]["color"] == styles["zh"]["color"] == style.TYPOLOGY_COLORS["analytic"]
    assert styles["ja"]["color"] == styles["tr"]["color"] == style.TYPOLOGY_COLORS["agglutinative"]
    assert styles["vi"]["linestyle"] != styles["zh"]["linestyle"]
    assert len({styles[c]["color"] for c in ("en", "zh", "de", "ja")}) == 4


def test_a_missing_column_is_a_one_line_error():
    from babelprobe.errors import BabelprobeError

    with pytest.raises(BabelprobeError, match="the peak table has no column 'peak_layer_low'"):
        figures.plot_peak_typology(pd.DataFrame({"language": ["en"], "peak_layer": [3], "n_layers": [18]}))


# ------------------------------------------------------------------------------ XCOMPS paper figures

@pytest.fixture(scope="module")
def cells(results):
    from babelprobe.analysis import xcomps

    return xcomps.method_cells(results["compare"].summary, results["compare"].layers)


def test_fig2_grid_shows_accuracy_and_max_layer_f1_per_negative_type(results, cells, tmp_path):
    from babelprobe.analysis import xcomps_figures

    fig = xcomps_figures.plot_method_grid(cells)
    heatmaps = [ax for ax in fig.axes if ax.get_images()]
    assert [ax.get_ylabel() for ax in heatmaps] == ["meta\naccuracy", "direct\naccuracy", "neuro F1\n(max over layers)"]
    columns = [t.get_text() for t in heatmaps[-1].get_xticklabels()]
    assert columns == ["en", "zh", "de", "ja"]  # English (not in Table 3) first, then by typology
    items, layers = results["compare"].items, results["compare"].layers
    direct = heatmaps[1].get_images()[0].get_array()
    neuro = heatmaps[2].get_images()[0].get_array()
    for i, subset in enumerate(["taxonomic", "random"]):
        for j, language in enumerate(columns):
            pairs = items[(items["language"] == language) & (items["subset"] == subset)]
            assert direct[i, j] == pytest.approx(round(pairs["direct_correct"].mean(), 2))
            group = layers[(layers["language"] == language) & (layers["subset"] == subset)]
            assert neuro[i, j] == pytest.approx(round(group["f1_mean"].max(), 2))
    assert_fits_and_no_overlap(fig, tmp_path, "fig2", "one")


def test_fig4_bars_are_class_means_of_table3_languages(cells, tmp_path):
    from babelprobe.analysis import xcomps_figures

    fig = xcomps_figures.plot_typology_means(cells)
    ax = fig.axes[0]
    heights = {c.get_label().split(" (")[0]: [p.get_height() for p in c.patches] for c in ax.containers}
    assert list(heights) == ["analytic", "inflectional", "agglutinative"]
    for typology, language in (("analytic", "zh"), ("inflectional", "de"), ("agglutinative", "ja")):
        mine = cells[cells["language"] == language].groupby("method")["value"].mean()
        np.testing.assert_allclose(heights[typology], mine[["meta", "direct", "neuro"]])
    assert "en" in ax.get_xlabel()  # named as left out
    assert_fits_and_no_overlap(fig, tmp_path, "fig4", "one")


def test_fig6_both_readings_side_by_side(results, tmp_path):
    from babelprobe.analysis import xcomps_figures

    probe = results["probe"]
    language, cell = language_peaks(probe, n_boot=50), subset_peaks(probe)
    fig = xcomps_figures.plot_peak_readings(language, cell)
    left, right = fig.axes[0], fig.axes[1]
    assert left.get_title().startswith("(a) per language") and right.get_title().startswith("(b) per language ×")
    kept = cell[cell["language"] != "en"]
    means = kept.groupby(kept["language"].map({"zh": 0, "de": 1, "ja": 2}))["peak_layer"].mean()
    assert [t.get_text() for t in right.get_xticklabels()] == [
        f"{name}\nmean {means[k]:.1f}" for k, name in enumerate(["analytic", "inflectional", "agglutinative"])]
    assert_fits_and_no_overlap(fig, tmp_path, "fig6", "two")


def test_fig10_12_panels_show_scipys_correlations_per_negative_type(cells, tmp_path):
    from babelprobe.analysis import xcomps_figures

    fig = xcomps_figures.plot_correlations_by_subset(cells)
    assert len(fig.axes) == 2 * 3  # two negative types × three method pairs
    random = cells[cells["subset"] == "random"].pivot_table(index="language", columns="method", values="value")
    title = fig.axes[3].get_title(loc="left")  # second row (random), first pair (meta, direct)
    assert title.startswith("random: ")
    if random["meta"].std() > 0 and random["direct"].std() > 0:
        r = stats.pearsonr(random["meta"], random["direct"]).statistic
        assert f"Pearson r = {r:.2f}" in title
    else:
        assert "n/a" in title
    assert_fits_and_no_overlap(fig, tmp_path, "fig10", "two")
