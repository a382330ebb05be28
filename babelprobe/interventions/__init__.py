"""Interventions: edit the residual stream along a probe's direction and see whether the model's own
judgement of the same minimal pairs changes (the causal leg of XCOMPS' neuro reading).

    from babelprobe.interventions import intervene
    result = intervene("default", "xcomps-sample", "cmp/", "cmp/intervene/", layers="peak", methods="ablate")

Modules, one job each: `edits` (the edits and the hooks that apply them inside the forward pass),
`directions` (probe, random and shuffled-label directions, LEACE erasers, the edit of each method),
`run` (the runs, the readouts and the tables). Summaries and figures: `babelprobe.analysis.interventions`.
This package composes extract, probes and the benchmarks' scorers, so it sits at the comparison layer
(docs/design.md "Layers").
"""

from babelprobe.interventions.directions import group_directions, load_probe_source, make_edit
from babelprobe.interventions.edits import Erase, Intervention, Project, Steer, fit_leace
from babelprobe.interventions.run import InterventionResult, intervene, pooled_states

__all__ = ["Erase", "Intervention", "InterventionResult", "Project", "Steer", "fit_leace", "group_directions",
           "intervene", "load_probe_source", "make_edit", "pooled_states"]
