"""The probe phase alone, on an activation store you already have, against its floor measured in the same run.

The phase is compare's neuro stage: the probe sweep (cross-validated probes of every layer of every language ×
negative-type group, with their tables, bootstrap intervals and peaks) and its result written (`neuro.csv`, its
folds, out-of-fold scores, peaks and probe weights). Its floor is the replay of the sweep's own solver calls
(`floors.FitCalls`, as `perf/workflow.py` measures it): the fits without anything around them. With a store made
once (`babelprobe extract`, or the store of a `compare` run) this times the phase at any group size without
running the model phases again: perf/workflow.py's `--pairs 2` gives groups of 4 items, where everything but
the fits counts; XCOMPS's groups have 7,184. The replay keeps the recorded calls' activations in memory (the
store's layers in float32).

`--pairs P` (a number per cell, `quarter` or `xcomps`) needs no store: XCOMPS's groups (68 of 2 × P items, the
17 languages × 4 negative types) of `bp.synthetic_activations` (minimal pairs with a planted acceptability
direction) at `--layers` × `--d-model`, in memory, read as an in-memory store is (no disk). A small width keeps the
fits cheap, so the phase's own work at XCOMPS's group sizes (out-of-fold tables of millions of rows, bootstrap
over thousands of pairs) shows as it does next to a GPU's fast fits. `--on-disk bfloat16` writes them to a store
first and probes that (reading each group through the store, as compare does; on a GPU, at `--d-model 4096`, the
real phase's reads and fits), `--languages N` keeps the first N languages' groups, and `--profile FILE` runs the
first round under torch's profiler (a Chrome trace and, at FILE.txt, `trace_gaps`' summary).

    OMP_NUM_THREADS=1 .venv/bin/python perf/probe_phase.py --acts runs/x/acts --repeat 3
    OMP_NUM_THREADS=1 .venv/bin/python perf/probe_phase.py --pairs quarter --layers 33 --d-model 16 --repeat 2
    python perf/probe_phase.py --pairs quarter --languages 1 --d-model 4096 --on-disk bfloat16 --profile t.json.gz
    python perf/probe_phase.py --pairs quarter --languages 2 --d-model 4096 --on-disk bfloat16 --workers 2,3,4

`--workers 2,3,4` runs each round once per count of groups in flight, in turn, on the same store (on a GPU the
sweep keeps 2: one group read and tabled on the host while the other is solved). `--device simulated` replaces
the fits by the time an H200 took for them (`SimulatedFits`), so that what the rest of the phase costs beside a
GPU's fits shows on a machine without one:

    OMP_NUM_THREADS=1 .venv/bin/python perf/probe_phase.py --pairs quarter --languages 2 --d-model 4096 \
        --on-disk bfloat16 --device simulated --workers 2,3,4 --repeat 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import floors  # noqa: E402
from workflow import SUBSETS, XCOMPS_LANGUAGES, pair_count, profiled  # noqa: E402

from babelprobe.comparison import CompareSettings  # noqa: E402
from babelprobe.errors import BabelprobeError  # noqa: E402
from babelprobe.extract import open_store, write_store  # noqa: E402
from babelprobe.probes import probe, synthetic_activations  # noqa: E402
from babelprobe.probes.solvers import resolve_device  # noqa: E402
from babelprobe.probes.source import ArrayStore, group_rows, usable_keys  # noqa: E402


def one_round(acts, settings, fits: floors.FitCalls | SimulatedFits, out: Path, profile: Path | None = None,
              workers: int | None = None) -> dict:
    """The phase once (the sweep with `workers` groups in flight, then its result written), its solver calls
    recorded; then their replay (on the device the probes ran on)."""
    device = resolve_device(None)
    fits.calls.clear()
    fits.recording = True
    sweep = partial(probe, acts, settings, progress=False, workers=workers)
    start = time.perf_counter()
    result = (profiled(sweep, profile, device) if profile else sweep)()
    swept = time.perf_counter()
    result.write(out / "neuro.csv")
    done = time.perf_counter()
    fits.recording = False
    replay, _ = fits.replay(device)
    return {"phase": done - start, "sweep": swept - start, "write": done - swept, "replay": replay}


# One quarter-XCOMPS group's fits on a GPU: the probe phase's device time on the H200 of 2026-11-30 (perf/README.md,
# "A quarter of XCOMPS in 160 s": 0.392 ms per pair × 61,064 pairs over 68 groups), for problems of that size
# (1,796 items × 33 layers × 4096 dims × 6 problems: 5 folds and the probe kept)
GPU_FIT_SECONDS = 0.392e-3 * 61_064 / 68
GPU_FIT_SIZE = 1_796 * 33 * 4_096 * 6
GPU_MEMORY_GB = 60.0  # the solvers' budget there (`probes.run.solver_memory_gb`: half of what the H200 had free)


class SimulatedFits:
    """The sweep's fits replaced by a GPU's time for them (`--device simulated`): each `fit_predict` call holds its
    thread (GIL released) for GPU_FIT_SECONDS scaled by its size, one call at a time (one device), and returns
    seeded random scores and zero probes of the right shapes. Everything around the fits runs as it is: the
    store's reads (decoded on the host here, on the device on a GPU), the folds, tables and bootstrap. The groups
    in flight and the solvers' memory are a GPU's (`probes.run.ACCELERATOR_GROUPS`, GPU_MEMORY_GB). The floor is
    the device's time. Used as `floors.FitCalls` is: `calls` cleared before a round, `replay` after it."""

    def __init__(self):
        self.calls: list[float] = []  # the device seconds of each call
        self.recording = False
        self.device = threading.Lock()

    def fit_predict(self, X, y, train, C=1.0, *, return_fit: bool = False, **_):
        from babelprobe.probes.solvers import LinearFit

        n, L, d = X.shape
        P = len(y)
        seconds = GPU_FIT_SECONDS * n * L * d * P / GPU_FIT_SIZE
        with self.device:
            time.sleep(seconds)
        self.calls.append(seconds)
        scores = np.random.default_rng(len(self.calls)).normal(size=(P, L, n))
        if not return_fit:
            return scores
        zeros = np.zeros((P, L, d))
        return scores, LinearFit(coef=zeros, intercept=np.zeros((P, L)), mean=zeros, scale=np.ones((P, L, d)),
                                 method="lbfgs", n_iter=np.ones((P, L), np.int64))

    def __enter__(self):
        import babelprobe.probes.run as runner

        self.runner = runner
        self.saved = runner.fit_predict, runner.solver_memory_gb, runner.group_workers
        workers = runner.group_workers
        runner.fit_predict = self.fit_predict
        runner.solver_memory_gb = lambda device: GPU_MEMORY_GB
        runner.group_workers = lambda given, solver, device, n_groups: workers(
            given or runner.ACCELERATOR_GROUPS, solver, device, n_groups)
        return self

    def __exit__(self, *exc):
        self.runner.fit_predict, self.runner.solver_memory_gb, self.runner.group_workers = self.saved
        return False

    def replay(self, device) -> tuple[float, float]:
        """The device's seconds in the round (its floor: the fits one after another), and no host CPU."""
        return sum(self.calls), 0.0


def synthetic_store(pairs: int, layers: int, d_model: int, languages: int = len(XCOMPS_LANGUAGES),
                    seed: int = 0) -> ArrayStore:
    """XCOMPS's groups (its first `languages` languages × 4 negative types × `pairs` pairs) of
    `bp.synthetic_activations`, in memory."""
    keys, values = synthetic_activations(n_pairs=pairs, n_layers=layers - 1, d_model=d_model,
                                         languages=XCOMPS_LANGUAGES[:languages], subsets=SUBSETS, seed=seed)
    return ArrayStore(keys, last=values, n_layers=layers - 1)


def on_disk(store: ArrayStore, path: Path, dtype: str) -> Path:
    """`store` written as an activation store in `dtype` at `path` (returned)."""
    write_store(path, store.keys, last=store.arrays["last"], layers=store.layers, dtype=dtype,
                n_layers=store.n_layers)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--acts", type=Path, help="an activation store directory")
    source.add_argument("--pairs", type=pair_count, help="no store: XCOMPS-shaped items, P pairs per cell "
                        "(a number, quarter or xcomps), random activations in memory")
    parser.add_argument("--layers", type=int, default=33, help="--pairs: layers stored (8B: 33)")
    parser.add_argument("--d-model", type=int, default=16, help="--pairs: width of the random activations")
    parser.add_argument("--folds", type=int, default=5, help="compare's folds (XCOMPS: 5)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (the first also warms up)")
    parser.add_argument("--languages", type=int, default=len(XCOMPS_LANGUAGES),
                        help="--pairs: the first N of XCOMPS's languages (4 groups each)")
    parser.add_argument("--on-disk", choices=("float32", "bfloat16"), help="--pairs: write them to a store in this "
                        "dtype (in --tmp) and probe that")
    parser.add_argument("--profile", type=Path, metavar="FILE", help="the first round under torch's profiler: "
                        "a gzipped Chrome trace here, trace_gaps' summary at FILE.txt")
    parser.add_argument("--tmp", type=Path, default=None, help="where the results are written (a temporary folder)")
    parser.add_argument("--device", choices=("here", "simulated"), default="here",
                        help="simulated: the fits take a GPU's time instead (`SimulatedFits`), the rest runs here")
    parser.add_argument("--workers", type=worker_counts, default=[None], metavar="N[,N...]",
                        help="groups in flight (default: the sweep's own, `probes.run.group_workers`: 2 on a GPU); "
                        "several: each round runs each in turn on the same store")
    args = parser.parse_args(argv)
    if args.acts and not (args.acts / "manifest.json").exists():
        parser.error(f"--acts {args.acts}: no activation store there (no manifest.json)")
    if args.tmp and not args.tmp.is_dir():
        parser.error(f"--tmp {args.tmp}: no such directory")
    if args.pairs is not None and min(args.pairs, args.layers, args.d_model, args.languages) < 1:
        parser.error(f"--pairs {args.pairs}, --layers {args.layers}, --d-model {args.d_model}, --languages "
                     f"{args.languages}: each at least 1")
    if args.acts and args.on_disk:
        parser.error("--on-disk writes --pairs' activations; --acts is a store already")
    settings = replace(CompareSettings().probe, folds=args.folds)
    ratios = {workers: [] for workers in args.workers}
    simulated = args.device == "simulated"
    with SimulatedFits() if simulated else floors.FitCalls() as fits, tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        acts = args.acts or synthetic_store(args.pairs, args.layers, args.d_model, args.languages)
        if args.on_disk:
            acts = on_disk(acts, Path(tmp) / "acts", args.on_disk)
        store = open_store(acts) if isinstance(acts, Path) else acts
        sizes = [len(rows) for _, rows in group_rows(usable_keys(store, settings.by, settings.pool), settings.by)]
        name = f"{args.acts or 'synthetic'}{f' ({args.on_disk} store)' if args.on_disk else ''}"
        print(f"{name}: {len(store.keys)} items, {len(sizes)} groups of {min(sizes)}–{max(sizes)} items, "
              f"{len(store.layers)} layers × {store.d_model}, {args.folds} folds, on "
              f"{'a simulated GPU (perf/probe_phase.py SimulatedFits)' if simulated else resolve_device(None)}, "
              f"{torch.get_num_threads()} thread(s)")
        floor = "the fits' device s (floor)" if simulated else "replay s (floor)"
        print(f"| round | workers | phase s | sweep s | write s | {floor} | floor/phase |")
        print("|---|---|---|---|---|---|---|")
        (Path(tmp) / "out").mkdir()
        for k in range(args.repeat):
            for workers in args.workers:
                try:
                    seconds = one_round(acts, settings, fits, Path(tmp) / "out",
                                        args.profile if k == 0 and workers == args.workers[0] else None, workers)
                except BabelprobeError as err:  # settings the store cannot take (more folds than a group's pairs)
                    print(f"probe_phase.py: {err}", file=sys.stderr)
                    return 2
                ratios[workers].append(seconds["replay"] / seconds["phase"])
                print(f"| {k + 1} | {workers or 'default'} | {seconds['phase']:.3f} | {seconds['sweep']:.3f} | "
                      f"{seconds['write']:.3f} | {seconds['replay']:.3f} | {ratios[workers][-1]:.3f} |", flush=True)
    for workers, theirs in ratios.items():
        later = theirs[1:] or theirs  # the first round pays first imports and caches
        print(f"floor/phase, median of rounds {2 if len(theirs) > 1 else 1}–{len(theirs)}"
              f"{f' at {workers} workers' if len(ratios) > 1 else ''}: {statistics.median(later):.3f}")
    return 0


def worker_counts(text: str) -> list[int]:
    """--workers: one count or several, comma-separated, each at least 1."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) < len(counts):
        raise argparse.ArgumentTypeError(f"{text!r}: counts of at least 1, comma-separated, each once")
    return counts


if __name__ == "__main__":
    raise SystemExit(main())
