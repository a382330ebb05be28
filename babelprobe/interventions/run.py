"""`intervene`: switch an edit on inside the model and read out, on the same minimal pairs, whether the
model's own judgement changes (direct, meta) and what a probe sees. One runner for every edit source
(`source.py`): probe directions (steer, ablate, leace), language neurons (neurons), SAE features next.

    result = intervene("default", "xcomps-sample", "cmp/", "cmp/intervene/", layers="peak", methods="ablate")
    result = intervene("default", "xcomps-sample", out="neu/deact/", neurons="neu/", methods="neurons", off="en,zh")
    result.rows      # one row per pair × edit, each readout with and without the edit (`_base`)
    result.summary   # Δ per language × layer × edit × direction, paired bootstrap 95% intervals
    result.sanity    # probe directions: the probe's balanced accuracy and a refitted probe's F1 after the edit

The run, for any source:
  1. settings checked (`settings.Settings`), items loaded, then every input checked before any model
     loads or anything is written: the probes (`--probes`: their groups and layers against the items
     and `--layers`), the source's own inputs (a neurons run and its languages), the meta prompts;
  2. the model loads and is checked against the probes and the source (dimensions, fingerprints);
  3. the run directory opens (`runs.open_run`: the same command reuses a finished run, another identity is
     refused), fresh probes are fitted (a store given as --probes: OUT/probes/);
  4. unit by unit (the source's `unit`: a probe group, a language), the source reads its items once
     without an edit and once per edit (`readouts.Unit`); each finished unit is kept, so an interrupted
     run resumes (`runs.score_resumably`);
  5. the summary (`analysis.interventions.summarize`) and the figures.

Readouts (`readouts.py`), each with and without the edit, per pair: direct (sum log-prob margin of the
pair, `score_direct`), meta (margin and verdict of the metalinguistic question, `score_meta`), probe (the
probe's scores of both sentences on the states re-read under the edit, at the edited layer or, for edits
that are not at one layer, at `--layers`: the group's peak by default). Every row carries `edit_source`
and the source's columns; `pair_id`, `language`, `subset` join the rows with a compare directory's
`items.csv`.

Output (OUT/): `interventions.csv` (the rows), `summary.csv`, `sanity.csv`, `intervene.json` (the run's
identity and settings) and `figures/` (`analysis.interventions`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.inputs import check_inputs
from babelprobe.interventions.directions import FreshProbes, ProbeSource, find_probes
from babelprobe.interventions.readouts import Unit
from babelprobe.interventions.settings import Settings
from babelprobe.interventions.source import source_class
from babelprobe.items import items_hash, load_items
from babelprobe.runs import LAYOUTS, JsonlMemo, open_run, read_manifest, score_resumably
from babelprobe.runtime import Runtime, runner
from babelprobe.tables import check_out_dir, read_table, write_table

MANIFEST = LAYOUTS["intervene"].manifest
OUTPUTS = {"rows": "interventions.csv", "summary": "summary.csv", "sanity": "sanity.csv"}
CORPUS_OUTPUT = "corpus.csv"  # the ppl readout (corpus_readout.py)
CORPUS_PARTIAL = "corpus.partial.jsonl"  # its edits' readouts as they are made (resumable)


@dataclass
class InterventionResult:
    rows: pd.DataFrame
    summary: pd.DataFrame
    sanity: pd.DataFrame
    figures: dict = field(default_factory=dict)  # name -> [pdf, png]
    checks: dict = field(default_factory=dict)  # e.g. baseline direct margins against compare's direct.csv
    settings: Settings | None = None
    corpus: pd.DataFrame | None = None  # corpus.csv: the ppl readout per edit × language


@runner(Settings, old=("model", "items", "probes", "out"))
def intervene(items: pd.DataFrame | str | None, out: str | Path | None = None, settings: Settings | None = None,
              runtime: Runtime | None = None, *, probes=None, inputs: dict | None = None,
              neurons: str | Path | None = None, sae: str | Path | None = None, corpus=None,
              n_boot: int = 1000) -> InterventionResult:
    """Run the interventions (module docstring) and write their tables and figures to `out`.

    `probes`: a compare directory, a probe result or an activation store (or a `ProbeSource`); needed by
    the probe-direction methods and by the probe readout. `neurons`: a `babelprobe neurons` directory
    (--method neurons). `settings` or the same values as keyword arguments (`methods="ablate"`,
    `layers="peak"`, `off="en,zh"`, ...: `settings.Settings`). `reduction`, `rule`, `prompts` (direct and
    meta scoring): None takes the compare directory's settings when `probes` is one, else sum, sum and
    xcomps. `sae`: a `babelprobe sae` directory (`--method sae`, `sae.edits`). `inputs`: the edit sources'
    own inputs by name ({"neurons": DIR}; `source.SOURCES`; `neurons=` and `sae=` are the same). `corpus`:
    the text of the ppl readout (`corpus_readout`; a `babelprobe.corpus` source, its held-out part read);
    with `readouts="ppl"` alone no items are read (`items` may be None).
    `runtime`: the model (loaded after every input is checked, the inputs' model against its files first)
    and the running options (`runtime.Runtime`, or `model=`, `load_options=`, `batch_tokens=`, `figures=`,
    `overwrite=`, `progress=` as keywords). `n_boot`, `batch_tokens`, `figures`, `progress` change no row."""
    if out is None:
        raise BabelprobeError("intervene needs an output directory (--out)")
    if n_boot < 0:
        raise BabelprobeError(f"--n-boot must be 0 or more, got {n_boot}")
    out = check_out_dir(out)
    _check_corpus(settings, corpus, read=False)  # the flags' own mistakes first, then the inputs on disk
    # --sae: a directory here (`sae` hands over its own run before it is finished; the source reads what it needs)
    check_inputs(items=(items, "items"), probes=(probes, "probes"), neurons=(neurons, "neurons"), sae=(sae, "dir"),
                 corpus=(corpus, "corpus"))
    pairs_read = set(settings.readouts) != {"ppl"}
    items = load_items(items if items is not None else "xcomps-sample") if pairs_read or items is not None else None
    text = _check_corpus(settings, corpus)
    found = probes if isinstance(probes, (ProbeSource, FreshProbes)) or probes is None else find_probes(probes, items)
    settings = _resolved(settings, found)
    if "probe" in settings.readouts and found is None:
        raise BabelprobeError("--readouts probe reads a probe: give --probes (a compare directory, a probe result or "
                              "an activation store)")
    if found is not None and "probe" in settings.readouts:
        found.check(items, settings.layers)
    inputs = _inputs(inputs, neurons=neurons, sae=sae)  # the edit sources' own, by name (source.SOURCES)
    source = source_class(settings.methods)(settings, items if items is not None else _no_items(), found, inputs)
    if "meta" in settings.readouts:
        from babelprobe.benchmarks.meta import meta_requests

        meta_requests(items, settings.prompts)  # the items can be asked: before any model work
    _check_manifest(out, runtime.overwrite)
    _check_model(runtime.info, found, source)  # the inputs' model against the model's files: before its weights load
    lm = runtime.lm
    _check_model(lm, found, source)  # and what only the loaded model tells (its MLPs)
    identity = {"fingerprint": lm.fingerprint, "items_hash": items_hash(items) if items is not None else None,
                "edit_source": source.name, **source.identity(), **settings.record()}
    if text is not None:
        identity["corpus"] = text.describe()
    if found is not None:
        identity.setdefault("probes", found.digest)
    record = {"model": lm.name, "probes_path": str(found.origin) if found is not None else None,
              **{f"{name}_path": str(path) for name, path in inputs.items() if path is not None}}
    run = open_run(out, identity, record=record, manifest=MANIFEST, overwrite=runtime.overwrite,
                   outputs=(*OUTPUTS.values(), CORPUS_OUTPUT, CORPUS_PARTIAL, "figures", "probes"),
                   what="an intervention run of another model, item set, probes, inputs or settings")
    ready = found.ready(out, settings.seed, runtime.progress) if found is not None else None
    source.ready(ready)
    units = source.units(items) if pairs_read else None
    pool = ready.pool if ready is not None else "last"

    def one_unit(chunk: pd.DataFrame) -> pd.DataFrame:
        unit_items = chunk.drop(columns=[source.unit]) if source.unit not in items.columns else chunk
        rows = source.unit_rows(Unit(lm, unit_items, settings, pool, runtime.batch_tokens))
        rows.insert(3, "edit_source", source.name)
        return rows

    def produce() -> pd.DataFrame:
        return score_resumably(one_unit, units, out / OUTPUTS["rows"], {"what": "intervene", **identity},
                               chunk_pairs=1, progress=runtime.progress, desc="intervene", unit=source.unit,
                               model=lm)

    from babelprobe.analysis import interventions as analysis

    if pairs_read:
        rows = run.stage("intervene", identity, produce, out / OUTPUTS["rows"], read_table)
        result = InterventionResult(rows=rows, summary=analysis.summarize(rows, n_boot=n_boot, seed=settings.seed),
                                    sanity=analysis.sanity(rows), checks=_checks(rows, ready), settings=settings)
        write_table(result.summary, out / OUTPUTS["summary"])
        write_table(result.sanity, out / OUTPUTS["sanity"])
    else:
        result = InterventionResult(rows=pd.DataFrame(), summary=pd.DataFrame(), sanity=pd.DataFrame(),
                                    settings=settings)
    if text is not None:
        from babelprobe.interventions.corpus_readout import corpus_table, readout_rows

        def read_corpus_text() -> pd.DataFrame:
            # each edit's readout kept as it is made: a Ctrl-C loses one edit at most, and the same command resumes
            # (the run's identity is this one's: another is refused, or its outputs removed by --overwrite)
            if runtime.overwrite:
                (out / CORPUS_PARTIAL).unlink(missing_ok=True)
            table = corpus_table(lm, source, readout_rows(lm, text, settings), runtime.batch_tokens, runtime.progress,
                                 memo=JsonlMemo(out / CORPUS_PARTIAL))
            write_table(table, out / CORPUS_OUTPUT)
            (out / CORPUS_PARTIAL).unlink(missing_ok=True)
            return table

        result.corpus = run.stage("corpus", {**identity, "stage": "corpus"}, read_corpus_text, out / CORPUS_OUTPUT,
                                  read_table)
    if runtime.figures:
        if pairs_read:
            result.figures = analysis.write_figures(result.summary, out / "figures",
                                                    f1_table=ready.table if ready is not None else None)
        if result.corpus is not None:
            result.figures.update(analysis.write_corpus_figures(result.corpus, out / "figures"))
    return result


def _check_model(model, found, source) -> None:
    """The probes and the edit source's inputs were made with `model` (a `LoadedModel` or its `ModelInfo`)."""
    if found is not None:
        found.check_model(model)
    source.check_model(model)


def _check_corpus(settings: Settings, corpus, read: bool = True):
    """The corpus of the ppl readout, read (unless not `read`: the flags alone) and checked before any model
    loads (None without ppl)."""
    if "ppl" not in settings.readouts:
        if corpus is not None:
            raise BabelprobeError("--corpus is the text of the ppl readout: add --readouts ppl (or leave --corpus out)")
        return None
    if corpus is None:
        raise BabelprobeError("--readouts ppl reads each language's perplexity on a text corpus: give --corpus "
                              "(e.g. udhr, or a folder of <lang>.txt)")
    if not read:
        return None
    from babelprobe.corpus import read_corpus

    text = read_corpus(corpus)
    empty = [code for code in text.languages if not text.heldout.get(code)]
    if empty:
        raise BabelprobeError(f"--corpus {text.source}: no held-out text in {empty[0]} to read the perplexity on")
    return text


def _inputs(given: dict | None, **named) -> dict:
    """The sources' own inputs by name: `given` and the named keywords; a name no source reads is an error."""
    from babelprobe.interventions.source import inputs as known

    merged = {**{name: None for name in known()}, **{k: v for k, v in named.items() if v is not None},
              **(given or {})}
    unknown = [name for name in merged if name not in known()]
    if unknown:
        raise BabelprobeError(f"no edit source reads an input called {unknown[0]!r} (inputs: {', '.join(known())})")
    return merged


def _no_items() -> pd.DataFrame:
    """An empty item table: a run that reads only the corpus has no pairs."""
    return pd.DataFrame(columns=["item_id", "pair_id", "language", "subset", "label", "text"])


def _resolved(settings: Settings, found) -> Settings:
    """The settings with what they leave open filled in: the readouts (direct and meta, and probe when
    there are probes; probe alone for last-token edits) and the direct/meta scoring (the compare
    directory's, else sum, sum, xcomps)."""
    stages = {}
    compare_dir = getattr(found, "compare_dir", None)
    if compare_dir is not None:
        stages = (read_manifest(compare_dir / LAYOUTS["compare"].manifest) or {}).get("stages", {})
    meta, direct = stages.get("meta", {}), stages.get("direct", {})
    readouts = settings.readouts or (("probe",) if settings.positions == "last" else
                                     ("direct", "meta", "probe") if found is not None else ("direct", "meta"))
    return dataclasses.replace(settings, readouts=readouts,
                               reduction=settings.reduction or direct.get("reduction", "sum"),
                               rule=settings.rule or meta.get("rule", "sum"),
                               prompts=str(settings.prompts or meta.get("prompts", "xcomps")))


def _check_manifest(out: Path, overwrite: bool) -> None:
    """A damaged manifest in `out` is refused before any work (`open_run` compares the identity later)."""
    if not overwrite:
        read_manifest(out / MANIFEST)


def _checks(rows: pd.DataFrame, source: ProbeSource | None) -> dict:
    """The baseline direct margins against the compare directory's direct.csv (the same scorer: they
    should agree to float precision)."""
    checks = {}
    path = source.compare_dir / "direct.csv" if source is not None and source.compare_dir is not None else None
    if path is not None and path.exists() and "direct_margin_base" in rows.columns:
        direct = read_table(path)
        margin = (direct["score_good"] - direct["score_bad"]).set_axis(direct["pair_id"])
        mine = rows.drop_duplicates("pair_id").set_index("pair_id")["direct_margin_base"]
        common = mine.index.intersection(margin.index)
        if len(common):
            checks["direct_baseline_vs_compare_max_abs_diff"] = float((mine[common] - margin[common]).abs().max())
            checks["direct_baseline_pairs_compared"] = len(common)
    return checks
