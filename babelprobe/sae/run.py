"""`sae_features`: the run behind `babelprobe sae`. One SAE on one layer, one item set (and, for the
ablation only, SAEs of other layers ablated at once, `also_sae`):

    result = sae_features("default", "xcomps-sample", "saes/l6", "sae/", acts="acts/")
    result = sae_features(..., sae="saes/l6", also_sae=["saes/l7"], protocol="paper")  # layers 6 and 7 at once
    result.features       # layer, feature, language, mean_act, freq, nu, rank      (features.csv)
    result.fit            # layer, language, fvu, l0, l0_published, n_tokens, states (fit.csv)
    result.sparse_probe   # group, language, subset, layer, k, f1_mean, f1_std, dense_f1, n (sparse_probe.csv)
    result.ablate         # pair_id, language, subset, feature_set, method, margin, margin_base, correct (ablate.csv)

Stages, each reused by a rerun with the same identity (model fingerprint, items, SAE weights,
settings; `runs.open_run`, manifest `sae.json`):

1. stats: one forward pass to the SAE's layer (`stats.sae_stats`): per-language sums of the codes of
   every token but BOS, FVU and L0 per language (fit.csv rows `states=tokens`), monolinguality ν and
   ranks (features.csv). The pass also keeps each text's last-token state at the layer; without
   `acts` these are written as a one-layer store in OUT/acts/ (what `extract --pool last` stores).
2. sparse: the last-token states (the store's `--acts`, or OUT/acts/) encoded offline
   (`sparse.encode_states`): the fit on them (fit.csv rows `states=last`) and the sparse probes against
   the dense probe on the same rows and folds (`sparse.sparse_probes`).
3. ablate: each language's `ablate` most specific features (highest ν; after its `ablate_from` most
   specific, Deng et al.'s start_idx) removed from the residual
   stream at the SAE's layer, x' = x − Σ_{s∈S} f_s(x) W_dec[s], at every token but BOS (`--ablate-mode
   projection`, `--protocol paper`: Deng et al.'s x' = x − Σ_s ⟨x, W_dec[s]⟩ W_dec[s]/‖W_dec[s]‖², every
   token; `sae.edits`), and `n_random`
   random sets of as many features that fire on the language's tokens, as controls; the direct margins
   of the same pairs before and after (ablate.csv; `sae.edits`).

With `also_sae` (`--also-sae DIR`, repeatable: Deng et al.'s `--modified_layer_num N`, which hooks the
SAEs of layers L .. L+N−1 in the same forward pass), each extra SAE has a stats pass of its own over the
same items (OUT/also/L{layer}.npz; its ν ranks its own features, as the release ranks each layer's from
its own `top_index_per_lan_magnitude.pth`), and the ablation removes each language's features at every
SAE's layer at once (ranks `ablate_from`+1 .. +`ablate` at each; the controls drawn per layer).
features.csv, fit.csv and the sparse probes stay the main SAE's (`sae`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.inputs import check_inputs
from babelprobe.runs import LAYOUTS
from babelprobe.runtime import Runtime, runner
from babelprobe.sae.settings import Settings
from babelprobe.sae.weights import SAE, check_fits, load_sae
from babelprobe.settings import settings_record

MANIFEST = LAYOUTS["sae"].manifest
STATS = "stats.npz"  # the stats pass's per-language sums (`stats.SAEStats`)
ALSO = "also"  # the stats passes of the SAEs also ablated: also/L{layer}.npz
OUTPUTS = {"features": "features.csv", "fit": "fit.csv", "sparse_probe": "sparse_probe.csv", "ablate": "ablate.csv"}


@dataclass
class SAEResult:
    features: pd.DataFrame
    fit: pd.DataFrame
    sparse_probe: pd.DataFrame
    ablate: pd.DataFrame
    out: Path
    sae: dict = field(default_factory=dict)  # the SAE's description
    also: list = field(default_factory=list)  # the descriptions of the SAEs also ablated (`also_sae`)


@runner(Settings, old=("model", "items", "sae", "out"))
def sae_features(items, out: str | Path, settings: Settings | None = None, runtime: Runtime | None = None, *,
                 sae, also_sae=(), acts: str | Path | None = None, n_boot: int = 1000) -> SAEResult:
    """The SAE view of `items` (module docstring), written to `out`. `items`: a DataFrame or an item
    source; `sae`: an `SAE` or its folder; `acts`: an activation store of the same model and items holding
    the SAE's layer (its last-token states feed the sparse probes). `settings` or its fields as keyword
    arguments (`ks="1,8,64"`, `ablate=4`). `also_sae`: SAEs (or folders) of other layers whose features are
    ablated together with `sae`'s (module docstring; each its layer from its folder). `runtime`: the model (a spec is loaded once the SAE, the store
    and the output are checked, against the model's files first) and the running options (or `model=`,
    `load_options=`, `batch_tokens=`, `overwrite=`, `progress=` as keywords). `n_boot`: bootstrap
    replicates of the ablation's summary (OUT/ablate/summary.csv)."""
    from babelprobe.items import items_hash, load_items
    from babelprobe.runs import open_run
    from babelprobe.tables import check_writable_dir

    out = Path(out)
    check_inputs(items=(items, "items"), sae=(sae, "sae-folder"), acts=(acts, "store"))
    for extra in also_sae:
        check_inputs(also_sae=(extra, "sae-folder"))
    items = load_items(items) if not isinstance(items, pd.DataFrame) else items
    layer = _one_layer(settings.layers)
    if not isinstance(sae, SAE):
        sae = load_sae(sae, layer=layer)
    elif layer is not None:
        if sae.layer is not None and sae.layer != layer:
            raise BabelprobeError(f"--layers {layer}: the SAE reads layer {sae.layer}; drop --layers or give {sae.layer}")
        sae.layer = layer
    also = _also_saes(also_sae, sae, settings)
    if items["language"].nunique() < 2:
        raise BabelprobeError("the SAE view compares languages: the items have only "
                              f"{', '.join(items['language'].unique())}")
    _check_groups(items, settings.folds)
    store = _check_store(acts, sae, items) if acts is not None else None
    check_writable_dir(out)
    info = runtime.info  # the model's files: its width, layers and fingerprint before its weights load
    for one in (sae, *also):
        check_fits(one, info.d_model, info.n_layers)
    if store is not None and store.fingerprint and store.fingerprint != info.fingerprint:
        raise BabelprobeError(f"activation store {store.path} was made with another model than {info.name}; point "
                              "--acts elsewhere or leave it out (the states are then read in the SAE's own pass)")
    lm = runtime.lm
    identity = {"fingerprint": lm.fingerprint, "items_hash": items_hash(items), "sae": _sae_digest(sae),
                "layer": sae.layer, **settings_record(settings)}
    record = {"model": lm.name, "sae_path": sae.path, "sae_info": sae.describe(),
              "acts": str(store.path) if store is not None else None}
    if also:  # only then: the identity of a one-layer run stays what it was
        identity["also"] = [{"sae": _sae_digest(one), "layer": one.layer} for one in also]
        record["also_paths"] = [one.path for one in also]
    run = open_run(out, identity, record=record, manifest=MANIFEST, overwrite=runtime.overwrite,
                   outputs=(*OUTPUTS.values(), STATS, ALSO, "acts", "ablate", "figures"),
                   what="an SAE run of another model, item set, SAE or settings")
    from babelprobe.tables import read_table, write_table

    stats = _stats_stage(run, lm, items, sae, store, out, runtime.batch_tokens, runtime.progress)
    _also_stage(run, lm, items, also, out, runtime.batch_tokens, runtime.progress)
    features = stats.features(top=settings.top or None)
    write_table(features, out / OUTPUTS["features"])
    tables = {"features": features}
    tables.update(_sparse_stage(run, sae, store or _own_store(out), settings, out, stats.fit().assign(states="tokens")))
    if run.state["stages"].get("ablate") != "done" or not (out / OUTPUTS["ablate"]).exists():
        ablate = ablation_rows(lm, items, out, settings, n_boot, runtime.batch_tokens, runtime.progress)
        write_table(ablate, out / OUTPUTS["ablate"])  # written last: it marks the run finished (runs.LAYOUTS)
        run.state["stages"]["ablate"] = "done"
        run.save()
    tables["ablate"] = read_table(out / OUTPUTS["ablate"])
    return SAEResult(out=out, sae=sae.describe(), also=[one.describe() for one in also], **tables)


def _check_groups(items: pd.DataFrame, folds: int) -> None:
    """Every language × subset group can be cross-validated with `folds` folds (before any work)."""
    labelled = items[items["label"].isin([0, 1])]
    if labelled.empty:
        raise BabelprobeError("the sparse probes need items labelled 1 (acceptable) and 0 (unacceptable); these have none")
    counts = labelled.groupby(["language", "subset"])["pair_id"].nunique()
    if counts.min() < folds:
        (language, subset), n = counts.idxmin(), int(counts.min())
        raise BabelprobeError(f"group language={language} subset={subset} has {n} pairs, fewer than --folds {folds}; "
                              "use fewer --folds or more items")


def _one_layer(spec) -> int | None:
    if spec is None:
        return None
    try:
        return int(str(spec).strip())
    except ValueError:
        raise BabelprobeError(f"--layers {spec!r}: an SAE reads one layer; give one number") from None


def _also_saes(folders, sae: SAE, settings: Settings) -> list[SAE]:
    """The SAEs also ablated (`also_sae`), loaded and checked against `sae` and each other before any model
    loads: one SAE per layer (two at a layer would ablate it twice, in an order nobody chose), the same
    width, an ablation to add them to, and under `--protocol paper` the release's consecutive layers from
    `sae`'s (any set of layers otherwise)."""
    also = [one if isinstance(one, SAE) else load_sae(one, flag="--also-sae") for one in folders]
    if also and settings.ablate == 0:
        raise BabelprobeError("--also-sae adds layers to the ablation, and --ablate 0 ablates nothing; give --ablate "
                              "1 or more, or leave --also-sae out")
    seen = {sae.layer: sae.path or "--sae"}
    for one in also:
        if one.layer in seen:
            raise BabelprobeError(f"--also-sae {one.path} reads layer {one.layer}, as {seen[one.layer]} does: one SAE "
                                  "per layer; give SAEs of other layers")
        if one.d_in != sae.d_in:
            raise BabelprobeError(f"--also-sae {one.path} reads states of width {one.d_in}, --sae {sae.path} of "
                                  f"{sae.d_in}: SAEs of two models")
        seen[one.layer] = one.path
    layers = sorted(seen)
    if also and settings.protocol == "paper" and layers != list(range(sae.layer, sae.layer + len(layers))):
        raise BabelprobeError(f"--protocol paper ablates layers L .. L+N-1 from --sae's layer L, as Deng et al.'s "
                              f"--modified_layer_num N does; --sae and --also-sae give layers "
                              f"{', '.join(map(str, layers))}: give SAEs of layers {sae.layer + 1} .. "
                              f"{sae.layer + len(also)}, or leave --protocol paper out")
    return also


def _check_store(acts, sae: SAE, items: pd.DataFrame):
    """The store `acts`, checked to hold the SAE's layer and the same items (before any model loads)."""
    from babelprobe.items import items_hash
    from babelprobe.runs import layout

    store_path = layout("store").check(acts, "--acts")
    from babelprobe.extract import open_store

    store = open_store(store_path)
    store.check_files()  # a truncated shard: now, not after the stats pass
    check_fits(sae, store.d_model, store.n_layers, what="store's")
    if sae.layer not in store.layers:
        raise BabelprobeError(f"activation store {store.path} has no layer {sae.layer} (the SAE's); it has "
                              f"{store.layers[0]}..{store.layers[-1]}")
    if "last" not in store.pools:
        raise BabelprobeError(f"activation store {store.path} has no last-token states (pools "
                              f"{', '.join(store.pools)}); the sparse probes read last-token states only")
    if store.items_hash and store.items_hash != items_hash(items):
        raise BabelprobeError(f"activation store {store.path} was made from other items than --items; point --acts "
                              "at a store of these items or leave it out")
    return store


def _sae_digest(sae: SAE) -> str:
    """A digest of the SAE's weights (its weights file, or the tensors of one built in memory), so that
    other weights are another identity."""
    from babelprobe.sae.weights import GEMMA_SCOPE_WEIGHTS, SAELENS_WEIGHTS, file_digest

    for name in (GEMMA_SCOPE_WEIGHTS, SAELENS_WEIGHTS):
        if sae.path and (Path(sae.path) / name).exists():
            return file_digest(Path(sae.path) / name)
    digest = hashlib.sha256()
    for tensor in (sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec, sae.threshold):
        if tensor is not None:
            digest.update(tensor.detach().cpu().numpy().tobytes())
    digest.update(f"{sae.architecture} {sae.k} {sae.apply_b_dec_to_input} {sae.layer}".encode())
    return digest.hexdigest()[:16]


# -------------------------------------------------------------------------------------------- stages

def _stats_stage(run, lm, items, sae, store, out: Path, batch_tokens, progress):
    """The pass's sums (OUT/stats.npz, reused by a rerun) and, without a store, OUT/acts/."""
    from babelprobe.sae.stats import SAEStats, sae_stats

    path = out / STATS
    if run.state["stages"].get("stats") == "done" and path.exists() and (store is not None or (out / "acts").exists()):
        return SAEStats.load(path)
    stats = sae_stats(lm, items, sae, batch_tokens=batch_tokens, progress=progress)
    if store is None:
        _write_own_store(out, items, stats, lm)
    stats.save(path)
    run.state["stages"]["stats"] = "done"
    run.save()
    return stats


def _also_stage(run, lm, items, also: list[SAE], out: Path, batch_tokens, progress) -> None:
    """Each SAE also ablated: its own stats pass over the same items (OUT/also/L{layer}.npz), whose ν
    ranks its features for the ablation; reused by a rerun."""
    from babelprobe.sae.stats import sae_stats

    paths = [also_stats_path(out, one.layer) for one in also]
    if not also or run.state["stages"].get("also") == "done" and all(p.exists() for p in paths):
        return
    for one, path in zip(also, paths):
        path.parent.mkdir(exist_ok=True)
        stats = sae_stats(lm, items, one, batch_tokens=batch_tokens, progress=progress)
        stats.last = None  # the sparse probes read the main SAE's layer only
        stats.save(path)
    run.state["stages"]["also"] = "done"
    run.save()


def also_stats_path(out: Path, layer: int) -> Path:
    return Path(out) / ALSO / f"L{layer}.npz"


def _write_own_store(out: Path, items: pd.DataFrame, stats, lm) -> None:
    """The pass's last-token states as a one-layer store in OUT/acts/ (read back by the sparse stage)."""
    from babelprobe.extract.store import write_store
    from babelprobe.items import items_hash

    keys = items[["item_id", "pair_id", "language", "subset", "label"]].reset_index(drop=True)
    write_store(out / "acts", keys, last=stats.last[:, None, :], layers=[stats.layer], n_layers=lm.n_layers,
                provenance={"model": {**lm.describe(), "name": lm.name}, "items": {"hash": items_hash(items)},
                            "written_by": "babelprobe sae (the stats pass's last-token states)"},
                overwrite=True)


def _own_store(out: Path):
    from babelprobe.extract import open_store

    return open_store(out / "acts")


def _sparse_stage(run, sae: SAE, store, settings: Settings, out: Path, fit_tokens: pd.DataFrame) -> dict:
    """fit.csv (both kinds of states) and sparse_probe.csv; reused by a rerun with the same settings."""
    from babelprobe.sae.sparse import encode_states, sparse_probes
    from babelprobe.sae.train import training_fit
    from babelprobe.tables import read_table, write_table

    record = {"ks": list(settings.ks), "folds": settings.folds, "seed": settings.seed, "store": str(store.path)}
    if run.state["stages"].get("sparse") == record and (out / OUTPUTS["sparse_probe"]).exists():
        return {"fit": read_table(out / OUTPUTS["fit"]), "sparse_probe": read_table(out / OUTPUTS["sparse_probe"])}
    states = store.read(sae.layer, pool="last")
    keys = store.keys.reset_index(drop=True)
    codes = encode_states(sae, states)
    last = training_fit(sae, states, keys["language"].astype(str).to_numpy()).rename(columns={"n_states": "n_tokens"})
    last = last.assign(l0_published=fit_tokens["l0_published"].iloc[0], states="last")
    fit = pd.concat([fit_tokens, last[fit_tokens.columns]], ignore_index=True)
    table = sparse_probes(codes, states, keys, sae.layer, ks=settings.ks, folds=settings.folds, seed=settings.seed)
    write_table(fit, out / OUTPUTS["fit"])
    write_table(table, out / OUTPUTS["sparse_probe"])
    run.state["stages"]["sparse"] = record
    run.save()
    return {"fit": fit, "sparse_probe": table}


ABLATE_COLUMNS = ["pair_id", "language", "subset", "feature_set", "method", "margin", "margin_base", "correct",
                  "layer", "alpha", "n_features", "features", "also_features"]


def ablation_rows(lm, items, out: Path, settings: Settings, n_boot: int, batch_tokens, progress) -> pd.DataFrame:
    """ablate.csv (module docstring, stage 3): the interventions runner with the SAE-feature edit source
    (`sae.edits`; its own run directory OUT/ablate/: interventions.csv, summary.csv,
    figures), its rows in ablate.csv's columns."""
    from babelprobe.interventions import intervene

    if settings.ablate == 0:
        return pd.DataFrame(columns=ABLATE_COLUMNS)
    result = intervene(items, out / "ablate", methods="sae", readouts="direct", n_random=settings.n_random,
                       seed=settings.seed, sae=out, ablate_mode=settings.ablate_mode, n_boot=n_boot, model=lm,
                       batch_tokens=batch_tokens, progress=progress)
    rows = result.rows
    return pd.DataFrame({
        "pair_id": rows["pair_id"], "language": rows["language"], "subset": rows["subset"],
        "feature_set": np.where(rows["direction"] == "features", "language", "random-" + rows["draw"].astype(str)),
        "method": "direct", "margin": rows["direct_margin"], "margin_base": rows["direct_margin_base"],
        "correct": rows["direct_correct"].astype(bool), "layer": rows["layer"], "alpha": rows["alpha"],
        "n_features": rows["n_features"], "features": rows["features"],
        # absent from the rows of runs made before --also-sae; empty (NaN read back) in one-layer runs
        "also_features": rows.get("also_features", pd.Series("", index=rows.index)).fillna("")})[ABLATE_COLUMNS]
