"""The probe sweep (`babelprobe probe`, `bp.probe`): cross-validated logistic probes for every layer of every group (language × subset by
default), read group by group from an activation store — the XCOMPS "neuro" method.

    import babelprobe as bp
    result = bp.probe("acts/", by=("language", "subset"), folds=5, controls="all", items=items)
    result.table        # one row per group × layer: f1_mean, f1_std, f1_ci_low/high, accuracy, auc, n, ...
    result.peaks        # one row per group: peak layer, its bootstrap interval, relative depth, 1-SE layer
    result.oof          # one row per item × layer: out-of-fold decision score and fold
    result.pair_scores(layer=6)   # one row per pair: correct when score_good > score_bad
    result.probes       # the probe of every group × layer fitted on all of the group's items (`Probes`)
    result.write("neuro.csv")     # neuro.csv + neuro.folds.csv, neuro.oof.parquet, neuro.peaks.csv,
                                  # neuro.probes.h5 (the weights, `bp.load_probes`), ...

For each group: items labelled -1 are left out; folds are made (grouped by pair by default); for every
layer and fold a probe is trained on the standardised training rows and scores the held-out rows
(all layers and folds of a group in one batched solve with the torch solver); F1 of the positive class
(label 1, acceptable) is computed per fold and averaged; a bootstrap over pairs gives intervals. Controls
(majority, shuffled labels, Hewitt–Liang concept control) use the same folds and C. The probe fitted
on all of the group's items (at the C chosen most often across folds) is solved in the same batch and
kept (`ProbeResult.probes`, written as NAME.probes.h5; see `babelprobe.probes.weights`).

On a CPU the torch solvers work on several groups at once, one thread each: the many small Newton
factorisations do not spread over threads, so groups side by side use the cores far better than
threads inside one solve (one group alone: L-BFGS spreads its layers over the threads instead).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from itertools import groupby
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from babelprobe.errors import BabelprobeError
from babelprobe.extract.layers import parse_layers
from babelprobe.inputs import check_input
from babelprobe.pipeline import frozen_heap
from babelprobe.probes.controls import (
    concept_labels,
    concepts_for,
    group_rng,
    majority_baseline,
    shuffled_labels,
)
from babelprobe.probes.folds import inner_train_masks, make_folds, train_masks
from babelprobe.probes.metrics import f1_scores, fold_metrics, out_of_fold
from babelprobe.probes.peaks import bootstrap_f1, f1_intervals, pair_draws, peak_summary
from babelprobe.probes.result import ProbeResult
from babelprobe.probes.settings import ProbeSettings
from babelprobe.probes.solvers import (
    default_exact_max,
    fit_predict,
    load_linalg,
    resolve_device,
    single_threaded,
)
from babelprobe.probes.source import (
    as_store,
    group_name,
    group_rows,
    in_memory,
    layer_chunks,
    read_checked,
    usable_keys,
)
from babelprobe.probes.weights import Probes, solver_record
from babelprobe.runtime import Runtime, runner
from babelprobe.settings import given
from babelprobe.tables import check_output

STANDARD_GROUP = ("language", "subset")  # every table carries these (value "all" when not grouped by)
HOST_MEMORY_GB = 2.0  # the default working memory on a CPU (`solver_memory_gb`), and of an in-memory store
ACCELERATOR_GROUPS = 2  # groups in flight on a GPU by default (`group_workers`)


@runner(ProbeSettings, old=("store", "settings"), progress=False)
def probe(store, out: str | Path | None = None, settings: ProbeSettings | None = None,
          runtime: Runtime | None = None, *, items: pd.DataFrame | None = None, device=None,
          n_jobs: int | None = None, workers: int | None = None, memory_gb: float | None = None,
          exact_max: int | None = None) -> ProbeResult:
    """The probe sweep of a store behind the runner door (`babelprobe probe`; docs/design.md "Runtime, settings,
    runners"): `probe(store, out, settings, runtime)`, the settings' fields as keywords (`bp.probe(store,
    folds=5)`) or the older `probe(store, settings)`. `runtime.progress`: a bar over groups (off unless asked:
    `progress=True`). `out`, when given, is the table written (.csv or .parquet, checked first; its side
    tables beside it, `ProbeResult.write`). The other parameters are `probe_store`'s."""
    check_input("store", store, "store")  # a path: there, readable, every shard opening
    if out is not None:
        check_output(out, (".csv", ".parquet"))
    result = probe_store(store, settings, items=items, device=device, n_jobs=n_jobs, workers=workers,
                         memory_gb=memory_gb, exact_max=exact_max, progress=runtime.progress)
    if out is not None:
        result.write(out)
    return result


def probe_store(store, settings: ProbeSettings | None = None, *, items: pd.DataFrame | None = None, device=None,
                n_jobs: int | None = None, workers: int | None = None, memory_gb: float | None = None,
                exact_max: int | None = None, progress: bool = False, **values) -> ProbeResult:
    """Cross-validated probes for every layer of every group of a store (`babelprobe probe`).

    Parameters
    ----------
    store : activation store directory, an opened store (`open_store`) or an `ArrayStore`.
    settings : a `ProbeSettings`, or its fields as keyword arguments (`values`): `by` (key columns that
        define the groups, default language × subset; () for one group), `layers` ("all", a list, or
        "0,6,12-18"), `folds`, `fold_scheme` ("grouped": stratified, pairs kept together; "plain":
        XCOMPS), `protocol` ("default" or "paper", which fixes folds and fold scheme), `pool`, `seed`,
        `solver` ("torch": batched exact Newton for small groups, L-BFGS for large ones, see
        `babelprobe.probes.solvers`; "newton", "lbfgs"; "sklearn", the reference), `C` (a list chooses C
        per fold and layer by inner cross-validation, `inner_folds`), `controls` ("none", "shuffle",
        "hewitt", "all"; the majority baseline is always reported), `transfer` (also train on each
        language and test on the others, `babelprobe.probes.crosslingual`), `n_boot`, `dtype` (the solver's).
    items : the items the store was made from (`load_items`), for the hewitt control's concepts; by
        default the item source recorded in the store's manifest is used when hewitt is asked for.
    device, n_jobs, memory_gb, exact_max : solver options that change speed, not numbers (see
        `fit_predict`); n_jobs parallelises the sklearn solver over layers. `memory_gb` is the budget of
        all groups in flight (default `solver_memory_gb`: 2 on a CPU, half of what an accelerator has free).
    workers : groups solved at the same time, one thread each (torch solver on CPU; default: torch's
        thread count). 1 solves one group at a time with all of torch's threads.
    progress : show a progress bar over groups.

    Returns
    -------
    ProbeResult with `table` (group × layer), `folds` (group × layer × fold), `oof` (item × layer),
    `peaks` (group), `transfer` (or None), `settings` and `probes` (the all-items probe of every group
    × layer, `Probes`).
    """
    settings = given(ProbeSettings, settings, values)
    store = as_store(store)
    by, pool, Cs, solver = settings.by, settings.pool, list(settings.C), settings.solver
    keys = usable_keys(store, by, pool)
    layer_list = parse_layers(settings.layers, store.layers, stored=True)
    control_names = settings.controls
    concepts = None
    if "hewitt" in control_names:
        if items is None and hasattr(store, "load_items"):
            try:
                items = store.load_items()
            except BabelprobeError as err:
                raise BabelprobeError(f"the hewitt control needs the items' concepts: pass --items ({err})") from err
        concepts = pd.Series(concepts_for(keys, items), index=keys.index)
    source = in_memory(store, layer_list, pool, memory_gb or HOST_MEMORY_GB)  # after the cheap checks: fail fast
    groups = group_rows(keys, by)
    workers = group_workers(workers, solver, device, len(groups))
    read_device = accelerator(device) if solver != "sklearn" else None  # groups decoded where they are solved
    memory_gb = memory_gb or solver_memory_gb(read_device)
    if exact_max is None and solver != "sklearn":
        exact_max = default_exact_max(resolve_device(device))
    share = memory_gb / workers  # the budget is shared by the groups in flight
    dtype = settings.dtype
    options = dict(n_folds=settings.folds, fold_scheme=settings.fold_scheme, seed=settings.seed, Cs=Cs,
                   inner_folds=settings.inner_folds, controls=control_names, n_boot=settings.n_boot,
                   n_layers=store.n_layers, memory_gb=share,
                   fit=dict(solver=solver, device=device, dtype=dtype, max_iter=settings.max_iter, tol=settings.tol,
                            n_jobs=n_jobs, memory_gb=share, exact_max=exact_max))

    columns = {column: keys[column].to_numpy() for column in ("item_id", "pair_id", "language", "subset", "label")}

    def one_group(group):
        (key, index), at = group
        name = group_name(by, key)

        def read(chunk):
            return read_checked(source, index, chunk, pool, name, device=read_device)

        rows = {column: values[at] for column, values in columns.items()}  # numpy: pandas costs more than a fit
        result = _group_columns(read, rows, layer_list, store.d_model, name=name,
                                concepts=None if concepts is None else concepts.loc[index].to_numpy(), **options)
        # the key columns of its out-of-fold rows: a large group's taken beside the next group's fits (Arrow's takes
        # release the GIL), a small group's later with its neighbours' (`_oof_key_parts`)
        place = at[result["oof"]["row"]]
        oof_keys = tabling.submit(_oof_keys, keys, place) if len(place) >= BACKGROUND_OOF_ROWS else place
        return {**_label_group(result, by, key), "oof_keys": oof_keys}

    load_linalg(read_device)  # here, not first in two of map_groups' threads at once
    # each group makes tables: no full collector pass over what was loaded before (the model); a thread of this
    # sweep's own (not kept by the module: it would outlive a fork) takes the groups' out-of-fold key columns
    with frozen_heap(), ThreadPoolExecutor(1, thread_name_prefix="babelprobe-oof") as tabling:
        parts = map_groups(one_group, list(zip(groups, _positions(keys, groups), strict=True)), workers, progress)
        oof = _oof_frame(_oof_key_parts(keys, [part["oof_keys"] for part in parts]), [part["oof"] for part in parts])
    record = {"method": "neuro", "pool": pool, "solver": solver, "C": Cs[0] if len(Cs) == 1 else Cs,
              "fold_scheme": settings.fold_scheme, "folds": settings.folds, "seed": settings.seed,
              "inner_folds": settings.inner_folds, "controls": list(control_names), "n_boot": settings.n_boot,
              "by": list(by), "layers": layer_list, "protocol": settings.protocol, "transfer": settings.transfer,
              "n_layers": store.n_layers, "store": str(getattr(store, "path", "")),
              "fingerprint": getattr(store, "fingerprint", None), "items_hash": getattr(store, "items_hash", None),
              "device": str(device) if device else None, "dtype": str(dtype) if dtype else None,
              "exact_max": exact_max, "libraries": dict(_versions()),
              "solver_record": solver_record([part["probe"] for part in parts])}
    # every group's columns joined once (a table per group and a concatenation cost more than the fits on small groups)
    table = _with_settings(_frame([p["table"] for p in parts]), record)
    out = ProbeResult(table=table, folds=_with_settings(_frame([p["folds"] for p in parts]), record),
                      oof=oof,
                      peaks=_with_settings(pd.DataFrame([p["peak"] for p in parts]), record),
                      settings=record, probes=_probes(parts, groups, by, layer_list, record))
    if settings.transfer:
        out.transfer = _transfer_with_diagonal(source, by, layer_list, table, pool=pool, progress=progress,
                                               C=_most_chosen_C(table), **options["fit"])
    return out


def group_workers(workers: int | None, solver: str, device, n_groups: int) -> int:
    """How many groups to solve at once: `workers` if given, else torch's thread count for the torch
    solvers on a CPU, 2 on a GPU (one group is read from the store and tabled on the host while the other is
    solved: on an 8B model's store the reading takes about as long as the solve), and 1 for the sklearn
    solver, which has its own `n_jobs`."""
    if workers is not None:
        if workers < 1:
            raise BabelprobeError(f"workers must be at least 1, got {workers}")
        return min(workers, max(1, n_groups))
    if solver == "sklearn":
        return 1
    import torch

    from babelprobe.probes.solvers import resolve_device

    if resolve_device(device).type != "cpu":
        return min(ACCELERATOR_GROUPS, n_groups)
    return max(1, min(torch.get_num_threads(), n_groups))


def solver_memory_gb(device) -> float:
    """The solvers' default budget: HOST_MEMORY_GB on a CPU; on an accelerator half of what it has free
    (torch's free memory plus the blocks its allocator holds unused; at least HOST_MEMORY_GB). A fixed 2 GB there
    cut a quarter-XCOMPS group (1,796 items × 33 layers × 4096) into 17 solves of 2 layers, each its own run
    of L-BFGS iterations, on an H200 with over 100 GB free."""
    if device is None or device.type != "cuda":
        return HOST_MEMORY_GB
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return max(HOST_MEMORY_GB, (free + unused) / 2 / 2**30)


def accelerator(device):
    """The torch solver's device when it is not the CPU (a group's activations are read straight to it), else None."""
    resolved = resolve_device(device)
    return None if resolved.type == "cpu" else resolved


def map_groups(fn, groups: list, workers: int, progress: bool) -> list:
    """[fn(group) for group in groups], `workers` at a time in threads (each single-threaded), with a
    progress bar; the first error stops the groups not yet started and is raised."""
    bar = dict(desc="probe", unit="group", total=len(groups), disable=not progress)
    if workers == 1:
        return [fn(group) for group in tqdm(groups, **bar)]
    with single_threaded(), ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(fn, group) for group in groups]
        try:
            for future in tqdm(futures, **bar):  # in order
                error = future.exception()
                if error is not None:
                    raise error
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()


def probe_group(read, keys: pd.DataFrame, layers: list[int], d_model: int, **options) -> dict:
    """Cross-validate probes for one group.

    `read(layers)` returns float32 activations [n, len(layers), d] of the group's rows (`keys`, labels
    0/1 only). Returns a dict of `table` rows (per layer), `folds` rows, `oof` rows, the `peak` and the
    `probe` fitted on all rows (arrays per layer: coef, intercept, mean, scale, C; its method). Options
    (keyword-only): name, n_folds, fold_scheme, seed, Cs, inner_folds, controls, concepts, n_boot, n_layers,
    memory_gb, fit (see `probe`)."""
    out = _group_columns(read, keys, layers, d_model, **options)
    keys = pd.DataFrame(keys).reset_index(drop=True)
    return {**out, **{name: _frame([out[name]]) for name in ("table", "folds")},
            "oof": _oof_frame([_oof_keys(keys, out["oof"]["row"])], [out["oof"]])}


# A group's bootstrap draws (`peaks.pair_draws`) are made on a thread of their own while its probes are fitted,
# from BACKGROUND_DRAWS replicates × items up (~1 ms of binomial draws on the 2-core machine; a thread costs
# ~0.1 ms): at XCOMPS's 3,592 pairs a group, 1,000 replicates took 0.17 s there, in line after the fits.
BACKGROUND_DRAWS = 50_000
# A group's out-of-fold key columns are taken on the sweep's thread from BACKGROUND_OOF_ROWS rows (items × layers)
# up. Below it the next group's fits beside that thread slow down more than the takes save: at 4 items × 19 layers
# a group the sweep's fits took 1.24-1.34 times their replay beside it, 1.00 without (perf/README.md; a shorter
# GIL switch interval did not change it).
BACKGROUND_OOF_ROWS = 20_000


def _in_background(fn, *args) -> Future:
    """`fn(*args)` on a thread made for it: a pool kept by the module would outlive a fork without its thread, and
    a sweep in the forked process would wait on it for ever."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="babelprobe-background")
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)  # the thread ends with its one task


def _group_columns(read, keys, layers: list[int], d_model: int, *, name: str, n_folds: int,
                   fold_scheme: str, seed: int, Cs: list[float], inner_folds: int, controls: tuple[str, ...],
                   concepts: np.ndarray | None, n_boot: int, n_layers: int, memory_gb: float, fit: dict) -> dict:
    """`probe_group`'s work, its tables as columns (name -> array, or a scalar for every row). `keys`: the
    group's key columns (a table, or a dict of arrays)."""
    labels = np.asarray(keys["label"]).astype(int)
    # each item's pair as its rank among the group's pair ids: the folds, the draws and the counts depend on that
    # order alone, and every later np.unique of small integers costs a fraction of one of strings
    pair_ids = np.unique(np.asarray(keys["pair_id"], dtype=object).astype(str), return_inverse=True)[1]
    n, L = len(labels), len(layers)
    fold = make_folds(labels, pair_ids, n_folds, fold_scheme, seed, name)
    train = train_masks(fold, n_folds)
    tasks = {"probe": np.tile(labels, (n_folds, 1))}
    if "shuffle" in controls:
        tasks["shuffle"] = shuffled_labels(labels, train, group_rng(seed, name, "shuffle"))
    if "hewitt" in controls:
        control = concept_labels(concepts, group_rng(seed, name, "hewitt"))
        tasks["hewitt"] = np.tile(control, (n_folds, 1))
    rng = group_rng(seed, name, "bootstrap")
    draws = _in_background(pair_draws, pair_ids, n_boot, rng) if n_boot * n >= BACKGROUND_DRAWS else None
    # the last problem trains on every row: the probe that is kept (in the same batch as the folds)
    y = np.concatenate([*tasks.values(), labels[None]])
    trains = np.concatenate([np.tile(train, (len(tasks), 1)), np.ones((1, n), dtype=bool)])
    scores = np.empty((len(y) - 1, L, n))
    chosen = np.full((n_folds, L), Cs[0])
    kept = {"coef": np.empty((L, d_model)), "intercept": np.empty(L), "mean": np.empty((L, d_model)),
            "scale": np.empty((L, d_model)), "C": np.empty(L), "n_iter": np.zeros(L, np.int64),
            "conditioning": np.full(L, np.nan), "n_iter_all": []}
    j = 0
    for chunk in layer_chunks(layers, n, d_model, memory_gb):
        X = read(chunk)
        at = slice(j, j + len(chunk))
        if len(Cs) > 1:
            chosen[:, at] = choose_C(X, labels, pair_ids, train, Cs, inner_folds, fold_scheme, seed, name, fit)
        C_all = np.concatenate([np.tile(chosen[:, at], (len(tasks), 1)),
                                [_modes(chosen[:, at])]])
        part, fitted = fit_predict(X, y, trains, C_all, return_fit=True, **fit)
        scores[:, at] = part[:-1]
        for key in ("coef", "intercept", "mean", "scale"):
            kept[key][at] = getattr(fitted, key)[-1]
        kept["C"][at] = C_all[-1]
        kept["method"] = fitted.method
        kept["n_iter"][at], kept["n_iter_all"] = fitted.n_iter[-1], [*kept["n_iter_all"], fitted.n_iter]
        kept["conditioning"][at] = fitted.info.get("conditioning", np.nan)
        j += len(chunk)
    kept.update(n_train=n, n_positive=int((labels == 1).sum()))
    by_task = dict(zip(tasks, np.split(scores, len(tasks)), strict=True))
    main = fold_metrics(by_task["probe"], labels, fold, n_folds)
    majority_f1s, majority_accuracy = majority_baseline(labels, fold, n_folds)
    extra = {"majority_f1": np.tile(majority_f1s[:, None], (1, L)),
             "majority_accuracy": np.tile(majority_accuracy[:, None], (1, L))}
    if "shuffle" in controls:
        extra["shuffle_f1"] = fold_metrics(by_task["shuffle"], labels, fold, n_folds)["f1"]
    if "hewitt" in controls:
        extra["control_f1"] = fold_metrics(by_task["hewitt"], tasks["hewitt"], fold, n_folds)["f1"]
    oof = out_of_fold(by_task["probe"], fold)
    if n_boot:
        replicates = bootstrap_f1(oof > 0, labels, fold, n_folds, pair_ids, n_boot, rng,
                                  draws=draws.result() if draws is not None else None)
    else:
        replicates = np.full((1, L), np.nan)
    return {"table": _layer_rows(layers, n_layers, labels, pair_ids, main, extra, chosen, replicates),
            "folds": _fold_rows(layers, main, extra, chosen, train),
            "oof": _oof_rows(layers, fold, oof),
            "peak": _peak_row(layers, n_layers, main, replicates, n, pair_ids), "probe": kept}


def choose_C(X: np.ndarray, labels: np.ndarray, pair_ids: np.ndarray, train: np.ndarray, Cs: list[float],
             inner_folds: int, fold_scheme: str, seed: int, name: str, fit: dict) -> np.ndarray:
    """Nested choice of C: [n_folds, L] the C with the best mean inner-fold F1 (the smallest C on ties)
    within each outer training fold, for each layer."""
    inner = inner_train_masks(labels, pair_ids, train, inner_folds, fold_scheme, seed, name)  # [F, G, n]
    F, G, n = inner.shape
    trains = np.repeat(inner.reshape(F * G, n), len(Cs), axis=0)  # problem (f, g, c)
    C_of = np.tile(Cs, F * G)
    scores = fit_predict(X, np.tile(labels, (len(trains), 1)), trains, C_of, **fit)
    valid = np.repeat(train, G * len(Cs), axis=0) & ~trains
    f1 = np.stack([f1_scores(scores[p][:, valid[p]], labels[valid[p]]) for p in range(len(trains))])
    mean_f1 = f1.reshape(F, G, len(Cs), -1).mean(1)  # [F, C, L]
    return np.asarray(Cs)[mean_f1.argmax(1)]


# ------------------------------------------------------------------------------------------ table rows

def _layer_rows(layers, n_layers, labels, pair_ids, main, extra, chosen, replicates) -> dict:
    k = main["f1"].shape[0]
    low, high = f1_intervals(replicates) if not np.isnan(replicates).all() else (np.nan, np.nan)
    L = len(layers)
    table = {
        "layer": np.asarray(layers, dtype=np.int64), "relative_depth": np.asarray(layers) / n_layers,
        "n": np.full(L, len(labels)), "n_pairs": np.full(L, len(np.unique(pair_ids))),
        "n_positive": np.full(L, int((labels == 1).sum())),
        "f1_mean": main["f1"].mean(0), "f1_std": main["f1"].std(0),
        "f1_se": main["f1"].std(0, ddof=1) / np.sqrt(k), "f1_ci_low": np.full(L, low) if np.ndim(low) == 0 else low,
        "f1_ci_high": np.full(L, high) if np.ndim(high) == 0 else high,
        "accuracy": main["accuracy"].mean(0), "accuracy_std": main["accuracy"].std(0),
        "auc": np.nanmean(main["auc"], 0) if not np.isnan(main["auc"]).all() else np.full(L, np.nan),
        "C_selected": _modes(chosen)}
    for column, values in extra.items():
        table[column] = values.mean(0)
        if not column.startswith("majority"):
            table[column.replace("_f1", "_f1_std")] = values.std(0)
    if "control_f1" in extra:
        table["selectivity"] = table["f1_mean"] - table["control_f1"]
    return table


def _fold_rows(layers, main, extra, chosen, train) -> dict:
    k, L = main["f1"].shape
    # sorted by layer, then fold (the arrays are [fold, layer]: transposed)
    rows = {"layer": np.repeat(np.asarray(layers, dtype=np.int64), k), "fold": np.tile(np.arange(k), L),
            "n_train": np.tile(train.sum(1), L), "n_test": np.tile(np.asarray(main["n_test"]), L),
            "f1": main["f1"].T.ravel(), "accuracy": main["accuracy"].T.ravel(), "auc": main["auc"].T.ravel(),
            "C_selected": chosen.T.ravel()}
    for column, values in extra.items():
        rows[column] = values.T.ravel()
    return rows


def _oof_rows(layers, fold, oof) -> dict:
    """The group's out-of-fold scores, item by layer; `row`: the item's place in the group's keys."""
    n, L = len(fold), len(layers)
    return {"row": np.tile(np.arange(n), L), "layer": np.repeat(np.asarray(layers, dtype=np.int64), n),
            "fold": np.tile(fold, L), "score": oof.ravel()}


OOF_KEYS = ("item_id", "pair_id", "language", "subset", "label")


def _oof_keys(keys: pd.DataFrame, place: np.ndarray) -> dict:
    """The key columns of a group's out-of-fold rows (`place`: each row's item in `keys`), taken from `keys`: a
    string column built from Python strings, one per item × layer, took longer than the fits at XCOMPS's size
    (4 million rows a quarter); Arrow's takes of its string columns release the GIL."""
    columns = {"method": _taken(pd.Series(["neuro"]), np.zeros(len(place), dtype=np.intp))}
    for column in OOF_KEYS:
        columns[column] = _taken(keys[column], place)
    return columns


def _oof_key_parts(keys: pd.DataFrame, pending: list) -> list[dict]:
    """The groups' out-of-fold key columns in order, from `pending`: per group a future of its `_oof_keys` (taken
    on a thread) or its rows' places in `keys`; a run of groups given by places is taken at once."""
    parts = []
    for as_places, run in groupby(pending, key=lambda group: isinstance(group, np.ndarray)):
        if as_places:
            parts.append(_oof_keys(keys, np.concatenate(list(run))))
        else:
            parts.extend(future.result() for future in run)
    return parts


def _oof_frame(key_parts: list[dict], oofs: list[dict]) -> pd.DataFrame:
    """The out-of-fold table of the groups' key columns (`_oof_key_parts`, the same rows in the same order) and
    their `_oof_rows`, joined once (an Arrow column's pieces as the chunks of one column, not copied)."""
    if not oofs:
        return pd.DataFrame()
    columns = {column: _joined([keys[column] for keys in key_parts]) for column in ("method", *OOF_KEYS)}
    for column in ("layer", "fold", "score"):
        columns[column] = np.concatenate([oof[column] for oof in oofs])
    return pd.DataFrame(columns)


def _joined(pieces: list):
    """numpy arrays concatenated; extension arrays (Arrow's) joined by their own type (`_concat_same_type`, the
    extension-array interface's join: an Arrow column's pieces become the chunks of one column)."""
    if isinstance(pieces[0], np.ndarray):
        return np.concatenate(pieces)
    return type(pieces[0])._concat_same_type(pieces)


def _taken(column: pd.Series, place: np.ndarray):
    """`column`'s values at `place`: an extension array's own take (a string column's stays in Arrow), a numpy
    column's as numpy values (the frame then infers their dtype as it does for any numpy column)."""
    if isinstance(column.dtype, np.dtype):
        return column.to_numpy()[place]
    return column.array.take(place)


def _peak_row(layers, n_layers, main, replicates, n, pair_ids) -> dict:
    k = main["f1"].shape[0]
    f1_mean, f1_se = main["f1"].mean(0), main["f1"].std(0, ddof=1) / np.sqrt(k)
    if np.isnan(replicates).all():
        replicates = f1_mean[None]  # no bootstrap: the interval collapses onto the peak
    return {"n": n, "n_pairs": len(np.unique(pair_ids)), "n_layers": n_layers,
            **peak_summary(np.asarray(layers), f1_mean, f1_se, replicates, n_layers)}


def _label_group(result: dict, by, key) -> dict:
    """Put the group's columns first in every table ("all" for a standard column not grouped by)."""
    values = dict(zip(by, key, strict=True))
    for column in STANDARD_GROUP:
        values.setdefault(column, "all")
    out = dict(result)
    for name in ("table", "folds"):
        out[name] = {"method": "neuro", **values, **result[name]}
    out["peak"] = {"method": "neuro", **values, **result["peak"]}
    return out


def _frame(parts: list[dict]) -> pd.DataFrame:
    """One table from the columns of several groups (a scalar stands for a column of one value)."""
    if not parts:
        return pd.DataFrame()
    sizes = [max((len(v) for v in part.values() if isinstance(v, np.ndarray)), default=1) for part in parts]
    columns = {}
    for column in parts[0]:
        pieces = [part[column] if isinstance(part[column], np.ndarray) else np.full(size, part[column], dtype=object
                  if isinstance(part[column], str) else None) for part, size in zip(parts, sizes)]
        columns[column] = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
    return pd.DataFrame(columns)


def _positions(keys: pd.DataFrame, groups: list) -> list[np.ndarray]:
    """Each group's rows' positions in `keys`, from one lookup: one per group took longer than a small group's
    tables (0.3 ms)."""
    if not groups:
        return []
    at = keys.index.get_indexer(np.concatenate([index for _, index in groups]))
    return np.split(at, np.cumsum([len(index) for _, index in groups[:-1]]))


def _probes(parts: list[dict], groups: list, by: tuple, layers: list[int], settings: dict) -> Probes:
    """The kept all-items probes of every group, as one `Probes`."""
    kept = [part["probe"] for part in parts]
    table = pd.DataFrame([dict(zip(by, key, strict=True)) for key, _ in groups], columns=list(by))
    for column in ("n_train", "n_positive", "method"):
        table[column] = [probe[column] for probe in kept]
    arrays = {key: np.stack([probe[key] for probe in kept])
              for key in ("coef", "intercept", "mean", "scale", "C", "n_iter", "conditioning")}
    return Probes(table, layers, **arrays, by=by, settings=settings)


def _with_settings(frame: pd.DataFrame, settings: dict) -> pd.DataFrame:
    frame = frame.copy()
    for column in ("pool", "solver", "fold_scheme", "folds", "seed"):
        frame[column] = settings[column]
    frame["C"] = settings["C"] if not isinstance(settings["C"], list) else "nested:" + ",".join(map(str, settings["C"]))
    return frame


def _modes(chosen: np.ndarray) -> np.ndarray:
    """The most chosen C of each layer (column) of `chosen` [folds, L]: `_mode` per column; a column of one
    value at once (a single C, the usual case, needs no counting)."""
    if (chosen == chosen[:1]).all():
        return chosen[0].astype(float)
    return np.array([_mode(chosen[:, j]) for j in range(chosen.shape[1])], dtype=float)


def _mode(values: np.ndarray) -> float:
    uniq, counts = np.unique(values, return_counts=True)
    return float(uniq[counts.argmax()])


def _most_chosen_C(table: pd.DataFrame) -> float:
    return _mode(table["C_selected"].to_numpy())


def _transfer_with_diagonal(store, by, layers, table, **options) -> pd.DataFrame:
    """The transfer matrix, with in-language cross-validated F1 on its diagonal (kind "cv")."""
    from babelprobe.probes.crosslingual import transfer

    if "language" not in by:
        raise BabelprobeError("--transfer compares languages: group by language (--by language,subset)")
    off = transfer(store, by=tuple(c for c in by if c != "language"), layers=layers, **options)
    for column in STANDARD_GROUP:
        if column != "language" and not off.empty and column not in off.columns:
            off[column] = "all"  # as in the per-layer table, for a column not grouped by
    diagonal = table.rename(columns={"f1_mean": "f1"}).assign(
        train_language=table["language"], test_language=table["language"], n_train=np.nan, C=table["C_selected"],
        kind="cv")
    keep = [c for c in off.columns if c in diagonal.columns] if not off.empty else \
        ["method", "train_language", "test_language", "subset", "layer", "f1", "accuracy", "auc", "n", "kind"]
    both = pd.concat([off, diagonal[keep]], ignore_index=True)
    order = [c for c in ("train_language", "test_language", *by, "layer") if c in both.columns and c != "language"]
    return both.sort_values(order, ignore_index=True)


@lru_cache(maxsize=1)  # a package lookup reads metadata files: ~4 ms each sweep otherwise
def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("babelprobe", "torch", "scikit-learn", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out
