"""`babelprobe intervene`: edit the residual stream along each probe's direction and read out, on the same
pairs, whether the model's own judgement changes (direct, meta) and what the probe sees.

    babelprobe intervene --model default --items xcomps-sample --probes cmp/ --layers peak --method ablate \\
        --out cmp/intervene/
    babelprobe intervene --probes cmp/ --method steer --alpha=-4,-2,0,2,4 --layers 4-12 --out cmp/steer/
    babelprobe intervene --probes cmp/ --method leace --layers peak --out cmp/leace/
    babelprobe report --results cmp/          # adds the interventions' figures and table to report.md

--probes: a compare directory, a probe result (NAME.csv with NAME.probes.h5 beside it) or an activation
store (fresh probes are fitted and kept in OUT/probes/). --layers: `peak` (each language × subset
group's peak layer in the probe results), or numbers and ranges (`6`, `0-4,12`). Methods: steer (add
α·σ·ŵ, σ the standard deviation of the states along ŵ; α a list for a dose–response curve), ablate (the
component along ŵ set to 0, or with --ablate-to mean to the mean of the two class means; α the fraction),
leace (LEACE concept erasure, concept-erasure package). Controls on every edit: --random N random unit
directions, edited the same way, and the direction of a probe fitted on shuffled labels. A steer moves
every direction by the same α·σ; an ablation removes each direction's own component, whose size can
differ a lot: compare the edit_norm column (--ablate-to mean leaves out each direction's offset).

Writes interventions.csv (one row per pair × layer × method × direction × α; join with the compare
directory's items.csv on pair_id), summary.csv (effects with 95% paired bootstrap intervals), sanity.csv
(the probe's balanced accuracy after the edit: ablating its own direction must bring it to chance; and
a probe refitted after the edit, cross-fitted for the probe's own direction),
intervene.json and figures/. The same command again reuses the finished run; an interrupted one resumes.
"""

from __future__ import annotations

from babelprobe.cli.common import add_items_options, add_model_options, comma_list, items_from, model_from


def register(sub) -> None:
    import argparse

    parser = sub.add_parser("intervene", help="edit activations along probe directions; direct/meta/probe effects",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    add_items_options(parser)
    parser.add_argument("--probes", required=True, metavar="DIR|FILE",
                        help="compare directory, probe result (NAME.csv / NAME.probes.h5) or activation store")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--layers", default="peak",
                        help="'peak' (each group's peak layer, default) or layers like 6 or 0-4,12")
    parser.add_argument("--method", default="ablate", metavar="LIST",
                        help="steer, ablate, leace, or a comma-separated list (default ablate)")
    parser.add_argument("--alpha", default=None, metavar="LIST",
                        help="strengths, written --alpha=-4,-2,0,2,4 (with '=' when the list starts with a minus): "
                        "steer in standard deviations along the direction "
                        "(default -4,-2,0,2,4); ablate and leace the fraction of the edit (default 1)")
    parser.add_argument("--ablate-to", choices=("zero", "mean"), default="zero",
                        help="ablate: project the direction out (zero, default) or set the component to the mean of "
                        "the two class means (mean)")
    parser.add_argument("--positions", choices=("all", "last"), default="all",
                        help="edit every token (default) or each text's last token (probe readout only)")
    parser.add_argument("--random", type=int, default=3, metavar="N",
                        help="random unit directions as controls, edited like the probe's (default 3)")
    parser.add_argument("--no-shuffled", action="store_true", help="leave out the shuffled-label probe control")
    parser.add_argument("--readouts", type=comma_list, default=["direct", "meta", "probe"], metavar="LIST",
                        help="direct, meta, probe (default all three)")
    parser.add_argument("--reduction", default=None, help="direct/meta score reduction (default: the compare run's, sum)")
    parser.add_argument("--rule", choices=("sum", "both", "first"), default=None,
                        help="meta rule (default: the compare run's, sum)")
    parser.add_argument("--prompts", default=None, metavar="NAME|FILE.tsv",
                        help="meta prompt set (default: the compare run's, xcomps)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random directions, label shuffle, bootstrap")
    parser.add_argument("--n-boot", type=int, default=1000, metavar="N", help="bootstrap replicates (default 1000)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="token budget per batch")
    parser.add_argument("--overwrite", action="store_true", help="replace a run of other settings in --out")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def run(args) -> int:
    from babelprobe.analysis.interventions import effect_table, sanity_lines
    from babelprobe.errors import BabelprobeError
    from babelprobe.interventions import intervene

    if args.n_boot < 0:
        raise BabelprobeError(f"--n-boot must be 0 or more, got {args.n_boot}")
    result = intervene(model_from(args), items_from(args), args.probes, args.out, layers=args.layers,
                       methods=args.method, alphas=args.alpha, ablate_to=args.ablate_to, positions=args.positions,
                       n_random=args.random, shuffled=not args.no_shuffled, readouts=args.readouts, seed=args.seed,
                       reduction=args.reduction, rule=args.rule, prompts=args.prompts, batch_tokens=args.batch_tokens,
                       n_boot=args.n_boot, overwrite=args.overwrite, progress=not args.no_progress)
    table = effect_table(result.summary)
    if len(table):
        print("effect of the edit (with − without; mean over pairs, 95% paired bootstrap interval):")
        print(table.to_string(index=False))
    for line in sanity_lines(result.sanity):
        print(f"sanity: {line}")
    for name, value in result.checks.items():
        print(f"check: {name} = {value:.3g}" if isinstance(value, float) else f"check: {name} = {value}")
    print(f"wrote interventions.csv ({len(result.rows)} rows), summary.csv, sanity.csv and {len(result.figures)} "
          f"figures to {args.out}")
    return 0
