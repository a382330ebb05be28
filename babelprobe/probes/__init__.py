"""Probes: cross-validated logistic probes per layer × group on stored activations (the "neuro" method).

    from babelprobe.probes import sweep
    result = sweep("acts/", by=("language", "subset"), folds=5)   # ProbeResult
    result.table, result.peaks, result.oof, result.pair_scores(layer=6)
    result.probes.direction(("en", "taxonomic"), layer=6)        # the kept all-items probes (`Probes`)

Modules, one job each: `folds` (grouped/plain stratified folds), `solvers` (batched torch exact Newton
and L-BFGS, the scikit-learn reference), `weights` (the kept probes: `Probes`, `load_probes`), `metrics`,
`controls` (majority, shuffled labels, Hewitt–Liang), `peaks` (bootstrap intervals, peak layers),
`crosslingual` (train on one language, test on another), `pairs` (per-pair view: the "neuro" rows of
`compare`), `run` (the whole sweep), `source` (store or in-memory arrays), `synthetic` (planted-signal
data for tests and perf).
"""

from babelprobe.probes.controls import concepts_for
from babelprobe.probes.crosslingual import at_peaks, transfer, transfer_matrix
from babelprobe.probes.folds import make_folds
from babelprobe.probes.pairs import neuro_pairs, pair_scores
from babelprobe.probes.peaks import peak_table
from babelprobe.probes.run import ProbeResult, probe_group, sweep
from babelprobe.probes.solvers import fit_logistic, fit_predict
from babelprobe.probes.source import ArrayStore
from babelprobe.probes.synthetic import synthetic_activations
from babelprobe.probes.weights import Probe, Probes, load_probes

__all__ = [
    "ArrayStore", "Probe", "ProbeResult", "Probes", "at_peaks", "concepts_for", "fit_logistic", "fit_predict",
    "load_probes", "make_folds", "neuro_pairs", "pair_scores", "peak_table", "probe_group", "sweep",
    "synthetic_activations", "transfer", "transfer_matrix",
]
