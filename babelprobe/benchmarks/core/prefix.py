"""Shared-prefix scoring: `token_logprobs` for texts that start alike (prompts and their answers), every
shared token prefix run through the model once (`shared_prefix_logprobs`, re-exported by `logprobs`).

The texts' tokens are merged into a prefix tree; the tree is run level by level, each node's tokens given the
KV cache of the tokens before it. Meta prompts in both option orders share their opening question, the same
question with the same first option is shared across subsets, and a prompt is run once for both of its
answers. Only states that predict scored tokens reach the vocabulary projection, each once (a prompt's last
state predicts the first token of both of its answers: 16% of the scored tokens of XCOMPS's meta prompts).

Like `token_logprobs` it comes in three steps for callers that overlap host and device work
(`pipeline.pipelined`): `plan_prefix` (host: tokenise, sort, build the trees, cut and pad every batch),
`run_prefix` (the device: the forward passes and projections; one read back for everything) and
`PrefixPlan.collect` (host: the per-text results).

Batches of one level hold segments (chains of nodes without branches) after their own past, which is copied
from the kept KV rows. How large a batch may be depends on the device (`past_budget`): on a CPU, where
compute is proportional to every token in the batch, rows × (longest past + longest segment) stays under
the token budget; on an accelerator, whose cost per forward pass is mostly fixed overhead unless the batch is
large, the budget bounds the new tokens (rows × longest segment), and the copied past may be
`PAST_PER_TOKEN` times as large (it costs memory and bandwidth, not matmuls), less where a CUDA device's memory
beyond the weights is small (`kv_room`, which also bounds the keys and values a chunk keeps).

The passes run under `models.sync_free_attention` (transformers' SDPA without its per-pass read of the mask).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch
from tqdm.auto import tqdm

from babelprobe.benchmarks.core.logprobs import (
    Readback,
    TokenLogprobs,
    _distinct_requests,
    _gathered_logprobs,
    projected_rows,
)
from babelprobe.models import LoadedModel, cheapest_batches, pass_tokens, sync_free_attention

PAST_PER_TOKEN = 8  # accelerators: past tokens copied per token of the budget (KV memory, not compute)
STACK_KV = True  # keep alike layers' keys and values in one tensor (False: per layer, as a dispatched model)
CHUNK_KV_BYTES = 16 << 30  # accelerators: a chunk's kept keys and values at most (and 2 × budget × PAST_PER_TOKEN
# tokens): at the 8B shape 131,072 tokens, the tree of `meta.TREE_CHUNK_PAIRS` XCOMPS pairs (~126k distinct tokens)


def past_budget(device: torch.device) -> int | None:
    """Past tokens a batch may copy per budget token on `device`; None: the past counts in the budget (CPU)."""
    return None if device.type == "cpu" else PAST_PER_TOKEN


def keeps_memory(device: torch.device) -> bool:
    """Whether a plan's gathered pasts and node rows are made once and reused (`_KeptMemory`): on a CPU."""
    return device.type == "cpu"


def kv_room(lm: LoadedModel) -> int | None:
    """Bytes that a chunk's kept keys and values, and separately a batch's copied past, may each take on a CUDA
    device: a quarter of its memory beyond the model's weights there (the rest: the batch's activations and
    projections, and PyTorch's cache). None elsewhere (no limit known: the constants hold). On an 80 GB GPU under
    an 8B model in bfloat16 this is ~16 GB, about `CHUNK_KV_BYTES`; on a 24 GB one ~2 GB, where 16 GiB would not
    fit."""
    total = _device_total(lm.device)
    if total is None:
        return None
    here = lm.device if lm.device.index is not None or lm.device.type != "cuda" else \
        torch.device("cuda", torch.cuda.current_device())  # "cuda" alone: the weights say "cuda:0"
    weights = sum(t.numel() * t.element_size() for t in (*lm.model.parameters(), *lm.model.buffers())
                  if t.device == here)
    return max(0, total - weights) // 4


def _device_total(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory


def _kv_bytes_per_token(lm: LoadedModel) -> int:
    """Bytes of keys and values one token keeps over all layers (from the config; 1 when it does not say)."""
    config = lm.model.config
    heads = getattr(config, "num_attention_heads", 1) or 1
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or lm.d_model // heads
    return max(1, 2 * lm.n_layers * kv * head_dim * torch.finfo(lm.dtype).bits // 8)


def shared_prefix_logprobs(lm: LoadedModel, texts: list[str], score_from: list[int] | None = None,
                           names: list[str] | None = None, batch_tokens: int = 4096, padding_side: str = "left",
                           truncate: bool = False, progress: bool = True,
                           chunk_tokens: int | None = None) -> list[TokenLogprobs]:
    """Same arguments and results as `token_logprobs` (same scored tokens, same flags; `padding_side` is
    accepted so that it is a drop-in, but the tree always pads the past on the left).

    Texts are sorted so that alike ones are neighbours and processed in chunks of about `chunk_tokens`
    distinct tokens (default 2 × batch_tokens; on an accelerator `PAST_PER_TOKEN` times that, at most
    `CHUNK_KV_BYTES` of keys and values, and on CUDA at most `kv_room`, which also shortens the copied past);
    a chunk's keys and values, every layer's for every token, are kept until it is done (37 KB per token on
    the default model: about 300 MB on a CPU; 128 KB per token at Llama-3.1-8B's shape in bfloat16: 16 GiB,
    131k tokens, on a GPU). Sliding-window layers keep everything too; their window comes from the attention mask.
    `tests/test_meta_logprobs.py` checks the result against a plain forward pass, sliding layers included."""
    plan = plan_prefix(lm, texts, score_from, names, batch_tokens, truncate, chunk_tokens)
    return plan.collect(run_prefix(lm, plan, progress=progress).wait())


@dataclass
class PrefixPlan:
    """Everything `run_prefix` needs, made on the host: per chunk its number of nodes and its batches (host
    tensors, level by level), and where each projected row's log-prob goes (`slots`, in run order)."""

    texts: list[str]
    score_from: list[int]
    unique: list[tuple[str, int]]
    encodings: list
    targets: list[list[int]]
    chunks: list[tuple[int, list[dict]]]  # (nodes, batches)
    slots: np.ndarray  # for each projected row, in run order: its index among all texts' scored tokens
    n_tokens: int

    def collect(self, flat: np.ndarray) -> list[TokenLogprobs]:
        ends = np.cumsum([len(t) for t in self.targets]).tolist()
        values = np.zeros(ends[-1] if ends else 0)
        values[self.slots] = flat
        results = [TokenLogprobs(ids=[enc.ids[p] for p in positions], offsets=[enc.offsets[p] for p in positions],
                                 logprobs=values[end - len(positions):end], truncated=enc.truncated,
                                 spans_join=bool(positions) and enc.offsets[positions[0]][0] < start)
                   for enc, positions, (_, start), end in zip(self.encodings, self.targets, self.unique, ends)]
        index = {key: i for i, key in enumerate(self.unique)}
        return [results[index[key]] for key in zip(self.texts, self.score_from)]


def plan_prefix(lm: LoadedModel, texts: list[str], score_from: list[int] | None = None,
                names: list[str] | None = None, batch_tokens: int = 4096, truncate: bool = False,
                chunk_tokens: int | None = None) -> PrefixPlan:
    """The host work of `shared_prefix_logprobs` (module docstring)."""
    score_from, unique, encodings, targets = _distinct_requests(lm, texts, score_from, names, truncate)
    # A text's model inputs: its tokens up to (not including) its last scored token.
    texts_in = [i for i, positions in enumerate(targets) if positions]
    n_inputs = np.array([targets[i][-1] for i in texts_in], dtype=np.int64)
    first_slot = np.concatenate([[0], np.cumsum([len(t) for t in targets])])
    pin, past = lm.device.type == "cuda", past_budget(lm.device)
    kv, room = _kv_bytes_per_token(lm), kv_room(lm) if past is not None else None
    if room is not None:  # the copied past and the chunk's keys and values within what the device holds
        past = max(1, min(past, room // (batch_tokens * kv)))
    if chunk_tokens is None and past is None:  # a CPU
        chunk_tokens = 2 * batch_tokens
    elif chunk_tokens is None:
        kept = CHUNK_KV_BYTES if room is None else min(CHUNK_KV_BYTES, room)
        chunk_tokens = max(2 * batch_tokens, min(2 * batch_tokens * past, kept // kv))
    sorting, common = _sorted_prefixes([encodings[i].ids for i in texts_in], n_inputs)
    order, n_inputs = [texts_in[k] for k in sorting.tolist()], n_inputs[sorting]
    chunks, slots = [], []
    for lo, hi in _prefix_chunks(n_inputs.tolist(), common.tolist(), chunk_tokens):
        chunk = order[lo:hi]
        ids = _padded([encodings[i].ids for i in chunk])  # a chunk's texts as rows of one array
        tree = _PrefixTree(ids, n_inputs[lo:hi], np.concatenate([[0], common[lo + 1:hi]]))
        batches = _plan_tree(tree, ids, [targets[i] for i in chunk], first_slot[chunk], batch_tokens, past,
                             pass_tokens(lm.device), lm.pad_token_id, pin)
        slots += [batch["slots"] for batch in batches if batch["slots"] is not None]
        chunks.append((tree.n_nodes, batches))
    return PrefixPlan(list(texts), score_from, unique, encodings, targets, chunks,
                      np.concatenate(slots) if slots else np.zeros(0, dtype=np.int64),
                      sum(len(e.ids) for e in encodings))


def run_prefix(lm: LoadedModel, plan: PrefixPlan, progress: bool = False) -> Readback:
    """The device's part: every chunk's batches, level by level, keeping every node's keys and values (per
    layer, one row per node; row 0, the root, is the padding row); the log-probs stay on the device until the
    one read back."""
    bar = tqdm(total=plan.n_tokens, unit="tok", desc="scoring", disable=not progress, dynamic_ncols=True)
    pending, states, token_ids, state_of = [], [], [], []
    rows, collected = projected_rows(lm, lm.device), 0

    def project():  # the batches' needed states together: few, full projections instead of one per batch
        pending.append(_gathered_logprobs(lm, torch.cat(states), torch.cat(token_ids), np.concatenate(state_of)))
        states.clear()
        token_ids.clear()
        state_of.clear()

    memory = _KeptMemory.for_plan(plan) if keeps_memory(lm.device) else None
    with torch.inference_mode(), sync_free_attention(lm):
        for n_nodes, batches in plan.chunks:
            kept = _NodeKV(n_nodes, memory)
            for batch in batches:
                hidden = _run_segments(lm, batch, kept)
                if batch["slots"] is not None:
                    at = hidden.device
                    states.append(hidden[batch["need_rows"].to(at, non_blocking=True),
                                         batch["need_cols"].to(at, non_blocking=True)])
                    token_ids.append(batch["token_ids"].to(at, non_blocking=True))
                    state_of.append(batch["state_of"] + collected)
                    collected += len(batch["need_rows"])
                    if collected >= rows:
                        project()
                        collected = 0
                bar.update(batch["n_new"])
        if states:
            project()
        bar.close()
        return Readback(torch.cat(pending) if pending else torch.zeros(0, dtype=torch.float64))


PAD_ROWS = 1024  # `_padded` reads the sequences this many at a time (each read holds the GIL: ~1 ms)


def _padded(sequences: list[list[int]]) -> np.ndarray:
    """Token sequences as rows of one array, -1 after each one's end. Read in pieces: one read of a meta chunk's
    16,000 sequences held the GIL ~17 ms, the thread that drives the device waiting beside it."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    out = np.full((len(sequences), int(lengths.max(initial=0))), -1, dtype=np.int64)
    flat = [np.fromiter(chain.from_iterable(sequences[k:k + PAD_ROWS]), dtype=np.int64,
                        count=int(lengths[k:k + PAD_ROWS].sum())) for k in range(0, len(sequences), PAD_ROWS)]
    out[np.arange(out.shape[1]) < lengths[:, None]] = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64)
    return out


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The ranges [starts[i], starts[i] + counts[i]) one after another (a concatenation of aranges, no loop)."""
    return np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))


SORT_CELLS = 1 << 25  # `_sorted_prefixes` sorts in numpy up to this many padded ids (256 MB of int64), else in Python


def _sorted_prefixes(sequences: list[list[int]], lengths) -> tuple[np.ndarray, np.ndarray]:
    """The order of the sequences' first `lengths` tokens (each a tuple: a prefix before what it starts, equal
    ones by index) and, in that order, how many leading tokens each shares with the one before (0 for the first).

    Sorted in numpy (`lexsort`, on the sequences padded with -1, which comes before every token id), which
    releases the GIL: Python's `sorted` over tuples held it ~60 ms at a time for a meta chunk of 4,000 pairs,
    the thread that drives the device waiting that long beside it (perf/README.md, "The producer's sort")."""
    n, lengths = len(sequences), np.asarray(lengths, dtype=np.int64)
    if not n:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if n * max(map(len, sequences)) > SORT_CELLS:  # a few very long texts among many: the padded array would not pay
        keys = [tuple(s[:k]) for s, k in zip(sequences, lengths.tolist())]
        order = sorted(range(n), key=keys.__getitem__)
        return np.array(order, dtype=np.int64), np.array(_common_prefixes([keys[i] for i in order]), dtype=np.int64)
    rows = _padded(sequences)
    rows[np.arange(rows.shape[1]) >= lengths[:, None]] = -1  # each sequence's first `lengths` tokens
    order = np.lexsort(rows.T[::-1])  # the first column the primary key; stable
    rows = rows[order]
    differ = rows[1:] != rows[:-1]  # two rows differ first at a token or where the shorter one ends
    common = np.where(differ.any(1), differ.argmax(1), lengths[order][1:])  # equal rows: the whole
    return order, np.concatenate([[0], common])


def _common_prefixes(sequences: list[tuple]) -> list[int]:
    """How many leading tokens each sequence shares with the one before it (0 for the first). Sorted, a
    sequence's longest common prefix with any earlier one is the one with its predecessor."""
    out, previous = [], ()
    for seq in sequences:
        n = min(len(seq), len(previous))
        out.append(next((k for k in range(n) if seq[k] != previous[k]), n))
        previous = seq
    return out


def _prefix_chunks(lengths: list[int], common: list[int], budget: int) -> list[tuple[int, int]]:
    """Cut sorted sequences (alike ones are neighbours) into runs [lo, hi) of about `budget` distinct tokens."""
    chunks, lo, size = [], 0, 0
    for k, (length, shared) in enumerate(zip(lengths, common)):
        new = length - shared
        if k > lo and size + new > budget:
            chunks.append((lo, k))
            lo, size, new = k, 0, length
        size += new
    if lengths:
        chunks.append((lo, len(lengths)))
    return chunks


class _PrefixTree:
    """Sorted token sequences merged into a tree, one node per distinct prefix (node 0 is the empty root).

    Each sequence shares the nodes of the tokens it has in common with the one before it and adds a node per
    further token, so nodes are numbered depth first: a node's first child is the next node, and a chain of
    nodes without branches (a segment, run as one piece after its parent) is a run of consecutive nodes.
    `rows` holds the sequences' tokens (`_padded`; the first `lengths` of each are the sequence), `common` how
    many each shares with the one before. `paths[k, j]` is the node of sequence k's token j (-1 after its end);
    `levels` the segments, as (first node, length) arrays, by depth in the tree of segments (level 0 starts at
    the root)."""

    def __init__(self, rows: np.ndarray, lengths: np.ndarray, common: np.ndarray):
        n, columns = len(rows), np.arange(rows.shape[1])
        new = lengths - common
        first = 1 + np.cumsum(new) - new  # each sequence's first new node
        # token j of sequence k is the node made by the last sequence k' <= k whose new tokens start by j (the
        # sequences between share more than j tokens with their predecessors: token j is the same in all)
        made = np.maximum.accumulate(np.where(common[:, None] <= columns, np.arange(n)[:, None], -1), axis=0)
        self.paths = np.where(columns < lengths[:, None], first[made] + columns - common[made], -1)
        creator = np.repeat(np.arange(n), new)
        depth = _ranges(common, new)  # sequence k's new nodes hold its tokens common[k], ..., lengths[k] - 1
        self.n_nodes = 1 + len(creator)
        self.parent = np.concatenate([[-1], np.where(depth > 0, self.paths[creator, np.maximum(depth - 1, 0)], 0)])
        self.token = np.concatenate([[0], rows[creator, depth]])
        self.depth, self.creator = np.concatenate([[0], depth]), np.concatenate([[-1], creator])
        self.levels = self._segments()

    def _segments(self) -> list[tuple[np.ndarray, np.ndarray]]:
        n_children = np.bincount(self.parent[1:], minlength=self.n_nodes)
        nodes = np.arange(1, self.n_nodes)
        starts = nodes[(self.parent[1:] == 0) | (n_children[self.parent[1:]] != 1)]
        lengths = np.diff(np.append(starts, self.n_nodes))
        segment_of = np.cumsum(np.isin(np.arange(self.n_nodes), starts)) - 1  # node -> its segment
        above = np.where(self.parent[starts] == 0, -1, segment_of[self.parent[starts]])  # the parent segment
        level, up = np.zeros(len(starts), dtype=np.int64), above
        while (going := up >= 0).any():  # a step up the tree of segments at a time (its depth: a few steps)
            level += going
            up = np.where(going, above[np.maximum(up, 0)], -1)
        return [(starts[level == d], lengths[level == d]) for d in range(int(level.max(initial=-1)) + 1)]


def _plan_tree(tree: _PrefixTree, ids: np.ndarray, targets: list[list[int]], first_slot: np.ndarray,
               batch_tokens: int, past: int | None, pass_cost: int, pad_id: int, pin: bool) -> list[dict]:
    """Every batch of the tree, level by level, as host tensors: the segments' tokens after their left-padded
    past (node rows of the kept KV), and the states to project with the tokens they predict."""
    # every scored token: the node whose state predicts it, its slot among all scored tokens, the token;
    # ordered by node, and by text and position within a node
    counts = np.fromiter(map(len, targets), dtype=np.int64, count=len(targets))
    text = np.repeat(np.arange(len(targets)), counts)
    position = np.fromiter(chain.from_iterable(targets), dtype=np.int64, count=int(counts.sum()))
    node = tree.paths[text, position - 1]
    slot = _ranges(first_slot, counts)
    by_node = np.argsort(node, kind="stable")
    needed = (node[by_node], slot[by_node], ids[text, position][by_node])
    batches = []
    for starts, lengths in tree.levels:
        for rows in _segment_batches(lengths, tree.depth[starts], batch_tokens, past, pass_cost):
            batches.append(_plan_batch(tree, starts[rows], lengths[rows], needed, pad_id, pin))
    return batches


def _plan_batch(tree: _PrefixTree, starts: np.ndarray, lengths: np.ndarray, needed: tuple, pad_id: int,
                pin: bool) -> dict:
    """One batch's host tensors (segments given by first node and length)."""
    past_lengths = tree.depth[starts]
    n, width_past, width_new = len(starts), int(past_lengths.max()), int(lengths.max())
    at = np.arange(width_past) - (width_past - past_lengths)[:, None]  # past column -> the path's token
    past_rows = np.where(at >= 0, tree.paths[tree.creator[starts][:, None], np.maximum(at, 0)], 0)
    columns = np.arange(width_new)
    inside = columns < lengths[:, None]
    input_ids = np.where(inside, tree.token[np.minimum(starts[:, None] + columns, tree.n_nodes - 1)], pad_id)
    mask = np.concatenate([np.arange(width_past) >= (width_past - past_lengths)[:, None], inside], axis=1)
    rows = np.repeat(np.arange(n), lengths)
    cols, nodes = _ranges(np.zeros_like(lengths), lengths), _ranges(starts, lengths)
    need_node, need_slot, need_token = needed
    lo, hi = np.searchsorted(need_node, starts), np.searchsorted(need_node, starts + lengths)
    picked = _ranges(lo, hi - lo)
    # a node predicting several scored tokens (a prompt's last one: each answer's first) is projected once
    first = np.diff(need_node[picked], prepend=-1) != 0
    need_rows = np.repeat(np.arange(n), hi - lo)[first]
    tensors = {"past_rows": torch.from_numpy(past_rows) if width_past else None,
               "attention_mask": torch.from_numpy(mask.astype(np.int64)), "input_ids": torch.from_numpy(input_ids),
               "position_ids": torch.from_numpy(past_lengths[:, None] + columns),
               "rows": torch.from_numpy(rows), "cols": torch.from_numpy(cols), "nodes": torch.from_numpy(nodes),
               "need_rows": torch.from_numpy(need_rows),
               "need_cols": torch.from_numpy(need_node[picked][first] - starts[need_rows]),
               "token_ids": torch.from_numpy(need_token[picked])}
    if pin:
        tensors = {name: t.pin_memory() if t is not None else None for name, t in tensors.items()}
    return {**tensors, "width_past": width_past, "slots": need_slot[picked] if len(picked) else None,
            "state_of": np.cumsum(first) - 1, "n_new": len(nodes)}


def _segment_batches(lengths: np.ndarray, past_lengths: np.ndarray, batch_tokens: int,
                     past: int | None = None, pass_cost: int = 0) -> list[list[int]]:
    """Segments of one level (by length and past length), longest first, cut so that the batch stays within
    the token budget (module docstring: `past` None counts rows × (longest past + longest segment), else rows ×
    longest segment, with rows × longest past ≤ past × budget), at the cheapest places: a batch costs its
    padded new tokens (rows × longest segment) plus `pass_cost` (`models.pass_tokens`,
    `models.cheapest_batches`). Returns each batch's segment indices."""
    widths, pasts = np.asarray(lengths, dtype=np.int64), np.asarray(past_lengths, dtype=np.int64)
    order = np.lexsort((-pasts, -widths))  # by length, then past, longest first (stable)
    widths, pasts = widths[order], pasts[order]
    cuts = cheapest_batches(widths, _reach(widths, pasts, batch_tokens, past), pass_cost)
    return [order[a:b].tolist() for a, b in zip(cuts[:-1], cuts[1:])]


def _reach(widths: np.ndarray, pasts: np.ndarray, batch_tokens: int, past: int | None) -> np.ndarray:
    """For each segment (sorted longest first), how many segments from it on fit one batch (at least 1):
    at most as many as the widths allow, then searched by halves for the longest past among them."""
    n = len(widths)
    longest_past = _range_max(pasts)

    def fit(starts, rows):
        if past is None:
            return rows * (longest_past(starts, rows) + widths[starts]) <= batch_tokens
        return rows * longest_past(starts, rows) <= past * batch_tokens

    starts = np.arange(n)
    low = np.ones(n, dtype=np.int64)  # one segment is a batch, whatever its size
    high = np.maximum(1, np.minimum(n - starts, batch_tokens // np.maximum(widths, 1)))
    while (unsettled := np.flatnonzero(low < high)).size:
        mid = (low[unsettled] + high[unsettled] + 1) // 2
        ok = fit(starts[unsettled], mid)
        low[unsettled] = np.where(ok, mid, low[unsettled])
        high[unsettled] = np.where(ok, high[unsettled], mid - 1)
    return low


def _range_max(values: np.ndarray):
    """A function (starts, lengths) -> max(values[i:i + length]) for each pair (lengths ≥ 1, within the
    array), from a sparse table of maxima over 1, 2, 4, ... values."""
    tables, span = [values], 1
    while 2 * span <= len(values):
        tables.append(np.maximum(tables[-1][:-span], tables[-1][span:]))  # max over 2 × span values from i
        span *= 2

    def query(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        level = np.floor(np.log2(lengths)).astype(np.int64)
        out = np.empty(len(starts), dtype=values.dtype)
        for k in np.unique(level).tolist():
            at = np.flatnonzero(level == k)
            i = starts[at]
            out[at] = np.maximum(tables[k][i], tables[k][i + lengths[at] - (1 << k)])
        return out

    return query


def _run_segments(lm: LoadedModel, batch: dict, kept: _NodeKV):
    """One forward pass over a planned batch of segments, each after its own past (left-padded, from the node
    KV rows); keeps the segments' new keys and values and returns their hidden states."""
    device = lm.device
    cache = kept.cache(batch["past_rows"], batch["input_ids"].shape[1], device)
    inputs = {name: batch[name].to(device, non_blocking=True)
              for name in ("input_ids", "attention_mask", "position_ids")}
    hidden = lm.parts.body(**inputs, **lm.parts.cache_argument(cache), use_cache=True).last_hidden_state
    kept.store(cache, batch["width_past"], *(batch[name].to(device, non_blocking=True)
                                            for name in ("rows", "cols", "nodes")))
    return hidden


def _filled(cache, past):
    """`cache` with each layer's past (keys, values [B, H, P, D]) set as it is: `DynamicCache.update` on an
    empty layer would make an empty tensor and copy the past into a new one (4 device operations a layer, and a
    copy of every past row) before the model's own update appends the batch's new tokens."""
    from transformers.cache_utils import DynamicLayer

    for keys, values in past:
        layer = DynamicLayer()
        layer.device, layer.keys, layer.values, layer.is_initialized = keys.device, keys, values, True
        cache.layers.append(layer)
    return cache


def _in_place_layers(room: torch.Tensor, width_past: int) -> list:
    """Cache layers over a batch's gathered past with room after it (`room` [B, P + W, 2, L, H, D], its first
    `width_past` columns the past): each layer's pass writes its W new tokens into the room (`update`) and
    attends over the whole, where transformers' layer would make a new tensor of the past and the new tokens
    (a copy of the copied past per layer and pass). Every layer's views come from a few operations on the
    whole room, not several per layer (each one a dispatch on the host, as a kernel launch is)."""
    whole = room.permute(2, 3, 0, 4, 1, 5)  # [2, L, B, H, P + W, D]

    def per_layer(part):  # each layer's (keys, values) views of `part`
        keys, values = part.unbind(0)
        return zip(keys.unbind(0), values.unbind(0))

    layer_class = _in_place_class()
    layers = []
    for whole_kv, past_kv, new_kv in zip(per_layer(whole), per_layer(whole[..., :width_past, :]),
                                         per_layer(whole[..., width_past:, :])):
        layer = layer_class()
        layer.device, layer.is_initialized, layer.whole, layer.new = room.device, True, whole_kv, new_kv
        layer.keys, layer.values = past_kv  # what the mask's sizes read
        layers.append(layer)
    return layers


@functools.cache
def _in_place_class():
    from transformers.cache_utils import DynamicLayer

    class InPlaceLayer(DynamicLayer):  # `_in_place_layers`
        def update(self, key_states, value_states, *args, **kwargs):
            self.new[0].copy_(key_states)
            self.new[1].copy_(value_states)
            self.keys, self.values = self.whole
            return self.whole

    return InPlaceLayer


class _NodeKV:
    """Every node's keys and values of one chunk (row 0, the root, is the padding row), kept between the
    tree's levels: one tensor [nodes, 2, layers, kv_heads, head_dim] when every layer's cache is alike and on
    one device (a few operations per batch, however many layers), else one [nodes, kv_heads, head_dim] pair
    per layer (a model dispatched over devices keeps each layer's on that layer's device). Stacked, a batch's
    past is gathered with room for its new tokens after it (`_in_place_layers`), and its new tokens are kept
    from there in one operation; with `memory`, both are made in it (`_KeptMemory`)."""

    def __init__(self, n_nodes: int, memory: _KeptMemory | None = None):
        self.n_nodes = n_nodes
        self.memory = memory
        self.stacked: torch.Tensor | None = None
        self.keys: list = []
        self.values: list = []
        self.room: torch.Tensor | None = None  # the batch's [B, P + W, 2, L, H, D], between `cache` and `store`

    def cache(self, past_rows: torch.Tensor | None, width_new: int, device):
        """A `DynamicCache` holding each row's past (`past_rows`: node ids, left-padded with the root)."""
        from transformers import DynamicCache

        cache = DynamicCache()  # plain layers: keeps every token; the mask applies sliding windows
        self.room = None
        if past_rows is None:
            return cache
        index = past_rows.to(device, non_blocking=True)
        if self.stacked is not None:
            width_past = index.shape[1]
            # the past's rows, then `width_new` of the root's as room for the new tokens (written by the pass)
            self.room = self._gathered(torch.nn.functional.pad(index.to(self.stacked.device), (0, width_new)))
            cache.layers.extend(_in_place_layers(self.room, width_past))
            return cache
        return _filled(cache, ((k[index.to(k.device)].transpose(1, 2), v[index.to(v.device)].transpose(1, 2))
                               for k, v in zip(self.keys, self.values)))

    def _gathered(self, rows: torch.Tensor) -> torch.Tensor:
        """The kept rows `rows` [B, T] as [B, T, 2, L, H, D]. In kept memory by `index_select`, which copies whole
        rows where indexing goes element by element (twice as long on a CPU); else by indexing (one launch)."""
        if self.memory is None:
            return self.stacked[rows]
        shape = (rows.numel(), *self.stacked.shape[1:])
        out = self.memory.take("room", shape, self.stacked)
        torch.index_select(self.stacked, 0, rows.reshape(-1), out=out)
        return out.view(*rows.shape, *shape[1:])

    def store(self, cache, width_past: int, rows: torch.Tensor, cols: torch.Tensor, nodes: torch.Tensor) -> None:
        """Keep the new tokens' keys and values (batch row, column) as the rows of their nodes."""
        if self.room is not None:  # the pass wrote them after the past
            self.stacked[nodes] = self.room[rows, cols + width_past]  # [tokens, 2, L, H, D]
            self.room = None
            return
        layers = cache.layers
        if self.stacked is None and not self.keys and STACK_KV:
            first = layers[0].keys
            if all(layer.keys.device == first.device and layer.keys.shape == first.shape for layer in layers):
                shape = (self.n_nodes, 2, len(layers), first.shape[1], first.shape[3])
                self.stacked = self.memory.take("nodes", shape, first).zero_() if self.memory else first.new_zeros(shape)
        if self.stacked is not None:
            new = torch.stack([torch.stack([layer.keys[:, :, width_past:] for layer in layers]),
                               torch.stack([layer.values[:, :, width_past:] for layer in layers])])
            self.stacked[nodes] = new.permute(2, 4, 0, 1, 3, 5)[rows, cols]  # [tokens, 2, L, H, D]
            return
        for layer, cached in enumerate(layers):
            at = cached.keys.device
            r, c, n = rows.to(at), cols.to(at), nodes.to(at)
            new_k = cached.keys[:, :, width_past:].transpose(1, 2)[r, c]  # [tokens, kv_heads, head_dim]
            new_v = cached.values[:, :, width_past:].transpose(1, 2)[r, c]
            if layer == len(self.keys):
                self.keys.append(new_k.new_zeros((self.n_nodes, *new_k.shape[1:])))
                self.values.append(new_v.new_zeros((self.n_nodes, *new_v.shape[1:])))
            self.keys[layer][n] = new_k
            self.values[layer][n] = new_v


class _KeptMemory:
    """On a CPU, the memory of every chunk's node rows and of every batch's gathered past, each made once at the
    plan's largest (`for_plan`) and reused: memory touched for the first time costs more there than what is then
    done with it (a batch's past on the default model: up to 150 MB; perf/README.md, "The past gathered into kept
    memory"). A GPU's allocator keeps freed blocks itself."""

    def __init__(self, rows: dict[str, int]):
        self.rows = rows  # name -> the most rows it is asked for
        self.tensors: dict[str, torch.Tensor] = {}

    @classmethod
    def for_plan(cls, plan: PrefixPlan) -> _KeptMemory:
        rooms = [len(b["past_rows"]) * (b["width_past"] + b["input_ids"].shape[1])
                 for _, batches in plan.chunks for b in batches if b["past_rows"] is not None]
        return cls({"nodes": max((n for n, _ in plan.chunks), default=0), "room": max(rooms, default=0)})

    def take(self, name: str, shape: tuple, like: torch.Tensor) -> torch.Tensor:
        """An uninitialised tensor of `shape` (like `like`), the first rows of the one kept under `name` (made at
        the first call: the plan's sizes bound every later one, and one model's rows are all alike)."""
        if name not in self.tensors:
            self.tensors[name] = like.new_empty((max(shape[0], self.rows[name]), *shape[1:]))
        return self.tensors[name][:shape[0]]
