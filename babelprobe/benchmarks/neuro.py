"""Neuro: the probing method as a per-pair scorer, so it lines up with meta and direct item by item.

A probe sweep (`babelprobe.probes.sweep`) gives every sentence an out-of-fold decision score at every
layer. `neuro_pairs(result, layer)` turns that into DESIGN.md per-pair rows: a pair is correct when
its acceptable sentence scores above its unacceptable one, at

  - `layer="peak"` (default): each language × subset group's own peak layer (highest mean F1; the
    XCOMPS summary's "maximum over layers"), recorded in the `layer` column;
  - `layer=N`: the same layer N for every group.

Choosing the peak on the same folds that are then reported makes the peak F1 optimistic; the
bootstrap interval of the peak position (in `result.peaks`) says how firmly it is located.
"""

from __future__ import annotations

import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.probes import ProbeResult


def chosen_layers(result: ProbeResult, layer: int | str = "peak") -> pd.DataFrame:
    """language, subset, layer: the layer used for each group."""
    groups = result.peaks[["language", "subset"]].copy()
    if layer in ("peak", "max"):
        groups["layer"] = result.peaks["peak_layer"].to_numpy()
        return groups
    try:
        layer = int(layer)
    except (TypeError, ValueError) as err:
        raise BabelprobeError(f"--layer must be 'peak' or a layer number, got {layer!r}") from err
    available = sorted(result.table["layer"].unique())
    if layer not in available:
        raise BabelprobeError(f"layer {layer} was not probed; probed layers: {available[0]}..{available[-1]}")
    groups["layer"] = layer
    return groups


def neuro_pairs(result: ProbeResult, layer: int | str = "peak", items: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per pair: method "neuro", score_good/score_bad (out-of-fold probe scores), correct, layer."""
    chosen = chosen_layers(result, layer)
    pairs = result.pair_scores(sorted(chosen["layer"].unique()), items)
    pairs = pairs.merge(chosen, on=["language", "subset", "layer"])
    f1 = result.table[["language", "subset", "layer", "f1_mean"]].rename(columns={"f1_mean": "group_f1"})
    return pairs.merge(f1, on=["language", "subset", "layer"], how="left").reset_index(drop=True)
