"""Cross-Lingual Pitfalls as released: the prompt strings of data/prompts/pitfalls_release.tsv against the
release's own files (read at test time from ../shared, skipped when absent), the released evaluation's
prompts and extraction (`--answer generate`, the paper preset), the search's simulation models answering
the release's way, and the bad inputs of the paper protocol."""

from __future__ import annotations

import re

import pytest

from babelprobe.benchmarks import pitfalls as pf
from babelprobe.errors import BabelprobeError
from babelprobe.languages import language_code
from tests import pitfalls_release as release

needs_release = pytest.mark.skipif(not release.RELEASE.is_dir(), reason="../shared/data/cross_lingual_pitfalls/release "
                                   "is absent")
if release.RELEASE.is_dir():
    INSTRUCTIONS = release.simulation_instructions()
    TEMPLATES = release.prompt_templates()
else:
    INSTRUCTIONS, TEMPLATES = {}, {}
TRANSLATED = sorted(name[len("English2"):] for name in TEMPLATES if name.startswith("English2") and name != "English2all")


@needs_release
def test_the_release_has_an_instruction_and_a_translation_template_for_each_target_language():
    targets = sorted(set(INSTRUCTIONS) - {"English"})
    assert targets == TRANSLATED and len(targets) == 17  # the paper reports 16 of them
    table = pf.load_release()
    assert sorted(lang for name, lang in table.index if name == "simulate") == sorted(
        language_code(n) for n in INSTRUCTIONS)


@needs_release
@pytest.mark.parametrize("language", sorted(INSTRUCTIONS))
def test_simulation_prompt_is_the_releases(language):
    """utils/answers.py simulate: question_prompt[language] + answer_question_withoutcot(question, choices)."""
    expected = INSTRUCTIONS[language] + TEMPLATES["answer_question_withoutcot"]
    assert pf.release_template(pf.load_release(), "simulate", language_code(language)) == expected


@needs_release
@pytest.mark.parametrize("language", TRANSLATED)
def test_seed_translation_template_is_the_releases(language):
    """utils/prompt.py English2<Language>, the template utils/translate.py sends for that target."""
    assert pf.release_template(pf.load_release(), "translate", language_code(language)) == TEMPLATES[f"English2{language}"]


@needs_release
def test_extraction_prompt_is_the_releases():
    assert pf.release_template(pf.load_release(), "extract", "*") == TEMPLATES["extract_answer_dk"]


@needs_release
def test_likelihood_instructions_are_the_releases_too():
    prompts = pf.load_prompts()
    for language, instruction in INSTRUCTIONS.items():
        assert prompts.at[language_code(language), "instruction"] == instruction.rstrip(" ")  # trailing space off


class Recorder:
    """Answers 'It is <second choice>' and, as extractor, returns the JSON the release's prompt asks for."""

    name = "recorder"

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, max_new_tokens=64, stop=None, temperature=0.0, seed=0):
        self.prompts += prompts
        out = []
        for p in prompts:
            if p.startswith("[Instruction]\nYou are an expert in JSON file processing. You need to select"):
                out.append('{"final_answer": "' + re.search(r"It is (.*)\n", p).group(1) + '"}')
            else:
                choices = eval(p.rstrip("\n").rsplit("\n", 1)[1])  # noqa: S307 (the release prints a Python list)
                out.append(f"It is {choices[1]}\n")
        return out


def test_released_evaluation_sends_the_release_prompt_and_extracts():
    questions = pf.load_pitfalls("pitfalls-sample", ["French"], limit=1)
    chat = Recorder()
    rows = pf.answer_release(questions, chat, progress=False)
    assert len(rows) == 4 and rows["method"].eq("simulate-extract").all()
    table = pf.load_release()
    q = questions.iloc[0]
    # what utils/answers.py builds: instruction + f"\n{question}\n{choices}\n", the choices a printed list
    french = table.at[("simulate", "fr"), "template"].split("\n")[0]
    assert chat.prompts[2] == f"{french}\n{q['transori']}\n{q['transchoices']!r}\n"
    assert chat.prompts[0].startswith("Please complete the following multiple-choice question")
    extraction = [p for p in chat.prompts if "[The Start of the Model's Answer]" in p]
    assert len(extraction) == 4 and f"It is {q['choices'][1]}\n" in extraction[0]
    assert rows["predicted"].eq(1).all() and (rows["correct"] == rows["gold"].eq(1)).all()
    assert set(rows["generator"]) == set(rows["extractor"]) == {"recorder"}


def test_release_answerer_is_a_simulation_model():
    chat = Recorder()
    answerer = pf.ReleaseAnswerer(chat)
    assert answerer.answer(["Q?", "Q2?"], [["a", "b"], ["x", "y", "z"]], ["en", "de"]) == [1, 1]
    assert chat.prompts[1].startswith("Bitte vervollständigen Sie")


def test_a_language_without_a_release_prompt_is_an_error():
    with pytest.raises(BabelprobeError, match="no 'simulate' prompt for language 'ru'"):
        pf.release_template(pf.load_release(), "simulate", "ru")


def test_paper_preset_and_cot():
    with pytest.raises(BabelprobeError, match="--protocol paper extracts each answer's choice with an LLM.*--extractor"):
        pf.Settings(protocol="paper", answer="generate", chat_template="auto")
    paper = pf.Settings(protocol="paper", answer="generate", chat_template="auto", extractor="self")
    assert paper.extractor == "generator"  # the answering model, accepted explicitly
    assert pf.METHODS[paper.answer] == "simulate-extract" and pf.METHODS["cot"] == "cot-extract"
    with pytest.raises(BabelprobeError, match="--extractor 'gpt4'"):
        pf.Settings(answer="generate", extractor="gpt4")


# --------------------------------------------------------------------------------------------- search

class FirstChoice(Recorder):
    """Answers with the first choice (the right one of the search's test seeds)."""

    name = "first-choice"

    def generate(self, prompts, max_new_tokens=64, stop=None, temperature=0.0, seed=0):
        self.prompts += prompts
        out = []
        for p in prompts:
            if p.startswith("[Instruction]\nYou are an expert in JSON file processing. You need to select"):
                out.append('{"final_answer": "' + re.search(r"It is (.*)\n", p).group(1) + '"}')
            else:
                out.append(f"It is {eval(p.rstrip(chr(10)).rsplit(chr(10), 1)[1])[0]}\n")  # noqa: S307
        return out


def test_search_preset_simulates_the_release_way_and_checks_meaning():
    from babelprobe.settings import settings_for

    with pytest.raises(BabelprobeError, match="give --extractor SPEC"):
        settings_for(pf.SearchSettings, "paper", pf.SEARCH_PROTOCOLS)
    paper = settings_for(pf.SearchSettings, "paper", pf.SEARCH_PROTOCOLS,
                         extractor="openai:gpt-4o-mini@https://api.openai.com/v1")
    assert (paper.answer, paper.semantic_check, paper.translation, paper.chat_template) == (
        "generate", True, "release", "auto")
    assert (paper.theta, paper.theta_cross) == (0.5, 0.5)
    with pytest.raises(BabelprobeError, match="--protocol paper runs --answer generate"):
        settings_for(pf.SearchSettings, "paper", pf.SEARCH_PROTOCOLS, answer="likelihood", extractor="self")


def test_search_seeds_with_a_generating_simulation_model():
    import pandas as pd

    from babelprobe.benchmarks.pitfalls.search import prepare_seeds

    chat = FirstChoice()
    source = pd.DataFrame([{"seed_id": "s", "question": "Which animal barks?", "choices": ["dog", "cat"],
                            "answer": "dog", "source": "t", "category": "c"}])

    class NoTranslation:
        name = "none"

        def generate(self, prompts, **kw):
            return ["not JSON"] * len(prompts)

    kept, dropped = prepare_seeds(source, "Chinese", NoTranslation(), [pf.ReleaseAnswerer(chat)])
    assert kept.empty and dropped["reason"].str.contains("translation").all()  # right in English, then translated
    assert chat.prompts[0] == pf.release_template(pf.load_release(), "simulate", "en").format(
        question="Which animal barks?", choices="['dog', 'cat']")
