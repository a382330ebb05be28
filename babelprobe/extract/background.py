"""The background writer of an extraction: shards are assembled, checked, hashed and written to HDF5 on a
thread of their own, so the device runs the next batches meanwhile instead of waiting on the disk.

The extraction loop (`run.py`) sends it, in order: `start(k)` for a shard, `rows(rows, pooled)` for each
batch (`pooled` is a `capture.PooledRows` whose copy to host memory may still be under way), and `end(k)`.
The writer thread fills the shard's arrays as the copies complete and, at `end`, writes the shard through
`StoreWriter.write_shard` — the same atomic write as before (temporary name, fsync, rename), so what a
kill leaves on disk is unchanged — then updates the manifest.

The queue between the two is bounded (`MAX_PENDING` messages), so pooled rows never pile up in memory
when the disk is slower than the device: the loop then waits, and that wait is measured
(`waited`). An error in the writer thread (a full disk, a NaN) is re-raised in the extraction loop at
its next message or at `close`, as the same exception; after an error or an interruption the writer
drops what is queued and writes nothing more.

`threaded=False` does the same work on the calling thread, message by message (used for nnsight's local
simulation of a remote run, which briefly removes modules from `sys.modules` while it deserialises a
trace: a writer thread importing h5py submodules at that moment would fail).
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

MAX_PENDING = 8  # batches of pooled rows in flight between the device and the disk
POLL_S = 0.05


class BackgroundWriter:
    """Assembles and writes shards on a thread (see module docstring).

    `writer` is the store's `StoreWriter`, `keys` the store keys of every row, `shape` (n stored layers,
    d_model); `records` the manifest records of shards already complete, updated here as shards are
    written when `update_manifest` (a single process; under a launcher rank 0 writes the manifest)."""

    def __init__(self, writer, keys, shape: tuple[int, int], records: list[dict], update_manifest: bool,
                 max_pending: int = MAX_PENDING, threaded: bool = True):
        self.writer, self.keys, self.shape = writer, keys, shape
        self.records, self.update_manifest = records, update_manifest
        self.queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self.error: BaseException | None = None
        self.stopping = False
        self.shards_written = 0
        self.waited = 0.0  # seconds the extraction loop spent waiting for room in the queue
        self.write_seconds = 0.0  # seconds the writer thread spent writing shards
        self.threaded = threaded
        self.arrays, self.span = None, None  # the shard being assembled (writer side)
        self.open: dict[int, tuple[dict, int]] = {}  # scattered rows: shard -> (arrays, rows still missing)
        self.thread = threading.Thread(target=self._loop, name="babelprobe-shard-writer", daemon=True)
        if threaded:
            self.thread.start()

    # -- the extraction loop's side
    def start(self, index: int) -> None:
        self._put(("start", index))

    def rows(self, rows, pooled) -> None:
        self._put(("rows", rows, pooled))

    def end(self, index: int) -> None:
        self._put(("end", index))

    def scattered(self, rows, pooled, source=None) -> None:
        """Rows of any shards, by store row (`rows`); `source[j]` is the pooled row that store row `rows[j]`
        takes (default: the j-th; a text scored once for several items fills each of their rows). A shard is
        written once all its rows have come (extraction fused into another pass, `fused.py`)."""
        self._put(("scattered", rows, pooled, source))

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
        while True:
            message = self.queue.get()
            if message is None:
                return
            self._handle(message)

    def _handle(self, message) -> None:
        if self.stopping:
            return  # after an error or an abort: drain without writing
        try:
            kind = message[0]
            if kind == "start":
                self.span = self.writer.shard_rows(message[1])
                self.arrays = {p: np.empty((self.span[1] - self.span[0], *self.shape), dtype=np.float32)
                               for p in self.writer.pools}
            elif kind == "rows":
                _, rows, pooled = message
                for pool, values in pooled.wait().items():
                    self.arrays[pool][rows] = values
            elif kind == "scattered":
                self._scatter(*message[1:])
            else:
                self._write(message[1], self.span, self.arrays)
                self.arrays = None
        except BaseException as err:  # re-raised in the extraction loop
            self.error, self.stopping = err, True

    def _scatter(self, rows: np.ndarray, pooled, source) -> None:
        values = pooled.wait()
        source = np.arange(len(rows)) if source is None else np.asarray(source)
        shards = np.asarray(rows) // self.writer.shard_size
        for index in np.unique(shards).tolist():
            span = self.writer.shard_rows(index)
            if index not in self.open:
                self.open[index] = ({p: np.empty((span[1] - span[0], *self.shape), dtype=np.float32)
                                     for p in self.writer.pools}, span[1] - span[0])
            arrays, missing = self.open[index]
            at = shards == index
            for pool, block in values.items():
                arrays[pool][np.asarray(rows)[at] - span[0]] = block[source[at]]
            missing -= int(at.sum())
            self.open[index] = (arrays, missing)
            if missing == 0:
                del self.open[index]
                self._write(index, span, arrays)

    def _write(self, index: int, span: tuple[int, int], arrays: dict) -> None:
        start = time.perf_counter()
        record = self.writer.write_shard(index, self.keys.iloc[span[0]:span[1]], arrays)
        self.shards_written += 1
        if self.update_manifest:  # the manifest shows progress
            self.records.append(record)
            self.writer.update_manifest(self.records, complete=False)
        self.write_seconds += time.perf_counter() - start
