"""What an L-layer patching sweep costs against L plain forward passes of the same target prompts,
measured in the same run (issue 30): target ≤ 1.15×.

The sweep is `babelprobe patch --protocol translation --exp exp1` on real prompts: per target prompt,
one unpatched copy and one copy per layer 1..L whose block-j output at the last token is replaced by a
source prompt's (`patching.core.patched_copies`: the prompt before the patched position runs once,
with a key/value cache, and the copies run only from there, all in one batch). The source pass that
gives the states is cached: it runs once before the rounds, as in the command. The baseline runs the
same target prompts through the model L times, plain (`lm.parts.body`, batched as the sweep).

    .venv/bin/python perf/patch.py
    .venv/bin/python perf/patch.py --n-pairs 20 --repeat 5

The compared runs take turns within each round (perf/timing.py) and the median ratio within rounds is
reported: the machine these run on may be shared and its speed drifts, so compare ratios, and rerun on a
quiet machine for the absolute times.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import fastest, median_ratio, ratios, rounds  # noqa: E402  (perf/timing.py)

from babelprobe.models import length_batches, load_model, pad_batch  # noqa: E402
from babelprobe.patching import translation  # noqa: E402
from babelprobe.patching.core import UNPATCHED, Target, patched_copies, read_states  # noqa: E402
from babelprobe.patching.settings import TranslationSettings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--n-pairs", type=int, default=10, help="source/target pairs (default 10)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="token budget per batch, both sides")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    args = parser.parse_args()

    lm = load_model(args.model, device="cpu", dtype="float32")
    settings = TranslationSettings(exps="exp1", n_pairs=args.n_pairs)
    words = translation.check_concepts(translation.load_concepts("xcomps-sample"), settings, "xcomps-sample")
    prompts = translation.Prompts(words, settings.shots, settings.seed)
    plan = translation.plan_pairs(lm, prompts, translation.configs(settings)[0], args.n_pairs, settings.seed)
    layers = list(range(1, lm.n_layers + 1))
    target_ids = [lm.encode([text])[0] for text in plan.pairs["target_prompt"]]
    source_ids = [lm.encode([texts[0]])[0] for texts in plan.pairs["source_prompts"]]
    # the source pass, cached as in the command: block outputs 1..L at each source's last token
    states, _ = read_states(lm, source_ids, [len(e.ids) - 1 for e in source_ids],
                            [[len(e.ids) - 1] for e in source_ids], args.batch_tokens)
    targets = [Target(e.ids, len(e.ids) - 1, [len(e.ids) - 1], states[i:i + 1],
                      [UNPATCHED] + [(0, (j,)) for j in layers]) for i, e in enumerate(target_ids)]
    tokens = sum(len(e.ids) for e in target_ids)
    print(f"{lm.name}: {len(targets)} target prompts, {tokens} tokens, {len(layers)} layers, "
          f"{torch.get_num_threads()} threads; the machine may be shared: read the ratios")

    def sweep():
        return patched_copies(lm, targets, args.batch_tokens)

    def plain():
        last = torch.empty((len(target_ids), lm.d_model))
        with torch.inference_mode():
            for _ in layers:
                for batch in length_batches([len(e.ids) for e in target_ids], args.batch_tokens):
                    padded = pad_batch([target_ids[i] for i in batch], lm.pad_token_id, "left", lm.device)
                    last[batch] = lm.parts.body(**padded, use_cache=False).last_hidden_state[:, -1].float().cpu()
        return last

    results = rounds({f"{len(layers)} plain forwards": plain, f"{len(layers)}-layer sweep": sweep}, args.repeat)
    for name, (_, wall, cpu) in fastest(results).items():
        print(f"  {name:28s} fastest {wall:7.2f} s wall, {cpu:7.2f} s CPU")
    # the sweep's unpatched copy is the plain run's last-token state (after the final norm)
    unpatched = torch.stack([o[0, 0].cpu() for o in fastest(results)[f"{len(layers)}-layer sweep"][0]])
    reference = fastest(results)[f"{len(layers)} plain forwards"][0]
    print(f"unpatched copy vs plain forward: max |Δ| {float((unpatched - reference).abs().max()):.2e}")
    median = float(np.median(ratios(results, f"{len(layers)}-layer sweep", f"{len(layers)} plain forwards")))
    verdict = "within" if median <= 1.15 else "ABOVE"
    print(f"sweep / {len(layers)} plain forwards: "
          f"{median_ratio(results, f'{len(layers)}-layer sweep', f'{len(layers)} plain forwards')}; "
          f"target ≤ 1.15x: {verdict}")


if __name__ == "__main__":
    main()
