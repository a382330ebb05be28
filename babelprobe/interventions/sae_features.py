"""SAE feature ablation: an edit source of the interventions. Remove a set of sparse-autoencoder features
from the residual stream at the SAE's layer and read, on the same minimal pairs, whether the model's own
judgement changes.

    x' = x − Σ_{s∈S} f_s(x) W_dec[s]          at every token but BOS (f = the SAE's code of x)

For items of language L, S is L's `n_features` most language-specific features (highest monolinguality
ν, `babelprobe.sae.stats`); each control is a random set of as many features drawn among those that
fire on L's tokens (freq > 0), other than S (seeded per language and draw, `probes.controls.group_rng`).
An empty S leaves every state as it is. The readout is the direct score (`score_direct`: the sum
log-prob of each sentence), with and without the edit:

    ablate.csv   pair_id, language, subset, feature_set, method, margin, margin_base, correct
                 (+ layer, n_features, features): one row per pair × feature set; `feature_set` is
                 `language` or `random-K`, `method` the readout (`direct`), `margin` = score_good −
                 score_bad with the edit, `margin_base` without it, `correct` = margin > 0.
                 Joins a compare directory's items.csv on pair_id.

The edit is an `edits.Edit`, put on the model by `edits.Intervention` (the hooks intervene uses).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from babelprobe.interventions.edits import Edit, Intervention
from babelprobe.models import LoadedModel
from babelprobe.probes.controls import group_rng


class FeatureAblation(Edit):
    """h − Σ_{s∈S} f_s(h) W_dec[s] for the SAE features S (module docstring); with `skip_first`, each
    row's first position (BOS) is left as it is. Only S's pre-activations are computed for a JumpReLU
    or ReLU SAE (f_s depends on its own only); a top-k SAE's code needs all of them."""

    def __init__(self, sae, features, skip_first: bool = True):
        super().__init__()
        self.sae, self.skip_first = sae, skip_first
        self.features = np.asarray(sorted({int(s) for s in features}), dtype=np.int64)
        self._on: dict = {}

    def parts(self, device: torch.device) -> dict:
        """The SAE's tensors restricted to S, on `device` (copied once)."""
        key = str(device)
        if key not in self._on:
            sae, index = self.sae, torch.as_tensor(self.features)
            parts = {"W_dec": sae.W_dec.index_select(0, index), "W_enc": sae.W_enc.index_select(1, index),
                     "b_enc": sae.b_enc.index_select(0, index), "b_dec": sae.b_dec,
                     "threshold": sae.threshold.index_select(0, index) if sae.threshold is not None else None,
                     "norms": sae.W_dec.norm(dim=-1).index_select(0, index)}
            self._on[key] = {name: t.to(device) if t is not None else None for name, t in parts.items()}
        return self._on[key]

    def codes(self, h: torch.Tensor) -> torch.Tensor:
        """f_S(h) [..., |S|]: the codes of S, as the SAE's `encode` gives them."""
        sae = self.sae
        if sae.architecture == "topk":
            return sae.to(h.device).encode(h)[..., torch.as_tensor(self.features, device=h.device)]
        p = self.parts(h.device)
        x = h - p["b_dec"] if sae.apply_b_dec_to_input else h
        pre = x @ p["W_enc"] + p["b_enc"]
        if sae.architecture == "jumprelu":
            return pre.relu() * (pre > p["threshold"])
        return pre.relu()

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if len(self.features) == 0:
            return h
        p = self.parts(h.device)
        f = self.codes(h)
        if self.sae.architecture == "topk" and self.sae.rescale_acts_by_decoder_norm:
            f = f / p["norms"]
        edited = h - f @ p["W_dec"]
        if self.skip_first and h.ndim == 3:
            edited[:, 0] = h[:, 0]
        return edited


def feature_sets(stats, n_features: int, n_random: int, seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """{language: {"language": its n_features features of highest ν, "random-K": K-th control set}}
    from a stats pass (`babelprobe.sae.stats.SAEStats`)."""
    if n_features == 0:
        return {}
    top = stats.top_features(n_features)
    sets = {}
    for g, language in enumerate(stats.languages):
        chosen = {"language": top[language]}
        pool = np.setdiff1d(np.flatnonzero(stats.count[g] > 0), top[language])
        for k in range(n_random):
            size = min(n_features, len(pool))
            chosen[f"random-{k}"] = np.sort(group_rng(seed, language, f"random features {k}").choice(pool, size,
                                                                                                      replace=False))
        sets[language] = chosen
    return sets


def ablate_features(lm: LoadedModel, items: pd.DataFrame, sae, sets: dict, *, reduction: str = "sum",
                    batch_tokens: int = 4096, progress: bool = False) -> pd.DataFrame:
    """ablate.csv's rows (module docstring) for the feature `sets` of each language (`feature_sets`)."""
    from tqdm.auto import tqdm

    from babelprobe.benchmarks.direct import score_direct

    columns = ["pair_id", "language", "subset", "feature_set", "method", "margin", "margin_base", "correct",
               "layer", "n_features", "features"]
    frames = []
    skip_first = lm.bos_policy == "bos"
    labelled = items[items["label"].isin([0, 1])]
    work = [(language, name, features) for language, chosen in sets.items() for name, features in chosen.items()]
    bar = tqdm(total=len(work), desc="ablate", unit="set", disable=not progress)
    for language, chosen in sets.items():
        part = labelled[labelled["language"].astype(str) == language]
        if part.empty:
            continue
        base = _margins(score_direct(lm, part, reduction=reduction, batch_tokens=batch_tokens, progress=False))
        for name, features in chosen.items():
            with Intervention(lm, {sae.layer: FeatureAblation(sae, features, skip_first)}):
                after = _margins(score_direct(lm, part, reduction=reduction, batch_tokens=batch_tokens,
                                              progress=False))
            frame = base[["pair_id", "language", "subset"]].copy()
            frame["feature_set"], frame["method"] = name, "direct"
            frame["margin"] = after.set_index("pair_id").loc[frame["pair_id"], "margin"].to_numpy()
            frame["margin_base"] = base["margin"].to_numpy()
            frame["correct"] = frame["margin"] > 0
            frame["layer"], frame["n_features"] = sae.layer, len(features)
            frame["features"] = " ".join(map(str, features))
            frames.append(frame)
            bar.update()
    bar.close()
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def _margins(direct: pd.DataFrame) -> pd.DataFrame:
    return direct.assign(margin=direct["score_good"] - direct["score_bad"]).reset_index(drop=True)
