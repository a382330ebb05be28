"""Reading a results directory for the report: the tables a `compare` or `probe` directory holds, checked
for the columns the figures need (`load_results`), and a second model's compare directory of the same
items for the two-model figures (`attach_other`). Writing the figures and report.md is `report.py`.

A results directory is a `babelprobe compare` directory (`items.csv`, `summary.csv`,
`correlations.csv`, `neuro.csv` and its side tables) or a probe directory (`neuro.csv` from
`babelprobe probe`, e.g. `make sweep`). A transfer table (`NAME.transfer.csv`, from `probe
--transfer`) is taken from the probe result, else from one subdirectory down (the demo's
`transfer/`), or from `transfer=`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from babelprobe.analysis import figures, xcomps
from babelprobe.errors import BabelprobeError
from babelprobe.runs import LAYOUTS
from babelprobe.tables import read_table

PROBE_NAMES = ("neuro.csv", "neuro.parquet")


@dataclass
class Results:
    """The tables of one results directory; None where the directory does not have one."""

    path: Path
    items: pd.DataFrame | None = None         # items.csv: one row per pair, every method side by side
    summary: pd.DataFrame | None = None       # summary.csv: language × subset × method × metric
    correlations: pd.DataFrame | None = None  # correlations.csv
    probe: object | None = None               # ProbeResult of neuro.csv (table, peaks, oof, transfer)
    transfer: pd.DataFrame | None = None      # train × test language × subset × layer
    transfer_peaks: pd.DataFrame | None = None  # the peaks of the sweep that made `transfer`
    info: dict = field(default_factory=dict)  # compare.json and the probe's settings
    protocol: str = "unknown"                 # the protocol the results were made with (xcomps.PROTOCOLS)
    other: Results | None = None              # a second model's compare directory (two-model figures)


# ------------------------------------------------------------------------------------------- reading

def load_results(path: str | Path, transfer: str | Path | None = None) -> Results:
    """Read a compare or probe results directory; a one-line error if it is neither or a table lacks a
    column the report needs."""
    path = Path(path)
    if not path.is_dir():
        raise BabelprobeError(f"--results {path}: no such directory")
    results = Results(path=path)
    manifest = path / LAYOUTS["compare"].manifest
    if manifest.exists():
        results.info["compare"] = _read_json(manifest)
    for name, file, columns in (("items", "items.csv", ["pair_id", "language", "subset"]),
                                ("summary", "summary.csv", ["language", "subset", "method", "metric", "value"]),
                                ("correlations", "correlations.csv", ["method_a", "method_b", "pearson_r"])):
        if (path / file).exists():
            setattr(results, name, figures.require(_read(path / file), columns, str(path / file)))
    probe_file = next((path / n for n in PROBE_NAMES if (path / n).exists()), None)
    if probe_file is not None:
        results.probe = _read_probe(probe_file)
        results.info["probe"] = results.probe.settings
        if results.probe.transfer is not None:
            results.transfer, results.transfer_peaks = results.probe.transfer, results.probe.peaks
    if transfer is not None or results.transfer is None:
        _attach_transfer(results, transfer)
    if results.items is None and results.summary is None and results.probe is None:
        raise BabelprobeError(f"{path} is not a results directory: it has no items.csv or summary.csv (from "
                              "`babelprobe compare`) and no neuro.csv (from `babelprobe probe`)")
    results.protocol = xcomps.recorded_protocol(results.info)
    return results


def attach_other(results: Results, other: str | Path | Results) -> Results:
    """`results` with a second model's compare directory on the same items attached (for Figs. 9 and 13)."""
    other = other if isinstance(other, Results) else load_results(LAYOUTS["compare"].check(other, "--other"))
    for which, flag in ((results, "--results"), (other, "--other")):  # the two-model figures need two
        LAYOUTS["compare"].check(which.path, flag)
        if which.probe is None:
            raise BabelprobeError(f"{flag} {which.path} has no neuro.csv; run `babelprobe compare` into it again")
    hashes = [r.info.get("compare", {}).get("items_hash") for r in (results, other)]
    if hashes[0] != hashes[1]:
        raise BabelprobeError(f"{results.path} and {other.path} were run on different items (items hash "
                              f"{hashes[0]} vs {hashes[1]}); the model difference needs the same items")
    if results.protocol != other.protocol:
        raise BabelprobeError(f"{results.path} was made with protocol {results.protocol!r}, {other.path} with "
                              f"{other.protocol!r}; compare models under one protocol")
    results.other = other
    return results


def _read(path: Path) -> pd.DataFrame:
    try:
        return read_table(path)
    except BabelprobeError:
        raise
    except Exception as err:  # a damaged file: say which, in one line
        raise BabelprobeError(f"cannot read {path}: {str(err).splitlines()[0] if str(err) else type(err).__name__}") \
            from err


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BabelprobeError(f"cannot read {path}: {err}") from err


def _read_probe(file: Path):
    from babelprobe.probes import ProbeResult

    result = ProbeResult(*(pd.DataFrame(),) * 4)
    for name, side in result.paths(file).items():
        if name not in ("settings", "transfer") and not side.exists():
            raise BabelprobeError(f"{file} is there but its side table {side.name} is not; rerun `babelprobe probe`")
    try:
        probe = ProbeResult.read(file)
    except BabelprobeError:
        raise
    except Exception as err:
        raise BabelprobeError(f"cannot read the probe result {file}: {str(err).splitlines()[0]}") from err
    figures.require(probe.table, ["language", "subset", "layer", "f1_mean", "f1_se", "f1_ci_low", "f1_ci_high",
                                  "n_pairs"], str(file))
    figures.require(probe.peaks, ["language", "subset", "peak_layer", "peak_layer_low", "peak_layer_high",
                                  "n_layers"], str(probe.paths(file)["peaks"]))
    figures.require(probe.oof, ["item_id", "pair_id", "language", "subset", "label", "layer", "fold", "score"],
                    str(probe.paths(file)["oof"]))
    return probe


def _attach_transfer(results: Results, transfer: str | Path | None) -> None:
    """Find the transfer table: the one given, else the single `*.transfer.csv|parquet` one directory
    down; its peaks are its own sweep's (`NAME.peaks.EXT` beside it), else the main probe's."""
    if transfer is None:
        found = sorted(p for p in results.path.glob("*/*.transfer.*") if p.suffix in (".csv", ".parquet"))
        if not found:
            return
        if len(found) > 1:
            raise BabelprobeError(f"{results.path} has several transfer tables ({', '.join(map(str, found))}); "
                                  "choose one with --transfer")
        transfer = found[0]
    transfer = Path(transfer)
    results.transfer = figures.require(_read(transfer), ["train_language", "test_language", "subset", "layer", "f1"],
                                       str(transfer))
    sibling = transfer.with_name(transfer.name.replace(".transfer.", ".peaks."))
    if sibling != transfer and sibling.exists():
        results.transfer_peaks = figures.require(_read(sibling), ["language", "subset", "peak_layer"], str(sibling))
    elif results.probe is not None:
        results.transfer_peaks = results.probe.peaks
