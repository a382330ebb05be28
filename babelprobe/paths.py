"""A user's input paths, checked before any work: there, readable by this process, a file or a directory as
asked. Each refusal is one line that starts with where the path was given (`--acts DIR`, `store DIR`, a
task's data file), so the command line and a notebook say the same thing: the command registry
(`cli/registry.py`), the runners' input checks (`babelprobe.inputs`) and the item readers all check with
these functions.

Readability is asked of the operating system (`os.access`), not learned from a failed open: a directory's
files are checked one level down, so an unreadable shard or table is found before a model loads, not
after it.
"""

from __future__ import annotations

import os
from pathlib import Path

from babelprobe.errors import BabelprobeError


def check_exists(path: str | Path, where: str, what: str = "file") -> Path:
    """`path` exists; else "WHERE: no such WHAT" (`what`: file, directory, file or directory)."""
    path = Path(path)
    if not path.exists():
        raise BabelprobeError(f"{where}: no such {what}")
    return path


def check_readable(path: str | Path, where: str) -> None:
    """`path` (a file, or a directory and the files in it, one level down) readable by this process."""
    path = Path(path)
    paths = [path, *(p for p in path.iterdir() if p.is_file())] if _listable(path) else [path]
    for one in paths:
        if not os.access(one, os.R_OK) or (one.is_dir() and not os.access(one, os.X_OK)):
            shown = where if one == path else f"{where}: {one.name}"
            raise BabelprobeError(f"{shown}: permission denied (not readable by this user); fix its permissions or "
                                  "point elsewhere")


def _listable(path: Path) -> bool:
    # a directory this process may list; one it may not is refused by the check of the directory itself
    return path.is_dir() and os.access(path, os.R_OK | os.X_OK)


def check_kind_of_path(path: str | Path, where: str, want: str) -> None:
    """`path` is what `want` says: "file" or "dir"."""
    path = Path(path)
    if want == "file" and path.is_dir():
        raise BabelprobeError(f"{where} is a directory; give a file")
    if want == "dir" and not path.is_dir():
        raise BabelprobeError(f"{where} is a file; give a directory")


def check_path(path: str | Path, where: str, want: str = "file") -> Path:
    """There, readable and of the sort `want` ("file", "dir", or "any"): the three checks above in order."""
    what = {"file": "file", "dir": "directory"}.get(want, "file or directory")
    path = check_exists(path, where, what)
    check_readable(path, where)
    if want in ("file", "dir"):
        check_kind_of_path(path, where, want)
    return path
