"""perf/workflow.py must not rot: its smoke run (the acceptance command of the workflow perf issue) runs
every phase of `compare`, its naive baseline and its floor (the phase's own model or solver calls,
recorded and replayed bare), and reports each. No timing is asserted here; what the floor replays is
checked against the phase's own work: the same token batches as babelprobe's extraction, and only as
many vocabulary rows as the scored tokens."""

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
        row = phases[name]
        assert row["seconds"] > 0 and row["baseline_seconds"] > 0 and row["baseline_ratio"] > 0, name
        assert row["floor_seconds"] > 0 and row["floor_ratio"] > 0, name
        assert row["cpu_seconds"] > 0 and row["floor_cpu_ratio"] > 0, name
    for name in ("direct", "meta", "extract"):
        assert phases[name]["tokens_per_s"] > 0, name
    table = (tmp_path / "w.md").read_text()
    assert report["run"]["pairs_total"] == 4 * 17 * 4 and "| direct |" in table and "floor/babelprobe" in table


def test_floor_records_the_phases_own_model_calls(tiny, tmp_path):
    """The floor replays what babelprobe's own calls were: extraction's token batches exactly as the
    extractor cut them (nothing else run), and for direct scoring one vocabulary row per scored token.
    Replaying gives positive times and leaves the model's forward as it was."""
    sys.path.insert(0, str(ROOT / "perf"))
    import workflow

    from babelprobe.benchmarks.core.logprobs import token_logprobs
    from babelprobe.extract import extract
    from babelprobe.extract.run import shard_batches
    from babelprobe.items import load_items

    items = load_items("xcomps-sample", languages=["en", "de"], limit=6)
    texts = items["text"].tolist()
    calls = workflow.ModelCalls(tiny)
    original = tiny.parts.body.forward
    with calls:
        calls.phase = "extract"
        extract(tiny, items, tmp_path / "acts", progress=False, batch_tokens=64)
        calls.phase = "direct"
        scored = token_logprobs(tiny, texts, batch_tokens=64, progress=False)
        calls.phase = None
        token_logprobs(tiny, texts, batch_tokens=64, progress=False)  # not recorded
    assert tiny.parts.body.forward == original
    lengths = [len(e.ids) for e in tiny.encode(texts)]
    expected = sorted(sorted(lengths[i] for i in batch) for batch in shard_batches(lengths, 64))
    recorded = sorted(sorted(call[1]["attention_mask"].sum(1).tolist()) for call in calls.calls["extract"])
    assert recorded == expected
    rows = sum(call[1][0] for call in calls.calls["direct"] if call[0] == "logits")
    assert rows == sum(s.n_tokens for s in dict(zip(texts, scored)).values())
    for phase in ("extract", "direct"):
        assert min(calls.replay(phase, tiny.device)) > 0


@pytest.mark.slow
def test_one_pair_per_cell_probes_per_language(tmp_path):
    """--pairs 1 leaves one pair per language × negative type, which pair-grouped folds cannot split: the
    probe phase then groups by language (4 pairs, 4 folds) and every phase still runs."""
    out = tmp_path / "workflow.json"
    done = subprocess.run([sys.executable, str(ROOT / "perf" / "workflow.py"), "--shape", "tiny", "--pairs", "1",
                           "--languages", "de,fr,zh", "--device", "cpu", "--no-progress", "--no-baseline",
                           "--json", str(out), "--tmp", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["run"]["folds"] == 4 and report["run"]["pairs_total"] == 3 * 4
    phases = {row["phase"]: row for row in report["phases"]}
    assert phases["probe"]["floor_seconds"] > 0 and phases["probe"]["seconds"] > 0


def test_zero_pairs_is_refused_before_any_work():
    done = subprocess.run([sys.executable, str(ROOT / "perf" / "workflow.py"), "--shape", "tiny", "--pairs", "0",
                           "--device", "cpu"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and "--pairs must be at least 1" in done.stderr
