"""The MLP neurons of a model, inside the forward pass: counting how often their activation is positive
(`NeuronCounter`), and switching some of them off (`Deactivation`, `deactivated`).

A neuron is one of the I units of a block's MLP, and its activation the output of the MLP's activation
function (Tang et al. 2024, released `activation.py`: LLaMA's `SiLU(gate_proj(x))`, BLOOM's
`gelu_impl(dense_h_to_4h(x))`): in a gated MLP (Llama, Gemma, Qwen, Mistral, Cohere, OLMo) `act_fn(gate_proj(x))`,
before the product with `up_proj(x)`; in a fused one (Phi-3) the activation of the gate half of
`gate_up_proj(x)`; in a plain one (GPT-2, BLOOM, XGLM, Falcon, GPT-J, GPT-NeoX) `act(fc(x))`. Where each
family computes it is declared in babelprobe/data/families.csv (`babelprobe.sites`): the neurons are read
and written at the `mlp` site of each layer, a hook on that module whose output is [batch, seq, I]. In a
mixture of experts (Mixtral, Qwen3-MoE, OLMoE) neuron e·I + j is unit j of expert e, active on a token
only when the token is routed to expert e (`sites.moe`: read from the experts' input, switched off by
zeroing its column of the expert's down projection); one with a shared expert beside the routed ones
(Qwen2-MoE) is refused in one line. Neurons are numbered by layer as in docs/design.md "Layers
(numbering)": block i's MLP is layer i (1..L), its neurons 0..I-1.

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

import contextlib

import numpy as np
import pandas as pd
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.models import LoadedModel
from babelprobe.sites import Hooks, mlp
from babelprobe.sites.moe import switched_off


def activation_modules(lm: LoadedModel) -> list[torch.nn.Module]:
    """The activation module of every block's MLP, block 1 first (`Parts.activation`); a one-line error for
    a family whose neurons cannot be read (module docstring)."""
    return [lm.parts.activation(layer) for layer in range(1, lm.n_layers + 1)]


def n_neurons(lm: LoadedModel) -> int:
    """I, the neurons of each MLP (the width of its activation)."""
    activation_modules(lm)  # refuses a family without readable neurons
    return int(lm.parts.width)


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
        self.n_layers = len(activation_modules(lm))
        self.skip_bos = lm.bos_policy == "bos"
        self.counts: list[torch.Tensor | None] = [None] * self.n_layers
        self._tokens: torch.Tensor | int = 0  # summed where the masks are: read back by `take`, not every batch
        self.hooks = Hooks(lm)
        self._masks: dict = {}

    def __enter__(self):
        for layer in range(1, self.n_layers + 1):
            self.hooks.read(mlp(layer), self._counter(layer - 1), stop=layer == self.n_layers)
        return self

    def __exit__(self, *exc):
        self.hooks.close()

    def _counter(self, index: int):
        def count(output):
            # 1 where the activation is > 0, else 0, then the counted tokens' sum as one matrix-vector
            # product: float ops and BLAS, several times faster on a CPU than a boolean reduction; the
            # sums are integers, exact in the weights' dtype (`run` picks float64 beyond 2^24 tokens)
            weights = self._mask_on(output.device)
            positive = output.clamp(min=0).sign_().reshape(-1, output.shape[-1]).to(weights.dtype)
            counted = (weights @ positive).to(torch.int64)
            self.counts[index] = counted if self.counts[index] is None else self.counts[index] + counted
        return count

    def _mask_on(self, device) -> torch.Tensor:
        if device not in self._masks:
            self._masks[device] = next(iter(self._masks.values())).to(device)
        return self._masks[device]

    def run(self, batch: dict[str, torch.Tensor]) -> None:
        """Count the tokens of one padded batch (`models.pad_batch`)."""
        mask = count_mask(batch["attention_mask"], self.skip_bos)
        dtype = torch.float32 if mask.numel() < 2 ** 24 else torch.float64
        self._masks = {mask.device: mask.reshape(-1).to(dtype)}
        self._tokens = self._tokens + mask.sum()
        with torch.inference_mode():
            self.hooks.run(batch)

    @property
    def n_tokens(self) -> int:
        """Tokens counted since the last `take` (a read back from the device)."""
        return int(self._tokens)

    def take(self) -> tuple[np.ndarray, int]:
        """(int64 [L, I] counts, tokens counted) since the last `take`; both start again from 0."""
        width = n_neurons(self.lm)
        out = np.stack([c.cpu().numpy().astype(np.int64) if c is not None else np.zeros(width, np.int64)
                        for c in self.counts])
        n, self.counts, self._tokens = self.n_tokens, [None] * self.n_layers, 0
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
        self.neurons = as_neuron_sets(neurons, len(activation_modules(lm)), n_neurons(lm))
        self.hooks = Hooks(lm)
        self._stack: contextlib.ExitStack | None = None
        self._placed: dict = {}

    def __enter__(self):
        if self.lm.parts.routed:  # a mixture of experts: the down projections' columns (sites.moe)
            self._stack = contextlib.ExitStack()
            experts = {layer: self.lm.parts.activation(layer) for layer in self.neurons}
            self._stack.enter_context(switched_off(experts, self.neurons))
            return self
        for layer, indices in sorted(self.neurons.items()):
            self.hooks.write(mlp(layer), self._switch_off(layer, indices))
        return self

    def __exit__(self, *exc):
        self.hooks.close()
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def _switch_off(self, layer: int, indices: np.ndarray):
        def switch_off(output):
            key = (layer, output.device)
            if key not in self._placed:
                self._placed[key] = torch.as_tensor(indices, device=output.device)
            if output.requires_grad:  # an activation's backward may need its output as it was
                return output.index_fill(-1, self._placed[key], 0)
            return output.index_fill_(-1, self._placed[key], 0)
        return switch_off


def deactivated(lm: LoadedModel, neurons) -> Deactivation:
    """`with deactivated(lm, neurons): ...`: every forward pass inside sees these neurons switched off
    (their activation 0 at every token). `neurons`: {layer: indices} (layer 1..L) or a table with `layer`
    and `neuron` columns, e.g. `lape.neurons("zh")`; an empty set changes nothing."""
    return Deactivation(lm, neurons)
