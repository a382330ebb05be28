"""The Cross-Lingual Pitfalls beam search and expanded pairs on a fake perturber, translator and simulation
models whose behaviour fixes which candidates must be found (and at which depth); the App. E prompts
they receive; the semantic checks of Eq. 4 with a pluggable similarity."""

from __future__ import annotations

import ast
import json
import re

import numpy as np
import pandas as pd
import pytest

from babelprobe.benchmarks import pitfalls as pf
from babelprobe.benchmarks.pitfalls.search import (
    EmbeddingSimilarity,
    JudgeSimilarity,
    SearchSettings,
    beam_search,
    clean,
    cross_evaluate,
    direct_perturbation,
    expand_pairs,
    parse_translation,
    prepare_seeds,
)
from babelprobe.errors import BabelprobeError


def _between(prompt: str, start: str, end: str) -> str:
    return re.search(re.escape(start) + r"\n(.*?)\n" + re.escape(end), prompt, re.S).group(1)


class FakePerturber:
    """Answers App. E's perturbation template with '{Generated Distraction: Think of <wrong option>.}' and
    its direct-perturbation template with 'New question: [D] <question>'; records the sampling asked for."""

    name = "fake-perturber"

    def __init__(self):
        self.calls, self.sampling = 0, set()

    def generate(self, prompts, max_new_tokens=64, stop=None, temperature=0.0, seed=0):
        self.calls += 1
        self.sampling.add((temperature, seed))
        out = []
        for p in prompts:
            if "[Requirements]" in p:
                out.append("New question: [D] " + _between(p, "[The Start of the Question]", "[The End of the Question]"))
            else:
                wrong = _between(p, "[The Start of the Incorrect Option]", "[The End of the Incorrect Option]")
                out.append("{Generated Distraction: Think of " + wrong + ".}")
        return out


class FakeTranslator:
    """'[T] <text>': keeps the text, so the fake models can see the distractions. A question with its
    choices and answer (App. E translation template) gets the template's JSON reply; plain text (the
    perturbation) gets the text."""

    name = "fake-translator"

    def generate(self, prompts, max_new_tokens=64, stop=None, temperature=0.0, seed=0):
        out = []
        for p in prompts:
            fields = _between_markers(p)
            if len(fields) == 3:  # text, choices, answer: App. E's or the release's template, in any language
                text, choices, answer = fields[0], ast.literal_eval(fields[1]), fields[2]
                out.append("Here it is:\n" + json.dumps({"text": "[T] " + text, "choices": ["[T] " + c for c in choices],
                                                         "answer": "[T] " + answer}, ensure_ascii=False))
            else:
                out.append("[T] " + _between(p, "[The Start of the text]", "[The End of the text]"))
        return out


def _between_markers(prompt: str) -> list[str]:
    """The lines a template puts between two section markers ('[The Start of the Text]', '[文本开始]', ...)."""
    lines = [line.strip() for line in prompt.splitlines()]

    def marker(line):
        return line.startswith("[") and line.endswith("]") and not line.startswith(("['", '["'))

    return [line for before, line, after in zip(lines, lines[1:], lines[2:]) if marker(before) and marker(after)
            and line and not marker(line)]


def target_model(i: int, poison: str | None = None):
    """Simulation model i: always right in English (unless a distraction names `poison`); in the target
    language wrong once the question holds i or more translated distractions. With 5 such models the
    target accuracy after n distractions is 1 − min(n, 5)/5, so V = n/5."""
    def answer(question, choices, language):
        if language == "en":
            return "nope" if poison and f"Think of {poison}" in question else "right"
        return "[T] wrong-1" if question.count("[T] Think of") >= i else choices[0]
    answer.__name__ = f"model-{i}"
    return answer


def seeds(n=2, translator=None):
    source = pd.DataFrame([{"seed_id": f"s{k}", "question": f"Question {k}?", "choices": ["right", "wrong-1", "wrong-2"],
                            "answer": "right", "source": "test", "category": "General Knowledge"} for k in range(n)])
    kept, dropped = prepare_seeds(source, "Chinese", translator or FakeTranslator(), [target_model(i) for i in range(1, 6)])
    assert dropped.empty and len(kept) == n
    return kept


def test_seeds_are_translated_with_the_releases_template_and_checked_in_english():
    prompts = []

    class Recording(FakeTranslator):
        def generate(self, batch, **kw):
            prompts.extend(batch)
            return super().generate(batch, **kw)

    kept = seeds(1, Recording()).iloc[0]
    assert kept["transori"] == "[T] Question 0?" and kept["transchoices"] == ["[T] right", "[T] wrong-1", "[T] wrong-2"]
    assert kept["transanswer"] == "[T] right" and kept["language"] == "zh"
    template = pf.release_template(pf.load_release(), "translate", "zh")  # utils/prompt.py English2Chinese
    assert prompts == [template.format(question="Question 0?", choices="['right', 'wrong-1', 'wrong-2']",
                                       ground_truth="right")]
    assert prompts[0].startswith("[system]\n你是一位专业的翻译专家。")
    source = pd.DataFrame([{"seed_id": "bad", "question": "Q?", "choices": ["right", "x"], "answer": "x",
                            "source": "t", "category": "c"}])
    kept, dropped = prepare_seeds(source, "Chinese", FakeTranslator(), [target_model(1)])
    assert kept.empty and dropped["reason"].str.contains("English").all()


def test_the_german_seed_uses_app_e_german_template():
    prompts = []

    class Recording(FakeTranslator):
        def generate(self, batch, **kw):
            prompts.extend(batch)
            return super().generate(batch, **kw)

    source = pd.DataFrame([{"seed_id": "s", "question": "Q?", "choices": ["right", "x"], "answer": "right",
                            "source": "t", "category": "c"}])
    kept, _ = prepare_seeds(source, "German", Recording(), [target_model(1)], SearchSettings(translation="paper"))
    assert prompts[0].startswith("[Instruction]\nSie sind ein professioneller Übersetzungsexperte.")
    assert kept["language"].tolist() == ["de"]


def test_search_finds_the_candidates_the_models_imply():
    models = [target_model(i) for i in range(1, 6)]
    perturber = FakePerturber()
    result = beam_search(seeds(2), perturber, FakeTranslator(), models, SearchSettings())
    c = result.candidates
    # V = n/5 after n distractions: 0.6 at depth 3 opens depth d2, 0.8 at depth 4 passes θinc = 0.8
    assert len(c) == 2 * 3  # r = 3 candidates per seed
    assert (c["depth"] == 4).all() and c["value"].eq(0.8).all()
    assert c["rate_ori"].eq(1.0).all() and c["rate_trans"].eq(0.2).all()
    assert c.groupby("seed_id").size().tolist() == [3, 3]
    for record in c.to_dict("records"):
        assert record["question"].count("Think of") == 4 and record["transquestion"].count("[T] Think of") == 4
        assert record["oriquestion"] in record["question"] and record["transori"] in record["transquestion"]
        assert "Generated Distraction" not in record["question"]  # the template's wrapping is removed
    assert perturber.sampling == {(0.7, 0)}  # App. B.1: perturbations sampled at temperature 0.7
    trace = result.trace
    assert trace["depth"].max() == 4  # every seed reached r candidates, so the beam emptied
    assert trace.loc[trace["depth"] == 3, "depth_limit"].eq(6).all()
    assert trace.groupby("depth")["in_beam"].sum().max() <= 12
    assert set(trace["status"]) <= {"included", "kept", "pruned", "english_failed", "no_text"}


def test_without_potential_the_search_stops_at_d1():
    models = [target_model(i) for i in range(1, 6)]
    result = beam_search(seeds(1), FakePerturber(), FakeTranslator(), models, SearchSettings(depth=2))
    assert result.candidates.empty
    assert result.trace["depth"].max() == 2 and result.trace["value"].max() == pytest.approx(0.4)


def test_english_failures_are_pruned_and_redundancy_caps_candidates():
    models = [target_model(i, poison="wrong-2") for i in range(1, 6)]
    result = beam_search(seeds(2), FakePerturber(), FakeTranslator(), models, SearchSettings(redundancy=1, width=3))
    c = result.candidates
    assert c.groupby("seed_id").size().tolist() == [1, 1]
    assert not c["question"].str.contains("Think of wrong-2").any()
    failed = result.trace[result.trace["status"] == "english_failed"]
    assert len(failed) and failed["wrong_option"].eq("wrong-2").all() and failed["value"].isna().all()
    assert result.trace.groupby("depth")["in_beam"].sum().max() <= 3


def test_semantic_checks_of_eq_4_drop_children_below_the_thresholds():
    # S(qE, qE') is 0.2 once the English question names wrong-2, else 0.9; S(qE', qT') is 0.9
    def similarity(pairs):
        return [0.2 if "Think of wrong-2" in b and "[T]" not in b else 0.9 for _, b in pairs]

    models = [target_model(i) for i in range(1, 6)]
    result = beam_search(seeds(1), FakePerturber(), FakeTranslator(), models, SearchSettings(theta=0.5),
                         similarity=similarity)
    failed = result.trace[result.trace["status"] == "semantic_failed"]
    assert len(failed) and failed["wrong_option"].eq("wrong-2").all() and failed["sim_en"].eq(0.2).all()
    # one chain of wrong-1 distractions is left: V = 0.8 at depth 4 and 1.0 at depth 5, where every model fails
    # the target question (nothing left to find: it leaves the beam)
    assert not result.candidates["question"].str.contains("wrong-2").any()
    assert result.candidates["depth"].tolist() == [4, 5]
    kept = result.trace[result.trace["status"] != "semantic_failed"]
    assert kept["sim_en"].eq(0.9).all() and kept["sim_cross"].eq(0.9).all()
    # a stricter θ' on the cross-lingual similarity drops every child, and seeds at preparation
    strict = beam_search(seeds(1), FakePerturber(), FakeTranslator(), models, SearchSettings(theta_cross=0.95),
                         similarity=similarity)
    assert strict.candidates.empty and set(strict.trace["status"]) == {"semantic_failed"}
    source = pd.DataFrame([{"seed_id": "s", "question": "Q?", "choices": ["right", "x"], "answer": "right",
                            "source": "t", "category": "c"}])
    kept, dropped = prepare_seeds(source, "Chinese", FakeTranslator(), [target_model(1)],
                                  SearchSettings(theta_cross=0.95), similarity=similarity)
    assert kept.empty and "semantic check" in dropped["reason"].iloc[0]


def test_judge_similarity_reads_the_verdict():
    class Judge:
        name = "judge"

        def generate(self, prompts, max_new_tokens=64, stop=None, **kw):
            out = []
            for p in prompts:
                if p.startswith("[Instruction]\nYou are a linguistics expert."):
                    q1 = _between(p, "[The Start of Question1]", "[The End of Question1]")
                    q2 = _between(p, "[The Start of Question2]", "[The End of Question2]")
                    out.append("Step by step... Yes." if q1 in q2 else "They differ. No.")
                else:  # the released code's extraction prompt around the judge's reply
                    out.append('{"check_result": "Yes"}' if "Yes." in p else '{"check_result": "No"}')
            return out

    judge = JudgeSimilarity(Judge())
    assert judge([("Q?", "Context. Q?"), ("Q?", "Another question?")]) == [1.0, 0.0]


def test_embedding_similarity_ignores_padding(tmp_path, tiny_long):
    tiny_long.model.save_pretrained(tmp_path)
    tiny_long.tokenizer.save_pretrained(tmp_path)
    similarity = EmbeddingSimilarity(str(tmp_path))
    texts = ["A dog can bark.", "Un chien peut aboyer et courir dans le jardin."]
    together = similarity.embed(texts)  # padded to the longer text
    alone = np.concatenate([similarity.embed([t]) for t in texts])
    np.testing.assert_allclose(together, alone, rtol=1e-4, atol=1e-5)
    a, b = alone
    assert similarity([(texts[0], texts[0]), (texts[0], texts[1])]) == pytest.approx(
        [1.0, float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))], abs=1e-5)
    with pytest.raises(BabelprobeError, match="cannot load the embedding model"):
        EmbeddingSimilarity(str(tmp_path / "missing"))


@pytest.mark.parametrize("output, ok", [
    ('{"text": "t", "choices": ["a", "b"], "answer": "a"}', True),
    ('```json\n{"text": "t", "choices": ["a", "b"], "answer": "a"}\n```', True),
    ('{"text": "t", "choices": ["a"], "answer": "a"}', False),  # another number of choices
    ("text: t", False),
])
def test_parse_translation(output, ok):
    assert (parse_translation(output, 2) is not None) == ok


def test_clean_removes_the_template_wrapping():
    assert clean("{Generated Distraction: <Think of cats.>}") == "Think of cats."
    assert clean('Generated Distraction: "Think of cats."\n\nMore.') == "Think of cats."


def test_invalid_settings():
    with pytest.raises(BabelprobeError, match="invalid search settings"):
        SearchSettings(depth=7, max_depth=6)
    with pytest.raises(BabelprobeError, match="unknown similarity"):
        SearchSettings(similarity="cosine")


def test_candidates_round_trip_through_the_evaluation_loader(tmp_path):
    models = [target_model(i) for i in range(1, 6)]
    result = beam_search(seeds(1), FakePerturber(), FakeTranslator(), models)
    (tmp_path / "Chinese.json").write_text(json.dumps(result.records(), ensure_ascii=False), encoding="utf-8")
    loaded = pf.load_pitfalls(tmp_path)
    assert len(loaded) == 3 and loaded["language"].eq("zh").all()


def test_direct_perturbation_baseline():
    models = [target_model(i) for i in range(1, 6)]
    rows = direct_perturbation(seeds(2), FakePerturber(), FakeTranslator(), models)
    assert rows["question"].tolist() == ["[D] Question 0?", "[D] Question 1?"]
    assert rows["transquestion"].tolist() == ["[T] [D] Question 0?", "[T] [D] Question 1?"]
    # no distraction names a wrong option: every model stays right in both languages, V = 1 − 1 = 0
    assert rows["value"].eq(0).all() and not rows["converted"].any()


def test_table1_no_perturbation_direct_perturbation_and_search_columns():
    from babelprobe.benchmarks.pitfalls.search import conversion_table, no_perturbation

    models = [target_model(i) for i in range(1, 6)]
    kept = seeds(2)
    plain = no_perturbation(kept, models)
    # the plain translation carries no distraction: every model right in the target language, V = 1 − 1 = 0
    assert plain["rate_trans"].eq(1).all() and plain["value"].eq(0).all() and not plain["converted"].any()
    direct = direct_perturbation(kept, FakePerturber(), FakeTranslator(), models)
    found = beam_search(kept, FakePerturber(), FakeTranslator(), models, SearchSettings(redundancy=1)).records()
    row = conversion_table("Chinese", len(kept), plain, direct, found)
    assert (row["np"], row["dp"]) == (0.0, 0.0)
    assert row["ours"] == len({r["seed_id"] for r in found}) / 2 and row["ours_converted"] == 2  # both seeds convert


def test_expanded_pairs_feed_the_affinity_matrix(tmp_path, tiny_long):
    models = [target_model(i) for i in range(1, 6)]
    found = beam_search(seeds(1), FakePerturber(), FakeTranslator(), models, SearchSettings(redundancy=1)).records()
    (tmp_path / "Chinese.json").write_text(json.dumps(found, ensure_ascii=False), encoding="utf-8")
    questions = pf.load_pitfalls(tmp_path)
    pairs, dropped = expand_pairs(questions, ["Chinese", "French"], FakeTranslator())
    assert dropped.empty and sorted(pairs["language"]) == ["fr", "zh"] and set(pairs["seed_language"]) == {"zh"}
    french = pairs[pairs["language"] == "fr"].iloc[0]
    own = questions.iloc[0]
    # the target-language portion translated: original question with choices and answer, then the context
    assert french["transori"] == "[T] " + own["transori"]
    assert french["transchoices"] == ["[T] " + c for c in own["transchoices"]]
    assert french["transanswer"] == "[T] " + own["transanswer"]
    parts = [own["transpre"], own["transori"], own["transsuf"]]
    assert french["transquestion"] == "".join("[T] " + p for p in parts if p)  # concatenated, as run.py does
    assert french["question"] == own["question"] and french["question_id"] == own["question_id"] + ">fr"
    rows = cross_evaluate([tiny_long], pairs)
    assert set(rows["language"]) == {"zh", "fr"} and set(rows["seed_language"]) == {"zh"}
    accuracy = pf.affinity_accuracy(rows)
    assert list(accuracy.columns) == ["zh"] and set(accuracy.index) == {"zh", "fr"}


def test_search_cli_writes_candidates_trace_and_dropped_seeds(tmp_path, monkeypatch, capsys, tiny_long_dir):
    from babelprobe.benchmarks.base import Models
    from babelprobe.cli import main

    source = tmp_path / "mmlu.json"
    source.write_text(json.dumps([{"question": "Which animal can bark?", "choices": ["dog", "cat", "fish"],
                                   "answer": "dog"}] * 2), encoding="utf-8")
    fakes = {"p": FakePerturber(), "t": FakeTranslator()}
    monkeypatch.setattr(Models, "generator", lambda self, spec: fakes[spec])
    out = tmp_path / "search"
    code = main(["bench", "pitfalls-search", "--model", str(tiny_long_dir), "--data", str(source), "--langs", "Chinese",
                 "--perturber", "p", "--translator", "t", "--out", str(out), "--no-progress", "--depth", "1",
                 "--max-depth", "1", "--perturb-temperature", "0.5", "--seed", "3", "--translation", "paper",
                 "--baselines"])
    assert code == 0
    table1 = pd.read_csv(out / "table1.csv")
    assert table1.columns[:5].tolist() == ["language", "seeds", "np", "dp", "ours"] and table1["language"].tolist() == [
        "Chinese"]
    assert isinstance(json.loads((out / "Chinese.json").read_text(encoding="utf-8")), list)
    assert (out / "seeds-dropped-Chinese.csv").exists() and (out / "run.json").exists()
    assert json.loads((out / "run.json").read_text())["settings"]["perturb_temperature"] == 0.5
    assert "seed questions kept (answered right in English by the simulation models and translated" in (
        capsys.readouterr().out)
    assert main(["bench", "pitfalls-search", "--model", str(tiny_long_dir), "--data", str(source),
                 "--out", str(out), "--no-progress"]) == 2  # no --langs
