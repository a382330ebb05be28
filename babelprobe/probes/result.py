"""What a probe sweep produced (`ProbeResult`), and how it is written and read back.

    result = bp.probe("acts/")
    result.table          # one row per group × layer: f1_mean, f1_std, f1_ci_low/high, accuracy, auc, n, ...
    result.peaks          # one row per group: peak layer, its bootstrap interval, relative depth, 1-SE layer
    result.oof            # one row per item × layer: out-of-fold decision score and fold
    result.pair_scores(6) # one row per pair: correct when score_good > score_bad
    result.probes         # the probe of every group × layer fitted on all of the group's items (`Probes`)
    result.write("neuro.csv"); ProbeResult.read("neuro.csv")

Its own module so that the per-pair view (`pairs`) and the sweep (`run`) can both use it without
importing each other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.probes.pairs import pair_scores
from babelprobe.probes.weights import Probes
from babelprobe.tables import atomic_path, write_table


@dataclass
class ProbeResult:
    """Everything a sweep produced. `table` is the main result (docs/design.md probe table); `settings`
    the sweep's settings record (`ProbeSettings` and what the run found: layers, store, fingerprint, ...)."""

    table: pd.DataFrame
    folds: pd.DataFrame
    oof: pd.DataFrame
    peaks: pd.DataFrame
    transfer: pd.DataFrame | None = None
    settings: dict = field(default_factory=dict)
    probes: Probes | None = None

    def pair_scores(self, layer: int | list[int] | None = None, items: pd.DataFrame | None = None) -> pd.DataFrame:
        """One row per pair (and layer): correct when the acceptable sentence scores higher."""
        return pair_scores(self.oof, layer, items)

    def paths(self, out: str | Path) -> dict[str, Path]:
        """Where `write(out)` puts each table: the side tables take out's name and extension, except the
        out-of-fold scores, always Parquet (they have a row per item and layer), and the probe weights,
        always HDF5."""
        out = Path(out)
        stem, ext = out.with_suffix(""), out.suffix
        paths = {"table": out, "folds": Path(f"{stem}.folds{ext}"), "oof": Path(f"{stem}.oof.parquet"),
                 "peaks": Path(f"{stem}.peaks{ext}"), "settings": Path(f"{stem}.settings.json")}
        if self.transfer is not None:
            paths["transfer"] = Path(f"{stem}.transfer{ext}")
        if self.probes is not None:
            paths["probes"] = Path(f"{stem}.probes.h5")
        return paths

    def write(self, out: str | Path) -> dict[str, Path]:
        """Write all tables (each atomically: complete or not at all) and the settings; return the paths."""
        paths = self.paths(out)
        if paths["table"].suffix not in (".csv", ".parquet"):
            raise BabelprobeError(f"--out {out}: use a .csv or .parquet file name")
        if "probes" in paths:
            self.probes.settings = dict(self.settings)  # as written (e.g. with the protocol recorded after the sweep)
            self.probes.write(paths["probes"])
        for name in ("folds", "oof", "peaks", "transfer", "table"):  # the main table last: it marks completion
            if name in paths:
                write_table(getattr(self, name), paths[name])
        with atomic_path(paths["settings"]) as tmp:
            tmp.write_text(json.dumps(self.settings, indent=1, default=str), encoding="utf-8")
        return paths

    @classmethod
    def read(cls, out: str | Path) -> ProbeResult:
        """Read back what `write(out)` wrote (the main table is written last, so its presence means
        the set is complete)."""
        from babelprobe.tables import read_table

        paths = cls(*(pd.DataFrame(),) * 4).paths(out)
        transfer = Path(f"{paths['table'].with_suffix('')}.transfer{paths['table'].suffix}")
        probes = Path(f"{paths['table'].with_suffix('')}.probes.h5")  # absent in results of older versions
        settings = json.loads(paths["settings"].read_text(encoding="utf-8")) if paths["settings"].exists() else {}
        return cls(table=read_table(paths["table"]), folds=read_table(paths["folds"]), oof=read_table(paths["oof"]),
                   peaks=read_table(paths["peaks"]), transfer=read_table(transfer) if transfer.exists() else None,
                   settings=settings, probes=Probes.read(probes) if probes.exists() else None)
