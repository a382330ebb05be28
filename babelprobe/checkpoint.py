"""Resumable scoring: an interrupted `score` or `compare` run picks up where it stopped.

`score_resumably(score, items, out, key)` scores the items in chunks of whole pairs. Each finished chunk
is kept as a Parquet file in a hidden directory beside the result (`.NAME.partial/`, written atomically),
together with `key` (model fingerprint, item-set hash, settings). Running the same command again skips
the chunks already done; a run with another key starts over. When every chunk is done the result table is
written atomically and the partial directory removed, so nothing partial ever sits under the final name.
Chunks are Parquet, never pickles; a lock keeps two runs from writing the same partial directory.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from filelock import FileLock, Timeout
from tqdm.auto import tqdm

from babelprobe.errors import BabelprobeError
from babelprobe.items import items_hash
from babelprobe.tables import atomic_path, write_table

CHUNK_PAIRS = 200  # pairs per chunk: what a Ctrl-C can cost, and large enough to fill a batch


def partial_dir(out: str | Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.partial"


def score_resumably(score: Callable[[pd.DataFrame], pd.DataFrame], items: pd.DataFrame, out: str | Path,
                    key: dict, chunk_pairs: int | None = None, progress: bool = True,
                    desc: str = "scoring") -> pd.DataFrame:
    """`score(chunk_of_items) -> rows` over all items, chunk by chunk, resuming a partial run of the same
    `key`; writes the concatenated rows to `out` and returns them."""
    out, partial = Path(out), partial_dir(out)
    key = json.loads(json.dumps({**key, "items": items_hash(items)}, sort_keys=True))
    pair_ids = list(dict.fromkeys(items["pair_id"]))
    lock = FileLock(str(out.parent / f".{out.name}.lock"))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=0)
    except Timeout:
        raise BabelprobeError(f"another process is writing {out}; wait for it or choose another --out") from None
    except OSError as err:
        raise BabelprobeError(f"cannot write {out}: {err.strerror}") from None
    try:
        done, chunk_pairs = _open_partial(partial, key, chunk_pairs or CHUNK_PAIRS)
        chunks = [pair_ids[i:i + chunk_pairs] for i in range(0, len(pair_ids), chunk_pairs)]
        already = sum(len(chunks[i]) for i in done)
        if done:
            print(f"resuming: {already} of {len(pair_ids)} pairs already scored in {partial}", file=sys.stderr)
        bar = tqdm(total=len(pair_ids), initial=already, unit="pair", desc=desc, disable=not progress,
                   dynamic_ncols=True)
        for index, chunk in enumerate(chunks):
            if index not in done:
                rows = score(items[items["pair_id"].isin(chunk)])
                with atomic_path(partial / f"chunk-{index:05d}.parquet") as tmp:
                    rows.to_parquet(tmp, index=False)
                bar.update(len(chunk))
        bar.close()
        frames = [pd.read_parquet(partial / f"chunk-{i:05d}.parquet") for i in range(len(chunks))]
        result = pd.concat(frames, ignore_index=True) if frames else score(items)
        write_table(result, out)
        shutil.rmtree(partial, ignore_errors=True)
        return result
    finally:
        lock.release()
        Path(lock.lock_file).unlink(missing_ok=True)


def _open_partial(partial: Path, key: dict, chunk_pairs: int) -> tuple[set[int], int]:
    """The chunks finished by an earlier run with the same key, and the chunk size they were made with; a
    partial directory of another key is discarded (said on stderr)."""
    key_file = partial / "key.json"
    if partial.exists():
        try:
            old = json.loads(key_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = {}
        if {k: v for k, v in old.items() if k != "chunk_pairs"} == key:
            return {int(p.stem.split("-")[1]) for p in partial.glob("chunk-*.parquet")}, old["chunk_pairs"]
        print(f"discarding partial results in {partial}: they were made with another model, item set or "
              "settings", file=sys.stderr)
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    with atomic_path(key_file) as tmp:
        tmp.write_text(json.dumps({**key, "chunk_pairs": chunk_pairs}, sort_keys=True), encoding="utf-8")
    return set(), chunk_pairs
