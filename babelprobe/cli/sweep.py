"""`babelprobe sweep`: extraction and probes over models × item sets × language slices as independent,
resumable jobs, run here one after another or submitted to SLURM as job arrays (babelprobe/jobs.py).

    babelprobe sweep --models default,models/other --items xcomps-sample --languages en,de --languages ja,zh \\
        --limit 10 --out sweeps/demo                       # 2 models x 2 slices, here
    babelprobe sweep ... --executor slurm --slurm-partition gpu --slurm-gpus 1 --slurm-time 240
    babelprobe sweep ... --dry-run                         # list the jobs and which are done

(`make sweep` is something else: extraction, probes with transfer and the report for one model.)
"""

from __future__ import annotations

from babelprobe.cli.common import comma_list
from babelprobe.errors import BabelprobeError


def register(sub) -> None:
    parser = sub.add_parser(
        "sweep", help="extract and probe many models × item sets × language slices as resumable jobs",
        description="Plan one extraction job per store (model × item set × language slice) and one probe job "
        "per batch of probe groups, then run the jobs not done yet, here (--executor local) or as SLURM job "
        "arrays through submitit (--executor slurm). Run the same command again to resume or to collect "
        "the tables: CELL/neuro.csv, CELL/neuro.peaks.csv and OUT/summary.csv.")
    what = parser.add_argument_group("what to sweep")
    what.add_argument("--models", type=comma_list, required=True, metavar="LIST",
                      help="comma-separated model specs ('default', local dirs, hub ids ORG/NAME[@REV])")
    what.add_argument("--items", type=comma_list, default=["xcomps-sample"], metavar="LIST",
                      help="comma-separated item sets (bundled names or files; default xcomps-sample)")
    what.add_argument("--languages", type=comma_list, action="append", metavar="LIST",
                      help="one language slice (comma-separated codes); repeat for several slices "
                      "(default: one slice of every language)")
    what.add_argument("--subsets", type=comma_list, metavar="LIST", help="comma-separated subsets to keep")
    what.add_argument("--limit", type=int, metavar="N", help="at most N pairs per language × subset")
    what.add_argument("--out", required=True, metavar="DIR", help="sweep directory")
    extraction = parser.add_argument_group("extraction")
    extraction.add_argument("--backend", choices=("hf", "transformer_lens", "nnsight"), default="hf")
    extraction.add_argument("--pool", choices=("last", "mean"), default="last",
                            help="pooling stored and probed (default last)")
    extraction.add_argument("--layers", default="all", metavar="SPEC", help="layers to store and probe")
    extraction.add_argument("--batch-tokens", type=int, default=8192, metavar="N")
    extraction.add_argument("--shard-size", type=int, metavar="N", help="items per shard (default: automatic)")
    extraction.add_argument("--device", help="cuda, mps or cpu (default: the first available)")
    extraction.add_argument("--model-dtype", help="float32, bfloat16 or float16 (default: bf16 on GPU, fp32 on CPU)")
    extraction.add_argument("--device-map", metavar="MAP", help="load each model across devices (auto, ...)")
    extraction.add_argument("--max-memory", metavar="LIST", help="memory per device for --device-map")
    probing = parser.add_argument_group("probes")
    probing.add_argument("--by", type=comma_list, default=["language", "subset"], metavar="LIST",
                         help="key columns that define the probe groups (default language,subset)")
    probing.add_argument("--groups-per-job", type=int, default=8, metavar="N",
                         help="probe groups per job (default 8)")
    probing.add_argument("--folds", type=int, default=5, metavar="K")
    probing.add_argument("--seed", type=int, default=0)
    probing.add_argument("--n-boot", type=int, default=1000, metavar="N")
    probing.add_argument("--control", default="none", metavar="NAME", help="none, shuffle, hewitt or all")
    run = parser.add_argument_group("running")
    run.add_argument("--executor", choices=("local", "slurm"), default="local",
                     help="local: here, one job after another (default); slurm: job arrays through submitit "
                     "(pip install 'babelprobe[slurm]')")
    run.add_argument("--slurm-partition", metavar="NAME")
    run.add_argument("--slurm-time", type=int, default=240, metavar="MIN", help="time limit per job (default 240)")
    run.add_argument("--slurm-gpus", type=int, default=1, metavar="N", help="GPUs per job (default 1)")
    run.add_argument("--slurm-cpus", type=int, default=8, metavar="N", help="CPUs per job (default 8)")
    run.add_argument("--slurm-mem", type=int, default=64, metavar="GB", help="memory per job (default 64)")
    run.add_argument("--wait", action="store_true", help="slurm: wait for the jobs and collect the tables")
    run.add_argument("--dry-run", action="store_true", help="list the jobs (and which are done); run nothing")
    run.add_argument("--overwrite", action="store_true", help="replace a sweep made with other settings")
    parser.set_defaults(func=run_sweep_command)


def run_sweep_command(args) -> int:
    from babelprobe.jobs import is_done, plan, run_sweep
    from babelprobe.runs import open_run

    if args.limit is not None and args.limit < 1:
        raise BabelprobeError(f"--limit must be at least 1, got {args.limit}")
    extract_options = {"backend": args.backend, "pool": args.pool, "layers": args.layers,
                       "batch_tokens": args.batch_tokens, "shard_size": args.shard_size, "device": args.device, "model_dtype": args.model_dtype,
                       "device_map": args.device_map, "max_memory": args.max_memory}
    probe_options = {"pool": args.pool, "layers": args.layers, "folds": args.folds, "seed": args.seed,
                     "n_boot": args.n_boot, "controls": args.control}
    jobs = plan(args.models, args.items, args.languages or [], args.out, by=tuple(args.by),
                groups_per_job=args.groups_per_job, limit=args.limit, subsets=args.subsets,
                extract_options=extract_options, probe_options=probe_options)
    if args.dry_run:
        for job in jobs:
            print(f"{'done' if is_done(job) else 'todo'}  {job.id}")
        return 0
    identity = {"sweep": {"models": args.models, "items": args.items, "slices": args.languages,
                          "subsets": args.subsets, "limit": args.limit, "by": args.by,
                          "groups_per_job": args.groups_per_job, "extract": extract_options, "probe": probe_options}}
    open_run(args.out, identity, manifest="sweep.json", overwrite=args.overwrite, what="a sweep",
             outputs=(".jobs", "summary.csv", *dict.fromkeys(job.cell.split("/")[0] for job in jobs)))
    slurm = {"timeout_min": args.slurm_time, "gpus_per_node": args.slurm_gpus, "cpus_per_task": args.slurm_cpus,
             "mem_gb": args.slurm_mem, **({"slurm_partition": args.slurm_partition} if args.slurm_partition else {})}
    report = run_sweep(jobs, args.executor, slurm=slurm, wait=args.wait)
    for job_id, scheduler_id in report.submitted:
        print(f"submitted {job_id} as {scheduler_id}")
    print(report.describe())
    return 0
