"""A small sparse autoencoder trained on a store's states: the L1-penalised ReLU SAE ("standard" in
SAELens), saved in the SAELens layout, for models that have no published SAEs and for tests.

    sae = train_sae("acts/", layers=6, width=2048, out="saes/l6")

Training data: the store's last-token states of one layer (every item; mean-pooled states are not token
states and are never used). The states are scaled by c so that their mean squared distance from their
mean is d_in (the scale is folded into the saved weights, as SAELens folds its activation-norm scaling
factor: W_enc·c, W_dec/c, b_dec/c), so one L1 coefficient suits every model and layer.

    f = ReLU((x − b_dec) W_enc + b_enc)        (apply_b_dec_to_input, as SAELens' standard SAE)
    x̂ = f W_dec + b_dec
    loss = mean over the batch of ‖x − x̂‖² / d_in + λ · Σ_s f_s ‖W_dec[s]‖ / √d_in

with λ raised linearly over the first 5% of steps (SAELens' l1_warm_up_steps), Adam, and the learning
rate decayed linearly over the last 20% of steps. Initialisation as SAELens' defaults: W_dec rows random
directions of norm 0.1, W_enc = W_decᵀ, b_enc = 0, b_dec the mean state. The weights, the settings and
the fit on the training states (FVU and L0 per language) are written to OUT: cfg.json,
sae_weights.safetensors (readable by `load_sae` and `sae_lens.SAE.load_from_disk`) and training.json.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.inputs import check_input
from babelprobe.sae.settings import TrainSettings
from babelprobe.sae.weights import SAE, SAELENS_CONFIG, save_sae
from babelprobe.settings import settings_record


@dataclass
class TrainResult:
    sae: SAE
    fit: pd.DataFrame  # per language and "all": fvu, l0, n_states on the training states
    losses: list[float]
    out: Path | None


def train_sae(acts, out: str | Path | None = None, settings: TrainSettings | None = None, *,
              overwrite: bool = False, progress: bool = False, **values) -> TrainResult:
    """Train on the store `acts` (a path or an opened store) and write the SAE to `out` (module docstring).
    `values`: the fields of `TrainSettings` as keyword arguments (`layers=6, width=512`)."""
    from babelprobe.extract.layers import parse_layers
    from babelprobe.probes.source import as_store
    from babelprobe.settings import settings_for

    settings = settings or settings_for(TrainSettings, **values)
    check_input("acts", acts, "store")  # there, readable, every shard opening: before any training
    if settings.layers is None:
        raise BabelprobeError("sae train needs --layers N: the one layer whose states to train on")
    store = as_store(acts)
    layers = parse_layers(str(settings.layers), store.layers, stored=True)
    if len(layers) != 1:
        raise BabelprobeError(f"--layers {settings.layers!r}: an SAE reads one layer; give one number")
    layer = layers[0]
    if "last" not in store.pools:
        raise BabelprobeError(f"store {store.path} has no last-token states (pools: {', '.join(store.pools)}); an SAE "
                              "is trained on token states: re-extract with --pool last or both")
    if out is not None:
        out = _check_out(Path(out), overwrite)
    X = store.read(layer, pool="last")
    keys = store.keys.reset_index(drop=True)
    sae, losses = fit_sae(X, settings, layer)
    sae.info["model_name"] = (store.manifest.get("model") or {}).get("model")
    fit = training_fit(sae, X, keys["language"].astype(str).to_numpy())
    result = TrainResult(sae=sae, fit=fit, losses=losses, out=out)
    if out is not None:
        _write(result, out, settings, store, layer)
    return result


def fit_sae(X: np.ndarray, settings: TrainSettings, layer: int) -> tuple[SAE, list[float]]:
    """The SAE trained on states X [n, d] (module docstring), and the loss every 100 steps."""
    generator = torch.Generator().manual_seed(settings.seed)
    x = torch.as_tensor(np.asarray(X, dtype=np.float32))
    n, d = x.shape
    if n < 2:
        raise BabelprobeError(f"an SAE needs more than {n} state to train on")
    mean = x.double().mean(0)
    spread = float(((x.double() - mean) ** 2).sum(1).mean())
    if not np.isfinite(spread) or spread == 0:
        raise BabelprobeError("the training states are all the same (or not finite); nothing to learn")
    c = float(np.sqrt(d / spread))
    xs = (x.double() * c).float()
    W_dec = torch.randn(settings.width, d, generator=generator)
    W_dec = 0.1 * W_dec / W_dec.norm(dim=1, keepdim=True)
    params = {"W_enc": W_dec.T.clone(), "W_dec": W_dec, "b_enc": torch.zeros(settings.width),
              "b_dec": xs.mean(0)}
    for tensor in params.values():
        tensor.requires_grad_(True)
    optimiser = torch.optim.Adam(params.values(), lr=settings.lr)
    warm, decay_from = max(1, settings.steps // 20), int(settings.steps * 0.8)
    losses = []
    for step in range(settings.steps):
        batch = xs[torch.randint(n, (min(settings.batch_size, n),), generator=generator)]
        f = torch.relu((batch - params["b_dec"]) @ params["W_enc"] + params["b_enc"])
        error = (f @ params["W_dec"] + params["b_dec"] - batch).square().sum(1).mean() / d
        sparsity = (f * params["W_dec"].norm(dim=1)).sum(1).mean() / np.sqrt(d)
        loss = error + settings.l1 * min(1.0, (step + 1) / warm) * sparsity
        optimiser.zero_grad()
        loss.backward()
        for group in optimiser.param_groups:
            group["lr"] = settings.lr * min(1.0, (settings.steps - step) / max(1, settings.steps - decay_from))
        optimiser.step()
        if step % 100 == 0 or step == settings.steps - 1:
            losses.append(float(loss.detach()))
    with torch.no_grad():  # back to raw units (module docstring)
        sae = SAE(W_enc=(params["W_enc"] * c).detach(), W_dec=(params["W_dec"] / c).detach(),
                  b_enc=params["b_enc"].detach().clone(), b_dec=(params["b_dec"] / c).detach(),
                  architecture="standard", apply_b_dec_to_input=True, layer=layer,
                  hook=f"blocks.{layer - 1}.hook_resid_post" if layer else "blocks.0.hook_resid_pre",
                  layout="saelens", info={"l0_published": None})
    return sae, losses


def training_fit(sae: SAE, X: np.ndarray, languages: np.ndarray) -> pd.DataFrame:
    """FVU (around each language's mean state) and L0 on states X, per language and for all ("all")."""
    x = torch.as_tensor(np.asarray(X, dtype=np.float32))
    with torch.no_grad():
        f = sae.encode(x)
        error = (x - sae.decode(f)).double().square().sum(1).numpy()
        l0 = (f > 0).sum(1).numpy()
    rows = []
    for language in [*sorted(set(languages)), "all"]:
        where = np.ones(len(x), bool) if language == "all" else languages == language
        xl = x[where].double()
        variance = float(((xl - xl.mean(0)) ** 2).sum())
        rows.append({"layer": sae.layer, "language": language, "fvu": error[where].sum() / variance,
                     "l0": float(l0[where].mean()), "n_states": int(where.sum())})
    return pd.DataFrame(rows)


def _check_out(out: Path, overwrite: bool) -> Path:
    from babelprobe.tables import check_out_dir, check_writable_dir

    check_out_dir(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        what = "an SAE" if (out / SAELENS_CONFIG).exists() else "files"
        raise BabelprobeError(f"--out {out} already holds {what}; choose another --out or pass --overwrite")

    check_writable_dir(out.parent if not out.exists() else out)
    return out


def _write(result: TrainResult, out: Path, settings: TrainSettings, store, layer: int) -> None:
    """Write into a temporary folder beside `out` and rename it into place: a complete SAE or none."""
    from babelprobe.tables import atomic_path

    tmp = out.parent / f".{out.name}.training"
    shutil.rmtree(tmp, ignore_errors=True)
    record = {"settings": settings_record(settings), "layer": layer, "store": str(store.path),
              "fingerprint": store.fingerprint, "items_hash": store.items_hash,
              "fit": result.fit.to_dict(orient="records"), "losses": result.losses}
    try:
        save_sae(result.sae, tmp, metadata={"babelprobe_training": {"store": str(store.path), "layer": layer}})
        with atomic_path(tmp / "training.json") as file:
            file.write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result.sae.path = str(out)
