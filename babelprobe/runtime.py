"""The runtime of a run: which model and how it is loaded and placed, and the options that change only its
speed or its output (`batch_tokens`, `progress`, `overwrite`, `figures`). None of it is a setting: it is
flagged once (`cli.common.add_runtime_options` builds the flags from the fields below), never part of a
run's identity or settings record, and every runner takes it the same way:

    runtime = Runtime(model="default", device="cpu", batch_tokens=8192, progress=False)
    runtime.info        # name, n_layers, d_model, fingerprint: from the model's files, no weights loaded
    runtime.lm          # the model, loaded on first use: the one door (models.load_model)
    bp.language_neurons(items, "neu/", settings, runtime)     # runner(items, out, settings, runtime)

`runtime.info` lets a runner refuse another model's inputs (probes, neurons, an SAE) and layers out of
range before the weights load; `runtime.lm` loads them after every check. `runner` (a decorator) is the
door of every runner: the canonical call `runner(items, out, settings, runtime)`, the settings' fields
and the runtime's as keywords (`folds=3`, `progress=False`, `load_options={...}`), and the older
`runner(model, items, out, ...)` all end up as the one call.

This module imports nothing heavy (the CLI builds its flags from it): `babelprobe.models` (torch) is
imported when a model is looked at or loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from functools import cached_property
from pathlib import Path

from babelprobe.errors import BabelprobeError
from babelprobe.settings import at_least, given, one_of, option

MODEL_DTYPES = ("float32", "bfloat16", "float16")
# the runtime's fields that say how the model is loaded (`load_model`'s keywords; model_dtype is its dtype)
LOAD_FIELDS = ("revision", "device", "model_dtype", "trust_remote_code", "device_map", "max_memory", "offload_folder")
# `load_model`'s name of a runtime field (in a `load_options` dict)
KEYWORDS = {"dtype": "model_dtype"}


@dataclasses.dataclass(frozen=True)
class Runtime:
    """The model and the running options of one run (module docstring). `model` is a spec for
    `models.load_model` or a model loaded already (a `LoadedModel`, e.g. a tiny one in a test)."""

    model: object = option("default", "'default' (Gemma-3-270M, offline), a local dir, a hub id ORG/NAME[@REV] or a "
                           ".gguf file", metavar="SPEC")
    revision: str | None = option(None, "hub revision (branch, tag or commit)")
    device: str | None = option(None, "cuda, mps or cpu (default: the first available)")
    model_dtype: str | None = option(None, "float32, bfloat16 or float16 (default: bf16 on GPU, fp32 on CPU)",
                                     choices=MODEL_DTYPES, aliases=("--dtype",))
    trust_remote_code: bool = option(False, "allow model code from the hub to run (off by default; only for models "
                                     "you trust)")
    device_map: str | None = option(None, "load the model across devices through accelerate: auto, balanced, "
                                    "balanced_low_0, sequential, or a JSON file {module: device} (devices: 0, 1, ..., "
                                    "cpu, disk); instead of --device", metavar="MAP")
    max_memory: str | None = option(None, "memory per device for --device-map, e.g. 0=70GiB,1=70GiB,cpu=200GiB (what "
                                    "does not fit goes to disk)", metavar="LIST")
    offload_folder: str | None = option(None, "where disk-offloaded weights go (default: a temporary folder in the "
                                        "cache)", metavar="DIR")
    batch_tokens: int = option(4096, "token budget per batch: batch size × longest text (speed only)", metavar="N")
    progress: bool = option(True, "progress bars", flag="--no-progress")
    overwrite: bool = option(False, "replace a run of another identity in --out (only that run's own outputs are "
                             "removed)")
    figures: bool = option(True, "draw the figures", cli=False)

    def __post_init__(self):
        one_of(self, "model_dtype", MODEL_DTYPES, allow_none=True)
        at_least(self, "batch_tokens", 1)
        if self.device_map is not None and self.device is not None:
            raise BabelprobeError("choose either --device or --device-map, not both")
        if self.device_map is None and (self.max_memory is not None or self.offload_folder is not None):
            raise BabelprobeError("--max-memory and --offload-folder need --device-map (e.g. --device-map auto)")

    @property
    def loaded(self) -> bool:
        """Whether the model was handed over loaded, or has been loaded (`lm`)."""
        return not isinstance(self.model, (str, Path)) or "lm" in self.__dict__

    @cached_property
    def info(self):
        """The model's name, layers, width and fingerprint, without loading its weights (`models.ModelInfo`;
        the loaded model itself when there is one)."""
        if not isinstance(self.model, (str, Path)):
            return self.model
        if "lm" in self.__dict__:
            return self.lm
        from babelprobe.models import model_info

        return model_info(str(self.model), revision=self.revision, trust_remote_code=self.trust_remote_code)

    @property
    def compute_dtype(self) -> str:
        """The dtype the model computes in ("bfloat16", ...), without loading it: the loaded model's, or the one
        `models.load_model` will load it in."""
        if self.loaded:
            return str(self.lm.dtype).removeprefix("torch.")
        from babelprobe.models import load_dtype

        return str(load_dtype(self.device, self.model_dtype)).removeprefix("torch.")

    @cached_property
    def lm(self):
        """The model (`models.LoadedModel`), loaded once, when first asked for: after every check."""
        if not isinstance(self.model, (str, Path)):
            return self.model
        from babelprobe.models import check_spec, load_model

        check_spec(str(self.model))  # a spec that names no model: one line, before anything is loaded
        return load_model(str(self.model), **self.load_options())

    def load_options(self) -> dict:
        """`models.load_model`'s keyword arguments (a --device-map JSON file read)."""
        options = {name: getattr(self, name) for name in LOAD_FIELDS if name != "model_dtype"}
        return {**options, "dtype": self.model_dtype, "device_map": read_device_map(self.device_map)}

    def replace(self, **values) -> Runtime:
        """A copy with `values` changed (the loaded model kept when the model and its loading stay)."""
        copy = dataclasses.replace(self, **values)
        if "lm" in self.__dict__ and not set(values) & {"model", *LOAD_FIELDS}:
            copy.__dict__["lm"] = self.__dict__["lm"]
        return copy


FIELDS = tuple(f.name for f in dataclasses.fields(Runtime))


def read_device_map(value):
    """--device-map: a strategy name (or a {module: device} dict) as it is, or a JSON file holding the map."""
    if not isinstance(value, str) or not value.endswith(".json"):
        return value
    import json

    try:
        mapping = json.loads(Path(value).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BabelprobeError(f"--device-map {value}: cannot read a JSON device map ({str(err).splitlines()[0]})") from err
    if not isinstance(mapping, dict) or not mapping:
        raise BabelprobeError(f"--device-map {value}: expected a JSON object {{module name: device}}")
    return {name: int(where) if str(where).isdigit() else where for name, where in mapping.items()}


def as_runtime(runtime: Runtime | None = None, model=None, load_options: dict | None = None, **values) -> Runtime:
    """The runtime of a runner call: `runtime`, or one made of the keyword door (`model`, `load_options`:
    `load_model`'s keywords, and the runtime's fields: `batch_tokens=...`, `progress=False`); a runtime
    and any of those besides is an error (one of the two would be dropped). Values of None are not given."""
    loading = {KEYWORDS.get(k, k): v for k, v in (load_options or {}).items()}
    values = {k: v for k, v in {**loading, **values}.items() if v is not None}
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise BabelprobeError(f"unknown runtime option {unknown[0]!r}; runtime options: {', '.join(FIELDS)}")
    if runtime is not None:
        if model is not None or values:
            given_ = ["model"] * (model is not None) + sorted(values)
            raise BabelprobeError(f"pass a runtime or its options, not both (got runtime and {', '.join(given_)})")
        return runtime
    return Runtime(**({"model": model} if model is not None else {}), **values)


def runner(settings_class=None, old: tuple[str, ...] = (), old_when=None, renamed: dict | None = None, **defaults):
    """The door of a runner `fn(items, out, settings, runtime, **inputs)` (module docstring).

    The wrapped function receives `settings` resolved (an instance of `settings_class`: the object given, or
    its fields given as keywords; both is an error) and `runtime` resolved (`as_runtime`; `defaults`: the
    runner's own defaults of runtime fields, e.g. `batch_tokens=8192`, for a runtime made of keywords).

    The older forms: `old` names the positional parameters of the older form `fn(model, items, out, ...)`
    (in the new form's names: `model` and the runtime's fields go to the runtime); a call whose first argument
    is a loaded model or a runtime, or whose positional arguments cannot be the new form (a path where the
    settings go, something other than a path where `out` goes, or `out` given twice), is read that way.
    `old_when(args, keywords)` tells the older form instead, for a runner those rules cannot tell
    (`run_benchmark(name, model, ...)`: a benchmark's name first). `renamed` maps older keyword names to the
    new ones (`source` -> `items`). A runtime where the older form has its model (the benchmarks' `Models`)
    is the runtime, the runtime options given beside it replacing its own, as that form did."""
    renamed = dict(renamed or {})

    def wrap(fn):
        parameters = inspect.signature(fn).parameters
        own = [name for name in parameters if name not in ("settings", "runtime")]
        positional = list(parameters)[:4]  # (items, out, settings, runtime), whatever the runner names its items

        @functools.wraps(fn)
        def call(*args, **keywords):
            keywords = {renamed.get(k, k): v for k, v in keywords.items()}
            if args and old and (old_when(args, keywords) if old_when is not None else _old_form(args, keywords)):
                if len(args) > len(old):
                    raise TypeError(f"{fn.__name__}({', '.join(old)}) got {len(args)} positional arguments")
                keywords = {**dict(zip(old, args)), **keywords}
                args = ()
            bound = dict(zip(positional, args))
            twice = set(bound) & set(keywords)
            if twice:
                raise TypeError(f"{fn.__name__}() got {', '.join(sorted(twice))} twice")
            keywords.update(bound)
            runtime_values = {k: keywords.pop(k) for k in list(keywords)
                              if k in (*FIELDS, "load_options", "model_options") and k not in own}
            if "model_options" in runtime_values:  # the old name of load_options (sae_features)
                runtime_values["load_options"] = runtime_values.pop("model_options")
            runtime = keywords.pop("runtime", None)
            if runtime is not None and not is_runtime(runtime):  # a loaded model there: the runtime's model
                runtime_values["model"], runtime = _model_for_runtime(runtime, runtime_values), None
            if runtime is None and is_runtime(runtime_values.get("model")):
                runtime, runtime_values = _held(runtime_values), {}
            if runtime is None:
                runtime_values = {**defaults, **{k: v for k, v in runtime_values.items() if v is not None}}
            runtime = as_runtime(runtime, **runtime_values)
            settings = keywords.pop("settings", None)
            values = {k: keywords.pop(k) for k in list(keywords) if k not in own}
            if settings_class is not None:
                settings = given(settings_class, settings, values)
            elif values:
                raise TypeError(f"{fn.__name__}() got unexpected keyword arguments {', '.join(sorted(values))}")
            return fn(settings=settings, runtime=runtime, **keywords)

        call.__signature__ = inspect.signature(fn)
        return call

    return wrap


def _held(values: dict):
    """The older forms' runtime given as their model (`runner`'s docstring): that runtime, with the runtime
    options given beside it (not None) in place of its own."""
    held = values.pop("model")
    given_ = {k: v for k, v in values.items() if v is not None and k in FIELDS}
    leftover = sorted(k for k, v in values.items() if v is not None and k not in FIELDS)
    if leftover:
        raise BabelprobeError(f"pass a runtime or its options, not both (got a runtime and {', '.join(leftover)})")
    if not given_:
        return held
    if isinstance(held, Runtime):
        return held.replace(**given_)
    import copy

    held = copy.copy(held)  # the benchmarks' Models: its runtime replaced, the caller's left as it was
    held.runtime = held.runtime.replace(**given_)
    return held


def _model_for_runtime(value, values: dict):
    """`value`, a loaded model given where a runner takes its runtime, as that runtime's model; anything else
    there is a one-line error (an attribute error deep in the runner otherwise)."""
    if not is_loaded_model(value):
        raise BabelprobeError(f"runtime: expected a babelprobe Runtime or a loaded model, got {type(value).__name__} "
                              f"{str(value)[:60]!r}; pass a model spec as model=...")
    if values.get("model") is not None:
        raise BabelprobeError("a loaded model as the runtime and model= besides: pass one of them")
    return value


def is_loaded_model(value) -> bool:
    """A `models.LoadedModel` (or what quacks like one: a fingerprint and a tokenizer), not a spec."""
    return not isinstance(value, (str, Path)) and hasattr(value, "fingerprint") and hasattr(value, "tokenizer")


def _old_form(args: tuple, keywords: dict) -> bool:
    """Whether positional `args` are the older `(model, items, out, ...)`: a loaded model or a runtime first,
    something other than a path where the new form has its `out` (`probe(store, settings)`), a path where it
    has its settings, or `out` given as a keyword beside two positional arguments."""
    first = args[0]
    if is_loaded_model(first):
        return True
    if is_runtime(first):
        return True
    if len(args) >= 2 and args[1] is not None and not isinstance(args[1], (str, os.PathLike)):
        return True
    if len(args) >= 3 and isinstance(args[2], (str, Path)):
        return True
    return len(args) == 2 and "out" in keywords


def is_runtime(value) -> bool:
    """A `Runtime`, or what holds one as `runtime` (the benchmarks' `Models`: a runtime and generators)."""
    return isinstance(value, Runtime) or isinstance(getattr(value, "runtime", None), Runtime)
