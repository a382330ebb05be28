"""Evaluation benchmarks: the token log-prob core, direct and meta scoring, and the seed benchmarks."""

from babelprobe.benchmarks.consistency import consistency_summary, load_consistency, run_consistency
from babelprobe.benchmarks.direct import score_direct, score_texts
from babelprobe.benchmarks.eclektic import eclektic_summary, load_eclektic, run_eclektic
from babelprobe.benchmarks.generate import (
                                           Generator,
                                           generate_cached,
                                           local_generator,
                                           make_generator,
                                           openai_generator,
)
from babelprobe.benchmarks.logprobs import shared_prefix_logprobs, token_logprobs
from babelprobe.benchmarks.meta import load_prompts, position_bias, score_meta
from babelprobe.benchmarks.pitfalls import (
                                           load_pitfalls,
                                           pitfalls_summary,
                                           relative_affinity,
                                           score_pitfalls,
                                           simulation_score,
)
from babelprobe.benchmarks.pitfalls_search import SearchSettings, beam_search, prepare_seeds
from babelprobe.benchmarks.stingray import (
                                           cognate_bias,
                                           cognate_comprehension,
                                           load_stingray,
                                           score_stingray,
                                           stingray_summary,
)

__all__ = ["score_direct", "score_texts", "token_logprobs",
           "load_prompts", "position_bias", "score_meta", "shared_prefix_logprobs",
           "SearchSettings", "beam_search", "cognate_bias", "cognate_comprehension", "load_pitfalls", "load_stingray",
           "pitfalls_summary", "prepare_seeds", "relative_affinity", "score_pitfalls", "score_stingray",
           "simulation_score", "stingray_summary",
           "Generator", "consistency_summary", "eclektic_summary", "generate_cached", "load_consistency",
           "load_eclektic", "local_generator", "make_generator", "openai_generator", "run_consistency",
           "run_eclektic"]
