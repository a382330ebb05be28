"""Cross-lingual transfer of probes: train on every item of language A, test on every item of language B
(same subset, each layer), giving a transfer matrix.

The table has one row per (train_language, test_language, subset, layer) with f1, accuracy, auc and n
(test items). Off-diagonal cells are true transfer (B is never seen in training). A probe cannot be
tested on its own training items, so `transfer` leaves the diagonal out; `sweep(..., transfer=True)`
fills it with the cross-validated in-language F1 and marks those rows `kind="cv"`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from babelprobe.errors import BabelprobeError
from babelprobe.extract.layers import parse_layers
from babelprobe.probes.metrics import accuracies, aucs, f1_scores
from babelprobe.probes.solvers import fit_predict
from babelprobe.probes.source import (
    as_store,
    group_name,
    group_rows,
    in_memory,
    layer_chunks,
    read_checked,
    usable_keys,
)


def transfer(store, by=("subset",), layers="all", *, across: str = "language", pool: str = "last", C: float = 1.0,
             solver: str = "torch", device=None, dtype=None, max_iter: int | None = None, tol: float | None = None,
             n_jobs: int | None = None, memory_gb: float = 2.0, exact_max: int | None = None,
             progress: bool = False) -> pd.DataFrame:
    """Train a probe per `across` value (language) and layer within each group of `by`; score every other
    language of the group.

    Parameters
    ----------
    store : a store directory, an opened store or an `ArrayStore`.
    by : grouping inside which languages are compared (default: per subset).
    layers : "all", a list, or "0,4,8-12".
    across : the column whose values are trained on and tested on (default "language").
    C, solver, device, dtype, max_iter, tol, n_jobs, memory_gb, exact_max : as in `fit_predict`.

    Returns
    -------
    DataFrame: train_language, test_language, <by columns>, layer, f1, accuracy, auc, n, n_train,
    kind ("transfer"), method ("neuro"), pool, solver, C.
    """
    store = as_store(store)
    by = tuple(c for c in by if c != across)
    keys = usable_keys(store, (*by, across), pool)
    layer_list = parse_layers(layers, store.layers, stored=True)
    store = in_memory(store, layer_list, pool, memory_gb)
    rows_out = []
    groups = group_rows(keys, by)
    for key, index in tqdm(groups, desc="transfer", unit="group", disable=not progress):
        name = group_name(by, key)
        part = keys.loc[index]
        labels = part["label"].to_numpy(int)
        langs = part[across].astype(str).to_numpy()
        names = np.unique(langs)
        if len(names) < 2:
            continue  # nothing to transfer to
        for lang in names:
            if len(np.unique(labels[langs == lang])) < 2:
                raise BabelprobeError(f"group {name} {across}={lang} has only one label; a transfer probe needs both")
        train = np.stack([langs == lang for lang in names])
        y = np.tile(labels, (len(names), 1))
        scores = np.empty((len(names), len(layer_list), len(part)))
        j = 0
        for chunk in layer_chunks(layer_list, len(part), store.d_model, memory_gb):
            X = read_checked(store, index, chunk, pool, name)
            scores[:, j:j + len(chunk)] = fit_predict(X, y, train, C, solver=solver, device=device, dtype=dtype,
                                                      max_iter=max_iter, tol=tol, n_jobs=n_jobs, memory_gb=memory_gb,
                                                      exact_max=exact_max)
            j += len(chunk)
        group_values = dict(zip(by, key, strict=True))
        for a, source in enumerate(names):
            for target in names:
                if target == source:
                    continue
                test = langs == target
                s, t = scores[a][:, test], labels[test]
                for layer, f1, acc, auc in zip(layer_list, f1_scores(s, t), accuracies(s, t), aucs(s, t), strict=True):
                    rows_out.append({"method": "neuro", f"train_{across}": source, f"test_{across}": target,
                                     **group_values, "layer": layer, "f1": f1, "accuracy": acc, "auc": auc,
                                     "n": int(test.sum()), "n_train": int(train[a].sum()), "kind": "transfer"})
    table = pd.DataFrame(rows_out)
    if not table.empty:
        table["pool"], table["solver"], table["C"] = pool, solver, float(C)
    return table


def transfer_matrix(table: pd.DataFrame, layer: int | str | None = "best", across: str = "language",
                    value: str = "f1") -> pd.DataFrame:
    """Train language down, test language across: mean `value` over the other grouping columns (e.g.
    subsets). `layer`: a layer number, "best" (the layer with the highest mean off-diagonal value) or
    None (use the rows as given, e.g. from `at_peaks`)."""
    if layer == "best":
        off = table[table["kind"] == "transfer"] if "kind" in table.columns else table
        layer = int(off.groupby("layer")[value].mean().idxmax())
    rows = table if layer is None else table[table["layer"] == layer]
    matrix = rows.pivot_table(index=f"train_{across}", columns=f"test_{across}", values=value, aggfunc="mean")
    where = "at the training language's peak layer" if layer is None else f"layer {layer}"
    matrix.index.name, matrix.columns.name = f"train ↓ / test → ({where})", None
    return matrix


def at_peaks(table: pd.DataFrame, peaks: pd.DataFrame) -> pd.DataFrame:
    """The transfer rows at the peak layer of the training language (per subset), from a sweep's peaks."""
    peak = peaks.rename(columns={"language": "train_language"})[["train_language", "subset", "peak_layer"]]
    merged = table.merge(peak, on=["train_language", "subset"])
    return merged[merged["layer"] == merged["peak_layer"]].drop(columns="peak_layer").reset_index(drop=True)
