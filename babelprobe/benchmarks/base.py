"""The contract every seed benchmark follows, so that one runner runs any of them (`babelprobe bench
NAME`, or `bp.run_benchmark(NAME, ...)` in a notebook) and their outputs look alike.

A benchmark is a package (`stingray`, `eclektic`, `consistency`, `pitfalls`) whose `__init__` defines

    NAME, TITLE      its command name and a one-line description
    Settings         a frozen dataclass of every option that changes the numbers, declared with
                     `babelprobe.settings.option` (defaults and help); the CLI builds its flags from it
                     and the run directory records it. `PROTOCOLS = {"paper": {...}}` (optional) names
                     presets of field values; a flag that contradicts the chosen preset is an error.
    load(source, languages=None, limit=None)   the benchmark's records (a DataFrame, or what its
                     `prepare` takes); `source` is a bundled set (declared in `babelprobe.bundled`), a file
                     or directory, or a hub id
    prepare(data, settings)   optional: what `load` read, made ready for `check` and `run` with the
                     settings (e.g. which rows are the source language and which are references)
    check(data, settings)   optional: raises on data or settings that cannot run, before any model loads
    run(data, models, settings, out=None, progress=True) -> DataFrame
                     one row per question asked, in the result conventions of docs/design.md
                     (`pair_id`, `language`, `subset`, `method`, `correct`, ...); `out` is the run
                     directory, where a run may keep what makes it resumable (generation memos, chunks)
    summarize(rows) -> DataFrame   a long table computed from the rows alone, one `metric_row` per
                     metric and cell: the columns naming the cell, then `metric`, `value`, `ci_low`,
                     `ci_high`, `n`, `interval`; `wide` turns it into one row per cell
    format_summary(summary) -> str   what the command prints
    answerer(settings) -> str   which model's answers the rows hold: "model" (the local model) or a
                     generator spec; it is the run's identity together with the settings

The package's `__init__` imports its settings and nothing heavy (the steps are imported when first used),
so `babelprobe bench NAME --help` reads `NAME`, `TITLE`, `Settings` and `PROTOCOLS` without torch; its
`__all__` lists the contract (`CONTRACT`, `OPTIONAL`) apart from the steps. Its figure is drawn by
`babelprobe.analysis.benchmarks` (`plot_benchmark`), where the runner, `run_benchmark`, lives: it draws,
so it sits above this layer (docs/design.md "Layers").

`models` is a `Models`: the local model, loaded when first asked for (a run that only calls an HTTP
endpoint never loads one), and generators made from spec strings (`core.generate.make_generator`).
"""

from __future__ import annotations

import importlib
import math
from types import ModuleType
from typing import TYPE_CHECKING

from babelprobe.errors import BabelprobeError
from babelprobe.settings import settings_for

if TYPE_CHECKING:
    import pandas as pd

    from babelprobe.models import LoadedModel
    from babelprobe.runtime import Runtime

BENCHMARKS = {name: f"babelprobe.benchmarks.{name}" for name in ("stingray", "eclektic", "consistency", "pitfalls")}
CONTRACT = ("NAME", "TITLE", "Settings", "load", "run", "summarize", "format_summary", "answerer")
OPTIONAL = ("PROTOCOLS", "prepare", "check")
SUMMARY_COLUMNS = ("metric", "value", "ci_low", "ci_high", "n", "interval")
# the benchmark bridges (benchmarks/bridges): released data sets scored as lm-evaluation-harness scores them
BENCHMARKS.update({name: f"babelprobe.benchmarks.bridges.{name}" for name in ("multiblimp", "belebele", "xnli", "pawsx")})
# any lm-evaluation-harness multiple-choice task, through the bridges' scoring (benchmarks/bridges/lmeval.py)
BENCHMARKS["lm-eval"] = "babelprobe.benchmarks.bridges.lmeval"


def benchmark(name: str) -> ModuleType:
    """The package of a seed benchmark by its name (light: its steps are imported when first used)."""
    if name not in BENCHMARKS:
        raise BabelprobeError(f"unknown benchmark {name!r}; use one of {', '.join(BENCHMARKS)}")
    return importlib.import_module(BENCHMARKS[name])


class Models:
    """What a benchmark may ask to answer with: the local model and generators by spec.

    `runtime` (`runtime.Runtime`) holds the local model, loaded on first use (a run that only calls an HTTP
    endpoint never loads one), and the running options (`batch_tokens`: the token budget of likelihood
    scoring, `progress`); without one it is made of `model` (a `LoadedModel` or a spec), `load_options`
    (device, dtype, revision, trust_remote_code), `batch_tokens` and `progress`. `http` holds the options of
    OpenAI-compatible endpoints (api_key_env, timeout, retries, rate_limit, workers); `batch_size` is the
    local generation batch. None of these change the numbers."""

    def __init__(self, model: LoadedModel | str = "default", load_options: dict | None = None,
                 http: dict | None = None, batch_size: int = 8, batch_tokens: int = 4096, progress: bool = True,
                 runtime: Runtime | None = None):
        from babelprobe.runtime import Runtime

        self.runtime = runtime if runtime is not None else Runtime(model=model, batch_tokens=batch_tokens,
                                                                   progress=progress, **_runtime_keys(load_options))
        self.http, self.batch_size = dict(http or {}), batch_size

    @property
    def lm(self) -> LoadedModel:
        return self.runtime.lm

    @property
    def batch_tokens(self) -> int:
        return self.runtime.batch_tokens

    @property
    def progress(self) -> bool:
        return self.runtime.progress

    def generator(self, spec: str):
        """A `Generator` from a spec ('local' is the local model; see `core.options.SPEC_HELP`)."""
        from babelprobe.benchmarks.core.generate import make_generator

        local = spec == "local"
        return make_generator(spec, lm=self.lm if local else None, batch_size=self.batch_size,
                              progress=self.progress, **({} if spec.startswith("local") else self.http))

    def identity(self, spec: str) -> dict:
        """Name and fingerprint of whoever answers: "model" or "local" (the local model), another spec."""
        if spec in ("model", "local"):
            return {"model": self.lm.name, "fingerprint": self.lm.fingerprint}
        generator = self.generator(spec)
        return {"model": generator.name, "fingerprint": getattr(generator, "fingerprint", generator.name)}


def _runtime_keys(load_options: dict | None) -> dict:
    """`load_model`'s keywords as the runtime's fields (its `dtype` is the runtime's `model_dtype`)."""
    return {("model_dtype" if k == "dtype" else k): v for k, v in (load_options or {}).items() if v is not None}


def as_models(models: Models | Runtime | LoadedModel | str) -> Models:
    from babelprobe.runtime import Runtime

    if isinstance(models, Models):
        return models
    return Models(runtime=models) if isinstance(models, Runtime) else Models(models)


# -------------------------------------------------------------------------------------------- settings

def benchmark_settings(name_or_module, protocol: str | None = None, **values):
    """The benchmark's `Settings` with its protocol preset (`protocol="paper"`, from the module's
    `PROTOCOLS`) applied, then `values`; a value that contradicts the preset is an error naming both
    (`babelprobe.settings.settings_for`)."""
    module = benchmark(name_or_module) if isinstance(name_or_module, str) else name_or_module
    return settings_for(module.Settings, protocol, getattr(module, "PROTOCOLS", {}), **values)


# --------------------------------------------------------------------------------------------- summaries

def metric_row(cell: dict, metric: str, value, ci_low=math.nan, ci_high=math.nan, n=0, interval: str = "",
               **extra) -> dict:
    """One row of a benchmark's long summary: the columns naming the `cell`, then `metric`, `value`, its
    95% interval `ci_low`, `ci_high`, the count `n` it rests on and `interval` (how the interval was
    made: "wilson", "bootstrap over ...", "" for none), then `extra` columns (e.g. `k`). Takes the
    result of `stats.proportion` as keywords: `metric_row(cell, "accuracy", **proportion(...))`."""
    return {**cell, "metric": metric, "value": float(value), "ci_low": float(ci_low), "ci_high": float(ci_high),
            "n": int(n), "interval": interval, **extra}


def wide(summary: pd.DataFrame, cell: list[str], carry: tuple[str, ...] = ()) -> pd.DataFrame:
    """A long summary as one row per `cell`: a column per metric (in the order they first appear), its
    interval as `<metric>_low`, `<metric>_high` and its count as `<metric>_n`; `carry` adds columns that
    are the same for every metric of a cell (e.g. `n_unique`). For figures and printing."""
    table = summary.groupby([*cell, "metric"], sort=False)[["value", "ci_low", "ci_high", "n"]].first()
    table = table.unstack("metric")
    out = table.index.to_frame(index=False)
    table = table.reset_index(drop=True)
    for metric in dict.fromkeys(summary["metric"]):
        out[metric] = table[("value", metric)]
        out[f"{metric}_low"], out[f"{metric}_high"] = table[("ci_low", metric)], table[("ci_high", metric)]
        out[f"{metric}_n"] = table[("n", metric)].astype("Int64")
    if carry:
        out = out.merge(summary.groupby(cell, sort=False)[list(carry)].first().reset_index(), on=cell, how="left")
    return out
