"""The language-neuron edit source of `babelprobe intervene` (`--method neurons --neurons neu/ --off LANGS`):
switch one language's LAPE-selected neurons off and read every evaluated language.

For each language k of `--off` (default: every language of the neurons run), k's selected neurons
(`Lape.neurons(k)`, at `--top-rate`, default the run's first rate) are switched off at every token
(`mlp.Deactivation`: activation 0, released `ppl.py`), and the unit's items are read as with any edit.
The control (`--random N` draws): as many neurons per layer as k has there, drawn from the neurons LAPE
did not select (seed, k and the draw fix each set, so every unit sees the same sets).

Units: the probe groups when the probe readout is asked for (it reads each group's probe at `--layers`,
its peak by default), else the languages. Columns of its rows, after the keys: `layer` (the probe
readout's layer; empty without one), `layer_rule`, `method` (neurons), `ablate_to` (empty), `positions`
(all), `direction` (neurons: the selected ones; random: a control draw), `draw`, `alpha` (1: switched
off), `off` (the language switched off), `top_rate`, `n_neurons` (how many were switched off), `n_items`. The corpus readout
(`--readouts ppl`) runs the same edits, one language's neurons (or a control) at a time (`corpus_edits`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from babelprobe.errors import BabelprobeError
from babelprobe.extract.layers import is_peak
from babelprobe.interventions.directions import layer_plan
from babelprobe.interventions.probe_edits import insert_columns
from babelprobe.interventions.source import EditSource
from babelprobe.neurons.mlp import Deactivation, activation_modules, n_neurons
from babelprobe.neurons.run import read_run
from babelprobe.probes.controls import group_rng


def with_neurons(sets: dict, explicit: bool, where: str, top_rate: float, bar: float) -> tuple[str, ...]:
    """The languages of `sets` ({language: {layer: indices}}) that have neurons to switch off. Switching
    nothing off has no effect to report (a tiny or degenerate model can select none: OLMo-2's activation
    probabilities sit at 1, so none exceeds τ_bar): a language named by --off without neurons is refused,
    one of the default (every language) left out with a note, and no language with neurons is refused."""
    empty = [code for code, chosen in sets.items() if not any(len(v) for v in chosen.values())]
    if not empty:
        return tuple(sets)
    why = (f"{where} selects no neurons of {', '.join(empty)} at --top-rate {top_rate:g} (a neuron belongs to the "
           f"languages whose activation probability exceeds τ_bar = {'?' if bar is None else f'{bar:.3g}'})")
    if explicit or len(empty) == len(sets):
        raise BabelprobeError(f"{why}; switching nothing off has no effect to report: choose --off among languages "
                              "with neurons, or select again (`babelprobe neurons` with a larger --top-rate, or on more text)")
    tqdm.write(f"babelprobe: {why}: leaving {'it' if len(empty) == 1 else 'them'} out of --off")
    return tuple(code for code in sets if code not in empty)


class NeuronDeactivation(EditSource):
    """Language neurons switched off (module docstring)."""

    name = "neurons"
    methods = ("neurons",)
    columns = ("layer", "layer_rule", "method", "ablate_to", "positions", "direction", "draw", "alpha", "off",
               "top_rate", "n_neurons", "n_items")

    def __init__(self, settings, items: pd.DataFrame, probes, inputs: dict):
        super().__init__(settings, items, probes, {k: v for k, v in inputs.items() if k != "neurons"})
        if inputs.get("neurons") is None:
            raise BabelprobeError("--method neurons switches language neurons off: give --neurons DIR (a `babelprobe "
                                  "neurons` directory)")
        self.path = Path(inputs["neurons"])
        self.lape, self.manifest = read_run(self.path)
        unknown = [code for code in settings.off if code not in self.lape.languages]
        if unknown:
            raise BabelprobeError(f"--off {unknown[0]}: the neurons in {self.path} are of "
                                  f"{', '.join(self.lape.languages)}")
        self.top_rate = float(settings.top_rate) if settings.top_rate is not None else self.lape.top_rates[0]
        self.sets = {code: self.lape.neurons(code, self.top_rate) for code in settings.off or self.lape.languages}
        self.off = with_neurons(self.sets, bool(settings.off), f"--neurons {self.path}", self.top_rate, self.lape.bar)
        self.unit = "probe_group" if probes is not None and "probe" in settings.readouts else "language"

    def identity(self) -> dict:
        digest = hashlib.sha256((self.path / "lape.csv").read_bytes()).hexdigest()[:16]
        return {"neurons": digest, "off_resolved": list(self.off), "top_rate_resolved": self.top_rate}

    def check_model(self, lm) -> None:
        made_with = self.manifest.get("fingerprint")
        if made_with != lm.fingerprint:
            raise BabelprobeError(f"--neurons {self.path} were found in another model (fingerprint {made_with}, this "
                                  f"model {lm.fingerprint})")
        if not hasattr(lm, "parts"):  # the model's files only (runtime.info): its MLPs are counted once it loads
            return
        if len(activation_modules(lm)) != self.lape.n_layers or n_neurons(lm) != self.lape.width:
            raise BabelprobeError(f"--neurons {self.path} has {self.lape.n_layers} × {self.lape.width} neurons, "
                                  f"{lm.name} {len(activation_modules(lm))} × {n_neurons(lm)}")

    def units(self, items: pd.DataFrame) -> pd.DataFrame:
        items = items[items["label"].isin([0, 1])].copy()
        if self.unit == "probe_group":
            by = list(self.probes.by)
            items["probe_group"] = items[by].astype(str).agg("/".join, axis=1) if by else "all"
        return items

    def random_sets(self, code: str) -> list[dict[int, np.ndarray]]:
        """`--random` sets for language `code`: per layer as many neurons as it has there, drawn from the
        unselected ones."""
        chosen = self.lape.selected(self.top_rate)
        taken = {int(layer): set(part["neuron"]) for layer, part in chosen.groupby("layer")}
        out = []
        for draw in range(self.settings.n_random):
            rng = group_rng(self.settings.seed, f"neurons off {code}", f"random {draw}")
            drawn = {}
            for layer, indices in sorted(self.sets[code].items()):
                pool = np.setdiff1d(np.arange(self.lape.width), sorted(taken.get(layer, ())))
                drawn[layer] = np.sort(rng.choice(pool, size=min(len(indices), len(pool)), replace=False))
            out.append(drawn)
        return out

    def unit_rows(self, unit) -> pd.DataFrame:
        settings, items = self.settings, unit.items
        probes = self.probes if "probe" in settings.readouts else None
        by = list(probes.by) if probes is not None else []
        key = tuple(items[by].astype(str).iloc[0]) if by else ()
        layers = layer_plan(probes, items, settings.layers)[key] if probes is not None else []
        group = dict(zip(by, key)) if by else None
        base = unit.read(None, layers)
        before = {layer: unit.probe_readout(probes.probes.probe(group, layer), base.states[layer]) for layer in layers}
        frames = []
        for code in self.off:
            edits = [("neurons", 0, self.sets[code])] + [("random", d, s) for d, s in enumerate(self.random_sets(code))]
            for direction, draw, neurons in edits:
                after = unit.read(Deactivation(unit.lm, neurons), layers)
                for layer in layers or [None]:
                    probe_after = (unit.probe_readout(probes.probes.probe(group, layer), after.states[layer])
                                   if layer is not None else {})
                    frame = unit.frame(base, after, before.get(layer), probe_after, keys=by)
                    labels = {"layer": layer if layer is not None else np.nan,
                              "layer_rule": ("peak" if is_peak(settings.layers) else "chosen")
                              if layer is not None else "",
                              "method": "neurons", "ablate_to": "", "positions": "all", "direction": direction,
                              "draw": draw, "alpha": 1.0, "off": code, "top_rate": self.top_rate,
                              "n_neurons": int(sum(len(v) for v in neurons.values())), "n_items": len(items)}
                    frames.append(insert_columns(frame, labels, after=len(dict.fromkeys(
                        ["pair_id", "language", "subset", *by]))))
        return pd.concat(frames, ignore_index=True)

    def corpus_edits(self, lm) -> list[tuple[dict, object]]:
        """(labels, edit context) per language switched off and per control draw, for the corpus readout
        (the released `ppl.py`: one language's mask at a time)."""
        out = []
        for code in self.off:
            edits = [("neurons", 0, self.sets[code])] + [("random", d, s) for d, s in enumerate(self.random_sets(code))]
            for direction, draw, neurons in edits:
                labels = {"off": code, "direction": direction, "draw": draw, "method": "neurons",
                          "top_rate": self.top_rate, "n_neurons": int(sum(len(v) for v in neurons.values()))}
                out.append((labels, Deactivation(lm, neurons)))
        return out
