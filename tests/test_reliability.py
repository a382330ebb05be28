"""The fault and bad-input catalogue of docs/reliability.md: one test per row.

Each case goes through the real command line (`babelprobe.cli.main`, or a subprocess where a signal is
involved) with a tiny model saved to disk, and checks what the catalogue promises: one line
`babelprobe: error: ...` naming what is wrong and what to do, a non-zero exit status, no traceback,
nothing partial under a final name, earlier results untouched, and that the same command resumes an
interrupted run. The SIGKILL case is tests/test_kill.py.
"""

import errno
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

import babelprobe as bp
from babelprobe.cli import main
from babelprobe.extract.store import store_lock
from tests.cli_errors import fails, refused
from tests.test_extract import save_tiny_model
from tests.tiny import CORPUS


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A tiny model on disk and a small valid item file (en, de; 2 pairs per language × subset)."""
    root = tmp_path_factory.mktemp("catalogue")
    model = save_tiny_model(root / "tiny")
    items = root / "good.jsonl"
    bp.write_items(bp.load_items("xcomps-sample", languages=["en", "de"], limit=2), items)
    return root, model, items


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_records(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def run(argv: list) -> int:
    return main([str(a) for a in argv])


def direct(model, items, out, *extra):
    return ["score", "direct", "--model", model, "--items", items, "--out", out, "--no-progress", *extra]


def extract_args(model, items, out, *extra):
    return ["extract", "--model", model, "--items", items, "--out", out, "--no-progress", *extra]


def shard_digests(store: Path) -> list:
    manifest = json.loads((store / "manifest.json").read_text())
    return [(s["name"], s["sha256"], s["keys_sha256"]) for s in manifest["shards"]]


def final_files_are_whole(store: Path) -> None:
    """Every shard under its final name opens and matches the checksum written into it."""
    for file in store.glob("shard-*.h5"):
        with h5py.File(file, "r") as f:
            for pool in ("last", "mean"):
                if pool in f:
                    assert hashlib.sha256(np.ascontiguousarray(f[pool][()]).data).hexdigest() == f[pool].attrs["sha256"]


# ------------------------------------------------------------------------------------------- item files

def test_01_empty_item_file(work, capsys):
    root, model, _ = work
    (root / "empty.jsonl").write_text("")
    fails(direct(model, root / "empty.jsonl", root / "r1.csv"), capsys, "empty.jsonl", "the item file is empty")
    assert not (root / "r1.csv").exists()


def test_02_whitespace_only_text(work, capsys):
    root, model, items = work
    rows = records(items)
    rows[2]["text"] = " \t "
    bad = write_records(root / "ws.jsonl", rows)
    fails(direct(model, bad, root / "r2.csv"), capsys, "ws.jsonl:3", rows[2]["item_id"], "whitespace-only text")


def test_03_text_longer_than_the_model_context(work, capsys):
    root, model, items = work
    rows = records(items)
    rows[0]["text"] = " ".join(CORPUS * 10)
    long = write_records(root / "long.jsonl", rows)
    fails(direct(model, long, root / "r3.csv"), capsys, rows[0]["item_id"], "context of 128", "--truncate")
    assert not (root / "r3.csv").exists()
    assert run(direct(model, long, root / "r3.csv", "--truncate")) == 0
    assert pd.read_csv(root / "r3.csv")["truncated"].sum() == 1


def test_04_unknown_language_code(work, capsys):
    root, model, items = work
    rows = records(items)
    rows[5]["language"] = "english"
    bad = write_records(root / "lang.jsonl", rows)
    fails(direct(model, bad, root / "r4.csv"), capsys, "lang.jsonl:6", "unknown language code 'english'", "ISO 639-1")
    fails(direct(model, items, root / "r4.csv", "--languages", "xx"), capsys, "xx")


def test_05_missing_required_field(work, capsys):
    root, model, items = work
    rows = records(items)
    del rows[3]["pair_id"]
    bad = write_records(root / "missing.jsonl", rows)
    fails(direct(model, bad, root / "r5.csv"), capsys, "missing.jsonl:4", "missing field 'pair_id'")


def test_06_malformed_json_line_is_named(work, capsys):
    root, model, items = work
    lines = items.read_text(encoding="utf-8").splitlines()
    lines[6] = lines[6][:-7]
    bad = root / "malformed.jsonl"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fails(direct(model, bad, root / "r6.csv"), capsys, "malformed.jsonl:7", "malformed JSON")


def test_07_non_utf8_file(work, capsys):
    root, model, items = work
    bad = root / "latin1.jsonl"
    bad.write_bytes(items.read_bytes().replace(b"A dog", "Ä dög".encode("latin-1")))
    fails(direct(model, bad, root / "r7.csv"), capsys, "latin1.jsonl", "not UTF-8", "re-save it as UTF-8")


def test_08_duplicate_item_id(work, capsys):
    root, model, items = work
    rows = records(items)
    rows[7]["item_id"] = rows[1]["item_id"]
    bad = write_records(root / "dup.jsonl", rows)
    fails(direct(model, bad, root / "r8.csv"), capsys, f"duplicate item_id '{rows[1]['item_id']}'",
          "dup.jsonl:2", "dup.jsonl:8")


# ---------------------------------------------------------------------------------------------- probing

def random_store(path: Path, one_class_language: str | None = None, pairs: int = 10) -> Path:
    rng = np.random.default_rng(0)
    keys = pd.DataFrame([{"item_id": f"{lang}{p}-{label}", "pair_id": f"{lang}{p}", "language": lang,
                          "subset": "taxonomic", "label": 1 if lang == one_class_language else label, "n_tokens": 4}
                         for lang in ("en", "de") for p in range(pairs) for label in (1, 0)])
    bp.write_store(path, keys, last=rng.normal(size=(len(keys), 4, 8)).astype(np.float32))
    return path


def test_09_probe_group_with_one_class(work, capsys):
    root = work[0]
    store = random_store(root / "oneclass", one_class_language="de")
    fails(["probe", "--acts", store, "--out", root / "p9.csv", "--no-progress"], capsys,
          "language=de", "only label 1", "acceptable (1) and unacceptable (0)")
    assert not (root / "p9.csv").exists()


def test_10_fewer_pairs_than_folds(work, capsys):
    root = work[0]
    store = random_store(root / "fewpairs", pairs=3)
    fails(["probe", "--acts", store, "--out", root / "p10.csv", "--no-progress"], capsys,
          "has 3 pairs, fewer than --folds 5", "use fewer folds")
    assert run(["probe", "--acts", store, "--out", root / "p10.csv", "--folds", "3", "--n-boot", "0",
                 "--no-progress"]) == 0


def test_11_nan_and_inf_activations(work, capsys):
    root, _, items = work
    # a model whose residual stream overflows float16 (Gemma's reaches ~3.7e4; scaled embeddings go past 65504)
    hot = save_tiny_model(root / "hot")
    from safetensors.torch import load_file, save_file

    weights = load_file(hot / "model.safetensors")
    weights["model.embed_tokens.weight"] *= 1e7
    save_file(weights, hot / "model.safetensors", metadata={"format": "pt"})
    out = root / "acts11"
    fails(extract_args(hot, items, out, "--dtype", "float16"), capsys, "float16", "layer 0", "float32")
    assert not list(out.glob("shard-*.h5"))
    # a store whose values became NaN (bit rot, a tool that edited it): probing stops, naming the shard
    store = random_store(root / "nan")
    with h5py.File(store / "shard-00000.h5", "r+") as f:
        f["last"][0, 1, 0] = np.nan
    fails(["probe", "--acts", store, "--out", root / "p11.csv", "--no-progress"], capsys,
          "shard-00000.h5/last", "babelprobe verify")
    assert not (root / "p11.csv").exists()
    # NaN handed in from memory (an ArrayStore) is named by item and layer
    keys = bp.open_store(random_store(root / "fewpairs11", pairs=3)).keys  # its own: not test_10's (xdist)
    values = np.random.default_rng(1).normal(size=(len(keys), 4, 8)).astype(np.float32)
    values[3, 2, 0] = np.inf
    with pytest.raises(bp.BabelprobeError, match=r"layer 2 are NaN or inf for item 'en1-0'"):
        bp.probe(bp.ArrayStore(keys, last=values), folds=3, n_boot=0, progress=False)


# ------------------------------------------------------------------------------------------------ stores

def test_12_store_made_with_another_model_or_other_arguments(work, capsys):
    root, model, items = work
    out = root / "acts12"
    assert run(extract_args(model, items, out)) == 0
    before = shard_digests(out)
    fails(extract_args(model, items, out, "--pool", "both"), capsys, "other settings", "pools", "--overwrite")
    other = save_tiny_model(root / "other-model", arch="gemma3")
    fails(extract_args(other, items, out), capsys, "other settings", "model", "--overwrite")
    assert shard_digests(out) == before
    cmp_out = root / "cmp12"
    fails(["compare", "--model", other, "--items", items, "--acts", out, "--out", cmp_out, "--no-progress"],
          capsys, "was made with another model", "--overwrite")


def test_13_truncated_shard(work, capsys):
    root, model, items = work
    out = root / "acts13"
    assert run(extract_args(model, items, out, "--shard-size", "8")) == 0
    clean = shard_digests(out)
    shard = out / "shard-00001.h5"
    shard.write_bytes(shard.read_bytes()[:4000])
    assert run(["verify", out]) == 1
    assert "shard-00001.h5: unreadable HDF5 file" in capsys.readouterr().err
    fails(["probe", "--acts", out, "--out", root / "p13.csv", "--no-progress"], capsys,
          "shard-00001.h5", "babelprobe verify")
    assert run(extract_args(model, items, out, "--shard-size", "8")) == 0  # the same command repairs it
    assert "1 written" in capsys.readouterr().out
    assert shard_digests(out) == clean and bp.verify_store(out) == []


def test_14_shard_checksum_no_longer_matches(work, capsys):
    root, model, items = work
    out = root / "acts14"
    assert run(extract_args(model, items, out, "--shard-size", "8")) == 0
    with h5py.File(out / "shard-00002.h5", "r+") as f:
        f["last"][0, 1, 0] += 1.0
    assert run(["verify", out]) == 1
    assert "shard-00002.h5/last: checksum mismatch" in capsys.readouterr().err
    fails(["probe", "--acts", out, "--out", root / "p14.csv", "--no-progress", "--folds", "2"], capsys,
          "shard-00002.h5/last", "checksum mismatch", "re-extract")
    assert not (root / "p14.csv").exists()


# ---------------------------------------------------------------------------------------- the file system

def test_15_read_only_output_directory(work, capsys, monkeypatch):
    root, model, items = work
    readonly = root / "readonly"
    readonly.mkdir()
    store = random_store(root / "fewpairs15", pairs=3)  # its own: test_10's may be on another xdist worker
    real_access = os.access
    # we run as root in CI, where chmod does not stop writes: the directory reports itself read-only
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != readonly and real_access(p, mode, **kw))
    fails(direct(model, items, readonly / "r.csv"), capsys, str(readonly), "not writable", "writable output")
    fails(extract_args(model, items, readonly), capsys, str(readonly), "not writable", "choose another --out")
    fails(["probe", "--acts", store, "--out", readonly / "p.csv", "--folds", "3"], capsys,
          "not writable")
    assert list(readonly.iterdir()) == []


def test_16_full_disk_keeps_finished_parts_and_earlier_results(work, capsys, monkeypatch):
    root, model, items = work
    out = root / "r16.csv"
    out.write_text("an earlier result\n")
    import builtins

    import babelprobe.runs as checkpoint

    real_open = builtins.open

    def full(file, mode="r", *args, **kwargs):  # the disk fills when the final table's bytes are written
        if Path(str(file)).name.startswith(".r16.csv.") and set(mode) & set("wax+"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full)  # the chunks (Parquet, written by pyarrow) fit
    monkeypatch.setattr(checkpoint, "CHUNK_PAIRS", 4)
    fails(direct(model, items, out), capsys, "r16.csv", "No space left on device", "free some space")
    assert out.read_text() == "an earlier result\n"
    # scored chunks are kept: 16 pairs, a first chunk of one (`FIRST_CHUNK_SHARE`), then of four
    assert len(list(checkpoint.partial_dir(out).glob("chunk-*.parquet"))) == 5
    monkeypatch.undo()
    assert run(direct(model, items, out)) == 0
    assert "resuming: 16 of 16 pairs already scored" in capsys.readouterr().err
    assert len(pd.read_csv(out)) == 16 and not checkpoint.partial_dir(out).exists()


def test_16b_full_disk_while_writing_a_table(work, capsys, monkeypatch):
    root = work[0]
    out = root / "t16.csv"
    out.write_text("kept\n")
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", full)
    with pytest.raises(bp.BabelprobeError, match="No space left on device; free some space"):
        bp.write_table(pd.DataFrame({"a": [1]}), out)
    assert out.read_text() == "kept\n" and [p.name for p in root.glob(".t16.csv*")] == []


def test_17_two_concurrent_writers(work, capsys):
    root, model, items = work
    out = root / "acts17"
    out.mkdir()
    with store_lock(out):
        fails(extract_args(model, items, out), capsys, "another process is writing the store")
    assert run(extract_args(model, items, out)) == 0
    capsys.readouterr()
    result = root / "r17.csv"
    from filelock import FileLock

    with FileLock(str(root / ".r17.csv.lock")):
        fails(direct(model, items, result), capsys, "another process is writing", "r17.csv")
    assert not result.exists()


# ------------------------------------------------------------------------------------------------ signals

def cli(*args) -> list[str]:
    return [sys.executable, "-m", "babelprobe", *map(str, args)]


def cli_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def interrupt_when(proc: subprocess.Popen, ready, timeout: float = 300) -> str:
    """Send SIGINT once `ready()` holds; return the process's stderr after it exits."""
    deadline = time.time() + timeout
    while not ready() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return err


def assert_interrupted(proc, err):
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1].startswith("babelprobe: interrupted")


def test_18_sigkill_during_extraction_is_tests_test_kill():
    assert (Path(__file__).parent / "test_kill.py").exists()


@pytest.mark.serial
def test_19_sigint_during_extraction_then_the_same_command_resumes(work, tmp_path):
    root, model, _ = work
    items = tmp_path / "items.jsonl"
    write_records(items, [{"item_id": f"t{i:03d}", "pair_id": f"t{i:03d}", "language": "en", "subset": "s",
                           "label": 1, "text": f"{CORPUS[i % len(CORPUS)]} {i}"} for i in range(200)])
    args = ["extract", "--model", model, "--items", items, "--pool", "both", "--shard-size", "2", "--no-progress"]
    subprocess.run(cli(*args, "--out", tmp_path / "clean"), env=cli_env(), check=True, capture_output=True)
    out = tmp_path / "acts"
    proc = subprocess.Popen(cli(*args, "--out", out), env=cli_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    err = interrupt_when(proc, lambda: (out / "shard-00005.h5").exists())
    assert_interrupted(proc, err)
    final_files_are_whole(out)
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    done = subprocess.run(cli(*args, "--out", out), env=cli_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "already complete" in done.stdout
    assert shard_digests(out) == shard_digests(tmp_path / "clean") and bp.verify_store(out) == []


@pytest.mark.serial
def test_20_sigint_during_scoring_then_the_same_command_resumes(work, tmp_path):
    from babelprobe.runs import partial_dir

    model = work[1]
    args = ["score", "direct", "--model", model, "--items", "xcomps-sample", "--no-progress"]
    clean = tmp_path / "clean.csv"
    subprocess.run(cli(*args, "--out", clean), env=cli_env(), check=True, capture_output=True)
    out = tmp_path / "direct.csv"
    out.write_text("an earlier result\n")
    proc = subprocess.Popen(cli(*args, "--out", out), env=cli_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    err = interrupt_when(proc, lambda: len(list(partial_dir(out).glob("chunk-*.parquet"))) >= 2)
    assert_interrupted(proc, err)
    assert out.read_text() == "an earlier result\n"  # untouched until the new table is complete
    done = subprocess.run(cli(*args, "--out", out), env=cli_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "resuming:" in done.stderr and "of 2720 pairs already scored" in done.stderr
    resumed, reference = pd.read_csv(out), pd.read_csv(clean)
    assert resumed["pair_id"].tolist() == reference["pair_id"].tolist()
    np.testing.assert_allclose(resumed["score_good"], reference["score_good"], rtol=1e-5, atol=1e-5)
    assert (resumed["correct"] == reference["correct"]).mean() > 0.99  # ties within float noise may flip
    assert not partial_dir(out).exists()


# ---------------------------------------------------------------------------------------- generation

def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_21_unreachable_generation_endpoint(work, capsys):
    root = work[0]
    url = f"http://127.0.0.1:{closed_port()}/v1"
    out = root / "bench21"
    fails(["bench", "eclektic", "--data", "eclektic-sample", "--generator", f"openai:m@{url}", "--out", out, "--limit", "1",
           "--retries", "1", "--timeout", "2", "--no-progress"], capsys,
          "openai:m", "no usable answer after 2 attempts", "check that the server is up")
    assert not out.exists() or not [p for p in out.rglob("*") if p.suffix in (".csv", ".md", ".png")]


def test_22_slow_generation_endpoint(work, capsys):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self):
            time.sleep(1.5)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1"
        fails(["bench", "eclektic", "--data", "eclektic-sample", "--generator", f"openai:m@{url}", "--out", work[0] / "bench22",
               "--limit", "1", "--retries", "0", "--timeout", "0.5", "--no-progress"], capsys,
              "no answer within 0.5 s", "raise --timeout/--retries")
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------------ other mistakes

def test_23_unknown_model_and_item_set(work, capsys):
    root, _, items = work
    fails(direct(root / "no-such-model", items, root / "r23.csv"), capsys, "no-such-model")
    fails(direct("default", "xcomps-smaple", root / "r23.csv"), capsys, "xcomps-smaple")


def test_24_unknown_output_format_is_refused_before_the_work(work, capsys):
    root, model, items = work
    fails(direct(model, items, root / "r24.xlsx"), capsys, "r24.xlsx", "unknown table format '.xlsx'")
    fails(["score", "meta", "--model", model, "--items", items, "--out", root / "r24.txt"], capsys, ".txt")


def test_25_bad_layer_list(work, capsys):
    root, model, items = work
    fails(extract_args(model, items, root / "acts25", "--layers", "2-9"), capsys, "9")
    assert not (root / "acts25").exists()
    # a list that cannot be read is refused before the model is even looked for
    fails(extract_args(root / "no-such-model", items, root / "acts25", "--layers", "5-2"), capsys,
          "--layers '5-2': the range 5-2 runs backwards; write 2-5")
    assert not (root / "acts25").exists()


# --------------------------------------------- inputs checked before work: lens, align, sweep, report, compare
# Each case: one line, exit 2, and OUT neither created nor changed. `--model` points nowhere where the model
# must not be loaded before the mistake is found (a model error would show instead).

@pytest.fixture(scope="module")
def store(work):
    """A store of the tiny model on the valid items (en, de; parallel_id set)."""
    root, model, items = work
    assert run(extract_args(model, items, root / "acts-checks", "--layers", "0-2")) == 0
    return root / "acts-checks"


@pytest.fixture(scope="module")
def compare_dir(work):
    root, model, items = work
    out = root / "cmp-checks"
    assert run(["compare", "--model", model, "--items", items, "--folds", "2", "--out", out, "--no-progress"]) == 0
    return out


def align_args(out, *extra):
    return ["align", "--out", out, "--no-progress", *extra]


def lens_args(out, *extra):
    return ["lens", "--out", out, "--no-progress", *extra]


def test_26_align_layer_not_in_the_store(store, tmp_path, capsys):
    refused(align_args(tmp_path / "o", "--acts", store, "--items", "xcomps-sample", "--layers", "77"),
            capsys, tmp_path / "o", "--layers '77': layer 77 is not in the store; stored layers: 0-2")


def test_27_align_store_missing_or_not_a_store(work, tmp_path, capsys):
    refused(align_args(tmp_path / "o", "--acts", tmp_path / "missing"), capsys, tmp_path / "o",
            "--acts", "missing: no such directory")
    (tmp_path / "empty").mkdir()
    refused(align_args(tmp_path / "o", "--acts", tmp_path / "empty"), capsys, tmp_path / "o",
            "is not a finished store directory (no manifest.json)")


def test_28_align_pivot_not_among_the_languages(store, tmp_path, capsys):
    refused(align_args(tmp_path / "o", "--acts", store, "--pivot", "ja"), capsys, tmp_path / "o",
            "--pivot ja: not among the items' languages (de, en)")


def test_29_align_and_lens_compare_directory_not_finished(work, tmp_path, capsys):
    root, _, items = work
    half = tmp_path / "half"
    half.mkdir()
    (half / "items.csv").write_text("pair_id\n", encoding="utf-8")
    refused(align_args(tmp_path / "o", "--compare", half), capsys, tmp_path / "o",
            "--compare", "is not a finished compare directory (no summary.csv); run `babelprobe compare`")
    refused(lens_args(tmp_path / "o", "--model", root / "no-such-model", "--items", items, "--compare", half),
            capsys, tmp_path / "o", "is not a finished compare directory")


def test_30_align_figure_layer_not_aligned(store, tmp_path, capsys):
    refused(align_args(tmp_path / "o", "--acts", store, "--layers", "0-1", "--matrix-layer", "2"), capsys,
            tmp_path / "o", "--matrix-layer 2 is not among the aligned layers (0..1)")


def test_31_lens_store_missing_is_found_before_the_model(work, tmp_path, capsys):
    root, _, items = work
    refused(lens_args(tmp_path / "o", "--model", root / "no-such-model", "--acts", tmp_path / "missing"),
            capsys, tmp_path / "o", "missing: no such directory")


def test_32_lens_target_without_a_store(work, tmp_path, capsys):
    root, _, items = work
    refused(lens_args(tmp_path / "o", "--model", root / "no-such-model", "--items", items, "--target", "answer"),
            capsys, tmp_path / "o", "--target needs --acts")


def test_33_lens_bad_settings(work, tmp_path, capsys):
    root, _, items = work
    refused(lens_args(tmp_path / "o", "--items", items, "--top-k", "0"), capsys, tmp_path / "o",
            "--top-k must be at least 1, got 0")
    refused(lens_args(tmp_path / "o", "--items", items, "--orders", "gf,xx"), capsys, tmp_path / "o",
            "--orders: unknown order 'xx'")


def test_34_lens_into_a_finished_run_of_other_settings_leaves_it_untouched(work, store, tmp_path, capsys):
    root, model, items = work
    out = tmp_path / "lens"
    assert run(lens_args(out, "--model", model, "--acts", store, "--n-boot", "10")) == 0
    refused(lens_args(out, "--model", model, "--acts", store, "--top-k", "3"), capsys, out,
            "lens.json: this directory holds a lens run of another model, item set or settings with top_k=10, not 3")


def test_35_sweep_bad_settings(work, tmp_path, capsys):
    root, model, items = work
    base = ["sweep", "--models", model, "--items", items, "--out", tmp_path / "s"]
    refused([*base, "--folds", "1"], capsys, tmp_path / "s", "--folds must be at least 2, got 1")
    refused([*base, "--layers", "5-2"], capsys, tmp_path / "s", "the range 5-2 runs backwards")
    refused([*base, "--control", "bogus"], capsys, tmp_path / "s", "--control: unknown control 'bogus'")
    refused([*base, "--limit", "0"], capsys, tmp_path / "s", "--limit must be at least 1, got 0")
    refused([*base, "--groups-per-job", "0"], capsys, tmp_path / "s", "--groups-per-job must be at least 1")


def test_36_sweep_group_column_the_items_lack(work, tmp_path, capsys):
    root, model, items = work
    refused(["sweep", "--models", model, "--items", items, "--by", "language,genre", "--out", tmp_path / "s"],
            capsys, tmp_path / "s", "cannot group probes by 'genre': the items have no such field")


def test_37_report_other_is_not_a_compare_directory(compare_dir, store, tmp_path, capsys):
    refused(["report", "--results", compare_dir, "--other", store, "--out", tmp_path / "f"], capsys, tmp_path / "f",
            "is not a finished compare directory")
    refused(["report", "--results", compare_dir, "--other", tmp_path / "missing", "--out", tmp_path / "f"],
            capsys, tmp_path / "f", "missing: no such directory")


def test_38_report_other_made_on_other_items(work, compare_dir, tmp_path, capsys):
    root, model, items = work
    other = tmp_path / "other"
    assert run(["compare", "--model", model, "--items", items, "--languages", "en", "--folds", "2", "--out", other,
                "--no-progress"]) == 0
    refused(["report", "--results", compare_dir, "--other", other, "--out", tmp_path / "f"], capsys, tmp_path / "f",
            "were run on different items")


def test_39_compare_per_pair_view_takes_one_layer(work, tmp_path, capsys):
    root, _, items = work
    refused(["compare", "--model", root / "no-such-model", "--items", items, "--layers", "3,4", "--out", tmp_path / "c"],
            capsys, tmp_path / "c", "the per-pair neuro view takes 'peak' or one layer")


# ------------------------------------------------------ issue 33: generator specs, release prompts, paper judges

def test_44_unknown_extractor_or_judge_spec(work, capsys):
    out = work[0] / "bench44"
    fails(["bench", "pitfalls", "--items", "pitfalls-sample", "--protocol", "paper", "--extractor", "gpt-4o-mini",
           "--out", out, "--no-progress"], capsys, "--extractor 'gpt-4o-mini': not a generator spec", "openai:MODEL@URL")
    fails(["bench", "eclektic", "--items", "eclektic-sample", "--judge", "llm:gemini-2.0-flash", "--out", out,
           "--no-progress"], capsys, "--judge 'llm:gemini-2.0-flash': the judge 'gemini-2.0-flash': not a generator spec")
    fails(["bench", "pitfalls-affinity", "--items", "pitfalls-sample", "--translator", "gpt-4o", "--out", out,
           "--no-progress"], capsys, "--translator 'gpt-4o': not a generator spec")
    assert not out.exists()


def test_45_unreachable_extractor_keeps_the_answers(work, tiny_long_dir, capsys):
    model, out = tiny_long_dir, work[0] / "bench45"
    url = f"http://127.0.0.1:{closed_port()}/v1"
    fails(["bench", "pitfalls", "--model", model, "--items", "pitfalls-sample", "--protocol", "paper", "--extractor",
           f"openai:gpt-4o-mini@{url}", "--retries", "0", "--timeout", "2", "--max-new-tokens", "3", "--limit", "1",
           "--out", out, "--no-progress"], capsys, "openai:gpt-4o-mini", "no usable answer after 1 attempt")
    assert (out / "generations.jsonl").read_text().count("\n") >= 2  # the answers generated stay: a rerun resumes
    assert not (out / "items.csv").exists()


def test_46_language_without_a_release_template(work, capsys):
    root = work[0]
    data = root / "russian"
    data.mkdir()
    sample = bp.benchmarks.pitfalls.resolve_source("pitfalls-sample") / "French.json"
    (data / "Russian.json").write_text(sample.read_text(encoding="utf-8"), encoding="utf-8")
    out = root / "bench46"
    fails(["bench", "pitfalls", "--items", data, "--protocol", "paper", "--extractor", "self", "--out", out, "--no-progress"], capsys,
          "the Cross-Lingual Pitfalls release has no 'simulate' prompt for language 'ru'", "--answer likelihood")
    source = root / "mmlu.json"
    source.write_text('[{"question": "Q?", "choices": ["a", "b"], "answer": "a"}]', encoding="utf-8")
    fails(["bench", "pitfalls-search", "--items", source, "--languages", "Russian", "--out", out, "--no-progress"],
          capsys, "no 'translate' prompt for language 'ru'", "--translation paper")
    assert not out.exists()


def test_47_eclektic_paper_protocol_without_a_judge(work, capsys):
    out = work[0] / "bench47"
    fails(["bench", "eclektic", "--items", "eclektic-sample", "--protocol", "paper", "--out", out, "--no-progress"],
          capsys, "--protocol paper needs --judge", "Gemini 2.0 Flash", "--judge self")
    assert not out.exists()

