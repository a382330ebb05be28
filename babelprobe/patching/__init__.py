"""Cross-lingual activation patching (`babelprobe patch`): which layers carry the output language and which
the concept, per pair.

    from babelprobe.patching import patch_translation, patch_pairs
    result = patch_translation("default", "xcomps-sample", out="patch/")   # Dumas et al. 2025, exp1 and exp2
    result = patch_pairs("default", "xcomps-sample", "en", out="patch/")   # minimal pairs, recovery by layer

Modules, one job each: `settings` (what changes the numbers), `core` (the patched forward passes, on the
interventions' hooks: `interventions.edits.Patch`), `translation` (the paper's protocol), `pairs` (the
minimal-pair join), `run` (the runners: checks, run directory, tables, figures). Summaries, figures and
the report: `babelprobe.analysis.patching`. This package composes models, the direct scorer and the
interventions, so it sits at the comparison layer (docs/design.md "Layers").
"""

from babelprobe.lazy import lazy_exports

_EXPORTS = {
    "patch_translation": "run", "patch_pairs": "run", "TranslationResult": "run", "PairsResult": "run",
    "TranslationSettings": "settings", "PairsSettings": "settings", "PAPER_LANGUAGES": "settings",
    "Target": "core", "patched_copies": "core", "read_states": "core", "token_set_probs": "core",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
