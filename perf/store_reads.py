"""The probe phase's reads of a store where a text is stored once (format 2) against the same store with every row
stored (format 1's layout): what pointing rows cost the reads, and what they save on disk.

In XCOMPS a language's acceptable sentence recurs in its four negative types, so in a format-2 store the
acceptable rows of three of the four (language × negative type) groups point to the first group's rows: a probe
group reads half its rows from another group's chunks. Both stores hold the same values, written through
`StoreWriter.write_shard` from perf/workflow.py's XCOMPS-shaped items (their real recurrence); each round reads
every group's rows, all layers, in the probe phase's layer chunks (`source.layer_chunks` at a CPU's solver
memory, `run.solver_memory_gb`), from both stores in turn (each first once), with the pages cached (`warm`, as
after a fused pass on a machine whose memory holds the store) and dropped (`cold`, read from the disk), and
layer 0 alone (a reader of one layer at a time: the lens, alignment, an SAE) with the pages cached. It checks
that both stores read the same values, then prints seconds, the GB/s of the values handed to the probes, and
pointing ÷ every row.

    OMP_NUM_THREADS=1 .venv/bin/python perf/store_reads.py --pairs quarter --languages 1 --tmp /tmp
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from store_pages import drop_pages  # noqa: E402
from workflow import XCOMPS_LANGUAGES, pair_count, synthetic_items  # noqa: E402

from babelprobe.extract.store import StoreWriter, first_rows, open_store, storage_dtype  # noqa: E402
from babelprobe.probes.run import solver_memory_gb  # noqa: E402
from babelprobe.probes.source import group_rows, layer_chunks  # noqa: E402

LAYOUTS = ("every row", "pointing")
READS = (("warm", "all layers"), ("cold", "all layers"), ("warm", "layer 0"))


def write(path: Path, items, layers: int, d_model: int, dtype: str, pointing: bool) -> None:
    """The store of `items`: row r holds the values of distinct text `first_rows(texts)[r]` (a pattern per text,
    so that both layouts hold the same values), every row stored or a text once."""
    value_rows = first_rows(items["text"].tolist())
    patterns = np.random.default_rng(0).normal(size=(97, layers, d_model)).astype(np.float32)
    writer = StoreWriter(path, n_rows=len(items), layers=list(range(layers)), d_model=d_model, n_layers=layers - 1,
                         pools=("last",), dtype=dtype, value_rows=value_rows if pointing else None)
    writer.prepare()
    keys = items[["item_id", "pair_id", "language", "subset", "label"]]
    for k in range(writer.n_shards):
        start, stop = writer.shard_rows(k)
        rows = np.arange(start, stop)
        rows = rows[writer.slot[start:stop] >= 0]
        values = patterns[value_rows[rows] % len(patterns)] * (1 + value_rows[rows] % 89)[:, None, None]
        writer.write_shard(k, keys.iloc[start:stop], {"last": values.astype(np.float32)})
    writer.finish()


def read_groups(path: Path, memory_gb: float, one_layer: bool = False) -> tuple[float, int, np.ndarray]:
    """Every (language, negative type) group read as the probe phase reads it (or only its layer 0, as a reader
    of one layer at a time does: the lens, alignment, an SAE): seconds, bytes handed over, and a checksum of what
    was read."""
    store = open_store(path)
    total, check = 0, np.zeros(3)
    start = time.perf_counter()
    for _, rows in group_rows(store.keys, ("language", "subset")):
        chunks = [[0]] if one_layer else layer_chunks(store.layers, len(rows), store.d_model, memory_gb)
        for chunk in chunks:
            values = store.read_layers(chunk, rows=rows)
            total += values.nbytes
            check += [values[:, 0, 0].sum(), values[-1, -1].sum(), values.shape[0]]
    seconds = time.perf_counter() - start
    store.close()
    return seconds, total, check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=pair_count, default=pair_count("quarter"),
                        help="pairs per language × negative type: a number, quarter or xcomps (default quarter)")
    parser.add_argument("--languages", type=int, default=1, help="the first N of XCOMPS's languages")
    parser.add_argument("--layers", type=int, default=33, help="layers stored (8B: 33)")
    parser.add_argument("--d-model", type=int, default=4096, help="width (8B: 4096)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--rounds", type=int, default=4, help="rounds; the layouts alternate which reads first")
    parser.add_argument("--tmp", type=Path, default=None, help="where the stores go (a temporary folder)")
    args = parser.parse_args(argv)
    if args.tmp and not args.tmp.is_dir():
        parser.error(f"--tmp {args.tmp}: no such directory")
    if min(args.pairs, args.languages, args.layers, args.d_model, args.rounds) < 1:
        parser.error("--pairs, --languages, --layers, --d-model and --rounds must each be at least 1")
    items = synthetic_items(args.pairs, XCOMPS_LANGUAGES[:args.languages])
    memory_gb = solver_memory_gb(None)  # a CPU's budget: the layer chunks a CPU's probe phase reads
    row_bytes = args.layers * args.d_model * np.dtype(storage_dtype(args.dtype)).itemsize
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        paths = {layout: Path(tmp) / layout.replace(" ", "-") for layout in LAYOUTS}
        for layout, path in paths.items():
            write(path, items, args.layers, args.d_model, args.dtype, layout == "pointing")
        sizes = {layout: sum(f.stat().st_size for f in path.glob("shard-*.h5")) for layout, path in paths.items()}
        print(f"{len(items)} items ({items['text'].nunique()} distinct texts) of {args.languages} language(s), "
              f"{args.layers} layers × {args.d_model} in {args.dtype} ({row_bytes / 1e3:.0f} kB a row); shards: "
              + ", ".join(f"{layout} {sizes[layout] / 1e9:.2f} GB" for layout in LAYOUTS))
        print("| round | pages | read | layout | seconds | GB/s handed over |")
        print("|---|---|---|---|---|---|")
        times: dict = {}
        for k in range(args.rounds):
            for pages, read in READS:
                for layout in LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]:
                    if pages == "cold":
                        for file in paths[layout].glob("shard-*.h5"):
                            drop_pages(file)
                    seconds, total, check = read_groups(paths[layout], memory_gb, read == "layer 0")
                    times.setdefault((pages, read, layout), []).append(seconds)
                    times.setdefault(("check", read, layout), check)
                    print(f"| {k + 1} | {pages} | {read} | {layout} | {seconds:.3f} | {total / seconds / 1e9:.2f} |",
                          flush=True)
        for read in ("all layers", "layer 0"):
            if not np.allclose(times[("check", read, LAYOUTS[0])], times[("check", read, LAYOUTS[1])], rtol=1e-6):
                print(f"store_reads.py: the two layouts read different values ({read})", file=sys.stderr)
                return 1
        for pages, read in READS:
            a, b = (np.median(times[(pages, read, layout)]) for layout in LAYOUTS)
            print(f"{pages}, {read}: pointing ÷ every row {b / a:.3f} (medians {b:.3f} and {a:.3f} s)")
        print(f"shard bytes: pointing ÷ every row {sizes['pointing'] / sizes['every row']:.3f}")
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
