"""Scoring lm-evaluation-harness tasks: babelprobe's log-prob path (`bench lm-eval`: each context run once for
all its options from a KV cache, only the scored tokens' states projected onto the vocabulary) against the
harness's own HF backend (`lm_eval.models.huggingface.HFLM.loglikelihood`) on the same requests, the same model
in the same process, measured in the same run. Goal: at least 2x on a CPU, with equal results.

    .venv/bin/python perf/lmeval.py --repeat 3
    .venv/bin/python perf/lmeval.py --repeat 3 --family belebele     # one family of the sample
    .venv/bin/python perf/lmeval.py --tasks xcopa_et,belebele_deu_Latn --include-path my_tasks/ --repeat 3

Both take turns in every round (perf/timing.py); the median within-round ratio is printed with the fastest time
of each, the largest |Δ LL| between them and the number of documents whose decision (acc, acc_norm) differs. The
harness runs at `--harness-batch-size` (its CLI's default is 1; 4 is kinder to it on a CPU). The machine these
run on is shared: compare ratios, re-run on a quiet one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import fastest, median_ratio, rounds  # noqa: E402  (perf/timing.py)

from babelprobe import lmeval  # noqa: E402
from babelprobe.benchmarks import bridges  # noqa: E402
from babelprobe.models import load_model  # noqa: E402


def harness_requests(source: str, family: str | None) -> list:
    """The harness's own request objects (`Instance`) of every task of `source` (those whose name starts with
    `family`), built as `lmeval.load` builds them (its task objects, zero-shot)."""
    parsed = lmeval.parse(source)
    instances = []
    for leaf in lmeval.resolve(parsed).leaves:
        if family and not leaf.name.startswith(family):
            continue
        task = lmeval.build(leaf, parsed)
        lmeval.task_questions(task, leaf.name, "", None)  # builds task.instances (the language is not used)
        instances += task.instances
    return instances


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--tasks", default="lm-eval-sample",
                        help="harness tasks (TASK[,TASK...]) or the bundled sample (default lm-eval-sample)")
    parser.add_argument("--include-path", help="a folder of your own harness task files")
    parser.add_argument("--family", help="only the tasks whose name starts with this (e.g. belebele, xcopa)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="babelprobe's token budget per batch")
    parser.add_argument("--harness-batch-size", type=int, default=4, help="the harness's batch size (default 4)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared, oversubscribed machine 2 threads mostly wait)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from lm_eval.models.huggingface import HFLM

    source = args.tasks if args.tasks in lmeval.bundled_sets(lmeval.NAME) else lmeval.source_of(
        args.tasks.split(","), args.include_path)
    lm = load_model(args.model, device="cpu", dtype="float32")
    items = lmeval.load(source, report=False)
    if args.family:
        items = items[items["task"].str.startswith(args.family)].reset_index(drop=True)
    instances = harness_requests(source, args.family)
    harness = HFLM(pretrained=lm.model, tokenizer=lm.tokenizer, batch_size=args.harness_batch_size, device="cpu")

    def babelprobe():
        return bridges.score(lm, items, progress=False)

    def the_harness():
        return harness.loglikelihood(instances, disable_tqdm=True)

    babelprobe()  # warm-up (first calls allocate)
    results = rounds({"babelprobe": babelprobe, "harness HFLM": the_harness}, args.repeat)
    best = fastest(results)
    rows, theirs = best["babelprobe"][0], best["harness HFLM"][0]
    by_request = {(i.task_name, i.doc_id, i.idx): ll for i, (ll, _) in zip(instances, theirs)}
    diffs, decisions = [], 0
    for row in rows.itertuples():
        lls = np.array([by_request[(row.task, row.doc_id, k)] for k in range(row.n_options)])
        ours = np.array([getattr(row, f"ll_{k}") for k in range(row.n_options)])
        diffs.append(np.max(np.abs(ours - lls)))
        decisions += int(np.argmax(lls)) != row.pred
    n_tokens = sum(len(e.ids) for e in lm.encode((items["context"] + items["delimiter"] + items["target"]).tolist()))
    print(f"{source}: {items['task'].nunique()} tasks, {items['pair_id'].nunique()} documents, {len(instances)} "
          f"requests, {n_tokens} tokens if each request ran whole; {lm.name}, {args.threads} threads, CPU, harness "
          f"batch size {args.harness_batch_size} (a shared machine)")
    for name, (_, wall, cpu) in best.items():
        print(f"  {name:13s} fastest {wall:6.2f} s wall, {cpu:6.2f} s CPU")
    print(f"babelprobe vs the harness's HF backend: {median_ratio(results, 'harness HFLM', 'babelprobe')} faster")
    print(f"largest |LL difference|: {max(diffs):.2e}; documents whose choice differs: {decisions} of {len(rows)}")


if __name__ == "__main__":
    main()
