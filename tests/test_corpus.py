"""The text corpus source (`babelprobe.corpus`): reading each kind of source with its held-out split,
packing into BOS-first rows of `window` tokens, and the one-line errors for bad corpora."""

from __future__ import annotations

import pandas as pd
import pytest

from babelprobe.corpus import HELDOUT_SHARE, pack_rows, packed, read_corpus, row_tokens
from babelprobe.errors import BabelprobeError


def test_the_bundled_corpus_has_the_xcomps_languages_english_and_a_declared_held_out_split():
    from babelprobe.languages import language_table

    corpus = read_corpus("udhr")
    xcomps = set(language_table().index)  # the 17 XCOMPS languages and English
    assert xcomps | {"it", "fi", "hi", "et"} == set(corpus.languages)
    assert corpus.split == "declared"
    for code in corpus.languages:
        train, held = corpus.train[code], corpus.heldout[code]
        assert len(train) > 50 and len(held) >= 12  # preamble + articles 1-24; articles 25-30
        assert not set(train) & set(held)


def test_pack_rows_is_bos_then_window_tokens_of_the_joined_stream(tiny):
    lines = ["A dog can bark.", "A cat can climb trees.", "An eagle can fly."]
    stream = tiny.tokenizer(["\n".join(lines)], add_special_tokens=False)["input_ids"][0]
    window = 4
    rows = pack_rows(tiny, lines, window)
    n_full = len(stream) // window
    assert rows == [[tiny.bos_token_id, *stream[i * window:(i + 1) * window]] for i in range(n_full)]
    kept = pack_rows(tiny, lines, window, keep_last=True)
    assert kept[-1] == [tiny.bos_token_id, *stream[n_full * window:]] or len(stream) % window == 0
    assert row_tokens(tiny, rows) == n_full * window
    # the token cap cuts the stream first (ppl.py: min(l, 2**20))
    assert pack_rows(tiny, lines, window, tokens=6) == [[tiny.bos_token_id, *stream[:4]]]
    # a stream shorter than one row is kept whole: it is the language's only row
    assert pack_rows(tiny, lines[:1], 1000) == [[tiny.bos_token_id, *tiny.tokenizer(lines[0], add_special_tokens=False)["input_ids"]]]


def test_a_folder_with_a_heldout_folder_and_one_without(tmp_path):
    (tmp_path / "a" / "heldout").mkdir(parents=True)
    (tmp_path / "a" / "en.txt").write_text("one\ntwo\n\nthree\n", encoding="utf-8")
    (tmp_path / "a" / "de.txt").write_text("eins\nzwei\n", encoding="utf-8")
    (tmp_path / "a" / "heldout" / "en.txt").write_text("four\n", encoding="utf-8")
    (tmp_path / "a" / "heldout" / "de.txt").write_text("vier\n", encoding="utf-8")
    corpus = read_corpus(tmp_path / "a")
    assert corpus.train == {"de": ["eins", "zwei"], "en": ["one", "two", "three"]}
    assert corpus.heldout == {"de": ["vier"], "en": ["four"]} and corpus.split == "declared"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "en.txt").write_text("\n".join(f"line {i}" for i in range(20)), encoding="utf-8")
    corpus = read_corpus(tmp_path / "b")
    n_held = round(20 * HELDOUT_SHARE)
    assert corpus.heldout["en"] == [f"line {i}" for i in range(20 - n_held, 20)] and corpus.split == "last share"
    assert read_corpus(tmp_path / "a", languages=["en"]).languages == ["en"]


def test_a_table_with_a_split_column(tmp_path):
    frame = pd.DataFrame({"text": ["a b", "c d", "e", "f"], "language": ["en", "en", "de", "de"],
                          "split": ["train", "test", "train", "heldout"]})
    frame.to_json(tmp_path / "c.jsonl", orient="records", lines=True)
    corpus = read_corpus(tmp_path / "c.jsonl")
    assert corpus.train == {"de": ["e"], "en": ["a b"]} and corpus.heldout == {"de": ["f"], "en": ["c d"]}
    frame.drop(columns="split").to_parquet(tmp_path / "c.parquet")
    assert read_corpus(tmp_path / "c.parquet").split == "last share"


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "no such file or directory"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "no <lang>.txt files"),
    (lambda p: (p / "bad").mkdir() or (p / "bad" / "english.txt").write_text("x") and p / "bad",
     "not an ISO 639-1 language code"),
    (lambda p: (p / "t.csv").write_text("text\nhello\n") and p / "t.csv", "needs a text and a language column"),
    (lambda p: (p / "t.txt").write_text("hello") and p / "t.txt", "a corpus file is"),
])
def test_bad_corpora_are_one_line_errors(tmp_path, make, message):
    with pytest.raises(BabelprobeError, match=message) as err:
        read_corpus(make(tmp_path))
    assert "\n" not in str(err.value) and "--corpus" in str(err.value)


def test_a_language_the_corpus_lacks_is_named():
    with pytest.raises(BabelprobeError, match="no sw text"):
        read_corpus("udhr", languages=["en", "sw"])


def test_packed_gives_each_language_its_rows(tiny):
    corpus = read_corpus("udhr", languages=["en", "zh"])
    rows = packed(tiny, corpus, "heldout", 16)
    assert set(rows) == {"en", "zh"}
    assert all(len(r) == 17 and r[0] == tiny.bos_token_id for code in rows for r in rows[code])


class _Stream:
    """What `datasets.load_dataset(..., streaming=True)` gives, without the hub: rows made on demand (an endless
    stream, as Wikipedia is for these budgets), counting how many were read."""

    def __init__(self, make_row):
        self.make_row, self.read = make_row, 0

    def __iter__(self):
        while True:
            self.read += 1
            yield self.make_row(self.read)


def test_a_hub_config_per_language_is_streamed_until_each_has_its_budget(monkeypatch):
    """`hf:NAME:CONFIG` with `{lang}` (online in real use; here `datasets.load_dataset` gives endless
    rows): one stream per language, its config named for it, read only until the token budget (8 characters
    a token) is met; the last tenth of each language's lines held out."""
    import datasets

    opened = {}

    def load_dataset(name, config, split, streaming):
        assert streaming and split == "train"
        code = config.rsplit(".", 1)[1]
        opened[(name, config)] = stream = _Stream(lambda k: {"id": k, "text": f"{code} article {k:03d}\n\nsecond line"})
        return stream

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    corpus = read_corpus("hf:wikimedia/wikipedia:20231101.{lang}", languages=["de", "fr"], tokens=20)
    assert set(opened) == {("wikimedia/wikipedia", "20231101.de"), ("wikimedia/wikipedia", "20231101.fr")}
    row_chars = len("de article 001") + len("second line")
    assert all(s.read == -(-20 * 8 // row_chars) for s in opened.values())  # stopped once 160 characters were in
    assert corpus.languages == ["de", "fr"] and corpus.split == "last share"
    lines = corpus.train["de"] + corpus.heldout["de"]
    assert lines[:3] == ["de article 001", "second line", "de article 002"]
    assert len(corpus.heldout["de"]) == round(len(lines) * HELDOUT_SHARE) and corpus.heldout["de"] == lines[-len(corpus.heldout["de"]):]


def test_a_hub_table_with_a_language_column_keeps_the_languages_asked_for(monkeypatch):
    import datasets

    codes = ["en", "sw", "de"]
    stream = _Stream(lambda k: {"text": f"line {k}", "language": codes[k % 3]})
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, split, streaming: stream)
    corpus = read_corpus("hf:org/mixed", languages=["en", "de"], tokens=3)
    assert corpus.languages == ["de", "en"] and stream.read < 30  # sw rows skipped; stopped at the budget
    assert all(line.startswith("line ") for code in ("en", "de") for line in corpus.train[code] + corpus.heldout[code])
    assert sum(map(len, corpus.train["en"] + corpus.heldout["en"])) >= 24


def test_a_hub_source_that_cannot_be_streamed_is_a_one_line_error(monkeypatch):
    import datasets

    def offline(name, config, split, streaming):
        raise ConnectionError("Couldn't reach 'wikimedia/wikipedia' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(BabelprobeError, match=r"^--corpus hf:wikimedia/wikipedia:20231101.\{lang\}: cannot stream it "
                                               r"\(Couldn't reach") as err:
        read_corpus("hf:wikimedia/wikipedia:20231101.{lang}", languages=["de"])
    assert "\n" not in str(err.value)
    with pytest.raises(BabelprobeError, match="names a language.*give --languages"):
        read_corpus("hf:wikimedia/wikipedia:20231101.{lang}")
