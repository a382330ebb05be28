"""Three ways to run the forward pass and hand each layer's hidden states to a `Pooler`.

  hf                plain PyTorch forward hooks on the model's own blocks (the default; fastest)
  transformer_lens  TransformerLens 4 `TransformerBridge` hook points (`blocks.{i}.hook_resid_pre/post`),
                    raw HF numerics (no weight processing)
  nnsight           an nnsight trace that reads `layers[i].input/.output`

All three store the same thing (docs/design.md "Layers (numbering)"): layer 0 is the hidden state entering the first
block (the embedding output, including any scaling or position embeddings the model adds), layer i is
the output of block i, before the final norm. Each stops the forward pass after the last requested
layer, so the final norm and the vocabulary head never run.

A backend is a context manager: `with make_backend(name, lm, layers) as backend: backend.run(batch,
pooler)`. Hooks and wrappers are removed on exit and the `LoadedModel` is left as it was.

A model dispatched over devices by accelerate (`load_model(device_map=...)`) keeps its blocks as
modules with accelerate's hooks (which move inputs and load offloaded weights inside the block's
forward): the hf backend's hooks sit outside them and see each block's output on that block's device,
and nnsight traces the same modules. TransformerLens's bridge rebuilds the model and needs it on one device.

The nnsight backend can run remotely (`remote=True`, NDIF; the API key comes from the `NDIF_API_KEY`
environment variable, read by nnsight itself and never stored or printed by babelprobe): the trace body
pools each layer with plain torch operations and saves only the stacked [batch, layers, d_model] result,
so that is all that comes back over the network. `remote="local"` runs exactly that body through
nnsight's local simulation of the remote path (serialised and deserialised as for the server).
"""

from __future__ import annotations

import copy
import os
from importlib.metadata import PackageNotFoundError, version

import torch

from babelprobe.errors import BabelprobeError
from babelprobe.extract.capture import Pooler, StopForward
from babelprobe.models import LoadedModel, sync_free_attention
from babelprobe.sites import Hooks, residual

BACKENDS = ("hf", "transformer_lens", "nnsight")


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


class Backend:
    """Base: `layers` are DESIGN numbers (sorted); `run` fills a `Pooler` for one padded batch."""

    name = "?"

    def __init__(self, lm: LoadedModel, layers: list[int]):
        self.lm, self.layers = lm, sorted(layers)
        self.column = {layer: i for i, layer in enumerate(self.layers)}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        pass

    def run(self, batch: dict[str, torch.Tensor], pooler: Pooler) -> None:
        raise NotImplementedError


class HFBackend(Backend):
    """Reads at the residual sites of the requested layers (`babelprobe.sites.Hooks`: a forward pre-hook on
    block 1 for layer 0, a forward hook on block i for layer i) and stops after the last one. Its passes run
    under `models.sync_free_attention` (transformers' SDPA without its read of the mask at every pass)."""

    name = "hf"

    def __init__(self, lm: LoadedModel, layers: list[int]):
        super().__init__(lm, layers)
        self.pooler: Pooler | None = None
        self.hooks = Hooks(lm)
        for layer in self.layers:
            self.hooks.read(residual(layer), self._reader(layer), stop=layer == self.layers[-1])

    def _reader(self, layer: int):
        column = self.column[layer]
        return lambda hidden: self.pooler.add(column, hidden)

    def run(self, batch, pooler):
        self.pooler = pooler
        try:
            with sync_free_attention(self.lm):
                self.hooks.run(batch)
        finally:
            self.pooler = None

    def close(self):
        self.hooks.close()


def _shallow_clone(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the module tree that shares every parameter and buffer (no extra weight memory), so a
    library that rewires modules in place leaves the caller's model untouched."""
    memo = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)


def _bridge_tokenizer(tokenizer):
    """A copy of the tokenizer the bridge accepts as is. The bridge only tokenises text we never give it
    (babelprobe passes token ids), but at boot it re-loads any tokenizer not marked `add_bos_token`
    from its original path (absent for in-memory tokenizers, and a network call for hub ones) and
    resets its padding side; marking a copy avoids both."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.init_kwargs.setdefault("name_or_path", getattr(tokenizer, "name_or_path", ""))
    tokenizer.init_kwargs["add_bos_token"] = True
    return tokenizer


class TransformerLensBackend(Backend):
    """TransformerLens 4 `TransformerBridge` with raw HF numerics; hook points resid_pre / resid_post."""

    name = "transformer_lens"

    def __init__(self, lm: LoadedModel, layers: list[int]):
        super().__init__(lm, layers)
        if lm.device_map or lm.remote:
            raise BabelprobeError("the transformer_lens backend needs the whole model on one device; with "
                                  "--device-map or a remote model use --backend hf or nnsight")
        try:
            from transformer_lens.model_bridge import TransformerBridge
        except ImportError as err:
            raise BabelprobeError("the transformer_lens backend needs TransformerLens >= 4 "
                                  "(pip install 'transformer-lens>=4')") from err
        import logging

        # The bridge swaps the model's blocks for wrappers and forces eager attention, in place: give
        # it a clone sharing the weights. Its own logging of alias/deprecation notes is not for users.
        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)
        clone = _shallow_clone(lm.model)
        if not getattr(clone.config, "architectures", None):  # models built from a config lack it
            clone.config.architectures = [type(lm.model).__name__]
        try:
            self.bridge = TransformerBridge.boot_transformers(
                lm.name, hf_model=clone, tokenizer=_bridge_tokenizer(lm.tokenizer), device=lm.device,
                dtype=lm.dtype)
        except Exception as err:  # unsupported architecture etc.
            raise BabelprobeError(f"TransformerLens cannot wrap {lm.name}: {str(err).splitlines()[0][:200]}; "
                                  "use --backend hf") from err
        finally:
            logging.getLogger().setLevel(quiet)
        self.bridge.eval()
        self.pooler: Pooler | None = None
        hooks = self.bridge.hook_dict
        for layer in self.layers:
            name = "blocks.0.hook_resid_pre" if layer == 0 else f"blocks.{layer - 1}.hook_resid_post"
            if name not in hooks:
                raise BabelprobeError(f"TransformerLens bridge of {lm.name} has no hook point {name}; use --backend hf")
            self.bridge.add_hook(name, self._hook(layer))

    def _hook(self, layer: int):
        def hook(tensor, hook):
            self.pooler.add(self.column[layer], tensor)
            if layer == self.layers[-1]:
                raise StopForward
        return hook

    def run(self, batch, pooler):
        self.pooler = pooler
        try:
            self.bridge(batch["input_ids"], return_type=None, attention_mask=batch["attention_mask"],
                        position_ids=batch["position_ids"], use_cache=False)
        except StopForward:
            pass
        finally:
            self.pooler = None

    def close(self):
        self.bridge.reset_hooks()


class NNsightBackend(Backend):
    """An nnsight trace per batch that reads `layers[0].input` and `layers[i-1].output`, pools them inside
    the trace with plain torch operations, saves only the pooled [batch, layers, d_model] states and
    stops the run. Locally, remotely on NDIF (`remote=True`) or through nnsight's local simulation of
    the remote path (`remote="local"`): the same trace body in all three."""

    name = "nnsight"

    def __init__(self, lm: LoadedModel, layers: list[int], remote: bool | str = False):
        super().__init__(lm, layers)
        try:
            import nnsight
        except ImportError as err:
            raise BabelprobeError("the nnsight backend needs nnsight >= 0.8 (pip install 'nnsight>=0.8')") from err
        self.remote = remote
        # nnsight sets its tokenizer's padding side; babelprobe pads itself, so give it a copy.
        tokenizer = copy.deepcopy(lm.tokenizer)
        wrapper = getattr(nnsight, "TransformersModel", None)
        if remote is True:
            if wrapper is None:
                raise BabelprobeError("remote extraction needs nnsight >= 0.8 (pip install 'nnsight>=0.8')")
            if not lm.remote:
                raise BabelprobeError("remote extraction needs a remote model (babelprobe extract --remote, or "
                                      "load_remote_model): NDIF runs models by hub id, not weights loaded here")
            if not os.environ.get("NDIF_API_KEY"):
                raise BabelprobeError("remote extraction needs an NDIF API key in the environment variable "
                                      "NDIF_API_KEY (get one at login.ndif.us)")
            repo, _, revision = lm.remote.partition("@")
            # built from the hub id: nnsight loads the config only (meta weights); NDIF holds the real ones
            self.model = wrapper(repo, revision=revision or None, tokenizer=tokenizer)
        elif wrapper is not None:
            self.model = wrapper(lm.model, task="text-generation", tokenizer=tokenizer)
        else:  # nnsight < 0.8
            self.model = nnsight.LanguageModel(lm.model, tokenizer=tokenizer)
        path = next(name for name, module in lm.model.named_modules() if module is lm.parts.layers)
        envoy = self.model
        for part in path.split("."):
            envoy = getattr(envoy, part)
        self.blocks = envoy

    def run(self, batch, pooler):
        pooled = self.trace(batch, pooler.rows, pooler.last_index, pooler.weights, tuple(pooler.out))
        for pool, values in pooled.items():
            pooler.set(pool, values.to(pooler.out[pool].device))

    def trace(self, batch, rows, last_index, weights, pools) -> dict:
        """{pool: [batch, n_layers stored, d_model]} pooled inside one trace. The body uses only torch and
        the tensors given (no babelprobe code), so nnsight can ship it to a server as it is."""
        blocks, layers = self.blocks, self.layers
        options = {"remote": self.remote} if self.remote else {}
        last_states = mean_states = None  # nnsight pushes saved values back into these names
        with self.model.trace(dict(batch), use_cache=False, **options) as tracer:
            last, mean = [], []
            for layer in layers:
                hidden = blocks[0].input if layer == 0 else blocks[layer - 1].output
                if isinstance(hidden, (tuple, list)):
                    hidden = hidden[0]
                if "last" in pools:
                    last.append(hidden[rows.to(hidden.device), last_index.to(hidden.device)].float())
                if "mean" in pools:
                    mean.append(torch.bmm(weights.to(hidden.device), hidden.float())[:, 0])
            if last:
                last_states = torch.stack(last, dim=1).save()
            if mean:
                mean_states = torch.stack(mean, dim=1).save()
            tracer.stop()
        return {pool: values for pool, values in (("last", last_states), ("mean", mean_states)) if values is not None}


def backend_version(name: str) -> str:
    """'<package> <version>' of the library a backend runs on."""
    package = {"hf": "transformers", "transformer_lens": "transformer-lens", "nnsight": "nnsight"}[name]
    return f"{package} {_version(package)}"


def make_backend(name: str, lm: LoadedModel, layers: list[int], remote: bool | str | None = None) -> Backend:
    """`remote` (nnsight only; see module docstring): True, "local", or False/None (local, unless the
    model is a remote one)."""
    classes = {"hf": HFBackend, "transformer_lens": TransformerLensBackend, "nnsight": NNsightBackend}
    if name not in classes:
        raise BabelprobeError(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")
    if remote is None:
        remote = bool(lm.remote)
    if name == "nnsight":
        return NNsightBackend(lm, layers, remote=remote)
    if remote:
        raise BabelprobeError(f"only the nnsight backend runs remotely, not {name!r}")
    return classes[name](lm, layers)
