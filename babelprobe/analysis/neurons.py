"""Figures and the report of a language-neuron run (`babelprobe neurons`, LAPE) and of switching the
neurons off (`babelprobe intervene --method neurons`).

    plot_lape_layers(counts)       # neurons.csv: selected neurons per layer × language
    plot_lape_overlap(table)       # lape.csv: Jaccard index of the languages' selected neuron sets
    plot_deactivation(summary)     # intervene's summary: Δ accuracy, language switched off × evaluated
    report("neu/", "neu/figures")  # `babelprobe report --results neu/`: the figures, tables, report.md

Read from the files alone (lape.csv, neurons.csv, neurons.json; intervention runs in or one level below
the directory), so the analysis layer needs no model code.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.analysis.figures import language_ticks
from babelprobe.analysis.peaks import language_order
from babelprobe.analysis.style import DIVERGING, SEQUENTIAL, annotate_cells, figure, note, save, text_colour
from babelprobe.errors import BabelprobeError
from babelprobe.runs import LAYOUTS

CAPTIONS = {
    "lape_layers": "Language-specific neurons (LAPE, Tang et al. 2024) per layer and language: the selected neurons "
                   "(lowest LAPE, top rate {rate:g}) whose activation probability in the language exceeds τ_bar; a "
                   "neuron shared by languages counts for each.",
    "lape_overlap": "Overlap of the languages' selected neuron sets: Jaccard index |A ∩ B| / |A ∪ B| (diagonal: 1).",
    "lape_deactivation": "Δ accuracy when one language's neurons are switched off (rows) on each evaluated "
                         "language's pairs (columns): mean over pairs of accuracy with − without; below each value "
                         "the random control's (as many random unselected neurons per layer, mean over draws); "
                         "outlined: the 95% paired bootstrap interval of neurons − random excludes 0.",
}


def _languages(values) -> list[str]:
    return language_order([v for v in values if v])


def plot_lape_layers(counts: pd.DataFrame, top_rate: float | None = None):
    """Heatmap of neurons.csv at one top rate (default its first): layers (rows) × languages."""
    rate = counts["top_rate"].iloc[0] if top_rate is None else top_rate
    part = counts[np.isclose(counts["top_rate"], rate)]
    grid = part.pivot_table(index="layer", columns="language", values="n_selected", aggfunc="sum")
    languages = _languages(grid.columns)
    grid = grid[languages].sort_index()
    fig, ax = figure("one", 0.9 + 0.17 * len(grid))
    image = ax.imshow(grid.to_numpy(float), cmap=SEQUENTIAL, aspect="auto")
    annotate_cells(ax, image, grid.to_numpy(float), fmt="{:.0f}", fontsize=5)
    language_ticks(ax, languages, "x")
    ax.set_yticks(range(len(grid)), grid.index.astype(int))
    ax.set_ylabel("layer (block's MLP)")
    totals = grid.sum(axis=0).astype(int)
    # the totals wrapped under the title: one long line made the figure far wider than its heatmap
    totals_text = textwrap.fill("totals: " + ", ".join(f"{c} {totals[c]}" for c in languages), 56)
    ax.set_title(f"Selected neurons per layer (top rate {rate:g})\n{totals_text}", fontsize=7)
    fig.colorbar(image, ax=ax, shrink=0.8, label="neurons")
    return fig


def jaccard_matrix(table: pd.DataFrame, languages: list[str] | None = None) -> pd.DataFrame:
    """languages × languages Jaccard index |A ∩ B| / |A ∪ B| of the languages' selected neuron sets
    (lape.csv rows: `selected`, `layer`, `neuron`, `languages`)."""
    chosen = table[table["selected"].astype(bool)]
    sets: dict[str, set] = {code: set() for code in languages or ()}
    for layer, neuron, codes in chosen[["layer", "neuron", "languages"]].itertuples(index=False):
        for code in filter(None, str(codes if pd.notna(codes) else "").split(",")):
            if languages is None or code in sets:
                sets.setdefault(code, set()).add((int(layer), int(neuron)))
    codes = languages or _languages(sets)
    out = pd.DataFrame(np.nan, index=codes, columns=codes)
    for a in codes:
        for b in codes:
            union = sets[a] | sets[b]
            out.loc[a, b] = len(sets[a] & sets[b]) / len(union) if union else np.nan
    return out


def plot_lape_overlap(table: pd.DataFrame, languages: list[str] | None = None):
    """Heatmap of `jaccard_matrix`: how many of two languages' selected neurons they share."""
    matrix = jaccard_matrix(table, _languages(languages) if languages else None)
    codes = list(matrix.index)
    if not codes:  # no language has a selected neuron (LAPE's bar can be above every score: a random model's)
        fig, ax = figure("one", 1.2)
        ax.set_axis_off()
        note(ax, "No language has a selected neuron: no overlap to show")
        ax.set_title("Shared language neurons (Jaccard index)", fontsize=8)
        return fig
    fig, ax = figure("one", 0.9 + 0.2 * len(codes))
    image = ax.imshow(matrix.to_numpy(float), cmap=SEQUENTIAL, vmin=0, vmax=1)
    annotate_cells(ax, image, matrix.to_numpy(float), fmt="{:.2f}", fontsize=5)
    language_ticks(ax, codes, "x")
    language_ticks(ax, codes, "y")
    ax.set_title("Shared language neurons (Jaccard index)", fontsize=8)
    fig.colorbar(image, ax=ax, shrink=0.8, label="Jaccard")
    return fig


def deactivation_matrix(summary: pd.DataFrame, readout: str = "direct_accuracy") -> dict[str, pd.DataFrame]:
    """{"neurons", "random", "excess_low", "excess_high"}: off (rows) × evaluated language (columns) of one
    readout from intervene's summary (neurons rows; the `all` layers cell, else the peak one)."""
    part = summary[(summary["edit_source"] == "neurons") & (summary["readout"] == readout) &
                   (summary["language"] != "all")]
    if part.empty:
        raise BabelprobeError(f"no neurons rows for {readout} in the summary")
    scope = next(s for s in ("all", "peak", *part["layers"].unique()) if (part["layers"] == s).any())
    part = part[part["layers"] == scope]
    rows, columns = _languages(part["off"].unique()), _languages(part["language"].unique())

    def grid(direction: str, value: str = "value") -> pd.DataFrame:
        cells = part[part["direction"] == direction]
        table = cells.pivot_table(index="off", columns="language", values=value, aggfunc="first")
        return table.reindex(index=rows, columns=columns)

    return {"neurons": grid("neurons"), "random": grid("random"), "excess_low": grid("neurons−random", "ci_low"),
            "excess_high": grid("neurons−random", "ci_high")}


def plot_deactivation(summary: pd.DataFrame):
    """One heatmap per readout (direct, meta, probe accuracy, those present): Δ accuracy with one language's
    neurons switched off (rows) on each evaluated language (columns), the random control beside it."""
    from babelprobe.analysis.figures import _outline

    readouts = [r for r in ("direct_accuracy", "meta_accuracy", "probe_accuracy")
                if ((summary["readout"] == r) & (summary["edit_source"] == "neurons")).any()]
    if not readouts:
        raise BabelprobeError("no neurons rows with an accuracy readout in the summary")
    grids = {r: deactivation_matrix(summary, r) for r in readouts}
    first = grids[readouts[0]]["neurons"]
    # one readout per row, so that each gets the page's width: ten languages side by side leave a cell
    # too narrow for its value and the control's when the readouts share a row
    fig, axes = figure("two", len(readouts) * (0.8 + 0.42 * len(first.index)), nrows=len(readouts), squeeze=False)
    limit = max(0.05, max(np.nanmax(np.abs(g["neurons"].to_numpy(float))) for g in grids.values()))
    for ax, readout in zip(axes[:, 0], readouts, strict=True):
        g = grids[readout]
        values = g["neurons"].to_numpy(float)
        image = ax.imshow(values, cmap=DIVERGING, vmin=-limit, vmax=limit, aspect="auto")
        for (i, j), value in np.ndenumerate(values):
            if np.isnan(value):
                continue
            control = g["random"].to_numpy(float)[i, j]
            ax.text(j, i, f"{value:+.2f}\n(r {control:+.2f})" if np.isfinite(control) else f"{value:+.2f}",
                    ha="center", va="center", fontsize=4.5, color=text_colour(image, value))
            low, high = g["excess_low"].to_numpy(float)[i, j], g["excess_high"].to_numpy(float)[i, j]
            if np.isfinite(low) and (low > 0 or high < 0):
                ax.add_patch(_outline(j, i))
        language_ticks(ax, list(g["neurons"].columns), "x")
        language_ticks(ax, list(g["neurons"].index), "y")
        ax.set_title(readout.replace("_", " "), fontsize=8)
        ax.set_ylabel("switched off")
    axes[-1][0].set_xlabel("evaluated language")
    fig.colorbar(image, ax=list(axes[:, 0]), shrink=0.8, label="Δ accuracy (with − without)")
    fig.suptitle("Switching language neurons off", fontsize=9)
    return fig


def figure_plan(summary: pd.DataFrame) -> list[tuple[str, object, str]]:
    """The figures of an intervention summary's neurons rows (`analysis.interventions.SOURCE_FIGURES`)."""
    return [("lape_deactivation", lambda: plot_deactivation(summary), CAPTIONS["lape_deactivation"])]


def write_figures(table: pd.DataFrame, counts: pd.DataFrame, out: str | Path) -> dict[str, list[Path]]:
    """lape_layers and lape_overlap of a neurons run into `out` (PDF + PNG)."""
    out = Path(out)
    return {"lape_layers": save(plot_lape_layers(counts), out / "lape_layers"),
            "lape_overlap": save(plot_lape_overlap(table), out / "lape_overlap")}


# ------------------------------------------------------------------------------------------- the report

def report(path: str | Path, out: str | Path, n_boot: int = 1000, seed: int = 0):
    """The report of a neurons directory (`babelprobe report --results neu/`): its figures, the number of
    selected neurons per language and layer, their overlap, and the interventions run in or below it
    (`intervene --method neurons --out neu/deact/`: lape_deactivation and the effect table)."""
    import json

    from babelprobe.analysis.interventions import report_section
    from babelprobe.analysis.report import Report
    from babelprobe.tables import atomic_path, read_table, write_table

    path, out = Path(path), Path(out)
    manifest = json.loads((path / LAYOUTS["neurons"].manifest).read_text(encoding="utf-8"))
    selection = manifest.get("selection", {})
    table, counts = read_table(path / "lape.csv"), read_table(path / "neurons.csv")
    table["languages"] = table["languages"].fillna("").astype(str)
    languages = _languages(selection.get("languages") or counts["language"].unique())
    result = Report(out=out)
    result.figures = write_figures(table, counts, out)
    rate = float(counts["top_rate"].iloc[0])
    per_language = (counts[np.isclose(counts["top_rate"], rate)].pivot_table(index="layer", columns="language",
                                                                              values="n_selected", aggfunc="sum"))
    per_language = per_language[languages]
    overlap = jaccard_matrix(table, languages)
    result.tables["lape_per_layer"] = write_table(per_language.reset_index(), out / "lape_per_layer.csv")
    result.tables["lape_overlap"] = write_table(overlap.rename_axis("language").reset_index(), out / "lape_overlap.csv")
    figures, tables, section = report_section(path, out, None, n_boot, seed)
    result.figures.update(figures)
    result.tables.update(tables)
    tau, bar = selection.get("tau"), selection.get("bar")
    n_tokens = selection.get("n_tokens", {})
    totals = per_language.sum(axis=0).astype(int)
    parts = [f"# babelprobe report: {path}",
             f"Language-specific neurons of {manifest.get('model', '?')} (fingerprint {manifest.get('fingerprint')}) "
             f"by LAPE (Tang et al. 2024; `babelprobe neurons`): {int(table['selected'].sum())} neurons selected "
             f"(top rate {rate:g} of {len(table)}), τ = {tau:.4g} and τ_bar = {bar:.4g}; tokens counted: " +
             ", ".join(f"{c} {n_tokens.get(c, '?')}" for c in languages) + "." if tau is not None else "",
             "## Selected neurons per language and layer",
             "A neuron shared by languages counts for each. Totals: " +
             ", ".join(f"{c} {totals[c]}" for c in languages) + ".",
             per_language.reset_index().to_markdown(index=False),
             "## Overlap between languages (Jaccard index of the selected neuron sets)",
             overlap.round(3).rename_axis("language").reset_index().to_markdown(index=False)]
    for name in ("lape_layers", "lape_overlap"):
        png = out / f"{name}.png"
        caption = CAPTIONS[name].format(rate=rate)
        parts.append(f"**{name}** ({name}.pdf, {name}.png): {caption}\n\n![{name}]({png.name})")
    if section:
        parts.append(section.replace("## Interventions", "## Switching neurons off", 1))
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text("\n\n".join(p for p in parts if p) + "\n", encoding="utf-8")
    return result
