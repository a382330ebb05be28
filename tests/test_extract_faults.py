"""Faults and bad input for `babelprobe extract` (SIGKILL and resume: tests/test_kill.py): full disk, read-only or missing
output directory, empty item set, too long text, two writers. Each: one-line error, exit != 0, nothing
complete lost, nothing partial under a final name."""

import errno
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from babelprobe.cli import main
from babelprobe.errors import BabelprobeError
from babelprobe.extract import extract, open_store, verify_store
from babelprobe.extract.store import StoreWriter, store_lock
from tests.test_extract import corpus_items, save_tiny_model, write_items_file
from tests.tiny import CORPUS, tiny_lm


def cli_env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def extract_cmd(model, items, out, *extra):
    return [sys.executable, "-m", "babelprobe", "extract", "--model", str(model), "--items", str(items),
            "--out", str(out), "--pool", "both", "--no-progress", *extra]


def error_lines(capsys):
    """Our error lines on stderr (transformers may draw a weight-loading bar there too)."""
    return [line for line in capsys.readouterr().err.splitlines() if "error" in line]


def shard_records(out):
    return json.loads((out / "manifest.json").read_text())["shards"]


def assert_no_partial_under_final_names(out):
    """Every file under a final shard name opens and matches the checksum written into it."""
    import hashlib

    for file in out.glob("shard-*.h5"):
        with h5py.File(file, "r") as f:
            for pool in ("last", "mean"):
                if pool not in f:
                    continue
                digest = hashlib.sha256(np.ascontiguousarray(f[pool][()]).data).hexdigest()
                assert digest == f[pool].attrs["sha256"], file


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def test_full_disk_keeps_complete_shards_and_leaves_nothing_partial(tmp_path, model_dir, monkeypatch, capsys):
    items = write_items_file(tmp_path / "items.jsonl")
    out = tmp_path / "acts"
    real = StoreWriter._write_hdf5

    def disk_fills_at_shard_2(self, tmp, index, *args):
        if index == 2:
            tmp.write_bytes(b"half a shard")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, tmp, index, *args)

    monkeypatch.setattr(StoreWriter, "_write_hdf5", disk_fills_at_shard_2)
    args = ["extract", "--model", str(model_dir), "--items", str(items), "--out", str(out), "--shard-size", "5",
            "--no-progress"]
    assert main(args) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "No space left on device" in err[0] and "shard-00002.h5" in err[0]
    shards = sorted(p.name for p in out.iterdir() if p.name.startswith("shard-"))
    # shards 0 and 1 came before; shard 3, when it was being written beside shard 2 (background.WRITERS), is whole
    assert shards in (["shard-00000.h5", "shard-00001.h5"], ["shard-00000.h5", "shard-00001.h5", "shard-00003.h5"])
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".babelprobe")) == ["manifest.json", *shards]
    assert [r["name"] for r in shard_records(out)] == shards
    assert_no_partial_under_final_names(out)
    monkeypatch.setattr(StoreWriter, "_write_hdf5", real)
    assert main(args) == 0
    assert f"{4 - len(shards)} written, {len(shards)} already complete" in capsys.readouterr().out
    assert verify_store(out) == []


def test_output_directory_missing_is_created_unwritable_is_an_error(tmp_path, model_dir, monkeypatch, capsys):
    items = write_items_file(tmp_path / "items.jsonl", CORPUS[:4])
    deep = tmp_path / "a" / "b" / "acts"
    assert main(["extract", "--model", str(model_dir), "--items", str(items), "--out", str(deep), "--no-progress"]) == 0
    assert verify_store(deep) == []
    (tmp_path / "file.txt").write_text("x")
    for out in (tmp_path / "file.txt", tmp_path / "file.txt" / "acts"):
        assert main(["extract", "--model", str(model_dir), "--items", str(items), "--out", str(out)]) == 2
        assert "babelprobe: error:" in capsys.readouterr().err
    import babelprobe.extract.store as store_module

    # what a read-only directory reports: readable, not writable
    monkeypatch.setattr(store_module.os, "access", lambda path, mode, *a, **k: not mode & store_module.os.W_OK)
    assert main(["extract", "--model", str(model_dir), "--items", str(items), "--out", str(tmp_path / "ro")]) == 2
    assert "is not writable" in capsys.readouterr().err


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write read-only directories")
def test_read_only_directory_for_real(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        with pytest.raises(BabelprobeError, match="not writable"):
            extract(tiny_lm("llama"), corpus_items(), out, progress=False)
    finally:
        out.chmod(0o755)


def test_empty_item_set(tmp_path, model_dir, capsys):
    with pytest.raises(BabelprobeError, match="item set is empty"):
        extract(tiny_lm("llama"), corpus_items()[:0], tmp_path / "s", progress=False)
    assert not (tmp_path / "s").exists()
    items = write_items_file(tmp_path / "items.jsonl", CORPUS[:4])
    assert main(["extract", "--model", str(model_dir), "--items", str(items), "--languages", "de",
                 "--out", str(tmp_path / "t")]) == 2
    assert "language de not in the items" in capsys.readouterr().err


def test_text_longer_than_the_context(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "short", max_positions=16)
    texts = ["A dog can bark.", " ".join(CORPUS[:6])]
    items = write_items_file(tmp_path / "items.jsonl", texts)
    out = tmp_path / "acts"
    args = ["extract", "--model", str(model), "--items", str(items), "--out", str(out), "--no-progress"]
    assert main(args) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "item t01" in err[0] and "context of 16" in err[0]
    assert not (out / "manifest.json").exists()
    assert main([*args, "--truncate"]) == 0
    assert open_store(out).keys["n_tokens"].tolist()[1] == 16


def test_two_writers(tmp_path, model_dir, capsys):
    items = write_items_file(tmp_path / "items.jsonl", CORPUS[:6])
    out = tmp_path / "acts"
    args = ["extract", "--model", str(model_dir), "--items", str(items), "--out", str(out), "--no-progress"]
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from filelock import FileLock; "
                               f"lock = FileLock({str(out / '.babelprobe.lock')!r}); lock.acquire(); print('held', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(args) == 2
        assert "another process is writing the store" in capsys.readouterr().err
        assert not (out / "manifest.json").exists()
    finally:
        holder.kill()
        holder.wait()
    assert main(args) == 0  # the lock dies with its holder
    with store_lock(out):
        with pytest.raises(BabelprobeError, match="another process is writing"):
            extract(tiny_lm("llama"), corpus_items(CORPUS[:6]), out, progress=False)
    assert verify_store(out) == []


def test_a_store_the_disk_cannot_hold_is_refused_before_any_work(tmp_path, monkeypatch):
    import babelprobe.extract.store as store_module

    def writer(path, n_rows, **extra):
        return StoreWriter(path, n_rows=n_rows, layers=[0, 2, 3], d_model=8, n_layers=4, pools=("last", "mean"),
                           shard_size=5, **extra)

    def free_bytes(n):
        monkeypatch.setattr(store_module.shutil, "disk_usage", lambda path: SimpleNamespace(free=n))

    # the stored values: 12 rows x 3 layers x 8 x 2 pools x 2 bytes (bfloat16)
    need = 12 * 3 * 8 * 2 * 2
    free_bytes(need)
    assert writer(tmp_path / "fits", 12, dtype="bfloat16").prepare() == [0, 1, 2]
    free_bytes(need - 1)
    with pytest.raises(BabelprobeError, match=r"needs at least 1.15 kB \(12 row\(s\) x 3 layer\(s\) x 8 x "
                                              r"last\+mean in bfloat16\) and the disk has 1.15 kB free"):
        writer(tmp_path / "short", 12, dtype="bfloat16").prepare()
    assert not (tmp_path / "short" / "manifest.json").exists()
    assert writer(tmp_path / "gzip", 12, dtype="bfloat16", compression="gzip").prepare() == [0, 1, 2]


def test_an_overwrite_the_disk_cannot_hold_keeps_the_old_store(tmp_path, model_dir, monkeypatch, capsys):
    import babelprobe.extract.store as store_module

    out = tmp_path / "acts"
    small = write_items_file(tmp_path / "small.jsonl", CORPUS[:4])
    assert main(["extract", "--model", str(model_dir), "--items", str(small), "--out", str(out), "--no-progress"]) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}
    old_bytes = sum(len(v) for k, v in before.items() if k.startswith("shard-"))
    # the free space plus what the overwrite would free is one byte short of the new store's float32 values
    items = write_items_file(tmp_path / "items.jsonl")
    lm = tiny_lm()
    need = len(CORPUS) * (lm.n_layers + 1) * lm.d_model * 4
    free = need - old_bytes - 1
    monkeypatch.setattr(store_module.shutil, "disk_usage", lambda path: SimpleNamespace(free=free))
    args = ["extract", "--model", str(model_dir), "--items", str(items), "--out", str(out), "--no-progress"]
    assert main([*args, "--overwrite"]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "the store needs at least" in err[0] and "choose another --out" in err[0]
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()} == before
    assert verify_store(out) == []
    free += 1
    assert main([*args, "--overwrite"]) == 0
    assert verify_store(out) == [] and open_store(out).n_rows == len(CORPUS)


def test_extract_and_compare_refuse_a_store_the_disk_cannot_hold_before_the_model_loads(tmp_path, model_dir,
                                                                                          monkeypatch, capsys):
    import babelprobe.extract.store as store_module
    import babelprobe.models as models

    items = write_items_file(tmp_path / "items.jsonl")
    monkeypatch.setattr(store_module.shutil, "disk_usage", lambda path: SimpleNamespace(free=1000))
    monkeypatch.setattr(models, "load_model", lambda *args, **kwargs: pytest.fail("the model's weights loaded"))
    lm = tiny_lm()
    need = len(CORPUS) * (lm.n_layers + 1) * lm.d_model * 4  # every layer's last-token row in float32
    for command, store in ((["extract", "--out", str(tmp_path / "acts")], tmp_path / "acts"),
                           (["compare", "--out", str(tmp_path / "cmp")], tmp_path / "cmp" / "acts")):
        assert main([*command, "--model", str(model_dir), "--items", str(items), "--no-progress"]) == 2
        err = error_lines(capsys)
        assert len(err) == 1 and f"{store}: the store needs at least {need / 1e3:.3g} kB" in err[0], err
        assert not store.exists() or not any(store.iterdir())
