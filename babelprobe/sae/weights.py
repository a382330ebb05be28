"""Sparse autoencoder weights: read either published layout with safetensors, encode and decode exactly
as SAELens does, write the SAELens layout.

Two folder layouts are read (no SAELens or TransformerLens needed):

- **Gemma Scope 2** (`params.safetensors` with `w_enc` [d_in, d_sae], `w_dec` [d_sae, d_in], `b_enc`,
  `b_dec`, `threshold`; optional `config.json`): JumpReLU, `apply_b_dec_to_input` False, as SAELens'
  `gemma_3` loader sets it (`sae_lens/loading/pretrained_sae_loaders.py`). The config's
  `hf_hook_point_in` names the Hugging Face module whose output the SAE reads: `model.layers.N.output`
  is the output of block N+1 in 1-based counting, babelprobe layer N+1 (docs/design.md "Layers
  (numbering)"). Without a config the folder's name (`resid_post/layer_N_width_...`) says the same.
  The config's `l0` is the published L0 (fit.csv's `l0_published`); a config of `type` other than
  `sae` (a transcoder) and the attention, MLP and transcoder folders are refused.
- **SAELens** (`cfg.json` + `sae_weights.safetensors` with `W_enc`, `W_dec`, `b_enc`, `b_dec` and, for
  JumpReLU, `threshold`): the architecture, `apply_b_dec_to_input`, `k` and the hook come from the
  config (SAELens 6, or the older flat config); `blocks.N.hook_resid_post` is babelprobe layer N+1,
  `blocks.N.hook_resid_pre` layer N. `babelprobe sae train` writes this layout.

The encoder and decoder (`sae_lens/saes/{jumprelu,standard,topk}_sae.py`):

    pre = (x − b_dec·[apply_b_dec_to_input]) W_enc + b_enc
    jumprelu  f = ReLU(pre) · 1[pre > θ]       (SAELens compares with ReLU(θ): the same f, since ReLU(pre) = 0
                                                wherever pre ≤ 0)
    standard  f = ReLU(pre)
    topk      f = ReLU of the k largest pre (× ‖W_dec[s]‖ first when `rescale_acts_by_decoder_norm`), 0 elsewhere
    x̂ = f W_dec + b_dec                         (topk with rescaling: f / ‖W_dec[s]‖ in place of f)

Only residual-stream SAEs with no run-time normalisation are read; anything else (attention or MLP
outputs, transcoders, `layer_norm` inputs, a learned scaling factor) is refused with the reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from babelprobe.errors import BabelprobeError

GEMMA_SCOPE_WEIGHTS, GEMMA_SCOPE_CONFIG = "params.safetensors", "config.json"
SAELENS_WEIGHTS, SAELENS_CONFIG = "sae_weights.safetensors", "cfg.json"
ARCHITECTURES = ("jumprelu", "standard", "topk")
_ARCHITECTURE_NAMES = {"jumprelu": "jumprelu", "jump_relu": "jumprelu", "standard": "standard", "relu": "standard",
                       "topk": "topk", "top_k": "topk"}
# the tensors of each layout, in its own spelling: (encoder, decoder, encoder bias, decoder bias, threshold)
_TENSORS = {"gemma-scope-2": ("w_enc", "w_dec", "b_enc", "b_dec", "threshold"),
            "saelens": ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")}


@dataclass
class SAE:
    """One sparse autoencoder on one babelprobe layer (module docstring). Tensors are float32 torch
    tensors on one device; `to(device)` gives a copy on another."""

    W_enc: torch.Tensor  # [d_in, d_sae]
    W_dec: torch.Tensor  # [d_sae, d_in]
    b_enc: torch.Tensor  # [d_sae]
    b_dec: torch.Tensor  # [d_in]
    architecture: str = "jumprelu"
    threshold: torch.Tensor | None = None  # [d_sae], JumpReLU only
    k: int | None = None  # topk only
    apply_b_dec_to_input: bool = False
    rescale_acts_by_decoder_norm: bool = False  # topk only
    layer: int | None = None  # babelprobe numbering (docs/design.md "Layers (numbering)")
    hook: str = ""  # the hook or module name the weights were trained on, as the folder says it
    path: str = ""
    layout: str = ""  # "gemma-scope-2" or "saelens"
    info: dict = field(default_factory=dict)  # model_name, l0_published, release, sae_id, ...

    @property
    def d_in(self) -> int:
        return int(self.W_enc.shape[0])

    @property
    def d_sae(self) -> int:
        return int(self.W_enc.shape[1])

    @property
    def device(self) -> torch.device:
        return self.W_enc.device

    def to(self, device) -> SAE:
        move = {name: getattr(self, name).to(device) for name in ("W_enc", "W_dec", "b_enc", "b_dec")}
        if self.threshold is not None:
            move["threshold"] = self.threshold.to(device)
        return replace(self, **move)

    # -------------------------------------------------------------------------------- the computation

    def pre_acts(self, x: torch.Tensor) -> torch.Tensor:
        """(x − b_dec·[apply_b_dec_to_input]) W_enc + b_enc for x [..., d_in] (float32)."""
        x = x.to(torch.float32)
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        return torch.addmm(self.b_enc, x.reshape(-1, self.d_in), self.W_enc).reshape(*x.shape[:-1], self.d_sae)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The feature activations f [..., d_sae] of x [..., d_in]."""
        pre = self.pre_acts(x)
        if self.architecture == "jumprelu":
            above = pre > self.threshold
            return pre.relu_().mul_(above)  # ReLU(pre)·1[pre > θ], in place on pre
        if self.architecture == "standard":
            return pre.relu_()
        if self.rescale_acts_by_decoder_norm:
            pre = pre * self.decoder_norms()
        values, index = torch.topk(pre, self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, index, values.relu())

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        """x̂ [..., d_in] from feature activations f [..., d_sae]."""
        return self.contribution(f) + self.b_dec

    def contribution(self, f: torch.Tensor, features=None) -> torch.Tensor:
        """Σ_s f_s W_dec[s] over all features, or over `features` (indices) only: what the features add to
        the reconstruction (topk with rescaling: f_s / ‖W_dec[s]‖ in place of f_s)."""
        f = f.to(torch.float32)
        W = self.W_dec
        if features is not None:
            index = torch.as_tensor(np.asarray(features, dtype=np.int64), device=f.device)
            f, W = f.index_select(-1, index), W.index_select(0, index)
        if self.architecture == "topk" and self.rescale_acts_by_decoder_norm:
            norms = self.W_dec.norm(dim=-1)
            f = f / (norms if features is None else norms.index_select(0, index))
        return (f.reshape(-1, f.shape[-1]) @ W).reshape(*f.shape[:-1], self.d_in)

    def decoder_norms(self) -> torch.Tensor:
        return self.W_dec.norm(dim=-1)

    def describe(self) -> dict:
        """What a run records about the SAE (its manifest entry)."""
        return {"path": self.path, "layout": self.layout, "architecture": self.architecture, "d_in": self.d_in,
                "d_sae": self.d_sae, "layer": self.layer, "hook": self.hook, "k": self.k,
                "apply_b_dec_to_input": self.apply_b_dec_to_input, **self.info}


# ------------------------------------------------------------------------------------------ reading

def load_sae(path: str | Path, layer: int | None = None, device=None, flag: str = "--sae") -> SAE:
    """The SAE in the folder `path` (Gemma Scope 2 or SAELens layout, module docstring). `layer` sets the
    babelprobe layer when the folder does not say; another layer than the folder's is an error (an SAE read
    at a layer it was not trained on is not that SAE). One-line errors name the folder and
    what is wrong: no such folder, an unknown layout or architecture, a missing tensor, shapes that do not
    fit, a hook that is not the residual stream. `flag`: the option the folder came from, for those errors."""
    path = Path(path)
    if not path.is_dir():
        raise BabelprobeError(f"{flag} {path}: no such directory (fetch one with `babelprobe sae fetch`, or train "
                              "one with `babelprobe sae train`)")
    if (path / GEMMA_SCOPE_WEIGHTS).exists():
        sae = _read_gemma_scope(path)
    elif (path / SAELENS_WEIGHTS).exists():
        sae = _read_saelens(path)
    else:
        raise BabelprobeError(f"{flag} {path}: neither a Gemma Scope 2 folder ({GEMMA_SCOPE_WEIGHTS}) nor a SAELens "
                              f"folder ({SAELENS_CONFIG} + {SAELENS_WEIGHTS})")
    if layer is not None:
        if sae.layer is not None and int(layer) != sae.layer:
            raise BabelprobeError(f"--layers {layer}: the SAE in {path} reads layer {sae.layer} ({sae.hook}); drop "
                                  f"--layers or give {sae.layer}")
        sae.layer = int(layer)
    if sae.layer is None:
        hint = "pass --layers N (babelprobe numbering: N = block N's output)" if flag == "--sae" else \
            f"{flag} takes folders that name their layer (SAELens' hook_name, Gemma Scope's folder)"
        raise BabelprobeError(f"{flag} {path}: the folder does not say which layer it reads (hook {sae.hook!r}); {hint}")
    fetched = path / "babelprobe_sae.json"  # written by `babelprobe sae fetch`: release, sae_id, published l0
    if fetched.exists():
        record = json.loads(fetched.read_text(encoding="utf-8"))
        sae.info.update({key: value for key, value in record.items() if value is not None or key not in sae.info})
    return sae.to(device) if device is not None else sae


def _read_gemma_scope(path: Path) -> SAE:
    config = _read_json(path / GEMMA_SCOPE_CONFIG) if (path / GEMMA_SCOPE_CONFIG).exists() else {}
    if config.get("type", "sae") != "sae" or config.get("affine_connection"):
        raise BabelprobeError(f"--sae {path}: a {config.get('type', 'transcoder')} ({GEMMA_SCOPE_CONFIG}), not a "
                              "residual-stream SAE")
    architecture = _architecture(config.get("architecture", "jump_relu"), path)
    hook = config.get("hf_hook_point_in") or _folder_hook(path)
    tensors = _read_tensors(path / GEMMA_SCOPE_WEIGHTS, "gemma-scope-2", architecture)
    if "affine_skip_connection" in tensors:
        raise BabelprobeError(f"--sae {path}: a transcoder with a skip connection, not a residual-stream SAE")
    # the released config.json gives the SAE's target L0 (`l0`, as SAELens' registry entry does)
    info = {key: config[name] for key, name in (("model_name", "model_name"), ("l0_published", "l0"))
            if config.get(name) is not None}
    return _assemble(path, "gemma-scope-2", architecture, tensors, hook, apply_b_dec_to_input=False, info=info)


def _read_saelens(path: Path) -> SAE:
    if not (path / SAELENS_CONFIG).exists():
        raise BabelprobeError(f"--sae {path}: {SAELENS_WEIGHTS} without {SAELENS_CONFIG}; a SAELens folder has both")
    cfg = _read_json(path / SAELENS_CONFIG)
    metadata = cfg.get("metadata") or {}
    activation = cfg.get("activation_fn") or cfg.get("activation_fn_str")
    name = cfg.get("architecture") or ("topk" if activation == "topk" else "standard")  # SAELens < 6 defaults
    architecture = _architecture(name, path)
    normalise = cfg.get("normalize_activations") or "none"
    if normalise not in ("none", False):
        raise BabelprobeError(f"--sae {path}: normalize_activations {normalise!r} is not supported (babelprobe reads "
                              "SAEs whose input is the raw residual stream)")
    if (cfg.get("reshape_activations") or "none") != "none":
        raise BabelprobeError(f"--sae {path}: reshape_activations {cfg['reshape_activations']!r} (attention heads), "
                              "not a residual-stream SAE")
    k = cfg.get("k") or (cfg.get("activation_fn_kwargs") or {}).get("k")
    if architecture == "topk" and not k:
        raise BabelprobeError(f"--sae {path}: a topk SAE whose {SAELENS_CONFIG} gives no k")
    tensors = _read_tensors(path / SAELENS_WEIGHTS, "saelens", architecture)
    hook = metadata.get("hook_name") or cfg.get("hook_name") or cfg.get("hook_point") or ""
    info = {key: metadata.get(key) or cfg.get(key) for key in ("model_name",) if metadata.get(key) or cfg.get(key)}
    sae = _assemble(path, "saelens", architecture, tensors, hook,
                    apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)), info=info,
                    k=int(k) if architecture == "topk" else None,
                    rescale=bool(cfg.get("rescale_acts_by_decoder_norm", False)))
    if metadata.get("babelprobe_layer") is not None:  # written by `babelprobe sae train`
        sae.layer = int(metadata["babelprobe_layer"])
    for key in ("d_in", "d_sae"):
        if cfg.get(key) is not None and int(cfg[key]) != getattr(sae, key):
            raise BabelprobeError(f"--sae {path}: {SAELENS_CONFIG} says {key} {cfg[key]}, the weights have "
                                  f"{getattr(sae, key)}")
    return sae


def _assemble(path: Path, layout: str, architecture: str, tensors: dict, hook: str, *, apply_b_dec_to_input: bool,
              info: dict, k: int | None = None, rescale: bool = False) -> SAE:
    enc, dec, b_enc, b_dec, threshold = _TENSORS[layout]
    sae = SAE(W_enc=tensors[enc], W_dec=tensors[dec], b_enc=tensors[b_enc], b_dec=tensors[b_dec],
              architecture=architecture, threshold=tensors.get(threshold) if architecture == "jumprelu" else None,
              k=k, apply_b_dec_to_input=apply_b_dec_to_input, rescale_acts_by_decoder_norm=rescale,
              layer=layer_of_hook(hook, path), hook=hook, path=str(path), layout=layout, info=info)
    _check_shapes(sae, layout, path)
    if k is not None and not 0 < k <= sae.d_sae:
        raise BabelprobeError(f"--sae {path}: k {k} must lie in 1..d_sae {sae.d_sae}")
    return sae


def _read_tensors(file: Path, layout: str, architecture: str) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(file))
    except (SafetensorError, OSError, ValueError) as err:
        raise BabelprobeError(f"cannot read {file}: {str(err).splitlines()[0]}") from err
    needed = list(_TENSORS[layout][:4]) + ([_TENSORS[layout][4]] if architecture == "jumprelu" else [])
    missing = [name for name in needed if name not in tensors]
    if missing:
        what = {"jumprelu": "a JumpReLU", "standard": "a ReLU", "topk": "a top-k"}[architecture]
        raise BabelprobeError(f"{file} has no tensor {missing[0]!r} ({what} SAE needs {', '.join(needed)})")
    scaling = tensors.get("scaling_factor")
    if scaling is not None and not torch.allclose(scaling.float(), torch.ones_like(scaling.float())):
        raise BabelprobeError(f"{file}: a learned scaling_factor (SAELens finetuning) is not supported")
    return {name: t.to(torch.float32).contiguous() for name, t in tensors.items()}


def _check_shapes(sae: SAE, layout: str, path: Path) -> None:
    names = dict(zip(("W_enc", "W_dec", "b_enc", "b_dec", "threshold"), _TENSORS[layout]))
    d_in, d_sae = (sae.W_enc.shape if sae.W_enc.ndim == 2 else (None, None))
    expected = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_in), "b_enc": (d_sae,), "b_dec": (d_in,),
                "threshold": (d_sae,)}
    for name, shape in expected.items():
        tensor = getattr(sae, name)
        if tensor is not None and tuple(tensor.shape) != shape:
            raise BabelprobeError(f"--sae {path}: tensor {names[name]!r} has shape {tuple(tensor.shape)}, expected "
                                  f"{shape} (from {names['W_enc']} [d_in, d_sae] = {tuple(sae.W_enc.shape)})")


def _architecture(name, path: Path) -> str:
    found = _ARCHITECTURE_NAMES.get(str(name).lower())
    if found is None:
        raise BabelprobeError(f"--sae {path}: unknown architecture {name!r}; babelprobe reads {', '.join(ARCHITECTURES)}")
    return found


def _folder_hook(path: Path) -> str:
    """`resid_post/layer_N_...` (a Gemma Scope 2 folder without config.json) as its hook point, the rule
    of SAELens' `_infer_gemma_3_raw_cfg_dict`; the other Gemma Scope 2 sites are refused."""
    match = re.search(r"layer_(\d+)", path.name)
    if match and "resid_post" in str(path):
        return f"model.layers.{match.group(1)}.output"
    site = next((name for name in ("attn_out", "mlp_out", "transcoder", "clt") if name in str(path)), None)
    if site is not None:
        raise BabelprobeError(f"--sae {path}: a Gemma Scope 2 {site} folder, not a residual-stream SAE (resid_post)")
    return ""


def layer_of_hook(hook: str, path: Path | str = "") -> int | None:
    """The babelprobe layer a residual-stream hook reads: `model.layers.N.output` and
    `blocks.N.hook_resid_post` are layer N+1, `blocks.N.hook_resid_pre` layer N; None when the hook is
    empty; an error for a hook that is not the residual stream."""
    if not hook:
        return None
    for pattern, offset in ((r"^(?:model\.)*layers\.(\d+)\.output$", 1),
                            (r"^blocks\.(\d+)\.hook_resid_post$", 1), (r"^blocks\.(\d+)\.hook_resid_pre$", 0)):
        match = re.match(pattern, hook)
        if match:
            return int(match.group(1)) + offset
    raise BabelprobeError(f"--sae {path}: reads {hook!r}, not the residual stream; babelprobe reads residual-stream "
                          "SAEs (model.layers.N.output, blocks.N.hook_resid_post or hook_resid_pre)")


def _read_json(file: Path) -> dict:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BabelprobeError(f"{file}: not readable JSON ({err})") from err


def file_digest(path: str | Path) -> str:
    """The first 16 hex digits of a file's SHA-256 (an SAE's weights, a stats pass: part of a run's identity)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


# ------------------------------------------------------------------------------------------ checking

def check_fits(sae: SAE, d_model: int, n_layers: int, what: str = "model") -> None:
    """One-line errors when the SAE cannot read this model's (or store's) residual stream: another width,
    or a layer beyond its last block."""
    if sae.d_in != d_model:
        raise BabelprobeError(f"SAE d_in {sae.d_in} ≠ {what} d_model {d_model}: {sae.path} was trained on another "
                              "model's activations")
    if not 0 <= sae.layer <= n_layers:
        hook = f" ({sae.hook})" if sae.hook else ""
        raise BabelprobeError(f"SAE {sae.path} reads layer {sae.layer}{hook}, beyond the {what}'s layers 0..{n_layers} "
                              "(0 = embeddings)")


# ------------------------------------------------------------------------------------------ writing

def save_sae(sae: SAE, path: str | Path, layout: str = "saelens", metadata: dict | None = None) -> Path:
    """Write `sae` into the folder `path` in the SAELens layout (cfg.json + sae_weights.safetensors, a
    SAELens 6 config that `sae_lens.SAE.load_from_disk` reads) or, for a JumpReLU SAE, the Gemma Scope 2
    layout (params.safetensors + config.json). Files appear only when complete."""
    from safetensors.torch import save_file

    from babelprobe.tables import atomic_path

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    enc, dec, b_enc, b_dec, threshold = _TENSORS["gemma-scope-2" if layout == "gemma-scope-2" else "saelens"]
    tensors = {enc: sae.W_enc, dec: sae.W_dec, b_enc: sae.b_enc, b_dec: sae.b_dec}
    if sae.threshold is not None:
        tensors[threshold] = sae.threshold
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in tensors.items()}
    if layout == "gemma-scope-2":
        if sae.architecture != "jumprelu" or sae.apply_b_dec_to_input:
            raise BabelprobeError("the Gemma Scope 2 layout holds JumpReLU SAEs that do not subtract b_dec from the input")
        config = {"architecture": "jump_relu", "hf_hook_point_in": f"model.layers.{sae.layer - 1}.output",
                  **({"model_name": sae.info["model_name"]} if sae.info.get("model_name") else {}), **(metadata or {})}
        files = {GEMMA_SCOPE_WEIGHTS: tensors, GEMMA_SCOPE_CONFIG: config}
    elif layout == "saelens":
        hook = f"blocks.{sae.layer - 1}.hook_resid_post" if sae.layer else "blocks.0.hook_resid_pre"
        config = {"architecture": sae.architecture, "d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": "float32",
                  "device": "cpu", "apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none",
                  "reshape_activations": "none",
                  "metadata": {"hook_name": hook, "babelprobe_layer": sae.layer, "sae_lens_version": "6.0.0",
                               "sae_lens_training_version": "6.0.0", "prepend_bos": True,
                               **({"model_name": sae.info["model_name"]} if sae.info.get("model_name") else {}),
                               **(metadata or {})}}
        if sae.architecture == "topk":
            config.update(k=sae.k, rescale_acts_by_decoder_norm=sae.rescale_acts_by_decoder_norm)
        files = {SAELENS_WEIGHTS: tensors, SAELENS_CONFIG: config}
    else:
        raise BabelprobeError(f"unknown SAE layout {layout!r}; use saelens or gemma-scope-2")
    for name, content in files.items():
        with atomic_path(path / name) as tmp:
            if isinstance(content, dict) and name.endswith(".safetensors"):
                save_file(content, str(tmp))
            else:
                tmp.write_text(json.dumps(content, indent=1), encoding="utf-8")
    return path
