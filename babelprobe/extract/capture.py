"""Pool hidden states inside the forward pass, so only [batch, layers, d_model] leaves the device.

A `Pooler` is made for one batch from its attention mask. Each backend hands it the hidden states of
one layer ([batch, seq, d_model], as the model computes them) the moment they exist; the pooler keeps
  - `last`: the state at each text's last real token (index from the mask: right or left padding);
  - `mean`: the masked mean over the text's tokens, BOS excluded (the BOS state is an attention sink
    whose norm dwarfs the others, so including it would make every mean mostly BOS),
in float32 buffers [batch, n_layers_stored, d_model] on the device. Nothing else is kept, so memory
does not grow with the number of layers times the sequence length.

`StopForward` (`babelprobe.sites`) is raised after the last requested layer: the rest of the network (final norm, and the
vocabulary projection, which is most of a small multilingual model's compute) never runs.

A model dispatched over several devices (`load_model(device_map=...)`) hands over each layer on the
device of its block: the pooler pools there (its index tensors are copied to each device once) and
copies only the pooled [batch, d_model] rows to its buffers on the input device. `result_async` copies
the buffers into pinned host memory without blocking (CUDA), so the next batch can start while the
copy runs; `PooledRows.wait` returns the numpy arrays once it is done (on CPU: at once, no copy).

`result_async(encode=...)` hands the rows over as the store keeps them (float32, or bfloat16's bits as
uint16), encoded and checked for NaN/inf where they were pooled, with a [batch, n_columns] flag of the finite
rows: on a GPU the host then neither converts nor scans them, and half the bytes cross to it for a bfloat16
store (an 8B model's every layer is 270 KB per item in bfloat16: the store's host work is what bound fused
direct scoring, perf/README.md "The store's writing"). The encoding is torch's float32 -> bfloat16 conversion, round
to nearest even on every device (`store.encode_tensor`, which the host's `store.encode_array` uses too), so
the bytes are the same either way.
"""

from __future__ import annotations

import numpy as np
import torch

from babelprobe.extract.store import encode_tensor
from babelprobe.models import copies_done

# the site mechanism's names, kept here for the code that imports them from extraction
from babelprobe.sites.hooks import StopForward, first_input, hidden_of  # noqa: F401


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
        if exclude_bos:  # each text's first token left out where it has another (integer indices: a boolean
            # one would read the device's flags back, making the host wait for the previous batch's pass)
            first_index = weights.argmax(dim=1)
            has_text = mask.sum(dim=1) > 1
            weights[self.rows, first_index] = weights[self.rows, first_index] * ~has_text
        self.weights = (weights / weights.sum(dim=1, keepdim=True))[:, None, :]  # [batch, 1, seq]
        self.out = {pool: torch.empty((batch, n_columns, d_model), dtype=torch.float32, device=device)
                    for pool in pools}
        self._on = {device: (self.rows, self.last_index, self.weights)}

    def indices(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows, last index, mean weights) on `device`, copied there once (a block on another GPU)."""
        if device not in self._on:
            self._on[device] = tuple(t.to(device) for t in (self.rows, self.last_index, self.weights))
        return self._on[device]

    def add(self, column: int, hidden: torch.Tensor) -> None:
        """Pool one layer's hidden states [batch, seq, d_model] into stored column `column`."""
        rows, last_index, weights = self.indices(hidden.device)
        if "last" in self.out:
            pooled = hidden[rows, last_index].to(torch.float32)
            self.out["last"][:, column] = pooled.to(self.rows.device, non_blocking=True)
        if "mean" in self.out:
            pooled = torch.bmm(weights, hidden.to(torch.float32))[:, 0]
            self.out["mean"][:, column] = pooled.to(self.rows.device, non_blocking=True)

    def set(self, pool: str, values: torch.Tensor) -> None:
        """All columns of `pool` at once ([batch, n_columns, d_model], pooled elsewhere: a remote trace)."""
        self.out[pool].copy_(values)

    def result_async(self, encode: str | None = None) -> PooledRows:
        """Start copying the pooled states to host memory (pinned, non-blocking on CUDA); see `PooledRows`.
        `encode` ("float32" or "bfloat16"): the rows encoded as a store of that dtype keeps them, with the
        flags of finite rows (module docstring); None: float32 rows, unchecked."""
        out, finite = self.out, None
        if encode is not None:
            finite = {pool: torch.isfinite(values).all(dim=-1) for pool, values in out.items()}
            out = {pool: encode_tensor(values, encode) for pool, values in out.items()}
        if next(iter(out.values())).device.type != "cuda":
            return PooledRows({pool: values.cpu() for pool, values in out.items()}, None,
                              None if finite is None else {pool: flags.cpu() for pool, flags in finite.items()})
        host = {pool: to_pinned(values) for pool, values in out.items()}  # queued on the device's current stream
        flags = None if finite is None else {pool: to_pinned(values) for pool, values in finite.items()}
        return PooledRows(host, copies_done(next(iter(out.values())).device), flags)

    def result(self) -> dict[str, np.ndarray]:
        """The pooled states as float32 numpy arrays [batch, n_columns, d_model] (one copy off the device)."""
        return self.result_async().wait()


def to_pinned(values: torch.Tensor) -> torch.Tensor:
    """A non-blocking copy of device `values` into new page-locked host memory."""
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    return host.copy_(values, non_blocking=True)


class PooledRows:
    """Pooled states on their way to host memory: `wait()` blocks until the copy is done (a CUDA event)
    and returns them as numpy arrays (bfloat16 bits as uint16); `finite()` then the flags of the rows found
    finite on the device ([batch, n_columns] per pool), or None when the rows were not checked there. Safe to
    call from another thread."""

    def __init__(self, host: dict[str, torch.Tensor], done=None, finite: dict[str, torch.Tensor] | None = None):
        self.host, self.done, self.flags = host, done, finite

    def wait(self) -> dict[str, np.ndarray]:
        if self.done is not None:
            self.done.synchronize()
        return {pool: as_numpy(values) for pool, values in self.host.items()}

    def finite(self) -> dict[str, np.ndarray] | None:
        self.wait()
        return None if self.flags is None else {pool: flags.numpy() for pool, flags in self.flags.items()}


def as_numpy(values: torch.Tensor) -> np.ndarray:
    array = values.numpy()
    return array.view(np.uint16) if array.dtype == np.int16 else array  # bfloat16 bits, as the store keeps them
