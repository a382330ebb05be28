"""`babelprobe align`: cross-lingual alignment of parallel items, layer by layer.

    babelprobe align --compare cmp/ --out align/            # cmp/acts, correlated with cmp's results
    babelprobe align --store acts/ --out align/             # any store whose items carry parallel_id
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
from pathlib import Path

from babelprobe.cli.common import add_items_options, add_model_options, model_from
from babelprobe.errors import BabelprobeError

OUTPUTS = ("acts", "curves.csv", "matrix.csv", "items.csv", "correlations.csv", "figures")


def register(sub) -> None:
    parser = sub.add_parser("align", help="cross-lingual alignment of parallel items by layer (retrieval, CKA)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    add_items_options(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--store", metavar="DIR", help="activation store to read (default: the compare "
                        "directory's acts/, else OUT/acts extracted with --model)")
    parser.add_argument("--compare", metavar="DIR", help="a compare directory: its store, and its results to correlate with")
    parser.add_argument("--pivot", default="en", help="language every other is retrieved against (default en)")
    parser.add_argument("--pool", choices=("last", "mean"), default="last", help="pooling to read (default last)")
    parser.add_argument("--no-centre", action="store_true", help="do not mean-centre each language's states")
    parser.add_argument("--layer", type=int, metavar="N",
                        help="layer of the language × language figure (default: the best mean retrieval)")
    parser.add_argument("--overwrite", action="store_true", help="replace results of another store or settings")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def run(args) -> int:
    from babelprobe.extract import open_store
    from babelprobe.latent.align import align_layers, alignment_correlations
    from babelprobe.runs import open_run
    from babelprobe.tables import write_table

    out = Path(args.out)
    if args.compare and not Path(args.compare).is_dir():
        raise BabelprobeError(f"--compare: {args.compare} is not a directory")
    store_path = Path(args.store) if args.store else Path(args.compare) / "acts" if args.compare else out / "acts"
    if not args.store and not args.compare:
        _extract(args, store_path)
    store = open_store(store_path)
    items = store.load_items() if (store.manifest.get("items") or {}).get("source") else _items(args)
    run_dir = open_run(out, {"store": str(store_path.resolve()), "items_hash": store.items_hash, "pivot": args.pivot,
                             "pool": args.pool, "centre": not args.no_centre},
                       record={"model": (store.manifest.get("model") or {}).get("model")}, manifest="align.json",
                       overwrite=args.overwrite, outputs=tuple(o for o in OUTPUTS if o != "acts" or not args.store),
                       what="an alignment of another store or settings")
    result = align_layers(store, items, pivot=args.pivot, pool=args.pool, centre=not args.no_centre,
                          progress=not args.no_progress)
    curves, matrix = result["curves"], result["matrix"]
    write_table(curves, out / "curves.csv")
    write_table(matrix, out / "matrix.csv")
    write_table(result["items"], out / "items.csv")
    correlations = None
    if args.compare:
        correlations = alignment_correlations(curves, result["items"], args.compare)
        write_table(correlations, out / "correlations.csv")
    best = int(curves.groupby("layer")["retrieval"].mean().idxmax())
    layer = best if args.layer is None else args.layer
    if layer not in set(matrix["layer"]):
        raise BabelprobeError(f"--layer {layer} is not in the store (layers {matrix['layer'].min()}-{matrix['layer'].max()})")
    figures = _figures(curves, matrix, correlations, layer, out / "figures")
    run_dir.state["matrix_layer"] = layer
    run_dir.save()
    print(_summary(curves, correlations, best))
    print(f"wrote curves.csv, matrix.csv, items.csv{', correlations.csv' if args.compare else ''} and "
          f"{len(figures)} figures to {out}")
    return 0


def _items(args):
    from babelprobe.cli.common import items_from

    return items_from(args)


def _extract(args, path: Path) -> None:
    from babelprobe.extract import extract

    source = {"source": args.items, "languages": args.languages, "subsets": args.subsets, "limit": args.limit}
    extract(model_from(args), _items(args), path, pool=args.pool, overwrite=args.overwrite, source=source,
            progress=not args.no_progress)


def _figures(curves, matrix, correlations, layer, folder: Path) -> list[Path]:
    from babelprobe.analysis.latent import plot_alignment, plot_alignment_correlation, plot_alignment_matrix
    from babelprobe.analysis.style import save

    written = save(plot_alignment(curves), folder / "alignment")
    written += save(plot_alignment_matrix(matrix, layer), folder / "alignment_matrix")
    if correlations is not None and len(correlations):
        written += save(plot_alignment_correlation(correlations), folder / "alignment_correlation")
    return written


def _summary(curves, correlations, best: int) -> str:
    fmt = lambda v: f"{v:.3f}"  # noqa: E731
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
