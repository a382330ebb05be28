"""`babelprobe intervene`: switch an edit on inside the model and read out, on the same pairs, whether the
model's own judgement changes (direct, meta) and what a probe sees.

    babelprobe intervene --model default --items xcomps-sample --probes cmp/ --layers peak --method ablate \\
        --out cmp/intervene/
    babelprobe intervene --probes cmp/ --method steer --alpha=-4,-2,0,2,4 --layers 4-12 --out cmp/steer/
    babelprobe intervene --probes cmp/ --method leace --layers peak --out cmp/leace/
    babelprobe intervene --method neurons --neurons neu/ --off en,zh --readouts direct,meta --out neu/deact/
    babelprobe intervene --method neurons --neurons neu/ --readouts ppl --corpus udhr --out neu/ppl/
    babelprobe report --results cmp/          # adds the interventions' figures and table to report.md

Edit sources. Probe directions (--method steer, ablate, leace; --probes: a compare directory, a probe
result NAME.csv with NAME.probes.h5 beside it, or an activation store, from which fresh probes are
fitted into OUT/probes/): steer adds α·σ·ŵ (σ the standard deviation of the states along ŵ; α a list
for a dose–response curve), ablate sets the component along ŵ to 0 (or with --ablate-to mean to the
mean of the two class means; α the fraction), leace applies LEACE concept erasure (concept-erasure
package); at --layers (`peak`: each language × subset group's peak layer, or numbers and ranges like 6,
0-4,12). Controls: --random N random unit directions edited the same way, and the direction of a probe
fitted on shuffled labels. A steer moves every direction by the same α·σ; an ablation removes each
direction's own component, whose size can differ a lot: compare the edit_norm column.

Language neurons (--method neurons, --neurons: a `babelprobe neurons` directory): for each language of
--off, its LAPE-selected neurons are switched off (their MLP activation set to 0) and every language of
the items is scored; control: --random N draws of as many random unselected neurons per layer.

Readouts, with and without the edit: direct, meta, and probe (with --probes: the probe re-read on the
edited states at --layers); ppl (--method neurons or sae, --corpus SOURCE): each language's mean token
NLL and perplexity on the corpus's held-out text with each language's edit, corpus.csv and the figure
ppl_change (neurons: Tang et al.'s matrix) or ce_change (sae: Deng et al.'s). Writes interventions.csv (one row per pair × edit; join with a compare
directory's items.csv on pair_id), summary.csv (effects with 95% paired bootstrap intervals), sanity.csv
(probe directions: the probe's balanced accuracy after the edit; ablating its own direction must bring it
to chance), intervene.json and figures/. Every input is checked before the model loads; the same command
again reuses the finished run, an interrupted one resumes.
"""

from __future__ import annotations

from babelprobe.cli.common import (
    add_items_options,
    add_model_options,
    add_runtime_options,
    add_settings_options,
    items_from,
    runtime_from,
)


def register(sub) -> None:
    import argparse

    from babelprobe.interventions.settings import Settings

    parser = sub.add_parser("intervene", help="edit inside the model (probe directions, language neurons); "
                            "direct/meta/probe effects", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    add_items_options(parser)
    group = parser.add_argument_group("inputs and output")
    group.add_argument("--probes", metavar="DIR|FILE",
                       help="compare directory, probe result (NAME.csv / NAME.probes.h5) or activation store: the "
                       "probe directions, and the probe readout")
    from babelprobe.interventions.source import inputs

    for name, text in inputs().items():  # each edit source's own input (interventions.source.SOURCES)
        group.add_argument(f"--{name}", metavar="DIR", help=text)
    group.add_argument("--corpus", metavar="SOURCE", help="--readouts ppl: the text corpus whose held-out part is read "
                       "(udhr, a folder of <lang>.txt, a .parquet/.jsonl with text and language, hf:ORG/NAME)")
    group.add_argument("--out", required=True, metavar="DIR", help="output directory")
    add_settings_options(parser, Settings, "intervene settings (recorded in intervene.json)")
    group = parser.add_argument_group("summary (changes no row)")
    group.add_argument("--n-boot", type=int, default=1000, metavar="N", help="bootstrap replicates (default 1000)")
    add_runtime_options(parser, ("batch_tokens", "overwrite", "progress"))
    parser.set_defaults(func=run)


def run(args) -> int:
    from babelprobe.analysis.interventions import effect_table, sanity_lines
    from babelprobe.cli.common import settings_from
    from babelprobe.interventions import intervene
    from babelprobe.interventions.settings import Settings
    from babelprobe.interventions.source import inputs

    settings = settings_from(args, Settings)
    ppl_only = set(settings.readouts) == {"ppl"}
    items = None if ppl_only and args.items == "xcomps-sample" else items_from(args)
    result = intervene(items, args.out, settings, runtime_from(args), probes=args.probes,
                       inputs={name: getattr(args, name) for name in inputs()}, corpus=_corpus(args),
                       n_boot=args.n_boot)
    if result.corpus is not None:
        print(corpus_lines(result.corpus))
    table = effect_table(result.summary)
    if len(table):
        print("effect of the edit (with − without; mean over pairs, 95% paired bootstrap interval):")
        print(table.to_string(index=False))
    for line in sanity_lines(result.sanity):
        print(f"sanity: {line}")
    for name, value in result.checks.items():
        print(f"check: {name} = {value:.3g}" if isinstance(value, float) else f"check: {name} = {value}")
    written = "corpus.csv, " if result.corpus is not None else ""
    if len(result.rows):
        written += f"interventions.csv ({len(result.rows)} rows), summary.csv, sanity.csv, "
    print(f"wrote {written}{len(result.figures)} figures to {args.out}")
    return 0


def _corpus(args):
    """--corpus, restricted to --languages when they are given (the ppl readout's evaluated languages)."""
    if args.corpus is None or not args.languages:
        return args.corpus
    from babelprobe.corpus import read_corpus

    return read_corpus(args.corpus, args.languages)


def corpus_lines(table) -> str:
    """The ppl readout's matrix as text: per edited language, Δ perplexity on each evaluated language."""
    main = table[table["direction"] != "random"]
    value = "delta_ppl" if main["edit_source"].iloc[0] == "neurons" else "delta_nll"
    grid = main.pivot_table(index="off", columns="language", values=value, aggfunc="mean")
    name = "Δ perplexity" if value == "delta_ppl" else "Δ cross-entropy (nats)"
    return f"{name} on the corpus's held-out text (rows: edited language; columns: evaluated language):\n" + \
        grid.round(3).to_string()
