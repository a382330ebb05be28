"""`babelprobe items list` and `babelprobe items show NAME|PATH`: what item sets exist and what is in one."""

from __future__ import annotations

from babelprobe.cli.common import add_items_options, items_from
from babelprobe.items import BUNDLED, load_items


def register(sub) -> None:
    parser = sub.add_parser("items", help="list bundled item sets or show (and validate) one", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    verbs.add_parser("list", help="bundled item sets with their sizes").set_defaults(func=run_list)
    show = verbs.add_parser("show", help="validate an item set, count it per language × subset, print some rows")
    show.add_argument("source", metavar="NAME|PATH", help="bundled set, item file or directory, or hf:ORG/NAME")
    show.add_argument("--rows", type=int, default=8, help="number of rows to print (default 8)")
    add_items_options(show)
    show.set_defaults(func=run_show)


def run_list(args) -> int:
    for name, description in BUNDLED.items():
        items = load_items(name)
        print(f"{name:16s} {len(items):6d} items  {items['pair_id'].nunique():5d} pairs  "
              f"{items['language'].nunique():3d} languages  {description}")
    return 0


def run_show(args) -> int:
    args.items = args.source
    items = items_from(args)
    counts = items.groupby(["language", "subset"])["pair_id"].nunique().unstack(fill_value=0)
    print(f"{args.source}: {len(items)} items, {items['pair_id'].nunique()} pairs, valid")
    print(f"pairs per language × subset:\n{counts.to_string()}\n")
    with_text = items[["item_id", "pair_id", "language", "subset", "label", "text"]]
    print(with_text.head(args.rows).to_string(index=False))
    return 0
