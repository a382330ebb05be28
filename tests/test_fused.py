"""Extraction fused into direct scoring (`extract/fused.py`, `compare`): one forward pass gives the same direct
scores as direct scoring alone and the same stored states as `extract` alone, within float32 rounding of a
different batching; `compare` fuses only when both start from scratch, and an interrupted fused pass is
finished by the ordinary resume."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import babelprobe.comparison as comparison
from babelprobe.benchmarks.scoring import DirectSettings, score_direct_capturing, score_pairs
from babelprobe.extract import extract, open_store
from babelprobe.extract.fused import StoreCapture
from babelprobe.extract.settings import ExtractSettings
from babelprobe.items import load_items

EPS32 = float(np.finfo(np.float32).eps)


def state_rtol(lm, layer: int) -> float:
    """How far two float32 evaluations of layer `layer`'s state may differ, relative to the layer's largest
    |value|, when only the batching differs (other batch rows and padding widths change how kernels block
    their sums): a sum of n terms errs by about √n·u on average (Higham, Accuracy and Stability, §4.2); 4·√n·ε
    (ε = 2u) per chained reduction covers the tail, and layer i chains i + 1 of them (the embedding and i
    blocks), each over at most the MLP width. The same rule as the project's tests/numeric.py."""
    config = lm.model.config
    width = max(lm.d_model, int(getattr(config, "intermediate_size", 4 * lm.d_model)))
    return (layer + 1) * 4.0 * math.sqrt(width) * EPS32


def sample_items():
    """A few sample pairs in three languages, plus a pair whose texts repeat another pair's (a text scored
    once fills every item row that has it)."""
    items = load_items("xcomps-sample", languages=["en", "de", "zh"], limit=2)
    copy = items[items["pair_id"] == items["pair_id"].iloc[0]].copy()
    copy["pair_id"] = "copy-pair"
    copy["item_id"] = copy["item_id"] + "-copy"
    return load_items(pd.concat([items, copy], ignore_index=True))


def assert_same_store(lm, fused_path, separate_path):
    fused, separate = open_store(fused_path), open_store(separate_path)
    assert fused.manifest["complete"] and separate.manifest["complete"]
    assert fused.manifest["settings_hash"] == separate.manifest["settings_hash"]  # extract reuses or resumes it
    assert "fused" in fused.manifest and "fused" not in separate.manifest
    pd.testing.assert_frame_equal(fused.keys.reset_index(drop=True), separate.keys.reset_index(drop=True))
    for pool in fused.pools:
        for layer in fused.layers:
            a, b = fused.read(layer, pool=pool), separate.read(layer, pool=pool)
            bound = state_rtol(lm, layer) * float(np.abs(b).max())
            np.testing.assert_allclose(a, b, rtol=0, atol=bound, err_msg=f"{pool} layer {layer}")


def test_one_pass_gives_the_scores_and_states_of_two(tiny, tmp_path):
    items = sample_items()
    settings = DirectSettings()
    alone = score_pairs("direct", tiny, items, tmp_path / "alone.csv", settings, batch_tokens=64, progress=False)
    extract(tiny, items, tmp_path / "separate", pool="both", batch_tokens=64, progress=False)
    capture = StoreCapture(tiny, items, tmp_path / "fused", ExtractSettings(pool="both"), batch_tokens=64)
    with capture:
        fused = score_direct_capturing(tiny, items, tmp_path / "fused.csv", settings, capture, batch_tokens=64,
                                       progress=False)
    # the same batches through the same model: the hooks only read, so the scores are the very same
    pd.testing.assert_frame_equal(fused, alone)
    assert_same_store(tiny, tmp_path / "fused", tmp_path / "separate")


@pytest.mark.parametrize("budget", [None, 0])
def test_a_text_that_an_earlier_chunk_ran_is_copied_not_run_again(tiny, tmp_path, monkeypatch, budget):
    """Chunks of two pairs: the copy pair (last) repeats the first pair's texts, so its scores come from the chunk
    that ran them and its rows in the store point to theirs; no memory is needed for that (`REPEAT_BYTES` 0
    alike). The scores and the store are direct scoring's and `extract`'s."""
    import babelprobe.benchmarks.direct as direct_module
    import babelprobe.extract.run as run_module
    import babelprobe.runs as runs

    items = sample_items()
    monkeypatch.setattr(runs, "CHUNK_PAIRS", 2)
    monkeypatch.setattr(runs, "FIRST_CHUNK_SHARE", 1.0)  # every chunk of two pairs, the first too
    if budget is not None:
        monkeypatch.setattr(run_module, "REPEAT_BYTES", budget)
    chunk = items["pair_id"].map({p: i // 2 for i, p in enumerate(dict.fromkeys(items["pair_id"]))})
    first_chunk = chunk.groupby(items["text"]).transform("min")
    in_earlier = int((chunk > first_chunk).sum())  # items whose text an earlier chunk has: the copy pair's
    assert in_earlier > 2  # and more (XCOMPS's acceptable sentence recurs over negative types)

    planned, plan_logprobs = [], direct_module.plan_logprobs
    def planning(lm, texts, **options):  # each chunk's distinct texts, as it plans to run them
        planned.extend(set(texts))
        return plan_logprobs(lm, texts, **options)

    monkeypatch.setattr(direct_module, "plan_logprobs", planning)
    settings = DirectSettings()
    capture = StoreCapture(tiny, items, tmp_path / "fused", ExtractSettings(pool="both"), batch_tokens=64)
    with capture:
        fused = score_direct_capturing(tiny, items, tmp_path / "fused.csv", settings, capture, batch_tokens=64,
                                       progress=False)
    runs_of = pd.Series(planned).value_counts()
    assert set(runs_of.index) == set(items["text"])
    assert runs_of.sum() == items["text"].nunique()  # each text once, whatever the budget
    assert capture.copies == in_earlier and not capture.kept and not capture.background.kept

    monkeypatch.setattr(direct_module, "plan_logprobs", plan_logprobs)
    alone = score_pairs("direct", tiny, items, tmp_path / "alone.csv", settings, batch_tokens=64, progress=False)
    scores = ["score_good", "score_bad"]
    np.testing.assert_allclose(fused[scores], alone[scores], rtol=0, atol=1e-5)  # issue 40: within 1e-5
    extract(tiny, items, tmp_path / "separate", pool="both", batch_tokens=64, progress=False)
    assert_same_store(tiny, tmp_path / "fused", tmp_path / "separate")
    store, row = open_store(tmp_path / "fused"), pd.Series(range(len(items)), index=items["item_id"])
    assert store.manifest["stored_rows"] == items["text"].nunique() < len(items)  # a text's values stored once
    copies = items[items["pair_id"] == "copy-pair"]
    for pool in store.pools:
        for layer in store.layers:
            values = store.read(layer, pool=pool)
            for item_id, text in zip(copies["item_id"], copies["text"]):
                first = items["item_id"][items["text"] == text].iloc[0]
                np.testing.assert_array_equal(values[row[item_id]], values[row[first]])


@pytest.mark.parametrize("budget", [None, 0])
def test_a_text_run_before_its_first_rows_chunk_fills_that_row(tiny, tmp_path, monkeypatch, budget):
    """Pairs P (A, Y) and Q (Y, B) with Q's items between P's: Y's first row is Q's, in the second chunk, but P's
    chunk runs Y first. Its rows are kept to fill Q's row bit for bit; with no room to keep them, Y runs again."""
    import babelprobe.benchmarks.direct as direct_module
    import babelprobe.extract.run as run_module
    import babelprobe.runs as runs

    a, y, b = "A dog can bark.", "A horse can fly.", "A stone can sing."
    items = load_items(pd.DataFrame({"item_id": ["p-good", "q-good", "q-bad", "p-bad"],
                                     "pair_id": ["P", "Q", "Q", "P"], "language": "en", "subset": "s",
                                     "label": [1, 1, 0, 0], "text": [a, y, b, y]}))
    monkeypatch.setattr(runs, "CHUNK_PAIRS", 1)
    monkeypatch.setattr(runs, "FIRST_CHUNK_SHARE", 1.0)
    if budget is not None:
        monkeypatch.setattr(run_module, "REPEAT_BYTES", budget)
    planned, plan_logprobs = [], direct_module.plan_logprobs
    monkeypatch.setattr(direct_module, "plan_logprobs",
                        lambda lm, texts, **options: planned.extend(set(texts)) or plan_logprobs(lm, texts, **options))
    capture = StoreCapture(tiny, items, tmp_path / "fused", ExtractSettings(pool="both"), batch_tokens=64)
    with capture:
        score_direct_capturing(tiny, items, tmp_path / "fused.csv", DirectSettings(), capture, batch_tokens=64,
                               progress=False)
    assert sorted(planned) == sorted([a, y, b] if budget is None else [a, y, y, b])
    extract(tiny, items, tmp_path / "separate", pool="both", batch_tokens=64, progress=False)
    assert_same_store(tiny, tmp_path / "fused", tmp_path / "separate")
    store = open_store(tmp_path / "fused")
    assert store.value_rows.tolist() == [0, 1, 2, 1] and store.manifest["stored_rows"] == 3


def test_compare_fuses_a_new_store_and_leaves_an_existing_one_to_extract(tiny, tmp_path, monkeypatch):
    items = sample_items()
    monkeypatch.setattr(comparison, "FUSE", True)  # forced: "auto" fuses on accelerators only
    comparison.compare(tiny, items, tmp_path / "fused", folds=2, progress=False)
    monkeypatch.setattr(comparison, "FUSE", False)
    comparison.compare(tiny, items, tmp_path / "separate", folds=2, progress=False)
    assert_same_store(tiny, tmp_path / "fused" / "acts", tmp_path / "separate" / "acts")
    a = pd.read_csv(tmp_path / "fused" / "direct.csv")
    b = pd.read_csv(tmp_path / "separate" / "direct.csv")
    # the separate direct pass runs the texts as a prefix tree (`DirectScorer.share_prefix`): the same scores up
    # to float32 rounding of the cached past (issue 40: fused and separate within 1e-5)
    np.testing.assert_allclose(a[["score_good", "score_bad"]], b[["score_good", "score_bad"]], rtol=0, atol=1e-5)
    # a store that is already there (even of these items) is never refilled by a fused pass
    monkeypatch.setattr(comparison, "FUSE", True)
    (tmp_path / "fused" / "direct.csv").unlink()
    comparison.compare(tiny, items, tmp_path / "fused", folds=2, progress=False)
    assert open_store(tmp_path / "fused" / "acts").manifest["fused"]  # the same store, reused


def test_an_interrupted_fused_pass_is_finished_by_the_resume(tiny, tmp_path, monkeypatch):
    import babelprobe.runs as runs
    from babelprobe.benchmarks.direct import DirectScorer

    items = sample_items()
    monkeypatch.setattr(runs, "CHUNK_PAIRS", 3)
    finish, calls = DirectScorer.finish, []

    def fail_on_the_third(self, ran):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return finish(self, ran)

    monkeypatch.setattr(DirectScorer, "finish", fail_on_the_third)
    monkeypatch.setattr(comparison, "FUSE", True)
    with pytest.raises(KeyboardInterrupt):
        comparison.compare(tiny, items, tmp_path / "cmp", folds=2, progress=False)
    assert not open_store(tmp_path / "cmp" / "acts", allow_incomplete=True).manifest["complete"]
    monkeypatch.setattr(DirectScorer, "finish", finish)
    comparison.compare(tiny, items, tmp_path / "cmp", folds=2, progress=False)  # direct resumes, extract resumes
    monkeypatch.setattr(comparison, "FUSE", False)
    comparison.compare(tiny, items, tmp_path / "separate", folds=2, progress=False)
    fused, separate = open_store(tmp_path / "cmp" / "acts"), open_store(tmp_path / "separate" / "acts")
    for layer in separate.layers:
        bound = state_rtol(tiny, layer) * float(np.abs(separate.read(layer)).max())
        np.testing.assert_allclose(fused.read(layer), separate.read(layer), rtol=0, atol=bound)


def test_on_a_cpu_compare_keeps_two_passes_and_its_store_is_extracts(tiny, tmp_path):
    """`FUSE = "auto"`: on a CPU compare's store is the one `extract` makes at the same budget, bit for bit."""
    items = sample_items()
    assert comparison.FUSE == "auto" and tiny.device.type == "cpu"
    comparison.compare(tiny, items, tmp_path / "cmp", folds=2, batch_tokens=64, progress=False)
    extract(tiny, items, tmp_path / "alone", batch_tokens=64, progress=False)
    made, alone = open_store(tmp_path / "cmp" / "acts"), open_store(tmp_path / "alone")
    assert "fused" not in made.manifest
    for layer in alone.layers:
        np.testing.assert_array_equal(made.read(layer), alone.read(layer))


@pytest.mark.parametrize("fuse", [True, False])
def test_compare_stores_in_the_dtype_asked_for_and_an_existing_store_in_its_own(tiny, tmp_path, monkeypatch, fuse):
    import torch

    from babelprobe.errors import BabelprobeError

    items = sample_items()
    monkeypatch.setattr(comparison, "FUSE", fuse)
    comparison.compare(tiny, items, tmp_path / "f32", folds=2, batch_tokens=64, progress=False)
    comparison.compare(tiny, items, tmp_path / "bf16", folds=2, batch_tokens=64, store_dtype="bfloat16", progress=False)
    wide, narrow = open_store(tmp_path / "f32" / "acts"), open_store(tmp_path / "bf16" / "acts")
    assert (wide.dtype, narrow.dtype) == ("float32", "bfloat16")
    for layer in wide.layers:  # the same passes: the states rounded to bfloat16 as torch rounds them
        expected = torch.from_numpy(wide.read(layer)).to(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(narrow.read(layer), expected)
    acts = tmp_path / "bf16" / "acts"
    with pytest.raises(BabelprobeError, match="holds bfloat16 values, not the --store-dtype float32"):
        comparison.compare(tiny, items, tmp_path / "again", acts=acts, folds=2, store_dtype="float32", progress=False)
    comparison.compare(tiny, items, tmp_path / "again", acts=acts, folds=2, progress=False)  # reused as it is
    assert open_store(acts).manifest["shards"] == narrow.manifest["shards"]


@pytest.mark.parametrize("fuse", [True, False])
def test_a_bfloat16_models_store_is_bfloat16_by_default_with_the_same_numbers(tmp_path, monkeypatch, fuse):
    """compare's default store dtype loses nothing (`extract.settings.exact_dtype`): a bfloat16 model's
    last-token states are bfloat16 values, so its store keeps them in bfloat16, half of float32's bytes, and
    reads back as the float32 store of the same passes does, bit for bit; the probes fit on them are the same."""
    import json

    import torch

    from babelprobe.models import wrap_model
    from tests.tiny import tiny_lm

    lm = tiny_lm()
    half = wrap_model(lm.model.to(torch.bfloat16), lm.tokenizer, name="tiny-llama-bf16")
    items = sample_items()
    monkeypatch.setattr(comparison, "FUSE", fuse)
    comparison.compare(half, items, tmp_path / "default", folds=2, batch_tokens=64, progress=False, figures=False)
    comparison.compare(half, items, tmp_path / "f32", folds=2, batch_tokens=64, store_dtype="float32",
                       progress=False, figures=False)
    narrow, wide = open_store(tmp_path / "default" / "acts"), open_store(tmp_path / "f32" / "acts")
    assert (narrow.dtype, wide.dtype) == ("bfloat16", "float32")
    for layer in wide.layers:
        np.testing.assert_array_equal(narrow.read(layer), wide.read(layer))
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "default" / "neuro.csv"),
                                  pd.read_csv(tmp_path / "f32" / "neuro.csv"))
    record = json.loads((tmp_path / "default" / "compare.json").read_text())
    assert record["settings"]["store_dtype"] == "bfloat16"  # the record says what was made


def test_compares_store_dtype_is_known_before_the_model_loads(tiny, tmp_path):
    """`store_dtype_for` from the runtime's planned dtype (no weights loaded): the model's own dtype for a
    16-bit model's last-token rows, float32 for a float32 model or a mean; what was asked for; and a store
    already at --acts keeps its dtype unless --overwrite."""
    from babelprobe.runtime import Runtime
    from babelprobe.settings import settings_for

    def dtype(runtime, **values):
        return comparison.store_dtype_for(settings_for(comparison.CompareSettings, **values), tmp_path / "acts",
                                          runtime)

    planned = {name: Runtime(device="cpu", model_dtype=name) for name in ("float32", "bfloat16", "float16")}
    assert [dtype(runtime) for runtime in planned.values()] == ["float32", "bfloat16", "float16"]
    assert Runtime(device="cpu").compute_dtype == "float32" and not planned["bfloat16"].loaded
    assert dtype(planned["bfloat16"], pool="mean") == "float32"
    assert dtype(planned["bfloat16"], store_dtype="float32") == "float32"
    extract(tiny, sample_items(), tmp_path / "acts", dtype="float16", progress=False)
    assert dtype(planned["bfloat16"]) == "float16"
    assert dtype(Runtime(device="cpu", model_dtype="bfloat16", overwrite=True)) == "bfloat16"
