"""Model loading by spec, fingerprints, and the once-only cached GGUF conversion."""

import threading
import time

import pytest
import torch

import babelprobe.models as models
from babelprobe.errors import BabelprobeError
from babelprobe.models import load_model, wrap_model
from tests.tiny import tiny_lm


def test_local_directory_loads_with_same_numbers(tiny, tiny_dir):
    lm = load_model(str(tiny_dir), device="cpu")
    assert (lm.n_layers, lm.d_model, lm.bos_policy) == (tiny.n_layers, tiny.d_model, "bos")
    ids = torch.tensor([lm.encode(["Ein Hund kann bellen."])[0].ids])
    with torch.no_grad():
        torch.testing.assert_close(lm.model(input_ids=ids).logits, tiny.model(input_ids=ids).logits)
    assert load_model(str(tiny_dir), device="cpu").fingerprint == lm.fingerprint


def test_fingerprint_changes_with_weights_and_tokenizer():
    a, b = tiny_lm(seed=0), tiny_lm(seed=1)
    assert a.fingerprint != b.fingerprint
    assert tiny_lm(seed=0).fingerprint == a.fingerprint
    assert tiny_lm(seed=0, bos=False).fingerprint != a.fingerprint


def test_unknown_spec_missing_gguf_and_unreachable_hub_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(BabelprobeError, match="unknown model spec"):
        load_model("not a model")
    with pytest.raises(BabelprobeError, match="does not exist"):
        load_model(str(tmp_path / "x.gguf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BabelprobeError, match="cannot download model 'nobody/no-such-model'"):
        load_model("nobody/no-such-model")


def test_directory_without_config_is_an_error(tmp_path):
    with pytest.raises(BabelprobeError, match="has no config.json"):
        load_model(str(tmp_path))


def test_auto_dtype_is_fp32_on_cpu_and_bf16_on_gpu():
    assert models.auto_dtype(torch.device("cpu")) == torch.float32
    assert models.auto_dtype(torch.device("cuda")) == torch.bfloat16
    with pytest.raises(BabelprobeError, match="unknown dtype"):
        models.parse_dtype("int3")


def test_conversion_runs_once_under_concurrency_and_is_atomic(tmp_path, monkeypatch):
    """Two converters at once: one converts, the other waits and reuses; no partial dir is visible."""
    monkeypatch.setenv("BABELPROBE_CACHE", str(tmp_path))
    calls = []

    def slow_dequantise(gguf, out):
        calls.append(gguf)
        out.mkdir()
        time.sleep(0.3)
        assert not any(p.name.startswith("gguf-") and p.is_dir() for p in tmp_path.iterdir())
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_dequantise", slow_dequantise)
    results = []
    threads = [threading.Thread(target=lambda: results.append(models._convert_once("ab" * 32, lambda t: t / "m.gguf")))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results[0] == results[1] and (results[0] / "config.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".convert-")]


def test_failed_conversion_leaves_nothing_under_the_final_name(tmp_path, monkeypatch):
    monkeypatch.setenv("BABELPROBE_CACHE", str(tmp_path))

    def broken(gguf, out):
        out.mkdir()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(models, "_dequantise", broken)
    with pytest.raises(BabelprobeError, match="No space left on device; free space there or set BABELPROBE_CACHE"):
        models._convert_once("cd" * 32, lambda t: t / "m.gguf")
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


def test_wrap_model_refuses_slow_tokenizer(tiny):
    class Slow:
        is_fast = False

    with pytest.raises(BabelprobeError, match="not a fast tokenizer"):
        wrap_model(tiny.model, Slow())


def test_device_map_options_are_checked_before_loading(tiny_dir):
    with pytest.raises(BabelprobeError, match="either --device or --device-map"):
        load_model(str(tiny_dir), device="cpu", device_map="auto")
    with pytest.raises(BabelprobeError, match="need --device-map"):
        load_model(str(tiny_dir), max_memory="cpu=1GB")
    with pytest.raises(BabelprobeError, match="unknown --device-map 'gpu-please'"):
        load_model(str(tiny_dir), device_map="gpu-please")


def test_a_dispatched_model_takes_inputs_on_its_embeddings_device_and_logits_come_back_there(tiny, tiny_dir):
    """All weights offloaded to disk (the meta device holds them until a module runs): the input device is
    the execution device of the embeddings' hook, and the logits equal the model's on one device."""
    lm = load_model(str(tiny_dir), device_map="auto", max_memory="cpu=1KB")
    assert set(lm.device_map.values()) == {"disk"} and lm.device == torch.device("cpu")
    assert lm.parts.embed.weight.device.type == "meta"
    ids = torch.tensor([lm.encode(["Ein Hund kann bellen."])[0].ids])
    with torch.no_grad():
        hidden = lm.parts.body(input_ids=ids).last_hidden_state
        torch.testing.assert_close(lm.parts.logits(hidden), tiny.model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    assert lm.describe()["device_map"] == lm.device_map


def wrapper_tokens(tokenizer, texts):
    """The transformers wrapper's own tokenisation: ids and spans of each text, no special tokens added."""
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    return [(list(ids), [tuple(o) for o in offs]) for ids, offs in zip(enc["input_ids"], enc["offset_mapping"])]


def sample_texts(tokenizer):
    """Item texts of every bundled sample language, meta prompts with answers, and text holding a special token."""
    from babelprobe.benchmarks.meta import meta_requests, prompt_texts
    from babelprobe.items import load_items

    items = load_items("xcomps-sample", limit=2)
    pairs, languages, prompts = meta_requests(items)
    texts, _, _ = prompt_texts(pairs, prompts, languages, True, lambda t, p, a, b: t.plain(p, a, b))
    return [*items["text"], *texts, f"{tokenizer.bos_token} A dog {tokenizer.eos_token}", "", "  two  spaces "]


def test_tokenize_gives_the_wrappers_tokens_and_spans(tiny):
    """`models.tokenize` calls the Rust backend directly: the same ids and character spans as the wrapper."""
    texts = sample_texts(tiny.tokenizer)
    assert models.tokenize(tiny.tokenizer, texts) == wrapper_tokens(tiny.tokenizer, texts)
    tiny.tokenizer.backend_tokenizer.enable_truncation(4)  # a setting left on the backend is not applied
    try:
        assert models.tokenize(tiny.tokenizer, texts) == wrapper_tokens(tiny.tokenizer, texts)
    finally:
        tiny.tokenizer.backend_tokenizer.no_truncation()


@pytest.mark.slow
def test_tokenize_gives_the_wrappers_tokens_and_spans_with_the_default_tokenizer(default_lm):
    texts = sample_texts(default_lm.tokenizer)
    assert models.tokenize(default_lm.tokenizer, texts) == wrapper_tokens(default_lm.tokenizer, texts)


@pytest.mark.parametrize(("batch", "mask_batch", "mask_rows", "length", "past"),
                         [(3, 3, "per query", 5, 4), (2, 1, "per query", 6, 0), (2, 2, "one row", 1, 7),
                          (2, 2, "per query", 33, 90)])
def test_packed_grouped_query_attention_equals_transformers_sdpa(batch, mask_batch, mask_rows, length, past):
    """`models.packed_gqa_attention` (query heads stacked per key/value head) against transformers' SDPA with its
    keys and values repeated per head, on random queries and masks (some rows padded); float32, summed in the
    kernel's blocks either way (~1e-6 relative)."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    generator = torch.Generator().manual_seed(0)
    heads, groups, dim, keys = 8, 4, 16, past + length
    module = SimpleNamespace(num_key_value_groups=groups, is_causal=True, training=False)
    query = torch.randn(batch, length, heads, dim, generator=generator).transpose(1, 2)  # as a model's projection
    key, value = (torch.randn(batch, heads // groups, keys, dim, generator=generator) for _ in range(2))
    mask = torch.rand(mask_batch, 1, length if mask_rows == "per query" else 1, keys, generator=generator) > 0.3
    mask[..., -1] = True  # every query sees a key
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    packed = models.packed_gqa_attention(module, query, key, value, mask, scaling=0.3)
    assert packed.shape == expected.shape == (batch, length, heads, dim)
    torch.testing.assert_close(packed, expected, rtol=1e-5, atol=1e-5)


def test_packed_grouped_query_attention_leaves_other_cases_to_transformers():
    """No groups, no mask, a mask per head, dropout or a soft cap: None (transformers' own SDPA runs)."""
    from types import SimpleNamespace

    query, key = torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 3, 8)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    grouped, plain = SimpleNamespace(num_key_value_groups=2), SimpleNamespace(num_key_value_groups=1)
    assert models.packed_gqa_attention(plain, query, query, query, mask) is None
    assert models.packed_gqa_attention(grouped, query, key, key, None) is None
    assert models.packed_gqa_attention(grouped, query, key, key, mask.expand(1, 4, 3, 3)) is None
    assert models.packed_gqa_attention(grouped, query, key, key, mask, dropout=0.1) is None
    assert models.packed_gqa_attention(grouped, query, key, key, mask, softcap=30.0) is None
    assert models.packed_gqa_attention(grouped, query, key, key, mask) is not None


def test_a_read_back_waits_on_a_blocking_event_recorded_after_the_queued_copies(monkeypatch):
    # CUDA's default event busy-waits: the thread collecting a chunk would spin on a core for the device's time
    made = []

    class Event:
        def __init__(self, **kwargs):
            self.kwargs, self.stream = kwargs, None
            made.append(self)

        def record(self, stream):
            self.stream = stream

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: ("current stream of", device))
    done = models.copies_done(torch.device("cuda", 1))
    assert made == [done] and done.kwargs == {"blocking": True}
    assert done.stream == ("current stream of", torch.device("cuda", 1))
