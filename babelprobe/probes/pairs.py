"""The per-pair view of a probe: a minimal pair is correct for "neuro" at a layer when the probe's
out-of-fold score of its acceptable sentence is above that of its unacceptable one.

This makes probes comparable item by item with the `direct` and `meta` scorers (docs/design.md per-pair
rows: `score_good`, `score_bad`, `correct`). With grouped folds both sentences of a pair are held out
together, so they are scored by the same probe; with plain folds they may come from two probes.

`neuro_pairs(result, layer)` is the "neuro" method of `compare`: one row per pair at

  - `layer="peak"` (default): each language × subset group's own peak layer (highest mean F1; the
    XCOMPS summary's "maximum over layers"), recorded in the `layer` column;
  - `layer=N`: the same layer N for every group.

Choosing the peak on the same folds that are then reported makes the peak F1 optimistic; the
bootstrap interval of the peak position (in `result.peaks`) says how firmly it is located.
"""

from __future__ import annotations

import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.extract.layers import PEAK, layer_choice


def pair_scores(oof: pd.DataFrame, layer: int | list[int] | None = None,
                items: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per pair (and layer) from out-of-fold scores.

    Parameters
    ----------
    oof : the out-of-fold table of a sweep (`ProbeResult.oof`): item_id, pair_id, language, subset,
        label, layer, score, fold.
    layer : a layer, a list of layers, or None for every layer in `oof`.
    items : optional items (as from `load_items`) to add `text_good` / `text_bad`.

    Returns
    -------
    DataFrame: method, pair_id, language, subset, layer, item_good, item_bad, score_good, score_bad,
    correct (score_good > score_bad; a tie is not correct), fold_good, fold_bad [, text_good, text_bad].
    Pairs that lack one of their two sentences (e.g. a label -1 item) are left out. A multiple-choice
    question (several label-0 items) is one row whose unacceptable side is its highest-scoring distractor,
    so `correct` means the gold item's score is the strict maximum.
    """
    if layer is not None:
        wanted = [layer] if isinstance(layer, int) else list(layer)
        missing = sorted(set(wanted) - set(oof["layer"]))
        if missing:
            raise BabelprobeError(f"layer {missing[0]} is not in the probe results (layers "
                                  f"{oof['layer'].min()}..{oof['layer'].max()})")
        oof = oof[oof["layer"].isin(wanted)]
    keys = ["pair_id", "language", "subset", "layer"]
    columns = ["item_id", "score", "fold"]
    good = oof[oof["label"] == 1][keys + columns]
    dup = good.duplicated(keys)
    if dup.any():
        raise BabelprobeError(f"pair {good['pair_id'][dup].iloc[0]!r} has more than one acceptable sentence; "
                              "pair_scores needs one per pair")
    # a multiple-choice question's unacceptable side is its highest-scoring distractor (the first on a tie)
    bad = oof[oof["label"] == 0][keys + columns].reset_index(drop=True)
    bad = bad.loc[bad.groupby(keys, sort=False)["score"].idxmax()]
    pairs = good.merge(bad, on=keys, suffixes=("_good", "_bad"))
    pairs = pairs.rename(columns={"item_id_good": "item_good", "item_id_bad": "item_bad"})
    pairs["correct"] = pairs["score_good"] > pairs["score_bad"]
    pairs.insert(0, "method", "neuro")
    if items is not None and "text" in items.columns:
        text = items.set_index("item_id")["text"]
        pairs["text_good"] = pairs["item_good"].map(text)
        pairs["text_bad"] = pairs["item_bad"].map(text)
    return pairs.sort_values(["language", "subset", "layer", "pair_id"], ignore_index=True)


def chosen_layers(result, layer: int | str = PEAK) -> pd.DataFrame:
    """language, subset, layer: the layer used for each group of `result` (a `ProbeResult`): its peak
    layer (`peak`) or one probed layer (`--layers N`)."""
    groups = result.peaks[["language", "subset"]].copy()
    available = sorted(int(x) for x in result.table["layer"].unique())
    chosen = layer_choice(str(layer), available, stored=True)
    if chosen == PEAK:
        groups["layer"] = result.peaks["peak_layer"].to_numpy()
        return groups
    if len(chosen) != 1:
        raise BabelprobeError(f"--layers {layer!r}: the per-pair view takes one layer or 'peak'")
    groups["layer"] = chosen[0]
    return groups


def neuro_pairs(result, layer: int | str = PEAK, items: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per pair of `result` (a `ProbeResult`): method "neuro", score_good/score_bad (out-of-fold probe
    scores), correct, layer."""
    chosen = chosen_layers(result, layer)
    pairs = result.pair_scores(sorted(chosen["layer"].unique()), items)
    pairs = pairs.merge(chosen, on=["language", "subset", "layer"])
    f1 = result.table[["language", "subset", "layer", "f1_mean"]].rename(columns={"f1_mean": "group_f1"})
    return pairs.merge(f1, on=["language", "subset", "layer"], how="left").reset_index(drop=True)
