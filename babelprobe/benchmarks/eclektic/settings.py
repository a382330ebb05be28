"""The settings of ECLeKTiC: `Settings` (recorded in run.json; `babelprobe bench eclektic` makes one flag
per field) and `PROTOCOLS`, the paper's preset (§3.2, §4.1, App. A). The lowest module of the package:
the others import it, it imports none of them, nor torch."""

from __future__ import annotations

from dataclasses import dataclass

from babelprobe.benchmarks.core.options import CHAT_TEMPLATE, CHAT_TEMPLATE_VALUES, SPEC_HELP, check_spec
from babelprobe.errors import BabelprobeError
from babelprobe.settings import one_of, option, resolve_values

NAME = "eclektic"
TITLE = "ECLeKTiC: cross-lingual knowledge transfer (closed book)"
# Table 3's conditions (App. A.3) and babelprobe's `qa` frame for base models.
PROMPT_SETS = ("closed-book", "general-hint", "source-language-name", "source-language-title",
               "cross-lingual-open-book", "qa")


@dataclass(frozen=True)
class Settings:
    """Who answers, with which prompt, and who judges (recorded in run.json); docs/fidelity.md compares
    the defaults and the paper preset with the paper."""

    protocol: str = option("default", help="settings preset: default (babelprobe's, for any model) or paper "
                           "(the paper's closed-book prompt, uncut answers, the chat template when the model has "
                           "one; needs --judge llm:SPEC or --judge self)")
    generator: str = option("local", metavar="SPEC", help=f"who answers: {SPEC_HELP}")
    chat_template: str = option("off", choices=CHAT_TEMPLATE, values=CHAT_TEMPLATE_VALUES, const="on",
        aliases=("--no-chat-template=off",),
        help="local generators: send each prompt as the user turn of the model's chat template: off, auto (when "
        "the model has one), on (instruction-tuned local models; openai: chat endpoints always do)")
    prompt_set: str = option("auto", choices=("auto", *PROMPT_SETS),
        help="closed-book prompt set of data/prompts/eclektic.tsv: closed-book (the bare question) and Table 3's "
        "hint conditions, or qa ('Question: …\\nAnswer:', babelprobe's frame for base models); auto: closed-book "
        "for chat answerers (openai:, a chat template), qa otherwise")
    prompt_file: str | None = option(None, metavar="FILE.tsv", help="your own templates (columns language, "
                                     "template; placeholders {question} {in_lang} {original_title} {original_context})")
    answer_cut: str = option("auto", choices=("auto", "none", "first-line"),
        help="keep the whole answer (none) or its first line; auto: the first line for the qa frame only")
    max_new_tokens: int = option(256, budget=True, help="answer length bound, in tokens")
    judge: str = option("match", metavar="match|self|llm:SPEC", values={"llm": "self"},
        help="match (babelprobe's normalised containment) or the paper's LLM judge with the App. A.2 prompt: "
        "llm:SPEC (a judge generator; the paper: Gemini 2.0 Flash) or self (the answering model judges itself, "
        "recorded as judge=self; 'llm' is its old spelling)")
    judge_prompt: str | None = option(None, metavar="FILE", help="your judge prompt with {context} {question} "
                                      "{predicted_answer} [{target_language}]; unset: App. A.2 (set judge of "
                                      "data/prompts/eclektic.tsv)")

    def __post_init__(self):
        resolve_values(self)
        one_of(self, "chat_template", CHAT_TEMPLATE)
        one_of(self, "prompt_set", ("auto", *PROMPT_SETS))
        one_of(self, "answer_cut", ("auto", "none", "first-line"))
        if self.judge not in ("match", "self") and not self.judge.startswith("llm:"):
            raise BabelprobeError(f"--judge {self.judge!r}: use match, self or llm:SPEC ({SPEC_HELP})")
        if self.judge.startswith("llm:"):
            check_spec(self.judge[4:], f"--judge {self.judge!r}: the judge")
        check_spec(self.generator, "--generator")
        if self.protocol == "paper" and self.judge == "match":
            raise BabelprobeError("--protocol paper needs --judge: the paper judged every model's answers with Gemini "
                                  "2.0 Flash (App. A.2); give --judge llm:SPEC (e.g. llm:openai:MODEL@URL), or "
                                  "--judge self to accept the answering model judging itself (rows record judge=self)")
        if self.chat_template == "on" and not self.generator.startswith("local"):
            raise BabelprobeError(f"--chat-template applies to local generators, not {self.generator!r} "
                                  "(openai: endpoints are chat endpoints already)")


# The paper's protocol (§3.2, §4.1, App. A): the bare question, whole answers, the chat template when a local model
# has one (the paper's models were prompted in their chat format). The judge is not in the preset: the paper's was
# Gemini 2.0 Flash for every model, so `--judge llm:SPEC` names one, or `--judge self` accepts self-judging.
PROTOCOLS = {"paper": {"prompt_set": "closed-book", "answer_cut": "none", "chat_template": "auto"}}
