"""Edit sources: what an intervention run switches on in the model. The runner (`run.intervene`) owns
the readouts, the rows, resuming, the summary and the figures; a source owns its edits.

An edit source is a class with

    name      the rows' `edit_source` ("probe_directions", "neurons", ...)
    methods   the `--method` values it serves
    unit      the item column a run resumes by: each unit's items are scored together, with one
              baseline pass and one pass per edit (a probe group, a language)
    columns   the columns its rows add after the keys (documented with the source)

    __init__(settings, items, probes, inputs)    check every input it needs (layers, languages, files)
                                                 before any model loads; `probes` is a checked
                                                 `directions.ProbeSource` or `FreshProbes` or None,
                                                 `inputs` {name: path} the sources' own inputs given
                                                 (`intervene(neurons=...)`: --neurons); a source refuses
                                                 one that is not its own
    identity() -> dict                           what beyond the settings fixes its edits (digests of
                                                 probe weights, of its inputs); part of the run's identity
    check_model(lm)                              after the model loads, before anything is written
    ready(probes)                                the probes once loaded or fitted (None without --probes)
    units(items) -> items with the `unit` column
    unit_rows(unit: readouts.Unit) -> rows       every row of one unit: a baseline `unit.read()`, then for
                                                 each edit `unit.read(edit_context, layers)` and
                                                 `unit.frame(...)` with the edit's columns inserted

`SOURCES` maps each method to its source ("module:Class", imported when used), so a new source is one
line here and a class beside the others (SAE features next).
"""

from __future__ import annotations

import importlib

from babelprobe.errors import BabelprobeError

SOURCES: dict[str, str] = {
    "steer": "babelprobe.interventions.probe_edits:ProbeDirections",
    "ablate": "babelprobe.interventions.probe_edits:ProbeDirections",
    "leace": "babelprobe.interventions.probe_edits:ProbeDirections",
    "sae": "babelprobe.interventions.sae_features:SAEFeatures",
    "neurons": "babelprobe.neurons.edits:NeuronDeactivation",
}
METHODS = tuple(SOURCES)


class EditSource:
    """Base of the edit sources (module docstring): the interface, and defaults for sources that need
    nothing beyond the settings."""

    name = "?"
    methods: tuple[str, ...] = ()
    unit = "language"
    columns: tuple[str, ...] = ()

    def __init__(self, settings, items, probes, inputs: dict):
        self.settings, self.found = settings, probes
        self.refuse_others(inputs)

    def refuse_others(self, inputs: dict, own: tuple[str, ...] = ()) -> None:
        """A one-line error for an input given that this source does not read."""
        other = next((name for name, value in inputs.items() if value is not None and name not in own), None)
        if other is not None:
            raise BabelprobeError(f"--{other} does not go with --method {','.join(self.settings.methods)}")

    def identity(self) -> dict:
        return {}

    def check_model(self, lm) -> None:
        pass

    def ready(self, probes) -> None:
        self.probes = probes

    def units(self, items):
        return items[items["label"].isin([0, 1])].copy()

    def unit_rows(self, unit):
        raise NotImplementedError


def source_class(methods) -> type[EditSource]:
    """The one edit source serving every method in `methods`; a one-line error when they need two."""
    paths = {SOURCES[m] for m in methods}
    if len(paths) > 1:
        raise BabelprobeError(f"--method {','.join(methods)}: these methods edit different things (probe directions, "
                              "neurons); run them into separate --out directories")
    module, _, name = paths.pop().partition(":")
    return getattr(importlib.import_module(module), name)
