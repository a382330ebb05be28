"""The settings of Cross-Lingual Pitfalls: `Settings` of the evaluation (recorded in run.json; `babelprobe
bench pitfalls` makes one flag per field) with `PROTOCOLS`, the paper's preset (App. E), and
`SearchSettings` of the weakness search (`babelprobe bench pitfalls-search`; §2.4, App. B.1). The lowest
module of the package: the others import it, it imports none of them, nor torch."""

from __future__ import annotations

from dataclasses import dataclass

from babelprobe.benchmarks.core.options import CHAT_TEMPLATE, CHAT_TEMPLATE_VALUES, REDUCTIONS, SPEC_HELP
from babelprobe.errors import BabelprobeError
from babelprobe.settings import at_least, one_of, option, resolve_values

NAME = "pitfalls"
TITLE = "Cross-Lingual Pitfalls: English vs target-language weakness"
METHODS = {"likelihood": "likelihood", "generate": "cot-extract"}  # the `answer` setting -> the rows' method


@dataclass(frozen=True)
class Settings:
    """How a Cross-Lingual Pitfalls evaluation answers (recorded in run.json)."""

    protocol: str = option("default", help="settings preset: 'paper' answers as App. E does (zero-shot chain of "
                           "thought, the choice extracted by an LLM)")
    answer: str = option("likelihood", choices=tuple(METHODS),
        help="likelihood: score each choice as a continuation; generate: the generator answers with chain of "
        "thought and the extractor picks the choice (the paper's protocol)")
    reduction: str = option("per_byte",
        choices=REDUCTIONS, help="likelihood: how a choice's token log-probs are combined (choices differ in length)")
    prompts: str | None = option(None,
        metavar="FILE", help="likelihood: prompt table TSV instead of the paper's instructions (data/prompts/pitfalls.tsv)")
    generator: str = option("local", metavar="SPEC", help=f"generate: who answers: {SPEC_HELP}")
    extractor: str = option("generator", metavar="SPEC",
        help="generate: who extracts the chosen option from the answer ('generator': the same; the paper: gpt-4o-mini)")
    max_new_tokens: int = option(1024, budget=True, help="generate: longest answer or extraction (App. B.1: 1,024)")
    chat_template: str = option("off", choices=CHAT_TEMPLATE, values=CHAT_TEMPLATE_VALUES, const="on",
        aliases=("--no-chat-template=off",),
        help="generate with a local generator: each prompt as the user turn of the model's chat template: off, "
        "auto (when the model has one), on")
    templates: str | None = option(None, metavar="FILE",
        help="generate: prompt table TSV instead of the paper's App. E templates (data/prompts/pitfalls_paper.tsv)")


    def __post_init__(self):
        resolve_values(self)
        one_of(self, "answer", tuple(METHODS))
        one_of(self, "reduction", REDUCTIONS)
        one_of(self, "chat_template", CHAT_TEMPLATE)
        at_least(self, "max_new_tokens", 1)


PROTOCOLS = {"paper": {"answer": "generate", "max_new_tokens": 1024}}


@dataclass(frozen=True)
class SearchSettings:
    """The search's parameters; defaults are the paper's (§2.4, App. B.1)."""

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
        if min(self.width, self.redundancy, self.batch_size) < 1 or not 1 <= self.depth <= self.max_depth:
            raise BabelprobeError(f"invalid search settings {self}: need width, redundancy, batch_size ≥ 1 and "
                                  "1 ≤ depth ≤ max_depth")
        if not (self.similarity == "none" or self.similarity.startswith(("llm:", "embedding:"))):
            raise BabelprobeError(f"unknown similarity {self.similarity!r}; use none, llm:SPEC or embedding:MODEL")
