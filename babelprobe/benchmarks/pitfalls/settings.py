"""The settings of Cross-Lingual Pitfalls: `Settings` of the evaluation (recorded in run.json; `babelprobe
bench pitfalls` makes one flag per field) with `PROTOCOLS`, the paper's preset (App. E), and
`SearchSettings` of the weakness search (`babelprobe bench pitfalls-search`; §2.4, App. B.1). The lowest
module of the package: the others import it, it imports none of them, nor torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from babelprobe.benchmarks.core.options import (
    CHAT_TEMPLATE,
    CHAT_TEMPLATE_VALUES,
    REDUCTIONS,
    SPEC_HELP,
    check_spec,
)
from babelprobe.errors import BabelprobeError
from babelprobe.settings import at_least, one_of, option, resolve_values

NAME = "pitfalls"
TITLE = "Cross-Lingual Pitfalls: English vs target-language weakness"
# the `answer` setting -> the rows' method: likelihood; generate = the released evaluation (eva.py -> utils/answers.py
# simulate: no chain of thought, then an extraction); cot = App. E's zero-shot chain of thought, then an extraction
METHODS = {"likelihood": "likelihood", "generate": "simulate-extract", "cot": "cot-extract"}
C_AFFINITY_DEFAULT = -1.0  # c of the Relative Affinity Score (App. B.1); summary.C_AFFINITY is the same


@dataclass(frozen=True)
class Settings:
    """How a Cross-Lingual Pitfalls evaluation answers (recorded in run.json)."""

    protocol: str = option("default", help="settings preset: 'paper' evaluates as the released code that made the "
                           "paper's figures (eva.py: the per-language instruction without chain of thought, the choice "
                           "extracted by an LLM)")
    answer: str = option("likelihood", choices=tuple(METHODS),
        help="likelihood: score each choice as a continuation; generate: the released evaluation (the language's "
        "simulation instruction, no chain of thought; the extractor picks the choice); cot: App. E's zero-shot "
        "chain-of-thought templates, then the extractor")
    reduction: str = option("per_byte",
        choices=REDUCTIONS, help="likelihood: how a choice's token log-probs are combined (choices differ in length)")
    prompts: str | None = option(None,
        metavar="FILE", help="likelihood: prompt table TSV instead of the paper's instructions (data/prompts/pitfalls.tsv)")
    generator: str = option("local", metavar="SPEC", help=f"generate, cot: who answers: {SPEC_HELP}")
    extractor: str | None = option(None, metavar="SPEC",
        help="generate, cot: who extracts the chosen option from the answer ('self': the answering model, the default "
        "outside --protocol paper; the release: gpt-4o-mini, e.g. openai:gpt-4o-mini@https://api.openai.com/v1; "
        "--protocol paper needs it named)")
    max_new_tokens: int = option(1024, budget=True, help="generate, cot: longest answer or extraction (App. B.1: 1,024)")
    chat_template: str = option("off", choices=CHAT_TEMPLATE, values=CHAT_TEMPLATE_VALUES, const="on",
        aliases=("--no-chat-template=off",),
        help="generate, cot with a local generator: each prompt as the user turn of the model's chat template: off, "
        "auto (when the model has one), on")
    templates: str | None = option(None, metavar="FILE",
        help="cot: prompt table TSV instead of the paper's App. E templates (data/prompts/pitfalls_paper.tsv)")
    release: str | None = option(None, metavar="FILE",
        help="generate: prompt table TSV instead of the released code's prompts (data/prompts/pitfalls_release.tsv)")

    def __post_init__(self):
        resolve_values(self)
        one_of(self, "answer", tuple(METHODS))
        one_of(self, "reduction", REDUCTIONS)
        one_of(self, "chat_template", CHAT_TEMPLATE)
        at_least(self, "max_new_tokens", 1)
        check_spec(self.generator, "--generator")
        resolve_extractor(self)


# The paper's figures (3, 5, 11-25) come from the released eva.py: every model answers the language's simulation
# instruction without chain of thought (utils/answers.py simulate) and gpt-4o-mini extracts the choice; the chat
# template is used when a local model has one (the paper's models were all chat models).
PROTOCOLS = {"paper": {"answer": "generate", "max_new_tokens": 1024, "chat_template": "auto"}}


@dataclass(frozen=True)
class SearchSettings:
    """The search's parameters; defaults are the paper's (§2.4, App. B.1); `SEARCH_PROTOCOLS["paper"]`
    adds the released code's way of simulating (generation without chain of thought, then extraction)."""

    protocol: str = option("default", help="settings preset: 'paper' simulates as the released run.py does (the "
                           "simulation models generate without chain of thought, an LLM extracts the choice) and "
                           "checks meaning (Eq. 4)")
    answer: str = option("likelihood", choices=("likelihood", "generate"),
        help="how the simulation models answer: likelihood of each choice, or generate (the released simulate: the "
        "language's instruction, no chain of thought, the extractor picks the choice)")
    extractor: str | None = option(None, metavar="SPEC",
        help="generate, cot: who extracts the chosen option ('self': the answering model, the default outside "
        "--protocol paper; the release: gpt-4o-mini; --protocol paper needs it named)")
    chat_template: str = option("off", choices=CHAT_TEMPLATE,
        help="local generators (perturber, translator, simulation models, judge): prompts as the user turn of the "
        "model's chat template: off, auto (when the model has one), on")
    translation: str = option("release", choices=("release", "paper"),
        help="seed translation template: release (utils/prompt.py, native for each of its 17 languages) or paper "
        "(App. E: fr, de, it, es; babelprobe's English rendering elsewhere)")
    baselines: bool = option(False, help="also run Table 1's baselines on the seeds: no perturbation (NP, the plain "
                             "translation) and direct perturbation (DP, one App. E perturbation); writes table1.csv")
    semantic_check: bool = option(False, help="check meaning (Eq. 4) with --similarity, or the local model as an LLM "
                                  "judge when --similarity is none (babelprobe's choice; the release asked gpt-4o)")

    width: int = option(12, help="w: questions kept in the beam")
    depth: int = option(4, help="d1: depth searched while nothing promising was found")
    max_depth: int = option(6, help="d2: depth allowed once a child reaches θpot")
    potential: float = option(0.6, help="θpot")
    inclusion: float = option(0.8, help="θinc")
    redundancy: int = option(3, help="r: candidates kept per seed question")
    gamma: float = option(2.0, help="γ of the simulation score")
    english_min: float = option(1.0,
        help="1 − ε: English accuracy a question must keep (released code: every model right)")
    batch_size: int = option(4, flag="--seeds-per-batch", help="W: seed questions searched together")
    max_new_tokens: int = option(1024, budget=True, help="longest perturbation, translation or check (App. B.1: 1,024)")
    perturb_temperature: float = option(0.7, help="sampling temperature of the perturber (App. B.1: 0.7)")
    seed: int = option(0, help="sampling seed of the perturber")
    similarity: str = option("none", metavar="SPEC",
        help="semantic check of Eq. 4: none, llm:GENERATOR (a judge LLM) or embedding:MODEL (cosine of an encoder's "
        "mean-pooled states)")
    theta: float = option(0.5, help="θ: least similarity of the perturbed English question to the original")
    theta_cross: float = option(0.5, flag="--theta-prime",
        help="θ': least similarity of the target-language question to the English one")
    templates: str | None = option(None, metavar="FILE",
        help="prompt table TSV instead of the paper's App. E templates (data/prompts/pitfalls_paper.tsv)")

    def __post_init__(self):
        one_of(self, "answer", ("likelihood", "generate"))
        one_of(self, "chat_template", CHAT_TEMPLATE)
        one_of(self, "translation", ("release", "paper"))
        resolve_extractor(self)
        if min(self.width, self.redundancy, self.batch_size) < 1 or not 1 <= self.depth <= self.max_depth:
            raise BabelprobeError(f"invalid search settings {self}: need width, redundancy, batch_size ≥ 1 and "
                                  "1 ≤ depth ≤ max_depth")
        if not (self.similarity == "none" or self.similarity.startswith(("llm:", "embedding:"))):
            raise BabelprobeError(f"unknown similarity {self.similarity!r}; use none, llm:SPEC or embedding:MODEL")


# θ = θ' = 0.5 for the semantic check are babelprobe's (the paper gives no values; the release's judge says yes or no).
SEARCH_PROTOCOLS = {"paper": {"answer": "generate", "semantic_check": True, "chat_template": "auto",
                              "translation": "release"}}


AFFINITY_PROTOCOLS = {"paper": {"answer": "generate", "chat_template": "auto", "max_new_tokens": 1024,
                                "translation": "release"}}


@dataclass(frozen=True)
class AffinitySettings:
    """The linguistic-affinity experiment (§3.3, App. B.2, Fig. 7; `babelprobe bench pitfalls-affinity`):
    who translates the found pairs into the other languages and how the expanded pairs are answered (the
    evaluation's answerers: likelihood, the released evaluation, App. E's chain of thought)."""

    PROTOCOLS: ClassVar[dict] = AFFINITY_PROTOCOLS  # what `settings.given` (a runner's keywords) presets with
    protocol: str = option("default", help="settings preset: 'paper' answers the expanded pairs as the released "
                           "evaluation does (no chain of thought, then an extractor) and translates with 1,024 tokens")
    answer: str = option("likelihood", choices=tuple(METHODS),
        help="how the expanded pairs are answered: likelihood, generate (the released evaluation) or cot (App. E)")
    generator: str = option("local", metavar="SPEC", help=f"generate, cot: who answers: {SPEC_HELP}")
    extractor: str | None = option(None, metavar="SPEC",
        help="generate, cot: who extracts the chosen option ('self': the answering model, the default outside "
        "--protocol paper; the release: gpt-4o-mini; --protocol paper needs it named)")
    translator: str = option("local", metavar="SPEC",
        help="who translates the pairs into the other languages (the paper: GPT-4o for the question with its choices, "
        "Google Translate for the added context)")
    translation: str = option("release", choices=("release", "paper"),
        help="template translating a question with its choices: release (utils/prompt.py, native per language) or "
        "paper (App. E)")
    reduction: str = option("per_byte", choices=REDUCTIONS, help="likelihood: how a choice's token log-probs combine")
    chat_template: str = option("off", choices=CHAT_TEMPLATE,
        help="local generators: each prompt as the user turn of the model's chat template: off, auto, on")
    max_new_tokens: int = option(256, budget=True,
        help="longest translation, answer or extraction (App. B.1: 1,024; babelprobe's default 256 keeps CPU runs short)")
    c: float = option(C_AFFINITY_DEFAULT, flag="--ras-c", help="c of the Relative Affinity Score (App. B.1: −1)")
    seed: int = option(0, help="seed of the random sample of --limit pairs per seed language (App. B.2: 100 at random)")

    def __post_init__(self):
        one_of(self, "answer", tuple(METHODS))
        one_of(self, "translation", ("release", "paper"))
        one_of(self, "reduction", REDUCTIONS)
        one_of(self, "chat_template", CHAT_TEMPLATE)
        at_least(self, "max_new_tokens", 1)
        check_spec(self.generator, "--generator")
        check_spec(self.translator, "--translator")
        resolve_extractor(self)


def resolve_extractor(settings) -> None:
    """`--extractor`: the answering model unless named ('self' and the old 'generator' say so); under
    `--protocol paper`, which extracts with an LLM as the release does (gpt-4o-mini), it must be named:
    a one-line error otherwise, before any model loads (as ECLeKTiC's preset does for its judge)."""
    value = settings.extractor
    if value is None and getattr(settings, "protocol", "default") == "paper" and settings.answer != "likelihood":
        raise BabelprobeError("--protocol paper extracts each answer's choice with an LLM, as the release does with "
                              "gpt-4o-mini: give --extractor SPEC (e.g. openai:gpt-4o-mini@https://api.openai.com/v1), "
                              "or --extractor self to let the answering model extract")
    if value in (None, "self"):
        object.__setattr__(settings, "extractor", "generator")
    else:
        check_spec(value, "--extractor", also=("generator",))
