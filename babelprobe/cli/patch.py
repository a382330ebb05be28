"""`babelprobe patch`: cross-lingual activation patching; which layers carry the output language and which
the concept, per pair.

    babelprobe patch --model default --protocol translation --exp exp1,exp2 --n-pairs 50 --out patch/
    babelprobe patch --model default --protocol pairs --items xcomps-sample --sources en --limit 10 --out patch/
    babelprobe report --results patch/

--protocol translation is Dumas et al., "Separating Tongue from Thought" (ACL 2025), as their released code
runs it: few-shot word-translation prompts (`Français: "chien" - 中文: "`) built from --concepts (a CSV of
concept_id, language, word; default: xcomps-sample's concepts). exp1: the source prompt's last-token
state written into block j's output at the target's last token, one layer j at a time; exp2: the source
concept's state (mean over --source-pairs, and the first pair alone) written at the target concept's last
token into block outputs j..L. Read at the next token: the probability of each concept in each language
(the first token of each of its words, with and without a leading space); pairs whose token sets overlap
are left out; unpatched baselines beside.

--protocol pairs is babelprobe's join with the minimal pairs (items with parallel_id, prefix and
continuation): into each target-language unacceptable item, at its last prefix token, block outputs j..L,
the acceptable item's prefix state from --sources (their mean) is written; recovery r_j = (s_patched −
s_bad)/(s_good − s_bad), s = direct's conditional score. Controls: the target language as source (upper
bound) and another pair's concept (lower bound). --compare DIR sets the recovery against its probe peaks.

Both protocols write into one OUT (patch.json records each one's settings): translation.csv,
translation_pairs.csv, translation_summary.csv, translation_switches.csv; pairs.csv (joins
compare/items.csv on pair_id), summary.csv, onsets.csv; figures/ (patch_translation, patch_recovery,
patch_vs_probe). The same command again reuses finished rows; an interrupted one resumes; a protocol run
again with other settings replaces its own tables (said on stderr) and keeps the other's.
"""

from __future__ import annotations

import argparse

from babelprobe.cli.common import (
    add_items_options,
    add_model_options,
    add_runtime_options,
    add_settings_options,
)
from babelprobe.patching.settings import SHARED, PairsSettings, TranslationSettings

PROTOCOLS = {"translation": TranslationSettings, "pairs": PairsSettings}


def register(sub) -> None:
    parser = sub.add_parser("patch", help="activation patching across languages: where the language and where the "
                            "concept are carried", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    parser.add_argument("--protocol", dest="patch_protocol", required=True, choices=tuple(PROTOCOLS),
                        help="translation (Dumas et al. 2025, exp1/exp2) or pairs (minimal pairs, recovery by layer)")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (both protocols can share it)")
    parser.add_argument("--concepts", metavar="NAME|FILE",
                        help="translation: concept words, a CSV of concept_id, language, word (default xcomps-sample)")
    add_items_options(parser)
    parser.set_defaults(items=None)  # pairs: xcomps-sample unless given; translation: refused
    parser.add_argument("--compare", metavar="DIR", help="pairs: a compare directory; its probe peaks beside the recovery")
    add_settings_options(parser, TranslationSettings, "settings shared by both protocols and translation settings "
                         "(recorded in patch.json)")
    add_settings_options(parser, PairsSettings, "pairs settings (recorded in patch.json)", skip=SHARED)
    add_runtime_options(parser, ("batch_tokens", "overwrite", "progress"))
    parser.set_defaults(func=run)


def _check_flags(args) -> None:
    """A flag of the other protocol is an error naming it (it would be ignored)."""
    from babelprobe.errors import BabelprobeError
    from babelprobe.settings import flag, flat_fields

    other = "pairs" if args.patch_protocol == "translation" else "translation"
    own = set(flat_fields(PROTOCOLS[args.patch_protocol]))  # the shared block's are both protocols' own
    for name in flat_fields(PROTOCOLS[other]):
        if name not in own and hasattr(args, name):
            raise BabelprobeError(f"{flag(PROTOCOLS[other], name)} applies to --protocol {other}")
    given = {"--concepts": args.concepts is not None, "--compare": args.compare is not None,
             "--items": args.items is not None, "--languages": args.languages is not None,
             "--subsets": args.subsets is not None, "--limit": args.limit is not None,
             "--language": args.language is not None}
    wrong = ["--concepts"] if args.patch_protocol == "pairs" else [k for k in given if k != "--concepts"]
    for name in wrong:
        if given[name]:
            raise BabelprobeError(f"{name} applies to --protocol {other}")


def run(args) -> int:
    from babelprobe.cli.common import runtime_from, settings_from
    from babelprobe.patching.run import patch_pairs, patch_translation

    _check_flags(args)
    settings = settings_from(args, PROTOCOLS[args.patch_protocol])
    runtime = runtime_from(args)
    if args.patch_protocol == "translation":
        result = patch_translation(args.concepts or "xcomps-sample", args.out, settings, runtime)
        for name, info in result.info.items():
            n = result.rows.loc[result.rows["config"] == name, "pair_idx"].nunique()
            print(f"{info['exp']} {name}: {n} pairs ({info['candidates']} candidates looked at, "
                  f"{info['unusable_prompts']} with a prompt whose concept could not be cut from its quote)")
        print("layers where patching moved the output language / the concept (mean over pairs):")
        print(result.switches.to_string(index=False))
        print(f"wrote translation.csv ({len(result.rows)} rows), translation_pairs.csv, translation_summary.csv, "
              f"translation_switches.csv and {len(result.figures)} figure(s) to {args.out}")
        return 0
    result = patch_pairs(_pairs_items(args, settings.sources), args.out, settings, runtime, compare=args.compare,
                         languages=args.languages)
    print(f"check: the patch runs' unpatched copies match direct's scores of the bad items within {result.check:.1e}")
    for note in result.notes:
        print(f"note: {note}")
    print("per target language, the layers j whose median recovery (patching j..L) is at least 0.5:")
    print(result.onsets.to_string(index=False))
    print(f"wrote pairs.csv ({len(result.rows)} rows), summary.csv, onsets.csv and {len(result.figures)} figure(s) "
          f"to {args.out}")
    return 0


def _pairs_items(args, sources):
    """The items: the selection given, with the source languages' items added (their states are written)."""
    from babelprobe.items import load_items

    languages = args.languages
    if languages:
        languages = [*languages, *(s for s in sources if s not in languages)]
    return load_items(args.items or "xcomps-sample", languages=languages, subsets=args.subsets, limit=args.limit,
                      language=args.language)
