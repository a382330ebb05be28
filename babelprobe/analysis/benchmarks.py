"""The seed benchmarks at the analysis layer: `run_benchmark`, the one runner of every benchmark (its
tables, run.json and figure), and the figures, in the house style (`analysis.style`): the stingray plot
(StingrayBench), the source × target heatmaps (ECLeKTiC), consistency by condition (self-consistency),
English vs target accuracy and the Relative Affinity heatmap (Cross-Lingual Pitfalls); for the benchmark
bridges (MultiBLiMP, Belebele, XNLI, PAWS-X) `bridge_accuracy` and `bridge_norm_gap`.

The runner lives here, above `benchmarks/`, because it draws (docs/design.md "Layers"); the contract it
runs is `babelprobe.benchmarks.base`. `plot_benchmark(name, summary, path)` draws a benchmark's figure
from its `summarize` table; every function writes `path.pdf` and a 300-dpi `path.png` and returns both
paths.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.analysis.style import DIVERGING, PALETTE, SEQUENTIAL, figure, note, save
from babelprobe.benchmarks import bridges, eclektic, pitfalls, stingray
from babelprobe.benchmarks.base import BENCHMARKS, Models, as_models, benchmark, benchmark_settings
from babelprobe.benchmarks.bridges import lmeval
from babelprobe.benchmarks.pitfalls.settings import AffinitySettings
from babelprobe.errors import BabelprobeError
from babelprobe.inputs import check_input
from babelprobe.items import check_limit
from babelprobe.runs import LAYOUTS, check_kind, open_run
from babelprobe.runtime import Runtime, runner
from babelprobe.settings import settings_record
from babelprobe.tables import write_table

ROWS, SUMMARY = "items.csv", "summary.csv"


@dataclass
class BenchmarkRun:
    """A finished benchmark run: its rows and summary (as written), the run directory, its identity
    (benchmark, fingerprint, settings; and the model's name) and the figure files drawn."""

    rows: pd.DataFrame
    summary: pd.DataFrame
    out: Path
    identity: dict
    figures: list[Path] = field(default_factory=list)


def _older_benchmark(args: tuple, keywords: dict) -> bool:
    """The older form `run_benchmark(name, model, source, out, ...)`: a benchmark's name first."""
    return isinstance(args[0], str) and args[0] in BENCHMARKS


# the older forms' keyword names (`models`: the runtime or a model; `source`: the items)
OLDER_NAMES = {"models": "model", "source": "items"}


@runner(old=("name", "model", "items", "out", "settings", "languages", "limit", "overwrite", "progress", "figures"),
        old_when=_older_benchmark, renamed=OLDER_NAMES)
def run_benchmark(items: str | Path, out: str | Path, settings=None, runtime: Runtime | Models | None = None, *,
                  name: str | None = None, languages: list[str] | None = None,
                  limit: int | None = None) -> BenchmarkRun:
    """Load `items` (the benchmark's source: a bundled sample, a file or directory in its layout), run
    benchmark `name` on it and write `items.csv`, `summary.csv`, `run.json` and, with `runtime.figures`, its
    figure (`plot_benchmark`: `NAME.pdf`, `NAME.png`) into `out`. The data and the settings are checked
    before any model loads or anything is written (the contract's `prepare` and `check`). A rerun with the
    same model and settings reuses what the run keeps (it resumes); another model or other settings there
    are refused unless `runtime.overwrite`. `settings`: the benchmark's `Settings` (None: its defaults),
    whose class names the benchmark where only one has it (the bridges share theirs: give `name`).
    `runtime`: a `Runtime`, or `Models` (a runtime with generators' options), or its options as keywords
    (docs/design.md "Runtime, settings, runners"); the older `run_benchmark(name, model, source, out,
    settings, languages, limit, overwrite, progress, figures)` too."""
    name = name or benchmark_named_by(settings)
    module = benchmark(name)
    settings = settings if settings is not None else benchmark_settings(module)
    check_input("items", items, "items")
    check_limit(limit)
    check_kind(out, "bench", f"bench {name}")
    models = as_models(runtime)
    runtime, source = models.runtime, items
    data = module.load(source, languages=languages, limit=limit)
    if hasattr(module, "prepare"):
        data = module.prepare(data, settings)
    if hasattr(module, "check"):
        module.check(data, settings)  # bad data or settings: fail before a model is loaded
    who = models.identity(module.answerer(settings))
    identity = {"benchmark": name, "fingerprint": who["fingerprint"], **settings_record(settings)}
    run = open_run(out, identity, record={"model": who["model"], "data": str(source), "languages": languages,
                                          "limit": limit}, overwrite=runtime.overwrite, outputs=(ROWS, SUMMARY),
                   what=f"a {name} run")
    rows = module.run(data, models, settings, out=run.path, progress=runtime.progress)
    for column, value in (("model", who["model"]), ("fingerprint", who["fingerprint"])):
        if column not in rows.columns:
            rows[column] = value
    summary = module.summarize(rows)
    write_table(rows, run.path / ROWS)
    write_table(summary, run.path / SUMMARY)
    drawn = plot_benchmark(name, summary, run.path / name, model=who["model"], source=source) \
        if runtime.figures else []
    return BenchmarkRun(rows=rows, summary=summary, out=run.path, identity={**identity, "model": who["model"]},
                        figures=drawn)


def benchmark_named_by(settings) -> str:
    """The one benchmark whose `Settings` class `settings` is; an error where none or several are."""
    if settings is None:
        raise BabelprobeError(f"which benchmark? give name= ({', '.join(BENCHMARKS)}) or its settings")
    named = [name for name in BENCHMARKS if type(settings) is benchmark(name).Settings]
    if len(named) != 1:
        raise BabelprobeError(f"{type(settings).__name__} is the settings of "
                              f"{', '.join(named) if named else 'no benchmark'}; give name= to say which to run")
    return named[0]


def plot_benchmark(name: str, summary: pd.DataFrame, path: str | Path, model: str = "",
                   source: str | Path | None = None) -> list[Path]:
    """The figure of benchmark `name` for a run of `model` on data `source`."""
    if name == "stingray":
        return plot_stingray(summary, path, title=f"StingrayBench — {model}", model=model or "model")
    if name == "eclektic":
        return plot_eclektic(summary, path, title=f"ECLeKTic: {model}")
    if name == "consistency":
        return plot_consistency(summary, path, title=f"self-consistency: {model}")
    if name in bridges.BRIDGES:
        return plot_bridge(summary, path, title=f"{name}: {model}")
    if name == "lm-eval":  # one bar group per task (its language beneath)
        return plot_bridge(summary, path, title=f"{name}: {model}", table=lmeval.task_table(summary))
    if name == "pitfalls":
        names = list(dict.fromkeys(pitfalls.wide(summary)["target_name"]))
        paper = {n: pitfalls.load_paper_results(source, n) for n in names} if source is not None else {}
        return plot_pitfalls(summary, path, model, paper, order=names)
    raise ValueError(f"no figure for benchmark {name!r}")


# ------------------------------------------------------------------------------------------ StingrayBench

STINGRAY_SUBSETS = {"true_cognate": "true cognates", "false_friend": "false friends"}


def plot_stingray(summary: pd.DataFrame, path: str | Path, title: str | None = None, model: str = "model") -> list[Path]:
    """A StingrayBench run's figures: the paper's aggregates, `path-overall` (Fig. 4) and `path-pairs`
    (Figs. 5 and 6), then `path` itself, the stingray plot of each task. PDF and PNG of each; the
    stingray plot's PNG comes last."""
    path = Path(path)
    written = plot_stingray_overall({model: summary}, path.with_name(path.name + "-overall"), title=title)
    written += plot_stingray_pairs({model: summary}, path.with_name(path.name + "-pairs"), title=title)
    return written + plot_stingray_tasks(summary, path, title=title)


def plot_stingray_tasks(summary: pd.DataFrame, path: str | Path, title: str | None = None) -> list[Path]:
    """The stingray plot: one panel per task with each pair × subset at (acc L1, acc L2) over the
    cognate-bias field and comprehension arcs (§3.3, Fig. 3; App. C Figs. 9–10). Writes path.pdf and path.png."""
    table = stingray.wide(summary)
    tasks = [t for t in stingray.TASKS if t in set(table["task"])]
    fig, axes = figure("two", height=3.6, ncols=len(tasks), squeeze=False)
    pairs = sorted(set(table["pair"]) - {"all"})
    colours = dict(zip(pairs, PALETTE, strict=False))
    markers = {"false_friend": "o", "true_cognate": "s"}
    field = None
    for ax, task in zip(axes[0], tasks, strict=True):
        field = _stingray_background(ax)
        points = table[(table["task"] == task) & table["accuracy_l1"].notna() & table["accuracy_l2"].notna()]
        for row in points.to_dict("records"):
            _stingray_point(ax, row, markers[row["subset"]], colours[row["pair"]])
        ax.set_title({"semantic": "semantic appropriateness", "usage": "usage correction"}[task])
        ax.set_xlabel("accuracy in L1")
        ax.set_ylabel("accuracy in L2")
    handles = [_legend_handle(marker="o", color=colours[p], label=p.replace("_", "–")) for p in pairs]
    handles += [_legend_handle(marker=m, color="white", label=s.replace("_", " ")) for s, m in markers.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
    _bias_colorbar(fig, field, axes[0].tolist())
    _stingray_title(fig, title, summary)
    return save(fig, path)


def plot_stingray_overall(summaries: dict[str, pd.DataFrame], path: str | Path, title: str | None = None,
                          task: str = "all") -> list[Path]:
    """Fig. 4: one point per model at its (acc L1, acc L2) averaged over language pairs and tasks, true
    cognates left, false friends right (`summaries`: model name -> its `summarize` table). With `task`
    'usage' or 'semantic', App. C Figs. 7 and 8: the point averaged over the pairs of that task only (the
    mean of the pairs' accuracies, as the summary's overall point is; drawn without an interval)."""
    fig, axes = figure("two", height=3.6, ncols=2, squeeze=False)
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    field = None
    for ax, (subset, label) in zip(axes[0], STINGRAY_SUBSETS.items(), strict=True):
        field = _stingray_background(ax)
        for k, summary in enumerate(summaries.values()):
            rows = _overall_point(stingray.wide(summary), subset, task)
            if rows and pd.notna(rows[0]["accuracy_l1"]) and pd.notna(rows[0]["accuracy_l2"]):
                _stingray_point(ax, rows[0], markers[k % len(markers)], PALETTE[k % len(PALETTE)])
        ax.set_title(f"{label} (mean over {'pairs and tasks' if task == 'all' else 'pairs'})")  # the task: in the title
        ax.set_xlabel("accuracy in L1")
        ax.set_ylabel("accuracy in L2")
    handles = [_legend_handle(marker=markers[k % len(markers)], color=PALETTE[k % len(PALETTE)], label=model)
               for k, model in enumerate(summaries)]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), frameon=False)
    _bias_colorbar(fig, field, axes[0].tolist())
    _stingray_title(fig, title, next(iter(summaries.values()), None))
    return save(fig, path)


def plot_stingray_pairs(summaries: dict[str, pd.DataFrame], path: str | Path, title: str | None = None,
                        task: str = "mean") -> list[Path]:
    """Figs. 5 and 6 per language pair: cognate comprehension averaged over the tasks (top) and the
    unsigned cognate bias, |mean bias over the tasks| (bottom); true cognates left, false friends
    right; one bar per model with its bootstrap interval. With `task` 'usage' or 'semantic', App. C
    Figs. 11 and 13 (usage correction) or 12 and 14 (semantic appropriateness): the same for one task."""
    tables = {model: _with_abs_bias(stingray.wide(summary)) for model, summary in summaries.items()}
    pairs = sorted({p for t in tables.values() for p in t["pair"]} - {"all"})
    fig, axes = figure("two", height=4.4, nrows=2, ncols=2, sharex=True, sharey="row")
    width = 0.8 / max(1, len(tables))
    for row, (metric, label) in enumerate((("comprehension", "comprehension"), ("abs_bias", "|bias|"))):
        for col, (subset, name) in enumerate(STINGRAY_SUBSETS.items()):
            ax = axes[row, col]
            for k, (model, table) in enumerate(tables.items()):
                cells = table[(table["task"] == task) & (table["subset"] == subset)].set_index("pair").reindex(pairs)
                values = cells[metric].to_numpy(float)
                errors = [np.clip(values - cells[f"{metric}_low"].to_numpy(float), 0, None),
                          np.clip(cells[f"{metric}_high"].to_numpy(float) - values, 0, None)]
                x = np.arange(len(pairs)) + (k - (len(tables) - 1) / 2) * width
                ax.bar(x, values, width * 0.9, yerr=errors, color=PALETTE[k % len(PALETTE)], label=model,
                       error_kw={"elinewidth": 0.6, "capsize": 1.5})
                for position in x[np.isnan(values)]:  # e.g. no bias at (0, 0): say so rather than draw nothing
                    ax.text(position, 0.02, "n/a", ha="center", va="bottom", fontsize=6, color="0.3")
            ax.set_ylim(0, 1.05)
            ax.set_xticks(range(len(pairs)), [p.replace("_", "–") for p in pairs])
            ax.grid(axis="x", visible=False)
            ax.set_title(f"{name}: cognate {label}", fontsize=8)
            if col == 0:
                ax.set_ylabel(f"{label} (mean over tasks)" if task == "mean" else label)  # the task: in the title
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4), frameon=False)
    _stingray_title(fig, title, next(iter(summaries.values()), None))
    return save(fig, path)


STINGRAY_TASKS = {"usage": "usage correction", "semantic": "semantic appropriateness"}
# App. C of the paper: the figure of each task (the overall point, comprehension and |bias| per pair)
STINGRAY_APPENDIX = {("usage", "overall"): "Fig. 7", ("semantic", "overall"): "Fig. 8",
                     ("usage", "pairs"): "Figs. 11, 13", ("semantic", "pairs"): "Figs. 12, 14"}


def _overall_point(table: pd.DataFrame, subset: str, task: str) -> list[dict]:
    """The row of the overall point of `subset`: the summary's (task 'all'), or for one task the mean of its
    pairs' accuracies (no interval)."""
    if task == "all":
        return table[(table["pair"] == "all") & (table["subset"] == subset)].to_dict("records")
    cells = table[(table["task"] == task) & (table["subset"] == subset) & (table["pair"] != "all")]
    if cells.empty:
        return []
    row = {"accuracy_l1": cells["accuracy_l1"].mean(), "accuracy_l2": cells["accuracy_l2"].mean()}
    for metric in ("accuracy_l1", "accuracy_l2"):
        row[f"{metric}_low"] = row[f"{metric}_high"] = row[metric]
    return [row]


def _with_abs_bias(table: pd.DataFrame) -> pd.DataFrame:
    """`abs_bias` (and its interval) for the per-task cells, which carry only the signed bias: |bias|, with
    the interval of |b| over the signed interval (0 at its low end when it spans 0)."""
    table = table.copy()
    per_task = table["task"].isin(list(STINGRAY_TASKS)) & table["bias"].notna()
    low, high = table["bias_low"].abs(), table["bias_high"].abs()
    spans = (table["bias_low"] <= 0) & (table["bias_high"] >= 0)
    if "abs_bias" not in table.columns:
        table["abs_bias"] = table["abs_bias_low"] = table["abs_bias_high"] = np.nan
    table.loc[per_task, "abs_bias"] = table.loc[per_task, "bias"].abs()
    table.loc[per_task, "abs_bias_low"] = np.where(spans, 0.0, np.minimum(low, high))[per_task.to_numpy()]
    table.loc[per_task, "abs_bias_high"] = np.maximum(low, high)[per_task]
    return table


def plot_stingray_appendix(summaries: dict[str, pd.DataFrame], out: str | Path, title: str | None = None) -> dict:
    """App. C per task: `stingray-<task>-overall` (Figs. 7, 8) and `stingray-<task>-pairs` (comprehension
    and |bias| per pair: Figs. 11 and 13, 12 and 14), for one model or several; name -> files."""
    out, drawn = Path(out), {}
    tasks = {t for s in summaries.values() for t in s["task"]}
    for task, label in STINGRAY_TASKS.items():
        if task not in tasks:
            continue
        for kind, plot in (("overall", plot_stingray_overall), ("pairs", plot_stingray_pairs)):
            heading = f"{title}\n" if title else ""  # two lines: a long model name would run off the figure
            heading += f"{label} (App. C {STINGRAY_APPENDIX[(task, kind)]})"
            drawn[f"stingray-{task}-{kind}"] = plot(summaries, out / f"stingray-{task}-{kind}", title=heading, task=task)
    return drawn


def _stingray_point(ax, row: dict, marker: str, colour: str) -> None:
    ax.errorbar(row["accuracy_l1"], row["accuracy_l2"], fmt=marker, ms=6, color=colour, mec="black", mew=0.6,
                zorder=4, xerr=_error_bar(row, "accuracy_l1"), yerr=_error_bar(row, "accuracy_l2"),
                elinewidth=0.6, capsize=0, alpha=0.95)


def _bias_colorbar(fig, field, axes) -> None:
    bar = fig.colorbar(field, ax=axes, shrink=0.85, ticks=[-1, -0.5, 0, 0.5, 1])
    bar.set_label("cognate bias (− towards L1, + towards L2)")


def _stingray_title(fig, title: str | None, summary: pd.DataFrame | None) -> None:
    """The title, naming the protocol, how the answers were read and the prompt format of the run."""
    run = [] if summary is None else [str(summary[c].iloc[0]) for c in ("protocol", "method", "prompt_format")
                                      if c in summary.columns and len(summary)]
    text = f"{title} ({', '.join(run)})" if title and run else title
    if text:
        fig.suptitle(text)


def _error_bar(row: dict, metric: str) -> list[list[float]]:
    """[[below], [above]] a value: its interval (clipped at rounding noise)."""
    value = row[metric]
    return [[max(0.0, value - row[f"{metric}_low"])], [max(0.0, row[f"{metric}_high"] - value)]]


def _stingray_background(ax):
    """Bias as a colour field (constant along rays from the origin), the 45° line and bias rays, and
    comprehension arcs (quarter circles of radius c·√2)."""
    grid = np.linspace(0, 1, 201)
    x, y = np.meshgrid(grid, grid)
    field = ax.contourf(x, y, stingray.cognate_bias(x, y), levels=np.linspace(-1, 1, 17), cmap=DIVERGING, alpha=0.45,
                        zorder=0)
    angles = np.linspace(0, np.pi / 2, 100)
    for c in (0.25, 0.5, 0.75):  # comprehension 1 is only the corner (1, 1)
        r = c * np.sqrt(2)
        keep = (r * np.cos(angles) <= 1.0001) & (r * np.sin(angles) <= 1.0001)
        ax.plot(r * np.cos(angles[keep]), r * np.sin(angles[keep]), color="0.35", lw=0.6, ls="--", zorder=1)
        # label near the L1 axis, away from the diagonal where balanced models sit
        label_angle = max(np.radians(10), np.arccos(min(1.0, 1 / r)) + np.radians(5))
        ax.text(r * np.cos(label_angle), r * np.sin(label_angle), f"{c:.2f}", fontsize=6, color="0.25",
                ha="center", va="center", zorder=2, bbox={"fc": "white", "ec": "none", "pad": 0.5, "alpha": 0.7})
    for b in (-0.5, 0.5):
        theta = np.pi / 4 * (1 + b)
        ax.plot([0, min(1, 1 / np.tan(theta))], [0, min(1, np.tan(theta))], color="0.5", lw=0.5, zorder=1)
    ax.plot([0, 1], [0, 1], color="0.2", lw=0.8, zorder=1)
    ax.set_xlim(-0.04, 1.04)
    ax.set_ylim(-0.04, 1.04)
    ax.set_aspect("equal")
    ax.grid(False)
    return field


def _legend_handle(marker: str, color: str, label: str):
    from matplotlib.lines import Line2D

    return Line2D([], [], marker=marker, ls="", color=color, mec="black", mew=0.6, ms=6, label=label)


# ------------------------------------------------------------------------------------------------ ECLeKTiC

def plot_eclektic(summary: pd.DataFrame, path: str | Path, title: str = "") -> list[Path]:
    """Heatmaps (source language down, target across) of overall success and transfer score; PDF + PNG."""
    from matplotlib.patches import Rectangle

    success, transfer = eclektic.transfer_matrices(summary)
    n = len(success)
    fig, axes = figure("two", height=max(2.6, 0.32 * n + 1.4), ncols=2)
    for ax, matrix, label in ((axes[0], success, "overall success (diagonal: source accuracy)"),
                              (axes[1], transfer, "transfer score")):
        image = ax.imshow(matrix.to_numpy(float), cmap=SEQUENTIAL, vmin=0, vmax=1)
        ax.set_xticks(range(n), matrix.columns)
        ax.set_yticks(range(n), matrix.index)
        ax.set_xlabel("target language")
        ax.set_ylabel("source language")
        ax.set_title(label)
        ax.grid(False)
        if ax is axes[0]:  # the diagonal is a different quantity: outline it
            for i in range(n):
                ax.add_patch(Rectangle((i - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=0.8,
                                       clip_on=False))
        for i in range(n):
            for j in range(n):
                value = matrix.iat[i, j]
                text = "–" if pd.isna(value) else f"{value:.2f}"
                colour = "black" if pd.isna(value) or value > 0.6 else "white"
                ax.text(j, i, text, ha="center", va="center", fontsize=6 if n <= 8 else 5, color=colour)
    fig.colorbar(image, ax=list(axes), shrink=0.8, label="share of pairs")
    protocol = summary["protocol"].iloc[0] if "protocol" in summary.columns and len(summary) else ""
    if title or protocol:
        fig.suptitle(f"{title} ({protocol} protocol)" if protocol else title)
    return save(fig, path)


# ------------------------------------------------------------------------------------------ self-consistency

def plot_consistency(summary: pd.DataFrame, path: str | Path, title: str = "") -> list[Path]:
    """(a) consistency with the orig answers per target language and condition, the same-language
    baselines (P: babelprobe's paraphrase; rerun: Table 5's second run) as dashed lines; (b) pooled over
    languages, split by whether orig was correct. The title names the protocol. PDF + PNG."""
    from matplotlib.patches import Patch

    cons = summary[summary["metric"] == "consistency"]
    colours = {"T": PALETTE[0], "I": PALETTE[1], "X": PALETTE[2], "R": PALETTE[4], "P": PALETTE[7],
               "rerun": PALETTE[5]}
    baselines = {"P": "P (paraphrase, babelprobe)", "rerun": "rerun (Table 5)"}
    fig, (left, right) = figure("two", height=2.8, ncols=2, width_ratios=[3, 2])
    per_lang = cons[(cons["group"] == "all") & ~cons["language"].isin(["all"]) & ~cons["condition"].isin(baselines)]
    languages = sorted(per_lang["language"].unique())
    conditions = [c for c in ("T", "I", "X", "R") if c in set(per_lang["condition"])]
    width = 0.8 / max(1, len(conditions))
    for k, condition in enumerate(conditions):
        part = per_lang[per_lang["condition"] == condition].set_index("language").reindex(languages)
        x = np.arange(len(languages)) + (k - (len(conditions) - 1) / 2) * width
        left.bar(x, part["value"], width, color=colours[condition], label=condition, yerr=_error_bars(part),
                 capsize=1.5, error_kw={"linewidth": 0.6})
    for condition, label in baselines.items():
        baseline = cons[(cons["condition"] == condition) & (cons["group"] == "all")]
        if not baseline.empty:
            left.axhline(baseline["value"].iloc[0], color=colours[condition], linestyle="--", linewidth=0.9,
                         label=label)
    left.set_xticks(range(len(languages)), languages)
    left.set_ylim(0, 1.32)  # room for the legend above the bars
    left.set_yticks(np.linspace(0, 1, 6))
    left.set_xlabel("target language")
    left.set_ylabel("consistency with orig answers")
    left.set_title("(a) by language and condition")
    left.legend(ncols=5, loc="upper center", fontsize=6, frameon=False, handlelength=1.2, columnspacing=0.8)

    pooled = cons[cons["language"].isin(["all"]) | cons["condition"].isin(baselines)]
    shown = [c for c in ("rerun", "P", "T", "I", "X", "R") if c in set(pooled["condition"])]
    for k, (group, shade) in enumerate((("orig_correct", 1.0), ("orig_incorrect", 0.45))):
        part = pooled[pooled["group"] == group].set_index("condition").reindex(shown)
        x = np.arange(len(shown)) + (k - 0.5) * 0.38
        right.bar(x, part["value"], 0.38, color=[colours[c] for c in shown], alpha=shade, yerr=_error_bars(part),
                  capsize=1.5, error_kw={"linewidth": 0.6})
    right.set_xticks(range(len(shown)), shown)
    right.set_ylim(0, 1.32)
    right.set_yticks(np.linspace(0, 1, 6))
    right.set_xlabel("condition (all languages)")
    right.set_title("(b) by orig correctness")
    right.legend(handles=[Patch(facecolor="0.35", label="orig correct"),
                          Patch(facecolor="0.35", alpha=0.45, label="orig incorrect")],
                 ncols=2, loc="upper center", fontsize=6, frameon=False, handlelength=1.2)
    if "protocol" in summary.columns and len(summary):
        title = f"{title} (protocol {summary['protocol'].iloc[0]})"
    if title:
        fig.suptitle(title)
    return save(fig, path)


def _error_bars(part: pd.DataFrame) -> np.ndarray:
    """Distances from the value to the interval ends (never negative: rounding at 0 and 1)."""
    return np.clip(np.vstack([part["value"] - part["ci_low"], part["ci_high"] - part["value"]]), 0, None)


# ------------------------------------------------------------------------------------ Cross-Lingual Pitfalls

def plot_affinity(affinity: pd.DataFrame, path: str | Path, title: str = "Relative Affinity Score") -> list[Path]:
    """The paper's Fig. 7: the Relative Affinity Score D[x, y] (`pitfalls.relative_affinity`: rows x the
    evaluation language, columns y the seed language) with the source (seed) language y down the vertical
    axis and the target language x across; darker cells are lower D, a stronger affinity (y's weaknesses
    persist in x). Values are written in the cells; the colour limits are the data's range (the paper's
    text does not state its scale)."""
    shown = affinity.T  # rows: source language y, columns: target language x
    values = shown.to_numpy(float)
    n = len(shown)
    low, high = (np.nanmin(values), np.nanmax(values)) if np.isfinite(values).any() else (0.0, 1.0)
    fig, ax = figure("one", height=0.45 * n + 1.2)
    image = ax.imshow(values, cmap=SEQUENTIAL, vmin=low, vmax=high)
    ax.set_xticks(range(n), shown.columns, rotation=45, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(n), shown.index)
    ax.set_xlabel("target language x")
    ax.set_ylabel("source (seed) language y")
    ax.grid(False)
    middle = (low + high) / 2
    for i in range(n):
        for j in range(n):
            value = values[i, j]
            if not np.isnan(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6,
                        color="black" if value > middle else "white")
    fig.colorbar(image, ax=ax, shrink=0.8, label="D(x, y)  (lower: stronger affinity)")
    ax.set_title(title)
    return save(fig, path)


def plot_pitfalls(summary: pd.DataFrame, path: str | Path, model_name: str,
                  paper: dict[str, pd.DataFrame | None] | None = None, order: list[str] | None = None) -> list[Path]:
    """Per target language (one panel each, in `order`): English vs target accuracy of the paper's models
    on the perturbed questions and of this model on the perturbed and original ones (95% intervals)."""
    summary = pitfalls.wide(summary)
    overall = summary[summary["subset"] == "all"]
    present = list(dict.fromkeys(overall["target_name"]))
    names = [n for n in (order or []) if n in present] or present
    fig, axes = figure("two", height=1.9 * len(names) + 0.5, nrows=len(names), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        bars = _bars_for(overall[overall["target_name"] == name], (paper or {}).get(name), model_name)
        x = np.arange(len(bars))
        for offset, side, colour, label in ((-0.2, "en", PALETTE[0], "English"), (0.2, "target", PALETTE[1], name)):
            values = bars[f"{side}_accuracy"].to_numpy()
            ax.bar(x + offset, values, width=0.4, color=colour, edgecolor="black", linewidth=0.4, label=label)
            ours = bars["ours"].to_numpy()
            low = np.clip(values - bars[f"{side}_accuracy_low"].to_numpy(), 0, None)
            high = np.clip(bars[f"{side}_accuracy_high"].to_numpy() - values, 0, None)
            ax.errorbar(x[ours] + offset, values[ours], yerr=[low[ours], high[ours]], fmt="none", ecolor="black",
                        elinewidth=0.7, capsize=1.5)
        ax.set_xticks(x, bars["label"], rotation=30, ha="right", rotation_mode="anchor")
        for tick, ours in zip(ax.get_xticklabels(), bars["ours"], strict=True):
            tick.set_fontweight("bold" if ours else "normal")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("accuracy")
        n = int(bars.loc[bars["ours"], "n"].iloc[0])
        total = int(bars["n"].max())  # the paper's models answered all questions; --limit gives fewer
        ax.set_title(f"English vs {name}, perturbed questions: {n}" + (f" of {total}" if total != n else ""),
                     loc="left")
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, frameon=False)
    return save(fig, path)


MODEL_LABEL_CHARS = 28  # a model's tick label at most (`model_label`)


def model_label(model_name: str, width: int = MODEL_LABEL_CHARS) -> str:
    """A model's name short enough for a tick label: without its fingerprint's parenthesis, the last part of a
    local directory's path or a hub id (a full path, rotated under a bar, left the panel no height), cut to
    `width` characters."""
    short = model_name.split(" (")[0].rstrip("/").rsplit("/", 1)[-1] or model_name
    return short if len(short) <= width else short[:width - 1] + "…"


def _bars_for(ours: pd.DataFrame, paper: pd.DataFrame | None, model_name: str) -> pd.DataFrame:
    """Bar table: the paper's models (perturbed questions), then this model perturbed and original."""
    rows = []
    if paper is not None:
        for r in paper.to_dict("records"):
            rows.append({"label": r["model"], "en_accuracy": r["en_accuracy"], "target_accuracy": r["target_accuracy"],
                         "en_accuracy_low": np.nan, "en_accuracy_high": np.nan, "target_accuracy_low": np.nan,
                         "target_accuracy_high": np.nan, "ours": False, "n": r["n"]})
    short = model_label(model_name)
    for version in ("perturbed", "original"):
        part = ours[ours["version"] == version]
        if len(part):
            r = part.iloc[0]
            rows.append({"label": f"{short} ({version})", **{k: r[k] for k in (
                "en_accuracy", "target_accuracy", "en_accuracy_low", "en_accuracy_high", "target_accuracy_low",
                "target_accuracy_high")}, "ours": True, "n": r["n"]})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------- benchmark bridges

BRIDGE_METRICS = {"acc": "acc (sum of log-probs)", "acc_norm": "acc_norm (per character)",
                  "acc_bytes": "acc_bytes (per UTF-8 byte)"}


def plot_bridge(summary: pd.DataFrame, path: str | Path, title: str = "", table: pd.DataFrame | None = None) -> list[Path]:
    """A bridge run's two figures beside `path`: `bridge_accuracy` (acc, acc_norm, acc_bytes per language,
    Wilson intervals) and `bridge_norm_gap` (acc_norm − acc_bytes per language, grouped and coloured by
    script, paired bootstrap intervals; where no language has a gap, a note says whether the two ever pick
    different options). PDF and PNG of each; the accuracy PNG comes last."""
    path = Path(path)
    if table is None:  # one bar group per language
        table = bridges.wide(summary).sort_values(["script", "language"]).reset_index(drop=True)
    table = table.reset_index(drop=True)
    written = _bridge_norm_gap(table, path.with_name("bridge_norm_gap"), title)
    return written + _bridge_accuracy(table, path.with_name("bridge_accuracy"), title)


def _bar_labels(table: pd.DataFrame) -> list[str]:
    """A bar group's label: the table's `label` (lm-eval: task and language), else language and script."""
    if "label" in table.columns:
        return table["label"].tolist()
    return [f"{lang}\n({script})" for lang, script in zip(table["language"], table["script"])]


def _bridge_accuracy(table: pd.DataFrame, path: Path, title: str) -> list[Path]:
    fig, ax = figure("two", height=2.8)
    x = np.arange(len(table))
    width = 0.8 / len(BRIDGE_METRICS)
    for k, (metric, label) in enumerate(BRIDGE_METRICS.items()):
        values = table[metric].to_numpy(float)
        errors = [np.clip(values - table[f"{metric}_low"].to_numpy(float), 0, None),
                  np.clip(table[f"{metric}_high"].to_numpy(float) - values, 0, None)]
        ax.bar(x + (k - 1) * width, values, width * 0.9, yerr=errors, color=PALETTE[k], label=label,
               error_kw={"elinewidth": 0.6, "capsize": 1.5})
    ax.set_xticks(x, _bar_labels(table))
    ax.set_ylim(0, 1.2)  # room above the bars for the legend, in one row
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("accuracy (95% Wilson)")
    ax.grid(axis="x", visible=False)
    ax.legend(loc="upper center", ncol=len(BRIDGE_METRICS), fontsize=7, frameon=False)
    ax.set_title(f"{title}: accuracy by normalisation" if title else "accuracy by normalisation")
    return save(fig, path)


def _bridge_norm_gap(table: pd.DataFrame, path: Path, title: str) -> list[Path]:
    fig, ax = figure("two", height=2.6)
    scripts = list(dict.fromkeys(table["script"]))
    colours = {script: PALETTE[k % len(PALETTE)] for k, script in enumerate(scripts)}
    x = np.arange(len(table))
    values = table["norm_gap"].to_numpy(float)
    errors = [np.clip(values - table["norm_gap_low"].to_numpy(float), 0, None),
              np.clip(table["norm_gap_high"].to_numpy(float) - values, 0, None)]
    ax.bar(x, values, 0.7, yerr=errors, color=[colours[s] for s in table["script"]],
           error_kw={"elinewidth": 0.6, "capsize": 1.5})
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(x, _bar_labels(table))
    ax.set_ylabel("acc_norm − acc_bytes")
    ax.grid(axis="x", visible=False)
    disagree = int(round((table["norm_disagree"] * table["n"]).sum()))
    if disagree == 0:  # e.g. Belebele: one-letter choices, so acc_norm ≡ acc ≡ acc_bytes
        why = "per character and per byte pick the same option in every question"
    elif (values == 0).all():  # no bar to see: say why
        why = (f"per character and per byte pick different options in {disagree} of {int(table['n'].sum())} "
               "questions, with the same accuracy in every language")
    else:
        why = ""
    if why:
        note(ax, why, y=0.6, va="baseline")
    handles = [_legend_handle(marker="s", color=colours[s], label=s) for s in scripts]
    ax.legend(handles=handles, title="script", fontsize=7, title_fontsize=7, frameon=False, loc="best")
    ax.set_title(f"{title}: per character minus per byte" if title else "per character minus per byte")
    return save(fig, path)


# ------------------------------------------------------------------------- Pitfalls: linguistic affinity

AFFINITY_FILES = ("pairs.csv", "pairs-dropped.csv", "items.csv", "accuracy.csv", "affinity.csv")


@dataclass
class AffinityRun:
    """A finished affinity run: the expanded pairs, their evaluation rows, A[x, y] and D[x, y] (rows x the
    evaluation language, columns y the seed language), the run directory and the heat map's files."""

    pairs: pd.DataFrame
    rows: pd.DataFrame
    accuracy: pd.DataFrame
    affinity: pd.DataFrame
    out: Path
    figures: list[Path] = field(default_factory=list)


def sample_pairs(questions: pd.DataFrame, limit: int | None, seed: int) -> pd.DataFrame:
    """At most `limit` questions per language, drawn at random with `seed` (App. B.2: "randomly select 100
    pairs"), kept in the file's order; all of them without a limit."""
    if limit is None:
        return questions
    drawn = [part.sample(n=min(limit, len(part)), random_state=np.random.default_rng([seed, k]).integers(2**31)).index
             for k, (_, part) in enumerate(questions.groupby("language", sort=True))]
    # a mask, not a concatenation: the table's attrs (the load report) stay with it
    return questions[questions.index.isin(np.concatenate(drawn))] if drawn else questions


@runner(AffinitySettings, old=("model", "items", "out", "settings", "languages", "limit", "overwrite", "progress"),
        renamed=OLDER_NAMES)
def run_affinity(items: str | Path, out: str | Path, settings: AffinitySettings | None = None,
                 runtime: Runtime | Models | None = None, *, languages: list[str] | None = None,
                 limit: int | None = None) -> AffinityRun:
    """Fig. 7 of Cross-Lingual Pitfalls (§3.3, App. B.2) from found pairs (`items`: what `bench pitfalls`
    reads; `limit` pairs per seed language drawn at random with `settings.seed`, the paper: 100 at random):
    expand every seed language's pairs into the other languages of `items`, answer them (`settings.answer`),
    write `pairs.csv`, `pairs-dropped.csv`,
    `items.csv`, `accuracy.csv` (A[x, y]), `affinity.csv` (D[x, y]), `affinity.json` and the heat map
    `pitfalls_fig7.{pdf,png}` (with `runtime.figures`) into `out`. Languages and prompts are checked before
    any model loads; generations are kept in `out/generations.jsonl` (a rerun resumes). `settings`: an
    `AffinitySettings` or its fields as keywords (`protocol="paper"`); `runtime`: a `Runtime` or `Models`, or
    its options as keywords; the older `run_affinity(model, source, out, settings, languages, limit,
    overwrite, progress)` too."""
    from babelprobe.benchmarks.pitfalls.affinity import answer_pairs, check_languages, pairs_table
    from babelprobe.benchmarks.pitfalls.search import _chat, expand_pairs
    from babelprobe.benchmarks.pitfalls.settings import SearchSettings
    from babelprobe.benchmarks.pitfalls.summary import affinity_accuracy, relative_affinity

    source = items
    check_input("items", items, "items")
    check_limit(limit)
    check_kind(out, "pitfalls-affinity", "bench pitfalls-affinity")
    questions = sample_pairs(pitfalls.load_pitfalls(source, languages, None), limit, settings.seed)
    names = list(dict.fromkeys(questions["language_name"]))
    check_languages(names, settings)
    models = as_models(runtime)
    overwrite, progress = models.runtime.overwrite, models.runtime.progress
    answering = "model" if settings.answer == "likelihood" else settings.generator
    who = models.identity(answering)
    identity = {"benchmark": "pitfalls-affinity", "fingerprint": who["fingerprint"], **settings_record(settings)}
    run = open_run(out, identity, record={"model": who["model"], "data": str(source), "languages": languages,
                                          "limit": limit}, manifest=LAYOUTS["pitfalls-affinity"].manifest, overwrite=overwrite,
                   outputs=AFFINITY_FILES, what="a Pitfalls affinity run")
    cache = run.path / "generations.jsonl"
    translator = _chat(models, settings.translator, settings.chat_template)
    pairs, dropped = expand_pairs(questions, names, translator, SearchSettings(max_new_tokens=settings.max_new_tokens,
                                                                              translation=settings.translation),
                                  cache=cache)
    rows = answer_pairs(pairs, models, settings, cache=cache, progress=progress)
    accuracy = affinity_accuracy(rows).reindex(index=[pitfalls_code(n) for n in names],
                                               columns=[pitfalls_code(n) for n in names])
    affinity = relative_affinity(accuracy, settings.c)
    write_table(pairs_table(pairs), run.path / "pairs.csv")
    write_table(dropped, run.path / "pairs-dropped.csv")
    write_table(rows, run.path / "items.csv")
    write_table(accuracy.reset_index(), run.path / "accuracy.csv")
    write_table(affinity.reset_index().rename(columns={"index": "language"}), run.path / "affinity.csv")
    drawn = plot_affinity(affinity, run.path / "pitfalls_fig7",
                          title=f"Relative Affinity Score (Fig. 7): {who['model']}") if models.runtime.figures else []
    return AffinityRun(pairs=pairs, rows=rows, accuracy=accuracy, affinity=affinity, out=run.path, figures=drawn)


def pitfalls_code(name: str) -> str:
    from babelprobe.languages import language_code

    return language_code(name)


# ------------------------------------------------------------------------------------ several runs, reports

def plot_eclektic_sizes(summaries: dict[str, pd.DataFrame], path: str | Path, title: str = "") -> list[Path]:
    """ECLeKTiC Fig. 4: overall success and transfer score (all source × target pairs pooled, 95%
    intervals) of several runs, one point per run in the order given (e.g. one model family by size)."""
    labels, lines = list(summaries), {"overall_success": [], "transfer_score": []}
    for summary in summaries.values():
        pooled = summary[(summary["source_language"] == "all") & (summary["target_language"] == "all")
                         & (summary.get("average", "pooled") == "pooled")]
        for metric in lines:
            row = pooled[pooled["metric"] == metric]
            lines[metric].append(row.iloc[0][["value", "ci_low", "ci_high"]].to_numpy(float) if len(row)
                                 else np.full(3, np.nan))
    fig, ax = figure("two", height=2.8)  # room for long run names
    x = np.arange(len(labels))
    for k, (metric, label) in enumerate((("overall_success", "overall success"), ("transfer_score", "transfer score"))):
        values = np.array(lines[metric]).reshape(-1, 3)
        errors = np.clip(np.vstack([values[:, 0] - values[:, 1], values[:, 2] - values[:, 0]]), 0, None)
        ax.errorbar(x, values[:, 0], yerr=errors, marker="os"[k], color=PALETTE[k], label=label, capsize=2, lw=1)
    # long run names (a hub id, the default model's) wrapped, so they do not squeeze the axes away
    ax.set_xticks(x, [textwrap.fill(label, 24) for label in labels], rotation=30 if len(labels) > 3 else 0,
                  ha="right" if len(labels) > 3 else "center", rotation_mode="anchor", fontsize=7)
    ax.set_xlim(-0.5, len(labels) - 0.5)
    ax.set_ylim(0, 1)
    ax.set_ylabel("score (all pairs pooled)")
    ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "ECLeKTiC: overall success and transfer by run (Fig. 4)")
    return save(fig, path)


def read_bench_run(path: str | Path) -> tuple[str, str, pd.DataFrame, dict]:
    """(benchmark, model, summary, run.json) of a finished `bench NAME` directory."""
    import json

    from babelprobe.runs import LAYOUTS
    from babelprobe.tables import read_table

    path = LAYOUTS["bench"].check(path, "--results")
    info = json.loads((path / LAYOUTS["bench"].manifest).read_text(encoding="utf-8"))
    return info.get("benchmark", ""), str(info.get("model") or path.name), read_table(path / SUMMARY), info


def plot_runs(runs: list[str | Path], out: str | Path) -> dict[str, list[Path]]:
    """The figures that put several runs of one benchmark side by side (`babelprobe bench figures`):
    StingrayBench Figs. 4–6 and App. C Figs. 7, 8, 11–14 with one colour per model; ECLeKTiC Fig. 4
    (overall success and transfer per run, in the order given). name -> files."""
    from babelprobe.errors import BabelprobeError

    for run in runs:
        check_input("runs", run, "bench")
    read = [read_bench_run(r) for r in runs]
    names = {name for name, *_ in read}
    if len(names) != 1:
        raise BabelprobeError(f"bench figures needs runs of one benchmark; got {', '.join(sorted(names))}")
    name, out = names.pop(), Path(out)
    summaries: dict[str, pd.DataFrame] = {}
    for (_, model, summary, _), run in zip(read, runs, strict=True):
        label = model if model not in summaries else f"{model} ({Path(run).name})"
        summaries[label] = summary
    if name == "stingray":
        drawn = {"stingray-overall": plot_stingray_overall(summaries, out / "stingray-overall"),
                 "stingray-pairs": plot_stingray_pairs(summaries, out / "stingray-pairs")}
        return {**drawn, **plot_stingray_appendix(summaries, out)}
    if name == "eclektic":
        return {"eclektic_fig4": plot_eclektic_sizes(summaries, out / "eclektic_fig4")}
    raise BabelprobeError(f"bench figures draws stingray and eclektic runs side by side, not {name!r}")


def report_bench(path: str | Path, out: str | Path, n_boot: int = 1000, seed: int = 0):
    """`babelprobe report --results DIR` for a `bench NAME` directory: the benchmark's figure from its
    summary (and StingrayBench's App. C figures), redrawn into `out`, and report.md."""
    from babelprobe.analysis.report import Report

    name, model, summary, info = read_bench_run(path)
    out = Path(out)
    report = Report(out=out)
    report.figures[name] = plot_benchmark(name, summary, out / name, model=model, source=info.get("data"))
    if name == "stingray":
        report.figures.update(plot_stingray_appendix({model: summary}, out, title=f"StingrayBench — {model}"))
    _write_markdown(report, f"{name} run {path} ({model})")
    return report


def report_affinity(path: str | Path, out: str | Path, n_boot: int = 1000, seed: int = 0):
    """`babelprobe report --results DIR` for a `bench pitfalls-affinity` directory: Fig. 7 and report.md."""
    import json

    from babelprobe.analysis.report import Report
    from babelprobe.tables import read_table

    path, out = Path(path), Path(out)
    info = json.loads((path / LAYOUTS["pitfalls-affinity"].manifest).read_text(encoding="utf-8"))
    affinity = read_table(path / "affinity.csv").set_index("language")
    report = Report(out=out)
    report.figures["pitfalls_fig7"] = plot_affinity(affinity, out / "pitfalls_fig7",
                                                    title=f"Relative Affinity Score (Fig. 7): {info.get('model', '')}")
    _write_markdown(report, f"Cross-Lingual Pitfalls affinity run {path}")
    return report


def _write_markdown(report, heading: str) -> None:
    from babelprobe.tables import atomic_path

    lines = [f"# {heading}", ""] + [f"- {name}: {', '.join(p.name for p in files)}"
                                    for name, files in report.figures.items()]
    with atomic_path(report.out / "report.md") as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
