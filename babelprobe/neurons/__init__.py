"""Language-specific neurons (Tang et al. 2024, LAPE): find them in one pass, switch them off.

    stats = neuron_stats(lm, items)             # mlp: counts inside the forward pass, nothing per token
    lape = select_lape(stats)                   # lape: LAPE, τ, the selection, the files
    with deactivated(lm, lape.neurons("zh")):   # mlp: the neurons' activation set to 0
        score_direct(lm, items)
    language_neurons("default", "xcomps-sample", "neu/")   # run: `babelprobe neurons`

Modules: `mlp` (where each architecture's MLP activation is, the counting and switching-off hooks),
`lape` (the definitions and the files), `settings`, `run` (the command's runner), `edits` (the edit
source of `babelprobe intervene --method neurons`). Figures and the report: `babelprobe.analysis.neurons`.
It composes models, the interventions runner and the scorers, so it sits at the comparison layer
(docs/design.md "Layers"). Names are imported when first used.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "neuron_stats": "run", "language_neurons": "run", "NeuronsResult": "run", "read_run": "run",
    "select_lape": "lape", "NeuronStats": "lape", "Lape": "lape", "lape_scores": "lape",
    "deactivated": "mlp", "Deactivation": "mlp", "NeuronCounter": "mlp", "Settings": "settings",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'babelprobe.neurons' has no attribute {name!r}")
    return getattr(importlib.import_module(f"babelprobe.neurons.{_EXPORTS[name]}"), name)
