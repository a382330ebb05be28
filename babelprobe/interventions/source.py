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

    corpus_edits(lm) -> [(labels, edit)]         optional: every edit as a context manager, with the
                                                 labels of its corpus readout rows (`--readouts ppl`);
                                                 a source without it cannot be read on a corpus

`SOURCES` maps each method to its entry: where the class is ("module:Class", imported when used), the
name of its own input (`--neurons`, `--sae`: the runner's keyword and the CLI flag, built from here) with
its help, and the settings fields only it reads (given with another method, they are an error). A new
source is one module and one line here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from babelprobe.errors import BabelprobeError


@dataclass(frozen=True)
class Source:
    """One registry line (module docstring)."""

    path: str                    # "module:Class"
    input: str | None = None     # its input's name: the keyword of `intervene` and the flag --NAME
    help: str = ""               # the flag's help
    fields: tuple[str, ...] = ()  # settings fields only this source reads


_PROBES = Source("babelprobe.interventions.probe_edits:ProbeDirections", fields=("ablate_to", "shuffled"))
SOURCES: dict[str, Source] = {
    "steer": _PROBES, "ablate": _PROBES, "leace": _PROBES,
    "neurons": Source("babelprobe.neurons.edits:NeuronDeactivation", "neurons",
                      "a `babelprobe neurons` directory (--method neurons)", ("off", "top_rate")),
    "sae": Source("babelprobe.sae.edits:SAEFeatures", "sae", "a `babelprobe sae` directory: --method sae removes each "
                  "language's most specific SAE features there", ("ablate_mode",)),
}
METHODS = tuple(SOURCES)


def inputs() -> dict[str, str]:
    """{input name: help} of every source that has one (the runner's keywords, the CLI's flags)."""
    return {entry.input: entry.help for entry in SOURCES.values() if entry.input}


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

    def corpus_edits(self, lm):
        raise BabelprobeError(f"--readouts ppl: --method {','.join(self.settings.methods)} has no corpus readout; it "
                              "goes with --method neurons or sae")


def source_class(methods) -> type[EditSource]:
    """The one edit source serving every method in `methods`; a one-line error when they need two."""
    paths = {SOURCES[m].path for m in methods}
    if len(paths) > 1:
        raise BabelprobeError(f"--method {','.join(methods)}: these methods edit different things (probe directions, "
                              "neurons, SAE features); run them into separate --out directories")
    module, _, name = paths.pop().partition(":")
    return getattr(importlib.import_module(module), name)
