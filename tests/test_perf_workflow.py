"""perf/workflow.py must not rot: its smoke run (the acceptance command of the workflow perf issue) runs
every phase of `compare` and its limits, and reports each. No timing is asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_workflow_smoke_run_reports_every_phase(tmp_path):
    out = tmp_path / "workflow.json"
    done = subprocess.run([sys.executable, str(ROOT / "perf" / "workflow.py"), "--shape", "tiny", "--pairs", "4",
                           "--device", "cpu", "--no-progress", "--json", str(out), "--markdown", str(tmp_path / "w.md"),
                           "--tmp", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    phases = {row["phase"]: row for row in report["phases"]}
    assert set(phases) == {"direct", "meta", "extract", "probe", "total"}
    for name in ("direct", "meta", "extract", "probe"):
        assert phases[name]["seconds"] > 0 and phases[name]["limit_seconds"] > 0 and phases[name]["ratio"] > 0, name
    for name in ("direct", "meta", "extract"):
        assert phases[name]["tokens_per_s"] > 0, name
    assert report["run"]["pairs_total"] == 4 * 17 * 4 and "| direct |" in (tmp_path / "w.md").read_text()
