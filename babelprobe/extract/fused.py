"""Extraction inside another forward pass: `compare` scores the items directly (the model body over each
text, then the vocabulary projection of the states that predict its tokens) and stores their hidden states,
and both read the same texts, so the store is filled from direct scoring's own forward passes instead of a
second pass of its own (`StoreCapture`).

The store is the one `extract` writes (same settings, hence the same settings hash: a later `extract` or
`compare` reuses it, or resumes it if the fused pass was interrupted): every layer, pooled inside the forward
pass at the hf backend's points (hooks that let the pass go on to the final norm that scoring needs), rows sent
to the background writer, which writes a shard once all its rows have come. Only the batching differs (direct
scoring's length-sorted batches of distinct texts, recorded in the manifest's provenance), which moves the
values by float rounding only (tests/test_fused.py bounds the difference).

A text that recurs runs once over the whole pass, not only within a chunk (XCOMPS's acceptable sentence is in
the pairs of all four negative types, which lie far apart in the items' order: in perf/workflow.py's XCOMPS-shaped
items, chunks of 2,000 pairs ran 92,143 texts for 69,355 distinct ones at a quarter of XCOMPS, 456,163 for
217,132 at the whole). The capture plans each chunk as the scorer prepares it (`plan`, in chunk order): a text
an earlier chunk ran and kept is not run again (the scorer reuses its log-probs); a text that items of later
chunks have too is kept, and let go after the chunk that has its last items. In the store a text's later rows
point to its first row (store format 2), so once the chunk with its first row has run, keeping it costs no
memory. Only a text run before its first row's chunk (a pair whose items lie apart) has its rows kept by the
background writer, to copy bit for bit into that row, while the kept rows fit `REPEAT_BYTES` (beyond it, it runs
again there).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.extract.background import BackgroundWriter
from babelprobe.extract.capture import Pooler
from babelprobe.extract.layers import parse_layers
from babelprobe.extract.run import KeptTexts
from babelprobe.extract.settings import ExtractSettings
from babelprobe.extract.store import MANIFEST, store_lock


def can_fuse(out: str | Path, overwrite: bool) -> bool:
    """Whether a store at `out` would be made from scratch (nothing there yet, or `overwrite`): only then is it
    filled by a fused pass; a store to reuse or resume is left to `extract`."""
    out = Path(out)
    return overwrite or not ((out / MANIFEST).exists() or any(out.glob("shard-*.h5")))


@dataclass
class ChunkRepeats:
    """A chunk's texts that recur across chunks (`StoreCapture.plan`): `earlier` ran in an earlier chunk and are
    not run again; `keep` run here and are kept for later chunks; `gone` are let go after this chunk; of `keep`,
    those in `free` have their first row in this chunk, so their later rows point to it in the store and the
    writer keeps no values for them."""

    earlier: set
    keep: set
    gone: list
    free: set = field(default_factory=set)


class StoreCapture:
    """Fills the activation store of `items` at `out` from another caller's forward passes of the same texts.

    `with capture:` takes the store's lock, prepares it and hooks the model; `capture.during(items, plan)`
    is what a `DirectScorer` enters around each batch's forward (the batch's pooled rows go to the writer);
    leaving the block writes the complete manifest (or, after an error, leaves the shards written so far for
    `extract` to resume). Options as `extract`'s."""

    def __init__(self, lm, items: pd.DataFrame, out: str | Path, settings: ExtractSettings | None = None, *,
                 shard_size: int | None = None, batch_tokens: int = 4096, compression: str = "none",
                 source: dict | None = None, provenance: dict | None = None, overwrite: bool = False):
        from babelprobe.extract.run import _writer, parse_pools, store_dtype

        settings = settings or ExtractSettings()
        settings = replace(settings, dtype=store_dtype(settings, out, str(lm.dtype).removeprefix("torch."), overwrite))
        if settings.backend != "hf" or settings.truncate:
            raise BabelprobeError("a fused extraction uses the hf backend without truncation")
        self.lm, self.overwrite = lm, overwrite
        self.layers, self.pools = parse_layers(settings.layers, lm.n_layers), parse_pools(settings.pool)
        self.keys = items[["item_id", "pair_id", "language", "subset", "label"]].reset_index(drop=True)
        self.keys["n_tokens"] = np.full(len(items), -1, dtype=np.int32)  # filled as the texts are tokenised
        self.row = pd.Series(np.arange(len(items)), index=items["item_id"].to_numpy())
        self.texts = items["text"].tolist()
        self.kept = None  # `run.KeptTexts` of the items' texts, once the writer's row size is known (`__enter__`)
        self.n_tokens: dict[str, int] = {}  # a kept text's token count (its copies' key `n_tokens`)
        self.copies = 0  # items filled from a text an earlier chunk ran
        self.stored_texts: set = set()  # texts whose first row (the one holding their values) a chunk so far has
        provenance = {**(provenance or {}), "extract_settings": {**vars(settings)},
                      "fused": "pooled inside direct scoring's forward passes (its batches of distinct texts)"}
        self.writer = _writer(lm, items, out, self.layers, self.pools, "hf", settings.dtype, settings.on_overflow,
                              shard_size, compression, False, source, provenance, batch_tokens, "right")
        self.background: BackgroundWriter | None = None
        self.pooler: Pooler | None = None
        self.handles: list = []

    def __enter__(self):
        from babelprobe.extract.store import ensure_dir

        ensure_dir(self.writer.path)
        self.lock = store_lock(self.writer.path)
        self.lock.__enter__()
        try:
            self.writer.prepare(overwrite=self.overwrite)
            self.background = BackgroundWriter(self.writer, self.keys, (len(self.layers), self.lm.d_model), [],
                                               update_manifest=True)
            self.kept = KeptTexts(self.texts, self.background.row_bytes)
            self._hook()
        except BaseException:
            self.lock.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind, error, trace):
        try:
            for handle in self.handles:
                handle.remove()
            if kind is None:
                self.background.close()
                from babelprobe.extract.backends import backend_version

                self.writer.finish(extra={"backend": {"name": "hf", "version": backend_version("hf")},
                                          "world_size": 1})
            else:
                self.background.abort()
        finally:
            self.lock.__exit__(None, None, None)
        return False

    def _hook(self) -> None:
        """The hf backend's reading points (layer 0 entering block 1, layer i leaving block i), pooling while a
        batch is captured; unlike extraction's, the pass goes on after the last layer (scoring needs it)."""
        from babelprobe.extract.capture import first_input, hidden_of

        blocks, column = self.lm.parts.layers, {layer: j for j, layer in enumerate(self.layers)}

        def add(layer, hidden):
            if self.pooler is not None:
                self.pooler.add(column[layer], hidden)

        if 0 in column:
            self.handles.append(blocks[0].register_forward_pre_hook(
                lambda module, args, kwargs: add(0, first_input(args, kwargs)), with_kwargs=True))
        for layer in self.layers:
            if layer > 0:
                self.handles.append(blocks[layer - 1].register_forward_hook(
                    lambda module, args, output, layer=layer: add(layer, hidden_of(output))))

    def _rows(self, items: pd.DataFrame) -> np.ndarray:
        """The store rows of `items` (by item id)."""
        return self.row.loc[items["item_id"].to_numpy()].to_numpy()

    def plan(self, items: pd.DataFrame) -> ChunkRepeats:
        """Which texts of this chunk of `items` an earlier chunk ran, and which to keep for later ones (module
        docstring). Called for every chunk in order, before it runs (the scorer's prepare)."""
        rows = self._rows(items)
        self.stored_texts.update(items["text"].to_numpy()[self.writer.value_rows[rows] == rows])  # first rows here
        earlier, keep, gone = self.kept.plan(items["text"], free=self.stored_texts)
        return ChunkRepeats(earlier, keep, gone, keep & self.stored_texts)

    def during(self, items: pd.DataFrame, plan, repeats: ChunkRepeats | None = None):
        """The per-batch capture for one chunk of `items` scored by `plan` (a `LogprobPlan` of their texts but
        those of `repeats.earlier`, which are copied from the rows kept when they ran)."""
        repeats = repeats or ChunkRepeats(set(), set(), [])
        texts = items["text"].tolist()
        rows_of_text: dict[str, list[int]] = {}
        # on the thread that drives the device, before the chunk's first batch: one lookup for all the items
        # (one per item: 24 ms per 8,000 items here, 4 ms so; more beside the pipeline's other threads)
        for row, text in zip(self._rows(items).tolist(), texts):
            rows_of_text.setdefault(text, []).append(row)
        exclude_bos = self.lm.bos_policy == "bos"
        unique_rows = [rows_of_text[text] for text, _ in plan.unique]
        for (text, _), enc in zip(plan.unique, plan.encodings):
            if text in repeats.keep:
                self.n_tokens[text] = len(enc.ids)
        filled = [(row, len(enc.ids)) for rows, enc in zip(unique_rows, plan.encodings) for row in rows]
        copied = [(row, text) for text in sorted(repeats.earlier) for row in rows_of_text[text]]
        filled += [(row, self.n_tokens[text]) for row, text in copied]
        column = self.keys.columns.get_loc("n_tokens")  # set before any of these rows reaches the writer
        self.keys.iloc[[r for r, _ in filled], column] = np.array([n for _, n in filled], dtype=np.int32)
        if copied:
            self.background.scattered_copies(np.array([r for r, _ in copied]), [text for _, text in copied])
            self.copies += len(copied)
        self.background.forget(repeats.gone)
        for text in repeats.gone:
            del self.n_tokens[text]
        batches = iter(plan.batches)
        kept_rows = repeats.keep - repeats.free  # texts whose pooled rows the writer keeps for a later first row

        @contextmanager
        def capture(inputs: dict[str, torch.Tensor]):
            batch = next(batches)  # the scorer runs the plan's batches in order
            pooler = Pooler(inputs["attention_mask"], self.pools, len(self.layers), self.lm.d_model, exclude_bos)
            self.pooler = pooler
            try:
                yield
            finally:
                self.pooler = None
            rows = [(row, j) for j, i in enumerate(batch["rows"]) for row in unique_rows[i]]
            keep = {j: plan.unique[i][0] for j, i in enumerate(batch["rows"]) if plan.unique[i][0] in kept_rows}
            self.background.scattered(np.array([r for r, _ in rows]), pooler.result_async(self.background.encoding),
                                      np.array([j for _, j in rows]), keep)

        return capture
