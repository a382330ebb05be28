"""Summaries, figures and the report of `babelprobe patch` (activation patching, babelprobe/patching).

    translation_summary(rows)   # config × exp × variant × layer × measure: mean over pairs, 95% bootstrap interval
    translation_switches(summ)  # the layers where patching moved the output language, and the concept
    pairs_summary(rows)         # control × source × language × layer: mean and median recovery, 95% intervals, gain
    recovery_onsets(summ, peaks)# per language: first and last layer with recovery ≥ 0.5, beside the probe's peak
    plot_translation(summ)      # probabilities by patched layer, baselines dashed   (figure patch_translation)
    plot_recovery(summ)         # recovery by layer with the controls                 (figure patch_recovery)
    plot_vs_probe(onsets)       # last layer j with r ≥ 0.5 against the probe peak    (figure patch_vs_probe)
    report(path, out)           # `babelprobe report --results PATCH_DIR`

Everything is computed from the run's tables (translation.csv, pairs.csv), so the report redraws what the
run drew.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from babelprobe.analysis.figures import require
from babelprobe.analysis.style import LINESTYLES, PALETTE, figure, save
from babelprobe.runs import LAYOUTS
from babelprobe.stats import paired_bootstrap
from babelprobe.tables import atomic_path, read_table, write_table

MANIFEST = LAYOUTS["patch"].manifest
MEASURES = ("p_src_concept_tgt_lang", "p_tgt_concept_tgt_lang", "p_src_concept_src_lang", "p_tgt_concept_src_lang",
            "p_latent")  # = patching.translation.MEASURES (tested)
LABELS = {"p_src_concept_tgt_lang": "source concept, target language",
          "p_tgt_concept_tgt_lang": "target concept, target language",
          "p_src_concept_src_lang": "source concept, source language",
          "p_tgt_concept_src_lang": "target concept, source language",
          "p_latent": "either concept, latent language"}
COLORS = dict(zip(MEASURES, (PALETTE[3], PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[4])))
CONTROL_LABELS = {"source": "patch (source language)", "target": "control: target language (upper bound)",
                  "other": "control: another concept (lower bound)"}
CONTROL_COLORS = {"source": PALETTE[0], "target": PALETTE[2], "other": PALETTE[3]}
THRESHOLD = 0.5  # recovery that counts as "the concept moved" (patch_vs_probe)


# ------------------------------------------------------------------------------------------ summaries

def _mean_rows(values: np.ndarray, rng, n_boot: int) -> dict:
    values = values[~np.isnan(values)]
    if not len(values):
        return {"mean": np.nan, "ci_low": np.nan, "ci_high": np.nan, "n": 0}
    low, high = paired_bootstrap(values, rng, n_boot) if n_boot else (np.nan, np.nan)
    return {"mean": float(values.mean()), "ci_low": low, "ci_high": high, "n": len(values)}


def translation_summary(rows: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per config × exp × variant × layer × measure (the five probabilities and the two
    baselines): the mean over pairs and its 95% bootstrap interval (pairs resampled), `n` pairs."""
    require(rows, ["config", "exp", "variant", "pair_idx", "layer", *MEASURES, "base_src", "base_tgt"], "translation rows")
    rng = np.random.default_rng(seed)
    out = []
    for (config, exp, variant, layer), group in rows.groupby(["config", "exp", "variant", "layer"], sort=False):
        for measure in (*MEASURES, "base_src", "base_tgt"):
            values = group[measure].to_numpy(float)
            if np.isnan(values).all():
                continue
            out.append({"config": config, "exp": exp, "variant": variant, "layer": int(layer), "measure": measure,
                        **_mean_rows(values, rng, n_boot)})
    return pd.DataFrame(out)


def translation_switches(summary: pd.DataFrame) -> pd.DataFrame:
    """Per config × exp × variant, from the mean curves: the layers where patching moved the output language
    (exp1: more probability on the source's output language than on the target's) and where it moved the
    concept (the source concept more probable than the target concept, in either language), with the first
    and last of them. Layers as in docs/design.md (block outputs 1..L)."""
    rows = []
    for (config, exp, variant), group in summary.groupby(["config", "exp", "variant"], sort=False):
        mean = group.pivot_table(index="layer", columns="measure", values="mean").sort_index()
        mean = mean.reindex(columns=list(MEASURES), fill_value=0.0).fillna(0.0)
        get = mean.__getitem__
        moves = {"concept": (get("p_src_concept_tgt_lang") + get("p_src_concept_src_lang"))
                 > (get("p_tgt_concept_tgt_lang") + get("p_tgt_concept_src_lang"))}
        if exp == "exp1":
            moves["language"] = ((get("p_src_concept_src_lang") + get("p_tgt_concept_src_lang"))
                                 > (get("p_src_concept_tgt_lang") + get("p_tgt_concept_tgt_lang")))
        for what, moved in moves.items():
            layers = [int(x) for x in moved.index[moved.to_numpy()]]
            rows.append({"config": config, "exp": exp, "variant": variant, "moves": what,
                         "layers": ",".join(map(str, layers)), "first_layer": layers[0] if layers else np.nan,
                         "last_layer": layers[-1] if layers else np.nan, "n_layers": len(mean)})
    return pd.DataFrame(rows)


def _median_rows(values: np.ndarray, rng, n_boot: int) -> dict:
    """The median and its 95% percentile bootstrap interval (units resampled)."""
    values = values[~np.isnan(values)]
    if not len(values):
        return {"median": np.nan, "median_low": np.nan, "median_high": np.nan}
    if not n_boot:
        return {"median": float(np.median(values)), "median_low": np.nan, "median_high": np.nan}
    medians = np.median(values[rng.integers(0, len(values), size=(n_boot, len(values)))], axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return {"median": float(np.median(values)), "median_low": float(low), "median_high": float(high)}


def pairs_summary(rows: pd.DataFrame, min_gap: float = 0.5, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per control × source × language × layer (and `all` languages), over the pairs the model
    decides correctly by at least `min_gap` nats (s_good − s_bad ≥ min_gap: a pair it gets wrong has no
    recovery to measure, and its ratio's sign flips): the mean recovery and its 95% bootstrap interval,
    the median recovery and its interval (a ratio of margins is heavy-tailed), the gain in nats the patch
    adds to the unacceptable item (s_patched − s_bad: mean and median), `n` pairs and `n_left_out` (those
    under the gap). A control no pair could run (no other concept) has no rows (`empty_controls`)."""
    require(rows, ["pair_id", "language", "source", "layer", "control", "s_good", "s_bad", "s_patched", "recovery"],
            "pairs rows")
    rng = np.random.default_rng(seed)
    gap = rows["s_good"] - rows["s_bad"]
    kept = rows[gap >= min_gap].assign(gain=lambda r: r["s_patched"] - r["s_bad"])
    left_out = rows[gap < min_gap]
    out = []
    for language_rows, language in [(kept[kept["language"] == lang], lang) for lang in sorted(kept["language"].unique())] \
            + [(kept, "all")]:
        for (control, layer), group in language_rows.groupby(["control", "layer"], sort=False):
            recovery = group["recovery"].to_numpy(float)
            if np.isnan(recovery).all():
                continue
            source = group["source"].iloc[0] if language != "all" or control != "target" else "target"
            dropped = left_out[(left_out["control"] == control) & (left_out["layer"] == layer)
                               & ((left_out["language"] == language) if language != "all" else True)]
            gain = group["gain"].to_numpy(float)
            out.append({"control": control, "source": source, "language": language, "layer": int(layer),
                        **_mean_rows(recovery, rng, n_boot), **_median_rows(recovery, rng, n_boot),
                        "gain_mean": float(np.nanmean(gain)), "gain_median": float(np.nanmedian(gain)),
                        "n_left_out": len(dropped)})
    columns = ["control", "source", "language", "layer", "mean", "ci_low", "ci_high", "n", "median", "median_low",
               "median_high", "gain_mean", "gain_median", "n_left_out"]
    return pd.DataFrame(out, columns=columns).sort_values(["control", "language", "layer"], kind="stable",
                                                           ignore_index=True)


def empty_controls(rows: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """One line per control that ran but has no recovery to show (every pair's control state missing, or no
    pair passed --min-gap): said once, and left out of the figure's legend."""
    lines = []
    for control in ("target", "other"):
        ran = rows is not None and (rows["control"] == control).any()
        if ran and not (summary["control"] == control).any():
            lines.append(f"control {control!r} ({CONTROL_LABELS[control]}) is empty: "
                         + ("no pair had another concept to draw (too few items)" if control == "other"
                            else "no pair passed --min-gap"))
    return lines


def recovery_onsets(summary: pd.DataFrame, peaks: pd.DataFrame | None = None,
                    threshold: float = THRESHOLD) -> pd.DataFrame:
    """Per language (the patch itself, control `source`): the first and last layer whose median recovery is
    at least `threshold`, the layer of the highest median recovery and its value, and (with `peaks`, a table
    of language and peak_layer) the probe's peak layer. The median, not the mean: a ratio of margins is
    heavy-tailed (one pair whose good and bad scores barely differ moves a mean anywhere)."""
    rows = []
    patch = summary[(summary["control"] == "source") & (summary["language"] != "all")]
    for language, group in patch.groupby("language", sort=True):
        group = group.sort_values("layer")
        above = group.loc[group["median"] >= threshold, "layer"].astype(int).tolist()
        best = group.loc[group["median"].idxmax()] if group["median"].notna().any() else None
        rows.append({"language": language, "first_layer": above[0] if above else np.nan,
                     "last_layer": above[-1] if above else np.nan,
                     "best_layer": int(best["layer"]) if best is not None else np.nan,
                     "best_recovery": float(best["median"]) if best is not None else np.nan})
    out = pd.DataFrame(rows, columns=["language", "first_layer", "last_layer", "best_layer", "best_recovery"])
    if peaks is not None and len(out):
        out = out.merge(peaks[["language", "peak_layer"]].rename(columns={"peak_layer": "probe_peak_layer"}),
                        on="language", how="left")
    return out


def probe_peaks(compare: str | Path, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per language: the peak layer of the probe's subset-averaged F1 curve in a compare directory."""
    from babelprobe.analysis.peaks import language_peaks
    from babelprobe.analysis.report import load_results

    results = load_results(compare)
    if results.probe is None:
        return pd.DataFrame(columns=["language", "peak_layer"])
    return language_peaks(results.probe, n_boot=n_boot, seed=seed)


# ------------------------------------------------------------------------------------------- figures

def _panels(n: int, columns: int = 3, sharey: bool = True):
    columns = min(columns, n)
    rows = int(np.ceil(n / columns))
    fig, axes = figure("two", height=1.8 * rows + 0.6, nrows=rows, ncols=columns, squeeze=False, sharey=sharey)
    axes = list(axes.flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def plot_translation(summary: pd.DataFrame):
    """One panel per configuration (exp1; exp2's mean and first-pair variants): the mean probability of each
    concept in each language at the target's next token, by patched layer, 95% bootstrap bands over pairs;
    dashed: the unpatched baselines (the source prompt's own answer, the target prompt's)."""
    require(summary, ["config", "exp", "variant", "layer", "measure", "mean", "ci_low", "ci_high"], "translation summary")
    panels = list(summary[["config", "exp", "variant"]].drop_duplicates().itertuples(index=False, name=None))
    fig, axes = _panels(len(panels), columns=min(3, len(panels)), sharey=False)
    for ax, (config, exp, variant) in zip(axes, panels):
        part = summary[(summary["config"] == config) & (summary["exp"] == exp) & (summary["variant"] == variant)]
        for measure in MEASURES:
            curve = part[part["measure"] == measure].sort_values("layer")
            if curve.empty:
                continue
            ax.plot(curve["layer"], curve["mean"], color=COLORS[measure], label=LABELS[measure])
            ax.fill_between(curve["layer"], curve["ci_low"], curve["ci_high"], color=COLORS[measure], alpha=0.2,
                            linewidth=0)
        for measure, color, label in (("base_src", COLORS["p_src_concept_src_lang"], "baseline: source prompt"),
                                      ("base_tgt", COLORS["p_tgt_concept_tgt_lang"], "baseline: target prompt")):
            base = part.loc[part["measure"] == measure, "mean"]
            if len(base):
                ax.axhline(float(base.mean()), color=color, linestyle="--", linewidth=0.9, label=label)
        ax.set_title(f"{exp}" + (f", {variant} of the sources" if variant == "mean" else
                                 ", first source" if variant == "first" else "") + f"\n{config}", fontsize=7)
        ax.set_xlabel("patched layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("probability of the next token")
    handles = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=3, frameon=False)
    return fig


def plot_recovery(summary: pd.DataFrame, language_order: list[str] | None = None):
    """One panel per target language (and all together): median recovery by the first patched layer j
    (layers j..L written), the patch and its controls, 95% bootstrap bands of the median over pairs; 0 = the
    unacceptable item's score, 1 = the acceptable one's."""
    require(summary, ["control", "language", "layer", "median", "median_low", "median_high"], "pairs summary")
    languages = language_order or sorted(set(summary["language"]) - {"all"})
    languages = [lang for lang in languages if lang in set(summary["language"])] + ["all"]
    fig, axes = _panels(len(languages), columns=4)
    for ax, language in zip(axes, languages):
        part = summary[summary["language"] == language]
        for control in ("source", "target", "other"):
            curve = part[part["control"] == control].sort_values("layer")
            if curve.empty or curve["median"].isna().all():
                continue  # an empty control draws nothing and has no legend entry (empty_controls says why)
            ax.plot(curve["layer"], curve["median"], color=CONTROL_COLORS[control], label=CONTROL_LABELS[control],
                    linestyle=LINESTYLES[0] if control == "source" else LINESTYLES[1])
            ax.fill_between(curve["layer"], curve["median_low"], curve["median_high"], color=CONTROL_COLORS[control],
                            alpha=0.2, linewidth=0)
        for level in (0, 1):
            ax.axhline(level, color="#777777", linewidth=0.6, linestyle=":")
        source = part.loc[part["control"] == "source", "source"]
        ax.set_title(f"{language}" + (f" ← {source.iloc[0]}" if len(source) and language != "all" else " languages"))
        ax.set_xlabel("first patched layer j (j..L)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("recovery")
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=3, frameon=False)
    return fig


def plot_vs_probe(onsets: pd.DataFrame):
    """Per language: the last layer j whose median recovery still reaches 0.5 against the probe's peak layer (a
    compare directory's), the diagonal dotted. The patch writes layers j..L, so recovery falls as j grows and
    the first such layer is 1 whenever any is: the last one says how deep the source state still moves the
    concept."""
    require(onsets, ["language", "last_layer", "probe_peak_layer"], "recovery onsets")
    fig, ax = figure("one")
    data = onsets.dropna(subset=["last_layer", "probe_peak_layer"])
    ax.scatter(data["probe_peak_layer"], data["last_layer"], color=PALETTE[0], s=14, zorder=3)
    for row in data.itertuples():
        ax.annotate(row.language, (row.probe_peak_layer, row.last_layer), fontsize=6, xytext=(3, 2),
                    textcoords="offset points")
    values = pd.concat([onsets["last_layer"], onsets["probe_peak_layer"]]).dropna()
    if len(values):
        low, high = float(values.min()) - 1, float(values.max()) + 1
        ax.plot([low, high], [low, high], color="#777777", linestyle=":", linewidth=0.8)
    missing = onsets.loc[onsets["last_layer"].isna(), "language"].tolist()
    if missing:
        ax.set_title(f"never ≥ {THRESHOLD}: {', '.join(missing)}", fontsize=7)
    ax.set_xlabel("probe peak layer (compare)")
    ax.set_ylabel(f"last j (patched j..L) with recovery ≥ {THRESHOLD}", fontsize=7)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def translation_figures(summary: pd.DataFrame, folder) -> dict[str, list]:
    return {"patch_translation": save(plot_translation(summary), Path(folder) / "patch_translation")}


def pairs_figures(summary: pd.DataFrame, onsets: pd.DataFrame | None, folder) -> dict[str, list]:
    """patch_recovery, and patch_vs_probe when there are probe peaks; none when no pair passed --min-gap."""
    folder = Path(folder)
    if summary.empty:
        return {}
    written = {"patch_recovery": save(plot_recovery(summary), folder / "patch_recovery")}
    if onsets is not None and "probe_peak_layer" in onsets and onsets["probe_peak_layer"].notna().any():
        written["patch_vs_probe"] = save(plot_vs_probe(onsets), folder / "patch_vs_probe")
    return written


# -------------------------------------------------------------------------------------------- report

def report(path, out, n_boot: int = 1000, seed: int = 0):
    """`babelprobe report --results PATCH_DIR`: the summaries (from the rows, with `n_boot` and `seed`), the
    figures and a report.md with the layer tables, for whichever protocols the directory holds."""
    from babelprobe.analysis.report import Report
    from babelprobe.errors import BabelprobeError

    path, out = Path(path), Path(out)
    if not (path / "translation.csv").exists() and not (path / "pairs.csv").exists():
        raise BabelprobeError(f"{path} holds no finished patching run (no translation.csv or pairs.csv); run "
                              "`babelprobe patch --protocol translation|pairs --out DIR` into it first")
    state = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    # each protocol's settings: those of its rows ("stages") and those of its summaries ("summaries")
    stages = {name: {**record, **state.get("summaries", {}).get(name, {})}
              for name, record in state.get("stages", {}).items()}
    result = Report(out=out)
    lines = [f"# babelprobe report: activation patching in {path}", "",
             f"- model: `{state.get('model')}` (fingerprint `{str(state.get('fingerprint'))[:16]}`)"]
    if (path / "translation.csv").exists():
        summary = translation_summary(read_table(path / "translation.csv"), n_boot, seed)
        switches = translation_switches(summary)
        result.tables["translation_summary"] = write_table(summary, out / "translation_summary.csv")
        result.tables["translation_switches"] = write_table(switches, out / "translation_switches.csv")
        result.figures.update(translation_figures(summary, out))
        lines += ["", "## Translation (Dumas et al. 2025)", "",
                  f"Settings: `{json.dumps(stages.get('translation', {}), ensure_ascii=False)}`", "",
                  "Layers where patching moved the output language or the concept (mean curves):", "",
                  _md(switches), "", "![patch_translation](patch_translation.png)"]
    if (path / "pairs.csv").exists():
        pairs_settings = stages.get("pairs", {})
        summary = pairs_summary(read_table(path / "pairs.csv"), float(pairs_settings.get("min_gap", 0.5)), n_boot, seed)
        compare = state.get("compare")
        peaks = probe_peaks(compare, n_boot, seed) if compare and Path(compare).is_dir() else None
        onsets = recovery_onsets(summary, peaks)
        result.tables["summary"] = write_table(summary, out / "summary.csv")
        result.tables["onsets"] = write_table(onsets, out / "onsets.csv")
        result.figures.update(pairs_figures(summary, onsets, out))
        lines += ["", "## Minimal pairs: recovery by layer", "",
                  f"Settings: `{json.dumps(pairs_settings, ensure_ascii=False)}`" +
                  (f"; probe peaks from `{compare}`" if peaks is not None else "; no compare directory (no probe peaks)"),
                  ""]
        if summary.empty:
            lines += [f"No pair's good and bad scores differ by --min-gap {pairs_settings.get('min_gap')} or more: "
                      "no recovery to summarise."]
        lines += [f"Per language: the layers whose median recovery is at least {THRESHOLD} (patching j..L):", "",
                  _md(onsets), ""] + [f"![{name}]({name}.png)" for name in ("patch_recovery", "patch_vs_probe")
                                      if name in result.figures]
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return result


def _md(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "(none)"
    shown = frame.copy()
    for column in shown.columns:
        if shown[column].dtype.kind == "f":
            shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else f"{v:.3g}")
    header = "| " + " | ".join(map(str, shown.columns)) + " |"
    rule = "|" + "---|" * len(shown.columns)
    body = ["| " + " | ".join(map(str, row)) + " |" for row in shown.itertuples(index=False)]
    return "\n".join([header, rule, *body])
