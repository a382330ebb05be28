"""Token states for training an SAE: every token's residual-stream state at one layer, from a corpus's
packed rows, served as shuffled training batches the way SAELens' `ActivationsStore` serves them.

    states = layer_states(lm, rows, layer)                 # [tokens, d]: every token but each row's BOS
    for batch in training_batches(lm, rows, layer, batch_size=4096, seed=0):   # endless, shuffled
        ...

`training_batches`: the rows run through the model in a seeded random order each epoch (SAELens runs its
dataset again, silently, when it runs out), their states (BOS left out, as SAELens'
`exclude_special_tokens`; BOS is an attention sink unlike any text token) pass through SAELens'
`mixing_buffer`: a buffer of `n_batches_in_buffer` batches, shuffled whenever full, half served as
batches and half kept to mix with the next states. Nothing is written to disk. The model is
deterministic, so the states of a row are the same in every epoch: they are kept in memory after its
first pass when all of them fit in `cache_bytes` (speed only: the batches are the same).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from babelprobe.models import Encoding, LoadedModel, length_batches, pad_host, to_device
from babelprobe.sae.stats import counted_tokens

CACHE_BYTES = 4 * 2**30  # the states of every training row are kept when they fit in this much memory


class _Collector:
    """Receives one layer's hidden states per batch from an extraction backend (the `Pooler` interface) and
    keeps every real token's state but each row's BOS, row by row. Which positions those are comes from the
    host's padded batch, and the batch's states leave the device in one copy (a boolean index and a copy per
    row would each make a GPU's host wait for the pass)."""

    def __init__(self, skip_bos: bool):
        self.skip_bos = skip_bos
        self.positions, self.counts = None, []
        self.rows: list[torch.Tensor] = []

    def begin(self, attention_mask: torch.Tensor) -> None:
        """The batch's host attention mask (right padding)."""
        mask = counted_tokens(attention_mask, self.skip_bos)
        self.positions, self.counts, self.rows = torch.from_numpy(np.flatnonzero(mask)), mask.sum(1).tolist(), []

    def add(self, column: int, hidden: torch.Tensor) -> None:
        states = hidden.reshape(-1, hidden.shape[-1]).index_select(0, self.positions.to(hidden.device))
        self.rows = list(torch.split(states.to(torch.float32).cpu(), self.counts))


def run_rows(lm: LoadedModel, rows: list[list[int]], layer: int, batch_tokens: int = 8192) -> Iterator[tuple[int, torch.Tensor]]:
    """(row index, float32 [tokens, d]) for every row: its states at `layer`, BOS left out."""
    from babelprobe.extract.backends import make_backend

    collector = _Collector(lm.bos_policy == "bos")
    encodings = [Encoding(row, [(0, 0)] * len(row)) for row in rows]
    with make_backend("hf", lm, [layer]) as backend, torch.inference_mode():
        for batch in length_batches([len(r) for r in rows], batch_tokens):
            padded = pad_host([encodings[i] for i in batch], lm.pad_token_id, "right")
            collector.begin(padded["attention_mask"])
            backend.run(to_device(padded, lm.device), collector)
            yield from zip(batch, collector.rows)


def layer_states(lm: LoadedModel, rows: list[list[int]], layer: int, batch_tokens: int = 8192) -> torch.Tensor:
    """float32 [tokens, d]: the states of every token of `rows` but BOS, row after row."""
    found = dict(run_rows(lm, rows, layer, batch_tokens))
    return torch.cat([found[i] for i in range(len(rows))]) if rows else torch.zeros(0, lm.d_model)


def mixing_buffer(buffer_size: int, batch_size: int, loader: Iterator[torch.Tensor], generator: torch.Generator,
                  mix_fraction: float = 0.5) -> Iterator[torch.Tensor]:
    """SAELens' `mixing_buffer` (training/mixing_buffer.py): states are gathered until `buffer_size`,
    shuffled, and all but `mix_fraction` of the buffer served in batches of `batch_size` (seeded here)."""
    if buffer_size < batch_size:
        raise ValueError("buffer_size must be at least batch_size")
    storage = None
    for new in loader:
        storage = new if storage is None else torch.cat([storage, new])
        if len(storage) >= buffer_size:
            if mix_fraction > 0:
                storage = storage[torch.randperm(len(storage), generator=generator)]
            keep = int(buffer_size * mix_fraction)
            n_batches = max(1, (len(storage) - keep) // batch_size)
            serving, storage = storage[:n_batches * batch_size], storage[n_batches * batch_size:]
            for b in range(n_batches):
                yield serving[b * batch_size:(b + 1) * batch_size]
    if storage is not None:
        for b in range(len(storage) // batch_size):
            yield storage[b * batch_size:(b + 1) * batch_size]


def epoch_states(lm: LoadedModel, rows: list[list[int]], layer: int, seed: int, batch_tokens: int,
                 cache: dict | None) -> Iterator[torch.Tensor]:
    """Endless: each epoch the rows in a random order (seeded by `seed` and the epoch), in model batches;
    `cache` ({row: states}, or None) keeps the states of rows already run."""
    epoch = 0
    while True:
        order = [int(i) for i in np.random.default_rng([seed, epoch]).permutation(len(rows))]
        if cache is None:  # run as served: nothing kept beyond the batch in hand
            served = ((order[k], states) for k, states in run_rows(lm, [rows[i] for i in order], layer, batch_tokens))
        else:
            todo = [i for i in order if i not in cache]
            cache.update({todo[k]: states for k, states in run_rows(lm, [rows[i] for i in todo], layer, batch_tokens)})
            served = ((i, cache[i]) for i in order)
        group: list[torch.Tensor] = []
        size = 0
        for _, states in served:  # about `batch_tokens` states at a time
            group.append(states)
            size += len(states)
            if size >= batch_tokens:
                yield torch.cat(group)
                group, size = [], 0
        if group:
            yield torch.cat(group)
        epoch += 1


def training_batches(lm: LoadedModel, rows: list[list[int]], layer: int, batch_size: int, seed: int = 0, *,
                     n_batches_in_buffer: int = 16, batch_tokens: int = 8192,
                     cache_bytes: int = CACHE_BYTES) -> Iterator[torch.Tensor]:
    """Endless shuffled batches [batch_size, d] of the rows' token states (module docstring)."""
    n_tokens = sum(len(r) for r in rows)
    cache = {} if n_tokens * lm.d_model * 4 <= cache_bytes else None
    generator = torch.Generator().manual_seed(seed)
    # with fewer tokens than the buffer, the buffer holds them all (one epoch), mixed as SAELens mixes
    buffer = max(batch_size, min(batch_size * n_batches_in_buffer, n_tokens))
    return mixing_buffer(buffer, batch_size, epoch_states(lm, rows, layer, seed, batch_tokens, cache), generator)
