"""Figures of the logit lens and of cross-lingual alignment (babelprobe/latent), in the house style.

    plot_lens_curves(curves)             # per language: P(answer in own language) and P(answer in the pivot)
                                         #   by layer, 95% bootstrap bands (the latent-English picture)
    plot_lens_entropy(curves)            # entropy and the own-script share of the top-k tokens by layer
    plot_alignment(curves)               # retrieval accuracy to the pivot and linear CKA by layer
    plot_alignment_matrix(matrix, layer) # language × language retrieval and CKA at one layer
    plot_alignment_correlation(corr)     # correlation of alignment with probe F1 and meta/direct accuracy

Each takes the tables `babelprobe lens` / `babelprobe align` write and returns a Figure; write it with
`style.save(fig, path)`. Languages keep their look from `figures.language_styles`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from babelprobe.analysis.figures import language_legend, language_styles, require
from babelprobe.analysis.peaks import language_order
from babelprobe.analysis.style import PALETTE, SEQUENTIAL, annotate_cells, figure
from babelprobe.runs import LAYOUTS

OWN, PIVOT = PALETTE[3], PALETTE[0]  # vermilion: the item's language; blue: the pivot (English)
CHANCE_STYLE = (0, (1, 2))
COLUMNS = 3  # panels per row of the per-language grid
FLOOR = 1e-6  # lower end of the log probability axis


def _grid(n: int, columns: int = COLUMNS):
    rows = int(np.ceil(n / columns))
    fig, axes = figure("two", height=1.55 * rows + 0.5, nrows=rows, ncols=columns, squeeze=False)
    axes = list(axes.flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes


def _layer_axis(*axes) -> None:
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _band(ax, frame, column, color, label):
    ax.plot(frame["layer"], frame[column], color=color, label=label)
    ax.fill_between(frame["layer"], frame[f"{column}_low"], frame[f"{column}_high"], color=color, alpha=0.2,
                    linewidth=0)


def plot_lens_curves(curves: pd.DataFrame, pivot: str = "en"):
    """One panel per language: mean probability of the answer's tokens in the item's language and of its
    pivot-language counterpart, by layer, with 95% bootstrap bands over pairs (log scale, from 1e-6)."""
    require(curves, ["language", "layer", "p_own", "p_own_low", "p_own_high", "p_pivot"], "lens curves")
    languages = [lang for lang in language_order(curves["language"]) if lang != pivot]
    languages = [lang for lang in languages if curves.loc[curves["language"] == lang, "p_pivot"].notna().any()]
    fig, axes = _grid(len(languages))
    for ax, language in zip(axes, languages):
        group = curves[curves["language"] == language].sort_values("layer")
        _band(ax, group, "p_own", OWN, f"answer in {language}")
        _band(ax, group, "p_pivot", PIVOT, f"answer in {pivot}")
        ax.set_title(f"{language}  (n={int(group['n_pairs'].max())} pairs)")
        ax.set_yscale("log")  # the pivot's share is small next to the final answer's: a log scale shows both
        ax.set_ylim(FLOOR, 1)
        _layer_axis(ax)
    for i, ax in enumerate(axes[: len(languages)]):
        if i + COLUMNS >= len(languages):  # the lowest panel of its column
            ax.set_xlabel("layer")
        if i % COLUMNS == 0:
            ax.set_ylabel("probability (log)")
    handles = [Line2D([], [], color=OWN, label="answer in the item's language"),
               Line2D([], [], color=PIVOT, label=f"answer in the pivot ({pivot})")]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, frameon=False)
    fig.suptitle("Logit lens on the meta question: which language is the answer in, layer by layer?", fontsize=9)
    return fig


def _language_lines(curves: pd.DataFrame, left_column: str, right_column: str):
    """Two panels side by side, each with one line per language by layer (`left_column`, `right_column`)."""
    fig, (left, right) = figure("two", height=2.9, ncols=2)
    styles = language_styles(curves["language"])
    for language, style in styles.items():
        group = curves[curves["language"] == language].sort_values("layer")
        kwargs = dict(color=style["color"], linestyle=style["linestyle"], marker=style["marker"], markersize=2.5)
        left.plot(group["layer"], group[left_column], **kwargs)
        right.plot(group["layer"], group[right_column], **kwargs)
    return fig, (left, right), styles


def plot_lens_entropy(curves: pd.DataFrame):
    """Entropy of the lens distribution and the share of the top-k tokens in the item's own script, by layer,
    one line per language."""
    require(curves, ["language", "layer", "entropy", "topk_own_script"], "lens curves")
    fig, (left, right), styles = _language_lines(curves, "entropy", "topk_own_script")
    left.set(xlabel="layer", ylabel="entropy (nats)", title="entropy of the next-token distribution")
    right.set(xlabel="layer", ylabel="share of top-k tokens", ylim=(-0.02, 1.02),
              title="top-k tokens in the language's own script")
    _layer_axis(left, right)
    language_legend(fig, styles)
    return fig


def plot_alignment(curves: pd.DataFrame):
    """Retrieval accuracy to and from the pivot (mean of both directions) with its chance level, and linear
    CKA with the pivot, by layer, one line per language."""
    require(curves, ["language", "layer", "retrieval", "cka", "chance", "pivot"], "alignment curves")
    fig, (left, right), styles = _language_lines(curves, "retrieval", "cka")
    chance = curves.groupby("layer")["chance"].mean()
    left.plot(chance.index, chance.values, color="#777777", linestyle=CHANCE_STYLE)
    pivot = curves["pivot"].iloc[0]
    left.set(xlabel="layer", ylabel="retrieval accuracy", ylim=(-0.02, 1.02),
             title=f"parallel-item retrieval with {pivot} (cosine)")
    right.set(xlabel="layer", ylabel="linear CKA", ylim=(-0.02, 1.02), title=f"linear CKA with {pivot}")
    _layer_axis(left, right)
    chance_handle = Line2D([], [], color="#777777", linestyle=CHANCE_STYLE, label="chance")
    language_legend(fig, styles, extra=[chance_handle])
    fig.suptitle("Cross-lingual alignment by layer (states mean-centred per language)", fontsize=9)
    return fig


def plot_alignment_matrix(matrix: pd.DataFrame, layer: int):
    """Language × language retrieval accuracy (row language retrieving column language) and linear CKA at
    `layer`, values written in the cells."""
    require(matrix, ["layer", "language_a", "language_b", "retrieval", "cka"], "alignment matrix")
    at = matrix[matrix["layer"] == layer]
    order = language_order(at["language_a"])
    fig, axes = figure("two", height=3.4, ncols=2)
    for ax, column, title in zip(axes, ("retrieval", "cka"), ("retrieval accuracy (row → column)", "linear CKA")):
        values = at.pivot(index="language_a", columns="language_b", values=column).reindex(index=order, columns=order)
        image = ax.imshow(values.to_numpy(), cmap=SEQUENTIAL, vmin=0, vmax=1)
        annotate_cells(ax, image, values.to_numpy(), fmt="{:.2f}", fontsize=5)
        ax.set_xticks(range(len(order)), order)
        ax.set_yticks(range(len(order)), order)
        ax.grid(False)
        ax.set_title(f"{title}, layer {layer}")
        fig.colorbar(image, ax=ax, shrink=0.8)
    return fig


def plot_alignment_correlation(correlations: pd.DataFrame):
    """Spearman's ρ by layer between alignment and each outcome: across languages (retrieval against probe F1
    at the same layer and meta/direct accuracy) and across pairs (item cosine against correctness)."""
    require(correlations, ["level", "layer", "alignment", "outcome", "spearman_rho"], "alignment correlations")
    fig, (left, right) = figure("two", height=2.7, ncols=2)
    colors = {"probe_f1": PALETTE[4], "meta_accuracy": PALETTE[3], "direct_accuracy": PALETTE[5],
              "meta_correct": PALETTE[3], "direct_correct": PALETTE[5], "neuro_correct": PALETTE[4]}
    languages = correlations[(correlations["level"] == "language") & (correlations["alignment"] == "retrieval")]
    for outcome, group in languages.groupby("outcome"):
        left.plot(group["layer"], group["spearman_rho"], marker="o", markersize=2.5, color=colors.get(outcome),
                  label=outcome.replace("_", " "))
    n = int(languages["n"].max()) if len(languages) else 0
    left.set(xlabel="layer", ylabel="Spearman ρ", ylim=(-1.05, 1.05),
             title=f"across languages (n={n}): retrieval vs ...")
    pairs = correlations[correlations["level"] == "pair"]
    for outcome, group in pairs.groupby("outcome"):
        right.plot(group["layer"], group["spearman_rho"], marker="o", markersize=2.5, color=colors.get(outcome),
                   label=outcome.replace("_", " "))
    n = int(pairs["n"].max()) if len(pairs) else 0
    right.set(xlabel="layer", ylabel="Spearman ρ", title=f"across pairs (n={n}): cosine to pivot vs ...")
    _layer_axis(left, right)
    for ax in (left, right):
        ax.axhline(0, color="#777777", linewidth=0.6)
        ax.legend(frameon=False)
    return fig


# ------------------------------------------------------------------------------ a run's figures, its report

def lens_figures(curves: pd.DataFrame, pivot: str | None, folder) -> dict[str, list]:
    """The figures of a lens run into `folder`: lens_entropy, and lens_curves when there is a pivot."""
    from babelprobe.analysis.style import save

    written = {"lens_entropy": save(plot_lens_entropy(curves), Path(folder) / "lens_entropy")}
    if pivot and curves["p_pivot"].notna().any():
        written["lens_curves"] = save(plot_lens_curves(curves, pivot), Path(folder) / "lens_curves")
    return written


def alignment_figures(curves: pd.DataFrame, matrix: pd.DataFrame, correlations: pd.DataFrame | None, layer: int,
                      folder) -> dict[str, list]:
    """The figures of an alignment run into `folder`: alignment, alignment_matrix (at `layer`) and, with a
    compare directory's results, alignment_correlation."""
    from babelprobe.analysis.style import save

    folder = Path(folder)
    written = {"alignment": save(plot_alignment(curves), folder / "alignment"),
               "alignment_matrix": save(plot_alignment_matrix(matrix, layer), folder / "alignment_matrix")}
    if correlations is not None and len(correlations):
        written["alignment_correlation"] = save(plot_alignment_correlation(correlations),
                                                folder / "alignment_correlation")
    return written


def report_lens(path, out, n_boot: int = 1000, seed: int = 0):
    """`babelprobe report --results LENS_DIR`: the lens figures again, from the tables on disk."""
    import json

    from babelprobe.tables import read_table

    path = Path(path)
    state = json.loads((path / LAYOUTS["lens"].manifest).read_text(encoding="utf-8"))
    figures = lens_figures(read_table(path / "curves.csv"), state.get("pivot"), out)
    return _written_report(out, f"lens run {path}", figures)


def report_align(path, out, n_boot: int = 1000, seed: int = 0):
    """`babelprobe report --results ALIGN_DIR`: the alignment figures again, from the tables on disk."""
    import json

    from babelprobe.tables import read_table

    path = Path(path)
    state = json.loads((path / LAYOUTS["align"].manifest).read_text(encoding="utf-8"))
    correlations = read_table(path / "correlations.csv") if (path / "correlations.csv").exists() else None
    figures = alignment_figures(read_table(path / "curves.csv"), read_table(path / "matrix.csv"), correlations,
                                int(state["matrix_layer"]), out)
    return _written_report(out, f"alignment run {path}", figures)


def _written_report(out, title: str, figures: dict):
    """A `report.Report` of these figures, with a report.md that shows them (written last)."""
    from babelprobe.analysis.report import Report
    from babelprobe.tables import atomic_path

    out = Path(out)
    lines = [f"# babelprobe report: {title}", ""] + [f"![{name}]({paths[-1].name})" for name, paths in figures.items()]
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Report(out=out, figures=figures)
