"""The readouts of an intervention, the same for every edit source: what the model and the probe say
about the same minimal pairs with an edit open on the model and without it.

    unit = Unit(lm, items, settings, probes)              # the items of one unit of a run
    base = unit.read()                                     # no edit: direct, meta, and states for the probe
    after = unit.read(Intervention(lm, {6: edit}), [6])    # any context manager that puts an edit on the model
    frame = unit.frame(base, after, probe_before, probe_after)   # one row per pair, `_base` columns beside

Per pair:
  - direct: the sum log-prob of the acceptable and of the unacceptable sentence (`score_direct`, the scorer
    `compare` uses), their margin and whether it is positive;
  - meta: the margin and verdict of the metalinguistic question (`score_meta`, compare's settings);
  - probe: the probe's scores of both sentences on the pooled states re-read at a layer under the edit
    (the probe's pooling), their margin and verdict, and the probe's balanced accuracy on the unit's items.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from babelprobe.items import strongest_distractor, to_pairs
from babelprobe.models import LoadedModel, length_batches, pad_batch

READOUTS = ("direct", "meta", "probe")


@dataclass
class Readouts:
    """What one pass over a unit's items read: per pair_id (direct: score_good, score_bad; meta: margin,
    correct), and the pooled states of every item at some layers ({layer: [n items, d]})."""

    direct: pd.DataFrame | None = None
    meta: pd.DataFrame | None = None
    states: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class Unit:
    """The items of one unit of a run (the edit source says what a unit is: a probe group, a language)
    and how to read them. `settings` is the run's `Settings` (readouts, reduction, rule, prompts,
    positions); `pool` the pooling the probe reads."""

    lm: LoadedModel
    items: pd.DataFrame
    settings: object
    pool: str = "last"
    batch_tokens: int = 4096

    def __post_init__(self):
        self.items = self.items.reset_index(drop=True)
        # a multiple-choice question's row: the direct and probe readouts compare its gold item with its
        # strongest distractor under each condition (items.strongest_distractor)
        self.pairs = to_pairs(self.items, strongest_distractor(self.items))
        self.labels = self.items["label"].to_numpy(int)

    def read(self, edit=None, layers=(), last_only: bool = False) -> Readouts:
        """The readouts with `edit` open on the model (a context manager: `Intervention`, `deactivated`;
        None: no edit) and the pooled states at `layers` (read when the probe readout is asked for, or
        without an edit: the edit sources need the unedited states). `last_only`: the edit applies only at
        each text's last token (an `Intervention`, whose `where` is set for every batch)."""
        from contextlib import nullcontext

        from babelprobe.benchmarks.direct import score_direct
        from babelprobe.benchmarks.meta import score_meta

        settings, out = self.settings, Readouts()
        with edit if edit is not None else nullcontext() as hooks:
            if "direct" in settings.readouts:
                direct = score_direct(self.lm, self.items, reduction=settings.reduction,
                                      batch_tokens=self.batch_tokens, progress=False)
                out.direct = direct.set_index("pair_id")[["score_good", "score_bad"]]
            if "meta" in settings.readouts:
                meta = score_meta(self.lm, self.items, rule=settings.rule, reduction=settings.reduction,
                                  prompts=settings.prompts, batch_tokens=self.batch_tokens, progress=False)
                out.meta = meta.set_index("pair_id")[["margin", "correct"]]
            layers = sorted(set(layers))
            if layers and ("probe" in settings.readouts or edit is None):
                states = pooled_states(self.lm, self.items["text"].tolist(), layers, self.pool,
                                       hooks if last_only and edit is not None else None, self.batch_tokens)
                out.states = dict(zip(layers, np.moveaxis(states, 1, 0)))
        return out

    def probe_readout(self, probe, X: np.ndarray | None) -> dict:
        """The probe's scores of the pairs' sentences on the states X [n items, d] and its balanced
        accuracy on the items ({} when the probe readout is not asked for)."""
        if "probe" not in self.settings.readouts or X is None:
            return {}
        from sklearn.metrics import balanced_accuracy_score

        scores = pd.Series(probe.score(X), index=self.items["item_id"].to_numpy())
        strongest = strongest_distractor(self.items, scores)
        return {"good": scores.loc[self.pairs["item_id_good"]].to_numpy(),
                "bad": scores.loc[strongest.loc[self.pairs["pair_id"]]].to_numpy(),
                "bacc": balanced_accuracy_score(self.labels, scores.to_numpy() > 0), "refit": np.nan}

    def frame(self, base: Readouts, after: Readouts, probe_before: dict | None = None,
              probe_after: dict | None = None, keys=()) -> pd.DataFrame:
        """One row per pair: `pair_id`, `language`, `subset` (and `keys`), then each readout with the edit
        and without it (`_base`)."""
        columns = list(dict.fromkeys(["pair_id", "language", "subset", *keys]))
        pairs = self.pairs
        frame = pairs[columns].copy()
        if after.direct is not None:
            for name, scores in (("", after.direct), ("_base", base.direct)):
                good = scores.loc[pairs["pair_id"], "score_good"].to_numpy()
                bad = scores.loc[pairs["pair_id"], "score_bad"].to_numpy()
                frame[f"direct_score_good{name}"], frame[f"direct_score_bad{name}"] = good, bad
                frame[f"direct_margin{name}"] = good - bad
                frame[f"direct_correct{name}"] = good > bad
        if after.meta is not None:
            for name, meta in (("", after.meta), ("_base", base.meta)):
                frame[f"meta_margin{name}"] = meta.loc[pairs["pair_id"], "margin"].to_numpy()
                frame[f"meta_correct{name}"] = meta.loc[pairs["pair_id"], "correct"].to_numpy(bool)
        if probe_after:
            frame["probe_score_good"], frame["probe_score_bad"] = probe_after["good"], probe_after["bad"]
            for name, readout in (("", probe_after), ("_base", probe_before)):
                frame[f"probe_margin{name}"] = readout["good"] - readout["bad"]
                frame[f"probe_correct{name}"] = readout["good"] > readout["bad"]
            frame["probe_bacc"], frame["probe_bacc_base"] = probe_after["bacc"], probe_before["bacc"]
            frame["refit_f1"], frame["refit_f1_base"] = probe_after["refit"], probe_before["refit"]
        return frame


def pooled_states(lm: LoadedModel, texts: list[str], layers: list[int], pool: str = "last",
                  intervention=None, batch_tokens: int = 4096) -> np.ndarray:
    """float32 [n, len(layers), d]: the texts' pooled states read by the hf backend's hooks (the same
    capture as `babelprobe extract`), under whatever edits are open. With `intervention` (an
    `edits.Intervention`), its edits apply only at each text's last token (`where` is set for every batch)."""
    from babelprobe.extract.backends import make_backend
    from babelprobe.extract.capture import Pooler

    layers = sorted(layers)
    encodings = lm.encode(texts)
    out = np.empty((len(texts), len(layers), lm.d_model), dtype=np.float32)
    with make_backend("hf", lm, layers) as backend, torch.inference_mode():
        for batch in length_batches([len(e.ids) for e in encodings], batch_tokens):
            padded = pad_batch([encodings[i] for i in batch], lm.pad_token_id, "right", lm.device)
            pooler = Pooler(padded["attention_mask"], (pool,), len(layers), lm.d_model, lm.bos_policy == "bos")
            if intervention is not None:
                intervention.where = (pooler.rows, pooler.last_index)
            backend.run(padded, pooler)
            out[batch] = pooler.result()[pool]
    if intervention is not None:
        intervention.where = None
    return out
