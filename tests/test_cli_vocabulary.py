"""One CLI vocabulary (docs/design.md "CLI"): every flag a command shows is in the flag table of
docs/design.md, with the commands that have it, and one idea has one spelling everywhere. Building the
parser, and any `--help`, imports neither torch nor matplotlib."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from babelprobe.cli import build_parser

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
# old spellings, accepted as hidden aliases only (the flag everyone uses instead)
HIDDEN = {"--dtype": "--model-dtype / --store-dtype / --solver-dtype", "--store": "--acts", "--layer": "--layers",
          "--inference": "--answer", "--chat": "--chat-template", "--data": "--items", "--langs": "--languages",
          "--transfer-file": "--transfer-table"}


def walk(parser: argparse.ArgumentParser, path: tuple = ()):
    """(command path, action) for every option a command shows in its --help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, path + (name,))
        elif action.option_strings and action.help != argparse.SUPPRESS:
            yield path, action


def benchmark_settings(path: tuple) -> set[str]:
    """The fields of a benchmark's own settings (`bench NAME`): documented by `bench NAME --help` and pinned by
    the benchmark contract test, not by the table; their shared vocabulary (--answer, --chat-template,
    --protocol) is checked here."""
    if len(path) < 2 or path[0] != "bench":
        return set()
    from babelprobe.benchmarks.base import BENCHMARKS, benchmark

    if path[1] in BENCHMARKS:
        settings = benchmark(path[1]).Settings
    elif path[1] == "pitfalls-search":
        from babelprobe.benchmarks.pitfalls.settings import SearchSettings as settings
    elif path[1] == "pitfalls-affinity":
        from babelprobe.benchmarks.pitfalls.settings import AffinitySettings as settings
    else:
        return set()
    import dataclasses

    return {f.name for f in dataclasses.fields(settings)} - {"answer", "chat_template", "protocol"}


def shown() -> dict[str, set[str]]:
    """flag -> the top-level commands that show it (`--help` left out; a benchmark's own settings too)."""
    flags: dict[str, set[str]] = {}
    for path, action in walk(build_parser()):
        if action.dest in benchmark_settings(path):
            continue
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                flags.setdefault(option, set()).add(path[0] if path else "")
    return flags


def table() -> dict[str, set[str]]:
    """The flag table of docs/design.md: | `--flag` | meaning | `cmd`, `cmd` |."""
    section = DESIGN.read_text(encoding="utf-8").split("### Flags", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\|\s*`(--[\w-]+)`(?:,\s*`(--[\w-]+)`)?\s*\|[^|]*\|([^|]*)\|", line)
        if match:
            commands = set(re.findall(r"`([\w-]+)`", match.group(3)))
            for flag in filter(None, match.group(1, 2)):
                rows[flag] = commands
    return rows


def test_every_shown_flag_is_in_the_design_table_with_its_commands():
    actual, documented = shown(), table()
    missing = sorted(set(actual) - set(documented))
    assert not missing, "add to the flag table of docs/design.md: " + ", ".join(
        f"{flag} ({', '.join(sorted(actual[flag]))})" for flag in missing)
    gone = sorted(set(documented) - set(actual))
    assert not gone, f"the flag table of docs/design.md lists flags no command has: {gone}"
    wrong = {flag: (sorted(documented[flag]), sorted(actual[flag])) for flag in actual
             if documented[flag] != actual[flag]}
    assert not wrong, f"commands per flag differ (table, parser): {wrong}"


def test_one_spelling_per_idea():
    actual = shown()
    old = {flag: instead for flag, instead in HIDDEN.items() if flag in actual}
    assert not old, f"old spellings shown in --help (keep them hidden, use the new one): {old}"
    for path, action in walk(build_parser()):
        if "--chat-template" in action.option_strings:
            assert list(action.choices) == ["off", "auto", "on"], path
        if "--answer" in action.option_strings and path[0] == "bench":
            assert {"likelihood", "generate"} <= set(action.choices or ()), path
        if "--acts" in action.option_strings:
            assert action.metavar == "DIR", path


@pytest.mark.parametrize("command", ["lens", "align", "probe", "compare"])
def test_the_store_is_acts(command):
    parser = build_parser()
    text = parser._subparsers._group_actions[0].choices[command].format_help()
    assert "--acts" in text and "--store " not in text


def test_help_imports_neither_torch_nor_matplotlib():
    code = """
import argparse, contextlib, io, sys
from babelprobe.cli import build_parser, main
parser = build_parser()
assert not {'torch', 'matplotlib', 'transformers'} & set(sys.modules), 'build_parser'

def paths(parser, path=()):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from paths(sub, path + (name,))

for path in paths(parser):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main([*path, "--help"])
        except SystemExit:
            pass
    heavy = {'torch', 'matplotlib', 'transformers'} & set(sys.modules)
    assert not heavy, (path, heavy)
print('ok')
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("where", ["babelprobe.comparison:CompareSettings", "babelprobe.interventions.settings:Settings"])
def test_peak_is_read_by_the_one_parser(where):
    """`--layers peak` (and `max`, the XCOMPS wording, any case) is `extract.layers.is_peak`'s, in every settings
    class that takes it."""
    import importlib

    from babelprobe.extract.layers import is_peak

    module, name = where.split(":")
    cls = getattr(importlib.import_module(module), name)
    assert is_peak("max") and is_peak(" Peak ") and not is_peak("3")
    assert cls(layers="max").layers == cls(layers=" Peak ").layers == "peak"
    assert cls(layers="3").layers == "3"
