"""The contract every seed benchmark follows, so that one runner runs any of them (`babelprobe bench
NAME`, or `run_benchmark(NAME, ...)` in a notebook) and their outputs look alike.

A benchmark module (`stingray`, `eclektic`, `consistency`, `pitfalls`) defines

    NAME, TITLE      its command name and a one-line description
    Settings         a frozen dataclass of every option that changes the numbers, declared with
                     `babelprobe.settings.option` (defaults and help); the CLI builds its flags from it
                     and the run directory records it. `PROTOCOLS = {"paper": {...}}` (optional) names
                     presets of field values; a flag that contradicts the chosen preset is an error.
    load(source, languages=None, limit=None) -> DataFrame   the benchmark's records; `source` is a
                     bundled set (declared in `babelprobe.bundled`), a file or directory, or a hub id
    run(data, models, settings, out=None, progress=True) -> DataFrame
                     one row per question asked, in the result conventions of docs/design.md
                     (`pair_id`, `language`, `subset`, `method`, `correct`, ...); `out` is the run
                     directory, where a run may keep what makes it resumable (generation memos, chunks)
    summarize(rows) -> DataFrame   a long table computed from the rows alone: `metric`, `value`,
                     `ci_low`, `ci_high`, `n`, `interval` and the columns that say which cell it is
    format_summary(summary) -> str   what the command prints
    answerer(settings) -> str   which model's answers the rows hold: "model" (the local model) or a
                     generator spec; it is the run's identity together with the settings
    check(data, settings)   optional: raises on data or settings that cannot run, before any model loads

Its figure lives in `babelprobe.analysis.benchmarks` (`FIGURES[NAME]`).

`models` is a `Models`: the local model, loaded when first asked for (a run that only calls an HTTP
endpoint never loads one), and generators made from spec strings (`core.generate.make_generator`).
"""

from __future__ import annotations

import dataclasses
import importlib
from functools import cached_property
from pathlib import Path
from types import ModuleType

import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.models import LoadedModel, load_model
from babelprobe.runs import open_run
from babelprobe.settings import settings_for, settings_record
from babelprobe.tables import write_table

BENCHMARKS = {name: f"babelprobe.benchmarks.{name}" for name in ("stingray", "eclektic", "consistency", "pitfalls")}
# the benchmark bridges (benchmarks/bridges): released data sets scored as lm-evaluation-harness scores them
BENCHMARKS.update({name: f"babelprobe.benchmarks.bridges.{name}" for name in ("multiblimp", "belebele", "xnli", "pawsx")})
ROWS, SUMMARY = "items.csv", "summary.csv"


def benchmark(name: str) -> ModuleType:
    """The module of a seed benchmark by its name."""
    if name not in BENCHMARKS:
        raise BabelprobeError(f"unknown benchmark {name!r}; use one of {', '.join(BENCHMARKS)}")
    return importlib.import_module(BENCHMARKS[name])


class Models:
    """What a benchmark may ask to answer with: the local model and generators by spec.

    `model` is a `LoadedModel` or a spec for `load_model` (with `load_options`: device, dtype, revision,
    trust_remote_code), loaded on first use. `http` holds the options of OpenAI-compatible endpoints
    (api_key_env, timeout, retries, rate_limit, workers); `batch_size` is the local generation batch
    and `batch_tokens` the token budget of likelihood scoring. None of these change the numbers."""

    def __init__(self, model: LoadedModel | str = "default", load_options: dict | None = None,
                 http: dict | None = None, batch_size: int = 8, batch_tokens: int = 4096, progress: bool = True):
        self._model, self.load_options = model, dict(load_options or {})
        self.http, self.batch_size, self.batch_tokens, self.progress = dict(http or {}), batch_size, batch_tokens, progress

    @cached_property
    def lm(self) -> LoadedModel:
        if isinstance(self._model, LoadedModel):
            return self._model
        return load_model(self._model, **self.load_options)

    def generator(self, spec: str):
        """A `Generator` from a spec ('local' is the local model; see `core.generate.SPEC_HELP`)."""
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


def as_models(models: Models | LoadedModel | str) -> Models:
    return models if isinstance(models, Models) else Models(models)


# -------------------------------------------------------------------------------------------- settings

def benchmark_settings(name_or_module, protocol: str | None = None, **values):
    """The benchmark's `Settings` with its protocol preset (`protocol="paper"`, from the module's
    `PROTOCOLS`) applied, then `values`; a value that contradicts the preset is an error naming both
    (`babelprobe.settings.settings_for`)."""
    module = benchmark(name_or_module) if isinstance(name_or_module, str) else name_or_module
    return settings_for(module.Settings, protocol, getattr(module, "PROTOCOLS", {}), **values)


# ---------------------------------------------------------------------------------------------- running

@dataclasses.dataclass
class BenchmarkRun:
    rows: pd.DataFrame
    summary: pd.DataFrame
    out: Path
    identity: dict


def run_benchmark(name: str, models: Models | LoadedModel | str, source: str | Path, out: str | Path,
                  settings=None, languages: list[str] | None = None, limit: int | None = None,
                  overwrite: bool = False, progress: bool = True) -> BenchmarkRun:
    """Load `source`, run benchmark `name` on it and write `items.csv`, `summary.csv` and `run.json`
    into `out`. A rerun with the same model and settings reuses what the run keeps (it resumes);
    another model or other settings there are refused unless `overwrite`."""
    module = benchmark(name)
    settings = settings if settings is not None else benchmark_settings(module)
    models = as_models(models)
    data = module.load(source, languages=languages, limit=limit)
    if hasattr(module, "check"):
        module.check(data, settings)  # bad data or settings: fail before a model is loaded
    who = models.identity(module.answerer(settings))
    identity = {"benchmark": name, "fingerprint": who["fingerprint"], **settings_record(settings)}
    run = open_run(out, identity, record={"model": who["model"], "data": str(source), "languages": languages,
                                          "limit": limit}, overwrite=overwrite, outputs=(ROWS, SUMMARY),
                   what=f"a {name} run")
    rows = module.run(data, models, settings, out=run.path, progress=progress)
    for column, value in (("model", who["model"]), ("fingerprint", who["fingerprint"])):
        if column not in rows.columns:
            rows[column] = value
    summary = module.summarize(rows)
    write_table(rows, run.path / ROWS)
    write_table(summary, run.path / SUMMARY)
    return BenchmarkRun(rows=rows, summary=summary, out=run.path, identity={**identity, "model": who["model"]})
