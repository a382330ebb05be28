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


@dataclass(frozen=True)
class ExtractSettings:
    """What an extraction stores (recorded in the store's manifest)."""

    layers: str = option("all", metavar="SPEC", help="layers to store: all, a range 0-18, a list 0,6,12, or a mix "
                         "0-4,12 (0 = embeddings, i = output of block i)")
    pool: str = option("last", choices=POOLINGS,
                       help="last token, masked mean over the text's tokens (BOS excluded), or both")
    dtype: str = option("float32", flag="--store-dtype", choices=DTYPES, aliases=("--dtype",),
                        help="dtype on disk (bfloat16 is stored as raw 16 bits)")
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
        one_of(self, "dtype", DTYPES)
        one_of(self, "on_overflow", ON_OVERFLOW)
        one_of(self, "backend", BACKENDS)
