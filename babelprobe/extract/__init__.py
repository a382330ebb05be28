"""Extraction: every layer's last-token and mean activations, streamed into a crash-safe HDF5 store.

    import babelprobe as bp
    lm = bp.load_model("default")
    bp.extract_activations(lm, bp.load_items("xcomps-sample"), "acts/", pool="both")
    store = bp.open_store("acts/")
    X = store.read(layer=6, rows=None, pool="last")      # float32 [n_items, d_model]
    store.keys                                           # item_id, pair_id, language, subset, label, n_tokens

Modules: `capture` (pooling inside the forward pass), `backends` (hf, transformer_lens, nnsight),
`store` (the HDF5 format, reader, writer, verify), `run` (batching, resume, progress, busy fraction),
`background` (the shard writer thread), `layers` (the one `--layers` grammar), `distributed` (several
processes, one store; replicas of a model dispatched over several GPUs).
"""

from babelprobe.extract.backends import BACKENDS
from babelprobe.extract.layers import parse_layers
from babelprobe.extract.run import ExtractReport, extract
from babelprobe.extract.store import Store, open_store, verify_store, write_store

extract_activations = extract  # the name under `import babelprobe` (there `extract` is this subpackage)

__all__ = ["BACKENDS", "ExtractReport", "Store", "extract", "extract_activations", "open_store", "parse_layers",
           "verify_store", "write_store"]
