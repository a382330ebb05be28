"""`babelprobe sweep` with the local executor: two tiny random models saved to directories × two language
slices, end to end; interrupted in the middle of an extraction and resumed (finished jobs and shards are
kept); the probe batches add up to the probe sweep of the whole store. The SLURM path runs through
submitit's in-process "debug" cluster when submitit is installed (no SLURM here)."""

import json
import os
import re

import numpy as np
import pandas as pd
import pytest

from babelprobe.cli import main
from babelprobe.errors import BabelprobeError
from babelprobe.extract import open_store
from babelprobe.extract.store import StoreWriter
from babelprobe.jobs import is_done, plan, run_sweep
from babelprobe.probes.run import probe as probe_sweep
from tests.tiny import CORPUS, tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")

SLICES = (["--languages", "en,de"], ["--languages", "fr,es"])


@pytest.fixture(scope="module")
def items_file(tmp_path_factory):
    """Four languages × two subsets × four pairs (the texts are the tiny corpus's; only the keys matter)."""
    rows = []
    for language in ("en", "de", "fr", "es"):
        for subset in ("a", "b"):
            for pair in range(4):
                for label in (1, 0):
                    n = len(rows)
                    rows.append({"item_id": f"{language}-{subset}-{pair}-{label}", "pair_id": f"{language}-{subset}-{pair}",
                                 "language": language, "subset": subset, "label": label,
                                 "text": f"{CORPUS[n % len(CORPUS)]} {n}"})
    path = tmp_path_factory.mktemp("items") / "items.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    paths = []
    for seed in (0, 1):
        lm = tiny_lm("llama", seed=seed)
        lm.model.save_pretrained(root / f"tiny-{seed}")
        lm.tokenizer.save_pretrained(root / f"tiny-{seed}")
        paths.append(str(root / f"tiny-{seed}"))
    return paths


def sweep_args(models, items, out, *extra):
    return ["sweep", "--models", ",".join(models), "--items", items, *SLICES[0], *SLICES[1],
            "--groups-per-job", "3", "--folds", "2", "--n-boot", "10", "--shard-size", "4",
            "--out", str(out), *extra]


def test_local_sweep_runs_two_models_by_two_slices_and_resumes_after_an_interruption(tmp_path, two_models, items_file,
                                                                                     monkeypatch, capsys):
    out = tmp_path / "sweep"
    args = sweep_args(two_models, items_file, out)
    jobs = plan(two_models, [items_file], [["en", "de"], ["fr", "es"]], out, groups_per_job=3)
    assert len(jobs) == 4 * (1 + 2)  # 4 stores; 4 groups each (2 languages x 2 subsets) in batches of 3
    second = [j for j in jobs if j.kind == "extract"][1].store
    # interrupt the second store's extraction when its third shard is about to be written
    real_write = StoreWriter.write_shard

    def interrupted(self, index, keys, arrays, **options):
        if self.path == second and index == 2:
            raise KeyboardInterrupt
        return real_write(self, index, keys, arrays, **options)

    monkeypatch.setattr(StoreWriter, "write_shard", interrupted)
    assert main(args) == 130
    capsys.readouterr()
    monkeypatch.setattr(StoreWriter, "write_shard", real_write)
    done_before = {j.id for j in jobs if (out / ".jobs" / f"{j.id}.json").exists()}
    assert done_before == {j.id for j in jobs[:3]}  # the first store and its probe batches
    assert not open_store(second, allow_incomplete=True).manifest["complete"]
    kept = {p.name: p.stat().st_ino for p in second.glob("shard-*.h5")}
    # shards 0 and 1 came before; one written beside the interrupted shard 2 (background.WRITERS) is whole
    assert {"shard-00000.h5", "shard-00001.h5"} <= set(kept) and "shard-00002.h5" not in kept

    assert main(args) == 0
    printed = capsys.readouterr().out
    ran, skipped = map(int, re.search(r"ran (\d+) job\(s\) in .* (\d+) of 12 already done", printed).groups())
    assert (ran, skipped) == (9, 3)
    assert {p.name: p.stat().st_ino for p in second.glob("shard-*.h5") if p.name in kept} == kept  # not redone
    stores = [j.store for j in jobs if j.kind == "extract"]

    summary = pd.read_csv(out / "summary.csv")
    assert sorted(summary["model"].unique()) == sorted(two_models)
    assert sorted(summary["languages"].unique()) == ["en+de", "fr+es"]
    assert len(summary) == 2 * 2 * 2 * 2  # models x slices x languages x subsets
    # the batches add up to the probe sweep of the whole store (groups are independent)
    for store in (stores[0], stores[-1]):  # one store of each model
        whole = probe_sweep(store, folds=2, n_boot=10).table
        joined = pd.read_csv(store.parent / "neuro.csv")
        key = ["language", "subset", "layer"]
        merged = whole.merge(joined, on=key, suffixes=("", "_jobs"))
        assert len(merged) == len(whole) == len(joined)
        np.testing.assert_allclose(merged["f1_mean_jobs"], merged["f1_mean"], atol=1e-9)
    assert main(args) == 0 and "ran 0 job(s)" in capsys.readouterr().out
    assert main([*args[:-2], "--out", str(out), "--folds", "3"]) == 2
    assert "holds a sweep" in capsys.readouterr().err


def test_dry_run_lists_jobs_and_bad_plans_are_one_line_errors(tmp_path, two_models, items_file, capsys):
    assert main(sweep_args(two_models, items_file, tmp_path / "s", "--dry-run")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 12 and all(line.startswith("todo  ") for line in lines)
    with pytest.raises(BabelprobeError, match="share the directory name"):
        plan([two_models[0], two_models[0]], [items_file], [], tmp_path)
    with pytest.raises(BabelprobeError, match="--groups-per-job"):
        plan(two_models, [items_file], [], tmp_path, groups_per_job=0)


def test_slurm_without_submitit_is_a_one_line_error(tmp_path, two_models, items_file, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_submitit(name, *a, **k):
        if name == "submitit":
            raise ImportError("No module named 'submitit'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_submitit)
    assert main(sweep_args(two_models[:1], items_file, tmp_path / "s", "--executor", "slurm")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("babelprobe: error: the slurm executor needs submitit: pip install 'babelprobe[slurm]' "
                       "(or use --executor local)")


def test_submitit_job_arrays_through_its_debug_cluster(tmp_path, two_models, items_file):
    pytest.importorskip("submitit")
    jobs = plan(two_models[:1], [items_file], [["en"]], tmp_path / "s", groups_per_job=1,
                extract_options={"shard_size": 8}, probe_options={"folds": 2, "n_boot": 0})
    report = run_sweep(jobs, "slurm", cluster="debug", wait=True, slurm={"timeout_min": 5})
    assert len(report.submitted) == len(jobs) == 3 and all(is_done(j) for j in jobs)
    peaks = pd.read_csv(tmp_path / "s" / "summary.csv")
    assert sorted(peaks["subset"]) == sorted(open_store(jobs[0].store).keys["subset"].unique())
    marker = json.loads((tmp_path / "s" / ".jobs" / f"{jobs[1].id}.json").read_text())
    assert marker["kind"] == "probe" and os.path.exists(jobs[1].table)
