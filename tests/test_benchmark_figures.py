"""Figures of benchmark run directories: `babelprobe report --results DIR` on a `bench` directory
(StingrayBench with App. C's per-task figures) and `babelprobe bench figures RUN...` (several models in one
StingrayBench figure; ECLeKTiC Fig. 4 from several runs). Every figure's PNG is checked to exist and be
non-empty; the per-task overall point is checked against the per-pair accuracies it averages."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from babelprobe.analysis import benchmarks as figures
from babelprobe.benchmarks import stingray
from babelprobe.cli import main


@pytest.fixture(scope="module")
def stingray_runs(tmp_path_factory, tiny_long):
    """Two finished runs (another reduction stands in for another model), without their own figures."""
    import babelprobe as bp
    from babelprobe.benchmarks.base import benchmark_settings

    root = tmp_path_factory.mktemp("sr")
    runs = []
    for name, values in (("a", {}), ("b", {"reduction": "sum"})):
        bp.run_benchmark("stingray", tiny_long, "stingray-sample", root / name, benchmark_settings("stingray", **values),
                         limit=2, progress=False, figures=False)
        runs.append(root / name)
    return runs


def _pngs(paths) -> list:
    return [p for p in paths if p.suffix == ".png"]


def test_report_of_a_stingray_run_draws_app_c(stingray_runs, tmp_path):
    out = tmp_path / "report"
    assert main(["report", "--results", str(stingray_runs[0]), "--out", str(out)]) == 0
    for name in ("stingray", "stingray-overall", "stingray-pairs", "stingray-usage-overall", "stingray-usage-pairs",
                 "stingray-semantic-overall", "stingray-semantic-pairs"):
        assert (out / f"{name}.png").stat().st_size > 0, name
    assert "stingray-usage-pairs" in (out / "report.md").read_text()


def test_per_task_overall_point_is_the_mean_of_the_pairs(stingray_runs):
    table = stingray.wide(pd.read_csv(stingray_runs[0] / "summary.csv"))
    point = figures._overall_point(table, "false_friend", "usage")[0]
    cells = table[(table["task"] == "usage") & (table["subset"] == "false_friend")]
    assert point["accuracy_l1"] == pytest.approx(cells["accuracy_l1"].mean())
    assert point["accuracy_l2"] == pytest.approx(cells["accuracy_l2"].mean())


def test_bench_figures_puts_several_models_in_one_stingray_figure(stingray_runs, tmp_path, capsys):
    out = tmp_path / "both"
    assert main(["bench", "figures", *map(str, stingray_runs), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in ("stingray-overall", "stingray-pairs", "stingray-usage-overall", "stingray-semantic-pairs"):
        assert (out / f"{name}.png").stat().st_size > 0 and name in printed


def _eclektic_run(path, model: str, success: float, transfer: float):
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"benchmark": "eclektic", "model": model}))
    (path / "items.csv").write_text("q_id\n")
    rows = [{"source_language": "all", "target_language": "all", "average": "pooled", "metric": metric,
             "value": value, "ci_low": value - 0.05, "ci_high": value + 0.05, "n": 100, "interval": "bootstrap"}
            for metric, value in (("overall_success", success), ("transfer_score", transfer))]
    pd.DataFrame(rows).to_csv(path / "summary.csv", index=False)
    return path


def test_eclektic_fig4_from_several_runs(tmp_path, capsys, monkeypatch):
    runs = [_eclektic_run(tmp_path / f"r{k}", f"qwen-{size}", 0.1 * k, 0.2 * k)
            for k, size in enumerate(("0.5b", "7b", "14b"), start=1)]
    out = tmp_path / "fig4"
    shown = {}
    original = figures.save
    monkeypatch.setattr(figures, "save", lambda fig, path: shown.update(ax=fig.axes[0]) or original(fig, path))
    assert main(["bench", "figures", *map(str, runs), "--out", str(out)]) == 0
    assert (out / "eclektic_fig4.png").stat().st_size > 0
    # one point per run, in the order given, at each run's pooled overall success and transfer score
    ax = shown["ax"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["qwen-0.5b", "qwen-7b", "qwen-14b"]
    drawn = {bars.get_label(): list(bars.lines[0].get_ydata()) for bars in ax.containers}  # errorbar: data line first
    assert drawn["overall success"] == pytest.approx([0.1, 0.2, 0.3])
    assert drawn["transfer score"] == pytest.approx([0.2, 0.4, 0.6])
    assert main(["bench", "figures", str(runs[0]), str(tmp_path), "--out", str(out)]) == 2  # not a run directory
    assert "not a finished bench directory" in capsys.readouterr().err

