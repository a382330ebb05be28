"""The background writer of an extraction: shards are assembled, checked, hashed and written to HDF5 on a
thread of their own, so the device runs the next batches meanwhile instead of waiting on the disk.

The extraction loop (`run.py`) sends it, in order: `start(k)` for a shard, `rows(rows, pooled, source)` for
each batch (`pooled` is a `capture.PooledRows` whose copy to host memory may still be under way; `source` maps
the shard's rows to pooled rows when a text that recurs was run once), and `end(k)`; the rows of a text that
a later shard has too are kept (`rows(..., keep)`), copied into that shard (`copied`) and let go once no shard
after it has the text (`forget`), as `run.Repeats` plans. A fused pass (`fused.py`) sends rows of any shards
instead (`scattered`, `scattered_copies`: a shard is written once all its rows have come), keeping rows the same
way.
A shard's arrays hold only its rows that hold values (`StoreWriter.slot`: a row whose text an earlier row has
points to it and is not stored), so a row's place is its slot, and a pointing row's values are dropped.
The writer thread fills the shard's arrays as the copies complete (as the store keeps them: a float32 or
bfloat16 store's rows come encoded and checked from where they were pooled, `device_encoding`, so the host
neither converts nor scans them) and, at `end`, hands the shard to one of
`WRITERS` shard-writing threads, which write it through `StoreWriter.write_shard` — the same atomic write as
before (temporary name, fsync, rename), so what a kill leaves on disk is unchanged — then update the manifest.
Several shards are written at once because writing is host work larger than the device's at large widths
(an 8B model's every layer is 540 KB per item and pooling in float32): its sha256, range checks and fsync
release the GIL and run side by side (HDF5's own calls take turns), while the next shard is assembled. A
written shard's arrays are reused for the next one (`spare`).

The queue between the two is bounded (`MAX_PENDING` messages), so pooled rows never pile up in memory
when the disk is slower than the device: the loop then waits, and that wait is measured
(`waited`). An error in a writer thread (a full disk, a NaN) is re-raised in the extraction loop at
its next message or at `close`, as the same exception; after an error or an interruption the writer
drops what is queued and writes nothing more (shards already being written are finished: each is whole).

`threaded=False` does the same work on the calling thread, message by message (used for nnsight's local
simulation of a remote run, which briefly removes modules from `sys.modules` while it deserialises a
trace: a writer thread importing h5py submodules at that moment would fail).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from babelprobe.extract.store import encode_array, not_finite, storage_dtype

MAX_PENDING = 8  # batches of pooled rows in flight between the device and the disk
# shards written at once: 2, up to 4 on a host with 16 cores or more (a GPU machine's), whose sha256 alone is
# ~1 ms of CPU per item at an 8B model's width, both poolings (memory: this many shards being written, plus those
# assembled)
WRITERS = max(2, min(4, (os.cpu_count() or 1) // 4))
# Every written shard's arrays are kept for the next ones (`spare`): filling freshly allocated memory costs a page
# fault per 4 KiB (~10x a copy into memory already touched: 0.68 against 5.5 GB/s on the 2-core machine). Kept all,
# not WRITERS of them: fused direct scoring's length-sorted batches fill every shard of a 2,000-pair chunk at once
# (8 at an 8B model's width), so with 2–4 spares most of each chunk's shards were fresh memory (simulated 8B,
# 9,180 pairs, bfloat16 store, 2 cores: direct 21.2–24.1 s before, 20.4–20.5 s after; there the shard writers'
# CPU binds). The spares never outnumber the shards once in use at the same time (a new shard takes one before
# allocating), so the memory held is the peak already reached. Shards store different numbers of rows (a text
# stored once), so every array holds the most any shard of the store stores and a shard fills its first rows: an
# array sized to its own shard fitted almost no later one (the same run: 1.3 ms of kernel time per pair, zeroing
# fresh pages for the store's every byte).
POLL_S = 0.05


def device_encoding(dtype: str) -> str | None:
    """The encoding a store of `dtype` takes its pooled rows in from the device (`Pooler.result_async`): its
    own, except float16's, whose shards are checked for overflow whole on the host (`store.check_values`)."""
    return dtype if dtype in ("float32", "bfloat16") else None


class BackgroundWriter:
    """Assembles and writes shards on a thread (see module docstring).

    `writer` is the store's `StoreWriter`, `keys` the store keys of every row, `shape` (n stored layers,
    d_model); `records` the manifest records of shards already complete, updated here as shards are
    written when `update_manifest` (a single process; under a launcher rank 0 writes the manifest)."""

    def __init__(self, writer, keys, shape: tuple[int, int], records: list[dict], update_manifest: bool,
                 max_pending: int = MAX_PENDING, threaded: bool = True, writers: int = WRITERS):
        self.writer, self.keys, self.shape = writer, keys, shape
        self.records, self.update_manifest = records, update_manifest
        self.queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self.error: BaseException | None = None
        self.stopping = False
        self.shards_written = 0
        self.waited = 0.0  # seconds the extraction loop spent waiting for room in the queue
        self.write_seconds = 0.0  # seconds spent writing shards (summed over the shard writers)
        self.threaded = threaded
        self.encoding = device_encoding(writer.dtype)  # what `rows`/`scattered` take: `Pooler.result_async(encode=)`
        self.arrays, self.span = None, None  # the shard being assembled (writer side)
        self.open: dict[int, tuple[dict, int]] = {}  # scattered rows: shard -> (arrays, rows still missing)
        self.spare: list[dict] = []  # arrays of written shards, reused (the module's note on `spare`)
        self.capacity = max((writer.stored_rows(i) for i in range(writer.n_shards)), default=0)  # the spares' rows
        self.kept: dict = {}  # a text's pooled rows kept for later shards (`rows(..., keep)`, `copied`, `forget`)
        n_layers, d_model = shape  # the bytes of one kept text's rows (as the shard is assembled)
        self.row_bytes = len(writer.pools) * n_layers * d_model * (
            4 if self.encoding is None else np.dtype(storage_dtype(self.encoding)).itemsize)
        self.lock = threading.Lock()  # the records, counters and spare arrays, shared by the shard writers
        self.writing: list[Future] = []  # shards handed to the writers, oldest first
        self.n_writers = writers if threaded else 1
        self.writers = ThreadPoolExecutor(writers, thread_name_prefix="babelprobe-shard-write") \
            if self.n_writers > 1 else None
        self.thread = threading.Thread(target=self._loop, name="babelprobe-shard-writer", daemon=True)
        if threaded:
            self.thread.start()

    # -- the extraction loop's side
    def start(self, index: int) -> None:
        self._put(("start", index))

    def rows(self, rows, pooled, source=None, keep=None) -> None:
        """Rows of the started shard (shard rows `rows`); `source[j]` is the pooled row that row `rows[j]` takes
        (default: the j-th; a text that recurs in the shard, run once, fills each of its rows); `keep` {pooled
        row: key}: rows kept for later shards' `copied`, until `forget` (`run.Repeats`)."""
        self._put(("rows", rows, pooled, source, keep))

    def copied(self, rows, keys) -> None:
        """Rows of the started shard filled from kept rows (row `rows[j]` from key `keys[j]`)."""
        self._put(("copied", rows, keys))

    def forget(self, keys) -> None:
        if keys:
            self._put(("forget", keys))

    def end(self, index: int) -> None:
        self._put(("end", index))

    def scattered(self, rows, pooled, source=None, keep=None) -> None:
        """Rows of any shards, by store row (`rows`); `source[j]` is the pooled row that store row `rows[j]`
        takes (default: the j-th; a text scored once for several items fills each of their rows); `keep` as
        `rows`'. A shard is written once all its rows have come (extraction fused into another pass,
        `fused.py`)."""
        self._put(("scattered", rows, pooled, source, keep))

    def scattered_copies(self, rows, keys) -> None:
        """Rows of any shards filled from kept rows (store row `rows[j]` from key `keys[j]`)."""
        self._put(("scattered_copies", rows, keys))

    def close(self) -> None:
        """Wait until every queued shard is written; re-raise the writer's error, if any."""
        if self.threaded:
            self._put(None)
            self.thread.join()
        self._raise()

    def abort(self) -> None:
        """Stop after the shard being written (if any), dropping the rest; never raises."""
        self.stopping = True
        while self.threaded and self.thread.is_alive():
            try:
                self.queue.put(None, timeout=POLL_S)
                break
            except queue.Full:
                continue
        if self.threaded:
            self.thread.join()

    def _put(self, message) -> None:
        self._raise()
        if not self.threaded:
            self._handle(message)
            self._raise()
            return
        start = time.perf_counter()
        while True:
            try:
                self.queue.put(message, timeout=POLL_S)
                break
            except queue.Full:
                self._raise()
                if not self.thread.is_alive():
                    raise RuntimeError("the shard writer thread stopped unexpectedly") from None
        self.waited += time.perf_counter() - start

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            self.stopping = True
            raise error

    # -- the writer thread's side
    def _loop(self) -> None:
        try:
            while True:
                message = self.queue.get()
                if message is None:
                    return
                self._handle(message)
        finally:
            self._wait_writing(0)
            if self.writers is not None:
                self.writers.shutdown()

    def _wait_writing(self, at_most: int) -> None:
        """Wait until at most `at_most` shards are being written; a writer's error becomes the error."""
        while len(self.writing) > at_most:
            try:
                self.writing.pop(0).result()
            except BaseException as err:
                if self.error is None:
                    self.error = err
                self.stopping = True

    def _handle(self, message) -> None:
        if self.stopping:
            return  # after an error or an abort: drain without writing
        try:
            kind = message[0]
            if kind == "start":
                self.span = self.writer.shard_rows(message[1])
                self.arrays = self._arrays(message[1])
            elif kind == "rows":
                _, rows, pooled, source, keep = message
                store_rows = self.span[0] + np.asarray(rows)
                taken = np.arange(len(rows)) if source is None else np.asarray(source)
                values = self._take(pooled, store_rows, taken)
                slots = self.writer.slot[store_rows]
                for pool, block in values.items():
                    if source is None and (slots >= 0).all():
                        self.arrays[pool][slots] = block
                    else:
                        self._place(self.arrays[pool], slots, lambda k, block=block: block[taken[k]])
                self._keep(values, keep)
            elif kind == "copied":
                _, rows, keys = message
                slots = self.writer.slot[self.span[0] + np.asarray(rows, dtype=np.int64)]
                for pool, target in self.arrays.items():
                    self._place(target, slots, lambda k, pool=pool: self.kept[keys[k]][pool])
            elif kind == "forget":
                for key in message[1]:
                    self.kept.pop(key, None)  # (a text whose later rows all point to a stored row was not kept)
            elif kind == "scattered":
                _, rows, pooled, source, keep = message
                source = np.arange(len(rows)) if source is None else np.asarray(source)
                values = self._take(pooled, np.asarray(rows), source)
                self._keep(values, keep)
                self._scatter(np.asarray(rows), lambda pool, k: values[pool][source[k]])
            elif kind == "scattered_copies":
                _, rows, keys = message
                self._scatter(np.asarray(rows), lambda pool, k: self.kept[keys[k]][pool])
            else:
                arrays, self.arrays = self.arrays, None
                self._write(message[1], self.span, arrays)
        except BaseException as err:  # re-raised in the extraction loop
            self.error, self.stopping = err, True

    def _keep(self, values: dict[str, np.ndarray], keep: dict | None) -> None:
        """Keep pooled row j of `values` under key `keep[j]` for later copies (until `forget`)."""
        for j, key in (keep or {}).items():
            self.kept[key] = {pool: block[j].copy() for pool, block in values.items()}

    @staticmethod
    def _place(target: np.ndarray, slots: np.ndarray, row_of, at=None) -> None:
        """Row `row_of(k)` into `target[slots[k]]` for each k of `at` (default: all) whose row holds values (a
        row pointing to an earlier row with its text has slot -1: nothing stored). Row by row: no batch-sized
        temporary (fresh pages) per batch."""
        for k in range(len(slots)) if at is None else at:
            if slots[k] >= 0:
                target[slots[k]] = row_of(k)

    def _scatter(self, rows: np.ndarray, row_of) -> None:
        """Store rows `rows` of any shards, the k-th from `row_of(pool, k)`; a shard they complete is written."""
        shards = rows // self.writer.shard_size
        slots = self.writer.slot[rows]
        for index in np.unique(shards).tolist():
            span = self.writer.shard_rows(index)
            if index not in self.open:
                self.open[index] = (self._arrays(index), span[1] - span[0])
            arrays, missing = self.open[index]
            at = np.flatnonzero(shards == index).tolist()
            for pool, target in arrays.items():
                self._place(target, slots, lambda k, pool=pool: row_of(pool, k), at)
            missing -= len(at)
            self.open[index] = (arrays, missing)
            if missing == 0:
                del self.open[index]
                self._write(index, span, arrays)

    def _take(self, pooled, store_rows: np.ndarray, source: np.ndarray) -> dict[str, np.ndarray]:
        """A batch's pooled rows as the shard is assembled in (`encoding`), refused when not finite, naming the
        item and layer as `store.check_values` does (store row `store_rows[k]` takes pooled row `source[k]`).
        Rows that come unencoded (pooled without `encode`) are encoded and checked here."""
        values, flags = pooled.wait(), pooled.finite()
        if self.encoding is None:
            return values  # float16: the whole shard is checked for overflow when written
        if flags is None:
            flags = {pool: np.isfinite(block).all(axis=-1) for pool, block in values.items()}
            values = {pool: encode_array(block, self.encoding) for pool, block in values.items()}
        for pool, found in flags.items():
            bad = ~found[source]
            if bad.any():
                k, column = (int(i) for i in np.argwhere(bad)[0])
                raise not_finite(pool, self.writer.layers[column], self.keys["item_id"].iloc[int(store_rows[k])])
        return values

    def _arrays(self, index: int) -> dict[str, np.ndarray]:
        """The arrays shard `index`'s rows that hold values are assembled in (float32, or as stored when the rows
        come encoded): the first rows of a written shard's arrays, else of new ones (the module's note on
        `spare`)."""
        with self.lock:
            arrays = self.spare.pop(0) if self.spare else None
        if arrays is None:
            dtype = np.float32 if self.encoding is None else storage_dtype(self.encoding)
            arrays = {p: np.empty((self.capacity, *self.shape), dtype=dtype) for p in self.writer.pools}
        rows = self.writer.stored_rows(index)
        return {p: block[:rows] for p, block in arrays.items()}

    def _write(self, index: int, span: tuple[int, int], arrays: dict) -> None:
        """Write shard `index`: on a shard-writing thread when there are several (at most `WRITERS` at once)."""
        if self.writers is None:
            self._write_shard(index, span, arrays)
            return
        self._wait_writing(self.n_writers - 1)
        if not self.stopping:
            self.writing.append(self.writers.submit(self._write_shard, index, span, arrays))

    def _write_shard(self, index: int, span: tuple[int, int], arrays: dict) -> None:
        if self.stopping:
            return  # an error or an abort came while this shard waited for a writer
        start = time.perf_counter()
        record = self.writer.write_shard(index, self.keys.iloc[span[0]:span[1]], arrays,
                                         encoded=self.encoding is not None)
        with self.lock:
            self.spare.insert(0, {p: block.base for p, block in arrays.items()})  # its memory serves the next shard
            self.shards_written += 1
            if self.update_manifest:  # the manifest shows progress
                self.records.append(record)
                self.writer.update_manifest(self.records, complete=False)
            self.write_seconds += time.perf_counter() - start
