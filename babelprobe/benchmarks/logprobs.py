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

from babelprobe.models import Encoding, LoadedModel

LOGIT_CHUNK_BYTES = 1 << 28  # fp32 logits materialised at once: 256 MiB


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


def token_logprobs(lm: LoadedModel, texts: list[str], score_from: list[int] | None = None,
                   names: list[str] | None = None, batch_tokens: int = 4096, padding_side: str = "right",
                   truncate: bool = False, progress: bool = True) -> list[TokenLogprobs]:
    """Log-probabilities of the scored tokens of each text (see module docstring)."""
    score_from = list(score_from) if score_from is not None else [0] * len(texts)
    unique = list(dict.fromkeys(zip(texts, score_from)))
    first_name = {}
    for i, key in enumerate(zip(texts, score_from)):
        first_name.setdefault(key, names[i] if names else f"#{i}")
    encodings = lm.encode([t for t, _ in unique], names=[first_name[k] for k in unique], truncate=truncate)
    targets = [_scored_positions(enc, start) for enc, (_, start) in zip(encodings, unique)]
    results: dict[int, TokenLogprobs] = {}
    bar = tqdm(total=sum(len(e.ids) for e in encodings), unit="tok", desc="scoring", disable=not progress,
               dynamic_ncols=True)
    with torch.inference_mode():
        for batch in length_batches([len(e.ids) for e in encodings], batch_tokens):
            logprobs = _score_batch(lm, [encodings[i] for i in batch], [targets[i] for i in batch], padding_side)
            for i, lp in zip(batch, logprobs):
                enc, positions = encodings[i], targets[i]
                boundary = unique[i][1]
                spans = bool(positions) and enc.offsets[positions[0]][0] < boundary
                results[i] = TokenLogprobs(ids=[enc.ids[p] for p in positions],
                                           offsets=[enc.offsets[p] for p in positions],
                                           logprobs=lp, spans_join=spans, truncated=enc.truncated)
            bar.update(sum(len(encodings[i].ids) for i in batch))
    bar.close()
    index = {key: i for i, key in enumerate(unique)}
    return [results[index[key]] for key in zip(texts, score_from)]


def _scored_positions(enc: Encoding, score_from: int) -> list[int]:
    """Token positions to score: never position 0 (BOS, or under the 'none' policy a first token with
    nothing to condition on), and only tokens that end after `score_from`."""
    return [p for p in range(1, len(enc.ids)) if enc.offsets[p][1] > score_from]


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices sorted by length (longest first) and cut so that batch size × longest length ≤ budget."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, current = [], []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * longest > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def pad_batch(encodings: list[Encoding], pad_id: int, padding_side: str, device) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and position_ids (0 at each text's first real token) for a batch."""
    width = max(len(e.ids) for e in encodings)
    ids = torch.full((len(encodings), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(encodings), width), dtype=torch.long)
    for row, enc in enumerate(encodings):
        n = len(enc.ids)
        cols = slice(width - n, width) if padding_side == "left" else slice(0, n)
        ids[row, cols] = torch.tensor(enc.ids)
        mask[row, cols] = 1
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "position_ids": positions.to(device)}


def _score_batch(lm: LoadedModel, encodings: list[Encoding], targets: list[list[int]],
                 padding_side: str) -> list[np.ndarray]:
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
    flat = _gathered_logprobs(lm, states, torch.tensor(token_ids, device=lm.device))
    return np.split(flat, np.cumsum([len(t) for t in targets])[:-1])


def _gathered_logprobs(lm: LoadedModel, states: torch.Tensor, token_ids: torch.Tensor) -> np.ndarray:
    """log p(token | state) for each row, projecting to the vocabulary a chunk of rows at a time."""
    vocab = lm.parts.head.weight.shape[0]
    chunk = max(1, LOGIT_CHUNK_BYTES // (4 * vocab))
    out = []
    for start in range(0, len(states), chunk):
        logits = lm.parts.logits(states[start:start + chunk]).float()
        picked = logits.gather(1, token_ids[start:start + chunk, None]).squeeze(1)
        out.append((picked - torch.logsumexp(logits, dim=-1)).double().cpu())
    return torch.cat(out).numpy() if out else np.zeros(0)


# ------------------------------------------------------------------------------ shared-prefix scoring

def shared_prefix_logprobs(lm: LoadedModel, texts: list[str], score_from: list[int] | None = None,
                           names: list[str] | None = None, batch_tokens: int = 4096, truncate: bool = False,
                           progress: bool = True) -> list[TokenLogprobs]:
    """`token_logprobs` for many continuations of few contexts: each context is run once.

    Same arguments and results as `token_logprobs` (same scored tokens, same flags). The context of a
    text is its tokens before the first scored token. Texts whose contexts are identical token for
    token (a prompt and its candidate answers) share one forward pass over the context, kept in the
    KV cache; then only each text's own remaining tokens are run, against a copy of that cache.

    Contexts are left-padded so that every context ends in the same column and the continuations
    follow without a gap; then a sliding-window cache layer (Gemma) keeps exactly the tokens the
    window needs. `tests/test_meta_logprobs.py` checks the result against a plain forward pass."""
    score_from = list(score_from) if score_from is not None else [0] * len(texts)
    unique = list(dict.fromkeys(zip(texts, score_from)))
    first_name = {}
    for i, key in enumerate(zip(texts, score_from)):
        first_name.setdefault(key, names[i] if names else f"#{i}")
    encodings = lm.encode([t for t, _ in unique], names=[first_name[k] for k in unique], truncate=truncate)
    targets = [_scored_positions(enc, start) for enc, (_, start) in zip(encodings, unique)]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (enc, positions) in enumerate(zip(encodings, targets)):
        if positions:
            groups.setdefault(tuple(enc.ids[:positions[0]]), []).append(i)
    logprobs = {i: np.zeros(0) for i, positions in enumerate(targets) if not positions}
    bar = tqdm(total=sum(len(e.ids) for e in encodings), unit="tok", desc="scoring", disable=not progress,
               dynamic_ncols=True)
    with torch.inference_mode():
        for batch in _context_batches(groups, encodings, targets, batch_tokens):
            logprobs.update(_score_context_batch(lm, batch, groups, encodings, targets))
            bar.update(sum(len(encodings[i].ids) for context in batch for i in groups[context]))
    bar.close()
    results = [TokenLogprobs(ids=[enc.ids[p] for p in positions], offsets=[enc.offsets[p] for p in positions],
                             logprobs=logprobs[i], truncated=enc.truncated,
                             spans_join=bool(positions) and enc.offsets[positions[0]][0] < start)
               for i, (enc, positions, (_, start)) in enumerate(zip(encodings, targets, unique))]
    index = {key: i for i, key in enumerate(unique)}
    return [results[index[key]] for key in zip(texts, score_from)]


def _context_batches(groups: dict, encodings: list[Encoding], targets: list[list[int]],
                     batch_tokens: int) -> list[list[tuple[int, ...]]]:
    """Contexts, longest first, cut so that (texts in the batch) × (longest context + longest rest) stays
    under the token budget: that bounds both the copied KV cache and the attention of the second pass."""
    def rest(i: int) -> int:
        return targets[i][-1] - targets[i][0]  # tokens run after the context (the last one is never input)

    order = sorted(groups, key=lambda c: -len(c))
    batches, current, n_texts, longest_rest = [], [], 0, 0
    for context in order:
        members = groups[context]
        new_rest = max([longest_rest, *(rest(i) for i in members)])
        width = len(current[0] if current else context) + new_rest
        if current and (n_texts + len(members)) * width > batch_tokens:
            batches.append(current)
            current, n_texts, new_rest = [], 0, max(rest(i) for i in members)
        current.append(context)
        n_texts += len(members)
        longest_rest = new_rest
    if current:
        batches.append(current)
    return batches


def _score_context_batch(lm: LoadedModel, contexts: list[tuple[int, ...]], groups: dict,
                         encodings: list[Encoding], targets: list[list[int]]) -> dict[int, np.ndarray]:
    """Run the contexts once (left-padded, cache kept), then every text's remaining tokens from a copy
    of its context's cache (right-padded); project only the states that predict scored tokens."""
    ctx = pad_batch([Encoding(list(c), []) for c in contexts], lm.pad_token_id, "left", lm.device)
    out = lm.parts.body(**ctx, use_cache=True)
    last_state = out.last_hidden_state[:, -1]  # predicts each text's first scored token
    members = [(row, i) for row, context in enumerate(contexts) for i in groups[context]]
    # Tokens each text still has to run: from its first scored token up to (not including) its last.
    rests = [encodings[i].ids[targets[i][0]:targets[i][-1]] for _, i in members]
    rest_states = None
    if any(rests):
        rows = torch.tensor([row for row, _ in members], device=lm.device)
        cache = out.past_key_values
        cache.batch_select_indices(rows)  # one copy of the context's cache per text
        width = max(len(r) for r in rests)
        ids = torch.full((len(members), max(width, 1)), lm.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for k, rest in enumerate(rests):
            ids[k, :len(rest)] = torch.tensor(rest, dtype=torch.long)
            mask[k, :len(rest)] = 1
        ctx_mask = ctx["attention_mask"][rows]
        start = ctx_mask.sum(dim=1, keepdim=True)  # each text's position after its context
        rest_states = lm.parts.body(
            input_ids=ids.to(lm.device), attention_mask=torch.cat([ctx_mask, mask.to(lm.device)], dim=1),
            position_ids=start + torch.arange(ids.shape[1], device=lm.device), past_key_values=cache,
            use_cache=True).last_hidden_state
    states, token_ids, sizes = [], [], []
    for k, (row, i) in enumerate(members):
        first = targets[i][0]
        for p in targets[i]:
            states.append(last_state[row] if p == first else rest_states[k, p - 1 - first])
            token_ids.append(encodings[i].ids[p])
        sizes.append(len(targets[i]))
    flat = _gathered_logprobs(lm, torch.stack(states), torch.tensor(token_ids, device=lm.device))
    return dict(zip([i for _, i in members], np.split(flat, np.cumsum(sizes)[:-1])))
