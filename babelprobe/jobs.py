"""Job arrays for sweeps: every model × item set × language slice as independent, resumable jobs, run one
after another in this process (`executor="local"`) or as SLURM job arrays through submitit
(`executor="slurm"`, the optional extra `pip install 'babelprobe[slurm]'`).

    babelprobe sweep --models default,ORG/NAME --items xcomps-sample --languages en,de --languages ja,zh --out sweeps/

Two kinds of job (`plan`):
  extract  one per store (a cell: model × item set × language slice): `extract` into CELL/acts; an
           interrupted one resumes from its last complete shard;
  probe    one per batch of probe groups (language × subset by default, `groups_per_job` per batch) of
           a store: the probe sweep over just those groups' rows, into CELL/probes/batch-NNN.csv (with
           its side tables). Groups are independent in the probe sweep, so batches add up to the
           sweep of the whole store (cross-lingual transfer, which spans groups, is not run here).
A job that finished leaves a marker `OUT/.jobs/ID.json` holding its spec; a rerun skips it (and any
job whose spec changed is redone). Probe jobs of a cell need its store: locally they run after it, on
SLURM they are submitted with an `afterok` dependency on its extract job. When every job is done,
`collect` writes CELL/neuro.csv and CELL/neuro.peaks.csv (the batches joined) and OUT/summary.csv (the
peak layer of every cell × group).

`sweep(item_sets, out, settings, runtime, models=...)` (`bp.sweep`, `babelprobe sweep`) plans, checks the run directory
and runs: `OUT/sweep.json` records the sweep's identity (models, item sets, slices and `SweepSettings`;
`runs.open_run`): the same command again resumes; other settings are refused unless `overwrite`.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.extract.settings import ExtractSettings
from babelprobe.inputs import check_input
from babelprobe.probes.settings import ProbeSettings
from babelprobe.runs import LAYOUTS
from babelprobe.runtime import Runtime, runner
from babelprobe.settings import Nested, at_least, block, block_record, option, settings_record
from babelprobe.tables import atomic_path, write_table

EXECUTORS = ("local", "slurm")
STANDARD_GROUP = ("language", "subset")
MANIFEST = LAYOUTS["sweep"].manifest


@dataclass(frozen=True)
class SweepSettings(Nested):
    """What changes the numbers of a sweep's extractions and probes (recorded in sweep.json): each job's own
    settings class (flagged flat; `--pool` and `--layers` set both: what is stored is what is probed) and
    the probe groups per job."""

    extract: ExtractSettings = block(ExtractSettings, ("pool", "layers", "backend"),
                                     help="the extraction jobs' settings")
    probe: ProbeSettings = block(ProbeSettings, ("by", "folds", "seed", "n_boot", "controls", "pool", "layers"),
                                 help="the probe jobs' settings")
    groups_per_job: int = option(8, metavar="N", help="probe groups per job")

    def __post_init__(self):
        at_least(self, "groups_per_job", 1)

    def extract_options(self) -> dict:
        return block_record(self, "extract")

    def probe_options(self) -> dict:
        return {k: v for k, v in block_record(self, "probe").items() if k != "by"}


@dataclass(frozen=True)
class Job:
    """One unit of work. `cell` names its store's directory (model/items/slice); a probe job also has its
    `batch` number and the `groups` (tuples of the `by` values) it probes."""

    kind: str  # "extract" or "probe"
    model: str
    items: str
    languages: tuple[str, ...] | None
    cell: str
    out: str  # the sweep directory
    extract_options: dict = field(default_factory=dict)
    probe_options: dict = field(default_factory=dict)
    batch: int | None = None
    groups: tuple = ()

    @property
    def id(self) -> str:
        name = f"{self.cell}/extract" if self.kind == "extract" else f"{self.cell}/probe-{self.batch:03d}"
        return name.replace("/", "__")

    @property
    def store(self) -> Path:
        return Path(self.out) / self.cell / "acts"

    @property
    def table(self) -> Path:
        return Path(self.out) / self.cell / "probes" / f"batch-{self.batch:03d}.csv"

    def spec(self) -> dict:
        return json.loads(json.dumps(asdict(self)))


# ----------------------------------------------------------------------------------------------- planning

def slug(text: str) -> str:
    """A directory name for a model spec, an item source or a language slice."""
    name = Path(text).name if ("/" in text and Path(text).expanduser().exists()) else text
    name = name.removesuffix(".jsonl").removesuffix(".json").removesuffix(".csv").removesuffix(".tsv")
    return re.sub(r"[^A-Za-z0-9._@+-]+", "--", name).strip("-") or "x"


def slice_name(languages) -> str:
    return "+".join(languages) if languages else "all"


def plan(models: list[str], item_sets: list[str], slices: list, out: str | Path, *, by=STANDARD_GROUP,
         groups_per_job: int = 8, limit: int | None = None, subsets: list[str] | None = None,
         extract_options: dict | None = None, probe_options: dict | None = None) -> list[Job]:
    """Every job of the sweep: per cell (model × item set × language slice; a slice of None is every
    language) one extract job, then its probe jobs, `groups_per_job` groups each. The item sets are read
    here (cheap) to find the groups; the models are not loaded."""
    from babelprobe.items import load_items

    if not models or not item_sets:
        raise BabelprobeError("a sweep needs at least one model (--models) and one item set (--items)")
    if groups_per_job < 1:
        raise BabelprobeError(f"--groups-per-job must be at least 1, got {groups_per_job}")
    slices = list(slices) or [None]
    for kind, names in (("model", models), ("item set", item_sets)):
        slugs = [slug(x) for x in names]
        twice = next((x for x in slugs if slugs.count(x) > 1), None)
        if twice:
            raise BabelprobeError(f"two {kind}s share the directory name {twice!r}; give each a distinct name")
    jobs = []
    for items_spec in item_sets:
        for languages in slices:
            languages = tuple(languages) if languages else None
            items = load_items(items_spec, languages=list(languages) if languages else None, subsets=subsets,
                               limit=limit)
            groups = _groups(items, by)
            for model in models:
                cell = f"{slug(model)}/{slug(items_spec)}/{slice_name(languages)}"
                common = dict(model=model, items=items_spec, languages=languages, cell=cell, out=str(out),
                              extract_options={"limit": limit, "subsets": subsets, **(extract_options or {})},
                              probe_options={"by": list(by), **(probe_options or {})})
                jobs.append(Job("extract", **common))
                for batch, start in enumerate(range(0, len(groups), groups_per_job)):
                    jobs.append(Job("probe", **common, batch=batch, groups=tuple(groups[start:start + groups_per_job])))
    return jobs


def _groups(items: pd.DataFrame, by) -> list[tuple]:
    """The probe groups of an item set: distinct values of `by` among items labelled 0 or 1, sorted."""
    usable = items[items["label"].isin([0, 1])]
    missing = [c for c in by if c not in usable.columns]
    if missing:
        raise BabelprobeError(f"cannot group probes by {missing[0]!r}: the items have no such field")
    return sorted({tuple(str(v) for v in row) for row in usable[list(by)].itertuples(index=False)})


# ---------------------------------------------------------------------------------------------- one job

def run_job(spec: dict) -> str:
    """Run one job (a `Job.spec()`; plain data, so submitit can ship it to a cluster node) and mark it
    done. Returns the job's id."""
    job = Job(**{**spec, "languages": tuple(spec["languages"]) if spec["languages"] else None,
                 "groups": tuple(tuple(g) for g in spec["groups"])})
    if job.kind == "extract":
        _extract(job)
    elif job.kind == "probe":
        _probe(job)
    else:
        raise BabelprobeError(f"unknown job kind {job.kind!r}")
    mark_done(job)
    return job.id


def _extract(job: Job) -> None:
    from babelprobe.extract import extract
    from babelprobe.items import load_items
    from babelprobe.runtime import Runtime

    options = dict(job.extract_options)
    limit, subsets = options.pop("limit", None), options.pop("subsets", None)
    # the model, its placement and dtype and the batch budget are the runtime; everything else an `extract` option
    running = {k: options.pop(k) for k in ("device", "model_dtype", "device_map", "max_memory", "batch_tokens")
               if k in options}
    languages = list(job.languages) if job.languages else None
    items = load_items(job.items, languages=languages, subsets=subsets, limit=limit)
    runtime = Runtime(model=job.model, progress=False, **{k: v for k, v in running.items() if v is not None})
    extract(items, job.store, runtime=runtime,
            source={"source": job.items, "languages": languages, "subsets": subsets, "limit": limit}, **options)


def _probe(job: Job) -> None:
    from babelprobe.extract import open_store
    from babelprobe.probes.run import probe
    from babelprobe.probes.source import ArrayStore

    options = dict(job.probe_options)
    by = tuple(options.pop("by"))
    pool = options.get("pool", "last")
    store = open_store(job.store)
    keys = store.keys
    wanted = set(job.groups)
    rows = [i for i, key in enumerate(keys[list(by)].astype(str).itertuples(index=False)) if tuple(key) in wanted]
    if not rows:
        raise BabelprobeError(f"store {job.store} has no rows of the groups {sorted(wanted)[:3]}")
    # only this batch's rows are read: a batch's memory does not grow with the store
    part = ArrayStore(keys.iloc[rows], **{pool: store.read_layers(rows=rows, pool=pool)}, layers=store.layers,
                      n_layers=store.n_layers)
    part.path, part.manifest, part.load_items = str(store.path), store.manifest, store.load_items
    part.fingerprint, part.items_hash = store.fingerprint, store.items_hash
    result = probe(part, by=by, **options)
    result.settings.update({"store": str(store.path), "groups": [list(g) for g in job.groups]})
    job.table.parent.mkdir(parents=True, exist_ok=True)
    result.write(job.table)


# ------------------------------------------------------------------------------------------ done markers

def marker(job: Job) -> Path:
    return Path(job.out) / ".jobs" / f"{job.id}.json"


def mark_done(job: Job) -> None:
    path = marker(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(job.spec(), indent=1), encoding="utf-8")


def is_done(job: Job) -> bool:
    """Finished earlier with the same spec (and its output is still there)."""
    path = marker(job)
    if not path.exists():
        return False
    try:
        same = json.loads(path.read_text(encoding="utf-8")) == job.spec()
    except ValueError:
        return False
    output = job.store / "manifest.json" if job.kind == "extract" else job.table
    return same and output.exists()


# ---------------------------------------------------------------------------------------------- running

@dataclass
class SweepReport:
    jobs: int
    skipped: int
    ran: int = 0
    submitted: list = field(default_factory=list)  # (job id, scheduler id) on SLURM
    summary: Path | None = None
    seconds: float = 0.0
    planned: list = field(default_factory=list)  # (job id, done) of a dry run

    def describe(self) -> str:
        if self.submitted:
            return (f"submitted {len(self.submitted)} job(s) ({self.skipped} of {self.jobs} already done); "
                    "run the same command again once they finish to collect the tables")
        done = f"ran {self.ran} job(s) in {self.seconds:.1f} s, {self.skipped} of {self.jobs} already done"
        return done + (f"; summary in {self.summary}" if self.summary else "")


# the runtime's fields that say how each job loads and batches its model (`placement`)
PLACEMENT = ("batch_tokens", "device", "model_dtype", "device_map", "max_memory")


@runner(SweepSettings, old=("models", "items", "out", "settings"), batch_tokens=8192)
def sweep(items: list[str], out: str | Path, settings: SweepSettings | None = None, runtime: Runtime | None = None,
          *, models: list[str] | None = None, slices: list | None = None, subsets: list[str] | None = None,
          limit: int | None = None, executor: str = "local", slurm: dict | None = None, wait: bool = False,
          dry_run: bool = False, shard_size: int | None = None, placement: dict | None = None,
          cluster: str | None = None) -> SweepReport:
    """Plan the jobs of `models` × item sets (`items`) × language `slices` (`plan`), record the sweep's identity
    in OUT/sweep.json and run (or submit) those not done yet (`run_sweep`); `dry_run` plans only (the report's
    `planned` lists (job id, done)). `runtime`: each job's placement and batching (`device`, `model_dtype`,
    `device_map`, `max_memory`, `batch_tokens`; model_dtype is part of the identity), `overwrite`, and
    `progress` (a line per job; the older keyword `progress=print` names the printer); `models`: the specs
    swept (default: the runtime's model). `shard_size`: items per store shard. The older `sweep(models,
    item_sets, out, settings, placement={...}, overwrite=...)` too (docs/design.md "Runtime, settings,
    runners")."""
    models = list(models) if models else [runtime.model]
    for item_set in items:
        check_input("items", item_set, "items")
    item_sets, overwrite = items, runtime.overwrite
    progress = runtime.progress if callable(runtime.progress) else print if runtime.progress else _quiet
    if placement is None:
        placement = {**{name: getattr(runtime, name) for name in PLACEMENT}, "shard_size": shard_size}
    if limit is not None and limit < 1:
        raise BabelprobeError(f"--limit must be at least 1, got {limit}")
    if executor not in EXECUTORS:
        raise BabelprobeError(f"unknown --executor {executor!r}; use {' or '.join(EXECUTORS)}")
    from babelprobe.extract.layers import check_spec

    check_spec(settings.layers)
    placement = {k: v for k, v in (placement or {}).items()}
    jobs = plan(models, item_sets, slices or [], out, by=settings.by, groups_per_job=settings.groups_per_job,
                limit=limit, subsets=subsets, extract_options={**settings.extract_options(), **placement},
                probe_options=settings.probe_options())
    if dry_run:
        return SweepReport(jobs=len(jobs), skipped=sum(is_done(j) for j in jobs),
                           planned=[(job.id, is_done(job)) for job in jobs])
    from babelprobe.runs import open_run

    identity = {"sweep": {"models": list(models), "items": list(item_sets), "slices": slices, "subsets": subsets,
                          "limit": limit, "model_dtype": placement.get("model_dtype"),
                          "settings": settings_record(settings)}}
    open_run(out, identity, manifest=MANIFEST, overwrite=overwrite, what="a sweep",
             outputs=(".jobs", "summary.csv", *dict.fromkeys(job.cell.split("/")[0] for job in jobs)))
    return run_sweep(jobs, executor, slurm=slurm, wait=wait, progress=progress, cluster=cluster)


def _quiet(line: str) -> None:
    """The printer of a sweep without progress lines."""


def run_sweep(jobs: list[Job], executor: str = "local", *, slurm: dict | None = None, wait: bool = False,
              progress=print, cluster: str | None = None) -> SweepReport:
    """Run (local) or submit (slurm) every job not done yet; collect the tables once all are done.

    `slurm`: submitit parameters (e.g. {"slurm_partition": "gpu", "timeout_min": 240, "gpus_per_node": 1});
    `wait`: with slurm, wait for the jobs and collect. `cluster` overrides submitit's cluster (tests use
    "debug", which runs the jobs in this process)."""
    if executor not in EXECUTORS:
        raise BabelprobeError(f"unknown --executor {executor!r}; use {' or '.join(EXECUTORS)}")
    todo = [j for j in jobs if not is_done(j)]
    report = SweepReport(jobs=len(jobs), skipped=len(jobs) - len(todo))
    start = time.perf_counter()
    if executor == "local":
        for n, job in enumerate(todo, 1):
            progress(f"[{n}/{len(todo)}] {job.kind} {job.cell}" + (f" batch {job.batch}" if job.kind == "probe" else ""))
            run_job(job.spec())
            report.ran += 1
    elif todo:
        report.submitted = _submit(todo, Path(jobs[0].out), slurm or {}, wait, cluster or "slurm")
        if not wait:
            return report
        report.ran = len(todo)
    report.seconds = time.perf_counter() - start
    if all(is_done(j) for j in jobs):
        report.summary = collect(jobs)
    return report


def _submit(todo: list[Job], out: Path, parameters: dict, wait: bool, cluster: str) -> list:
    """Extract jobs as one array; each cell's probe jobs as an array that waits for its store (on SLURM an
    `afterok` dependency; elsewhere the extract jobs are waited for first)."""
    try:
        import submitit
    except ImportError as err:
        raise BabelprobeError("the slurm executor needs submitit: pip install 'babelprobe[slurm]' "
                              "(or use --executor local)") from err
    folder = out / ".submitit"
    try:
        executor = submitit.AutoExecutor(folder=folder / "%j", cluster=cluster)
        executor.update_parameters(name="babelprobe-sweep", **parameters)
        extracts = [j for j in todo if j.kind == "extract"]
        submitted = list(zip(extracts, executor.map_array(run_job, [j.spec() for j in extracts]))) if extracts else []
    except Exception as err:  # no sbatch, a refused submission, a bad parameter
        raise BabelprobeError(f"cannot submit the sweep's jobs to {cluster}: {str(err).strip().splitlines()[0]}") from err
    store_job = {j.cell: s for j, s in submitted}
    if cluster != "slurm":  # no dependencies there: the stores first
        _results(submitted, folder)
    by_cell: dict[str, list[Job]] = {}
    for job in (j for j in todo if j.kind == "probe"):
        by_cell.setdefault(job.cell, []).append(job)
    for cell, probes in by_cell.items():
        if cluster == "slurm" and cell in store_job:
            executor.update_parameters(slurm_additional_parameters={"dependency": f"afterok:{store_job[cell].job_id}"})
        submitted += list(zip(probes, executor.map_array(run_job, [j.spec() for j in probes])))
        if cluster == "slurm":
            executor.update_parameters(slurm_additional_parameters={})
    if wait:
        _results(submitted, folder)
    return [(job.id, handle.job_id) for job, handle in submitted]


def _results(submitted: list, folder: Path) -> None:
    """Wait for submitted jobs; a failed one is a one-line error naming it and its log folder."""
    for job, handle in submitted:
        try:
            handle.result()
        except Exception as err:
            lines = [line for line in str(err).strip().splitlines() if line.strip()]
            raise BabelprobeError(f"job {job.id} ({handle.job_id}) failed: {lines[-1] if lines else type(err).__name__}"
                                  f"; its log is in {folder}") from err


# --------------------------------------------------------------------------------------------- collecting

def collect(jobs: list[Job]) -> Path:
    """Join each cell's batch tables into CELL/neuro.csv and CELL/neuro.peaks.csv, and the peaks of every
    cell into OUT/summary.csv (with model, items and languages columns)."""
    out = Path(jobs[0].out)
    summaries = []
    for cell in dict.fromkeys(j.cell for j in jobs):
        probes = [j for j in jobs if j.cell == cell and j.kind == "probe"]
        if not probes:
            continue
        tables = [pd.read_csv(j.table) for j in probes]
        peaks = [pd.read_csv(j.table.with_name(j.table.stem + ".peaks.csv")) for j in probes]
        write_table(pd.concat(peaks, ignore_index=True), out / cell / "neuro.peaks.csv")
        write_table(pd.concat(tables, ignore_index=True), out / cell / "neuro.csv")
        first = probes[0]
        summaries.append(pd.concat(peaks, ignore_index=True).assign(
            model=first.model, items=first.items, languages=slice_name(first.languages)))
    path = out / "summary.csv"
    if summaries:
        frame = pd.concat(summaries, ignore_index=True)
        front = ["model", "items", "languages"]
        write_table(frame[front + [c for c in frame.columns if c not in front]], path)
    return path
