"""Pool hidden states inside the forward pass, so only [batch, layers, d_model] leaves the device.

A `Pooler` is made for one batch from its attention mask. Each backend hands it the hidden states of
one layer ([batch, seq, d_model], as the model computes them) the moment they exist; the pooler keeps
  - `last`: the state at each text's last real token (index from the mask: right or left padding);
  - `mean`: the masked mean over the text's tokens, BOS excluded (the BOS state is an attention sink
    whose norm dwarfs the others, so including it would make every mean mostly BOS),
in float32 buffers [batch, n_layers_stored, d_model] on the device. Nothing else is kept, so memory
does not grow with the number of layers times the sequence length.

`StopForward` is raised after the last requested layer: the rest of the network (final norm, and the
vocabulary projection, which is most of a small multilingual model's compute) never runs.
"""

from __future__ import annotations

import numpy as np
import torch


class StopForward(Exception):
    """Raised from the hook of the last requested layer to end the forward pass there."""


def hidden_of(output):
    """The hidden-state tensor of a block's output: a bare tensor (transformers 5) or a tuple's first item."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return output[0]
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    raise TypeError(f"cannot find the hidden states in a block output of type {type(output).__name__}")


def first_input(args, kwargs):
    """The hidden states entering a block (first positional argument or `hidden_states=`)."""
    return args[0] if args else kwargs["hidden_states"]


class Pooler:
    """Collects the pooled states of one batch, layer by layer (see module docstring).

    Parameters
    ----------
    attention_mask : [batch, seq] 0/1 tensor on the model's device.
    pools : subset of ("last", "mean").
    n_columns : number of stored layers; `column` in `add` indexes them.
    exclude_bos : leave each text's first token out of the mean (when the model puts BOS first and
        the text has at least one token besides it).
    """

    def __init__(self, attention_mask: torch.Tensor, pools, n_columns: int, d_model: int,
                 exclude_bos: bool = True):
        mask = attention_mask.to(torch.bool)
        batch, width = mask.shape
        device = mask.device
        self.rows = torch.arange(batch, device=device)
        weights = mask.to(torch.float32)
        # last real token: the first 1 from the right (argmax returns the first maximum), so right and
        # left padding both work
        self.last_index = width - 1 - weights.flip(1).argmax(dim=1)
        if exclude_bos:
            first_index = weights.argmax(dim=1)
            has_text = mask.sum(dim=1) > 1
            weights[self.rows[has_text], first_index[has_text]] = 0.0
        self.weights = (weights / weights.sum(dim=1, keepdim=True))[:, None, :]  # [batch, 1, seq]
        self.out = {pool: torch.empty((batch, n_columns, d_model), dtype=torch.float32, device=device)
                    for pool in pools}

    def add(self, column: int, hidden: torch.Tensor) -> None:
        """Pool one layer's hidden states [batch, seq, d_model] into stored column `column`."""
        if "last" in self.out:
            self.out["last"][:, column] = hidden[self.rows, self.last_index].to(torch.float32)
        if "mean" in self.out:
            self.out["mean"][:, column] = torch.bmm(self.weights, hidden.to(torch.float32))[:, 0]

    def result(self) -> dict[str, np.ndarray]:
        """The pooled states as float32 numpy arrays [batch, n_columns, d_model] (one copy off the device)."""
        return {pool: values.cpu().numpy() for pool, values in self.out.items()}
