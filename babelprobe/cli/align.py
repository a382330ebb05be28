"""`babelprobe align`: cross-lingual alignment of parallel items, layer by layer.

    babelprobe align --compare cmp/ --out align/            # cmp/acts, correlated with cmp's results
    babelprobe align --acts acts/ --out align/              # any store whose items carry parallel_id
    babelprobe align --model default --items xcomps-sample --out align/   # extracts into OUT/acts first

Items are matched across languages by `parallel_id`; states are mean-centred per language at every
layer. Per layer: retrieval accuracy of each language's units to the pivot's and back by cosine
(MEXA-style), linear CKA, and each item's cosine to its pivot parallel; the same for every language
pair. Writes to OUT: curves.csv (language × layer, to the pivot), matrix.csv (layer × language ×
language), items.csv (item × layer cosine), correlations.csv (with --compare: alignment against probe
F1 and meta/direct accuracy per language, and against correctness per pair), align.json, figures/.
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
from babelprobe.latent.settings import AlignSettings


def register(sub) -> None:
    parser = sub.add_parser("align", help="cross-lingual alignment of parallel items by layer (retrieval, CKA)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    add_items_options(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    add_alias(parser, "--store", "acts")
    parser.add_argument("--acts", metavar="DIR",
                        help="activation store to read (default: the compare directory's acts/, else OUT/acts "
                        "extracted with --model)")
    parser.add_argument("--compare", metavar="DIR", help="a compare directory: its store, and its results to "
                        "correlate with")
    add_settings_options(parser, AlignSettings, "alignment settings (recorded in align.json)")
    group = parser.add_argument_group("output (does not change the numbers)")
    add_alias(group, "--layer", "matrix_layer", type=int)
    group.add_argument("--matrix-layer", type=int, metavar="N",
                       help="layer of the language × language figure (default: the best mean retrieval)")
    add_runtime_options(parser, ("overwrite", "progress"))
    parser.set_defaults(func=run)


def run(args) -> int:
    from babelprobe.cli.common import items_source, runtime_from, settings_from
    from babelprobe.latent.run import align

    settings = settings_from(args, AlignSettings)
    source = {"source": args.items, "languages": args.languages, "subsets": args.subsets, "limit": args.limit}
    result = align(items_source(args), args.out, settings, runtime_from(args), acts=args.acts, compare=args.compare,
                   matrix_layer=args.matrix_layer, source=source)
    print(_summary(result))
    print(f"wrote curves.csv, matrix.csv, items.csv{', correlations.csv' if args.compare else ''} and "
          f"{len(result.figures)} figures to {args.out}")
    return 0


def _summary(result) -> str:
    fmt = lambda v: f"{v:.3f}"  # noqa: E731
    curves, correlations = result.curves, result.correlations
    best = int(curves.groupby("layer")["retrieval"].mean().idxmax())
    table = curves.pivot_table(index="layer", columns="language", values="retrieval")
    lines = [f"retrieval accuracy with the pivot (mean of both directions; chance {curves['chance'].mean():.3f}), "
             f"states mean-centred per language; best mean layer {best}:\n{table.to_string(float_format=fmt)}"]
    cka = curves.pivot_table(index="layer", columns="language", values="cka")
    lines.append(f"linear CKA with the pivot:\n{cka.to_string(float_format=fmt)}")
    if correlations is not None and len(correlations):
        shown = correlations[(correlations["level"] == "language") & (correlations["alignment"] == "retrieval")]
        shown = shown.pivot_table(index="layer", columns="outcome", values="spearman_rho")
        lines.append(f"Spearman ρ across languages, retrieval vs outcome:\n{shown.to_string(float_format=fmt)}")
    return "\n\n".join(lines)
