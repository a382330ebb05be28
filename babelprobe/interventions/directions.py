"""The probes an intervention reads and edits along, their directions, and the edits built on them.

Probes come from `find_probes(spec, items)`, which checks them without fitting or writing anything:
  - a compare directory (`neuro.csv` and its `neuro.probes.h5`, written by `babelprobe compare`);
  - a probe result (`NAME.csv`/`NAME.parquet` or `NAME.probes.h5`, written by `babelprobe probe`);
  - an activation store (a directory with `manifest.json`, or a compare directory with only `acts/`):
    `FreshProbes`, fitted by the probe sweep (`babelprobe.probes.probe`: language × subset groups, 5
    grouped folds, or fewer when a group has fewer pairs) once the run starts (`ready(out)`) and kept
    under OUT/probes/.
Either says which layers and groups it has (`check(items, layers)`: a one-line error before any work)
and which model it was made on (`check_model(lm)`). The per-layer F1 table and the peaks come with the
probes (for `--layers peak` and the F1-vs-effect figure).

For one probe group (language × subset by default) at one layer, `group_directions` gathers, from the
group's un-intervened states X [n, d] (the probe's pooling) and labels:
  - `probe`: the probe's unit direction ŵ = coef/‖coef‖ (`Probes.direction`);
  - `random-K`: unit vectors drawn from a standard normal (seed, group, layer and K fix each one);
  - `shuffled`: the unit direction of a probe fitted the same way (same C) on the group's labels permuted;
  - σ: the standard deviation of X·ŵ over the group's items (steering's unit: α·σ), and for each
    direction the two class means of the component along it and its overall mean;
  - for LEACE, erasers fitted on the true and on the permuted labels.

`make_edit(method, direction, alpha, ...)`:
  steer   h + α·σ·u  (u = ŵ or a control direction: every edit has the same norm α·σ);
  ablate  the component along u moved to 0 (`ablate_to="zero"`: u projected out) or to the mean of the
          two class-conditional means of the component (`"mean"`: every text gets the same component,
          one that lies between the classes, and the class sizes do not pull it), scaled by α (1: fully);
  leace   LEACE's eraser fitted on the true labels (`probe`) or the permuted ones (`shuffled`); the
          random control erases a random direction the same affine way: its component set to its mean.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.extract.layers import is_peak
from babelprobe.interventions.edits import Edit, Erase, Project, Steer, fit_leace
from babelprobe.probes.controls import group_rng
from babelprobe.probes.weights import Probes
from babelprobe.runs import LAYOUTS

METHODS = ("steer", "ablate", "leace")
ABLATE_TO = ("zero", "mean")
STORE_GROUPS = ("language", "subset")  # fresh probes from a store: the sweep's default groups


class _Checks:
    """What `ProbeSource` and `FreshProbes` share: their inputs checked against the items, the layers
    asked for and the model, before any work."""

    origin: Path
    by: tuple
    layers: list[int]
    d_model: int
    fingerprint: str | None

    def group_keys(self, items: pd.DataFrame) -> list[tuple]:
        by = list(self.by)
        items = items[items["label"].isin([0, 1])]
        return [()] if not by else [tuple(k) for k in items[by].astype(str).drop_duplicates().itertuples(
            index=False, name=None)]

    def check(self, items: pd.DataFrame, layers: str | None) -> None:
        """One-line errors: a group of the items without probes here, or a layer (`--layers`, numbers)
        the probes do not cover."""
        from babelprobe.extract.layers import parse_layers

        known = self.known_groups()
        for key in self.group_keys(items):
            if key not in known:
                listed = ", ".join("/".join(k) for k in sorted(known)) or "none"
                raise BabelprobeError(f"--probes {self.origin}: no probes for {'/'.join(key)} "
                                      f"({', '.join(self.by)}); its groups are {listed}")
        if layers is not None and not is_peak(layers):
            chosen = parse_layers(layers, 10**6)  # the grammar only; the probes' layers below
            missing = [x for x in chosen if x not in self.layers]
            if missing:
                raise BabelprobeError(f"--layers {layers!r}: no probe at layer {missing[0]}; the probes cover layers "
                                      f"{self.layers[0]}..{self.layers[-1]}")

    def check_model(self, lm) -> None:
        if self.d_model != lm.d_model:
            raise BabelprobeError(f"the probes in {self.origin} have {self.d_model} dims, model {lm.name} has "
                                  f"{lm.d_model}: they were fitted on another model's activations")
        if self.fingerprint and self.fingerprint != lm.fingerprint:
            raise BabelprobeError(f"the probes in {self.origin} were fitted on another model (fingerprint "
                                  f"{self.fingerprint}, this model {lm.fingerprint})")

    def known_groups(self) -> set[tuple]:
        raise NotImplementedError


@dataclass
class ProbeSource(_Checks):
    """Probes with their sweep's tables, and where they came from."""

    probes: Probes
    table: pd.DataFrame  # one row per group × layer: f1_mean, ... (neuro.csv)
    peaks: pd.DataFrame  # one row per group: peak_layer, ...
    origin: Path
    digest: str  # of the probe weights: a change of probes is a change of run identity
    compare_dir: Path | None = None  # a compare directory, whose meta settings and tables we reuse

    @property
    def pool(self) -> str:
        return str(self.probes.settings.get("pool", "last"))

    @property
    def by(self) -> tuple:
        return tuple(self.probes.by)

    @property
    def layers(self) -> list[int]:
        return self.probes.layers

    @property
    def d_model(self) -> int:
        return self.probes.d_model

    @property
    def fingerprint(self) -> str | None:
        return self.probes.settings.get("fingerprint")

    def known_groups(self) -> set[tuple]:
        if not self.by:
            return {()}
        return {tuple(map(str, k)) for k in self.probes.groups[list(self.by)].itertuples(index=False, name=None)}

    def ready(self, out=None, seed: int = 0, progress: bool = False) -> ProbeSource:
        return self


@dataclass
class FreshProbes(_Checks):
    """An activation store to fit probes from (`ready` fits them into OUT/probes/neuro.csv)."""

    store: Path
    items: pd.DataFrame | None = None
    compare_dir: Path | None = None

    def __post_init__(self):
        from babelprobe.extract import open_store

        opened = open_store(self.store)
        self.origin, self.by = self.store, STORE_GROUPS
        self.layers, self.d_model, self.fingerprint = opened.layers, opened.d_model, opened.fingerprint
        keys = opened.keys
        self.keys = keys[keys["label"].isin([0, 1])]
        self.digest = "store-" + _file_digest(self.store / LAYOUTS["store"].manifest)

    def known_groups(self) -> set[tuple]:
        return {tuple(map(str, k)) for k in self.keys[list(self.by)].drop_duplicates().itertuples(index=False,
                                                                                                  name=None)}

    def check(self, items: pd.DataFrame, layers: str | None) -> None:
        super().check(items, layers)
        smallest = int(self.keys.groupby(list(self.by))["pair_id"].nunique().min())
        if smallest < 2:
            raise BabelprobeError(f"the store {self.store} has a language × subset group with one pair: too few to "
                                  "fit probes")

    def ready(self, out, seed: int = 0, progress: bool = False) -> ProbeSource:
        """Fit the probes (or read those an earlier run of the same identity fitted) into OUT/probes/."""
        from babelprobe.probes.run import ProbeResult, probe

        target = Path(out) / "probes" / "neuro.csv"
        if target.exists() and target.with_name("neuro.probes.h5").exists():
            result = ProbeResult.read(target)
        else:
            smallest = int(self.keys.groupby(list(self.by))["pair_id"].nunique().min())
            result = probe(self.store, folds=min(5, smallest), seed=seed, items=self.items, progress=progress)
            result.write(target)
        return ProbeSource(result.probes, result.table, result.peaks, target,
                           _file_digest(result.paths(target)["probes"]), self.compare_dir)


def find_probes(spec: str | Path, items: pd.DataFrame | None = None) -> ProbeSource | FreshProbes:
    """The probes named by `spec` (module docstring), read but not fitted: nothing is written."""
    path = Path(spec)
    if not path.exists():
        raise BabelprobeError(f"--probes {spec}: no such file or directory")
    compare_dir = path if (path / LAYOUTS["compare"].manifest).exists() else None
    if path.is_dir():
        result_file = next((path / n for n in ("neuro.csv", "neuro.parquet") if (path / n).exists()), None)
        if result_file is None:
            store = path if (path / LAYOUTS["store"].manifest).exists() else path / "acts"
            if not (store / LAYOUTS["store"].manifest).exists():
                raise BabelprobeError(f"--probes {spec}: not a compare directory, probe result or activation store "
                                      "(no neuro.csv, no manifest.json, no acts/)")
            return FreshProbes(store=store, items=items, compare_dir=compare_dir)
    elif path.name.endswith(".probes.h5"):
        stem = path.name.removesuffix(".probes.h5")
        result_file = next((path.with_name(stem + ext) for ext in (".csv", ".parquet")
                            if path.with_name(stem + ext).exists()), None)
        if result_file is None:
            raise BabelprobeError(f"--probes {spec}: the probe table {stem}.csv beside it is missing")
    else:
        result_file = path
    return _saved_probes(result_file, compare_dir)


def load_probe_source(spec: str | Path, out: str | Path | None = None, items: pd.DataFrame | None = None,
                      seed: int = 0, progress: bool = False) -> ProbeSource:
    """The probes named by `spec`, fitted afresh into OUT/probes/ when `spec` is a store."""
    found = find_probes(spec, items)
    if isinstance(found, FreshProbes) and out is None:
        raise BabelprobeError("fitting fresh probes from a store needs an output directory to keep them in")
    return found.ready(out, seed, progress)


def _saved_probes(result_file: Path, compare_dir: Path | None) -> ProbeSource:
    from babelprobe.probes.run import ProbeResult

    try:
        result = ProbeResult.read(result_file)
    except BabelprobeError:
        raise
    except Exception as err:  # a damaged or foreign table: say which, in one line
        raise BabelprobeError(f"cannot read the probe result {result_file}: {str(err).splitlines()[0]}") from err
    weights = result_file.with_name(result_file.with_suffix("").name + ".probes.h5")
    if result.probes is None:
        raise BabelprobeError(f"{result_file} has no probe weights beside it ({weights.name}; results made before "
                              "weights were kept): rerun `babelprobe probe` or `babelprobe compare` with --overwrite, "
                              "or pass the activation store as --probes to fit fresh probes")
    return ProbeSource(result.probes, result.table, result.peaks, result_file, _file_digest(weights), compare_dir)


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def layer_plan(source: ProbeSource, items: pd.DataFrame, spec: str) -> dict[tuple, list[int]]:
    """{group key (strings, in `by` order): layers} for the groups of `items`: each group's peak layer
    (`peak`) or the layers `spec` selects among the probes' layers (`source.check` has checked them)."""
    from babelprobe.extract.layers import parse_layers

    keys, by = source.group_keys(items), list(source.by)
    if is_peak(spec):
        peaks = source.peaks.copy()
        for column in by:
            peaks[column] = peaks[column].astype(str)
        peak_of = {tuple(row[by]): int(row["peak_layer"]) for _, row in peaks.iterrows()} if by else \
            {(): int(peaks["peak_layer"].iloc[0])}
        missing = [k for k in keys if k not in peak_of]
        if missing:
            raise BabelprobeError(f"no peak layer for group {'/'.join(missing[0])} in {source.origin}")
        return {k: [peak_of[k]] for k in keys}
    chosen = parse_layers(spec, source.layers)
    return {k: chosen for k in keys}


# ------------------------------------------------------------------------------------ per group × layer

@dataclass
class Directions:
    """A group's directions at one layer and the statistics the edits need (module docstring)."""

    layer: int
    units: dict[str, np.ndarray]  # "probe", "shuffled", "random-0", ... -> unit vector [d]
    sigma: float  # std of the states along the probe direction
    midpoint: dict[str, float]  # mean of the two class means of the component along each unit
    mean: dict[str, float]  # overall mean of the component along each unit
    erasers: dict = field(default_factory=dict)  # "probe", "shuffled" -> LeaceEraser (for leace)


def group_directions(probes: Probes, group, layer: int, X: np.ndarray, labels: np.ndarray, *, name: str,
                     n_random: int, shuffled: bool, seed: int, leace: bool) -> Directions:
    """The directions of `group` at `layer` from its un-intervened states X [n, d] and 0/1 labels."""
    X = np.asarray(X, dtype=np.float64)
    labels = np.asarray(labels, dtype=int)
    where = f"{name} layer {layer}"
    units = {"probe": probes.direction(group, layer)}
    for k in range(n_random):
        draw = group_rng(seed, where, f"random {k}").standard_normal(X.shape[1])
        units[f"random-{k}"] = draw / np.linalg.norm(draw)
    permuted = group_rng(seed, where, "shuffled labels").permutation(labels)
    if shuffled:
        units["shuffled"] = fitted_direction(X, permuted, probes.probe(group, layer).C,
                                             where=f"the shuffled-label control of {where}")
    components = {kind: X @ u for kind, u in units.items()}
    out = Directions(layer=layer, units=units, sigma=float(components["probe"].std()),
                     midpoint={k: _class_midpoint(c, labels) for k, c in components.items()},
                     mean={k: float(c.mean()) for k, c in components.items()})
    if leace:
        out.erasers["probe"] = fit_leace(X, labels)
        if shuffled:
            out.erasers["shuffled"] = fit_leace(X, permuted)
    return out


def fitted_direction(X: np.ndarray, labels: np.ndarray, C: float, where: str = "a probe") -> np.ndarray:
    """The unit direction of a logistic probe (standardised features, this C; the sweep's solver) fitted on
    all rows of X with these labels (permuted ones for the shuffled control); a one-line error saying why
    when the fit has no direction (`where` names the probe)."""
    from babelprobe.probes.solvers import fit_predict

    _, fit = fit_predict(X[:, None, :].astype(np.float32), labels[None], np.ones((1, len(labels)), dtype=bool), C,
                         return_fit=True)
    coef = fit.coef[0, 0]
    norm = np.linalg.norm(coef)
    if not np.isfinite(norm) or norm == 0:
        raise BabelprobeError(f"{where} has no direction: {why_no_direction(X, labels)}; for the shuffled control "
                              "pass --no-shuffled, or choose other --layers")
    return coef / norm


def why_no_direction(X: np.ndarray, labels: np.ndarray) -> str:
    """What made a probe fit on X [n, d] and 0/1 labels come out all zero (or not finite)."""
    counts = np.bincount(np.asarray(labels, dtype=int), minlength=2)
    if counts.min() == 0:
        return f"its {len(labels)} rows all have label {int(np.argmax(counts))}"
    X = np.asarray(X, dtype=np.float64)
    if not np.isfinite(X).all():
        return "its states hold NaN or infinite values"
    if np.ptp(X, axis=0).max() == 0:
        return (f"its {len(X)} states are identical (both labels present: {counts[0]} and {counts[1]}), so nothing "
                "separates them; e.g. layer 0 of texts that end in the same token")
    return f"the fit gave all-zero weights although both labels are present ({counts[0]} and {counts[1]})"


def fold_edit(method: str, X: np.ndarray, labels: np.ndarray, C: float, alpha: float, ablate_to: str) -> Edit:
    """The edit `make_edit` builds along the probe's own direction, with everything fitted on X [n, d] and
    labels only (one fold's training rows): the probe direction and class midpoint (ablate) or the LEACE
    eraser (leace). Used to cross-fit the refitted probe (`run._crossfit_f1`)."""
    if method == "leace":
        return Erase(fit_leace(X, labels), alpha)
    u = fitted_direction(X, labels, C)
    return Project(u, 0.0 if ablate_to == "zero" else _class_midpoint(X @ u, labels), alpha)


def _class_midpoint(component: np.ndarray, labels: np.ndarray) -> float:
    return float((component[labels == 1].mean() + component[labels == 0].mean()) / 2)


def make_edit(method: str, kind: str, alpha: float, d: Directions, ablate_to: str = "zero") -> Edit:
    """The edit of `method` along direction `kind` ("probe", "shuffled", "random-K") at strength α."""
    u = d.units[kind]
    if method == "steer":
        return Steer(alpha * d.sigma * u)
    if method == "ablate":
        if ablate_to not in ABLATE_TO:
            raise BabelprobeError(f"unknown --ablate-to {ablate_to!r}; use zero or mean")
        return Project(u, 0.0 if ablate_to == "zero" else d.midpoint[kind], alpha)
    if method == "leace":
        if kind in d.erasers:
            return Erase(d.erasers[kind], alpha)
        return Project(u, d.mean[kind], alpha)  # a random direction, erased the same affine way
    raise BabelprobeError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")


def edit_size(edit: Edit, X: np.ndarray) -> float:
    """Mean norm of the change the edit makes to the states X [n, d] (the pooled ones the probe reads)."""
    import torch

    h = torch.as_tensor(np.asarray(X, dtype=np.float32))
    return float(torch.linalg.vector_norm(edit(h) - h, dim=-1).mean())
