"""The settings of the self-consistency benchmark: `Settings` (recorded in run.json; `babelprobe bench
consistency` makes one flag per field) and `PROTOCOLS`, the `paper` preset (§3.1-§3.3). The lowest module
of the package: the others import it, it imports none of them, nor torch."""

from __future__ import annotations

from dataclasses import dataclass

from babelprobe.benchmarks.core.options import CHAT_TEMPLATE, CHAT_TEMPLATE_VALUES, SPEC_HELP
from babelprobe.settings import at_least, one_of, option, resolve_values

NAME = "consistency"
TITLE = "multilingual self-consistency (Ohmer, Bruni & Hupkes)"

COMET_MODEL = "Unbabel/wmt22-comet-da"  # §3.3, footnote 4

# §3.1: temperature 0.25; at most 256 tokens per answer and 2048 per translation. §3.2: zero-shot
# answers to the App. B instruction, valid when they match or contain the label word. §3.3 / App. C:
# the translation prompts. §4.4 / Table 5: the baseline is a second run of the source task.
PROTOCOLS = {"paper": {"answer": "generate", "cue": False, "translation_prompt": "paper", "temperature": 0.25,
                       "answer_tokens": 256, "max_new_tokens": 2048, "first_line": False, "baseline": "rerun",
                       "chat_template": "auto"}}  # the paper's models were chat models: their template when they have one


@dataclass(frozen=True)
class Settings:
    """Who translates and answers, and how (recorded in run.json)."""

    protocol: str = option("default",
        help="settings preset: 'paper' answers by generation at temperature 0.25 with App. B/C prompts (§3)")
    task: str | None = option(None,
        help="task (paws-x, xnli); default: the items' 'task' field, else from the file's columns")
    language: str | None = option(None,
        help="source language: the items asked and translated (rows of other languages are references); "
        "also the language of a file that does not say it (PAWS-X/XNLI hub exports); default: the file's, "
        "en in a file of several languages")
    generator: str = option("local",
        metavar="SPEC", help=f"who translates (and answers, with --answer generate): {SPEC_HELP}")
    answer: str = option("likelihood",
        choices=("likelihood", "generate"), help="likelihood: compare the label words' log-probabilities "
        "under --model; generate: the generator answers and the answer is mapped to a label (§3.2)")
    cue: bool = option(True,
        help="end each task prompt with an answer cue (babelprobe's, for base models; the paper sends "
        "the instruction alone)")
    translation_prompt: str = option("oneshot",
        choices=("oneshot", "paper"), help="oneshot: babelprobe's one-shot prompt (small base models); "
        "paper: App. C's zero-shot prompts")
    baseline: str = option("paraphrase",
        choices=("paraphrase", "rerun", "both", "none"), help="same-language baseline: paraphrase "
        "(babelprobe's addition: the model's paraphrase of instruction and input), rerun (Table 5: a second "
        "sampled run of the source task), both, or none")
    temperature: float = option(0.0,
        help="sampling temperature of translations and generated answers (0: greedy; the paper: 0.25)")
    seed: int = option(0, help="sampling seed (the rerun baseline uses seed + 1)")
    max_new_tokens: int = option(96, budget=True, help="bound on each translation/paraphrase, in tokens")
    answer_tokens: int = option(8, budget=True, help="bound on each generated answer, in tokens")
    first_line: bool = option(True,
        help="keep only the first line of every translation and answer (stops generating there)")
    chat_template: str = option("off", choices=CHAT_TEMPLATE, values=CHAT_TEMPLATE_VALUES, const="on",
        aliases=("--no-chat-template=off",),
        help="local generators: send each prompt as the user turn of the model's chat template: off, auto (when "
        "the model has one), on (instruction-tuned local models; the paper's model was a chat model)")
    mixed: bool = option(False,
        help="also condition M (Table 9, App. F): each item's original input with the native App. B instruction of "
        "each target language (no translation by the model)")
    comet: bool = option(False,
        help=f"also score translations with COMET-22 ({COMET_MODEL}; needs the 'comet' extra and downloads "
        "the model)")
    spec: str | None = option(None,
        metavar="FILE.json", help="task definitions instead of data/prompts/consistency.json")
    instructions: str | None = option(None,
        metavar="FILE.tsv", help="task instructions instead of data/prompts/consistency_instructions.tsv")
    prompts: str | None = option(None,
        metavar="FILE.tsv", help="prompt templates instead of data/prompts/consistency_prompts.tsv")

    def __post_init__(self):
        resolve_values(self)
        one_of(self, "answer", ("likelihood", "generate"))
        one_of(self, "translation_prompt", ("oneshot", "paper"))
        one_of(self, "baseline", ("paraphrase", "rerun", "both", "none"))
        one_of(self, "chat_template", CHAT_TEMPLATE)
        at_least(self, "temperature", 0.0)
        at_least(self, "max_new_tokens", 1)
        at_least(self, "answer_tokens", 1)
