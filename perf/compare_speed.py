"""How much faster babelprobe's scoring is than the naive way, measured in the same run.

Meta part (issue 5): meta prompts are long and only the answer tokens are scored. The naive way runs
every prompt+answer text separately through the full model and takes `logits.log_softmax(-1)` at every
position (a [batch, seq, 262k] tensor on the default model), then picks the answer tokens. babelprobe
projects to the vocabulary only the states that predict answer tokens and runs each prompt once for
both of its answers (KV cache). A middle row (no prefix sharing) separates the two gains.

    .venv/bin/python perf/compare_speed.py --limit 2 --languages en,de,zh

prints the seconds of each way, the speed-up against the naive way, and the largest difference
between their scores (should be ~1e-5: same numbers, computed differently). Timings on a shared
machine are noisy; compare ratios, re-run on a quiet one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import timed  # noqa: E402  (perf/timing.py)

from babelprobe.benchmarks.meta import meta_requests, prompt_texts, score_meta  # noqa: E402
from babelprobe.cli.common import comma_list  # noqa: E402
from babelprobe.items import load_items  # noqa: E402
from babelprobe.models import load_model  # noqa: E402

SCORE_COLUMNS = ["score_good_gf", "score_bad_gf", "score_good_bf", "score_bad_bf"]


def naive_answer_logprobs(lm, texts: list[str], starts: list[int], batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Sum of log p(answer tokens), the straightforward way: each text on its own row, full logits and a
    full fp32 log-softmax at every position, then pick the tokens that end after the prompt.

    Also returns the same sums with the log-softmax of the picked rows redone in float64: fp32
    log-softmax over a 262k vocabulary is itself off by ~1e-4, so this is the fair reference."""
    encodings = lm.encode(texts)
    sums, exact = [], []
    with torch.inference_mode():
        for first in range(0, len(texts), batch_size):
            batch = encodings[first:first + batch_size]
            width = max(len(e.ids) for e in batch)
            ids = torch.full((len(batch), width), lm.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, enc in enumerate(batch):
                ids[row, :len(enc.ids)] = torch.tensor(enc.ids)
                mask[row, :len(enc.ids)] = 1
            logits = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device)).logits
            logp = logits.log_softmax(-1)
            for row, (enc, start) in enumerate(zip(batch, starts[first:first + batch_size])):
                positions = [p for p in range(1, len(enc.ids)) if enc.offsets[p][1] > start]
                sums.append(sum(logp[row, p - 1, enc.ids[p]].item() for p in positions))
                exact.append(sum(logits[row, p - 1].double().log_softmax(-1)[enc.ids[p]].item() for p in positions))
    return np.array(sums), np.array(exact)


def work(lm, texts: list[str], starts: list[int]) -> dict:
    """Tokens each way runs through the model body and positions it projects to the vocabulary:
    a machine-independent measure of the work, next to the noisy timings."""
    encodings = lm.encode(texts)
    scored = [[p for p in range(1, len(e.ids)) if e.offsets[p][1] > s] for e, s in zip(encodings, starts)]
    unique = {tuple(e.ids): n for e, n in zip(encodings, scored)}
    prefixes = {tuple(e.ids[:j]) for e, n in zip(encodings, scored) for j in range(1, n[-1] + 1)}
    return {"naive": (sum(len(e.ids) for e in encodings), sum(len(e.ids) for e in encodings)),
            "unshared": (sum(len(ids) for ids in unique), sum(len(n) for n in unique.values())),
            "shared": (len(prefixes), sum(len(n) for n in unique.values()))}


def meta_speed(lm, items, naive_batch: int, batch_tokens: int) -> dict:
    """Time naive, unshared and default meta scoring of `items`; largest score differences."""
    pairs, asked, templates = meta_requests(items)
    texts, starts, _ = prompt_texts(pairs, templates, asked, True, lambda t, p, w1, w2: t.plain(p, w1, w2))
    lm.model(input_ids=torch.tensor([lm.encode(texts[:1])[0].ids], device=lm.device))  # warm-up
    (naive, exact), *t_naive = timed(lambda: naive_answer_logprobs(lm, texts, starts, naive_batch))
    common = dict(batch_tokens=batch_tokens, progress=False)
    unshared, *t_unshared = timed(lambda: score_meta(lm, items, share_prefix=False, **common))
    shared, *t_shared = timed(lambda: score_meta(lm, items, **common))
    diff = {}
    for key, frame in (("unshared", unshared), ("shared", shared)):
        scores = frame[SCORE_COLUMNS].to_numpy().ravel()
        diff[key] = (float(np.abs(scores - naive).max()), float(np.abs(scores - exact).max()))
    return {"pairs": len(pairs), "texts": len(texts), "work": work(lm, texts, starts), "diff": diff,
            "seconds": {"naive": t_naive, "unshared": t_unshared, "shared": t_shared}}


def report_meta(result: dict) -> str:
    (naive_wall, naive_cpu), work_ = result["seconds"]["naive"], result["work"]
    lines = [f"meta scoring: {result['pairs']} pairs, {result['texts']} prompt+answer texts",
             f"  {'':<52} {'wall s':>8} {'speed-up':>8} {'cpu s':>8} {'speed-up':>8} {'body tok':>9} "
             f"{'vocab pos':>9}  max |score - naive| (fp32 / fp64 log-softmax)"]
    labels = {"naive": "naive (full logits, every text separately)",
              "unshared": "babelprobe, answer positions only, no sharing",
              "shared": "babelprobe default (+ shared prompt prefixes)"}
    for key, label in labels.items():
        wall, cpu = result["seconds"][key]
        diff = result["diff"].get(key)
        diff = f"  {diff[0]:.1e} / {diff[1]:.1e}" if diff else ""
        lines.append(f"  {label:<52} {wall:8.2f} {naive_wall / wall:7.2f}x {cpu:8.2f} {naive_cpu / cpu:7.2f}x "
                     f"{work_[key][0]:9d} {work_[key][1]:9d}{diff}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--items", default="xcomps-sample")
    parser.add_argument("--languages", type=comma_list)
    parser.add_argument("--limit", type=int, help="at most N pairs per language × subset")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2, like CI)")
    parser.add_argument("--naive-batch", type=int, default=8, help="texts per naive forward pass")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model)
    items = load_items(args.items, languages=args.languages, limit=args.limit)
    print(f"model {lm.name} on {lm.device} ({args.threads} threads)")
    print(report_meta(meta_speed(lm, items, args.naive_batch, args.batch_tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
