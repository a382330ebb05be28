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


def test_a_runtime_where_the_older_form_had_its_model_is_the_runtime(tiny):
    """The older forms took a runtime (or the benchmarks' `Models`) as their model, with options beside it that
    replaced its own: the door keeps that, without changing the caller's runtime."""
    from babelprobe.benchmarks.base import Models

    given_ = Runtime(model=tiny, batch_tokens=64)
    runtime = echo(given_, "xcomps-sample", "neu/", progress=False)[3]
    assert (runtime.lm, runtime.batch_tokens, runtime.progress, given_.progress) == (tiny, 64, False, True)
    models = Models(tiny)
    held = echo(models, "xcomps-sample", "neu/", progress=False)[3]
    assert held.runtime.progress is False and models.runtime.progress is True and held.lm is tiny
    with pytest.raises(BabelprobeError, match="not both"):
        echo(given_, "xcomps-sample", "neu/", load_options={"device": "cpu"})


def test_a_loaded_model_where_the_runtime_goes_is_the_runtimes_model(tiny):
    """`runner(items, out, settings, lm)`: the model loaded already stands for its runtime (options beside it
    and the runner's defaults as for a runtime made of keywords); anything else there is a one-line error."""
    settings = NeuronSettings(top_rate=(0.02,))
    runtime = echo("xcomps-sample", "neu/", settings, tiny, progress=False)[3]
    assert isinstance(runtime, Runtime) and runtime.lm is tiny and not runtime.progress
    assert runtime.batch_tokens == 8192
    with pytest.raises(BabelprobeError, match="expected a babelprobe Runtime or a loaded model, got str 'default'"):
        echo("xcomps-sample", "neu/", settings, "default")
    with pytest.raises(BabelprobeError, match="pass one of them"):
        echo("xcomps-sample", "neu/", settings, tiny, model="default")


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
                      "rule": "sum", "reduction": "mean", "prompts": "xcomps", "conditional": False, "layers": "peak",
                      "store_dtype": None}
    assert from_record(CompareSettings, record) == settings
    older = {k: v for k, v in record.items() if k != "store_dtype"}  # compare.json before --store-dtype
    assert from_record(CompareSettings, older) == settings
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


# --------------------------------------------------------------------- every runner through its doors

def _store(seed: int = 0):
    """An in-memory store of 12 pairs in two languages, 3 layers: label-1 items shifted along one axis."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    keys = pd.DataFrame([{"item_id": f"{lang}{i}-{label}", "pair_id": f"{lang}{i}", "language": lang, "subset": "s",
                          "label": label} for lang in ("en", "de") for i in range(12) for label in (1, 0)])
    values = rng.normal(size=(len(keys), 3, 8)).astype("float32")
    values[keys["label"].to_numpy() == 1, :, 0] += 1.5
    return bp.ArrayStore(keys, last=values)


def test_probe_canonical_keywords_and_old_form_are_one_sweep(tmp_path):
    from babelprobe.probes.settings import ProbeSettings

    store, settings = _store(), ProbeSettings(folds=2, n_boot=0)
    old = bp.probe(store, settings)
    canonical = bp.probe(store, tmp_path / "neuro.csv", settings, Runtime(progress=False))
    by_keywords = bp.probe(store, folds=2, n_boot=0)
    for result in (canonical, by_keywords):
        assert result.table[["language", "layer", "f1_mean"]].equals(old.table[["language", "layer", "f1_mean"]])
    written = bp.ProbeResult.read(tmp_path / "neuro.csv")  # `out` given: written as `ProbeResult.write` writes
    assert written.table["f1_mean"].tolist() == pytest.approx(old.table["f1_mean"].tolist())
    with pytest.raises(BabelprobeError, match="unknown table format"):
        bp.probe(store, tmp_path / "neuro.txt", settings)


def test_score_pairs_canonical_and_old_form_and_what_they_refuse(tiny, tmp_path):
    from babelprobe.benchmarks.scoring import DirectSettings, score_pairs

    items = bp.load_items("xcomps-sample", languages=["en"], limit=2)
    old = score_pairs("direct", tiny, items, tmp_path / "old.csv", DirectSettings(), batch_tokens=64, progress=False)
    canonical = score_pairs(items, tmp_path / "new.csv", DirectSettings(), Runtime(model=tiny, batch_tokens=64,
                                                                                  progress=False))
    assert canonical[["pair_id", "score_good", "score_bad"]].equals(old[["pair_id", "score_good", "score_bad"]])
    meta = score_pairs(items, tmp_path / "meta.csv", method="meta", model=tiny, progress=False)
    assert set(meta["method"]) == {"meta"}
    with pytest.raises(BabelprobeError, match="the settings are direct's"):
        score_pairs(items, tmp_path / "x.csv", DirectSettings(), method="meta", model=tiny)
    with pytest.raises(BabelprobeError, match="needs its settings"):
        score_pairs(items, tmp_path / "x.csv", model=tiny)
    with pytest.raises(BabelprobeError, match="DirectSettings or MetaSettings, not ProbeSettings"):
        score_pairs(items, tmp_path / "x.csv", bp.ProbeSettings(), model=tiny)


def test_run_benchmark_canonical_and_old_form_write_the_same_run(tiny_long, tmp_path):
    from babelprobe.benchmarks import stingray
    from babelprobe.benchmarks.bridges import Settings as BridgeSettings

    old = bp.run_benchmark("stingray", tiny_long, "stingray-sample", tmp_path / "old", limit=1, progress=False,
                           figures=False)
    runtime = Runtime(model=tiny_long, progress=False, figures=False)
    new = bp.run_benchmark("stingray-sample", tmp_path / "new", stingray.Settings(), runtime, limit=1)
    assert new.identity == old.identity  # the benchmark named by its settings' class
    assert new.rows.drop(columns=["model"]).equals(old.rows.drop(columns=["model"]))
    assert not new.figures and not (tmp_path / "new" / "stingray.png").exists()
    with pytest.raises(BabelprobeError, match="give name="):  # the bridges share one settings class
        bp.run_benchmark("xnli-sample", tmp_path / "x", BridgeSettings(), runtime)


def test_sweep_canonical_and_old_form_plan_the_same_jobs(tmp_path, monkeypatch):
    import babelprobe.jobs

    planned, real = [], babelprobe.jobs.plan
    monkeypatch.setattr(babelprobe.jobs, "plan", lambda *a, **k: planned.append(k["extract_options"]) or real(*a, **k))
    placement = {"batch_tokens": 8192, "device": "cpu", "model_dtype": None, "device_map": None, "max_memory": None,
                 "shard_size": None}  # what `babelprobe sweep --device cpu` gave before the runtime
    old = bp.sweep(["default"], ["xcomps-sample"], tmp_path / "old", limit=1, dry_run=True, folds=2,
                   placement=placement)
    new = bp.sweep(["xcomps-sample"], tmp_path / "new", runtime=Runtime(device="cpu", batch_tokens=8192), limit=1,
                   dry_run=True, folds=2)
    assert new.planned == old.planned and new.jobs == old.jobs > 1
    assert planned[0] == planned[1]  # each job's placement, part of its spec (another one redoes the job)


@pytest.fixture(scope="module")
def two_compares(tmp_path_factory):
    from tests.tiny import tiny_lm

    root = tmp_path_factory.mktemp("compares")
    items = bp.load_items("xcomps-sample", languages=["en", "de"], limit=3)
    for name, seed in (("base", 0), ("other", 1)):
        bp.compare(items, root / name, folds=2, model=tiny_lm("llama", seed=seed), progress=False)
    return root / "base", root / "other"


def test_diff_and_write_report_through_their_doors(two_compares, tmp_path):
    from babelprobe.analysis.report import ReportSettings

    base, other = two_compares
    old = bp.diff(base, other)
    new = bp.diff(base, tmp_path / "diff", other=other)
    assert new.equals(old) and (tmp_path / "diff" / "difference.csv").exists()
    by_keywords = bp.write_report(base, tmp_path / "r1", n_boot=20, x="relative_depth")
    canonical = bp.write_report(base, tmp_path / "r2", ReportSettings(n_boot=20, x="relative_depth"))
    assert set(by_keywords.figures) == set(canonical.figures) and set(by_keywords.tables) == set(canonical.tables)
    for name in canonical.tables:
        assert (tmp_path / "r1" / f"{name}.csv").read_bytes() == (tmp_path / "r2" / f"{name}.csv").read_bytes()
    with pytest.raises(BabelprobeError, match="--x: unknown value 'depth'"):
        bp.write_report(base, tmp_path / "r3", x="depth")
