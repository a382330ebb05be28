"""Extraction on tiny random models: every backend against HF's own hidden states run one text at a time,
padding sides, layer selection, stopping early, resume, settings checks, OOM halving, and the CLI."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from babelprobe.cli import main
from babelprobe.errors import BabelprobeError
from babelprobe.extract import extract, open_store, parse_layers, verify_store
from babelprobe.extract.capture import Pooler
from babelprobe.items import load_items
from tests.tiny import CORPUS, tiny_lm

BACKENDS = ("hf", "transformer_lens", "nnsight")


def corpus_items(texts=CORPUS) -> pd.DataFrame:
    n = len(texts)
    return load_items(pd.DataFrame({"item_id": [f"t{i:02d}" for i in range(n)], "pair_id": [f"p{i // 2}" for i in range(n)],
                                    "language": "en", "subset": ["a", "b"] * (n // 2) + ["a"] * (n % 2),
                                    "label": [1, 0] * (n // 2) + [1] * (n % 2), "text": list(texts)}))


def hf_reference(lm, text: str) -> tuple[np.ndarray, np.ndarray]:
    """HF's own forward (the base model) on one text with `output_hidden_states`, the final norm swapped
    for Identity so that the last entry is block L's output (HF returns it after the norm). Returns
    (last, mean) [L+1, d], mean over the tokens after BOS (all tokens when the model has no BOS)."""
    ids = torch.tensor([lm.encode([text])[0].ids])
    body, norm = lm.parts.body, lm.parts.final_norm
    name = next(n for n, m in body.named_children() if m is norm)
    setattr(body, name, torch.nn.Identity())
    try:
        with torch.inference_mode():
            # the base model (no vocabulary head: same hidden states, a fraction of the compute)
            states = torch.stack(body(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states)
    finally:
        setattr(body, name, norm)
    states = states[:, 0].double()
    skip = 1 if lm.bos_policy == "bos" and states.shape[1] > 1 else 0
    return states[:, -1].numpy(), states[:, skip:].mean(dim=1).numpy()


def assert_close_rel(actual, expected, rtol, what=""):
    scale = np.abs(expected).max(axis=-1, keepdims=True)
    err = (np.abs(actual - expected) / scale).max()
    assert err <= rtol, f"{what}: max relative error {err:.2e} > {rtol:.0e}"


def test_pooler_last_and_mean_under_both_paddings():
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    for mask, last_pos, text_pos in ((right, 2, [1, 2]), (left, 3, [2, 3])):
        pooler = Pooler(mask, ("last", "mean"), 1, 3, exclude_bos=True)
        pooler.add(0, hidden)
        out = pooler.result()
        np.testing.assert_array_equal(out["last"][0, 0], hidden[0, last_pos].numpy())
        np.testing.assert_array_equal(out["last"][1, 0], hidden[1, 3].numpy())
        np.testing.assert_allclose(out["mean"][0, 0], hidden[0, text_pos].mean(0).numpy())
        np.testing.assert_allclose(out["mean"][1, 0], hidden[1, 1:].mean(0).numpy())
    only_bos = Pooler(torch.tensor([[1, 0]]), ("mean",), 1, 3)
    only_bos.add(0, hidden[:1, :2])
    np.testing.assert_array_equal(only_bos.result()["mean"][0, 0], hidden[0, 0].numpy())


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_store_equals_hf_hidden_states_one_text_at_a_time(tmp_path, arch, backend):
    lm = tiny_lm(arch)
    items = corpus_items()
    report = extract(lm, items, tmp_path / "s", pool="both", backend=backend, shard_size=7, batch_tokens=64,
                     progress=False)
    assert report.shards_written == 3 and report.processed_tokens >= report.real_tokens
    store = open_store(tmp_path / "s")
    assert store.layers == list(range(lm.n_layers + 1)) and store.manifest["backend"]["name"] == backend
    last, mean = store.read_layers(pool="last"), store.read_layers(pool="mean")
    for row, text in enumerate(items["text"]):
        ref_last, ref_mean = hf_reference(lm, text)
        assert_close_rel(last[row], ref_last, 1e-5, f"{arch}/{backend} last of {text!r}")
        assert_close_rel(mean[row], ref_mean, 1e-5, f"{arch}/{backend} mean of {text!r}")
    assert store.keys["item_id"].tolist() == items["item_id"].tolist()
    assert store.keys["n_tokens"].tolist() == [len(e.ids) for e in lm.encode(items["text"].tolist())]
    assert verify_store(tmp_path / "s") == []


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("kept", [True, False])
def test_a_text_that_recurs_runs_once_and_fills_each_of_its_rows(tmp_path, monkeypatch, dtype, kept):
    """XCOMPS's acceptable sentence is in the pairs of all four negative types: it runs once. Shards of 4:
    [a b a c] and [b a d]; a and b recur in the second shard, whose rows point to their first rows in the store:
    they run once, with or without memory for kept rows."""
    import babelprobe.extract.run as run_module

    if not kept:
        monkeypatch.setattr(run_module, "REPEAT_BYTES", 0)
    lm = tiny_lm("llama")
    a, b, c, d = CORPUS[:4]
    items = corpus_items([a, b, a, c, b, a, d])
    run = []  # the real tokens of every text the model runs, from its own inputs
    hook = lm.parts.body.register_forward_pre_hook(
        lambda module, args, kwargs: run.extend(kwargs["attention_mask"].sum(1).tolist()), with_kwargs=True)
    try:
        report = extract(lm, items, tmp_path / "s", pool="both", dtype=dtype, shard_size=4, batch_tokens=64,
                         progress=False)
    finally:
        hook.remove()
    tokens = {text: len(lm.encode([text])[0].ids) for text in (a, b, c, d)}
    ran = (a, b, c, d)
    assert sorted(run) == sorted(tokens[t] for t in ran)
    assert (report.items_done, report.repeats, report.real_tokens) == (7, 7 - len(ran), sum(run))
    store = open_store(tmp_path / "s")
    for pool in ("last", "mean"):
        values = store.read_layers(pool=pool)
        assert np.array_equal(values[2], values[0])  # a copy is its first's rows, bit for bit
        assert np.array_equal(values[5], values[0]) and np.array_equal(values[4], values[1])
        if dtype == "float32":
            for row, text in enumerate(items["text"]):
                assert_close_rel(values[row], hf_reference(lm, text)[pool == "mean"], 1e-5, f"{pool} of row {row}")
    assert store.keys["item_id"].tolist() == items["item_id"].tolist()
    assert store.keys["n_tokens"].tolist() == [tokens[t] for t in items["text"]]
    assert store.manifest["stored_rows"] == 4 and store.value_rows.tolist() == [0, 1, 0, 3, 1, 0, 6]  # once a text
    assert "7 items (4 distinct texts stored) in 2 shards" in report.summary()
    assert verify_store(tmp_path / "s") == []


def test_a_complete_format_1_store_is_kept_by_the_same_command(tmp_path, monkeypatch):
    """A store made before format 2 (every row stored) is read as it is: the same extract command finds it
    complete instead of refusing its settings or making it again."""
    import babelprobe.extract.run as run_module
    import babelprobe.extract.store as store_module
    from tests.test_store import format_1

    lm, items = tiny_lm("llama"), corpus_items(CORPUS[:3] + CORPUS[:2])
    with monkeypatch.context() as old:  # as format 1 wrote it
        old.setattr(store_module, "FORMAT_VERSION", 1)
        old.setattr(run_module, "first_rows", lambda texts: None)
        extract(lm, items, tmp_path / "s", shard_size=2, batch_tokens=64, progress=False)
    format_1(tmp_path / "s")
    before = {f.name: f.read_bytes() for f in (tmp_path / "s").iterdir()}
    report = extract(lm, items, tmp_path / "s", shard_size=2, batch_tokens=64, progress=False)
    assert report.shards_written == 0 and report.shards_skipped == 3
    assert {f.name: f.read_bytes() for f in (tmp_path / "s").iterdir()} == before
    store = open_store(tmp_path / "s")
    assert store.manifest["format_version"] == 1 and store.value_rows.tolist() == [0, 1, 2, 3, 4]
    for row, text in enumerate(items["text"]):
        assert_close_rel(store.read_layers(rows=[row])[0], hf_reference(lm, text)[0], 1e-5, f"row {row}")
    with pytest.raises(BabelprobeError, match="other settings"):  # another setting still needs --overwrite
        extract(lm, items, tmp_path / "s", shard_size=2, batch_tokens=64, progress=False, pool="mean")


def test_kept_rows_stay_within_their_budget_and_go_after_their_last_shard():
    """`Repeats` keeps a text's rows only while the kept rows fit the budget, and lets them go once the last
    shard that has the text copied them; a text not kept runs again where it recurs."""
    from babelprobe.extract.run import Repeats
    from babelprobe.models import Encoding

    texts = [[1, 2], [3], [1, 2], [4], [3], [5], [4], [1, 2], [5]]  # shards of 3: [A B A] [C B E] [C A E]
    encodings = [Encoding([0, *ids], [(0, 0)] * (len(ids) + 1)) for ids in texts]
    repeats = Repeats(encodings, [(0, 3), (3, 6), (6, 9)], row_bytes=10, budget=20)  # two texts at most
    plans = []
    for n in range(3):
        plans.append(repeats.shard(n))
        assert len(repeats.kept) * 10 <= 20
    first, second, third = plans
    assert (first.firsts, first.copies, first.copied) == ([0, 1], {0: [0, 2], 1: [1]}, {})
    assert sorted(first.keep) == [0, 1] and first.gone == []  # A (again in the third shard) and B (the second)
    assert second.copied == {1: (0, 3)} and second.firsts == [0, 2]  # B copied; C and E run
    assert second.gone == [(0, 3)]  # no shard after the second has B: copied, its rows go
    assert second.keep == {0: (0, 4)}  # room for C, not for E
    assert third.copied == {0: (0, 4), 1: (0, 1, 2)} and third.firsts == [2]  # E runs again
    assert sorted(third.gone) == [(0, 1, 2), (0, 4)] and not repeats.kept


def test_rows_whose_text_an_earlier_shard_stores_need_nothing():
    """In the store a row whose text an earlier shard has points there (`value_rows`): nothing runs, is kept or
    copied for it. A different text with the same tokens (A2) holds values of its own: it takes A's kept rows."""
    from babelprobe.extract.run import Repeats
    from babelprobe.extract.store import first_rows
    from babelprobe.models import Encoding

    names = ["A", "B", "A", "C", "B", "E", "C", "A2", "E"]  # shards of 3: [A B A] [C B E] [C A2 E]
    ids = {"A": [1, 2], "A2": [1, 2], "B": [3], "C": [4], "E": [5]}
    encodings = [Encoding([0, *ids[name]], [(0, 0)] * (len(ids[name]) + 1)) for name in names]
    repeats = Repeats(encodings, [(0, 3), (3, 6), (6, 9)], row_bytes=10, budget=20, value_rows=first_rows(names))
    first, second, third = (repeats.shard(n) for n in range(3))
    assert (first.firsts, first.copies, first.pointing) == ([0, 1], {0: [0, 2], 1: [1]}, 0)
    assert first.keep == {0: (0, 1, 2)}  # A's tokens, for A2; B is only ever pointed to
    assert (second.firsts, second.copied, second.keep, second.pointing) == ([0, 2], {}, {}, 1)  # B points
    assert (third.firsts, third.copied, third.pointing) == ([], {1: (0, 1, 2)}, 2)  # C and E point; A2 copies
    assert third.gone == [(0, 1, 2)] and not repeats.kept


def test_left_padding_and_no_bos_model(tmp_path):
    lm = tiny_lm("gemma3", bos=False)  # sliding-window attention, no BOS: the mean covers every token
    items = corpus_items()
    extract(lm, items, tmp_path / "left", pool="both", padding_side="left", progress=False)
    extract(lm, items, tmp_path / "right", pool="both", padding_side="right", progress=False)
    left, right = open_store(tmp_path / "left"), open_store(tmp_path / "right")
    for pool in ("last", "mean"):
        np.testing.assert_allclose(left.read_layers(pool=pool), right.read_layers(pool=pool), rtol=1e-5, atol=1e-5)
    ref_last, ref_mean = hf_reference(lm, items["text"][3])
    assert_close_rel(left.read_layers(rows=[3], pool="mean")[0], ref_mean, 1e-5, "no-BOS mean")
    assert left.manifest["bos_policy"] == "none"


@pytest.mark.parametrize("backend", BACKENDS)
def test_stops_after_the_last_requested_layer(tmp_path, backend):
    lm = tiny_lm("llama")
    calls = {"block 3": 0, "head": 0, "norm": 0}
    handles = [lm.parts.layers[2].register_forward_hook(lambda *a: calls.__setitem__("block 3", calls["block 3"] + 1)),
               lm.parts.head.register_forward_hook(lambda *a: calls.__setitem__("head", calls["head"] + 1)),
               lm.parts.final_norm.register_forward_hook(lambda *a: calls.__setitem__("norm", calls["norm"] + 1))]
    try:
        extract(lm, corpus_items(), tmp_path / "s", layers="0,2", backend=backend, progress=False)
    finally:
        for h in handles:
            h.remove()
    assert calls == {"block 3": 0, "head": 0, "norm": 0}
    store = open_store(tmp_path / "s")
    assert store.layers == [0, 2]
    ref_last, _ = hf_reference(lm, CORPUS[5])
    assert_close_rel(store.read(2, [5])[0], ref_last[2], 1e-5, "layer 2")


def test_backends_leave_the_model_as_it_was(tmp_path):
    lm = tiny_lm("llama")
    blocks = list(lm.parts.layers)
    before = lm.model(input_ids=torch.tensor([[2, 40, 41]])).logits
    for backend in BACKENDS:
        extract(lm, corpus_items()[:4], tmp_path / backend, backend=backend, progress=False)
    assert list(lm.parts.layers) == blocks and not any(b._forward_hooks or b._forward_pre_hooks for b in blocks)
    assert lm.model.config._attn_implementation == "eager" and lm.tokenizer.padding_side == "right"
    torch.testing.assert_close(lm.model(input_ids=torch.tensor([[2, 40, 41]])).logits, before)


def test_float16_overflow_through_extraction(tmp_path):
    lm = tiny_lm("llama")
    with torch.no_grad():
        lm.parts.embed.weight.mul_(1e8)  # embeddings far beyond float16's 65504
    with pytest.raises(BabelprobeError, match=r"layer 0 reach \|x\| = .*--on-overflow"):
        extract(lm, corpus_items(), tmp_path / "s", dtype="float16", progress=False)
    assert not list((tmp_path / "s").glob("shard-*"))
    extract(lm, corpus_items(), tmp_path / "s", dtype="float16", on_overflow="float32", progress=False)
    store = open_store(tmp_path / "s")
    assert {s["dtype"]["last"] for s in store.manifest["shards"]} == {"float32"}
    assert np.abs(store.read(0)).max() > 65504 and verify_store(tmp_path / "s") == []


def _batch_cost(batches, lengths, pass_tokens):
    """What a batching costs in the model `length_batches` minimises: each batch's padded tokens and a pass."""
    return sum(len(b) * max(lengths[i] for i in b) + pass_tokens for b in batches)


@pytest.mark.parametrize("pass_tokens", [0, 3, 40, 10**9])
def test_length_batches_cover_every_text_once_within_budget(pass_tokens):
    from babelprobe.models import length_batches

    lengths = list(np.random.default_rng(0).integers(3, 40, size=500))
    batches = length_batches(lengths, 256, pass_tokens)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= 256 or len(batch) == 1
    if pass_tokens == 0:  # padding is all a batch costs: no text shares a batch with a longer one
        assert all(len({lengths[i] for i in batch}) == 1 for batch in batches)
    if pass_tokens == 10**9:  # passes are all that counts: as few as cutting by the budget alone gives
        assert len(batches) == len(length_batches(lengths, 256))


def test_length_batches_are_the_cheapest_cuts():
    """Every way to cut the sorted texts into batches within the budget is a candidate: the batching costs the
    least of all 2^(n-1) ways (enumerated here; budgets from never binding to one text's worth), and never more
    than the budget-only cuts or one batch per length on larger sets."""
    from itertools import combinations

    from babelprobe.models import length_batches

    rng = np.random.default_rng(3)
    for trial in range(60):
        lengths = [int(x) for x in rng.integers(1, 12, size=10)]
        pass_tokens, budget = int(rng.integers(0, 30)), int(rng.choice([12, 25, 40, 10**6]))
        ordered = sorted(range(10), key=lambda i: -lengths[i])
        ways = ([ordered[a:b] for a, b in zip((0, *cuts), (*cuts, 10))]
                for k in range(10) for cuts in combinations(range(1, 10), k))
        least = min(_batch_cost(way, lengths, pass_tokens) for way in ways
                    if all(len(b) * max(lengths[i] for i in b) <= budget or len(b) == 1 for b in way))
        batches = length_batches(lengths, budget, pass_tokens)
        assert all(len(b) * max(lengths[i] for i in b) <= budget or len(b) == 1 for b in batches)
        assert _batch_cost(batches, lengths, pass_tokens) == least, (trial, lengths, pass_tokens, budget)
    lengths = list(rng.integers(3, 40, size=300))
    for pass_tokens in (8, 64, 768):
        cost = _batch_cost(length_batches(lengths, 256, pass_tokens), lengths, pass_tokens)
        assert cost <= _batch_cost(length_batches(lengths, 256), lengths, pass_tokens)
        assert cost <= _batch_cost(length_batches(lengths, 256, 0), lengths, pass_tokens)


def test_a_pass_costs_more_on_an_accelerator():
    """A GPU's pass has a large fixed cost (launches, reading the weights): fewer, fuller batches than a CPU's."""
    from babelprobe.models import length_batches, pass_tokens

    lengths = list(np.random.default_rng(1).integers(3, 40, size=3000))
    cpu, gpu = (length_batches(lengths, 2048, pass_tokens(torch.device(d))) for d in ("cpu", "cuda"))
    assert pass_tokens(torch.device("cuda")) > pass_tokens(torch.device("cpu")) > 0
    assert len(gpu) < len(cpu)
    padded = [sum(len(b) * max(lengths[i] for i in b) for b in batches) for batches in (cpu, gpu)]
    assert sum(lengths) <= padded[0] < padded[1]


def test_parse_layers():
    assert parse_layers("all", 18) == list(range(19))
    assert parse_layers(None, 3) == [0, 1, 2, 3]
    assert parse_layers("0-4,12", 18) == [0, 1, 2, 3, 4, 12]
    assert parse_layers("12,0,6,6", 18) == [0, 6, 12]
    assert parse_layers([3, 1], 18) == [1, 3]
    for bad in ("19", "0-40", "x", "", "-1"):
        with pytest.raises(BabelprobeError, match="--layers"):
            parse_layers(bad, 18)


def test_resume_redoes_only_missing_shards_with_identical_checksums(tmp_path):
    lm, items = tiny_lm("llama"), corpus_items()
    extract(lm, items, tmp_path / "s", pool="both", shard_size=4, progress=False)
    full = json.loads((tmp_path / "s" / "manifest.json").read_text())
    (tmp_path / "s" / "shard-00003.h5").unlink()
    (tmp_path / "s" / ".shard-00004.h5.123.tmp").write_bytes(b"partial")
    report = extract(lm, items, tmp_path / "s", pool="both", shard_size=4, progress=False)
    assert (report.shards_written, report.shards_skipped) == (1, 4)
    again = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert again["shards"] == full["shards"] and again["complete"]
    assert not list((tmp_path / "s").glob(".shard-*"))
    nothing = extract(lm, items, tmp_path / "s", pool="both", shard_size=4, progress=False)
    assert nothing.shards_written == 0 and nothing.shards_skipped == 5


def test_a_bfloat16_extraction_stores_the_float32_states_rounded_to_nearest_even(tmp_path):
    """The rows are encoded where they are pooled (`Pooler.result_async(encode=)`): the stored bits equal the
    float32 store's values of the same passes rounded to nearest even, written out on their bits."""
    from tests.test_store import bfloat16_bits

    lm, items = tiny_lm("llama"), corpus_items()
    for dtype in ("float32", "bfloat16"):
        extract(lm, items, tmp_path / dtype, pool="both", dtype=dtype, shard_size=6, progress=False)
    wide, narrow = open_store(tmp_path / "float32"), open_store(tmp_path / "bfloat16")
    for pool in ("last", "mean"):
        expected = bfloat16_bits(wide.read_layers(pool=pool)).astype(np.uint32) << 16
        np.testing.assert_array_equal(narrow.read_layers(pool=pool).view(np.uint32), expected)
    assert verify_store(tmp_path / "bfloat16") == []


def test_other_settings_are_refused_unless_overwrite(tmp_path):
    lm, items = tiny_lm("llama"), corpus_items()
    extract(lm, items, tmp_path / "s", progress=False)
    with pytest.raises(BabelprobeError, match="other settings.*pools.*--overwrite"):
        extract(lm, items, tmp_path / "s", pool="mean", progress=False)
    with pytest.raises(BabelprobeError, match=r"different: model\b"):
        extract(tiny_lm("llama", seed=1), items, tmp_path / "s", progress=False)
    with pytest.raises(BabelprobeError, match="different: item set"):
        extract(lm, items[:6], tmp_path / "s", progress=False)
    extract(lm, items, tmp_path / "s", pool="mean", overwrite=True, progress=False)
    store = open_store(tmp_path / "s")
    assert store.pools == ("mean",) and verify_store(tmp_path / "s") == []
    (tmp_path / "mine.txt").write_text("keep")
    extract(lm, items, tmp_path, overwrite=True, progress=False)  # only store files are ever removed
    assert (tmp_path / "mine.txt").read_text() == "keep"


def test_out_of_memory_halves_the_batch_and_gets_the_same_values(tmp_path, monkeypatch):
    from babelprobe.extract import backends

    lm, items = tiny_lm("llama"), corpus_items()
    extract(lm, items, tmp_path / "plain", progress=False)
    real_run = backends.HFBackend.run

    def small_memory(self, batch, pooler):
        if batch["input_ids"].shape[0] > 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_run(self, batch, pooler)

    monkeypatch.setattr(backends.HFBackend, "run", small_memory)
    report = extract(lm, items, tmp_path / "halved", progress=False)
    assert report.halvings > 0
    np.testing.assert_allclose(open_store(tmp_path / "halved").read_layers(),
                               open_store(tmp_path / "plain").read_layers(), rtol=1e-5, atol=1e-6)


def save_tiny_model(path, arch="llama", max_positions=128):
    lm = tiny_lm(arch, max_positions=max_positions)
    lm.model.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    return path


def write_items_file(path, texts=CORPUS):
    corpus_items(texts).to_json(path, orient="records", lines=True, force_ascii=False)
    return path


def test_cli_extract_keeps_a_bfloat16_models_last_tokens_in_bfloat16_unless_asked(tmp_path, capsys):
    """The default --store-dtype loses nothing: a bfloat16 model's last-token states are bfloat16 values
    (tests/test_families.py), so they are stored in bfloat16 and read back as a float32 store of them does; a
    mean is stored in float32, and a store already at --out keeps its own dtype."""
    model = save_tiny_model(tmp_path / "model")
    items = write_items_file(tmp_path / "items.jsonl")
    base = ["extract", "--model", str(model), "--items", str(items), "--model-dtype", "bfloat16", "--device", "cpu",
            "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "default")]) == 0
    assert main([*base, "--out", str(tmp_path / "f32"), "--store-dtype", "float32"]) == 0
    assert main([*base, "--out", str(tmp_path / "both"), "--pool", "both"]) == 0
    narrow, wide = open_store(tmp_path / "default"), open_store(tmp_path / "f32")
    assert (narrow.dtype, wide.dtype, open_store(tmp_path / "both").dtype) == ("bfloat16", "float32", "float32")
    assert narrow.manifest["extract_settings"]["dtype"] == "bfloat16"  # the record says what was made
    np.testing.assert_array_equal(narrow.read_layers(), wide.read_layers())
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "f32")]) == 0
    assert "nothing left to extract" in capsys.readouterr().out


def test_cli_extract_and_verify(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "model")
    items = write_items_file(tmp_path / "items.jsonl")
    out = tmp_path / "acts"
    args = ["extract", "--model", str(model), "--items", str(items), "--out", str(out), "--pool", "both",
            "--layers", "0-2", "--dtype", "bfloat16", "--shard-size", "6", "--compression", "lzf", "--no-progress"]
    assert main(args) == 0
    assert "20 items in 4 shards (4 written)" in capsys.readouterr().out
    assert main(["verify", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"OK {out}: 20 items, layers 0..2 (3)")
    store = open_store(out)
    assert store.dtype == "bfloat16" and store.manifest["items"]["source"] == str(items)
    assert store.load_items()["item_id"].tolist() == store.keys["item_id"].tolist()
    assert main(args) == 0 and "nothing left to extract" in capsys.readouterr().out
    store.close()
    import h5py

    with h5py.File(out / "shard-00002.h5", "r+") as f:
        f["mean"][0, 0, 0] = f["mean"][0, 0, 0] + 1
    assert main(["verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert "shard-00002.h5/mean: checksum mismatch" in err and "1 problem(s)" in err
