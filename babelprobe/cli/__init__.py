"""The `babelprobe` command. Each command group lives in its own module here with a `register(sub)`
function; this module builds the parser and turns user mistakes into one-line errors.

Exit status: 0 success, 1 a check failed (e.g. `verify` found a problem), 2 a user mistake
(`BabelprobeError`), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from babelprobe.cli import registry
from babelprobe.errors import BabelprobeError

# babelprobe.cli.<name>.register(subparsers) adds that module's commands, in this order in --help.
COMMAND_MODULES = ("models", "items", "score", "extract", "probe", "compare", "intervene", "neurons", "patch", "lens", "align",
                   "sae", "report", "bench", "sweep")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="babelprobe", description="Does a multilingual LM know the same thing in every language, "
        "and where in its layers? Score, extract, probe and compare on the same items.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"babelprobe.cli.{name}").register(sub)
    name_commands(parser)
    return parser


def name_commands(parser, path: tuple[str, ...] = ()) -> None:
    """Each command's parser records its path (`args.command_path`: ("bench", "xnli")), by which `main`
    finds it in the registry."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                sub.set_defaults(command_path=path + (name,))
                name_commands(sub, path + (name,))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        registry.check(registry.command_of(args.command_path), args)  # every command's common checks, first
        return args.func(args) or 0
    except BabelprobeError as err:
        print(f"babelprobe: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("babelprobe: interrupted; nothing partial was kept under a final name. "
              "Run the same command again to redo or resume it.", file=sys.stderr)
        return 130
