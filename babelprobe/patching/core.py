"""The forward passes of activation patching: read block outputs at given positions, and run a target text
in many patched copies at once.

    states, finals = read_states(lm, encodings, at, read)   # block outputs 1..L at `at`; final states at `read`
    finals = patched_copies(lm, targets)                      # per target: [copies, reads, d] final states
    probs = token_set_probs(lm, finals, sets)                 # next-token probability of each token set

A patched copy of a target writes given states into the block outputs at one position `at` (the
interventions' hooks: `Intervention` with a `Patch` edit per layer), every other state is the model's
own. Layers are numbered as everywhere (docs/design.md "Layers (numbering)"): the state of layer j is the
output of block j, before the final norm, so writing it at layer j replaces what block j computed there
and blocks j+1..L read it. Final states are after the final norm, what the vocabulary projection reads.

How a sweep stays cheap and exact: the model is causal, so the states before `at` are the same in every
copy. A target's tokens before `at` are run once (with a key/value cache) and only its tokens from `at`
on are run per copy, all copies of a batch of targets in one forward pass. An L-layer sweep of a
prompt whose last token is patched thus costs one pass over the prompt and L one-token steps. The
shared part is laid out left-aligned whatever the padding of its own pass, so that the positions of
the cache, and the sliding windows computed from them (Gemma-3), are the real ones. `tests/test_patch.py`
checks the copies against plain forward passes with plain hooks, batch 1 against 8, left against right
padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from babelprobe.benchmarks.core.logprobs import LOGIT_CHUNK_BYTES
from babelprobe.interventions.edits import Intervention, Patch
from babelprobe.models import Encoding, LoadedModel, length_batches, pad_batch
from babelprobe.sites import Hooks, residual

UNPATCHED = (-1, ())  # a copy that writes nothing: the target's own run


@dataclass
class Target:
    """One target text and the copies of it to run.

    `ids`: its token ids (BOS first when the model has one); `at`: the position every copy writes;
    `read`: the positions (≥ at) whose final states are returned; `sources`: [K, L, d] float32, K sets of
    states for the block outputs 1..L; `copies`: (k, layers) per copy: write `sources[k, j - 1]` at
    position `at` of block j's output for each j in `layers` (`UNPATCHED`: write nothing)."""

    ids: list[int]
    at: int
    read: list[int]
    sources: torch.Tensor
    copies: list[tuple[int, tuple[int, ...]]]

    def __post_init__(self):
        if not 0 <= self.at < len(self.ids) or any(not self.at <= p < len(self.ids) for p in self.read):
            raise ValueError(f"positions out of range: at={self.at}, read={self.read}, {len(self.ids)} tokens")


def read_states(lm: LoadedModel, encodings: list[Encoding], at: list[int], read: list[list[int]],
                batch_tokens: int = 4096, padding_side: str = "right") -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The block outputs 1..L of each text at its position `at[i]` ([n, L, d] float32, on the model's
    device), and its final states at the positions `read[i]` (a [len(read[i]), d] float32 tensor each),
    from one plain forward pass per batch."""
    n, n_layers = len(encodings), lm.n_layers
    finals: list[torch.Tensor | None] = [None] * n
    current: dict = {}

    def reader(layer: int):
        def read(h):
            rows, cols = current["rows"].to(h.device), current["cols"].to(h.device)
            states[current["batch"], layer - 1] = h[rows, cols].float().to(states.device)
        return read

    with Hooks(lm) as hooks, torch.inference_mode():
        for layer in range(1, n_layers + 1):
            hooks.read(residual(layer), reader(layer))
        states = torch.empty((n, n_layers, lm.d_model), dtype=torch.float32, device=lm.device)
        for batch in length_batches([len(e.ids) for e in encodings], batch_tokens):
            padded = pad_batch([encodings[i] for i in batch], lm.pad_token_id, padding_side, lm.device)
            width = padded["input_ids"].shape[1]
            shift = [width - len(encodings[i].ids) if padding_side == "left" else 0 for i in batch]
            current.update(batch=torch.tensor(batch, device=lm.device), rows=torch.arange(len(batch)),
                           cols=torch.tensor([s + at[i] for s, i in zip(shift, batch)]))
            hidden = hooks.run(padded).last_hidden_state
            for row, (s, i) in enumerate(zip(shift, batch)):
                finals[i] = hidden[row, [s + p for p in read[i]]].float()
    return states, finals


def patched_copies(lm: LoadedModel, targets: list[Target], batch_tokens: int = 4096,
                   padding_side: str = "left") -> list[torch.Tensor]:
    """For each target, the final states of each copy at its `read` positions: [copies, reads, d] float32
    (module docstring). `batch_tokens` bounds copies × (shared length + own length) per batch;
    `padding_side` is the padding of the shared part's own pass (the result does not depend on it)."""
    out: list[torch.Tensor | None] = [None] * len(targets)
    sizes = [len(t.copies) * len(t.ids) for t in targets]
    with torch.inference_mode():
        for batch in _batches(sizes, batch_tokens):
            for i, finals in zip(batch, _run_batch(lm, [targets[i] for i in batch], padding_side)):
                out[i] = finals
    return out


def _batches(sizes: list[int], budget: int) -> list[list[int]]:
    """Targets in order, cut so that the sum of their sizes stays under `budget` (at least one each)."""
    batches, current, total = [], [], 0
    for i, size in enumerate(sizes):
        if current and total + size > budget:
            batches.append(current)
            current, total = [], 0
        current.append(i)
        total += size
    return batches + [current] if current else batches


def _run_batch(lm: LoadedModel, targets: list[Target], padding_side: str) -> list[torch.Tensor]:
    from transformers import DynamicCache

    device = lm.device
    lengths = torch.tensor([t.at for t in targets])  # shared tokens per target: those before `at`
    width = int(lengths.max())
    row_of = torch.tensor([b for b, t in enumerate(targets) for _ in t.copies])  # the target of each copy
    keys, values = _shared_pass(lm, targets, width, padding_side) if width else ([], [])
    cache = DynamicCache()
    for layer, (k, v) in enumerate(zip(keys, values)):  # [B, kv_heads, width, head_dim] -> one row per copy
        index = row_of.to(k.device)
        cache.update(k[index], v[index], layer)
    own = [t.ids[t.at:] for t in targets]
    span = max(len(ids) for ids in own)
    input_ids = torch.full((len(row_of), span), lm.pad_token_id, dtype=torch.long)
    own_mask = torch.zeros((len(row_of), span), dtype=torch.long)
    for r, b in enumerate(row_of.tolist()):
        input_ids[r, :len(own[b])] = torch.tensor(own[b])
        own_mask[r, :len(own[b])] = 1
    shared_mask = (torch.arange(width)[None, :] >= width - lengths[:, None]).long()[row_of]  # left-aligned
    mask = torch.cat([shared_mask, own_mask], dim=1)
    positions = lengths[row_of][:, None] + torch.arange(span)[None, :]
    with Intervention(lm, _patch_edits(lm, targets)):
        hidden = lm.parts.body(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                               position_ids=positions.to(device), **lm.parts.cache_argument(cache),
                               use_cache=True).last_hidden_state
    out, start = [], 0
    for t in targets:
        rows = slice(start, start + len(t.copies))
        out.append(hidden[rows][:, [p - t.at for p in t.read]].float())
        start += len(t.copies)
    return out


def _shared_pass(lm: LoadedModel, targets: list[Target], width: int, padding_side: str):
    """Keys and values of every layer for the tokens before each target's `at`, left-aligned:
    per layer [targets, kv_heads, width, head_dim], each target's tokens in the last columns."""
    from transformers import DynamicCache

    ids = torch.full((len(targets), width), lm.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(targets), width), dtype=torch.long)
    for b, t in enumerate(targets):
        cols = slice(width - t.at, width) if padding_side == "left" else slice(0, t.at)
        ids[b, cols] = torch.tensor(t.ids[:t.at], dtype=torch.long)
        mask[b, cols] = 1
    padded = {"input_ids": ids.to(lm.device), "attention_mask": mask.to(lm.device),
              "position_ids": (mask.cumsum(dim=1) - 1).clamp(min=0).to(lm.device)}
    cache = DynamicCache()
    lm.parts.body(**padded, **lm.parts.cache_argument(cache), use_cache=True)
    keys, values = [], []
    order = None
    if padding_side == "right":  # real tokens first: move each row's padding to the front
        n = torch.tensor([t.at for t in targets])
        order = (torch.arange(width)[None, :] + n[:, None]) % width  # [targets, width]
    for layer in cache.layers:
        k, v = layer.keys, layer.values
        if order is not None:
            index = order.to(k.device)[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
            k, v = k.gather(2, index), v.gather(2, index)
        keys.append(k)
        values.append(v)
    return keys, values


def _patch_edits(lm: LoadedModel, targets: list[Target]) -> dict[int, Patch]:
    """{layer: Patch} writing, in every copy that patches that layer, its source state at its own first
    column (the position `at`)."""
    rows: dict[int, list[int]] = {}
    states: dict[int, list[torch.Tensor]] = {}
    r = 0
    for t in targets:
        for k, layers in t.copies:
            for layer in layers:
                if not 1 <= layer <= lm.n_layers:
                    raise ValueError(f"patched layers are block outputs 1..{lm.n_layers}, got {layer}")
                rows.setdefault(layer, []).append(r)
                states.setdefault(layer, []).append(t.sources[k, layer - 1])
            r += 1
    return {layer: Patch(rows[layer], [0] * len(rows[layer]), torch.stack(states[layer])) for layer in rows}


def token_set_probs(lm: LoadedModel, finals: torch.Tensor, sets: list[list[list[int]]]) -> np.ndarray:
    """[n, Q] float64: for each final state (row of `finals`, [n, d]) and each of its Q token sets
    (`sets[i][q]`, token ids), the sum of the next-token probabilities of the set's tokens (0 for an empty
    set). The softmax runs in float32 over the whole vocabulary, a chunk of rows at a time."""
    n, q = len(sets), len(sets[0]) if sets else 0
    width = max([len(s) for row in sets for s in row] + [1])
    index = torch.zeros((n, q, width), dtype=torch.long)
    keep = torch.zeros((n, q, width), dtype=torch.bool)
    for i, row in enumerate(sets):
        for j, ids in enumerate(row):
            index[i, j, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            keep[i, j, :len(ids)] = True
    vocab = lm.parts.head.weight.shape[0]
    chunk = max(1, LOGIT_CHUNK_BYTES // (4 * vocab))
    out = []
    with torch.inference_mode():
        for start in range(0, n, chunk):
            logits = lm.parts.logits(finals[start:start + chunk].to(lm.device)).float()
            log_z = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, index[start:start + chunk].flatten(1).to(logits.device))
            probs = (picked - log_z[:, None]).exp().view(-1, q, width) * keep[start:start + chunk].to(logits.device)
            out.append(probs.sum(-1).double().cpu())
    return torch.cat(out).numpy() if out else np.zeros((0, q))
