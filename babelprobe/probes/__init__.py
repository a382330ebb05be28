"""Probes: cross-validated logistic probes per layer × group on stored activations (the "neuro" method).

    from babelprobe.probes import probe
    result = probe("acts/", by=("language", "subset"), folds=5)   # ProbeResult
    result.table, result.peaks, result.oof, result.pair_scores(layer=6)
    result.probes.direction(("en", "taxonomic"), layer=6)        # the kept all-items probes (`Probes`)

Modules, one job each: `folds` (grouped/plain stratified folds), `solvers` (batched torch exact Newton
and L-BFGS, the scikit-learn reference), `weights` (the kept probes: `Probes`, `load_probes`), `metrics`,
`controls` (majority, shuffled labels, Hewitt–Liang), `peaks` (bootstrap intervals, peak layers),
`crosslingual` (train on one language, test on another), `pairs` (per-pair view: the "neuro" rows of
`compare`), `settings` (`ProbeSettings`, the protocol presets), `result` (`ProbeResult`), `run` (the whole
sweep), `source` (store or in-memory arrays), `synthetic` (planted-signal
data for tests and perf).
"""

from babelprobe.lazy import lazy_exports

# public name -> the module that defines it; imported when first used (`probes.settings` stays light)
_EXPORTS = {
    "concepts_for": "controls", "at_peaks": "crosslingual", "transfer": "crosslingual",
    "transfer_matrix": "crosslingual", "make_folds": "folds", "neuro_pairs": "pairs", "pair_scores": "pairs",
    "peak_table": "peaks", "ProbeResult": "result", "probe": "run", "probe_group": "run",
    "PROTOCOLS": "settings", "ProbeSettings": "settings", "fit_logistic": "solvers", "fit_predict": "solvers",
    "ArrayStore": "source", "synthetic_activations": "synthetic", "Probe": "weights", "Probes": "weights",
    "load_probes": "weights",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
