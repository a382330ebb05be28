"""perf/workflow.py must not rot: its smoke run (the acceptance command of the workflow perf issue) runs
every phase of `compare`, its naive baseline and its floors (the replay of the phase's own model or solver
calls, a bare forward of the same tokens at each budget of a sweep, the FLOPs over the measured matmul rate),
and reports each; on the simulated device too (perf/simulated.py). No timing is asserted here; what the floors
count is checked against independent counts: the replay against the phase's own batches and scored tokens,
the FLOPs against the model's own parameter count, the simulated model against a real one's shapes."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from babelprobe.models import pad_batch

ROOT = Path(__file__).resolve().parents[1]


def perf(script: str, *args: str, **options) -> subprocess.CompletedProcess:
    """perf/`script` run with `args` from the project's root, its output captured as text."""
    return subprocess.run([sys.executable, str(ROOT / "perf" / script), *args], capture_output=True, text=True,
                          cwd=ROOT, **options)


def printed(script: str, *args: str) -> list[str]:
    """The lines perf/`script` printed, run with `args`; it must succeed."""
    done = perf(script, *args)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def round_rows(lines: list[str]) -> list[list[str]]:
    """The cells of a printed table's rows that start with a round number."""
    return [line.split(" | ") for line in lines if line.startswith("| ") and line[2].isdigit()]


def run_workflow(tmp_path, *options):
    out = tmp_path / "workflow.json"
    done = perf("workflow.py", "--no-progress", "--json", str(out), "--markdown", str(tmp_path / "w.md"),
                "--tmp", str(tmp_path), *options)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    return report, {row["phase"]: row for row in report["phases"]}, (tmp_path / "w.md").read_text()


@pytest.mark.slow
def test_workflow_smoke_run_reports_every_phase(tmp_path):
    report, phases, table = run_workflow(tmp_path, "--shape", "tiny", "--pairs", "4", "--device", "cpu",
                                         "--baseline", "--separate")
    assert set(phases) == {"direct", "meta", "extract", "probe", "total"}
    for name in ("direct", "meta", "extract", "probe"):
        row = phases[name]
        assert row["seconds"] > 0 and row["baseline_seconds"] > 0 and row["baseline_ratio"] > 0, name
        assert row["floor_seconds"] > 0 and 0 < row["floor_ratio"], name
        assert row["cpu_seconds"] > 0 and row["host_ms_per_pair"] > 0, name
    for name in ("direct", "meta", "extract"):  # the model phases have all three floors and an MFU
        row = phases[name]
        assert row["floor_replay"] > 0 and row["floor_bare"] > 0 and row["floor_arithmetic"] > 0, name
        assert row["floor_seconds"] == min(row["floor_replay"], row["floor_bare"], row["floor_arithmetic"]), name
        assert row["bare_budget"] in (1024, 2048, 4096, 8192) and 0 < row["mfu"], name
    assert phases["total"]["flops"] == sum(phases[name]["flops"] for name in ("direct", "meta", "extract"))
    # extraction separate: the store's writer is its phase's, none in direct's
    assert 0 <= phases["extract"]["store_busy"] <= 1 and "store_busy" not in phases["direct"]
    assert report["run"]["pairs_total"] == 4 * 17 * 4 and "| direct |" in table and "floor/babelprobe" in table
    assert "the whole XCOMPS (244,256 pairs)" in table


@pytest.mark.parametrize("device", ["simulated", "simulated-gpu"])
def test_the_simulated_device_reports_host_device_and_overlap(tmp_path, device):
    """The acceptance measure of issue 40 item 4 at a tiny size: host and simulated device ms per pair and
    wall / max(host, device) for every model phase, extraction fused into direct scoring; the queued device
    (`simulated-gpu`) also gives its busy share, as NVML gives a GPU's."""
    report, phases, table = run_workflow(tmp_path, "--shape", "tiny", "--pairs", "2", "--languages", "de,zh",
                                         "--device", device, "--sweep-tokens", "200", "--probe-layers", "0",
                                         "--profile", str(tmp_path / "meta.json.gz"))
    if device == "simulated-gpu":
        assert all(0 <= phases[name]["gpu_busy"] <= 1 for name in ("direct", "meta"))  # tiny: ~0 busy
    assert "simulated" in report["run"]["hardware"] and "wall/max(host, device)" in table
    assert "| driving thread CPU s |" in table
    # the meta phase profiled: its Chrome trace (the stand-in's operators) and the operators' totals
    with gzip.open(tmp_path / "meta.json.gz", "rt") as trace:
        assert any("aten::" in event.get("name", "") for event in json.load(trace)["traceEvents"])
    summary = (tmp_path / "meta.json.gz.txt").read_text()
    assert "Self CPU" in summary and "no device work in the trace" in summary  # no GPU kernels to place
    for name in ("direct", "meta"):
        row = phases[name]
        assert row["host_ms_per_pair"] > 0 and row["device_ms_per_pair"] > 0 and row["overlap"] > 0, name
        tick = 1000 * 0.02 / report["run"]["pairs_total"]  # os.times counts the kernel's share in 10 ms ticks
        assert 0 <= row["host_sys_ms_per_pair"] <= row["host_ms_per_pair"] + tick, name
        # the driving thread's CPU is part of the process's; on the synchronous device the thread is held for the
        # device's seconds without running, so its CPU, the device's time and its run-queue wait fit in the wall
        # (the device's sleeps keep to its charges within one oversleep, a few ms)
        assert 0 < row["driving_cpu_s"] <= row["cpu_seconds"] + 0.01, name
        if device == "simulated":
            assert row["driving_wait_s"] >= -0.02, name
        else:
            assert row["driving_wait_s"] is None, name
    assert phases["extract"]["floor"] == "fused into direct"
    # the store written in direct's passes: whether its writer set the pace (the loop's wait, the drain after)
    direct = phases["direct"]
    assert direct["store_wait_s"] >= 0 and direct["store_drain_s"] >= 0 and 0 <= direct["store_busy"] <= 1
    assert direct["store_mb"] > 0 and "| store MB |" in table
    assert "store_busy" not in phases["meta"] and "| store writers busy |" in table
    assert phases["probe"]["seconds"] > 0  # perf/README.md's command probes layer 0 only (--probe-layers)


def test_the_queued_simulated_device_runs_beside_the_host_and_waits_where_a_gpu_waits():
    """`--device simulated-gpu`'s clock (perf/simulated.py `Device(queued=True)`), on a clock of its own: work
    starts when the work before it is done or when it is launched, whichever is later; a launch returns at
    once; a synchronisation waits for what was queued; the synchronous device holds the thread at once."""
    sys.path.insert(0, str(ROOT / "perf"))
    import simulated

    now, slept = [0.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    rates = simulated.Rates(1.0, 1.0, "test")
    device = simulated.Device(rates, queued=True, clock=lambda: now[0], sleep=sleep)
    device.charge(2.0)  # launched at 0: done at 2
    now[0] = 0.5
    device.charge(1.0)  # queued behind it: done at 3
    device.settle()
    assert slept == [] and device.free_at == 3.0  # the host goes on
    now[0] = 5.0
    device.charge(1.0)  # launched after the device went idle at 3: done at 6
    device.wait()
    assert slept == [1.0] and now[0] == 6.0 and device.busy == 4.0
    held = simulated.Device(rates, clock=lambda: now[0], sleep=sleep)
    held.charge(2.0)
    held.wait()  # nothing queued: the synchronous device has done its work when its thread comes back
    held.settle()
    assert slept == [1.0, 2.0]


def test_trace_gaps_names_the_host_work_the_device_waited_for():
    """The device's idle gaps in a profiler trace, and per thread the innermost host event meanwhile, against
    a trace whose answer is worked out by hand (µs): kernels [0, 10], [12, 20], [50, 60]; one gap of at
    least 5 µs, [20, 50]."""
    sys.path.insert(0, str(ROOT / "perf"))
    import trace_gaps

    def event(cat, name, ts, dur, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}

    events = [event("kernel", "k1", 0, 10, 7), event("kernel", "k2", 12, 8, 7), event("gpu_memcpy", "c", 50, 10, 7),
              event("cpu_op", "launch", 0, 25), event("cpu_op", "aten::mm", 5, 17), event("python_function", "plan", 25, 20),
              event("python_function", "prepare", 15, 45, tid=2)]
    result = trace_gaps.summary(events, min_gap_us=5)
    assert (result["busy_us"], result["span_us"], result["gaps"], result["idle_us"]) == (28, 60, 1, 30)
    assert dict(result["host"]) == {((0, 2), "prepare"): 30, ((0, 1), "plan"): 20, ((0, 1), "launch"): 3,
                                    ((0, 1), "aten::mm"): 2}


def test_trace_gaps_gives_the_device_time_to_the_operators_that_launched_it():
    """Each kernel's time goes to the chain of host operators open at its launch (matched by correlation id),
    worked out by hand: a copy launched inside reshape > clone > copy_, two matmuls inside mm, a kernel whose
    launch is outside any operator, and one with no launch in the trace (left out)."""
    sys.path.insert(0, str(ROOT / "perf"))
    import trace_gaps

    def event(cat, name, ts, dur, tid=1, correlation=None):
        args = {} if correlation is None else {"correlation": correlation}
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid, "args": args}

    events = [event("cpu_op", "aten::reshape", 0, 10), event("cpu_op", "aten::clone", 1, 8),
              event("cpu_op", "aten::copy_", 2, 5), event("cuda_runtime", "cudaLaunchKernel", 3, 1, correlation=1),
              event("cpu_op", "aten::mm", 20, 5), event("cuda_driver", "cuLaunchKernelEx", 21, 1, correlation=2),
              event("cpu_op", "aten::mm", 30, 5), event("cuda_driver", "cuLaunchKernelEx", 31, 1, correlation=3),
              event("cuda_runtime", "cudaMemcpyAsync", 40, 1, correlation=4),
              event("kernel", "copy", 5, 30, tid=7, correlation=1),
              event("kernel", "gemm", 40, 50, tid=7, correlation=2),
              event("kernel", "gemm", 90, 70, tid=7, correlation=3),
              event("gpu_memcpy", "h2d", 160, 4, tid=7, correlation=4),
              event("kernel", "orphan", 170, 9, tid=7, correlation=99)]
    assert trace_gaps.by_launcher(events) == [("aten::mm", 120, 2),
                                              ("aten::reshape > aten::clone > aten::copy_", 30, 1),
                                              ("(no operator)", 4, 1)]
    assert trace_gaps.by_launcher(events, depth=2)[1][0] == "aten::reshape > aten::clone"
    # each thread's time in the runtime's and driver's calls, worked out by hand
    waits = events + [event("cuda_runtime", "cudaStreamSynchronize", 50, 40), event("cuda_runtime", "cudaLaunchKernel",
                                                                               95, 2, tid=2)]
    assert trace_gaps.runtime_calls(waits) == [((0, 1), "cudaStreamSynchronize", 40, 1),
                                               ((0, 1), "cuLaunchKernelEx", 2, 2), ((0, 2), "cudaLaunchKernel", 2, 1),
                                               ((0, 1), "cudaLaunchKernel", 1, 1), ((0, 1), "cudaMemcpyAsync", 1, 1)]


def test_matmul_shapes_times_every_weight_shape(capsys):
    """perf/matmul_shapes.py (the host cost of a matmul shape not seen before, for the next lent GPU) runs on a
    CPU at the tiny shape: a row per distinct weight shape of a block, fresh M drawn under the budget."""
    sys.path.insert(0, str(ROOT / "perf"))
    import matmul_shapes

    result = matmul_shapes.measure("tiny", torch.device("cpu"), torch.float32, passes=5, budget=600, bucket=256, seed=0)
    assert result["fresh_m"] == 5 and 1 <= result["buckets"] <= 3
    assert [name for name, _, _ in matmul_shapes.weight_shapes("llama-3.1-8b")] == list(result["by_shape"])
    assert all(len(times[kind]) == 5 and min(times[kind]) > 0
               for times in result["by_shape"].values() for kind in times)
    assert matmul_shapes.main(["--device", "cpu", "--shape", "tiny", "--passes", "3", "--budget", "400"]) == 0
    assert "| down_proj |" in capsys.readouterr().out


def test_event_wait_finds_pytorchs_own_cuda_runtime_and_needs_a_gpu(capsys):
    """perf/event_wait.py (for the next lent GPU) sets the context's scheduling flag through the libcudart PyTorch
    loaded, found in /proc/self/maps (a maps text written by hand: the first library of that name, not a path that
    only contains it); on a machine without CUDA it refuses in one line, exit 2."""
    sys.path.insert(0, str(ROOT / "perf"))
    import event_wait

    maps = ("7f00-7f10 r--p 00000000 08:01 11 /opt/libcudart_helper/libz.so.1\n"
            "7f10-7f20 r-xp 00000000 08:01 12 /env/site-packages/nvidia/cu13/lib/libcudart.so.13\n"
            "7f20-7f30 rw-p 00000000 00:00 0 \n")
    assert event_wait.loaded_library("libcudart.so", maps) == "/env/site-packages/nvidia/cu13/lib/libcudart.so.13"
    assert event_wait.loaded_library("libcudart.so", maps.splitlines()[0]) is None
    if not torch.cuda.is_available():
        assert event_wait.main(["--context-flag", "blocking"]) == 2
        assert capsys.readouterr().err.strip().count("\n") == 0


def test_floor_records_the_phases_own_model_calls(tiny, tmp_path):
    """The floor replays what babelprobe's own calls were: extraction's token batches exactly as the
    extractor cut them (each distinct text once, nothing else run), and for direct scoring one vocabulary row per distinct state that
    predicts a scored token in each batch (the token prefix before it). Replaying gives positive times and
    leaves the model's forward as it was."""
    sys.path.insert(0, str(ROOT / "perf"))
    import floors

    from babelprobe.benchmarks.core.logprobs import token_logprobs
    from babelprobe.extract import extract
    from babelprobe.items import load_items
    from babelprobe.models import length_batches, pass_tokens

    items = load_items("xcomps-sample", languages=["en", "de"], limit=6)
    texts = items["text"].tolist()
    calls = floors.ModelCalls(tiny)
    original = tiny.parts.body.forward
    with calls:
        calls.phase = "extract"
        extract(tiny, items, tmp_path / "acts", progress=False, batch_tokens=64)
        calls.phase = "direct"
        scored = token_logprobs(tiny, texts, batch_tokens=64, progress=False)
        calls.phase = None
        token_logprobs(tiny, texts, batch_tokens=64, progress=False)  # not recorded
    assert tiny.parts.body.forward == original
    # the items fit one shard, where a text that recurs runs once (the acceptable sentence of each negative type)
    lengths = [len(e.ids) for e in tiny.encode(list(dict.fromkeys(texts)))]
    assert len(lengths) < len(texts)
    expected = sorted(sorted(lengths[i] for i in batch) for batch in length_batches(lengths, 64, pass_tokens(tiny.device)))
    recorded = sorted(sorted(call[1]["attention_mask"].sum(1).tolist()) for call in calls.calls["extract"])
    assert recorded == expected
    rows = sum(call[1][0] for call in calls.calls["direct"]  # each row once (a CPU projects blocks of the vocabulary)
               if call[0] == "logits" and (call[3] is None or call[3].start == 0))
    distinct = [tiny.encode([t])[0].ids for t in dict.fromkeys(texts)]
    batches = length_batches([len(ids) for ids in distinct], 64, pass_tokens(tiny.device))
    states = sum(len({tuple(distinct[i][:p]) for i in batch for p in range(1, len(distinct[i]))}) for batch in batches)
    assert rows == states < sum(s.n_tokens for s in dict(zip(texts, scored)).values())
    for phase in ("extract", "direct"):
        assert min(calls.replay(phase, tiny.device)) > 0


@pytest.mark.slow
def test_one_pair_per_cell_probes_per_language(tmp_path):
    """--pairs 1 leaves one pair per language × negative type, which pair-grouped folds cannot split: the
    probe phase then groups by language (4 pairs, 4 folds) and every phase still runs."""
    out = tmp_path / "workflow.json"
    done = perf("workflow.py", "--shape", "tiny", "--pairs", "1", "--languages", "de,fr,zh", "--device",
                "cpu", "--no-progress", "--replay-only", "--json", str(out), "--tmp", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["run"]["folds"] == 4 and report["run"]["pairs_total"] == 3 * 4
    phases = {row["phase"]: row for row in report["phases"]}
    assert phases["probe"]["floor_seconds"] > 0 and phases["probe"]["seconds"] > 0


def test_zero_pairs_is_refused_before_any_work():
    done = perf("workflow.py", "--shape", "tiny", "--pairs", "0", "--device", "cpu", timeout=120)
    assert done.returncode == 2 and "--pairs must be at least 1" in done.stderr


def test_synthetic_pairs_are_distinct_and_sample_shaped():
    """Every synthetic pair is new (no pair repeats within a cell while the sample allows), is a valid item
    set, keeps the sample's way of joining concept and property (a text is prefix + join + continuation) and
    XCOMPS's sharing of acceptable sentences."""
    sys.path.insert(0, str(ROOT / "perf"))
    import workflow

    from babelprobe.items import load_items, to_pairs

    items = load_items(workflow.synthetic_items(40, ("de", "zh", "ar"), seed=1))  # ar: a stand-in language
    pairs = to_pairs(items)
    assert len(pairs) == 40 * 3 * 4 and not pairs.duplicated(["language", "subset", "text_good", "text_bad"]).any()
    sample = load_items("xcomps-sample")
    joins = {row.language: row.text[len(row.prefix):len(row.text) - len(row.continuation)]
             for row in sample.itertuples()}
    for row in items[items["language"] == "de"].itertuples():
        assert row.text == row.prefix + joins["de"] + row.continuation
    # XCOMPS's structure: pair k of a language has one acceptable sentence in all four negative types, and no
    # text is in two languages (a stand-in's are tagged with its code)
    good = items[items["label"] == 1].groupby(["language", "subset"])["text"].apply(list)
    for language in ("de", "zh", "ar"):
        assert all(good[language, subset] == good[language, workflow.SUBSETS[0]] for subset in workflow.SUBSETS)
    assert items.groupby("text")["language"].nunique().max() == 1
    assert items[items["language"] == "ar"]["text"].str.startswith("ar: ").all()
    assert workflow.pair_count("xcomps") * 17 * 4 == 244_256


def test_flops_count_the_models_own_weights(tiny):
    """The FLOPs per token are 2 × the decoder blocks' weights (counted here from the model's own parameters,
    norms aside), plus the attention products over the causal context, plus 2 × d × vocabulary per row."""
    sys.path.insert(0, str(ROOT / "perf"))
    import floors

    config = tiny.model.config
    weights = sum(p.numel() for name, p in tiny.parts.layers.named_parameters() if p.dim() == 2)
    head_dim = config.hidden_size // config.num_attention_heads
    lengths, rows = [3, 5], 4
    attention = 4 * config.num_hidden_layers * config.num_attention_heads * head_dim * (3 * 4 / 2 + 5 * 6 / 2)
    expected = 2 * weights * 8 + attention + 2 * config.hidden_size * config.vocab_size * rows
    assert floors.Work(lengths, rows).flops(config, config.vocab_size) == pytest.approx(expected, rel=1e-12)


def test_the_simulated_model_has_a_real_models_shapes(tiny):
    """The stand-in (no values) gives the shapes a real model of the same config gives: hidden states, logits
    rows, KV caches and the scorers' per-token log-probs; reads back as zeros; charges its device."""
    sys.path.insert(0, str(ROOT / "perf"))
    import simulated

    import babelprobe.extract.fused as fused
    from babelprobe.benchmarks.core.logprobs import token_logprobs
    from babelprobe.benchmarks.core.prefix import shared_prefix_logprobs
    from babelprobe.extract.capture import Pooler

    lm, device = simulated.simulated_model("tiny", tiny.model.config, tiny.tokenizer, torch.float32)
    assert fused.Pooler is Pooler  # building the stand-in leaves real extraction as it is (workflow patches it)
    texts = ["A dog can bark.", "Ein Hund kann bellen.", "A dog can"]
    real, fake = token_logprobs(tiny, texts, progress=False), token_logprobs(lm, texts, progress=False)
    assert [r.ids for r in real] == [f.ids for f in fake] and all((f.logprobs == 0).all() for f in fake)
    real = shared_prefix_logprobs(tiny, texts, [2, 4, 2], progress=False)
    fake = shared_prefix_logprobs(lm, texts, [2, 4, 2], progress=False)
    assert [r.n_tokens for r in real] == [f.n_tokens for f in fake]
    batch = pad_batch(tiny.encode(texts), tiny.pad_token_id, "right", "cpu")
    with torch.inference_mode():
        hidden = lm.parts.body(**batch, use_cache=False).last_hidden_state
        expected = tiny.parts.body(**batch, use_cache=False).last_hidden_state
        assert hidden.shape == expected.shape and lm.parts.logits(hidden[:, -1]).shape == (3, tiny.parts.head.weight.shape[0])
        assert torch.equal(hidden[:, 0].cpu(), torch.zeros(3, tiny.d_model))
    assert device.busy > 0


def test_store_floor_times_the_floor_and_babelprobe_on_one_shard(tmp_path):
    """perf/store_floor.py at a tiny size: the floor's three parts, their sum and babelprobe's own work on the
    same shard, each per pair, and the ratios, then the shard's read back against HDF5's (no timing asserted); the
    shard it wrote is gone afterwards."""
    lines = printed("store_floor.py", "--layers", "2", "--d-model", "8", "--rows", "6", "--repeat", "1", "--tmp",
                    str(tmp_path))
    assert lines[0].startswith("one shard: 6 items x 2 layers x 8, bfloat16")
    named = [line.split(" | ")[0].strip("| ") for line in lines if line.startswith("| ") and "---" not in line]
    assert named[1:6] == ["sha256", "write", "copy", "floor (their sum)", "babelprobe: assembly + write_shard"]
    assert named[6:] == ["read back", "HDF5's read into one buffer (floor)", "read_layers to the host (float32)",
                         "read_layers to cpu"]
    assert any(line.startswith("floor/babelprobe: ") for line in lines)
    assert any(line.startswith("device 0.764 ms per pair: floor/device ") for line in lines)
    assert list(tmp_path.iterdir()) == []


def test_store_pages_writes_and_reads_a_store_with_its_pages_kept_and_dropped(tmp_path):
    """perf/store_pages.py at a tiny size: a row per round, kept and dropped in turn, with the store's write and
    read back (no timing asserted); each round's store is gone afterwards."""
    lines = printed("store_pages.py", "--layers", "2", "--d-model", "8", "--gb", "0.0003", "--rounds", "2",
                    "--tmp", str(tmp_path))
    assert lines[0].startswith("5 shards of 0 MB (2 layers × 8, bfloat16)")
    rounds = round_rows(lines)
    assert [(r[0], r[1]) for r in rounds] == [("| 1", "kept"), ("| 2", "dropped")]
    assert all(len(r) == 9 and float(r[2]) == 0.0 and float(r[3]) > 0 and float(r[7]) >= 0 for r in rounds)
    assert list(tmp_path.iterdir()) == []
    for flags, words in ((["--tmp", str(tmp_path / "absent")], "no such directory"), (["--modes", "x"], "choose from"),
                         (["--gb", "0"], "must be positive")):
        refused = perf("store_pages.py", *flags)
        assert refused.returncode == 2 and words in refused.stderr and "Traceback" not in refused.stderr


def test_store_reads_reads_both_layouts_alike(tmp_path):
    """perf/store_reads.py at a tiny size: XCOMPS-shaped items (a language's acceptable sentences recur in its
    four negative types), the store with every row and with a text once read group by group, warm and cold, to
    the same values (the script checks; no timing asserted); the pointing store is the smaller."""
    lines = printed("store_reads.py", "--pairs", "6", "--layers", "2", "--d-model", "8", "--rounds", "2",
                    "--tmp", str(tmp_path))
    assert lines[0].startswith("48 items (30 distinct texts) of 1 language(s), 2 layers × 8 in bfloat16")
    rounds = round_rows(lines)
    assert len(rounds) == 12 and {(r[1], r[2], r[3]) for r in rounds} == {
        (p, read, k) for p, read in (("warm", "all layers"), ("cold", "all layers"), ("warm", "layer 0"))
        for k in ("every row", "pointing")}
    assert float(lines[-1].split()[-1]) < 1  # shard bytes: pointing ÷ every row
    assert list(tmp_path.iterdir()) == []
    refused = perf("store_reads.py", "--rounds", "0")
    assert refused.returncode == 2 and "at least 1" in refused.stderr and "Traceback" not in refused.stderr


def test_simulated_fits_take_a_gpus_time_one_call_at_a_time(monkeypatch):
    """perf/probe_phase.py's `--device simulated`: the sweep's fits hold their thread for the H200's time scaled by
    their size, one call at a time, return scores and probes of the right shapes, and the groups in flight and the
    solvers' memory are a GPU's; everything is restored afterwards, and a sweep runs through it."""
    sys.path.insert(0, str(ROOT / "perf"))
    import probe_phase

    import babelprobe.probes.run as runner
    from babelprobe.probes import synthetic_activations
    from babelprobe.probes.run import probe_store
    from babelprobe.probes.source import ArrayStore

    slept = []
    monkeypatch.setattr(probe_phase.time, "sleep", slept.append)
    before = runner.fit_predict, runner.solver_memory_gb, runner.group_workers
    with probe_phase.SimulatedFits() as fits:
        assert runner.group_workers(None, "torch", None, 68) == runner.ACCELERATOR_GROUPS
        assert runner.group_workers(3, "torch", None, 68) == 3
        assert runner.solver_memory_gb(None) == probe_phase.GPU_MEMORY_GB
        X, y, train = np.zeros((1796, 33, 8)), np.zeros((6, 1796), int), np.ones((6, 1796), bool)
        scores, fit = runner.fit_predict(X, y, train, 1.0, return_fit=True)
        assert scores.shape == (6, 33, 1796) and fit.coef.shape == (6, 33, 8) and fit.intercept.shape == (6, 33)
        assert slept == [pytest.approx(probe_phase.GPU_FIT_SECONDS * 8 / 4096, rel=1e-12)]
        assert fits.replay(None) == (slept[0], 0.0)
        keys, values = synthetic_activations(n_pairs=4, n_layers=2, d_model=4, languages=["en", "de"],
                                             subsets=["a"], seed=0)
        result = probe_store(ArrayStore(keys, last=values, n_layers=2), folds=2)
        assert len(result.table) == 2 * 3 and len(slept) == 1 + 2
    assert (runner.fit_predict, runner.solver_memory_gb, runner.group_workers) == before


def test_probe_phase_times_the_sweep_and_its_replayed_fits(tmp_path):
    """perf/probe_phase.py on a tiny store: a row per round with the phase, its parts and the replayed fits,
    and the median ratio (no timing asserted); its results go to a temporary folder that is gone afterwards."""
    from babelprobe.extract.store import write_store

    rng = np.random.default_rng(0)
    keys = pd.DataFrame([{"item_id": f"{lang}-{subset}-{k}-{side}", "pair_id": f"{lang}-{subset}-{k}", "language": lang,
                          "subset": subset, "label": int(side == "good")}
                         for lang in ("en", "de") for subset in ("a", "b") for k in range(3) for side in ("good", "bad")])
    write_store(tmp_path / "acts", keys, last=rng.normal(size=(len(keys), 3, 8)), n_layers=2)
    (tmp_path / "out").mkdir()
    lines = printed("probe_phase.py", "--acts", str(tmp_path / "acts"), "--folds", "3", "--repeat", "2", "--tmp",
                    str(tmp_path / "out"))
    assert ": 24 items, 4 groups of 6–6 items, 3 layers × 8, 3 folds, " in lines[0]
    rounds = [line for line in lines if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rounds) == 2 and all(len(line.split("|")) == 9 for line in rounds)
    assert lines[-1].startswith("floor/phase, median of rounds 2–2: ")
    assert list((tmp_path / "out").iterdir()) == []
    missing = perf("probe_phase.py", "--acts", str(tmp_path))
    assert missing.returncode == 2 and "no activation store there" in missing.stderr
    no_tmp = perf("probe_phase.py", "--acts", str(tmp_path / "acts"), "--tmp", str(tmp_path / "absent"))
    assert no_tmp.returncode == 2 and "--tmp" in no_tmp.stderr and "no such directory" in no_tmp.stderr
    # without a store: XCOMPS-shaped items (17 languages × 4 types × 2 pairs) with random activations
    synthetic = perf("probe_phase.py", "--pairs", "2", "--layers", "2", "--d-model", "4", "--folds", "2",
                     "--repeat", "1")
    assert synthetic.returncode == 0, synthetic.stderr[-2000:]
    assert synthetic.stdout.startswith("synthetic: 272 items, 68 groups of 4–4 items, 2 layers × 4, 2 folds, ")
    both = perf("probe_phase.py", "--acts", str(tmp_path / "acts"), "--pairs", "2")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    # the first 2 languages' groups written to a bfloat16 store and probed from it, 3 groups in flight, the first
    # round profiled
    stored = perf("probe_phase.py", "--pairs", "2", "--layers", "2", "--d-model", "4", "--folds", "2",
                  "--repeat", "1", "--languages", "2", "--on-disk", "bfloat16", "--profile",
                  str(tmp_path / "trace.json.gz"), "--tmp", str(tmp_path / "out"), "--workers", "3,1")
    assert stored.returncode == 0, stored.stderr[-2000:]
    assert "synthetic (bfloat16 store): 32 items, 8 groups of 4–4 items, 2 layers × 4, 2 folds, " in stored.stdout
    assert [line.split("|")[2].strip() for line in stored.stdout.splitlines() if line.startswith("| 1 |")] == ["3", "1"]
    assert "at 3 workers: " in stored.stdout and "at 1 workers: " in stored.stdout
    simulated = perf("probe_phase.py", "--pairs", "2", "--layers", "2", "--d-model", "4", "--folds", "2",
                     "--repeat", "1", "--languages", "1", "--device", "simulated")
    assert simulated.returncode == 0, simulated.stderr[-2000:]
    assert "on a simulated GPU" in simulated.stdout and "| the fits' device s (floor) |" in simulated.stdout
    for wrong in ("0", "2,2", "two"):
        refused = perf("probe_phase.py", "--pairs", "2", "--workers", wrong)
        assert refused.returncode == 2 and "--workers" in refused.stderr and "Traceback" not in refused.stderr
    assert (tmp_path / "trace.json.gz").stat().st_size > 0 and (tmp_path / "trace.json.gz.txt").exists()
    assert list((tmp_path / "out").iterdir()) == []
    refused = perf("probe_phase.py", "--acts", str(tmp_path / "acts"), "--on-disk", "bfloat16")
    assert refused.returncode == 2 and "--on-disk" in refused.stderr
    too_many = perf("probe_phase.py", "--pairs", "2", "--layers", "2", "--d-model", "4", "--folds", "5",
                    "--repeat", "1")
    assert too_many.returncode == 2 and "Traceback" not in too_many.stderr
    assert too_many.stderr.strip().splitlines() == [too_many.stderr.strip()] and "fewer than --folds 5" in too_many.stderr


def test_the_simulated_devices_shape_rules_agree_with_the_meta_devices():
    """perf/simulated.py works out the hot operations' shapes itself (the meta device's own rules run in Python
    and cost 40–400 µs a call, far more than a kernel launch); each gives the shape and dtype the meta device
    gives, and a slice its strides too, and leaves a permuted operand to the meta device's own rule."""
    sys.path.insert(0, str(ROOT / "perf"))
    import simulated

    aten = torch.ops.aten
    x, flags = torch.empty(3, 4, 5, 6, device="meta"), torch.empty(3, 5, dtype=torch.bool, device="meta")
    half = torch.empty(4, 5, 6, dtype=torch.bfloat16, device="meta")
    cases = [(aten.slice.Tensor, (x, 2, 1, None)), (aten.slice.Tensor, (x, -1, -4, 100, 2)),
             (aten.slice.Tensor, (x, 0, 5, 2)), (aten.slice.Tensor, (x.permute(0, 2, 1, 3), 1, 0, 3)),
             (aten.sub.Tensor, (x, half)), (aten.sub.Tensor, (half, 2.5)),
             (aten.sub.Tensor, (torch.empty(3, 1, 5, 6, dtype=torch.float64, device="meta"), x)),
             (aten.amax.default, (x, [-1], True)), (aten.amax.default, (x, [1, 2])), (aten.amax.default, (x,)),
             (aten.sum.dim_IntList, (x, [0])), (aten.sum.dim_IntList, (flags, [-1])),
             (aten.sum.dim_IntList, (half, None, True))]
    for func, args in cases:
        expected = func(*args)
        got = simulated.SHAPE_RULES[func](*(simulated.SimTensor(a) if isinstance(a, torch.Tensor) else a for a in args))
        assert (got.shape, got.dtype) == (expected.shape, expected.dtype), (func, args[1:])
        if func is aten.slice.Tensor:
            assert got.stride() == expected.stride(), args[1:]
    assert simulated.SHAPE_RULES[aten.sub.Tensor](simulated.SimTensor(x.permute(3, 2, 1, 0)), 1.0) is None


@pytest.mark.parametrize("scorer", ["meta", "direct"])
def test_stages_times_each_chunks_steps_on_the_simulated_device(tmp_path, scorer):
    """perf/stages.py must not rot: one scorer's run on the stand-in, each chunk's preparation, run and finishing
    timed in order, the device's seconds all charged inside the runs, and the start and the tail of the run."""
    done = perf("stages.py", "--scorer", scorer, "--shape", "tiny", "--pairs", "2", "--languages", "de,zh",
                "--batch-tokens", "256", "--repeat", "1", "--tmp", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ") and "chunk" not in line]
    assert [int(row[0]) for row in rows] == list(range(len(rows))) and rows
    summary = done.stdout.strip().splitlines()[-1]
    numbers = dict(zip(("wall", "device", "host"), (float(summary.split()[i]) for i in (1, 4, 7))))
    assert abs(sum(float(row[3]) for row in rows) - numbers["device"]) < 1e-3 * len(rows) + 1e-9
    assert 0 < numbers["device"] <= numbers["wall"] and "the run ended" in summary


@pytest.mark.parametrize("flag", [["--batch-tokens", "0"], ["--pairs", "0"], ["--repeat", "0"], ["--tmp", "/no/such"]])
def test_stages_refuses_bad_settings_before_any_model(flag):
    done = perf("stages.py", *flag, timeout=60)
    assert done.returncode == 2 and flag[0] in done.stderr and "Traceback" not in done.stderr
