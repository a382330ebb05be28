"""Cross-Lingual Pitfalls: the formulas on hand-made numbers (V, the Relative Affinity Score of §3.3 on a
hand-computed 3×3 example), the App. E templates against the paper text, the loader on every released
file in ../shared/data and on hand-written fixtures of the release's broken records, prompts, scoring
against a plain forward pass, the paper's answering protocol with a fake generator, the summary and
the CLI on the bundled sample."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from babelprobe.benchmarks import pitfalls as pf
from babelprobe.benchmarks.base import Models
from babelprobe.cli import main
from babelprobe.errors import BabelprobeError

SHARED = Path(__file__).resolve().parents[2] / "shared"
DATA = SHARED / "data" / "cross_lingual_pitfalls"
PAPER = SHARED / "papers" / "000_717ecdc8b2f19799.txt"


def _question(en_q, en_choices, answer, fr_q, fr_choices, category="General Knowledge"):
    """A bilingual record in the released format; the perturbed versions add one sentence of context."""
    k = en_choices.index(answer)
    return {"oriquestion": en_q, "question": "Many people like trivia. " + en_q, "choices": en_choices,
            "answer": answer, "transori": fr_q, "transquestion": "Beaucoup aiment les quiz. " + fr_q,
            "transchoices": fr_choices, "transanswer": fr_choices[k], "category": category, "source": "handmade",
            "prequestion": "Many people like trivia.", "sufquestion": "", "transpre": "Beaucoup aiment les quiz.",
            "transsuf": "", "value": 1.0, "rate_ori": 1.0, "rate_trans": 0.0}


FRENCH = [
    _question("Which animal can bark?", ["dog", "cat", "fish"], "dog",
              "Quel animal peut aboyer ?", ["chien", "chat", "poisson"]),
    _question("What colour is snow?", ["green", "white", "red", "blue"], "white",
              "De quelle couleur est la neige ?", ["vert", "blanc", "rouge", "bleu"], "Science & Technology"),
    _question("How many legs does a chair usually have?", ["four", "two", "ten"], "four",
              "Combien de pieds a une chaise en général ?", ["quatre", "deux", "dix"]),
]
CHINESE = [
    {**_question("Which animal can bark?", ["dog", "cat", "fish"], "dog", "", ["", "", ""]),
     "transori": "哪种动物会叫？", "transquestion": "很多人喜欢问答。哪种动物会叫？", "transpre": "很多人喜欢问答。",
     "transchoices": ["狗", "猫", "鱼"], "transanswer": "狗"},
    {**_question("What colour is snow?", ["green", "white", "red"], "white", "", ["", "", ""]),
     "transori": "雪是什么颜色？", "transquestion": "很多人喜欢问答。雪是什么颜色？", "transpre": "很多人喜欢问答。",
     "transchoices": ["绿色", "白色", "红色"], "transanswer": "白色"},
]


def _write(path: Path, records) -> Path:
    path.write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.fixture
def data_dir(tmp_path):
    _write(tmp_path / "French.json", FRENCH)
    _write(tmp_path / "Chinese.json", CHINESE)
    (tmp_path / "French_results.json").write_text(json.dumps(
        {"English": {"model-a": 3, "model-b": 2}, "French": {"model-a": 1, "model-b": 0}, "Total Questions": 3}))
    return tmp_path


# --------------------------------------------------------------------------------------------- formulas

def test_simulation_score_on_hand_made_numbers():
    assert pf.simulation_score(1.0, 0.0) == 1.0
    assert pf.simulation_score(1.0, 1.0) == 0.0
    assert pf.simulation_score(0.9, 0.2) == pytest.approx(0.81 - 0.2)  # γ = 2 punishes English mistakes
    assert pf.simulation_score(0.9, 0.2, gamma=1) == pytest.approx(0.7)
    np.testing.assert_allclose(pf.simulation_score([1.0, 0.5], [0.4, 0.0]), [0.6, 0.25])


def test_question_scores_average_the_simulation_models():
    # three models on one question: right in English 3/3 and 2/3 in the two versions, in French 1/3 and 0/3
    correct = {"a": (True, True, True, False), "b": (True, True, False, False), "c": (True, False, False, False)}
    rows = pd.DataFrame([{"model": m, "target": "fr", "target_name": "French", "pair_id": "q0", "subset": "x",
                          "version": version, "side": side, "correct": c[k]}
                         for m, c in correct.items()
                         for k, (version, side) in enumerate([("original", "en"), ("perturbed", "en"),
                                                              ("original", "target"), ("perturbed", "target")])])
    scores = pf.question_scores(rows).set_index("version")
    assert scores.at["original", "models"] == 3
    assert scores.at["original", "value"] == pytest.approx(1.0 - 1 / 3)  # 1² − 1/3
    assert scores.at["perturbed", "value"] == pytest.approx((2 / 3) ** 2 - 0)


def test_summary_on_hand_made_rows():
    en = [True, True, True, False]
    target = [False, True, False, False]
    rows = pd.DataFrame([{"target": "fr", "target_name": "French", "pair_id": f"q{i}", "subset": "cat" if i < 2 else "dog",
                          "version": "perturbed", "side": side, "correct": value}
                         for i in range(4) for side, value in (("en", en[i]), ("target", target[i]))])
    summary = pf.pitfalls_summary(rows)
    overall = summary[summary["subset"] == "all"].iloc[0]
    assert (overall["n"], overall["en_accuracy"], overall["target_accuracy"]) == (4, 0.75, 0.25)
    assert overall["drop"] == pytest.approx(0.5)
    assert overall["en_only"] == pytest.approx(0.5)  # questions 0 and 2: right in English only
    assert overall["drop_ci_low"] <= 0.5 <= overall["drop_ci_high"]
    by_category = summary[summary["subset"] == "cat"].iloc[0]
    assert (by_category["en_accuracy"], by_category["target_accuracy"]) == (1.0, 0.5)


# A[x, y]: accuracy on language x (rows) of the expanded pairs from seed language y (columns)
ACCURACY = pd.DataFrame([[0.2, 0.3, 0.7],
                         [0.4, 0.1, 0.8],
                         [0.9, 0.6, 0.3]], index=["zh", "ja", "fr"], columns=["zh", "ja", "fr"])


def test_relative_affinity_on_a_hand_computed_3x3_example():
    # §3.3: D[x, y] = ((A[x, y] − Ā_x) / Ā_x) · exp(c · |Ā_y − Ā_x|), c = −1 (App. B.1), Ā_x = row mean
    mean = {"zh": (0.2 + 0.3 + 0.7) / 3, "ja": (0.4 + 0.1 + 0.8) / 3, "fr": (0.9 + 0.6 + 0.3) / 3}
    assert mean == pytest.approx({"zh": 0.4, "ja": 1.3 / 3, "fr": 0.6})
    d = pf.relative_affinity(ACCURACY)
    assert d.at["zh", "ja"] == pytest.approx((0.3 - 0.4) / 0.4 * math.exp(-abs(1.3 / 3 - 0.4)))  # −0.2418
    assert d.at["ja", "zh"] == pytest.approx((0.4 - 1.3 / 3) / (1.3 / 3) * math.exp(-abs(0.4 - 1.3 / 3)))
    assert d.at["fr", "fr"] == pytest.approx((0.3 - 0.6) / 0.6)  # the diagonal too: exp(0) = 1, −0.5
    assert d.at["zh", "fr"] == pytest.approx(0.75 * math.exp(-0.2))
    for x in ACCURACY.index:  # every cell, written out from the formula
        for y in ACCURACY.columns:
            expected = (ACCURACY.at[x, y] - mean[x]) / mean[x] * math.exp(-1.0 * abs(mean[y] - mean[x]))
            assert d.at[x, y] == pytest.approx(expected)
    assert d.at["ja", "ja"] < d.at["ja", "fr"]  # lower: stronger affinity (ja fails its own seed pairs most)
    # c scales the distance term: c = 0 leaves the relative deviation
    assert pf.relative_affinity(ACCURACY, c=0).at["zh", "ja"] == pytest.approx(-0.25)
    with pytest.raises(BabelprobeError, match="same languages"):
        pf.relative_affinity(ACCURACY.drop(columns="ja"))


def test_affinity_accuracy_averages_over_models():
    # model a: zh questions from seed ja 1/2 right; model b: 2/2 right -> A[zh, ja] = (0.5 + 1.0) / 2
    rows = pd.DataFrame([{"model": m, "language": "zh", "seed_language": "ja", "correct": c}
                         for m, cs in (("a", (True, False)), ("b", (True, True))) for c in cs]
                        + [{"model": m, "language": "en", "seed_language": "ja", "correct": False} for m in "ab"])
    accuracy = pf.affinity_accuracy(rows)
    assert accuracy.at["zh", "ja"] == pytest.approx(0.75) and "en" not in accuracy.index
    with pytest.raises(BabelprobeError, match="seed_language"):
        pf.affinity_accuracy(rows.drop(columns="seed_language"))


def test_affinity_heatmap_is_drawn_as_figure_7(tmp_path, monkeypatch):
    from babelprobe.analysis import benchmarks as figures

    shown = {}
    original = figures.save
    monkeypatch.setattr(figures, "save", lambda fig, path: shown.update(ax=fig.axes[0]) or original(fig, path))
    written = figures.plot_affinity(pf.relative_affinity(ACCURACY), tmp_path / "ras")
    assert [p.suffix for p in written] == [".pdf", ".png"] and all(p.stat().st_size > 0 for p in written)
    ax = shown["ax"]
    # vertical axis: the source (seed) language y; horizontal: the target language x; cell (y, x) = D[x, y]
    assert "source" in ax.get_ylabel() and "target" in ax.get_xlabel()
    image = ax.images[0].get_array()
    d = pf.relative_affinity(ACCURACY)
    assert image[0, 1] == pytest.approx(d.at["ja", "zh"]) and image[1, 0] == pytest.approx(d.at["zh", "ja"])
    assert ax.images[0].get_cmap().name == "viridis"  # low (strong affinity) is dark


# ---------------------------------------------------------------------------------- App. E templates

def _paper_templates() -> dict[str, str]:
    """Title -> whitespace-normalised text of every App. E template in the paper text."""
    text = PAPER.read_text(encoding="utf-8")
    blocks = re.split(r"\\faBook\[solid\] Template for ", text[text.index("Appendix E Prompt Template"):])[1:]
    out = {}
    for block in blocks:
        title, _, body = block.partition(" [Instruction]")
        out[title.rstrip(".")] = " ".join(("[Instruction]" + body).split())
    return out


def test_bundled_templates_are_the_papers_appendix_e():
    if not PAPER.exists():
        pytest.skip("../shared/papers is absent")
    paper = _paper_templates()
    table = pf.load_templates().reset_index()
    ours = table[table["origin"].str.startswith("paper App. E")]
    assert len(ours) == len(paper) == 11  # every App. E template is bundled
    for row in ours.to_dict("records"):
        title = row["origin"].removeprefix("paper App. E: Template for ")
        rendered = row["template"].replace("{{", "{").replace("}}", "}")  # literal braces are doubled in the file
        assert " ".join(rendered.split()) == paper[title], title
    # the App. E answering and translation templates are chosen by the question's language
    assert pf.template_for(pf.load_templates(), "answer", "fr")[0].startswith("[Instruction]\nVeuillez lire")
    assert pf.template_for(pf.load_templates(), "answer", "de")[1] == "en"  # App. E has no German answering template
    assert pf.template_for(pf.load_templates(), "translate", "de")[0].startswith("[Instruction]\nSie sind")
    assert pf.template_for(pf.load_templates(), "translate", "zh")[1] == "*"


# ------------------------------------------------------------------------------------------------ data

def test_loader_on_hand_made_files(data_dir):
    (data_dir / "run.json").write_text("{}")  # not a language: ignored (a search's output directory has one)
    questions = pf.load_pitfalls(data_dir)
    assert list(pf.available_languages(data_dir)) == ["Chinese", "French"]
    assert sorted(set(questions["language"])) == ["fr", "zh"]
    french = pf.load_pitfalls(data_dir, ["fr"], limit=2)  # ISO code or name, any case
    assert french["question_id"].tolist() == ["French-0000", "French-0001"]
    assert french["answer_index"].tolist() == [0, 1] and french["language_name"].eq("French").all()
    assert pf.load_paper_results(data_dir, "French")["en_accuracy"].tolist() == [1.0, pytest.approx(2 / 3)]
    assert pf.load_paper_results(data_dir, "Chinese") is None


# Hand-written records that mimic the broken ones of the release (data/<Language>.json of
# github.com/xzx34/Cross-Lingual-Pitfalls), each named after the layout it copies.
QUOTED_CHOICES = {  # German.json records 189-191: transchoices wrapped in literal '...', transanswer not
    **FRENCH[0], "transchoices": ["'chien'", "'chat'", "'poisson'"], "transanswer": "chien"}
QUOTED_BOTH = {  # German.json records 167-172: choices and answer wrapped; English with a stray trailing '
    **FRENCH[1], "choices": ["green'", "white'", "red'", "blue'"], "answer": "white'",
    "transchoices": ["'vert'", "'blanc'", "'rouge'", "'bleu'"], "transanswer": "'blanc'"}
NO_TRANSLATION = {  # Amharic/Yoruba/Zulu... layout of the issue: "transanswer": "None", "transchoices": []
    **FRENCH[2], "transanswer": "None", "transchoices": []}
ANSWER_ELSEWHERE = {**FRENCH[2], "transanswer": "trois"}  # a transanswer that is no choice, quoted or not
NO_CATEGORY = {k: v for k, v in FRENCH[2].items() if k not in ("category", "source")}  # fields some files lack


def test_broken_release_records_are_normalised_or_skipped_and_counted(tmp_path, capsys):
    _write(tmp_path / "German.json", [NO_TRANSLATION, QUOTED_CHOICES, QUOTED_BOTH, ANSWER_ELSEWHERE, NO_CATEGORY,
                                      FRENCH[0]])
    questions = pf.load_pitfalls(tmp_path, limit=3)  # validated whole, then the first 3 scorable questions
    assert questions["question_id"].tolist() == ["German-0001", "German-0002", "German-0004"]
    quoted = questions.iloc[0]
    assert quoted["transchoices"] == ["chien", "chat", "poisson"] and quoted["transanswer_index"] == 0
    both = questions.iloc[1]  # quotes removed on both sides of the target; the English ' is not a wrapping
    assert both["transchoices"] == ["vert", "blanc", "rouge", "bleu"] and both["transanswer"] == "blanc"
    assert both["choices"] == ["green'", "white'", "red'", "blue'"] and both["answer_index"] == 1
    assert questions["normalised"].tolist() == [True, True, False]
    assert questions.iloc[2][["category", "source"]].tolist() == ["unknown", "unknown"]
    report = questions.attrs["load_report"].iloc[0]
    assert (report["records_read"], report["records_normalised"], report["records_skipped"]) == (6, 2, 2)
    assert questions["records_skipped"].eq(2).all()  # carried on every row: the summary needs only the rows
    skipped = questions.attrs["skipped"]
    assert skipped["record"].tolist() == [1, 4]
    assert "'transchoices' is empty (transanswer 'None')" in skipped["reason"].iloc[0]
    assert "not among its transchoices" in skipped["reason"].iloc[1]
    err = capsys.readouterr().err
    assert "German: 6 records, 2 with quotes normalised, 2 skipped" in err


def test_a_bad_file_never_stops_the_other_languages(data_dir, capsys):
    (data_dir / "Italian.json").write_text("[{", encoding="utf-8")
    _write(data_dir / "Korean.json", [NO_TRANSLATION])  # nothing scorable at all
    questions = pf.load_pitfalls(data_dir)
    assert set(questions["language_name"]) == {"Chinese", "French"}
    report = questions.attrs["load_report"].set_index("language_name")
    assert "Italian.json:1: malformed JSON" in report.at["Italian", "problem"]
    assert "none of its 1 records can be scored" in report.at["Korean", "problem"]
    assert "skipped Italian" in capsys.readouterr().err
    with pytest.raises(BabelprobeError, match="Italian.json:1: malformed JSON"):  # nothing left: one-line error
        pf.load_pitfalls(data_dir, ["Italian"])
    with pytest.raises(BabelprobeError, match="Broken.json:1: malformed JSON"):
        (data_dir / "Broken.json").write_text("[{", encoding="utf-8")
        pf.load_pitfalls(data_dir / "Broken.json")


def test_unknown_language_lists_the_available_ones(data_dir):
    with pytest.raises(BabelprobeError, match="no Cross-Lingual Pitfalls language 'Klingon'; available: Chinese, French"):
        pf.load_pitfalls(data_dir, ["French", "Klingon"])


def test_every_shared_release_file_loads():
    if not DATA.exists():
        pytest.skip("../shared/data/cross_lingual_pitfalls is absent")
    files = pf.available_languages(DATA)
    assert len(files) >= 6
    questions = pf.load_pitfalls(DATA, report=False)
    report = questions.attrs["load_report"].set_index("language_name")
    for name, path in files.items():
        records = json.loads(path.read_text(encoding="utf-8"))
        assert report.at[name, "records_read"] == len(records) and not report.at[name, "problem"]
        # every record is either loaded or skipped with a reason, never lost
        kept = questions[questions["language_name"] == name]
        assert len(kept) + report.at[name, "records_skipped"] == len(records)
        # quotes are normalised exactly where the release wraps every target choice in them
        wrapped = sum(all(len(c) > 1 and c[0] == c[-1] == "'" for c in r["transchoices"]) for r in records)
        assert report.at[name, "records_normalised"] == wrapped
        results = pf.load_paper_results(DATA, name)
        assert results is None or results["n"].iloc[0] == len(records)
    # every perturbed question contains its original, in both languages, and every answer is a choice
    assert all(o in q for o, q in zip(questions["oriquestion"], questions["question"], strict=True))
    assert all(o in q for o, q in zip(questions["transori"], questions["transquestion"], strict=True))
    assert all(a in c for a, c in zip(questions["transanswer"], questions["transchoices"], strict=True))
    if "German" in files:  # the shared German file has 9 quote-wrapped records (167-172, 189-191)
        assert report.at["German", "records_normalised"] == 9


def test_bundled_sample_loads():
    questions = pf.load_pitfalls("pitfalls-sample", report=False)
    assert set(questions["language_name"]) == {"French", "German", "Chinese"}
    assert (questions.groupby("language_name").size() >= 3).all() and not questions["normalised"].any()
    assert all(o in q for o, q in zip(questions["transori"], questions["transquestion"], strict=True))


# --------------------------------------------------------------------------------------------- prompts

def test_prompt_layout_and_option_separators(data_dir):
    prompts = pf.load_prompts()
    prompt, options = pf.format_prompt("Which animal can bark?", ["dog", "cat"], "en", prompts)
    assert prompt == (prompts.at["en", "instruction"] + "\nWhich animal can bark?\n- dog\n- cat\nAnswer:")
    assert options == [" dog", " cat"]
    prompt, options = pf.format_prompt("哪种动物会叫？", ["狗", "猫"], "zh", prompts)
    assert prompt.endswith("\n- 狗\n- 猫\n答案：") and options == ["狗", "猫"]  # no space before Chinese
    requests = pf.build_requests(pf.load_pitfalls(data_dir, ["French"], limit=1))
    assert list(zip(requests["side"], requests["version"], requests["language"], strict=True)) == [
        ("en", "original", "en"), ("en", "perturbed", "en"), ("target", "original", "fr"), ("target", "perturbed", "fr")]
    assert "Beaucoup aiment les quiz. Quel animal" in requests["prompt"][3]
    with pytest.raises(BabelprobeError, match="no Cross-Lingual Pitfalls prompt for language 'xx'"):
        pf.format_prompt("?", ["a", "b"], "xx", prompts)


# --------------------------------------------------------------------------------------------- scoring

def _reference_per_byte(lm, prompt: str, options: list[str]) -> list[float]:
    """Independent reference: a plain HF forward pass of prompt + option; the log-probs of the tokens
    after the prompt, summed and divided by the option's UTF-8 bytes."""
    bos = [lm.tokenizer.bos_token_id]
    prompt_ids = bos + lm.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    scores = []
    for option in options:
        ids = bos + lm.tokenizer(prompt + option, add_special_tokens=False)["input_ids"]
        assert ids[:len(prompt_ids)] == prompt_ids
        keep = len(ids) - len(prompt_ids) + 1  # logits of the last positions only: those predicting the option
        with torch.no_grad():
            logprobs = lm.model(torch.tensor([ids]), logits_to_keep=keep).logits[0].double().log_softmax(-1)
        total = sum(float(logprobs[p - len(prompt_ids), ids[p]]) for p in range(len(prompt_ids), len(ids)))
        scores.append(total / len(option.encode("utf-8")))
    return scores


def test_scores_match_a_plain_forward_pass(data_dir, tiny_long):
    questions = pf.load_pitfalls(data_dir)
    rows = pf.score_pitfalls(tiny_long, questions, progress=False)
    requests = pf.build_requests(questions)
    assert len(rows) == 4 * len(questions)
    for row, request in zip(rows.to_dict("records"), requests.to_dict("records"), strict=True):
        expected = _reference_per_byte(tiny_long, request["prompt"], request["options"])
        assert json.loads(row["scores"]) == pytest.approx(expected, abs=1e-4)
        assert row["predicted"] == int(np.argmax(expected))
        assert row["correct"] == (row["predicted"] == request["gold"])
    # the shared-prefix path and the plain core give the same rows
    plain = pf.score_pitfalls(tiny_long, questions, progress=False, share_prefix=False)
    pd.testing.assert_series_equal(plain["predicted"], rows["predicted"])


# ------------------------------------------------------------------------------------ paper protocol

class FakeChat:
    """A generator for the paper protocol: answers 'I pick <first choice>' to an App. E answering prompt;
    as extractor, returns the template's JSON with the pick it finds in the model's answer."""

    name = "fake-chat"

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, max_new_tokens=64, stop=None, temperature=0.0, seed=0):
        self.prompts += prompts
        out = []
        for p in prompts:
            if "select the model" in p and "final answer from the choices" in p:  # App. E's or the release's
                pick = re.search(r"I pick (.*)\n", p).group(1)
                out.append('{"final_answer": "' + pick + '"}' if pick != "nothing" else "I cannot tell.")
            else:
                choices = re.search(r"\n(\[['\"].*\])\n", p).group(1)  # the choices, printed as a Python list
                first = re.match(r"\[(['\"])(.*?)\1", choices).group(2)
                out.append(f"Let me think step by step. I pick {first}\nDone.")
        return out


def test_paper_protocol_answers_with_the_app_e_templates(data_dir):
    questions = pf.load_pitfalls(data_dir, ["French"], limit=2)
    chat = FakeChat()
    rows = pf.answer_cot(questions, chat, progress=False)
    assert len(rows) == 8 and rows["method"].eq("cot-extract").all()
    templates = pf.load_templates()
    english = templates.at[("answer", "en"), "template"]
    first = english.format(question=questions["oriquestion"].iloc[0], choices="['dog', 'cat', 'fish']")
    assert chat.prompts[0] == first  # App. E, the choices as the released code prints a list
    french = [p for p in chat.prompts if p.startswith("[Instruction]\nVeuillez lire")]
    assert len(french) == 4  # the French questions get App. E's French template
    assert rows["template_language"].tolist() == ["en", "en", "fr", "fr"] * 2
    assert rows["predicted"].eq(0).all() and (rows["correct"] == rows["gold"].eq(0)).all()
    assert rows["extracted"].iloc[0] == "dog" and rows["response"].iloc[0].startswith("Let me think")


@pytest.mark.parametrize("output, index", [
    ('{"final_answer": "cat"}', 1),
    ('```json\n{"final_answer": "cat"}\n```', 1),
    ('{"final_answer": cat}', 1),  # the template's own unquoted form
    ("{\"final_answer\": \"'cat'\"}", 1),  # quotes around a choice
    ('{"final_answer": "Cat"}', -1),  # not exactly a choice: wrong, as in the released code
    ("no idea", -1),
])
def test_parse_choice(output, index):
    assert pf.parse_choice(output, ["dog", "cat", "fish"])[0] == index


# ------------------------------------------------------------------------------------------------- CLI

def test_cli_resumes_an_interrupted_run_and_refuses_other_settings(data_dir, tmp_path, tiny_long_dir, monkeypatch,
                                                                   capsys):
    out = tmp_path / "clp"
    base = ["bench", "pitfalls", "--model", str(tiny_long_dir), "--items", str(data_dir), "--out", str(out),
            "--no-progress", "--languages", "French,Chinese"]
    from babelprobe.benchmarks.pitfalls import answers  # where the run looks them up

    monkeypatch.setattr(answers, "CHUNK_QUESTIONS", 1)  # a checkpoint after every question
    scored, original = [], pf.score_pitfalls

    def interrupted(lm, q, **kw):
        if len(scored) == 2:
            raise KeyboardInterrupt
        scored.append(list(q["question_id"]))
        return original(lm, q, **kw)

    monkeypatch.setattr(answers, "score_pitfalls", interrupted)
    assert main(base) == 130  # Ctrl-C after two questions
    assert not (out / "items.csv").exists()
    monkeypatch.setattr(answers, "score_pitfalls", lambda lm, q, **kw: scored.append(list(q["question_id"])) or original(lm, q, **kw))
    assert main(base) == 0  # the same command resumes: the two finished questions are not scored again
    assert scored == [["French-0000"], ["French-0001"], ["French-0002"], ["Chinese-0000"], ["Chinese-0001"]]
    rows = pd.read_csv(out / "items.csv")
    assert len(rows) == 4 * 5 and {"pair_id", "language", "language_name", "subset", "method", "correct"} <= set(rows.columns)
    assert set(rows["language"]) == {"en", "fr", "zh"} and set(rows["protocol"]) == {"default"}
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["target_name"]) == {"French", "Chinese"} and "all" in set(summary["subset"])
    assert set(summary["metric"]) == {"en_accuracy", "target_accuracy", "drop", "en_only", *pf.COUNTS}
    assert set(summary["method"]) == {"likelihood"}
    for name in ("pitfalls.pdf", "pitfalls.png", "run.json", "load-report.csv"):
        assert (out / name).stat().st_size > 0
    printed = capsys.readouterr().out
    assert "drop" in printed and "records read" in printed and "answered by: likelihood" in printed

    monkeypatch.setattr(pf, "score_pitfalls", original)
    assert main(base + ["--reduction", "sum"]) == 2  # another setting: refused
    assert "reduction" in capsys.readouterr().err


def test_cli_counts_normalised_and_skipped_records(tmp_path, tiny_long_dir, capsys):
    data = tmp_path / "data"
    data.mkdir()
    _write(data / "German.json", [NO_TRANSLATION, QUOTED_CHOICES, FRENCH[1]])
    out = tmp_path / "o"
    code = main(["bench", "pitfalls", "--model", str(tiny_long_dir), "--items", str(data), "--out", str(out),
                 "--no-progress", "--limit", "1"])
    captured = capsys.readouterr()
    assert code == 0
    assert re.search(r"German\s+3\s+1\s+1", captured.out)  # read, normalised, skipped: in the printed summary
    assert "German: 3 records, 1 with quotes normalised, 1 skipped" in captured.err
    summary = pd.read_csv(out / "summary.csv").set_index("metric")
    assert summary.at["records_skipped", "value"] == 1 and summary.at["records_normalised", "value"] == 1
    report = pd.read_csv(out / "load-report.csv")
    assert report.loc[report["kind"] == "skipped", "record"].tolist() == [1]


def test_cli_paper_protocol_on_the_bundled_sample(tmp_path, tiny_long_dir, monkeypatch, capsys):
    chat = FakeChat()
    monkeypatch.setattr(Models, "generator", lambda self, spec: chat)  # stands in for --generator local
    out = tmp_path / "paper"
    code = main(["bench", "pitfalls", "--model", str(tiny_long_dir), "--items", "pitfalls-sample", "--protocol",
                 "paper", "--generator", "local", "--extractor", "self", "--out", str(out), "--no-progress",
                 "--limit", "2"])
    assert code == 0
    rows = pd.read_csv(out / "items.csv")
    assert len(rows) == 3 * 2 * 4 and set(rows["method"]) == {"simulate-extract"} and set(rows["protocol"]) == {"paper"}
    assert set(rows["extractor"]) == {"fake-chat"}  # no --extractor: the answering model extracts, recorded per row
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["protocol"]) == {"paper"} and set(summary["method"]) == {"simulate-extract"}
    run = json.loads((out / "run.json").read_text())
    assert (run["protocol"], run["answer"], run["max_new_tokens"], run["chat_template"]) == (
        "paper", "generate", 1024, "auto")
    assert "protocol paper" in capsys.readouterr().out
    assert (out / "generations.jsonl").exists()


def test_the_figure_labels_a_model_at_a_long_path_by_its_name(tmp_path, tiny_long_dir, monkeypatch):
    """A model in a deeply nested local directory: its bars are labelled by the directory's name, cut to
    MODEL_LABEL_CHARS, and the figure is laid out without matplotlib's warning (the full path, rotated under the
    bars, left the panel no height: "constrained_layout not applied because axes sizes collapsed to zero")."""
    import warnings

    from babelprobe.analysis.benchmarks import MODEL_LABEL_CHARS, model_label

    assert model_label("/scratch/someone/models/Llama-3.1-8B/") == "Llama-3.1-8B"
    assert model_label("meta-llama/Llama-3.1-8B (sha 1234)") == "Llama-3.1-8B"
    long = model_label("x" * 40)
    assert len(long) == MODEL_LABEL_CHARS and long.endswith("…")
    deep = tmp_path.joinpath(*[f"a-directory-of-some-length-{k}" for k in range(6)], "the-tiny-long-model")
    deep.parent.mkdir(parents=True)
    deep.symlink_to(tiny_long_dir, target_is_directory=True)
    monkeypatch.setattr(Models, "generator", lambda self, spec: FakeChat())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert main(["bench", "pitfalls", "--model", str(deep), "--items", "pitfalls-sample", "--protocol", "paper",
                     "--generator", "local", "--extractor", "self", "--out", str(tmp_path / "o"), "--no-progress",
                     "--limit", "2"]) == 0
    assert (tmp_path / "o" / "pitfalls.png").exists()


def test_cli_unknown_language_is_one_line(data_dir, tmp_path, tiny_long_dir, capsys):
    code = main(["bench", "pitfalls", "--model", str(tiny_long_dir), "--items", str(data_dir), "--languages", "Elvish",
                 "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "available: Chinese, French" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_default_model_on_shared_questions(default_lm):
    if not DATA.exists():
        pytest.skip("../shared/data/cross_lingual_pitfalls is absent")
    questions = pf.load_pitfalls(DATA, ["Chinese"], limit=1)
    rows = pf.score_pitfalls(default_lm, questions, progress=False)
    requests = pf.build_requests(questions)
    k = 2  # the Chinese original question: checked against a plain forward pass
    expected = _reference_per_byte(default_lm, requests["prompt"][k], requests["options"][k])
    assert json.loads(rows["scores"][k]) == pytest.approx(expected, abs=1e-3)
    assert len(rows) == 4 and rows["correct"].dtype == bool
