"""`babelprobe score direct|meta`: score minimal pairs with a model's own sentence probabilities (direct)
or by asking it which concept has the property (meta)."""

from __future__ import annotations

import pandas as pd

from babelprobe.analysis.summary import accuracy_pivot, format_pivot
from babelprobe.benchmarks.direct import REDUCTIONS, score_direct
from babelprobe.benchmarks.meta import RULES, meta_requests, position_bias, score_meta
from babelprobe.cli.common import add_items_options, add_model_options, items_from
from babelprobe.cli.extract import add_placement_options, placed_model
from babelprobe.runs import score_resumably
from babelprobe.tables import check_output


def register(sub) -> None:
    parser = sub.add_parser("score", help="score minimal pairs (direct, meta)", description=__doc__)
    methods = parser.add_subparsers(dest="method", metavar="METHOD", required=True)
    direct = methods.add_parser(
        "direct", help="compare the log-probabilities of the two sentences of each pair",
        description="Score each pair by the sum of its tokens' log-probabilities given BOS (or a reduction); "
        "write one row per pair and print accuracy per language × subset.")
    add_model_options(direct)
    add_placement_options(direct)
    add_items_options(direct)
    add_scoring_options(direct)
    direct.add_argument("--reduction", choices=REDUCTIONS, default="sum",
                        help="sum (default), mean per token, per character or per UTF-8 byte")
    direct.add_argument("--conditional", action="store_true",
                        help="score only the continuation (property phrase) given its prefix")
    direct.add_argument("--out", required=True, metavar="FILE", help="result table (.csv or .parquet)")
    direct.set_defaults(func=run_direct)
    add_meta_parser(methods)


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
    check_output(args.out)  # before the work, not after it
    items = items_from(args)
    lm = placed_model(args)  # one device, or several with --device-map
    settings = {"reduction": args.reduction, "conditional": args.conditional, "truncate": args.truncate}
    results = score_resumably(
        lambda chunk: score_direct(lm, chunk, batch_tokens=args.batch_tokens, padding_side=args.padding_side,
                                   progress=False, **settings),
        items, args.out, {"method": "direct", "fingerprint": lm.fingerprint, **settings},
        progress=not args.no_progress, desc="direct")
    print(format_pivot(accuracy_pivot(results), f"direct accuracy ({args.reduction}), language × subset:"))
    print(f"wrote {len(results)} pairs to {args.out}")
    return 0


def add_meta_parser(methods) -> None:
    meta = methods.add_parser(
        "meta", help="ask which concept has the property and compare the answers' log-probabilities",
        description="Metalinguistic prompting (XCOMPS Figure 8): ask 'Which concept is most likely to have the "
        "following property: \"P\", \"A\" or \"B\"? Answer: \"' in the items' language, in both option orders, and "
        "score each concept as the answer. Writes one row per pair (method=meta; text_good/text_bad are the "
        "concept words) and prints accuracy per language × subset and the position bias per language.")
    add_model_options(meta)
    add_placement_options(meta)
    add_items_options(meta)
    group = meta.add_argument_group("meta prompt")
    group.add_argument("--rule", choices=RULES, default="sum",
                       help="when a pair is correct: sum (default; good − bad summed over both orders > 0), "
                       "both (good wins in both orders), first (only the order with the acceptable concept first)")
    group.add_argument("--reduction", choices=REDUCTIONS, default="sum",
                       help="of the answer's token log-probs: sum (default), mean per token, per character or per byte")
    group.add_argument("--no-close-quote", action="store_true",
                       help="score the bare concept word, not the word with its closing quote (the complete answer)")
    group.add_argument("--chat-template", action="store_true",
                       help="wrap the question in the model's chat template (user turn) and start the assistant "
                       "turn with the answer prefix; for instruction-tuned models")
    group.add_argument("--chat-template-file", metavar="FILE.jinja",
                       help="use this Jinja chat template instead of the model's (implies --chat-template)")
    group.add_argument("--prompts", default="xcomps", metavar="NAME|FILE.tsv",
                       help="prompt set: bundled 'xcomps' (default) or a .tsv of templates (see data/prompts/README.md)")
    group.add_argument("--prompt-language", metavar="CODE",
                       help="ask every item with this language's template (default: the item's own language)")
    group.add_argument("--no-share-prefix", action="store_true",
                       help="score every prompt+answer separately instead of running each prompt once (slower; "
                       "same numbers, for checking)")
    add_scoring_options(meta)
    meta.add_argument("--out", required=True, metavar="FILE", help="result table (.csv or .parquet)")
    meta.set_defaults(func=run_meta)


def run_meta(args) -> int:
    check_output(args.out)  # before the work, not after it
    chat = args.chat_template_file or args.chat_template
    items = items_from(args)
    meta_requests(items, args.prompts, args.prompt_language)  # bad items or prompts: fail before loading the model
    lm = placed_model(args)  # one device, or several with --device-map
    settings = {"rule": args.rule, "reduction": args.reduction, "close_quote": not args.no_close_quote,
                "chat_template": chat, "prompts": args.prompts, "prompt_language": args.prompt_language,
                "truncate": args.truncate}
    results = score_resumably(
        lambda chunk: score_meta(lm, chunk, share_prefix=not args.no_share_prefix, batch_tokens=args.batch_tokens,
                                 padding_side=args.padding_side, progress=False, **settings),
        items, args.out, {"method": "meta", "fingerprint": lm.fingerprint, **settings},
        progress=not args.no_progress, desc="meta")
    title = f"meta accuracy (rule {args.rule}, {args.reduction}, {results['prompt_format'].iloc[0]} prompt), language × subset:"
    print(format_pivot(accuracy_pivot(results), title))
    bias = pd.concat([position_bias(results), position_bias(results, by=None).assign(language="all")])
    print(format_pivot(bias.set_index("language")[["n", "first_rate", "first_ci_low", "first_ci_high",
                                                   "accuracy_gf", "accuracy_bf", "consistent"]],
                       "position bias (first_rate: share of answers where the first-listed concept won; 0.5 = none):"))
    print(f"wrote {len(results)} pairs to {args.out}")
    return 0
