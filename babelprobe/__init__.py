"""babelprobe: does a multilingual language model know the same thing in every language, and where
in its layers does it know it?

Everything a user touches is reachable from here:

    import babelprobe as bp
    lm = bp.load_model("default")                 # Gemma-3-270M, offline
    items = bp.load_items("xcomps-sample")        # bundled conceptual minimal pairs
    direct = bp.score_direct(lm, items)           # one row per pair
    meta = bp.score_meta(lm, items)               # ask which concept has the property; one row per pair
    result = bp.compare(lm, items, "cmp/")        # meta + direct + neuro on the same pairs, joined per pair
    bp.write_report("cmp/", "cmp/figures")        # every figure (PDF + PNG) and report.md
    bp.run_benchmark("stingray", lm, "stingray-sample", "sr/")   # a seed benchmark

Names are imported when first used, so `import babelprobe` stays light (no matplotlib, no model code,
no HTTP client until asked for). The layout and the contracts are in docs/design.md.
"""

from __future__ import annotations

import importlib

from babelprobe.errors import BabelprobeError

__version__ = "0.1.0"

# public name -> module that defines it (the name there, unless given as "module:name")
_EXPORTS = {
    "load_model": "models", "wrap_model": "models", "LoadedModel": "models",
    "load_items": "items", "write_items": "items", "to_pairs": "items", "language_table": "languages",
    "read_table": "tables", "write_table": "tables",
    "score_direct": "benchmarks.direct", "score_texts": "benchmarks.direct", "score_meta": "benchmarks.meta",
    "token_logprobs": "benchmarks.core.logprobs",
    "extract_activations": "extract.run:extract", "open_store": "extract.store", "verify_store": "extract.store",
    "write_store": "extract.store", "Store": "extract.store",
    "sweep": "probes.run", "ProbeResult": "probes.run", "ArrayStore": "probes.source",
    "transfer_matrix": "probes.crosslingual", "load_probes": "probes.weights", "Probes": "probes.weights",
    "compare": "comparison", "compare_models": "comparison", "CompareResult": "comparison",
    "intervene": "interventions.run", "InterventionResult": "interventions.run", "Intervention": "interventions.edits",
    "plot_effect_by_layer": "analysis.interventions", "plot_dose_response": "analysis.interventions",
    "plot_f1_vs_effect": "analysis.interventions",
    "run_benchmark": "analysis.benchmarks", "Models": "benchmarks.base",
    "run_affinity": "analysis.benchmarks", "plot_runs": "analysis.benchmarks",
    "write_report": "analysis.report", "load_results": "analysis.report", "save_figure": "analysis.style:save",
    "accuracy_table": "analysis.summary", "accuracy_pivot": "analysis.summary",
    "language_curves": "analysis.peaks", "language_peaks": "analysis.peaks", "subset_peaks": "analysis.peaks",
    "typology_peaks": "analysis.peaks", "peak_difference": "analysis.peaks",
    "plot_layer_curves": "analysis.figures", "plot_method_bars": "analysis.figures",
    "plot_method_correlations": "analysis.figures", "plot_peak_heatmap": "analysis.figures",
    "plot_peak_typology": "analysis.figures", "plot_transfer": "analysis.figures",
    "plot_benchmark": "analysis.benchmarks",
    "lens_table": "latent.lens", "meta_lens": "latent.lens", "lens_curves": "latent.lens", "token_set": "latent.tokens",
    "align_layers": "latent.align", "linear_cka": "latent.align", "retrieval_accuracy": "latent.align",
}

__all__ = ["BabelprobeError", *_EXPORTS]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'babelprobe' has no attribute {name!r}")
    module, _, attribute = _EXPORTS[name].partition(":")
    value = getattr(importlib.import_module(f"babelprobe.{module}"), attribute or name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
