"""Timing helpers shared by the perf scripts: wall and CPU time of one run, and rounds in which the
compared runs take turns.

The machines these run on are shared and their speed drifts by up to 2x within minutes, so a ratio of
two runs made minutes apart means little. In each round the runs follow each other closely (their
order alternating from round to round), the ratio is taken within the round, and the median over
rounds is reported next to the fastest time of each.
"""

from __future__ import annotations

import statistics
import time


def timed(fn):
    """The result, wall seconds and CPU seconds of this process (all its threads; not worker processes)."""
    start, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - start, time.process_time() - cpu


def rounds(runs: dict, repeat: int) -> list[dict]:
    """[{name: (result, wall, cpu)}] for `repeat` rounds; the runs take turns, in alternating order."""
    out = []
    for k in range(repeat):
        names = list(runs) if k % 2 == 0 else list(runs)[::-1]
        out.append({name: timed(runs[name]) for name in names})
    return out


def fastest(results: list[dict]) -> dict:
    """{name: (result, wall, cpu)} of each name's fastest run."""
    return {name: min((r[name] for r in results), key=lambda run: run[1]) for name in results[0]}


def ratios(results: list[dict], slow: str, fast: str) -> list[float]:
    """Wall-time ratio slow / fast within each round."""
    return [r[slow][1] / r[fast][1] for r in results]


def median_ratio(results: list[dict], slow: str, fast: str) -> str:
    """"4.2x (rounds: 4.0, 4.2, 4.5)": the median ratio within rounds, and each round's."""
    each = ratios(results, slow, fast)
    return f"{statistics.median(each):.2f}x (rounds: {', '.join(f'{x:.2f}' for x in each)})"
