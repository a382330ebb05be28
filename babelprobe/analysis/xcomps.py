"""XCOMPS as published (He, Nie et al. 2025): the paper's probing protocol as a preset, and the tables
behind its figures, computed from `compare` results.

    probes.settings.PROTOCOLS["paper"]   # stratified 5-fold (pairs may be split), F1 over folds, max over layers
    cells = method_cells(summary, layers)  # Fig. 2 / Table 4: language × negative type × method
    typology_means(cells)                # Fig. 4 / Table 5 (typology_table): class means, English left out
    peak_readings(language_peaks, subset_peaks)   # Fig. 6 under both readings of "average peak layer"
    correlations_by_subset(cells)        # Figs. 10-12: method correlations per negative type
    layer_difference(probe_a, probe_b)   # Fig. 13: layer-wise F1 difference of two models
    cells_difference(cells_a, cells_b)   # Fig. 9: Fig. 2's numbers, other − base

The paper reports meta and direct as accuracy and neuro as the probe's F1 (averaged over five
cross-validation folds) at the best layer (§4.2, Fig. 2 caption): `method_cells` takes neuro from the
per-layer probe table, whatever layer `compare --layer` chose for the per-pair view. Typology classes
are Table 3's; only its 17 languages enter class means (English, which Table 3 does not list, is left
out, as in Figs. 4 and 6). Where the paper is silent, docs/fidelity.md says what babelprobe chose.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from babelprobe.analysis import methods
from babelprobe.analysis.peaks import (
    NOT_IN_TABLE3,
    TYPOLOGIES,
    subset_replicates,
    table3_only,
    typology_peaks,
    with_typology,
)
from babelprobe.errors import BabelprobeError
from babelprobe.probes.peaks import f1_intervals
from babelprobe.probes.settings import PROTOCOLS

# The probing protocols live with the probes (`probes.settings`): babelprobe's default keeps the two
# sentences of a pair in one fold; "paper" is XCOMPS §4.2 (docs/fidelity.md).
METHOD_METRIC = {"meta": "accuracy", "direct": "accuracy", "neuro": "f1"}
PAPER_DTYPE = "float16"  # XCOMPS §4.1: "During inference, we adopt float16 precision"


def protocol_dtype(protocol: str, dtype: str | None, device: str | None) -> str | None:
    """The model dtype a protocol runs: under "paper" float16 on CUDA (§4.1; a different --dtype there is
    an error), elsewhere what was given (None: babelprobe's choice, float32 on CPU, where float16 is slow
    and the default model's residual stream overflows it)."""
    if protocol != "paper":
        return dtype
    import torch

    from babelprobe.models import auto_device

    on_cuda = (torch.device(device) if device else auto_device()).type == "cuda"
    if not on_cuda:
        return dtype
    if dtype not in (None, PAPER_DTYPE):
        raise BabelprobeError(f"--protocol paper runs --model-dtype {PAPER_DTYPE} on CUDA (XCOMPS §4.1); drop "
                              f"--model-dtype {dtype} or the --protocol")
    return PAPER_DTYPE


# ------------------------------------------------------------------------------------------- protocol

def recorded_protocol(info: dict) -> str:
    """The protocol a results directory was made with: as recorded by `compare` / `probe`, else the
    preset its probe settings match ("custom" when none does, "unknown" without probe settings)."""
    for source in ("compare", "probe"):
        if info.get(source, {}).get("protocol"):
            return str(info[source]["protocol"])
    probe = info.get("probe", {})
    if not probe:
        return "unknown"
    for name, preset in PROTOCOLS.items():
        if probe.get("fold_scheme") == preset["fold_scheme"] and probe.get("folds") == preset["folds"]:
            return name
    return "custom"


# --------------------------------------------------------------------------------- Fig. 2, Table 4

def method_cells(summary: pd.DataFrame | None, layers: pd.DataFrame | None) -> pd.DataFrame:
    """One row per language × subset × method with the paper's measure (Fig. 2): meta and direct pair
    accuracy (from `summary`), neuro the highest fold-averaged F1 over layers (from the per-layer probe
    table `layers`) and the layer where it is reached. Columns: language, subset, method, metric,
    value, ci_low, ci_high, n, layer, and typology columns."""
    parts = []
    if summary is not None:
        scored = summary[summary["method"].isin(["meta", "direct"]) & (summary["metric"] == "accuracy")]
        parts.append(scored[["language", "subset", "method", "metric", "value", "ci_low", "ci_high", "n"]]
                     .assign(layer=np.nan))
    if layers is not None:
        best = layers.loc[layers.groupby(["language", "subset"])["f1_mean"].idxmax()]  # first maximum
        parts.append(pd.DataFrame({"language": best["language"], "subset": best["subset"], "method": "neuro",
                                   "metric": "f1", "value": best["f1_mean"], "ci_low": best["f1_ci_low"],
                                   "ci_high": best["f1_ci_high"], "n": best["n"], "layer": best["layer"]}))
    if not parts:
        raise BabelprobeError("no summary and no probe table: nothing to put in the XCOMPS tables")
    cells = pd.concat(parts, ignore_index=True)
    order = {m: i for i, m in enumerate(methods.METHODS)}
    cells = cells.assign(_m=cells["method"].map(order)).sort_values(["_m", "language", "subset"])
    return with_typology(cells.drop(columns="_m").reset_index(drop=True))


def language_groups(languages) -> list[tuple[str, list[str]]]:
    """The paper's column order: languages outside Table 3 (English) first, then Table 3's typology
    classes (analytic, inflectional, agglutinative), each sorted by code."""
    frame = with_typology(pd.DataFrame({"language": sorted(set(languages))}))
    groups = [(name, frame.loc[frame["group"] == name, "language"].tolist()) for name in (NOT_IN_TABLE3, *TYPOLOGIES)]
    return [(name, codes) for name, codes in groups if codes]


def method_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Table 4 (wide): one row per language in the paper's order, a column per method × negative type
    (`meta taxonomic`, ...) and each method's mean over negative types (`meta mean`)."""
    from babelprobe.analysis.figures import subset_order

    subsets = subset_order(cells["subset"])
    present = [m for m in methods.METHODS if m in set(cells["method"])]
    order = [code for _, codes in language_groups(cells["language"]) for code in codes]
    table = pd.DataFrame(index=pd.Index(order, name="language"))
    for method in present:
        wide = cells[cells["method"] == method].pivot_table(index="language", columns="subset", values="value")
        for subset in subsets:
            table[f"{method} {subset}"] = wide.get(subset)
        table[f"{method} mean"] = wide[[s for s in subsets if s in wide.columns]].mean(axis=1)
    table.insert(0, "typology", with_typology(table.reset_index())["group"].to_numpy())
    return table.reset_index()


def cells_difference(base: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """Fig. 9's numbers: `other − base` of two models' `method_cells` on the same languages and subsets."""
    keys = ["language", "subset", "method", "metric"]
    merged = base[keys + ["value"]].merge(other[keys + ["value"]], on=keys, suffixes=("_base", "_other"))
    if merged.empty:
        raise BabelprobeError("the two results share no language × subset × method; compare the same items")
    merged["value"] = merged["value_other"] - merged["value_base"]
    return with_typology(merged)


# --------------------------------------------------------------------------------- Fig. 4, Table 5

def typology_means(cells: pd.DataFrame) -> pd.DataFrame:
    """Table 5 / Fig. 4: per typology class × method × subset (and subset "all": each language's mean over
    its subsets first), the mean over the class's languages, their standard deviation, min, max, count
    and codes. Only Table 3 languages enter (English is left out, as in Fig. 4)."""
    kept = table3_only(cells)
    if kept.empty:
        raise BabelprobeError("no language of XCOMPS Table 3 in the results: typology class means need them")
    overall = kept.groupby(["language", "typology", "method", "metric"], as_index=False)["value"].mean()
    both = pd.concat([kept, overall.assign(subset="all")], ignore_index=True)
    out = both.groupby(["typology", "method", "metric", "subset"]).agg(
        value=("value", "mean"), sd=("value", "std"), min=("value", "min"), max=("value", "max"),
        n_languages=("language", "nunique"), languages=("language", lambda s: ", ".join(sorted(set(s))))
    ).reset_index()
    rank = {t: i for i, t in enumerate(TYPOLOGIES)}
    method_rank = {m: i for i, m in enumerate(methods.METHODS)}
    return out.assign(_t=out["typology"].map(rank), _m=out["method"].map(method_rank)).sort_values(
        ["_m", "_t", "subset"]).drop(columns=["_t", "_m"]).reset_index(drop=True)


def typology_table(means: pd.DataFrame) -> pd.DataFrame:
    """Table 5 (wide): one row per typology class of Table 3, a column per method × negative type and
    each method's mean over negative types (`meta mean`), and the languages averaged."""
    from babelprobe.analysis.figures import subset_order

    subsets = subset_order(s for s in means["subset"] if s != "all")
    classes = [t for t in TYPOLOGIES if t in set(means["typology"])]
    table = pd.DataFrame(index=pd.Index(classes, name="typology"))
    for method in [m for m in methods.METHODS if m in set(means["method"])]:
        wide = means[means["method"] == method].pivot_table(index="typology", columns="subset", values="value")
        for subset in [*subsets, "all"]:
            table[f"{method} {'mean' if subset == 'all' else subset}"] = wide.get(subset)
    table["languages"] = means.drop_duplicates("typology").set_index("typology")["languages"]
    return table.reset_index()


def left_out(languages) -> list[str]:
    """The languages (codes) that no typology class mean includes: those outside Table 3."""
    frame = with_typology(pd.DataFrame({"language": sorted(set(languages))}))
    return frame.loc[~frame["in_table3"], "language"].tolist()


# ------------------------------------------------------------------------------------------- Fig. 6

def peak_readings(language_peaks: pd.DataFrame, subset_peaks: pd.DataFrame) -> pd.DataFrame:
    """Fig. 6's "average peak layer" per typology class under both readings, labelled in `reading`:
    "per language" (the peak of each language's curve averaged over negative types, then the mean over
    the class's languages) and "per language × negative type" (each language × subset group's own peak,
    then the mean over the class's groups). Table 3 languages only."""
    return pd.concat([typology_peaks(language_peaks).assign(reading="per language"),
                      typology_peaks(subset_peaks).assign(reading="per language × negative type")],
                     ignore_index=True)


# ------------------------------------------------------------------------------------ Figs. 10-12

def correlations_by_subset(cells: pd.DataFrame) -> pd.DataFrame:
    """Pearson and Spearman correlation of every two methods across languages, one negative type at a
    time (Figs. 10-12; `methods.correlations` on the cells of one subset). Columns: subset and those of
    `methods.correlations`."""
    from babelprobe.analysis.figures import subset_order

    rows = [methods.correlations(cells[cells["subset"] == subset]).assign(subset=subset)
            for subset in subset_order(cells["subset"])]
    out = pd.concat(rows, ignore_index=True)
    return out[["subset", *[c for c in out.columns if c != "subset"]]]


# ------------------------------------------------------------------------------------------- Fig. 13

def layer_difference(base, other, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Fig. 13: `other − base` probe F1 by layer per language × subset for two probe results on the same
    items (e.g. instruct − base), with a paired bootstrap interval: both models' out-of-fold predictions
    are resampled with the same pairs in every replicate. The two models must have the same layers."""
    a, b = base.table, other.table
    if sorted(a["layer"].unique()) != sorted(b["layer"].unique()):
        raise BabelprobeError(f"the two probe results have different layers ({a['layer'].max()} vs "
                              f"{b['layer'].max()}); the layer-wise difference needs models of the same depth")
    keys = ["language", "subset", "layer"]
    merged = a[keys + ["relative_depth", "f1_mean"]].merge(b[keys + ["f1_mean"]], on=keys,
                                                           suffixes=("_base", "_other"))
    if merged.empty:
        raise BabelprobeError("the two probe results share no language × subset; compare the same items")
    merged["difference"] = merged["f1_mean_other"] - merged["f1_mean_base"]
    merged["ci_low"], merged["ci_high"] = np.nan, np.nan
    if n_boot:
        _paired_layer_intervals(merged, base, other, n_boot, seed, level)
    return with_typology(merged.sort_values(keys, ignore_index=True))


def _paired_layer_intervals(merged: pd.DataFrame, base, other, n_boot: int, seed: int, level: float) -> None:
    for (language, subset), cell in merged.groupby(["language", "subset"]):
        layers = np.sort(cell["layer"].unique())
        held = [set(p.oof.loc[(p.oof["language"] == language) & (p.oof["subset"] == subset), "item_id"])
                for p in (base, other)]
        if held[0] != held[1]:
            raise BabelprobeError(f"{language} {subset}: the two probe results hold other items; compare the same items")
        reps = []
        for probe in (base, other):
            folds = int(probe.settings.get("folds") or probe.oof["fold"].max() + 1)
            reps.append(subset_replicates(probe.oof, language, subset, layers, folds, n_boot, seed))
        low, high = f1_intervals(reps[1] - reps[0], level)
        where = cell.sort_values("layer").index
        merged.loc[where, "ci_low"], merged.loc[where, "ci_high"] = low, high
