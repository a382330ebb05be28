"""SIGKILL an extraction at random moments, rerunning the same command after each kill: the final store
must hold the same arrays (checksums) as an uninterrupted run, and no kill may leave a partial file under
a final name. `make test` kills 3 times; `make stress` kills 20 times (BABELPROBE_KILLS=20; the moments
come from BABELPROBE_KILL_SEED, default 0, and are printed so a failure can be replayed)."""

import json
import os
import random
import signal
import subprocess
import time

import babelprobe as bp
from tests.test_extract import save_tiny_model
from tests.test_reliability import cli, cli_env, final_files_are_whole, shard_digests, write_records
from tests.tiny import CORPUS

KILLS = int(os.environ.get("BABELPROBE_KILLS", "3"))
SEED = int(os.environ.get("BABELPROBE_KILL_SEED", "0"))
N_ITEMS, SHARD_SIZE = 400, 4


def shards_on_disk(out) -> int:
    return len(list(out.glob("shard-*.h5"))) if out.exists() else 0


def wait_for(condition, proc, timeout=300.0) -> None:
    deadline = time.time() + timeout
    while not condition() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)


def test_killed_at_random_moments_then_resumed_equals_the_uninterrupted_store(tmp_path):
    model = save_tiny_model(tmp_path / "model")
    items = write_records(tmp_path / "items.jsonl", [
        {"item_id": f"t{i:04d}", "pair_id": f"t{i:04d}", "language": "en", "subset": "s", "label": i % 2,
         "text": f"{CORPUS[i % len(CORPUS)]} {i}"} for i in range(N_ITEMS)])
    n_shards = N_ITEMS // SHARD_SIZE

    def command(out):
        return cli("extract", "--model", model, "--items", items, "--out", out, "--pool", "both",
                   "--shard-size", SHARD_SIZE, "--no-progress")

    # the uninterrupted run, timed: how long start-up takes and how long one shard takes
    clean = tmp_path / "clean"
    start = time.time()
    proc = subprocess.Popen(command(clean), env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(lambda: shards_on_disk(clean) > 0, proc)
    first_shard = time.time() - start
    assert proc.wait() == 0, proc.stderr.read()
    per_shard = max((time.time() - start - first_shard) / n_shards, 0.001)

    rng = random.Random(SEED)
    targets = sorted(rng.sample(range(n_shards), KILLS))  # kill once this many shards are on disk ...
    delays = [rng.uniform(0, 2 * per_shard) for _ in targets]  # ... and a moment later, inside a shard's work
    print(f"kill moments (shards on disk, then seconds): {list(zip(targets, [round(d, 4) for d in delays]))}")
    out = tmp_path / "killed"
    mid_run = 0
    for target, delay in zip(targets, delays):
        proc = subprocess.Popen(command(out), env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda target=target: shards_on_disk(out) >= target, proc)
        time.sleep(delay)
        mid_run += proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        final_files_are_whole(out)
        if (out / "manifest.json").exists():
            json.loads((out / "manifest.json").read_text())  # never torn
    assert mid_run >= KILLS - 1, f"only {mid_run} of {KILLS} kills landed while the run was going"

    done = subprocess.run(command(out), env=cli_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert shard_digests(out) == shard_digests(clean)
    assert bp.verify_store(out) == [] and not list(out.glob(".shard-*"))
