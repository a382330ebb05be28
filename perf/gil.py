"""How much the pipeline's host threads slow the thread that drives the device (issue 40).

`pipeline.pipelined` prepares chunk k+1 and finishes chunk k-1 on threads while the calling thread drives the
device through chunk k. On a GPU that thread launches a forward's operators one at a time (transformers' Llama:
a few dozen per decoder layer), and each operator gives up the GIL and takes it back. While another thread runs
Python, taking it back waits until the interpreter asks that thread to let go (every `sys.getswitchinterval()`
seconds), so the launches slow down by however often that happens, and a GPU waits for them.

This measures it with the code that runs: a transformers Llama forward with 32 decoder layers (the 8B's count
of operators; width 64, so each operator's own work is as small as a GPU launch's) on the calling thread,
alone and while another thread runs babelprobe's own producer step (`MetaScorer.prepare` of a chunk of
XCOMPS-shaped pairs, the default tokenizer's texts) or finishing step (`MetaScorer.finish` of that chunk), at
the pipeline's switch interval (`pipeline.SWITCH_INTERVAL`) and at Python's default of 5 ms; and, the other
way, how much longer the step takes beside the forwards. Timings on a loaded machine are noisy (the threads
also wait for a CPU): run it on a quiet one.

    .venv/bin/python perf/gil.py                       # 200 pairs per chunk, the default tokenizer
    .venv/bin/python perf/gil.py --pairs 2000 --repeat 5
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import workflow  # noqa: E402  (perf/workflow.py: the synthetic items and the simulated stand-in)

from babelprobe.benchmarks.meta import MetaScorer  # noqa: E402
from babelprobe.pipeline import SWITCH_INTERVAL  # noqa: E402


def driver_model():
    """A transformers Llama body with the 8B's 32 decoder layers at width 64: its forward's Python and
    operator launches are the 8B's, its arithmetic next to none."""
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=32, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128)
    model = LlamaModel(config).eval()
    ids = torch.randint(0, 128, (4, 16))
    mask = torch.ones_like(ids)
    mask[1:, :3] = 0  # left padding, as babelprobe's batches have
    return lambda: model(input_ids=ids, attention_mask=mask)


def forwards_per_second(forward, seconds: float, stop: threading.Event | None = None) -> float:
    """Forwards per second on this thread for `seconds` (or until `stop` is set)."""
    n, start = 0, time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - start < seconds and not (stop is not None and stop.is_set()):
            forward()
            n += 1
    return n / (time.perf_counter() - start)


def beside(step, forward) -> tuple[float, float]:
    """(forwards per second while `step()` runs on another thread, the step's seconds)."""
    done, took = threading.Event(), []

    def other():
        start = time.perf_counter()
        step()
        took.append(time.perf_counter() - start)
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    rate = forwards_per_second(forward, float("inf"), stop=done)
    thread.join()
    return rate, took[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=200, help="pairs of one prepared chunk (the pipeline's: 2,000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the table gives their medians")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    per_cell = max(1, args.pairs // (len(workflow.XCOMPS_LANGUAGES) * len(workflow.SUBSETS)))
    items = workflow.synthetic_items(per_cell, workflow.XCOMPS_LANGUAGES)
    texts, _ = workflow.meta_texts(items)
    lm = workflow.build_model("llama-3.1-8b", "simulated", None, [*items["text"], *texts])
    scorer = MetaScorer(lm, batch_tokens=16384)
    workflow.simulate_gpu_batching()
    prepared = scorer.prepare(items)
    ran = scorer.run(prepared)
    steps = {"prepare": lambda: scorer.prepare(items), "finish": lambda: scorer.finish(ran)}
    forward = driver_model()
    forwards_per_second(forward, 0.5)  # warm
    rows = []
    for interval in (SWITCH_INTERVAL, 5e-3):
        previous = sys.getswitchinterval()
        sys.setswitchinterval(interval)
        try:
            for name, step in steps.items():
                rounds = []
                for _ in range(args.repeat):
                    step_alone = min(_timed(step) for _ in range(2))
                    alone = forwards_per_second(forward, 1.0)
                    shared, step_shared = beside(step, forward)
                    rounds.append((1e3 / alone, 1e3 / shared, step_alone, step_shared))
                ms_alone, ms_shared, step_alone, step_shared = np.median(np.array(rounds), axis=0)
                rows.append((interval, name, ms_alone, ms_shared, step_alone, step_shared))
        finally:
            sys.setswitchinterval(previous)
    print(f"{len(items) // 2} pairs per chunk; a 32-layer transformers Llama forward (width 64) on the driving "
          f"thread; medians of {args.repeat} rounds\n")
    print("| switch interval | step beside | forward alone ms | forward beside the step ms | slower | step alone s "
          "| step beside the forwards s |")
    print("|---|---|---|---|---|---|---|")
    for interval, name, ms_alone, ms_shared, step_alone, step_shared in rows:
        print(f"| {interval * 1e3:g} ms | {name} | {ms_alone:.1f} | {ms_shared:.1f} | {ms_shared / ms_alone:.1f}x "
              f"| {step_alone:.2f} | {step_shared:.2f} |")
    return 0


def _timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


if __name__ == "__main__":
    raise SystemExit(main())
