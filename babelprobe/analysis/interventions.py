"""Summaries and figures of intervention runs (`babelprobe intervene`): does an edit inside the model (a
probe's direction edited, language neurons switched off) change the model's own judgement of the same
pairs, more than a control edit of the same kind?

    summary = summarize(rows)      # Δ per language × layer × edit × direction, 95% paired bootstrap
    sanity(rows)                   # probe directions: the probe's balanced accuracy after the edit
    write_figures(summary, "figs/", f1_table=probe.table)

Computed from the per-pair rows (`interventions.csv`) alone, whatever their edit source. A readout's
effect on a pair is its value with the edit minus its value without (`correct` as 0/1 for accuracies,
margins in nats for direct and in the meta rule's units); a cell's effect is the mean over its pairs,
with a paired bootstrap interval over pairs (`stats.paired_bootstrap`). Directions: the edit itself
(`probe`: the probe's direction; `neurons`: the selected neurons) and its controls (`random`: random
directions or random unselected neurons, each pair's effect averaged over the draws first, `draw_min`
/ `draw_max` the range of the per-draw means; `shuffled`: a shuffled-label probe's direction);
`probe−random` (`neurons−random`) is each pair's effect minus the random average, so its interval says
whether the edit does more than a random one of the same kind. A steer is the same size along every
direction; an ablation is not: it removes each direction's own component, and on models with large
constant offsets in a few dimensions (Gemma-3-270M) a random unit direction's component is far larger
than the probe's (the rows' `edit_norm`: median 169 against 11 at its peak layers, ablating to zero).
Read the random control of a zero ablation with that in mind; `--ablate-to mean` removes only the
spread along each direction, and the shuffled-label probe is a control of the probe's own kind.
Cells: each language and `all`; each edit (`CONFIG`: source, method, ablate_to, positions, α, the
language switched off); each layer, `peak` pooling every group at its own peak layer (runs with
`--layers peak`), and `all` for edits at no one layer read without a probe (neurons).
"""

from __future__ import annotations

import importlib
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from babelprobe.analysis.figures import CHANCE_STYLE, language_styles, panel_grid
from babelprobe.analysis.peaks import language_order
from babelprobe.analysis.style import PALETTE, figure, save
from babelprobe.errors import BabelprobeError
from babelprobe.stats import paired_bootstrap

# readout: (column with the edit, column without), label
READOUTS = {
    "direct_accuracy": ("direct_correct", "direct_correct_base", "Δ direct accuracy"),
    "direct_margin": ("direct_margin", "direct_margin_base", "Δ direct margin (nats)"),
    "meta_accuracy": ("meta_correct", "meta_correct_base", "Δ meta accuracy"),
    "meta_margin": ("meta_margin", "meta_margin_base", "Δ meta margin"),
    "probe_accuracy": ("probe_correct", "probe_correct_base", "Δ probe pair accuracy"),
    "probe_margin": ("probe_margin", "probe_margin_base", "Δ probe margin"),
}
CONFIG = ["edit_source", "method", "ablate_to", "positions", "alpha", "off"]
CONTROLS = ("random", "shuffled")
DIRECTIONS = ("probe", "random", "shuffled", "probe−random")
# the figures of other edit sources: edit_source -> "module:function", called with the summary's rows of that
# source and returning [(name, draw, caption)] like `figure_plan`
SOURCE_FIGURES = {"neurons": "babelprobe.analysis.neurons:figure_plan",
                  "sae_features": "babelprobe.analysis.sae:intervene_figure_plan"}
COLORS = {"probe": PALETTE[0], "neurons": PALETTE[0], "shuffled": PALETTE[1], "random": "0.45"}


def _rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with their text columns as text (CSV reads an empty `ablate_to` back as NaN), and the
    columns of every edit source (rows of runs made before edit sources: probe directions)."""
    rows = rows.copy()
    if "edit_source" not in rows.columns:
        rows["edit_source"] = "probe_directions"
    for column in ("ablate_to", "positions", "method", "direction", "layer_rule", "off", "edit_source"):
        rows[column] = rows[column].astype(object).fillna("").astype(str) if column in rows.columns else ""
    if "layer" not in rows.columns:
        rows["layer"] = np.nan
    return rows


def targets(directions) -> list[str]:
    """The edits themselves among `directions` (not a control, not a difference): probe, neurons, ..."""
    return [d for d in dict.fromkeys(directions) if d not in CONTROLS and "−" not in str(d)]


def readouts_in(rows: pd.DataFrame) -> list[str]:
    return [name for name, (after, before, _) in READOUTS.items()
            if after in rows.columns and before in rows.columns and rows[after].notna().any()]


def summarize(rows: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per language × layer cell × edit × direction × readout: `value` (mean effect), `ci_low`,
    `ci_high`, `before`, `after` (mean readout without and with the edit), `n` pairs (module docstring)."""
    rows = _rows(rows)
    keys = ["pair_id", "language", "layer", "layer_rule", *CONFIG]
    effects = []
    for name in readouts_in(rows):
        after, before, _ = READOUTS[name]
        part = rows[keys + ["direction", "draw"]].assign(
            readout=name, after=rows[after].astype(float), before=rows[before].astype(float))
        effects.append(part.assign(delta=part["after"] - part["before"]))
    if not effects:
        raise BabelprobeError("the intervention rows have no readout columns (direct_*, meta_*, probe_*)")
    long = pd.concat(effects, ignore_index=True)
    scopes = [long.assign(layers=[str(int(x)) if pd.notna(x) else "all" for x in long["layer"]])]
    peak = long[long["layer_rule"] == "peak"]
    if len(peak):
        scopes.append(peak.assign(layers="peak", layer=np.nan))
    long = pd.concat(scopes, ignore_index=True)
    long = pd.concat([long, long.assign(language="all")], ignore_index=True)
    cell = ["language", "layers", "layer_rule", *CONFIG, "readout"]
    out = []
    for values, part in long.groupby(cell, sort=False, dropna=False):
        out += _cell_rows(dict(zip(cell, values)), part, n_boot, seed)
    table = pd.DataFrame(out)
    order = {code: i for i, code in enumerate([*language_order(table.loc[table["language"] != "all", "language"]),
                                               "all"])}
    return table.sort_values(["language", "layers", "layer_rule", *CONFIG, "readout", "direction"],
                             key=lambda c: c.map(order) if c.name == "language" else
                             (c.map(_layers_rank) if c.name == "layers" else c), ignore_index=True)


def _layers_rank(value: str) -> float:
    return -2.0 if value == "all" else -1.0 if value == "peak" else float(value)


def _cell_rows(cell: dict, part: pd.DataFrame, n_boot: int, seed: int) -> list[dict]:
    rng = np.random.default_rng([seed, zlib.crc32(repr(sorted(cell.items())).encode())])
    layer = part["layer"].iloc[0] if cell["layers"] not in ("peak", "all") else np.nan
    per_pair = part.groupby(["direction", "pair_id"])[["delta", "before", "after"]].mean()
    present = list(per_pair.index.get_level_values(0).unique())
    out = []
    for direction in [*targets(present), *(c for c in CONTROLS if c in present)]:
        d = per_pair.loc[direction]
        low, high = paired_bootstrap(d["delta"].to_numpy(), rng, n_boot) if n_boot else (np.nan, np.nan)
        row = {**cell, "layer": layer, "direction": direction, "value": d["delta"].mean(), "ci_low": low,
               "ci_high": high, "before": d["before"].mean(), "after": d["after"].mean(), "n": len(d)}
        if direction == "random":
            draws = part[part["direction"] == "random"].groupby("draw")["delta"].mean()
            row.update(n_draws=len(draws), draw_min=draws.min(), draw_max=draws.max())
        out.append(row)
    for target in targets(present) if "random" in present else ():
        excess = (per_pair.loc[target, "delta"] - per_pair.loc["random", "delta"]).dropna()
        low, high = paired_bootstrap(excess.to_numpy(), rng, n_boot) if n_boot else (np.nan, np.nan)
        out.append({**cell, "layer": layer, "direction": f"{target}−random", "value": excess.mean(), "ci_low": low,
                    "ci_high": high, "n": len(excess)})
    for row in out:
        row["interval"] = "paired bootstrap over pairs" if n_boot else ""
    return out


def sanity(rows: pd.DataFrame) -> pd.DataFrame:
    """The built-in check: per probe group × layer × edit × direction, the probe's balanced accuracy on
    the group's items without and with the edit (`at_chance`: within 1.96·0.5/√n of 0.5, n items) and
    the cross-validated F1 of a probe refitted on the edited states (ablate, leace; for the probe's own
    direction the erased direction is refitted in each fold on its training rows, `run._crossfit_f1`)."""
    rows = _rows(rows)
    rows = rows[rows["edit_source"] == "probe_directions"]
    if "probe_bacc" not in rows.columns or rows.empty:
        return pd.DataFrame(columns=["language", "subset", "layer", *CONFIG, "direction", "draw", "probe_bacc"])
    keys = ["language", "subset", "layer", *CONFIG, "direction", "draw"]
    table = rows.groupby(keys, sort=False)[["n_items", "probe_bacc_base", "probe_bacc", "refit_f1_base",
                                            "refit_f1"]].first().reset_index()
    table["at_chance"] = (table["probe_bacc"] - 0.5).abs() <= 1.96 * 0.5 / np.sqrt(table["n_items"])
    return table


def sanity_lines(table: pd.DataFrame) -> list[str]:
    """One line per ablation method: how many groups × layers the probe's own direction brought to chance."""
    lines = []
    if table.empty:
        return lines
    own = table[(table["direction"] == "probe") & table["method"].isin(["ablate", "leace"])]
    for (method, alpha), part in own.groupby(["method", "alpha"]):
        refit = part["refit_f1"].mean()
        lines.append(f"{method} (α={alpha:g}) along the probe's direction: probe balanced accuracy "
                     f"{part['probe_bacc_base'].mean():.3f} → {part['probe_bacc'].mean():.3f} (chance 0.5); at chance "
                     f"in {int(part['at_chance'].sum())} of {len(part)} groups × layers; refitted probe F1 "
                     f"{part['refit_f1_base'].mean():.3f} → {refit:.3f}")
    return lines


# ------------------------------------------------------------------------------------------- figures

def _pick(summary: pd.DataFrame, method: str, alpha: float | None) -> tuple[pd.DataFrame, float]:
    """The summary rows of one method at one α (default: the largest |α|, positive on ties)."""
    part = summary[summary["method"] == method]
    if alpha is None:
        alphas = sorted(part["alpha"].unique(), key=lambda a: (abs(a), a))
        alpha = alphas[-1]
    return part[part["alpha"] == alpha], float(alpha)


def _edit_name(part: pd.DataFrame, method: str, alpha: float) -> str:
    ablate_to = str(part["ablate_to"].iloc[0]) if "ablate_to" in part.columns and len(part) else ""
    detail = f" to {ablate_to}" if method == "ablate" and ablate_to else ""
    positions = part["positions"].iloc[0] if len(part) else "all"
    return f"{method}{detail}, α = {alpha:g}, {positions} tokens"


def _panels(languages: list[str]):
    nrows, ncols = panel_grid(len(languages))
    ncols = min(4, max(ncols, -(-len(languages) // max(nrows, 1))))
    nrows = -(-len(languages) // ncols)
    fig, axes = figure("two" if ncols > 1 else "one", 0.9 + 1.55 * nrows, nrows=nrows, ncols=ncols, sharex=True,
                       sharey=True, squeeze=False)
    for ax in axes.flat[len(languages):]:
        ax.set_visible(False)
    return fig, axes


def _draw_cell_series(ax, part: pd.DataFrame, x: str, offset: float, connect: bool = True) -> None:
    """Probe (blue), random (grey bars, and a band when `connect`) and shuffled (hollow) against `x`; lines
    join the points only when `connect` (the same pairs at every x: not so for groups at their own peaks)."""
    for direction, shift, style in (("random", -offset, dict(color=COLORS["random"], marker="s", mfc="white")),
                                    ("shuffled", offset, dict(color=COLORS["shuffled"], marker="^", mfc="white")),
                                    ("probe", 0.0, dict(color=COLORS["probe"], marker="o"))):
        rows = part[part["direction"] == direction].sort_values(x)
        if rows.empty:
            continue
        xs = rows[x].to_numpy(float) + shift
        if direction == "random" and connect and len(rows) > 1:
            ax.fill_between(rows[x], rows["ci_low"], rows["ci_high"], color=COLORS["random"], alpha=0.18, linewidth=0)
        ax.errorbar(xs, rows["value"], yerr=[rows["value"] - rows["ci_low"], rows["ci_high"] - rows["value"]],
                    markersize=3, linewidth=0.9 if connect and len(rows) > 1 else 0, elinewidth=0.8, capsize=1.5,
                    **style)
    ax.axhline(0, color="0.3", linestyle=CHANCE_STYLE, linewidth=0.8)


def _legend(fig) -> None:
    handles = [Line2D([], [], color=COLORS["probe"], marker="o", markersize=3, label="probe direction"),
               Line2D([], [], color=COLORS["random"], marker="s", mfc="white", markersize=3,
                      label="random directions (mean, 95% CI)"),
               Line2D([], [], color=COLORS["shuffled"], marker="^", mfc="white", markersize=3,
                      label="shuffled-label probe")]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, frameon=False)


def plot_effect_by_layer(summary: pd.DataFrame, readout: str = "direct_accuracy", method: str | None = None,
                         alpha: float | None = None):
    """Effect of the edit by layer, one panel per language (and all languages): the probe's direction with
    its 95% interval, the random directions' band, the shuffled-label probe."""
    method = method or summary["method"].iloc[0]
    part, alpha = _pick(summary[(summary["readout"] == readout) & (summary["layers"] != "peak")], method, alpha)
    if part.empty:
        raise BabelprobeError(f"no {readout} rows for method {method} in the summary")
    languages = [*language_order(part.loc[part["language"] != "all", "language"]), "all"]
    languages = [lang for lang in languages if (part["language"] == lang).any()]
    connect = not (part["layer_rule"] == "peak").any()
    fig, axes = _panels(languages)
    for ax, language in zip(axes.flat, languages, strict=False):
        _draw_cell_series(ax, part[part["language"] == language], "layer", 0.18, connect)
        ax.set_title(language if language != "all" else "all languages")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[-1]:
        ax.set_xlabel("layer")
    for ax in axes[:, 0]:
        ax.set_ylabel(READOUTS[readout][2])
    fig.suptitle(f"{READOUTS[readout][2]} by layer: {_edit_name(part, method, alpha)}")
    _legend(fig)
    return fig


def plot_dose_response(summary: pd.DataFrame, readout: str = "direct_margin", method: str = "steer",
                       layers: str | None = None):
    """Effect against α, one panel per language, at the `layers` cell ("peak" when the run used the peak
    layers, else the middle one of the layers run)."""
    part = summary[(summary["readout"] == readout) & (summary["method"] == method)]
    if part.empty or part["alpha"].nunique() < 2:
        raise BabelprobeError(f"a dose–response curve needs {method} at two α or more")
    if layers is None:
        cells = sorted(part["layers"].unique(), key=_layers_rank)
        layers = "peak" if "peak" in cells else cells[len(cells) // 2]
    part = part[part["layers"] == layers]
    languages = [lang for lang in [*language_order(part.loc[part["language"] != "all", "language"]), "all"]
                 if (part["language"] == lang).any()]
    spread = float(np.ptp(part["alpha"])) or 1.0
    fig, axes = _panels(languages)
    for ax, language in zip(axes.flat, languages, strict=False):
        _draw_cell_series(ax, part[part["language"] == language], "alpha", 0.02 * spread)
        ax.set_title(language if language != "all" else "all languages")
    for ax in axes[-1]:
        ax.set_xlabel("α (standard deviations along the direction)")
    for ax in axes[:, 0]:
        ax.set_ylabel(READOUTS[readout][2])
    where = "each group's peak layer" if layers == "peak" else f"layer {layers}"
    fig.suptitle(f"Dose–response, {method} at {where}")
    _legend(fig)
    return fig


def language_f1(f1_table: pd.DataFrame) -> pd.DataFrame:
    """language, layer, f1 (the sweep's cross-validated F1, mean over subsets), is_peak (the layer of the
    language's highest mean F1)."""
    table = f1_table.groupby(["language", "layer"], as_index=False)["f1_mean"].mean().rename(columns={"f1_mean": "f1"})
    best = table.loc[table.groupby("language")["f1"].idxmax(), ["language", "layer"]]
    table["is_peak"] = table.set_index(["language", "layer"]).index.isin(best.set_index(["language", "layer"]).index)
    return table


def plot_f1_vs_effect(summary: pd.DataFrame, f1_table: pd.DataFrame, readout: str = "direct_accuracy",
                      method: str | None = None, alpha: float | None = None):
    """One point per language × layer: the probe's cross-validated F1 there against the causal effect of the
    edit along its direction beyond random directions (probe − random, 95% interval); filled markers with a
    black edge are each language's peak F1 layer."""
    method = method or summary["method"].iloc[0]
    part, alpha = _pick(summary[(summary["readout"] == readout) & (summary["layers"] != "peak") &
                                (summary["language"] != "all") & (summary["direction"] == "probe−random")],
                        method, alpha)
    if part.empty:
        raise BabelprobeError(f"no probe−random {readout} rows for method {method} (random directions needed)")
    points = part.merge(language_f1(f1_table), on=["language", "layer"], how="inner")
    if points.empty:
        raise BabelprobeError("the probe table has no F1 at the layers of the interventions")
    styles = language_styles(points["language"].unique())
    fig, ax = figure("one", 2.9)
    for language in language_order(points["language"]):
        rows = points[points["language"] == language]
        style = styles[language]
        ax.errorbar(rows["f1"], rows["value"], yerr=[rows["value"] - rows["ci_low"], rows["ci_high"] - rows["value"]],
                    linestyle="none", color=style["color"], marker=style["marker"], markersize=3.5, elinewidth=0.6,
                    capsize=1.2, alpha=0.85, label=language)
        peak = rows[rows["is_peak"]]
        ax.plot(peak["f1"], peak["value"], linestyle="none", marker=style["marker"], markersize=5.5,
                markerfacecolor=style["color"], markeredgecolor="black", markeredgewidth=0.9)
    ax.axhline(0, color="0.3", linestyle=CHANCE_STYLE, linewidth=0.8)
    ax.set_xlabel("probe F1 at the layer (cross-validated)")
    ax.set_ylabel(f"{READOUTS[readout][2]}, probe − random")
    r = points[["f1", "value"]].corr().iloc[0, 1] if len(points) > 2 else np.nan
    ax.set_title(f"Probe F1 vs causal effect ({_edit_name(part, method, alpha)})" +
                 (f"\nPearson r = {r:.2f} over {len(points)} language × layer cells" if np.isfinite(r) else ""),
                 fontsize=7.5)
    handles = [Line2D([], [], linestyle="none", color=styles[c]["color"], marker=styles[c]["marker"], markersize=3.5,
                      label=c) for c in language_order(points["language"])]
    handles.append(Line2D([], [], linestyle="none", marker="o", markersize=5, markerfacecolor="white",
                          markeredgecolor="black", label="peak F1 layer"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(6, len(handles)), frameon=False,
               handletextpad=0.2, columnspacing=0.7)
    return fig


# name pattern -> caption
CAPTIONS = {
    "effect_by_layer": "{label} under the edit ({edit}) by layer, one panel per language: the probe's direction "
                       "(95% paired bootstrap interval over pairs), the mean of the random directions of equal "
                       "size (grey: band and bars, 95% interval), the shuffled-label probe's direction.",
    "dose_response": "{label} against the steering strength α (standard deviations of the states along the "
                     "direction), at {where}; probe, random (grey) and shuffled-label directions as above.",
    "f1_vs_effect": "Probe F1 (cross-validated) against the causal effect beyond random directions ({label}, "
                    "probe − random, 95% interval), one point per language × layer ({edit}); black-edged: each "
                    "language's peak F1 layer.",
}


def figure_plan(summary: pd.DataFrame, f1_table: pd.DataFrame | None) -> list[tuple[str, object, str]]:
    """[(file name, a function drawing it, caption)] for what the summary has: by layer, dose–response and
    F1-vs-effect figures of probe directions; the figures other edit sources declare (`SOURCE_FIGURES`)."""
    plan = []
    for source, where in SOURCE_FIGURES.items():
        if (summary["edit_source"] == source).any():
            module, _, function = where.partition(":")
            plan += getattr(importlib.import_module(module), function)(summary[summary["edit_source"] == source])
    summary = summary[summary["edit_source"] == "probe_directions"]
    present = set(summary["readout"])
    layered = summary[summary["layers"] != "peak"]
    for method in summary["method"].drop_duplicates():
        part, alpha = _pick(summary, method, None)
        edit = _edit_name(part, method, alpha)
        for readout in ("direct_accuracy", "meta_accuracy", "probe_accuracy"):
            if readout in present and len(layered[(layered["method"] == method) & (layered["readout"] == readout)]):
                plan.append((f"effect_by_layer_{method}_{readout}",
                             lambda m=method, r=readout: plot_effect_by_layer(summary, r, m),
                             CAPTIONS["effect_by_layer"].format(label=READOUTS[readout][2], edit=edit)))
        if summary.loc[summary["method"] == method, "alpha"].nunique() >= 2:
            where = "each group's peak layer" if (summary["layers"] == "peak").any() else "the middle layer run"
            for readout in ("direct_margin", "meta_margin"):
                if readout in present:
                    plan.append((f"dose_response_{method}_{readout}",
                                 lambda m=method, r=readout: plot_dose_response(summary, r, m),
                                 CAPTIONS["dose_response"].format(label=READOUTS[readout][2], where=where)))
        primary = next((r for r in ("direct_accuracy", "meta_accuracy") if r in present), None)
        if f1_table is not None and primary and (summary["direction"] == "probe−random").any() and len(layered):
            plan.append((f"f1_vs_effect_{method}", lambda m=method, r=primary: plot_f1_vs_effect(summary, f1_table, r, m),
                         CAPTIONS["f1_vs_effect"].format(label=READOUTS[primary][2], edit=edit)))
    return plan


def write_figures(summary: pd.DataFrame, out: str | Path, f1_table: pd.DataFrame | None = None,
                  prefix: str = "") -> dict[str, list[Path]]:
    """Draw every figure of `figure_plan` into `out` (PDF + PNG); {name: paths}."""
    written = {}
    for name, draw, _ in figure_plan(summary, f1_table):
        written[prefix + name] = save(draw(), Path(out) / f"{prefix}{name}")
    return written


# -------------------------------------------------------------------------------- the corpus readout

# per edit source: the change drawn, its label, the figure's name and title (interventions.corpus_readout)
CORPUS_MATRICES = {"neurons": ("delta_ppl", "Δ perplexity (off − base)", "ppl_change",
                               "Perplexity change with one language's neurons off (Tang et al.)"),
                   "sae_features": ("delta_nll", "Δ cross-entropy, nats (ablated − base)", "ce_change",
                                    "Cross-entropy change with one language's SAE features ablated (Deng et al.)")}


def corpus_matrix(table: pd.DataFrame, value: str, direction: str) -> pd.DataFrame:
    """Edited language (rows) × evaluated language (columns) of `value` for one direction (the edit, or
    `random`: the mean over the control draws)."""
    part = table[table["direction"] == direction]
    grid = part.pivot_table(index="off", columns="language", values=value, aggfunc="mean")
    rows, columns = language_order(list(grid.index)), language_order(list(grid.columns))
    return grid.reindex(index=rows, columns=columns)


def plot_corpus_matrix(table: pd.DataFrame):
    """The language × language matrix of the corpus readout (`CORPUS_MATRICES`): each edited language's change
    on every evaluated language, the random controls' mean in brackets."""
    from babelprobe.analysis.figures import language_ticks
    from babelprobe.analysis.style import DIVERGING, text_colour

    source = str(table["edit_source"].iloc[0])
    value, label, _, title = CORPUS_MATRICES.get(source, CORPUS_MATRICES["neurons"])
    direction = next(d for d in table["direction"].unique() if d != "random")
    grid = corpus_matrix(table, value, direction)
    control = corpus_matrix(table, value, "random") if (table["direction"] == "random").any() else None
    values = grid.to_numpy(float)
    fig, ax = figure("one", 1.0 + 0.3 * len(grid.index))
    limit = max(1e-9, float(np.nanmax(np.abs(values))))
    image = ax.imshow(values, cmap=DIVERGING, vmin=-limit, vmax=limit, aspect="auto")
    for (i, j), cell in np.ndenumerate(values):
        if np.isnan(cell):
            continue
        extra = control.to_numpy(float)[i, j] if control is not None else np.nan
        text = f"{cell:+.2g}" + (f"\n(r {extra:+.2g})" if np.isfinite(extra) else "")
        ax.text(j, i, text, ha="center", va="center", fontsize=4, color=text_colour(image, cell))
    language_ticks(ax, list(grid.columns), "x")
    language_ticks(ax, list(grid.index), "y")
    ax.set_xlabel("evaluated language")
    ax.set_ylabel("edited language")
    ax.set_title(title, fontsize=7)
    fig.colorbar(image, ax=ax, shrink=0.8, label=label)
    return fig


def write_corpus_figures(table: pd.DataFrame, out: str | Path) -> dict[str, list[Path]]:
    """The corpus readout's matrix (`ppl_change` or `ce_change`) into `out`; {} for an empty table."""
    if table is None or table.empty:
        return {}
    name = CORPUS_MATRICES.get(str(table["edit_source"].iloc[0]), CORPUS_MATRICES["neurons"])[2]
    return {name: save(plot_corpus_matrix(table), Path(out) / name)}


# ------------------------------------------------------------------------------------------- the report

def find_runs(results: str | Path) -> list[Path]:
    """Intervention run directories in or one level below `results` (those holding interventions.csv)."""
    results = Path(results)
    return sorted({p.parent for p in [*results.glob("interventions.csv"), *results.glob("*/interventions.csv")]})


def report_section(results: str | Path, out: str | Path, f1_table: pd.DataFrame | None = None,
                   n_boot: int = 1000, seed: int = 0):
    """The report's interventions part for the runs under `results`: (figures {name: paths}, tables
    {name: path}, markdown text). Empty when there is no run."""
    from babelprobe.tables import read_table, write_table

    runs = find_runs(results)
    if not runs:
        return {}, {}, ""
    rows = pd.concat([_rows(read_table(run / "interventions.csv")) for run in runs], ignore_index=True)
    rows = rows.drop_duplicates(["pair_id", "layer", *CONFIG, "direction", "draw"])
    summary, checks = summarize(rows, n_boot, seed), sanity(rows)
    out = Path(out)
    tables = {"intervene_summary": write_table(summary, out / "intervene_summary.csv"),
              "intervene_sanity": write_table(checks, out / "intervene_sanity.csv")}
    figures, captions = {}, {}
    for name, draw, caption in figure_plan(summary, f1_table):
        name = name if name.startswith("lape_") else "intervene_" + name
        figures[name] = save(draw(), out / name)
        captions[name] = caption
    parts = ["## Interventions",
             "Edits inside the model (`babelprobe intervene`, runs: " + ", ".join(f"`{run}`" for run in runs) +
             "). Effect = readout with the edit − without, mean over pairs, 95% paired bootstrap intervals; random: "
             "the mean over the random controls (directions of equal size, or as many random unselected neurons "
             "per layer)."]
    for source in summary["edit_source"].drop_duplicates():
        parts.append(effect_table(summary[summary["edit_source"] == source]).to_markdown(index=False,
                                                                                         disable_numparse=True))
    lines = sanity_lines(checks)
    if lines:
        parts.append("Sanity check (the probe on the re-extracted states):\n\n" + "\n".join(f"- {x}" for x in lines))
    for name, paths in figures.items():
        png = next(p for p in paths if p.suffix == ".png")
        parts.append(f"**{name}** ({png.with_suffix('.pdf').name}, {png.name}): {captions[name]}\n\n![{name}]({png.name})")
    return figures, tables, "\n\n".join(parts) + "\n"


def edit_label(cell: dict) -> str:
    """A cell's edit in words: "ablate zero α=1", "neurons off zh"."""
    if cell["edit_source"] == "neurons":
        return f"neurons off {cell['off']}"
    ablate_to = f" {cell['ablate_to']}" if cell["ablate_to"] else ""
    return f"{cell['method']}{ablate_to} α={float(cell['alpha']):g}"


def effect_table(summary: pd.DataFrame, readouts=("direct_accuracy", "direct_margin", "meta_accuracy")) -> pd.DataFrame:
    """Per language × edit × readout of one edit source, at the peak layers (or every layer when none
    were peak runs): the edit's effect (a column named after it: probe, neurons), the random
    controls', the shuffled-label probe's, and the edit's minus the random ones, each with its interval."""
    if "readout" not in summary.columns:  # a run that read the corpus alone (--readouts ppl) has no summary
        return pd.DataFrame()
    part = summary[summary["readout"].isin(readouts)]
    part = part[part["layers"] == "peak"] if (part["layers"] == "peak").any() else part
    if part.empty:
        return pd.DataFrame()
    names = targets(part["direction"])
    fmt = lambda r: "" if r is None or pd.isna(r["value"]) else f"{r['value']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"  # noqa: E731
    shown = [*names, *(c for c in CONTROLS if (part["direction"] == c).any()), *(f"{t}−random" for t in names)]
    cells = ["language", "layers", "layer_rule", *CONFIG, "readout"]
    rows = []
    for key, cell in part.groupby(cells, sort=False, dropna=False):
        cell_of = dict(zip(cells, key))
        by = {d: cell[cell["direction"] == d].iloc[0] if (cell["direction"] == d).any() else None for d in shown}
        base = next((by[t] for t in names if by[t] is not None), None)
        base = base if base is not None else next(v for v in by.values() if v is not None)
        row = {"language": cell_of["language"], "layer": cell_of["layers"], "edit": edit_label(cell_of),
               "readout": cell_of["readout"], "pairs": int(base["n"]),
               "before": f"{base['before']:.3f}" if pd.notna(base.get("before")) else ""}
        row.update({d.replace("−", " − "): fmt(by[d]) for d in shown})
        rows.append(row)
    return pd.DataFrame(rows)
