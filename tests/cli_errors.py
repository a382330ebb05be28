"""The bad-input contract of docs/reliability.md, checked the same way by every test of its catalogue:
the command exits 2 (or `status`) with exactly one line `babelprobe: error: ...` holding every needle and
no traceback (`fails`), and leaves its output as it was: not created when it did not exist, no file added,
removed or changed (`refused`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from babelprobe.cli import main


def fails(argv: list, capsys, *needles: str, status: int = 2) -> str:
    """Run the CLI; it must exit with `status` and print exactly one error line holding every needle."""
    assert main([str(a) for a in argv]) == status
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("babelprobe: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def snapshot(path: Path) -> dict:
    """Every file under `path` with its content hash (empty when `path` does not exist)."""
    if not path.exists():
        return {}
    return {str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest() for f in path.rglob("*") if f.is_file()}


def refused(argv: list, capsys, out: Path, *needles: str) -> str:
    """`fails`, and `out` exactly as it was before (not created when it did not exist)."""
    existed, before = out.exists(), snapshot(out)
    line = fails(argv, capsys, *needles)
    assert out.exists() == existed and snapshot(out) == before
    return line
