"""`babelprobe sae train`: a sparse autoencoder trained on a corpus's token stream as SAELens trains one,
evaluated on held-out tokens, saved in the SAELens layout.

    result = train_sae("default", "udhr", "saes/l6", layers=6, width=4096, tokens=2_000_000)
    result.fit         # held-out FVU, L0 per language and pooled ("all")
    result.dead        # dead share: in training's last window, and never firing on held-out tokens

Data (`sae.stream`): the corpus's training part packed into rows of `--window` tokens (BOS first,
`corpus.pack_rows`), run through the model to the layer, every token's state but BOS, shuffled through
SAELens' mixing buffer (in host memory), `--batch-size` states a step until `--tokens` states (the corpus runs
again when it runs out, as SAELens' store does); the SAE trains on the model's device, as SAELens' on its
`device`. The states are scaled by s = √d_in / mean ‖x‖ (SAELens'
`normalize_activations="expected_average_only_in"`, estimated on the first 100 batches) and s is folded
into the saved weights (`fold_activation_norm_scaling_factor`: W_enc·s, W_dec/s, b_dec/s).

Architectures, as SAELens 6 trains them (`sae_lens/saes/{topk,standard,jumprelu}_sae.py`,
`training/sae_trainer.py`), with pre = (x − b_dec) W_enc + b_enc (apply_b_dec_to_input):

    topk      f = ReLU of the k largest of pre·‖W_dec[s]‖ (rescale_acts_by_decoder_norm), x̂ = (f/‖W_dec‖) W_dec
              + b_dec; loss = Σ_d (x̂ − x)² + AuxK: the top k_aux = d_in/2 dead features' pre-activations
              reconstruct the residual x − x̂ (detached), scaled by min(n_dead / k_aux, 1); the decoder
              norms are folded into the saved weights (W_dec/‖W_dec‖, W_enc·‖W_dec‖, b_enc·‖W_dec‖)
    standard  f = ReLU(pre), x̂ = f W_dec + b_dec; loss = Σ_d (x̂ − x)² + λ·Σ_s f_s ‖W_dec[s]‖
    jumprelu  f = pre·1[pre > θ], θ ≥ 0 learnt (init 0.01) through the rectangle-kernel straight-through
              estimator (bandwidth 0.05, to θ only); loss = Σ_d (x̂ − x)² + λ·Σ_s 1[pre_s > θ_s]

each averaged over the batch; λ warmed up linearly over the first 5% of steps. Initialisation: W_dec
rows Kaiming-uniform then scaled to norm 0.1 (decoder_init_norm), W_enc = W_decᵀ, b_enc = b_dec = 0.
Adam (0.9, 0.999), gradients clipped to norm 1, the learning rate constant then decayed linearly to a
tenth over the last 20% of steps. Dead features: a feature that has not fired for `dead_feature_window`
steps (SAELens' n_forward_passes_since_fired).

Evaluation: the held-out part, packed the same way, through the model and the final SAE in raw units:
FVU (Σ ‖x − x̂‖² over Σ ‖x − x̄_L‖², the language's own mean state; `sae.stats`) and L0 per language and
pooled, and the share of features that fire on no held-out token.

Checkpoints: every `checkpoint_every` steps the weights, Adam's state and the counters go to
`.OUT.checkpoint/` beside OUT, written whole or not at all (safetensors + JSON, nothing pickled); the
same command after an interruption resumes from it (its later batches are drawn anew, seeded by the
step). OUT itself appears only when complete: cfg.json, sae_weights.safetensors (`load_sae`,
`sae_lens.SAE.load_from_disk`), training.json.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.inputs import check_input
from babelprobe.models import on_device
from babelprobe.sae.settings import TrainSettings
from babelprobe.sae.weights import SAE, SAELENS_CONFIG, save_sae
from babelprobe.settings import settings_record

NORM_BATCHES = 100  # batches the activation scale is estimated on (SAELens: n_batches_for_norm_estimate)
JUMPRELU_INIT_THRESHOLD, JUMPRELU_BANDWIDTH = 0.01, 0.05  # SAELens' JumpReLUTrainingSAEConfig defaults
DECODER_INIT_NORM = 0.1  # SAELens' TrainingSAEConfig.decoder_init_norm
WARM_UP_SHARE, DECAY_SHARE = 0.05, 0.2


@dataclass
class TrainResult:
    sae: SAE
    fit: pd.DataFrame  # held-out: layer, language, fvu, l0, n_tokens (and "all")
    dead: dict = field(default_factory=dict)  # train_window, heldout: shares of dead features
    losses: list = field(default_factory=list)  # [step, mse, sparsity or aux loss] every 50 steps
    out: Path | None = None
    record: dict = field(default_factory=dict)  # training.json


# ----------------------------------------------------------------------------------------- the model

def _rectangle(x: torch.Tensor) -> torch.Tensor:
    return ((x > -0.5) & (x < 0.5)).to(x)


class _JumpReLU(torch.autograd.Function):
    """pre·1[pre > θ]; θ's gradient by the rectangle-kernel estimator (SAELens' `JumpReLU`, ste_to_input off)."""

    @staticmethod
    def forward(ctx, x, threshold, bandwidth):
        ctx.save_for_backward(x, threshold)
        ctx.bandwidth = bandwidth
        return x * (x > threshold)

    @staticmethod
    def backward(ctx, grad):
        x, threshold = ctx.saved_tensors
        ste = (threshold / ctx.bandwidth) * _rectangle((x - threshold) / ctx.bandwidth) * grad
        return (x > threshold) * grad, -ste.sum(0), None


class _Step(torch.autograd.Function):
    """1[pre > θ]; θ's gradient by the rectangle-kernel estimator (SAELens' `Step`, ste_to_input off)."""

    @staticmethod
    def forward(ctx, x, threshold, bandwidth):
        ctx.save_for_backward(x, threshold)
        ctx.bandwidth = bandwidth
        return (x > threshold).to(x)

    @staticmethod
    def backward(ctx, grad):
        x, threshold = ctx.saved_tensors
        ste = (1.0 / ctx.bandwidth) * _rectangle((x - threshold) / ctx.bandwidth) * grad
        return None, -ste.sum(0), None


class TrainingSAE(torch.nn.Module):
    """The parameters and the training forward pass of one architecture (module docstring)."""

    def __init__(self, d_in: int, width: int, architecture: str, k: int | None, generator: torch.Generator):
        super().__init__()
        self.architecture, self.k = architecture, k
        W_dec = torch.empty(width, d_in)
        bound = np.sqrt(6.0 / d_in)  # nn.init.kaiming_uniform_ on [width, d_in] (fan_in = d_in, a = 0)
        W_dec.uniform_(-bound, bound, generator=generator)
        W_dec = DECODER_INIT_NORM * W_dec / W_dec.norm(dim=1, keepdim=True)
        self.W_dec = torch.nn.Parameter(W_dec)
        self.W_enc = torch.nn.Parameter(W_dec.T.clone().contiguous())
        self.b_enc = torch.nn.Parameter(torch.zeros(width))
        self.b_dec = torch.nn.Parameter(torch.zeros(d_in))
        if architecture == "jumprelu":
            self.threshold = torch.nn.Parameter(torch.full((width,), JUMPRELU_INIT_THRESHOLD))

    def forward(self, x: torch.Tensor, dead: torch.Tensor, coefficient: float) -> tuple[dict, torch.Tensor]:
        """({mse, sparsity or aux}, codes f) for a batch of scaled states x [n, d_in]."""
        pre = (x - self.b_dec) @ self.W_enc + self.b_enc
        losses = {}
        if self.architecture == "topk":
            norms = self.W_dec.norm(dim=1)
            pre = pre * norms
            top = torch.topk(pre, self.k, dim=-1, sorted=False)
            values = top.values.relu()
            f = torch.zeros_like(pre).scatter(-1, top.indices, values)
            out = (f / norms) @ self.W_dec + self.b_dec
            losses["aux"] = self._aux_loss(x, out, pre, dead, norms)
        elif self.architecture == "standard":
            f = pre.relu()
            out = f @ self.W_dec + self.b_dec
            losses["sparsity"] = coefficient * (f * self.W_dec.norm(dim=1)).sum(-1).mean()
        else:
            with torch.no_grad():
                self.threshold.clamp_(min=0.0)
            f = _JumpReLU.apply(pre, self.threshold, JUMPRELU_BANDWIDTH)
            out = f @ self.W_dec + self.b_dec
            losses["sparsity"] = coefficient * _Step.apply(pre, self.threshold, JUMPRELU_BANDWIDTH).sum(-1).mean()
        losses["mse"] = (out - x).square().sum(-1).mean()
        return losses, f

    def _aux_loss(self, x, out, pre, dead, norms) -> torch.Tensor:
        """SAELens' `calculate_topk_aux_loss` (TopK's dead-feature loss; zero without dead features)."""
        n_dead = int(dead.sum())
        if n_dead == 0:
            return out.new_zeros(())
        residual = (x - out).detach()
        k_aux = x.shape[-1] // 2
        scale = min(n_dead / k_aux, 1.0)
        k_aux = min(k_aux, n_dead)
        masked = torch.where(dead[None], pre, -torch.inf)
        top = masked.topk(k_aux, sorted=False)
        acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values)
        recon = (acts / norms) @ self.W_dec
        return scale * (recon - residual).square().sum(-1).mean()

    @torch.no_grad()
    def inference_sae(self, scale: float, layer: int) -> SAE:
        """The SAE in raw units (module docstring: the scale and, for topk, the decoder norms folded), in host
        memory as `load_sae` gives one."""
        W_enc, W_dec, b_enc, b_dec = (t.detach().cpu().clone() for t in (self.W_enc, self.W_dec, self.b_enc,
                                                                          self.b_dec))
        if self.architecture == "topk":  # _fold_norm_topk
            norms = W_dec.norm(dim=1)
            b_enc, W_dec, W_enc = b_enc * norms, W_dec / norms[:, None], W_enc * norms[None]
        threshold = self.threshold.detach().cpu().clone() if self.architecture == "jumprelu" else None
        return SAE(W_enc=W_enc * scale, W_dec=W_dec / scale, b_enc=b_enc, b_dec=b_dec / scale,
                   architecture=self.architecture, threshold=threshold, k=self.k, apply_b_dec_to_input=True,
                   rescale_acts_by_decoder_norm=False, layer=layer,
                   hook=f"blocks.{layer - 1}.hook_resid_post" if layer else "blocks.0.hook_resid_pre",
                   layout="saelens", info={"l0_published": None})


# -------------------------------------------------------------------------------------------- training

@dataclass
class _State:
    """What a checkpoint keeps beside the weights: the step, the counters, the losses."""

    step: int = 0
    scale: float = 0.0
    since_fired: torch.Tensor | None = None  # [width] steps since each feature last fired
    fired: torch.Tensor | None = None  # [width] firings since the start (L0 in training)
    tokens: int = 0
    losses: list = field(default_factory=list)


def train_sae(model, corpus, out: str | Path | None = None, settings: TrainSettings | None = None, *,
              languages: list[str] | None = None, load_options: dict | None = None, batch_tokens: int = 8192,
              checkpoint_every: int = 200, overwrite: bool = False, progress: bool = False, **values) -> TrainResult:
    """Train on the corpus's token stream and write the SAE to `out` (module docstring). `model`: a
    `LoadedModel` or a spec (loaded once the corpus and `out` are checked); `corpus`: a source of
    `babelprobe.corpus.read_corpus` or a `Corpus`. `values`: the fields of `TrainSettings` as keywords."""
    from babelprobe.corpus import packed, read_corpus
    from babelprobe.runtime import as_runtime
    from babelprobe.settings import settings_for

    settings = settings or settings_for(TrainSettings, **values)
    check_input("corpus", corpus, "corpus")  # a folder or table there and readable: before any training
    if settings.layers is None:
        raise BabelprobeError("sae train needs --layers N: the one layer whose states to train on")
    layer = _one_layer(settings.layers)
    corpus = read_corpus(corpus, languages)
    if out is not None:
        out = _check_out(Path(out), overwrite)
    runtime = as_runtime(model=model, load_options=load_options)
    info = runtime.info  # the model's layers from its files: a layer out of range is refused before it loads
    if not 0 <= layer <= info.n_layers:
        raise BabelprobeError(f"--layers {layer}: {info.name} has layers 0..{info.n_layers} (0 = embeddings)")
    lm = runtime.lm
    train_rows = [row for rows in packed(lm, corpus, "train", settings.window).values() for row in rows]
    held_rows = packed(lm, corpus, "heldout", settings.window, keep_last=True)
    if not train_rows or sum(len(r) - 1 for r in train_rows) < settings.batch_size:
        raise BabelprobeError(f"--corpus {corpus.source}: fewer training tokens than one --batch-size "
                              f"{settings.batch_size}; give more text or a smaller batch")
    identity = {"fingerprint": lm.fingerprint, "layer": layer, **corpus.describe(), **settings_record(settings)}
    started = time.perf_counter()
    trainer, state = fit(lm, train_rows, layer, settings, identity=identity, batch_tokens=batch_tokens,
                         checkpoint=_checkpoint_dir(out) if out is not None else None,
                         checkpoint_every=checkpoint_every, progress=progress)
    sae = trainer.inference_sae(state.scale, layer)
    sae.info["model_name"] = lm.name
    fit_table, heldout_dead = heldout_fit(lm, sae, held_rows, batch_tokens)
    window_dead = float((state.since_fired > settings.dead_feature_window).float().mean())
    record = {"settings": settings_record(settings), "layer": layer, "model": lm.name, "fingerprint": lm.fingerprint,
              **corpus.describe(), "tokens_trained": state.tokens, "steps": state.step, "activation_scale": state.scale,
              "l0_train": float(state.fired.sum() / max(state.tokens, 1)),
              "dead": {"train_window": window_dead, "heldout": heldout_dead},
              "heldout_tokens": int(fit_table.set_index("language").loc["all", "n_tokens"]),
              "fit": fit_table.to_dict(orient="records"), "losses": state.losses,
              "seconds": round(time.perf_counter() - started, 1)}
    result = TrainResult(sae=sae, fit=fit_table, dead=record["dead"], losses=state.losses, out=out, record=record)
    if out is not None:
        _write(result, out)
    return result


def fit(lm, rows: list[list[int]], layer: int, settings: TrainSettings, *, identity: dict | None = None,
        batch_tokens: int = 8192, checkpoint: Path | None = None, checkpoint_every: int = 200,
        progress: bool = False, batches=None) -> tuple[TrainingSAE, _State]:
    """The training loop (module docstring) over the rows' token states; `batches` (an iterator of
    [batch, d] tensors in raw units) replaces the model's stream, e.g. to train on a fixed buffer."""
    from tqdm.auto import tqdm

    from babelprobe.sae.stream import training_batches

    generator = torch.Generator().manual_seed(settings.seed)
    if batches is not None:
        batches = iter(batches)
        first = next(batches)
        batches, d_in, device = itertools.chain([first], batches), first.shape[1], first.device
    else:
        d_in, device = lm.d_model, lm.device
    # initialised on the host with its seeded generator (the same weights on every device), trained where the model
    # runs (SAELens trains on its `device`): the batches come from the host's mixing buffer one at a time
    trainer = TrainingSAE(d_in, settings.width, settings.architecture, settings.k, generator).to(device)
    optimiser = torch.optim.Adam(trainer.parameters(), lr=settings.lr, betas=(0.9, 0.999))
    steps = settings.tokens // settings.batch_size
    state = _State(since_fired=torch.zeros(settings.width, device=device),
                   fired=torch.zeros(settings.width, device=device))
    if checkpoint is not None:
        _resume(checkpoint, identity, trainer, optimiser, state)
    # a resumed run draws its later batches anew, seeded by the step (module docstring)
    data = batches if batches is not None else training_batches(
        lm, rows, layer, settings.batch_size, settings.seed + 7919 * state.step, batch_tokens=batch_tokens)
    if not state.scale:
        norms = [float(next(data).norm(dim=1).mean()) for _ in range(min(NORM_BATCHES, max(1, steps // 10)))]
        state.scale = float(np.sqrt(trainer.W_dec.shape[1]) / np.mean(norms))
    warm, decay_from = max(1, int(steps * WARM_UP_SHARE)), int(steps * (1 - DECAY_SHARE))
    bar = tqdm(total=steps, initial=state.step, desc="sae train", unit="step", disable=not progress)
    while state.step < steps:
        x = on_device(next(data).to(torch.float32), device) * state.scale  # queued behind the last step
        # SAELens' CoefficientScheduler (training/optim.py): 0 at the first step, λ·s/W at step s, then λ
        coefficient = settings.l1 * min(1.0, state.step / warm)
        losses, f = trainer(x, state.since_fired > settings.dead_feature_window, coefficient)
        loss = sum(losses.values())
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainer.parameters(), 1.0)
        for group in optimiser.param_groups:
            left = (steps - state.step) / max(1, steps - decay_from)
            group["lr"] = settings.lr * (1.0 if state.step < decay_from else 0.1 + 0.9 * left)
        optimiser.step()
        with torch.no_grad():
            fired = (f > 0).sum(0)
            state.since_fired += 1
            state.since_fired.masked_fill_(fired > 0, 0)  # not a boolean index: no read back on a GPU
            state.fired += fired
        state.tokens += len(x)
        state.step += 1
        if state.step % 50 == 0 or state.step == steps:
            state.losses.append([state.step, round(float(losses["mse"].detach()), 6),
                                 round(float(losses.get("aux", losses.get("sparsity")).detach()), 6)])
        if checkpoint is not None and (state.step % checkpoint_every == 0) and state.step < steps:
            _save_checkpoint(checkpoint, identity, trainer, optimiser, state)
        bar.update(1)
    bar.close()
    return trainer, state


def heldout_fit(lm, sae: SAE, rows_by_language: dict[str, list[list[int]]], batch_tokens: int = 8192):
    """(fit table, dead share): FVU and L0 per language and pooled on the held-out rows (every token but
    BOS; `sae.stats.SAEStats.fit`), and the share of features that fire on no held-out token."""
    from babelprobe.models import Encoding
    from babelprobe.sae.stats import stats_pass

    languages = sorted(code for code, rows in rows_by_language.items() if rows)
    rows = [(g, row) for g, code in enumerate(languages) for row in rows_by_language[code]]
    if not rows:
        raise BabelprobeError("no held-out text to evaluate the SAE on")
    encodings = [Encoding(row, [(0, 0)] * len(row)) for _, row in rows]
    groups = torch.tensor([g for g, _ in rows])
    stats = stats_pass(lm, sae, encodings, groups, languages, batch_tokens)
    table = stats.fit().drop(columns=["l0_published"])
    return table, float((stats.count.sum(0) == 0).mean())


# ------------------------------------------------------------------------------------- checkpoints

def _checkpoint_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.checkpoint"


def _save_checkpoint(path: Path, identity: dict, trainer: TrainingSAE, optimiser, state: _State) -> None:
    """The weights, Adam's moments and the counters (safetensors) and the rest (JSON), into a new folder
    renamed over the old one: a checkpoint is whole or absent."""
    from safetensors.torch import save_file

    tensors = {f"param.{name}": p.detach().contiguous() for name, p in trainer.named_parameters()}
    names = [name for name, _ in trainer.named_parameters()]
    adam = optimiser.state_dict()["state"]
    for index, moments in adam.items():
        for key, value in moments.items():
            tensors[f"adam.{names[index]}.{key}"] = torch.as_tensor(value).reshape(-1).contiguous() \
                if key == "step" else value.contiguous()
    tensors.update(since_fired=state.since_fired.contiguous(), fired=state.fired.contiguous())
    tmp = path.parent / (path.name + ".new")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.cpu() for k, v in tensors.items()}, str(tmp / "state.safetensors"))
    (tmp / "state.json").write_text(json.dumps({"identity": identity, "step": state.step, "scale": state.scale,
                                                "tokens": state.tokens, "losses": state.losses}, default=str),
                                    encoding="utf-8")
    old = path.parent / (path.name + ".old")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def _resume(path: Path, identity: dict, trainer: TrainingSAE, optimiser, state: _State) -> None:
    """Load a checkpoint of the same identity (another one is left alone and replaced later)."""
    from safetensors.torch import load_file

    if not (path / "state.json").exists() or not (path / "state.safetensors").exists():
        return
    record = json.loads((path / "state.json").read_text(encoding="utf-8"))
    if json.loads(json.dumps(identity, default=str)) != record.get("identity"):
        return
    tensors = load_file(str(path / "state.safetensors"))
    names = [name for name, _ in trainer.named_parameters()]
    with torch.no_grad():
        for name, p in trainer.named_parameters():
            p.copy_(tensors[f"param.{name}"])
    moments = {}
    for index, name in enumerate(names):
        if f"adam.{name}.step" in tensors:
            moments[index] = {"step": tensors[f"adam.{name}.step"].reshape(()),
                              "exp_avg": tensors[f"adam.{name}.exp_avg"],
                              "exp_avg_sq": tensors[f"adam.{name}.exp_avg_sq"]}
    saved = optimiser.state_dict()
    saved["state"] = moments
    optimiser.load_state_dict(saved)
    state.step, state.scale, state.tokens = int(record["step"]), float(record["scale"]), int(record["tokens"])
    state.losses = list(record["losses"])
    device = state.fired.device
    state.since_fired, state.fired = tensors["since_fired"].to(device), tensors["fired"].to(device)


def checkpoint_fit(model, corpus, out: str | Path, settings: TrainSettings, *, languages: list[str] | None = None,
                   batch_tokens: int = 8192) -> tuple[pd.DataFrame, float, int]:
    """(held-out fit table, held-out dead share, step) of the checkpoint an unfinished `train_sae` into `out`
    left: how far a long run has come (the same evaluation as the finished SAE's)."""
    from safetensors.torch import load_file

    from babelprobe.corpus import packed, read_corpus
    from babelprobe.runtime import as_runtime

    path = _checkpoint_dir(Path(out))
    if not (path / "state.json").exists():
        raise BabelprobeError(f"--out {out}: no checkpoint beside it ({path})")
    record = json.loads((path / "state.json").read_text(encoding="utf-8"))
    lm = as_runtime(model=model).lm
    trainer = TrainingSAE(lm.d_model, settings.width, settings.architecture, settings.k, torch.Generator())
    tensors = load_file(str(path / "state.safetensors"))
    with torch.no_grad():
        for name, p in trainer.named_parameters():
            p.copy_(tensors[f"param.{name}"])
    layer = _one_layer(settings.layers)
    held = packed(lm, read_corpus(corpus, languages), "heldout", settings.window, keep_last=True)
    table, dead = heldout_fit(lm, trainer.inference_sae(float(record["scale"]), layer), held, batch_tokens)
    return table, dead, int(record["step"])


# ------------------------------------------------------------------------------------------ output

def _one_layer(spec) -> int:
    try:
        return int(str(spec).strip())
    except ValueError:
        raise BabelprobeError(f"--layers {spec!r}: an SAE reads one layer; give one number") from None


def _check_out(out: Path, overwrite: bool) -> Path:
    from babelprobe.tables import check_out_dir, check_writable_dir

    check_out_dir(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        what = "an SAE" if (out / SAELENS_CONFIG).exists() else "files"
        raise BabelprobeError(f"--out {out} already holds {what}; choose another --out or pass --overwrite")
    if out.exists() and any(out.iterdir()) and not (out / SAELENS_CONFIG).exists():
        raise BabelprobeError(f"--out {out} holds files that are not an SAE; --overwrite replaces only an SAE folder")
    check_writable_dir(out.parent if not out.exists() else out)
    return out


def _write(result: TrainResult, out: Path) -> None:
    """Write into a temporary folder beside `out` and rename it into place: a complete SAE or none; then
    the checkpoint goes."""
    from babelprobe.tables import atomic_path

    tmp = out.parent / f".{out.name}.training"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_sae(result.sae, tmp, metadata={"babelprobe_training": {"corpus": result.record["corpus"],
                                                                     "layer": result.sae.layer}})
        with atomic_path(tmp / "training.json") as file:
            file.write_text(json.dumps(result.record, indent=1, default=str), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(_checkpoint_dir(out), ignore_errors=True)
    result.sae.path = str(out)


def training_fit(sae: SAE, X: np.ndarray, languages: np.ndarray) -> pd.DataFrame:
    """FVU (around each language's mean state) and L0 on states X, per language and for all ("all")
    (`babelprobe sae`'s fit on last-token states)."""
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
