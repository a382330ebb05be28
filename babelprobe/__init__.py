"""babelprobe: does a multilingual language model know the same thing in every language, and where
in its layers does it know it?

Everything a user touches is reachable from here:

    import babelprobe as bp
    lm = bp.load_model("default")                 # Gemma-3-270M, offline
    items = bp.load_items("xcomps-sample")        # bundled conceptual minimal pairs
    direct = bp.score_direct(lm, items)           # one row per pair
"""

from babelprobe.analysis import accuracy_pivot, accuracy_table
from babelprobe.benchmarks import score_direct, score_texts, token_logprobs
from babelprobe.errors import BabelprobeError
from babelprobe.items import language_table, load_items, to_pairs, write_items
from babelprobe.models import LoadedModel, load_model, wrap_model
from babelprobe.tables import read_table, write_table

__version__ = "0.1.0"

__all__ = [
    "BabelprobeError", "LoadedModel", "accuracy_pivot", "accuracy_table", "language_table", "load_items",
    "load_model", "read_table", "score_direct", "score_texts", "to_pairs", "token_logprobs", "wrap_model",
    "write_items", "write_table",
]
