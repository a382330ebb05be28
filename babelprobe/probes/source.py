"""Where probes read activations from: an activation store on disk, or arrays already in memory.

`as_store(x)` opens a store directory (through `babelprobe.extract.open_store`, which bounds memory and
decodes dtypes) or passes through anything with the store's reading interface; `ArrayStore` gives
in-memory arrays that interface, e.g. activations computed in a notebook.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.errors import BabelprobeError


class ArrayStore:
    """In-memory activations with the reading interface of an activation store.

    Parameters
    ----------
    keys : DataFrame, one row per item: item_id, pair_id, language, subset, label.
    last, mean : float arrays [n_items, n_stored_layers, d_model] (at least one).
    layers : DESIGN numbers of the stored layers (default 0..n_stored_layers-1).
    n_layers : L of the model (default: the largest stored layer).
    """

    def __init__(self, keys: pd.DataFrame, last=None, mean=None, layers=None, n_layers: int | None = None):
        self.arrays = {pool: a for pool, a in (("last", last), ("mean", mean)) if a is not None}
        if not self.arrays:
            raise BabelprobeError("ArrayStore needs `last` or `mean` activations")
        first = next(iter(self.arrays.values()))
        if first.ndim != 3 or len(first) != len(keys):
            raise BabelprobeError(f"activations must be [n_items={len(keys)}, layers, d_model]; got {first.shape}")
        self.keys = keys.reset_index(drop=True)
        self.layers = list(range(first.shape[1])) if layers is None else [int(x) for x in layers]
        if len(self.layers) != first.shape[1]:
            raise BabelprobeError(f"{len(self.layers)} layer numbers for {first.shape[1]} stored layers")
        self.pools = tuple(self.arrays)
        self.d_model = first.shape[2]
        self.n_layers = n_layers or max(self.layers)
        self.manifest: dict = {}
        self.fingerprint = None
        self.items_hash = None
        self.path = "<arrays>"

    def read_layers(self, layers=None, rows=None, pool: str = "last", device=None):
        """As `Store.read_layers`: float32 numpy, or with `device` a torch tensor there."""
        if pool not in self.arrays:
            raise BabelprobeError(f"the activations have no {pool!r} pooling; they have {', '.join(self.pools)}")
        layers = self.layers if layers is None else [int(x) for x in np.atleast_1d(layers)]
        missing = [x for x in layers if x not in self.layers]
        if missing:
            raise BabelprobeError(f"layer {missing[0]} is not among the stored layers {self.layers}")
        columns = [self.layers.index(x) for x in layers]
        array = self.arrays[pool]
        picked = array[:, columns] if rows is None else array[np.ix_(np.asarray(rows), columns)]  # one copy
        values = np.asarray(picked, dtype=np.float32)
        if device is None:
            return values
        import torch

        return torch.from_numpy(values).to(device)

    def read(self, layer: int, rows=None, pool: str = "last") -> np.ndarray:
        return self.read_layers([layer], rows, pool)[:, 0]


def as_store(store):
    """An opened activation store from a path, or `store` itself if it already reads like one."""
    if isinstance(store, (str, Path)):
        from babelprobe.extract import open_store

        return open_store(store)
    if not (hasattr(store, "read_layers") and hasattr(store, "keys")):
        raise BabelprobeError(f"cannot probe a {type(store).__name__}: pass a store directory, an opened store "
                              "or an ArrayStore")
    return store


# ---------------------------------------------------------------------------------- reading for probes

KEY_FIELDS = ("item_id", "pair_id", "language", "subset", "label")


def usable_keys(store, by, pool: str) -> pd.DataFrame:
    """The store's keys restricted to items with label 0 or 1 (label -1 is "not applicable"); checks
    the key fields, the grouping columns and the pooling. The index keeps the store row numbers."""
    keys = store.keys
    missing = [c for c in (*KEY_FIELDS, *by) if c not in keys.columns]
    if missing:
        raise BabelprobeError(f"the store keys have no {missing[0]!r} field; they have "
                              f"{', '.join(map(str, keys.columns))}")
    if pool not in store.pools:
        raise BabelprobeError(f"store {store.path} has no {pool!r} pooling; it has {', '.join(store.pools)} "
                              "(choose --pool or re-extract with that pooling)")
    labels = pd.to_numeric(keys["label"], errors="coerce")
    bad = ~labels.isin([0, 1, -1])
    if bad.any():
        raise BabelprobeError(f"item {keys['item_id'][bad].iloc[0]!r} has label {keys['label'][bad].iloc[0]!r}; "
                              "labels must be 1 (acceptable), 0 (unacceptable) or -1 (not applicable)")
    usable = keys[labels.isin([0, 1])].copy()
    usable["label"] = labels[usable.index].astype(np.int8)
    if usable.empty:
        raise BabelprobeError(f"store {store.path} has no items labelled 0 or 1 (all {len(keys)} are -1); "
                              "probes need acceptable and unacceptable items")
    if by:  # every group needs a usable item (one groupby, not a pass per group)
        usable_in = labels.isin([0, 1]).groupby([keys[column] for column in by], sort=True).any()
        if not usable_in.all():
            key = usable_in.index[~usable_in.to_numpy()][0]
            raise BabelprobeError(f"group {group_name(by, key if isinstance(key, tuple) else (key,))} has no items "
                                  "labelled 0 or 1 (all are -1); leave it out or fix its labels")
    return usable


def group_rows(keys: pd.DataFrame, by) -> list[tuple[tuple, np.ndarray]]:
    """[(group key, index labels of its rows)] in sorted order; one group "all" when `by` is empty."""
    if not by:
        return [((), keys.index.to_numpy())]
    return [(key if isinstance(key, tuple) else (key,), part.index.to_numpy())
            for key, part in keys.groupby(list(by), sort=True)]


def group_name(by, key: tuple) -> str:
    return " ".join(f"{c}={v}" for c, v in zip(by, key, strict=True)) or "all"


def layer_chunks(layers: list[int], n_rows: int, d_model: int, memory_gb: float) -> list[list[int]]:
    """Split `layers` so that one chunk of float32 activations for `n_rows` rows takes at most a quarter
    of `memory_gb` (the rest is the solver's)."""
    per_layer = max(1, n_rows * d_model * 4)
    size = int(max(1, min(len(layers), memory_gb * 2**30 / 4 // per_layer)))
    return [layers[i:i + size] for i in range(0, len(layers), size)]


def read_checked(store, rows: np.ndarray, layers: list[int], pool: str, group: str, device=None):
    """float32 [len(rows), len(layers), d] read through the store, refusing NaN or inf with the group,
    layer and item named. With `device` (an accelerator the solver runs on), a torch tensor there: a store on
    disk copies its stored bits and they are decoded and checked on the device, not by the host."""
    X = store.read_layers(layers, rows=rows, pool=pool, device=device)
    if device is not None:
        import torch

        finite_of, where = torch.isfinite, lambda mask: torch.nonzero(mask)[0].tolist()
    else:
        finite_of, where = np.isfinite, lambda mask: np.argwhere(mask)[0]
    if bool(finite_of(X.sum())):  # one pass, no mask: a NaN or inf makes the sum NaN or inf (an overflow is rechecked)
        return X
    finite = finite_of(X)
    if not bool(finite.all()):
        row, j, _ = where(~finite)
        item = store.keys["item_id"].iloc[int(rows[row])]
        raise BabelprobeError(f"group {group}: {pool} activations of layer {layers[j]} are NaN or inf for item "
                              f"{item!r}; re-extract in float32 or leave the item out")
    return X


def in_memory(store, layers: list[int], pool: str, memory_gb: float):
    """The store's `layers` read once into an `ArrayStore` when they take at most half of `memory_gb`,
    else the store itself (read group by group). One sequential read is much faster than one read per
    group when groups interleave in the store (item sets are often ordered by pair)."""
    if isinstance(store, ArrayStore):
        return store
    size = len(store.keys) * len(layers) * store.d_model * 4
    if size > memory_gb * 2**30 / 2:
        return store
    cached = ArrayStore(store.keys, **{pool: store.read_layers(layers, pool=pool)}, layers=layers,
                        n_layers=store.n_layers)
    cached.path, cached.manifest = getattr(store, "path", "<store>"), getattr(store, "manifest", {})
    cached.fingerprint, cached.items_hash = getattr(store, "fingerprint", None), getattr(store, "items_hash", None)
    if hasattr(store, "load_items"):
        cached.load_items = store.load_items
    return cached
