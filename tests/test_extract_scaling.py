"""Scaling out extraction, on CPU: a model dispatched by accelerate over CPU and disk (blocks whose weights
live on disk and are loaded inside their forward) extracts the same store as the model on one device and
as HF's own forward; the background writer overlaps writing with the next shard's forward and hands its
errors back; the nnsight trace that NDIF would run (serialised and run through nnsight's local
simulation of the remote path) stores the same values; replica placement; scoring with --device-map.

No GPU here: the CUDA parts (pinned non-blocking copies, several GPUs per replica) are not exercised."""

import json
import threading

import numpy as np
import pandas as pd
import pytest
import torch

from babelprobe.cli import main
from babelprobe.errors import BabelprobeError
from babelprobe.extract import extract, open_store, verify_store
from babelprobe.extract.distributed import replica_gpus, replica_max_memory
from babelprobe.extract.store import StoreWriter
from babelprobe.models import load_model, parse_max_memory
from tests.test_extract import assert_close_rel, corpus_items, hf_reference, save_tiny_model, write_items_file
from tests.tiny import CORPUS, tiny_lm

# blocks 2 and 3 and the head on disk, the rest in CPU memory (accelerate's hooks load disk weights on use)
CPU_AND_DISK = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                "model.layers.2": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def shards(out):
    return json.loads((out / "manifest.json").read_text())["shards"]


def test_dispatched_over_cpu_and_disk_equals_the_model_on_one_device(tmp_path, model_dir):
    items = corpus_items()
    plain = load_model(str(model_dir), device="cpu")
    dispatched = load_model(str(model_dir), device_map=CPU_AND_DISK)
    # really dispatched: the disk blocks hold no weights until their forward, and inputs go to the embeddings' device
    assert dispatched.device == torch.device("cpu") and dispatched.device_map == CPU_AND_DISK
    assert dispatched.parts.layers[1].self_attn.q_proj.weight.device.type == "meta"
    assert dispatched.parts.layers[1]._hf_hook is not None
    extract(plain, items, tmp_path / "plain", pool="both", shard_size=7, batch_tokens=64, progress=False)
    for backend in ("hf", "nnsight"):
        out = tmp_path / backend
        extract(dispatched, items, out, pool="both", shard_size=7, batch_tokens=64, backend=backend, progress=False)
        assert shards(out) == shards(tmp_path / "plain")  # identical array and key checksums
        assert open_store(out).manifest["model"]["device_map"] == CPU_AND_DISK
    # and against HF's own forward of the undispatched model, one text at a time
    store = open_store(tmp_path / "hf")
    for row in (0, 11, 19):
        ref_last, ref_mean = hf_reference(plain, items["text"][row])
        assert_close_rel(store.read_layers(rows=[row], pool="last")[0], ref_last, 1e-5, "dispatched last")
        assert_close_rel(store.read_layers(rows=[row], pool="mean")[0], ref_mean, 1e-5, "dispatched mean")
    assert verify_store(tmp_path / "hf") == []


def test_cli_device_map_auto_with_max_memory_and_a_json_map(tmp_path, model_dir, capsys):
    items = write_items_file(tmp_path / "items.jsonl")
    base = ["extract", "--model", str(model_dir), "--items", str(items), "--pool", "both", "--shard-size", "8",
            "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "plain"), "--device", "cpu"]) == 0
    (tmp_path / "map.json").write_text(json.dumps(CPU_AND_DISK))
    assert main([*base, "--out", str(tmp_path / "json"), "--device-map", str(tmp_path / "map.json")]) == 0
    # 150 kB of CPU memory: the rest is offloaded to disk
    assert main([*base, "--out", str(tmp_path / "auto"), "--device-map", "auto", "--max-memory", "cpu=150KB"]) == 0
    assert "compute-busy fraction" in capsys.readouterr().out
    auto_map = open_store(tmp_path / "auto").manifest["model"]["device_map"]
    assert "disk" in auto_map.values()
    assert shards(tmp_path / "json") == shards(tmp_path / "plain") == shards(tmp_path / "auto")
    assert main([*base, "--out", str(tmp_path / "x"), "--device-map", "everywhere"]) == 2
    assert "unknown --device-map 'everywhere'" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "x"), "--max-memory", "cpu=1GB"]) == 2
    assert "need --device-map" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "x"), "--device-map", "auto", "--max-memory", "lots"]) == 2
    assert "DEVICE=SIZE" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "x"), "--gpus-per-replica", "2"]) == 2
    assert "--gpus-per-replica needs --device-map" in capsys.readouterr().err


def test_scoring_accepts_a_device_map(tmp_path, model_dir, tiny_long_dir):
    items = write_items_file(tmp_path / "items.jsonl")
    (tmp_path / "map.json").write_text(json.dumps(CPU_AND_DISK))
    base = ["score", "direct", "--model", str(model_dir), "--items", str(items), "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "plain.csv"), "--device", "cpu"]) == 0
    assert main([*base, "--out", str(tmp_path / "dispatched.csv"), "--device-map", str(tmp_path / "map.json")]) == 0
    plain, dispatched = pd.read_csv(tmp_path / "plain.csv"), pd.read_csv(tmp_path / "dispatched.csv")
    np.testing.assert_allclose(dispatched["score_good"], plain["score_good"], rtol=1e-6)
    np.testing.assert_allclose(dispatched["score_bad"], plain["score_bad"], rtol=1e-6)
    meta = ["score", "meta", "--model", str(tiny_long_dir), "--items", "xcomps-sample", "--languages", "en",
            "--limit", "2", "--no-progress"]
    assert main([*meta, "--out", str(tmp_path / "meta.csv"), "--device", "cpu"]) == 0
    assert main([*meta, "--out", str(tmp_path / "meta-d.csv"), "--device-map", "auto", "--max-memory", "cpu=150KB"]) == 0
    a, b = pd.read_csv(tmp_path / "meta.csv"), pd.read_csv(tmp_path / "meta-d.csv")
    np.testing.assert_allclose(b["score_good"], a["score_good"], rtol=1e-5)


def test_max_memory_grammar():
    assert parse_max_memory("0=20GiB, 1=20GiB,cpu=60GiB") == {0: "20GiB", 1: "20GiB", "cpu": "60GiB"}
    assert parse_max_memory({"cuda:1": "1GB", "disk": "1TB"}) == {1: "1GB", "disk": "1TB"}
    with pytest.raises(BabelprobeError, match="unknown device 'tpu'"):
        parse_max_memory("tpu=1GB")


def test_replicas_take_consecutive_gpus_and_only_theirs():
    assert replica_gpus(2, local_rank=0, n_gpus=8) == [0, 1]
    assert replica_gpus(2, local_rank=3, n_gpus=8) == [6, 7]
    with pytest.raises(BabelprobeError, match="local rank 4 needs GPUs 8..9 but this node has 8; launch 4"):
        replica_gpus(2, local_rank=4, n_gpus=8)
    free = {6: 80 << 30, 7: 70 << 30}.__getitem__
    # indices of --max-memory are within the replica: 0 is the replica's first GPU (here GPU 6)
    assert replica_max_memory([6, 7], {0: "40GiB", "cpu": "100GiB"}, free) == {6: "40GiB", 7: int(0.9 * (70 << 30)),
                                                                             "cpu": "100GiB"}
    with pytest.raises(BabelprobeError, match="names GPU 2"):
        replica_max_memory([6, 7], {2: "1GiB"}, free)


def test_background_writer_overlaps_the_next_shards_forward(tmp_path, monkeypatch):
    """The write of shard 0 waits until the model has run a batch of shard 1: that can only happen if the
    forward passes go on while a shard is being written (on one thread this would wait forever; the
    timeout turns that into a failure)."""
    from babelprobe.extract import backends

    lm, items = tiny_lm("llama"), corpus_items()
    forwards, next_shard_ran = [], threading.Event()
    real_run, real_write = backends.HFBackend.run, StoreWriter.write_shard

    def counting_run(self, batch, pooler):
        forwards.append(batch["input_ids"].shape[0])
        if sum(forwards) > 10:  # a batch of the second shard (shard size 10)
            next_shard_ran.set()
        return real_run(self, batch, pooler)

    def slow_write(self, index, keys, arrays, **options):
        if index == 0:
            assert next_shard_ran.wait(timeout=120), "no forward pass ran while shard 0 was being written"
        return real_write(self, index, keys, arrays, **options)

    monkeypatch.setattr(backends.HFBackend, "run", counting_run)
    monkeypatch.setattr(StoreWriter, "write_shard", slow_write)
    report = extract(lm, items, tmp_path / "s", pool="both", shard_size=10, batch_tokens=16, progress=False)
    assert report.shards_written == 2 and verify_store(tmp_path / "s") == []
    monkeypatch.setattr(StoreWriter, "write_shard", real_write)
    extract(lm, items, tmp_path / "sync", pool="both", shard_size=10, batch_tokens=16, progress=False)
    assert shards(tmp_path / "s") == shards(tmp_path / "sync")
    assert 0 < report.forward_seconds <= report.seconds and 0 < report.busy_fraction <= 1
    assert "compute-busy fraction" in report.summary()


def test_writer_errors_come_back_to_the_caller_and_nothing_partial_stays(tmp_path, monkeypatch):
    lm, items = tiny_lm("llama"), corpus_items()
    real_write = StoreWriter.write_shard

    def failing_write(self, index, keys, arrays, **options):
        if index == 1:
            raise BabelprobeError("cannot write shard 1 (simulated)")
        return real_write(self, index, keys, arrays, **options)

    monkeypatch.setattr(StoreWriter, "write_shard", failing_write)
    with pytest.raises(BabelprobeError, match=r"cannot write shard 1 \(simulated\)"):
        extract(lm, items, tmp_path / "s", shard_size=4, batch_tokens=16, progress=False)
    on_disk = sorted(p.name for p in (tmp_path / "s").iterdir() if p.name not in ("manifest.json", ".babelprobe.lock"))
    # shard 0 came before the error; a shard being written beside shard 1 (background.WRITERS) is whole
    assert on_disk[0] == "shard-00000.h5" and "shard-00001.h5" not in on_disk
    assert all(name.startswith("shard-") and name.endswith(".h5") for name in on_disk)  # no temporary left
    assert [r["name"] for r in shards(tmp_path / "s")] == on_disk
    assert not any(t.name.startswith("babelprobe-shard-write") and t.is_alive() for t in threading.enumerate())
    monkeypatch.setattr(StoreWriter, "write_shard", real_write)
    report = extract(lm, items, tmp_path / "s", shard_size=4, batch_tokens=16, progress=False)
    assert (report.shards_written, report.shards_skipped) == (5 - len(on_disk), len(on_disk))
    assert verify_store(tmp_path / "s") == []


def test_an_interrupted_loop_stops_the_writer_without_a_partial_shard(tmp_path, monkeypatch):
    from babelprobe.extract import backends

    lm, items = tiny_lm("llama"), corpus_items()
    real_run, calls = backends.HFBackend.run, []

    def interrupted(self, batch, pooler):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real_run(self, batch, pooler)

    monkeypatch.setattr(backends.HFBackend, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        extract(lm, items, tmp_path / "s", shard_size=4, batch_tokens=8, progress=False)
    assert not any(t.name.startswith("babelprobe-shard-write") and t.is_alive() for t in threading.enumerate())
    assert not list((tmp_path / "s").glob(".shard-*"))
    for record in shards(tmp_path / "s"):
        assert (tmp_path / "s" / record["name"]).exists()


def test_the_remote_trace_stores_what_hf_stores(tmp_path):
    """`remote="local"` is nnsight's own dry run of the remote path: the trace body is serialised as for
    NDIF, deserialised with local modules hidden (as on the server) and run here. NDIF itself is not
    reachable offline; this is the same code path up to the network."""
    lm, items = tiny_lm("gemma3"), corpus_items()
    extract(lm, items, tmp_path / "hf", pool="both", shard_size=7, progress=False)
    extract(lm, items, tmp_path / "remote", pool="both", shard_size=7, backend="nnsight", remote="local",
            progress=False)
    assert shards(tmp_path / "remote") == shards(tmp_path / "hf")
    assert open_store(tmp_path / "remote").manifest["backend"]["remote"] == "local"
    ref_last, ref_mean = hf_reference(lm, items["text"][4])
    assert_close_rel(open_store(tmp_path / "remote").read_layers(rows=[4], pool="mean")[0], ref_mean, 1e-5, "mean")


def test_remote_needs_nnsight_a_remote_model_and_a_key(tmp_path, monkeypatch, model_dir, capsys):
    lm, items = tiny_lm("llama"), corpus_items()[:4]
    with pytest.raises(BabelprobeError, match="only with --backend nnsight"):
        extract(lm, items, tmp_path / "a", remote=True, progress=False)
    with pytest.raises(BabelprobeError, match="needs a remote model"):
        extract(lm, items, tmp_path / "b", backend="nnsight", remote=True, progress=False)
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    lm.remote = "org/name"  # as load_remote_model marks it
    with pytest.raises(BabelprobeError, match="NDIF_API_KEY"):
        extract(lm, items, tmp_path / "c", backend="nnsight", progress=False)
    items_file = write_items_file(tmp_path / "items.jsonl", CORPUS[:4])
    args = ["extract", "--model", str(model_dir), "--items", str(items_file), "--out", str(tmp_path / "d"), "--remote"]
    assert main(args) == 2 and "add --backend nnsight" in capsys.readouterr().err
    assert main([*args, "--backend", "nnsight"]) == 2
    assert "a remote model must be a hub id" in capsys.readouterr().err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main([*args[:2], "nobody/no-such-model", *args[3:], "--backend", "nnsight"]) == 2
    assert "cannot download model 'nobody/no-such-model'" in capsys.readouterr().err


def test_a_store_made_with_language_reloads_its_items(tmp_path, model_dir):
    """Items without a language field, given one by --language: the store records it and reloads them."""
    rows = corpus_items(CORPUS[:6]).drop(columns=["language"])
    rows.to_json(tmp_path / "items.jsonl", orient="records", lines=True, force_ascii=False)
    out = tmp_path / "acts"
    assert main(["extract", "--model", str(model_dir), "--items", str(tmp_path / "items.jsonl"), "--language", "de",
                 "--out", str(out), "--no-progress"]) == 0
    store = open_store(out)
    assert store.manifest["items"]["language"] == "de"
    assert store.load_items()["language"].tolist() == ["de"] * 6
