"""`babelprobe report`: every figure and a short report.md from a compare or probe results directory.

    babelprobe report --results results/demo --out results/demo/figures
    babelprobe report --results results/sweep --transfer-table results/sweep/neuro.transfer.csv --x relative_depth
    babelprobe report --results cmp-base --other cmp-instruct --protocol paper    # + XCOMPS Figs. 9 and 13

Writes NAME.pdf (vector) and NAME.png (300 dpi) for each figure whose input is there (the others are
listed in report.md as skipped), the analysis tables (language_peaks.csv, typology_peaks.csv, ...) and
report.md, last. From a compare directory that includes every XCOMPS figure and table: Figs. 2-6, 10-12
and 14 and the Table 4/5-style accuracy tables (xcomps_*); with --other (a second model's compare
directory of the same items) also Fig. 9 and Fig. 13. report.md names the protocol the results were
made with; --protocol paper refuses results made otherwise.
"""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    import argparse

    parser = sub.add_parser("report", help="figures and report.md from a compare or probe results directory",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", required=True, metavar="DIR",
                        help="a `babelprobe compare` output directory, or one holding a probe's neuro.csv")
    parser.add_argument("--out", metavar="DIR", help="where to write figures and report.md (default RESULTS/figures)")
    parser.add_argument("--transfer", dest="transfer_table", help=argparse.SUPPRESS)  # the old spelling
    parser.add_argument("--transfer-table", metavar="FILE",
                        help="transfer table (NAME.transfer.csv from `probe --transfer`); default: the probe's own, "
                        "else the one in a subdirectory of RESULTS")
    parser.add_argument("--x", choices=("layer", "relative_depth"), default="layer",
                        help="x axis of the layer curves (relative_depth to compare models of different depth)")
    parser.add_argument("--n-boot", type=int, default=1000, metavar="N",
                        help="bootstrap replicates for the per-language peak intervals (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--other", metavar="DIR",
                        help="a second model's compare directory of the same items (e.g. instruct beside base): "
                        "adds XCOMPS Fig. 9 and Fig. 13, the differences OTHER − RESULTS")
    parser.add_argument("--protocol", choices=("default", "paper"),
                        help="check that the results were made with this protocol (`compare --protocol`); default: "
                        "report what they were made with")
    parser.set_defaults(func=run)


def run(args) -> int:
    from babelprobe.analysis.report import ReportSettings, write_report

    settings = ReportSettings(n_boot=args.n_boot, seed=args.seed, x=args.x, protocol=args.protocol)
    out = Path(args.out) if args.out else Path(args.results) / "figures"
    report = write_report(args.results, out, settings, transfer=args.transfer_table, other=args.other)
    for name, paths in report.figures.items():
        print(f"  {name}: {', '.join(p.name for p in paths)}")
    for name, why in report.skipped.items():
        print(f"  {name}: skipped, {why}")
    print(f"wrote {len(report.figures)} figures, {len(report.tables)} tables and report.md to {out}")
    return 0
