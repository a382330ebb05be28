"""Interventions: switch an edit on inside the model and see whether its own judgement of the same
minimal pairs changes (the causal leg of XCOMPS' neuro reading), and what a probe then sees.

    from babelprobe.interventions import intervene
    result = intervene("default", "xcomps-sample", "cmp/", "cmp/intervene/", layers="peak", methods="ablate")
    result = intervene("default", "xcomps-sample", out="neu/deact/", neurons="neu/", methods="neurons", off="zh")

One runner, several edit sources. The runner (`run`) owns what every intervention shares: the settings
(`settings.Settings`, one flag each), the input checks before any work, the readouts with and without
the edit (`readouts`: direct, meta, probe with `bp.load_probes`), the per-pair rows, resuming unit by
unit (`runs.score_resumably`), the paired-bootstrap summary and the figures
(`babelprobe.analysis.interventions`). An edit source (`source.EditSource`) owns its edits:

    name       the rows' `edit_source`
    methods    the --method values it serves (`source.SOURCES` maps each method to its source)
    unit       the item column the run resumes by (a probe group, a language)
    columns    the columns it adds to every row (documented in its module)
    __init__(settings, items, probes, inputs)    its inputs checked before any model loads
    identity(), check_model(lm), ready(probes), units(items), unit_rows(unit)

Sources: `probe_edits.ProbeDirections` (steer, ablate, leace along probe directions, with random and
shuffled-label controls; `directions` builds them, `edits` applies them at a layer of the residual
stream) and `babelprobe.neurons.edits.NeuronDeactivation` (language-specific neurons switched off,
with random unselected neurons as the control); SAE features next. The package composes extract, probes and the benchmarks'
scorers, so it sits at the comparison layer (docs/design.md "Layers").

Names are imported when first used: `interventions.settings` (what the CLI needs to build its flags)
imports no model code.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Erase": "edits", "Intervention": "edits", "Project": "edits", "Steer": "edits", "fit_leace": "edits",
    "group_directions": "directions", "load_probe_source": "directions", "find_probes": "directions",
    "make_edit": "directions", "ProbeSource": "directions",
    "InterventionResult": "run", "intervene": "run", "pooled_states": "readouts", "Unit": "readouts",
    "Settings": "settings", "EditSource": "source", "SOURCES": "source", "ProbeDirections": "probe_edits",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'babelprobe.interventions' has no attribute {name!r}")
    return getattr(importlib.import_module(f"babelprobe.interventions.{_EXPORTS[name]}"), name)
