"""The floors of perf/workflow.py: the least time each phase's model work can take, three ways, all measured in
the same run as babelprobe's own phases.

  replay      babelprobe's own model (or solver) calls of the phase, recorded during its run and replayed bare
              (`ModelCalls`, `FitCalls`): same inputs, same batches, nothing captured, written or tabulated.
              It inherits babelprobe's batching, so it bounds what babelprobe adds around its calls, not how
              well it batches.
  bare        the same tokens through a plain forward at the best batch budget of a sweep (`bare_seconds`):
              direct: the distinct texts' tokens, then the projection of the rows that predict a scored
              token; meta: the prefix trees' new tokens as plain rows (their past left out, so less than the
              real work), then the scored rows' projection; extract: each distinct text's tokens, the body only.
  arithmetic  the phase's model FLOPs (`Work.flops`: 2 × the blocks' weights per token, attention over each
              token's context, 2 × d_model × vocabulary per projected row) ÷ the dense matmul rate of this
              device measured in this run (`matmul_rate`: the model's dtype, a large square product).

The floor of a phase is the least of the three, and MFU (model-FLOPs utilisation) is its FLOPs ÷ (its seconds
× the measured matmul rate). The probe phase has no model: its floor is the replay of the solver's fits.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from babelprobe.models import length_batches, pad_batch

CPU_BUDGETS = (1024, 2048, 4096, 8192)
GPU_BUDGETS = (4096, 8192, 16384, 32768, 65536)


class Clock:
    """Wall and CPU seconds of a block, the device synchronised at both ends (light enough to wrap every call)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
        _drain_simulated()
        self.start, self.cpu_start = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        _drain_simulated()
        self.seconds = time.perf_counter() - self.start
        self.cpu_seconds = time.process_time() - self.cpu_start
        return False


def _drain_simulated() -> None:
    """The queued simulated device (perf/simulated.py, `--device simulated-gpu`) done with its work, as
    `torch.cuda.synchronize` makes a GPU."""
    simulated = sys.modules.get("simulated")
    if simulated is not None and simulated.CLOCK:
        simulated.CLOCK[-1].wait()


# ------------------------------------------------------------------------------------------- the replay

class ModelCalls:
    """Records the model calls babelprobe makes in each phase, to replay them bare.

    While `phase` is set, every forward of the model body (`lm.parts.body`) is recorded with its inputs
    (token ids, mask, positions: copies) and the shapes of the KV cache it was given, and every
    vocabulary projection (`lm.parts.logits`) with its number of rows. The originals run unchanged."""

    def __init__(self, lm):
        self.lm, self.phase = lm, None
        self.calls: dict[str, list] = {}

    def __enter__(self):
        body, parts = self.lm.parts.body, self.lm.parts
        parts.cache_argument(None)  # the body's cache keyword, read from its own signature before it is wrapped
        self.forward, self.logits = body.forward, parts.logits

        def forward(*args, **kwargs):
            if self.phase is not None:
                cache = kwargs.get("cache", kwargs.get("past_key_values"))
                shapes = None if cache is None else [(layer.keys.shape, layer.values.shape, layer.keys.dtype)
                                                     for layer in cache.layers
                                                     if getattr(layer, "keys", None) is not None]
                inputs = {k: v.detach().clone() for k, v in kwargs.items() if torch.is_tensor(v)}
                flags = {k: v for k, v in kwargs.items() if not torch.is_tensor(v)
                         and k not in ("cache", "past_key_values")}
                self.calls.setdefault(self.phase, []).append(("body", inputs, flags, shapes))
            return self.forward(*args, **kwargs)

        def logits(hidden, vocab=None):
            if self.phase is not None:
                self.calls.setdefault(self.phase, []).append(("logits", hidden.shape, hidden.dtype, vocab))
            return self.logits(hidden, vocab)

        body.forward, parts.logits = forward, logits
        return self

    def __exit__(self, *exc):
        self.lm.parts.body.forward, self.lm.parts.logits = self.forward, self.logits
        return False

    def replay(self, phase: str, device: torch.device) -> tuple[float, float]:
        """Seconds of the phase's model calls run again bare: each body forward on the recorded inputs
        (with a zero-filled cache of the recorded shapes where it had one, built outside the clock), each
        projection on as many zero rows followed by the log-normaliser and the target gather, as the
        scorers do. Only the calls themselves are timed."""
        from transformers import DynamicCache

        lm, seconds, cpu = self.lm, 0.0, 0.0
        with torch.inference_mode():
            for call in self.calls.get(phase, []):
                if call[0] == "body":
                    _, inputs, flags, shapes = call
                    kwargs = dict(inputs, **flags)
                    if shapes is not None:
                        cache = DynamicCache()
                        kwargs.update(lm.parts.cache_argument(cache))
                        for layer, (k, v, dtype) in enumerate(shapes):
                            cache.update(zeros(lm, k, dtype), zeros(lm, v, dtype), layer)
                    with Clock(device) as clock:
                        self.forward(**kwargs)
                else:
                    _, shape, dtype, vocab = call
                    states = zeros(lm, shape, dtype)
                    with Clock(device) as clock:
                        project(lm, states, self.logits, vocab)
                seconds += clock.seconds
                cpu += clock.cpu_seconds
        return seconds, cpu


def zeros(lm, shape, dtype) -> torch.Tensor:
    """Zeros on the model's device (on the simulated device: a tensor without data, as its own caches are)."""
    if getattr(lm, "simulated", None) is not None:
        from simulated import empty

        return empty(*shape, dtype=dtype)
    return torch.zeros(shape, dtype=dtype, device=lm.device)


def project(lm, states: torch.Tensor, logits=None, vocab: slice | None = None) -> None:
    """What a scorer does with the states that predict scored tokens: logits (of `vocab`'s token ids: a CPU's
    block), the target's and the log-normaliser (`logprobs._gathered_logprobs`, with zero targets)."""
    from babelprobe.benchmarks.core.logprobs import _logsumexp_

    values = (logits or lm.parts.logits)(states, vocab).float()
    values.gather(1, torch.zeros(len(states), 1, dtype=torch.long, device=values.device))
    _logsumexp_(values)


class FitCalls:
    """Records the solver calls of the probe phase (`fit_predict` as the sweep calls it, per group) and
    replays them with the sweep's own parallelism: the probe phase's floor. On a GPU the sweep reads each
    group straight to the device, so the recorded activations stay there (68 groups of 270 items × 33 × 4096
    at 9,180 pairs: 10 GB) and the replay is the solves alone."""

    def __init__(self):
        self.calls: list = []
        self.recording = False

    def __enter__(self):
        import babelprobe.probes.run as runner

        self.runner, self.original = runner, runner.fit_predict

        def recorded(*args, **kwargs):
            if self.recording:
                self.calls.append((args, kwargs))
            return self.original(*args, **kwargs)

        runner.fit_predict = recorded
        return self

    def __exit__(self, *exc):
        self.runner.fit_predict = self.original
        return False

    def replay(self, device: torch.device) -> tuple[float, float]:
        from babelprobe.probes.run import group_workers, map_groups

        workers = group_workers(None, "torch", None, len(self.calls))
        with Clock(device) as clock:
            map_groups(lambda call: self.original(*call[0], **call[1]), self.calls, workers, False)
        return clock.seconds, clock.cpu_seconds


# --------------------------------------------------------------------------------------------- the work

@dataclass
class Work:
    """The model work of a phase: token sequences through the body (`lengths`, with `context`, the tokens
    each sequence's tokens also attend to: a prefix tree's past) and rows through the vocabulary projection."""

    lengths: list[int]
    rows: int
    context: list[int] | None = None

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def flops(self, config, vocab: int) -> float:
        """2 × the blocks' weights per token, the attention products (QKᵀ and AV: 4 × heads × head_dim per
        pair of a token and a token it attends to, causal: n(n+1)/2 pairs plus n × context), and 2 × d_model ×
        vocabulary per projected row."""
        from simulated import block_flops

        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        n = np.asarray(self.lengths, dtype=float)
        context = np.asarray(self.context if self.context is not None else np.zeros(len(n)), dtype=float)
        pairs = float(np.sum(n * (n + 1) / 2 + n * context))
        attention = 4.0 * config.num_hidden_layers * heads * head_dim * pairs
        return block_flops(config) * self.tokens + attention + 2.0 * config.hidden_size * vocab * self.rows


def direct_work(lm, texts: list[str], tree_budget: int | None = None) -> Work:
    """The distinct texts babelprobe scores, and one projected row per distinct state that predicts a scored
    token (the token prefix before it: texts that start alike share it, all share BOS's). With `tree_budget`
    (direct scoring as a prefix tree, `DirectScorer.share_prefix`, at that budget): the tree's, `prefix_work`."""
    if tree_budget is not None:
        return prefix_work(lm, texts, [0] * len(texts), tree_budget)
    from babelprobe.benchmarks.core.logprobs import plan_logprobs

    plan = plan_logprobs(lm, texts)
    return Work([len(e.ids) for e in plan.encodings], len(predicting_states(plan.encodings, plan.targets)))


def predicting_states(encodings, targets) -> set:
    """The distinct token prefixes before scored tokens, over all texts: the least number of projected rows."""
    return {tuple(enc.ids[:p]) for enc, positions in zip(encodings, targets) for p in positions}


def prefix_work(lm, texts: list[str], starts: list[int], batch_tokens: int) -> Work:
    """The prefix trees' new tokens (each segment after its past) and one projected row per distinct state
    that predicts a scored token (the tree's node before it: tokens predicted by the same node share it)."""
    from babelprobe.benchmarks.core.prefix import plan_prefix

    plan = plan_prefix(lm, texts, starts, batch_tokens=batch_tokens)
    lengths, context = [], []
    for _, batches in plan.chunks:
        for batch in batches:
            mask = batch["attention_mask"].numpy()
            width_past = batch["width_past"]
            lengths += mask[:, width_past:].sum(1).tolist()
            context += mask[:, :width_past].sum(1).tolist()
    return Work(lengths, len(predicting_states(plan.encodings, plan.targets)), context)


def extract_work(lm, texts: list[str]) -> Work:
    """Each distinct text's tokens through the body, nothing projected (extraction runs a text that recurs within
    a shard once; the floor runs it once over all)."""
    return Work([len(e.ids) for e in lm.encode(list(dict.fromkeys(texts)), truncate=True)], 0)


# ------------------------------------------------------------------------------------------- the floors

def bare_seconds(lm, work: Work, budgets, device: torch.device, sample_tokens: int | None = None) -> dict:
    """{budget: (seconds, CPU seconds)} of `work`'s tokens through the body in length-sorted batches under each budget, plus
    its projected rows (chunks of the scorers' size), measured on at most `sample_tokens` tokens of it (taken
    across the lengths) and scaled up by tokens."""
    from babelprobe.benchmarks.core.logprobs import LOGIT_CHUNK_BYTES
    from babelprobe.models import Encoding

    lengths = list(work.lengths)
    scale = 1.0
    if sample_tokens and work.tokens > sample_tokens:
        keep = np.linspace(0, len(lengths) - 1, max(1, len(lengths) * sample_tokens // work.tokens)).astype(int)
        lengths = [lengths[i] for i in keep]
        scale = work.tokens / max(1, sum(lengths))
    token = lm.bos_token_id if lm.bos_token_id is not None else lm.pad_token_id
    encodings = [Encoding([token] * n, [(0, 0)] * n) for n in lengths]
    vocab = lm.parts.head.weight.shape[0]
    chunk = max(1, LOGIT_CHUNK_BYTES // (4 * vocab))
    rows = int(round(work.rows / scale)) if work.rows else 0
    out = {}
    with torch.inference_mode():
        for budget in budgets:
            batches = [pad_batch([encodings[i] for i in batch], lm.pad_token_id, "right", lm.device)
                       for batch in length_batches(lengths, budget)]  # inputs ready before the clock
            with Clock(device) as clock:
                for inputs in batches:
                    lm.parts.body(**inputs, use_cache=False)
                for start in range(0, rows, chunk):
                    project(lm, zeros(lm, (min(chunk, rows - start), lm.d_model), lm.dtype))
            out[budget] = (clock.seconds * scale, clock.cpu_seconds * scale)
    return out


def matmul_rate(lm, device: torch.device, size: int = 4096, repeat: int = 5) -> float:
    """FLOP/s of a dense size × size × size product in the model's dtype on `device`, the best of `repeat`
    (on the simulated device: its own rate, the blocks' FLOPs per token ÷ its seconds per token)."""
    clock = getattr(lm, "simulated", None)
    if clock is not None:
        from simulated import block_flops

        return block_flops(lm.model.config) / clock.rates.body_s_per_token
    a = torch.randn(size, size, dtype=lm.dtype, device=device)
    b = torch.randn(size, size, dtype=lm.dtype, device=device)
    best = float("inf")
    for _ in range(repeat):
        with Clock(device) as timer:
            a @ b
        best = min(best, timer.seconds)
    return 2.0 * size ** 3 / best
