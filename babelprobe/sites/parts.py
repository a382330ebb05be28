"""`Parts`: the pieces of one loaded causal LM that babelprobe calls separately, found by its family's row
of babelprobe/data/families.csv or by the structural rule (`sites.table.locate`).

The logits are what the model's own *ForCausalLM forward computes from the final states (after the
final norm): the head, then the family's logit scale (Cohere multiplies by `logit_scale`, Granite divides
by `logits_scaling`), then its soft-cap (Gemma-2/3: cap·tanh(logits/cap)). A site the family does not
have, or that could not be found, is named in `missing` and refused in one line where it is asked for,
never replaced by something else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import nn
from torch.nn import functional as F

from babelprobe.errors import BabelprobeError


@dataclass
class Parts:
    """The pieces of a causal LM that scorers, extractors and hooks use (module docstring)."""

    body: nn.Module  # embeddings + blocks + final norm; returns hidden states, never logits
    embed: nn.Module
    layers: nn.ModuleList
    final_norm: nn.Module | None  # None: the family has none (or it was not found: `missing["final_norm"]`)
    head: nn.Module  # hidden state -> vocabulary logits
    softcap: float | None  # Gemma-2 style final logit soft-capping, applied after `head` and the scale
    device: torch.device | None = None  # the input device; logits come back there (a dispatched head may be elsewhere)
    logit_scale: float | None = None  # multiplies the head's logits (Cohere's `logit_scale`)
    logit_divisor: float | None = None  # divides them (Granite's `logits_scaling`)
    activations: list[nn.Module] | None = None  # block i's MLP activation module (moe: experts) at index i - 1
    width: int | None = None  # neurons per MLP (the activation's last dimension)
    routed: bool = False  # `activations` are experts modules, their neurons read as `sites.moe` says
    family: object | None = None  # the `sites.table.Family` these were found by
    missing: dict[str, str] = field(default_factory=dict)  # "final_norm" / "mlp" -> why it is not there

    def logits(self, hidden: torch.Tensor, vocab: slice | None = None) -> torch.Tensor:
        """What the HF CausalLM forward computes from final hidden states (after the final norm); with `vocab`,
        only those token ids' logits (a plain `nn.Linear` head only: `sliceable_head`)."""
        if vocab is None:
            out = self.head(hidden)
        else:
            bias = self.head.bias
            out = F.linear(hidden, self.head.weight[vocab], None if bias is None else bias[vocab])
        if self.logit_scale is not None:
            out = out * self.logit_scale
        if self.logit_divisor is not None:
            out = out / self.logit_divisor
        if self.softcap:
            out = torch.tanh(out / self.softcap) * self.softcap
        if self.device is not None and out.device != self.device:
            out = out.to(self.device)
        return out

    def sliceable_head(self, device: torch.device) -> bool:
        """Whether `logits(..., vocab=slice)` may be used: the head is a plain linear layer (not quantised or
        wrapped) whose weight is on `device`."""
        return type(self.head) is nn.Linear and self.head.weight.device == device

    def normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """Pre-final-norm states (a layer's residual stream) through the model's final norm, as the model
        treats its last block's output; a one-line error when the final norm was not found."""
        if "final_norm" in self.missing:
            raise BabelprobeError(self.missing["final_norm"])
        return self.final_norm(hidden) if self.final_norm is not None else hidden

    def activation(self, layer: int) -> nn.Module:
        """The module whose output is block `layer`'s MLP activation (layer 1..L); a one-line error for a
        family whose neurons babelprobe cannot read."""
        if "mlp" in self.missing:
            raise BabelprobeError(self.missing["mlp"])
        if not 1 <= layer <= len(self.activations):
            raise BabelprobeError(f"MLP layers are 1..{len(self.activations)} (block i's MLP is layer i), got {layer}")
        return self.activations[layer - 1]

    def site_module(self, site) -> tuple[nn.Module, bool]:
        """(module, entering) of a `sites.hooks.Site`: entering means the state is the module's input."""
        n = len(self.layers)
        if site.kind == "residual":
            if not 0 <= site.layer <= n:
                raise BabelprobeError(f"layer {site.layer}: layers are 0..{n} (0 = embeddings)")
            return (self.layers[0], True) if site.layer == 0 else (self.layers[site.layer - 1], False)
        return self.activation(site.layer), False

    def cache_argument(self, cache) -> dict:
        """The body's keyword for a KV cache: transformers 5 renamed `past_key_values` to `cache` (the old
        name warns, and goes in 5.40); 4.x knows only the old one."""
        return {self._cache_keyword: cache}

    @cached_property
    def _cache_keyword(self) -> str:
        # read once per model: scorers and patching ask for it on every batch
        import inspect

        forward = getattr(self.body, "forward", self.body)
        return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
