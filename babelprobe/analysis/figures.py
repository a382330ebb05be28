"""Publication figures of a comparison or a probe sweep (the XCOMPS figures), in the one style of
`babelprobe.analysis.style`. Every function takes tidy tables and returns a matplotlib Figure; write it
with `style.save(fig, "name")` (PDF + 300-dpi PNG).

    plot_layer_curves(probe.table)             # Fig. 5's form: F1 by layer, one panel per subset, band = 95% CI
    plot_layer_curves(language_curves(probe))  #         the same with subsets averaged, one panel
    plot_peak_typology(language_peaks(probe))  # Fig. 6: peak layer per language, grouped by typology
    plot_peak_heatmap(subset_peaks(probe))     # Fig. 14: peak layer per language × subset
    plot_method_bars(result.items)             # meta / direct / neuro pair accuracy per language (Fig. 2's form:
                                               # xcomps_figures, `xcomps_fig2` of the report)
    plot_method_correlations(result.summary)   # Fig. 3: method against method over language × subset cells
    plot_transfer(probe.transfer, probe.peaks) # train language × test language probe F1

Languages keep one look everywhere: the colour is their typology class of XCOMPS Table 3 (analytic,
inflectional, agglutinative; grey, "other" in legends, for a language Table 3 does not list, such as
English), the line style and marker tell languages of one class apart.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from babelprobe.analysis import methods
from babelprobe.analysis.peaks import NOT_IN_TABLE3, TYPOLOGIES, language_order, with_typology
from babelprobe.analysis.style import (
    DIVERGING,
    LINESTYLES,
    MARKERS,
    METHOD_COLORS,
    SEQUENTIAL,
    TYPOLOGY_COLORS,
    annotate_cells,
    figure,
)
from babelprobe.analysis.summary import accuracy_table
from babelprobe.errors import BabelprobeError

CHANCE_STYLE = (0, (1, 2))  # dotted: the F1 or accuracy of guessing
LEGEND_HEADERS = {NOT_IN_TABLE3: "other"}  # short legend header of the grey group (English: not in Table 3)
SUBSET_ORDER = ("taxonomic", "overlap", "co-occurrence", "random")  # XCOMPS order: hardest negatives first
METRIC_LABELS = {"meta": "meta accuracy", "direct": "direct accuracy", "neuro": "neuro F1 (peak layer)"}


def require(frame: pd.DataFrame | None, columns, what: str) -> pd.DataFrame:
    """`frame`, or a one-line error naming `what` (a file or table) and the first missing column."""
    if frame is None:
        raise BabelprobeError(f"{what} is missing")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise BabelprobeError(f"{what} has no column {missing[0]!r} (columns: {', '.join(map(str, frame.columns))})")
    if frame.empty:
        raise BabelprobeError(f"{what} has no rows")
    return frame


def language_styles(languages) -> dict[str, dict]:
    """Colour (typology class of XCOMPS Table 3; grey for a language it does not list, e.g. English), line
    style and marker of each language, stable for a given set."""
    table = with_typology(pd.DataFrame({"language": language_order(languages)}))
    styles = {}
    for _, group in table.groupby("group", sort=False):
        for i, (code, typology) in enumerate(zip(group["language"], group["group"], strict=True)):
            styles[code] = {"typology": typology, "color": TYPOLOGY_COLORS.get(typology, TYPOLOGY_COLORS["other"]),
                            "linestyle": LINESTYLES[i % len(LINESTYLES)], "marker": MARKERS[i % len(MARKERS)]}
    return styles


def language_legend(fig, styles: dict, extra=()) -> None:
    """A legend below the axes, inside the figure, with one column per typology class headed by its name
    (the colour), the languages of the class under it, and the `extra` handles under the shortest column
    when they fit there or there are four columns already (else in a last column)."""
    classes: dict[str, list] = {}
    for code, style in styles.items():
        handle = Line2D([], [], color=style["color"], linestyle=style["linestyle"], marker=style["marker"],
                        markersize=3, label=code)
        classes.setdefault(style["typology"], []).append(handle)
    headers = {name: LEGEND_HEADERS.get(name, name) for name in classes}
    columns = [[blank_handle(headers[name]), *handles] for name, handles in classes.items()]
    if extra:
        shortest = min(columns, key=len)
        fits = len(shortest) + len(extra) <= max(len(c) for c in columns)
        if len(columns) > 1 and (fits or len(columns) >= 4):  # a fifth column does not fit one column's width
            shortest.extend(extra)
        else:
            columns.append([blank_handle(""), *extra])
    rows = max(len(c) for c in columns)
    entries = [h for column in columns for h in column + [blank_handle("")] * (rows - len(column))]
    legend = fig.legend(handles=entries, loc="outside lower center", ncols=len(columns), frameon=False,
                        handlelength=1.9, columnspacing=0.8, handletextpad=0.3)
    for text in legend.get_texts():
        if text.get_text() in headers.values():
            text.set_fontweight("bold")


def group_handles(languages) -> list:
    """Legend handles: one coloured dot per language group present (not in Table 3, then its classes)."""
    groups = list(dict.fromkeys(style["typology"] for style in language_styles(languages).values()))
    return [Line2D([], [], linestyle="", marker="o", color=TYPOLOGY_COLORS.get(g, TYPOLOGY_COLORS["other"]),
                   label=LEGEND_HEADERS.get(g, g)) for g in groups]


def blank_handle(label: str):
    return Line2D([], [], linestyle="none", label=label)


def subset_order(subsets) -> list[str]:
    """XCOMPS subsets in their paper order, any others after them alphabetically."""
    subsets = list(dict.fromkeys(subsets))
    return [s for s in SUBSET_ORDER if s in subsets] + sorted(s for s in subsets if s not in SUBSET_ORDER)


# ------------------------------------------------------------------------------------- probe figures

def plot_layer_curves(table: pd.DataFrame, x: str = "layer", title: str | None = None, *, value: str = "f1_mean",
                      low: str = "f1_ci_low", high: str = "f1_ci_high", reference: tuple[float, str] = (0.5, "chance"),
                      ylim: tuple[float, float] | None = (0, 1.02), ylabel: str = "probe F1 (cross-validated)"):
    """F1 by layer, one line per language with its 95% interval as a band (XCOMPS Fig. 5's form with the
    per-subset table; the subsets-averaged curves are babelprobe's summary).

    `table` is a per-layer probe table (`probe.table`, `layers.csv`: one panel per subset) or
    `language_curves(probe)` (no subset column: one panel, subsets averaged). `x` is "layer" or
    "relative_depth" (to put models of different depth side by side). `value`, `low`, `high`,
    `reference` (a dotted line and its legend label), `ylim` and `ylabel` draw other per-layer
    quantities the same way (Fig. 13's F1 difference)."""
    require(table, ["language", "layer", value, low, high, x], "the per-layer probe table")
    panels = subset_order(table["subset"]) if "subset" in table.columns else [None]
    nrows, ncols = panel_grid(len(panels))
    width = "one" if ncols == 1 else "two"
    height = 2.4 if ncols == 1 else 1.15 + 1.85 * nrows
    fig, axes = figure(width, height, nrows=nrows, ncols=ncols, sharex=True, sharey=True, squeeze=False)
    styles = language_styles(table["language"].unique())
    for ax, panel in zip(axes.flat, panels, strict=False):
        part = table if panel is None else table[table["subset"] == panel]
        for language in styles:
            rows = part[part["language"] == language].sort_values(x)
            if rows.empty:
                continue
            style = styles[language]
            ax.fill_between(rows[x], rows[low], rows[high], color=style["color"], alpha=0.12, linewidth=0)
            ax.plot(rows[x], rows[value], label=language, color=style["color"], linestyle=style["linestyle"],
                    marker=style["marker"], markersize=2.5, markevery=max(1, len(rows) // 6))
        ax.axhline(reference[0], color="0.4", linestyle=CHANCE_STYLE, linewidth=0.8)
        ax.set_title(panel if panel is not None else (title or "F1 by layer, subsets averaged"))
        if ylim is not None:
            ax.set_ylim(*ylim)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("layer" if x == "layer" else "relative depth (layer / L)")
        if x == "layer":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    chance = Line2D([], [], color="0.4", linestyle=CHANCE_STYLE, linewidth=0.8, label=reference[1])
    language_legend(fig, styles, [chance])
    if title and panel is not None:
        fig.suptitle(title)
    return fig


def plot_peak_typology(peaks: pd.DataFrame, title: str | None = "Peak layer by typology"):
    """Peak layer of each language (subsets averaged) with its 95% bootstrap interval, grouped by
    typology class; a black bar marks each class mean (XCOMPS Fig. 6). `peaks` is `language_peaks(probe)`.
    Only languages of XCOMPS Table 3 are drawn (English is not in it; the paper drops it too)."""
    require(peaks, ["language", "peak_layer", "peak_layer_low", "peak_layer_high", "n_layers"], "the peak table")
    fig, ax = figure("one", 2.5)
    draw_peak_classes(ax, peaks)
    if title:
        ax.set_title(title)
    return fig


def draw_peak_classes(ax, peaks: pd.DataFrame, labels: bool = True, markers: dict | None = None,
                      ylabel: str = "peak layer (95% CI)", depth_axis: bool = True, note: bool = True) -> None:
    """Into `ax`: one point per row of `peaks` (a language, or a language × subset group with `markers`
    by subset) at its peak layer with its bootstrap interval, grouped by typology class with a black bar
    at each class mean; languages outside XCOMPS Table 3 are left out (named under the axis if `note`).
    `depth_axis`: a relative-depth scale on the right."""
    table = with_typology(peaks)
    missing = sorted(set(table.loc[~table["in_table3"], "language"]))
    table = table[table["in_table3"]]
    if table.empty:
        raise BabelprobeError("no language of XCOMPS Table 3 in the peak table: the typology figure needs them")
    styles = language_styles(table["language"])
    order = {code: i for i, code in enumerate(styles)}
    table = table.assign(_o=table["language"].map(order)).sort_values(["_o", *(["subset"] if markers else [])])
    classes = [t for t in TYPOLOGIES if t in set(table["typology"])]
    ticks = []
    for c, typology in enumerate(classes):
        group = table[table["typology"] == typology]
        spread = 0.25 if len(group) < 8 else 0.38
        offsets = np.linspace(-spread, spread, len(group)) if len(group) > 1 else np.zeros(1)
        for dx, row in zip(offsets, group.itertuples(), strict=True):
            style = styles[row.language]
            marker = markers.get(row.subset, "o") if markers else style["marker"]
            ax.errorbar(c + dx, row.peak_layer, yerr=[[row.peak_layer - row.peak_layer_low],
                                                      [row.peak_layer_high - row.peak_layer]],
                        fmt=marker, color=style["color"], markersize=4 if labels else 3, capsize=2 if labels else 0,
                        elinewidth=0.8 if labels else 0.5, alpha=1 if labels else 0.8)
            if labels:
                ax.annotate(row.language, (c + dx, row.peak_layer), xytext=(3, 0), textcoords="offset points",
                            fontsize=6, va="center", ha="left")
        mean = group["peak_layer"].mean()
        ax.hlines(mean, c - 0.45, c + 0.45, color="black", linewidth=1.2, zorder=0)
        ticks.append(f"{typology}\nmean {mean:.1f}")
    n_layers = int(table["n_layers"].max())
    ax.set_xticks(range(len(classes)), ticks)
    ax.set_xlim(-0.6, len(classes) - 0.4)
    ax.set_ylim(-0.5, n_layers + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(axis="x", visible=False)
    if depth_axis:
        depth = ax.secondary_yaxis("right", functions=(lambda v: v / n_layers, lambda d: d * n_layers))
        depth.set_ylabel("relative depth")
    if missing and note:
        ax.set_xlabel(f"left out (not in XCOMPS Table 3): {', '.join(missing)}", fontsize=6.5, color="0.35")


def plot_peak_heatmap(peaks: pd.DataFrame, title: str | None = "Peak layer per language and subset"):
    """Peak layer of every language × subset, annotated (XCOMPS Fig. 14); languages grouped by typology.
    `peaks` is `subset_peaks(probe)` or a sweep's `peaks` table."""
    require(peaks, ["language", "subset", "peak_layer", "n_layers"], "the peak table")
    rows, cols = language_order(peaks["language"]), subset_order(peaks["subset"])
    matrix = peaks.pivot_table(index="language", columns="subset", values="peak_layer").reindex(index=rows,
                                                                                               columns=cols)
    n_layers = int(peaks["n_layers"].max())
    fig, ax = figure("one", 0.9 + 0.2 * len(rows))
    image = ax.imshow(matrix.to_numpy(float), cmap=SEQUENTIAL, vmin=0, vmax=n_layers, aspect="auto")
    annotate_cells(ax, image, matrix.to_numpy(float), fmt="{:.0f}", fontsize=6.5)
    ax.set_xticks(range(len(cols)), cols)
    language_ticks(ax, rows, "y")
    fig.colorbar(image, ax=ax, label="peak layer", shrink=0.9, pad=0.02)
    if title:
        ax.set_title(title)
    return fig


def plot_transfer(transfer: pd.DataFrame, peaks: pd.DataFrame | None = None, layer: int | str = "peak",
                  title: str | None = None):
    """Cross-lingual transfer: F1 of a probe trained on one language (rows) and tested on another
    (columns), averaged over subsets; the outlined diagonal is in-language cross-validated F1.

    `layer="peak"` (default) reads each training language's peak layer per subset from `peaks` (chosen
    without looking at the test languages); "best" takes the one layer with the highest mean transfer F1
    (chosen on the test results, so optimistic); a number takes that layer."""
    from babelprobe.probes.crosslingual import at_peaks, transfer_matrix

    require(transfer, ["train_language", "test_language", "subset", "layer", "f1"], "the transfer table")
    if layer == "peak":
        require(peaks, ["language", "subset", "peak_layer"], "the peak table (for transfer at the peak layer)")
        matrix = transfer_matrix(at_peaks(transfer, peaks), layer=None)
        where = "train language's peak layer"
    else:
        matrix = transfer_matrix(transfer, layer=layer)
        where = matrix.index.name.split("(")[-1].rstrip(")")
    order = [code for code in language_order([*matrix.index, *matrix.columns])]
    matrix = matrix.reindex(index=[c for c in order if c in matrix.index], columns=[c for c in order if c in matrix])
    values = matrix.to_numpy(float)
    fig, ax = figure("one", 0.9 + 0.26 * len(matrix))
    # centred on chance: blue cells transfer worse than guessing (the probe's direction flips), red better
    image = ax.imshow(values, cmap=DIVERGING, vmin=0.0, vmax=1.0)
    annotate_cells(ax, image, values, fmt="{:.2f}", fontsize=5.5 if len(matrix) > 8 else 6.5)
    for i, code in enumerate(matrix.index):
        if code in matrix.columns:
            j = list(matrix.columns).index(code)
            ax.add_patch(_outline(j, i))
    language_ticks(ax, list(matrix.columns), "x")
    language_ticks(ax, list(matrix.index), "y")
    ax.set_xlabel("test language")
    ax.set_ylabel("train language")
    bar = fig.colorbar(image, ax=ax, shrink=0.9, pad=0.02)
    bar.set_label("probe F1 (0.5: chance)")
    ax.set_title(title or f"Probe transfer, {where}", fontsize=7.5)
    return fig


# ------------------------------------------------------------------------------------ method figures

def plot_method_bars(items: pd.DataFrame, title: str | None = None):
    """Pair accuracy of meta, direct and neuro per language, with 95% Wilson intervals and the chance
    line at 0.5 (babelprobe's view of XCOMPS Fig. 2's data; the paper's form is `xcomps_fig2`). `items` is the
    per-pair join (`items.csv`): every method is judged on
    the same pairs by the same rule, the acceptable sentence scoring higher (neuro: the out-of-fold
    probe score at each group's peak layer)."""
    present = [m for m in methods.METHODS if f"{m}_correct" in items.columns]
    require(items, ["language", *(f"{m}_correct" for m in present or ["meta"])], "the per-pair table (items.csv)")
    long = pd.concat([items[["language"]].assign(method=m, correct=items[f"{m}_correct"].astype(bool))
                      for m in present], ignore_index=True)
    table = pd.concat([accuracy_table(long, by=("language", "method")),
                       accuracy_table(long.assign(language="all"), by=("language", "method"))], ignore_index=True)
    groups = language_order(items["language"]) + ["all"]
    width = 0.8 / len(present)
    fig, ax = figure("two", 2.3)
    for k, method in enumerate(present):
        rows = table[table["method"] == method].set_index("language").reindex(groups)
        x = np.arange(len(groups)) + (k - (len(present) - 1) / 2) * width
        ax.bar(x, rows["accuracy"], width, color=METHOD_COLORS.get(method), label=method, edgecolor="white",
               linewidth=0.4)
        # clipped at 0: at an accuracy of 0 or 1 the Wilson bound equals it up to float rounding (-1e-16)
        below, above = (rows["accuracy"] - rows["ci_low"]).clip(lower=0), (rows["ci_high"] - rows["accuracy"]).clip(lower=0)
        ax.errorbar(x, rows["accuracy"], yerr=[below, above], fmt="none", ecolor="black", elinewidth=0.7, capsize=1.5)
    ax.axhline(0.5, color="0.3", linestyle=CHANCE_STYLE, linewidth=0.9, label="chance")
    ax.axvline(len(groups) - 1.5, color="0.6", linewidth=0.6)
    ax.set_xticks(range(len(groups)), groups)
    styles = language_styles(groups[:-1])
    for label in ax.get_xticklabels()[:-1]:
        label.set_color(styles[label.get_text()]["color"])
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylim(0, 1.0)
    ax.set_ylabel("pair accuracy (95% CI)")
    ax.grid(axis="x", visible=False)
    n = items.groupby("language").size()
    each = f"{n.min()}" if n.min() == n.max() else f"{n.min()}–{n.max()}"
    ax.set_xlabel(f"language ({each} pairs each, coloured by typology; all: {len(items)} pairs)")
    handles, labels = ax.get_legend_handles_labels()
    order = [labels.index(m) for m in present] + [labels.index("chance")]
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside upper center",
               ncols=len(order), frameon=False)
    if title:
        ax.set_title(title)
    return fig


def plot_method_correlations(summary: pd.DataFrame, correlations: pd.DataFrame | None = None):
    """Each method against each other over the language × subset cells (XCOMPS Fig. 3): meta and direct
    accuracy, neuro F1 at the peak layer; one panel per pair with Pearson r and Spearman ρ and their
    95% intervals. `summary` is `summary.csv`; `correlations` (`correlations.csv`) is computed if absent."""
    require(summary, ["language", "subset", "method", "metric", "value"], "the summary table (summary.csv)")
    if correlations is None:
        correlations = methods.correlations(summary)
    require(correlations, ["method_a", "method_b", "n_cells", "pearson_r", "pearson_low", "pearson_high",
                           "spearman_rho", "spearman_low", "spearman_high"], "the correlation table")
    cells = methods.primary(summary).pivot_table(index=["language", "subset"], columns="method",
                                                 values="value").reset_index()
    pairs = list(correlations[["method_a", "method_b"]].itertuples(index=False, name=None))
    fig, axes = figure("two" if len(pairs) > 1 else "one", 2.55, ncols=len(pairs), squeeze=False)
    styles = language_styles(cells["language"])
    subsets = subset_order(cells["subset"])
    markers = dict(zip(subsets, MARKERS, strict=False))
    for ax, (a, b) in zip(axes.flat, pairs, strict=True):
        for _, row in cells.iterrows():
            ax.scatter(row[a], row[b], s=14, color=styles[row["language"]]["color"],
                       marker=markers.get(row["subset"], "o"), edgecolor="white", linewidth=0.3, alpha=0.9)
        fit_line(ax, cells[a], cells[b])
        stats = correlations[(correlations["method_a"] == a) & (correlations["method_b"] == b)].iloc[0]
        ax.set_title(correlation_text(stats), fontsize=6.5, loc="left")
        ax.set_xlabel(METRIC_LABELS.get(a, a))
        ax.set_ylabel(METRIC_LABELS.get(b, b))
        pad_limits(ax, cells[a], cells[b])
    colours = group_handles(cells["language"])
    colours.append(blank_handle(f"(points: the {len(cells)} language × subset cells)"))
    shapes = [Line2D([], [], linestyle="", marker=markers[s], color="0.35", label=s) for s in subsets]
    ncols = max(len(colours), len(shapes))
    colours += [blank_handle("")] * (ncols - len(colours))
    shapes += [blank_handle("")] * (ncols - len(shapes))
    # legends fill column by column: interleave so the first row is typology, the second subset
    entries = [h for pair in zip(colours, shapes, strict=True) for h in pair]
    fig.legend(handles=entries, loc="outside lower center", ncols=ncols, frameon=False, handletextpad=0.2,
               columnspacing=1.2)
    return fig


# ---------------------------------------------------------------------------------------- helpers

def panel_grid(n: int) -> tuple[int, int]:
    if n <= 1:
        return 1, 1
    if n in (2, 4):
        return n // 2, 2
    return -(-n // 3), 3


def language_ticks(ax, codes: list[str], axis: str) -> None:
    """Heatmap tick labels in their typology colour, with thin white lines between typology classes."""
    styles = language_styles(codes)
    (ax.set_xticks if axis == "x" else ax.set_yticks)(range(len(codes)), codes)
    labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    for label, code in zip(labels, codes, strict=True):
        label.set_color(styles[code]["color"])
        label.set_fontweight("bold")
    classes = [styles[c]["typology"] for c in codes]
    for k in range(1, len(codes)):
        if classes[k] != classes[k - 1]:
            (ax.axvline if axis == "x" else ax.axhline)(k - 0.5, color="white", linewidth=1.5)
    ax.tick_params(length=0)
    ax.grid(False)
    ax.spines[:].set_visible(False)


def _outline(j: int, i: int):
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.0, zorder=3)


def correlation_text(stats) -> str:
    def one(symbol, value, low, high):
        if pd.isna(value):
            return f"{symbol} = n/a (too few cells)"
        return f"{symbol} = {value:.2f} [{low:.2f}, {high:.2f}]"

    return "\n".join([one("Pearson r", stats["pearson_r"], stats["pearson_low"], stats["pearson_high"]),
                      one("Spearman ρ", stats["spearman_rho"], stats["spearman_low"], stats["spearman_high"])])


def fit_line(ax, x: pd.Series, y: pd.Series) -> None:
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3 or np.std(x[keep]) == 0:
        return
    slope, intercept = np.polyfit(x[keep], y[keep], 1)
    xs = np.array([x[keep].min(), x[keep].max()])
    ax.plot(xs, intercept + slope * xs, color="0.4", linewidth=0.8, zorder=0)


def pad_limits(ax, x: pd.Series, y: pd.Series) -> None:
    """Limits a little wider than the data, within [0, 1] (accuracies and F1) plus a margin."""
    for values, setter in ((x, ax.set_xlim), (y, ax.set_ylim)):
        low, high = np.nanmin(values), np.nanmax(values)
        span = max(high - low, 0.1)
        setter(max(-0.02, low - 0.08 * span), min(1.02, high + 0.08 * span))
