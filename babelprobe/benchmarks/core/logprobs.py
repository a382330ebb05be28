"""Token log-probabilities of texts under a causal LM: the core of the direct and meta scorers.

`token_logprobs(lm, texts, score_from=...)` returns, for every text, the log-probability of each scored
token given BOS and all tokens before it. Scored tokens are those that end after character
`score_from` of the text (0: the whole text; len(prefix): a continuation given its prefix). A token
that starts before the boundary and ends after it spans the join: it is scored (it carries
continuation characters) and flagged.

How it stays fast and exact:
  - identical requests are scored once; the rest are sorted by token length and cut into batches
    under a token budget, so little padding is processed;
  - padding may be on either side; attention mask and position ids make the result independent of
    it (tests check left == right == one at a time);
  - the model body runs without its output layer; only the hidden states that predict a scored
    token go through the vocabulary projection, in chunks, and only the target log-prob is kept:
    no [batch, seq, vocab] tensor is ever made (the default model's vocabulary has 262k entries).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from babelprobe.benchmarks.core.options import REDUCTIONS
from babelprobe.errors import BabelprobeError
from babelprobe.models import Encoding, LoadedModel, length_batches, pad_batch

LOGIT_CHUNK_BYTES = 1 << 29  # fp32 logits materialised at once: 512 MiB (512 rows of the default model's
# 262k vocabulary: the projection runs ~20% faster than at 256 rows on a CPU)


@dataclass
class TokenLogprobs:
    """Scored tokens of one text: ids, character spans, float64 log-probs, and whether one spans the join."""

    ids: list[int]
    offsets: list[tuple[int, int]]
    logprobs: np.ndarray
    spans_join: bool
    truncated: bool

    @property
    def n_tokens(self) -> int:
        return len(self.ids)


def reduce(scored: TokenLogprobs, span: str, reduction: str) -> float:
    """Sum of token log-probs, or that sum per token, per character or per UTF-8 byte of the scored span."""
    total = float(np.sum(scored.logprobs))
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / max(scored.n_tokens, 1)
    if reduction == "per_char":
        return total / max(len(span), 1)
    if reduction == "per_byte":
        return total / max(len(span.encode("utf-8")), 1)
    raise BabelprobeError(f"unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}")


def token_logprobs(lm: LoadedModel, texts: list[str], score_from: list[int] | None = None,
                   names: list[str] | None = None, batch_tokens: int = 4096, padding_side: str = "right",
                   truncate: bool = False, progress: bool = True) -> list[TokenLogprobs]:
    """Log-probabilities of the scored tokens of each text (see module docstring)."""
    score_from, unique, encodings, targets = _distinct_requests(lm, texts, score_from, names, truncate)
    results: dict[int, TokenLogprobs] = {}
    bar = tqdm(total=sum(len(e.ids) for e in encodings), unit="tok", desc="scoring", disable=not progress,
               dynamic_ncols=True)
    pending = []  # (batch, its log-probs on the model's device): read back once all batches are queued
    with torch.inference_mode():
        for batch in length_batches([len(e.ids) for e in encodings], batch_tokens):
            pending.append((batch, _score_batch(lm, [encodings[i] for i in batch], [targets[i] for i in batch],
                                                padding_side)))
            bar.update(sum(len(encodings[i].ids) for i in batch))
    bar.close()
    for batch, flat in pending:
        logprobs = np.split(flat.cpu().numpy(), np.cumsum([len(targets[i]) for i in batch])[:-1])
        for i, lp in zip(batch, logprobs):
            enc, positions = encodings[i], targets[i]
            spans = bool(positions) and enc.offsets[positions[0]][0] < unique[i][1]
            results[i] = TokenLogprobs(ids=[enc.ids[p] for p in positions], offsets=[enc.offsets[p] for p in positions],
                                       logprobs=lp, spans_join=spans, truncated=enc.truncated)
    index = {key: i for i, key in enumerate(unique)}
    return [results[index[key]] for key in zip(texts, score_from)]


def _distinct_requests(lm: LoadedModel, texts: list[str], score_from: list[int] | None, names: list[str] | None,
                       truncate: bool):
    """The distinct (text, score_from) requests in first-seen order, their encodings (named after the
    first request of each, for error messages) and the token positions to score in each."""
    score_from = list(score_from) if score_from is not None else [0] * len(texts)
    unique = list(dict.fromkeys(zip(texts, score_from)))
    first_name = {}
    for i, key in enumerate(zip(texts, score_from)):
        first_name.setdefault(key, names[i] if names else f"#{i}")
    encodings = lm.encode([t for t, _ in unique], names=[first_name[k] for k in unique], truncate=truncate)
    targets = [_scored_positions(enc, start) for enc, (_, start) in zip(encodings, unique)]
    return score_from, unique, encodings, targets


def _scored_positions(enc: Encoding, score_from: int) -> list[int]:
    """Token positions to score: never position 0 (BOS, or under the 'none' policy a first token with
    nothing to condition on), and only tokens that end after `score_from`."""
    return [p for p in range(1, len(enc.ids)) if enc.offsets[p][1] > score_from]


def _score_batch(lm: LoadedModel, encodings: list[Encoding], targets: list[list[int]],
                 padding_side: str) -> torch.Tensor:
    """The scored tokens' log-probs of one batch, all texts' in a row (float64, on the model's device)."""
    batch = pad_batch(encodings, lm.pad_token_id, padding_side, lm.device)
    hidden = lm.parts.body(**batch, use_cache=False).last_hidden_state  # after the final norm
    width = batch["input_ids"].shape[1]
    rows, cols, token_ids = [], [], []
    for row, (enc, positions) in enumerate(zip(encodings, targets)):
        shift = width - len(enc.ids) if padding_side == "left" else 0
        rows += [row] * len(positions)
        cols += [shift + p - 1 for p in positions]  # the state before a token predicts it
        token_ids += [enc.ids[p] for p in positions]
    states = hidden[torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)]
    return _gathered_logprobs(lm, states, torch.tensor(token_ids, device=lm.device))


def _gathered_logprobs(lm: LoadedModel, states: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """float64 log p(token | state) for each row, projecting to the vocabulary a chunk of rows at a time.
    The result stays on the model's device: callers read their results back once, after their last batch,
    instead of making the host wait for the device after every batch."""
    vocab = lm.parts.head.weight.shape[0]
    chunk = max(1, LOGIT_CHUNK_BYTES // (4 * vocab))
    out = []
    for start in range(0, len(states), chunk):
        logits = lm.parts.logits(states[start:start + chunk]).float()
        picked = logits.gather(1, token_ids[start:start + chunk, None]).squeeze(1)
        out.append((picked - _logsumexp_(logits)).double())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64, device=states.device)


def _logsumexp_(logits: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dimension, overwriting `logits`. The same sums as `torch.logsumexp`, about
    2.5 times faster on a CPU: no temporaries the size of the vocabulary are made."""
    top = logits.amax(-1, keepdim=True)
    return logits.sub_(top).exp_().sum(-1).log_().add_(top.squeeze(-1))


def scored_positions(enc: Encoding, score_from: int) -> list[int]:
    """The token positions of `enc` that `token_logprobs` scores for `score_from` (module docstring), for
    callers that run the model themselves (activation patching, `babelprobe patch`)."""
    return _scored_positions(enc, score_from)


def logprobs_of_states(lm: LoadedModel, states: torch.Tensor, token_ids) -> np.ndarray:
    """float64 log p(token_ids[i] | states[i]) for final hidden states [n, d] (after the final norm): the
    same chunked vocabulary projection as `token_logprobs`, for callers that run the model themselves."""
    with torch.inference_mode():
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=lm.device)
        return _gathered_logprobs(lm, states, ids).cpu().numpy()


# ------------------------------------------------------------------------------ shared-prefix scoring

def shared_prefix_logprobs(lm: LoadedModel, texts: list[str], score_from: list[int] | None = None,
                           names: list[str] | None = None, batch_tokens: int = 4096, padding_side: str = "left",
                           truncate: bool = False, progress: bool = True,
                           chunk_tokens: int | None = None) -> list[TokenLogprobs]:
    """`token_logprobs` for texts that start alike (prompts and their answers): every shared token
    prefix is run through the model once.

    Same arguments and results as `token_logprobs` (same scored tokens, same flags; `padding_side` is
    accepted so that it is a drop-in, but the tree always pads the past on the left). The texts' tokens
    are merged into a prefix tree; the tree is run level by level, each node's tokens given the KV
    cache of the tokens before it. Meta prompts in both option orders share their opening question,
    the same question with the same first option is shared across subsets, and a prompt is run once
    for both of its answers. Only states that predict scored tokens reach the vocabulary projection.

    Texts are sorted so that alike ones are neighbours and processed in chunks of about `chunk_tokens`
    distinct tokens (default 2 × batch_tokens); a chunk's keys and values, every layer's for every
    token, are kept until it is done (37 KB per token on the default model: about 300 MB). Sliding-
    window layers keep everything too; their window comes from the attention mask.
    `tests/test_meta_logprobs.py` checks the result against a plain forward pass, sliding layers included."""
    score_from, unique, encodings, targets = _distinct_requests(lm, texts, score_from, names, truncate)
    # A text's model inputs: its tokens up to (not including) its last scored token.
    inputs = {i: tuple(enc.ids[:positions[-1]]) for i, (enc, positions) in enumerate(zip(encodings, targets))
              if positions}
    logprobs = {i: np.zeros(0) for i, positions in enumerate(targets) if not positions}
    bar = tqdm(total=sum(len(e.ids) for e in encodings), unit="tok", desc="scoring", disable=not progress,
               dynamic_ncols=True)
    with torch.inference_mode():
        for chunk in _prefix_chunks(sorted(inputs, key=inputs.get), inputs, chunk_tokens or 2 * batch_tokens):
            tree = _PrefixTree([inputs[i] for i in chunk])
            scored = _score_tree(lm, tree, [encodings[i].ids for i in chunk], [targets[i] for i in chunk],
                                 batch_tokens)
            logprobs.update(zip(chunk, scored))
            bar.update(sum(len(encodings[i].ids) for i in chunk))
    bar.close()
    results = [TokenLogprobs(ids=[enc.ids[p] for p in positions], offsets=[enc.offsets[p] for p in positions],
                             logprobs=logprobs[i], truncated=enc.truncated,
                             spans_join=bool(positions) and enc.offsets[positions[0]][0] < start)
               for i, (enc, positions, (_, start)) in enumerate(zip(encodings, targets, unique))]
    index = {key: i for i, key in enumerate(unique)}
    return [results[index[key]] for key in zip(texts, score_from)]


def _prefix_chunks(order: list[int], inputs: dict[int, tuple], budget: int) -> list[list[int]]:
    """Cut texts (sorted, so alike texts are neighbours) into chunks of about `budget` distinct tokens."""
    chunks, current, size, previous = [], [], 0, ()
    for i in order:
        seq = inputs[i]
        common = next((k for k, (a, b) in enumerate(zip(seq, previous)) if a != b), min(len(seq), len(previous)))
        new = len(seq) - common
        if current and size + new > budget:
            chunks.append(current)
            current, size, new = [], 0, len(seq)
        current.append(i)
        size += new
        previous = seq
    if current:
        chunks.append(current)
    return chunks


class _PrefixTree:
    """Token sequences merged into a tree: one node per distinct prefix (node 0 is the empty root).

    `paths[k]` lists the nodes of sequence k (node of its token j at index j). The tree is cut into
    segments, chains of nodes without branches; a segment is run as one piece, after its parent."""

    def __init__(self, sequences: list[tuple[int, ...]]):
        self.parent, self.token, self.children = [-1], [0], [{}]
        self.paths, self._past = [], {}
        for seq in sequences:
            node, path = 0, []
            for token in seq:
                child = self.children[node].get(token)
                if child is None:
                    child = len(self.parent)
                    self.parent.append(node)
                    self.token.append(token)
                    self.children.append({})
                    self.children[node][token] = child
                node = child
                path.append(node)
            self.paths.append(path)
        self.levels = self._segments()

    def _segments(self) -> list[list[list[int]]]:
        """Segments (lists of nodes) grouped by depth in the segment tree: level 0 starts at the root."""
        levels, frontier = [], list(self.children[0].values())
        while frontier:
            level, next_frontier = [], []
            for node in frontier:
                segment = [node]
                while len(self.children[segment[-1]]) == 1:
                    segment.append(next(iter(self.children[segment[-1]].values())))
                level.append(segment)
                next_frontier += self.children[segment[-1]].values()
            levels.append(level)
            frontier = next_frontier
        return levels

    def past(self, node: int) -> list[int]:
        """The nodes before `node`, from the root's first token on (kept per node: segments that share a
        parent ask for the same past, and every batch asks twice)."""
        cached = self._past.get(node)
        if cached is None:
            walk, ancestor = [], self.parent[node]
            while ancestor > 0 and ancestor not in self._past:
                walk.append(ancestor)
                ancestor = self.parent[ancestor]
            cached = (self._past[ancestor] + [ancestor] if ancestor > 0 else []) + walk[::-1]
            self._past[node] = cached
        return cached


def _score_tree(lm: LoadedModel, tree: _PrefixTree, ids: list[list[int]], targets: list[list[int]],
                batch_tokens: int) -> list[np.ndarray]:
    """Run the tree's segments level by level, keeping every node's keys and values (per layer, one row
    per node; row 0, the root, is the padding row) and projecting only the needed states."""
    needed: dict[int, list[tuple[int, int, int]]] = {}  # node -> (text, slot, token it predicts)
    for k, positions in enumerate(targets):
        for slot, p in enumerate(positions):
            needed.setdefault(tree.paths[k][p - 1], []).append((k, slot, ids[k][p]))
    out = [np.zeros(len(positions)) for positions in targets]
    pending = []  # (where, log-probs on the model's device): read back after the last level is queued
    keys, values = [], []  # per layer: [nodes, kv_heads, head_dim]
    for level in tree.levels:
        for batch in _segment_batches(level, tree, batch_tokens):
            hidden = _run_segments(lm, tree, batch, keys, values)
            rows, cols, where, token_ids = [], [], [], []
            for r, segment in enumerate(batch):
                for c, node in enumerate(segment):
                    for k, slot, token in needed.get(node, ()):
                        rows.append(r)
                        cols.append(c)
                        where.append((k, slot))
                        token_ids.append(token)
            if rows:
                states = hidden[torch.tensor(rows), torch.tensor(cols)]
                pending.append((where, _gathered_logprobs(lm, states, torch.tensor(token_ids, device=lm.device))))
    for where, flat in pending:
        for (k, slot), value in zip(where, flat.cpu().numpy()):
            out[k][slot] = value
    return out


def _segment_batches(segments: list[list[int]], tree: _PrefixTree, batch_tokens: int) -> list[list[list[int]]]:
    """Segments of one level, longest first, cut so that rows × (longest past + longest segment) stays
    under the token budget (that bounds the copied KV cache and the attention) and no segment is
    shorter than half the batch's longest (padding costs compute like real tokens)."""
    past_len = {segment[0]: len(tree.past(segment[0])) for segment in segments}
    order = sorted(segments, key=lambda s: (-len(s), -past_len[s[0]]))
    batches, current, width_past, width_new = [], [], 0, 0
    for segment in order:
        wp, wn = max(width_past, past_len[segment[0]]), max(width_new, len(segment))
        if current and ((len(current) + 1) * (wp + wn) > batch_tokens or 2 * len(segment) < wn):
            batches.append(current)
            current, wp, wn = [], past_len[segment[0]], len(segment)
        current.append(segment)
        width_past, width_new = wp, wn
    if current:
        batches.append(current)
    return batches


def _run_segments(lm: LoadedModel, tree: _PrefixTree, batch: list[list[int]], keys: list, values: list):
    """One forward pass over a batch of segments, each after its own past (left-padded, from the node
    KV rows); stores the segments' new keys and values and returns their hidden states."""
    from transformers import DynamicCache

    pasts = [tree.past(segment[0]) for segment in batch]
    width_past, width_new = max(len(p) for p in pasts), max(len(s) for s in batch)
    past_rows = np.zeros((len(batch), width_past), dtype=np.int64)  # numpy: a torch.tensor per row is slow
    mask = np.zeros((len(batch), width_past + width_new), dtype=np.int64)
    input_ids = np.full((len(batch), width_new), lm.pad_token_id, dtype=np.int64)
    for r, (past, segment) in enumerate(zip(pasts, batch)):
        past_rows[r, width_past - len(past):] = past
        mask[r, width_past - len(past):width_past + len(segment)] = 1
        input_ids[r, :len(segment)] = [tree.token[n] for n in segment]
    past_rows, mask, input_ids = torch.from_numpy(past_rows), torch.from_numpy(mask), torch.from_numpy(input_ids)
    start = torch.tensor([[len(p)] for p in pasts])
    cache = DynamicCache()  # plain layers: keeps every token; the mask applies sliding windows
    if width_past:
        index = past_rows.to(lm.device)
        for layer, (k, v) in enumerate(zip(keys, values)):  # a dispatched model keeps each layer on its device
            at = index.to(k.device)
            cache.update(k[at].transpose(1, 2), v[at].transpose(1, 2), layer)
    hidden = lm.parts.body(input_ids=input_ids.to(lm.device), attention_mask=mask.to(lm.device),
                           position_ids=(start + torch.arange(width_new)).to(lm.device),
                           **lm.parts.cache_argument(cache), use_cache=True).last_hidden_state
    rows = torch.tensor([r for r, s in enumerate(batch) for _ in s], device=lm.device)
    cols = torch.tensor([c for s in batch for c in range(len(s))], device=lm.device)
    nodes = torch.tensor([n for s in batch for n in s], device=lm.device)
    for layer, cached in enumerate(cache.layers):
        device = cached.keys.device
        r, c, n = rows.to(device), cols.to(device), nodes.to(device)
        new_k = cached.keys[:, :, width_past:].transpose(1, 2)[r, c]  # [tokens, kv_heads, head_dim]
        new_v = cached.values[:, :, width_past:].transpose(1, 2)[r, c]
        if layer == len(keys):
            n_nodes = len(tree.parent)
            keys.append(new_k.new_zeros((n_nodes, *new_k.shape[1:])))
            values.append(new_v.new_zeros((n_nodes, *new_v.shape[1:])))
        keys[layer][n] = new_k
        values[layer][n] = new_v
    return hidden
