"""The real default model (Gemma-3-270M): every backend's store against HF's own hidden states of each
sentence run alone, within 1e-4 relative in float32, on 12 sentences in six scripts."""

import numpy as np
import pytest
import torch

from babelprobe.extract import extract, open_store, verify_store
from babelprobe.items import load_items
from tests.test_extract import BACKENDS, assert_close_rel, hf_reference

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def items():
    return load_items("xcomps-sample", languages=["en", "zh", "ru", "ja", "ko", "vi"], subsets=["taxonomic"],
                      limit=1)


@pytest.fixture(scope="module")
def references(default_lm, items):
    return [hf_reference(default_lm, text) for text in items["text"]]


@pytest.fixture(scope="module")
def stores(default_lm, items, tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    for backend in BACKENDS:
        extract(default_lm, items, root / backend, pool="both", backend=backend, progress=False)
    return {name: open_store(root / name) for name in BACKENDS}


@pytest.mark.parametrize("name", BACKENDS)
def test_store_equals_hf_block_outputs_of_each_sentence_alone(stores, references, items, name):
    store = stores[name]
    assert len(items) == 12 and store.layers == list(range(19)) and store.d_model == 640
    last, mean = store.read_layers(pool="last"), store.read_layers(pool="mean")
    for row, (ref_last, ref_mean) in enumerate(references):
        assert_close_rel(last[row], ref_last, 1e-4, f"{name} last, {items['item_id'][row]}")
        assert_close_rel(mean[row], ref_mean, 1e-4, f"{name} mean, {items['item_id'][row]}")
    assert verify_store(store.path) == []


def test_backends_agree_and_layer_18_is_before_the_final_norm(stores, default_lm, items):
    hf = stores["hf"].read_layers(pool="last")
    for name in ("transformer_lens", "nnsight"):
        assert_close_rel(stores[name].read_layers(pool="last"), hf, 1e-4, name)
        assert_close_rel(stores[name].read_layers(pool="mean"), stores["hf"].read_layers(pool="mean"), 1e-4, name)
    # HF's own last hidden state is the normed one: the final norm of our layer 18 must give it
    ids = torch.tensor([default_lm.encode([items["text"][0]])[0].ids])
    with torch.inference_mode():
        normed = default_lm.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -1]
        ours = default_lm.parts.final_norm(torch.from_numpy(hf[0, 18]))
    assert_close_rel(ours.numpy(), normed.numpy(), 1e-4, "final norm of layer 18")
    assert np.abs(hf[:, 18]).max() > 1000  # the un-normed residual stream is large in Gemma-3


def test_float16_store_of_gemma_fits_and_matches(default_lm, items, tmp_path, stores):
    """The residual stream reaches ~4e4 here: inside float16's range (65504), so it is stored, rounded."""
    extract(default_lm, items, tmp_path / "f16", dtype="float16", progress=False)
    stored = open_store(tmp_path / "f16").read_layers()
    rounded = torch.from_numpy(stores["hf"].read_layers()).to(torch.float16).float().numpy()
    assert_close_rel(stored, rounded, 1e-3, "float16")
