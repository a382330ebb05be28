"""The settings of `babelprobe intervene` (and `bp.intervene`): every option that changes its numbers,
declared once (babelprobe.settings); the CLI builds its flags from them. Importing this module imports
no model code, so `babelprobe intervene --help` stays fast."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from babelprobe.benchmarks.scoring import REDUCTIONS, RULES
from babelprobe.errors import BabelprobeError
from babelprobe.extract.layers import PEAK, is_peak
from babelprobe.settings import as_tuple, at_least, each_of, flag, one_of, option, settings_record

READOUTS = ("direct", "meta", "probe", "ppl")
METHODS = ("steer", "ablate", "leace", "neurons", "sae")  # interventions.source.SOURCES says which source serves each
POSITIONS = ("all", "last")
ABLATE_TO = ("zero", "mean")
ABLATE_MODES = ("subtract", "projection")  # sae: babelprobe's f_s·W_dec[s], Deng et al.'s projection
CORPUS_ROWS = ("packed", "lines")
DEFAULT_ALPHAS = {"steer": (-4.0, -2.0, 0.0, 2.0, 4.0), "ablate": (1.0,), "leace": (1.0,), "neurons": (1.0,), "sae": (1.0,)}


@dataclass(frozen=True)
class Settings:
    """What changes the numbers of an intervention run (recorded in intervene.json)."""

    methods: tuple[str, ...] = option(("ablate",), "steer, ablate, leace (edits along probe directions), neurons "
                                      "(language neurons switched off, --neurons), sae (SAE features removed, "
                                      "--sae); a comma list of one kind", flag="--method", metavar="LIST")
    layers: str = option("peak", "'peak' (each probe group's peak layer) or layers like 6 or 0-4,12: where probe "
                         "directions are edited, and where the probe readout reads", metavar="LAYERS")
    readouts: tuple[str, ...] = option((), "direct, meta, probe (default: direct and meta, and probe with --probes); "
                                       "ppl: each language's perplexity on --corpus's held-out text (--method neurons, "
                                       "sae)", metavar="LIST")
    alphas: tuple[float, ...] = option((), "strengths, written --alpha=-4,-2,0,2,4 ('=' when the list starts with a "
                                       "minus): steer in standard deviations along the direction (default "
                                       "-4,-2,0,2,4); ablate and leace the fraction of the edit (default 1)",
                                       flag="--alpha", metavar="LIST")
    ablate_to: str = option("zero", "ablate: project the direction out (zero) or set the component to the mean of "
                            "the two class means (mean)", choices=ABLATE_TO)
    positions: str = option("all", "edit every token (all) or each text's last token (last; probe readout only)",
                            choices=POSITIONS)
    n_random: int = option(3, "random controls: unit directions edited like the probe's, or as many random "
                           "unselected neurons per layer as the language switched off has", flag="--random",
                           metavar="N")
    shuffled: bool = option(True, "the shuffled-label probe's direction as a control (probe directions)")
    off: tuple[str, ...] = option((), "neurons: the languages whose neurons are switched off, one at a time (default: "
                                  "every language of the --neurons run)", metavar="LIST")
    top_rate: float | None = option(None, "neurons: the share of all neurons LAPE selects (default: the --neurons "
                                    "run's first --top-rate)", metavar="RATE")
    ablate_mode: str = option("subtract", "sae: remove f_s(x)·W_dec[s] at every token but BOS (subtract) or the "
                              "projection of x onto each W_dec[s] at every token (projection: Deng et al.)",
                              choices=ABLATE_MODES)
    corpus_rows: str = option("packed", "ppl: the held-out text cut into rows of --window tokens (packed: Tang et al.'s "
                              "ppl.py) or each line its own row (lines: Deng et al.)", choices=CORPUS_ROWS)
    window: int = option(1024, "ppl, --corpus-rows packed: text tokens per row (BOS added)", metavar="N")
    tokens: int | None = option(None, "ppl: at most N held-out tokens per language (ppl.py: 2^20)", metavar="N")
    seed: int = option(0, "seed of the random controls, the label shuffle and the bootstrap")
    reduction: str | None = option(None, "direct and meta score reduction (default: the compare run's, else sum)",
                                   choices=REDUCTIONS)
    rule: str | None = option(None, "meta rule: how the two option orders decide a pair (default: the compare run's, "
                              "else sum)", choices=RULES)
    prompts: str | None = option(None, "meta prompt set (default: the compare run's, else xcomps)",
                                 metavar="NAME|FILE.tsv")
    refit_folds: int = option(5, "folds of the probe refitted on edited states", cli=False)

    def __post_init__(self):
        for name in ("methods", "readouts", "off"):
            object.__setattr__(self, name, as_tuple(getattr(self, name)))
        if is_peak(self.layers):  # `max` (the XCOMPS wording) too: recorded as peak
            object.__setattr__(self, "layers", PEAK)
        object.__setattr__(self, "methods", tuple(dict.fromkeys(self.methods)))
        each_of(self, "methods", METHODS)
        if self.readouts:
            each_of(self, "readouts", READOUTS)
        one_of(self, "ablate_to", ABLATE_TO)
        one_of(self, "positions", POSITIONS)
        at_least(self, "n_random", 0)
        at_least(self, "refit_folds", 2)
        try:
            alphas = tuple(float(a) for a in as_tuple(self.alphas))
        except ValueError as err:
            raise BabelprobeError(f"--alpha: cannot read {self.alphas!r}; use numbers like -4,-2,0,2,4") from err
        if not np.isfinite(alphas).all():
            raise BabelprobeError(f"--alpha needs finite numbers, got {','.join(map(str, alphas))}")
        object.__setattr__(self, "alphas", tuple(dict.fromkeys(alphas)))
        one_of(self, "ablate_mode", ABLATE_MODES)
        one_of(self, "corpus_rows", CORPUS_ROWS)
        at_least(self, "window", 1)
        if self.tokens is not None:
            at_least(self, "tokens", 1)
        _own_fields(self)
        neurons = "neurons" in self.methods
        if "ppl" in self.readouts and not set(self.methods) <= {"neurons", "sae"}:
            raise BabelprobeError("--readouts ppl reads each language's perplexity with one language's edit at a time: "
                                  "it goes with --method neurons or sae")
        if neurons and self.alphas and self.alphas != (1.0,):
            raise BabelprobeError("--alpha: --method neurons switches neurons off (their activation set to 0); it has "
                                  "no strength to choose")
        if neurons and self.positions != "all":
            raise BabelprobeError("--positions last: --method neurons switches neurons off at every token")
        if self.top_rate is not None and not 0 < float(self.top_rate) <= 1:
            raise BabelprobeError(f"--top-rate must lie in (0, 1], got {self.top_rate}")
        if self.positions == "last" and self.readouts and set(self.readouts) != {"probe"}:
            raise BabelprobeError("--positions last edits each text's last token, which no direct or meta score reads; "
                                  "use --readouts probe")
        one_of(self, "rule", RULES, allow_none=True)
        one_of(self, "reduction", REDUCTIONS, allow_none=True)

    def alphas_for(self, method: str) -> tuple[float, ...]:
        """The strengths run for `method`: --alpha, else the method's default."""
        return self.alphas or DEFAULT_ALPHAS[method]

    def record(self) -> dict:
        """The settings as JSON, with each method's strengths resolved (the run's identity)."""
        return {**settings_record(self), "alphas": {m: list(self.alphas_for(m)) for m in self.methods}}


def _own_fields(settings: Settings) -> None:
    """A source's own settings (interventions.source.SOURCES `fields`) given with another method: an error
    naming the flag and the method it goes with."""
    from dataclasses import fields

    from babelprobe.interventions.source import SOURCES

    defaults = {f.name: f.default for f in fields(settings)}
    for method, entry in SOURCES.items():
        if method in settings.methods or any(SOURCES[m] == entry for m in settings.methods):
            continue
        for name in entry.fields:
            if getattr(settings, name) != defaults[name]:
                raise BabelprobeError(f"{flag(settings, name)} goes with --method {method}")
