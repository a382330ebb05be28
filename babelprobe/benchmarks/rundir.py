"""Output directories of `babelprobe bench ...` runs: one model per directory, recorded in `run.json`.

`open_run_dir(out, manifest, overwrite)` creates the directory and writes `run.json` (benchmark, model
name and fingerprint, settings). A rerun into the same directory with another model or other
settings is refused unless `overwrite=True`, so rows of two models are never mixed silently; a rerun
with the same model and settings may reuse finished parts (resumable benchmarks).
"""

from __future__ import annotations

import json
from pathlib import Path

from babelprobe.errors import BabelprobeError
from babelprobe.tables import atomic_path, write_table

MANIFEST = "run.json"
ITEMS, SUMMARY = "items.csv", "summary.csv"


def open_run_dir(out: str | Path, manifest: dict, overwrite: bool = False,
                 keys: tuple[str, ...] = ("benchmark", "fingerprint")) -> tuple[Path, bool]:
    """Create `out` and record `manifest`; returns (path, resumed). `resumed` is True when an earlier run
    with the same `keys` left its manifest there (its finished parts may be reused)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BabelprobeError(f"--out {out} exists and is not a directory")
    old = read_manifest(out)
    resumed = False
    if old is not None:
        differs = [k for k in keys if old.get(k) != manifest.get(k)]
        if differs and not overwrite:
            k = differs[0]
            raise BabelprobeError(f"{out / MANIFEST}: this directory holds a run with {k}={old.get(k)!r}, not "
                                  f"{manifest.get(k)!r}; use another --out or pass --overwrite")
        resumed = not differs and not overwrite
    write_manifest(out, manifest)
    return out, resumed


def read_manifest(out: Path) -> dict | None:
    path = Path(out) / MANIFEST
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BabelprobeError(f"{path}: not a readable run manifest ({err}); remove it or use another --out") from err


def write_manifest(out: Path, manifest: dict) -> None:
    with atomic_path(Path(out) / MANIFEST) as tmp:
        tmp.write_text(json.dumps(manifest, indent=1, ensure_ascii=False, default=str), encoding="utf-8")


def write_results(out: Path, rows, summary) -> None:
    """The run's per-item rows and its summary, as `items.csv` and `summary.csv` in `out`."""
    write_table(rows, Path(out) / ITEMS)
    write_table(summary, Path(out) / SUMMARY)


def written(out: Path, rows, figures: list[Path]) -> str:
    """The closing line of a benchmark command: what it wrote where."""
    return f"wrote {len(rows)} rows to {Path(out) / ITEMS}, {Path(out) / SUMMARY}, {figures[1]}"
