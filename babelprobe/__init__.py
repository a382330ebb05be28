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
    probes = bp.probe("cmp/acts", folds=5)        # the probe sweep of a store (`babelprobe probe`)
    bp.lens(lm, items, "lens/"); bp.align(lm, items, "align/")   # logit lens; cross-lingual alignment
    bp.patch_translation(lm, "xcomps-sample", out="patch/")    # activation patching (Dumas et al. 2025)

Every command has its library call of the same name and a settings dataclass (`bp.ProbeSettings`,
`bp.CompareSettings`, ...) whose fields are the command's flags.

Names are imported when first used, so `import babelprobe` stays light (no matplotlib, no model code,
no HTTP client until asked for). The layout and the contracts are in docs/design.md.
"""

from __future__ import annotations

from babelprobe.errors import BabelprobeError
from babelprobe.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it (the name there, unless given as "module:name")
_EXPORTS = {
    "load_model": "models", "wrap_model": "models", "LoadedModel": "models",
    "load_items": "items", "write_items": "items", "to_pairs": "items", "language_table": "languages",
    "read_table": "tables", "write_table": "tables",
    "score_direct": "benchmarks.direct", "score_texts": "benchmarks.direct", "score_meta": "benchmarks.meta",
    "score_pairs": "benchmarks.scoring", "DirectSettings": "benchmarks.scoring", "MetaSettings": "benchmarks.scoring",
    "token_logprobs": "benchmarks.core.logprobs",
    "extract_activations": "extract.run:extract", "ExtractSettings": "extract.settings",
    "open_store": "extract.store", "verify_store": "extract.store",
    "write_store": "extract.store", "Store": "extract.store",
    "probe": "probes.run", "ProbeSettings": "probes.settings", "ProbeResult": "probes.result",
    "ArrayStore": "probes.source",
    "transfer_matrix": "probes.crosslingual", "load_probes": "probes.weights", "Probes": "probes.weights",
    "compare": "comparison", "CompareSettings": "comparison", "diff": "comparison", "CompareResult": "comparison",
    "intervene": "interventions.run", "InterventionResult": "interventions.run", "Intervention": "interventions.edits",
    "patch_translation": "patching.run", "patch_pairs": "patching.run", "TranslationResult": "patching.run",
    "PairsResult": "patching.run", "TranslationSettings": "patching.settings", "PairsSettings": "patching.settings",
    "language_neurons": "neurons.run", "neuron_stats": "neurons.run", "select_lape": "neurons.lape",
    "deactivated": "neurons.mlp", "NeuronStats": "neurons.lape", "Lape": "neurons.lape",
    "plot_lape_layers": "analysis.neurons", "plot_lape_overlap": "analysis.neurons",
    "plot_deactivation": "analysis.neurons",
    "plot_effect_by_layer": "analysis.interventions", "plot_dose_response": "analysis.interventions",
    "plot_f1_vs_effect": "analysis.interventions",
    "run_benchmark": "analysis.benchmarks", "Models": "benchmarks.base",
    "run_affinity": "analysis.benchmarks", "plot_runs": "analysis.benchmarks",
    "write_report": "analysis.report", "load_results": "analysis.results", "save_figure": "analysis.style:save",
    "accuracy_table": "analysis.summary", "accuracy_pivot": "analysis.summary",
    "language_curves": "analysis.peaks", "language_peaks": "analysis.peaks", "subset_peaks": "analysis.peaks",
    "typology_peaks": "analysis.peaks", "peak_difference": "analysis.peaks",
    "plot_layer_curves": "analysis.figures", "plot_method_bars": "analysis.figures",
    "plot_method_correlations": "analysis.figures", "plot_peak_heatmap": "analysis.figures",
    "plot_peak_typology": "analysis.figures", "plot_transfer": "analysis.figures",
    "plot_benchmark": "analysis.benchmarks",
    "lens": "latent.run", "align": "latent.run", "LensSettings": "latent.settings", "AlignSettings": "latent.settings",
    "sweep": "jobs", "SweepSettings": "jobs",
    "lens_table": "latent.lens", "meta_lens": "latent.lens", "lens_curves": "latent.lens", "token_set": "latent.tokens",
    "align_layers": "latent.align", "linear_cka": "latent.align", "retrieval_accuracy": "latent.align",
    "load_sae": "sae.weights", "save_sae": "sae.weights", "SAE": "sae.weights", "sae_stats": "sae.stats",
    "sae_features": "sae.run", "SAEResult": "sae.run", "train_sae": "sae.train", "fetch_sae": "sae.fetch",
    "plot_sae_monolinguality": "analysis.sae:plot_monolinguality", "plot_sae_fit": "analysis.sae:plot_fit",
    "plot_sae_vs_dense": "analysis.sae:plot_sparse_vs_dense", "plot_sae_ablation": "analysis.sae:plot_ablation",
    "sae_ablation_summary": "analysis.sae:ablation_summary",
}

__all__ = ["BabelprobeError", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
