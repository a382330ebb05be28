"""Evaluation benchmarks: the token log-prob core, direct and meta scoring, and the seed benchmarks."""

from babelprobe.benchmarks.direct import score_direct, score_texts
from babelprobe.benchmarks.logprobs import token_logprobs

__all__ = ["score_direct", "score_texts", "token_logprobs"]
