"""A store of many shards written and read back with each shard's pages kept in the page cache (what babelprobe
does) or dropped once the shard is on disk: which of the two this machine favours, at a store's real size.

Direct scoring with its fused extraction writes the store at the device's pace (an 8B model's every layer is
270 KB per item in bfloat16: a quarter of XCOMPS 33 GB, the whole 132 GB); the probe phase then reads it back.
Kept, each shard's written pages stay cached: the kernel finds fresh pages for every write (on a virtual
machine's fresh memory the costly part, perf/README.md "Direct's pace is the store's") and the probe phase
reads from memory. Dropped (`posix_fadvise(DONTNEED)` after the shard's fsync, so its pages are clean), the
next shards reuse the same pages and the probe phase reads from the disk. A store larger than the memory cannot
stay cached either way. A third way, `unsynced`, keeps the pages and skips the fsyncs (this script's process
only): what waiting for the disk costs, where the disk rather than the memory sets the pace.

Each round writes `--gb` of shards through `StoreWriter.write_shard` (keys, sha256, HDF5, fsync, rename) on
`WRITERS` threads as extraction's background writer does, then reads every shard back whole with HDF5 (the bytes
the probe phase reads, in file order), then deletes the store. The rounds take the `--modes` in turn, then in
the reverse order, so that each comes first once (a fresh machine's first writes pay more).

    .venv/bin/python perf/store_pages.py --gb 20 --tmp /tmp
    .venv/bin/python perf/store_pages.py --gb 16 --modes kept,dropped,unsynced --rounds 6
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from babelprobe.extract.background import WRITERS  # noqa: E402
from babelprobe.extract.store import StoreWriter, default_shard_size, shard_name, storage_dtype  # noqa: E402


def drop_pages(path: Path) -> None:
    """The file's cached pages let go (they are clean: `write_shard` fsynced the file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


MODES = ("kept", "dropped", "unsynced")


@contextmanager
def fsyncs_skipped():
    """`os.fsync` does nothing meanwhile (in this process: the writers' threads call it through the os module)."""
    real = os.fsync
    os.fsync = lambda fd: None
    try:
        yield
    finally:
        os.fsync = real


def one_round(path: Path, shards: int, layers: int, d_model: int, dtype: str, mode: str) -> dict:
    rows = default_shard_size(layers, d_model)
    writer = StoreWriter(path, n_rows=rows * shards, layers=list(range(layers)), d_model=d_model,
                         n_layers=layers - 1, pools=("last",), dtype=dtype)
    writer.prepare()
    values = np.random.default_rng(0).integers(0, 2**15, size=(rows, layers, d_model)).astype(storage_dtype(dtype))

    def write(k: int) -> None:
        start, stop = writer.shard_rows(k)
        keys = pd.DataFrame({"item_id": [f"i{j}" for j in range(start, stop)],
                             "pair_id": [f"p{j // 2}" for j in range(start, stop)], "language": "en", "subset": "s",
                             "label": np.arange(start, stop) % 2})
        writer.write_shard(k, keys, {"last": values}, encoded=True)
        if mode == "dropped":
            drop_pages(path / shard_name(k))

    before, start = os.times(), time.perf_counter()
    with ThreadPoolExecutor(WRITERS) as pool, fsyncs_skipped() if mode == "unsynced" else nullcontext():
        list(pool.map(write, range(shards)))
    written, after = time.perf_counter() - start, os.times()
    import h5py

    start = time.perf_counter()
    for k in range(shards):
        with h5py.File(path / shard_name(k), "r") as f:
            f["last"][...]
    read = time.perf_counter() - start
    shutil.rmtree(path)
    return {"write": written, "user": after.user - before.user, "sys": after.system - before.system, "read": read,
            "gb": shards * values.nbytes / 1e9}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=20.0, help="the store's size per round (default 20 GB)")
    parser.add_argument("--layers", type=int, default=33, help="stored layers (default 33: an 8B model's every one)")
    parser.add_argument("--d-model", type=int, default=4096)
    parser.add_argument("--store-dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--modes", default="kept,dropped", help=f"comma-separated, of {', '.join(MODES)} (default "
                        "kept,dropped)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds: the modes in turn, then reversed (default 4)")
    parser.add_argument("--tmp", help="where the store is written (default: the system's temporary directory)")
    args = parser.parse_args(argv)
    if args.gb <= 0 or args.rounds < 1:
        parser.error(f"--gb {args.gb}, --rounds {args.rounds}: both must be positive")
    if args.tmp and not Path(args.tmp).is_dir():
        parser.error(f"--tmp {args.tmp}: no such directory")
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes {args.modes!r}: choose from {', '.join(MODES)}")
    shard_bytes = default_shard_size(args.layers, args.d_model) * args.layers * args.d_model * \
        np.dtype(storage_dtype(args.store_dtype)).itemsize
    shards = max(1, round(args.gb * 1e9 / shard_bytes))
    free = shutil.disk_usage(args.tmp or tempfile.gettempdir()).free
    if shards * shard_bytes > 0.9 * free:
        parser.error(f"--gb {args.gb}: {shards * shard_bytes / 1e9:.1f} GB of shards, {free / 1e9:.1f} GB free")
    print(f"{shards} shards of {shard_bytes / 1e6:.0f} MB ({args.layers} layers × {args.d_model}, {args.store_dtype}), "
          f"{WRITERS} writer threads, {os.cpu_count()} CPUs")
    print("| round | pages | GB | write s | write GB/s | CPU user s | CPU sys s | read s | read GB/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    order = modes + modes[::-1]  # kept, dropped, dropped, kept: each first once
    for k in range(args.rounds):
        mode = order[k % len(order)]
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            r = one_round(Path(tmp) / "store", shards, args.layers, args.d_model, args.store_dtype, mode)
        print(f"| {k + 1} | {mode} | {r['gb']:.1f} | {r['write']:.3f} | "
              f"{r['gb'] / r['write']:.2f} | {r['user']:.1f} | {r['sys']:.1f} | {r['read']:.3f} | "
              f"{r['gb'] / r['read']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
