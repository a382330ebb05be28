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
  inputs    the flags (or positional names) that name an input, and what each must be (`inputs.SORTS`): "store", "compare",
            "neurons", "sae-run" (`runs.LAYOUTS` kinds), "run" (a run directory of any kind), "sae-folder" (an
            SAE folder), "new-store" (a store to reuse, or a new or empty directory), "probes" (a compare directory, a probe table or a store), "dir", "file", "items",
            "tasks" (lm-evaluation-harness task names), "lm-eval" (harness tasks as a source: lm-eval:TASK[@DIR])
  model     whether it loads a model (every check above happens before it does)

The checks made here, for every command alike (`check`): the running numbers (`--limit` at least 1,
`--batch-tokens` positive, ...); `--out` of the right sort and not another command's run directory (with
or without `--overwrite`: a run is only ever replaced by the command that made it); every input there,
readable and of its kind (`inputs.check_input`, which the runners call too). Each is one line naming the flag
and the value, before any model loads and before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from babelprobe.errors import BabelprobeError
from babelprobe.inputs import SORTS, check_input  # noqa: F401 (SORTS: the sorts an input may be, public here too)


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
                                      "--sae": "sae-run", "--corpus": "corpus"}),
    Command(("neurons",), "babelprobe.neurons.run:language_neurons", ("babelprobe.neurons.settings:Settings",),
            kind="neurons", inputs={"--items": "items", "--corpus": "corpus"}),
    Command(("patch",), "babelprobe.patching.run:patch_pairs",
            ("babelprobe.patching.settings:TranslationSettings", "babelprobe.patching.settings:PairsSettings"),
            kind="patch", inputs={"--items": "items", "--concepts": "concepts", "--compare": "compare"}),
    Command(("lens",), "babelprobe.latent.run:lens", ("babelprobe.latent.settings:LensSettings",), kind="lens",
            inputs={"--items": "items", "--acts": "store", "--compare": "compare"}),
    Command(("align",), "babelprobe.latent.run:align", ("babelprobe.latent.settings:AlignSettings",), kind="align",
            inputs={"--items": "items", "--acts": "store", "--compare": "compare"}),
    Command(("sae",), "babelprobe.sae.run:sae_features", ("babelprobe.sae.settings:Settings",), kind="sae",
            inputs={"--items": "items", "--sae": "sae-folder", "--also-sae": "sae-folder", "--acts": "store"}),
    Command(("sae", "fetch"), "babelprobe.sae.fetch:fetch_sae", model=False),
    Command(("sae", "train"), "babelprobe.sae.train:train_sae", ("babelprobe.sae.settings:TrainSettings",),
            inputs={"--corpus": "corpus"}),
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



def command_of(path) -> Command:
    return BY_PATH[tuple(path)]


def check(command: Command, args) -> None:
    """The checks every command makes alike (module docstring), before it runs."""
    check_numbers(args)
    for name, sort in command.inputs.items():
        value = getattr(args, name.lstrip("-").replace("-", "_"), None)
        for one in value if isinstance(value, list) else [value]:
            if one is not None:
                check_input(name if name.startswith("-") else "", one, sort)  # a positional: named by its value
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
