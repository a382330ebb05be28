"""compare: meta + direct + neuro on the same pairs, the per-pair join, summaries, agreement, reuse,
refusal of another model's results, and differencing two models."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from babelprobe.analysis import methods
from babelprobe.cli import main
from babelprobe.comparison import CompareResult, compare, diff
from babelprobe.errors import BabelprobeError
from babelprobe.items import load_items
from tests.tiny import tiny_lm

CONCEPTS = [("dog", "cat", "can bark"), ("eagle", "chair", "can fly"), ("fish", "tree", "can swim"),
            ("cat", "spoon", "can climb trees"), ("horse", "cup", "has four legs"), ("bird", "stone", "has wings")]


def items_frame():
    rows = []
    for language in ("en", "de"):
        for subset in ("taxonomic", "random"):
            for i, (good, bad, prop) in enumerate(CONCEPTS):
                pair = f"p{i}-{subset}-{language}"
                for label, concept in ((1, good), (0, bad)):
                    rows.append({"item_id": f"{pair}-{label}", "pair_id": pair, "language": language,
                                 "subset": subset, "label": label, "text": f"A {concept} {prop}.",
                                 "property": prop, "acceptable_concept": good, "unacceptable_concept": bad})
    return load_items(pd.DataFrame(rows))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp")
    lm = tiny_lm("llama", seed=0)
    return lm, out, compare(lm, items_frame(), out, folds=3, progress=False)


def test_one_row_per_pair_with_all_three_methods(first_run):
    lm, out, result = first_run
    items = items_frame()
    assert len(result.items) == items["pair_id"].nunique()
    for method in ("meta", "direct", "neuro"):
        assert {f"{method}_score_good", f"{method}_score_bad", f"{method}_correct"} <= set(result.items.columns)
        rows = result.per_method[method].set_index("pair_id")
        joined = result.items.set_index("pair_id")
        np.testing.assert_array_equal(joined[f"{method}_correct"], rows.loc[joined.index, "correct"])
    for name in ("items.csv", "summary.csv", "layers.csv", "correlations.csv", "agreement.csv", "direct.csv",
                 "meta.csv", "neuro.csv", "compare.json"):
        assert (out / name).exists()


def test_summary_has_every_cell_and_method_with_intervals(first_run):
    _, _, result = first_run
    summary = result.summary
    acc = summary[summary["metric"] == "accuracy"]
    assert acc.groupby(["language", "subset"])["method"].nunique().eq(3).all()
    direct = result.per_method["direct"]
    cell = direct[(direct["language"] == "de") & (direct["subset"] == "random")]
    row = acc[(acc["method"] == "direct") & (acc["language"] == "de") & (acc["subset"] == "random")].iloc[0]
    assert row["value"] == pytest.approx(cell["correct"].mean()) and row["n"] == len(cell)
    assert (acc["ci_low"] <= acc["value"]).all() and (acc["value"] <= acc["ci_high"]).all()
    f1 = summary[(summary["method"] == "neuro") & (summary["metric"] == "f1")]
    peaks = result.layers.loc[result.layers.groupby(["language", "subset"])["f1_mean"].idxmax()]
    np.testing.assert_allclose(np.sort(f1["value"]), np.sort(peaks["f1_mean"]))


def test_second_run_reuses_every_stage(first_run, monkeypatch):
    import babelprobe.benchmarks.scoring as scoring
    import babelprobe.extract as extract_pkg
    import babelprobe.probes as probes

    lm, out, result = first_run

    def fail(*args, **kwargs):
        raise AssertionError("a finished stage was recomputed")

    for module, name in ((scoring, "score_pairs"), (extract_pkg, "extract"), (probes, "probe")):
        monkeypatch.setattr(module, name, fail)
    again = compare(lm, items_frame(), out, folds=3, progress=False)
    pd.testing.assert_frame_equal(again.items, result.items)


def test_other_meta_wording_reruns_meta_only(first_run, tmp_path, monkeypatch):
    import shutil

    import babelprobe.benchmarks.direct as direct
    import babelprobe.extract as extract_pkg
    import babelprobe.probes as probes

    lm, out, result = first_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("acts"))

    def fail(*args, **kwargs):
        raise AssertionError("a finished stage was recomputed")

    for module, name in ((direct, "score_direct"), (extract_pkg, "extract"), (probes, "probe")):
        monkeypatch.setattr(module, name, fail)
    again = compare(lm, items_frame(), copy, acts=out / "acts", folds=3, prompts="xcomps-babelprobe", progress=False)
    before, after = (r.per_method["meta"].query("language == 'de'")["prompt_gf"].iloc[0] for r in (result, again))
    assert before.startswith("Welches Konzept hat am wahrscheinlichsten")  # XCOMPS Figure 8, the default
    assert after.startswith("Welches Konzept hat am ehesten")  # babelprobe's own wording
    assert (again.per_method["meta"]["prompt_set"] == "xcomps-babelprobe").all()


def test_the_stages_run_with_the_heap_alive_before_them_frozen(first_run, monkeypatch):
    """compare's stages and its tables run inside `pipeline.frozen_heap` (the collector's full passes leave out the
    model, tokenizer and items), and the heap is thawed when it returns."""
    import gc

    lm, out, _ = first_run
    frozen, write = [], CompareResult.write
    monkeypatch.setattr(CompareResult, "write",
                        lambda self, path: frozen.append(gc.get_freeze_count()) or write(self, path))
    compare(lm, items_frame(), out, folds=3, progress=False)
    assert len(frozen) == 1 and frozen[0] > 0
    assert gc.get_freeze_count() == 0


def test_another_model_is_refused_without_overwrite(first_run):
    _, out, _ = first_run
    with pytest.raises(BabelprobeError, match="holds a comparison of another model or item set"):
        compare(tiny_lm("llama", seed=3), items_frame(), out, folds=3, progress=False)


def test_a_store_of_another_model_is_refused(first_run, tmp_path):
    _, out, _ = first_run
    with pytest.raises(BabelprobeError, match="was made with another model"):
        compare(tiny_lm("llama", seed=4), items_frame(), tmp_path / "new", acts=out / "acts", folds=3,
                progress=False)


def test_difference_of_two_models_with_paired_intervals(first_run, tmp_path):
    _, out, base = first_run
    other_dir = tmp_path / "other"
    other = compare(tiny_lm("llama", seed=1), items_frame(), other_dir, folds=3, progress=False)
    difference = diff(out, other_dir)
    row = difference[(difference["method"] == "direct") & (difference["metric"] == "accuracy")
                     & (difference["language"] == "en") & (difference["subset"] == "taxonomic")].iloc[0]
    cell = lambda r: r.per_method["direct"].query("language == 'en' and subset == 'taxonomic'")  # noqa: E731
    assert row["difference"] == pytest.approx(cell(other)["correct"].mean() - cell(base)["correct"].mean())
    assert row["ci_low"] <= row["difference"] <= row["ci_high"]
    assert main(["diff", str(out), str(other_dir), "--out", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / "difference.csv").exists()
    assert main(["compare", "--diff", str(out), str(other_dir), "--out", str(tmp_path / "old")]) == 0  # old spelling


def test_correlations_match_scipy_and_agreement_counts_match_a_crosstab():
    rng = np.random.default_rng(0)
    cells = [(lang, sub) for lang in "abcdefgh" for sub in ("x", "y")]
    rows = []
    for method in ("meta", "direct", "neuro"):
        for lang, sub in cells:
            rows.append({"language": lang, "subset": sub, "method": method,
                         "metric": "f1" if method == "neuro" else "accuracy", "value": rng.random()})
    summary = pd.DataFrame(rows)
    corr = methods.correlations(summary).set_index(["method_a", "method_b"]).loc[("meta", "neuro")]
    x = summary.query("method == 'meta'")["value"].to_numpy()
    y = summary.query("method == 'neuro'")["value"].to_numpy()
    assert corr["pearson_r"] == pytest.approx(stats.pearsonr(x, y).statistic)
    assert corr["spearman_rho"] == pytest.approx(stats.spearmanr(x, y).statistic)
    assert corr["pearson_low"] < corr["pearson_r"] < corr["pearson_high"]

    joined = pd.DataFrame({"language": ["a"] * 6, "meta_correct": [1, 1, 0, 0, 1, 0],
                           "direct_correct": [1, 0, 1, 0, 1, 0]}).astype({"meta_correct": bool,
                                                                          "direct_correct": bool})
    row = methods.agreement(joined).query("language == 'all'").iloc[0]
    table = pd.crosstab(joined["meta_correct"], joined["direct_correct"])
    assert (row["both"], row["only_a"], row["only_b"], row["neither"]) == (
        table.loc[True, True], table.loc[True, False], table.loc[False, True], table.loc[False, False])
    assert row["agreement"] == pytest.approx(4 / 6)


def test_reading_an_unfinished_directory_is_a_clear_error(tmp_path):
    with pytest.raises(BabelprobeError, match="not a finished compare directory"):
        CompareResult.read(tmp_path)


@pytest.mark.slow
def test_compare_on_the_default_model_covers_languages_subsets_and_methods(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--model", "default", "--items", "xcomps-sample", "--languages", "en,zh",
                 "--limit", "5", "--out", str(out), "--no-progress"]) == 0
    summary = pd.read_csv(out / "summary.csv")
    acc = summary[summary["metric"] == "accuracy"]
    assert acc.groupby(["language", "subset"])["method"].nunique().eq(3).all()
    assert len(acc.groupby(["language", "subset"])) == 8
    assert "correlation across" in capsys.readouterr().out
