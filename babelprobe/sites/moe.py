"""The neurons of a mixture-of-experts MLP (Mixtral, Qwen3-MoE, OLMoE): one expert's unit, active only on
the tokens routed to that expert.

transformers 5 keeps a block's experts as one module (`mlp.experts`) holding every expert's weights in 3D
tensors, `gate_up_proj` [E, 2·I, d] (gate rows first) and `down_proj` [E, d, I], called as
`experts(hidden [tokens, d], top_k_index [tokens, k], top_k_weights)`; expert e computes, for the tokens
routed to it, `down_proj[e] · (act_fn(gate) * up)` with `gate, up = (gate_up_proj[e] · x).chunk(2)`
(the eager forward, e.g. `MixtralExperts.forward`; its grouped and batched implementations compute the
same). Neuron e·I + j is unit j of expert e, so a layer has E·I neurons:

- read (`routed_activation`): [tokens, E·I], `act_fn(gate)` where the token is routed to the expert and 0
  where it is not (a neuron counts as active on a token only when the token reaches its expert); computed
  from the experts' own weights and `act_fn` in a pre-hook on the experts module, as the eager forward
  does. It holds tokens × E·I values (Mixtral-8x7B: 460 KB a token): a smaller --batch-tokens bounds it.
- switch off (`switched_off`): column j of `down_proj[e]` set to 0 while the context is open, which is
  exactly the activation set to 0 (the down projection's product term is 0 either way), in every experts
  implementation.

A layout other than this one (transposed or interleaved gate/up, no gate, a shared expert beside the
routed ones as in Qwen2-MoE) is refused where the table says so (`mlp` = moe-shared) or where the module
does not have it.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from babelprobe.errors import BabelprobeError


def check_layout(experts: nn.Module, name: str) -> int:
    """I, the units of one expert; a one-line error for an experts module of another layout."""
    weights = getattr(experts, "gate_up_proj", None)
    down = getattr(experts, "down_proj", None)
    plain = (getattr(experts, "is_concatenated", True) and not getattr(experts, "is_transposed", False)
             and getattr(experts, "has_gate", True))
    if not isinstance(weights, torch.Tensor) or not isinstance(down, torch.Tensor) or weights.dim() != 3 or not plain \
            or not hasattr(experts, "act_fn"):
        raise BabelprobeError(f"the experts of {name} ({type(experts).__name__}) are not laid out as babelprobe reads "
                              "them (gate_up_proj [E, 2I, d], down_proj [E, d, I], act_fn)")
    return int(down.shape[-1])


def routed_activation(experts: nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor) -> torch.Tensor:
    """[tokens, E·I]: each token's activation of every expert's units, 0 for experts it is not routed to."""
    n_experts, width = experts.gate_up_proj.shape[0], experts.down_proj.shape[-1]
    out = hidden.new_zeros((hidden.shape[0], n_experts, width))
    for expert in range(n_experts):
        tokens = (top_k_index == expert).any(dim=-1).nonzero()[:, 0]
        if len(tokens):
            gate, _ = nn.functional.linear(hidden[tokens], experts.gate_up_proj[expert]).chunk(2, dim=-1)
            out[tokens, expert] = experts.act_fn(gate)
    return out.view(hidden.shape[0], n_experts * width)


def experts_input(args, kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states, top_k_index) of a call of an experts module."""
    hidden = args[0] if args else kwargs["hidden_states"]
    index = args[1] if len(args) > 1 else kwargs["top_k_index"]
    return hidden, index


@contextlib.contextmanager
def switched_off(experts_of: dict[int, nn.Module], neurons: dict[int, object]):
    """While open, the neurons {layer: indices (e·I + j)} are off: column j of `down_proj[e]` is 0 (module
    docstring); the columns are restored on exit, whatever happened."""
    saved = []
    try:
        with torch.no_grad():
            for layer, indices in sorted(neurons.items()):
                down = experts_of[layer].down_proj
                index = torch.as_tensor(indices, dtype=torch.long, device=down.device)
                expert, unit = index // down.shape[-1], index % down.shape[-1]
                saved.append((down, expert, unit, down[expert, :, unit].clone()))
                down[expert, :, unit] = 0
        yield
    finally:
        with torch.no_grad():
            for down, expert, unit, values in reversed(saved):
                down[expert, :, unit] = values
