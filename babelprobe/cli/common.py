"""Options shared by several commands (`--model`, `--items`, ...), the flags of a settings dataclass
(`add_settings_options`, `settings_from`), and the objects they build.

Building the parser imports no model code, torch or matplotlib (`babelprobe --help` stays fast): what
the options build (models, items) is imported when a command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from babelprobe.settings import flat_fields, settings_for

MODEL_DTYPES = ("float32", "bfloat16", "float16")
MODEL = ("model", "revision", "device", "model_dtype", "trust_remote_code")  # the runtime's model options
PLACEMENT = ("device_map", "max_memory", "offload_folder")                  # ... and its placement options


def add_model_options(parser: argparse.ArgumentParser, dtype_alias: bool = True) -> None:
    """--model and how to load it (the runtime's `MODEL` fields). The model's dtype is `--model-dtype` in every
    command; `--dtype`, its old spelling, is a hidden alias where `--dtype` has no other meaning (`dtype_alias`;
    in extract and probe it is the old spelling of --store-dtype / --solver-dtype)."""
    add_runtime_options(parser, MODEL, "model", aliases=dtype_alias)


def add_runtime_options(parser, names, title: str = "running (does not change the numbers)", aliases: bool = True,
                        **defaults) -> None:
    """The flags of the runtime fields `names` (`runtime.Runtime`: declared there once, with their help), in
    a group `title`; `defaults` overrides a field's default for this command (`batch_tokens=8192`). A bool
    field is a switch (`--overwrite`; `--no-progress` for one that is on by default). `aliases=False`: no
    hidden old spellings (`--dtype`, where it means something else)."""
    from babelprobe.runtime import Runtime

    fields = {f.name: f for f in dataclasses.fields(Runtime)}
    group = next((g for g in parser._action_groups if g.title == title), None) or parser.add_argument_group(title)
    for name in names:
        field = fields[name]
        default = defaults.get(name, field.default)
        flag = field.metadata.get("flag", "--" + name.replace("_", "-"))
        help_text = field.metadata["help"] + (f" (default {default})" if not isinstance(default, bool) and
                                              default is not None and name != "model" else "")
        if isinstance(field.default, bool):
            negative = flag.startswith("--no-")  # a field on by default: its flag switches it off
            group.add_argument(flag, dest=name, action="store_false" if negative else "store_true", default=default,
                               help=f"no {help_text}" if negative else help_text)
            continue
        options = dict(dest=name, default=default, choices=field.metadata.get("choices"),
                       metavar=field.metadata.get("metavar"), type=int if isinstance(field.default, int) else None)
        group.add_argument(flag, help=help_text, **options)
        for alias in field.metadata.get("aliases", ()) if aliases else ():
            group.add_argument(alias, help=argparse.SUPPRESS, **options)


def runtime_from(args, **values):
    """The `Runtime` of the runtime flags the command has (`add_runtime_options`), `values` beside them."""
    from babelprobe.runtime import FIELDS, Runtime

    given = {name: getattr(args, name) for name in FIELDS if hasattr(args, name)}
    return Runtime(**{**given, **values})


def add_items_options(parser: argparse.ArgumentParser, required: bool = False, items: bool = True) -> None:
    """--items and its selection options (`items=False`: the selection only, for a command that names the
    source another way)."""
    group = parser.add_argument_group("items")
    if items:
        group.add_argument("--items", default=None if required else "xcomps-sample", required=required,
                           metavar="NAME|PATH", help="bundled set name, item file (.jsonl .json .csv .tsv .parquet; "
                           "released COMPS/XCOMPS layouts too) or directory, or hf:ORG/NAME[:config[:split]]")
    group.add_argument("--language", metavar="CODE",
                       help="language of a single-language source that does not say (no 'language' field and no "
                       "code in its name, e.g. a renamed COMPS file: --language en)")
    group.add_argument("--languages", type=comma_list, metavar="LIST", help="comma-separated language codes to keep")
    group.add_argument("--subsets", type=comma_list, metavar="LIST", help="comma-separated subsets to keep")
    group.add_argument("--limit", type=int, metavar="N", help="at most N pairs per language × subset")


def comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def items_source(args, also: str | None = None):
    """The selected items (loaded), or None when --items was not given (a command that can take its items
    from a store). `also`: a language kept besides --languages (e.g. the lens's pivot, whose items give the
    counterpart answers)."""
    from babelprobe.items import load_items

    if args.items is None:
        return None
    languages = args.languages
    if languages and also and also not in languages:
        languages = [*languages, also]
    return load_items(args.items, languages=languages, subsets=args.subsets, limit=args.limit, language=args.language)


def items_from(args):
    from babelprobe.items import load_items

    return load_items(args.items, languages=args.languages, subsets=args.subsets, limit=args.limit,
                      language=args.language)


def add_http_options(parser) -> None:
    """The OpenAI-compatible endpoint's options (add once per command, whatever generators it has)."""
    group = parser.add_argument_group("OpenAI-compatible endpoint (for openai:MODEL@URL generators)")
    group.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="NAME",
                       help="environment variable holding the API key (default OPENAI_API_KEY; unset: no key sent)")
    group.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds per request (default 60)")
    group.add_argument("--retries", type=int, default=3, metavar="N",
                       help="retries after a timeout, 429, 5xx or malformed answer, with doubling back-off (default 3)")
    group.add_argument("--rate-limit", type=float, metavar="PER_S", help="at most this many requests per second")
    group.add_argument("--workers", type=int, default=1, metavar="N", help="requests in flight at once (default 1)")


def http_options(args) -> dict:
    """The options of `add_http_options` that were given, for `make_generator`."""
    return {name: getattr(args, name) for name in ("api_key_env", "timeout", "retries", "rate_limit", "workers")
            if getattr(args, name, None) is not None}


def load_options(args) -> dict:
    """`load_model` keyword arguments from the model options."""
    return runtime_from(args).load_options()


def model_from(args):
    """The model of the command's runtime flags, loaded (`Runtime.lm`: the one door)."""
    return runtime_from(args).lm


# -------------------------------------------------------------------------------- settings as flags

def add_settings_options(parser, cls, title: str | None = None, presets: dict | None = None,
                         skip: tuple[str, ...] = ()) -> None:
    """One flag per field of the settings dataclass `cls` (`--max-new-tokens` for `max_new_tokens`; a
    field's `flag` and `aliases` metadata rename it and add hidden old spellings), plus `--protocol` when
    there are `presets` (default `cls.PROTOCOLS`). Defaults stay unset here, so `settings_from` can tell a
    flag given explicitly from the protocol preset and the dataclass default. `skip`: fields without a flag."""
    from babelprobe.settings import setting_field

    group = parser.add_argument_group(title or "settings (recorded in the run's manifest)")
    presets = presets if presets is not None else getattr(cls, "PROTOCOLS", {}) or {}
    for name in flat_fields(cls):  # a block's fields flat, as the class's own (settings.block)
        field = setting_field(cls, name)
        if field.name in skip or not field.metadata.get("cli", True):
            continue
        if field.name == "protocol":
            group.add_argument("--protocol", choices=list(dict.fromkeys(["default", *presets])),
                               default=argparse.SUPPRESS,
                               help=field.metadata.get("help", "settings preset") + " (default: default)")
            continue
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        name = field.metadata.get("flag", "--" + field.name.replace("_", "-"))
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        help_text = field.metadata.get("help", "")
        help_text = f"{help_text} (default {shown})" if shown not in (None, "") else help_text
        common = dict(dest=field.name, default=argparse.SUPPRESS)
        if isinstance(default, bool):  # --x (default off) or --x/--no-x (default on)
            action = argparse.BooleanOptionalAction if default else "store_true"
            group.add_argument(name, action=action, help=help_text, **common)
        else:
            group.add_argument(name, type=_flag_type(field, default), choices=field.metadata.get("choices"),
                               metavar=field.metadata.get("metavar"), help=help_text, **_const(field), **common)
        for alias in field.metadata.get("aliases", ()):
            alias, constant, value = alias.partition("=")
            if constant:  # an old flag without a value, standing for one value of the new flag
                group.add_argument(alias, action="store_const", const=value, help=argparse.SUPPRESS, **common)
            elif isinstance(default, bool):
                group.add_argument(alias, action="store_true" if not alias.startswith("--no-") else "store_false",
                                   help=argparse.SUPPRESS, **common)
            else:
                group.add_argument(alias, type=_flag_type(field, default), choices=field.metadata.get("choices"),
                                   help=argparse.SUPPRESS, **_const(field), **common)


def add_alias(parser, alias: str, dest: str, **options) -> None:
    """A hidden old spelling of an option (accepted, not shown in --help)."""
    parser.add_argument(alias, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **options)


def settings_from(args, cls, presets: dict | None = None, **extra):
    """The settings of `cls` from the flags given (the rest: the protocol preset, then the defaults);
    `extra` adds values that come from elsewhere (they count as given)."""
    names = [name for name in flat_fields(cls) if name != "protocol"]  # in declaration order: one message per run
    given = {name: getattr(args, name) for name in names if hasattr(args, name)}
    return settings_for(cls, getattr(args, "protocol", None), presets, **given, **extra)


def _const(field) -> dict:
    """A flag whose field declares `const` may be given without a value (`--chat-template` = on)."""
    return {"nargs": "?", "const": field.metadata["const"]} if "const" in field.metadata else {}


def _flag_type(field, default):
    parse, old = _value_type(field, default), field.metadata.get("values")
    # old values are read as the new ones before argparse checks the choices
    return (lambda text: old.get(text, parse(text))) if old else parse


def _value_type(field, default):
    if field.metadata.get("type"):
        return field.metadata["type"]
    if isinstance(default, tuple):
        return lambda text: tuple(comma_list(text))
    if default is None or isinstance(field.type, str):
        return _from_annotation(field.type) if isinstance(field.type, str) else \
            next((t for t in typing.get_args(field.type) if t is not type(None)), str)
    return type(default)


def _from_annotation(annotation: str):
    """`int | None` -> int, `float` -> float, `tuple[...]` -> a comma list, anything else -> str
    (annotations are strings under `from __future__ import annotations`)."""
    text = annotation.replace(" ", "")
    if text.startswith("tuple"):
        return lambda value: tuple(comma_list(value))
    for name, kind in (("int", int), ("float", float)):
        if text == name or text.startswith(name + "|") or text.endswith("|" + name):
            return kind
    return str
