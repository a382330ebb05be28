"""The settings of `babelprobe patch`: `TranslationSettings` (the paper's word-translation protocol) and
`PairsSettings` (babelprobe's minimal-pair join), what changes their numbers, recorded in patch.json; the
CLI makes one flag per field.

The defaults of `TranslationSettings` are the paper's design on the languages of the bundled concepts
(xcomps-sample has no it, nl or fi): the paper's languages are `PAPER_LANGUAGES` (Dumas et al. 2025; the
released notebooks patchscope_shifted_translation.ipynb and obj_patch_translation.ipynb), for a concept
file that has them: `bp.patch_translation(lm, "words.csv", "patch/", **PAPER_LANGUAGES)`.

This module imports nothing heavy: the CLI builds its flags from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from babelprobe.errors import BabelprobeError
from babelprobe.settings import Nested, as_tuple, at_least, block, each_of, flag, one_of, option

EXPERIMENTS = ("exp1", "exp2")
# The released notebooks' settings: exp1 `shifted_translation_plot("de", "it", "fr", "zh", extra_langs=["en"])`,
# exp2 `object_patching_plot(paper_pairs, "fr", "zh")`.
PAPER_LANGUAGES = {"source": "de-it", "target": "fr-zh", "latent": "en",
                   "source_pairs": ("de-it", "nl-fi", "zh-es", "es-ru", "ru-ko")}
# `--preset paper`: every configuration of the paper's figures (released notebooks): exp1
# shifted_translation_plot("de", "it", "fr", "zh", extra_langs=["en"]); exp2 object_patching_plot's
# (paper_pairs, "fr", "zh") and ([(l, "hi") for l in paper_ins], "fr", "et")
PAPER_CONFIGS = (("exp1", ("de-it",), "fr-zh"),
                 ("exp2", ("de-it", "nl-fi", "zh-es", "es-ru", "ru-ko"), "fr-zh"),
                 ("exp2", ("de-hi", "nl-hi", "zh-hi", "es-hi", "ru-hi"), "fr-et"))
PRESETS = ("none", "paper")


@dataclass(frozen=True)
class Shared:
    """The settings both protocols have: one block, declared once (`TranslationSettings.shared`,
    `PairsSettings.shared`; flagged flat: --layers, --seed, --n-boot)."""

    layers: str = option("all", metavar="SPEC", help="patched block outputs: all (1..L), or e.g. 4-12")
    seed: int = option(0, help="seed of the random draws (translation: the few-shot examples and the pair order; "
                       "pairs: the control concepts) and of the bootstrap")
    n_boot: int = option(1000, metavar="N", help="bootstrap replicates of the intervals over pairs")

    def __post_init__(self):
        object.__setattr__(self, "layers", _layer_spec(self.layers))
        at_least(self, "n_boot", 0)
        from babelprobe.extract.layers import check_spec

        check_spec(self.layers)


SHARED = tuple(f.name for f in dataclasses.fields(Shared))


@dataclass(frozen=True)
class TranslationSettings(Nested):
    """What changes the numbers of the translation protocol (`bp.patch_translation`)."""

    exps: tuple[str, ...] = option(EXPERIMENTS, flag="--exp", metavar="LIST",
                                   help="exp1: the source prompt's last-token state written into block j's output "
                                   "of the target's last token, one layer at a time; exp2: the source concept's "
                                   "state (mean over --source-pairs, and the first pair's alone) written at the "
                                   "target concept's last token, layers j..L")
    source: str = option("de-es", metavar="IN-OUT",
                         help="exp1: the source prompt's input and output languages (the paper: de-it)")
    target: str = option("fr-zh", metavar="IN-OUT", help="the target prompt's input and output languages")
    latent: str | None = option("en", metavar="CODE",
                                help="the language of the latent concept, both concepts' words summed, measured and "
                                "(exp2: its set in the pair filter) kept disjoint (the paper: en; 'none': leave it "
                                "out)")
    source_pairs: tuple[str, ...] = option(("de-es", "de-tr", "zh-es", "es-ru", "ru-ko"), metavar="LIST",
                                           help="exp2: the source prompts' language pairs (the paper: de-it,nl-fi,"
                                           "zh-es,es-ru,ru-ko)")
    preset: str = option("none", choices=PRESETS, help="paper: run every language configuration of Dumas et al.'s "
                         "figures (exp1 de-it into fr-zh, latent en; exp2 five source pairs into fr-zh and five into "
                         "fr-et) on the bundled dumas-concepts; --source, --target, --source-pairs then come from it")
    n_pairs: int = option(200, metavar="N", help="source/target concept pairs per experiment")
    shots: int = option(5, metavar="K", help="translation examples before the query")
    shared: Shared = block(Shared, SHARED, help="the settings both protocols have")

    def __post_init__(self):
        object.__setattr__(self, "exps", as_tuple(self.exps))
        object.__setattr__(self, "source_pairs", as_tuple(self.source_pairs))
        latent = None if self.latent is None or str(self.latent).lower() == "none" else str(self.latent)
        object.__setattr__(self, "latent", latent)
        each_of(self, "exps", EXPERIMENTS)
        one_of(self, "preset", PRESETS)
        if self.preset == "paper":
            _check_preset(self)
        at_least(self, "n_pairs", 1)
        at_least(self, "shots", 1)
        source, target = language_pair(self, "source"), language_pair(self, "target")
        pairs = [language_pair(self, "source_pairs", text) for text in self.source_pairs]
        if "exp2" in self.exps and not pairs:
            raise BabelprobeError("--source-pairs: exp2 needs at least one source language pair, e.g. de-es")
        if "exp2" in self.exps and self.latent == target[1]:
            raise BabelprobeError(f"--latent {self.latent} is the output language of --target; choose another or 'none'")
        if "exp1" in self.exps:
            if source[1] == target[1]:
                raise BabelprobeError(f"--source {self.source} and --target {self.target} have the same output "
                                      "language; exp1 tells the two apart by it")
            if self.latent in (source[1], target[1]):
                raise BabelprobeError(f"--latent {self.latent} is an output language of --source or --target; choose "
                                      "another or 'none'")
        check_prompt_names(sorted(self.prompt_languages()))

    def prompt_languages(self) -> list[str]:
        """The languages the chosen experiments' prompts are written in (and need prompt names in): exp1 its
        source and target, exp2 its target and source pairs' (an experiment not run needs none)."""
        if self.preset == "paper":
            codes = [c for exp, sources, target in PAPER_CONFIGS if exp in self.exps
                     for pair in (*sources, target) for c in pair.split("-")]
        else:
            exp1, exp2 = "exp1" in self.exps, "exp2" in self.exps
            codes = [*(self.source.split("-") if exp1 else []), *self.target.split("-"),
                     *(c for p in self.source_pairs for c in p.split("-") if exp2)]
        return list(dict.fromkeys(codes))

    def languages(self) -> list[str]:
        """Every language the chosen experiments need words in: the prompts' and the latent one (its words
        counted, in both experiments; never written in a prompt)."""
        return list(dict.fromkeys(self.prompt_languages() + ([self.latent] if self.latent else [])))


@dataclass(frozen=True)
class PairsSettings(Nested):
    """What changes the numbers of the minimal-pair protocol (`bp.patch_pairs`)."""

    sources: tuple[str, ...] = option(("en",), metavar="LIST",
                                      help="source languages: the acceptable item's prefix state in each (the mean "
                                      "over them) is written into the target language's unacceptable item")
    controls: bool = option(True, help="also run the controls: the target language as source (upper bound) and "
                            "another pair's concept (lower bound)")
    min_gap: float = option(0.5, metavar="NATS",
                            help="summary: keep only the pairs the model decides correctly by at least this margin "
                            "(s_good − s_bad ≥ NATS; the recovery's denominator)")
    shared: Shared = block(Shared, SHARED, help="the settings both protocols have")

    def __post_init__(self):
        object.__setattr__(self, "sources", as_tuple(self.sources))
        object.__setattr__(self, "min_gap", float(self.min_gap))
        if not self.sources:
            raise BabelprobeError("--sources needs at least one language code, e.g. en")
        if self.min_gap < 0:
            raise BabelprobeError(f"--min-gap must be 0 or more, got {self.min_gap}")


def _check_preset(settings: TranslationSettings) -> None:
    """`--preset paper` sets the language configurations: a --source, --target or --source-pairs other than
    the default is an error naming it."""
    from dataclasses import fields

    defaults = {f.name: f.default for f in fields(settings)}
    for name in ("source", "target", "source_pairs"):
        if getattr(settings, name) != defaults[name]:
            raise BabelprobeError(f"{flag(settings, name)} does not go with --preset paper, which runs the paper's "
                                  "configurations (exp1 de-it into fr-zh; exp2 into fr-zh and fr-et)")


def _layer_spec(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def language_pair(settings, name: str, text: str | None = None) -> tuple[str, str]:
    """"de-it" as ("de", "it"); a one-line error naming the flag otherwise."""
    text = str(getattr(settings, name) if text is None else text)
    parts = text.split("-")
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise BabelprobeError(f"{flag(settings, name)} {text!r}: write a language pair as IN-OUT with two different "
                              "codes, e.g. de-it")
    return parts[0], parts[1]


def prompt_names() -> dict[str, str]:
    """The languages' names in the translation prompts (data/prompts/translation_names.tsv)."""
    from babelprobe.prompts import read_prompts

    table = read_prompts("translation_names", ("language", "name"), optional=("source",))
    return dict(zip(table["language"], table["name"]))


def check_prompt_names(languages) -> None:
    names = prompt_names()
    missing = [code for code in languages if code not in names]
    if missing:
        raise BabelprobeError(f"language {missing[0]!r} has no name for the translation prompt (the prompt names "
                              f"each language in itself); named: {', '.join(sorted(names))}; add it to "
                              "babelprobe/data/prompts/translation_names.tsv")
