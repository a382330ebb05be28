"""The settings of an extraction (`babelprobe extract`, `bp.extract_activations`): what changes the stored
numbers. The CLI makes one flag per field; the store's manifest records them. Options that change speed
or layout only (batch token budget, shard size, compression, padding side, devices) are not settings.

This module imports nothing heavy: the CLI builds its flags from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from babelprobe.settings import one_of, option

POOLINGS = ("last", "mean", "both")
DTYPES = ("float32", "float16", "bfloat16")  # = store.DTYPES (tested)
BACKENDS = ("hf", "transformer_lens", "nnsight")  # = backends.BACKENDS (tested)
ON_OVERFLOW = ("error", "bfloat16", "float32")


def exact_dtype(pool: str, model_dtype: str) -> str:
    """The fewest bytes that keep a model's stored states exactly: a bfloat16 or float16 model's last-token
    states are values of its own dtype (the blocks' outputs; checked on every family and backend in
    tests/test_families.py), so its store of last-token rows alone holds the same numbers in half the bytes
    of float32; a mean over tokens is no such value, nor is a float32 model's state, so those are float32."""
    return model_dtype if pool == "last" and model_dtype in ("bfloat16", "float16") else "float32"


@dataclass(frozen=True)
class ExtractSettings:
    """What an extraction stores (recorded in the store's manifest)."""

    layers: str = option("all", metavar="SPEC", help="layers to store: all, a range 0-18, a list 0,6,12, or a mix "
                         "0-4,12 (0 = embeddings, i = output of block i)")
    pool: str = option("last", choices=POOLINGS,
                       help="last token, masked mean over the text's tokens (BOS excluded), or both")
    dtype: str | None = option(None, flag="--store-dtype", choices=DTYPES, aliases=("--dtype",),
                               help="dtype on disk (bfloat16 is stored as raw 16 bits; default: a bfloat16 or "
                               "float16 model's own for last-token rows, which are values of that dtype, so the "
                               "same numbers in half of float32's bytes; float32 otherwise; a store being resumed "
                               "keeps its own)")
    on_overflow: str = option("error", choices=ON_OVERFLOW,
                              help="when a shard's values exceed float16's range: stop with an error naming the layer, "
                              "or store that shard as bfloat16 / float32")
    backend: str = option("hf", choices=BACKENDS,
                          help="hf (own hooks, fastest), transformer_lens (TransformerBridge) or nnsight; all store the "
                          "same values")
    truncate: bool = option(False, help="keep the first tokens of a text longer than the context instead of stopping")

    def __post_init__(self):
        if isinstance(self.layers, (list, tuple)):
            object.__setattr__(self, "layers", ",".join(map(str, self.layers)))
        object.__setattr__(self, "layers", "all" if self.layers is None else str(self.layers))
        one_of(self, "pool", POOLINGS)
        one_of(self, "dtype", DTYPES, allow_none=True)
        one_of(self, "on_overflow", ON_OVERFLOW)
        one_of(self, "backend", BACKENDS)
