"""`babelprobe sae`: an SAE-feature view per language, and the two ways to get an SAE.

    babelprobe sae fetch --release gemma-scope-2-270m-pt-res --sae-id layer_12_width_16k_l0_medium --out saes/l13
    babelprobe sae train --model default --corpus udhr --layers 6 --width 4096 --tokens 2000000 --out saes/l6
    babelprobe sae --model default --items xcomps-sample --sae saes/l6 --acts acts/ --out sae/
    babelprobe sae --model default --items xcomps-sample --sae saes/l6 --also-sae saes/l7 --protocol paper --out sae67/
    babelprobe report --results sae/

`--sae DIR` is a Gemma Scope 2 folder (params.safetensors [+ config.json]) or a SAELens folder (cfg.json
+ sae_weights.safetensors), read offline; its config says which layer it reads (Gemma Scope 2's
model.layers.N.output is babelprobe layer N+1). The run writes features.csv (each feature's mean
activation, firing frequency and monolinguality ν per language, every token but BOS), fit.csv (FVU and
L0 per language, over every token and over the last-token states), sparse_probe.csv (probes on the k
features that best separate the classes in each training fold, against the dense probe on the same
folds), ablate.csv (the direct margins of the same pairs with each language's most specific features
removed, and random feature sets as controls; joins compare's items.csv on pair_id) and sae.json.
`--also-sae DIR` (repeatable) ablates the features of SAEs at other layers in the same forward pass, each
ranked by its own ν on the same items (Deng et al.'s --modified_layer_num: layers L, L+1, ... at once).
`sae fetch` needs the network once (huggingface_hub); `sae train` trains an SAE on a corpus's token
stream as SAELens does (TopK, JumpReLU or L1 ReLU), reports its held-out fit and saves it in the SAELens
layout.
"""

from __future__ import annotations

import argparse

from babelprobe.cli.common import (
    add_items_options,
    add_model_options,
    add_runtime_options,
    add_settings_options,
    comma_list,
)


def register(sub) -> None:
    from babelprobe.sae.settings import Settings, TrainSettings

    parser = sub.add_parser("sae", help="SAE features per language: monolinguality, fit, sparse probes, ablation; "
                            "`sae fetch`, `sae train`", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    add_items_options(parser)
    group = parser.add_argument_group("the SAE run")
    group.add_argument("--sae", metavar="DIR", help="the SAE folder (Gemma Scope 2 or SAELens layout)")
    group.add_argument("--also-sae", metavar="DIR", action="append", help="an SAE folder of another layer whose "
                       "features are ablated with --sae's, in the same forward pass, each ranked by its own ν on the "
                       "same items (repeatable; Deng et al.'s --modified_layer_num)")
    group.add_argument("--acts", metavar="DIR", help="activation store of the same model and items holding the SAE's "
                       "layer (its last-token states feed the sparse probes; default: the run's own pass)")
    group.add_argument("--out", metavar="DIR", help="output directory")
    add_settings_options(parser, Settings, "settings (recorded in sae.json)")
    group.add_argument("--n-boot", type=int, default=1000, metavar="N",
                       help="bootstrap replicates of the ablation's summary (default 1000)")
    add_runtime_options(parser, ("batch_tokens", "overwrite", "progress"))
    parser.set_defaults(func=run)

    commands = parser.add_subparsers(dest="sae_command", metavar="fetch|train")
    fetch = commands.add_parser("fetch", help="download a published SAE folder (Gemma Scope 2, SAELens registry)",
                                description="Download one SAE folder from the Hugging Face hub into OUT, for --sae "
                                "OUT offline. --release/--sae-id as in SAELens' registry (gemma-scope-2-270m-pt-res "
                                "+ layer_12_width_16k_l0_medium), or --release ORG/REPO --sae-id FOLDER.")
    fetch.add_argument("--release", required=True, help="SAELens release (e.g. gemma-scope-2-270m-pt-res) or ORG/REPO")
    fetch.add_argument("--sae-id", required=True, metavar="ID", help="the SAE's id in the release (or folder in the repo)")
    fetch.add_argument("--revision", help="hub revision (branch, tag or commit)")
    fetch.add_argument("--out", required=True, metavar="DIR", help="the folder to create")
    fetch.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    fetch.set_defaults(func=run_fetch)

    train = commands.add_parser("train", help="train an SAE on a corpus's token stream (SAELens' way)",
                                description="Train a TopK, JumpReLU or L1 ReLU SAE on the states of every token of "
                                "a text corpus at one layer, as SAELens trains one (shuffled buffer, dead-feature "
                                "auxiliary loss, decoder norms folded), evaluate it on the corpus's held-out part "
                                "(FVU, L0, dead features per language and pooled) and write it in the SAELens "
                                "layout (cfg.json, sae_weights.safetensors) with training.json. An interrupted run "
                                "resumes from its checkpoint when run again.")
    add_model_options(train)
    train.add_argument("--corpus", required=True, metavar="SOURCE", help="text corpus: udhr (bundled), a folder of "
                       "<lang>.txt, a .parquet/.jsonl/.csv with text and language columns, or hf:ORG/NAME[:CONFIG]")
    train.add_argument("--languages", type=comma_list, metavar="LIST", help="the corpus languages to train on "
                       "(default: all)")
    train.add_argument("--out", required=True, metavar="DIR", help="the SAE folder to write")
    add_settings_options(train, TrainSettings, "training settings (recorded in training.json)")
    add_runtime_options(train, ("batch_tokens", "overwrite", "progress"), batch_tokens=8192)
    train.set_defaults(func=run_train)


def run(args) -> int:
    from babelprobe.cli.common import items_from, runtime_from, settings_from
    from babelprobe.errors import BabelprobeError
    from babelprobe.sae.run import sae_features
    from babelprobe.sae.settings import Settings

    for flag, value in (("--sae", args.sae), ("--out", args.out)):
        if not value:
            raise BabelprobeError(f"babelprobe sae needs {flag} (or a subcommand: sae fetch, sae train)")
    settings = settings_from(args, Settings)
    result = sae_features(items_from(args), args.out, settings, runtime_from(args), sae=args.sae,
                          also_sae=args.also_sae or (), acts=args.acts, n_boot=args.n_boot)
    print(summary(result))
    return 0


def summary(result) -> str:
    """What `babelprobe sae` prints: the fit, each language's most specific features, sparse vs dense F1."""
    fit = result.fit
    lines = [f"SAE {result.sae.get('path')} (layer {result.sae.get('layer')}, {result.sae.get('d_sae')} features, "
             f"{result.sae.get('architecture')}):"]
    if result.also:
        lines.append("  also ablated at once: " + ", ".join(f"layer {one.get('layer')} ({one.get('path')})"
                                                          for one in result.also))
    for states, title in (("tokens", "every token but BOS"), ("last", "the last-token states")):
        part = fit[fit["states"] == states].set_index("language")
        if len(part):
            lines.append(f"  fit on {title}: " + ", ".join(
                f"{language} FVU {row.fvu:.2f} L0 {row.l0:.1f}" for language, row in part.iterrows()))
    from babelprobe.analysis.sae import fit_warning

    warning = fit_warning(fit)
    if warning:
        lines.append(f"  note: {warning}")
    for language, part in result.features[result.features["rank"] <= 3].groupby("language"):
        own = part.sort_values("rank")
        lines.append(f"  {language}: most specific features " + ", ".join(
            f"#{int(row.feature)} (ν {row.nu:.3g}, freq {row.freq:.2f})" for row in own.itertuples()))
    probe = result.sparse_probe
    if len(probe):
        means = probe.groupby("k")[["f1_mean", "dense_f1"]].mean()
        lines.append("  sparse vs dense probe F1 (mean over groups): " + ", ".join(
            f"k={k}: {row.f1_mean:.2f}" for k, row in means.iterrows()) + f"; dense {means['dense_f1'].iloc[0]:.2f}")
    ablate = result.ablate
    if len(ablate):
        delta = (ablate["margin"] - ablate["margin_base"]).groupby(ablate["feature_set"].str.split("-").str[0]).mean()
        lines.append("  ablation, mean change of the direct margin: " + ", ".join(
            f"{name} {value:+.3f}" for name, value in delta.items()))
    lines.append(f"wrote features.csv, fit.csv, sparse_probe.csv, ablate.csv to {result.out}; figures: "
                 f"babelprobe report --results {result.out}")
    return "\n".join(lines)


def run_fetch(args) -> int:
    from babelprobe.sae.fetch import fetch_sae
    from babelprobe.sae.weights import load_sae

    out = fetch_sae(args.release, args.sae_id, args.out, revision=args.revision, overwrite=args.overwrite)
    sae = load_sae(out)
    print(f"fetched {args.release} {args.sae_id} into {out}: {sae.architecture}, d_in {sae.d_in}, {sae.d_sae} "
          f"features, layer {sae.layer} ({sae.hook}); use --sae {out}")
    return 0


def run_train(args) -> int:
    from babelprobe.cli.common import load_options, settings_from
    from babelprobe.errors import BabelprobeError
    from babelprobe.sae.train import TrainSettings, train_sae

    if args.batch_tokens < 1:
        raise BabelprobeError(f"--batch-tokens must be positive, got {args.batch_tokens}")
    settings = settings_from(args, TrainSettings)
    result = train_sae(args.model, args.corpus, args.out, settings, languages=args.languages,
                       load_options=load_options(args), batch_tokens=args.batch_tokens, overwrite=args.overwrite,
                       progress=args.progress)
    print(train_summary(result))
    return 0


def train_summary(result) -> str:
    """What `sae train` prints: the held-out fit per language and pooled, dead features, time."""
    record, fit = result.record, result.fit.set_index("language")
    lines = [f"trained a {result.sae.d_sae}-feature {result.sae.architecture} SAE on layer {result.sae.layer} of "
             f"{record['model']}: {record['tokens_trained']:,} token states of {record['corpus']} in "
             f"{record['seconds']:.0f} s",
             f"  held-out ({record['heldout_tokens']:,} tokens): FVU {fit.loc['all', 'fvu']:.3f}, L0 "
             f"{fit.loc['all', 'l0']:.1f}; dead features {record['dead']['heldout']:.1%} (none fire on held-out "
             f"text), {record['dead']['train_window']:.1%} (silent in training's last window)",
             "  per language: " + ", ".join(f"{lang} FVU {row.fvu:.2f} L0 {row.l0:.1f}"
                                             for lang, row in fit.iterrows() if lang != "all")]
    if result.out is not None:
        lines.append(f"wrote {result.out} (cfg.json, sae_weights.safetensors, training.json); use --sae {result.out}")
    return "\n".join(lines)
