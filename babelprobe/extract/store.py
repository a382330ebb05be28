"""The activation store: sharded HDF5 files plus a manifest, written crash-safely and read by layer.

Layout (docs/design.md, "Activation store"): a directory with `manifest.json` and `shard-NNNNN.h5`. Shard k
holds the rows `[k * shard_size, (k + 1) * shard_size)` of the item set, in item-set order. Each shard
is readable with plain h5py:

    last, mean     (rows, n_stored_layers, d_model) activations; attribute `dtype` is the logical dtype:
                   float32, float16, or bfloat16 stored as its raw upper 16 bits in uint16;
                   attribute `sha256` is the sha256 of the stored bytes (C order); attribute `layers`
    item_id, pair_id, language, subset   UTF-8 strings;   label  int8;   n_tokens  int32
    value_row      int64 per row: the store row whose values the row has (format 2). A text that recurs is
                   stored once: a row whose text an earlier row has points to that row (the first with the
                   text) and has no values in `last`/`mean`, which hold the shard's other rows, in order.

Arrays are chunked as (about 1 MiB of rows) x 1 layer x d_model, so reading one layer of a shard is a
few large reads. A shard is written to a hidden temporary name, flushed, fsynced and renamed, so a
file under a final name is always complete; the manifest is replaced atomically. `write_store` writes
in-memory arrays through the same `StoreWriter` that extraction uses; `open_store` returns a `Store`
whose `read(layer, rows)` reads only the chunks it needs; `verify_store` rechecks everything.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import threading
from functools import cache, cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.tables import atomic_path

FORMAT = "babelprobe-activations"
FORMAT_VERSION = 2  # 2: a recurring text's rows point to its first row (`value_row`); 1: every row stored
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
LOCK = ".babelprobe.lock"
POOLS = ("last", "mean")
DTYPES = ("float32", "float16", "bfloat16")
COMPRESSIONS = ("none", "lzf", "gzip")
KEY_COLUMNS = ("item_id", "pair_id", "language", "subset", "label", "n_tokens")
STRING_KEYS = ("item_id", "pair_id", "language", "subset")
CHUNK_BYTES = 1 << 20  # at most 1 MiB per chunk: rows x 1 layer x d_model (`StoreWriter._chunks`)
READ_RUN_CHUNKS = 16  # a read covers at most this many consecutive chunks (memory bound of a read)
SCATTER_TEMPORARY_BYTES = 4 << 20  # rows scattered into a read's answer through a temporary up to this size
SHARD_BYTES = 256 << 20  # default shard size: at most this many float32 bytes per pooling ...
MAX_SHARD_ROWS = 2048  # ... and at most this many rows (resume granularity: a shard is redone whole)
FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504
SHARD_RE = re.compile(r"^shard-(\d{5,})\.h5$")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.h5"


def default_shard_size(n_layers_stored: int, d_model: int) -> int:
    """Rows per shard: one pooling of a shard is at most `SHARD_BYTES` in float32, and at most 2048 rows.
    This also bounds extraction's memory: a shard is assembled in memory before it is written."""
    return int(max(1, min(MAX_SHARD_ROWS, SHARD_BYTES // (4 * max(1, n_layers_stored * d_model)))))


def settings_hash(settings: dict) -> str:
    """Hash of everything that determines a store's content; resuming requires it to match."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


@cache
def library_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("babelprobe", "torch", "transformers", "transformer-lens", "nnsight", "h5py", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


# ------------------------------------------------------------------------------------ dtype encoding

def encode_array(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values -> their stored representation (bfloat16: round to nearest even, raw uint16)."""
    if dtype == "float32":
        return np.ascontiguousarray(values, dtype=np.float32)
    if dtype == "float16":
        return values.astype(np.float16)
    if dtype == "bfloat16":
        values = _torch().from_numpy(np.ascontiguousarray(values, dtype=np.float32))
        return encode_tensor(values, dtype).numpy().view(np.uint16)
    raise BabelprobeError(f"unknown store dtype {dtype!r}; use one of {', '.join(DTYPES)}")


def encode_tensor(values, dtype: str):
    """float32 torch `values`, on any device, as a float32 or bfloat16 store keeps them: float32, or bfloat16's
    bits (int16 to torch, uint16 in the store; torch rounds to nearest even on every device)."""
    if dtype == "float32":
        return values
    if dtype == "bfloat16":
        torch = _torch()
        return values.to(torch.bfloat16).view(torch.int16)
    raise ValueError(f"rows are encoded as float32 or bfloat16 on a device, not {dtype!r}")


def decode_array(stored: np.ndarray, dtype: str) -> np.ndarray:
    """Stored representation -> float32."""
    if dtype == "bfloat16":
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored.astype(np.float32, copy=False)


def decode_into(stored: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """`decode_array` written into float32 `out` (same shape) without temporaries."""
    if dtype == "bfloat16":
        np.left_shift(stored, 16, out=out.view(np.uint32), dtype=np.uint32)
    else:
        out[...] = stored


def _decode_to(stored: np.ndarray, dtype: str, target) -> None:
    """`decode_into` a float32 numpy array, or into a torch tensor on its device: the stored bits are copied
    there as they are and decoded by torch (bfloat16 bits are bfloat16 to torch)."""
    if isinstance(target, np.ndarray):
        decode_into(stored, dtype, target)
        return
    torch = _torch()
    source = torch.from_numpy(stored.view(np.int16)).view(torch.bfloat16) if dtype == "bfloat16" else \
        torch.from_numpy(stored)
    target.copy_(source.to(target.device))


def _torch():
    import torch  # only where a read goes to a device: the store's other users need no torch

    return torch


_STAGED = threading.local()  # each reading thread's buffer (probe groups are read on several threads at once)


def _read_staged(ds, rows: slice, layers: slice, pinned: bool) -> np.ndarray:
    """`ds[rows, layers, :]` read into this thread's reused buffer (page-locked when `pinned`: a copy to a GPU
    from it is a DMA, not the driver's staged copy of pageable memory), valid until the thread's next read.
    A fresh array per read costs its pages' faults: HDF5's reads of a bfloat16 store at the 8B width went from
    2.0 to 3.6 GB/s here reused (perf/README.md "... store reads through one buffer")."""
    shape = (rows.stop - rows.start, layers.stop - layers.start, ds.shape[2])
    size = int(np.prod(shape)) * ds.dtype.itemsize
    held = getattr(_STAGED, "buffer", None)
    if held is None or held.nbytes < size or getattr(_STAGED, "pinned", False) != pinned:
        held = _torch().empty(size, dtype=_torch().uint8, pin_memory=True).numpy() if pinned else \
            np.empty(size, dtype=np.uint8)
        _STAGED.buffer, _STAGED.pinned = held, pinned
    out = held[:size].view(ds.dtype).reshape(shape)
    ds.read_direct(out, np.s_[rows, layers, :])
    return out


def storage_dtype(dtype: str):
    return {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[dtype]


def check_values(values: np.ndarray, layers: list[int], pool: str, keys: pd.DataFrame, dtype: str,
                 on_overflow: str) -> str:
    """Refuse non-finite values; return the dtype to store in (float16 overflow: error or `on_overflow`).

    Checked one layer at a time so no shard-sized temporary is made, in two passes over the values (the
    largest and the smallest: a NaN or an infinity shows in them); the item is looked up only on an error."""
    worst_layer, worst = None, 0.0
    for j, layer in enumerate(layers):
        block = values[:, j]
        high, low = float(block.max(initial=0.0)), float(block.min(initial=0.0))
        if not (np.isfinite(high) and np.isfinite(low)):
            row = int(np.argwhere(~np.isfinite(block))[0][0])
            raise not_finite(pool, layer, keys['item_id'].iloc[row])
        peak = max(high, -low)
        if peak > worst:
            worst_layer, worst = layer, peak
    if dtype != "float16" or worst <= FLOAT16_MAX:
        return dtype
    if on_overflow in ("bfloat16", "float32"):
        return on_overflow
    raise BabelprobeError(f"{pool} activations of layer {worst_layer} reach |x| = {worst:.5g}, beyond float16's "
                          f"largest value {FLOAT16_MAX:.0f}; store float32 or bfloat16 instead, or pass "
                          "--on-overflow bfloat16 (or float32) to store such shards in that dtype")


def not_finite(pool: str, layer: int, item_id: str) -> BabelprobeError:
    return BabelprobeError(f"{pool} activations of layer {layer} are not finite (NaN or inf) for item {item_id!r}; "
                           "the model overflowed its compute dtype: run the model in float32 (--model-dtype "
                           "float32) or check the model")


def first_rows(texts) -> np.ndarray:
    """For each row, the first row with the same text (itself for a text's first row): the `value_row` of a store
    whose rows hold these texts' states, where a recurring text is stored once."""
    first: dict = {}
    return np.array([first.setdefault(text, row) for row, text in enumerate(texts)], dtype=np.int64)


def shard_slots(value_rows: np.ndarray, spans) -> np.ndarray:
    """Each row's place in its shard's `last`/`mean` (shards: the (start, stop) `spans`): its rank among the shard's
    rows that hold values, -1 for a row pointing to an earlier one (nothing stored) or in no span."""
    own, slots = value_rows == np.arange(len(value_rows)), np.full(len(value_rows), -1, dtype=np.int64)
    for start, stop in spans:
        slots[start:stop] = np.where(own[start:stop], np.cumsum(own[start:stop]) - 1, -1)
    return slots


def check_value_rows(value_rows: np.ndarray, where: str) -> None:
    """A row points to itself or to an earlier row that points to itself (the one holding the values)."""
    rows = np.arange(len(value_rows))
    bad = (value_rows < 0) | (value_rows > rows)
    if not bad.any():
        bad = value_rows[value_rows] != value_rows
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise BabelprobeError(f"{where}: row {row} points to row {int(value_rows[row])}, which does not hold values "
                              "(a row points to itself or to an earlier row that holds its values)")


def sha256_of(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).data).hexdigest()


def keys_sha256(keys: pd.DataFrame) -> str:
    payload = keys[list(KEY_COLUMNS)].to_json(orient="values", force_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def normalise_keys(keys: pd.DataFrame) -> pd.DataFrame:
    """The store's key columns with their types; `n_tokens` defaults to -1 (unknown) when missing."""
    missing = [c for c in KEY_COLUMNS[:5] if c not in keys.columns]
    if missing:
        raise BabelprobeError(f"store keys lack column(s) {', '.join(missing)}; need {', '.join(KEY_COLUMNS[:5])}")
    out = pd.DataFrame({c: keys[c].astype(str).to_numpy() for c in STRING_KEYS})
    out["label"] = keys["label"].to_numpy().astype(np.int8)
    out["n_tokens"] = (keys["n_tokens"].to_numpy() if "n_tokens" in keys.columns
                       else np.full(len(keys), -1)).astype(np.int32)
    if out["item_id"].duplicated().any():
        raise BabelprobeError(f"store keys have duplicate item_id {out['item_id'][out['item_id'].duplicated()].iloc[0]!r}")
    return out


# ------------------------------------------------------------------------------------------- manifest

def read_manifest(path: Path) -> dict:
    file = Path(path) / MANIFEST
    if not Path(path).exists():
        raise BabelprobeError(f"activation store {path} does not exist")
    if not file.exists():
        raise BabelprobeError(f"{path} is not an activation store: it has no {MANIFEST}")
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BabelprobeError(f"{file}: unreadable manifest ({str(err).splitlines()[0]}); "
                              "re-run the extract command with --overwrite") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BabelprobeError(f"{file}: not a babelprobe activation manifest (format field missing or wrong)")
    if manifest.get("format_version", 1) not in READABLE_VERSIONS:
        raise BabelprobeError(f"{file}: format_version {manifest.get('format_version')!r} is not one this babelprobe "
                              f"reads ({', '.join(map(str, READABLE_VERSIONS))}); update babelprobe")
    for field in ("layers", "pools", "d_model", "n_rows", "shard_size", "shards", "dtype"):
        if field not in manifest:
            raise BabelprobeError(f"{file}: manifest lacks field {field!r}; re-run extract with --overwrite")
    return manifest


def write_manifest(path: Path, manifest: dict) -> None:
    with atomic_path(Path(path) / MANIFEST) as tmp:
        tmp.write_text(json.dumps(manifest, indent=1, ensure_ascii=False, default=str), encoding="utf-8")


# --------------------------------------------------------------------------------------------- writing

class StoreWriter:
    """Writes a store's shards and manifest; used by both `write_store` and extraction.

    `settings` is everything that determines the content (model fingerprint, items hash, backend,
    pools, dtype, layers, shard size, ...); `provenance` is recorded but does not affect resuming.
    Call `prepare(overwrite)` once (under the caller's lock), then `write_shard` for each shard (any
    order, any process), then `finish()`."""

    def __init__(self, path: str | Path, *, n_rows: int, layers: list[int], d_model: int, n_layers: int,
                 pools: tuple[str, ...], dtype: str = "float32", shard_size: int | None = None,
                 on_overflow: str = "error", compression: str = "none", settings: dict | None = None,
                 provenance: dict | None = None, value_rows: np.ndarray | None = None):
        if n_rows <= 0:
            raise BabelprobeError("nothing to store: the item set is empty")
        bad = [p for p in pools if p not in POOLS]
        if bad or not pools:
            raise BabelprobeError(f"unknown pooling {bad[0] if bad else '(none)'!r}; use last, mean or both")
        if dtype not in DTYPES:
            raise BabelprobeError(f"unknown store dtype {dtype!r}; use one of {', '.join(DTYPES)}")
        if on_overflow not in ("error", "bfloat16", "float32"):
            raise BabelprobeError(f"unknown --on-overflow {on_overflow!r}; use error, bfloat16 or float32")
        if compression not in COMPRESSIONS:
            raise BabelprobeError(f"unknown compression {compression!r}; use one of {', '.join(COMPRESSIONS)}")
        if shard_size is not None and shard_size < 1:
            raise BabelprobeError(f"shard size must be at least 1, got {shard_size}")
        self.path = Path(path)
        self.n_rows, self.layers, self.d_model, self.n_layers = n_rows, list(layers), d_model, n_layers
        self.pools, self.dtype, self.on_overflow, self.compression = tuple(pools), dtype, on_overflow, compression
        self.shard_size = shard_size or default_shard_size(len(self.layers), d_model)
        self.settings = {**(settings or {}), "pools": list(self.pools), "dtype": dtype, "on_overflow": on_overflow,
                         "layers": self.layers, "d_model": d_model, "n_layers": n_layers, "n_rows": n_rows,
                         "shard_size": self.shard_size, "format_version": FORMAT_VERSION}
        self.settings_hash = settings_hash(self.settings)
        self.provenance = provenance or {}
        self.already_complete = False
        # the row whose values each row has (`first_rows` of the items' texts; default: every row its own). It
        # follows from the items, which the settings hash covers, so every process and every resume agrees on it.
        rows = np.arange(n_rows, dtype=np.int64)
        self.value_rows = rows if value_rows is None else np.asarray(value_rows, dtype=np.int64)
        if self.value_rows.shape != (n_rows,):
            raise ValueError(f"value_rows has shape {self.value_rows.shape}, expected ({n_rows},)")
        check_value_rows(self.value_rows, f"store {self.path}")
        self.slot = shard_slots(self.value_rows, map(self.shard_rows, range(self.n_shards)))

    # -- layout
    @property
    def n_shards(self) -> int:
        return -(-self.n_rows // self.shard_size)

    def shard_rows(self, index: int) -> tuple[int, int]:
        return index * self.shard_size, min(self.n_rows, (index + 1) * self.shard_size)

    def stored_rows(self, index: int | None = None) -> int:
        """Rows of shard `index` (default: of the store) that hold values (the others point to an earlier row with
        the same text)."""
        start, stop = (0, self.n_rows) if index is None else self.shard_rows(index)
        return int((self.slot[start:stop] >= 0).sum())

    def base_manifest(self) -> dict:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "complete": False,
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                **self.provenance, "settings": self.settings, "settings_hash": self.settings_hash,
                "pools": list(self.pools), "dtype": self.dtype, "on_overflow": self.on_overflow,
                "layers": self.layers, "layer_names": [layer_name(i, self.n_layers) for i in self.layers],
                "n_layers": self.n_layers, "d_model": self.d_model, "n_rows": self.n_rows,
                "shard_size": self.shard_size, "n_shards": self.n_shards, "compression": self.compression,
                "stored_rows": self.stored_rows(), "libraries": library_versions(), "shards": []}

    # -- lifecycle
    def prepare(self, overwrite: bool = False) -> list[int]:
        """Create the directory, check an existing store, clear leftovers; return the shard indices to do."""
        ensure_dir(self.path)
        for leftover in self.path.glob(".shard-*.tmp"):
            leftover.unlink(missing_ok=True)  # partial shards of a killed run
        existing, shards = self.path / MANIFEST, sorted(self.path.glob("shard-*.h5"))
        has_manifest = existing.exists()
        if has_manifest and not overwrite and self._complete_in_older_format(existing):
            self.already_complete = True  # readable as it is: kept, not made again
            return []
        if has_manifest and not overwrite:
            self._check_same(existing)
        elif shards and not overwrite:
            raise BabelprobeError(f"{self.path} has shard files but no {MANIFEST}; "
                                  "pass --overwrite to replace them or choose another --out")
        replace = overwrite and (has_manifest or bool(shards))
        todo = [k for k in range(self.n_shards) if replace or not self.shard_is_done(k)]
        # the room is checked before an overwrite removes anything: a store refused is a store kept
        replaced = {f.name for f in shards} if replace else {shard_name(k) for k in todo}
        check_room(self.path, sum(map(self.stored_rows, todo)), len(self.layers),
                   self.d_model, self.pools, self.dtype, self.compression,
                   freed=sum(f.stat().st_size for f in shards if f.name in replaced))
        if replace:
            self.remove_store_files()
        self.already_complete = not todo and _is_complete(existing, self.settings_hash)
        if not self.already_complete:  # a finished store stays readable while it is re-checked
            write_manifest(self.path, self.base_manifest())
        return todo

    def _check_same(self, existing: Path) -> None:
        try:
            old = json.loads(existing.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = {}
        if old.get("settings_hash") == self.settings_hash:
            return
        if not any(self.path.glob("shard-*.h5")):
            return  # a store that never got a shard (e.g. a first run that failed): nothing to lose
        names = {"fingerprint": "model", "items_hash": "item set"}
        diff = sorted(names.get(k, k) for k in set(self.settings) | set(old.get("settings", {}))
                      if self.settings.get(k) != old.get("settings", {}).get(k))
        raise BabelprobeError(f"{self.path} holds a store made with other settings (different: "
                              f"{', '.join(diff) or 'unknown'}); pass --overwrite to replace it or choose another --out")

    def _complete_in_older_format(self, existing: Path) -> bool:
        """A complete store of an older format version with these settings otherwise (format 1: every row
        stored, recurring texts included), which this version reads."""
        try:
            old = json.loads(existing.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        settings = dict(old.get("settings") or {})
        version = settings.pop("format_version", None)
        ours = {k: v for k, v in self.settings.items() if k != "format_version"}
        return (bool(old.get("complete")) and version in READABLE_VERSIONS and version < FORMAT_VERSION
                and settings == json.loads(json.dumps(ours, default=str)))

    def remove_store_files(self) -> None:
        """Delete only what a store consists of (never other files in the directory)."""
        for file in [*self.path.glob("shard-*.h5"), *self.path.glob(".shard-*.tmp"), self.path / MANIFEST]:
            if file.is_file():
                file.unlink()

    def shard_is_done(self, index: int) -> bool:
        """A shard under its final name with this store's settings hash is complete (atomic rename)."""
        file = self.path / shard_name(index)
        if not file.exists():
            return False
        import h5py

        try:
            with h5py.File(file, "r") as f:
                return (f.attrs.get("settings_hash") == self.settings_hash
                        and tuple(f.attrs.get("rows", ())) == self.shard_rows(index))
        except OSError:
            return False

    def write_shard(self, index: int, keys: pd.DataFrame, arrays: dict[str, np.ndarray],
                    encoded: bool = False) -> dict:
        """Write shard `index` (the keys of its rows, and float32 arrays [stored rows, layers, d] of the rows that
        hold values: all, or those `slot` places) atomically; return its record. `encoded`: the arrays are
        already in the store's dtype and checked finite (`capture.Pooler.result_async` with
        `encode=self.dtype`), as they are stored."""
        start, stop = self.shard_rows(index)
        keys = normalise_keys(keys)
        if len(keys) != stop - start:
            raise ValueError(f"shard {index} needs {stop - start} rows, got {len(keys)}")
        final = self.path / shard_name(index)
        tmp = self.path / f".{final.name}.{os.getpid()}.tmp"
        value_rows = self.value_rows[start:stop]
        record = {"name": final.name, "rows": [start, stop], "stored_rows": self.stored_rows(index), "dtype": {},
                  "sha256": {}, "keys_sha256": keys_sha256(keys), "value_rows_sha256": sha256_of(value_rows)}
        stored_keys = keys[self.slot[start:stop] >= 0].reset_index(drop=True)  # who a stored row is (errors)
        stored = {}
        for pool in self.pools:
            values = arrays[pool]
            expected = (record["stored_rows"], len(self.layers), self.d_model)
            if tuple(values.shape) != expected:
                raise BabelprobeError(f"{pool} array of shard {index} has shape {tuple(values.shape)}, "
                                      f"expected {expected}")
            if encoded and values.dtype != storage_dtype(self.dtype):
                raise ValueError(f"{pool} array of shard {index} is {values.dtype}, not {self.dtype} as stored")
            dtype = self.dtype if encoded else check_values(values, self.layers, pool, stored_keys, self.dtype,
                                                            self.on_overflow)
            stored[pool] = values if encoded else encode_array(values, dtype)
            record["dtype"][pool] = dtype
            record["sha256"][pool] = sha256_of(stored[pool])
        try:
            self._write_hdf5(tmp, index, keys, stored, record)
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, final)
            _fsync_dir(self.path)
        except OSError as err:
            raise BabelprobeError(f"cannot write shard {final}: {err.strerror or err}; nothing partial was kept "
                                  "(complete shards are intact; run the same command again when fixed)") from err
        finally:
            if tmp.exists():
                tmp.unlink()
        return record

    def _write_hdf5(self, tmp: Path, index: int, keys: pd.DataFrame, stored: dict, record: dict) -> None:
        import h5py

        # no chunk cache: every chunk is written whole once, and going through HDF5's cache only adds a copy
        # (~1.5x the CPU time of the write at an 8B model's width)
        with h5py.File(tmp, "w", rdcc_nbytes=0) as f:
            f.attrs.update({"format": FORMAT, "format_version": FORMAT_VERSION, "shard": index,
                            "rows": record["rows"], "settings_hash": self.settings_hash,
                            "layers": np.asarray(self.layers, dtype=np.int32),
                            "provenance": json.dumps(self.provenance, default=str)})
            for column in STRING_KEYS:
                f.create_dataset(column, data=keys[column].to_numpy(dtype=object), dtype=h5py.string_dtype("utf-8"))
            f.create_dataset("label", data=keys["label"].to_numpy())
            f.create_dataset("n_tokens", data=keys["n_tokens"].to_numpy())
            f.create_dataset("value_row", data=self.value_rows[slice(*record["rows"])])
            for pool, data in stored.items():
                empty = {"maxshape": (None, *data.shape[1:])} if not len(data) else {}  # no chunk fits 0 rows
                ds = f.create_dataset(pool, shape=data.shape, dtype=data.dtype, chunks=self._chunks(data),
                                      **empty, **self._filters())
                ds[...] = data
                ds.attrs.update({"dtype": record["dtype"][pool], "sha256": record["sha256"][pool],
                                 "layers": np.asarray(self.layers, dtype=np.int32)})
            f.flush()

    def record_of(self, index: int) -> dict:
        """The manifest record of a complete shard, read back from its attributes."""
        import h5py

        with h5py.File(self.path / shard_name(index), "r") as f:
            keys = _keys_of(f)
            return {"name": shard_name(index), "rows": [int(x) for x in f.attrs["rows"]],
                    "stored_rows": int(f[self.pools[0]].shape[0]),
                    "dtype": {p: str(f[p].attrs["dtype"]) for p in self.pools},
                    "sha256": {p: str(f[p].attrs["sha256"]) for p in self.pools},
                    "keys_sha256": keys_sha256(keys), "value_rows_sha256": sha256_of(f["value_row"][()])}

    def update_manifest(self, records: list[dict], complete: bool, extra: dict | None = None) -> dict:
        manifest = self.base_manifest()
        manifest["shards"] = sorted(records, key=lambda r: r["name"])
        manifest["complete"] = complete
        manifest.update(extra or {})
        write_manifest(self.path, manifest)
        return manifest

    def finish(self, extra: dict | None = None) -> dict:
        """Collect every shard's record and write the complete manifest."""
        missing = [k for k in range(self.n_shards) if not self.shard_is_done(k)]
        if missing:
            raise BabelprobeError(f"{self.path}: shard(s) {', '.join(shard_name(k) for k in missing[:5])} are "
                                  "missing; run the same command again to finish the store")
        return self.update_manifest([self.record_of(k) for k in range(self.n_shards)], True, extra)

    # -- HDF5 layout
    def _chunks(self, data: np.ndarray) -> tuple[int, int, int]:
        """Rows × 1 layer × d_model, at most `CHUNK_BYTES`, the shard's rows split evenly: HDF5 keeps a last chunk
        whole on disk however few rows it holds (a shard of 130 bfloat16 rows at 4096 in chunks of 128 took twice
        its bytes), and shards storing a text once hold any number of rows."""
        most = max(1, CHUNK_BYTES // (data.itemsize * self.d_model))
        n_chunks = max(1, -(-len(data) // most))
        return (max(1, -(-len(data) // n_chunks)), 1, self.d_model)

    def _filters(self) -> dict:
        if self.compression == "none":
            return {}
        return {"compression": self.compression, "shuffle": True}


def check_room(path: Path, rows: int, n_layers: int, d_model: int, pools, dtype: str, compression: str = "none",
               freed: int | None = None) -> None:
    """Refuse, before the work, a store the disk cannot hold: the stored values of `rows` rows (those holding
    values: one per distinct text in an extraction's store; their files'
    least size: keys, attributes and HDF5's layout come on top, and float16 values beyond its range may be
    stored wider) against the free space of the disk that holds `path` plus the `freed` bytes of files they
    replace (default: every shard file already at `path`, as an overwrite removes them and a resumed store's
    count against its rows; before the model loads, `extract` and `compare` check thus with the model's
    config). A compressed store's size is not known in advance: not checked. Running out anyway is not fatal:
    complete shards are kept and the same command resumes."""
    if compression != "none" or rows <= 0:
        return
    path = Path(path)
    need = rows * len(pools) * n_layers * d_model * np.dtype(storage_dtype(dtype)).itemsize
    if freed is None:
        freed = sum(f.stat().st_size for f in path.glob("shard-*.h5")) if path.is_dir() else 0
    there = next((p for p in (path, *path.parents) if p.exists()), Path.cwd())
    try:
        free = shutil.disk_usage(there).free + freed
    except OSError:
        return  # a file system that does not say: the write will
    if need > free:
        raise BabelprobeError(
            f"{path}: the store needs at least {_gigabytes(need)} ({rows} row(s) x {n_layers} layer(s) x {d_model} "
            f"x {'+'.join(pools)} in {dtype}) and the disk has {_gigabytes(free)} free; free space, choose another "
            "--out, or store less (--layers, --store-dtype bfloat16)")


def _gigabytes(n: int) -> str:
    """A byte count in decimal units, three significant digits (1.32e+11 -> '132 GB')."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def ensure_dir(path: Path) -> None:
    """Create the output directory if missing; a one-line error if that fails or it is not writable."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BabelprobeError(f"cannot create output directory {path}: {err.strerror}") from err
    if not path.is_dir():
        raise BabelprobeError(f"output path {path} exists and is not a directory; choose another --out")
    if not os.access(path, os.W_OK | os.X_OK):
        raise BabelprobeError(f"output directory {path} is not writable; choose another --out")


def _is_complete(manifest: Path, settings_hash_: str) -> bool:
    try:
        old = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(old.get("complete")) and old.get("settings_hash") == settings_hash_


def layer_name(layer: int, n_layers: int) -> str:
    if layer == 0:
        return "embeddings"
    return f"block {layer} output" + (" (before the final norm)" if layer == n_layers else "")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def store_lock(path: Path):
    """A non-blocking lock on the store directory: a second writer fails at once with a clear message."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(Path(path) / LOCK), timeout=0)

    class _Held:
        def __enter__(self):
            try:
                lock.acquire()
            except Timeout as err:
                raise BabelprobeError(f"another process is writing the store {path} (lock {Path(path) / LOCK}); "
                                      "wait for it to finish or choose another --out") from err
            except OSError as err:
                raise BabelprobeError(f"cannot lock {Path(path) / LOCK}: {err.strerror}") from err
            return lock

        def __exit__(self, *exc):
            lock.release()

    return _Held()


def write_store(path: str | Path, keys: pd.DataFrame, last: np.ndarray | None = None,
                mean: np.ndarray | None = None, *, layers: list[int] | None = None, dtype: str = "float32",
                shard_size: int | None = None, provenance: dict | None = None, compression: str = "none",
                on_overflow: str = "error", n_layers: int | None = None, overwrite: bool = False) -> Path:
    """Write in-memory activations as a complete store (the same writer extraction uses).

    Parameters
    ----------
    path : the store directory (created; an existing store there is an error unless `overwrite`).
    keys : one row per item, in order: item_id, pair_id, language, subset, label, optional n_tokens.
    last, mean : float arrays [n_items, n_layers_stored, d_model]; at least one.
    layers : DESIGN numbers of the stored layers (default 0..n_layers_stored-1).
    dtype : float32, float16 or bfloat16 on disk.
    provenance : recorded in the manifest (e.g. {"model": {"name": ..., "fingerprint": ...},
        "items": {"source": ..., "hash": ...}}); `fingerprint`/`items_hash` keys are also understood.
    n_layers : L of the model (default: the largest stored layer).
    """
    arrays = {pool: np.asarray(a, dtype=np.float32) for pool, a in (("last", last), ("mean", mean)) if a is not None}
    if not arrays:
        raise BabelprobeError("write_store needs `last` or `mean` activations")
    shapes = {a.shape for a in arrays.values()}
    first = next(iter(arrays.values()))
    if len(shapes) != 1 or first.ndim != 3:
        raise BabelprobeError(f"activations must be [n_items, n_layers, d_model] arrays of one shape; got {shapes}")
    n, n_stored, d_model = first.shape
    if n != len(keys):
        raise BabelprobeError(f"keys have {len(keys)} rows but the activations have {n}")
    layers = list(range(n_stored)) if layers is None else [int(x) for x in layers]
    if len(layers) != n_stored or len(set(layers)) != len(layers):
        raise BabelprobeError(f"layers {layers} do not match the {n_stored} stored layers (or repeat)")
    provenance = _normalise_provenance(dict(provenance or {}), keys)
    writer = StoreWriter(path, n_rows=n, layers=layers, d_model=d_model,
                         n_layers=n_layers or provenance.get("model", {}).get("n_layers") or max(layers),
                         pools=tuple(arrays), dtype=dtype, shard_size=shard_size, on_overflow=on_overflow,
                         compression=compression, provenance=provenance,
                         settings={"fingerprint": provenance.get("model", {}).get("fingerprint"),
                                   "items_hash": provenance.get("items", {}).get("hash"), "source": "write_store"})
    ensure_dir(Path(path))
    with store_lock(Path(path)):
        if (Path(path) / MANIFEST).exists() and not overwrite:
            raise BabelprobeError(f"{path} already holds an activation store; pass overwrite=True to replace it")
        writer.prepare(overwrite=True)
        keys = normalise_keys(keys)
        for k in range(writer.n_shards):
            start, stop = writer.shard_rows(k)
            writer.write_shard(k, keys.iloc[start:stop], {p: a[start:stop] for p, a in arrays.items()})
        writer.finish()
    return Path(path)


def _normalise_provenance(provenance: dict, keys: pd.DataFrame) -> dict:
    """Accept flat `fingerprint` / `items_hash` keys; compute the items hash when keys carry texts."""
    model = dict(provenance.get("model") or {})
    items = dict(provenance.get("items") or {})
    if "fingerprint" in provenance:
        model.setdefault("fingerprint", provenance.pop("fingerprint"))
    if "items_hash" in provenance:
        items.setdefault("hash", provenance.pop("items_hash"))
    if "hash" not in items and "text" in keys.columns:
        from babelprobe.items import items_hash

        items["hash"] = items_hash(keys)
    provenance["model"], provenance["items"] = model, items
    return provenance


# --------------------------------------------------------------------------------------------- reading

def _keys_of(f) -> pd.DataFrame:
    frame = pd.DataFrame({c: f[c].asstr()[()] for c in STRING_KEYS})
    frame["label"] = f["label"][()].astype(np.int8)
    frame["n_tokens"] = f["n_tokens"][()].astype(np.int32)
    return frame


class Store:
    """A complete activation store opened for reading (see `open_store`).

    Reads touch only the shards and chunks holding the requested rows and layer, one run of at most
    `READ_RUN_CHUNKS` chunks at a time, so memory is bounded by the size of the answer."""

    def __init__(self, path: str | Path, allow_incomplete: bool = False):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        if not self.manifest.get("complete") and not allow_incomplete:
            done = len(self.manifest.get("shards", []))
            raise BabelprobeError(f"activation store {self.path} is incomplete ({done} of "
                                  f"{self.manifest.get('n_shards', '?')} shards recorded); run the same "
                                  "extract command again to finish it")
        self.layers: list[int] = [int(x) for x in self.manifest["layers"]]
        self.pools: tuple[str, ...] = tuple(self.manifest["pools"])
        self.d_model: int = int(self.manifest["d_model"])
        self.n_layers: int = int(self.manifest.get("n_layers") or max(self.layers))
        self.n_rows: int = int(self.manifest["n_rows"])
        self.dtype: str = self.manifest["dtype"]
        shards = self.manifest["shards"]
        self._names = [s["name"] for s in shards]
        self._starts = np.array([s["rows"][0] for s in shards], dtype=np.int64)
        self._stops = np.array([s["rows"][1] for s in shards], dtype=np.int64)
        self._files: dict = {}

    # -- provenance
    @property
    def fingerprint(self) -> str | None:
        return (self.manifest.get("model") or {}).get("fingerprint")

    @property
    def items_hash(self) -> str | None:
        return (self.manifest.get("items") or {}).get("hash")

    def __len__(self) -> int:
        return self.n_rows

    def check(self, pools=None) -> None:
        """Raise a one-line error if an array of `pools` (default: all) no longer matches the checksum written
        with it, or holds NaN/inf, or a shard's `value_row` (which row has which values) no longer matches its
        checksum. Reads every shard once, in row blocks; `verify_store` lists every problem."""
        for k, record in enumerate(self.manifest["shards"]):
            if "value_rows_sha256" in record and sha256_of(self.value_rows[slice(*record["rows"])]) != \
                    record["value_rows_sha256"]:
                raise BabelprobeError(f"activation store {self.path}: {record['name']}/value_row changed after it was "
                                      f"written (checksum mismatch); run `babelprobe verify {self.path}`")
            for pool in pools or self.pools:
                if pool not in self.pools:
                    continue
                digest, bad = _digest_and_check(self._file(k)[pool], record["dtype"][pool])
                where = f"activation store {self.path}: {record['name']}/{pool}"
                if digest != record["sha256"][pool]:
                    raise BabelprobeError(f"{where} changed after it was written (checksum mismatch); re-extract "
                                          f"it (delete the shard and rerun extract) or run `babelprobe verify {self.path}`")
                if bad:
                    raise BabelprobeError(f"{where} holds {bad} NaN/inf values; re-extract in float32")

    @cached_property
    def value_rows(self) -> np.ndarray:
        """int64 [n_rows]: the row whose values each row has (itself, or the first row with its text; a format-1
        shard stores every row)."""
        value_rows = np.arange(self.n_rows, dtype=np.int64)  # (rows of shards an incomplete store lacks: their own)
        for k, (start, stop) in enumerate(zip(self._starts.tolist(), self._stops.tolist())):
            if "value_row" in self._file(k):
                value_rows[start:stop] = self._file(k)["value_row"][()]
        check_value_rows(value_rows, f"activation store {self.path}")
        return value_rows

    @cached_property
    def _slots(self) -> np.ndarray:
        """Each row's place in its shard's arrays (`shard_slots` over the listed shards)."""
        return shard_slots(self.value_rows, zip(self._starts.tolist(), self._stops.tolist()))

    def check_files(self) -> None:
        """Every shard opens as HDF5 (a truncated or missing shard is refused here, without reading an array)."""
        for k in range(len(self._names)):
            self._file(k)

    def __repr__(self) -> str:
        return (f"Store({str(self.path)!r}, rows={self.n_rows}, layers={self.layers[0]}..{self.layers[-1]} "
                f"({len(self.layers)}), d_model={self.d_model}, pools={self.pools}, dtype={self.dtype})")

    @cached_property
    def keys(self) -> pd.DataFrame:
        """One row per stored item in item-set order: item_id, pair_id, language, subset, label, n_tokens."""
        frames = [_keys_of(self._file(k)) for k in range(len(self._names))]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(KEY_COLUMNS))

    def load_items(self) -> pd.DataFrame:
        """Reload the items this store was extracted from (source and selection in the manifest),
        checking that they are the same (items hash)."""
        from babelprobe.items import items_hash, load_items

        info = self.manifest.get("items") or {}
        if not info.get("source"):
            raise BabelprobeError(f"store {self.path} does not record its item source; load the items yourself")
        items = load_items(info["source"], languages=info.get("languages"), subsets=info.get("subsets"),
                           limit=info.get("limit"), language=info.get("language"))
        if info.get("hash") and items_hash(items) != info["hash"]:
            raise BabelprobeError(f"items from {info['source']} have changed since store {self.path} was made "
                                  f"(hash {items_hash(items)} != {info['hash']}); re-extract")
        return items

    # -- reading
    def read(self, layer: int, rows=None, pool: str = "last") -> np.ndarray:
        """float32 [len(rows), d_model]: the `pool` activations of `layer` (DESIGN numbering) for `rows`."""
        return self.read_layers([layer], rows, pool)[:, 0, :]

    def read_layers(self, layers=None, rows=None, pool: str = "last", device=None):
        """float32 [len(rows), len(layers), d_model] for `layers` (default: all stored) and `rows`: a numpy
        array, or with `device` a torch tensor there, the stored values copied as stored and decoded on the
        device (a bfloat16 store moves half the bytes and the host decodes nothing)."""
        layers = self.layers if layers is None else [int(x) for x in np.atleast_1d(layers)]
        columns = [self._layer_column(x) for x in layers]
        if pool not in self.pools:
            raise BabelprobeError(f"store {self.path} has no {pool!r} pooling; it has {', '.join(self.pools)}")
        rows = self._rows(rows)
        shape = (len(rows), len(layers), self.d_model)
        out = np.empty(shape, dtype=np.float32) if device is None else _torch().empty(shape, device=device)
        stored = self.value_rows[rows]  # a recurring text's rows read its first row
        shard_of = np.searchsorted(self._stops, stored, side="right")
        for k in np.unique(shard_of):
            where = np.flatnonzero(shard_of == k)
            where = where[np.argsort(stored[where], kind="stable")]  # in the shard's order: runs of stored rows
            self._read_shard(int(k), self._slots[stored[where]], where, columns, pool, out)
        return out

    def _read_shard(self, k: int, local: np.ndarray, where: np.ndarray, columns: list[int], pool: str,
                    out: np.ndarray) -> None:
        ds = self._file(k)[pool]
        dtype = str(ds.attrs.get("dtype", "float32"))
        chunk_rows = ds.chunks[0] if ds.chunks else len(ds)
        chunk_of = local // chunk_rows
        runs = _consecutive(local, where, chunk_rows)
        if len(runs) <= len(np.unique(chunk_of)):
            # consecutive rows (a group stored together): read exactly them, every layer in one call when the
            # layers are consecutive, decoded straight into `out` (a read holds at most one chunk's rows)
            span = _span(columns)
            pinned = not isinstance(out, np.ndarray) and out.device.type == "cuda"
            for start, stop, at in runs:
                if not isinstance(at, int):  # rows consecutive in the shard, not in the answer
                    _scatter_to(_read_staged(ds, slice(start, stop), span, pinned) if span is not None else
                                np.stack([ds[start:stop, c, :] for c in columns], axis=1), dtype, out, at)
                    continue
                target = out[at:at + stop - start]
                if span is not None and dtype == "float32" and isinstance(out, np.ndarray):
                    ds.read_direct(target, np.s_[start:stop, span, :])  # no decoding: straight into the answer
                elif span is not None:
                    _decode_to(_read_staged(ds, slice(start, stop), span, pinned), dtype, target)
                else:
                    for i, column in enumerate(columns):
                        _decode_to(ds[start:stop, column, :], dtype, target[:, i, :])
            return
        span = _span(columns)
        if span is not None:  # scattered rows: each chunk of rows read once for all its layers, its rows picked
            pinned = not isinstance(out, np.ndarray) and out.device.type == "cuda"
            for chunk in np.unique(chunk_of).tolist():
                r0, r1 = chunk * chunk_rows, min(len(ds), (chunk + 1) * chunk_rows)
                inside = chunk_of == chunk
                _scatter_to(_read_staged(ds, slice(r0, r1), span, pinned), dtype, out, where[inside], local[inside] - r0)
            return
        for first, last in _runs(np.unique(chunk_of), READ_RUN_CHUNKS):  # the same, layer by layer
            r0, r1 = first * chunk_rows, min(len(ds), (last + 1) * chunk_rows)
            inside = (local >= r0) & (local < r1)
            picked = local[inside] - r0
            on_host = isinstance(out, np.ndarray)
            at = where[inside] if on_host else _torch().from_numpy(where[inside]).to(out.device)
            for i, column in enumerate(columns):
                block = ds[r0:r1, column, :]
                values = decode_array(block[picked], dtype)
                out[at, i, :] = values if on_host else _torch().from_numpy(values).to(out.device)

    def _layer_column(self, layer: int) -> int:
        if layer not in self.layers:
            raise BabelprobeError(f"layer {layer} is not in store {self.path}; stored layers: "
                                  f"{_ranges(self.layers)}")
        return self.layers.index(layer)

    def _rows(self, rows) -> np.ndarray:
        if rows is None:
            return np.arange(self.n_rows, dtype=np.int64)
        rows = np.asarray(rows)
        if rows.dtype == bool:
            if rows.shape != (self.n_rows,):
                raise BabelprobeError(f"a boolean row mask must have {self.n_rows} entries, got {rows.shape}")
            return np.flatnonzero(rows)
        if rows.size and not np.issubdtype(rows.dtype, np.integer):
            raise BabelprobeError(f"rows must be integers (store row numbers), got {rows.dtype}")
        rows = rows.astype(np.int64).ravel()
        bad = (rows < 0) | (rows >= self.n_rows)
        if bad.any():
            raise BabelprobeError(f"row {int(rows[bad][0])} is out of range: store {self.path} has {self.n_rows} rows")
        return rows

    def _file(self, k: int):
        import h5py

        if k not in self._files:
            file = self.path / self._names[k]
            try:
                self._files[k] = h5py.File(file, "r")
            except OSError as err:
                raise BabelprobeError(f"cannot read shard {file}: {err}; run `babelprobe verify {self.path}`") from err
        return self._files[k]

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_store(path: str | Path, allow_incomplete: bool = False) -> Store:
    """Open an activation store for reading; BabelprobeError if it is missing, incomplete or corrupt."""
    return Store(path, allow_incomplete=allow_incomplete)


def _runs(ids: np.ndarray, max_len: int):
    """Consecutive integers grouped into (first, last) runs of at most `max_len`."""
    start = prev = None
    for i in ids.tolist():
        if start is not None and i == prev + 1 and i - start < max_len:
            prev = i
            continue
        if start is not None:
            yield start, prev
        start = prev = i
    if start is not None:
        yield start, prev


def _consecutive(local: np.ndarray, where: np.ndarray, chunk_rows: int) -> list[tuple[int, int, object]]:
    """(start, stop, place in the answer) of each run of rows consecutive in the shard, cut where a chunk of rows
    ends: the place is the run's first position when the run is consecutive in the answer too, else the
    positions of its rows (an array)."""
    if not len(local):
        return []
    breaks = (np.diff(local) != 1) | (local[1:] % chunk_rows == 0)
    firsts = np.concatenate([[0], np.flatnonzero(breaks) + 1])
    lasts = np.concatenate([firsts[1:], [len(local)]]) - 1
    jumps = np.concatenate([[0], np.cumsum(np.diff(where) != 1)])  # a run is consecutive in the answer: no jump
    together = jumps[lasts] == jumps[firsts]
    return [(int(local[a]), int(local[b]) + 1, int(where[a]) if one else where[a:b + 1])
            for a, b, one in zip(firsts.tolist(), lasts.tolist(), together.tolist(), strict=True)]


def _scatter_to(stored: np.ndarray, dtype: str, out, at: np.ndarray, picked: np.ndarray | None = None) -> None:
    """Stored rows (`picked` of them, default all) decoded into rows `at` of `out`. To a device, the rows go as read
    (from the page-locked buffer: a DMA, not a pageable copy of picked rows) and are picked and decoded there. On
    the host, rows of many layers go one by one straight into `out`: a decoded temporary of them would be fresh
    memory at every read (the page faults that `_read_staged`'s reused buffer avoids), while rows of a few layers
    are cheaper through a small temporary than a call each (a layer of an 8B store: 6 µs a row)."""
    if not isinstance(out, np.ndarray):
        torch = _torch()
        source = torch.from_numpy(stored.view(np.int16)).view(torch.bfloat16) if dtype == "bfloat16" else \
            torch.from_numpy(stored)
        source = source.to(out.device)
        if picked is not None:
            source = source[torch.from_numpy(picked).to(out.device)]
        out[torch.from_numpy(at).to(out.device)] = source.to(out.dtype)
        return
    if stored[0].nbytes * len(at) > SCATTER_TEMPORARY_BYTES:
        for j, row in enumerate(range(len(stored)) if picked is None else picked.tolist()):
            decode_into(stored[row], dtype, out[at[j]])
        return
    out[at] = decode_array(stored if picked is None else stored[picked], dtype)


def _span(columns: list[int]):
    """`columns` as a slice when they are consecutive and ascending (one HDF5 read for all), else None."""
    if columns and columns == list(range(columns[0], columns[0] + len(columns))):
        return slice(columns[0], columns[0] + len(columns))
    return None


def _ranges(values: list[int]) -> str:
    if values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}"
    return ",".join(map(str, values))


# ------------------------------------------------------------------------------------------- verifying

def verify_store(path: str | Path) -> list[str]:
    """Recheck a store: manifest consistency, every shard's shapes, dtypes, keys and array checksums, and
    that no value is NaN or inf. Returns the problems found (empty: the store is sound)."""
    import h5py

    path = Path(path)
    try:
        manifest = read_manifest(path)
    except BabelprobeError as err:
        return [str(err)]
    problems = []
    if not manifest.get("complete"):
        problems.append(f"manifest: the store is incomplete ({len(manifest['shards'])} of "
                        f"{manifest.get('n_shards')} shards); run the same extract command again")
    layers, d_model, pools = manifest["layers"], manifest["d_model"], manifest["pools"]
    expected_rows, names = 0, set()
    n_shards = -(-manifest["n_rows"] // manifest["shard_size"])
    if manifest.get("complete") and len(manifest["shards"]) != n_shards:
        problems.append(f"manifest: lists {len(manifest['shards'])} shards, expected {n_shards}")
    seen_ids: set[str] = set()
    value_rows: list[np.ndarray] = []
    for record in manifest["shards"]:
        name = record["name"]
        names.add(name)
        start, stop = record["rows"]
        if start != expected_rows:
            problems.append(f"{name}: rows start at {start}, expected {expected_rows} (gap or overlap)")
        expected_rows = stop
        file = path / name
        if not file.exists():
            problems.append(f"{name}: missing")
            continue
        try:
            with h5py.File(file, "r") as f:
                pointers = _verify_value_rows(f, name, record, start, stop)
                problems += pointers[1]
                # the rows that hold values (not known when value_row is wrong: that problem is the one reported)
                stored = (None if pointers[1] else stop - start if pointers[0] is None
                          else int((pointers[0] == np.arange(start, stop)).sum()))
                problems += _verify_shard(f, name, record, stop - start, stored, layers, d_model, pools, seen_ids)
                value_rows.append(np.arange(start, stop) if pointers[0] is None else pointers[0])
        except OSError as err:
            problems.append(f"{name}: unreadable HDF5 file ({err})")
    if manifest.get("complete") and expected_rows != manifest["n_rows"]:
        problems.append(f"manifest: shards cover {expected_rows} rows, manifest says n_rows={manifest['n_rows']}")
    if not problems and value_rows:
        try:
            check_value_rows(np.concatenate(value_rows), "value_row")
        except BabelprobeError as err:
            problems.append(str(err))
    for extra in sorted(p.name for p in path.glob("shard-*.h5") if p.name not in names):
        problems.append(f"{extra}: shard file not listed in the manifest")
    return problems


def _verify_value_rows(f, name, record, start, stop) -> tuple[np.ndarray | None, list[str]]:
    """A shard's `value_row` (None in a format-1 shard: every row stored) and its problems."""
    if "value_row" not in f:
        return None, ([f"{name}: dataset 'value_row' missing"] if "value_rows_sha256" in record else [])
    value_rows = f["value_row"][()]
    if value_rows.shape != (stop - start,):
        return None, [f"{name}: dataset 'value_row' has shape {value_rows.shape}, expected ({stop - start},)"]
    if sha256_of(value_rows.astype(np.int64)) != record.get("value_rows_sha256"):
        return None, [f"{name}: value_row does not match the manifest checksum"]
    return value_rows.astype(np.int64), []


def _verify_shard(f, name, record, n, stored, layers, d_model, pools, seen_ids) -> list[str]:
    problems = []
    for column in KEY_COLUMNS:
        if column not in f:
            problems.append(f"{name}: key dataset {column!r} missing")
        elif f[column].shape != (n,):
            problems.append(f"{name}: key dataset {column!r} has shape {f[column].shape}, expected ({n},)")
    if not problems:
        keys = _keys_of(f)
        if keys_sha256(keys) != record.get("keys_sha256"):
            problems.append(f"{name}: keys do not match the manifest checksum")
        dup = set(keys["item_id"]) & seen_ids
        if dup:
            problems.append(f"{name}: item_id {sorted(dup)[0]!r} appears in an earlier shard too")
        seen_ids.update(keys["item_id"])
    for pool in pools:
        if pool not in f:
            problems.append(f"{name}: dataset {pool!r} missing")
            continue
        ds = f[pool]
        expected = (ds.shape[0] if stored is None else stored, len(layers), d_model)
        if ds.shape != expected:
            problems.append(f"{name}/{pool}: shape {ds.shape}, expected {expected}")
            continue
        dtype = str(ds.attrs.get("dtype", ""))
        if dtype not in DTYPES or ds.dtype != storage_dtype(dtype):
            problems.append(f"{name}/{pool}: dtype attribute {dtype!r} does not match stored {ds.dtype}")
            continue
        if dtype != record.get("dtype", {}).get(pool):
            problems.append(f"{name}/{pool}: dtype {dtype} but the manifest says {record.get('dtype', {}).get(pool)}")
        digest, bad = _digest_and_check(ds, dtype)
        if digest != record.get("sha256", {}).get(pool):
            problems.append(f"{name}/{pool}: checksum mismatch (the array changed after it was written)")
        if bad:
            problems.append(f"{name}/{pool}: {bad} non-finite values (NaN or inf)")
    return problems


def _digest_and_check(ds, dtype: str) -> tuple[str, int]:
    """sha256 of the stored bytes in C order and the number of non-finite values, reading row blocks."""
    h = hashlib.sha256()
    bad = 0
    per_row = max(1, int(np.prod(ds.shape[1:])) * ds.dtype.itemsize)
    step = max(1, (64 << 20) // per_row)
    for r0 in range(0, ds.shape[0], step):
        block = ds[r0:r0 + step]
        h.update(np.ascontiguousarray(block).data)
        bad += int((~np.isfinite(decode_array(block, dtype))).sum())
    return h.hexdigest(), bad
