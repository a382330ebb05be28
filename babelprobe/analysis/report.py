"""The report of a results directory: every figure it has the inputs for, the analysis tables, and a
short `report.md` that shows them (what `babelprobe report` and `make demo` / `make figures` write).

    results = load_results("results/demo")    # whatever compare / probe left there
    report = write_report("results/demo", "results/demo/figures")
    report.figures, report.skipped            # written figures; figures left out and why

Reading the directory is `results.py` (`load_results`, `attach_other`); this module analyses and writes.
A figure whose input is absent is skipped with a note. Other kinds of run directory (`runs.LAYOUTS`:
lens, align, ...) are reported by their own function (`REPORTS`).

Every XCOMPS figure and table (He, Nie et al. 2025) is drawn from one compare directory: Figs. 2-6,
10-12 and 14 and Tables 4-5-style accuracy tables (`analysis.xcomps`, `analysis.xcomps_figures`); the
two-model figures (Fig. 9: Fig. 2's numbers other − base; Fig. 13: layer-wise F1 difference) need a
second compare directory of the same items, `other=` (`babelprobe report --results A --other B`).
`report.md` says which protocol made the numbers (`compare --protocol`); `protocol="paper"` refuses
results made otherwise.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from babelprobe.analysis import figures, methods, peaks, xcomps
from babelprobe.analysis.results import Results, attach_other, load_results  # noqa: F401 (load_results: public here too)
from babelprobe.analysis.style import save
from babelprobe.analysis.summary import accuracy_table
from babelprobe.errors import BabelprobeError
from babelprobe.inputs import check_inputs
from babelprobe.probes.settings import protocol_text
from babelprobe.runs import detect
from babelprobe.runtime import Runtime, runner
from babelprobe.settings import at_least, one_of, option
from babelprobe.tables import atomic_path, write_table

X_AXES = ("layer", "relative_depth")

# The report of every other kind of run directory (`runs.LAYOUTS`), by kind: "module:function", the
# function called as `function(path, out, n_boot=..., seed=...) -> Report` (its own figures, tables and
# report.md). compare and probe directories are reported here.
REPORTS: dict[str, str] = {
    "lens": "babelprobe.analysis.latent:report_lens",
    "align": "babelprobe.analysis.latent:report_align",
    "patch": "babelprobe.analysis.patching:report",
    "sae": "babelprobe.analysis.sae:report",
    "neurons": "babelprobe.analysis.neurons:report",
    "bench": "babelprobe.analysis.benchmarks:report_bench",
    "pitfalls-affinity": "babelprobe.analysis.benchmarks:report_affinity",
}


@dataclass
class Report:
    out: Path
    figures: dict[str, list[Path]] = field(default_factory=dict)  # name -> [pdf, png]
    skipped: dict[str, str] = field(default_factory=dict)         # name -> why
    tables: dict[str, Path] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- analysis

def analyse(results: Results, n_boot: int = 1000, seed: int = 0) -> dict[str, pd.DataFrame]:
    """The analysis tables the figures and report.md use, for what the directory has."""
    tables = {}
    if results.probe is not None:
        tables["subset_peaks"] = peaks.subset_peaks(results.probe)
        tables["language_curves"] = peaks.language_curves(results.probe, n_boot, seed)
        tables["language_peaks"] = peaks.language_peaks(results.probe, n_boot, seed)
        tables["typology_peaks"] = peaks.typology_peaks(tables["language_peaks"])
    if results.items is not None:
        tables["method_accuracy"] = method_accuracy(results.items)
    if results.summary is not None and results.correlations is None:
        results.correlations = methods.correlations(results.summary)
    tables.update(xcomps_tables(results, tables, n_boot, seed))
    return tables


def xcomps_tables(results: Results, tables: dict, n_boot: int, seed: int) -> dict[str, pd.DataFrame]:
    """The numbers of the XCOMPS figures and tables (module docstring), for what the directory has."""
    out = {}
    layers = results.probe.table if results.probe is not None else None
    cells = xcomps.method_cells(results.summary, layers)
    out["xcomps_cells"] = cells
    out["xcomps_table4"] = xcomps.method_table(cells)
    if xcomps.table3_only(cells).empty:
        return out
    out["xcomps_typology_means"] = xcomps.typology_means(cells)
    out["xcomps_table5"] = xcomps.typology_table(out["xcomps_typology_means"])
    if results.probe is not None:
        out["xcomps_peak_readings"] = xcomps.peak_readings(tables["language_peaks"], tables["subset_peaks"])
    if cells["method"].nunique() > 1:
        out["xcomps_correlations_by_subset"] = xcomps.correlations_by_subset(cells)
    if results.other is not None:
        other = results.other
        other_cells = xcomps.method_cells(other.summary, other.probe.table)
        out["xcomps_model_difference"] = xcomps.cells_difference(cells, other_cells)
        out["xcomps_layer_difference"] = xcomps.layer_difference(results.probe, other.probe, n_boot, seed)
        out["difference"] = methods.difference(results.summary, other.summary, results.items, other.items)
    return out


def method_accuracy(items: pd.DataFrame) -> pd.DataFrame:
    """Pair accuracy per language (and over all languages) × method with 95% Wilson intervals, from the
    per-pair join (`<method>_correct` columns)."""
    present = [m for m in methods.METHODS if f"{m}_correct" in items.columns]
    if not present:
        raise BabelprobeError("the per-pair table (items.csv) has no <method>_correct column")
    long = pd.concat([items[["language"]].assign(method=m, correct=items[f"{m}_correct"].astype(bool))
                      for m in present], ignore_index=True)
    return pd.concat([accuracy_table(long, by=("language", "method")),
                      accuracy_table(long.assign(language="all"), by=("language", "method"))], ignore_index=True)


# ------------------------------------------------------------------------------------------- figures

# name, caption, and what it is drawn from; the order is the order in report.md
FIGURES = {
    "layer_curves": "Probe F1 by layer, one line per language, subsets averaged; bands are 95% bootstrap "
                    "intervals over pairs (babelprobe's summary; XCOMPS Fig. 5's form is layer_curves_by_subset).",
    "layer_curves_by_subset": "XCOMPS Fig. 5 in its form: probe F1 by layer, one panel per subset; bands are the 95% "
                              "bootstrap intervals of each language × subset group.",
    "peak_typology": "Peak layer of each language (subsets averaged) with its 95% bootstrap interval, grouped by "
                     "typology; bars are class means (XCOMPS Fig. 6).",
    "peak_heatmap": "Peak layer per language × subset (XCOMPS Fig. 14).",
    "method_bars": "Pair accuracy of meta, direct and neuro per language with 95% Wilson intervals; dashed line: "
                   "chance (babelprobe's view: every method by one pair rule; XCOMPS Fig. 2's form is xcomps_fig2).",
    "method_correlations": "Method against method over language × subset cells, with Pearson r and Spearman ρ "
                           "and 95% intervals (XCOMPS Fig. 3).",
    "transfer": "Cross-lingual transfer: F1 of a probe trained on one language (rows) and tested on another "
                "(columns) at the training language's peak layer, mean over subsets; outlined diagonal: "
                "in-language cross-validated F1.",
    "xcomps_fig2": "XCOMPS Fig. 2 in its form: meta and direct pair accuracy and neuro F1 at the best layer (the "
                   "maximum over layers of the fold-averaged F1), one row per negative type, languages grouped by "
                   "typology (English, not in Table 3, first). Numbers: xcomps_table4.csv.",
    "xcomps_fig4": "XCOMPS Fig. 4: each method's score (negative types averaged) averaged over the languages of "
                   "each typology class of Table 3; dots are the languages; English left out. Numbers: "
                   "xcomps_table5.csv.",
    "xcomps_fig6": "XCOMPS Fig. 6 under both readings of \"average peak layer\": (a) the peak of each language's "
                   "curve (negative types averaged), (b) the peak of each language × negative type; bars are class "
                   "means, Table 3 languages only (English left out). Numbers: xcomps_peak_readings.csv.",
    "xcomps_fig10_12": "XCOMPS Figs. 10-12 (the paper has one per model): method against method across languages, "
                       "one row per negative type, Pearson r and Spearman ρ with 95% intervals. Numbers: "
                       "xcomps_correlations_by_subset.csv.",
    "xcomps_fig9": "XCOMPS Fig. 9: Fig. 2's numbers of the second model minus the first (--other). Numbers: "
                   "xcomps_model_difference.csv; accuracy differences with paired bootstrap intervals: difference.csv.",
    "xcomps_fig13": "XCOMPS Fig. 13: probe F1 by layer of the second model minus the first (--other), one line per "
                    "language, one panel per negative type; bands are paired bootstrap 95% intervals over pairs. "
                    "Numbers: xcomps_layer_difference.csv.",
}

# The paper's figures and tables and the files that reproduce them (report.md's XCOMPS section).
PAPER_FIGURES = {
    "Fig. 2": "xcomps_fig2", "Fig. 3": "method_correlations", "Fig. 4": "xcomps_fig4",
    "Fig. 5": "layer_curves_by_subset", "Fig. 6": "xcomps_fig6", "Fig. 9": "xcomps_fig9",
    "Figs. 10-12": "xcomps_fig10_12", "Fig. 13": "xcomps_fig13", "Fig. 14": "peak_heatmap",
}


# what `compare` draws itself (with `runtime.figures`): the figures its own tables give without a bootstrap
COMPARE_FIGURES = ("peak_heatmap", "method_bars")


def draw_compare_figures(results: str | Path, out: str | Path) -> dict[str, list[Path]]:
    """The figures of `COMPARE_FIGURES` a compare directory has the inputs for, drawn into `out` as `report`
    draws them (`draw`); name -> [pdf, png]."""
    results = load_results(results)
    tables = {"subset_peaks": peaks.subset_peaks(results.probe)} if results.probe is not None else {}
    drawn = {}
    for name in COMPARE_FIGURES:
        fig = draw(name, results, tables)
        if not isinstance(fig, str):  # a reason it cannot be drawn: `report` says it; compare draws the rest
            drawn[name] = save(fig, Path(out) / name)
    return drawn


def draw(name: str, results: Results, tables: dict, x: str = "layer"):
    """The figure `name` of FIGURES, or the reason it cannot be drawn (a string)."""
    probe_needed = "no probe result (neuro.csv from `babelprobe probe` or `babelprobe compare`)"
    if name.startswith("xcomps_"):
        return _draw_xcomps(name, results, tables, x)
    if name == "layer_curves":
        return figures.plot_layer_curves(tables["language_curves"], x=x) if results.probe else probe_needed
    if name == "layer_curves_by_subset":
        return figures.plot_layer_curves(results.probe.table, x=x) if results.probe else probe_needed
    if name == "peak_typology":
        return figures.plot_peak_typology(tables["language_peaks"]) if results.probe else probe_needed
    if name == "peak_heatmap":
        return figures.plot_peak_heatmap(tables["subset_peaks"]) if results.probe else probe_needed
    if name == "method_bars":
        return figures.plot_method_bars(results.items) if results.items is not None else \
            "no items.csv (the per-pair join of `babelprobe compare`)"
    if name == "method_correlations":
        if results.summary is None:
            return "no summary.csv (from `babelprobe compare`)"
        if results.summary["method"].nunique() < 2:
            return "summary.csv has fewer than two methods"
        return figures.plot_method_correlations(results.summary, results.correlations)
    if name == "transfer":
        if results.transfer is None or (results.transfer.get("kind", pd.Series(["transfer"])) != "transfer").all():
            return "no transfer table (run `babelprobe probe --transfer`, or pass --transfer FILE)"
        if results.transfer_peaks is None:
            return "no peak table beside the transfer table to choose the layer"
        return figures.plot_transfer(results.transfer, results.transfer_peaks)
    raise BabelprobeError(f"unknown figure {name!r}; figures: {', '.join(FIGURES)}")


def _draw_xcomps(name: str, results: Results, tables: dict, x: str):
    from babelprobe.analysis import xcomps_figures as paper

    if name in ("xcomps_fig9", "xcomps_fig13") and results.other is None:
        return ("needs a second compare directory of the same items: `babelprobe report --results A --other B` "
                "(`make paper-xcomps RESULTS=A OTHER=B`)")
    if name != "xcomps_fig6" and (results.summary is None or results.probe is None):
        return "needs meta, direct and neuro: a `babelprobe compare` directory (summary.csv and neuro.csv)"
    if results.probe is None:
        return "no probe result (neuro.csv from `babelprobe probe` or `babelprobe compare`)"
    if name != "xcomps_fig2" and "xcomps_typology_means" not in tables:
        return "no language of XCOMPS Table 3 in the results (typology class means need them)"
    cells = tables.get("xcomps_cells")
    if name == "xcomps_fig2":
        return paper.plot_method_grid(cells)
    if name == "xcomps_fig4":
        return paper.plot_typology_means(cells)
    if name == "xcomps_fig6":
        return paper.plot_peak_readings(tables["language_peaks"], tables["subset_peaks"])
    if name == "xcomps_fig10_12":
        return paper.plot_correlations_by_subset(cells, tables["xcomps_correlations_by_subset"])
    names = (_model_name(results), _model_name(results.other))
    if name == "xcomps_fig9":
        return paper.plot_method_grid(tables["xcomps_model_difference"], difference=True,
                                      title=f"{names[1]} − {names[0]}")
    if name == "xcomps_fig13":
        return paper.plot_layer_difference(tables["xcomps_layer_difference"], x=x,
                                           title=f"Probe F1 by layer, {names[1]} − {names[0]}")
    raise BabelprobeError(f"unknown figure {name!r}; figures: {', '.join(FIGURES)}")


def _model_name(results: Results) -> str:
    return str(results.info.get("compare", {}).get("model") or results.path.name)


# ------------------------------------------------------------------------------------------- writing

@dataclass(frozen=True)
class ReportSettings:
    """How a report is drawn (`babelprobe report`'s flags): the bootstrap of its intervals, the x axis of its
    layer curves, and the protocol the results must have been made with. A report is no run: nothing records
    these."""

    n_boot: int = option(1000, metavar="N", help="bootstrap replicates for the per-language peak intervals")
    seed: int = option(0, help="bootstrap seed")
    x: str = option("layer", choices=X_AXES, help="x axis of the layer curves (relative_depth to compare models of "
                    "different depth)")
    protocol: str | None = option(None, choices=("default", "paper"), help="check that the results were made with "
                                  "this protocol (None: report what they were made with)")

    def __post_init__(self):
        at_least(self, "n_boot", 0)
        one_of(self, "x", X_AXES)
        one_of(self, "protocol", ("default", "paper"), allow_none=True)


@runner(ReportSettings)
def write_report(results: str | Path | Results, out: str | Path, settings: ReportSettings | None = None,
                 runtime: Runtime | None = None, *, transfer: str | Path | None = None,
                 other: str | Path | None = None) -> Report:
    """Write every figure the results have inputs for (NAME.pdf and NAME.png), the analysis tables
    (CSV) and `report.md` (written last: its presence means the report is complete) into `out`.
    `settings`: a `ReportSettings` or its fields as keywords (`n_boot`, `seed`, `x`, `protocol`: refuse
    results made with another protocol). `transfer`: a transfer table (default: the probe's own); `other`: a
    second model's compare directory (XCOMPS Figs. 9 and 13). The runner door's form (docs/design.md
    "Runtime, settings, runners"); `write_report(results, out, x=..., n_boot=...)` as before."""
    x, n_boot, seed, protocol = settings.x, settings.n_boot, settings.seed, settings.protocol
    check_inputs(results=(results, "run"), other=(other, "compare"), transfer=(transfer, "file"))
    if not isinstance(results, Results):
        kind = detect(results)
        if kind is not None and kind.kind in REPORTS:
            if other is not None or protocol is not None or transfer is not None:
                raise BabelprobeError(f"{results} is a {kind.kind} directory: --other, --protocol and --transfer "
                                      "apply to compare and probe results")
            module, _, function = REPORTS[kind.kind].partition(":")
            report_of = getattr(importlib.import_module(module), function)
            return report_of(kind.check(results, "--results"), Path(out), n_boot=n_boot, seed=seed)
        results = load_results(results, transfer)
    if other is not None:
        attach_other(results, other)
    if protocol is not None and results.protocol != protocol:
        made = protocol_text(results.protocol, _folds(results), otherwise=results.protocol)
        raise BabelprobeError(f"{results.path} was made with protocol {results.protocol!r} ({made}), not "
                              f"{protocol!r}; rerun `babelprobe compare ... --protocol {protocol}` or drop --protocol")
    out = Path(out)
    tables = analyse(results, n_boot, seed)
    report = Report(out=out)
    for name, table in tables.items():
        report.tables[name] = write_table(table, out / f"{name}.csv")
    for name in FIGURES:
        fig = draw(name, results, tables, x)
        if isinstance(fig, str):
            report.skipped[name] = fig
        else:
            report.figures[name] = save(fig, out / name)
    # interventions (`babelprobe intervene` runs in RESULTS or one level below): their own figures and section
    from babelprobe.analysis.interventions import report_section

    f1_table = results.probe.table if results.probe is not None else None
    intervention_figures, intervention_tables, intervention_md = report_section(results.path, out, f1_table,
                                                                                n_boot, seed)
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text(markdown(results, tables, report) + ("\n" + intervention_md if intervention_md else ""),
                       encoding="utf-8")
    report.figures.update(intervention_figures)
    report.tables.update(intervention_tables)
    return report


def markdown(results: Results, tables: dict, report: Report) -> str:
    """report.md: where the results come from, the main tables, the figures, and what was skipped."""
    parts = [f"# babelprobe report: {results.path}", _provenance(results)]
    if "method_accuracy" in tables:
        parts += ["## Methods per language",
                  "Pair accuracy (the acceptable sentence scores higher) of each method on the same pairs, with "
                  "95% Wilson intervals; neuro uses each language × subset's peak layer." +
                  (" `neuro F1`: mean over subsets of the probe F1 at each subset's peak layer." if
                   results.summary is not None else ""),
                  _md(_method_table(tables["method_accuracy"], results.summary))]
    if results.summary is not None:
        parts += ["## Methods per subset", "Mean over languages of each method's own metric (meta and direct "
                  "accuracy, neuro F1 at the peak layer).", _md(_subset_table(results.summary))]
    if "language_peaks" in tables:
        parts += ["## Peak layers",
                  "Per language: the peak of the F1 curve averaged over subsets; the interval is the 95% "
                  "bootstrap interval of the peak's position (pairs resampled within each subset).",
                  _md(_language_peak_table(tables["language_peaks"], tables["language_curves"])),
                  "Per typology class: mean, standard deviation and range of the languages' peak layers.",
                  _md(_typology_table(tables["typology_peaks"])),
                  "Per language × subset (each group's own peak; bootstrap intervals in "
                  "`subset_peaks.csv`):", _md(_subset_peak_pivot(tables["subset_peaks"]))]
    if results.correlations is not None:
        parts += ["## Correlations between methods",
                  "Across language × subset cells; 95% intervals by the Fisher z-transform.",
                  _md(_correlation_table(results.correlations))]
    parts += _xcomps_markdown(results, tables, report)
    if "transfer" in report.figures:
        parts += ["## Cross-lingual transfer", "Probe F1, train language down, test language across, at the "
                  "training language's peak layer, mean over subsets (diagonal: in-language cross-validation).",
                  _md(_transfer_table(results))]
    parts.append("## Figures")
    for name, paths in report.figures.items():
        png = next(p for p in paths if p.suffix == ".png")
        parts.append(f"**{name}** ({png.with_suffix('.pdf').name}, {png.name}): {FIGURES[name]}\n\n![{name}]({png.name})")
    if report.skipped:
        parts.append("Skipped:\n\n" + "\n".join(f"- {name}: {why}" for name, why in report.skipped.items()))
    return "\n\n".join(parts) + "\n"


def _xcomps_markdown(results: Results, tables: dict, report: Report) -> list[str]:
    """The XCOMPS section: which file is which paper figure, Tables 4 and 5, Fig. 6's readings."""
    rows = []
    for paper_name, name in PAPER_FIGURES.items():
        where = f"{name}.pdf / .png" if name in report.figures else f"not drawn: {report.skipped.get(name, '')}"
        rows.append({"paper": paper_name, "babelprobe": where})
    rows.append({"paper": "Table 4 style", "babelprobe": "xcomps_table4.csv (long, with 95% intervals: "
                 "xcomps_cells.csv)"})
    if "xcomps_table5" in tables:
        rows.append({"paper": "Table 5 style", "babelprobe": "xcomps_table5.csv (long: xcomps_typology_means.csv)"})
    parts = ["## XCOMPS as published (He, Nie et al. 2025)",
             f"Protocol of these results: **{results.protocol}** — "
             f"{protocol_text(results.protocol, _folds(results))}. Meta and direct: pair "
             "accuracy; neuro: the probe's fold-averaged F1 at its best layer (max over layers).",
             _md(pd.DataFrame(rows)),
             "**Table 4 style**: each method per language × negative type (English, not in XCOMPS Table 3, first).",
             _md(_formatted(tables["xcomps_table4"]))]
    if "xcomps_table5" in tables:
        dropped = xcomps.left_out(tables["xcomps_cells"]["language"])
        parts += ["**Table 5 style**: mean over each typology class's languages (Table 3 only"
                  + (f"; left out: {', '.join(dropped)}" if dropped else "") + ").",
                  _md(_formatted(tables["xcomps_table5"]))]
    if "xcomps_peak_readings" in tables:
        readings = tables["xcomps_peak_readings"]
        parts += ["**Fig. 6, both readings** of the average peak layer per typology class (Table 3 languages only):",
                  _md(pd.DataFrame({"reading": readings["reading"], "typology": readings["typology"],
                                    "units averaged": readings["n"],
                                    "peak layer mean ± sd": [f"{m:.1f} ± {s:.1f}" if pd.notna(s) else f"{m:.1f}"
                                                             for m, s in zip(readings["peak_layer_mean"],
                                                                             readings["peak_layer_sd"], strict=True)],
                                    "relative depth mean": readings["relative_depth_mean"].map("{:.2f}".format)}))]
    return parts


def _formatted(table: pd.DataFrame) -> pd.DataFrame:
    """Numbers with two decimals (blank where missing), other columns as they are."""
    return table.apply(lambda column: column.map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
                       if pd.api.types.is_float_dtype(column) else column.astype(str))


def _folds(results: Results) -> int | None:
    """The folds the results' probes used, as recorded (compare.json, else the probe's settings)."""
    recorded = results.info.get("compare", {}).get("settings") or results.info.get("probe") or {}
    return recorded.get("folds")


def _provenance(results: Results) -> str:
    lines = []
    compare = results.info.get("compare", {})
    if compare:
        lines.append(f"- model: `{compare.get('model')}` (fingerprint `{str(compare.get('fingerprint'))[:16]}`), "
                     f"items hash `{str(compare.get('items_hash'))[:16]}`")
    lines.append(f"- protocol: {results.protocol} ({protocol_text(results.protocol, _folds(results), 'not a preset')})")
    if results.other is not None:
        lines.append(f"- second model (Figs. 9, 13): `{_model_name(results.other)}` from {results.other.path}")
    probe = results.info.get("probe", {})
    if probe:
        lines.append(f"- probe: {probe.get('folds')}-fold {probe.get('fold_scheme', '')} cross-validation, "
                     f"{probe.get('pool')} pooling, {probe.get('n_layers')} layers, seed {probe.get('seed')}, "
                     f"{probe.get('n_boot')} bootstrap replicates")
    frame = results.items if results.items is not None else (results.probe.table if results.probe else None)
    if frame is not None:
        n_pairs = f", {len(results.items)} pairs" if results.items is not None else ""
        lines.append(f"- languages: {', '.join(peaks.language_order(frame['language']))}; subsets: "
                     f"{', '.join(figures.subset_order(frame['subset']))}{n_pairs}")
    return "\n".join(lines)


def _md(frame: pd.DataFrame) -> str:
    """A markdown table of a frame whose numbers are already formatted (tabulate would re-format
    number-like strings otherwise)."""
    return frame.to_markdown(index=False, disable_numparse=True)


def _interval(value, low, high, digits: int = 2) -> str:
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _method_table(accuracy: pd.DataFrame, summary: pd.DataFrame | None) -> pd.DataFrame:
    cells = accuracy.assign(cell=[_interval(*v) for v in accuracy[["accuracy", "ci_low", "ci_high"]].to_numpy()])
    table = cells.pivot(index="language", columns="method", values="cell")
    table = table[[m for m in methods.METHODS if m in table.columns]]
    table.columns = [f"{m} accuracy" for m in table.columns]
    if summary is not None:
        f1 = summary[(summary["method"] == "neuro") & (summary["metric"] == "f1")]
        if not f1.empty:
            per_language = f1.groupby("language")["value"].mean()
            per_language["all"] = f1["value"].mean()
            table["neuro F1"] = per_language.map(lambda v: f"{v:.2f}")
    table["pairs"] = accuracy.groupby("language")["n"].max()
    order = [c for c in peaks.language_order([c for c in table.index if c != "all"])] + ["all"]
    return table.reindex(order).reset_index()


def _subset_table(summary: pd.DataFrame) -> pd.DataFrame:
    main = methods.primary(summary)
    table = main.pivot_table(index="subset", columns="method", values="value").reindex(
        figures.subset_order(main["subset"]))
    table = table[[m for m in methods.METHODS if m in table.columns]]
    metric = main.drop_duplicates("method").set_index("method")["metric"]
    table.columns = [f"{m} {'F1' if metric[m] == 'f1' else metric[m]}" for m in table.columns]
    return table.map("{:.3f}".format).reset_index()


def _language_peak_table(language_peaks: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    at_peak = curves.merge(language_peaks[["language", "peak_layer"]], left_on=["language", "layer"],
                           right_on=["language", "peak_layer"])
    table = language_peaks.merge(at_peak[["language", "f1_ci_low", "f1_ci_high"]], on="language")
    table = table.set_index("language").loc[peaks.language_order(table["language"])].reset_index()
    return pd.DataFrame({
        "language": table["language"], "typology": table["group"],
        "peak layer [95% CI]": [f"{r.peak_layer} [{r.peak_layer_low}–{r.peak_layer_high}]" for r in table.itertuples()],
        "relative depth": table["peak_relative_depth"].map("{:.2f}".format),
        "F1 at peak [95% CI]": [_interval(r.peak_f1, r.f1_ci_low, r.f1_ci_high) for r in table.itertuples()],
        "first layer within 1 SE": table["first_within_1se"]})


def _typology_table(typology: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "typology": typology["typology"], "languages": typology["languages"],
        "peak layer mean ± sd": [f"{m:.1f} ± {s:.1f}" if pd.notna(s) else f"{m:.1f}"
                                 for m, s in zip(typology["peak_layer_mean"], typology["peak_layer_sd"], strict=True)],
        "range": [f"{lo}–{hi}" for lo, hi in zip(typology["peak_layer_min"], typology["peak_layer_max"], strict=True)],
        "relative depth mean": typology["relative_depth_mean"].map("{:.2f}".format),
        "peak F1 mean": typology["peak_f1_mean"].map("{:.3f}".format)})


def _subset_peak_pivot(subset_peaks: pd.DataFrame) -> pd.DataFrame:
    table = subset_peaks.pivot_table(index="language", columns="subset", values="peak_layer")
    table = table.reindex(index=peaks.language_order(table.index), columns=figures.subset_order(table.columns))
    return table.astype("Int64").reset_index()


def _correlation_table(correlations: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "methods": correlations["method_a"] + " – " + correlations["method_b"], "cells": correlations["n_cells"],
        "Pearson r [95% CI]": [_interval(*v) if pd.notna(v[0]) else "n/a" for v in
                               correlations[["pearson_r", "pearson_low", "pearson_high"]].to_numpy()],
        "p (Pearson)": correlations["pearson_p"].map(_p_value),
        "Spearman ρ [95% CI]": [_interval(*v) if pd.notna(v[0]) else "n/a" for v in
                                correlations[["spearman_rho", "spearman_low", "spearman_high"]].to_numpy()]})


def _p_value(p: float) -> str:
    return "n/a" if pd.isna(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def _transfer_table(results: Results) -> pd.DataFrame:
    from babelprobe.probes.crosslingual import at_peaks, transfer_matrix

    matrix = transfer_matrix(at_peaks(results.transfer, results.transfer_peaks), layer=None)
    order = peaks.language_order([*matrix.index, *matrix.columns])
    matrix = matrix.reindex(index=[c for c in order if c in matrix.index],
                            columns=[c for c in order if c in matrix.columns])
    matrix.index.name = "train ↓ / test →"
    return matrix.map("{:.2f}".format).reset_index()
