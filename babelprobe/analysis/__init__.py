"""Analysis: joins, accuracy tables with intervals, correlations, peak layers, figures, the report."""

from babelprobe.lazy import lazy_exports

# imported when first used: `import babelprobe.analysis.X` for a light module does not load matplotlib
_EXPORTS = {
    "accuracy_pivot": "summary", "accuracy_table": "summary", "wilson": "summary",
    "agreement": "methods", "correlations": "methods", "difference": "methods", "join_pairs": "methods",
    "primary": "methods", "summarize": "methods",
    "language_curves": "peaks", "language_peaks": "peaks", "peak_difference": "peaks", "subset_peaks": "peaks",
    "typology_peaks": "peaks", "with_typology": "peaks",
    "plot_layer_curves": "figures", "plot_method_bars": "figures", "plot_method_correlations": "figures",
    "plot_peak_heatmap": "figures", "plot_peak_typology": "figures", "plot_transfer": "figures",
    "save_figure": "style:save", "load_results": "results", "write_report": "report",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
