"""The runs behind `babelprobe lens` and `babelprobe align`: check the inputs, open the run directory, compute,
write the tables and figures, return the result (`bp.lens`, `bp.align`; the commands only parse and print).

    result = bp.lens("default", "xcomps-sample", "lens/", compare="cmp/")   # LensResult: table, curves, turns, ...
    result = bp.align("default", None, "align/", acts="cmp/acts")         # AlignResult: curves, matrix, items, ...

Everything that can be checked without the model (settings, the store and compare directory, the
layers, the pivot, the items) is checked before the model loads and before OUT is created.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.extract.layers import parse_layers
from babelprobe.inputs import check_inputs
from babelprobe.latent.settings import AlignSettings, LensSettings
from babelprobe.runs import LAYOUTS, open_run
from babelprobe.runtime import Runtime, runner
from babelprobe.settings import settings_record
from babelprobe.tables import check_out_dir, read_table, write_table

LENS_OUTPUTS = ("states", "lens.csv", "curves.csv", "turns.csv", "pairs.csv", "languages.csv", "pair_correlations.csv",
                "figures")
ALIGN_OUTPUTS = ("acts", "curves.csv", "matrix.csv", "items.csv", "correlations.csv", "figures")


@dataclass
class LensResult:
    table: pd.DataFrame  # item × layer
    curves: pd.DataFrame  # language × layer, bootstrap bands
    turns: pd.DataFrame  # per language: where the pivot answer leads
    pairs: pd.DataFrame  # per pair (joined with a compare directory when given)
    check: float  # the lens at the last layer against the model's own logits (relative difference)
    languages: pd.DataFrame | None = None  # per language, with a compare directory's outcomes
    pair_correlations: pd.DataFrame | None = None
    figures: dict = field(default_factory=dict)


@dataclass
class AlignResult:
    curves: pd.DataFrame  # language × layer, to the pivot
    matrix: pd.DataFrame  # layer × language × language
    items: pd.DataFrame  # item × layer cosine to the pivot parallel
    matrix_layer: int  # the layer of the language × language figure
    correlations: pd.DataFrame | None = None  # with a compare directory's results
    figures: dict = field(default_factory=dict)


def _store(acts, flag: str = "--acts"):
    from babelprobe.extract import open_store

    path = Path(acts)
    if not (path / LAYOUTS["store"].manifest).exists():
        LAYOUTS["store"].check(path, flag)  # "no such directory" or "not a finished store directory"
    return open_store(path)


def _store_items(store, items, languages=None):
    """The items a store was made from (its manifest's source), else `items` (loaded), else an error."""
    from babelprobe.items import load_items

    if (store.manifest.get("items") or {}).get("source"):
        return store.load_items()
    if items is None:
        raise BabelprobeError(f"store {store.path} does not say which items it holds; pass --items")
    return load_items(items, languages=languages) if isinstance(items, (str, Path)) else items


# ------------------------------------------------------------------------------------------------ lens

@runner(LensSettings, old=("model", "items", "out", "settings"))
def lens(items, out: str | Path, settings: LensSettings | None = None, runtime: Runtime | None = None, *,
         acts: str | Path | None = None, compare: str | Path | None = None) -> LensResult:
    """The logit lens with language attribution (`latent.lens`), written to `out`.

    Without `acts`, every pair's meta question (both option orders) is run once and stored in OUT/states,
    and the lens reads it; with `acts` it reads that store (its items from its manifest, else `items`;
    `settings.target` names the expected-answer field). `compare`: a compare directory to join with
    (per pair and per language). `runtime`: the model (a spec is loaded once the inputs are checked, a
    store's model against the model's files first) and the running options (or their keywords)."""
    from babelprobe.items import items_hash, load_items
    from babelprobe.latent import lens as lens_mod

    out = check_out_dir(out)
    check_inputs(items=(items, "items"), acts=(acts, "store"), compare=(compare, "compare"))
    if acts is not None:
        store = _store(acts)
        store.check_files()  # a truncated shard: before the model loads
        items = _store_items(store, items)
        info = runtime.info
        if store.fingerprint and store.fingerprint != info.fingerprint:
            raise BabelprobeError(f"--acts {store.path} was made with another model than {info.name}; the lens reads "
                                  "a store through its own model's unembedding: give that model or another --acts")
        identity = {"store": str(Path(acts).resolve()), "target": settings.target}
    else:
        if settings.target:
            raise BabelprobeError("--target needs --acts (the meta questions' answer is the acceptable concept)")
        if items is None:
            raise BabelprobeError("the lens needs --items (the meta questions are asked of them) or --acts")
        items = load_items(items) if isinstance(items, (str, Path)) else items
        lens_mod.meta_prompt_items(items, settings.prompts, settings.orders)  # bad items or prompts: now
        identity = {"orders": list(settings.orders), "prompts": settings.prompts}
    lm = runtime.lm
    run = open_run(out, {"fingerprint": lm.fingerprint, "items_hash": items_hash(items), **identity,
                         "pivot": settings.pivot, "top_k": settings.top_k},
                   record={"model": lm.name, "settings": settings_record(settings)}, manifest=LAYOUTS["lens"].manifest,
                   overwrite=runtime.overwrite, outputs=LENS_OUTPUTS,
                   what="a lens run of another model, item set or settings")

    def produce():
        if acts is not None:
            table = lens_mod.lens_table(lm, store, items, target=settings.target, pivot=settings.pivot,
                                        top_k=settings.top_k, progress=runtime.progress)
            texts = items.set_index("item_id").loc[store.keys["item_id"], "text"].tolist()
            check = lens_mod.last_layer_check(lm, store, texts)
        else:
            table, check = lens_mod.meta_lens(lm, items, out, pivot=settings.pivot, prompts=settings.prompts,
                                              orders=settings.orders, top_k=settings.top_k,
                                              batch_tokens=runtime.batch_tokens, overwrite=runtime.overwrite,
                                              progress=runtime.progress)
        run.state["last_layer_check"] = {"max_relative_difference": check, "what": "lens at the last layer vs the "
                                         "model's own next-token logits, first 4 stored rows"}
        write_table(table, out / "lens.csv")
        return table

    # the same run again (e.g. with a compare directory added) reuses lens.csv and redoes tables and figures
    table = run.stage("lens", {"version": 2}, produce, out / "lens.csv", read_table)
    curves = lens_mod.lens_curves(table, n_boot=settings.n_boot, seed=settings.seed)
    result = LensResult(table=table, curves=curves, turns=lens_mod.lens_turns(curves),
                        pairs=lens_mod.pair_summary(table),
                        check=run.state["last_layer_check"]["max_relative_difference"])
    write_table(result.curves, out / "curves.csv")
    write_table(result.turns, out / "turns.csv")
    if compare is not None:
        result.pairs, accuracy = lens_mod.join_compare(result.pairs, compare)
        result.languages = accuracy.merge(result.turns, on="language", how="left") if len(result.turns) else accuracy
        result.pair_correlations = lens_mod.pair_correlations(result.pairs)
        write_table(result.languages, out / "languages.csv")
        write_table(result.pair_correlations, out / "pair_correlations.csv")
    write_table(result.pairs, out / "pairs.csv")
    if runtime.figures:
        from babelprobe.analysis.latent import lens_figures

        result.figures = lens_figures(result.curves, settings.pivot, out / "figures")
    run.save()
    return result


# ----------------------------------------------------------------------------------------------- align

@runner(AlignSettings, old=("model", "items", "out", "settings"))
def align(items, out: str | Path, settings: AlignSettings | None = None, runtime: Runtime | None = None, *,
          acts: str | Path | None = None, compare: str | Path | None = None, matrix_layer: int | None = None,
          source: dict | None = None) -> AlignResult:
    """Cross-lingual alignment of parallel items by layer (`latent.align`), written to `out`.

    The store: `acts`, else the compare directory's acts/ (`compare`), else OUT/acts extracted here with
    the runtime's model (loaded once the inputs are checked; its layers against --layers first).
    `matrix_layer`: the layer of the language × language figure (default: the best mean retrieval)."""
    from babelprobe.latent.align import align_layers, alignment_correlations, parallel_items

    out = check_out_dir(out)
    check_inputs(items=(items, "items"), acts=(acts, "store"), compare=(compare, "compare"))
    store_path = Path(acts) if acts is not None else Path(compare) / "acts" if compare is not None else out / "acts"
    if acts is not None or compare is not None:
        store = _store(store_path, "--acts" if acts is not None else "--compare")
        layers = parse_layers(settings.layers, store.layers, stored=True)
        items = _store_items(store, items)
        _check_align(parallel_items(store, items), settings, layers, matrix_layer)
    else:  # extract first: check what can be checked without the model, then extract
        if items is None:
            raise BabelprobeError("align needs --acts, --compare or --items (to extract a store into OUT/acts)")
        from babelprobe.extract.layers import check_spec
        from babelprobe.items import load_items

        check_spec(settings.layers)
        items = load_items(items) if isinstance(items, (str, Path)) else items
        if "parallel_id" not in items.columns:
            raise BabelprobeError("the items have no 'parallel_id' field, which links the same content across "
                                  "languages; add it to the item file (README, Items)")
        _check_align(items, settings, None, matrix_layer)
        parse_layers(settings.layers, runtime.info.n_layers)
        from babelprobe.extract import extract

        extract(runtime.lm, items, store_path, pool=settings.pool, overwrite=runtime.overwrite, source=source,
                progress=runtime.progress)
        store = _store(store_path)
        layers = parse_layers(settings.layers, store.layers, stored=True)
    run = open_run(out, {"store": str(store_path.resolve()), "items_hash": store.items_hash, "pivot": settings.pivot,
                         "pool": settings.pool, "centre": settings.centre, "layers": layers},
                   record={"model": (store.manifest.get("model") or {}).get("model"),
                           "settings": settings_record(settings)},
                   manifest=LAYOUTS["align"].manifest, overwrite=runtime.overwrite,
                   outputs=tuple(o for o in ALIGN_OUTPUTS if o != "acts" or acts is not None or compare is not None),
                   what="an alignment of another store or settings")
    tables = align_layers(store, items, pivot=settings.pivot, layers=layers, pool=settings.pool,
                          centre=settings.centre, progress=runtime.progress)
    best = int(tables["curves"].groupby("layer")["retrieval"].mean().idxmax())
    result = AlignResult(curves=tables["curves"], matrix=tables["matrix"], items=tables["items"],
                         matrix_layer=best if matrix_layer is None else int(matrix_layer))
    write_table(result.curves, out / "curves.csv")
    write_table(result.matrix, out / "matrix.csv")
    write_table(result.items, out / "items.csv")
    if compare is not None:
        result.correlations = alignment_correlations(result.curves, result.items, compare)
        write_table(result.correlations, out / "correlations.csv")
    if runtime.figures:
        from babelprobe.analysis.latent import alignment_figures

        result.figures = alignment_figures(result.curves, result.matrix, result.correlations, result.matrix_layer,
                                           out / "figures")
    run.state.update(matrix_layer=result.matrix_layer, best_layer=best)
    run.save()
    return result


def _check_align(keys: pd.DataFrame, settings: AlignSettings, layers: list[int] | None, matrix_layer) -> None:
    """The pivot among the items' languages, at least two languages, the figure's layer among the layers."""
    languages = sorted(keys["language"].unique())
    if settings.pivot not in languages:
        raise BabelprobeError(f"--pivot {settings.pivot}: not among the items' languages ({', '.join(languages)}); "
                              "extract it too or choose another --pivot")
    if len(languages) < 2:
        raise BabelprobeError("alignment needs items in at least two languages")
    if matrix_layer is not None and layers is not None and int(matrix_layer) not in layers:
        raise BabelprobeError(f"--matrix-layer {matrix_layer} is not among the aligned layers "
                              f"({layers[0]}..{layers[-1]})")
