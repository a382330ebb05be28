"""`babelprobe lens`: the logit lens with language attribution, layer by layer.

    babelprobe lens --model default --items xcomps-sample --out lens/ --compare cmp/
    babelprobe lens --model default --store acts/ --target answer --out lens/   # states already stored

By default every pair's meta question (in its language, both option orders) is run once and stored
(OUT/states); the lens then reads each layer's last-token state through the model's final norm and
unembedding and asks how probable the acceptable concept is in the item's language and in the pivot
(English; the counterpart is found through `parallel_id`). With --store it reads a store you made; its
items' --target field is the expected answer (none: entropy and top-k tokens only).

Writes to OUT: lens.csv (item × layer), curves.csv (language × layer, 95% bootstrap bands over pairs),
turns.csv (per language: the layers where the pivot answer leads), pairs.csv (per pair; with --compare
joined with meta/direct/neuro correctness), languages.csv and pair_correlations.csv (with --compare),
lens.json (settings and the last-layer check against the model's own logits) and figures/.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from babelprobe.cli.common import add_items_options, add_model_options, comma_list, model_from
from babelprobe.errors import BabelprobeError

OUTPUTS = ("states", "lens.csv", "curves.csv", "turns.csv", "pairs.csv", "languages.csv", "pair_correlations.csv",
           "figures")


def register(sub) -> None:
    parser = sub.add_parser("lens", help="logit lens: which language each layer would answer in",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    add_items_options(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--store", metavar="DIR", help="read this activation store instead of running the meta "
                        "questions (its items come from its manifest, else from --items)")
    parser.add_argument("--target", metavar="FIELD", help="with --store: the item field holding the expected answer")
    parser.add_argument("--pivot", default="en", help="language of the counterpart answer (default en; 'none': no pivot)")
    parser.add_argument("--orders", type=comma_list, default=["gf", "bf"], metavar="LIST",
                        help="meta option orders to ask: gf (acceptable concept first), bf (default both)")
    parser.add_argument("--prompts", default="xcomps", metavar="NAME|FILE", help="meta prompt set (default xcomps)")
    parser.add_argument("--top-k", type=int, default=10, metavar="K", help="top tokens whose script is counted (default 10)")
    parser.add_argument("--compare", metavar="DIR", help="a compare directory to join with (per pair and per language)")
    parser.add_argument("--n-boot", type=int, default=1000, metavar="N", help="bootstrap replicates (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="token budget per batch of the fresh pass")
    parser.add_argument("--overwrite", action="store_true", help="replace results of another model or item set")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def run(args) -> int:
    from babelprobe.items import items_hash
    from babelprobe.latent import lens
    from babelprobe.runs import open_run
    from babelprobe.tables import read_table, write_table

    out, pivot = Path(args.out), None if args.pivot.lower() == "none" else args.pivot
    if args.top_k < 1:
        raise BabelprobeError(f"--top-k must be at least 1, got {args.top_k}")
    if args.compare and not Path(args.compare).is_dir():
        raise BabelprobeError(f"--compare: {args.compare} is not a directory")
    lm, progress = model_from(args), not args.no_progress
    if args.store:
        from babelprobe.extract import open_store

        store = open_store(args.store)
        items = store.load_items() if (store.manifest.get("items") or {}).get("source") else _items(args, pivot)
        settings = {"store": str(Path(args.store).resolve()), "target": args.target}
    else:
        if args.target:
            raise BabelprobeError("--target needs --store (the meta questions' answer is the acceptable concept)")
        items = _items(args, pivot)
        settings = {"orders": args.orders, "prompts": str(args.prompts)}
    run_dir = open_run(out, {"fingerprint": lm.fingerprint, "items_hash": items_hash(items), **settings,
                             "pivot": pivot, "top_k": args.top_k},
                       record={"model": lm.name}, manifest="lens.json", overwrite=args.overwrite, outputs=OUTPUTS,
                       what="a lens run of another model, item set or settings")

    def produce():
        if args.store:
            table = lens.lens_table(lm, store, items, target=args.target, pivot=pivot, top_k=args.top_k,
                                    progress=progress)
            texts = items.set_index("item_id").loc[store.keys["item_id"], "text"].tolist()
            check = lens.last_layer_check(lm, store, texts)
        else:
            table, check = lens.meta_lens(lm, items, out, pivot=pivot, prompts=args.prompts,
                                          orders=tuple(args.orders), top_k=args.top_k, batch_tokens=args.batch_tokens,
                                          overwrite=args.overwrite, progress=progress)
        run_dir.state["last_layer_check"] = {"max_relative_difference": check, "what": "lens at the last layer vs "
                                             "the model's own next-token logits, first 4 stored rows"}
        write_table(table, out / "lens.csv")
        return table

    # the same run again (e.g. with --compare added) reuses lens.csv and only redoes the tables and figures
    table = run_dir.stage("lens", {"version": 2}, produce, out / "lens.csv", read_table)
    check = run_dir.state["last_layer_check"]["max_relative_difference"]
    curves = lens.lens_curves(table, n_boot=args.n_boot, seed=args.seed)
    turns = lens.lens_turns(curves)
    pairs = lens.pair_summary(table)
    write_table(curves, out / "curves.csv")
    write_table(turns, out / "turns.csv")
    languages = None
    if args.compare:
        pairs, accuracy = lens.join_compare(pairs, args.compare)
        languages = accuracy.merge(turns, on="language", how="left") if len(turns) else accuracy
        write_table(languages, out / "languages.csv")
        write_table(lens.pair_correlations(pairs), out / "pair_correlations.csv")
    write_table(pairs, out / "pairs.csv")
    figures = _figures(curves, pivot, out / "figures")
    print(_summary(turns, languages, check, pivot))
    print(f"wrote lens.csv ({len(table)} rows), curves.csv, turns.csv, pairs.csv"
          f"{', languages.csv, pair_correlations.csv' if args.compare else ''} and {len(figures)} figures to {out}")
    return 0


def _items(args, pivot):
    """The selected items, plus the pivot language's (the counterpart answers come from them)."""
    from babelprobe.items import load_items

    languages = args.languages
    if languages and pivot and pivot not in languages:
        languages = [*languages, pivot]
    return load_items(args.items, languages=languages, subsets=args.subsets, limit=args.limit)


def _figures(curves, pivot, folder: Path) -> list[Path]:
    from babelprobe.analysis.latent import plot_lens_curves, plot_lens_entropy
    from babelprobe.analysis.style import save

    written = save(plot_lens_entropy(curves), folder / "lens_entropy")
    if pivot and curves["p_pivot"].notna().any():
        written += save(plot_lens_curves(curves, pivot), folder / "lens_curves")
    return written


def _summary(turns, languages, check: float, pivot) -> str:
    lines = [f"last-layer check: the lens differs from the model's own logits by at most {check:.1e} (relative)"]
    if len(turns):
        shown = turns[["language", "pivot_leads", "max_lead_layer", "max_lead", "peak_pivot_layer", "peak_p_pivot",
                       "final_p_own", "final_p_pivot", "n_pairs"]]
        lines.append(f"layers where the answer in {pivot} is more probable than in the item's language "
                     f"(95% interval above 0):\n{shown.to_string(index=False, float_format=lambda v: f'{v:.3f}')}")
    if languages is not None:
        lines.append(languages.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return "\n\n".join(lines)
