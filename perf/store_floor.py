"""The host's floor for storing activations: what one store shard's bytes cost this CPU, per pair, against
babelprobe's own host work on the same shard, measured in the same run.

Every stored row is hashed (the store's sha256), written to a file and copied once into its shard; those three
on the shard's bytes, done without babelprobe (`hashlib.sha256`, a file write into the page cache in 1 MiB
pieces, a numpy copy into memory already touched), are the floor, in CPU seconds (the disk's write-back, which
the store's fsync waits for, is not this CPU's work). babelprobe's work on the same rows, come encoded from the
device: copied into the shard row by row, then `StoreWriter.write_shard` (keys, sha256, HDF5 layout, fsync, the
atomic rename). Both are compared with a device time per pair (default: the simulated H200's fused direct phase
at the 8B shape): issue 40's goal, host ≤ 0.25 × device per pair, cannot hold where the floor alone is above it.

The written shard is then read back as the probe phase reads a group (`read_layers`: every layer of its rows; to
the host in float32, and to `--read-device`, where the stored bits are copied and decoded on the device), against
HDF5's read of the same bytes in chunk-sized runs into one reused buffer (the library's read, nothing decoded),
in wall seconds.

    .venv/bin/python perf/store_floor.py                               # 8B width, every layer, bfloat16
    .venv/bin/python perf/store_floor.py --layers 19 --d-model 640 --store-dtype float32 --device-ms 0
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from babelprobe.extract import open_store  # noqa: E402
from babelprobe.extract.store import StoreWriter, default_shard_size, storage_dtype  # noqa: E402

# the simulated H200's direct phase at the 8B shape, fused extraction (perf/README.md "Rows encoded where they are
# pooled": device ms per pair of `perf/workflow.py --shape llama-3.1-8b --device simulated --pairs 135`)
DEVICE_MS_PER_PAIR = 0.764
WRITE_BYTES = 1 << 20  # the floor's write, in pieces the size of the store's HDF5 chunks (one write of a whole
# shard was ~2x slower here: the kernel reclaims page cache inside that one call)


def shard(rows: int, layers: int, d_model: int, dtype: str, seed: int = 0) -> np.ndarray:
    """A shard's stored values: random bits of the stored dtype (the cost does not depend on the values)."""
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.normal(size=(rows, layers, d_model)).astype(np.float32)
    return rng.integers(0, 1 << 15, size=(rows, layers, d_model), dtype=np.uint16).view(storage_dtype(dtype))


def floor_seconds(values: np.ndarray, folder: Path) -> dict[str, float]:
    """CPU seconds of the floor's three parts on `values` (hash, durable write, one copy)."""
    out, target = {}, np.empty_like(values)
    target[...] = values  # touched once: a reused shard buffer
    start = time.process_time()
    hashlib.sha256(values.data).hexdigest()
    out["sha256"] = time.process_time() - start
    path = folder / "raw.bin"
    start = time.process_time()
    data = memoryview(values.reshape(-1).view(np.uint8))
    with open(path, "wb", buffering=0) as handle:
        for at in range(0, len(data), WRITE_BYTES):
            handle.write(data[at:at + WRITE_BYTES])
    out["write"] = time.process_time() - start
    os.sync()  # the write-back is the disk's, not this CPU's: done before the next part is timed
    path.unlink()
    start = time.process_time()
    target[...] = values
    out["copy"] = time.process_time() - start
    return out


def babelprobe_seconds(values: np.ndarray, dtype: str, folder: Path) -> float:
    """CPU seconds of babelprobe's host work on a shard of encoded rows (the fused and extraction paths): the rows
    copied into the shard one by one, then `StoreWriter.write_shard`."""
    rows, layers, d_model = values.shape
    keys = pd.DataFrame({"item_id": [f"i{k}" for k in range(rows)], "pair_id": [f"p{k // 2}" for k in range(rows)],
                         "language": "en", "subset": "s", "label": np.arange(rows) % 2})
    writer = StoreWriter(folder / "store", n_rows=rows, layers=list(range(layers)), d_model=d_model,
                         n_layers=layers, pools=("last",), dtype=dtype, shard_size=rows)
    writer.prepare(overwrite=True)
    target = np.empty_like(values)
    target[...] = values  # touched once: a written shard's arrays, reused (`BackgroundWriter.spare`)
    start = time.process_time()
    for i in range(rows):  # assembled row by row, as `BackgroundWriter._scatter` does
        target[i] = values[i]
    writer.write_shard(0, keys, {"last": target}, encoded=True)
    seconds = time.process_time() - start
    writer.finish()  # a complete store, for `read_seconds`
    return seconds


def read_seconds(store_dir: Path, device: str) -> dict[str, float]:
    """Wall seconds of reading the shard written by `babelprobe_seconds` back: HDF5's read into one reused buffer
    (the floor), then `read_layers` of every row and layer to the host and to `device`."""
    import h5py
    import torch

    out = {}
    with h5py.File(next(store_dir.glob("shard-*.h5")), "r") as f:
        ds = f["last"]
        step = ds.chunks[0] if ds.chunks else len(ds)
        buffer = np.empty((step, *ds.shape[1:]), dtype=ds.dtype)
        start = time.perf_counter()
        for r0 in range(0, len(ds), step):
            r1 = min(len(ds), r0 + step)
            ds.read_direct(buffer, np.s_[r0:r1], np.s_[0:r1 - r0])
        out["HDF5's read into one buffer (floor)"] = time.perf_counter() - start
    store = open_store(store_dir)
    for name, where in (("read_layers to the host (float32)", None), (f"read_layers to {device}", device)):
        start = time.perf_counter()
        values = store.read_layers(device=None if where is None else torch.device(where))
        if where is not None and torch.device(where).type == "cuda":
            torch.cuda.synchronize()
        out[name] = time.perf_counter() - start
        del values
    store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=33, help="stored layers (default 33: an 8B model's every one)")
    parser.add_argument("--d-model", type=int, default=4096)
    parser.add_argument("--store-dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--rows", type=int, help="rows of the shard (default: the store's default shard size)")
    parser.add_argument("--device-ms", type=float, default=DEVICE_MS_PER_PAIR,
                        help="device ms per pair to compare with (0: none)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; seconds are the median of the rounds'")
    parser.add_argument("--tmp", help="where the shard is written (default: the system's temporary directory)")
    parser.add_argument("--read-device", default="cpu", help="the device of the read back (default cpu; cuda on a GPU)")
    args = parser.parse_args(argv)
    if args.tmp and not Path(args.tmp).is_dir():
        parser.error(f"--tmp {args.tmp}: no such directory")
    rows = args.rows or default_shard_size(args.layers, args.d_model)
    values = shard(rows, args.layers, args.d_model, args.store_dtype)
    floors, ours, reads = [], [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            floors.append(floor_seconds(values, Path(tmp)))
            ours.append(babelprobe_seconds(values, args.store_dtype, Path(tmp)))
            reads.append(read_seconds(Path(tmp) / "store", args.read_device))
    parts = {name: statistics.median(f[name] for f in floors) for name in floors[0]}
    floor, mine = sum(parts.values()), statistics.median(ours)
    per_pair = 2 * 1000 / rows  # ms per pair from seconds per shard
    print(f"one shard: {rows} items x {args.layers} layers x {args.d_model}, {args.store_dtype}, "
          f"{values.nbytes / 1e6:.0f} MB ({values.nbytes / rows / 1e3:.0f} KB per item); median of {args.repeat} rounds")
    print("| | CPU s per shard | ms per pair | GB/s |")
    print("|---|---|---|---|")
    for name, seconds in [*parts.items(), ("floor (their sum)", floor), ("babelprobe: assembly + write_shard", mine)]:
        print(f"| {name} | {seconds:.3f} | {seconds * per_pair:.3f} | {values.nbytes / max(seconds, 1e-9) / 1e9:.2f} |")
    print(f"floor/babelprobe: {floor / mine:.2f}")
    read = {name: statistics.median(r[name] for r in reads) for name in reads[0]}
    least = min(read.values())
    print("\n| read back | wall s per shard | GB/s of stored bytes | floor/this |")
    print("|---|---|---|---|")
    for name, seconds in read.items():
        print(f"| {name} | {seconds:.3f} | {values.nbytes / max(seconds, 1e-9) / 1e9:.2f} | {least / seconds:.2f} |")
    if args.device_ms:
        print(f"device {args.device_ms:.3f} ms per pair: floor/device {floor * per_pair / args.device_ms:.2f}, "
              f"babelprobe/device {mine * per_pair / args.device_ms:.2f} (issue 40's goal: host ≤ 0.25 × device)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
