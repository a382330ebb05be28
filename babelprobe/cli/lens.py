"""`babelprobe lens`: the logit lens with language attribution, layer by layer.

    babelprobe lens --model default --items xcomps-sample --out lens/ --compare cmp/
    babelprobe lens --model default --acts acts/ --target answer --out lens/   # states already stored

By default every pair's meta question (in its language, both option orders) is run once and stored
(OUT/states); the lens then reads each layer's last-token state through the model's final norm and
unembedding and asks how probable the acceptable concept is in the item's language and in the pivot
(English; the counterpart is found through `parallel_id`). With --acts it reads a store you made; its
items' --target field is the expected answer (none: entropy and top-k tokens only).

Writes to OUT: lens.csv (item × layer), curves.csv (language × layer, 95% bootstrap bands over pairs),
turns.csv (per language: the layers where the pivot answer leads), pairs.csv (per pair; with --compare
joined with meta/direct/neuro correctness), languages.csv and pair_correlations.csv (with --compare),
lens.json (settings and the last-layer check against the model's own logits) and figures/.
"""

from __future__ import annotations

import argparse

from babelprobe.cli.common import (
    add_alias,
    add_items_options,
    add_model_options,
    add_runtime_options,
    add_settings_options,
)
from babelprobe.latent.settings import LensSettings


def register(sub) -> None:
    parser = sub.add_parser("lens", help="logit lens: which language each layer would answer in",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    add_items_options(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    add_alias(parser, "--store", "acts")
    parser.add_argument("--acts", metavar="DIR",
                        help="read this activation store instead of running the meta questions (its items come from "
                        "its manifest, else from --items)")
    parser.add_argument("--compare", metavar="DIR", help="a compare directory to join with (per pair and per language)")
    add_settings_options(parser, LensSettings, "lens settings (recorded in lens.json)")
    add_runtime_options(parser, ("batch_tokens", "overwrite", "progress"))
    parser.set_defaults(func=run)


def run(args) -> int:
    from babelprobe.cli.common import items_source, runtime_from, settings_from
    from babelprobe.latent.run import lens

    settings = settings_from(args, LensSettings)
    result = lens(items_source(args, also=settings.pivot), args.out, settings, runtime_from(args), acts=args.acts,
                  compare=args.compare)
    print(_summary(result, settings.pivot))
    print(f"wrote lens.csv ({len(result.table)} rows), curves.csv, turns.csv, pairs.csv"
          f"{', languages.csv, pair_correlations.csv' if args.compare else ''} and {len(result.figures)} figures to "
          f"{args.out}")
    return 0


def _summary(result, pivot) -> str:
    lines = [f"last-layer check: the lens differs from the model's own logits by at most {result.check:.1e} (relative)"
             if result.check == result.check else "last-layer check: not made (the store lacks the last layer)"]
    if len(result.turns):
        shown = result.turns[["language", "pivot_leads", "max_lead_layer", "max_lead", "peak_pivot_layer",
                              "peak_p_pivot", "final_p_own", "final_p_pivot", "n_pairs"]]
        lines.append(f"layers where the answer in {pivot} is more probable than in the item's language "
                     f"(95% interval above 0):\n{shown.to_string(index=False, float_format=lambda v: f'{v:.3f}')}")
    if result.languages is not None:
        lines.append(result.languages.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return "\n\n".join(lines)
