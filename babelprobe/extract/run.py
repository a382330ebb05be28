"""`extract`: run items through a model once and stream every requested layer's pooled activations into
a store (see `store.py`), resumably and, under a launcher, across processes.

How a run goes:
  1. tokenise every text through `LoadedModel.encode` (the tokens the scorers see; too long: an error
     naming the item, unless `truncate`);
  2. rank 0 takes the store's lock, checks an existing store (same settings: resume; other settings:
     refuse unless `overwrite`), removes partial leftovers and lists the shards still to do;
  3. each process takes its shards; a text that recurs runs once (`Repeats`: in its shard, and for later
     shards its pooled rows are kept while `REPEAT_BYTES` holds them); in a shard, the texts are sorted by
     length and cut into batches under a token budget, cut where the padding saved pays for one more forward
     pass (`models.length_batches`), run once through the model by a backend that pools inside the forward
     pass; the pooled rows leave the device without blocking (pinned host memory on CUDA); on a GPU
     out-of-memory the batch is halved and retried;
  4. a background thread (`background.py`) puts the rows back in item order and writes each finished
     shard atomically (temporary name, fsync, rename) and updates the manifest, while the model runs
     the next batches;
  5. rank 0 writes the complete manifest. Throughput, padding efficiency and the busy fraction (device
     time in forward passes over wall time, `ForwardClock`) are reported.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from babelprobe.errors import BabelprobeError
from babelprobe.extract.backends import backend_version, make_backend
from babelprobe.extract.background import BackgroundWriter
from babelprobe.extract.capture import Pooler
from babelprobe.extract.distributed import World, join_world
from babelprobe.extract.layers import parse_layers
from babelprobe.extract.settings import ExtractSettings, exact_dtype
from babelprobe.extract.store import POOLS, StoreWriter, check_room, ensure_dir, first_rows, store_lock
from babelprobe.models import length_batches, pad_batch, pass_tokens
from babelprobe.pipeline import frozen_heap
from babelprobe.runtime import Runtime, runner
from babelprobe.settings import settings_record


def _host_memory() -> int:
    """Bytes of physical memory (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


# Host memory for the pooled rows of texts that recur in a later shard or chunk (`Repeats`, `fused.StoreCapture`):
# a text beyond it runs again. 1 GiB or a sixteenth of the host's memory: a whole XCOMPS language's acceptable
# sentences at an 8B model's width (every layer, both poolings, bfloat16) take 2.5 GB (`fused.py`).
REPEAT_BYTES = max(1 << 30, _host_memory() // 16)
MEAN_POOLING = "masked mean over the text's tokens, BOS excluded (BOS alone if the text is only BOS)"
LAST_POOLING = "state at the text's last token"


@dataclass
class ExtractReport:
    """What a run did: shards written and skipped (already complete), tokens and time."""

    path: Path
    n_items: int
    n_shards: int
    stored_rows: int = 0  # rows holding values: one per distinct text (the others point to them)
    shards_written: int = 0
    shards_skipped: int = 0
    items_done: int = 0
    repeats: int = 0  # items whose text came earlier in their shard: its pooled rows copied, not run again
    real_tokens: int = 0
    processed_tokens: int = 0
    seconds: float = 0.0
    backend: str = "hf"
    halvings: int = 0
    forward_seconds: float = 0.0  # device time in forward passes (CUDA events; wall time of the forward on CPU)
    writer_wait_seconds: float = 0.0  # the loop waiting for room in the background writer's queue
    drain_seconds: float = 0.0  # waiting at the end for the last shards to be written
    device: str = "cpu"
    per_rank: list = field(default_factory=list)

    @property
    def busy_fraction(self) -> float:
        """Share of the wall time the device spent in forward passes (GPU-busy fraction; on CPU the same
        measure of compute against everything else: tokenising, copying, waiting on the writer)."""
        return min(1.0, self.forward_seconds / self.seconds) if self.seconds else 0.0

    @property
    def padding_efficiency(self) -> float:
        """Real tokens / tokens processed (batch size × longest text, summed over batches)."""
        return self.real_tokens / self.processed_tokens if self.processed_tokens else 1.0

    @property
    def items_per_s(self) -> float:
        return self.items_done / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.real_tokens / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        repeats = f", {self.repeats} repeating a text run once" if self.repeats else ""
        done = (f"extracted {self.items_done} items{repeats} ({self.real_tokens} tokens run) in {self.seconds:.1f} "
                f"s: {self.items_per_s:.1f} items/s, {self.tokens_per_s:.0f} tokens/s, padding efficiency "
                f"{self.padding_efficiency:.1%}" if self.items_done else "nothing left to extract")
        skipped = f", {self.shards_skipped} already complete" if self.shards_skipped else ""
        busy = ""
        if self.items_done:
            what = "GPU" if self.device.startswith("cuda") else "compute"
            busy = (f"\n{what}-busy fraction {self.busy_fraction:.1%} ({self.forward_seconds:.1f} s in forward "
                    f"passes on {self.device}); waited {self.writer_wait_seconds + self.drain_seconds:.1f} s "
                    "on the background writer")
        distinct = f" ({self.stored_rows} distinct texts stored)" if self.stored_rows < self.n_items else ""
        return (f"{done}{busy}\nstore {self.path}: {self.n_items} items{distinct} in {self.n_shards} shards "
                f"({self.shards_written} written{skipped}), backend {self.backend}")


# ------------------------------------------------------------------------------------- arguments

def parse_pools(pool) -> tuple[str, ...]:
    """'last', 'mean', 'both' or a sequence of them."""
    if isinstance(pool, str):
        pools = POOLS if pool == "both" else (pool,)
    else:
        pools = tuple(pool)
    bad = [p for p in pools if p not in POOLS]
    if bad or not pools:
        raise BabelprobeError(f"unknown pooling {pool!r}; use last, mean or both")
    return tuple(p for p in POOLS if p in pools)


# ------------------------------------------------------------------------------------------ run

@runner(ExtractSettings, old=("model", "items", "out", "settings"), batch_tokens=8192)
def extract(items: pd.DataFrame, out: str | Path, settings: ExtractSettings | None = None,
            runtime: Runtime | None = None, *, shard_size: int | None = None, compression: str = "none",
            padding_side: str = "right", source: dict | None = None, provenance: dict | None = None,
            remote: bool | str | None = None) -> ExtractReport:
    """Extract pooled activations of `items` (text column) into the store at `out`.

    Parameters
    ----------
    runtime : the model (a `LoadedModel` or a spec, loaded after the checks) and the running options:
        `batch_tokens` (token budget per batch: batch size × longest text), `overwrite`, `progress`
        (`runtime.Runtime`, or those as keywords: `extract(lm, items, out, batch_tokens=64)`).
    settings : an `ExtractSettings`, or its fields as keyword arguments (`values`): `layers` ('all'
        (default), '0-18', '0,6,12' or a list; 0 = embeddings, i = output of block i), `pool` ('last',
        'mean' or 'both'), `dtype` (float32, float16 or bfloat16 on disk) with `on_overflow` ('error',
        'bfloat16', 'float32': what to do with a shard whose values exceed float16's range), `backend`
        ('hf', 'transformer_lens' or 'nnsight'; all store the same values), `truncate`.
    shard_size : items per shard (default: at most 256 MiB of float32 per pooling and 2048 items).
    remote : nnsight backend only: True runs each batch's trace on NDIF (a model from `load_remote_model`;
        the default for one), "local" serialises the trace as for NDIF and runs it here (a dry run of the
        remote path), False/None runs it here.
    source : how to reload the items (e.g. {"source": "xcomps-sample", "languages": [...], "limit": 5}),
        recorded in the manifest so later stages can find them.
    Returns an `ExtractReport`; read the store with `open_store(out)`.
    """
    batch_tokens, overwrite, progress = runtime.batch_tokens, runtime.overwrite, runtime.progress
    check_extract(runtime.info, settings, batch_tokens=batch_tokens, shard_size=shard_size, padding_side=padding_side)
    if items is None or len(items) == 0:
        raise BabelprobeError("nothing to extract: the item set is empty")
    from babelprobe.items import validate

    items = validate(items.copy(), "items given to extract")  # schema, unique ids, non-empty texts
    settings = replace(settings, dtype=store_dtype(settings, out, runtime.compute_dtype, runtime.overwrite))
    check_store_room(out, items, settings, runtime.info, compression)  # before the weights load
    lm = runtime.lm
    layers, pools = parse_layers(settings.layers, lm.n_layers), parse_pools(settings.pool)
    backend = settings.backend
    encodings = lm.encode(items["text"].tolist(), names=items["item_id"].tolist(), truncate=settings.truncate)
    keys = items[["item_id", "pair_id", "language", "subset", "label"]].copy()
    keys["n_tokens"] = np.array([len(e.ids) for e in encodings], dtype=np.int32)
    if remote is None:
        remote = bool(lm.remote)
    if remote and backend != "nnsight":
        raise BabelprobeError(f"a remote model runs only with --backend nnsight, not {backend!r}")
    provenance = {**(provenance or {}), "extract_settings": settings_record(settings)}
    writer = _writer(lm, items, out, layers, pools, backend, settings.dtype, settings.on_overflow, shard_size,
                     compression, settings.truncate, source, provenance, batch_tokens, padding_side, remote)
    world = join_world(lm.device)
    try:
        return _run(lm, world, writer, encodings, keys, backend, layers, batch_tokens, padding_side,
                    overwrite, progress, remote)
    finally:
        world.close()


def store_dtype(settings: ExtractSettings, out: str | Path, model_dtype: str, overwrite: bool = False) -> str:
    """The dtype of the store at `out` that an extraction makes or resumes, known before the model loads
    (`model_dtype`: what it computes in, `Runtime.compute_dtype`): the one asked for (`settings.dtype`); else
    the dtype of a store already there (kept unless `overwrite`); else the fewest bytes that hold the model's
    states exactly (`settings.exact_dtype`: bfloat16 for a bfloat16 model's last-token rows, the default on a
    GPU; float32 on a CPU)."""
    from babelprobe.extract.store import MANIFEST, open_store

    if settings.dtype is not None:
        return settings.dtype
    if not overwrite and (Path(out) / MANIFEST).exists():
        return open_store(out, allow_incomplete=True).dtype
    return exact_dtype(settings.pool, model_dtype)


def check_extract(lm, settings: ExtractSettings, *, batch_tokens: int = 8192, shard_size: int | None = None,
                  padding_side: str = "right") -> None:
    """The checks an extraction can make before any work: the runtime options, and the layers against the
    model (`lm`: a `LoadedModel`, or its number of blocks L)."""
    if batch_tokens < 1:
        raise BabelprobeError(f"--batch-tokens must be positive, got {batch_tokens}")
    if shard_size is not None and shard_size < 1:
        raise BabelprobeError(f"--shard-size must be at least 1, got {shard_size}")
    if padding_side not in ("right", "left"):
        raise BabelprobeError(f"padding side must be right or left, got {padding_side!r}")
    parse_layers(settings.layers, lm if isinstance(lm, int) else lm.n_layers)


def check_store_room(out, items: pd.DataFrame, settings: ExtractSettings, lm, compression: str = "none") -> None:
    """The store of `items` (a row of values per distinct text) fits the disk at `out` (`store.check_room`;
    `lm`: a `LoadedModel` or the `ModelInfo` read from its files, so that this runs before the weights load)."""
    check_room(Path(out), items["text"].nunique(), len(parse_layers(settings.layers, lm.n_layers)), lm.d_model,
               parse_pools(settings.pool), settings.dtype, compression)


def _writer(lm, items, out, layers, pools, backend, dtype, on_overflow, shard_size, compression, truncate,
            source, provenance, batch_tokens, padding_side, remote=False) -> StoreWriter:
    from babelprobe.extract.backends import BACKENDS
    from babelprobe.items import items_hash

    if backend not in BACKENDS:
        raise BabelprobeError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    ihash = items_hash(items)
    model_dtype = str(lm.dtype).removeprefix("torch.")
    provenance = dict(provenance or {})
    model = {**lm.describe(), **(provenance.pop("model", None) or {})}
    item_info = {**(source or {}), **(provenance.pop("items", None) or {}), "hash": ihash, "n": len(items)}
    settings = {"fingerprint": lm.fingerprint, "items_hash": ihash, "backend": backend, "model_dtype": model_dtype,
                "truncate": truncate, "mean_excludes_bos": lm.bos_policy == "bos"}
    return StoreWriter(
        out, n_rows=len(items), layers=layers, d_model=lm.d_model, n_layers=lm.n_layers, pools=pools,
        dtype=dtype, shard_size=shard_size, on_overflow=on_overflow, compression=compression,
        settings=settings, value_rows=first_rows(items["text"].tolist()),
        provenance={"model": model, "items": item_info, "bos_policy": lm.bos_policy,
                    "backend": {"name": backend, **({"remote": remote} if remote else {})},
                    "pooling": {p: (MEAN_POOLING if p == "mean" else LAST_POOLING) for p in pools},
                    "batching": {"batch_tokens": batch_tokens, "padding_side": padding_side},
                    **provenance})


def _run(lm, world: World, writer: StoreWriter, encodings, keys, backend_name, layers, batch_tokens,
         padding_side, overwrite, progress, remote=False) -> ExtractReport:
    report = ExtractReport(path=writer.path, n_items=writer.n_rows, n_shards=writer.n_shards, backend=backend_name,
                           stored_rows=writer.stored_rows())
    lock = store_lock(writer.path)
    held, todo, error = False, None, None
    if world.is_main:
        try:
            ensure_dir(writer.path)
            lock.__enter__()
            held = True
            todo = writer.prepare(overwrite=overwrite)
        except BabelprobeError as err:
            error = str(err)
    try:
        world.agree(error)
        todo = world.gather(todo)[0]
        mine = world.my_shards(todo)
        report.shards_skipped = writer.n_shards - len(todo)
        if progress and world.is_main and todo and report.shards_skipped:
            tqdm.write(f"babelprobe: resuming {writer.path}: {report.shards_skipped} of {writer.n_shards} "
                       "shards already complete")
        error, stats = None, None
        try:
            stats = _extract_shards(lm, world, writer, encodings, keys, backend_name, layers, batch_tokens,
                                    padding_side, mine, progress, remote)
        except Exception as err:
            if world.size == 1:
                raise
            error = str(err) if isinstance(err, BabelprobeError) else f"{type(err).__name__}: {err}"
            world.agree(error)
        world.agree(None)
        everyone = world.gather(stats)
        for key in ("shards_written", "items_done", "repeats", "real_tokens", "processed_tokens", "halvings"):
            setattr(report, key, sum(s[key] for s in everyone))
        report.seconds = max(s["seconds"] for s in everyone)
        # busy fraction over all ranks: each rank's forward time against the same wall time
        report.forward_seconds = sum(s["forward_seconds"] for s in everyone) / world.size
        report.writer_wait_seconds = max(s["writer_wait_seconds"] for s in everyone)
        report.drain_seconds = max(s["drain_seconds"] for s in everyone)
        report.device = stats["device"] if stats else str(lm.device)
        report.per_rank = everyone if world.size > 1 else []
        if world.is_main and not writer.already_complete:
            writer.finish(extra={"backend": {"name": backend_name, "version": backend_version(backend_name),
                                             **({"remote": remote} if remote else {})},
                                 "world_size": world.size})
        world.gather(None)  # every rank returns once the manifest is complete
    finally:
        if held:
            lock.__exit__(None, None, None)
    return report


def _extract_shards(lm, world, writer, encodings, keys, backend_name, layers, batch_tokens, padding_side,
                    shards, progress, remote=None) -> dict:
    stats = {"shards_written": 0, "items_done": 0, "repeats": 0, "real_tokens": 0, "processed_tokens": 0,
             "halvings": 0,
             "seconds": 0.0, "forward_seconds": 0.0, "writer_wait_seconds": 0.0, "drain_seconds": 0.0,
             "write_seconds": 0.0, "device": str(lm.device)}
    if not shards:
        return stats
    total = sum(writer.shard_rows(k)[1] - writer.shard_rows(k)[0] for k in shards)
    bar = tqdm(total=total, unit="item", desc="extract", dynamic_ncols=True,
               disable=not progress or not world.is_main)
    records = [] if world.size > 1 else [writer.record_of(k) for k in range(writer.n_shards)
                                         if k not in shards and writer.shard_is_done(k)]
    start = time.perf_counter()
    clock, cost = ForwardClock(lm.device), pass_tokens(lm.device)
    with make_backend(backend_name, lm, layers, remote=remote) as backend, torch.inference_mode(), frozen_heap():
        background = BackgroundWriter(writer, keys, (len(layers), lm.d_model), records,
                                      update_manifest=world.size == 1, threaded=remote != "local")
        runner = _BatchRunner(lm, backend, layers, writer.pools, padding_side, stats, clock, background.encoding)
        try:
            repeats = Repeats(encodings, [writer.shard_rows(k) for k in shards], background.row_bytes,
                              value_rows=writer.value_rows)
            for n, k in enumerate(shards):
                r0, r1 = writer.shard_rows(k)
                shard_encodings = encodings[r0:r1]
                plan = repeats.shard(n)
                background.start(k)
                if plan.copied:
                    background.copied(list(plan.copied), list(plan.copied.values()))
                background.forget(plan.gone)
                stats["items_done"] += len(plan.copied) + plan.pointing
                stats["repeats"] += (r1 - r0) - len(plan.firsts)
                bar.update(len(plan.copied) + plan.pointing)
                for batch in length_batches([len(shard_encodings[i].ids) for i in plan.firsts], batch_tokens, cost):
                    for rows, pooled in runner.run([plan.firsts[j] for j in batch], shard_encodings):
                        into = [row for first in rows for row in plan.copies[first]]
                        source = [j for j, first in enumerate(rows) for _ in plan.copies[first]] \
                            if len(into) > len(rows) else None  # None: each row its own (no copy made)
                        keep = {j: plan.keep[first] for j, first in enumerate(rows) if first in plan.keep}
                        background.rows(into, pooled, source, keep)
                    done = sum(len(plan.copies[plan.firsts[j]]) for j in batch)
                    stats["items_done"] += done
                    bar.update(done)
                    elapsed = time.perf_counter() - start
                    bar.set_postfix_str(f"{stats['real_tokens'] / max(elapsed, 1e-9):.0f} tok/s", refresh=False)
                background.end(k)
            drain = time.perf_counter()
            background.close()  # the last shards are written before the run counts as done
            stats["drain_seconds"] = time.perf_counter() - drain
        except BaseException:
            background.abort()
            raise
        finally:
            bar.close()
    stats["seconds"] = time.perf_counter() - start
    stats["forward_seconds"] = clock.total()
    stats["shards_written"] = background.shards_written
    stats["writer_wait_seconds"] = background.waited
    stats["write_seconds"] = background.write_seconds
    return stats


def repeated_texts(keys: dict) -> tuple[list[int], dict[int, list[int]]]:
    """The first row of each distinct key (a text's tokens) among a shard's rows ({row: key}), and for each first
    row every row with its key (itself included)."""
    first: dict = {}
    copies: dict[int, list[int]] = {}
    for row, key in keys.items():
        copies.setdefault(first.setdefault(key, row), []).append(row)
    return list(first.values()), copies


@dataclass
class ShardPlan:
    """One shard's rows (numbered within it): `firsts` to run, each first's `copies` (rows with its tokens,
    itself included), the rows `copied` from a kept earlier shard's text (row -> key), and the run texts to
    `keep` for later shards (first row -> key); the kept texts no later shard has are `gone` once copied. The
    `pointing` rows need nothing: their text's values are stored in an earlier shard, where they point."""

    firsts: list[int]
    copies: dict[int, list[int]]
    copied: dict[int, tuple]
    gone: list[tuple]
    keep: dict[int, tuple]
    pointing: int = 0


class KeptTexts:
    """Which texts that recur are kept for later units of work (an extraction's shards, a fused pass's chunks),
    given every key (a text, or its tokens) of every unit ahead, one entry per row. `plan(keys)`, called for the
    units in order, says which of a unit's keys an earlier unit kept (`earlier`: copied, not run), which of the
    others to keep because a later unit has them too, while the kept rows stay within `budget` bytes
    (`REPEAT_BYTES`; beyond it a text runs again where it recurs), and which kept keys no later unit has (`gone`:
    let go once copied). `len()` is the number kept now. Keys in `plan`'s `free` are kept without their rows
    (their values need no copy: every later row with them points to a stored row) and cost no bytes."""

    def __init__(self, keys, row_bytes: int, budget: int | None = None):
        self.left = Counter(keys)  # each key's rows in units not yet planned
        self.held: dict = {}  # key -> the bytes its kept rows take
        self.row_bytes, self.budget = row_bytes, REPEAT_BYTES if budget is None else budget

    def __len__(self) -> int:
        return len(self.held)

    def plan(self, keys, free=frozenset()) -> tuple[set, set, list]:
        counts = Counter(keys)
        earlier = {key for key in counts if key in self.held}
        self.left.subtract(counts)
        gone = [key for key in counts if key in earlier and self.left[key] == 0]
        for key in gone:
            del self.held[key]
        keep, used = set(), sum(self.held.values())
        for key in counts:
            cost = 0 if key in free else self.row_bytes
            if key not in earlier and self.left[key] > 0 and used + cost <= self.budget:
                self.held[key] = cost
                used += cost
                keep.add(key)
        return earlier, keep, gone


class Repeats:
    """Which texts a process's shards run and which they copy. The same tokens give the same states, so a text
    that recurs (XCOMPS's acceptable sentence, once in each of its four negative types' pairs: 37.5% of the
    items) runs once: within a shard its pooled rows fill each of its rows. A row whose text an earlier shard
    has (`value_rows`, the store's) points to that shard's row and needs nothing; other rows whose tokens an
    earlier shard ran (another text, the same tokens) take the rows the background writer kept from it until the
    last shard that has them (`KeptTexts`)."""

    def __init__(self, encodings, spans: list[tuple[int, int]], row_bytes: int, budget: int | None = None,
                 value_rows=None):
        self.keys = [{row - r0: tuple(encodings[row].ids) for row in range(r0, r1)
                      if value_rows is None or value_rows[row] >= r0} for r0, r1 in spans]
        self.sizes = [r1 - r0 for r0, r1 in spans]
        self.kept = KeptTexts((key for keys in self.keys for key in keys.values()), row_bytes, budget)

    def shard(self, n: int) -> ShardPlan:
        """The n-th shard's plan; kept texts that no later shard has are let go once copied (`ShardPlan.gone`)."""
        keys = self.keys[n]
        firsts, copies = repeated_texts(keys)
        earlier, keep, gone = self.kept.plan(keys.values())
        copied = {row: keys[first] for first in firsts if keys[first] in earlier for row in copies[first]}
        firsts = [first for first in firsts if keys[first] not in earlier]
        return ShardPlan(firsts, {first: copies[first] for first in firsts}, copied, gone,
                         {first: keys[first] for first in firsts if keys[first] in keep}, self.sizes[n] - len(keys))


class ForwardClock:
    """Time the device spends in forward passes: CUDA events around each batch's forward (read at the end,
    so timing never makes the host wait for the device), wall time on CPU where the forward is synchronous."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.pending: list = []
        self.seconds = 0.0

    def begin(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def end(self, begun) -> None:
        if not self.cuda:
            self.seconds += time.perf_counter() - begun
            return
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        self.pending.append((begun, event))
        while len(self.pending) > 64 and self.pending[0][1].query():  # fold in what the device has finished
            first, last = self.pending.pop(0)
            self.seconds += first.elapsed_time(last) / 1000

    def total(self) -> float:
        for first, last in self.pending:
            last.synchronize()
            self.seconds += first.elapsed_time(last) / 1000
        self.pending = []
        return self.seconds


class _BatchRunner:
    """Runs one length-sorted batch through the backend and returns its pooled rows (on their way to host
    memory); halves the batch and retries when the GPU runs out of memory."""

    def __init__(self, lm, backend, layers, pools, padding_side, stats, clock: ForwardClock,
                 encode: str | None = None):
        self.lm, self.backend, self.layers, self.pools = lm, backend, layers, pools
        self.padding_side, self.stats, self.clock, self.encode = padding_side, stats, clock, encode
        self.exclude_bos = lm.bos_policy == "bos"

    def run(self, rows: list[int], encodings) -> list:
        """[(rows, PooledRows)]: one entry, or several when the batch had to be halved."""
        try:
            pooled = self._forward([encodings[i] for i in rows])
        except torch.OutOfMemoryError:
            pooled = None  # leave the except block first, so the failed batch's tensors are freed
        if pooled is None:
            if len(rows) == 1:
                raise BabelprobeError(f"out of GPU memory on a single text of {len(encodings[rows[0]].ids)} "
                                      "tokens; use a smaller model dtype, --device-map auto or a bigger GPU")
            torch.cuda.empty_cache()
            self.stats["halvings"] += 1
            half = len(rows) // 2
            return self.run(rows[:half], encodings) + self.run(rows[half:], encodings)
        return [(rows, pooled)]

    def _forward(self, encodings):
        batch = pad_batch(encodings, self.lm.pad_token_id, self.padding_side, self.lm.device)
        pooler = Pooler(batch["attention_mask"], self.pools, len(self.layers), self.lm.d_model, self.exclude_bos)
        begun = self.clock.begin()
        self.backend.run(batch, pooler)
        self.clock.end(begun)
        result = pooler.result_async(self.encode)
        self.stats["real_tokens"] += sum(len(e.ids) for e in encodings)
        self.stats["processed_tokens"] += int(batch["input_ids"].numel())
        return result
