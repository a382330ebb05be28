"""An SAE-feature view per language: which sparse-autoencoder features are specific to a language, how
well the SAE reconstructs each language, whether a few features carry what a dense probe reads, and
what removing a language's features does to the model's judgement of the same pairs.

    import babelprobe as bp
    sae = bp.load_sae("saes/l6")                        # Gemma Scope 2 or SAELens folder, read offline
    stats = bp.sae_stats(lm, items, sae)                # per-language sums in one forward pass
    result = bp.sae_features(lm, items, sae, "sae/", acts="acts/")   # features, fit, sparse probes, ablation

Modules, one job each: `weights` (the two folder layouts, encode/decode, saving), `fetch` (a published
SAE from the Hugging Face hub), `stats` (the forward pass and monolinguality), `train` (a small L1 SAE
on a store), `sparse` (offline codes and sparse probes), `run` (the `babelprobe sae` run directory).
Feature ablation is an edit source of the interventions runner (`babelprobe.interventions`). This
package composes models, extraction, probes and interventions, so it sits at the comparison layer
(docs/design.md "Layers"). Importing the package imports none of them: the CLI builds its flags from
`babelprobe.sae.settings` without torch.
"""
