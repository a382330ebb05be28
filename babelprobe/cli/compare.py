"""`babelprobe compare`: meta, direct and neuro on the same minimal pairs, joined per pair.

    babelprobe compare --model default --items xcomps-sample --out cmp/
    babelprobe compare --model default --items xcomps-sample --protocol paper --out cmp-paper/
    babelprobe compare --diff cmp-base/ cmp-instruct/ --out diff/      # instruct − base, as a table
    babelprobe report --results cmp-base/ --other cmp-instruct/        # ... and the XCOMPS Figs. 9 and 13

--protocol paper runs the XCOMPS paper's probing protocol: stratified 5-fold cross-validation (the two
sentences of a pair may fall in different folds), F1 averaged over the folds, neuro = the maximum over
layers. The default keeps the sentences of a pair in one fold. Either is recorded in compare.json,
neuro.settings.json and the protocol column of summary.csv and layers.csv (docs/fidelity.md).
"""

from __future__ import annotations

from pathlib import Path

from babelprobe.cli.common import add_items_options, add_model_options, items_from, model_from
from babelprobe.errors import BabelprobeError
from babelprobe.tables import write_table


def register(sub) -> None:
    parser = sub.add_parser("compare", help="meta + direct + neuro on the same items, joined per pair",
                            description=__doc__, formatter_class=_raw())
    add_model_options(parser)
    add_items_options(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--protocol", choices=("default", "paper"), default="default",
                        help="paper: the XCOMPS paper's probing protocol (stratified 5-fold, F1 over folds, max over "
                        "layers); default: folds that keep each pair together")
    parser.add_argument("--layer", default=None,
                        help="neuro layer per pair: 'peak' (each group's best layer, default) or a number")
    parser.add_argument("--rule", choices=("sum", "both", "first"), default="sum",
                        help="meta: how the two option orders decide a pair (see `score meta --help`)")
    parser.add_argument("--reduction", default="sum", help="meta and direct score reduction (default sum)")
    parser.add_argument("--prompts", default="xcomps", metavar="NAME|FILE.tsv",
                        help="meta prompt set: 'xcomps' (XCOMPS Figure 8, default), 'xcomps-babelprobe' or a .tsv")
    parser.add_argument("--folds", type=int, default=None, help="probe cross-validation folds (default 5)")
    parser.add_argument("--fold-scheme", choices=("grouped", "plain"), default=None,
                        help="probe folds: grouped (pairs kept together; the default protocol) or plain (stratified "
                        "k-fold; the paper protocol)")
    parser.add_argument("--seed", type=int, default=0, help="probe fold and bootstrap seed")
    parser.add_argument("--acts", metavar="DIR", help="activation store to use or create (default OUT/acts)")
    parser.add_argument("--backend", default="hf", help="extraction backend if a store must be made")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="token budget per batch")
    parser.add_argument("--overwrite", action="store_true", help="replace results of another model or item set")
    parser.add_argument("--diff", nargs=2, metavar=("BASE", "OTHER"),
                        help="instead of running: difference OTHER − BASE of two compare directories")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def _raw():
    import argparse

    return argparse.RawDescriptionHelpFormatter


def run(args) -> int:
    if args.diff:
        return _run_diff(args)
    from babelprobe.analysis.xcomps import DESCRIPTIONS, protocol_dtype, protocol_settings
    from babelprobe.comparison import compare

    protocol_settings(args.protocol, folds=args.folds, fold_scheme=args.fold_scheme, layer=args.layer)  # before work
    args.dtype = protocol_dtype(args.protocol, args.dtype, args.device)  # the paper: float16 on CUDA
    items = items_from(args)
    source = {"source": args.items, "languages": args.languages, "subsets": args.subsets, "limit": args.limit,
              "language": args.language}
    result = compare(model_from(args), items, args.out, protocol=args.protocol, layer=args.layer, rule=args.rule,
                     reduction=args.reduction, prompts=args.prompts, folds=args.folds, fold_scheme=args.fold_scheme,
                     seed=args.seed, acts=args.acts, backend=args.backend, batch_tokens=args.batch_tokens,
                     source=source, overwrite=args.overwrite, progress=not args.no_progress)
    print(f"protocol {args.protocol}: {DESCRIPTIONS[args.protocol]}")
    print(_summary_text(result))
    print(f"wrote items.csv ({len(result.items)} pairs), summary.csv, layers.csv, correlations.csv, "
          f"agreement.csv to {args.out}")
    return 0


def _summary_text(result) -> str:
    from babelprobe.analysis.methods import primary

    main = primary(result.summary)
    by_language = main.pivot_table(index="language", columns="method", values="value")
    by_subset = main.pivot_table(index="subset", columns="method", values="value")
    fmt = lambda v: f"{v:.3f}"  # noqa: E731
    corr = result.correlations[["method_a", "method_b", "n_cells", "pearson_r", "pearson_low", "pearson_high",
                                "spearman_rho"]]
    return ("meta and direct: pair accuracy; neuro: probe F1 at each group's layer (mean over subsets)\n"
            f"{by_language.to_string(float_format=fmt)}\n\n{by_subset.to_string(float_format=fmt)}\n\n"
            f"correlation across language × subset cells:\n{corr.to_string(index=False, float_format=fmt)}")


def _run_diff(args) -> int:
    from babelprobe.comparison import compare_models

    base, other = args.diff
    for path in (base, other):
        if not Path(path).is_dir():
            raise BabelprobeError(f"--diff: {path} is not a directory")
    diff = compare_models(base, other)
    write_table(diff, Path(args.out) / "difference.csv")
    table = diff.pivot_table(index="language", columns=["method", "metric"], values="difference")
    print(f"{other} − {base} (mean over subsets):\n{table.to_string(float_format=lambda v: f'{v:+.3f}')}")
    print(f"wrote {Path(args.out) / 'difference.csv'}")
    return 0
