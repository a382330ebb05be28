"""`compare`: meta, direct and neuro on exactly the same minimal pairs, joined item by item (XCOMPS).

    result = compare("default", "xcomps-sample", "cmp/")          # or protocol="paper", folds=3, ...
    result.items        # one row per pair: meta_*, direct_*, neuro_* score_good / score_bad / correct
    result.summary      # language × subset × method: accuracy (and neuro F1) with 95% intervals
    result.layers       # the probe's per-layer table (neuro F1 by layer, with intervals)
    result.correlations # Pearson / Spearman between methods across language × subset cells
    result.agreement    # per-pair agreement counts and Cohen's kappa between methods

The output directory holds each stage's own result (`direct.csv`, `meta.csv`, `acts/`, `neuro.csv` and
its side tables) and `compare.json`, which records the model fingerprint, the item-set hash, the
protocol and each stage's settings. A rerun reuses every stage whose settings are unchanged (a second
run only loads and joins); a directory or store made with another model or item set is refused unless
`overwrite`.

`protocol="paper"` runs the XCOMPS paper's probing protocol (`probes.settings.PROTOCOLS`: stratified
5-fold cross-validation that may split a pair, F1 averaged over folds, neuro at the best layer);
the default keeps both sentences of a pair in one fold. The protocol is recorded in `compare.json`,
`neuro.settings.json` and a `protocol` column of `summary.csv` and `layers.csv`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pandas as pd

from babelprobe.benchmarks.scoring import REDUCTIONS, RULES, DirectSettings, MetaSettings
from babelprobe.errors import BabelprobeError
from babelprobe.extract.layers import PEAK, check_spec, is_peak
from babelprobe.probes.settings import FOLD_SCHEMES, POOLS, describe
from babelprobe.probes.settings import PROTOCOLS as PROBE_PROTOCOLS
from babelprobe.runs import LAYOUTS
from babelprobe.settings import at_least, given, one_of, option, settings_record

LAYOUT = LAYOUTS["compare"]
MANIFEST = LAYOUT.manifest
OUTPUTS = {"items": "items.csv", "summary": "summary.csv", "layers": "layers.csv",
           "correlations": "correlations.csv", "agreement": "agreement.csv"}
# the probe protocols (`probes.settings.PROTOCOLS`), and neuro read at each group's peak layer
PROTOCOLS = {name: {**preset, "layers": PEAK} for name, preset in PROBE_PROTOCOLS.items()}


@dataclass(frozen=True)
class CompareSettings:
    """What changes the numbers of a comparison (recorded in compare.json)."""

    PROTOCOLS: ClassVar[dict] = PROTOCOLS
    protocol: str = option("default", help="paper: the XCOMPS paper's probing protocol (stratified 5-fold, pairs "
                           "may be split, F1 over folds, max over layers); default: folds that keep each pair together")
    layers: str = option(PEAK, metavar="peak|N", aliases=("--layer",),
                         help="neuro layer of the per-pair view: 'peak' (each group's best layer) or a layer number")
    rule: str = option("sum", choices=RULES, help="meta: how the two option orders decide a pair (see `score meta "
                       "--help`)")
    reduction: str = option("sum", choices=REDUCTIONS, help="meta and direct score reduction")
    prompts: str = option("xcomps", metavar="NAME|FILE.tsv",
                          help="meta prompt set: 'xcomps' (XCOMPS Figure 8), 'xcomps-babelprobe' or a .tsv")
    folds: int = option(5, metavar="K", help="probe cross-validation folds")
    fold_scheme: str = option("grouped", choices=FOLD_SCHEMES,
                              help="probe folds: grouped (pairs kept together) or plain (stratified k-fold; the paper)")
    seed: int = option(0, help="probe fold and bootstrap seed")
    pool: str = option("last", choices=POOLS, help="pooling extracted and probed")

    def __post_init__(self):
        layers = str(self.layers).strip()
        object.__setattr__(self, "layers", PEAK if is_peak(layers) else layers)  # `max` (XCOMPS) too
        object.__setattr__(self, "prompts", str(self.prompts))
        one_of(self, "protocol", list(PROTOCOLS))
        one_of(self, "rule", RULES)
        one_of(self, "reduction", REDUCTIONS)
        one_of(self, "fold_scheme", FOLD_SCHEMES)
        one_of(self, "pool", POOLS)
        at_least(self, "folds", 2)
        chosen = check_spec(self.layers, peak=True)
        if chosen != PEAK and (chosen == "all" or len(chosen) != 1):
            raise BabelprobeError(f"--layers {self.layers!r}: the per-pair neuro view takes 'peak' or one layer")

    @property
    def description(self) -> str:
        return describe(self)

    def stage(self, name: str) -> dict:
        """The settings of one stage (direct, meta, neuro), as compare.json records them."""
        if name == "direct":
            return {"reduction": self.reduction}
        if name == "meta":
            return {"rule": self.rule, "reduction": self.reduction, "prompts": self.prompts}
        return {"folds": self.folds, "fold_scheme": self.fold_scheme, "seed": self.seed, "pool": self.pool,
                "protocol": self.protocol}


@dataclass
class CompareResult:
    items: pd.DataFrame
    summary: pd.DataFrame
    layers: pd.DataFrame
    correlations: pd.DataFrame
    agreement: pd.DataFrame
    per_method: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    def write(self, out: str | Path) -> None:
        from babelprobe.tables import write_table

        for name, file in OUTPUTS.items():
            write_table(getattr(self, name), Path(out) / file)

    @classmethod
    def read(cls, out: str | Path) -> CompareResult:
        from babelprobe.tables import read_table

        out = LAYOUT.check(out)
        return cls(**{name: read_table(out / file) for name, file in OUTPUTS.items()})


def compare(model, items: pd.DataFrame | str, out: str | Path, settings: CompareSettings | None = None, *,
            acts: str | Path | None = None, backend: str = "hf", batch_tokens: int = 4096,
            source: dict | None = None, overwrite: bool = False, progress: bool = True, **values) -> CompareResult:
    """Run (or reuse) direct, meta, extraction and probes on the same items and join them per pair.

    `settings`: a `CompareSettings`, or its fields as keyword arguments: `protocol` ("default" or "paper",
    which fixes folds, fold scheme and the peak layer; a value that contradicts it is an error), `layers`
    (the neuro layer per pair: "peak" or a number), `rule`, `reduction`, `prompts` (the meta prompt set:
    `xcomps`, XCOMPS Figure 8, or a prompt file), `folds`, `fold_scheme`, `seed`, `pool`. `acts`: the
    activation store to use or create (default OUT/acts); `backend`: its extraction backend."""
    from babelprobe.analysis import methods
    from babelprobe.benchmarks.meta import CONCEPT_FIELDS, prompts_digest
    from babelprobe.benchmarks.scoring import score_pairs
    from babelprobe.items import items_hash, load_items, strongest_distractor, to_pairs
    from babelprobe.models import load_model
    from babelprobe.probes.pairs import neuro_pairs
    from babelprobe.runs import open_run
    from babelprobe.tables import read_table

    settings = given(CompareSettings, settings, values)
    out = Path(out)
    if isinstance(items, str):
        source = source or {"source": items}
    items = load_items(items)
    # meta asks about a property and two concepts; grammatical minimal pairs (MultiBLiMP's) have none
    asks_meta = set(CONCEPT_FIELDS) <= set(items.columns)
    if not asks_meta:
        print("compare: meta skipped: the items have no property and concept fields to ask about (grammatical "
              "minimal pairs such as MultiBLiMP's, questions such as Belebele's); direct and neuro run",
              file=sys.stderr)
    to_pairs(items, strongest_distractor(items))  # one gold item and its distractors per pair: before the model
    # bad prompts fail before model work
    digest = prompts_digest(settings.prompts, sorted(items["language"].unique())) if asks_meta else None
    if isinstance(model, str):  # the paper protocol loads float16 on CUDA (XCOMPS §4.1), as `compare --protocol paper`
        from babelprobe.analysis.xcomps import protocol_dtype

        lm = load_model(model, dtype=protocol_dtype(settings.protocol, None, None))
    else:
        lm = model
    run = open_run(out, {"fingerprint": lm.fingerprint, "items_hash": items_hash(items)},
                   record={"model": lm.name, "protocol": settings.protocol, "settings": settings_record(settings)},
                   manifest=MANIFEST, overwrite=overwrite, outputs=("direct.csv", "meta.csv", "acts", *OUTPUTS.values()),
                   what="a comparison of another model or item set")
    acts = Path(acts) if acts is not None else out / "acts"

    def scored(method: str, scorer_settings):
        """Score in chunks kept beside the table, so an interrupted compare resumes mid-stage."""
        return lambda: score_pairs(method, lm, items, out / f"{method}.csv", scorer_settings,
                                   batch_tokens=batch_tokens, progress=progress)

    direct_settings = DirectSettings(settings.reduction)
    produce_direct = scored("direct", direct_settings)
    fused = _fuses(run, settings, out, acts, backend, overwrite)
    if fused:  # one forward pass: scores and hidden states
        produce_direct = _fused_direct(lm, items, out, acts, direct_settings, settings.pool, batch_tokens, source,
                                       overwrite, progress)
    direct = run.stage("direct", settings.stage("direct"), produce_direct, out / "direct.csv", read_table)
    # the templates' digest is part of the stage's settings: other wording is never reused
    meta_settings = MetaSettings(rule=settings.rule, reduction=settings.reduction, prompts=settings.prompts)
    meta = run.stage("meta", {**settings.stage("meta"), "prompts_digest": digest}, scored("meta", meta_settings),
                     out / "meta.csv", read_table) if asks_meta else None
    store_digest = _ensure_store(lm, items, acts, overwrite, pool=settings.pool, backend=backend, source=source,
                                 progress=progress, written=fused)
    from babelprobe.probes import ProbeResult, probe

    probe_settings = {"store": str(acts.resolve()), "store_digest": store_digest, **settings.stage("neuro")}

    def probe_now():
        result = probe(acts, folds=settings.folds, fold_scheme=settings.fold_scheme, seed=settings.seed,
                       pool=settings.pool, protocol=settings.protocol, items=items, progress=progress)
        return _probe_written(result, out / "neuro.csv")

    probed = run.stage("neuro", probe_settings, probe_now, out / "neuro.csv", ProbeResult.read)
    neuro = neuro_pairs(probed, settings.layers, items)
    per_method = {name: rows for name, rows in (("meta", meta), ("direct", direct), ("neuro", neuro))
                  if rows is not None}
    summary = methods.summarize(per_method, probed.table).assign(protocol=settings.protocol)
    joined = methods.join_pairs({name: per_method[name] for name in ("direct", "meta", "neuro") if name in per_method})
    result = CompareResult(items=joined, summary=summary, layers=probed.table.assign(protocol=settings.protocol),
                           correlations=methods.correlations(summary), agreement=methods.agreement(joined),
                           per_method=per_method)
    result.write(out)
    return result


def diff(base: str | Path, other: str | Path) -> pd.DataFrame:
    """`other − base` per language × subset × method × metric of two compare directories (e.g. the
    paper's instruct − base), with paired bootstrap intervals for accuracy differences
    (`babelprobe diff`)."""
    from babelprobe.analysis import methods

    a, b = CompareResult.read(base), CompareResult.read(other)
    return methods.difference(a.summary, b.summary, a.items, b.items)


# -------------------------------------------------------------------------------------- stage helpers

FUSE = True  # direct scoring fills a new activation store in the same forward passes (extract/fused.py)


def _fuses(run, settings: CompareSettings, out: Path, acts: Path, backend: str, overwrite: bool) -> bool:
    """Direct scoring and extraction share one pass when both start from scratch: direct is neither finished
    nor partly scored, the store is new (a store to reuse or resume is extraction's own), the backend is hf."""
    from babelprobe.extract.fused import can_fuse
    from babelprobe.runs import partial_dir

    direct = out / "direct.csv"
    return (FUSE and backend == "hf" and not run.finished("direct", settings.stage("direct"), direct)
            and not partial_dir(direct).exists() and can_fuse(acts, overwrite))


def _fused_direct(lm, items, out: Path, acts: Path, direct_settings, pool: str, batch_tokens: int, source, overwrite,
                  progress):
    from babelprobe.benchmarks.scoring import score_direct_capturing
    from babelprobe.extract.fused import StoreCapture
    from babelprobe.extract.settings import ExtractSettings

    def produce():
        capture = StoreCapture(lm, items, acts, ExtractSettings(pool=pool), batch_tokens=batch_tokens, source=source,
                               overwrite=overwrite)
        with capture:
            return score_direct_capturing(lm, items, out / "direct.csv", direct_settings, capture,
                                          batch_tokens=batch_tokens, progress=progress)
    return produce


def _probe_written(result, path: Path):
    result.write(path)
    return result


def _ensure_store(lm, items: pd.DataFrame, acts: Path, overwrite: bool, written: bool = False, **options) -> str:
    """Reuse a complete store of this model and item set, resume an incomplete one, refuse another's
    (unless `overwrite`). Returns a digest of the store's shard checksums, so probes redo if it changes.
    `written`: this run has just written the store (fused into direct scoring), so its arrays are not read
    back to recheck their checksums, as after an extraction."""
    from babelprobe.extract import extract, open_store
    from babelprobe.items import items_hash

    if written and (acts / LAYOUTS["store"].manifest).exists() and open_store(acts).manifest.get("complete"):
        return _digest(open_store(acts).manifest)
    if (acts / LAYOUTS["store"].manifest).exists():
        store = open_store(acts, allow_incomplete=True)
        mismatch = store.fingerprint != lm.fingerprint or store.items_hash != items_hash(items)
        if mismatch and not overwrite:
            what = "model" if store.fingerprint != lm.fingerprint else "item set"
            raise BabelprobeError(f"activation store {acts} was made with another {what} than the one being "
                                  "compared; point --acts elsewhere or pass --overwrite")
        if not mismatch and store.manifest.get("complete"):
            store.check([options.get("pool", "last")])
            return _digest(store.manifest)
    extract(lm, items, acts, overwrite=overwrite, **options)
    return _digest(open_store(acts).manifest)


def _digest(manifest: dict) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(manifest.get("shards"), sort_keys=True).encode()).hexdigest()[:16]
