"""Belebele as the bridge scores it: each question's context (passage, question, four answers) run once and
its four one-letter options scored from the KV cache (`shared_prefix_logprobs`), against the four
options scored separately (`token_logprobs`: context + option as four texts), measured in the same run.

    .venv/bin/python perf/bridges.py --repeat 3

The two ways take turns in every round (perf/timing.py) and the median within-round ratio is printed,
with the fastest time of each and the largest difference between their LLs (same numbers, computed
differently: ~1e-5). The machine these run on is shared: compare ratios, re-run on a quiet one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import fastest, median_ratio, rounds  # noqa: E402  (perf/timing.py)

from babelprobe.benchmarks.bridges import belebele, harness_requests  # noqa: E402
from babelprobe.benchmarks.core.logprobs import token_logprobs  # noqa: E402
from babelprobe.benchmarks.core.prefix import shared_prefix_logprobs  # noqa: E402
from babelprobe.models import load_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--items", default="belebele-sample", help="a Belebele source (default belebele-sample)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared, oversubscribed machine 2 threads mostly wait)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    lm = load_model(args.model, device="cpu", dtype="float32")
    data = belebele.load(args.items)
    texts, starts = harness_requests(lm, data["context"].tolist(), (data["delimiter"] + data["choice"]).tolist())
    n_tokens = sum(len(e.ids) for e in lm.encode(texts))

    def separately():
        return token_logprobs(lm, texts, starts, batch_tokens=args.batch_tokens, progress=False)

    def context_once():
        return shared_prefix_logprobs(lm, texts, starts, batch_tokens=args.batch_tokens, progress=False)

    context_once()  # warm-up (first calls allocate)
    results = rounds({"separately": separately, "context once": context_once}, args.repeat)
    best = fastest(results)
    sums = {name: np.array([float(np.sum(s.logprobs)) for s in run[0]]) for name, run in best.items()}
    print(f"{args.items}: {data['pair_id'].nunique()} questions, {len(texts)} options, {n_tokens} tokens if "
          f"each option ran with its context; {lm.name}, {args.threads} threads, CPU (a shared machine)")
    for name, (_, wall, cpu) in best.items():
        print(f"  {name:13s} fastest {wall:6.2f} s wall, {cpu:6.2f} s CPU")
    print(f"context once vs four options separately: {median_ratio(results, 'separately', 'context once')} faster")
    print(f"largest LL difference between the two: {np.max(np.abs(sums['separately'] - sums['context once'])):.2e}")


if __name__ == "__main__":
    main()
