"""What a thread waiting for the GPU costs the host: CUDA's default event against the blocking one babelprobe's
read backs wait on (`models.copies_done`), measured in the same run.

babelprobe collects a chunk's log-probs, and the background writer each extraction batch's rows, on a thread of
their own while the main thread launches the next work: that thread waits on a CUDA event for most of the
device's time. An event made without cudaEventBlockingSync busy-waits (CUDA runtime API, "Event Management"),
holding a core and polling the driver while the other threads tokenise, write shards and launch kernels. Each
round here queues `--seconds` of device work (bfloat16 matmuls of 16,384², a few dozen a second, so that the
launch queue never fills), records an event of one kind after it, and waits on it on a second thread while the
main thread calls the driver (`cudaStreamQuery` on an idle stream, as often as it can); it prints the waiting
thread's CPU seconds per second of waiting, and the main thread's driver calls per second meanwhile (what a
driver polled by a spinning thread leaves to the thread that launches).

    python perf/event_wait.py                   # a GPU; 2 rounds of each kind, ~1 s of device work each
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from babelprobe.models import copies_done  # noqa: E402

WIDTH = 16384  # a matmul of ~9 TFLOP: ~12 ms on an H200, so a second of work is ~80 launches


def queue_work(seconds: float, a: torch.Tensor, per_matmul: float) -> None:
    for _ in range(max(1, round(seconds / per_matmul))):
        torch.mm(a, a)


def one_round(kind: str, seconds: float, a: torch.Tensor, per_matmul: float, device: torch.device) -> dict:
    idle = torch.cuda.Stream(device)
    torch.cuda.synchronize(device)
    queue_work(seconds, a, per_matmul)
    if kind == "blocking":
        event = copies_done(device)
    else:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
    result: dict = {}

    def wait():
        cpu, wall = time.thread_time(), time.perf_counter()
        event.synchronize()
        result["cpu"], result["wall"] = time.thread_time() - cpu, time.perf_counter() - wall

    waiter = threading.Thread(target=wait)
    calls, start = 0, time.perf_counter()
    waiter.start()
    while waiter.is_alive():
        idle.query()
        calls += 1
    waiter.join()
    torch.cuda.synchronize(device)
    return {"kind": kind, "wall": result["wall"], "cpu": result["cpu"],
            "calls_per_s": calls / (time.perf_counter() - start)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.0, help="device work queued per round (default 1 s)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of each kind, alternating (default 2)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("perf/event_wait.py: error: needs a CUDA GPU (the events it compares are CUDA's)", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    a = torch.randn(WIDTH, WIDTH, device=device, dtype=torch.bfloat16) / WIDTH ** 0.5
    for _ in range(3):
        torch.mm(a, a)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(10):
        torch.mm(a, a)
    torch.cuda.synchronize(device)
    per_matmul = (time.perf_counter() - start) / 10
    rounds = [one_round(kind, args.seconds, a, per_matmul, device)
              for _ in range(args.repeat) for kind in ("default", "blocking")]
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}: {args.seconds} s of device work a round")
    print("| event | rounds | wait s | waiting thread's CPU s | CPU ÷ wait | main thread's driver calls/s meanwhile |")
    print("|---|---|---|---|---|---|")
    for kind in ("default", "blocking"):
        mine = [r for r in rounds if r["kind"] == kind]
        wall, cpu = statistics.median(r["wall"] for r in mine), statistics.median(r["cpu"] for r in mine)
        calls = statistics.median(r["calls_per_s"] for r in mine)
        label = "CUDA's default (busy-wait)" if kind == "default" else "blocking (models.copies_done)"
        print(f"| {label} | {len(mine)} | {wall:.3f} | {cpu:.3f} | {cpu / wall:.2f} | {calls:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
