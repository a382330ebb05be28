"""Host work off the device's critical path: a three-stage pipeline over chunks of work.

A model stage has three parts of different kinds: preparing a chunk on the host (tokenising, batching,
building prefix trees, padded tensors), running it on the device (the forward passes, whose results stay on
the device), and finishing it on the host (one read back, the result tables, writing). Done in series the
device waits for the host twice per chunk. `pipelined` runs them as a pipeline, the way serving engines keep
a GPU fed (vLLM's and SGLang's schedulers prepare the next step while the model runs this one):

    chunk k+1 prepared  (a producer thread)
    chunk k   run       (the calling thread: the device is driven from one thread, in order)
    chunk k-1 finished  (a finishing thread)

so the device only waits for the host at the start (the first chunk's preparation) and the host only after
the device's last chunk. The stages keep their order, each works on one chunk at a time, and at most two
finished chunks wait to be finished, which bounds memory. The first error of any stage stops the pipeline
(chunks not yet run are dropped, chunks already run are still finished) and is raised in the caller, as the
same exception.

Threads suffice because the heavy host work here releases the GIL (tokenisers, numpy, hashing, file I/O)
and a device's forward pass releases it while it waits (Python work of the producer and the finisher still
takes turns with the launching thread). Taking turns costs the launching thread: when it comes back from
the device it waits until the thread holding the GIL is asked to give it up, every `sys.getswitchinterval()`
(5 ms by default). While a pipeline runs the interval is `SWITCH_INTERVAL`, so the device is driven again
sooner (meta scoring of 9,180 pairs on perf/simulated.py's 8B stand-in: wall ÷ max(host, device), the
median of 6 runs each, 1.36 at 5 ms and 1.31 at 0.2 ms; later, on another machine, the driving thread's
waits beside its own CPU and the device's time were 1.09-1.36 s at 0.2 ms and 0.74-0.88 s at 0.05 ms, and
no shorter at 0.01-0.02 ms: perf/README.md "The driving thread's time"). Taking turns still costs a real
model's launches most: a transformers Llama forward launches a few dozen operators per layer, each one a turn, and
`perf/gil.py` measures its 32 layers' launches 2.3x slower beside the producer's `MetaScorer.prepare` (2.7x
beside the finishing step) than alone; a producer in a process of its own would not take those turns,
but on perf/simulated.py's device it gained nothing and cost seconds of CPU a run (perf/README.md, "A producer
process, tried"): the producer's own Python is kept small instead (`prefix._PrefixTree`: arrays).
`runs.score_resumably` runs a plain scoring function whole in the run step.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

MAX_FINISHING = 2  # run chunks waiting to be finished: the run stage waits beyond this
SWITCH_INTERVAL = 5e-5  # seconds: how often a thread holding the GIL is asked to let a waiting one run


@contextmanager
def switching(interval: float = SWITCH_INTERVAL):
    """The interpreter's thread switch interval at most `interval` inside the block (module docstring)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, interval))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


_FROZEN = {"depth": 0, "lock": threading.Lock(), "thresholds": (700, 10, 10)}
FULL_PASS_EVERY = 1000  # middle-generation passes before a full one is considered, while frozen (Python: 10)


@contextmanager
def frozen_heap():
    """The objects alive when the block starts left out of the garbage collector's passes inside it (`gc.freeze`;
    a block inside another freezes what the outer one made so far; all thawed when the outermost block ends), and
    full passes over the rest rarer (`FULL_PASS_EVERY`). A full pass stops every thread while it walks the tracked
    objects: with a model, a tokenizer and a run's items loaded that took 0.3-0.5 s each, 20 of them in meta
    scoring's 32 s at a quarter of XCOMPS on perf/simulated.py's 1B stand-in, the device idle (vLLM and SGLang
    freeze their heap after warm-up for the same reason). Frozen, a full pass walks only what the run made (the
    chunks in flight, mostly their encodings: 0.06-0.2 s) but is due whenever a quarter as many objects as it
    walked last time have outlived the young passes: 4 times a chunk at Python's thresholds, about once a chunk
    after 100 middle passes, once in the 17 chunks of a quarter of XCOMPS after 1,000 (perf/README.md). The garbage that
    only a full pass frees is rare here (~130 objects in meta scoring of 9,180 pairs)."""
    with _FROZEN["lock"]:
        if _FROZEN["depth"] == 0:
            _FROZEN["thresholds"] = gc.get_threshold()
            young, middle, full = _FROZEN["thresholds"]
            gc.set_threshold(young, middle, max(full, FULL_PASS_EVERY))
        gc.freeze()
        _FROZEN["depth"] += 1
    try:
        yield
    finally:
        with _FROZEN["lock"]:
            _FROZEN["depth"] -= 1
            if _FROZEN["depth"] == 0:
                gc.set_threshold(*_FROZEN["thresholds"])
                gc.unfreeze()


def pipelined(chunks: Iterable, prepare: Callable, run: Callable, finish: Callable,
              done: Callable | None = None) -> list:
    """[finish(run(prepare(chunk))) for chunk in chunks], pipelined (module docstring). `done(k, result)`, if
    given, is called on the finishing thread right after chunk k is finished (e.g. to write it)."""
    chunks = list(chunks)
    if not chunks:
        return []

    def finished(k, ran):
        result = finish(ran)
        if done is not None:
            done(k, result)
        return result

    with switching(), frozen_heap(), ThreadPoolExecutor(1, thread_name_prefix="babelprobe-prepare") as before, \
            ThreadPoolExecutor(1, thread_name_prefix="babelprobe-finish") as after:
        upcoming = before.submit(prepare, chunks[0])
        finishing: list[Future] = []
        try:
            for k in range(len(chunks)):
                ready = upcoming.result()
                if k + 1 < len(chunks):
                    upcoming = before.submit(prepare, chunks[k + 1])
                ran = run(ready)
                if len(finishing) >= MAX_FINISHING:
                    finishing[-MAX_FINISHING].result()  # memory bound; raises a finishing error here
                finishing.append(after.submit(finished, k, ran))
                # the finishing thread now holds the chunk's last reference, and frees its objects there (a meta
                # chunk's plan: ~30 ms of the interpreter's time, which this thread would spend between two runs)
                del ready, ran
            return [future.result() for future in finishing]
        except BaseException:
            upcoming.cancel()
            # chunks the device has run are still finished (and written by `done`): an interruption keeps
            # every chunk whose forward passes completed; a finishing error of theirs gives way to this one
            for future in finishing:
                try:
                    future.result()
                except BaseException:
                    pass
            raise
