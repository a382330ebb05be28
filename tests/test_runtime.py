"""The runtime (babelprobe/runtime.py): what the model's files tell before its weights load, against what HF's
own loading gives; the one door that loads it, once; the runner door's three ways in (the canonical
`runner(items, out, settings, runtime)`, keywords, the older `runner(model, items, out)`), and what it
refuses; settings that nest, flagged and recorded flat."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

import babelprobe as bp
from babelprobe.errors import BabelprobeError
from babelprobe.runtime import Runtime, as_runtime, runner
from tests.tiny import tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    found = {}
    for arch in ("llama", "gemma3", "gpt2"):
        lm = tiny_lm(arch)
        lm.model.save_pretrained(root / arch)
        lm.tokenizer.save_pretrained(root / arch)
        found[arch] = root / arch
    return found


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_info_from_the_files_is_what_loading_gives_and_loads_no_weights(arch, model_dirs, monkeypatch):
    import babelprobe.models

    runtime = Runtime(model=str(model_dirs[arch]), device="cpu", model_dtype="float32")
    real = babelprobe.models.load_model
    monkeypatch.setattr(babelprobe.models, "load_model", lambda *a, **k: pytest.fail("info loaded the model"))
    info = runtime.info
    assert not runtime.loaded
    hf = AutoModelForCausalLM.from_pretrained(model_dirs[arch])  # HF's own reading of the same folder
    blocks = hf.transformer.h if arch == "gpt2" else hf.model.layers
    assert (info.n_layers, info.d_model) == (len(blocks), hf.config.get_text_config().hidden_size)
    monkeypatch.setattr(babelprobe.models, "load_model", real)
    assert info.fingerprint == runtime.lm.fingerprint  # the fingerprint stores and runs record
    assert runtime.loaded and runtime.lm is runtime.lm  # loaded once
    assert runtime.info is not None


def test_a_model_that_is_not_there_is_one_line_before_anything_loads(tmp_path):
    with pytest.raises(BabelprobeError, match="unknown model spec"):
        _ = Runtime(model=str(tmp_path / "nowhere")).lm
    (tmp_path / "empty").mkdir()
    with pytest.raises(BabelprobeError, match="has no config.json"):
        _ = Runtime(model=str(tmp_path / "empty")).lm


@pytest.mark.parametrize("values, message", [
    ({"batch_tokens": 0}, "--batch-tokens must be at least 1"),
    ({"device": "cpu", "device_map": "auto"}, "either --device or --device-map"),
    ({"max_memory": "0=1GiB"}, "--max-memory and --offload-folder need --device-map"),
    ({"model_dtype": "int8"}, "--model-dtype: unknown value"),
])
def test_runtime_options_are_checked_when_made(values, message):
    with pytest.raises(BabelprobeError, match=message):
        Runtime(**values)


def test_a_runtime_and_its_options_both_is_an_error():
    assert as_runtime(model="default", progress=False).progress is False
    assert as_runtime(load_options={"dtype": "float32", "device": "cpu"}).model_dtype == "float32"
    with pytest.raises(BabelprobeError, match="not both"):
        as_runtime(Runtime(), progress=False)
    with pytest.raises(BabelprobeError, match="unknown runtime option 'speed'"):
        as_runtime(speed=2)


def test_replace_keeps_the_loaded_model_unless_the_loading_changes(tiny):
    runtime = Runtime(model=tiny)
    assert runtime.replace(progress=False).lm is tiny
    spec = Runtime(model="default")
    spec.__dict__["lm"] = tiny  # as if loaded
    assert spec.replace(batch_tokens=64).__dict__["lm"] is tiny
    assert "lm" not in spec.replace(device="cpu").__dict__


# --------------------------------------------------------------------------------------- the runner door

from babelprobe.neurons.settings import Settings as NeuronSettings  # noqa: E402


@runner(NeuronSettings, old=("model", "items", "out"), batch_tokens=8192)
def echo(items=None, out=None, settings=None, runtime=None, *, extra=None):
    """A runner that returns what its door gave it."""
    return items, out, settings, runtime, extra


def test_the_canonical_form_keywords_and_the_old_form_are_one_call(tiny):
    settings = NeuronSettings(top_rate=(0.02,))
    runtime = Runtime(model=tiny, progress=False)
    canonical = echo("xcomps-sample", "neu/", settings, runtime, extra=1)
    assert canonical == ("xcomps-sample", "neu/", settings, runtime, 1)
    by_keywords = echo("xcomps-sample", "neu/", top_rate=0.02, model=tiny, progress=False, extra=1)
    assert by_keywords[2] == settings and by_keywords[3].lm is tiny and not by_keywords[3].progress
    assert by_keywords[3].batch_tokens == 8192  # the runner's own default, for a runtime made of keywords
    old = echo(tiny, "xcomps-sample", "neu/", top_rate=0.02, progress=False)
    assert old[:3] == ("xcomps-sample", "neu/", settings) and old[3].lm is tiny
    old_spec = echo("default", "xcomps-sample", "neu/", load_options={"device": "cpu"})
    assert old_spec[3].model == "default" and old_spec[3].device == "cpu" and old_spec[0] == "xcomps-sample"


@runner(NeuronSettings, old=("model", "items", "out", "settings"))
def echo_with_settings(items=None, out=None, settings=None, runtime=None):
    return items, out, settings, runtime


def test_the_old_form_keeps_a_positional_settings_and_refuses_more(tiny):
    settings = NeuronSettings(top_rate=(0.02,))
    items, out, got, runtime = echo_with_settings(tiny, "xcomps-sample", "neu/", settings)
    assert (items, out, got, runtime.lm) == ("xcomps-sample", "neu/", settings, tiny)
    with pytest.raises(TypeError, match="5 positional arguments"):
        echo_with_settings(tiny, "xcomps-sample", "neu/", settings, "one too many")


def test_the_door_refuses_what_would_be_dropped(tiny):
    with pytest.raises(BabelprobeError, match="settings or keyword values, not both"):
        echo("x", "o", NeuronSettings(), top_rate=0.5)
    with pytest.raises(BabelprobeError, match="runtime or its options, not both"):
        echo("x", "o", None, Runtime(), progress=False)
    with pytest.raises(BabelprobeError, match="unknown setting 'folds'"):
        echo("x", "o", folds=3)


def test_a_real_runner_through_each_door_writes_the_same_run(tiny, tmp_path):
    items = bp.load_items("xcomps-sample", languages=["en", "de"], limit=1)
    new = bp.language_neurons(items, tmp_path / "new", NeuronSettings(), Runtime(model=tiny, progress=False,
                                                                                 figures=False), min_tokens=1)
    old = bp.language_neurons(tiny, items, tmp_path / "old", min_tokens=1, progress=False, figures=False)
    assert (new.stats.over_zero == old.stats.over_zero).all()
    assert not (tmp_path / "new" / "figures").exists()
    record = json.loads((tmp_path / "new" / "neurons.json").read_text())
    assert "batch_tokens" not in json.dumps(record) and "progress" not in json.dumps(record)  # runtime: no record


# ----------------------------------------------------------------------------------------- nested settings

def test_nested_settings_are_given_read_and_recorded_flat():
    from babelprobe.comparison import CompareSettings
    from babelprobe.probes.settings import ProbeSettings
    from babelprobe.settings import from_record, settings_for, settings_record

    settings = settings_for(CompareSettings, "paper", reduction="mean", seed=3)
    assert settings.probe == ProbeSettings(protocol="paper", folds=5, fold_scheme="plain", seed=3)
    assert settings.meta.reduction == settings.direct.reduction == "mean"  # one flag, both steps
    assert (settings.folds, settings.fold_scheme, settings.reduction) == (5, "plain", "mean")
    record = settings_record(settings)
    assert record == {"protocol": "paper", "folds": 5, "fold_scheme": "plain", "seed": 3, "pool": "last",
                      "rule": "sum", "reduction": "mean", "prompts": "xcomps", "conditional": False, "layers": "peak"}
    assert from_record(CompareSettings, record) == settings
    assert settings.stage("neuro") == {"protocol": "paper", "folds": 5, "fold_scheme": "plain", "seed": 3,
                                       "pool": "last"}
    with pytest.raises(BabelprobeError, match="--protocol paper runs --fold-scheme plain"):
        settings_for(CompareSettings, "paper", fold_scheme="grouped")


def test_the_patch_protocols_share_one_block():
    from babelprobe.patching.settings import PairsSettings, Shared, TranslationSettings
    from babelprobe.settings import given

    pairs, translation = given(PairsSettings, None, {"layers": "1-2", "seed": 4}), given(TranslationSettings, None,
                                                                                          {"layers": "1-2", "seed": 4})
    assert pairs.shared == translation.shared == Shared(layers="1-2", seed=4)
    with pytest.raises(BabelprobeError, match="--n-boot must be at least 0"):
        given(PairsSettings, None, {"n_boot": -1})
