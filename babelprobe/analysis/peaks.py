"""Peak layers: at which depth the probes separate acceptable from unacceptable sentences best, per
language × subset, per language (subsets averaged), per typology class, and how two models differ.

    probe = ProbeResult.read("cmp/neuro.csv")
    subset_peaks(probe)                 # language × subset: the sweep's peaks with typology columns
    curves = language_curves(probe)     # language × layer: F1 averaged over subsets, bootstrap band
    peaks = language_peaks(probe)       # language: peak of that curve and its bootstrap interval
    typology_peaks(peaks)               # typology class: mean peak layer and its spread (Table 3 languages)
    peak_difference(peaks_a, peaks_b)   # other − base, in layers and in relative depth

The per-language curve is the mean of the language's subset curves. Its bootstrap resamples pairs
within each subset (the subsets stay balanced) from the sweep's out-of-fold scores, exactly as the
sweep does for one group; the probes are not refitted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.languages import language_table
from babelprobe.probes.controls import group_rng
from babelprobe.probes.peaks import bootstrap_f1, f1_intervals, peak_summary, peak_table

TYPOLOGIES = ("analytic", "inflectional", "agglutinative")  # XCOMPS Table 3 order
NOT_IN_TABLE3 = "not in Table 3"  # the group of English (and any language XCOMPS Table 3 does not list)


def with_typology(frame: pd.DataFrame, column: str = "language") -> pd.DataFrame:
    """`frame` with the language table's `name`, `typology`, `family` and `script` of `column` added
    (typology "other" for a code the table does not know), `in_table3`: whether XCOMPS Table 3 lists the
    language (its 17 languages; not English), and `group`: the typology class for those, else "not in
    Table 3". Only Table 3 languages enter class means; figures group and colour languages by `group`."""
    table = language_table()[["name", "typology", "family", "script"]].assign(
        in_table3=language_table()["in_xcomps"] == "yes")
    out = frame.drop(columns=[c for c in table.columns if c in frame.columns])
    out = out.merge(table, left_on=column, right_index=True, how="left")
    out["name"] = out["name"].fillna(out[column])
    out["typology"] = out["typology"].fillna("other")
    out["in_table3"] = out["in_table3"].fillna(False).astype(bool)
    out["group"] = out["typology"].where(out["in_table3"], NOT_IN_TABLE3)  # how figures group and colour it
    return out.fillna({"family": "", "script": ""})


def table3_only(frame: pd.DataFrame, column: str = "language") -> pd.DataFrame:
    """The rows of `frame` whose language XCOMPS Table 3 lists, with typology columns. English is not in
    Table 3 (the paper's typology figures, Figs. 4 and 6, drop it); its `analytic` in languages.csv only
    colours it in figures, it never enters a class mean."""
    frame = with_typology(frame, column)
    return frame[frame["in_table3"]].reset_index(drop=True)


def language_order(languages) -> list[str]:
    """Known languages outside XCOMPS Table 3 (English) first, as in the paper's Fig. 2, then Table 3's
    by typology class (analytic, inflectional, agglutinative), then codes the language table does not
    know; each group sorted by code."""
    frame = with_typology(pd.DataFrame({"language": sorted(set(languages))}))
    rank = {t: i for i, t in enumerate((NOT_IN_TABLE3, *TYPOLOGIES))}
    frame["rank"] = frame["group"].map(rank).where(frame["typology"] != "other", len(rank))
    return frame.sort_values(["rank", "language"])["language"].tolist()


def subset_peaks(probe) -> pd.DataFrame:
    """One row per language × subset: peak layer, its bootstrap interval, relative depth, peak F1 and the
    first layer within one standard error (the sweep's `peaks`), with typology columns."""
    peaks = probe.peaks
    if peaks is None or peaks.empty:
        peaks = peak_table(probe.table, ["language", "subset"])
    return with_typology(peaks)


def language_curves(probe, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """One row per language × layer: `f1_mean` averaged over the language's subsets, a bootstrap
    interval `f1_ci_low`/`f1_ci_high` (pairs resampled within each subset), `f1_se` (fold standard
    errors combined as for a mean of independent subsets), `relative_depth`, `n_subsets`, `n_pairs`."""
    rows = []
    for language, curve in _language_replicates(probe, n_boot, seed).items():
        low, high = f1_intervals(curve["replicates"], level)
        rows.append(pd.DataFrame({"language": language, "layer": curve["layers"],
                                  "relative_depth": curve["layers"] / curve["n_layers"], "f1_mean": curve["f1"],
                                  "f1_se": curve["se"], "f1_ci_low": low, "f1_ci_high": high,
                                  "n_subsets": curve["n_subsets"], "n_pairs": curve["n_pairs"]}))
    return with_typology(pd.concat(rows, ignore_index=True))


def language_peaks(probe, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """One row per language: the peak of its subset-averaged F1 curve (`peak_layer`, `peak_f1`), the
    bootstrap interval of the peak's position (`peak_layer_low`/`high`), `peak_relative_depth`, the
    first layer within one standard error, and typology columns."""
    rows = []
    for language, curve in _language_replicates(probe, n_boot, seed).items():
        summary = peak_summary(curve["layers"], curve["f1"], curve["se"], curve["replicates"], curve["n_layers"],
                               level)
        rows.append({"language": language, **summary, "n_subsets": curve["n_subsets"], "n_pairs": curve["n_pairs"],
                     "n_layers": curve["n_layers"]})
    return with_typology(pd.DataFrame(rows))


def typology_peaks(peaks: pd.DataFrame, by: tuple[str, ...] = ("typology",)) -> pd.DataFrame:
    """Mean peak layer, relative depth and peak F1 per typology class (or per `by`, e.g. typology ×
    subset) over the rows of `peaks` (languages, or language × subset groups: `n` counts them), with
    the spread: standard deviation, minimum, maximum, and the languages. Only languages of XCOMPS
    Table 3 enter a class (`table3_only`: English is left out)."""
    peaks = table3_only(peaks)
    if peaks.empty:
        raise BabelprobeError("no language of XCOMPS Table 3 in the peak table: typology class means need them")
    grouped = peaks.groupby(list(by), sort=False)
    out = grouped.agg(n=("peak_layer", "size"), n_languages=("language", "nunique"),
                      languages=("language", lambda s: ", ".join(sorted(set(s)))),
                      peak_layer_mean=("peak_layer", "mean"), peak_layer_sd=("peak_layer", "std"),
                      peak_layer_min=("peak_layer", "min"), peak_layer_max=("peak_layer", "max"),
                      relative_depth_mean=("peak_relative_depth", "mean"),
                      relative_depth_sd=("peak_relative_depth", "std"),
                      peak_f1_mean=("peak_f1", "mean"), peak_f1_sd=("peak_f1", "std")).reset_index()
    rank = {t: i for i, t in enumerate(TYPOLOGIES)}
    order = out["typology"].map(rank).fillna(len(rank)) if "typology" in by else 0
    return out.assign(_rank=order).sort_values(["_rank", *by]).drop(columns="_rank").reset_index(drop=True)


def peak_difference(base: pd.DataFrame, other: pd.DataFrame, on: tuple[str, ...] = ("language",)) -> pd.DataFrame:
    """`other − base` peak position per `on` group of two peak tables (e.g. two models' `language_peaks`):
    in layers and in relative depth (the comparable measure when the models differ in depth), and the
    change in peak F1."""
    keep = [*on, "peak_layer", "peak_relative_depth", "peak_f1"]
    for name, frame in (("base", base), ("other", other)):
        missing = [c for c in keep if c not in frame.columns]
        if missing:
            raise BabelprobeError(f"{name} peak table has no column {missing[0]!r}")
    merged = base[keep].merge(other[keep], on=list(on), suffixes=("_base", "_other"))
    if merged.empty:
        raise BabelprobeError(f"the two peak tables share no {' × '.join(on)}; compare the same items")
    for column in ("peak_layer", "peak_relative_depth", "peak_f1"):
        merged[f"{column}_difference"] = merged[f"{column}_other"] - merged[f"{column}_base"]
    return merged


# ------------------------------------------------------------------------------------------ internals

def _language_replicates(probe, n_boot: int, seed: int) -> dict:
    """Per language: layers, subset-averaged F1 and its standard error, bootstrap replicates of that
    mean [n_boot, L] (with n_boot 0: the mean itself, so intervals collapse onto it), counts."""
    oof, table = probe.oof, probe.table
    if n_boot and (oof is None or oof.empty):
        raise BabelprobeError("the probe result has no out-of-fold scores (NAME.oof.parquet) for the bootstrap; "
                              "rerun the probe or use n_boot=0")
    n_folds = int(probe.settings.get("folds") or oof["fold"].max() + 1) if n_boot else 0
    n_layers = int(probe.settings.get("n_layers") or table["layer"].max())
    out = {}
    for language, lang_table in table.groupby("language", sort=False):
        curves = lang_table.pivot_table(index="subset", columns="layer", values="f1_mean")
        ses = lang_table.pivot_table(index="subset", columns="layer", values="f1_se")
        layers, f1 = curves.columns.to_numpy(), curves.mean().to_numpy()
        if n_boot:
            replicates = np.mean([subset_replicates(oof, language, subset, layers, n_folds, n_boot, seed)
                                  for subset in curves.index], axis=0)
        else:
            replicates = f1[None]
        out[language] = {"layers": layers, "f1": f1, "se": np.sqrt((ses ** 2).sum()).to_numpy() / len(curves),
                         "replicates": replicates, "n_layers": n_layers, "n_subsets": len(curves),
                         "n_pairs": int(lang_table.drop_duplicates("subset")["n_pairs"].sum())}
    return out


def subset_replicates(oof, language, subset, layers, n_folds, n_boot, seed) -> np.ndarray:
    """Bootstrap replicates [n_boot, L] of one group's fold-averaged F1, from its out-of-fold scores. The
    draws depend only on the seed, the group and its pairs, so two models' replicates of the same items
    resample the same pairs (a paired bootstrap)."""
    rows = oof[(oof["language"] == language) & (oof["subset"] == subset)]
    scores = rows.pivot_table(index="item_id", columns="layer", values="score")[layers]
    items = rows.drop_duplicates("item_id").set_index("item_id").loc[scores.index]
    rng = group_rng(seed, f"language={language}, subset={subset}", "language-peak bootstrap")
    return bootstrap_f1(scores.to_numpy().T > 0, items["label"].to_numpy(int), items["fold"].to_numpy(int), n_folds,
                        items["pair_id"].astype(str).to_numpy(), n_boot, rng)
