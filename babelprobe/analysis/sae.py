"""The report of a `babelprobe sae` directory: its figures, summary tables and report.md, computed from
its tables alone (features.csv, fit.csv, sparse_probe.csv, ablate.csv).

    report("sae/", "sae/figures")       # what `babelprobe report --results sae/` writes

Figures:
  - sae_monolinguality: each language's most specific features (highest ν) as rows, the languages as
    columns, each feature's mean activation divided by its largest over the languages (a feature
    specific to one language is one bright cell on its row);
  - sae_fit: FVU and L0 per language, over every token but BOS and over the last-token states, with the
    published L0 of the SAE when known (a log scale where the two kinds of states lie far apart);
  - sae_vs_dense: sparse-probe F1 by the number of features k (mean over language × subset groups, each
    language's mean as a thin line) against the dense probe's F1 on the same folds;
  - sae_ablation: per language, the mean change of the direct margin when its own features are removed
    and when random feature sets are (95% paired bootstrap intervals; the interventions runner's own
    summary and rows are in OUT/ablate/).
Tables: sae_top_features.csv (each language's top features), sae_probe_summary.csv (F1 by k and the
dense F1, mean over groups), sae_ablation.csv (the mean change of the direct margin and accuracy when a
language's features are removed, language set and random sets, with 95% paired bootstrap intervals over
pairs; `random−language`: each pair's random-set change, averaged over draws, minus its language-set
change).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.analysis.figures import CHANCE_STYLE, language_styles, require
from babelprobe.analysis.peaks import language_order
from babelprobe.analysis.style import PALETTE, SEQUENTIAL, figure, save
from babelprobe.stats import paired_bootstrap
from babelprobe.tables import atomic_path, read_table, write_table

FIGURES = ("sae_monolinguality", "sae_fit", "sae_vs_dense", "sae_ablation")
COLUMNS = {"features.csv": ["layer", "feature", "language", "mean_act", "freq", "nu", "rank"],
           "fit.csv": ["layer", "language", "fvu", "l0", "l0_published", "n_tokens"],
           "sparse_probe.csv": ["group", "layer", "k", "f1_mean", "dense_f1"],
           "ablate.csv": ["pair_id", "language", "subset", "feature_set", "method", "margin", "margin_base", "correct"]}


def read_tables(path: str | Path) -> dict[str, pd.DataFrame]:
    path = Path(path)
    return {name.removesuffix(".csv"): require(read_table(path / name), columns, str(path / name))
            for name, columns in COLUMNS.items()}


# ------------------------------------------------------------------------------------------- tables

def top_features(features: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """Each language's `n` most specific features: language, rank, feature, nu, mean_act, freq."""
    own = features[features["rank"] <= n].sort_values(["language", "rank"])
    return own[["language", "rank", "feature", "nu", "mean_act", "freq"]].reset_index(drop=True)


def probe_summary(table: pd.DataFrame) -> pd.DataFrame:
    """F1 by k, mean and standard deviation over groups, with the dense probe's mean F1."""
    grouped = table.groupby("k")
    return pd.DataFrame({"f1_mean": grouped["f1_mean"].mean(), "f1_sd": grouped["f1_mean"].std(),
                         "dense_f1": grouped["dense_f1"].mean(), "groups": grouped.size()}).reset_index()


def ablation_summary(rows: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per language and "all": the mean change (with − without the edit) of the direct margin and of the
    accuracy, for the language's own features and the random sets, and random − language per pair."""
    if rows.empty:
        return pd.DataFrame()
    rows = rows.assign(d_margin=rows["margin"] - rows["margin_base"],
                       d_correct=rows["correct"].astype(float) - (rows["margin_base"] > 0).astype(float),
                       kind=np.where(rows["feature_set"] == "language", "language", "random"))
    per_pair = rows.groupby(["language", "pair_id", "kind"])[["d_margin", "d_correct"]].mean().unstack("kind")
    out = []
    rng = np.random.default_rng(seed)
    for language in [*language_order(rows["language"].unique()), "all"]:
        part = per_pair if language == "all" else per_pair.loc[[language]]
        for readout in ("d_margin", "d_correct"):
            series = {kind: part[(readout, kind)].dropna() for kind in ("language", "random")
                      if (readout, kind) in part.columns}
            if "language" in series and "random" in series:
                both = part[[(readout, "language"), (readout, "random")]].dropna()
                series["random−language"] = both[(readout, "random")] - both[(readout, "language")]
            for kind, values in series.items():
                low, high = paired_bootstrap(values.to_numpy(), rng, n_boot) if n_boot else (np.nan, np.nan)
                out.append({"language": language, "readout": "margin" if readout == "d_margin" else "accuracy",
                            "feature_set": kind, "effect": float(values.mean()), "ci_low": low, "ci_high": high,
                            "n_pairs": len(values)})
    return pd.DataFrame(out)


def fit_warning(fit: pd.DataFrame) -> str | None:
    """A warning when the SAE reconstructs the tokens of the stats pass worse than their language's mean
    state (FVU above 1 over all of them), as an SAE trained on last-token states alone does: the
    token-level tables then describe states outside what it was trained on."""
    if "states" not in fit.columns:
        return None
    tokens = fit[(fit["states"] == "tokens") & (fit["language"] == "all")]["fvu"]
    if not len(tokens) or not float(tokens.iloc[0]) > 1:
        return None
    last = fit[(fit["states"] == "last") & (fit["language"] == "all")]["fvu"]
    trained = f", against {float(last.iloc[0]):.2f} on the last-token states" if len(last) else ""
    return (f"FVU {float(tokens.iloc[0]):.2f} over every token but BOS{trained}: the SAE reconstructs those tokens "
            "worse than their language's mean state (an SAE from `sae train` has seen last-token states only), so "
            "features.csv describes states outside its training data; a published SAE (`sae fetch`) reads every token")


# ------------------------------------------------------------------------------------------ figures

def plot_monolinguality(features: pd.DataFrame, per_language: int = 3):
    """sae_monolinguality (module docstring)."""
    languages = language_order(features["language"].unique())
    chosen = []
    for language in languages:
        own = features[(features["language"] == language) & (features["rank"] <= per_language)].sort_values("rank")
        chosen += [(language, int(f)) for f in own["feature"] if int(f) not in [c[1] for c in chosen]]
    grid = features.pivot_table(index="feature", columns="language", values="mean_act", aggfunc="first")
    values = np.array([[grid.loc[f, lang] if lang in grid.columns else np.nan for lang in languages]
                       for _, f in chosen], dtype=float)
    peak = np.nanmax(values, axis=1, keepdims=True)
    shown = np.divide(values, peak, out=np.zeros_like(values), where=peak > 0)
    fig, ax = figure("two", height=max(2.2, 0.16 * len(chosen) + 0.9))
    image = ax.imshow(shown, aspect="auto", cmap=SEQUENTIAL, vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks(range(len(languages)), languages)
    ax.set_yticks(range(len(chosen)), [f"#{f} ({lang})" for lang, f in chosen], fontsize=5)
    ax.grid(False)
    ax.set_xlabel("mean activation over the language's tokens")
    ax.set_ylabel(f"each language's top {per_language} features by ν")
    fig.colorbar(image, ax=ax, label="÷ the feature's largest", shrink=0.8)
    ax.set_title(f"Language-specific SAE features, layer {int(features['layer'].iloc[0])}")
    return fig


def plot_fit(fit: pd.DataFrame):
    """sae_fit (module docstring)."""
    languages = [*language_order(fit.loc[fit["language"] != "all", "language"].unique()), "all"]
    kinds = [k for k in ("tokens", "last") if "states" not in fit.columns or k in set(fit["states"])] \
        if "states" in fit.columns else [None]
    labels = {"tokens": "every token but BOS", "last": "last-token states", None: "tokens"}
    fig, axes = figure("two", height=2.4, ncols=2)
    width = 0.8 / len(kinds)
    x = np.arange(len(languages))
    for i, kind in enumerate(kinds):
        part = (fit if kind is None else fit[fit["states"] == kind]).set_index("language").reindex(languages)
        for ax, column in zip(axes, ("fvu", "l0")):
            ax.bar(x + (i - (len(kinds) - 1) / 2) * width, part[column], width, color=PALETTE[i], label=labels[kind])
    published = fit["l0_published"].dropna()
    if len(published):
        axes[1].axhline(float(published.iloc[0]), color="black", linestyle=CHANCE_STYLE, linewidth=0.8,
                        label="published L0")
    axes[0].axhline(1.0, color="grey", linestyle=CHANCE_STYLE, linewidth=0.8)
    for ax, column, label in zip(axes, ("fvu", "l0"), ("FVU (around the language's mean)",
                                                      "L0 (features firing per state)")):
        ax.set_xticks(x, languages, rotation=90)
        ax.set_ylabel(label)
        values = fit[column].to_numpy(float)
        values = values[np.isfinite(values) & (values > 0)]
        if len(values) and values.max() > 10 * values.min():  # token and last-token fits far apart: both visible
            ax.set_yscale("log")
    # below the panels: the bars fill both of them
    fig.legend(*axes[1].get_legend_handles_labels(), loc="outside lower center", ncol=3, frameon=False, fontsize=6)
    fig.suptitle(f"SAE fit per language, layer {int(fit['layer'].iloc[0])}")
    return fig


def plot_sparse_vs_dense(table: pd.DataFrame):
    """sae_vs_dense (module docstring)."""
    fig, ax = figure("one")
    languages = language_order(table["language"].unique()) if "language" in table.columns else []
    styles = language_styles(languages) if languages else {}
    for language in languages:
        part = table[table["language"] == language].groupby("k")["f1_mean"].mean()
        ax.plot(part.index, part.values, color=styles[language]["color"], linewidth=0.5, alpha=0.6)
    summary = probe_summary(table)
    se = summary["f1_sd"] / np.sqrt(summary["groups"])
    ax.fill_between(summary["k"], summary["f1_mean"] - 1.96 * se, summary["f1_mean"] + 1.96 * se,
                    color=PALETTE[0], alpha=0.2, linewidth=0)
    ax.plot(summary["k"], summary["f1_mean"], color=PALETTE[0], marker="o", markersize=3, label="sparse probe (mean)")
    dense = table.drop_duplicates("group")["dense_f1"]
    ax.axhline(dense.mean(), color=PALETTE[3], linestyle="--", label=f"dense probe ({dense.mean():.2f})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(summary["k"], [str(k) for k in summary["k"]])
    ax.set_xlabel("k (SAE features the probe reads)")
    ax.set_ylabel("F1 (label 1), cross-validated")
    ax.set_ylim(0, 1)
    ax.legend(frameon=False, fontsize=6, loc="lower right")
    ax.set_title(f"Sparse vs dense probes, layer {int(table['layer'].iloc[0])}")
    return fig


def plot_ablation(summary: pd.DataFrame):
    """sae_ablation (module docstring), from `ablation_summary`."""
    part = summary[(summary["readout"] == "margin") & summary["feature_set"].isin(["language", "random"])]
    languages = [code for code in dict.fromkeys(part["language"])]
    fig, ax = figure("two", height=2.3)
    x = np.arange(len(languages))
    for i, (kind, label) in enumerate((("language", "the language's own features"),
                                       ("random", "random features that fire on it (mean of draws)"))):
        rows = part[part["feature_set"] == kind].set_index("language").reindex(languages)
        ax.bar(x + (i - 0.5) * 0.38, rows["effect"], 0.38, color=PALETTE[0] if kind == "language" else "0.6",
               yerr=[rows["effect"] - rows["ci_low"], rows["ci_high"] - rows["effect"]], error_kw={"linewidth": 0.7},
               label=label)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(x, languages)
    ax.set_ylabel("Δ direct margin (nats)")
    ax.legend(frameon=False, fontsize=6)
    ax.set_title("SAE features removed at their layer: change of the direct margin of the same pairs")
    return fig


def intervene_figure_plan(summary: pd.DataFrame) -> list[tuple[str, object, str]]:
    """sae_ablation drawn from an intervention summary's SAE-feature rows (`intervene --method sae`;
    `analysis.interventions.SOURCE_FIGURES`): the `features` and `random` directions' direct-margin effects."""
    part = summary[summary["readout"] == "direct_margin"]
    kinds = part["direction"].map({"features": "language", "random": "random"})
    table = pd.DataFrame({"language": part["language"], "readout": "margin", "feature_set": kinds,
                          "effect": part["value"], "ci_low": part["ci_low"], "ci_high": part["ci_high"]})
    table = table.dropna(subset=["feature_set"])
    if table.empty:
        return []
    caption = ("Δ direct margin (nats, with − without) when each language's most specific SAE features are removed "
               "at their layer, and when random feature sets are (mean of draws); 95% paired bootstrap intervals.")
    return [("sae_ablation", lambda: plot_ablation(table), caption)]


# ------------------------------------------------------------------------------------------- report

def report(path: str | Path, out: str | Path, n_boot: int = 1000, seed: int = 0):
    """Write the figures, the summary tables and report.md (last) of the sae directory `path` into `out`."""
    from babelprobe.analysis.report import Report

    path, out = Path(path), Path(out)
    tables = read_tables(path)
    result = Report(out=out)
    summaries = {"sae_top_features": top_features(tables["features"]),
                 "sae_probe_summary": probe_summary(tables["sparse_probe"]),
                 "sae_ablation": ablation_summary(tables["ablate"], n_boot, seed)}
    for name, table in summaries.items():
        result.tables[name] = write_table(table, out / f"{name}.csv")
    for name, draw, table in (("sae_monolinguality", plot_monolinguality, tables["features"]),
                              ("sae_fit", plot_fit, tables["fit"]),
                              ("sae_vs_dense", plot_sparse_vs_dense, tables["sparse_probe"]),
                              ("sae_ablation", plot_ablation, summaries["sae_ablation"])):
        if table.empty:
            result.skipped[name] = "its table is empty"
            continue
        result.figures[name] = save(draw(table), out / name)
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text(markdown(path, tables, summaries, result), encoding="utf-8")
    return result


def markdown(path: Path, tables: dict, summaries: dict, result) -> str:
    fit = tables["fit"]
    parts = [f"# babelprobe SAE report: {path}",
             f"Layer {int(fit['layer'].iloc[0])}. Tables: features.csv, fit.csv, sparse_probe.csv, ablate.csv.",
             "## Fit per language", "FVU around each language's mean state and L0 (features firing per state), "
             "over every token but BOS (`tokens`) and over the last-token states (`last`).",
             _md(fit.round(3)), *(f"**Note:** {w}." for w in [fit_warning(fit)] if w),
             "## Most language-specific features", "Monolinguality ν = the feature's mean activation over the "
             "language's tokens minus its mean over the other languages (Deng et al.).",
             _md(summaries["sae_top_features"].round(4)),
             "## Sparse vs dense probes", "Mean F1 over language × subset groups of probes on the k features "
             "with the largest class-mean gap in each training fold, and of the dense probe on the same folds.",
             _md(summaries["sae_probe_summary"].round(3))]
    if not summaries["sae_ablation"].empty:
        parts += ["## Feature ablation", "Mean change (with − without) of the direct margin (nats) and accuracy "
                  "when each language's most specific features are removed at the SAE's layer, against random "
                  "feature sets that fire on the language; 95% paired bootstrap intervals over pairs.",
                  _md(summaries["sae_ablation"].round(4))]
    parts += ["## Figures", *[f"![{name}]({name}.png)" for name in result.figures]]
    parts += [f"- {name}: skipped, {why}" for name, why in result.skipped.items()]
    return "\n\n".join(parts) + "\n"


def _md(table: pd.DataFrame) -> str:
    return table.to_markdown(index=False) if len(table) else "(none)"
