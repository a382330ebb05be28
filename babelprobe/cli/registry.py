"""The command registry: every command of `babelprobe`, what it calls and what it reads and writes, declared
once. The CLI checks each command's arguments by it before the command runs (`check`), and
`tests/test_command_contract.py` runs every command through the same conformance checks and bad-input
catalogue by it, as scikit-learn's `parametrize_with_checks` checks every estimator: a command added here
is checked without a line of its own.

A `Command` names
  path      the words after `babelprobe` (`("bench", "belebele")`)
  runner    the library call behind it, "module:function" (docs/design.md "CLI": it has the command's name)
  settings  its settings dataclasses, "module:Class": every field a flag with help, recorded in the run
  kind      the kind of run directory it writes (`runs.LAYOUTS`), None when its output is no run directory
  out       what `--out` is: "dir", "table" (a .csv/.parquet file), "items" (an item file), None (no --out)
  inputs    the flags (or positional names) that name an input, and what each must be: "store", "compare",
            "neurons", "sae-run" (`runs.LAYOUTS` kinds), "run" (a run directory of any kind), "sae-folder" (an
            SAE folder), "new-store" (a store to reuse, or a new or empty directory), "probes" (a compare directory, a probe table or a store), "dir", "file", "items",
            "tasks" (lm-evaluation-harness task names), "lm-eval" (harness tasks as a source: lm-eval:TASK[@DIR])
  model     whether it loads a model (every check above happens before it does)

The checks made here, for every command alike (`check`): the running numbers (`--limit` at least 1,
`--batch-tokens` positive, ...); `--out` of the right sort and not another command's run directory (with
or without `--overwrite`: a run is only ever replaced by the command that made it); every input there,
readable and of its kind. Each is one line naming the flag and the value, before any model loads and
before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from babelprobe.errors import BabelprobeError
from babelprobe.paths import check_kind_of_path, check_path, check_readable


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]
    runner: str | None
    settings: tuple[str, ...] = ()
    kind: str | None = None
    out: str | None = "dir"
    inputs: dict[str, str] = field(default_factory=dict)
    model: bool = True

    @property
    def name(self) -> str:
        return " ".join(self.path)


BENCH_SETTINGS = {name: f"babelprobe.benchmarks.{path}:Settings" for name, path in (
    ("stingray", "stingray"), ("eclektic", "eclektic"), ("consistency", "consistency"), ("pitfalls", "pitfalls"),
    ("multiblimp", "bridges.multiblimp"), ("belebele", "bridges.belebele"), ("xnli", "bridges.xnli"),
    ("pawsx", "bridges.pawsx"), ("lm-eval", "bridges.lmeval"))}
# a benchmark whose inputs are not one --items source: bench lm-eval names the harness's tasks
BENCH_INPUTS = {"lm-eval": {"--items": "lm-eval", "--tasks": "tasks", "--include-path": "dir"}}

COMMANDS: tuple[Command, ...] = (
    Command(("models",), "babelprobe.models:load_model", out=None),
    Command(("items", "list"), None, out=None, model=False),
    Command(("items", "show"), "babelprobe.items:load_items", out=None, inputs={"source": "items"}, model=False),
    Command(("items", "convert"), "babelprobe.benchmarks.bridges:convert", out="items", inputs={"source": "items"},
            model=False),
    Command(("items", "from-lm-eval"), "babelprobe.benchmarks.bridges.lmeval:convert", out="items",
            inputs={"tasks": "tasks", "--include-path": "dir"}, model=False),
    Command(("score", "direct"), "babelprobe.benchmarks.scoring:score_pairs",
            ("babelprobe.benchmarks.scoring:DirectSettings",), out="table", inputs={"--items": "items"}),
    Command(("score", "meta"), "babelprobe.benchmarks.scoring:score_pairs",
            ("babelprobe.benchmarks.scoring:MetaSettings",), out="table", inputs={"--items": "items"}),
    Command(("extract",), "babelprobe.extract.run:extract", ("babelprobe.extract.settings:ExtractSettings",),
            kind="store", inputs={"--items": "items"}),
    Command(("verify",), "babelprobe.extract.store:verify_store", out=None, inputs={"acts": "dir"}, model=False),
    Command(("probe",), "babelprobe.probes.run:probe", ("babelprobe.probes.settings:ProbeSettings",), kind="probe",
            out="table", inputs={"--acts": "store", "--items": "items"}, model=False),
    Command(("compare",), "babelprobe.comparison:compare", ("babelprobe.comparison:CompareSettings",),
            kind="compare", inputs={"--items": "items", "--acts": "new-store"}),
    Command(("diff",), "babelprobe.comparison:diff", inputs={"base": "compare", "other": "compare"}, model=False),
    Command(("intervene",), "babelprobe.interventions.run:intervene", ("babelprobe.interventions.settings:Settings",),
            kind="intervene", inputs={"--items": "items", "--probes": "probes", "--neurons": "neurons",
                                      "--sae": "sae-run"}),
    Command(("neurons",), "babelprobe.neurons.run:language_neurons", ("babelprobe.neurons.settings:Settings",),
            kind="neurons", inputs={"--items": "items", "--corpus": "dir"}),
    Command(("patch",), "babelprobe.patching.run:patch_pairs",
            ("babelprobe.patching.settings:TranslationSettings", "babelprobe.patching.settings:PairsSettings"),
            kind="patch", inputs={"--items": "items", "--concepts": "file", "--compare": "compare"}),
    Command(("lens",), "babelprobe.latent.run:lens", ("babelprobe.latent.settings:LensSettings",), kind="lens",
            inputs={"--items": "items", "--acts": "store", "--compare": "compare"}),
    Command(("align",), "babelprobe.latent.run:align", ("babelprobe.latent.settings:AlignSettings",), kind="align",
            inputs={"--items": "items", "--acts": "store", "--compare": "compare"}),
    Command(("sae",), "babelprobe.sae.run:sae_features", ("babelprobe.sae.settings:Settings",), kind="sae",
            inputs={"--items": "items", "--sae": "sae-folder", "--acts": "store"}),
    Command(("sae", "fetch"), "babelprobe.sae.fetch:fetch_sae", model=False),
    Command(("sae", "train"), "babelprobe.sae.train:train_sae", ("babelprobe.sae.settings:TrainSettings",),
            inputs={"--acts": "store"}, model=False),
    Command(("report",), "babelprobe.analysis.report:write_report", ("babelprobe.analysis.report:ReportSettings",),
            inputs={"--results": "run", "--other": "compare", "--transfer-table": "file"}, model=False),
    *(Command(("bench", name), "babelprobe.analysis.benchmarks:run_benchmark", (settings,), kind="bench",
              inputs=BENCH_INPUTS.get(name, {"--items": "items"})) for name, settings in BENCH_SETTINGS.items()),
    Command(("bench", "pitfalls-search"), "babelprobe.benchmarks.pitfalls.search:search_languages",
            ("babelprobe.benchmarks.pitfalls.settings:SearchSettings",), inputs={"--items": "items"}),
    Command(("bench", "pitfalls-affinity"), "babelprobe.analysis.benchmarks:run_affinity",
            ("babelprobe.benchmarks.pitfalls.settings:AffinitySettings",), kind="pitfalls-affinity",
            inputs={"--items": "items"}),
    Command(("bench", "figures"), "babelprobe.analysis.benchmarks:plot_runs", inputs={"runs": "bench"}, model=False),
    Command(("sweep",), "babelprobe.jobs:sweep", ("babelprobe.jobs:SweepSettings",), kind="sweep"),
)
BY_PATH = {command.path: command for command in COMMANDS}

# The running numbers every command checks alike: dest -> (flag, the least value).
LEAST = {"limit": ("--limit", 1), "batch_tokens": ("--batch-tokens", 1), "batch_size": ("--batch-size", 1),
         "n_boot": ("--n-boot", 0), "shard_size": ("--shard-size", 1), "min_tokens": ("--min-tokens", 1),
         "workers": ("--workers", 1), "retries": ("--retries", 0), "rows": ("--rows", 0),
         "gpus_per_replica": ("--gpus-per-replica", 1), "slurm_time": ("--slurm-time", 1),
         "slurm_gpus": ("--slurm-gpus", 0), "slurm_cpus": ("--slurm-cpus", 1), "slurm_mem": ("--slurm-mem", 1)}
POSITIVE = {"timeout": "--timeout", "rate_limit": "--rate-limit", "memory_gb": "--memory-gb"}
# the sorts of input a command may name, and what each must be
SORTS = {"store": "an activation store (`babelprobe extract`)", "compare": "a compare directory (`babelprobe compare`)",
         "neurons": "a neurons directory (`babelprobe neurons`)", "sae-run": "an SAE run directory (`babelprobe sae`)",
         "bench": "a benchmark run directory (`babelprobe bench NAME`)", "run": "a run directory of any kind",
         "sae-folder": "an SAE folder (Gemma Scope 2 or SAELens layout)",
         "probes": "a compare directory, a probe table or an activation store", "dir": "a directory",
         "file": "a file", "items": "an item source: a bundled set, a file, a directory or hf:ORG/NAME",
         "new-store": "an activation store to reuse, or a new or empty directory to extract into",
         "tasks": "lm-evaluation-harness task, group or tag names (the lm-eval extra)",
         "lm-eval": "lm-evaluation-harness tasks: lm-eval:TASK[,TASK...][@DIR], TASK[,TASK...][@DIR] or a bundled "
                    "sample (lm-eval-sample)"}


def command_of(path) -> Command:
    return BY_PATH[tuple(path)]


def check(command: Command, args) -> None:
    """The checks every command makes alike (module docstring), before it runs."""
    check_numbers(args)
    for name, sort in command.inputs.items():
        value = getattr(args, name.lstrip("-").replace("-", "_"), None)
        for one in value if isinstance(value, list) else [value]:
            if one is not None:
                check_input(name, one, sort)
    out = getattr(args, "out", None)
    if command.out is not None and out is not None:
        check_out(command, out)


def check_numbers(args) -> None:
    for dest, (flag, least) in LEAST.items():
        value = getattr(args, dest, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < least:
            raise BabelprobeError(f"{flag} must be at least {least}, got {value}")
    for dest, flag in POSITIVE.items():
        value = getattr(args, dest, None)
        if isinstance(value, (int, float)) and value <= 0:
            raise BabelprobeError(f"{flag} must be positive, got {value}")


def check_input(flag: str, value, sort: str) -> Path:
    """`value` there and readable, and of `sort` (module docstring); one line naming `flag` otherwise."""
    from babelprobe.runs import LAYOUTS, detect

    path = Path(value)
    where = f"{flag} {path}" if flag.startswith("-") else str(path)
    if sort in ("tasks", "lm-eval") or sort == "items" and is_harness_source(value):
        return check_tasks(flag, str(value), sort)
    if sort == "items" and not path.exists():
        return path  # a bundled set or a hub id, or a name the item loader explains
    if sort == "new-store":  # a store to reuse, or a new (or empty) directory to extract into
        if not path.exists() or path.is_dir() and not any(path.iterdir()):
            return path
        sort = "store"
    if not path.exists():
        what = "file" if sort in ("file", "items") else "directory" if sort != "probes" else "file or directory"
        raise BabelprobeError(f"{where}: no such {what}")
    check_readable(path, where)
    if sort == "file" or sort in ("dir", "run", "sae-folder", *LAYOUTS, "sae-run"):
        check_kind_of_path(path, where, "file" if sort == "file" else "dir")
    layout_kind = {"sae-run": "sae"}.get(sort, sort)
    if layout_kind in LAYOUTS:
        LAYOUTS[layout_kind].check(path, flag if flag.startswith("-") else "")
    if layout_kind == "store":
        check_store(path, where)
    if sort == "run" and detect(path) is None:
        raise BabelprobeError(f"{where} is not a results directory: it holds no run of babelprobe (no manifest "
                              "such as compare.json, no neuro.csv); give the --out of a command that writes one")
    return path


def is_harness_source(value) -> bool:
    from babelprobe.lmeval import is_source

    return is_source(str(value))


def check_tasks(flag: str, value: str, sort: str) -> Path:
    """lm-evaluation-harness tasks: for `lm-eval` (bench lm-eval's --items) not an item file; the task folder
    after '@' a readable directory; the harness installed. Whether each task exists, is multiple-choice and
    its data files are readable is the item reader's check (`lmeval.load`, before any data set is read)."""
    from babelprobe import lmeval
    from babelprobe.bundled import bundled_sets

    where = f"{flag} {value}" if flag.startswith("-") else value
    if sort == "lm-eval" and not lmeval.is_source(value) and Path(value).exists():
        raise BabelprobeError(f"{where} is an item file or directory; this command reads lm-evaluation-harness tasks "
                              f"({SORTS['lm-eval']}); give item files to compare, extract or score")
    if sort != "tasks" and value not in bundled_sets(lmeval.NAME):  # a bundled sample: its own folder
        source = lmeval.parse(value if lmeval.is_source(value) else lmeval.PREFIX + value)
        if source.include_path is not None:
            folder = f"{where}: task folder {source.include_path}"
            check_path(Path(source.include_path).expanduser(), folder, "dir")
    lmeval.harness()
    return Path(value)


def check_store(path: Path, where: str) -> None:
    """The store opens and every shard of it opens (a truncated or missing shard is found here, without
    reading its arrays)."""
    from babelprobe.extract.store import open_store

    with open_store(path) as store:
        try:
            store.check_files()
        except BabelprobeError as err:
            raise BabelprobeError(f"{where}: {err}") from None


def check_out(command: Command, out) -> None:
    """`--out` of the command's sort, and not a run directory of another command (a run directory is only
    ever written, or replaced with --overwrite, by the command that made it)."""
    from babelprobe.runs import check_kind, detect

    path = Path(out)
    if command.out == "dir":
        if path.exists() and not path.is_dir():
            raise BabelprobeError(f"--out {path} is a file; {command.name} writes a directory")
        check_kind(path, command.kind, command.name)
    elif command.out in ("table", "items"):
        if path.is_dir():
            raise BabelprobeError(f"--out {path} is a directory; {command.name} writes a file "
                                  f"({'.csv or .parquet' if command.out == 'table' else 'an item file'})")
        found = detect(path.parent) if path.parent.is_dir() else None
        if found is not None and found.kind != command.kind:
            raise BabelprobeError(f"--out {path} is inside a {found.kind} run ({found.command}); choose another --out")
