"""Cross-lingual alignment by layer: do the same sentences in different languages get similar states?

Items are linked across languages by `parallel_id` (the same concept and property; docs/design.md
"Items"). At every stored layer, from a store's pooled states:

  - each language's states are **mean-centred per language** (its mean state at that layer is
    subtracted), so a constant language offset — present in every multilingual model — does not count
    as misalignment, and what is compared is where items sit relative to their language;
  - a language's representation of a parallel unit is the mean of its items with that `parallel_id`
    (items with the same text, e.g. a COMPS acceptable sentence reused in four pairs, are identical);
  - **retrieval** (MEXA-style): for every unit of language A, is its nearest unit of language B by cosine
    its own parallel unit? Accuracy over the units both languages have (chance: 1 / n units);
    `retrieval` for a language is the mean of the two directions to and from the pivot;
  - **linear CKA** (Kornblith et al. 2019): CKA(X, Y) = ‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F) on the matched
    units, columns centred;
  - **cosine**: per item, the cosine between its state and its pivot parallel unit's state.

`align_layers` returns the per-language curves (to the pivot), the language × language matrices of every
layer and the per-item cosines; `alignment_correlations` relates them to probe F1 and meta/direct
accuracy from a compare directory, per language (across languages, at each layer) and per pair.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from babelprobe.errors import BabelprobeError

# ---------------------------------------------------------------------------------------- the measures

def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms == 0, 1, norms)


def retrieval_accuracy(a: np.ndarray, b: np.ndarray) -> float:
    """Share of rows i of `a` whose most cosine-similar row of `b` is row i (rows are parallel). A tie
    counts as a miss: identical states (every text ending in the same token, at layer 0) retrieve nothing."""
    similarity = unit_rows(a) @ unit_rows(b).T
    own = np.diag(similarity).copy()
    np.fill_diagonal(similarity, -np.inf)
    return float((own > similarity.max(axis=1)).mean())


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA of two sets of states of the same rows (Kornblith et al. 2019, eq. for linear kernels),
    columns centred first."""
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    scale = np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
    if scale == 0:  # a set of identical states (e.g. every text ends in the same token at layer 0)
        return float("nan")
    return float(np.linalg.norm(y.T @ x) ** 2 / scale)


# ----------------------------------------------------------------------------------------- the states

def parallel_items(store, items: pd.DataFrame | None = None) -> pd.DataFrame:
    """The store's items in row order with their `parallel_id` (from `items`, else the store's own)."""
    items = store.load_items() if items is None else items
    if "parallel_id" not in items.columns:
        raise BabelprobeError("the items have no 'parallel_id' field, which links the same concept and property "
                              "across languages; add it to the item file (README, Items)")
    by_id = items.drop_duplicates("item_id").set_index("item_id")
    missing = set(store.keys["item_id"]) - set(by_id.index)
    if missing:
        raise BabelprobeError(f"store {store.path} holds items that are not in the item set given "
                              f"(e.g. {sorted(missing)[0]!r}); give the items the store was extracted from")
    keys = store.keys[["item_id", "pair_id", "language", "subset", "label"]].copy()
    keys["parallel_id"] = by_id.loc[keys["item_id"], "parallel_id"].to_numpy()
    if keys["parallel_id"].isna().any() or (keys["parallel_id"].astype(str).str.strip() == "").any():
        first = keys.loc[keys["parallel_id"].isna() | (keys["parallel_id"].astype(str).str.strip() == ""),
                         "item_id"].iloc[0]
        raise BabelprobeError(f"item {first!r} has an empty 'parallel_id'; every item needs one for `align`")
    keys["parallel_id"] = keys["parallel_id"].astype(str)
    return keys


def language_units(states: np.ndarray, keys: pd.DataFrame, centre: bool = True) -> dict[str, pd.DataFrame]:
    """Per language: a frame indexed by parallel_id holding the unit's (mean) state, after centring each
    language's item states on their mean."""
    out = {}
    for language, rows in keys.groupby("language", sort=True).indices.items():
        x = states[rows]
        if centre:
            x = x - x.mean(axis=0)
        frame = pd.DataFrame(x, index=keys["parallel_id"].to_numpy()[rows])
        out[language] = frame.groupby(level=0, sort=True).mean()
    return out


def _matched(units: dict[str, pd.DataFrame], a: str, b: str) -> tuple[np.ndarray, np.ndarray]:
    common = units[a].index.intersection(units[b].index)
    return units[a].loc[common].to_numpy(), units[b].loc[common].to_numpy()


# ---------------------------------------------------------------------------------------- by layer

def align_layers(store, items: pd.DataFrame | None = None, pivot: str = "en", layers=None, pool: str = "last",
                 centre: bool = True, progress: bool = True) -> dict[str, pd.DataFrame]:
    """Alignment of every stored layer (or `layers`). Returns
      curves   language × layer: retrieval_to_pivot, retrieval_from_pivot, retrieval, cka, cosine (mean
               over the language's items), chance (1 / units), n_units;
      matrix   layer × language_a × language_b: retrieval (a's units retrieving b's), cka, cosine (mean over
               matched units), n_units;
      items    item × layer: cosine to the pivot parallel unit."""
    from babelprobe.extract import open_store

    store = open_store(store) if isinstance(store, (str, Path)) else store
    keys = parallel_items(store, items)
    languages = sorted(keys["language"].unique())
    if pivot not in languages:
        raise BabelprobeError(f"pivot language {pivot!r} is not in the store's items ({', '.join(languages)}); "
                              "extract it too or choose another --pivot")
    if len(languages) < 2:
        raise BabelprobeError("alignment needs items in at least two languages")
    layers = store.layers if layers is None else [int(x) for x in layers]
    curves, matrix, per_item = [], [], []
    for layer in tqdm(layers, desc="align", unit="layer", disable=not progress, dynamic_ncols=True):
        units = language_units(store.read(layer, pool=pool), keys, centre)
        for a in languages:
            for b in languages:
                x, y = _matched(units, a, b)
                if len(x) < 2:
                    continue
                matrix.append({"layer": layer, "language_a": a, "language_b": b, "n_units": len(x),
                               "retrieval": retrieval_accuracy(x, y), "cka": linear_cka(x, y),
                               "cosine": float((unit_rows(x) * unit_rows(y)).sum(axis=1).mean())})
        per_item.append(_item_cosines(store.read(layer, pool=pool), keys, units, pivot, centre).assign(layer=layer))
    matrix = pd.DataFrame(matrix)
    per_item = pd.concat(per_item, ignore_index=True)
    curves = _curves(matrix, per_item, pivot, store.n_layers)
    return {"curves": curves, "matrix": matrix, "items": per_item}


def _item_cosines(states, keys, units, pivot, centre) -> pd.DataFrame:
    out = keys[keys["language"] != pivot].copy()
    target = units[pivot]
    cosine = np.full(len(out), np.nan)
    for language, rows in out.groupby("language").indices.items():
        index = out.index[rows]
        x = states[index.to_numpy()]
        if centre:
            x = x - states[keys.index[keys["language"] == language].to_numpy()].mean(axis=0)
        ids = out.loc[index, "parallel_id"]
        known = ids.isin(target.index).to_numpy()
        y = target.loc[ids[known]].to_numpy()
        cosine[rows[known]] = (unit_rows(x[known]) * unit_rows(y)).sum(axis=1)
    return out.assign(cosine=cosine)


def _curves(matrix: pd.DataFrame, per_item: pd.DataFrame, pivot: str, n_layers: int) -> pd.DataFrame:
    to_pivot = matrix[(matrix["language_b"] == pivot) & (matrix["language_a"] != pivot)]
    from_pivot = matrix[(matrix["language_a"] == pivot) & (matrix["language_b"] != pivot)]
    curves = to_pivot.rename(columns={"language_a": "language", "retrieval": "retrieval_to_pivot"})[
        ["language", "layer", "n_units", "retrieval_to_pivot", "cka"]]
    back = from_pivot.rename(columns={"language_b": "language", "retrieval": "retrieval_from_pivot"})
    curves = curves.merge(back[["language", "layer", "retrieval_from_pivot"]], on=["language", "layer"])
    curves["retrieval"] = (curves["retrieval_to_pivot"] + curves["retrieval_from_pivot"]) / 2
    cosine = per_item.groupby(["language", "layer"], as_index=False)["cosine"].mean()
    curves = curves.merge(cosine, on=["language", "layer"], how="left")
    curves["chance"] = 1 / curves["n_units"]
    curves["relative_depth"] = curves["layer"] / n_layers
    curves.insert(1, "pivot", pivot)
    return curves.sort_values(["language", "layer"], ignore_index=True)


# ------------------------------------------------------------------------------------ correlations

def alignment_correlations(curves: pd.DataFrame, per_item: pd.DataFrame, compare_dir: str | Path) -> pd.DataFrame:
    """Pearson and Spearman correlations of alignment with a compare directory's results:
      level=language  across languages at each layer: retrieval, cka and cosine against probe F1 at the
                      same layer (subset-averaged), meta accuracy and direct accuracy;
      level=pair      across pairs at each layer: the pair's mean item cosine against its meta, direct and
                      neuro correctness (Pearson with a 0/1 variable is the point-biserial r).
    Columns: level, layer, alignment, outcome, n, pearson_r, pearson_p, spearman_rho, spearman_p."""
    from babelprobe.latent.outcomes import check_compare_dir, correlate, language_accuracy, probe_curve
    from babelprobe.tables import read_table

    compare_dir = check_compare_dir(compare_dir)
    accuracy = language_accuracy(compare_dir).set_index("language")
    f1 = probe_curve(compare_dir).rename(columns={"f1_mean": "probe_f1"})
    by_language = curves.merge(f1, on=["language", "layer"], how="left").join(
        accuracy[[c for c in ("meta_accuracy", "direct_accuracy") if c in accuracy]], on="language")
    rows = []
    for layer, group in by_language.groupby("layer"):
        for alignment in ("retrieval", "cka", "cosine"):
            for outcome in ("probe_f1", "meta_accuracy", "direct_accuracy"):
                if outcome in group:
                    rows.append({"level": "language", "layer": layer, "alignment": alignment, "outcome": outcome,
                                 **correlate(group[alignment], group[outcome])})
    joined = read_table(compare_dir / "items.csv")
    correct = [c for c in ("meta_correct", "direct_correct", "neuro_correct") if c in joined]
    pairs = per_item.groupby(["pair_id", "layer"], as_index=False)["cosine"].mean().merge(
        joined[["pair_id", *correct]], on="pair_id")
    for layer, group in pairs.groupby("layer"):
        for outcome in correct:
            rows.append({"level": "pair", "layer": layer, "alignment": "cosine", "outcome": outcome,
                         **correlate(group["cosine"], group[outcome].astype(float))})
    return pd.DataFrame(rows)
