"""Run directories and resuming: the one contract of every command that writes results.

Four pieces, one job each (docs/design.md "Runs"):

- `LAYOUTS` - the one declaration of every kind of run directory: its manifest and the files a finished
  run holds. Every reader asks it (`layout("compare").check(path)`, `detect(path)`), so a directory is
  recognised, and refused with the same one-line error, in one place.

- `open_run(out, identity)` - an output directory belongs to one identity (model fingerprint, item-set
  hash, benchmark, settings that change the numbers), recorded in a JSON manifest (`run.json`; `compare`
  names its own `compare.json`). A rerun with the same identity reuses what is finished; another
  identity is refused with a one-line error unless `overwrite`, which first removes the run's listed
  outputs, never anything else. `RunDir.stage(...)` reuses a finished stage whose settings are unchanged.
- `score_resumably(score, items, out, key)` - scores items in chunks of whole units (pairs, questions);
  each finished chunk is kept as a Parquet file in a hidden directory beside the result
  (`.NAME.partial/`, written atomically) together with `key`. Running the same command again skips the
  chunks already done; another key starts over. When every chunk is done the result table is written
  atomically and the partial directory removed, so nothing partial ever sits under the final name.
  A lock keeps two runs from writing the same partial directory.
- `JsonlMemo(path)` - an append-only JSONL memo of expensive outputs (generated text) keyed by request,
  flushed after every chunk, so an interrupted generation keeps what it made.

Nothing here unpickles: manifests are JSON, chunks Parquet, memos JSONL.
"""


from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from filelock import FileLock, Timeout
from tqdm.auto import tqdm

from babelprobe.errors import BabelprobeError
from babelprobe.items import items_hash
from babelprobe.pipeline import frozen_heap, pipelined
from babelprobe.tables import atomic_path, check_out_dir, csv_rows, write_csv_rows

# Units per chunk: what a Ctrl-C can cost. Each chunk is scored on its own (tokenised, sorted by length,
# batched, tabulated, written), so small chunks mean part-filled batches and per-chunk bookkeeping: 9,180
# XCOMPS-sized pairs on a tiny model (perf/workflow.py's items, one CPU thread) took 11.2 s for direct
# and 33.2 s for meta in chunks of 200 pairs, 6.7 s and 26.3 s in chunks of 1,000, 3.6 s and 22.0 s in
# chunks of 5,000; on an H200 at Llama-8B shapes the phases ran at a quarter of their model work's time
# in chunks of 200. 2,000 pairs of the default model take about a minute of direct scoring on a CPU.
CHUNK_PAIRS = 2000
# A pipelined scorer's first chunk holds this share of the others' units: the device waits for the first
# chunk's preparation alone (meta's prompts, tokens and prefix tree of 2,000 pairs: ~0.6 s here), so a small
# first chunk starts it sooner; the chunks after it are prepared while the device runs the one before.
FIRST_CHUNK_SHARE = 0.25
MANIFEST = "run.json"


# --------------------------------------------------------------------------------------------- layouts

@dataclass(frozen=True)
class Layout:
    """What a run directory of one kind holds: its JSON `manifest` (None: the kind has none), the `files`
    every finished run has (the one written last marks completion), the `command` that makes it."""

    kind: str
    manifest: str | None
    files: tuple[str, ...]
    command: str

    def finished(self, path: str | Path) -> bool:
        return all((Path(path) / name).exists() for name in self.files)

    def check(self, path: str | Path, flag: str = "") -> Path:
        """`path` if it is a finished run of this kind, else a one-line error naming the first file it
        lacks and the command that makes it (`flag`: the option that named the path, for the message)."""
        path = Path(path)
        where = f"{flag} {path}" if flag else str(path)
        if not path.is_dir():
            raise BabelprobeError(f"{where}: no such directory")
        missing = next((name for name in self.files if not (path / name).exists()), None)
        if missing is not None:
            raise BabelprobeError(f"{where} is not a finished {self.kind} directory (no {missing}); run "
                                  f"`{self.command}` into it first")
        return path


LAYOUTS: dict[str, Layout] = {layout.kind: layout for layout in (
    Layout("compare", "compare.json", ("items.csv", "summary.csv", "layers.csv", "correlations.csv", "agreement.csv"),
           "babelprobe compare"),
    Layout("probe", None, ("neuro.csv",), "babelprobe probe --out DIR/neuro.csv"),
    Layout("store", "manifest.json", ("manifest.json",), "babelprobe extract"),
    Layout("intervene", "intervene.json", ("interventions.csv", "summary.csv", "sanity.csv"), "babelprobe intervene"),
    Layout("neurons", "neurons.json", ("activation.h5", "lape.csv", "neurons.csv"), "babelprobe neurons"),
    Layout("lens", "lens.json", ("lens.csv", "curves.csv", "turns.csv", "pairs.csv"), "babelprobe lens"),
    Layout("align", "align.json", ("curves.csv", "matrix.csv", "items.csv"), "babelprobe align"),
    Layout("sweep", "sweep.json", ("summary.csv",), "babelprobe sweep"),
    Layout("patch", "patch.json", ("patch.json",), "babelprobe patch"),
    Layout("sae", "sae.json", ("features.csv", "fit.csv", "sparse_probe.csv", "ablate.csv"), "babelprobe sae"),
    Layout("bench", MANIFEST, ("items.csv", "summary.csv"), "babelprobe bench NAME"),
    Layout("pitfalls-affinity", "affinity.json", ("items.csv", "accuracy.csv", "affinity.csv"),
           "babelprobe bench pitfalls-affinity"),
)}


def layout(kind: str) -> Layout:
    return LAYOUTS[kind]


def detect(path: str | Path) -> Layout | None:
    """The layout of the run directory `path` by its manifest (a probe directory: by its neuro.csv), or
    None. Finished or not: `Layout.check` says."""
    path = Path(path)
    for candidate in LAYOUTS.values():
        if candidate.manifest is not None and (path / candidate.manifest).exists():
            return candidate
    if (path / "neuro.csv").exists() or (path / "neuro.parquet").exists():
        return LAYOUTS["probe"]
    return None


def check_kind(path: str | Path, kind: str | None, writer: str = "this command", flag: str = "--out") -> None:
    """A one-line error when `path` holds a run of another kind than `kind` (None: any run at all): a run
    directory is only written into, or replaced with --overwrite, by the command that made it, so that
    nothing of another command's run is ever overwritten or deleted."""
    found = detect(path) if Path(path).is_dir() else None
    if found is not None and found.kind != kind:
        raise BabelprobeError(f"{flag} {path} holds a {found.kind} run ({found.command}); {writer} does not write "
                              "into another command's run, even with --overwrite: choose another --out")


def partial_dir(out: str | Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.partial"


class TokenMeter:
    """Counts the real tokens of every forward pass of a model's body while it is open (a forward pre-hook;
    padding and a KV cache's past left out on a CPU; on an accelerator the positions run, padding included,
    since reading the mask back would make the host wait for the device at every pass), and shows the count on
    a progress bar: the bar of `score_resumably` moves by finished chunks of units, the count moves with every
    batch inside one, so a long chunk (a language's interventions, a chunk of patched pairs) is seen working
    rather than jumping from 0 to N at its end."""

    def __init__(self, lm, bar=None):
        self.lm, self.bar, self.tokens, self._handle = lm, bar, 0, None

    def __enter__(self):
        body = getattr(getattr(self.lm, "parts", None), "body", None)
        if body is not None:
            self._handle = body.register_forward_pre_hook(self._count, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        if self._handle is not None:
            self._handle.remove()

    def _count(self, module, args, kwargs):
        mask, ids = kwargs.get("attention_mask"), kwargs.get("input_ids", args[0] if args else None)
        run = ids if ids is not None else kwargs.get("inputs_embeds")
        if run is None and mask is None:
            return
        width = run.shape[1] if run is not None else mask.shape[1]  # a mask wider than the pass covers a KV past
        from babelprobe import models  # here: this module does not load torch, and a model is running

        if mask is not None and models.reads_are_free(mask.device):
            self.tokens += int(mask[:, mask.shape[1] - width:].sum())
        else:  # on an accelerator the mask's sum is a read back, a wait for the device at every pass: positions
            self.tokens += int((run if run is not None else mask).shape[0] * width)
        if self.bar is not None and not self.bar.disable:
            self.bar.set_postfix_str(f"{self.tokens:,} tokens run", refresh=False)
            self.bar.update(0)  # redraws at most every `mininterval` seconds


# a full collector pass walks every object alive: those before the run are left out of them until its table is
# written (pipeline.frozen_heap)
@frozen_heap()
def score_resumably(score: Callable[[pd.DataFrame], pd.DataFrame], items: pd.DataFrame, out: str | Path,
                    key: dict, chunk_pairs: int | None = None, progress: bool = True,
                    desc: str = "scoring", unit: str = "pair_id", model=None, together: str | None = None
                    ) -> pd.DataFrame:
    """`score(chunk_of_items) -> rows` over all items, chunks of whole `unit`s (default: pairs) at a time,
    resuming a partial run of the same `key`; writes the concatenated rows to `out` and returns them.
    `chunk_pairs`: units per chunk (default: the scorer's `chunk_pairs` attribute when it has one, else
    `CHUNK_PAIRS`); a scorer in three steps (`pipeline.pipelined`) starts with a smaller one (`FIRST_CHUNK_SHARE`).
    The bar counts finished units; with `model` (the `LoadedModel` scoring) it also counts the tokens of its
    forward passes as they run (`TokenMeter`). An interruption keeps every finished chunk. `together` (a
    column, e.g. "text"): units that share a value of it are chunked together (`kept_together`); the rows
    come back in the items' order of units all the same."""
    out, partial = Path(out), partial_dir(out)
    key = {**key, "items": _hash(items), **({"together": together} if together is not None else {})}
    key = json.loads(json.dumps(key, sort_keys=True, default=str))
    units = pd.unique(items[unit]).tolist()  # in the order they come
    pair_ids = units if together is None else kept_together(items, unit, together)
    lock = FileLock(str(out.parent / f".{out.name}.lock"))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=0)
    except Timeout:
        raise BabelprobeError(f"another process is writing {out}; wait for it or choose another --out") from None
    except OSError as err:
        raise BabelprobeError(f"cannot write {out}: {err.strerror}") from None
    try:
        size = chunk_pairs or getattr(score, "chunk_pairs", None) or CHUNK_PAIRS
        own = _steps(score)
        prepare, run, finish = own or ((lambda chunk: chunk), score, (lambda rows: rows))
        first = max(1, int(size * FIRST_CHUNK_SHARE)) if own else size
        done, size, first = _open_partial(partial, key, size, first)
        bounds = [0, *range(min(first, len(pair_ids)), len(pair_ids), size), len(pair_ids)]
        chunks = [pair_ids[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        already = sum(len(chunks[i]) for i in done)
        if done:
            print(f"resuming: {already} of {len(pair_ids)} {unit.removesuffix('_id')}s already scored in {partial}",
                  file=sys.stderr)
        bar = tqdm(total=len(pair_ids), initial=already, unit=unit.removesuffix("_id"), desc=desc,
                   disable=not progress, dynamic_ncols=True)

        lines = {}  # a chunk's rows as CSV, made while the device runs the next one (`tables.csv_rows`)

        def write(k, rows):  # on the pipeline's finishing thread, while the device runs the next chunk
            with atomic_path(partial / f"chunk-{todo[k]:05d}.parquet") as tmp:
                rows.to_parquet(tmp, index=False)
            if out.suffix == ".csv":
                lines[todo[k]] = csv_rows(rows)
            bar.update(len(chunks[todo[k]]))

        todo = [index for index in range(len(chunks)) if index not in done]
        # each chunk's rows, in the items' order; a chunk's table taken from the items on the producer thread (at
        # XCOMPS's size the 62 chunks' tables took 2 s before the device could start)
        starts = np.cumsum([0, *map(len, chunks)])
        chunk_of = np.searchsorted(starts, pd.Index(pair_ids).get_indexer(items[unit]), side="right") - 1
        rows_of = items.groupby(chunk_of, sort=False).indices

        def prepare_chunk(index):
            return prepare(items.iloc[rows_of[index]])

        with TokenMeter(model, bar):
            try:
                fresh = dict(zip(todo, pipelined(todo, prepare_chunk, run, finish, done=write)))
            except Exception as err:
                if not _out_of_memory(err):
                    raise
                budget = getattr(score, "batch_tokens", None)
                raise BabelprobeError(
                    f"{desc}: the device ran out of memory ({str(err).splitlines()[0][:160]}); finished chunks "
                    f"({len(list(partial.glob('chunk-*.parquet')))}) are kept in {partial}: run the same command "
                    f"with a smaller --batch-tokens{f' (this run: {budget})' if budget else ''} to go on from them"
                ) from err
        bar.close()
        # this run's chunks as they are in memory (not read back while the device waits); earlier runs' from disk
        frames = [fresh[i] if i in fresh else pd.read_parquet(partial / f"chunk-{i:05d}.parquet")
                  for i in range(len(chunks))]
        result = pd.concat(frames, ignore_index=True) if frames else score(items)
        order = None
        if together is not None and len(result):  # the items' order of units (a stable sort keeps each unit's rows)
            order = np.argsort(pd.Index(units).get_indexer(result[unit]), kind="stable")
            result = result.iloc[order].reset_index(drop=True)
        # the table joined from its chunks' lines where each was made here, else formatted now
        write_csv_rows(result, [lines.get(i) for i in range(len(chunks))], order, out)
        shutil.rmtree(partial, ignore_errors=True)
        return result
    finally:
        lock.release()
        Path(lock.lock_file).unlink(missing_ok=True)


def kept_together(items: pd.DataFrame, unit: str, column: str) -> list:
    """The units of `items` in an order that keeps units sharing a value of `column` next to each other: each
    set of units linked through shared values in a row, the sets in the order of their first unit, a set's
    units in the items' order. A scorer that runs a text once per chunk then runs it about once: XCOMPS's
    acceptable sentence is in the pairs of four negative types, and at a quarter of XCOMPS in perf/workflow.py's
    order (language, negative type, pair) chunks of 2,000 pairs held 92,143 distinct texts in all, 69,436 so
    ordered, for 69,355 distinct texts over all."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    codes, units = pd.factorize(items[unit])
    values = pd.factorize(items[column])[0]
    if not len(units):
        return []
    size = len(units) + int(values.max()) + 1  # a graph of units and values, an edge per item
    _, sets = connected_components(coo_matrix((np.ones(len(codes)), (codes, len(units) + values)),
                                              shape=(size, size)), directed=False)
    order = pd.factorize(sets[:len(units)])[0]  # the sets numbered in the order of their first unit
    return list(units[np.argsort(order, kind="stable")])


def _out_of_memory(err: Exception) -> bool:
    import torch  # loaded already: something ran a model

    return isinstance(err, torch.OutOfMemoryError)


def _steps(score) -> tuple | None:
    """`score`'s own prepare, run and finish steps (`pipeline.pipelined`) when it has them (a scorer whose host
    work can overlap the device's), else None (a plain function: all of it in the run step)."""
    if all(hasattr(score, name) for name in ("prepare", "run", "finish")):
        return score.prepare, score.run, score.finish
    return None


def _open_partial(partial: Path, key: dict, chunk_pairs: int, first: int) -> tuple[set[int], int, int]:
    """The chunks finished by an earlier run with the same key, and the chunk sizes they were made with (the
    others', the first's: the others' when its record has none, as before there was a smaller first); a partial
    directory of another key is discarded (said on stderr)."""
    key_file = partial / "key.json"
    sizes = ("chunk_pairs", "first_chunk")
    if partial.exists():
        try:
            old = json.loads(key_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = {}
        if "chunk_pairs" in old and {k: v for k, v in old.items() if k not in sizes} == key:
            return ({int(p.stem.split("-")[1]) for p in partial.glob("chunk-*.parquet")}, old["chunk_pairs"],
                    old.get("first_chunk", old["chunk_pairs"]))
        print(f"discarding partial results in {partial}: they were made with another model, item set or "
              "settings", file=sys.stderr)
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    with atomic_path(key_file) as tmp:
        tmp.write_text(json.dumps({**key, "chunk_pairs": chunk_pairs, "first_chunk": first}, sort_keys=True),
                       encoding="utf-8")
    return set(), chunk_pairs, first


def _hash(items: pd.DataFrame) -> str:
    """The item-set hash for schema items; a content hash for other tables (benchmark questions)."""
    import hashlib

    if {"item_id", "pair_id", "language", "subset", "label", "text"} <= set(items.columns):
        return items_hash(items)
    payload = items.to_json(orient="values", force_ascii=False, default_handler=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------- run directories

@dataclass
class RunDir:
    """An output directory of one identity. `state` is the manifest: the identity, what else was
    recorded, and `stages` (the settings each finished stage was made with)."""

    path: Path
    manifest: str
    state: dict
    resumed: bool  # an earlier run of the same identity left its manifest here (its outputs may be reused)

    def stage(self, name: str, settings: dict, produce: Callable, output: Path, read: Callable):
        """`read(output)` when stage `name` finished with these `settings` earlier, else `produce()` (which
        writes `output`), then record the settings."""
        settings = json.loads(json.dumps(settings, default=str))
        if self.finished(name, settings, output):
            return read(output)
        result = produce()
        self.state["stages"][name] = settings
        self.save()
        return result

    def finished(self, name: str, settings: dict, output: Path) -> bool:
        """Whether stage `name` finished earlier with these `settings` (its output is there)."""
        settings = json.loads(json.dumps(settings, default=str))
        return self.state["stages"].get(name) == settings and Path(output).exists()

    def save(self) -> None:
        with atomic_path(self.path / self.manifest) as tmp:
            tmp.write_text(json.dumps(self.state, indent=1, ensure_ascii=False, default=str), encoding="utf-8")


def open_run(out: str | Path, identity: dict, record: dict | None = None, manifest: str = MANIFEST,
             overwrite: bool = False, outputs: tuple[str, ...] = (), what: str = "a run") -> RunDir:
    """Create (or reopen) the run directory `out` for `identity`.

    `record` is written beside the identity without being compared (a model's display name, settings
    that do not change results). With the same identity the earlier state is kept (finished stages are
    reused); with another one this is refused unless `overwrite`, which removes `outputs` (file or
    directory names inside `out`) and starts afresh. `what` names the run in the refusal."""
    out = check_out_dir(out)
    identity = json.loads(json.dumps(identity, default=str))
    old = read_manifest(out / manifest)
    if old is not None:
        if check_identity(out, identity, manifest, overwrite, what):
            state = {**old, **(record or {}), **identity}
            state.setdefault("stages", {})
            run = RunDir(out, manifest, state, resumed=not overwrite)
            run.save()
            return run
        for name in outputs:
            target = out / name
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    run = RunDir(out, manifest, {**(record or {}), **identity, "stages": {}}, resumed=False)
    run.save()
    return run


def check_identity(out: str | Path, identity: dict, manifest: str = MANIFEST, overwrite: bool = False,
                   what: str = "a run") -> bool:
    """Whether `out` holds a run of `identity` (the same run again); a run of another identity there is the
    one-line refusal `open_run` makes, unless `overwrite`. Writes nothing: a runner calls it before its
    model loads, with the identity the model's files give (`runtime.info`)."""
    identity = json.loads(json.dumps(identity, default=str))
    old = read_manifest(Path(out) / manifest)
    if old is None:
        return False
    differs = [k for k in identity if old.get(k) != identity[k]]
    if differs and not overwrite:
        k = differs[0]
        raise BabelprobeError(f"{Path(out) / manifest}: this directory holds {what} with {k}={old.get(k)!r}, not "
                              f"{identity[k]!r}; use another --out or pass --overwrite")
    return not differs


def read_manifest(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BabelprobeError(f"{path}: not a readable run manifest ({err}); remove it or use another --out") from err


# ---------------------------------------------------------------------------------------- output memos

class JsonlMemo:
    """Outputs by key, kept in an append-only JSONL file (`{"key": ..., "output": ...}` per line).

    `add` appends and fsyncs, so what was made survives a crash; a torn last line (a run killed while
    writing) is ignored on reading and ended before the next append. `path=None` keeps it in memory."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None
        self.done: dict[str, str] = {}
        if self.path is not None and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                    self.done[record["key"]] = record["output"]
                except (ValueError, KeyError, TypeError):
                    continue

    def __contains__(self, key: str) -> bool:
        return key in self.done

    def __getitem__(self, key: str) -> str:
        return self.done[key]

    def add(self, pairs: list[tuple[str, str]]) -> None:
        self.done.update(pairs)
        if self.path is None or not pairs:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as f:  # appends always go to the end, wherever we seek to read
            torn = False
            if f.seek(0, os.SEEK_END) > 0:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            text = "".join(json.dumps({"key": k, "output": o}, ensure_ascii=False) + "\n" for k, o in pairs)
            f.write((("\n" if torn else "") + text).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
