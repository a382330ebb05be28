"""Two CPU processes under torchrun (gloo) write one store that equals a single-process run."""

import json
import subprocess
import sys

from babelprobe.extract import open_store, verify_store
from tests.test_extract import save_tiny_model, write_items_file
from tests.test_extract_faults import cli_env, extract_cmd
from tests.tiny import CORPUS


def test_two_ranks_write_the_same_store_as_one_process(tmp_path):
    model = save_tiny_model(tmp_path / "model")
    # 12 distinct texts, each recurring in later shards than its first (shards of 4, the ranks taking turns)
    items = write_items_file(tmp_path / "items.jsonl", [f"{CORPUS[i % 4]} {i % 6}" for i in range(30)])
    single = subprocess.run(extract_cmd(model, items, tmp_path / "one", "--shard-size", "4"), env=cli_env(),
                            capture_output=True, text=True)
    assert single.returncode == 0, single.stderr
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    two = subprocess.run([*launcher, *extract_cmd(model, items, tmp_path / "two", "--shard-size", "4")[1:]],
                         env=cli_env(), capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("store ") == 1  # only rank 0 reports
    one_manifest = json.loads((tmp_path / "one" / "manifest.json").read_text())
    two_manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert two_manifest["world_size"] == 2 and two_manifest["complete"]
    assert two_manifest["shards"] == one_manifest["shards"]  # identical array and key checksums
    assert two_manifest["stored_rows"] == 12  # a text stored once, whichever rank's shard holds it
    assert verify_store(tmp_path / "two") == []
    assert open_store(tmp_path / "two").keys["item_id"].tolist() == open_store(tmp_path / "one").keys["item_id"].tolist()


def test_two_ranks_each_with_a_model_dispatched_over_cpu_and_disk(tmp_path):
    """Replicas of a dispatched model: each rank loads the model spread over CPU memory and disk (its own
    offload folder) and writes its own shards; the store equals a single process on one device."""
    model = save_tiny_model(tmp_path / "model")
    items = write_items_file(tmp_path / "items.jsonl", [f"{CORPUS[i % len(CORPUS)]} {i}" for i in range(16)])
    single = subprocess.run(extract_cmd(model, items, tmp_path / "one", "--shard-size", "4", "--device", "cpu"),
                            env=cli_env(), capture_output=True, text=True)
    assert single.returncode == 0, single.stderr
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    two = subprocess.run([*launcher, *extract_cmd(model, items, tmp_path / "two", "--shard-size", "4", "--device-map",
                                                  "auto", "--max-memory", "cpu=150KB")[1:]],
                         env=cli_env(), capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    two_manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert two_manifest["world_size"] == 2 and "disk" in two_manifest["model"]["device_map"].values()
    assert two_manifest["shards"] == json.loads((tmp_path / "one" / "manifest.json").read_text())["shards"]
