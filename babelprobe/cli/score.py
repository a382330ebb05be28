"""`babelprobe score direct`: score minimal pairs with a model's own sentence probabilities."""

from __future__ import annotations

from babelprobe.analysis.summary import accuracy_pivot, format_pivot
from babelprobe.benchmarks.direct import REDUCTIONS, score_direct
from babelprobe.cli.common import add_items_options, add_model_options, items_from, model_from
from babelprobe.tables import write_table


def register(sub) -> None:
    parser = sub.add_parser("score", help="score minimal pairs (direct)", description=__doc__)
    methods = parser.add_subparsers(dest="method", metavar="METHOD", required=True)
    direct = methods.add_parser(
        "direct", help="compare the log-probabilities of the two sentences of each pair",
        description="Score each pair by the sum of its tokens' log-probabilities given BOS (or a reduction); "
        "write one row per pair and print accuracy per language × subset.")
    add_model_options(direct)
    add_items_options(direct)
    add_scoring_options(direct)
    direct.add_argument("--reduction", choices=REDUCTIONS, default="sum",
                        help="sum (default), mean per token, per character or per UTF-8 byte")
    direct.add_argument("--conditional", action="store_true",
                        help="score only the continuation (property phrase) given its prefix")
    direct.add_argument("--out", required=True, metavar="FILE", help="result table (.csv or .parquet)")
    direct.set_defaults(func=run_direct)


def add_scoring_options(parser) -> None:
    group = parser.add_argument_group("scoring")
    group.add_argument("--batch-tokens", type=int, default=4096, metavar="N",
                       help="token budget per batch (batch size × longest text; default 4096)")
    group.add_argument("--padding-side", choices=("right", "left"), default="right",
                       help="padding side (results do not depend on it)")
    group.add_argument("--truncate", action="store_true",
                       help="keep the first tokens of a text longer than the context (recorded) instead of stopping")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_direct(args) -> int:
    items = items_from(args)
    results = score_direct(model_from(args), items, reduction=args.reduction, conditional=args.conditional,
                           batch_tokens=args.batch_tokens, padding_side=args.padding_side,
                           truncate=args.truncate, progress=not args.no_progress)
    write_table(results, args.out)
    print(format_pivot(accuracy_pivot(results), f"direct accuracy ({args.reduction}), language × subset:"))
    print(f"wrote {len(results)} pairs to {args.out}")
    return 0
