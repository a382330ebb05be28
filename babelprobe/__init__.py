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
"""

from babelprobe.analysis import (
    accuracy_pivot,
    accuracy_table,
    language_curves,
    language_peaks,
    load_results,
    peak_difference,
    plot_layer_curves,
    plot_method_bars,
    plot_method_correlations,
    plot_peak_heatmap,
    plot_peak_typology,
    plot_transfer,
    save_figure,
    subset_peaks,
    typology_peaks,
    write_report,
)
from babelprobe.benchmarks import (
    Generator,
    SearchSettings,
    beam_search,
    cognate_bias,
    cognate_comprehension,
    consistency_summary,
    eclektic_summary,
    generate_cached,
    load_consistency,
    load_eclektic,
    load_pitfalls,
    load_prompts,
    load_stingray,
    local_generator,
    make_generator,
    openai_generator,
    pitfalls_summary,
    position_bias,
    prepare_seeds,
    relative_affinity,
    run_consistency,
    run_eclektic,
    score_direct,
    score_meta,
    score_pitfalls,
    score_stingray,
    score_texts,
    shared_prefix_logprobs,
    simulation_score,
    stingray_summary,
    token_logprobs,
)
from babelprobe.benchmarks.compare import CompareResult, compare, compare_models
from babelprobe.errors import BabelprobeError
from babelprobe.extract import Store, extract_activations, open_store, verify_store, write_store
from babelprobe.items import language_table, load_items, to_pairs, write_items
from babelprobe.models import LoadedModel, load_model, wrap_model
from babelprobe.probes import ArrayStore, ProbeResult, pair_scores, sweep, transfer_matrix
from babelprobe.probes import transfer as probe_transfer
from babelprobe.tables import read_table, write_table

__version__ = "0.1.0"

__all__ = [
    "BabelprobeError", "LoadedModel", "accuracy_pivot", "accuracy_table", "language_table", "load_items",
    "load_model", "read_table", "score_direct", "score_texts", "to_pairs", "token_logprobs", "wrap_model",
    "write_items", "write_table",
    "load_prompts", "position_bias", "score_meta", "shared_prefix_logprobs",
    "ArrayStore", "ProbeResult", "pair_scores", "probe_transfer", "sweep", "transfer_matrix",
    "Store", "extract_activations", "open_store", "verify_store", "write_store",
    "language_curves", "language_peaks", "load_results", "peak_difference", "plot_layer_curves", "plot_method_bars",
    "plot_method_correlations", "plot_peak_heatmap", "plot_peak_typology", "plot_transfer", "save_figure",
    "subset_peaks", "typology_peaks", "write_report", "CompareResult", "compare", "compare_models",
    "SearchSettings", "beam_search", "cognate_bias", "cognate_comprehension", "load_pitfalls", "load_stingray",
    "pitfalls_summary", "prepare_seeds", "relative_affinity", "score_pitfalls", "score_stingray", "simulation_score",
    "stingray_summary",
    "Generator", "consistency_summary", "eclektic_summary", "generate_cached", "load_consistency", "load_eclektic",
    "local_generator", "make_generator", "openai_generator", "run_consistency", "run_eclektic",
]
