"""babelprobe's `sae train` against SAELens on the same token states: equal width, k (L0) and tokens.

    PYTHONPATH=/tmp/sl .venv/bin/python perf/sae_train.py --tokens 204800 --width 4096 --k 64

SAELens is not a dependency (it cannot be installed beside transformer-lens 4); put it in a folder of
its own (README "SAE features") and add that folder to PYTHONPATH. The script reads the bundled `udhr`
corpus's training rows through the default model to `--layer` once, then trains

  - babelprobe's TopK SAE (`sae.train.fit`, given the batches), and
  - SAELens' `TopKTrainingSAE` with its own `SAETrainer` (data_provider = the same batches),

on the same sequence of batches (SAELens' mixing buffer over the cached states, one seed), with the same
learning rate, schedule (constant, the last fifth decayed), dead-feature window and activation scaling
(`expected_average_only_in`). Both are evaluated on the held-out rows' states (FVU around each
language's mean, pooled; L0; share of features that never fire there) and the wall time of each
training is printed with the ratio babelprobe / SAELens, measured in the same run.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=204_800)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--layer", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig
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

    settings = TrainSettings(layers=str(args.layer), width=args.width, k=args.k, tokens=args.tokens,
                             batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    start = time.perf_counter()
    trainer, state = fit(None, [], args.layer, settings, batches=batches(train, args.batch_size, args.seed))
    ours_seconds = time.perf_counter() - start
    ours = trainer.inference_sae(state.scale, args.layer)

    steps = args.tokens // args.batch_size
    cfg = SAETrainerConfig(total_training_samples=args.tokens, train_batch_size_samples=args.batch_size, lr=args.lr,
                           lr_end=args.lr / 10,  # SAETrainer asserts it is set (SAETrainerConfig leaves it None)
                           lr_decay_steps=int(steps * DECAY_SHARE), dead_feature_window=settings.dead_feature_window,
                           feature_sampling_window=10 ** 9, n_batches_for_norm_estimate=min(100, max(1, steps // 10)))
    torch.manual_seed(args.seed)
    theirs = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=lm.d_model, d_sae=args.width, k=args.k,
                                                   normalize_activations="expected_average_only_in"))
    start = time.perf_counter()
    SAETrainer(cfg, theirs, batches(train, args.batch_size, args.seed)).fit()
    theirs_seconds = time.perf_counter() - start
    state_dict = theirs.state_dict()
    theirs.process_state_dict_for_saving_inference(state_dict)
    theirs_sae = SAE(W_enc=state_dict["W_enc"], W_dec=state_dict["W_dec"], b_enc=state_dict["b_enc"],
                     b_dec=state_dict["b_dec"], architecture="topk", k=args.k, apply_b_dec_to_input=True,
                     rescale_acts_by_decoder_norm=False, layer=args.layer)

    print(f"width {args.width}, k {args.k}, {args.tokens:,} tokens, batch {args.batch_size}, lr {args.lr}")
    for name, sae, seconds in (("babelprobe", ours, ours_seconds), ("SAELens", theirs_sae, theirs_seconds)):
        row = evaluate(sae, held)
        print(f"  {name:10s} held-out FVU (pooled within languages) {row['fvu_pooled_within']:.3f}, per-language mean "
              f"{row['fvu_languages_mean']:.3f}, max {row['fvu_max']:.3f}; L0 {row['l0']:.1f}; dead on held-out "
              f"{row['dead_heldout']:.1%}; {seconds:.0f} s")
    print(f"  time ratio babelprobe / SAELens: {ours_seconds / theirs_seconds:.2f} (same machine, same run)")


if __name__ == "__main__":
    main()
