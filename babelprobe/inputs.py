"""Every sort of input a command or a runner names, checked before any model loads or anything is written:
there, readable by this process, and of its kind (a store whose shards open, a finished compare directory,
an SAE folder, lm-evaluation-harness tasks whose folder is there and whose harness is installed, ...).

    check_input("--acts", "cmp/acts", "store")     # the command line (cli/registry.py, for every command)
    check_input("acts", acts, "store")             # a runner's first lines (bp.probe, bp.sae_features, ...)

Both say the same line (`acts cmp/acts: permission denied ...`), so a notebook user gets what the command
line gives. The sorts (`SORTS`) are what `cli/registry.py` declares each command's inputs to be.
"""

from __future__ import annotations

import os
from pathlib import Path

from babelprobe.errors import BabelprobeError
from babelprobe.paths import check_kind_of_path, check_path, check_readable

# the sorts of input a command may name, and what each must be
SORTS = {"store": "an activation store (`babelprobe extract`)", "compare": "a compare directory (`babelprobe compare`)",
         "neurons": "a neurons directory (`babelprobe neurons`)", "sae-run": "an SAE run directory (`babelprobe sae`)",
         "bench": "a benchmark run directory (`babelprobe bench NAME`)", "run": "a run directory of any kind",
         "sae-folder": "an SAE folder (Gemma Scope 2 or SAELens layout)",
         "probes": "a compare directory, a probe table or an activation store", "dir": "a directory",
         "file": "a file", "items": "an item source: a bundled set, a file, a directory or hf:ORG/NAME",
         "new-store": "an activation store to reuse, or a new or empty directory to extract into",
         "tasks": "lm-evaluation-harness task, group or tag names (the lm-eval extra)",
         "lm-eval": "lm-evaluation-harness tasks: lm-eval:TASK[,TASK...][@DIR], TASK[,TASK...][@DIR] or a bundled "
                    "sample (lm-eval-sample)",
         "corpus": "a text corpus: a bundled one, a folder of <lang>.txt, a table or hf:ORG/NAME",
         "concepts": "a table of concept words (concept_id, language, word) or a bundled set (xcomps-sample, "
                     "dumas-concepts)"}


def check_input(name: str, value, sort: str):
    """`value` there and readable, and of `sort` (`SORTS`); one line starting with `name` (the flag, `--acts`,
    or the runner's parameter, `acts`; empty: the value alone) otherwise. A value that is no path (None, a
    frame, an opened store, a loaded SAE) is returned as it is: there is nothing on disk to check."""
    if value is None or not isinstance(value, (str, os.PathLike)):
        return value
    # imported here: the CLI's help imports this module, and runs imports pandas
    from babelprobe.runs import LAYOUTS, detect

    path = Path(value)
    where = f"{name} {path}" if name else str(path)
    if sort in ("tasks", "lm-eval") or sort == "items" and is_harness_source(value):
        return check_tasks(name, str(value), sort)
    if sort in ("items", "corpus", "concepts") and not path.exists():
        return path  # a bundled set or a hub id, or a name the item, corpus or concept loader explains
    sort = "file" if sort == "concepts" else sort
    if sort == "new-store":  # a store to reuse, or a new (or empty) directory to extract into
        if not path.exists() or path.is_dir() and not any(path.iterdir()):
            return path
        sort = "store"
    if not path.exists():
        what = "file" if sort in ("file", "items") else "directory" if sort != "probes" else "file or directory"
        raise BabelprobeError(f"{where}: no such {what}")
    check_readable(path, where)
    if sort == "file" or sort in ("dir", "run", "sae-folder", *LAYOUTS, "sae-run"):
        check_kind_of_path(path, where, "file" if sort == "file" else "dir")
    layout_kind = {"sae-run": "sae"}.get(sort, sort)
    if layout_kind in LAYOUTS:
        LAYOUTS[layout_kind].check(path, name)
    if layout_kind == "store":
        check_store(path, where)
    if sort == "run" and detect(path) is None:
        raise BabelprobeError(f"{where} is not a results directory: it holds no run of babelprobe (no manifest "
                              "such as compare.json, no neuro.csv); give the --out of a command that writes one")
    return path


def is_harness_source(value) -> bool:
    from babelprobe.lmeval import is_source

    return is_source(str(value))


def check_tasks(name: str, value: str, sort: str) -> Path:
    """lm-evaluation-harness tasks: for `lm-eval` (bench lm-eval's --items) not an item file; the task folder
    after '@' a readable directory; the harness installed. Whether each task exists, is multiple-choice and
    its data files are readable is the item reader's check (`lmeval.load`, before any data set is read)."""
    from babelprobe import lmeval
    from babelprobe.bundled import bundled_sets

    where = f"{name} {value}" if name else value
    if sort == "lm-eval" and not lmeval.is_source(value) and Path(value).exists():
        raise BabelprobeError(f"{where} is an item file or directory; this command reads lm-evaluation-harness tasks "
                              f"({SORTS['lm-eval']}); give item files to compare, extract or score")
    if sort != "tasks" and value not in bundled_sets(lmeval.NAME):  # a bundled sample: its own folder
        source = lmeval.parse(value if lmeval.is_source(value) else lmeval.PREFIX + value)
        if source.include_path is not None:
            folder = f"{where}: task folder {source.include_path}"
            check_path(Path(source.include_path).expanduser(), folder, "dir")
    lmeval.harness()
    return Path(value)


def check_store(path: Path, where: str) -> None:
    """The store opens and every shard of it opens (a truncated or missing shard is found here, without
    reading its arrays)."""
    from babelprobe.extract.store import open_store

    with open_store(path) as store:
        try:
            store.check_files()
        except BabelprobeError as err:
            raise BabelprobeError(f"{where}: {err}") from None


def check_inputs(**named) -> None:
    """`check_input` for each of a runner's inputs, `parameter=(value, sort)`: the runner's first line, so a
    notebook's call is refused as the command line is."""
    for name, (value, sort) in named.items():
        check_input(name, value, sort)
