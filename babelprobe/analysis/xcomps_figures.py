"""The XCOMPS paper's own figures that `figures.py` does not already draw, from the tables of
`analysis.xcomps`, in the one house style (`analysis.style`).

    plot_method_grid(method_cells(summary, layers))            # Fig. 2: rows per negative type per method
    plot_method_grid(cells_difference(a, b), difference=True)  # Fig. 9: the same, other − base
    plot_typology_means(cells)                                 # Fig. 4: class means, English left out
    plot_peak_readings(language_peaks(p), subset_peaks(p))     # Fig. 6 under both readings
    plot_correlations_by_subset(cells)                         # Figs. 10-12: correlations per negative type
    plot_layer_difference(layer_difference(probe_a, probe_b))  # Fig. 13: layer-wise F1 difference

Figs. 3, 5 and 14 are `figures.plot_method_correlations`, `plot_layer_curves` and `plot_peak_heatmap`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from babelprobe.analysis import methods, xcomps
from babelprobe.analysis.figures import (
    CHANCE_STYLE,
    blank_handle,
    correlation_text,
    draw_peak_classes,
    fit_line,
    group_handles,
    language_styles,
    language_ticks,
    pad_limits,
    plot_layer_curves,
    require,
    subset_order,
)
from babelprobe.analysis.peaks import TYPOLOGIES, table3_only
from babelprobe.analysis.style import DIVERGING, MARKERS, TYPOLOGY_COLORS, annotate_cells, figure

GRID_LABELS = {"meta": "meta\naccuracy", "direct": "direct\naccuracy", "neuro": "neuro F1\n(max over layers)"}
CELL_COLUMNS = ["language", "subset", "method", "value"]


def plot_method_grid(cells: pd.DataFrame, difference: bool = False, title: str | None = None):
    """XCOMPS Fig. 2 in its form: one heatmap per method (meta, direct, neuro) with a row per negative
    type and a column per language, languages grouped by typology (English, not in Table 3, first);
    meta and direct are pair accuracy, neuro the best layer's fold-averaged F1. With `difference` the
    values are other − base (Fig. 9) on a scale centred on 0; otherwise centred on chance (0.5)."""
    require(cells, CELL_COLUMNS, "the method cells")
    present = [m for m in methods.METHODS if m in set(cells["method"])]
    subsets = subset_order(cells["subset"])
    groups = xcomps.language_groups(cells["language"])
    columns = [code for _, codes in groups for code in codes]
    if difference:
        span = max(float(np.nanmax(np.abs(cells["value"]))), 0.05)
        vmin, vmax, fmt = -span, span, "{:+.2f}"
    else:
        vmin, vmax, fmt = 0.0, 1.0, "{:.2f}"
    width = "two" if len(columns) > 5 else "one"
    fig, axes = figure(width, 0.75 + len(present) * (0.3 + 0.21 * len(subsets)), nrows=len(present), squeeze=False)
    image = None
    for ax, method in zip(axes[:, 0], present, strict=True):
        matrix = cells[cells["method"] == method].pivot_table(index="subset", columns="language", values="value")
        values = np.round(matrix.reindex(index=subsets, columns=columns).to_numpy(float), 2) + 0.0  # no "-0.00"
        image = ax.imshow(values, cmap=DIVERGING, vmin=vmin, vmax=vmax, aspect="auto")
        annotate_cells(ax, image, values, fmt=fmt, fontsize=5.5 if len(columns) > 12 else 6)
        ax.set_yticks(range(len(subsets)), subsets)
        ax.set_ylabel(GRID_LABELS.get(method, method), fontsize=7)
        language_ticks(ax, columns, "x")
        ax.tick_params(axis="x", labelbottom=ax is axes[-1, 0])
    _group_labels(axes[0, 0], groups)
    bar = fig.colorbar(image, ax=axes[:, 0].tolist(), shrink=0.8, pad=0.015, aspect=30)
    bar.set_label("other − base" if difference else "accuracy / F1 (0.5: chance)")
    if title:
        fig.suptitle(title)
    return fig


SHORT_CLASS = {"analytic": "analyt.", "inflectional": "inflect.", "agglutinative": "agglut."}


def _group_labels(ax, groups) -> None:
    """The typology group names above the top heatmap, centred over their columns."""
    start = 0
    for name, codes in groups:
        centre = start + (len(codes) - 1) / 2
        label = name.replace("not in ", "not in\n") if len(codes) < 3 else name  # narrow group: two lines
        if len(codes) == 1:  # one column: the class name would run into its neighbours'
            label = SHORT_CLASS.get(label, label)
        ax.annotate(label, (centre, 1.0), xycoords=("data", "axes fraction"), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=6.5,
                    color=TYPOLOGY_COLORS.get(name, "0.3"), fontweight="bold")
        start += len(codes)


def plot_typology_means(cells: pd.DataFrame, title: str | None = None):
    """XCOMPS Fig. 4: each method's score (negative types averaged) averaged over the languages of each
    typology class of Table 3 (bars); the dots are the languages. English is left out (named under the
    axis); meta and direct are pair accuracy, neuro the best layer's F1."""
    require(cells, CELL_COLUMNS, "the method cells")
    means = xcomps.typology_means(cells)
    means = means[means["subset"] == "all"]
    per_language = table3_only(cells).groupby(["language", "typology", "method"], as_index=False)["value"].mean()
    present = [m for m in methods.METHODS if m in set(means["method"])]
    classes = [t for t in TYPOLOGIES if t in set(means["typology"])]
    width = 0.8 / len(classes)
    fig, ax = figure("one", 2.6)
    rng = np.random.default_rng(0)  # the dots' horizontal jitter only
    for k, typology in enumerate(classes):
        rows = means[means["typology"] == typology].set_index("method").reindex(present)
        x = np.arange(len(present)) + (k - (len(classes) - 1) / 2) * width
        n = int(rows["n_languages"].max())
        ax.bar(x, rows["value"], width, color=TYPOLOGY_COLORS[typology], alpha=0.85, edgecolor="white",
               linewidth=0.4, label=f"{typology} ({n} language{'s' if n > 1 else ''})")
        for i, method in enumerate(present):
            dots = per_language[(per_language["typology"] == typology) & (per_language["method"] == method)]
            ax.scatter(x[i] + rng.uniform(-width / 4, width / 4, len(dots)), dots["value"], s=5, color="black",
                       zorder=3, linewidth=0)
    ax.axhline(0.5, color="0.3", linestyle=CHANCE_STYLE, linewidth=0.9)
    ax.set_xticks(range(len(present)), [GRID_LABELS[m] for m in present], fontsize=6.5)
    ax.set_ylim(0, 1.0)
    ax.set_ylabel("mean over the class's languages")
    ax.grid(axis="x", visible=False)
    dropped = xcomps.left_out(cells["language"])
    if dropped:
        ax.set_xlabel(f"left out (not in XCOMPS Table 3): {', '.join(dropped)}", fontsize=6.5, color="0.35")
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], linestyle="", marker="o", markersize=2.5, color="black"))
    labels.append("a language")
    fig.legend(handles, labels, loc="outside upper center", ncols=2, frameon=False, fontsize=6.5)
    if title:
        ax.set_title(title)
    return fig


def plot_peak_readings(language_peaks: pd.DataFrame, subset_peaks: pd.DataFrame):
    """XCOMPS Fig. 6 under both readings of "average peak layer" per typology class, side by side and
    labelled: (a) each language's peak (its curve averaged over negative types), (b) each language ×
    negative type's own peak. Bars: class means; points: the units averaged, with their bootstrap
    intervals. Table 3 languages only (English left out)."""
    require(language_peaks, ["language", "peak_layer", "peak_layer_low", "peak_layer_high", "n_layers"],
            "the language peak table")
    require(subset_peaks, ["language", "subset", "peak_layer", "peak_layer_low", "peak_layer_high", "n_layers"],
            "the language × subset peak table")
    subsets = subset_order(subset_peaks["subset"])
    markers = dict(zip(subsets, MARKERS, strict=False))
    fig, axes = figure("two", 2.9, ncols=2, sharey=True)
    draw_peak_classes(axes[0], language_peaks, depth_axis=False, note=False)
    draw_peak_classes(axes[1], subset_peaks, labels=False, markers=markers, ylabel="", note=False)
    dropped = xcomps.left_out([*language_peaks["language"], *subset_peaks["language"]])
    if dropped:
        axes[0].set_xlabel(f"left out (not in XCOMPS Table 3): {', '.join(dropped)}", fontsize=6.5, color="0.35")
    axes[0].set_title("(a) per language (negative types averaged)", fontsize=8)
    axes[1].set_title("(b) per language × negative type", fontsize=8)
    shapes = [Line2D([], [], linestyle="", marker=markers[s], color="0.35", markersize=3.5, label=s) for s in subsets]
    fig.legend(handles=shapes, loc="outside lower right", ncols=len(shapes), frameon=False, fontsize=6.5,
               title="(b) points by negative type", title_fontsize=6.5)
    fig.suptitle("Average peak layer by typology (XCOMPS Fig. 6, both readings)", fontsize=8.5)
    return fig


def plot_correlations_by_subset(cells: pd.DataFrame, correlations: pd.DataFrame | None = None):
    """XCOMPS Figs. 10-12 (one per model): each method against each other across languages, a row per
    negative type, with Pearson r and Spearman ρ and their 95% intervals; points coloured by typology."""
    require(cells, CELL_COLUMNS, "the method cells")
    if correlations is None:
        correlations = xcomps.correlations_by_subset(cells)
    subsets = subset_order(cells["subset"])
    pairs = list(dict.fromkeys(correlations[["method_a", "method_b"]].itertuples(index=False, name=None)))
    fig, axes = figure("two", 0.7 + 1.85 * len(subsets), nrows=len(subsets), ncols=len(pairs), squeeze=False)
    styles = language_styles(cells["language"])
    for r, subset in enumerate(subsets):
        wide = cells[cells["subset"] == subset].pivot_table(index="language", columns="method", values="value")
        for c, (a, b) in enumerate(pairs):
            ax = axes[r, c]
            for language, row in wide.iterrows():
                ax.scatter(row[a], row[b], s=12, color=styles[language]["color"], edgecolor="white", linewidth=0.3)
                ax.annotate(language, (row[a], row[b]), xytext=(2, 1), textcoords="offset points", fontsize=5,
                            color="0.3")
            fit_line(ax, wide[a], wide[b])
            stats = correlations[(correlations["subset"] == subset) & (correlations["method_a"] == a)
                                 & (correlations["method_b"] == b)].iloc[0]
            ax.set_title(f"{subset}: " + correlation_text(stats), fontsize=6, loc="left")
            ax.set_xlabel(GRID_LABELS[a].replace("\n", " "), fontsize=6.5)
            ax.set_ylabel(GRID_LABELS[b].replace("\n", " "), fontsize=6.5)
            pad_limits(ax, wide[a], wide[b])
    handles = group_handles(cells["language"])
    handles.append(blank_handle(f"(points: the {cells['language'].nunique()} languages)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    return fig


def plot_layer_difference(difference: pd.DataFrame, x: str = "layer", title: str | None = None):
    """XCOMPS Fig. 13: probe F1 of one model minus another's by layer, one line per language, one panel
    per negative type; bands are paired bootstrap 95% intervals (`xcomps.layer_difference`)."""
    require(difference, ["language", "subset", "layer", "difference", "ci_low", "ci_high"],
            "the layer-wise difference table")
    span = float(np.nanmax(np.abs(difference[["difference", "ci_low", "ci_high"]].to_numpy())))
    span = max(span, 0.05) * 1.05
    return plot_layer_curves(difference, x=x, title=title, value="difference", low="ci_low", high="ci_high",
                             reference=(0.0, "no difference"), ylim=(-span, span), ylabel="Δ probe F1 (other − base)")
