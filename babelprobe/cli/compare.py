"""`babelprobe compare` (meta, direct and neuro on the same minimal pairs, joined per pair) and `babelprobe
diff` (the difference of two compare directories).

    babelprobe compare --model default --items xcomps-sample --out cmp/
    babelprobe compare --model default --items xcomps-sample --protocol paper --out cmp-paper/
    babelprobe diff cmp-base/ cmp-instruct/ --out diff/                  # instruct − base, as a table
    babelprobe report --results cmp-base/ --other cmp-instruct/        # ... and the XCOMPS Figs. 9 and 13

--protocol paper runs the XCOMPS paper's probing protocol: stratified 5-fold cross-validation (the two
sentences of a pair may fall in different folds), F1 averaged over the folds, neuro = the maximum over
layers; a flag that contradicts it is an error. The default keeps the sentences of a pair in one fold.
Either is recorded in compare.json, neuro.settings.json and the protocol column of summary.csv and
layers.csv (docs/fidelity.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from babelprobe.cli.common import (
    add_items_options,
    add_model_options,
    add_runtime_options,
    add_settings_options,
    items_from,
    runtime_from,
    settings_from,
)
from babelprobe.comparison import PROTOCOLS, CompareSettings
from babelprobe.extract.settings import BACKENDS


def register(sub) -> None:
    parser = sub.add_parser("compare", help="meta + direct + neuro on the same items, joined per pair",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    add_items_options(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    add_settings_options(parser, CompareSettings, "comparison settings (recorded in compare.json)", PROTOCOLS)
    group = parser.add_argument_group("the store (does not change the numbers)")
    group.add_argument("--acts", metavar="DIR", help="activation store to use or create (default OUT/acts)")
    group.add_argument("--backend", choices=BACKENDS, default="hf", help="extraction backend if a store must be made")
    group.add_argument("--diff", nargs=2, metavar=("BASE", "OTHER"), help=argparse.SUPPRESS)  # now `babelprobe diff`
    add_runtime_options(parser, ("batch_tokens", "overwrite", "progress"))
    parser.set_defaults(func=run)

    diff = sub.add_parser("diff", help="the difference OTHER − BASE of two compare directories",
                          description="Per language × subset × method × metric, OTHER − BASE of two compare "
                          "directories of the same items (e.g. instruct − base), with paired bootstrap intervals for "
                          "accuracy differences; writes OUT/difference.csv.")
    diff.add_argument("base", metavar="BASE", help="compare directory of the base model")
    diff.add_argument("other", metavar="OTHER", help="compare directory of the other model")
    diff.add_argument("--out", required=True, metavar="DIR", help="output directory (difference.csv)")
    diff.set_defaults(func=run_diff)


def run(args) -> int:
    if args.diff:  # the old spelling of `babelprobe diff`
        args.base, args.other = args.diff
        return run_diff(args)
    from babelprobe.comparison import compare
    from babelprobe.tables import check_out_dir

    settings = settings_from(args, CompareSettings, PROTOCOLS)  # settings, out and items: before any model work
    check_out_dir(args.out)
    items = items_from(args)
    source = {"source": args.items, "languages": args.languages, "subsets": args.subsets, "limit": args.limit,
              "language": args.language}
    result = compare(items, args.out, settings, runtime_from(args), acts=args.acts, backend=args.backend,
                     source=source)
    print(f"protocol {settings.protocol}: {settings.description}")
    print(_summary_text(result))
    print(f"wrote items.csv ({len(result.items)} pairs), summary.csv, layers.csv, correlations.csv, "
          f"agreement.csv to {args.out}" + (f"; figures {', '.join(result.figures)} in {Path(args.out) / 'figures'}"
                                            if result.figures else ""))
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


def run_diff(args) -> int:
    from babelprobe.comparison import diff

    table = diff(args.base, args.out, other=args.other)  # both compare directories checked before anything is written
    shown = table.pivot_table(index="language", columns=["method", "metric"], values="difference")
    print(f"{args.other} − {args.base} (mean over subsets):\n{shown.to_string(float_format=lambda v: f'{v:+.3f}')}")
    print(f"wrote {Path(args.out) / 'difference.csv'}")
    return 0
