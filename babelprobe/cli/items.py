"""`babelprobe items list`, `babelprobe items show NAME|PATH` (what item sets exist and what is in one),
`babelprobe items convert BRIDGE SRC --out F` (a MultiBLiMP, Belebele, XNLI or PAWS-X release as items) and
`babelprobe items from-lm-eval TASK[,TASK...] --out F` (lm-evaluation-harness multiple-choice tasks as items)."""

from __future__ import annotations

from babelprobe.benchmarks.bridges import BRIDGES
from babelprobe.bundled import BUNDLED
from babelprobe.cli.common import add_items_options, comma_list, items_from


def register(sub) -> None:
    parser = sub.add_parser("items", help="list bundled item sets or show (and validate) one", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    verbs.add_parser("list", help="every bundled set, of every benchmark, with its size").set_defaults(func=run_list)
    show = verbs.add_parser("show", help="validate an item set, count it per language × subset, print some rows")
    show.add_argument("source", metavar="NAME|PATH",
                      help="bundled set, item file or directory (released COMPS/XCOMPS layouts too), or hf:ORG/NAME")
    show.add_argument("--rows", type=int, default=8, help="number of rows to print (default 8)")
    add_items_options(show, items=False)
    show.set_defaults(func=run_show)
    convert = verbs.add_parser("convert", help="a benchmark's release (multiblimp, belebele, xnli, pawsx) as items, "
                               "one per answer option (docs/datasets.md)")
    convert.add_argument("bridge", choices=BRIDGES, metavar="BRIDGE", help=", ".join(BRIDGES))
    convert.add_argument("source", metavar="NAME|PATH", help="bundled sample (multiblimp-sample, ...), a file or "
                         "directory in the release's layout, or hf:ID[:CONFIG] when online")
    convert.add_argument("--out", required=True, metavar="FILE", help="items file to write (.jsonl .json .csv .parquet)")
    convert.add_argument("--languages", type=comma_list, metavar="LIST", help="configs or languages to keep")
    convert.add_argument("--limit", type=int, metavar="N", help="at most N questions per language")
    convert.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    convert.set_defaults(func=run_convert)
    harness = verbs.add_parser("from-lm-eval", help="lm-evaluation-harness multiple-choice tasks as items, one per "
                               "option of every document (its own task objects; the lm-eval extra)")
    harness.add_argument("tasks", type=comma_list, metavar="TASK[,TASK...]",
                         help="task, group or tag names (glob patterns too), as the harness's --tasks")
    add_task_folder(harness)
    harness.add_argument("--out", required=True, metavar="FILE", help="items file to write (.jsonl .json .csv .parquet)")
    harness.add_argument("--language", metavar="CODE", help="language of tasks whose metadata, data set and name do "
                         "not say")
    harness.add_argument("--languages", type=comma_list, metavar="LIST", help="keep the tasks in these languages")
    harness.add_argument("--limit", type=int, metavar="N", help="the first N documents of each task (the harness's "
                         "--limit)")
    harness.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    harness.set_defaults(func=run_from_harness)


def add_task_folder(parser) -> None:
    """--include-path: a folder of the user's own harness task files (the harness's --include_path)."""
    parser.add_argument("--include-path", metavar="DIR", help="a folder of your own lm-evaluation-harness task files, "
                        "searched after the installed ones (they override them), as the harness's --include_path")


def run_from_harness(args) -> int:
    from babelprobe.benchmarks.bridges.lmeval import convert
    from babelprobe.lmeval import source_of

    source = source_of(args.tasks, args.include_path)
    items = convert(source, args.out, languages=args.languages, limit=args.limit, language=args.language,
                    overwrite=args.overwrite)
    counts = items.groupby("task")["pair_id"].nunique()
    print(f"{source}: {items['pair_id'].nunique()} documents ({', '.join(f'{k} {v}' for k, v in counts.items())}), "
          f"{len(items)} items (one per option); wrote {args.out}")
    return 0


def run_convert(args) -> int:
    from babelprobe.benchmarks.bridges import convert

    items = convert(args.bridge, args.source, args.out, languages=args.languages, limit=args.limit,
                    overwrite=args.overwrite)
    counts = items.groupby("language")["pair_id"].nunique()
    print(f"{args.source}: {items['pair_id'].nunique()} questions ({', '.join(f'{k} {v}' for k, v in counts.items())}), "
          f"{len(items)} items (one per option); wrote {args.out}")
    return 0


def run_list(args) -> int:
    import pandas as pd

    from babelprobe.benchmarks.base import benchmark
    from babelprobe.items import load_items
    from babelprobe.lmeval import sample_counts

    rows = [("name", "used by", "records", "languages", "description")]
    for name, bundled in BUNDLED.items():
        if bundled.benchmark == "xcomps":
            records, command = load_items(name), "score/extract/compare"
        elif bundled.benchmark == "lm-eval":  # counted from its files: listing needs no harness installed
            documents, languages = sample_counts(name)
            rows.append((name, "bench lm-eval", str(documents), str(len(languages)), bundled.description))
            continue
        elif bundled.benchmark == "patching":  # concept words: one record per word
            from babelprobe.patching.translation import load_concepts

            records, command = load_concepts(name), "patch --protocol translation --concepts"
        elif bundled.benchmark == "corpus":  # running text: its lines are the records
            from babelprobe.corpus import read_corpus

            corpus = read_corpus(name)
            records = pd.DataFrame({"language": [c for c, lines in corpus.train.items() for _ in lines]})
            command = "--corpus (neurons, sae train, intervene)"
        else:
            records, command = benchmark(bundled.benchmark).load(name), f"bench {bundled.benchmark}"
            records = getattr(records, "frame", records)  # what a `prepare` step takes holds the frame read
        rows.append((name, command, str(len(records)), str(len(_languages(records))), bundled.description))
    name_width, command_width = (max(len(row[column]) for row in rows) for column in (0, 1))
    for name, command, records, languages, description in rows:
        print(f"{name:{name_width}s}  {command:{command_width}s}  {records:>7s}  {languages:>9s}  {description}")
    return 0


def _languages(records) -> set[str]:
    if "language" in records.columns:
        return set(records["language"])
    return set(records["l1"]) | set(records["l2"])  # StingrayBench: one record per word of a language pair


def run_show(args) -> int:
    args.items = args.source
    items = items_from(args)
    counts = items.groupby(["language", "subset"])["pair_id"].nunique().unstack(fill_value=0)
    skipped = sum(report["skipped"] for report in items.attrs.get("skipped", []))
    note = f"; {skipped} released record{'s' * (skipped != 1)} skipped (reasons above)" if skipped else ""
    print(f"{args.source}: {len(items)} items, {items['pair_id'].nunique()} pairs, valid{note}")
    print(f"pairs per language × subset:\n{counts.to_string()}\n")
    release_id = ["id"] if "id" in items.columns else []  # the released record's own id, kept
    with_text = items[["item_id", "pair_id", *release_id, "language", "subset", "label", "text"]]
    print(with_text.head(args.rows).to_string(index=False))
    return 0
