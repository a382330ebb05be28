"""`pipeline.pipelined`: chunks prepared, run and finished in order, the next chunk prepared and the previous one
finished while one runs, and the first error of any stage raised in the caller as the same exception."""

from __future__ import annotations

import threading
import time

import pytest

from babelprobe.pipeline import pipelined


def test_results_and_done_calls_come_in_order():
    seen = []
    out = pipelined(range(6), lambda k: k * 10, lambda p: p + 1, lambda r: -r, done=lambda k, r: seen.append((k, r)))
    assert out == [-(k * 10 + 1) for k in range(6)]
    assert seen == [(k, -(k * 10 + 1)) for k in range(6)]
    assert pipelined([], str, str, str) == []


def test_the_next_chunk_is_prepared_and_the_last_finished_while_one_runs():
    """Run k waits (with a time limit) until prepare k+1 and finish k-1 have happened: in series it would not."""
    prepared = {k: threading.Event() for k in range(4)}
    finished = {k: threading.Event() for k in range(4)}
    overlapped = []

    def prepare(k):
        prepared[k].set()
        return k

    def run(k):
        if k + 1 < 4:
            overlapped.append(prepared[k + 1].wait(timeout=10))
        if k >= 1:
            overlapped.append(finished[k - 1].wait(timeout=10))
        return k

    def finish(k):
        finished[k].set()
        return k

    assert pipelined(range(4), prepare, run, finish) == [0, 1, 2, 3]
    assert overlapped == [True] * 6


def test_a_finished_chunk_is_freed_on_the_finishing_thread():
    """The thread that drives the device keeps no reference to a chunk it has handed on: the chunk's objects are
    freed on the finishing thread, not between two of the device's runs. Finish k returns once run k + 1 has
    started (the driving thread has handed chunk k on), and run k + 1 waits up to a second for chunk k to be
    freed: were the driving thread still holding it, it would be freed there after the wait."""
    freed, gone, started = {}, {k: threading.Event() for k in range(5)}, {k: threading.Event() for k in range(5)}

    class Chunk:
        def __init__(self, k):
            self.k = k

        def __del__(self):
            freed[self.k] = threading.current_thread().name
            gone[self.k].set()

    def run(chunk):
        started[chunk.k].set()
        if chunk.k >= 1:
            gone[chunk.k - 1].wait(timeout=1)
        return chunk

    def finish(chunk):
        if chunk.k + 1 < 5:
            assert started[chunk.k + 1].wait(timeout=10)
        return chunk.k

    assert pipelined(range(5), Chunk, run, finish) == list(range(5))
    assert all(freed[k].startswith("babelprobe-finish") for k in range(4)), freed


@pytest.mark.parametrize("stage", ["prepare", "run", "finish", "done"])
def test_the_first_error_of_any_stage_is_raised_and_stops_the_rest(stage):
    started = []

    def step(name):
        def call(value, *rest):
            if name == "run":
                started.append(value)
            if name == stage and value == 2:
                raise ValueError(f"{name} failed on 2")
            return value
        return call

    done = step("done")
    with pytest.raises(ValueError, match=f"{stage} failed on 2"):
        pipelined(range(8), step("prepare"), step("run"), step("finish"), done=lambda k, r: done(k))
    assert max(started) <= 5  # chunks well after the failing one never ran


def test_an_interrupt_while_running_still_finishes_the_chunks_already_run():
    """A Ctrl-C in the device step: every chunk whose forward passes completed is finished and handed to
    `done` (what `runs.score_resumably` writes), so a resumed run does not score it again."""
    written = []

    def run(k):
        if k == 3:
            raise KeyboardInterrupt
        time.sleep(0.01)
        return k

    def finish(k):
        time.sleep(0.05)  # slower than the device: chunks wait to be finished when the interrupt comes
        return k

    with pytest.raises(KeyboardInterrupt):
        pipelined(range(6), lambda k: k, run, finish, done=lambda k, r: written.append(r))
    assert sorted(written) == [0, 1, 2]


def test_threads_switch_often_while_it_runs_and_as_before_after_it():
    """The launching thread gets the GIL back within SWITCH_INTERVAL, not Python's default 5 ms, while a
    pipeline runs; the interpreter's own interval comes back afterwards, after an error too."""
    import sys

    from babelprobe.pipeline import SWITCH_INTERVAL

    before = sys.getswitchinterval()
    seen = pipelined([1, 2], lambda c: sys.getswitchinterval(), lambda c: c, lambda c: c)
    assert seen == pytest.approx([SWITCH_INTERVAL] * 2, rel=1e-6) and SWITCH_INTERVAL < before  # held in µs
    assert sys.getswitchinterval() == before

    def fails(chunk):
        raise ValueError("run failed")

    with pytest.raises(ValueError, match="run failed"):
        pipelined([1], lambda c: c, fails, lambda c: c)
    assert sys.getswitchinterval() == before


def test_the_heap_is_frozen_while_it_runs_and_thawed_after_it():
    """The objects alive at the start are out of the collector's passes while a pipeline (or an outer block)
    runs, a block inside freezes what the outer one made, full passes come rarer, garbage made inside is still
    collected, and the heap is thawed and the collector's thresholds restored when the outermost block ends,
    after an error too."""
    import gc

    from babelprobe.pipeline import FULL_PASS_EVERY, frozen_heap

    assert gc.get_freeze_count() == 0
    thresholds = gc.get_threshold()
    alive = [[k] for k in range(1000)]  # tracked containers alive before the block

    def run(chunk):
        cycle = [chunk]
        cycle.append(cycle)  # garbage that only the collector frees
        del cycle
        return gc.get_freeze_count(), gc.collect()

    with frozen_heap():
        frozen = gc.get_freeze_count()
        assert gc.get_threshold() == (*thresholds[:2], max(thresholds[2], FULL_PASS_EVERY))  # full passes rarer
        made = [[k] for k in range(500)]  # tracked containers made inside the outer block
        inner = pipelined([1, 2], lambda c: c, run, lambda c: c)  # a block inside: it freezes them too
        # not thawed by the block inside (a frozen object that dies, e.g. an earlier test's thread finishing on its
        # own, leaves the frozen generation: hence the margin of 10)
        assert len(alive) + len(made) <= gc.get_freeze_count()
    assert all(count >= max(frozen - 10, len(alive)) + len(made) for count, _ in inner)
    assert all(collected >= 1 for _, collected in inner)  # garbage made inside is still collected
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == thresholds

    def fails(chunk):
        raise ValueError("run failed")

    with pytest.raises(ValueError, match="run failed"):
        pipelined([1], lambda c: c, fails, lambda c: c)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == thresholds and len(alive) == 1000
