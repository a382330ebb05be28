"""babelprobe's `sae train` against SAELens on the same token states: equal width, tokens and L0.

    PYTHONPATH=/tmp/sl .venv/bin/python perf/sae_train.py --tokens 204800 --width 4096 --k 64
    PYTHONPATH=/tmp/sl .venv/bin/python perf/sae_train.py --architecture jumprelu --width 1024 --l1 1,5,25

SAELens is not a dependency (it cannot be installed beside transformer-lens 4); put it in a folder of
its own (README "SAE features") and add that folder to PYTHONPATH. The script reads the bundled `udhr`
corpus's training rows through the default model to `--layer` once, then trains

  - babelprobe's SAE (`sae.train.fit`, given the batches), and
  - SAELens' training SAE of the same architecture (`TopKTrainingSAE`, `JumpReLUTrainingSAE` or
    `StandardTrainingSAE`) with its own `SAETrainer` (data_provider = the same batches),

on the same sequence of batches (SAELens' mixing buffer over the cached states, one seed), with the same
learning rate, dead-feature window, activation scaling (`expected_average_only_in`, estimated on the same
first batches) and, for jumprelu and standard, the same objective: SAELens' config is set field by field
from babelprobe's (`saelens_sae`: the coefficient `--l1` as l0_coefficient / l1_coefficient, its warm-up
over the first 5% of steps, JumpReLU's bandwidth 0.05, initial threshold 0.01, the "step" L0 loss with
the straight-through estimator to the threshold only, no pre-activation loss; L1 with p = 1 on
f·‖W_dec‖; decoder rows initialised to norm 0.1; b_dec subtracted from the input).

The learning-rate schedule: babelprobe keeps lr constant, then decays it linearly to a tenth over the last
fifth of steps; SAELens' "constant" scheduler with lr_decay_steps decays to zero (its constant scheduler
ignores lr_end). `--saelens-lr matched` (the default for jumprelu and standard) gives SAELens' trainer
babelprobe's schedule so that both train with the same hyperparameters; `own` (the default for topk, as
the TopK numbers in the README were measured) keeps SAELens' own decay to zero.

A sparsity-penalised SAE does not fix its L0, so `--l1` takes a list: each coefficient trains both sides
and the table gives coefficient -> (L0, FVU) for each; FVU is then compared at equal L0, each side's FVU
interpolated over log L0 between its own runs at the other side's L0s. Both are evaluated on the held-out
rows' states (FVU around each language's mean, pooled; L0; share of features that never fire there) and
the wall time of each training is printed with the ratio babelprobe / SAELens, measured in the same run.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import torch


def batches(states: torch.Tensor, batch_size: int, seed: int):
    """Endless: the cached states, each epoch in a seeded order, through SAELens' mixing buffer."""
    from babelprobe.sae.stream import mixing_buffer

    def epochs():
        for epoch in itertools.count():
            order = torch.randperm(len(states), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
            for start in range(0, len(states), 8192):
                yield states[order[start:start + 8192]]

    return mixing_buffer(min(16 * batch_size, len(states)), batch_size, epochs(),
                         torch.Generator().manual_seed(seed))


def evaluate(sae, held: dict[str, torch.Tensor]) -> dict:
    error = variance = fired_tokens = n = 0.0
    fired = torch.zeros(sae.d_sae, dtype=torch.bool)
    per = {}
    for code, x in held.items():
        with torch.no_grad():
            f = sae.encode(x)
            e = float((x - sae.decode(f)).double().square().sum())
            v = float((x.double() - x.double().mean(0)).square().sum())
        per[code] = e / v
        error, variance = error + e, variance + v
        fired |= (f > 0).any(0)
        fired_tokens += float((f > 0).sum())
        n += len(x)
    return {"fvu_languages_mean": float(np.mean(list(per.values()))), "fvu_max": max(per.values()),
            "fvu_pooled_within": error / variance, "l0": fired_tokens / n, "dead_heldout": float((~fired).float().mean())}


def saelens_sae(architecture: str, d_in: int, settings, steps: int):
    """SAELens' training SAE of `architecture` with its config set from babelprobe's settings, field by field."""
    from sae_lens import (
        JumpReLUTrainingSAE,
        JumpReLUTrainingSAEConfig,
        StandardTrainingSAE,
        StandardTrainingSAEConfig,
        TopKTrainingSAE,
        TopKTrainingSAEConfig,
    )

    from babelprobe.sae.train import (
        DECODER_INIT_NORM,
        JUMPRELU_BANDWIDTH,
        JUMPRELU_INIT_THRESHOLD,
        WARM_UP_SHARE,
    )

    common = dict(d_in=d_in, d_sae=settings.width, apply_b_dec_to_input=True,
                  normalize_activations="expected_average_only_in", decoder_init_norm=DECODER_INIT_NORM)
    warm = max(1, int(steps * WARM_UP_SHARE))  # babelprobe's warm-up of λ (sae/train.py `fit`)
    if architecture == "topk":
        return TopKTrainingSAE(TopKTrainingSAEConfig(k=settings.k, **common))
    if architecture == "jumprelu":
        return JumpReLUTrainingSAE(JumpReLUTrainingSAEConfig(
            l0_coefficient=settings.l1, l0_warm_up_steps=warm, jumprelu_bandwidth=JUMPRELU_BANDWIDTH,
            jumprelu_init_threshold=JUMPRELU_INIT_THRESHOLD, jumprelu_sparsity_loss_mode="step",
            jumprelu_ste_to_input=False, pre_act_loss_coefficient=None, **common))
    return StandardTrainingSAE(StandardTrainingSAEConfig(l1_coefficient=settings.l1, lp_norm=1.0,
                                                         l1_warm_up_steps=warm, **common))


def babelprobe_schedule(steps: int):
    """babelprobe's learning-rate factor at each step (sae/train.py `fit`): 1, then linearly down to a tenth
    over the last DECAY_SHARE of steps."""
    from babelprobe.sae.train import DECAY_SHARE

    decay_from = int(steps * (1 - DECAY_SHARE))
    return lambda step: 1.0 if step < decay_from else 0.1 + 0.9 * (steps - step) / max(1, steps - decay_from)


def at_l0(rows: list[dict], l0: float) -> float | None:
    """FVU of one side's runs interpolated linearly over log L0 at `l0`; None outside their range."""
    points = sorted((np.log(r["l0"]), r["fvu_pooled_within"]) for r in rows if r["l0"] > 0)
    if not points or not points[0][0] - 1e-9 <= np.log(l0) <= points[-1][0] + 1e-9:
        return None
    return float(np.interp(np.log(l0), [p[0] for p in points], [p[1] for p in points]))


def main() -> None:
    from babelprobe.sae.settings import TRAIN_ARCHITECTURES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architecture", choices=TRAIN_ARCHITECTURES, default="topk")
    parser.add_argument("--tokens", type=int, default=204_800)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--k", type=int, default=64, help="topk: features active per token")
    parser.add_argument("--l1", default="5", help="jumprelu, standard: the sparsity coefficient λ (babelprobe's "
                        "--l1: SAELens' l0_coefficient / l1_coefficient); a comma list trains each")
    parser.add_argument("--saelens-lr", choices=("matched", "own"), default=None,
                        help="SAELens' learning-rate schedule: babelprobe's (matched) or its own decay to zero "
                        "(own); default: own for topk, matched for jumprelu and standard")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--layer", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    coefficients = [None] if args.architecture == "topk" else [float(c) for c in args.l1.split(",")]
    schedule = args.saelens_lr or ("own" if args.architecture == "topk" else "matched")

    from sae_lens.config import SAETrainerConfig
    from sae_lens.training.sae_trainer import SAETrainer

    from babelprobe.corpus import packed, read_corpus
    from babelprobe.models import load_model
    from babelprobe.sae.settings import TrainSettings
    from babelprobe.sae.stream import layer_states
    from babelprobe.sae.train import DECAY_SHARE, fit
    from babelprobe.sae.weights import SAE

    lm = load_model("default")
    corpus = read_corpus("udhr")
    train = torch.cat([layer_states(lm, rows, args.layer) for rows in packed(lm, corpus, "train", 128).values()])
    held = {code: layer_states(lm, rows, args.layer)
            for code, rows in packed(lm, corpus, "heldout", 128, keep_last=True).items()}
    print(f"states: {len(train):,} training tokens, {sum(map(len, held.values())):,} held-out tokens, layer {args.layer}")
    print(f"{args.architecture}, width {args.width}, " + (f"k {args.k}, " if args.architecture == "topk" else "")
          + f"{args.tokens:,} tokens, batch {args.batch_size}, lr {args.lr}, SAELens lr schedule: {schedule}",
          flush=True)

    steps = args.tokens // args.batch_size
    results = {"babelprobe": [], "SAELens": []}
    for coefficient in coefficients:
        settings = TrainSettings(layers=str(args.layer), architecture=args.architecture, width=args.width, k=args.k,
                                 l1=5.0 if coefficient is None else coefficient, tokens=args.tokens,
                                 batch_size=args.batch_size, lr=args.lr, seed=args.seed)
        start = time.perf_counter()
        trainer, state = fit(None, [], args.layer, settings, batches=batches(train, args.batch_size, args.seed))
        ours_seconds = time.perf_counter() - start
        ours = trainer.inference_sae(state.scale, args.layer)

        cfg = SAETrainerConfig(total_training_samples=args.tokens, train_batch_size_samples=args.batch_size,
                               lr=args.lr, lr_end=args.lr / 10,  # SAETrainer asserts it is set
                               lr_decay_steps=int(steps * DECAY_SHARE),
                               dead_feature_window=settings.dead_feature_window, feature_sampling_window=10 ** 9,
                               n_batches_for_norm_estimate=min(100, max(1, steps // 10)))
        torch.manual_seed(args.seed)
        theirs = saelens_sae(args.architecture, lm.d_model, settings, steps)
        start = time.perf_counter()
        sae_trainer = SAETrainer(cfg, theirs, batches(train, args.batch_size, args.seed))
        if schedule == "matched":
            sae_trainer.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(sae_trainer.optimizer,
                                                                         babelprobe_schedule(steps))
        sae_trainer.fit()
        theirs_seconds = time.perf_counter() - start
        state_dict = theirs.state_dict()
        theirs.process_state_dict_for_saving_inference(state_dict)  # topk: decoder norms folded; else as is
        theirs_sae = SAE(W_enc=state_dict["W_enc"], W_dec=state_dict["W_dec"], b_enc=state_dict["b_enc"],
                         b_dec=state_dict["b_dec"], architecture=args.architecture,
                         threshold=state_dict.get("threshold"), k=args.k if args.architecture == "topk" else None,
                         apply_b_dec_to_input=True, rescale_acts_by_decoder_norm=False, layer=args.layer)

        label = f"k {args.k}" if coefficient is None else f"λ {coefficient:g}"
        for name, sae, seconds in (("babelprobe", ours, ours_seconds), ("SAELens", theirs_sae, theirs_seconds)):
            row = evaluate(sae, held)
            results[name].append({"coefficient": coefficient, "seconds": seconds, **row})
            print(f"  {label:7s} {name:10s} held-out FVU (pooled within languages) {row['fvu_pooled_within']:.3f}, "
                  f"per-language mean {row['fvu_languages_mean']:.3f}, max {row['fvu_max']:.3f}; L0 {row['l0']:.1f}; "
                  f"dead on held-out {row['dead_heldout']:.1%}; {seconds:.0f} s", flush=True)
        print(f"  {label:7s} time ratio babelprobe / SAELens: {ours_seconds / theirs_seconds:.2f} "
              "(same machine, same run)", flush=True)

    if args.architecture == "topk":
        return
    print("\n| λ | babelprobe L0 | babelprobe FVU | SAELens L0 | SAELens FVU | babelprobe s | SAELens s |")
    print("|---|---|---|---|---|---|---|")
    for ours, theirs in zip(results["babelprobe"], results["SAELens"]):
        print(f"| {ours['coefficient']:g} | {ours['l0']:.1f} | {ours['fvu_pooled_within']:.3f} | {theirs['l0']:.1f} | "
              f"{theirs['fvu_pooled_within']:.3f} | {ours['seconds']:.0f} | {theirs['seconds']:.0f} |")
    total = (sum(r["seconds"] for r in results["babelprobe"]), sum(r["seconds"] for r in results["SAELens"]))
    print(f"time ratio babelprobe / SAELens over the sweep: {total[0] / total[1]:.2f}")
    print("\nFVU at equal L0 (the other side's FVU interpolated over log L0 between its own runs):")
    for side, other in (("babelprobe", "SAELens"), ("SAELens", "babelprobe")):
        for row in results[side]:
            theirs = at_l0(results[other], row["l0"])
            if theirs is None:
                print(f"  {side} λ {row['coefficient']:g}, L0 {row['l0']:.1f}: outside {other}'s L0 range")
                continue
            ours_fvu, theirs_fvu = ((row["fvu_pooled_within"], theirs) if side == "babelprobe"
                                    else (theirs, row["fvu_pooled_within"]))
            print(f"  at L0 {row['l0']:.1f} ({side} λ {row['coefficient']:g}): babelprobe {ours_fvu:.3f}, SAELens "
                  f"{theirs_fvu:.3f}, difference babelprobe − SAELens {ours_fvu - theirs_fvu:+.3f}")


if __name__ == "__main__":
    main()
