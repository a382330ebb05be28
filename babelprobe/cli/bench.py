"""`babelprobe bench NAME`: the seed benchmarks (StingrayBench, ECLEKTIC, multilingual
self-consistency, Cross-Lingual Pitfalls). Each benchmark module in `babelprobe.benchmarks` provides
`add_arguments(parser)` for its own options and `run_cli(args) -> int`; this file only wires them up.
"""

from __future__ import annotations

import importlib

from babelprobe.cli.common import add_model_options, comma_list

BENCHMARKS = {
    "stingray": ("babelprobe.benchmarks.stingray", "StingrayBench: cross-lingual false friends and true cognates"),
    "eclektic": ("babelprobe.benchmarks.eclektic", "ECLEKTIC: cross-lingual knowledge transfer (closed book)"),
    "consistency": ("babelprobe.benchmarks.consistency", "multilingual self-consistency (Ohmer, Bruni & Hupkes)"),
    "pitfalls": ("babelprobe.benchmarks.pitfalls", "Cross-Lingual Pitfalls: English vs target-language weakness"),
}


def register(sub) -> None:
    parser = sub.add_parser("bench", help="run a seed benchmark (stingray, eclektic, consistency, pitfalls)",
                            description=__doc__)
    names = parser.add_subparsers(dest="benchmark", metavar="NAME", required=True)
    for name, (module_name, summary) in BENCHMARKS.items():
        bench = names.add_parser(name, help=summary, description=summary)
        add_model_options(bench)
        bench.add_argument("--data", required=True, metavar="NAME|PATH",
                           help="bundled sample name, local file/directory, or hub id when online")
        bench.add_argument("--out", required=True, metavar="DIR", help="output directory (rows, summary, figure)")
        bench.add_argument("--langs", type=comma_list, metavar="LIST", help="languages or language pairs to keep")
        bench.add_argument("--limit", type=int, metavar="N", help="at most N items per language (pair)")
        bench.add_argument("--no-progress", action="store_true", help="no progress bar")
        module = importlib.import_module(module_name)
        bench.set_defaults(func=module.run_cli, benchmark_module=module_name)
        module.add_arguments(bench)
