"""The SAE-feature edit source of `babelprobe intervene` (`--method sae --sae DIR`, DIR a `babelprobe sae`
directory): remove a language's most specific sparse-autoencoder features from the residual stream and
read the same minimal pairs (and, with `--readouts ppl`, the corpus) as with any edit. Two edits
(`--ablate-mode`):

    subtract (babelprobe)     x' = x − α · Σ_{s∈S} f_s(x) W_dec[s]                 every token but BOS
    projection (Deng et al.)  x' = x − α · Σ_{s∈S} ⟨x, W_dec[s]⟩ W_dec[s] / ‖W_dec[s]‖²   every token

with f the SAE's code of x (`babelprobe.sae.weights.SAE`). The projection is Deng et al.'s released
`SAE/inference.py` (`add_hook_to_change_activation_ablation`): each decoder direction's projection of the
state removed, one term per feature (not the joint projection onto their span), at every position of
the block's output, BOS included; it does not depend on the SAE's encoder. It is the `--protocol paper`
edit of the SAE ablation. For a unit of language L, S is L's `ablate`
features of highest monolinguality ν after its `ablate_from` most specific (DIR's stats pass,
`babelprobe.sae.stats`; `ablate` and `ablate_from` are DIR's settings: Deng et al.'s `topk_feature_num`
and `start_idx`); each control (`--random N` draws) is a random set of as many features among those that fire
on L's tokens (freq > 0), other than S, fixed by the seed, L and the draw (`probes.controls.group_rng`).
An empty S leaves every state as it is. α (`--alpha`, default 1) scales the removal.

Several layers at once (DIR made with `babelprobe sae --also-sae`: Deng et al.'s `--modified_layer_num`):
each of DIR's SAEs has its own S, ranked by its own stats pass on the same items with the same
`ablate_from` and `ablate` (the release slices each layer's `top_index_per_lan_magnitude.pth` alike), and
one edit hooks every SAE's layer in the same forward pass; each control is a random set per layer
(drawn at the main layer as in a one-layer run). The rows' `layer` and `features` are the main SAE's,
`also_features` the others' (`7: 3 9; 8: 1`, empty for one layer).

Units: the languages, or the probe groups when the probe readout is asked for (it reads each group's
probe on the states re-read at the SAE's layer). Columns of its rows, after the keys: `layer` (the SAE's),
`layer_rule` (sae), `method` (sae), `ablate_to` (the --ablate-mode: subtract or projection), `positions` (all), `direction` (features: the
language's; random: a control draw), `draw`, `alpha`, `off` (empty: each pair loses its own language's
features, so the summary's `all` cell pools the languages), `n_features`, `features` (the indices,
space-separated), `also_features` (those at the other layers, by layer), `n_items`.

`babelprobe sae` runs this source for its ablate.csv (`babelprobe.sae.run`). For the corpus readout
(`corpus_edits`) each language's set and the controls are one edit each, on every corpus language.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.interventions.edits import Edit, Intervention
from babelprobe.interventions.probe_edits import insert_columns
from babelprobe.interventions.source import EditSource
from babelprobe.probes.controls import group_rng


class FeatureAblation(Edit):
    """h − α·Σ_{s∈S} f_s(h) W_dec[s] for the SAE features S (module docstring); with `skip_first`, each
    row's first position (BOS) is left as it is. Only S's pre-activations are computed for a JumpReLU or
    ReLU SAE (f_s depends on its own alone); a top-k SAE's code needs all of them."""

    def __init__(self, sae, features, skip_first: bool = True, alpha: float = 1.0):
        super().__init__()
        self.sae, self.skip_first, self.alpha = sae, skip_first, float(alpha)
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
        edited = h - self.alpha * (f @ p["W_dec"])
        if self.skip_first and h.ndim == 3:
            edited[:, 0] = h[:, 0]
        return edited


class ProjectionAblation(Edit):
    """h − α·Σ_{s∈S} ⟨h, W_dec[s]⟩ W_dec[s] / ‖W_dec[s]‖² (module docstring: Deng et al.'s edit), at every
    position unless `skip_first`."""

    def __init__(self, sae, features, skip_first: bool = False, alpha: float = 1.0):
        super().__init__()
        self.features = np.asarray(sorted({int(s) for s in features}), dtype=np.int64)
        rows = sae.W_dec.detach().to(torch.float32).index_select(0, torch.as_tensor(self.features))
        self.tensors = {"rows": rows, "scaled": rows / rows.square().sum(dim=1, keepdim=True)}
        self.skip_first, self.alpha = skip_first, float(alpha)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if len(self.features) == 0:
            return h
        coefficients = h @ self.on("rows", h.device).T  # ⟨h, W_dec[s]⟩, [..., |S|]
        edited = h - self.alpha * (coefficients @ self.on("scaled", h.device))
        if self.skip_first and h.ndim == 3:
            edited[:, 0] = h[:, 0]
        return edited


def sae_edit(mode: str, sae, features, skip_first: bool, alpha: float) -> Edit:
    """The edit of `--ablate-mode` (module docstring): subtract skips BOS, projection edits every position."""
    if mode == "projection":
        return ProjectionAblation(sae, features, skip_first=False, alpha=alpha)
    return FeatureAblation(sae, features, skip_first, alpha)


def read_sae_run(path: str | Path) -> dict:
    """A `babelprobe sae` directory's manifest and stats pass: {manifest, stats, sae, also: [{sae, stats}] of
    the SAEs also ablated}; one-line errors when it is not one or its stats passes have not finished."""
    from babelprobe.sae.run import MANIFEST, STATS, also_stats_path
    from babelprobe.sae.stats import SAEStats
    from babelprobe.sae.weights import load_sae

    path = Path(path)
    if not (path / MANIFEST).exists():
        raise BabelprobeError(f"--sae {path}: not a `babelprobe sae` directory (no {MANIFEST}); run `babelprobe sae` "
                              "into it first")
    if not (path / STATS).exists():
        raise BabelprobeError(f"--sae {path}: its stats pass has not finished (no {STATS}); run the same "
                              "`babelprobe sae` command again")
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    sae = load_sae(manifest["sae_path"], layer=manifest.get("layer"))
    also = []
    for entry, folder in zip(manifest.get("also", []), manifest.get("also_paths", [])):
        stats = also_stats_path(path, entry["layer"])
        if not stats.exists():
            raise BabelprobeError(f"--sae {path}: the stats pass of its layer {entry['layer']} SAE has not finished "
                                  f"(no {stats.relative_to(path)}); run the same `babelprobe sae` command again")
        also.append({"sae": load_sae(folder, layer=entry["layer"]), "stats": SAEStats.load(stats)})
    return {"manifest": manifest, "stats": SAEStats.load(path / STATS), "sae": sae, "also": also}


def feature_sets(stats, n_features: int, n_random: int, seed: int = 0, skip: int = 0,
                 salt: str = "") -> dict[str, dict[str, np.ndarray]]:
    """{language: {"features": its features of ranks skip+1 .. skip+n_features by ν, "random-K": the K-th
    control set}} from a stats pass (`babelprobe.sae.stats.SAEStats`; module docstring). Controls are drawn
    from features that fire on the language's tokens, none of its skip + n_features most specific; `salt`
    keeps the draws of an extra layer apart from the main layer's (which stay those of a one-layer run)."""
    top = stats.top_features(skip + n_features)
    sets = {}
    for g, language in enumerate(stats.languages):
        features = top[language][skip:]
        chosen = {"features": features}
        pool = np.setdiff1d(np.flatnonzero(stats.count[g] > 0), top[language])
        for draw in range(n_random):
            rng = group_rng(seed, f"sae features {language}{salt}", f"random {draw}")
            chosen[f"random-{draw}"] = np.sort(rng.choice(pool, min(len(features), len(pool)), replace=False))
        sets[language] = chosen
    return sets


class SAEFeatures(EditSource):
    """A language's SAE features removed (module docstring)."""

    name = "sae_features"
    methods = ("sae",)
    columns = ("layer", "layer_rule", "method", "ablate_to", "positions", "direction", "draw", "alpha", "off",
               "n_features", "features", "also_features", "n_items")

    def __init__(self, settings, items: pd.DataFrame, probes, inputs: dict):
        super().__init__(settings, items, probes, {k: v for k, v in inputs.items() if k != "sae"})
        if inputs.get("sae") is None:
            raise BabelprobeError("--method sae removes SAE features: give --sae DIR (a `babelprobe sae` directory)")
        self.path = Path(inputs["sae"])
        run = read_sae_run(self.path)
        self.manifest, self.stats, self.sae = run["manifest"], run["stats"], run["sae"]
        n_features = int(self.manifest.get("ablate", 0))
        if n_features < 1:
            raise BabelprobeError(f"--sae {self.path} was run with --ablate 0: it names no features to remove")
        unknown = sorted(set(items["language"].astype(str)) - set(self.stats.languages))
        if unknown:
            raise BabelprobeError(f"--sae {self.path}: no features of language {unknown[0]} (its stats pass covers "
                                  f"{', '.join(self.stats.languages)})")
        skip = int(self.manifest.get("ablate_from", 0))  # absent from older sae.json: 0
        self.sets = feature_sets(self.stats, n_features, settings.n_random, settings.seed, skip=skip)
        # the SAEs also ablated: {layer: (sae, its sets)}, each ranked by its own stats pass
        self.also = {one["sae"].layer: (one["sae"], feature_sets(one["stats"], n_features, settings.n_random,
                                                                   settings.seed, skip=skip,
                                                                   salt=f" layer {one['sae'].layer}"))
                     for one in run["also"]}
        self.unit = "probe_group" if probes is not None and "probe" in settings.readouts else "language"
        if self.unit == "probe_group":
            probes.check(items, str(self.sae.layer))

    def identity(self) -> dict:
        from babelprobe.sae.run import STATS, also_stats_path
        from babelprobe.sae.weights import file_digest

        identity = {"sae": self.manifest.get("sae"), "sae_stats": file_digest(self.path / STATS),
                    "sae_layer": self.sae.layer}
        if self.also:  # only then: a one-layer run's identity stays what it was
            identity["sae_also"] = [{"sae": entry["sae"], "layer": entry["layer"],
                                     "stats": file_digest(also_stats_path(self.path, entry["layer"]))}
                                    for entry in self.manifest["also"]]
        return identity

    def check_model(self, lm) -> None:
        from babelprobe.sae.weights import check_fits

        made_with = self.manifest.get("fingerprint")
        if made_with != lm.fingerprint:
            raise BabelprobeError(f"--sae {self.path} was made with another model (fingerprint {made_with}, this model "
                                  f"{lm.fingerprint})")
        for sae in (self.sae, *(sae for sae, _ in self.also.values())):
            check_fits(sae, lm.d_model, lm.n_layers)

    def edits(self, language: str, name: str, skip_first: bool, alpha: float) -> tuple[dict, dict]:
        """({layer: edit} of one feature set at every SAE's layer, its labels `features`, `also_features`)."""
        mode, features = self.settings.ablate_mode, self.sets[language][name]
        edits = {self.sae.layer: sae_edit(mode, self.sae, features, skip_first, alpha)}
        also = []
        for layer, (sae, sets) in sorted(self.also.items()):
            edits[layer] = sae_edit(mode, sae, sets[language][name], skip_first, alpha)
            also.append(f"{layer}: " + " ".join(map(str, sets[language][name])))
        return edits, {"features": " ".join(map(str, features)), "also_features": "; ".join(also)}

    def units(self, items: pd.DataFrame) -> pd.DataFrame:
        items = items[items["label"].isin([0, 1])].copy()
        if self.unit == "probe_group":
            by = list(self.probes.by)
            items["probe_group"] = items[by].astype(str).agg("/".join, axis=1) if by else "all"
        return items

    def unit_rows(self, unit) -> pd.DataFrame:
        settings, items, layer = self.settings, unit.items, self.sae.layer
        language = str(items["language"].iloc[0])
        probes = self.probes if self.unit == "probe_group" else None
        by = list(probes.by) if probes is not None else []
        group = dict(zip(by, items[by].astype(str).iloc[0])) if by else None
        layers = [layer] if probes is not None else []
        base = unit.read(None, layers)
        probe = probes.probes.probe(group, layer) if probes is not None else None
        before = unit.probe_readout(probe, base.states.get(layer)) if probe is not None else {}
        skip_first = unit.lm.bos_policy == "bos"
        frames = []
        for alpha in settings.alphas_for("sae"):
            for name, features in self.sets[language].items():
                direction, _, draw = name.partition("-")
                edits, named = self.edits(language, name, skip_first, alpha)
                after = unit.read(Intervention(unit.lm, edits), layers)
                after_probe = unit.probe_readout(probe, after.states.get(layer)) if probe is not None else {}
                frame = unit.frame(base, after, before, after_probe, keys=by)
                labels = {"layer": layer, "layer_rule": "sae", "method": "sae", "ablate_to": settings.ablate_mode,
                          "positions": "all",
                          "direction": direction, "draw": int(draw or 0), "alpha": alpha, "off": "",
                          "n_features": len(features), **named, "n_items": len(items)}
                frames.append(insert_columns(frame, labels, after=len(dict.fromkeys(
                    ["pair_id", "language", "subset", *by]))))
        return pd.concat(frames, ignore_index=True)

    def corpus_edits(self, lm) -> list[tuple[dict, object]]:
        """(labels, edit context) per language's feature set and per control, for the corpus readout."""
        skip_first = lm.bos_policy == "bos"
        out = []
        for alpha in self.settings.alphas_for("sae"):
            for language, sets in self.sets.items():
                for name, features in sets.items():
                    direction, _, draw = name.partition("-")
                    edits, named = self.edits(language, name, skip_first, alpha)
                    labels = {"off": language, "direction": direction, "draw": int(draw or 0), "layer": self.sae.layer,
                              "method": "sae", "ablate_to": self.settings.ablate_mode, "alpha": alpha,
                              "n_features": len(features)}
                    if self.also:  # a one-layer run's labels (its resumable readouts' keys) stay what they were
                        labels["also_features"] = named["also_features"]
                    out.append((labels, Intervention(lm, edits)))
        return out
