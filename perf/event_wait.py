"""What a thread waiting for the GPU costs the host: CUDA's default event against the blocking one babelprobe's
read backs wait on (`models.copies_done`), and a synchronising read (`.item()`), measured in the same run.

babelprobe collects a chunk's log-probs, and the background writer each extraction batch's rows, on a thread of
their own while the main thread launches the next work: that thread waits on a CUDA event for most of the
device's time. An event made without cudaEventBlockingSync busy-waits (CUDA runtime API, "Event Management"),
holding a core and polling the driver while the other threads tokenise, write shards and launch kernels. Each
round here queues `--seconds` of device work (bfloat16 matmuls of 16,384², a few dozen a second, so that the
launch queue never fills), records an event of one kind after it, and waits on it on a second thread while the
main thread calls the driver (`cudaStreamQuery` on an idle stream, as often as it can); it prints the waiting
thread's CPU seconds per second of waiting, and the main thread's driver calls per second meanwhile (what a
driver polled by a spinning thread leaves to the thread that launches).

A synchronising read (`.item()`, `.cpu()`: the probe solvers' once per iteration, transformers' checks) waits as
the CUDA context's scheduling flag says, which PyTorch leaves at cudaDeviceScheduleAuto (a spin on a host with
more cores than contexts) and has no setter for (pytorch/pytorch#28224). `--context-flag blocking` sets
cudaDeviceScheduleBlockingSync through PyTorch's own CUDA runtime (`cudaSetDeviceFlags`, the loaded libcudart
called with ctypes) before the context is made, reads the flags back once it is, and measures the same waits:
whether babelprobe should set it. Then the latency each kind adds: many waits, each for a ~10 µs kernel launched
just before (a blocking wait returns after an interrupt and the scheduler's wake-up, a spin at once).

    python perf/event_wait.py                          # a GPU; 2 rounds of each kind, ~1 s of device work each
    python perf/event_wait.py --context-flag blocking  # the same with the context's waits blocking
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from babelprobe.models import copies_done  # noqa: E402

WIDTH = 16384  # a matmul of ~9 TFLOP: ~12 ms on an H200, so a second of work is ~80 launches
BLOCKING_SYNC = 0x04  # cudaDeviceScheduleBlockingSync (cuda_runtime_api.h)
SCHEDULE_MASK = 0x07  # the scheduling bits of the device flags
KINDS = {"default": "CUDA's default event", "blocking": "blocking event (models.copies_done)",
         "read": "a synchronising read (.item())"}


def loaded_library(stem: str, maps: str) -> str | None:
    """The path of the shared library named `stem...` (e.g. libcudart.so.12) that this process has loaded, from
    /proc/self/maps' text: PyTorch's own copy (a second copy loaded from elsewhere has a state of its own)."""
    for fields in map(str.split, maps.splitlines()):
        if len(fields) >= 6 and Path(fields[5]).name.startswith(stem):  # address, perms, offset, dev, inode, path
            return fields[5]
    return None


def cuda_runtime():
    """PyTorch's CUDA runtime library, through ctypes, or None (none loaded: a build that links it statically)."""
    import torch.cuda  # noqa: F401  (loads libtorch_cuda and with it libcudart)

    path = loaded_library("libcudart.so", Path("/proc/self/maps").read_text())
    return ctypes.CDLL(path) if path else None


def device_flags(runtime) -> int:
    flags = ctypes.c_uint()
    runtime.cudaGetDeviceFlags(ctypes.byref(flags))
    return flags.value


def queue_work(seconds: float, a: torch.Tensor, per_matmul: float) -> None:
    for _ in range(max(1, round(seconds / per_matmul))):
        torch.mm(a, a)


def recorded_event(kind: str, device: torch.device):
    """An event after the work queued so far: babelprobe's blocking one ("blocking") or CUDA's default."""
    if kind == "blocking":
        return copies_done(device)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def one_round(kind: str, seconds: float, a: torch.Tensor, per_matmul: float, device: torch.device) -> dict:
    idle = torch.cuda.Stream(device)
    torch.cuda.synchronize(device)
    queue_work(seconds, a, per_matmul)
    event = recorded_event(kind, device) if kind != "read" else None
    last = a[0, :1].sum()  # after the queued work: its read waits for all of it
    result: dict = {}

    def wait():
        cpu, wall = time.thread_time(), time.perf_counter()
        if kind == "read":
            last.item()
        else:
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


def short_waits(kind: str, device: torch.device, n: int = 400, cycles: int = 20_000) -> list[float]:
    """The wall time of `n` waits, each for a short kernel (`cycles` GPU clock cycles of torch.cuda._sleep, ~10 µs
    on an H200) launched just before: a blocking wait's wake-up (an interrupt, then the scheduler) against a spin's
    return, the latency a pipeline's collecting thread adds each time it waits."""
    walls = []
    flag = torch.ones(1, device=device)
    for _ in range(n):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.cuda._sleep(cycles)
        if kind == "read":
            flag.sum().item()
        else:
            recorded_event(kind, device).synchronize()
        walls.append(time.perf_counter() - start)
    return walls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.0, help="device work queued per round (default 1 s)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of each kind, alternating (default 2)")
    parser.add_argument("--context-flag", choices=("auto", "blocking"), default="auto",
                        help="the CUDA context's scheduling: PyTorch's (auto) or cudaDeviceScheduleBlockingSync")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("perf/event_wait.py: error: needs a CUDA GPU (the events it compares are CUDA's)", file=sys.stderr)
        return 2
    runtime = cuda_runtime()
    if args.context_flag == "blocking":
        if runtime is None:
            print("perf/event_wait.py: error: no libcudart loaded by PyTorch to set the flag through", file=sys.stderr)
            return 2
        status = runtime.cudaSetDeviceFlags(BLOCKING_SYNC)  # before the context is made (the first tensor)
        if status != 0:
            print(f"perf/event_wait.py: error: cudaSetDeviceFlags returned {status}", file=sys.stderr)
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
    rounds = [one_round(kind, args.seconds, a, per_matmul, device) for _ in range(args.repeat) for kind in KINDS]
    flags = "unknown (no libcudart found)" if runtime is None else f"{device_flags(runtime) & SCHEDULE_MASK:#x}"
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}: {args.seconds} s of device work a round; "
          f"context flag asked {args.context_flag}, the context's scheduling flags read back {flags} (0x0 auto, "
          "0x1 spin, 0x2 yield, 0x4 blocking)")
    print("| wait on | rounds | wait s | waiting thread's CPU s | CPU ÷ wait "
          "| main thread's driver calls/s meanwhile |")
    print("|---|---|---|---|---|---|")
    for kind, label in KINDS.items():
        mine = [r for r in rounds if r["kind"] == kind]
        wall, cpu = statistics.median(r["wall"] for r in mine), statistics.median(r["cpu"] for r in mine)
        calls = statistics.median(r["calls_per_s"] for r in mine)
        print(f"| {label} | {len(mine)} | {wall:.3f} | {cpu:.3f} | {cpu / wall:.2f} | {calls:,.0f} |")
    for kind in KINDS:  # a first round warms each kind up; the second is kept
        short_waits(kind, device)
    short = {kind: short_waits(kind, device) for kind in KINDS}
    print("\n| a short wait (a ~10 µs kernel launched, then waited on) | waits | median µs | p90 µs | max µs |")
    print("|---|---|---|---|---|")
    for kind, label in KINDS.items():
        walls = sorted(1e6 * w for w in short[kind])
        print(f"| {label} | {len(walls)} | {statistics.median(walls):.1f} | {walls[int(0.9 * len(walls))]:.1f} "
              f"| {walls[-1]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
