"""`babelprobe score direct|meta`: score minimal pairs with a model's own sentence probabilities (direct)
or by asking it which concept has the property (meta)."""

from __future__ import annotations

from babelprobe.benchmarks.scoring import DirectSettings, MetaSettings
from babelprobe.cli.common import (
    add_items_options,
    add_model_options,
    add_runtime_options,
    add_settings_options,
    items_from,
    runtime_from,
    settings_from,
)
from babelprobe.cli.extract import add_placement_options, check_placement, placed_model


def register(sub) -> None:
    parser = sub.add_parser("score", help="score minimal pairs (direct, meta)", description=__doc__)
    methods = parser.add_subparsers(dest="method", metavar="METHOD", required=True)
    direct = methods.add_parser(
        "direct", help="compare the log-probabilities of the two sentences of each pair",
        description="Score each pair by the sum of its tokens' log-probabilities given BOS (or a reduction); "
        "write one row per pair and print accuracy per language × subset.")
    add_common(direct, DirectSettings, "direct scoring settings")
    direct.add_argument("--no-share-prefix", action="store_true",
                        help="score every text in plain batches instead of running the starts texts share once "
                        "(slower; the same numbers up to float rounding, for checking)")
    direct.set_defaults(func=run)
    meta = methods.add_parser(
        "meta", help="ask which concept has the property and compare the answers' log-probabilities",
        description="Metalinguistic prompting (XCOMPS Figure 8): ask 'Which concept is most likely to have the "
        "following property: \"P\", \"A\" or \"B\"? Answer: \"' in the items' language, in both option orders, and "
        "score each concept as the answer. Writes one row per pair (method=meta; text_good/text_bad are the "
        "concept words) and prints accuracy per language × subset and the position bias per language.")
    add_common(meta, MetaSettings, "meta prompt settings")
    meta.add_argument("--no-share-prefix", action="store_true",
                      help="score every prompt+answer separately instead of running each prompt once (slower; same "
                      "numbers, for checking)")
    meta.set_defaults(func=run)


def add_common(parser, settings_class, title: str) -> None:
    add_model_options(parser)
    add_placement_options(parser)
    add_items_options(parser)
    add_settings_options(parser, settings_class, title)
    add_runtime_options(parser, ("batch_tokens", "progress"))
    group = next(g for g in parser._action_groups if g.title == "running (does not change the numbers)")
    group.add_argument("--padding-side", choices=("right", "left"), default="right",
                       help="padding side (results do not depend on it)")
    parser.add_argument("--out", required=True, metavar="FILE", help="result table (.csv or .parquet)")


def run(args) -> int:
    import pandas as pd

    from babelprobe.analysis.summary import accuracy_pivot, format_pivot
    from babelprobe.benchmarks.scoring import score_pairs
    from babelprobe.tables import check_output

    settings = settings_from(args, DirectSettings if args.method == "direct" else MetaSettings)
    check_output(args.out)  # before the work, not after it
    check_placement(args)  # placement flags that do not go together: before the model loads
    items = items_from(args)
    if args.method == "meta":
        from babelprobe.benchmarks.meta import meta_requests

        meta_requests(items, settings.prompts, settings.prompt_language)  # bad items or prompts: before the model
    elif settings.conditional:
        from babelprobe.benchmarks.direct import _score_from

        _score_from(items)  # items without prefix and continuation (MultiBLiMP's not always filled): before the model
    lm = placed_model(args)  # one device, or several with --device-map
    results = score_pairs(items, args.out, settings, runtime_from(args, model=lm), padding_side=args.padding_side,
                          share_prefix=not getattr(args, "no_share_prefix", False))
    if args.method == "direct":
        print(format_pivot(accuracy_pivot(results), f"direct accuracy ({settings.reduction}), language × subset:"))
    else:
        from babelprobe.benchmarks.meta import position_bias

        title = (f"meta accuracy (rule {settings.rule}, {settings.reduction}, {results['prompt_format'].iloc[0]} "
                 "prompt), language × subset:")
        print(format_pivot(accuracy_pivot(results), title))
        bias = pd.concat([position_bias(results), position_bias(results, by=None).assign(language="all")])
        print(format_pivot(bias.set_index("language")[["n", "first_rate", "first_ci_low", "first_ci_high",
                                                       "accuracy_gf", "accuracy_bf", "consistent"]],
                           "position bias (first_rate: share of answers where the first-listed concept won; "
                           "0.5 = none):"))
    print(f"wrote {len(results)} pairs to {args.out}")
    return 0
