"""Latent language and cross-lingual alignment, computed from activation stores and the model.

Modules: `tokens` (which tokens can begin a word, the script of a token), `lens` (the logit lens with
language attribution: `lens_table`, `meta_lens`, curves and the join with compare), `align` (retrieval,
linear CKA and cosine between parallel items of different languages, by layer), `outcomes` (a compare
directory's accuracies and probe F1, and the correlation both use). Figures for both are in
`babelprobe/analysis/latent.py`; the commands are `babelprobe lens` and `babelprobe align`.
"""
