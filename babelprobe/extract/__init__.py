"""Extraction: every layer's last-token and mean activations, streamed into a crash-safe HDF5 store.

    import babelprobe as bp
    lm = bp.load_model("default")
    bp.extract_activations(lm, bp.load_items("xcomps-sample"), "acts/", pool="both")
    store = bp.open_store("acts/")
    X = store.read(layer=6, rows=None, pool="last")      # float32 [n_items, d_model]
    store.keys                                           # item_id, pair_id, language, subset, label, n_tokens

Modules: `capture` (pooling inside the forward pass), `backends` (hf, transformer_lens, nnsight),
`store` (the HDF5 format, reader, writer, verify), `run` (batching, resume, progress, busy fraction),
`background` (the shard writer threads), `layers` (the one `--layers` grammar), `distributed` (several
processes, one store; replicas of a model dispatched over several GPUs).
"""

from babelprobe.lazy import lazy_exports

# imported when first used (`extract.settings` and `extract.layers` stay light);
# `extract_activations` is the name under `import babelprobe` (there `extract` is this subpackage)
_EXPORTS = {"BACKENDS": "backends", "parse_layers": "layers", "ExtractReport": "run", "extract": "run",
            "extract_activations": "run:extract", "ExtractSettings": "settings", "Store": "store",
            "open_store": "store", "verify_store": "store", "write_store": "store"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
