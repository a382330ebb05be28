"""The settings of StingrayBench: `Settings` (recorded in run.json; `babelprobe bench stingray` makes one
flag per field) and `PROTOCOLS`, the paper's presets (§4.3). The lowest module of the package: the others
import it, it imports none of them, nor torch."""

from __future__ import annotations

from dataclasses import dataclass

from babelprobe.benchmarks.core.options import CHAT_TEMPLATE, REDUCTIONS, SPEC_HELP
from babelprobe.settings import as_tuple, at_least, each_of, one_of, option, resolve_values

NAME = "stingray"
TITLE = "StingrayBench: cross-lingual false friends and true cognates"
TASKS = ("semantic", "usage")
ANSWERS = ("likelihood", "generate")

# §4.3: zero-shot, each model's chat format, likelihood-based inference for the open models; prompts and
# the summed label log-probabilities of the released likelihood_eval.py. `paper-generation` is the
# paper's robustness check: the same prompts answered by generation, post-processed, at most 3 new tokens
# (the released generation scripts).
PROTOCOLS = {
    "paper": {"answer": "likelihood", "chat_template": "auto", "reduction": "sum", "prompts": None, "tasks": TASKS},
    "paper-generation": {"answer": "generate", "chat_template": "auto", "max_new_tokens": 3, "prompts": None,
                         "tasks": TASKS},
}


@dataclass(frozen=True)
class Settings:
    """What a StingrayBench run asks and how it reads the answers (recorded in run.json)."""

    protocol: str = option("default", help="settings preset: 'paper' = §4.3 (likelihood, each model's chat "
                           "format where it has one, the released prompts); 'paper-generation' = its "
                           "robustness check (the same, answered by generation)")
    tasks: tuple[str, ...] = option(TASKS, help="semantic, usage")
    answer: str = option("likelihood", choices=ANSWERS, aliases=("--inference",), values={"generation": "generate"},
        help="likelihood: the best-scoring answer label; generate: the generator's answer, post-processed (§4.3)")
    chat_template: str = option("off", choices=CHAT_TEMPLATE, aliases=("--chat",), const="on",
        help="the model's chat template around the prompt: off, auto (when the model has one; §4.3), on")
    reduction: str = option("sum",
        choices=REDUCTIONS, help="likelihood: how an answer label's token log-probs are combined")
    generator: str = option("local", metavar="SPEC", help=f"generate: who answers: {SPEC_HELP}")
    max_new_tokens: int = option(3, budget=True, help="generate: answer length in tokens (3 in the released code)")
    prompts: str | None = option(None,
        metavar="FILE", help="prompt file instead of the released one (data/prompts/stingray.tsv)")

    def __post_init__(self):
        resolve_values(self)
        object.__setattr__(self, "tasks", as_tuple(self.tasks))
        each_of(self, "tasks", TASKS)
        one_of(self, "answer", ANSWERS)
        one_of(self, "chat_template", CHAT_TEMPLATE)
        one_of(self, "reduction", REDUCTIONS)
        at_least(self, "max_new_tokens", 1)
