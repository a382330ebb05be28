"""Prompt files: one format and one loader for every prompt template babelprobe reads.

A prompt file is UTF-8, tab-separated text with a header row (data/prompts/README.md):

  - one row per template; some columns say what it is for (`set`, `task`, `language`, ...), the others
    hold text (`template`, an answer prefix, ...);
  - no quoting: a `"` is just a character; inside a field a line break is written `\\n`, a tab `\\t` and
    a backslash `\\\\`;
  - a line starting with `#` is a comment (where the template comes from, which section it cites).

`read_prompts(source, columns)` reads a bundled prompt file by name (`xcomps_meta` for
data/prompts/xcomps_meta.tsv) or a path, checks the columns and that no required cell is empty, and
returns the rows as a DataFrame (text unescaped, `line` = the row's line number). `check_placeholders`
checks a template's `{placeholders}`. Every mistake is a one-line `BabelprobeError` naming file, line
and column. Templates are the experiments' inputs: the bundled ones cite the paper section they copy.
"""

from __future__ import annotations

import re
import string
from pathlib import Path

import pandas as pd

from babelprobe.bundled import DATA
from babelprobe.errors import BabelprobeError
from babelprobe.tables import read_text

ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def prompt_path(source: str | Path) -> Path:
    """A bundled prompt file by name (with or without .tsv) or a path to your own."""
    bundled = Path(str(DATA / "prompts")) / (str(source) if str(source).endswith(".tsv") else f"{source}.tsv")
    if "/" not in str(source) and bundled.is_file():
        return bundled
    path = Path(source).expanduser()
    if not path.is_file():
        names = sorted(p.stem for p in Path(str(DATA / "prompts")).glob("*.tsv"))
        raise BabelprobeError(f"prompt file {source!r} is neither a bundled one ({', '.join(names)}) nor a file")
    return path


def unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: ESCAPES.get(m.group(1), m.group(0)), text)


def read_prompts(source: str | Path, columns: tuple[str, ...], optional: tuple[str, ...] = ()) -> pd.DataFrame:
    """The rows of a prompt file with the given (required, non-empty) `columns` and `optional` ones."""
    path = prompt_path(source)
    lines = read_text(path).splitlines()
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip() and not line.startswith("#")]
    if not numbered:
        raise BabelprobeError(f"{path}: no header row")
    (header_line, header), rows = numbered[0], numbered[1:]
    names = header.split("\t")
    missing = [c for c in columns if c not in names]
    if missing:
        raise BabelprobeError(f"{path}:{header_line}: missing column {missing[0]!r}; a prompt file needs the "
                              f"tab-separated columns {', '.join(columns)}" + (f" (optional: {', '.join(optional)})"
                                                                               if optional else ""))
    records = []
    for number, line in rows:
        fields = line.split("\t")
        if len(fields) != len(names):
            raise BabelprobeError(f"{path}:{number}: {len(fields)} tab-separated fields where the header has "
                                  f"{len(names)} ({', '.join(names)})")
        record = {name: unescape(value) for name, value in zip(names, fields)}
        for column in columns:
            if not record[column].strip():
                raise BabelprobeError(f"{path}:{number}: empty {column!r}")
        records.append({**record, "line": f"{path}:{number}"})
    if not records:
        raise BabelprobeError(f"{path}: no templates")
    return pd.DataFrame(records)


def placeholders(template: str, where: str = "") -> list[str]:
    """The `{names}` in a template, in order, with repeats."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as err:
        raise BabelprobeError(f"{where}: unbalanced braces in the template ({err}); write a literal brace as "
                              "{{ or }}") from err


def check_placeholders(template: str, where: str, required: tuple[str, ...], allowed: tuple[str, ...] = (),
                       once: bool = True) -> None:
    """`required` placeholders are in `template` (exactly once when `once`); nothing else but `allowed`."""
    names = placeholders(template, where)
    for name in required:
        count = names.count(name)
        if count == 0 or (once and count != 1):
            raise BabelprobeError(f"{where}: the template must contain {{{name}}} {'exactly once' if once else ''}"
                                  f" (found {count})".replace("  ", " "))
    unknown = sorted(set(names) - set(required) - set(allowed))
    if unknown:
        known = ", ".join("{" + n + "}" for n in (*required, *allowed))
        raise BabelprobeError(f"{where}: unknown placeholder(s) {', '.join('{' + n + '}' for n in unknown)}; "
                              f"use {known}")
