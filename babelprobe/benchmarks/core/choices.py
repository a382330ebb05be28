"""Likelihood-based multiple choice: score each option as a continuation of its prompt.

`option_scores(lm, prompts, options)` returns, per prompt, the (reduced) log-probability of each
option given the prompt, teacher-forced over all the option's tokens and boundary-safe (the core's
`score_from`). `choose` picks the highest. Used by StingrayBench (A/B/C, Yes/No), Cross-Lingual
Pitfalls (four answer strings), self-consistency (label words) and anywhere else an answer is one of
a known set.
"""

from __future__ import annotations

import numpy as np

from babelprobe.benchmarks.core.logprobs import reduce, token_logprobs
from babelprobe.benchmarks.core.prefix import shared_prefix_logprobs
from babelprobe.models import LoadedModel


def option_scores(lm: LoadedModel, prompts: list[str], options: list[list[str]], reduction: str = "sum",
                  share_prefix: bool = False, **core_options) -> list[np.ndarray]:
    """Score `prompt + option` for every option of every prompt; only the option's tokens count.
    `share_prefix=True` runs each prompt once and its options from the KV cache
    (`prefix.shared_prefix_logprobs`: same numbers, much less work for long prompts)."""
    texts, starts, spans = [], [], []
    for prompt, opts in zip(prompts, options):
        for option in opts:
            texts.append(prompt + option)
            starts.append(len(prompt))
            spans.append(option)
    core = shared_prefix_logprobs if share_prefix else token_logprobs
    scored = core(lm, texts, score_from=starts, **core_options)
    flat = np.array([reduce(s, span, reduction) for s, span in zip(scored, spans)])
    return np.split(flat, np.cumsum([len(o) for o in options])[:-1])


def choose(lm: LoadedModel, prompts: list[str], options: list[list[str]], **kwargs) -> np.ndarray:
    """Index of the highest-scoring option for each prompt."""
    return np.array([int(np.argmax(s)) for s in option_scores(lm, prompts, options, **kwargs)])
