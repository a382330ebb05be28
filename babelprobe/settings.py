"""Settings declared once: the options of a command that change its numbers, as a frozen dataclass.

Every command (`extract`, `probe`, `compare`, `intervene`, `lens`, `align`, `sweep`, each benchmark)
declares its settings the same way:

    @dataclass(frozen=True)
    class Settings:
        folds: int = option(5, "number of cross-validation folds", metavar="K")
        fold_scheme: str = option("grouped", "grouped or plain folds", choices=("grouped", "plain"))

        def __post_init__(self):
            at_least(self, "folds", 2)            # one-line errors that name the flag

and the rest follows from the declaration:

- the CLI makes one flag per field (`babelprobe.cli.common.add_settings_options`: `--fold-scheme` for
  `fold_scheme`, the help text, choices; booleans as `--x/--no-x`; tuples as comma lists; old spellings
  as hidden aliases);
- `settings_for(Settings, protocol, presets, **values)` applies a protocol preset and then the values
  given; a value that contradicts the preset is an error naming both (`--protocol paper` always means
  the paper's settings), everywhere;
- `settings_record(settings)` is the JSON the run manifest records (`from_record` reads it back);
- notebooks pass the same values as keyword arguments (`bp.probe(store, folds=3)`), checked the same way.

Settings nest: a command that runs other commands' steps holds their settings as blocks (`block`), e.g.

    @dataclass(frozen=True)
    class CompareSettings(Nested):
        probe: ProbeSettings = block(ProbeSettings, ("protocol", "folds", "fold_scheme", "seed", "pool"))
        meta: MetaSettings = block(MetaSettings, ("rule", "reduction", "prompts"))
        direct: DirectSettings = block(DirectSettings, ("reduction",))
        layers: str = option("peak", "neuro layer of the per-pair view")

The block's fields named there are the command's own settings: flagged flat (`--folds`, not
`--probe-folds`; a name in several blocks, `reduction`, is one flag that sets each), read flat
(`settings.folds`), given flat (`compare(..., folds=3)`, `settings_for`), recorded flat (the record keeps
the keys a flat class had); its other fields keep their defaults. `settings.probe` is a `ProbeSettings`
that the probe step takes as it is.

Options that change only speed or output (device, threads, progress bars) are not settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from babelprobe.errors import BabelprobeError


def option(default, help: str = "", **metadata):
    """A settings field: its default, the help text of its flag and, optionally, `choices`, `metavar`,
    `type` (the flag's parser), `flag` (the flag's name when it is not the field's), `aliases` (old
    spellings accepted but not shown; "--old=VALUE" is a flag without a value that sets VALUE), `values`
    (old values accepted, from the command line or code, and replaced: `{"generation": "generate"}`;
    `resolve_values` in `__post_init__`), `const` (the value of the flag given without one), `cli=False`
    (no flag: set from code only) or `budget=True`: a length cap (e.g. `max_new_tokens`) that may be set
    below a protocol's value without contradicting it; the run records the value used, so a capped run
    never passes for the uncapped one."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("settings defaults must be immutable (use a tuple)")
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


def block(cls, fields: tuple[str, ...], help: str = "") -> dataclasses.Field:
    """A field holding the settings block `cls` (nested settings, module docstring): `fields` are the block's
    fields that are the command's own settings (flagged, given and recorded flat); the others keep `cls`'s
    defaults."""
    return dataclasses.field(default_factory=cls, metadata={
        "help": help or f"the {cls.__name__} of its step", "block": cls, "fields": tuple(fields)})


class Nested:
    """A settings class with blocks: a block's field reads as the settings' own (`settings.folds` is
    `settings.probe.folds`)."""

    def __getattr__(self, name):
        if not name.startswith("_"):
            for block_name, field in _blocks(type(self)).items():
                if name in field.metadata["fields"]:
                    return getattr(object.__getattribute__(self, block_name), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def _blocks(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if "block" in f.metadata}


def flat_fields(cls) -> dict[str, list[tuple[str | None, dataclasses.Field]]]:
    """The settings of `cls` as its flags see them: name -> [(the block holding it, or None: `cls` itself,
    its field)], in declaration order (a block's fields where the block is declared)."""
    found: dict[str, list] = {}
    for field in dataclasses.fields(cls):
        if "block" not in field.metadata:
            found.setdefault(field.name, []).append((None, field))
            continue
        inner = {f.name: f for f in dataclasses.fields(field.metadata["block"])}
        for name in field.metadata["fields"]:
            found.setdefault(name, []).append((field.name, inner[name]))
    return found


def setting_field(cls, name: str) -> dataclasses.Field | None:
    """The field that declares setting `name` of `cls` (in a block: the block's own)."""
    paths = flat_fields(cls).get(name)
    return paths[0][1] if paths else None


def build(cls, values: Mapping):
    """`cls` from flat `values` (a block's fields go into its block; a block given whole is taken as it is)."""
    paths, kwargs, inner = flat_fields(cls), {}, {}
    unknown = sorted(set(values) - set(paths) - set(_blocks(cls)))
    if unknown:
        raise BabelprobeError(f"unknown setting {unknown[0]!r}; settings: {', '.join(sorted(paths))}")
    for name, value in values.items():
        if name in _blocks(cls) and name not in paths:
            kwargs[name] = value
            continue
        for block_name, _ in paths[name]:
            if block_name is None:
                kwargs[name] = value
            else:
                inner.setdefault(block_name, {})[name] = value
    for block_name, sub in inner.items():
        if block_name not in kwargs:
            kwargs[block_name] = _blocks(cls)[block_name].metadata["block"](**sub)
    return cls(**kwargs)


def flag(settings_or_class, name: str) -> str:
    """The command-line flag of field `name` (`--max-new-tokens` for `max_new_tokens`)."""
    cls = settings_or_class if isinstance(settings_or_class, type) else type(settings_or_class)
    field = setting_field(cls, name)
    return field.metadata.get("flag", "--" + name.replace("_", "-")) if field else "--" + name.replace("_", "-")


def settings_for(cls, protocol: str | None = None, presets: Mapping[str, Mapping] | None = None, **values):
    """`cls` (a settings dataclass) with the `protocol` preset applied, then `values`.

    `presets` maps protocol names to field values (default: `cls.PROTOCOLS` if it has one). A value given
    that differs from the preset's is an error naming both, so results recorded as made under a protocol
    always ran it (a `budget` field excepted: a cap may be lowered, and is recorded). Values of None are
    taken as not given. The chosen protocol is stored in the field
    `protocol` when `cls` has one."""
    presets = dict(presets if presets is not None else getattr(cls, "PROTOCOLS", {}) or {})
    fields = {name: setting_field(cls, name) for name in flat_fields(cls)}
    names = set(fields) | set(_blocks(cls))
    protocol = protocol or "default"
    if protocol != "default" and protocol not in presets:
        known = ", ".join(["default", *(p for p in presets if p != "default")])
        raise BabelprobeError(f"unknown --protocol {protocol!r}; use {known}")
    unknown = sorted(set(values) - names)
    if unknown:
        raise BabelprobeError(f"unknown setting {unknown[0]!r}; settings: {', '.join(sorted(names))}")
    preset = dict(presets.get(protocol, {}))
    chosen = {k: v for k, v in preset.items() if k in names}
    for name, value in values.items():
        if value is None:
            continue
        if name not in fields:  # a whole block, given as it is
            chosen[name] = value
            continue
        value = current_value(fields[name], value)
        budget = fields[name].metadata.get("budget", False)
        if protocol != "default" and name in preset and not budget and not _same(value, preset[name]):
            option_flag = flag(cls, name)
            raise BabelprobeError(f"--protocol {protocol} runs {option_flag} {_shown(preset[name])}; drop "
                                  f"{option_flag} {_shown(value)} or the --protocol")
        chosen[name] = value
    if "protocol" in names:
        chosen["protocol"] = protocol
    return build(cls, chosen)


def given(cls, settings=None, values: Mapping | None = None):
    """The settings of a library call (the kwargs door of every runner): `settings`, an instance of `cls`,
    or `cls` built from its fields given as keyword `values` (where `cls` has protocol presets, through
    `settings_for`, a `protocol` among the values choosing the preset); both is an error."""
    values = dict(values or {})
    if settings is not None:
        if values:
            raise BabelprobeError(f"pass settings or keyword values, not both (got {', '.join(values)})")
        return settings
    if getattr(cls, "PROTOCOLS", None):
        return settings_for(cls, values.pop("protocol", None), **values)
    return build(cls, values)


def current_value(field: dataclasses.Field, value):
    """`value`, or the value that replaced it when it is an old one (the field's `values`)."""
    old = field.metadata.get("values", {})
    try:
        return old.get(value, value)
    except TypeError:  # unhashable (a list): never an old value
        return value


def resolve_values(settings) -> None:
    """Old values of fields declared with `values` replaced in place (call in `__post_init__`), so
    `Settings(answer="generation")` holds "generate" and records it."""
    for field in dataclasses.fields(settings):
        if "values" in field.metadata:
            object.__setattr__(settings, field.name, current_value(field, getattr(settings, field.name)))


def settings_record(settings) -> dict:
    """The settings as plain JSON values (tuples as lists), for manifests and rows; flat (a block's own
    fields under their names, as the flags have them)."""
    if _blocks(type(settings)):
        return {name: _plain(getattr(settings, name)) for name in flat_fields(type(settings))}
    return {k: _plain(v) for k, v in dataclasses.asdict(settings).items()}


def block_record(settings, name: str) -> dict:
    """The record of block `name`'s own fields (those the settings set), flat: a step's part of the record."""
    fields = dataclasses.fields(type(settings))
    return {f: _plain(getattr(settings, f)) for f in next(x for x in fields if x.name == name).metadata["fields"]}


def from_record(cls, record: Mapping):
    """The settings `settings_record` recorded, rebuilt (JSON lists back as tuples where the field holds a
    tuple); `from_record(cls, settings_record(s)) == s`."""
    values = {name: _tupled(value) if isinstance(value, list) else value
              for name, value in record.items() if name in flat_fields(cls)}
    return build(cls, values)


def _tupled(value):
    return tuple(_tupled(v) if isinstance(v, list) else v for v in value)


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return [str(x) for x in _as_tuple(a)] == [str(x) for x in _as_tuple(b)]
    return str(a) == str(b)


def _as_tuple(value) -> tuple:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


# ------------------------------------------------------------------------- checks for __post_init__

def at_least(settings, name: str, minimum, allow_none: bool = False) -> None:
    """One-line error naming the flag when field `name` is below `minimum`."""
    value = getattr(settings, name)
    if value is None and allow_none:
        return
    if value is None or value < minimum:
        raise BabelprobeError(f"{flag(settings, name)} must be at least {minimum}, got {value}")


def one_of(settings, name: str, choices, allow_none: bool = False) -> None:
    """One-line error naming the flag when field `name` is not one of `choices`."""
    value = getattr(settings, name)
    if value is None and allow_none:
        return
    if value not in choices:
        raise BabelprobeError(f"{flag(settings, name)}: unknown value {value!r}; use {', '.join(map(str, choices))}")


def each_of(settings, name: str, choices) -> None:
    """One-line error naming the flag when a member of tuple field `name` is not one of `choices` (or
    the tuple is empty)."""
    values = getattr(settings, name)
    bad = [v for v in values if v not in choices]
    if bad or not values:
        raise BabelprobeError(f"{flag(settings, name)}: unknown value {bad[0] if bad else ''!r}; use "
                              f"{', '.join(map(str, choices))} (or a comma-separated list)")


def as_tuple(value) -> tuple:
    """A comma-separated string, a list or a tuple as a tuple of stripped strings (for tuple fields
    set from code: `methods="ablate,steer"`)."""
    return _as_tuple(value)
