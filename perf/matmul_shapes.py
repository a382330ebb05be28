"""What a matmul of a shape not seen before costs the host, against the same shape again (issue 40).

A model pass runs its linear layers at M = its padded tokens; a prefix tree's passes all have an M of their
own. On an H200 (perf/gpu_check.sh profiles, 2026-11-28, meta at the 8B shape, 41 passes) the first matmul
of each new (M, N, K) in a pass took the launching thread a median 0.3-3.8 ms (up to 147 ms) of host time
outside any CUDA call, where the same shape again took ~50-90 us: 1.27 s of host time in 103 calls, 0.36 s of
it while the GPU waited. This measures that cost directly, per weight shape of `--shape`: for `--passes` fresh
values of M drawn as a pass's padded token counts are (256 to the budget), the host time of the first call and
of a repeat, and the same with M rounded up to a multiple of `--bucket` after one pass over every bucket
(shapes that recur, which a heuristics cache keeps). The queue is emptied before each timed call (the host time
of a launch, not a wait for a full queue).

    python perf/matmul_shapes.py --device cuda                  # 8B shapes, bfloat16
    python perf/matmul_shapes.py --device cpu --shape tiny      # a check that it runs (a CPU call computes)
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

# (name, N, K) of a Llama-3.1-8B block's distinct linear layers: q/o (d × d), k/v (kv × d), gate/up, down
SHAPES = {"llama-3.1-8b": {"d": 4096, "kv": 1024, "ffn": 14336}, "tiny": {"d": 64, "kv": 16, "ffn": 128}}


def weight_shapes(shape: str) -> list[tuple[str, int, int]]:
    s = SHAPES[shape]
    return [("q_proj", s["d"], s["d"]), ("k_proj", s["kv"], s["d"]), ("gate_proj", s["ffn"], s["d"]),
            ("down_proj", s["d"], s["ffn"])]


def host_us(x: torch.Tensor, w: torch.Tensor) -> float:
    """Host microseconds of one `x @ w.T` launched on an empty queue."""
    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)
    start = time.perf_counter()
    torch.nn.functional.linear(x, w)
    return (time.perf_counter() - start) * 1e6


def measure(shape: str, device: torch.device, dtype: torch.dtype, passes: int, budget: int, bucket: int,
            seed: int) -> dict:
    """Per weight shape: host µs of first calls at fresh M, of repeats, and of bucketed M after warming."""
    rng = np.random.default_rng(seed)
    fresh = rng.choice(np.arange(256, budget + 1), size=passes, replace=False)
    weights = {name: torch.randn(n, k, device=device, dtype=dtype) for name, n, k in weight_shapes(shape)}
    widths = {w.shape[1] for w in weights.values()}
    inputs = {k: torch.randn(budget + bucket, k, device=device, dtype=dtype) for k in widths}
    out = {name: {"first": [], "again": [], "bucketed": []} for name in weights}
    for m in fresh.tolist():
        for name, w in weights.items():
            x = inputs[w.shape[1]][:m]
            out[name]["first"].append(host_us(x, w))
            out[name]["again"].append(host_us(x, w))
    def rounded(m: int) -> int:  # M up to the next multiple of the bucket
        return -(-m // bucket) * bucket

    buckets = sorted({rounded(m) for m in fresh.tolist()})
    for m in buckets:  # one pass over every bucket first: the shapes a run meets again and again
        for w in weights.values():
            host_us(inputs[w.shape[1]][:m], w)
    for m in fresh.tolist():
        for name, w in weights.items():
            out[name]["bucketed"].append(host_us(inputs[w.shape[1]][:rounded(m)], w))
    return {"fresh_m": len(fresh), "buckets": len(buckets), "by_shape": out}


def table(result: dict) -> str:
    lines = ["| weight | first call: median µs | p90 | max | same shape again: median µs | "
             f"M rounded up to the bucket ({result['buckets']} shapes, warmed): median µs | max |",
             "|---|---|---|---|---|---|---|"]
    for name, times in result["by_shape"].items():
        first, again, bucketed = (np.array(times[k]) for k in ("first", "again", "bucketed"))
        lines.append(f"| {name} | {np.median(first):.0f} | {np.percentile(first, 90):.0f} | {first.max():.0f} | "
                     f"{np.median(again):.0f} | {np.median(bucketed):.0f} | {bucketed.max():.0f} |")
    total = sum(sum(times["first"]) - sum(times["again"]) for times in result["by_shape"].values())
    lines.append(f"\nfirst calls beyond repeats: {total / 1e3:.1f} ms over {result['fresh_m']} fresh M "
                 f"({total / 1e3 / result['fresh_m']:.2f} ms a pass's new shapes)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--passes", type=int, default=60, help="fresh values of M (passes)")
    parser.add_argument("--budget", type=int, default=16384, help="the largest M (a pass's token budget)")
    parser.add_argument("--bucket", type=int, default=256, help="M rounded up to a multiple of this")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.passes > args.budget - 255:
        parser.error(f"--passes {args.passes}: at most {args.budget - 255} fresh values of M under --budget")
    result = measure(args.shape, device, dtype, args.passes, args.budget, args.bucket, args.seed)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{args.shape} weights, {dtype}, {name}, torch {torch.__version__}")
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
