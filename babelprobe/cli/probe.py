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

from babelprobe.cli.common import comma_list
from babelprobe.errors import BabelprobeError


def register(sub) -> None:
    parser = sub.add_parser(
        "probe", help="train cross-validated logistic probes on every layer (the 'neuro' method)",
        description="Train a logistic probe (acceptable vs unacceptable) for every layer and group of an "
        "activation store, k-fold cross-validated; write tidy tables and print the peak layer per group.",
        epilog="Side tables next to --out: NAME.folds.EXT, NAME.oof.parquet, NAME.peaks.EXT, "
        "NAME.transfer.EXT (with --transfer), NAME.probes.h5 (the all-items probe weights), NAME.settings.json.")
    parser.add_argument("--acts", required=True, metavar="DIR", help="activation store (from `babelprobe extract`)")
    parser.add_argument("--out", required=True, metavar="FILE", help="per-layer table (.csv or .parquet)")
    parser.add_argument("--by", type=comma_list, default=["language", "subset"], metavar="LIST",
                        help="key columns that define the groups (default language,subset)")
    parser.add_argument("--layers", default="all", metavar="LIST", help="all (default), or e.g. 0,6,12-18")
    parser.add_argument("--pool", default="last", choices=("last", "mean"), help="pooling to read (default last)")
    cv = parser.add_argument_group("cross-validation")
    cv.add_argument("--protocol", choices=("default", "paper"), default="default",
                    help="paper: XCOMPS's protocol (stratified 5-fold, F1 over folds, max over layers); "
                    "recorded in NAME.settings.json")
    cv.add_argument("--folds", type=int, default=None, metavar="K", help="number of folds (default 5)")
    cv.add_argument("--fold-scheme", choices=("grouped", "plain"), default=None,
                    help="grouped: stratified, pairs kept together (default); plain: XCOMPS's stratified k-fold "
                    "(--protocol paper)")
    cv.add_argument("--seed", type=int, default=0, help="seed of folds, controls and bootstrap (default 0)")
    cv.add_argument("--n-boot", type=int, default=1000, metavar="N",
                    help="bootstrap replicates over pairs for intervals (default 1000; 0 for none)")
    solver = parser.add_argument_group("solver")
    solver.add_argument("--solver", choices=("torch", "newton", "lbfgs", "plbfgs", "sklearn"), default="torch",
                        help="torch: batched, all layers and folds of a group at once, exact Newton for small "
                        "groups, L-BFGS for large ones, preconditioned by each layer's Gram when the activations "
                        "are ill-conditioned (default); newton, lbfgs, plbfgs: that one; sklearn: reference")
    solver.add_argument("--C", default="1.0", metavar="C",
                        help="inverse regularisation (scikit-learn's C; default 1.0); a list like 0.01,0.1,1 "
                        "chooses C per fold and layer by inner cross-validation")
    solver.add_argument("--inner-folds", type=int, default=3, metavar="K", help="inner folds for a C list (default 3)")
    solver.add_argument("--device", help="torch device: cpu, cuda, cuda:N (default: cuda if available)")
    solver.add_argument("--dtype", choices=("float32", "float64"),
                        help="torch dtype of the solver (default float32, scores within ~3e-4 of float64's; "
                        "float64 for the exact optimum)")
    solver.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="processes for the sklearn solver (default 1; -1: all cores)")
    solver.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads of the torch solver: it solves this many groups at once, one thread "
                        "each (default: torch's thread count)")
    solver.add_argument("--memory-gb", type=float, default=2.0, metavar="GB",
                        help="working memory of the solver, shared by the groups solved at once (layers are chunked "
                        "to fit; default 2; at least one layer of one group's activations)")
    controls = parser.add_argument_group("controls")
    controls.add_argument("--control", default="none", metavar="NAME",
                          help="none (default), shuffle, hewitt, or all; the majority baseline is always reported")
    controls.add_argument("--items", metavar="NAME|PATH",
                          help="items the store was made from, for hewitt's concepts (default: the source in "
                          "the store's manifest)")
    parser.add_argument("--transfer", action="store_true",
                        help="also train on each language and test on every other (same subset)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args) -> int:
    from babelprobe.analysis.xcomps import DESCRIPTIONS, protocol_settings
    from babelprobe.extract import open_store
    from babelprobe.items import load_items
    from babelprobe.probes.crosslingual import at_peaks, transfer_matrix
    from babelprobe.probes.run import ProbeResult, sweep
    from babelprobe.tables import check_output

    out = check_output(args.out, (".csv", ".parquet"))  # before the work, not after it
    chosen = protocol_settings(args.protocol, folds=args.folds, fold_scheme=args.fold_scheme)
    if chosen["folds"] < 2:
        raise BabelprobeError(f"--folds must be at least 2, got {chosen['folds']}")
    if args.threads is not None:
        if args.threads < 1:
            raise BabelprobeError(f"--threads must be at least 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    items = load_items(args.items) if args.items else None
    store = open_store(args.acts)
    store.check([args.pool])  # a changed or NaN shard stops here, not as a silently wrong probe
    result: ProbeResult = sweep(
        store, by=tuple(args.by), layers=args.layers, folds=chosen["folds"], pool=args.pool,
        fold_scheme=chosen["fold_scheme"], seed=args.seed, solver=args.solver, C=args.C, inner_folds=args.inner_folds,
        controls=args.control, items=items, transfer=args.transfer, n_boot=args.n_boot, device=args.device,
        dtype=args.dtype, n_jobs=args.jobs, memory_gb=args.memory_gb,
        progress=not args.no_progress)
    result.settings["protocol"] = args.protocol
    paths = result.write(out)
    print(f"protocol {args.protocol}: {DESCRIPTIONS[args.protocol]}")
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
