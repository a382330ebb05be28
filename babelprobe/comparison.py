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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import pandas as pd

from babelprobe.benchmarks.scoring import DirectSettings, MetaSettings
from babelprobe.errors import BabelprobeError
from babelprobe.extract.layers import PEAK, check_spec, is_peak
from babelprobe.extract.settings import DTYPES as STORE_DTYPES
from babelprobe.extract.settings import ExtractSettings
from babelprobe.inputs import check_inputs
from babelprobe.pipeline import frozen_heap
from babelprobe.probes.settings import PROTOCOLS as PROBE_PROTOCOLS
from babelprobe.probes.settings import ProbeSettings, describe
from babelprobe.runs import LAYOUTS, check_identity, check_kind
from babelprobe.runtime import Runtime, runner
from babelprobe.settings import Nested, block, block_record, option, settings_record

LAYOUT = LAYOUTS["compare"]
MANIFEST = LAYOUT.manifest
DIFFERENCE = "difference.csv"  # what `diff` writes into its out
FIGURES = "figures"  # where compare draws its figures (`report`'s default --out too)
WHAT = "a comparison of another model or item set"  # what a refusal calls a run of another identity
OUTPUTS = {"items": "items.csv", "summary": "summary.csv", "layers": "layers.csv",
           "correlations": "correlations.csv", "agreement": "agreement.csv"}
# the probe protocols (`probes.settings.PROTOCOLS`), and neuro read at each group's peak layer
PROTOCOLS = {name: {**preset, "layers": PEAK} for name, preset in PROBE_PROTOCOLS.items()}


@dataclass(frozen=True)
class CompareSettings(Nested):
    """What changes the numbers of a comparison (recorded in compare.json): the settings of its three steps,
    each the step's own settings class (flagged flat: `--folds`, `--rule`, `--reduction` sets meta's and
    direct's), and the per-pair neuro layer."""

    PROTOCOLS: ClassVar[dict] = PROTOCOLS
    probe: ProbeSettings = block(ProbeSettings, ("protocol", "folds", "fold_scheme", "seed", "pool"),
                                 help="the neuro step's probe settings")
    meta: MetaSettings = block(MetaSettings, ("rule", "reduction", "prompts"), help="the meta step's settings")
    direct: DirectSettings = block(DirectSettings, ("reduction", "conditional"), help="the direct step's settings")
    layers: str = option(PEAK, metavar="peak|N", aliases=("--layer",),
                         help="neuro layer of the per-pair view: 'peak' (each group's best layer) or a layer number")
    store_dtype: str | None = option(None, choices=STORE_DTYPES,
                                     help="the dtype of a new activation store (as extract's --store-dtype; default: "
                                          "the model's own for a bfloat16 or float16 model's last-token rows, which "
                                          "are values of that dtype, so half of float32's bytes for the same numbers; "
                                          "float32 otherwise: an 8B model's every layer is 540 KB per item in "
                                          "float32); a store already at --acts is reused in its own unless this asks "
                                          "for another")

    def __post_init__(self):
        layers = str(self.layers).strip()
        object.__setattr__(self, "layers", PEAK if is_peak(layers) else layers)  # `max` (XCOMPS) too
        if self.meta.reduction != self.direct.reduction:
            raise BabelprobeError(f"--reduction: meta and direct score with one reduction in a comparison, got "
                                  f"{self.meta.reduction} and {self.direct.reduction}")
        chosen = check_spec(self.layers, peak=True)
        if chosen != PEAK and (chosen == "all" or len(chosen) != 1):
            raise BabelprobeError(f"--layers {self.layers!r}: the per-pair neuro view takes 'peak' or one layer")

    @property
    def new_store_dtype(self) -> str:
        """The dtype of a store this comparison makes (`store_dtype`; `compare` fills it in when not asked,
        `store_dtype_for`; float32 where it is still None)."""
        return self.store_dtype or "float32"

    @property
    def new_store(self) -> ExtractSettings:
        """The extraction settings of a store this comparison makes: every layer, its pooling and dtype."""
        return ExtractSettings(pool=self.pool, dtype=self.new_store_dtype)

    @property
    def description(self) -> str:
        return describe(self)

    def stage(self, name: str) -> dict:
        """The settings of one step (direct, meta, neuro) that the comparison sets, as compare.json records
        them (its block's own fields; direct's `conditional` only when on, so earlier directories keep their
        direct stage)."""
        record = block_record(self, {"neuro": "probe"}.get(name, name))
        if name == "direct" and not record.get("conditional"):
            record.pop("conditional", None)
        return record


@dataclass
class CompareResult:
    items: pd.DataFrame
    summary: pd.DataFrame
    layers: pd.DataFrame
    correlations: pd.DataFrame
    agreement: pd.DataFrame
    per_method: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)
    figures: dict[str, list[Path]] = field(default_factory=dict, repr=False)  # name -> [pdf, png], OUT/figures

    def write(self, out: str | Path) -> None:
        from babelprobe.tables import write_table

        for name, file in OUTPUTS.items():
            write_table(getattr(self, name), Path(out) / file)

    @classmethod
    def read(cls, out: str | Path) -> CompareResult:
        from babelprobe.tables import read_table

        out = LAYOUT.check(out)
        return cls(**{name: read_table(out / file) for name, file in OUTPUTS.items()})


@runner(CompareSettings, old=("model", "items", "out", "settings"))
def compare(items: pd.DataFrame | str, out: str | Path, settings: CompareSettings | None = None,
            runtime: Runtime | None = None, *, acts: str | Path | None = None, backend: str = "hf",
            source: dict | None = None) -> CompareResult:
    """Run (or reuse) direct, meta, extraction and probes on the same items and join them per pair.

    `settings`: a `CompareSettings`, or its fields as keyword arguments: `protocol` ("default" or "paper",
    which fixes folds, fold scheme and the peak layer; a value that contradicts it is an error), `layers`
    (the neuro layer per pair: "peak" or a number), `rule`, `reduction`, `prompts` (the meta prompt set:
    `xcomps`, XCOMPS Figure 8, or a prompt file), `folds`, `fold_scheme`, `seed`, `pool`. `acts`: the
    activation store to use or create (default OUT/acts); `backend`: its extraction backend. `runtime`: the
    model (a spec is loaded after the checks; the paper protocol loads float16 on CUDA) and the running
    options (`batch_tokens` for the scoring and the extraction alike), or their keywords."""
    from babelprobe.benchmarks.meta import CONCEPT_FIELDS, prompts_digest
    from babelprobe.items import items_hash, load_items, probe_target, strongest_distractor, to_pairs
    from babelprobe.runs import open_run

    out = Path(out)
    check_kind(out, "compare", "compare")
    check_inputs(items=(items, "items"), acts=(acts, "new-store"))
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
    if settings.conditional:  # every item split into prefix and continuation: before the model (as `score`)
        from babelprobe.benchmarks.direct import _score_from

        _score_from(items)
    # bad prompts fail before model work
    digest = prompts_digest(settings.prompts, sorted(items["language"].unique())) if asks_meta else None
    acts = Path(acts) if acts is not None else out / "acts"
    if not runtime.loaded:  # the paper protocol loads float16 on CUDA (XCOMPS §4.1), as `compare --protocol paper`
        from babelprobe.analysis.xcomps import protocol_dtype

        runtime = runtime.replace(model_dtype=protocol_dtype(settings.protocol, runtime.model_dtype, runtime.device))
    settings = replace(settings, store_dtype=store_dtype_for(settings, acts, runtime))
    if (out / MANIFEST).exists():  # another run in OUT, or another store at acts: before the model loads
        check_identity(out, {"fingerprint": runtime.info.fingerprint, "items_hash": items_hash(items)}, MANIFEST,
                       runtime.overwrite, WHAT)
    _check_store(acts, runtime, items, settings.store_dtype)
    _check_room(acts, runtime, items, settings)
    if not is_peak(settings.layers):  # the neuro view's layer against the model's config, before it loads
        from babelprobe.extract.layers import parse_layers

        parse_layers(settings.layers, runtime.info.n_layers)
    lm = runtime.lm
    run = open_run(out, {"fingerprint": lm.fingerprint, "items_hash": items_hash(items)},
                   record={"model": lm.name, "protocol": settings.protocol, "settings": settings_record(settings),
                           "probe_target": probe_target(items)},
                   manifest=MANIFEST, overwrite=runtime.overwrite,
                   outputs=("direct.csv", "meta.csv", "acts", *OUTPUTS.values()), what=WHAT)

    with frozen_heap():  # what is loaded (model, tokenizer, items) out of the collector's full passes
        return _stages(run, items, out, acts, settings, runtime, backend, source, digest)


def _stages(run, items: pd.DataFrame, out: Path, acts: Path, settings: CompareSettings, runtime: Runtime,
            backend: str, source: dict | None, digest: str | None) -> CompareResult:
    """`compare`'s stages, once its inputs are checked and its model loaded: each one run or reused (`run.stage`),
    then the per-pair join, the summary tables and the figures. `digest`: the meta templates' (None: the items
    have nothing to ask meta about)."""
    from babelprobe.analysis import methods
    from babelprobe.benchmarks.scoring import score_pairs
    from babelprobe.probes import ProbeResult, probe
    from babelprobe.probes.pairs import neuro_pairs
    from babelprobe.tables import read_table

    lm = runtime.lm  # loaded by compare

    def scored(method: str, scorer_settings):
        """Score in chunks kept beside the table, so an interrupted compare resumes mid-stage."""
        return lambda: score_pairs(method, lm, items, out / f"{method}.csv", scorer_settings,
                                   batch_tokens=runtime.batch_tokens, progress=runtime.progress)

    produce_direct = scored("direct", settings.direct)
    fused = _fuses(lm, run, settings, out, acts, backend, runtime.overwrite)
    if fused:  # one forward pass: scores and hidden states
        produce_direct = _fused_direct(lm, items, out, acts, settings, runtime.batch_tokens, source,
                                       runtime.overwrite, runtime.progress)
    direct = run.stage("direct", settings.stage("direct"), produce_direct, out / "direct.csv", read_table)
    # the templates' digest is part of the stage's settings: other wording is never reused
    meta = run.stage("meta", {**settings.stage("meta"), "prompts_digest": digest}, scored("meta", settings.meta),
                     out / "meta.csv", read_table) if digest is not None else None
    store_digest = _ensure_store(lm, items, acts, runtime.overwrite, pool=settings.pool,
                                 dtype=settings.new_store_dtype, backend=backend, source=source,
                                 batch_tokens=runtime.batch_tokens, progress=runtime.progress,
                                 written=fused)
    probe_settings = {"store": str(acts.resolve()), "store_digest": store_digest, **settings.stage("neuro")}

    def probe_now():
        result = probe(acts, settings.probe, items=items, progress=runtime.progress)
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
    if runtime.figures:  # the peak layers (XCOMPS Fig. 14) and the methods' accuracy, drawn as `report` draws them
        from babelprobe.analysis.report import draw_compare_figures

        result.figures = draw_compare_figures(out, out / FIGURES)
    return result


def _older_diff(args: tuple, keywords: dict) -> bool:
    """The older form `diff(base, other)`: two compare directories and no `other=`."""
    return len(args) == 2 and "other" not in keywords


@runner(old=("base", "other"), old_when=_older_diff)
def diff(base: str | Path, out: str | Path | None = None, settings=None, runtime: Runtime | None = None, *,
         other: str | Path) -> pd.DataFrame:
    """`other − base` per language × subset × method × metric of two compare directories (e.g. the
    paper's instruct − base), with paired bootstrap intervals for accuracy differences (`babelprobe diff`);
    written to `out`/difference.csv when `out` is given. The runner door's form `diff(base, out,
    other=...)` (no settings, no model); the older `diff(base, other)` too."""
    from babelprobe.analysis import methods
    from babelprobe.tables import check_out_dir, write_table

    check_inputs(base=(base, "compare"), other=(other, "compare"))  # both: before anything is written
    if out is not None:
        check_out_dir(out)
    a, b = CompareResult.read(base), CompareResult.read(other)
    table = methods.difference(a.summary, b.summary, a.items, b.items)
    if out is not None:
        write_table(table, Path(out) / DIFFERENCE)
    return table


# -------------------------------------------------------------------------------------- stage helpers

# Whether direct scoring fills a new activation store in its own forward passes (extract/fused.py): "auto" on an
# accelerator, where the saved pass is GPU time. On a CPU the store is made by extraction's own batches, so a
# compare's store equals the one `extract` makes of the same items (the fused pass's states differ by float
# rounding of another batching, ~1e-7 relative, which the probes' fits can amplify: the demo's per-pair neuro
# scores moved by 1.4e-4 and a transfer AUC by one pair). True or False forces it (perf/workflow.py, tests).
FUSE: bool | str = "auto"


def _fuses(lm, run, settings: CompareSettings, out: Path, acts: Path, backend: str, overwrite: bool) -> bool:
    """Direct scoring and extraction share one pass when both start from scratch: direct is neither finished
    nor partly scored, the store is new (a store to reuse or resume is extraction's own), the backend is hf,
    the scoring is of whole texts, and the model is on an accelerator (`FUSE`)."""
    from babelprobe.extract.fused import can_fuse
    from babelprobe.runs import partial_dir

    direct = out / "direct.csv"
    wanted = lm.device.type != "cpu" if FUSE == "auto" else bool(FUSE)
    # conditional scoring reads a continuation only: its passes are not extraction's (kept separate)
    return (wanted and backend == "hf" and not settings.conditional
            and not run.finished("direct", settings.stage("direct"), direct)
            and not partial_dir(direct).exists() and can_fuse(acts, overwrite))


def _fused_direct(lm, items, out: Path, acts: Path, settings: CompareSettings, batch_tokens: int, source, overwrite,
                  progress):
    from babelprobe.benchmarks.scoring import score_direct_capturing
    from babelprobe.extract.fused import StoreCapture

    def produce():
        capture = StoreCapture(lm, items, acts, settings.new_store, batch_tokens=batch_tokens, source=source,
                               overwrite=overwrite)
        with capture:
            return score_direct_capturing(lm, items, out / "direct.csv", settings.direct, capture,
                                          batch_tokens=batch_tokens, progress=progress)
    return produce


def _probe_written(result, path: Path):
    result.write(path)
    return result


def store_dtype_for(settings: CompareSettings, acts: Path, runtime: Runtime) -> str:
    """The dtype of the store at `acts` that compare makes, resumes or reuses, as extraction decides it
    (`extract.run.store_dtype`: --store-dtype, else a store's own, else the exact one for the model)."""
    from babelprobe.extract.run import store_dtype

    return store_dtype(ExtractSettings(pool=settings.pool, dtype=settings.store_dtype), acts, runtime.compute_dtype,
                       runtime.overwrite)


def _check_store(acts: Path, runtime: Runtime, items: pd.DataFrame, dtype: str | None) -> None:
    """A store already at `acts` was made with this model and these items (unless --overwrite): checked
    against the model's files, before its weights load (`_ensure_store` checks again with the model)."""
    from babelprobe.extract import open_store
    from babelprobe.items import items_hash

    if runtime.overwrite or not (acts / LAYOUTS["store"].manifest).exists():
        return
    store = open_store(acts, allow_incomplete=True)
    other = "model" if store.fingerprint != runtime.info.fingerprint else \
        "item set" if store.items_hash != items_hash(items) else None
    if other is not None:
        raise BabelprobeError(f"activation store {acts} was made with another {other} than the one being compared; "
                              "point --acts elsewhere or pass --overwrite")
    if dtype is not None and store.dtype != dtype:
        raise BabelprobeError(f"activation store {acts} holds {store.dtype} values, not the --store-dtype {dtype} "
                              "asked for; point --acts elsewhere, pass --overwrite, or ask for its dtype")


def _check_room(acts: Path, runtime: Runtime, items: pd.DataFrame, settings: CompareSettings) -> None:
    """The store compare makes or resumes at `acts` (every layer of every item) fits the disk: checked with the
    model's config, before its weights load (`store.check_room`)."""
    from babelprobe.extract.run import check_store_room

    check_store_room(acts, items, settings.new_store, runtime.info)


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
