"""`babelprobe sweep`: extraction and probes over models × item sets × language slices as independent,
resumable jobs, run here one after another or submitted to SLURM as job arrays (babelprobe/jobs.py).

    babelprobe sweep --models default,models/other --items xcomps-sample --languages en,de --languages ja,zh \\
        --limit 10 --out sweeps/demo                       # 2 models x 2 slices, here
    babelprobe sweep ... --executor slurm --slurm-partition gpu --slurm-gpus 1 --slurm-time 240
    babelprobe sweep ... --dry-run                         # list the jobs and which are done

(`make sweep` is something else: extraction, probes with transfer and the report for one model.)
"""

from __future__ import annotations

from babelprobe.cli.common import add_runtime_options, add_settings_options, comma_list
from babelprobe.jobs import SweepSettings


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
    add_settings_options(parser, SweepSettings, "extraction and probe settings (recorded in sweep.json)")
    title = "model placement and batching (each job's)"
    add_runtime_options(parser, ("device", "model_dtype", "device_map", "max_memory", "batch_tokens"), title,
                        aliases=False, batch_tokens=8192)
    placement = next(g for g in parser._action_groups if g.title == title)
    placement.add_argument("--shard-size", type=int, metavar="N", help="items per shard (default: automatic)")
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
    add_runtime_options(parser, ("overwrite",), "running")
    parser.set_defaults(func=run_sweep_command)


def run_sweep_command(args) -> int:
    from babelprobe.cli.common import runtime_from, settings_from
    from babelprobe.jobs import sweep

    settings = settings_from(args, SweepSettings)
    slurm = {"timeout_min": args.slurm_time, "gpus_per_node": args.slurm_gpus, "cpus_per_task": args.slurm_cpus,
             "mem_gb": args.slurm_mem, **({"slurm_partition": args.slurm_partition} if args.slurm_partition else {})}
    report = sweep(args.items, args.out, settings, runtime_from(args), models=args.models, slices=args.languages,
                   subsets=args.subsets, limit=args.limit, executor=args.executor, slurm=slurm, wait=args.wait,
                   dry_run=args.dry_run, shard_size=args.shard_size)
    if args.dry_run:
        for job_id, done in report.planned:
            print(f"{'done' if done else 'todo'}  {job_id}")
        return 0
    for job_id, scheduler_id in report.submitted:
        print(f"submitted {job_id} as {scheduler_id}")
    print(report.describe())
    return 0
