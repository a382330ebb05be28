"""Probe weights kept for reuse: for every group × layer of a sweep, the probe fitted on all of the group's
items, with everything needed to apply it to new activations (and to steer along it).

    import babelprobe as bp
    probes = bp.load_probes("probes/neuro.probes.h5")
    probes.groups                                   # one row per group: language, subset, n_train, method ...
    scores = probes.score(X, ("en", "taxonomic"), layer=6)         # X [n, d] raw activations -> [n]
    u = probes.direction(("en", "taxonomic"), layer=6)             # unit vector in activation space
    p = probes.probe({"language": "en", "subset": "taxonomic"}, 6)  # one Probe: coef, intercept, mean, ...

A probe's score is `x·coef + intercept` on raw activations x of its layer (the pooling the sweep read,
`settings["pool"]`): the training rows' standardisation is folded into `coef` and `intercept`, so
`score(X)` equals scikit-learn's `make_pipeline(StandardScaler(), LogisticRegression(C)).decision_function(X)`
fitted on the same rows, and > 0 predicts label 1 (acceptable). `direction` is `coef / ‖coef‖`: the
direction in activation space along which the score rises fastest (by ‖coef‖ per unit of distance).

The file is plain HDF5, readable without babelprobe (format in docs/design.md "Probe weights"); no
pickle is involved in writing or reading it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.tables import atomic_path

FORMAT = "babelprobe.probes"
VERSION = 1
ARRAYS = ("coef", "intercept", "mean", "scale", "C")
# [groups, layers] arrays added after version 1 was out: written always, read when present (files written
# before them read as "unknown"), so files stay version 1 both ways
RECORDS = {"n_iter": (np.int64, -1), "conditioning": (np.float64, np.nan)}


@dataclass(frozen=True)
class Probe:
    """One fitted probe (a group at a layer). score(x) = x·coef + intercept on raw activations [.., d]."""

    group: dict
    layer: int
    coef: np.ndarray  # [d] weights on raw activations (= w / scale for the weights w on standardised ones)
    intercept: float
    mean: np.ndarray  # [d] the standardisation of the training rows (StandardScaler.mean_)
    scale: np.ndarray  # [d] (StandardScaler.scale_; 1 for constant features)
    C: float

    def score(self, X) -> np.ndarray:
        """Decision scores of activations X [..., d] (float64)."""
        return np.asarray(X, dtype=np.float64) @ self.coef + self.intercept

    def direction(self) -> np.ndarray:
        """The unit vector coef / ‖coef‖ in activation space."""
        return _unit(self.coef)

    @property
    def standardised_coef(self) -> np.ndarray:
        """The weights on standardised features (scikit-learn's `LogisticRegression.coef_[0]`)."""
        return self.coef * self.scale


class Probes:
    """The probes of a sweep, one per group × layer, fitted on all of each group's items.

    Attributes
    ----------
    groups : DataFrame, one row per group: the grouping columns (`by`), n_train, n_positive, method (the
        solver that fitted it: newton, lbfgs, plbfgs or sklearn; see `babelprobe.probes.solvers`).
    layers : the layer numbers (docs/design.md "Layers (numbering)").
    coef, mean, scale : float64 [groups, layers, d]; intercept, C : float64 [groups, layers].
    n_iter : int64 [groups, layers], the iterations the solver took for the probe (-1: not recorded);
    conditioning : float64 [groups, layers], the estimate of the layer's conditioning the choice of
        solver used (`probes.precondition.conditioning`: the spread of the eigenvalues of the correlation
        matrix of the group's activations, ~1 isotropic, ≫ 1 ill-conditioned; NaN: not estimated).
    by : the grouping columns; settings : the sweep's settings (pool, C, solver, store fingerprint, ...).
    """

    def __init__(self, groups: pd.DataFrame, layers, coef, intercept, mean, scale, C, by, settings: dict,
                 n_iter=None, conditioning=None):
        self.groups = groups.reset_index(drop=True)
        self.layers = [int(x) for x in layers]
        self.coef, self.intercept = np.asarray(coef, np.float64), np.asarray(intercept, np.float64)
        self.mean, self.scale, self.C = np.asarray(mean, np.float64), np.asarray(scale, np.float64), np.asarray(C)
        self.by = tuple(by)
        self.settings = dict(settings)
        shape = (len(self.groups), len(self.layers))
        for name, value in (("n_iter", n_iter), ("conditioning", conditioning)):
            dtype, missing = RECORDS[name]
            setattr(self, name, np.full(shape, missing, dtype) if value is None else np.asarray(value, dtype))
        for name in (*ARRAYS, *RECORDS):
            if getattr(self, name).shape[:2] != shape:
                raise BabelprobeError(f"probe weights: {name} has shape {getattr(self, name).shape}, expected "
                                      f"{shape} (groups × layers) first")

    def __repr__(self) -> str:
        return (f"Probes({len(self.groups)} groups by {list(self.by)} × layers {self.layers}, "
                f"d_model {self.d_model})")

    @property
    def d_model(self) -> int:
        return self.coef.shape[-1]

    # ---------------------------------------------------------------------------------------- lookup

    def group_index(self, group) -> int:
        """The row of `group` in `groups`: a dict {column: value}, a tuple in `by` order, a single value
        when grouped by one column, or None/"all" when the sweep had no grouping."""
        if not self.by:
            if group in (None, "all", ()):
                return 0
            raise BabelprobeError(f"these probes have one group ('all'); got {group!r}")
        if isinstance(group, dict):
            values = [group.get(c) for c in self.by]
        else:
            values = list(group) if isinstance(group, (tuple, list)) else [group]
        if len(values) != len(self.by) or any(v is None for v in values):
            raise BabelprobeError(f"a group is given by {', '.join(self.by)}; got {group!r}")
        match = np.ones(len(self.groups), dtype=bool)
        for column, value in zip(self.by, values, strict=True):
            match &= self.groups[column].astype(str).to_numpy() == str(value)
        if not match.any():
            known = ", ".join("/".join(map(str, row)) for row in self.groups[list(self.by)].itertuples(index=False))
            raise BabelprobeError(f"no probe for group {group!r}; the groups are {known}")
        return int(np.flatnonzero(match)[0])

    def layer_index(self, layer: int) -> int:
        if int(layer) not in self.layers:
            raise BabelprobeError(f"no probe at layer {layer}; the layers are {self.layers}")
        return self.layers.index(int(layer))

    def probe(self, group, layer: int) -> Probe:
        """The probe of `group` at `layer`."""
        g, j = self.group_index(group), self.layer_index(layer)
        return Probe(group=self.groups.loc[g, list(self.by)].to_dict(), layer=int(layer), coef=self.coef[g, j],
                     intercept=float(self.intercept[g, j]), mean=self.mean[g, j], scale=self.scale[g, j],
                     C=float(self.C[g, j]))

    # ----------------------------------------------------------------------------------------- apply

    def score(self, X, group, layer: int | None = None) -> np.ndarray:
        """Decision scores of raw activations: X [n, d] at `layer` -> [n]; or, with layer=None, X [n,
        len(layers), d] at every layer of these probes (as `store.read_layers(probes.layers)` returns) ->
        [n, len(layers)]."""
        X = np.asarray(X, dtype=np.float64)
        g = self.group_index(group)
        if layer is not None:
            if X.shape[-1] != self.d_model:
                raise BabelprobeError(f"activations have {X.shape[-1]} dims; the probes have {self.d_model}")
            j = self.layer_index(layer)
            return X @ self.coef[g, j] + self.intercept[g, j]
        if X.ndim != 3 or X.shape[1:] != (len(self.layers), self.d_model):
            raise BabelprobeError(f"score(X, group) needs X [n, {len(self.layers)} layers, {self.d_model}]; got "
                                  f"{X.shape} (or pass layer=)")
        return np.einsum("nld,ld->nl", X, self.coef[g]) + self.intercept[g]

    def direction(self, group, layer: int) -> np.ndarray:
        """The probe's unit direction in activation space (coef / ‖coef‖), [d]: adding ε·direction to an
        activation raises its score by ε·‖coef‖."""
        g, j = self.group_index(group), self.layer_index(layer)
        return _unit(self.coef[g, j])

    def table(self) -> pd.DataFrame:
        """One row per group × layer: the grouping columns, layer, C, intercept and ‖coef‖."""
        rows = self.groups.loc[np.repeat(np.arange(len(self.groups)), len(self.layers))].reset_index(drop=True)
        rows["layer"] = np.tile(self.layers, len(self.groups))
        rows["C"] = self.C.ravel()
        rows["intercept"] = self.intercept.ravel()
        rows["coef_norm"] = np.linalg.norm(self.coef, axis=-1).ravel()
        rows["n_iter"] = self.n_iter.ravel()
        rows["conditioning"] = self.conditioning.ravel()
        return rows

    # ---------------------------------------------------------------------------------------- files

    def write(self, path: str | Path) -> Path:
        """Write the probes as one HDF5 file (atomically: complete or not at all)."""
        import h5py

        path = Path(path)
        strings = h5py.string_dtype("utf-8")
        with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            f.attrs["format"], f.attrs["version"] = FORMAT, VERSION
            f.attrs["by"] = json.dumps(list(self.by))
            f.attrs["settings"] = json.dumps(self.settings, default=str)
            f.create_dataset("layers", data=np.asarray(self.layers, dtype=np.int64))
            for name in ARRAYS:
                f.create_dataset(name, data=np.asarray(getattr(self, name), dtype=np.float64))  # no copy when float64
            for name, (dtype, _) in RECORDS.items():
                f.create_dataset(name, data=getattr(self, name).astype(dtype))
            table = f.create_group("groups", track_order=True)
            for column in self.groups.columns:
                values = self.groups[column]
                if pd.api.types.is_integer_dtype(values):
                    table.create_dataset(column, data=values.to_numpy(np.int64))
                else:
                    table.create_dataset(column, data=values.astype(str).to_numpy(object), dtype=strings)
        return path

    @classmethod
    def read(cls, path: str | Path) -> Probes:
        import h5py

        path = Path(path)
        if not path.exists():
            raise BabelprobeError(f"no probe weights at {path} (written by `babelprobe probe` as NAME.probes.h5 "
                                  "beside NAME.csv)")
        try:
            with h5py.File(path, "r") as f:
                if f.attrs.get("format") != FORMAT:
                    raise BabelprobeError(f"{path} is not a babelprobe probe file (format attribute "
                                          f"{f.attrs.get('format')!r})")
                if int(f.attrs["version"]) > VERSION:
                    raise BabelprobeError(f"{path} has probe format version {int(f.attrs['version'])}; this "
                                          f"babelprobe reads up to {VERSION}: upgrade babelprobe")
                groups = pd.DataFrame({column: _column(f["groups"][column]) for column in f["groups"]})
                arrays = {name: f[name][()] for name in ARRAYS}
                records = {name: f[name][()] for name in RECORDS if name in f}
                return cls(groups, f["layers"][()], **arrays, by=json.loads(f.attrs["by"]),
                           settings=json.loads(f.attrs["settings"]), **records)
        except OSError as err:
            raise BabelprobeError(f"cannot read probe weights {path}: {err}") from err
        except KeyError as err:
            raise BabelprobeError(f"probe weights {path} lack {err}; the file is incomplete or not babelprobe's") from err


def solver_record(kept: list[dict]) -> dict:
    """What the solvers did over a sweep's groups, for its settings: the methods (groups fitted by each),
    and the iterations of every problem (folds and all-rows probe) × layer: median and max. `kept` are the
    per-group records (`method`, `n_iter_all`: [problems, layers] arrays, one per chunk of layers)."""
    methods = pd.Series([k["method"] for k in kept]).value_counts().sort_index()
    iterations = np.concatenate([np.ravel(a) for k in kept for a in k["n_iter_all"]] or [np.zeros(0)])
    return {"methods": {str(m): int(c) for m, c in methods.items()},
            "n_iter_median": float(np.median(iterations)) if len(iterations) else None,
            "n_iter_max": int(iterations.max()) if len(iterations) else None}


def load_probes(path: str | Path) -> Probes:
    """The probes a sweep kept (`NAME.probes.h5` beside `NAME.csv`): see `Probes`."""
    return Probes.read(path)


def _column(dataset) -> np.ndarray:
    if dataset.dtype.kind in "OS":
        return dataset.asstr()[()]
    return dataset[()]


def _unit(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v)
    if norm == 0:
        raise BabelprobeError("this probe has zero weights (the constant classifier): it has no direction")
    return v / norm
