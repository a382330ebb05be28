"""The probe-direction edit source (`--method steer,ablate,leace`): edit the residual stream at a layer
along a probe's direction, or along control directions edited the same way.

Units are the probe groups (language × subset by default; column `probe_group`). For each group and
each of its layers (`--layers peak`: the group's peak layer in the probe results; or numbers and
ranges), the group's items are read once without an edit (the baseline) and once per method ×
direction × α with the edit in place (`edits.Intervention`: forward hooks at that layer, every token
or only each text's last). Directions: the probe's, `--random N` random ones and a shuffled-label
probe's (`directions.py`). α = 0 is the identity edit, read once and shared by every direction.

Columns of its rows, after the keys: `layer` (the edited layer), `layer_rule` (peak or chosen),
`method`, `ablate_to`, `positions`, `direction` (probe, random, shuffled), `draw` (which random
direction), `alpha`, `sigma` (the states' standard deviation along the probe's direction: steering's
unit), `edit_norm` (mean norm of the change at the edited layer), `probe_f1` and `peak_layer` (the
sweep's cross-validated F1 at the layer, the group's peak), `n_items`. The probe readout adds, per
group, the probe's balanced accuracy on the items and the cross-validated F1 of a probe refitted on
the edited states (ablate, leace; cross-fitted for the probe's own direction, `_crossfit_f1`, since
erasing a direction fitted on every row leaks the held-out rows' labels). Ablating the probe's own
direction must bring its balanced accuracy to chance: the sanity check (`analysis.interventions.sanity`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.extract.layers import is_peak
from babelprobe.interventions.directions import (
    METHODS,
    ProbeSource,
    edit_size,
    group_directions,
    layer_plan,
    make_edit,
)
from babelprobe.interventions.edits import Intervention
from babelprobe.interventions.source import EditSource


class ProbeDirections(EditSource):
    """Edits along probe directions (module docstring)."""

    name = "probe_directions"
    methods = METHODS
    unit = "probe_group"
    columns = ("layer", "layer_rule", "method", "ablate_to", "positions", "direction", "draw", "alpha", "sigma",
               "edit_norm", "probe_f1", "peak_layer", "n_items")

    def __init__(self, settings, items: pd.DataFrame, probes, inputs: dict):
        super().__init__(settings, items, probes, inputs)
        if probes is None:
            raise BabelprobeError(f"--method {','.join(settings.methods)} edits along probe directions: give --probes "
                                  "(a compare directory, a probe result or an activation store)")
        probes.check(items, settings.layers)

    def identity(self) -> dict:
        return {"probes": self.found.digest}

    def check_model(self, lm) -> None:
        self.found.check_model(lm)

    def ready(self, probes: ProbeSource) -> None:
        self.probes = probes

    def units(self, items: pd.DataFrame) -> pd.DataFrame:
        """The labelled items with `probe_group`: their probe group's name."""
        items = items[items["label"].isin([0, 1])].copy()
        by = list(self.found.by)
        items["probe_group"] = items[by].astype(str).agg("/".join, axis=1) if by else "all"
        return items

    def unit_rows(self, unit) -> pd.DataFrame:
        """Every row of one probe group: baseline once, then each edit."""
        settings, probes, by = self.settings, self.probes.probes, list(self.probes.by)
        items = unit.items
        key = tuple(items[by].astype(str).iloc[0]) if by else ()
        group = dict(zip(by, key)) if by else None
        name = "/".join(key) or "all"
        layers = layer_plan(self.probes, items, settings.layers)[key]
        base = unit.read(None, layers)
        f1 = _f1_lookup(self.probes, group)
        frames = []
        for layer in layers:
            X = base.states[layer]
            dirs = group_directions(probes, group, layer, X, unit.labels, name=name, n_random=settings.n_random,
                                    shuffled=settings.shuffled, seed=settings.seed, leace="leace" in settings.methods)
            probe = probes.probe(group, layer)
            before = unit.probe_readout(probe, X)
            if before and _wants_refit(settings):
                before["refit"] = _refit_f1(X, layer, items, settings)
            for method in settings.methods:
                identity = None
                for alpha in settings.alphas_for(method):
                    for kind in dirs.units:
                        edit = make_edit(method, kind, alpha, dirs, settings.ablate_to)
                        hooks = Intervention(unit.lm, {layer: edit})
                        last_only = settings.positions == "last"
                        if alpha == 0:  # the identity edit: read once, shared by every direction
                            identity = identity or unit.read(hooks, [layer], last_only)
                            after = identity
                        else:
                            after = unit.read(hooks, [layer], last_only)
                        after_probe = unit.probe_readout(probe, after.states.get(layer))
                        erases = method != "steer"
                        if after_probe and erases:
                            after_probe["refit"] = (_crossfit_f1(X, items, settings, method, probe.C, alpha)
                                                    if kind == "probe" else _refit_f1(after.states[layer], layer,
                                                                                      items, settings))
                        frame = unit.frame(base, after, before, after_probe, keys=by)
                        direction, _, draw = kind.partition("-")
                        labels = {"layer": layer,
                                  "layer_rule": "peak" if is_peak(settings.layers) else "chosen",
                                  "method": method, "ablate_to": settings.ablate_to if method == "ablate" else "",
                                  "positions": settings.positions, "direction": direction, "draw": int(draw or 0),
                                  "alpha": alpha, "sigma": dirs.sigma, "edit_norm": edit_size(edit, X),
                                  "probe_f1": f1.get(layer, np.nan), "peak_layer": f1.get("peak", np.nan),
                                  "n_items": len(items)}
                        frames.append(insert_columns(frame, labels, after=len(dict.fromkeys(
                            ["pair_id", "language", "subset", *by]))))
        return pd.concat(frames, ignore_index=True)


def insert_columns(frame: pd.DataFrame, labels: dict, after: int = 3) -> pd.DataFrame:
    """`frame` with the columns `labels` (one value each) inserted after its first `after` columns."""
    for i, (column, value) in enumerate(labels.items()):
        frame.insert(after + i, column, value)
    return frame


def _wants_refit(settings) -> bool:
    return "probe" in settings.readouts and any(m != "steer" for m in settings.methods)


def _refit_f1(X: np.ndarray, layer: int, items: pd.DataFrame, settings) -> float:
    """Cross-validated F1 (pairs kept in one fold) of a fresh probe on the states X [n, d]."""
    from babelprobe.probes.run import probe as probe_sweep
    from babelprobe.probes.source import ArrayStore

    keys = items[["item_id", "pair_id", "language", "subset", "label"]].reset_index(drop=True)
    folds = min(settings.refit_folds, keys["pair_id"].nunique())
    if folds < 2:
        return np.nan
    store = ArrayStore(keys, last=X[:, None, :], layers=[layer], n_layers=max(layer, 1))
    result = probe_sweep(store, by=(), folds=folds, seed=settings.seed, n_boot=0, workers=1)
    return float(result.table["f1_mean"].iloc[0])


def _crossfit_f1(X: np.ndarray, items: pd.DataFrame, settings, method: str, C: float, alpha: float) -> float:
    """Cross-validated F1 of a fresh probe after erasing the probe's own direction, cross-fitted: in each
    fold the direction (or LEACE eraser) is fitted on that fold's training rows only and applied to the
    un-intervened states X [n, d] of every row. At the edited layer the model's states are exactly that
    edit of X (the edit acts on each token's state; pooled states: the last token's, or a mean, which an
    affine edit commutes with when every position is edited).

    Why not refit on the states the all-rows probe's edit produced: that direction was fitted with the
    held-out rows' labels, and erasing it leaks them. On xcomps-sample (Gemma-3-270M, peak layers) the
    refitted F1 averaged over every group rose from 0.68 to 0.91 that way, while cross-fitted it fell a
    little in the three groups checked (0.73 → 0.71, 0.61 → 0.59, 0.88 → 0.87)."""
    from babelprobe.interventions.directions import fold_edit
    from babelprobe.probes.folds import make_folds
    from babelprobe.probes.metrics import f1_scores
    from babelprobe.probes.solvers import fit_predict

    labels, pair_ids = items["label"].to_numpy(int), items["pair_id"].to_numpy()
    folds = min(settings.refit_folds, len(np.unique(pair_ids)))
    if folds < 2:
        return np.nan
    fold = make_folds(labels, pair_ids, folds, seed=settings.seed)
    h = torch.as_tensor(np.asarray(X, dtype=np.float32))
    f1 = []
    for k in range(folds):
        train = fold != k
        edited = fold_edit(method, X[train], labels[train], C, alpha, settings.ablate_to)(h).numpy()
        scores = fit_predict(edited[:, None, :], labels[None], train[None])[0, 0]  # C = 1, as `_refit_f1`'s sweep
        f1.append(f1_scores(scores[~train], labels[~train]))
    return float(np.mean(f1))


def _f1_lookup(source: ProbeSource, group: dict | None) -> dict:
    """{layer: the sweep's cross-validated F1 of this group, "peak": its peak layer}."""
    table, peaks = source.table, source.peaks
    for column, value in (group or {}).items():
        table = table[table[column].astype(str) == str(value)]
        peaks = peaks[peaks[column].astype(str) == str(value)]
    out = dict(zip(table["layer"].astype(int), table["f1_mean"].astype(float)))
    if len(peaks):
        out["peak"] = int(peaks["peak_layer"].iloc[0])
    return out
