"""What counting language neurons and switching them off cost, against what they stand beside, measured
in the same run (issue 29):

  - the counting pass of `babelprobe neurons` (`neuron_stats`: hooks at every MLP activation, counts
    kept on the device, nothing per token) against `babelprobe extract --pool last` (every layer's
    last-token state, written to a store) on the same items; target ≤ 1.15×;
  - `score direct` with one language's LAPE neurons switched off (`deactivated`) against plain
    `score direct`; target ≤ 1.05×.

    .venv/bin/python perf/neurons.py --repeat 3
    .venv/bin/python perf/neurons.py --repeat 3 --limit 10 --languages en,de,zh

The compared runs take turns within each round (perf/timing.py) and the median ratio within rounds is
reported, with the median ratio of this process's CPU seconds beside it: the machine these run on is
shared and its speed drifts, so compare ratios (the CPU-time one when the machine is busy), and rerun on
a quiet machine for the absolute times.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import fastest, median_ratio, ratios, rounds  # noqa: E402  (perf/timing.py)

from babelprobe.benchmarks.direct import score_direct  # noqa: E402
from babelprobe.cli.common import comma_list  # noqa: E402
from babelprobe.extract import extract  # noqa: E402
from babelprobe.items import load_items  # noqa: E402
from babelprobe.models import load_model  # noqa: E402
from babelprobe.neurons.lape import select_lape  # noqa: E402
from babelprobe.neurons.mlp import deactivated  # noqa: E402
from babelprobe.neurons.run import neuron_stats  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--items", default="xcomps-sample")
    parser.add_argument("--languages", type=comma_list, default=None, help="languages to keep (default all)")
    parser.add_argument("--limit", type=int, default=10, help="pairs per language × subset (default 10)")
    parser.add_argument("--off", default="zh", help="the language whose neurons are switched off (default zh)")
    parser.add_argument("--batch-tokens", type=int, default=8192, help="token budget per batch, both sides")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    args = parser.parse_args()

    lm = load_model(args.model, device="cpu", dtype="float32")
    items = load_items(args.items, languages=args.languages, limit=args.limit)
    tokens = sum(len(e.ids) for e in lm.encode(items["text"].tolist()))
    print(f"{lm.name}: {len(items)} items, {tokens} tokens, {torch.get_num_threads()} threads; the machine may be "
          "shared: read the ratios")
    stats = neuron_stats(lm, items, batch_tokens=args.batch_tokens)  # warm-up, and the neurons to switch off
    lape = select_lape(stats)
    neurons = lape.neurons(args.off)
    print(f"{args.off}: {sum(len(v) for v in neurons.values())} neurons switched off "
          f"(of {lape.n_selected()} selected at top rate {lape.top_rates[0]:g} on these items)")
    scratch = Path(tempfile.mkdtemp(prefix="perf-neurons-"))

    def extract_last():
        shutil.rmtree(scratch / "acts", ignore_errors=True)
        return extract(lm, items, scratch / "acts", pool="last", batch_tokens=args.batch_tokens, progress=False)

    def count():
        return neuron_stats(lm, items, batch_tokens=args.batch_tokens)

    def plain():
        return score_direct(lm, items, batch_tokens=args.batch_tokens, progress=False)

    def switched_off():
        with deactivated(lm, neurons):
            return score_direct(lm, items, batch_tokens=args.batch_tokens, progress=False)

    try:
        counting = rounds({"extract --pool last": extract_last, "count": count}, args.repeat)
        scoring = rounds({"score direct": plain, "score direct, neurons off": switched_off}, args.repeat)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name, (_, wall, cpu) in {**fastest(counting), **fastest(scoring)}.items():
        print(f"  {name:28s} fastest {wall:7.2f} s wall, {cpu:7.2f} s CPU")
    results = fastest(counting)
    np.testing.assert_array_equal(results["count"][0].over_zero, stats.over_zero)  # the same counts every time
    for label, table, slow, fast, target in (
            ("counting pass / extract --pool last", counting, "count", "extract --pool last", 1.15),
            ("score direct neurons off / plain", scoring, "score direct, neurons off", "score direct", 1.05)):
        median = float(np.median(ratios(table, slow, fast)))
        verdict = "within" if median <= target else "ABOVE"
        # CPU seconds of this process beside the wall ratio: on a shared machine the wall ratio is noise
        cpu = float(np.median([r[slow][2] / r[fast][2] for r in table]))
        print(f"{label}: {median_ratio(table, slow, fast)}; target ≤ {target}x: {verdict} "
              f"(CPU-time ratio {cpu:.2f}x)")


if __name__ == "__main__":
    main()
