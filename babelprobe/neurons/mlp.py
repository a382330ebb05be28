"""The MLP neurons of a model, inside the forward pass: where their activation is, counting how often it
is positive (`NeuronCounter`), and switching some of them off (`Deactivation`, `deactivated`).

A neuron is one of the I units of a block's MLP, and its activation the output of the MLP's activation
function (Tang et al. 2024, released `activation.py`): in a gated MLP (Llama, Gemma, Qwen, Mistral)
`act_fn(gate_proj(x))`, before the product with `up_proj(x)`; in GPT-2 `mlp.act(c_fc(x))`. `ACTIVATIONS`
maps each known MLP class to the attribute holding that activation module, so a forward hook on it sees
the activations [batch, seq, I] and can replace them. Neurons are numbered by layer as in docs/design.md
"Layers (numbering)": block i's MLP is layer i (1..L), its neurons 0..I-1.

Counting keeps nothing per token (as `extract.capture.Pooler`): each hook adds, per neuron, the number of
counted tokens whose activation is > 0 into an int64 [I] buffer on the device (a NaN activation would
make its count meaningless: the model's states are then broken anyway); the counted tokens are the
real tokens of each text (padding left out, and BOS, which every text shares). The forward pass stops
after the last block's activation (`StopForward`): the rest never runs. How texts are batched changes
the float rounding of the activations, so a count can move where an activation lies within rounding of
0 (the default model, 8 Chinese texts, one per batch vs all in one: 1 of 36,864 counts differs, by 4,
at activations of 6e-7 vs -1.5e-8); the released code has the same property.

Switching off sets the activations at the given indices to 0 (released `ppl.py`: `index_fill_`), so the
MLP's down projection sees 0 there at every token; the hooks live while the context is open, like
`interventions.edits.Intervention`'s.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.extract.capture import StopForward
from babelprobe.models import LoadedModel

# MLP class -> the attribute holding its activation module (whose output is the neurons' activations)
ACTIVATIONS = {
    "LlamaMLP": "act_fn", "MistralMLP": "act_fn", "Qwen2MLP": "act_fn", "Qwen3MLP": "act_fn",
    "GemmaMLP": "act_fn", "Gemma2MLP": "act_fn", "Gemma3MLP": "act_fn", "OlmoMLP": "act_fn", "Olmo2MLP": "act_fn",
    "Phi3MLP": "activation_fn", "GPT2MLP": "act", "GPTNeoXMLP": "act",
}


def activation_modules(lm: LoadedModel) -> list[torch.nn.Module]:
    """The activation module of every block's MLP, block 1 first; a one-line error naming an MLP class
    this map does not know."""
    found = []
    for block in lm.parts.layers:
        mlp = getattr(block, "mlp", None)
        kind = type(mlp).__name__ if mlp is not None else f"{type(block).__name__} (no .mlp)"
        if kind not in ACTIVATIONS:
            raise BabelprobeError(f"unknown MLP {kind} in {lm.name}: neurons are found in "
                                  f"{', '.join(sorted(ACTIVATIONS))} (babelprobe/neurons/mlp.py ACTIVATIONS)")
        found.append(getattr(mlp, ACTIVATIONS[kind]))
    if len({id(m) for m in found}) < len(found):
        raise BabelprobeError(f"the MLPs of {lm.name} share one activation module; a hook on it cannot tell the "
                              "layers apart")
    return found


def n_neurons(lm: LoadedModel) -> int:
    """I, the neurons of each MLP (the width of its activation)."""
    config = lm.model.config
    return int(getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
               or 4 * config.hidden_size)


def count_mask(attention_mask: torch.Tensor, skip_bos: bool) -> torch.Tensor:
    """bool [batch, seq]: the tokens counted, the real ones without each text's first (BOS) when `skip_bos`
    (right or left padding alike: the first real token is the first 1 of the mask)."""
    mask = attention_mask.to(torch.bool).clone()
    if skip_bos:
        rows = torch.arange(mask.shape[0], device=mask.device)
        mask[rows, mask.to(torch.int8).argmax(dim=1)] = False
    return mask


class NeuronCounter:
    """Hooks that count, per layer and neuron, the tokens with activation > 0 (module docstring).

        with NeuronCounter(lm) as counter:
            counter.run(padded_batch)        # any number of batches
            counts = counter.take()          # int64 [L, I] since the last take; n tokens in counter.n_tokens
    """

    def __init__(self, lm: LoadedModel):
        self.lm = lm
        self.modules = activation_modules(lm)
        self.skip_bos = lm.bos_policy == "bos"
        self.counts: list[torch.Tensor | None] = [None] * len(self.modules)
        self.n_tokens = 0
        self.handles: list = []
        self._masks: dict = {}

    def __enter__(self):
        for layer, module in enumerate(self.modules):
            self.handles.append(module.register_forward_hook(self._hook(layer)))
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _hook(self, index: int):
        last = index == len(self.modules) - 1

        def hook(module, args, output):
            # 1 where the activation is > 0, else 0, then the counted tokens' sum as one matrix-vector
            # product: float ops and BLAS, several times faster on a CPU than a boolean reduction; the
            # sums are integers, exact in the weights' dtype (`run` picks float64 beyond 2^24 tokens)
            weights = self._mask_on(output.device)
            positive = output.clamp(min=0).sign_().reshape(-1, output.shape[-1]).to(weights.dtype)
            counted = (weights @ positive).to(torch.int64)
            self.counts[index] = counted if self.counts[index] is None else self.counts[index] + counted
            if last:
                raise StopForward
        return hook

    def _mask_on(self, device) -> torch.Tensor:
        if device not in self._masks:
            self._masks[device] = next(iter(self._masks.values())).to(device)
        return self._masks[device]

    def run(self, batch: dict[str, torch.Tensor]) -> None:
        """Count the tokens of one padded batch (`models.pad_batch`)."""
        mask = count_mask(batch["attention_mask"], self.skip_bos)
        dtype = torch.float32 if mask.numel() < 2 ** 24 else torch.float64
        self._masks = {mask.device: mask.reshape(-1).to(dtype)}
        self.n_tokens += int(mask.sum())
        try:
            with torch.inference_mode():
                self.lm.parts.body(**batch, use_cache=False)
        except StopForward:
            pass

    def take(self) -> tuple[np.ndarray, int]:
        """(int64 [L, I] counts, tokens counted) since the last `take`; both start again from 0."""
        width = n_neurons(self.lm)
        out = np.stack([c.cpu().numpy().astype(np.int64) if c is not None else np.zeros(width, np.int64)
                        for c in self.counts])
        n, self.counts, self.n_tokens = self.n_tokens, [None] * len(self.modules), 0
        return out, n


def as_neuron_sets(neurons, n_layers: int, width: int) -> dict[int, np.ndarray]:
    """{layer (1..L): sorted distinct neuron indices} from a dict {layer: indices} or a table with
    `layer` and `neuron` columns (lape.csv rows); a one-line error for a layer or index out of range."""
    if isinstance(neurons, pd.DataFrame):
        neurons = {int(layer): part["neuron"].to_numpy() for layer, part in neurons.groupby("layer")}
    out = {}
    for layer, indices in dict(neurons or {}).items():
        indices = np.unique(np.asarray(indices, dtype=np.int64).ravel())
        if not 1 <= int(layer) <= n_layers:
            raise BabelprobeError(f"neurons at layer {layer}: MLP layers are 1..{n_layers} (block i's MLP is layer i)")
        if len(indices) and (indices[0] < 0 or indices[-1] >= width):
            raise BabelprobeError(f"neuron index {indices[-1] if indices[-1] >= width else indices[0]} at layer {layer}: "
                                  f"the MLPs have neurons 0..{width - 1}")
        if len(indices):
            out[int(layer)] = indices
    return out


class Deactivation:
    """Hooks that set the activations of `neurons` ({layer: indices}) to 0 while the context is open."""

    def __init__(self, lm: LoadedModel, neurons):
        self.lm = lm
        self.modules = activation_modules(lm)
        self.neurons = as_neuron_sets(neurons, len(self.modules), n_neurons(lm))
        self.handles: list = []
        self._placed: dict = {}

    def __enter__(self):
        for layer, indices in sorted(self.neurons.items()):
            self.handles.append(self.modules[layer - 1].register_forward_hook(self._hook(layer, indices)))
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _hook(self, layer: int, indices: np.ndarray):
        def hook(module, args, output):
            key = (layer, output.device)
            if key not in self._placed:
                self._placed[key] = torch.as_tensor(indices, device=output.device)
            if output.requires_grad:  # an activation's backward may need its output as it was
                return output.index_fill(-1, self._placed[key], 0)
            return output.index_fill_(-1, self._placed[key], 0)
        return hook


def deactivated(lm: LoadedModel, neurons) -> Deactivation:
    """`with deactivated(lm, neurons): ...`: every forward pass inside sees these neurons switched off
    (their activation 0 at every token). `neurons`: {layer: indices} (layer 1..L) or a table with `layer`
    and `neuron` columns, e.g. `lape.neurons("zh")`; an empty set changes nothing."""
    return Deactivation(lm, neurons)
