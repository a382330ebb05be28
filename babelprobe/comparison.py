"""`compare`: meta, direct and neuro on exactly the same minimal pairs, joined item by item (XCOMPS).

    result = compare("default", "xcomps-sample", "cmp/")
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

`protocol="paper"` runs the XCOMPS paper's probing protocol (`analysis.xcomps.PROTOCOLS`: stratified
5-fold cross-validation that may split a pair, F1 averaged over folds, neuro at the best layer);
the default keeps both sentences of a pair in one fold. The protocol is recorded in `compare.json`,
`neuro.settings.json` and a `protocol` column of `summary.csv` and `layers.csv`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from babelprobe.analysis import methods
from babelprobe.analysis.xcomps import protocol_settings
from babelprobe.benchmarks.direct import score_direct
from babelprobe.benchmarks.meta import prompts_digest, score_meta
from babelprobe.errors import BabelprobeError
from babelprobe.items import items_hash, load_items
from babelprobe.models import LoadedModel, load_model
from babelprobe.probes.pairs import neuro_pairs
from babelprobe.runs import open_run, score_resumably
from babelprobe.tables import read_table, write_table

MANIFEST = "compare.json"
OUTPUTS = {"items": "items.csv", "summary": "summary.csv", "layers": "layers.csv",
           "correlations": "correlations.csv", "agreement": "agreement.csv"}


@dataclass
class CompareResult:
    items: pd.DataFrame
    summary: pd.DataFrame
    layers: pd.DataFrame
    correlations: pd.DataFrame
    agreement: pd.DataFrame
    per_method: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    def write(self, out: str | Path) -> None:
        for name, file in OUTPUTS.items():
            write_table(getattr(self, name), Path(out) / file)

    @classmethod
    def read(cls, out: str | Path) -> CompareResult:
        out = Path(out)
        missing = [f for f in OUTPUTS.values() if not (out / f).exists()]
        if missing:
            raise BabelprobeError(f"{out} is not a finished compare directory (no {missing[0]}); run "
                                  "`babelprobe compare` into it first")
        return cls(**{name: read_table(out / file) for name, file in OUTPUTS.items()})


def compare(model: LoadedModel | str, items: pd.DataFrame | str, out: str | Path, *, protocol: str = "default",
            layer: int | str | None = None, rule: str = "sum", reduction: str = "sum", folds: int | None = None,
            fold_scheme: str | None = None, seed: int = 0, pool: str = "last", prompts: str = "xcomps",
            backend: str = "hf", acts: str | Path | None = None, batch_tokens: int = 4096,
            source: dict | None = None, overwrite: bool = False, progress: bool = True) -> CompareResult:
    """Run (or reuse) direct, meta, extraction and probes on the same items and join them per pair.

    `protocol` ("default" or "paper") sets `folds`, `fold_scheme` and `layer` (None: the protocol's);
    under "paper" a value that contradicts it is an error. `prompts`: the meta prompt set (`xcomps`,
    XCOMPS Figure 8) or a prompt file."""
    chosen = protocol_settings(protocol, folds=folds, fold_scheme=fold_scheme, layer=layer)
    folds, fold_scheme, layer = chosen["folds"], chosen["fold_scheme"], chosen["layer"]
    out = Path(out)
    if isinstance(items, str):
        source = source or {"source": items}
    items = load_items(items)
    meta_settings = {"rule": rule, "reduction": reduction, "prompts": str(prompts)}
    digest = prompts_digest(prompts, sorted(items["language"].unique()))  # bad prompts fail before model work
    lm = load_model(model) if isinstance(model, str) else model
    run = open_run(out, {"fingerprint": lm.fingerprint, "items_hash": items_hash(items)},
                   record={"model": lm.name, "protocol": protocol, "protocol_settings": chosen},
                   manifest=MANIFEST, overwrite=overwrite, outputs=("direct.csv", "meta.csv", "acts", *OUTPUTS.values()),
                   what="a comparison of another model or item set")
    stage = run.stage
    acts = Path(acts) if acts is not None else out / "acts"

    def resumably(method: str, score, settings: dict, key: dict):
        """Score in chunks kept beside the table, so an interrupted compare resumes mid-stage."""
        return lambda: score_resumably(lambda chunk: score(lm, chunk, batch_tokens=batch_tokens, progress=False,
                                                           **settings),
                                       items, out / f"{method}.csv",
                                       {"method": method, "fingerprint": lm.fingerprint, **settings, **key},
                                       progress=progress, desc=method)

    direct = stage("direct", {"reduction": reduction},
                   resumably("direct", score_direct, {"reduction": reduction}, {}), out / "direct.csv", read_table)
    # the templates' digest is part of the stage's settings: other wording is never reused
    meta = stage("meta", {**meta_settings, "prompts_digest": digest},
                 resumably("meta", score_meta, meta_settings, {"prompts_digest": digest}), out / "meta.csv",
                 read_table)
    store_digest = _ensure_store(lm, items, acts, overwrite, pool=pool, backend=backend, source=source,
                                 progress=progress)
    from babelprobe.probes import ProbeResult, sweep

    probe_settings = {"store": str(acts.resolve()), "store_digest": store_digest, "folds": folds,
                      "fold_scheme": fold_scheme, "seed": seed, "pool": pool, "protocol": protocol}

    def probe_now():
        result = sweep(acts, folds=folds, fold_scheme=fold_scheme, seed=seed, pool=pool, items=items,
                       progress=progress)
        result.settings["protocol"] = protocol  # written to neuro.settings.json
        return _probe_written(result, out / "neuro.csv")

    probe = stage("neuro", probe_settings, probe_now, out / "neuro.csv", ProbeResult.read)
    neuro = neuro_pairs(probe, layer, items)
    per_method = {"meta": meta, "direct": direct, "neuro": neuro}
    summary = methods.summarize(per_method, probe.table).assign(protocol=protocol)
    joined = methods.join_pairs({"direct": direct, "meta": meta, "neuro": neuro})
    result = CompareResult(items=joined, summary=summary, layers=probe.table.assign(protocol=protocol),
                           correlations=methods.correlations(summary), agreement=methods.agreement(joined),
                           per_method=per_method)
    result.write(out)
    return result


def compare_models(base: str | Path, other: str | Path) -> pd.DataFrame:
    """`other − base` per language × subset × method × metric of two compare directories (e.g. the
    paper's instruct − base), with paired bootstrap intervals for accuracy differences."""
    a, b = CompareResult.read(base), CompareResult.read(other)
    return methods.difference(a.summary, b.summary, a.items, b.items)


# -------------------------------------------------------------------------------------- stage helpers

def _probe_written(result, path: Path):
    result.write(path)
    return result


def _ensure_store(lm: LoadedModel, items: pd.DataFrame, acts: Path, overwrite: bool, **options) -> str:
    """Reuse a complete store of this model and item set, resume an incomplete one, refuse another's
    (unless `overwrite`). Returns a digest of the store's shard checksums, so probes redo if it changes."""
    from babelprobe.extract import extract, open_store

    if (acts / "manifest.json").exists():
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
