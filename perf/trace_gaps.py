"""Where the GPU waits, read from a torch profiler Chrome trace (`perf/workflow.py --profile FILE`).

The GPU's busy time is the union of its kernels' and copies' intervals; the gaps between them are its waits.
For each gap this names what the host threads were inside at the time: the deepest operator or Python
function (`cpu_op`, `python_function`, `user_annotation`) of each thread, weighted by how much of the gap it
covered, so the table says which host work the device waited for (launching a forward's operators, building
a prefix tree, a read back). A text summary, for a machine where the trace cannot be looked at.

It also gives the device's time by the host operators that launched each kernel (`by_launcher`: the outermost
`cpu_op`s open at the launch, matched through its correlation id), which tells one copy from another
(transformers' `repeat_kv` is `aten::reshape > aten::clone > aten::copy_`), and each thread's time in CUDA's runtime
and driver calls (`runtime_calls`): launches that block on a full queue, or waits for the device.

    python perf/trace_gaps.py meta-trace.json.gz [--min-gap-ms 0.05] [--top 25]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict

import numpy as np

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "python_function", "user_annotation", "cuda_runtime", "cuda_driver")


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def busy_intervals(events: list[dict]) -> list[tuple[float, float]]:
    """The device's busy intervals (µs), merged."""
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                   if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES)
    merged: list[list[float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def summary(events: list[dict], min_gap_us: float = 50.0, top: int = 25) -> dict:
    """Busy and idle microseconds of the device between its first and last work, and the host's doing
    during the idle gaps of at least `min_gap_us`: [((pid, tid), name), µs of gaps it covered (innermost)]."""
    busy = busy_intervals(events)
    if not busy:
        return {"busy_us": 0.0, "span_us": 0.0, "gaps": 0, "idle_us": 0.0, "host": []}
    gaps = [(a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] - a[1] >= min_gap_us]
    threads = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in HOST_CATEGORIES:
            threads[(e.get("pid"), e.get("tid"))].append(e)
    covered: dict[tuple, float] = defaultdict(float)
    for thread, evs in threads.items():
        starts = np.array([e["ts"] for e in evs], dtype=float)
        ends = starts + np.array([e.get("dur", 0) for e in evs], dtype=float)
        for start, end in gaps:
            inside = [evs[i] for i in np.flatnonzero((starts < end) & (ends > start))]
            for name, us in _innermost(inside, start, end).items():
                covered[(thread, name)] += us
    span = busy[-1][1] - busy[0][0]
    return {"busy_us": sum(b - a for a, b in busy), "span_us": span, "gaps": len(gaps),
            "idle_us": sum(b - a for a, b in gaps), "host": sorted(covered.items(), key=lambda kv: -kv[1])[:top]}


def _innermost(evs: list[dict], start: float, end: float) -> dict:
    """µs of [start, end) spent in each innermost event of one thread (the latest-starting one that covers
    the moment), between consecutive event boundaries."""
    out: dict = defaultdict(float)
    cuts = sorted({start, end, *(max(start, e["ts"]) for e in evs), *(min(end, e["ts"] + e.get("dur", 0)) for e in evs)})
    for a, b in zip(cuts, cuts[1:]):
        live = [e for e in evs if e["ts"] <= a and e["ts"] + e.get("dur", 0) >= b]
        if live:
            out[max(live, key=lambda e: e["ts"])["name"]] += b - a
    return out


def by_launcher(events: list[dict], depth: int = 4, top: int = 25) -> list[tuple[str, float, int]]:
    """Device µs and kernel count per chain of host operators (`cpu_op`s, outermost first, at most `depth`
    deep) open at the launch of each kernel or copy, matched by its correlation id; largest first."""
    chain_of = _launch_chains(events, depth)
    totals: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES:
            key = chain_of.get(e.get("args", {}).get("correlation"))
            if key is not None:
                totals[key][0] += e.get("dur", 0)
                totals[key][1] += 1
    return sorted(((key, us, n) for key, (us, n) in totals.items()), key=lambda row: -row[1])[:top]


def _launch_chains(events: list[dict], depth: int) -> dict:
    """correlation id -> the host operators open at that launch on its thread (operators on a thread nest:
    one sweep in time order with a stack of open ones)."""
    by_thread = defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        thread = (e.get("pid"), e.get("tid"))
        if e.get("cat") == "cpu_op":
            by_thread[thread].append((e["ts"], 0, e["ts"] + e.get("dur", 0), e["name"]))
        elif e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            by_thread[thread].append((e["ts"], 1, e["args"]["correlation"], None))
    out = {}
    for items in by_thread.values():
        stack: list[tuple[float, str]] = []
        for ts, kind, value, name in sorted(items, key=lambda item: (item[0], item[1])):
            while stack and stack[-1][0] < ts:
                stack.pop()
            if kind == 0:
                stack.append((value, name))
            else:
                out[value] = " > ".join(n for _, n in stack[:depth]) or "(no operator)"
    return out


def runtime_calls(events: list[dict], top: int = 25) -> list[tuple[tuple, str, float, int]]:
    """Host µs and count of each CUDA runtime or driver call per thread, largest first: whether the thread that
    drives the device spends its time launching (a launch blocks while the device's queue is full) or waiting
    (`cudaStreamSynchronize`, `cudaEventSynchronize`, a synchronous copy, `cudaFree`)."""
    totals: dict[tuple, list] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver"):
            key = ((e.get("pid"), e.get("tid")), e["name"])
            totals[key][0] += e.get("dur", 0)
            totals[key][1] += 1
    rows = [(thread, name, us, n) for (thread, name), (us, n) in totals.items()]
    return sorted(rows, key=lambda row: -row[2])[:top]


def report(path: str, min_gap_ms: float = 0.05, top: int = 25) -> str:
    events = load(path)
    result = summary(events, min_gap_ms * 1e3, top)
    if not result["span_us"]:
        return "no device work in the trace (a CPU or simulated run): nothing to place"
    lines = [f"device busy {result['busy_us'] / 1e6:.3f} s of {result['span_us'] / 1e6:.3f} s "
             f"({result['busy_us'] / result['span_us']:.0%}); {result['gaps']} gaps of >= {min_gap_ms} ms, "
             f"{result['idle_us'] / 1e6:.3f} s idle in them",
             "", "| thread | innermost host event during the gaps | seconds |", "|---|---|---|"]
    lines += [f"| {thread[1]} | {name[:90]} | {us / 1e6:.3f} |" for (thread, name), us in result["host"]]
    lines += ["", "| host operators that launched the device's work | seconds | share | kernels |", "|---|---|---|---|"]
    lines += [f"| {key[:120]} | {us / 1e6:.3f} | {us / result['busy_us']:.1%} | {n} |"
              for key, us, n in by_launcher(events, top=top)]
    lines += ["", "| thread | CUDA runtime or driver call | host seconds | calls |", "|---|---|---|---|"]
    lines += [f"| {thread[1]} | {name} | {us / 1e6:.3f} | {n} |" for thread, name, us, n in runtime_calls(events, top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--min-gap-ms", type=float, default=0.05)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    print(report(args.trace, args.min_gap_ms, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
