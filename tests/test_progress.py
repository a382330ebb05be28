"""Progress on the long loops (issue 39 item 6): the bar of `runs.score_resumably` (patch, intervene, bench,
score, compare) counts finished units and, inside a chunk, the tokens the model runs, as it runs them
(`runs.TokenMeter`); an interruption keeps every finished chunk and leaves no hook on the model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import babelprobe as bp
from babelprobe.benchmarks.direct import score_direct
from babelprobe.runs import TokenMeter, partial_dir, score_resumably

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def items():
    return bp.load_items("xcomps-sample", languages=["en", "de"], limit=2)


def real_tokens(lm, texts) -> int:
    """Every token a forward pass of each distinct text holds (direct scoring runs a sentence shared by two
    pairs once), counted with the tokenizer itself: BOS and the text."""
    return sum(1 + len(lm.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in set(texts))


@pytest.mark.parametrize("batch_tokens, padding_side", [(16, "right"), (4096, "left")])
def test_the_meter_counts_the_real_tokens_of_every_forward_pass_whatever_the_padding(tiny, items, batch_tokens,
                                                                                     padding_side):
    with TokenMeter(tiny) as meter:
        score_direct(tiny, items, batch_tokens=batch_tokens, padding_side=padding_side, progress=False,
                     share_prefix=False)
    assert meter.tokens == real_tokens(tiny, items["text"])
    assert not tiny.parts.body._forward_pre_hooks  # the hook went with the meter


def test_the_meter_counts_a_prefix_trees_new_tokens_not_its_copied_past(tiny, items):
    """Direct scoring as a prefix tree (one chunk of texts, one tree) runs each distinct start of the texts
    once, up to each text's last scored token (whose own state predicts nothing), in batches of 16 tokens whose
    passes attend to copied pasts: the meter counts the tokens run, not the past."""
    import babelprobe.benchmarks.direct as direct

    plan = direct.plan_prefix
    with TokenMeter(tiny) as meter, pytest.MonkeyPatch.context() as patch:
        patch.setattr(direct, "plan_prefix", lambda *a, **k: plan(*a, **{**k, "chunk_tokens": 10**6}))
        score_direct(tiny, items, batch_tokens=16, progress=False)
    encoded = [[tiny.tokenizer.bos_token_id, *tiny.tokenizer(t, add_special_tokens=False)["input_ids"]]
               for t in set(items["text"])]
    assert meter.tokens == len({tuple(ids[:j]) for ids in encoded for j in range(1, len(ids))})


def test_on_an_accelerator_the_meter_counts_positions_without_reading_the_mask(tiny):
    """A mask on another device than the CPU is not read back (its sum would make the host wait for the device
    at every pass): the meter counts its positions. A meta-device mask has no values to read."""
    meter = TokenMeter(tiny)
    meter._count(None, (), {"attention_mask": torch.ones(3, 5, dtype=torch.long, device="meta")})
    meter._count(None, (), {"attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])})  # a CPU mask: its real tokens
    assert meter.tokens == 15 + 5


class Recorder:
    """A stand-in for tqdm that records, at each postfix, how many units were finished then."""

    def __init__(self, total, initial=0, **kwargs):
        self.n, self.disable, self.seen = initial, kwargs.get("disable", False), []
        Recorder.last = self

    def set_postfix_str(self, text, refresh=True):
        self.seen.append((self.n, text))

    def update(self, n=1):
        self.n += n

    def close(self):
        pass


def test_the_bar_moves_inside_a_chunk_as_tokens_run(tiny, items, tmp_path, monkeypatch):
    import babelprobe.runs

    monkeypatch.setattr(babelprobe.runs, "tqdm", Recorder)
    pairs = items["pair_id"].nunique()
    score_resumably(lambda chunk: score_direct(tiny, chunk, batch_tokens=16, progress=False, share_prefix=False), items,
                    tmp_path / "direct.csv", {"what": "test"}, chunk_pairs=pairs, model=tiny)  # one chunk
    bar = Recorder.last
    assert bar.n == pairs
    inside = [text for finished, text in bar.seen if finished == 0]
    assert len(inside) > 1, bar.seen  # several batches counted before the only chunk finished
    counts = [int(text.split()[0].replace(",", "")) for text in inside]
    assert counts == sorted(counts) and counts[-1] == real_tokens(tiny, items["text"])


def test_an_interruption_keeps_the_finished_chunks_and_removes_the_hook(tiny, items, tmp_path):
    out = tmp_path / "direct.csv"
    calls = []

    def score(chunk):
        if calls:
            raise KeyboardInterrupt
        calls.append(chunk["pair_id"].nunique())
        return score_direct(tiny, chunk, progress=False)

    with pytest.raises(KeyboardInterrupt):
        score_resumably(score, items, out, {"what": "test"}, chunk_pairs=1, progress=False, model=tiny)
    assert not tiny.parts.body._forward_pre_hooks
    assert len(list(partial_dir(out).glob("chunk-*.parquet"))) == 1 and not out.exists()
    again = score_resumably(lambda chunk: score_direct(tiny, chunk, progress=False), items, out, {"what": "test"},
                            chunk_pairs=1, progress=False, model=tiny)
    whole = score_direct(tiny, items, progress=False)
    again, whole = (frame.sort_values("pair_id").reset_index(drop=True) for frame in (again, whole))
    scores = ["score_good", "score_bad"]
    pd.testing.assert_frame_equal(again.drop(columns=scores), whole.drop(columns=scores))
    # the resumed run batched the texts otherwise (one pair per chunk): a score sums ~20 float32 log-probs, each
    # within ~1e-7 relative of its value in any batch, so the sums agree to 20 × 1.2e-7 ≈ 2.4e-6 relative; 1e-5
    np.testing.assert_allclose(again[scores].to_numpy(float), whole[scores].to_numpy(float), rtol=1e-5, atol=0)


def test_running_out_of_device_memory_is_one_line_and_keeps_the_finished_chunks(tiny, items, tmp_path):
    """A scorer's batch too large for the GPU: a one-line error naming --batch-tokens and where the finished
    chunks are; the same command with a smaller budget goes on from them."""
    import torch

    from babelprobe.benchmarks.direct import DirectScorer
    from babelprobe.errors import BabelprobeError

    out, calls = tmp_path / "direct.csv", []

    class TooBig(DirectScorer):
        def run(self, prepared, progress=False):
            if calls:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB (GPU 0; 23.6 GiB total)")
            calls.append(1)
            return super().run(prepared, progress)

    with pytest.raises(BabelprobeError) as caught:
        score_resumably(TooBig(tiny, batch_tokens=64), items, out, {"what": "test"}, chunk_pairs=1, progress=False,
                        model=tiny)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("scoring: the device ran out of memory (CUDA out of memory.")
    assert f"finished chunks (1) are kept in {partial_dir(out)}" in message and "(this run: 64)" in message
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError) and not out.exists()
    again = score_resumably(DirectScorer(tiny, batch_tokens=32), items, out, {"what": "test"}, chunk_pairs=1,
                            progress=False, model=tiny)
    assert len(again) == items["pair_id"].nunique() and out.exists()


def test_units_that_share_a_text_are_chunked_together_and_come_back_in_order(tmp_path):
    """`together="text"`: a chunk holds the pairs linked by a shared text (XCOMPS's acceptable sentence is in
    four pairs), so a scorer that runs each distinct text of a chunk once runs it once; the rows come back in
    the items' order."""
    from babelprobe.runs import kept_together

    texts = {"p1": ("a", "x"), "p2": ("b", "y"), "p3": ("a", "z"), "p4": ("c", "y"), "p5": ("d", "w")}
    items = pd.DataFrame([{"pair_id": pid, "item_id": f"{pid}-{k}", "text": text}
                          for pid, pair in texts.items() for k, text in enumerate(pair)])
    assert kept_together(items, "pair_id", "text") == ["p1", "p3", "p2", "p4", "p5"]  # {p1 p3} by a, {p2 p4} by y
    chunks = []

    def score(chunk):  # one row per pair: its texts, as a scorer's table
        chunks.append(list(dict.fromkeys(chunk["pair_id"])))
        return chunk.groupby("pair_id", sort=False)["text"].agg("+".join).reset_index()

    rows = score_resumably(score, items, tmp_path / "rows.csv", {"what": "test"}, chunk_pairs=2, progress=False,
                           together="text")
    assert chunks == [["p1", "p3"], ["p2", "p4"], ["p5"]]
    assert rows["pair_id"].tolist() == ["p1", "p2", "p3", "p4", "p5"]
    assert rows["text"].tolist() == ["a+x", "b+y", "a+z", "c+y", "d+w"]
    assert pd.read_csv(tmp_path / "rows.csv")["pair_id"].tolist() == rows["pair_id"].tolist()


def test_a_scorer_in_three_steps_starts_with_a_small_chunk_and_resumes_an_older_layout(tmp_path):
    """A pipelined scorer's first chunk holds a quarter of the others' pairs (the device waits for its
    preparation alone), a plain function's does not; a partial run recorded without a first chunk's size (as
    before there was one) resumes in its own chunks of equal size, each pair scored once."""
    items = pd.DataFrame([{"pair_id": f"p{k:02d}", "item_id": f"p{k:02d}-{s}", "text": f"t{k}{s}"}
                          for k in range(10) for s in "ab"])

    def table(chunk):
        return chunk.groupby("pair_id", sort=False)["text"].agg("+".join).reset_index()

    class Steps:  # prepare, run, finish: what `pipeline.pipelined` overlaps
        def __init__(self, fail_after=None):
            self.sizes, self.fail_after = [], fail_after

        def prepare(self, chunk):
            return chunk

        def run(self, chunk):
            if len(self.sizes) == self.fail_after:
                raise RuntimeError("stopped")
            self.sizes.append(chunk["pair_id"].nunique())
            return chunk

        def finish(self, chunk):
            return table(chunk)

    plain = []
    score_resumably(lambda chunk: plain.append(chunk["pair_id"].nunique()) or table(chunk), items,
                    tmp_path / "plain.csv", {"what": "test"}, chunk_pairs=4, progress=False)
    steps = Steps()
    rows = score_resumably(steps, items, tmp_path / "steps.csv", {"what": "test"}, chunk_pairs=4, progress=False)
    assert plain == [4, 4, 2] and steps.sizes == [1, 4, 4, 1]
    assert rows["pair_id"].tolist() == [f"p{k:02d}" for k in range(10)]

    out = tmp_path / "older.csv"
    with pytest.raises(RuntimeError, match="stopped"):
        score_resumably(Steps(fail_after=1), items, out, {"what": "test"}, chunk_pairs=4, progress=False)
    partial = partial_dir(out)
    key = json.loads((partial / "key.json").read_text())
    assert (key["chunk_pairs"], key.pop("first_chunk")) == (4, 1)
    (partial / "key.json").write_text(json.dumps(key))  # as an older babelprobe recorded it: its first chunk of 4
    table(items[items["pair_id"] < "p04"]).to_parquet(partial / "chunk-00000.parquet", index=False)
    again = Steps()
    rows = score_resumably(again, items, out, {"what": "test"}, chunk_pairs=4, progress=False)
    assert again.sizes == [4, 2]
    assert rows["pair_id"].tolist() == [f"p{k:02d}" for k in range(10)]


@pytest.mark.parametrize("scorer", ["direct", "meta"])
def test_a_run_keeps_its_chunks_rows_in_memory_and_reads_back_only_an_earlier_runs(tiny, items, tmp_path,
                                                                                   monkeypatch, scorer):
    """The result of a run is its chunks' rows as they were finished (none read back from the partial directory
    while the device waits); a resumed run reads the earlier run's chunks from disk, and the two write the same
    table, byte for byte, and return the same rows (meta's prompt columns are Python strings in memory and Arrow
    strings read back: the values are compared)."""
    from babelprobe.benchmarks.direct import DirectScorer
    from babelprobe.benchmarks.meta import MetaScorer

    Scorer = {"direct": DirectScorer, "meta": MetaScorer}[scorer]

    class Stopping(Scorer):  # interrupted after its first chunk
        def run(self, prepared, progress=False):
            if getattr(self, "ran", False):
                raise KeyboardInterrupt
            self.ran = True
            return super().run(prepared)

    def score(scorer, name):
        return score_resumably(scorer, items, tmp_path / name, {"what": "test"}, chunk_pairs=2, progress=False)

    read_parquet = pd.read_parquet
    monkeypatch.setattr(pd, "read_parquet", lambda *a, **k: pytest.fail("a chunk of this run was read back"))
    fresh = score(Scorer(tiny), "fresh.csv")
    with pytest.raises(KeyboardInterrupt):
        score(Stopping(tiny), "resumed.csv")
    reads = []
    monkeypatch.setattr(pd, "read_parquet", lambda *a, **k: reads.append(a[0]) or read_parquet(*a, **k))
    resumed = score(Scorer(tiny), "resumed.csv")
    assert [path.name for path in reads] == ["chunk-00000.parquet"]
    assert (tmp_path / "fresh.csv").read_bytes() == (tmp_path / "resumed.csv").read_bytes()  # the same chunks and batches
    pd.testing.assert_frame_equal(resumed, fresh, check_dtype=scorer == "direct")


def test_a_run_scores_and_writes_its_table_with_the_heap_alive_before_it_frozen(tmp_path, monkeypatch):
    """The chunks are scored and the final table written inside `pipeline.frozen_heap` (a full collector pass
    there walks only what the run made); the heap is thawed when the run returns."""
    import gc

    import babelprobe.runs as runs

    items = pd.DataFrame({"pair_id": [f"p{k}" for k in range(4)], "item_id": [f"i{k}" for k in range(4)]})
    frozen, write = [], runs.write_csv_rows
    monkeypatch.setattr(runs, "write_csv_rows", lambda rows, *a: frozen.append(gc.get_freeze_count()) or
                        write(rows, *a))

    def score(chunk):
        frozen.append(gc.get_freeze_count())
        return chunk.assign(score=1.0)

    rows = score_resumably(score, items, tmp_path / "rows.csv", {"what": "test"}, chunk_pairs=2, progress=False)
    assert len(rows) == 4 and len(frozen) == 3 and min(frozen) > 0  # two chunks, then the table
    assert gc.get_freeze_count() == 0


def tricky_table(n: int, seed: int) -> pd.DataFrame:
    """Rows with what a CSV writer must quote or spell out: separators, quotes, line breaks, empty and missing
    cells, non-ASCII text, JSON lists, floats of every magnitude, NaN and infinities, flags, integers."""
    rng = np.random.default_rng(seed)
    words = ["plain", "a,b", 'say "hi"', "two\nlines", "cr\ronly", "", " pad ", "日本語", "ünï", "x\r\ny"]
    floats = rng.choice([0.1, 1e-5, -2.5e20, 1 / 3, -0.0, np.nan, np.inf, 12.0], n) * rng.normal(size=n)
    return pd.DataFrame({
        "pair_id": [f"p{k:03d}" for k in range(n)],
        "text": pd.array(rng.choice(words, n), dtype="str"),
        "note": [rng.choice(words) if k % 5 else None for k in range(n)],
        "tokens": [[int(t) for t in rng.integers(0, 9, k % 3)] if k % 4 else "none" for k in range(n)],
        "score": floats, "n": rng.integers(-5, 10**12, n), "flag": rng.random(n) < 0.5})


@pytest.mark.parametrize("piece_rows", [128, 5], ids=["pieces-of-128", "pieces-of-5"])
def test_a_table_joined_from_its_chunks_lines_is_the_table_pandas_writes(tmp_path, monkeypatch, piece_rows):
    """`write_csv_rows` joins the lines each chunk made (`csv_rows`, in any order of rows, pandas' writer called on
    a few rows at a time) into the very bytes `write_table` writes for the whole table; where a chunk's lines
    cannot stand for the whole (a column's dtype differs: integers beside missing ones read as floats; categories;
    a cell holding the record separator) the table is formatted whole, the same bytes again."""
    import babelprobe.tables as tables
    from babelprobe.tables import csv_rows, write_csv_rows, write_table

    monkeypatch.setattr(tables, "CSV_PIECE_ROWS", piece_rows)

    whole = tricky_table(60, seed=1)
    chunks = [whole.iloc[a:b].reset_index(drop=True) for a, b in ((0, 7), (7, 31), (31, 60))]
    order = np.random.default_rng(2).permutation(len(whole))
    write_table(whole.iloc[order].reset_index(drop=True), tmp_path / "pandas.csv")
    write_csv_rows(whole.iloc[order].reset_index(drop=True), [csv_rows(c) for c in chunks], order,
                   tmp_path / "joined.csv")
    expected = (tmp_path / "pandas.csv").read_bytes()
    assert b'"two\nlines"' in expected and (tmp_path / "joined.csv").read_bytes() == expected

    missing = chunks[1].assign(n=np.nan)  # its integers read as floats once concatenated
    odd = chunks[2].assign(text=chunks[2]["text"].str.cat(["\x1e"] * len(chunks[2])))
    assert csv_rows(odd) is None and csv_rows(chunks[0].assign(text=chunks[0]["text"].astype("category"))) is None
    for parts in ([chunks[0], missing, chunks[2]], [chunks[0], chunks[1], odd]):
        frame = pd.concat(parts, ignore_index=True)
        write_table(frame, tmp_path / "pandas.csv")
        write_csv_rows(frame, [csv_rows(c) for c in parts], None, tmp_path / "joined.csv")
        assert (tmp_path / "joined.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_a_run_writes_its_table_from_its_chunks_lines_after_the_last_pass(tmp_path, monkeypatch):
    """A scorer in three steps has each chunk's CSV lines made on the finishing thread; the table is then joined
    from them, rows in the items' order of units, not formatted by pandas after the last chunk, and it is the
    table pandas writes for the rows returned."""
    import babelprobe.tables as tables

    table = tricky_table(40, seed=3).assign(text=[f"t{k % 7}" for k in range(40)], tokens=[[k, 1] for k in range(40)])
    items = table[["pair_id", "text"]].assign(item_id=table["pair_id"])

    class Steps:
        prepare = run = staticmethod(lambda chunk: chunk)

        def finish(self, chunk):
            return table.set_index("pair_id").loc[chunk["pair_id"]].reset_index()

    formatted, to_csv = [], pd.DataFrame.to_csv
    monkeypatch.setattr(pd.DataFrame, "to_csv", lambda self, *a, **k: formatted.append(len(self)) or
                        to_csv(self, *a, **k))
    rows = score_resumably(Steps(), items, tmp_path / "rows.csv", {"what": "test"}, chunk_pairs=8, progress=False,
                           together="text")
    assert rows["pair_id"].tolist() == table["pair_id"].tolist()
    assert formatted[-1] == 0 and max(formatted) == 8 and sum(formatted) == len(table)  # chunks, then the header
    tables.write_table(rows, tmp_path / "pandas.csv")
    assert (tmp_path / "rows.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()
