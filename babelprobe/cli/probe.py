"""`babelprobe probe`: cross-validated logistic probes on every layer of an activation store.

Writes the per-layer table to --out and, next to it (same name, same extension):
  NAME.folds.EXT       one row per group × layer × fold
  NAME.oof.parquet     one row per item × layer: out-of-fold decision score and fold (for `compare`)
  NAME.peaks.EXT       one row per group: peak layer with its bootstrap interval, relative depth, 1-SE layer
  NAME.transfer.EXT    with --transfer: train language × test language × subset × layer
  NAME.probes.h5       the probe of every group × layer fitted on all of the group's items: weights in raw
                       activation units, intercept, standardisation, C (HDF5; read with `bp.load_probes`)
  NAME.settings.json   every setting (and the protocol), seed, library version and the store's fingerprint
and prints the peak layer of each group.

--protocol paper runs the XCOMPS paper's protocol: stratified 5-fold cross-validation (--fold-scheme plain
--folds 5), F1 averaged over folds, the peak = the maximum over layers; the default keeps the two
sentences of a pair in one fold (--fold-scheme grouped).
"""

from __future__ import annotations

from babelprobe.errors import BabelprobeError


def register(sub) -> None:
    from babelprobe.cli.common import add_settings_options
    from babelprobe.probes.settings import ProbeSettings

    parser = sub.add_parser(
        "probe", help="train cross-validated logistic probes on every layer (the 'neuro' method)",
        description="Train a logistic probe (acceptable vs unacceptable) for every layer and group of an "
        "activation store, k-fold cross-validated; write tidy tables and print the peak layer per group.",
        epilog="Side tables next to --out: NAME.folds.EXT, NAME.oof.parquet, NAME.peaks.EXT, "
        "NAME.transfer.EXT (with --transfer), NAME.probes.h5 (the all-items probe weights), NAME.settings.json.")
    parser.add_argument("--acts", required=True, metavar="DIR", help="activation store (from `babelprobe extract`)")
    parser.add_argument("--out", required=True, metavar="FILE", help="per-layer table (.csv or .parquet)")
    parser.add_argument("--items", metavar="NAME|PATH",
                        help="items the store was made from, for hewitt's concepts (default: the source in the "
                        "store's manifest)")
    add_settings_options(parser, ProbeSettings, "probe settings (recorded in NAME.settings.json)")
    add_solver_options(parser)
    from babelprobe.cli.common import add_runtime_options

    add_runtime_options(parser, ("progress",))
    parser.set_defaults(func=run)


def add_solver_options(parser) -> None:
    """Options of the solver that change its speed, not its numbers."""
    group = parser.add_argument_group("solver speed (does not change the numbers)")
    group.add_argument("--device", help="torch device: cpu, cuda, cuda:N (default: cuda if available)")
    group.add_argument("--jobs", type=int, default=None, metavar="N",
                       help="processes for the sklearn solver (default 1; -1: all cores)")
    group.add_argument("--threads", type=int, default=None, metavar="N",
                       help="CPU threads of the torch solver: it solves this many groups at once, one thread each "
                       "(default: torch's thread count)")
    group.add_argument("--memory-gb", type=float, default=None, metavar="GB",
                       help="working memory of the solver, shared by the groups solved at once (layers are chunked "
                       "to fit; default 2 on a CPU, half the GPU's free memory on a GPU; at least one layer of one "
                       "group's activations)")


def solver_options(args) -> dict:
    """The speed options as `bp.probe` keyword arguments (checked first; --threads sets torch's threads)."""
    if args.threads is not None and args.threads < 1:
        raise BabelprobeError(f"--threads must be at least 1, got {args.threads}")
    if args.memory_gb is not None and args.memory_gb <= 0:
        raise BabelprobeError(f"--memory-gb must be positive, got {args.memory_gb}")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    return {"device": args.device, "n_jobs": args.jobs, "memory_gb": args.memory_gb}


def run(args) -> int:
    from babelprobe.cli.common import runtime_from, settings_from
    from babelprobe.extract import open_store
    from babelprobe.items import load_items
    from babelprobe.probes.crosslingual import at_peaks, transfer_matrix
    from babelprobe.probes.run import probe
    from babelprobe.probes.settings import ProbeSettings
    from babelprobe.tables import check_output

    settings = settings_from(args, ProbeSettings)  # bad settings stop here, before any work
    out = check_output(args.out, (".csv", ".parquet"))
    speed = solver_options(args)
    items = load_items(args.items) if args.items else None
    store = open_store(args.acts)
    store.check([settings.pool])  # a changed or NaN shard stops here, not as a silently wrong probe
    result = probe(store, out, settings, runtime_from(args), items=items, **speed)
    paths = result.paths(out)
    print(f"protocol {settings.protocol}: {settings.description}")
    print(format_peaks(result))
    if result.transfer is not None and (result.transfer["kind"] == "transfer").any():
        print("\ntransfer F1 (mean over subsets; diagonal: cross-validated in-language F1):")
        peaks = at_peaks(result.transfer, result.peaks)
        print(transfer_matrix(peaks, layer=None).to_string(float_format=lambda v: f"{v:.3f}"))
    print(f"\nwrote {len(result.table)} layer rows to {paths['table']} (and "
          + ", ".join(str(p.name) for name, p in paths.items() if name != "table") + ")")
    return 0


def format_peaks(result) -> str:
    """One line per group: the peak layer with its interval, F1 with its interval, the 1-SE layer."""
    groups = list(dict.fromkeys(["language", "subset", *result.settings["by"]]))
    extra = [c for c in ("f1_ci_low", "f1_ci_high", "selectivity") if c in result.table.columns]
    at_peak = result.table[groups + ["layer"] + extra].rename(columns={"layer": "peak_layer"})
    rows = result.peaks.merge(at_peak, on=groups + ["peak_layer"])
    lines = [f"peak layer per group (of L={result.settings['n_layers']}; 95% bootstrap intervals over pairs):"]
    for row in rows.to_dict("records"):
        name = " ".join(f"{row[c]:<16}" if c == "subset" else f"{row[c]:>6}" for c in groups)
        line = (f"  {name} layer {row['peak_layer']:>3} [{row['peak_layer_low']}–{row['peak_layer_high']}]  "
                f"depth {row['peak_relative_depth']:.2f}  F1 {row['peak_f1']:.3f} [{row['f1_ci_low']:.3f}, "
                f"{row['f1_ci_high']:.3f}]  first within 1 SE: {row['first_within_1se']}")
        if "selectivity" in row:
            line += f"  selectivity {row['selectivity']:+.3f}"
        lines.append(line)
    return "\n".join(lines)
