"""How much faster the batched torch probe solver is than a scikit-learn loop, measured in the same run.

The full sweep (every layer × language × subset × 5 grouped folds, no bootstrap or controls) runs on
the same store with `solver="torch"` (all layers and folds of a group in one batched solve, `--threads`
groups at once) and `solver="sklearn"` (StandardScaler + LogisticRegression per fold and layer, the
reference, in `--threads` processes), taking turns for `--repeat` rounds (see perf/timing.py). Both fit
the same problems: the 5 folds and the all-items probe that the sweep keeps, per group and layer.
It prints the fastest time of each, the median ratio within rounds, and the largest |ΔF1| between them
over all groups and layers. Goal: ≥ 10× with |ΔF1| ≤ 0.01. scikit-learn's lbfgs stops at tol=1e-4, short of the optimum,
so `--tight-groups` groups are also run with scikit-learn at tol=1e-6 to show which side a difference
comes from (`--tight-groups 40`: all of them).

The store is the bundled xcomps-sample (10 languages × 4 subsets × 136 items) through the default model
(Gemma-3-270M, layers 0..18, 640 dims), extracted once into the cache; `--synthetic` (or no model)
uses planted-signal activations of the same shape (120 items per group).

    .venv/bin/python perf/probe_solver.py                   # real sample store (extracts it once)
    .venv/bin/python perf/probe_solver.py --synthetic --groups 8
    .venv/bin/python perf/probe_solver.py --scale --repeat 3   # the table from the sample to 8000 × 4096
    .venv/bin/python perf/probe_solver.py --scale --spectrum-from /tmp/solver-acts --spectra powerlaw
    .venv/bin/python perf/probe_solver.py --sampled --threads 1   # research sizes, scikit-learn on 1 of 6 problems
    .venv/bin/python perf/probe_solver.py --gpu             # large synthetic case, GPU against CPU

`--scale`: rows from the sample's size to research scale, each `--repeat` rounds in which three runs take
turns: the torch sweep (`solver="torch"`, which picks exact Newton, L-BFGS or Gram-preconditioned L-BFGS
by size, memory and conditioning), the scikit-learn sweep at tol=1e-4 (the time baseline) and at tol=1e-6
("converged": the reference for |ΔF1|), both with max_iter 10,000 so each reaches its tolerance. Rows
(`--sizes`): 136×640 is the real sample store (40 groups of 136 items, 19 layers; `--store DIR` for an
existing one); every other size is one synthetic group of that many items × dims (`--scale-layers`
layers, signal growing with depth) in each of `--spectra`:
  isotropic  `synthetic_activations` (planted signal; standardised covariance close to I, like the rows
             measured before real spectra were);
  powerlaw   activations with a real spectrum (`powerlaw_store`): eigenvalues falling as rank^−1.5 over
             the first half and steeper after, condition 2.5e5 (Gemma-3-270M's layers measure a −1.5
             slope over their first 300 eigenvalues and condition 5.7e4–3.3e6), one random rotation so
             that standardising keeps the spectrum, the label's signal along the mid-spectrum
             eigenvector; `--spectrum-from STORE` takes the median spectrum of a store's layers instead
             (eigenvalues of each layer's standardised covariance, stretched to d in log-log).
Same protocol everywhere: 5 grouped folds plus the all-items probe, no controls, no bootstrap; torch with
`--threads` threads (groups side by side, or one group's layers in threads), scikit-learn with
`--threads` processes (n_jobs, over layers), BLAS single-threaded in each. Each row prints, per run, the
method, the iterations per problem (max / median over problems × layers) and the passes over the
activations per layer (torch: 1 + 2 per L-BFGS iteration for all of a layer's problems at once, plus
the Gram for plbfgs; scikit-learn: at least 1 + 2 per iteration per problem; exact Newton: –), the time,
the speed-ups and the largest |ΔF1| against tol 1e-6. For the synthetic L-BFGS rows it also times the
two passes over the activations that an iteration makes, for scikit-learn (each problem, float64) and
for the torch L-BFGS (all problems in one product, float32): their ratio is what a first-order solver's
speed-up can reach at equal iteration counts (`pass_ceiling`); the preconditioned one needs 20–40×
fewer iterations than scikit-learn on spread spectra, which is how it gets past that ceiling.

`--sampled`: the power-law rows at research sizes when the whole scikit-learn sweep would take too long
(a shared machine: ~300 CPU-seconds per layer at 4000 × 2048 at tol 1e-4, 4–8× that at 8000 × 4096):
one layer, the sweep's six problems (5 grouped folds + all items) fitted by the torch solver, the first
`--sklearn-problems` by scikit-learn at tol 1e-4 and 1e-6, its time scaled by 6/k (a lower bound: the
all-items problem is 25% larger than a fold); CPU seconds, one thread, everything in this process; the
held-out F1 of the sampled folds against scikit-learn at tol 1e-6. See `sampled_table`.

`--gpu`: one group of 20k items × 33 layers × 4096 dims (the scale of Llama-8B on full XCOMPS), 5 grouped
folds, on CUDA, with power-law activations (`--gpu-spectrum powerlaw`, the default; `isotropic` flatters
first-order solvers); the CPU torch solver is timed on `--cpu-layers` layers and the scikit-learn loop
(tol 1e-4) on `--sklearn-problems` of the 5 folds of them, both scaled to all (they are far too slow to
run whole). The same code runs on both devices; the sizes are options, so it can be checked small on a CPU
machine: `--gpu --device cpu --items 2000 --layers 3 --dim 256`.

Timings on a shared machine are noisy: compare ratios, re-run on a quiet one.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import fastest, median_ratio, rounds  # noqa: E402  (perf/timing.py)

from babelprobe.errors import BabelprobeError  # noqa: E402
from babelprobe.probes import ArrayStore, probe, synthetic_activations  # noqa: E402
from babelprobe.probes.solvers import fit_predict, single_threaded  # noqa: E402


def sample_store(cache: Path, synthetic: bool, groups: int | None):
    """The real xcomps-sample store (extracted once into `cache`), or synthetic data of the same shape."""
    if not synthetic:
        try:
            from babelprobe.extract import extract, open_store
            from babelprobe.items import load_items

            path = cache / "xcomps-sample-default-last"
            if not (path / "manifest.json").exists():
                from babelprobe.models import load_model

                print(f"extracting xcomps-sample with the default model into {path} (once) ...", flush=True)
                extract(load_model("default", device="cpu", dtype="float32"), load_items("xcomps-sample"), path,
                        pool="last", source={"source": "xcomps-sample"}, progress=True)
            store = open_store(path)
            if groups:
                keep = store.keys.groupby(["language", "subset"]).ngroup() < groups
                return ArrayStore(store.keys[keep], last=store.read_layers(rows=np.flatnonzero(keep)),
                                  layers=store.layers, n_layers=store.n_layers), "xcomps-sample via Gemma-3-270M"
            return store, "xcomps-sample via Gemma-3-270M"
        except (BabelprobeError, OSError, ImportError) as err:
            print(f"no real store ({err}); using synthetic activations of the same shape")
    languages = ["en", "de", "fr", "es", "ru", "zh", "ja", "ko", "tr", "vi"]
    subsets = ["taxonomic", "overlap", "co-occurrence", "random"]
    n_groups = groups or len(languages) * len(subsets)
    keys, X = synthetic_activations(n_pairs=60, n_layers=18, d_model=640, languages=languages[: -(-n_groups // 4)],
                                    subsets=subsets, signal=6, seed=0)
    keep = (keys.groupby(["language", "subset"], sort=False).ngroup() < n_groups).to_numpy()
    return ArrayStore(keys[keep], last=X[keep], n_layers=18), "synthetic, 120 items × 19 layers × 640 dims per group"


def compare_solvers(args) -> None:
    store, what = sample_store(Path(args.cache), args.synthetic, args.groups)
    n_groups = store.keys.groupby(["language", "subset"]).ngroups
    print(f"store: {what}; {n_groups} groups, {len(store.keys)} items, layers {store.layers[0]}..{store.layers[-1]}, "
          f"d_model {store.d_model}; {args.threads} thread(s)")
    common = dict(folds=5, n_boot=0, seed=args.seed)
    probe(store, layers=[0], **common)  # warm up: imports, first calls
    results = rounds({"torch": lambda: probe(store, solver="torch", **common),
                      "sklearn": lambda: probe(store, solver="sklearn", n_jobs=args.threads, **common)}, args.repeat)
    best = fastest(results)
    (torch_result, torch_s, torch_cpu), (sk_result, sk_s, sk_cpu) = best["torch"], best["sklearn"]
    print(f"torch   (batched Newton)        {torch_s:8.2f} s wall {torch_cpu:8.2f} s CPU   (fastest of {args.repeat})")
    print(f"sklearn (LogisticRegression)    {sk_s:8.2f} s wall {sk_cpu:8.2f} s CPU   ({args.threads} process(es), "
          "tol 1e-4)", flush=True)
    keys = ["language", "subset", "layer"]
    both = torch_result.table.merge(sk_result.table, on=keys, suffixes=("_torch", "_sk"))
    delta = (both["f1_mean_torch"] - both["f1_mean_sk"]).abs()
    cpu_ratio = f", {sk_cpu / torch_cpu:.1f}x in CPU time" if args.threads == 1 else ""
    print(f"speed-up, median within rounds: {median_ratio(results, 'sklearn', 'torch')} in wall time{cpu_ratio} "
          f"(goal >= 10x); largest |dF1| over {len(both)} "
          f"group-layers: {delta.max():.4f} (goal <= 0.01; the tol=1e-6 line below shows which side it comes "
          f"from); mean {delta.mean():.5f}")
    if args.tight_groups:
        first = both.drop_duplicates(["language", "subset"]).head(args.tight_groups)[["language", "subset"]]
        rows = store.keys.merge(first, on=["language", "subset"]).item_id
        part = store.keys["item_id"].isin(rows).to_numpy()
        small = ArrayStore(store.keys[part], last=store.read_layers(rows=np.flatnonzero(part)), layers=store.layers,
                           n_layers=store.n_layers)
        small_results = rounds({"torch": lambda: probe(small, solver="torch", **common),
                                "tight": lambda: probe(small, solver="sklearn", tol=1e-6, n_jobs=args.threads,
                                                       **common)}, args.repeat)
        small_best = fastest(small_results)
        (_, small_torch_s, _), (tight, tight_s, _) = small_best["torch"], small_best["tight"]
        check = tight.table.merge(both, on=keys)
        print(f"on {len(first)} groups, against sklearn converged further (tol=1e-6): largest |dF1| torch "
              f"{(check['f1_mean'] - check['f1_mean_torch']).abs().max():.4f}, sklearn at tol=1e-4 "
              f"{(check['f1_mean'] - check['f1_mean_sk']).abs().max():.4f}; time {tight_s:.2f} s against torch "
              f"{small_torch_s:.2f} s (median within rounds {median_ratio(small_results, 'tight', 'torch')})")
    peaks = torch_result.peaks
    print("peak layers (torch): " + ", ".join(f"{r.language}/{r.subset}:{r.peak_layer}" for r in peaks.itertuples()))


def scale_store(n: int, d: int, layers: int, seed: int):
    """One synthetic group of n items (n/2 minimal pairs) × d dims at `layers` layers with a planted signal
    (layers 1..L of `synthetic_activations`; layer 0 has none): isotropic after standardisation."""
    keys, X = synthetic_activations(n_pairs=n // 2, n_layers=layers, d_model=d, signal=6, seed=seed)
    store = ArrayStore(keys, last=X[:, 1:], layers=list(range(1, layers + 1)), n_layers=layers)
    return store, f"isotropic synthetic, 1 group × {n} items × {layers} layers × {d} dims"


# --------------------------------------------------------------------- activations with a real spectrum

def powerlaw_spectrum(d: int, slope: float = -1.5, condition: float = 2.5e5) -> np.ndarray:
    """Eigenvalues (largest 1) falling as rank^slope over the first half of the spectrum, then as a steeper
    power law that reaches λ_1/condition at rank d (when the slope alone does not): the shape measured on
    Gemma-3-270M's standardised last-token states (slope ≈ −1.5 over the first 300 of 640, steeper after,
    condition 5.7e4–3.3e6 by layer)."""
    rank = np.arange(1, d + 1, dtype=float)
    values = rank ** slope
    if values[0] / values[-1] < condition:
        half = d // 2
        tail = np.log(rank[half:] / half) / np.log(d / half)  # 0 at the knee, 1 at rank d
        values[half:] = values[half - 1] * np.exp(tail * np.log(1 / (condition * values[half - 1])))
    return values


def store_spectrum(path: str, max_condition: float = 1e9) -> tuple[np.ndarray, str]:
    """The median spectrum (largest 1) of a store's layers, from the eigenvalues of each layer's
    standardised covariance over all its items, and a one-line summary (fitted head slope, condition).
    Layers whose covariance is singular (condition above `max_condition`, e.g. the embeddings of a
    shared last token) are left out."""
    from babelprobe.extract import open_store

    store = open_store(path)
    X = np.asarray(store.read_layers(), dtype=np.float64)
    spectra, slopes, conditions = [], [], []
    for j in range(X.shape[1]):
        x = X[:, j]
        sd = x.std(0)
        z = (x[:, sd > 0] - x[:, sd > 0].mean(0)) / sd[sd > 0]
        values = np.linalg.eigvalsh(z.T @ z / len(z))[::-1]
        if values[-1] <= 0 or values[0] / values[-1] > max_condition:
            continue
        head = min(300, len(values) // 2)
        slopes.append(np.polyfit(np.log(np.arange(1, head + 1)), np.log(values[:head]), 1)[0])
        conditions.append(values[0] / values[-1])
        spectra.append(values / values[0])
    if not spectra:
        raise SystemExit(f"--spectrum-from {path}: no layer with a non-singular covariance")
    summary = (f"spectrum of {path} ({len(spectra)} of {X.shape[1]} layers, {len(X)} items × {X.shape[2]} dims): "
               f"head slope {np.median(slopes):.2f} (first {head} eigenvalues), condition {np.median(conditions):.3g} "
               f"(median over layers; {min(conditions):.2g}–{max(conditions):.2g})")
    return np.median(np.stack(spectra), axis=0), summary


def resample_spectrum(values: np.ndarray, d: int) -> np.ndarray:
    """A spectrum measured at len(values) dims stretched to d dims: log λ interpolated against log relative
    rank (a power law keeps its slope, the spectrum its condition)."""
    source = np.log((np.arange(len(values)) + 0.5) / len(values))
    target = np.log((np.arange(d) + 0.5) / d)
    return np.exp(np.interp(target, source, np.log(values)))


def powerlaw_store(n: int, d: int, layers: int, seed: int, spectrum: np.ndarray | None = None,
                   signal: float = 4.0):
    """One group of n items (n/2 minimal pairs) × d dims at `layers` layers whose standardised covariance
    has the given spectrum (default `powerlaw_spectrum(d)`): latent Gaussians scaled by √λ (a pair
    component of variance 4 shared by both items, as minimal pairs share most of their representation,
    and an own one of variance 1), turned by one random rotation (so every dimension has about the same
    variance and standardising keeps the spectrum), with the label's signal along the eigenvector at
    mid-spectrum (rank d/2), `signal` own-noise deviations apart at the last layer (growing with depth)."""
    rng = np.random.default_rng(seed)
    values = powerlaw_spectrum(d) if spectrum is None else resample_spectrum(spectrum, d)
    rotation, _ = np.linalg.qr(rng.standard_normal((d, d)))
    labels = np.tile([1, 0], n // 2)
    root = np.sqrt(values)
    X = np.empty((n, layers, d), dtype=np.float32)
    for j in range(layers):
        latent = (np.repeat(rng.standard_normal((n // 2, d)), 2, axis=0) * 2 + rng.standard_normal((n, d))) * root
        latent[:, d // 2] += (labels - 0.5) * signal * root[d // 2] * (j + 1) / layers
        X[:, j] = latent @ rotation.T
    pairs = [f"en-taxonomic-{p:05d}" for p in range(n // 2)]
    keys = pd.DataFrame({"item_id": [f"{pair}-{'good' if label else 'bad'}" for pair, label in
                                     zip(np.repeat(pairs, 2), labels, strict=True)],
                         "pair_id": np.repeat(pairs, 2), "language": "en", "subset": "taxonomic",
                         "label": labels.astype(np.int8), "concept": "none"})
    what = "store spectrum" if spectrum is not None else "power law -1.5, condition 2.5e5"
    return (ArrayStore(keys, last=X, layers=list(range(1, layers + 1)), n_layers=layers),
            f"{what}, 1 group × {n} items × {layers} layers × {d} dims")


# ------------------------------------------------------------------------------- iterations and passes

class FitRecorder:
    """Records the fit of every `fit_predict` call the sweep makes (method, iterations per problem and
    layer), by wrapping the function the probe runner calls; perf-only, no change to what is fitted."""

    def __init__(self):
        self.fits: list = []

    def __enter__(self):
        import babelprobe.probes.run as runner

        self.runner, self.original = runner, runner.fit_predict

        def recorded(*args, **kwargs):
            out = self.original(*args, **kwargs)
            if kwargs.get("return_fit"):
                self.fits.append(out[1])
            return out

        runner.fit_predict = recorded
        return self

    def __exit__(self, *exc):
        self.runner.fit_predict = self.original
        return False

    def summary(self) -> dict:
        """Iterations (max and median over problems × layers) and passes over X per layer: torch reads X
        once per product for all of a layer's problems (1 + 2 per L-BFGS iteration, lock-step: the layer's
        slowest problem counts); scikit-learn reads each problem's rows at least twice per iteration."""
        iters = np.concatenate([fit.n_iter.ravel() for fit in self.fits])
        method = "/".join(sorted({fit.method for fit in self.fits}))
        layers = sum(fit.n_iter.shape[1] for fit in self.fits)
        if method == "sklearn":
            passes = sum((1 + 2 * fit.n_iter).sum() for fit in self.fits)
        elif "newton" in method:
            passes = np.nan  # exact Newton forms matrices; passes do not measure it
        else:
            passes = sum((1 + 2 * fit.n_iter.max(0)).sum() for fit in self.fits)
        kappa = [np.nanmedian(fit.info["conditioning"]) for fit in self.fits
                 if not np.isnan(fit.info.get("conditioning", np.nan)).all()]
        return {"method": method, "iter_max": int(iters.max()), "iter_median": float(np.median(iters)),
                "passes": float(passes / layers), "conditioning": float(np.median(kappa)) if kappa else None}


def timed_sweeps(store, runs: dict, repeat: int) -> tuple[list[dict], dict]:
    """`rounds` of the sweeps in `runs`, and each one's fit summary (from its first round)."""
    summaries: dict = {}

    def recorded(name, fn):
        def run():
            with FitRecorder() as recorder:
                out = fn()
            summaries.setdefault(name, recorder.summary())
            return out
        return run

    return rounds({name: recorded(name, fn) for name, fn in runs.items()}, repeat), summaries


def pass_ceiling(store, problems: int = 6) -> tuple[float, float, float]:
    """The speed-up that one iteration allows, from the passes over the activations that both solvers make.

    An iteration of either L-BFGS reads the training rows twice (X·w, then Xᵀr). scikit-learn does it per
    problem in float64 (numpy's BLAS, as its lbfgs does); the torch L-BFGS does it once for all the
    layer's problems in float32 (the products `SharedFeatures` makes). Each pass is timed on one thread,
    fastest of 5, on the store's first layer. Returns (scikit-learn's passes for all problems, torch's
    passes, their ratio): at equal iteration counts the most the speed-up can be once the passes are most
    of the cost. The preconditioned solver escapes it by needing 20–40× fewer iterations."""
    X = np.asarray(store.read_layers(layers=[store.layers[0]]))[:, 0]
    rows = X[: len(X) * 4 // 5]  # a training fold's rows
    x64, w64, r64 = np.ascontiguousarray(rows, dtype=np.float64), np.ones(X.shape[1]), np.ones(len(rows))
    x32 = torch.as_tensor(X, dtype=torch.float32)
    u, r = torch.ones(problems, X.shape[1]), torch.ones(problems, len(X))

    with single_threaded():
        best = fastest(rounds({"sk_forward": lambda: x64 @ w64, "sk_backward": lambda: r64 @ x64,
                               "forward": lambda: x32 @ u.T, "backward": lambda: r @ x32}, 5))
    sk = problems * (best["sk_forward"][1] + best["sk_backward"][1])
    ours = best["forward"][1] + best["backward"][1]
    return sk, ours, sk / ours


def scale_row(store, what: str, args) -> dict:
    """Time the three sweeps on one store in rounds; the row of the table."""
    groups = store.keys.groupby(["language", "subset"]).ngroups
    print(f"\n{what}: {groups} group(s) × {len(store.layers)} layers, d_model {store.d_model}", flush=True)
    common = dict(folds=5, n_boot=0, seed=args.seed)
    probe(store, layers=[store.layers[0]], **common)  # warm up: first calls of this shape
    runs = {"torch": lambda: probe(store, solver="torch", **common),
            "sklearn": lambda: probe(store, solver="sklearn", max_iter=10_000, n_jobs=args.threads, **common),
            "converged": lambda: probe(store, solver="sklearn", tol=1e-6, max_iter=10_000, n_jobs=args.threads,
                                       **common)}  # max_iter: each runs to its tolerance (1000 cuts 1e-6 short)
    results, fits = timed_sweeps(store, runs, args.repeat)
    best = fastest(results)
    keys = ["language", "subset", "layer"]
    f1 = {name: best[name][0].table.set_index(keys)["f1_mean"] for name in runs}
    row = {"size": f"{store.keys.groupby(['language', 'subset']).size().max()} × {store.d_model}",
           "what": what, "layers": len(store.layers), "groups": groups, "fits": fits,
           "method": fits["torch"]["method"],
           **{f"{name}_s": best[name][1] for name in runs},
           "ratio": median_ratio(results, "sklearn", "torch"),
           "ratio_converged": median_ratio(results, "converged", "torch"),
           "cpu": {name: best[name][2] for name in runs},
           "df1_torch": float((f1["torch"] - f1["converged"]).abs().max()),
           "df1_sklearn": float((f1["sklearn"] - f1["converged"]).abs().max()),
           "f1": f"{f1['converged'].min():.2f}–{f1['converged'].max():.2f}"}
    kappa = fits["torch"]["conditioning"]
    print(f"  torch ({row['method']}{f', conditioning {kappa:.1f}' if kappa else ''}) {row['torch_s']:.2f} s; "
          f"sklearn tol 1e-4 {row['sklearn_s']:.2f} s, speed-up {row['ratio']}; sklearn tol 1e-6 "
          f"{row['converged_s']:.2f} s, speed-up {row['ratio_converged']}; largest |dF1| against sklearn tol 1e-6: "
          f"torch {row['df1_torch']:.4f}, sklearn tol 1e-4 {row['df1_sklearn']:.4f} (F1 range {row['f1']})", flush=True)
    for name in runs:
        fit = fits[name]
        print(f"  {name}: iterations per problem max {fit['iter_max']}, median {fit['iter_median']:.0f}; passes "
              f"over X per layer {fit['passes']:.0f}", flush=True)
    row["ceiling"] = None  # exact Newton (the real sample, small sizes) does not work by passes
    if groups == 1 and "lbfgs" in row["method"]:
        sk_pass, torch_pass, row["ceiling"] = pass_ceiling(store)
        print(f"  one iteration's passes over the activations (one thread): scikit-learn {1e3 * sk_pass:.2f} ms for "
              f"the 6 problems in float64, torch {1e3 * torch_pass:.2f} ms in float32: {row['ceiling']:.1f}x at equal "
              "iteration counts", flush=True)
    if args.threads == 1:  # everything ran in this process: CPU time is comparable, and robust to a busy machine
        cpu = row["cpu"]
        print(f"  CPU time: torch {cpu['torch']:.2f} s, sklearn tol 1e-4 {cpu['sklearn']:.2f} s "
              f"({cpu['sklearn'] / cpu['torch']:.1f}x), tol 1e-6 {cpu['converged']:.2f} s "
              f"({cpu['converged'] / cpu['torch']:.1f}x)", flush=True)
    return row


def scale_table(args) -> None:
    """The speed-up from the bundled sample's size to research scale, torch against scikit-learn."""
    print(f"protocol: probe(folds=5 grouped, n_boot=0, no controls), the all-items probe kept; torch: --threads "
          f"{args.threads} (groups side by side, or one group's layers in threads); scikit-learn: n_jobs="
          f"{args.threads} processes over layers, BLAS one thread each; {args.repeat} round(s), turns alternating; "
          "times: the fastest round; speed-up: median of the within-round ratios", flush=True)
    spectrum = None
    if args.spectrum_from:
        spectrum, summary = store_spectrum(args.spectrum_from)
        print(summary, flush=True)
    probe(scale_store(40, 16, 1, 0)[0], solver="sklearn", n_jobs=args.threads, n_boot=0)  # start the worker processes
    table = []
    for size in args.sizes.split(","):
        n, d = (int(v) for v in size.lower().split("x"))
        if (n, d) == (136, 640) and not args.synthetic:
            if args.store:
                from babelprobe.extract import open_store

                stores = [(open_store(args.store), f"real store {args.store}", "real")]
            else:
                stores = [(*sample_store(Path(args.cache), False, args.groups), "real")]
        else:
            stores = []
            for kind in args.spectra.split(","):
                if kind == "isotropic":
                    stores.append((*scale_store(n, d, args.scale_layers, args.seed), "isotropic"))
                elif kind == "powerlaw":
                    stores.append((*powerlaw_store(n, d, args.scale_layers, args.seed, spectrum, args.signal),
                                   "store spectrum" if spectrum is not None else "power law"))
                else:
                    raise SystemExit(f"--spectra: unknown kind {kind!r}; use isotropic and/or powerlaw")
        for store, what, kind in stores:
            row = scale_row(store, what, args)
            row["kind"] = kind
            table.append(row)
            del store
    print_table(table)


def sampled_table(args) -> None:
    """`--sampled`: research sizes on a shared machine, where the whole scikit-learn sweep takes too long
    (at 4000 × 2048 with a real spectrum, ~300 CPU-seconds per layer at tol 1e-4, and 4-8x that at
    8000 × 4096). One layer of `powerlaw_store` per size; the six problems the sweep would fit on it (its 5
    grouped folds and the all-items probe): the torch solver fits all six, scikit-learn (tol 1e-4 and
    1e-6, max_iter 10,000) only the first `--sklearn-problems`, and its time is scaled by 6 / that number.
    The all-items problem has 25% more rows than a fold, so the scaling under-counts scikit-learn: the
    speed-up printed is a lower bound. Everything runs in this process on one thread, timed in CPU seconds
    (robust to other users of a shared machine) and wall seconds. Agreement: the F1 of each sampled fold
    on its held-out rows, torch against scikit-learn at tol 1e-6, and the largest decision-score
    difference relative to the largest score."""
    from babelprobe.probes.folds import make_folds, train_masks
    from babelprobe.probes.metrics import f1_scores

    spectrum = None
    if args.spectrum_from:
        spectrum, summary = store_spectrum(args.spectrum_from)
        print(summary, flush=True)
    k = args.sklearn_problems
    print(f"protocol: one layer, 6 problems (5 grouped folds + all items), C=1; torch: all 6, one thread; "
          f"scikit-learn: the first {k} fold(s), float64, one thread, times × 6/{k}; {args.repeat} round(s), turns "
          "alternating; CPU seconds (shared machine)", flush=True)
    rows = []
    for size in args.sizes.split(","):
        n, d = (int(v) for v in size.lower().split("x"))
        store, what = powerlaw_store(n, d, 1, args.seed, spectrum, args.signal)
        X = np.asarray(store.read_layers())  # [n, 1, d]
        labels = store.keys["label"].to_numpy()
        fold = make_folds(labels, store.keys["pair_id"].to_numpy(), 5, seed=args.seed)
        train = np.vstack([train_masks(fold, 5), np.ones((1, n), bool)])
        y = np.tile(labels, (6, 1))
        print(f"\n{what}", flush=True)
        runs = {"torch": partial(fit_predict, X, y, train, 1.0, solver="torch", return_fit=True),
                "sklearn": partial(fit_predict, X, y[:k], train[:k], 1.0, solver="sklearn", tol=1e-4,
                                   max_iter=10_000, n_jobs=1, return_fit=True),
                "converged": partial(fit_predict, X, y[:k], train[:k], 1.0, solver="sklearn", tol=1e-6,
                                     max_iter=10_000, n_jobs=1, return_fit=True)}
        with single_threaded():
            for solver in ("torch", "sklearn"):  # first calls (and imports) outside the clock
                fit_predict(X[:200, :, :64], y[:1, :200], train[:1, :200], 1.0, solver=solver, n_jobs=1)
            results = rounds(runs, args.repeat)
        best = fastest(results)
        cpu = {name: best[name][2] * (6 / k if name != "torch" else 1) for name in runs}
        wall = {name: best[name][1] * (6 / k if name != "torch" else 1) for name in runs}
        fits = {name: best[name][0][1] for name in runs}
        scores = {name: best[name][0][0][:k, 0] for name in runs}  # [k, n]
        held = ~train[:k]
        f1 = {name: np.array([f1_scores(scores[name][i, held[i]], labels[held[i]]) for i in range(k)])
              for name in runs}
        estimated = fits["torch"].info["conditioning"]
        kappa = float(np.nanmedian(estimated)) if np.isfinite(estimated).any() else float("nan")
        row = {"size": f"{n} × {d}", "what": what, "method": fits["torch"].method, "conditioning": kappa,
               "iters": {name: (int(fits[name].n_iter.max()), float(np.median(fits[name].n_iter))) for name in runs},
               "cpu": cpu, "wall": wall,
               "ratio": cpu["sklearn"] / cpu["torch"], "ratio_converged": cpu["converged"] / cpu["torch"],
               "df1_torch": float(np.abs(f1["torch"] - f1["converged"]).max()),
               "df1_sklearn": float(np.abs(f1["sklearn"] - f1["converged"]).max()),
               "score_gap": float(np.abs(scores["torch"] - scores["converged"]).max()
                                  / np.abs(scores["converged"]).max())}
        print(f"  torch ({row['method']}, conditioning {kappa:.1f}): iterations max / median "
              f"{row['iters']['torch'][0]} / {row['iters']['torch'][1]:.0f}, {cpu['torch']:.1f} CPU s "
              f"({wall['torch']:.1f} wall)", flush=True)
        for name, tol in (("sklearn", "1e-4"), ("converged", "1e-6")):
            print(f"  scikit-learn tol {tol}: iterations max / median {row['iters'][name][0]} / "
                  f"{row['iters'][name][1]:.0f}, {cpu[name]:.1f} CPU s for 6 problems ({wall[name]:.1f} wall), "
                  f"speed-up {cpu[name] / cpu['torch']:.1f}x (CPU), {wall[name] / wall['torch']:.1f}x (wall)",
                  flush=True)
        print(f"  held-out F1 of the sampled fold(s): largest |dF1| against scikit-learn tol 1e-6: torch "
              f"{row['df1_torch']:.4f}, scikit-learn tol 1e-4 {row['df1_sklearn']:.4f}; largest decision-score "
              f"difference torch vs tol 1e-6: {row['score_gap']:.2e} of the largest score", flush=True)
        rows.append(row)
    print("\n| items × dims | activations | torch method (conditioning) | iterations max / median: torch, sklearn "
          "1e-4, sklearn 1e-6 | torch CPU s | sklearn 1e-4 CPU s (×6/k) | speed-up | sklearn 1e-6 CPU s (×6/k) | "
          "speed-up | max abs dF1 vs 1e-6: torch / sklearn 1e-4 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        iters = ", ".join(f"{r['iters'][name][0]} / {r['iters'][name][1]:.0f}" for name in ("torch", "sklearn", "converged"))
        print(f"| {r['size']} | {r['what'].split(',')[0]} | {r['method']} ({r['conditioning']:.0f}) | {iters} | "
              f"{r['cpu']['torch']:.1f} | {r['cpu']['sklearn']:.1f} | {r['ratio']:.1f}x | {r['cpu']['converged']:.1f} | "
              f"{r['ratio_converged']:.1f}x | {r['df1_torch']:.4f} / {r['df1_sklearn']:.4f} |")


def print_table(table: list[dict]) -> None:
    print("\n| items × dims | activations | groups × layers | torch method | iterations max / median: torch, sklearn "
          "1e-4, sklearn 1e-6 | passes over X per layer: torch, sklearn 1e-4, sklearn 1e-6 | torch | sklearn "
          "(tol 1e-4) | speed-up | sklearn (tol 1e-6) | speed-up | max abs dF1 vs tol 1e-6: torch / sklearn 1e-4 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in table:
        fits = row["fits"]
        iters = ", ".join(f"{fits[name]['iter_max']} / {fits[name]['iter_median']:.0f}"
                          for name in ("torch", "sklearn", "converged"))
        passes = ", ".join("–" if np.isnan(fits[name]["passes"]) else f"{fits[name]['passes']:.0f}"
                           for name in ("torch", "sklearn", "converged"))
        if fits["torch"]["method"] == "plbfgs":
            passes = passes.replace(",", " + Gram,", 1)
        print(f"| {row['size']} | {row['kind']} | {row['groups']} × {row['layers']} | {row['method']} | {iters} | "
              f"{passes} | {row['torch_s']:.2f} s | {row['sklearn_s']:.2f} s | {row['ratio'].split(' ')[0]} | "
              f"{row['converged_s']:.2f} s | {row['ratio_converged'].split(' ')[0]} | "
              f"{row['df1_torch']:.4f} / {row['df1_sklearn']:.4f} |")


def gpu_activations(n: int, L: int, d: int, spectrum: str, device: torch.device, seed: int,
                    signal: float) -> tuple[np.ndarray, np.ndarray]:
    """The large case's activations [n, L, d] (float32, on the host) and labels (pairs adjacent).

    isotropic: standard normal plus a signal along one random direction growing with depth (the case
    timed first; it flatters first-order solvers). powerlaw: `powerlaw_store`'s construction (pair and own
    latents scaled by √λ of `powerlaw_spectrum`, one random rotation, the signal along the mid-spectrum
    eigenvector), drawn layer by layer on `device` (the rotation product is 0.7 TFLOP per layer at the
    default size: seconds on a GPU, minutes in numpy)."""
    labels = np.tile([1, 0], n // 2)
    X = np.empty((n, L, d), dtype=np.float32)  # 10.8 GB at the default size
    g = torch.Generator(device).manual_seed(seed)
    signs = torch.as_tensor(labels - 0.5, dtype=torch.float32, device=device)
    if spectrum == "isotropic":
        direction = torch.randn(d, generator=g, device=device)
        for j, strength in enumerate(np.linspace(0.2, 2, L) * 8 / np.sqrt(d)):
            layer = torch.randn(n, d, generator=g, device=device) + torch.outer(signs * float(strength), direction)
            X[:, j] = layer.cpu().numpy()
        return X, labels
    root = torch.as_tensor(np.sqrt(powerlaw_spectrum(d)), dtype=torch.float32, device=device)
    rotation, _ = torch.linalg.qr(torch.randn(d, d, generator=g, device=device))
    for j in range(L):
        pair = torch.randn(n // 2, d, generator=g, device=device).repeat_interleave(2, 0)
        latent = (pair * 2 + torch.randn(n, d, generator=g, device=device)) * root
        latent[:, d // 2] += signs * signal * root[d // 2] * (j + 1) / L
        X[:, j] = (latent @ rotation.T).cpu().numpy()
    return X, labels


def gpu_case(args) -> None:
    """20k items × 33 layers × 4096 dims, 5 grouped folds, one group: GPU time against CPU time (the same
    torch code on the CPU, and the scikit-learn loop), measured on part of the work and scaled to all."""
    device = torch.device(args.device or "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--gpu: torch sees no CUDA GPU here (use --device cpu with small sizes to check the script)")
    n, L, d = args.items, args.layers, args.dim
    start = time.perf_counter()
    X, labels = gpu_activations(n, L, d, args.gpu_spectrum, device, args.seed, args.signal)
    rng = np.random.default_rng(args.seed)
    fold = np.repeat(rng.permutation(np.arange(n // 2) % 5), 2)  # grouped by pair
    train = np.stack([fold != k for k in range(5)])
    y = np.tile(labels, (5, 1))
    print(f"large case: {n} items × {L} layers × {d} dims, {args.gpu_spectrum} activations (drawn in "
          f"{time.perf_counter() - start:.1f} s), 5 grouped folds ({int(train[0].sum())} training rows each), "
          f"C=1", flush=True)

    def run(on, layers, problems=5, **options):
        if on.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        scores, fit = fit_predict(X[:, :layers], y[:problems], train[:problems], 1.0, device=on,
                                  memory_gb=args.memory_gb, return_fit=True, **options)
        if on.type == "cuda":
            torch.cuda.synchronize()
        return scores, fit, time.perf_counter() - start

    def iterations(fit) -> str:
        return f"{fit.method}, iterations max / median {int(fit.n_iter.max())} / {float(np.median(fit.n_iter)):.0f}"

    run(device, 1)  # warm up (CUDA context, kernels)
    fast, fit, fast_s = run(device, L)
    peak = f", peak {torch.cuda.max_memory_allocated() / 2 ** 30:.1f} GiB" if device.type == "cuda" else ""
    print(f"{device}: {fast_s:.2f} s for {L} layers ({iterations(fit)}{peak})", flush=True)
    cpu_layers = min(args.cpu_layers, L)
    slow, fit, slow_s = run(torch.device("cpu"), cpu_layers)
    per_layer = slow_s / cpu_layers
    print(f"cpu torch ({args.threads} threads): {slow_s:.2f} s for {cpu_layers} layer(s) -> {per_layer * L:.1f} s "
          f"for {L} layers (scaled; {iterations(fit)}); speed-up {per_layer * L / fast_s:.1f}x; largest |score "
          f"difference| on the CPU layers {np.abs(fast[:, :cpu_layers] - slow).max():.2e}", flush=True)
    k = min(args.sklearn_problems, 5)
    jobs = min(args.threads, cpu_layers)  # over layers: one layer gets one process with every BLAS thread
    reference, fit, reference_s = run(torch.device("cpu"), cpu_layers, k, solver="sklearn", n_jobs=jobs,
                                      max_iter=10_000)
    per_layer = reference_s * 5 / k / cpu_layers
    print(f"sklearn loop (tol 1e-4, {jobs} process(es), {args.threads} threads; {iterations(fit)}): {reference_s:.2f} s for {k} of 5 "
          f"fold(s) × {cpu_layers} layer(s) -> {per_layer * L:.1f} s for 5 folds × {L} layers (scaled); speed-up "
          f"of {device} {per_layer * L / fast_s:.1f}x (goal >= 100x); decisions that differ on the CPU layers: "
          f"{((fast[:k, :cpu_layers] > 0) != (reference > 0)).mean():.2%}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synthetic", action="store_true", help="synthetic activations instead of the real store")
    parser.add_argument("--groups", type=int, help="only the first N language × subset groups (default all 40)")
    parser.add_argument("--tight-groups", type=int, default=4, help="groups also run with sklearn tol=1e-6 (0: none)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="CPU cores to use: the torch sweep solves this many groups at once (one thread "
                        "each), the sklearn loop runs this many single-threaded processes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="rounds in which the two solvers take turns (default 3)")
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "babelprobe" / "perf"),
                        help="where the extracted sample store is kept")
    parser.add_argument("--scale", action="store_true", help="the table over sizes (--sizes) instead")
    parser.add_argument("--sizes", default="136x640,1000x1024,4000x2048,8000x4096",
                        help="--scale: items × dims per row; 136x640 is the real sample store (unless --synthetic)")
    parser.add_argument("--scale-layers", type=int, default=2, help="--scale: layers of the synthetic groups")
    parser.add_argument("--spectra", default="isotropic,powerlaw",
                        help="--scale: the synthetic rows of each size: isotropic (planted signal, standardised "
                        "covariance close to I) and/or powerlaw (a real spectrum, see --spectrum-from)")
    parser.add_argument("--spectrum-from", metavar="STORE",
                        help="--scale: the powerlaw rows take the median spectrum of this activation store's layers "
                        "(default: slope -1.5 over the first half, condition 2.5e5)")
    parser.add_argument("--signal", type=float, default=4.0, help="--scale: separation of the powerlaw rows' "
                        "classes along their mid-spectrum direction, in own-noise deviations")
    parser.add_argument("--sampled", action="store_true", help="research sizes on a shared machine: one powerlaw "
                        "layer per --sizes, scikit-learn on --sklearn-problems of the 6 problems (see sampled_table)")
    parser.add_argument("--sklearn-problems", type=int, default=1,
                        help="--sampled, --gpu: folds scikit-learn fits (1-6; --gpu: 1-5), its time scaled to all")
    parser.add_argument("--store", help="the real row's store (default: xcomps-sample extracted into --cache)")
    parser.add_argument("--gpu", action="store_true", help="run the large GPU-against-CPU case instead")
    parser.add_argument("--device", help="--gpu: the fast device (default cuda)")
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--layers", type=int, default=33)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--cpu-layers", type=int, default=1, help="--gpu: layers timed on the CPU")
    parser.add_argument("--gpu-spectrum", default="powerlaw", choices=["powerlaw", "isotropic"],
                        help="--gpu: the activations' spectrum (see gpu_activations)")
    parser.add_argument("--memory-gb", type=float, default=16.0, help="--gpu: working memory of the solver")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with threadpool_limits(args.threads):
        if args.sampled:
            sampled_table(args)
        elif args.scale:
            scale_table(args)
        elif args.gpu:
            gpu_case(args)
        else:
            compare_solvers(args)


if __name__ == "__main__":
    main()
