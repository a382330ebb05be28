"""`babelprobe bench NAME`: run a seed benchmark (StingrayBench, ECLeKTiC, multilingual self-consistency,
Cross-Lingual Pitfalls) and `babelprobe bench pitfalls-search`, the Pitfalls weakness search.

One runner for every benchmark (`bp.run_benchmark`: items.csv, summary.csv, run.json and the figure): its
flags are built from the benchmark's `Settings` dataclass (see `babelprobe.benchmarks.base`), so a
benchmark module never sees argparse. `--protocol paper` applies the benchmark's paper preset; a flag that
contradicts the preset is an error naming both. Building the parser reads each benchmark's settings
only: no torch, transformers or matplotlib until a command runs.
"""

from __future__ import annotations

import argparse

from babelprobe.benchmarks.base import BENCHMARKS, benchmark
from babelprobe.bundled import bundled_sets
from babelprobe.cli import common
from babelprobe.cli.common import (
    add_alias,
    add_http_options,
    add_model_options,
    add_settings_options,
    comma_list,
    http_options,
    runtime_from,
    settings_from,
)
from babelprobe.errors import BabelprobeError


def register(sub) -> None:
    parser = sub.add_parser("bench", help="run a seed benchmark (stingray, eclektic, consistency, pitfalls)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    names = parser.add_subparsers(dest="benchmark", metavar="NAME", required=True)
    for name in BENCHMARKS:
        module = benchmark(name)
        bench = names.add_parser(name, help=module.TITLE, description=module.TITLE)
        add_model_options(bench)
        add_source_options(bench, name)
        if name == "lm-eval":
            add_task_options(bench)
        add_settings_options(bench, module.Settings, f"{name} settings (recorded in run.json)",
                             presets=getattr(module, "PROTOCOLS", {}))
        add_runtime_options(bench)
        bench.set_defaults(func=run, benchmark_name=name)
    add_search_parser(names)
    add_affinity_parser(names)
    add_figures_parser(names)


def add_source_options(parser, name: str) -> None:
    bundled = ", ".join(bundled_sets(name)) or "none"
    group = parser.add_argument_group("data")
    group.add_argument("--items", dest="items", metavar="NAME|PATH",
                       help=f"bundled sample ({bundled}), a local file or directory, or a hub id when online")
    group.add_argument("--languages", dest="languages", type=comma_list, metavar="LIST",
                       help="languages or language pairs to keep")
    add_old_spellings(group)
    group.add_argument("--limit", type=int, metavar="N", help="at most N items per language (pair)")
    group.add_argument("--out", required=True, metavar="DIR", help="output directory (rows, summary, figure)")


def add_task_options(parser) -> None:
    """`bench lm-eval`: the harness's tasks by name (instead of --items lm-eval:...), and the user's task folder."""
    from babelprobe.cli.items import add_task_folder

    group = parser.add_argument_group("lm-evaluation-harness tasks")
    group.add_argument("--tasks", type=comma_list, metavar="LIST",
                       help="task, group or tag names (glob patterns too), as the harness's --tasks")
    add_task_folder(group)


def task_source(args) -> str | None:
    """`--tasks` and `--include-path` as an `lm-eval:` source; either with --items is an error."""
    tasks, folder = getattr(args, "tasks", None), getattr(args, "include_path", None)
    if not tasks and not folder:
        return args.items
    if args.items:
        raise BabelprobeError("give the tasks either as --tasks (and --include-path) or as --items lm-eval:TASK[@DIR], "
                              "not both")
    if not tasks:
        raise BabelprobeError("--include-path needs --tasks: the tasks to read from it")
    from babelprobe.lmeval import source_of

    return source_of(tasks, folder)


def add_old_spellings(group) -> None:
    """--data and --langs: the old spellings of --items and --languages, accepted and hidden."""
    add_alias(group, "--data", "items")
    add_alias(group, "--langs", "languages", type=comma_list)


def require_items(args) -> None:
    if not args.items:
        what = "--tasks TASK[,TASK...] or --items" if getattr(args, "benchmark_name", "") == "lm-eval" else "--items"
        raise BabelprobeError(f"{what} is required (a bundled sample name, a file or a directory)")


def add_runtime_options(parser) -> None:
    """Options that change speed, never numbers: the runtime's (`cli.common.add_runtime_options`), the local
    generation batch and the endpoints'."""
    common.add_runtime_options(parser, ("batch_tokens", "overwrite", "progress"))
    group = next(g for g in parser._action_groups if g.title == "running (does not change the numbers)")
    group.add_argument("--batch-size", type=int, default=8, metavar="N", help="local generation batch size (default 8)")
    add_http_options(parser)


def models_from(args):
    """The runtime of the flags, with the generators' options (`benchmarks.base.Models`)."""
    from babelprobe.benchmarks.base import Models

    return Models(runtime=runtime_from(args), http=http_options(args), batch_size=args.batch_size)


def run(args) -> int:
    from babelprobe.analysis.benchmarks import run_benchmark

    if args.benchmark_name == "lm-eval":  # StingrayBench has a --tasks of its own
        args.items = task_source(args)
    require_items(args)
    module = benchmark(args.benchmark_name)
    settings = settings_from(args, module.Settings, getattr(module, "PROTOCOLS", {}))
    result = run_benchmark(args.items, args.out, settings, models_from(args), name=args.benchmark_name,
                           languages=args.languages, limit=args.limit)
    protocol = f", protocol {settings.protocol}" if hasattr(settings, "protocol") else ""
    print(f"{module.TITLE.split(':')[0]} ({args.items}), {result.identity['model']}{protocol}:")
    print(module.format_summary(result.summary))
    print(f"wrote {len(result.rows)} rows to {result.out / 'items.csv'}, {result.out / 'summary.csv'}, "
          f"{result.figures[-1] if result.figures else '(no figure)'}")
    return 0


# ------------------------------------------------------------------------------------- pitfalls-search

def add_search_parser(names) -> None:
    from babelprobe.benchmarks.pitfalls.settings import SEARCH_PROTOCOLS, SearchSettings

    search = names.add_parser(
        "pitfalls-search", help="Cross-Lingual Pitfalls: beam search for questions a model fails only in the "
        "target language", description="Grow English seed questions (--items: an English source file such as "
        "source/mmlu.json) with distracting context until the simulation models answer them in English but not in "
        "each --languages target language; writes OUT/<Language>.json, loadable by `bench pitfalls --items OUT`.")
    add_model_options(search)
    group = search.add_argument_group("data")
    group.add_argument("--items", dest="items", metavar="PATH", help="English source questions")
    group.add_argument("--languages", dest="languages", type=comma_list, metavar="LIST",
                       help="target languages by English name, e.g. Chinese,French (required)")
    add_old_spellings(group)
    group.add_argument("--limit", type=int, metavar="N", help="at most N seed questions")
    group.add_argument("--out", required=True, metavar="DIR", help="output directory")
    roles = search.add_argument_group("who does what")
    roles.add_argument("--perturber", default="local", metavar="SPEC", help="generator writing distractions (default local)")
    roles.add_argument("--translator", default="local", metavar="SPEC", help="generator translating (default local)")
    roles.add_argument("--sim-models", type=comma_list, default=[], metavar="LIST",
                       help="further simulation models besides --model: model specs (--answer likelihood) or "
                       "generator specs (--answer generate; a bare model spec is local:SPEC)")
    roles.add_argument("--reduction", default="per_byte", help="how simulation models combine a choice's token "
                       "log-probs (default per_byte)")
    add_settings_options(search, SearchSettings, "pitfalls-search settings (recorded in the search's manifest)",
                         presets=SEARCH_PROTOCOLS)
    add_runtime_options(search)
    search.set_defaults(func=run_search)


def run_search(args) -> int:
    import numpy as np

    from babelprobe.benchmarks.pitfalls.search import SearchSettings, search_languages
    from babelprobe.benchmarks.pitfalls.settings import SEARCH_PROTOCOLS

    require_items(args)
    if not args.languages:
        raise BabelprobeError("pitfalls-search needs --languages: the target languages by English name, e.g. "
                              "Chinese,French")
    settings = settings_from(args, SearchSettings, SEARCH_PROTOCOLS)
    models = models_from(args)
    found = search_languages(args.items, args.languages, models, settings, args.out, perturber=args.perturber,
                             translator=args.translator, sim_models=args.sim_models, reduction=args.reduction,
                             limit=args.limit, overwrite=args.overwrite, progress=args.progress)
    for name, (seeds, total, records) in found.items():
        values = [r["value"] for r in records]
        print(f"{name}: {seeds} of {total} seed questions kept (answered right in English by the simulation models "
              f"and translated; why the others were left: seeds-dropped-{name}.csv); {len(records)} candidates"
              + (f" (mean V {np.mean(values):.3f})" if values else ""))
    print(f"wrote candidates to {args.out}/<Language>.json (evaluate them with `bench pitfalls --items {args.out}`) "
          "and the search traces")
    return 0



# ----------------------------------------------------------------------------------- pitfalls-affinity

def add_affinity_parser(names) -> None:
    from babelprobe.benchmarks.pitfalls.settings import AFFINITY_PROTOCOLS, AffinitySettings

    parser = names.add_parser(
        "pitfalls-affinity", help="Cross-Lingual Pitfalls Fig. 7: expand found pairs into the other languages, "
        "evaluate them, Relative Affinity Score heat map", description="Expand every seed language's found pairs "
        "(--items: what `bench pitfalls` reads) into the other languages of --items, answer them, and write the "
        "accuracy matrix A[x, y], the Relative Affinity Score D[x, y] (§3.3) and its heat map (Fig. 7).")
    add_model_options(parser)
    add_source_options(parser, "pitfalls")
    add_settings_options(parser, AffinitySettings, "pitfalls-affinity settings (recorded in affinity.json)",
                         presets=AFFINITY_PROTOCOLS)
    add_runtime_options(parser)
    parser.set_defaults(func=run_affinity)


def run_affinity(args) -> int:
    from babelprobe.analysis.benchmarks import run_affinity as run_it
    from babelprobe.benchmarks.pitfalls.settings import AFFINITY_PROTOCOLS, AffinitySettings

    settings = settings_from(args, AffinitySettings, AFFINITY_PROTOCOLS)
    result = run_it(args.items, args.out, settings, models_from(args), languages=args.languages, limit=args.limit)
    import sys

    from babelprobe.tables import read_table

    kept = result.pairs["seed_language"].ne(result.pairs["language"]).sum() if len(result.pairs) else 0
    dropped = len(read_table(result.out / "pairs-dropped.csv"))
    print(f"Cross-Lingual Pitfalls affinity ({args.items}), protocol {settings.protocol}, answer {settings.answer}: "
          f"{len(result.pairs)} pairs ({kept} expanded, {dropped} translations unusable: pairs-dropped.csv), "
          f"{len(result.rows)} answers")
    if dropped and not kept:  # A and D are their diagonals only: say why rather than leave a blank heat map
        print("no pair could be expanded: the translator must reply in the JSON the release's template asks for; "
              "give an instruction-tuned one with --translator SPEC", file=sys.stderr)
    print("A[x, y] (rows: evaluated language x, columns: seed language y):")
    print(result.accuracy.round(3).to_string())
    print("D[x, y] (lower: stronger affinity):")
    print(result.affinity.round(3).to_string())
    print(f"wrote {result.out / 'affinity.csv'}, {result.out / 'accuracy.csv'}, "
          f"{result.figures[-1] if result.figures else '(no figure)'}")
    return 0


# ---------------------------------------------------------------------------------------------- figures

def add_figures_parser(names) -> None:
    parser = names.add_parser(
        "figures", help="several runs of one benchmark in one figure (StingrayBench Figs. 4-8, 11-14 by model; "
        "ECLeKTiC Fig. 4 by run)", description="Draw the figures that compare runs: StingrayBench's overall and "
        "per-pair figures and App. C's per-task ones with one colour per model, or ECLeKTiC's Fig. 4 (overall "
        "success and transfer score per run, in the order given: e.g. one model family by size).")
    parser.add_argument("runs", nargs="+", metavar="RUN", help="finished `bench NAME` directories")
    parser.add_argument("--out", required=True, metavar="DIR", help="where to write the figures")
    parser.set_defaults(func=run_figures)


def run_figures(args) -> int:
    from babelprobe.analysis.benchmarks import plot_runs

    drawn = plot_runs(args.runs, args.out)
    for name, files in drawn.items():
        print(f"{name}: {', '.join(str(f) for f in files)}")
    return 0
