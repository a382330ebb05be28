"""Token log-probabilities of texts under a causal LM: the core of the direct and meta scorers.

`token_logprobs(lm, texts, score_from=...)` returns, for every text, the log-probability of each scored
token given BOS and all tokens before it. Scored tokens are those that end after character
`score_from` of the text (0: the whole text; len(prefix): a continuation given its prefix). A token
that starts before the boundary and ends after it spans the join: it is scored (it carries
continuation characters) and flagged.

How it stays fast and exact:
  - identical requests are scored once; the rest are sorted by token length and cut into batches
    under a token budget, and cut where the padding saved pays for one more forward pass
    (`models.pass_tokens`), so little padding is processed;
  - padding may be on either side; attention mask and position ids make the result independent of
    it (tests check left == right == one at a time);
  - the model body runs without its output layer; only the hidden states that predict a scored
    token go through the vocabulary projection, each distinct one once per batch (texts that start
    alike share the states of their common start; every text's first token comes from BOS's), in
    chunks (on a CPU also in blocks of the vocabulary, their log-sum-exps joined), and only the target
    log-prob is kept: no [batch, seq, vocab] tensor is ever made (the default model's vocabulary has
    262k entries).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from babelprobe.benchmarks.core.options import REDUCTIONS
from babelprobe.errors import BabelprobeError
from babelprobe.models import (
    Encoding,
    LoadedModel,
    copies_done,
    length_batches,
    pad_host,
    pass_tokens,
    sync_free_attention,
    to_device,
)

LOGIT_CHUNK_BYTES = 1 << 29  # fp32 logits materialised at once: 512 MiB (512 rows of the default model's
# 262k vocabulary: the projection runs ~20% faster than at 256 rows on a CPU)
CPU_ROWS, CPU_VOCAB_BLOCK = 1024, 4096  # a CPU projects 1,024 rows × 4,096 token ids (16 MiB) at a time: the
# product runs faster on such blocks than on the whole vocabulary, and the log-normaliser reads each block from
# the cache instead of memory (the default model, one core: 1.5× faster than 512 rows of every logit; perf/README.md)


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
    total = float(np.add.reduce(scored.logprobs))  # np.sum's own reduction, without its Python wrapper
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
    plan = plan_logprobs(lm, texts, score_from, names, batch_tokens, padding_side, truncate)
    return plan.collect(run_logprobs(lm, plan, progress=progress).wait())


# The three steps of `token_logprobs`, for callers that overlap them (`pipeline.pipelined`): planning and
# collecting are host work, running is the device's.

@dataclass
class LogprobPlan:
    """The host side of scoring some texts: the distinct requests, their encodings and scored positions, and
    each batch's padded inputs (host tensors) with the rows and columns of the states to project."""

    texts: list[str]
    score_from: list[int]
    unique: list[tuple[str, int]]
    encodings: list[Encoding]
    targets: list[list[int]]
    # each batch: rows (indices into unique), inputs, the states' rows / cols, the scored token ids and the
    # state of each, n_tokens
    batches: list[dict]

    @property
    def n_tokens(self) -> int:
        return sum(batch["n_tokens"] for batch in self.batches)

    def collect(self, flat: np.ndarray) -> list[TokenLogprobs]:
        """Every text's `TokenLogprobs` from the scored tokens' log-probs of all batches, in batch order."""
        order = [i for batch in self.batches for i in batch["rows"]]
        pieces = np.split(flat, np.cumsum([len(self.targets[i]) for i in order])[:-1]) if order else []
        results: list[TokenLogprobs | None] = [None] * len(self.unique)
        for i, lp in zip(order, pieces):
            enc, positions = self.encodings[i], self.targets[i]
            spans = bool(positions) and enc.offsets[positions[0]][0] < self.unique[i][1]
            results[i] = TokenLogprobs(ids=[enc.ids[p] for p in positions], offsets=[enc.offsets[p] for p in positions],
                                       logprobs=lp, spans_join=spans, truncated=enc.truncated)
        index = {key: i for i, key in enumerate(self.unique)}
        return [results[index[key]] for key in zip(self.texts, self.score_from)]


def plan_logprobs(lm: LoadedModel, texts: list[str], score_from: list[int] | None = None,
                  names: list[str] | None = None, batch_tokens: int = 4096, padding_side: str = "right",
                  truncate: bool = False) -> LogprobPlan:
    """Tokenise, deduplicate and batch `texts` (host work only; see `token_logprobs`)."""
    score_from, unique, encodings, targets = _distinct_requests(lm, texts, score_from, names, truncate)
    pin = lm.device.type == "cuda"
    batches = []
    for rows in length_batches([len(e.ids) for e in encodings], batch_tokens, pass_tokens(lm.device)):
        batch = [encodings[i] for i in rows]
        inputs = pad_host(batch, lm.pad_token_id, padding_side, pin)
        width = inputs["input_ids"].shape[1]
        state_rows, state_cols, token_ids, state_of = [], [], [], []
        first_seen: dict[int, int] = {}  # a prefix (`_Prefixes` id) -> its state's index in this batch
        prefixes = _Prefixes()
        for row, (enc, i) in enumerate(zip(batch, rows)):
            shift = width - len(enc.ids) if padding_side == "left" else 0
            prefix_of = prefixes.of(enc.ids)
            for p in targets[i]:  # the state before a token predicts it: one per distinct prefix
                k = first_seen.setdefault(prefix_of[p], len(state_rows))
                if k == len(state_rows):
                    state_rows.append(row)
                    state_cols.append(shift + p - 1)
                state_of.append(k)
                token_ids.append(enc.ids[p])
        batches.append({"rows": rows, "inputs": inputs, "state_rows": torch.tensor(state_rows, dtype=torch.long),
                        "state_cols": torch.tensor(state_cols, dtype=torch.long),
                        "token_ids": torch.tensor(token_ids, dtype=torch.long),
                        "state_of": np.array(state_of, dtype=np.int64), "n_tokens": sum(len(e.ids) for e in batch)})
    return LogprobPlan(list(texts), score_from, unique, encodings, targets, batches)


class _Prefixes:
    """Ids of token prefixes: `of(ids)[p]` is the same number for every sequence that starts with `ids[:p]`
    (a trie walked token by token: linear in the tokens, however long the texts)."""

    def __init__(self):
        self.child: dict[tuple[int, int], int] = {}

    def of(self, ids: list[int]) -> list[int]:
        node, out = 0, [0]
        for token in ids:
            node = self.child.setdefault((node, token), len(self.child) + 1)
            out.append(node)
        return out


def run_logprobs(lm: LoadedModel, plan: LogprobPlan, progress: bool = False, during=None) -> Readback:
    """The device's part: every batch of `plan` through the body and the needed rows through the vocabulary
    projection; the log-probs stay on the device until the one read back (`Readback.wait`). `during`, if
    given, is a context manager entered around each batch's forward (a capture of its hidden states)."""
    bar = tqdm(total=plan.n_tokens, unit="tok", desc="scoring", disable=not progress, dynamic_ncols=True)
    pending = []
    with torch.inference_mode(), sync_free_attention(lm):
        for batch in plan.batches:
            inputs = to_device(batch["inputs"], lm.device)
            pending.append(_score_batch(lm, inputs, batch, during))
            bar.update(batch["n_tokens"])
        bar.close()
        flat = torch.cat(pending) if pending else torch.zeros(0, dtype=torch.float64)
        return Readback(flat)


class Readback:
    """Device results on their way to host memory: one copy for the whole plan, started without blocking
    (page-locked memory on CUDA); `wait()` returns them as a numpy array (safe from another thread)."""

    def __init__(self, values: torch.Tensor):
        if values.device.type == "cuda":
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.done = copies_done(values.device)
        else:
            self.host, self.done = values.cpu(), None

    def wait(self) -> np.ndarray:
        if self.done is not None:
            self.done.synchronize()
        return self.host.numpy()


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
    offsets = enc.offsets
    return [p for p in range(1, len(offsets)) if offsets[p][1] > score_from]


def _score_batch(lm: LoadedModel, inputs: dict[str, torch.Tensor], batch: dict, during=None) -> torch.Tensor:
    """The scored tokens' log-probs of one batch, all texts' in a row (float64, on the model's device)."""
    from contextlib import nullcontext

    with during(inputs) if during is not None else nullcontext():
        hidden = lm.parts.body(**inputs, use_cache=False).last_hidden_state  # after the final norm
    device = hidden.device
    states = hidden[batch["state_rows"].to(device, non_blocking=True), batch["state_cols"].to(device, non_blocking=True)]
    return _gathered_logprobs(lm, states, batch["token_ids"].to(device, non_blocking=True), batch["state_of"])


def _gathered_logprobs(lm: LoadedModel, states: torch.Tensor, token_ids: torch.Tensor,
                       state_of: np.ndarray | None = None) -> torch.Tensor:
    """float64 log p(token_ids[e] | states[state_of[e]]) for each scored token e (`state_of`: a host array;
    None: one state per token), projecting to the vocabulary a chunk of states at a time, each state once
    however many tokens it predicts (texts that start alike share the states of their common start). The
    result stays on the model's device: callers read their results back once, after their last batch,
    instead of making the host wait for the device after every batch."""
    vocab, device = lm.parts.head.weight.shape[0], states.device
    blocked = _blockwise(lm, device)
    chunk = projected_rows(lm, device)
    out = states.new_empty(len(token_ids), dtype=torch.float64)
    for start in range(0, len(states), chunk):
        rows = states[start:start + chunk]
        if state_of is None:  # token e is predicted by state e
            at, which = slice(start, start + chunk), None
        else:
            tokens = np.flatnonzero((state_of >= start) & (state_of < start + chunk))
            at = torch.from_numpy(tokens).to(device, non_blocking=True)
            which = torch.from_numpy(state_of[tokens] - start).to(device, non_blocking=True)
        ids = token_ids[at]
        if blocked:
            out[at] = _blockwise_logprobs(lm, rows, ids, vocab, which).double()
        else:
            logits = lm.parts.logits(rows).float()
            target = logits.gather(1, ids[:, None]).squeeze(1) if which is None else logits[which, ids]
            out[at] = (target - _per_token(_logsumexp_(logits), which)).double()
    return out


def _per_token(values: torch.Tensor, which: torch.Tensor | None) -> torch.Tensor:
    """Per-state values for each scored token (`which`: its state; None: one state per token)."""
    return values if which is None else values[which]


def projected_rows(lm: LoadedModel, device: torch.device) -> int:
    """How many states `_gathered_logprobs` projects at once on `device` (callers that gather states from many
    small batches collect this many first)."""
    return CPU_ROWS if _blockwise(lm, device) else max(1, LOGIT_CHUNK_BYTES // (4 * lm.parts.head.weight.shape[0]))


def _blockwise(lm: LoadedModel, device: torch.device) -> bool:
    """Whether states on `device` are projected a block of the vocabulary at a time: a CPU, a plain linear head."""
    return device.type == "cpu" and lm.parts.sliceable_head(device)


def _blockwise_logprobs(lm: LoadedModel, states: torch.Tensor, token_ids: torch.Tensor, vocab: int,
                        which: torch.Tensor | None = None) -> torch.Tensor:
    """float32 log p(token_ids[e] | states[which[e]]) (`which` None: states[e]), the vocabulary
    `CPU_VOCAB_BLOCK` ids at a time: each block's maximum and sum of exp(logit - maximum) are kept per state,
    and the blocks' sums are joined at the end on their largest maximum (the log-sum-exp of the whole row, its
    terms summed in another order)."""
    n_blocks = -(-vocab // CPU_VOCAB_BLOCK)
    maxima = torch.empty(len(states), n_blocks)
    sums = torch.empty(len(states), n_blocks)
    picked = torch.full((len(token_ids),), float("nan"))  # an id outside the vocabulary stays NaN, never garbage
    state = _per_token(torch.arange(len(states)), which)
    for block, low in enumerate(range(0, vocab, CPU_VOCAB_BLOCK)):
        logits = lm.parts.logits(states, vocab=slice(low, low + CPU_VOCAB_BLOCK)).float()
        inside = (token_ids >= low) & (token_ids < low + CPU_VOCAB_BLOCK)
        picked[inside] = logits[state[inside], token_ids[inside] - low]
        top = logits.amax(1)
        maxima[:, block] = top
        sums[:, block] = logits.sub_(top[:, None]).exp_().sum(1)
    top = maxima.amax(1)
    return picked - _per_token(sums.mul_(maxima.sub_(top[:, None]).exp_()).sum(1).log_().add_(top), which)


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

