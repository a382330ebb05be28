"""`babelprobe neurons`: language-specific neurons by LAPE (Tang et al. 2024), counted in one pass.

    babelprobe neurons --model default --items xcomps-sample --out neu/
    babelprobe neurons --model default --corpus wiki/ --languages en,zh,ja --top-rate 0.01,0.05 --out neu/
    babelprobe neurons --model default --protocol paper --corpus udhr --out neu/      # Tang et al.'s counting
    babelprobe intervene --method neurons --neurons neu/ --off en,zh --readouts direct,meta --out neu/deact/
    babelprobe report --results neu/

Counts, per MLP neuron (gated MLPs: act_fn(gate_proj(x)); GPT-2: mlp.act) and language, the tokens on
which its activation is > 0, over every real token but BOS of the items' texts (or of --corpus
DIR/<lang>.txt, cut into rows of --window tokens). p = count / tokens; LAPE = the entropy of p
normalised over languages; the round(top_rate·L·I) neurons of lowest LAPE whose p exceeds τ (the 95%
quantile of all p) in some language are selected, and each belongs to the languages whose p exceeds it
(released identify.py). Writes activation.h5 (the counts, plain HDF5), lape.csv (one row per neuron),
neurons.csv (selected per language and layer), neurons.json and figures/ (lape_layers, lape_overlap).
Every language needs at least --min-tokens tokens.
"""

from __future__ import annotations

from babelprobe.cli.common import (
    add_items_options,
    add_model_options,
    add_runtime_options,
    add_settings_options,
)


def register(sub) -> None:
    import argparse

    from babelprobe.neurons.settings import Settings

    parser = sub.add_parser("neurons", help="language-specific neurons (LAPE): counts, selection, figures",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    add_items_options(parser)
    parser.set_defaults(items=None)  # xcomps-sample unless --corpus
    group = parser.add_argument_group("inputs and output")
    group.add_argument("--corpus", metavar="SOURCE", help="count a text corpus's training part instead of items: udhr "
                       "(bundled), a folder of <lang>.txt, a .parquet/.jsonl with text and language, hf:ORG/NAME")
    group.add_argument("--out", required=True, metavar="DIR", help="output directory")
    group.add_argument("--min-tokens", type=int, default=1000, metavar="N",
                       help="fewest tokens a language may have (default 1000)")
    add_settings_options(parser, Settings, "LAPE settings (recorded in neurons.json)")
    add_runtime_options(parser, ("batch_tokens", "overwrite", "progress"), batch_tokens=8192)
    parser.set_defaults(func=run)


def run(args) -> int:
    from babelprobe.cli.common import items_from, runtime_from, settings_from
    from babelprobe.errors import BabelprobeError
    from babelprobe.neurons.run import language_neurons
    from babelprobe.neurons.settings import Settings

    settings = settings_from(args, Settings)
    if args.corpus is not None and (args.items is not None or args.subsets or args.limit or args.language):
        raise BabelprobeError("--corpus counts text files: --items, --subsets, --limit and --language do not go with it")
    if args.corpus is None:
        args.items = args.items or "xcomps-sample"
    items = items_from(args) if args.corpus is None else None
    result = language_neurons(items, args.out, settings, runtime_from(args), corpus=args.corpus,
                              languages=args.languages if args.corpus else None, min_tokens=args.min_tokens)
    lape, stats = result.lape, result.stats
    print(f"τ = {lape.tau:.4g}, τ_bar = {lape.bar:.4g}; tokens: " +
          ", ".join(f"{c} {n}" for c, n in zip(stats.languages, stats.n_tokens)))
    counts = lape.counts[lape.counts["top_rate"] == lape.top_rates[0]]
    table = counts.pivot_table(index="layer", columns="language", values="n_selected", aggfunc="sum")
    print(f"selected neurons per layer and language (top rate {lape.top_rates[0]:g}, {lape.n_selected()} of "
          f"{lape.n_layers * lape.width}):")
    print(table.to_string())
    print("overlap (Jaccard):")
    print(lape.jaccard().round(2).to_string())
    print(f"wrote activation.h5, lape.csv, neurons.csv and {len(result.figures)} figures to {args.out}")
    return 0
