"""Timing helpers shared by the perf scripts: wall and CPU time of one run, and the fastest of several
rounds in which the compared runs take turns."""

from __future__ import annotations

import time


def timed(fn):
    """The result, wall seconds and CPU seconds of this process (all its threads; not worker processes)."""
    start, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - start, time.process_time() - cpu


def fastest(runs: dict, repeat: int) -> dict:
    """{name: (result, wall, cpu)} of the fastest of `repeat` rounds, the runs taking turns within each
    round: on a shared machine whose speed drifts, every side then sees the same drift, and the first
    run of a process (page faults, first-call set-up) does not count."""
    best = {}
    for _ in range(repeat):
        for name, fn in runs.items():
            now = timed(fn)
            if name not in best or now[1] < best[name][1]:
                best[name] = now
    return best
