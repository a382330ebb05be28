"""StingrayBench: metrics and the paper's aggregates against hand sums, the loader (bundled sample, hub-config
files, the hub repository's raw CSVs, records that cannot be scored), the prompts against the paper and the
released code, likelihood scoring against a plain forward pass (plain and chat format), generation with the
paper's post-processing, the CLI (default and paper protocol) and its outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import babelprobe as bp
from babelprobe.benchmarks import stingray as sr
from babelprobe.cli import main
from babelprobe.errors import BabelprobeError
from tests.tiny import tiny_lm

PAPER = Path(__file__).resolve().parents[2] / "shared" / "papers" / "004_7e40498803b4bb0f.txt"
GEMMA_LIKE_CHAT = ("{{ bos_token }}{% for m in messages %}<start_of_turn>"
                   "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] | trim }}<end_of_turn>\n"
                   "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def bias(x: float, y: float) -> float:
    """§3.3 by hand: the angle of (x, y) from 45°, scaled from [-π/4, π/4] to [-1, 1]."""
    return (math.atan2(y, x) - math.pi / 4) / (math.pi / 4)


def comprehension(x: float, y: float) -> float:
    """§3.3 by hand: the length of (x, y) over √2."""
    return math.sqrt(x * x + y * y) / math.sqrt(2)


def cell_rows(pair: str, subset: str, task: str, right_l1: list[bool], right_l2: list[bool]) -> pd.DataFrame:
    """Rows of one cell: one question per listed answer and side (usage: the same records on both sides)."""
    n = max(len(right_l1), len(right_l2))
    ids = [f"{pair}-{subset}-{task}-{i}" for i in range(n)]
    first = pd.DataFrame({"pair_id": ids[:len(right_l1)], "side": "L1", "correct": right_l1})
    second = pd.DataFrame({"pair_id": ids[:len(right_l2)] if task == "usage" else [f"{i}b" for i in ids[:len(right_l2)]],
                           "side": "L2", "correct": right_l2})
    return pd.concat([first, second]).assign(pair=pair, subset=subset, task=task, predicted="")


def value(summary: pd.DataFrame, metric: str, **where) -> float:
    mask = summary["metric"] == metric
    for key, wanted in where.items():
        mask &= summary[key] == wanted
    assert mask.sum() == 1, (metric, where)
    return float(summary.loc[mask, "value"].iloc[0])


# --------------------------------------------------------------------------------------------- metrics

def test_bias_and_comprehension_on_hand_checked_points():
    # (1, 0): right only in L1 -> the most L1-biased point; length 1 -> 1/√2
    assert sr.cognate_comprehension(1, 0) == pytest.approx(0.7071, abs=1e-4)
    assert sr.cognate_bias(1, 0) == pytest.approx(-1.0)
    assert sr.cognate_bias(0, 1) == pytest.approx(1.0)
    assert sr.cognate_comprehension(1, 1) == pytest.approx(1.0)
    for a in (0.1, 0.37, 0.5, 1.0):  # on the 45° line: no bias
        assert sr.cognate_bias(a, a) == pytest.approx(0.0, abs=1e-12)
        assert sr.cognate_comprehension(a, a) == pytest.approx(a)
    # 22.5° is halfway between the L1 axis and the diagonal: bias -0.5
    assert sr.cognate_bias(1.0, math.tan(math.pi / 8)) == pytest.approx(-0.5)
    assert np.isnan(sr.cognate_bias(0, 0))  # no direction at the origin


def test_summary_from_hand_made_rows():
    rows = cell_rows("en_de", "false_friend", "semantic", [True, True, True, False], [True, False, False, False])
    s = sr.stingray_summary(rows).set_index("task").loc["semantic"]
    assert (s["accuracy_l1"], s["accuracy_l2"], s["accuracy"], s["accuracy_n"]) == (0.75, 0.25, 0.5, 8)
    # atan(1/3) = 0.32175 rad; (0.32175 - π/4) / (π/4) = -0.59033; √(0.75² + 0.25²)/√2 = 0.55902
    assert s["bias"] == pytest.approx(-0.59033, abs=1e-5)
    assert s["comprehension"] == pytest.approx(0.55902, abs=1e-5)
    assert s["bias_low"] <= s["bias"] <= s["bias_high"]
    assert s["comprehension_low"] <= s["comprehension"] <= s["comprehension_high"]
    assert s["accuracy_l1_low"] < 0.75 < s["accuracy_l1_high"]


def test_true_cognates_semantic_answer_counts_for_each_sentence_it_names():
    # both sentences are appropriate (gold C): A names L1 only, B names L2 only, C names both
    rows = pd.DataFrame({"pair": "zh_ja", "subset": "true_cognate", "task": "semantic", "side": "both",
                         "pair_id": ["r1", "r2", "r3", "r4"], "predicted": ["C", "A", "A", "B"],
                         "correct": [True, False, False, False]})
    s = sr.stingray_summary(rows).set_index("task").loc["semantic"]
    assert s["accuracy"] == 0.25
    assert (s["accuracy_l1"], s["accuracy_l2"]) == (0.75, 0.5)  # L1: C, A, A; L2: C, B
    assert s["bias"] == pytest.approx(bias(0.75, 0.5)) and s["comprehension"] == pytest.approx(comprehension(0.75, 0.5))


def test_the_papers_aggregates_against_hand_sums():
    """Figs. 4-6 from two pairs × two tasks of false friends and one cell of true cognates."""
    counts = {("en_de", "semantic"): ([1, 1, 1, 0], [1, 0, 0, 0]), ("en_de", "usage"): ([1, 1, 0, 0], [1, 1, 1, 0]),
              ("id_ms", "semantic"): ([1, 0], [0, 0, 0, 1, 1]), ("id_ms", "usage"): ([1, 1, 1], [1, 1, 1])}
    rows = pd.concat([cell_rows(pair, "false_friend", task, [bool(v) for v in l1], [bool(v) for v in l2])
                      for (pair, task), (l1, l2) in counts.items()]
                     + [cell_rows("en_de", "true_cognate", "usage", [True] * 3, [True, False, True])])
    summary = sr.summarize(rows)
    point = {key: (sum(l1) / len(l1), sum(l2) / len(l2)) for key, (l1, l2) in counts.items()}
    assert point[("id_ms", "semantic")] == (0.5, 0.4)
    for pair in ("en_de", "id_ms"):  # Figs. 5 and 6: the mean over the two tasks, and |mean bias|
        sem, use = point[(pair, "semantic")], point[(pair, "usage")]
        assert value(summary, "comprehension", pair=pair, subset="false_friend", task="mean") == pytest.approx(
            (comprehension(*sem) + comprehension(*use)) / 2)
        assert value(summary, "bias", pair=pair, subset="false_friend", task="mean") == pytest.approx(
            (bias(*sem) + bias(*use)) / 2)
        assert value(summary, "abs_bias", pair=pair, subset="false_friend", task="mean") == pytest.approx(
            abs(bias(*sem) + bias(*use)) / 2)
    # Fig. 4: the mean point over the four pair × task cells, then its bias and comprehension
    x = (0.75 + 0.5 + 0.5 + 1.0) / 4
    y = (0.25 + 0.75 + 0.4 + 1.0) / 4
    where = {"pair": "all", "subset": "false_friend", "task": "all"}
    assert value(summary, "accuracy_l1", **where) == pytest.approx(x)
    assert value(summary, "accuracy_l2", **where) == pytest.approx(y)
    assert value(summary, "bias", **where) == pytest.approx(bias(x, y))
    assert value(summary, "comprehension", **where) == pytest.approx(comprehension(x, y))
    # a subset with one cell: its aggregates are that cell's numbers
    assert value(summary, "comprehension", pair="all", subset="true_cognate", task="all") == pytest.approx(
        comprehension(1, 2 / 3))
    assert value(summary, "abs_bias", pair="en_de", subset="true_cognate", task="mean") == pytest.approx(
        abs(bias(1, 2 / 3)))
    assert value(summary, "comprehension", **where) == pytest.approx(
        sr.wide(summary).set_index(["pair", "subset", "task"]).loc[("all", "false_friend", "all"), "comprehension"])
    aggregates = summary[summary["task"].isin(["mean", "all"])]
    assert (aggregates["ci_low"] <= aggregates["value"] + 1e-12).all()
    assert (aggregates["value"] <= aggregates["ci_high"] + 1e-12).all()
    assert (summary.loc[summary["task"] == "mean", "n"] > 0).all()


# ------------------------------------------------------------------------------------- post-processing

@pytest.mark.parametrize("response, label", [
    ("A", "A"), (" B.", "B"), ("C.Both.", "C"), ("(A)", "A"), ("Answer: B", "B"), ("A and B", "C"),
    ("A, B", "C"), ("Both sentences", "C"), ("both", "C"), ("\nA.For her", "A"), ("I think", None), ("", None),
])
def test_semantic_answers_are_read_as_the_paper_says(response, label):
    assert sr.parse_answer(response, "semantic") == label


@pytest.mark.parametrize("response, label", [
    ("Yes", "Yes"), ("no.", "No"), ("No, the usage", "No"), (" YES", "Yes"), ("The usage is correct", "Yes"),
    ("incorrect", "No"), ("not correct", "No"), ("Maybe", None), ("Nothing", None),
])
def test_usage_answers(response, label):
    assert sr.parse_answer(response, "usage") == label


# ------------------------------------------------------------------------------------------------ data

def test_bundled_sample_has_both_kinds_for_two_pairs():
    records = sr.load_stingray("stingray-sample")
    counts = records.groupby(["pair", "subset"]).size()
    assert set(records["pair"]) == {"en_de", "zh_ja"}
    assert (counts >= 10).all() and len(counts) == 4
    assert records.attrs["skipped"] == [] and sum(records.attrs["read"].values()) == len(records)
    ff = records[records["subset"] == "false_friend"]
    # a false friend fits exactly one sentence, and the semantic answer names that one
    assert ((ff["usage_l1"] == "Yes") != (ff["usage_l2"] == "Yes")).all()
    assert ((ff["semantic_answer"] == "A") == (ff["usage_l1"] == "Yes")).all()
    assert set(ff.groupby("pair")["semantic_answer"].nunique()) == {2}  # both directions occur
    tc = records[records["subset"] == "true_cognate"]
    assert (tc["semantic_answer"] == "C").all() and (tc[["usage_l1", "usage_l2"]] == "Yes").all().all()
    assert tc["word"].str.contains(",").all() and (tc["word_l1"] != "").all() and (tc["word_l2"] != "").all()
    assert sr.load_stingray("stingray-sample", pairs=["zh-ja"], limit=3).groupby("subset").size().tolist() == [3, 3]


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


GOOD = {"word": "Gift", "lang1_sentence": "A gift for you.", "lang2_sentence": "Ein Gift für dich.",
        "semantic_appropriate_label": 0, "usage_correctness_lang1_answer": "Yes",
        "usage_correctness_lang2_answer": "No"}


def test_hub_config_files_csv_and_answer_field(tmp_path):
    """The hub configs' fields (src/likelihood_eval.py reads them), as exported files named after the config."""
    _write_jsonl(tmp_path / "en_de.jsonl", [GOOD])
    pd.DataFrame([{"word": "学生, 学生", "lang1_sentence": "他是学生。", "lang2_sentence": "彼は学生だ。",
                   "semantic_appropriate_answer": "Both", "usage_correctness_lang1_answer": "yes",
                   "usage_correctness_lang2_answer": "YES"}]).to_csv(tmp_path / "zh_ja_common.csv", index=False)
    records = sr.load_stingray(tmp_path)
    en, zh = records.iloc[0], records.iloc[1]
    assert (en["pair"], en["l1"], en["l2"], en["subset"], en["semantic_answer"]) == ("en_de", "en", "de", "false_friend", "A")
    assert (zh["subset"], zh["word_l1"], zh["word_l2"], zh["semantic_answer"], zh["usage_l2"]) == \
        ("true_cognate", "学生", "学生", "C", "Yes")


@pytest.mark.parametrize("change, reason", [
    ({"lang2_sentence": None}, "missing field 'lang2_sentence'"),
    ({"usage_correctness_lang1_answer": "maybe"}, "usage_correctness_lang1_answer' is 'maybe'"),
    ({"semantic_appropriate_label": 2}, "false friend has exactly one sentence appropriate"),
    ({"semantic_appropriate_label": 7}, "semantic_appropriate_label' is 7"),
])
def test_records_that_cannot_be_scored_are_counted_reported_and_skipped(tmp_path, capsys, change, reason):
    record = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    _write_jsonl(tmp_path / "en_de.jsonl", [GOOD, record, GOOD])
    records = sr.load_stingray(tmp_path)
    assert len(records) == 2 and list(records["record_id"]) == ["en_de-001", "en_de-003"]
    (skipped,) = records.attrs["skipped"]
    assert skipped["source"].endswith("en_de.jsonl:2") and reason in skipped["reason"]
    err = capsys.readouterr().err
    assert "skipped 1 of 3 records" in err and "en_de.jsonl:2" in err and reason in err


def test_no_scorable_record_is_an_error(tmp_path):
    _write_jsonl(tmp_path / "en_de.jsonl", [{**GOOD, "usage_correctness_lang2_answer": "?"}])
    with pytest.raises(BabelprobeError, match=r"no StingrayBench record can be scored \(1 skipped; first: .*en_de"):
        sr.load_stingray(tmp_path, report=False)


def test_unknown_pair_and_unnamed_files(tmp_path):
    _write_jsonl(tmp_path / "en_de.jsonl", [GOOD])
    with pytest.raises(BabelprobeError, match="no language pair id_tl; available: en_de"):
        sr.load_stingray(tmp_path, pairs=["id_tl"])
    _write_jsonl(tmp_path / "words.jsonl", [GOOD])
    with pytest.raises(BabelprobeError, match="cannot tell the StingrayBench config"):
        sr.load_stingray(tmp_path)
    with pytest.raises(BabelprobeError, match="neither a bundled set"):
        sr.load_stingray(tmp_path / "nothing-here")


# -------------------------------------------------------------------------------- raw CSVs of the hub's data/

SEMANTIC = "Which sentence is more semantically appropriate? A. {L1} B. {L2} C. Both"
USAGE_L1 = "Is the usage of {Cognates} in this sentence correct? {L1}"
USAGE_L2 = "Is the usage of {Cognates} in this sentence correct? {L2}"


def raw_false_friends() -> pd.DataFrame:
    """Mimics data/en_de.csv of the hub repository StingrayBench/StingrayBench: one row per entry, a false
    friend's two entries one after the other (the L1 sense, then the L2 sense); `Cognates` may carry a
    gloss in parentheses; the label column holds L1/L2; two 'Is the usage ...' columns (here in the order
    L2, L1, to check that they are told apart by name). Our own sentences."""
    return pd.DataFrame([
        {"Cognates": "Gift (present)", "L1": "I wrapped a gift.", "L2": "Ich habe ein Gift verpackt.",
         "Meaning in L1": "present", "Meaning in L2": "poison", SEMANTIC: "L1", USAGE_L2: "No", USAGE_L1: "Yes"},
        {"Cognates": "Gift (poison)", "L1": "The snake's gift killed him.", "L2": "Das Gift der Schlange tötete ihn.",
         "Meaning in L1": "present", "Meaning in L2": "poison", SEMANTIC: "L2", USAGE_L2: "Yes", USAGE_L1: "No"},
        {"Cognates": "bald", "L1": "He went bald early.", "L2": "", "Meaning in L1": "hairless",
         "Meaning in L2": "soon", SEMANTIC: "L1", USAGE_L2: "No", USAGE_L1: "Yes"},  # no German sentence
        {"Cognates": "Rat", "L1": "I asked my lawyer for a rat.", "L2": "Ich bat meinen Anwalt um Rat.",
         "Meaning in L1": "rodent", "Meaning in L2": "advice", SEMANTIC: "L2", USAGE_L2: "Yes", USAGE_L1: "Maybe"},
        {"Cognates": "Handy", "L1": "My handy rang.", "L2": "Mein Handy klingelte.", "Meaning in L1": "useful",
         "Meaning in L2": "mobile phone", SEMANTIC: "L2", USAGE_L2: "Yes", USAGE_L1: "No"},
    ])


def raw_true_cognates() -> pd.DataFrame:
    """Mimics data/en_de_common_words.csv: the word of each language in `Cognates_L1`, `Cognates_L2`;
    meanings, sentences, the label column (Both) and the usage columns as in the false-friend file."""
    return pd.DataFrame([
        {"Cognates_L1": "arm", "Cognates_L2": "Arm", "L1": "She broke her arm.", "L2": "Sie brach sich den Arm.",
         "Meaning in L1": "arm", "Meaning in L2": "arm", SEMANTIC: "Both", USAGE_L1: "Yes", USAGE_L2: "Yes"},
        {"Cognates_L1": "hand", "Cognates_L2": "Hand", "L1": "He raised his hand.", "L2": "Er hob die Hand.",
         "Meaning in L1": "hand", "Meaning in L2": "hand", SEMANTIC: "L1", USAGE_L1: "Yes", USAGE_L2: "Yes"},
        {"Cognates_L1": "name", "Cognates_L2": "Name", "L1": "Write your name.", "L2": "Schreib deinen Namen.",
         "Meaning in L1": "name", "Meaning in L2": "name", SEMANTIC: "Both", USAGE_L1: "Yes", USAGE_L2: "Yes"},
    ])


def write_raw(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    raw_false_friends().to_csv(directory / "en_de.csv", index=False)
    raw_true_cognates().to_csv(directory / "en_de_common_words.csv", index=False)
    return directory


def test_raw_csvs_of_the_hub_repository_load_as_the_configs(tmp_path, capsys):
    records = sr.load_stingray(write_raw(tmp_path / "data"))
    ff = records[records["subset"] == "false_friend"].set_index("record_id")
    assert list(ff.index) == ["en_de-001", "en_de-002", "en_de-005"]
    gift = ff.loc["en_de-001"]
    assert (gift["word"], gift["lang1_sentence"], gift["semantic_answer"], gift["usage_l1"], gift["usage_l2"]) == \
        ("Gift", "I wrapped a gift.", "A", "Yes", "No")
    assert (gift["meaning_l1"], gift["meaning_l2"], gift["language_flag"]) == ("present", "poison", "L1")
    assert (ff.loc["en_de-002", "semantic_answer"], ff.loc["en_de-002", "usage_l1"]) == ("B", "No")
    tc = records[records["subset"] == "true_cognate"].set_index("record_id")
    assert list(tc.index) == ["en_de_common-001", "en_de_common-003"]
    assert (tc.loc["en_de_common-001", "word"], tc.loc["en_de_common-001", "word_l2"]) == ("arm, Arm", "Arm")
    reasons = {s["source"].rsplit("/", 1)[1]: s["reason"] for s in records.attrs["skipped"]}
    assert reasons == {"en_de.csv:4": "missing field 'L2' (lang2_sentence)",
                       "en_de.csv:5": f"'{USAGE_L1}' (usage_correctness_lang1_answer) is 'Maybe'; expected Yes or No",
                       "en_de_common_words.csv:3": f"'{SEMANTIC}' (semantic_appropriate_answer) is 'L1', but a true "
                                                   "cognate has both sentences appropriate"}
    err = capsys.readouterr().err
    assert "[en_de]: skipped 2 of 5 records" in err and "[en_de_common]: skipped 1 of 3 records" in err
    # a copy of the whole hub repository (README, loading script, data/) reads its data/ folder
    (tmp_path / "README.md").write_text("StingrayBench")
    assert len(sr.load_stingray(tmp_path, report=False)) == len(records)


def test_raw_true_cognates_without_usage_columns_are_right_in_both(tmp_path):
    raw_true_cognates().drop(columns=[USAGE_L1, USAGE_L2, SEMANTIC]).to_csv(tmp_path / "zh_ja_common_words.csv",
                                                                          index=False)
    records = sr.load_stingray(tmp_path)
    assert len(records) == 3 and (records[["usage_l1", "usage_l2"]] == "Yes").all().all()
    assert (records["semantic_answer"] == "C").all()


def test_raw_layout_problems_with_the_whole_file_are_one_line_errors(tmp_path):
    raw_false_friends().drop(columns=["L2"]).to_csv(tmp_path / "en_de.csv", index=False)
    with pytest.raises(BabelprobeError, match="en_de.csv: missing column 'L2' of the raw StingrayBench layout"):
        sr.load_stingray(tmp_path)
    raw_false_friends().drop(columns=[USAGE_L2]).to_csv(tmp_path / "en_de.csv", index=False)
    with pytest.raises(BabelprobeError, match="one usage column"):
        sr.load_stingray(tmp_path)
    write_raw(tmp_path)
    raw_false_friends().to_csv(tmp_path / "en_de_false_friends.csv", index=False)
    with pytest.raises(BabelprobeError, match="config 'en_de' again"):
        sr.load_stingray(tmp_path)


# --------------------------------------------------------------------------------------------- prompts

# src/prompts.py of github.com/SamuelCahyawijaya/stingraybench (commit a8eae60), copied for this check
RELEASED = {
    "semantic": "Which sentence is more semantically appropriate? Please limit you answer to A, B, or C.\nA.[L1]\nB.[L2]"
                "\nC.Both.",
    "usage_l1": "Is the usage of [FF] in this sentence correct? Please limit your answer to Yes or No.\n[L1]",
    "usage_l2": "Is the usage of [FF] in this sentence correct? Please limit your answer to Yes or No.\n[L2]",
}


def test_prompts_are_the_released_codes():
    prompts = sr.load_prompts()
    for task, released in RELEASED.items():
        template = prompts[task]["template"]
        for name, marker in (("lang1_sentence", "[L1]"), ("lang2_sentence", "[L2]"), ("word_l1", "[FF]"),
                             ("word_l2", "[FF]")):
            template = template.replace("{" + name + "}", marker)
        assert template == released
        assert prompts[task]["answer"] == "\nAnswer:"  # src/likelihood_eval.py: prompt + "\nAnswer: " + label
    assert prompts["semantic"]["options"] == [" A", " B", " C"]
    assert prompts["usage_l1"]["options"] == prompts["usage_l2"]["options"] == [" Yes", " No"]


@pytest.mark.skipif(not PAPER.exists(), reason="../shared/papers is not available")
def test_prompts_ask_the_papers_questions():
    paper = " ".join(PAPER.read_text(encoding="utf-8").split())
    prompts = sr.load_prompts()
    semantic = "Which sentence is more semantically appropriate?"  # §3.2 (and App. B.5)
    usage = "Is the usage of [WORD] in this sentence correct?"    # §3.2
    assert f"prompt the model with: {semantic}" in paper and f"prompting the models with: {usage}" in paper
    assert prompts["semantic"]["template"].startswith(semantic)
    for key in ("usage_l1", "usage_l2"):
        word = "{word_l1}" if key == "usage_l1" else "{word_l2}"
        assert prompts[key]["template"].replace(word, "[WORD]").startswith(usage)
    # §4.3: the generation prompts ask to limit the answer to "A, B or C" / "Yes or No"
    assert "limit their answers to “A, B or C” or “Yes or No”" in paper
    assert "limit you answer to A, B, or C." in prompts["semantic"]["template"]  # the released wording
    assert "limit your answer to Yes or No." in prompts["usage_l1"]["template"]


def test_prompts_fill_the_records_fields():
    record = sr.load_stingray("stingray-sample", pairs=["en_de"], limit=1)
    requests = sr.build_requests(record)
    first = record.iloc[0]
    semantic = requests[requests["task"] == "semantic"].iloc[0]
    assert semantic["prompt"] == ("Which sentence is more semantically appropriate? Please limit you answer to A, B, "
                                  f"or C.\nA.{first['lang1_sentence']}\nB.{first['lang2_sentence']}\nC.Both.\nAnswer:")
    assert semantic["question"] + "\nAnswer:" == semantic["prompt"] and semantic["options"] == [" A", " B", " C"]
    usage = requests[(requests["task"] == "usage") & (requests["side"] == "L2")].iloc[0]
    assert usage["prompt"] == (f"Is the usage of {first['word']} in this sentence correct? Please limit your answer "
                               f"to Yes or No.\n{first['lang2_sentence']}\nAnswer:")
    assert usage["language"] == "de" and usage["options"][usage["gold"]] == (" Yes" if first["usage_l2"] == "Yes" else " No")


def test_a_prompt_file_without_the_sentence_is_refused(tmp_path):
    path = tmp_path / "mine.tsv"
    path.write_text("task\ttemplate\toptions\nsemantic\tWhich? {lang1_sentence} {lang2_sentence}\t A| B| C\n"
                    "usage_l1\tUsage of {word_l1}? {lang1_sentence}\t Yes| No\nusage_l2\tUsage of {word_l2}?\t Yes| No\n")
    with pytest.raises(BabelprobeError, match=r"mine.tsv:4: the template must contain \{lang2_sentence\}"):
        sr.load_prompts(path)


# --------------------------------------------------------------------------------------------- scoring

def _reference_scores(lm, prompt: str, options: list[str]) -> list[float]:
    """Independent reference: one plain HF forward pass per prompt+option, summing the log-probs of the
    tokens that lie after the prompt (the prompt's own tokenisation is a prefix here)."""
    scores = []
    bos = [lm.tokenizer.bos_token_id]
    for option in options:
        prompt_ids = bos + lm.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        ids = bos + lm.tokenizer(prompt + option, add_special_tokens=False)["input_ids"]
        assert ids[:len(prompt_ids)] == prompt_ids
        keep = len(ids) - len(prompt_ids) + 1  # logits of the last positions only: those predicting the option
        with torch.no_grad():
            logits = lm.model(torch.tensor([ids]), logits_to_keep=keep).logits[0].double().log_softmax(-1)
        scores.append(sum(float(logits[p - len(prompt_ids), ids[p]]) for p in range(len(prompt_ids), len(ids))))
    return scores


def test_scores_match_a_plain_forward_pass(tiny_long):
    lm = tiny_long
    records = sr.load_stingray("stingray-sample", limit=2)
    rows = sr.score_stingray(lm, records, progress=False)
    requests = sr.build_requests(records, split_words=False)  # likelihood: "w1, w2" as likelihood_eval.py
    assert len(rows) == len(requests) == len(records) * 3
    assert set(rows["prompt_format"]) == {"plain"} and set(rows["method"]) == {"likelihood"}
    for row, request in zip(rows.to_dict("records"), requests.to_dict("records"), strict=True):
        expected = _reference_scores(lm, request["prompt"], request["options"])
        assert json.loads(row["scores"]) == pytest.approx(expected, abs=1e-4)
        assert row["predicted"] == request["options"][int(np.argmax(expected))].strip()
        assert row["correct"] == (row["predicted"] == row["gold"])


@pytest.fixture(scope="module")
def chat_lm():
    """A tiny model whose tokenizer has a Gemma-like chat template."""
    lm = tiny_lm("llama", max_positions=512, seed=2)
    lm.tokenizer.chat_template = GEMMA_LIKE_CHAT
    return lm


def test_chat_format_scores_the_labels_as_the_assistant_turn(chat_lm):
    records = sr.load_stingray("stingray-sample", pairs=["en_de"], limit=1)
    rows = sr.score_stingray(chat_lm, records, chat="on", progress=False)
    requests = sr.build_requests(records, split_words=False)
    assert set(rows["prompt_format"]) == {"chat"}
    for row, request in zip(rows.to_dict("records"), requests.to_dict("records"), strict=True):
        expected_prompt = f"<start_of_turn>user\n{request['question']}<end_of_turn>\n<start_of_turn>model\n"
        assert row["prompt"] == expected_prompt  # no second BOS: encoding puts one first
        labels = [o.strip() for o in request["options"]]
        assert json.loads(row["scores"]) == pytest.approx(_reference_scores(chat_lm, expected_prompt, labels), abs=1e-4)
    assert sr.score_stingray(chat_lm, records, chat="auto", progress=False)["prompt"].equals(rows["prompt"])


def test_chat_needs_a_template_unless_auto(tiny_long):
    records = sr.load_stingray("stingray-sample", limit=1)
    with pytest.raises(BabelprobeError, match="has no chat template"):
        sr.score_stingray(tiny_long, records, chat="on", progress=False)
    rows = sr.score_stingray(tiny_long, records, chat="auto", tasks=("semantic",), progress=False)
    assert set(rows["prompt_format"]) == {"plain"}


class CannedGenerator:
    """Answers from a table (a stand-in for a model or an endpoint); records what it was asked."""

    name = "canned"

    def __init__(self, answers):
        self.answers, self.asked = answers, []

    def generate(self, prompts, max_new_tokens=64, stop=None, temperature=0.0, seed=0):
        self.asked += prompts
        return [self.answers(p) for p in prompts]


def test_generation_reads_the_answers_with_the_post_processing(tmp_path):
    records = sr.load_stingray("stingray-sample", pairs=["en_de"], limit=2)

    def answers(prompt):
        return "A and B" if prompt.startswith("Which") else ("No, it is not" if "Gift" in prompt else "Maybe")

    generator = CannedGenerator(answers)
    rows = sr.generate_stingray(generator, records, cache=tmp_path / "generations.jsonl", progress=False)
    requests = sr.build_requests(records)
    # the bare question: no answer cue, stripped (src/generation_baseline.py)
    assert generator.asked == [q.strip() for q in requests["question"]]
    semantic = rows[rows["task"] == "semantic"]
    assert (semantic["predicted"] == "C").all() and semantic["valid"].all()
    usage = rows[rows["task"] == "usage"]
    assert set(usage.loc[usage["response"] == "Maybe", "predicted"]) == {""}
    assert not usage.loc[usage["response"] == "Maybe", ["valid", "correct"]].any().any()
    assert (rows["correct"] == (rows["predicted"] == rows["gold"])).all()
    summary = sr.summarize(rows)
    assert value(summary, "valid", pair="en_de", subset="false_friend", task="usage") == pytest.approx(
        usage[usage["subset"] == "false_friend"]["valid"].mean())
    # a rerun reads the cache and asks nothing
    again = CannedGenerator(lambda p: pytest.fail("asked again"))
    assert sr.generate_stingray(again, records, cache=tmp_path / "generations.jsonl", progress=False)["response"].equals(
        rows["response"])


def test_local_generation_in_chat_format(chat_lm):
    from babelprobe.benchmarks.core.generate import local_generator

    records = sr.load_stingray("stingray-sample", pairs=["zh_ja"], limit=1)
    rows = sr.generate_stingray(local_generator(chat_lm), records, chat="auto", max_new_tokens=2, progress=False)
    assert set(rows["prompt_format"]) == {"chat"} and rows["prompt"].str.startswith("<start_of_turn>user\n").all()
    assert len(rows) == 6 and rows["response"].map(type).eq(str).all()


# ------------------------------------------------------------------------------------------------- CLI

def test_cli_writes_rows_summary_figures_and_refuses_another_model(tmp_path, tiny_long_dir, capsys):
    out = tmp_path / "sr"
    args = ["bench", "stingray", "--model", str(tiny_long_dir), "--data", "stingray-sample", "--out", str(out),
            "--limit", "2", "--no-progress"]
    assert main(args) == 0
    for name in ("items.csv", "summary.csv", "run.json", "skipped_records.csv", *(
            f"stingray{part}.{kind}" for part in ("", "-overall", "-pairs") for kind in ("pdf", "png"))):
        assert (out / name).stat().st_size > 0
    rows, summary = pd.read_csv(out / "items.csv"), pd.read_csv(out / "summary.csv")
    assert len(rows) == 2 * 2 * 2 * 3 and {"pair_id", "language", "subset", "method", "correct"} <= set(rows.columns)
    per_cell = summary[summary["task"].isin(sr.TASKS)]
    assert len(per_cell) == 2 * 2 * 2 * 5  # pair × subset × task × metric, long (the benchmark contract)
    assert set(per_cell["metric"]) == {"accuracy", "accuracy_l1", "accuracy_l2", "bias", "comprehension"}
    assert len(summary[summary["task"] == "mean"]) == 2 * 2 * 3 and len(summary[summary["pair"] == "all"]) == 2 * 4
    assert set(summary["protocol"]) == {"default"} and set(summary["prompt_format"]) == {"plain"}
    assert (summary.loc[summary["metric"] == "records_skipped", "value"] == 0).all()
    recomputed = sr.stingray_summary(rows)
    assert sr.wide(summary)[["accuracy", "bias", "abs_bias"]].equals(recomputed[["accuracy", "bias", "abs_bias"]])
    printed = capsys.readouterr().out
    assert "comprehension" in printed and "Fig. 4" in printed and "protocol default" in printed

    other = tmp_path / "other-model"
    lm = tiny_lm("llama", seed=1, max_positions=512)
    lm.model.save_pretrained(other)
    lm.tokenizer.save_pretrained(other)
    args[3] = str(other)
    assert main(args) == 2
    assert "fingerprint" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory, chat_lm):
    path = tmp_path_factory.mktemp("tiny-chat")
    chat_lm.model.save_pretrained(path)
    chat_lm.tokenizer.save_pretrained(path)
    return path


def test_cli_paper_protocol_on_the_sample(tmp_path, chat_dir, capsys):
    out = tmp_path / "paper"
    base = ["bench", "stingray", "--model", str(chat_dir), "--items", "stingray-sample", "--limit", "2",
            "--no-progress", "--protocol", "paper"]
    assert main([*base, "--out", str(out)]) == 0
    rows, summary = pd.read_csv(out / "items.csv"), pd.read_csv(out / "summary.csv")
    run = json.loads((out / "run.json").read_text())
    assert json.dumps(run).count('"protocol": "paper"') >= 1 and '"chat_template": "auto"' in json.dumps(run)
    assert set(rows["prompt_format"]) == {"chat"} and set(rows["method"]) == {"likelihood"}
    assert set(summary["protocol"]) == {"paper"} and set(summary["prompt_format"]) == {"chat"}
    assert "protocol paper" in capsys.readouterr().out
    # the paper's robustness check, answering by generation, is a preset of its own; through the runner
    from babelprobe.benchmarks.base import benchmark_settings

    settings = benchmark_settings(sr, "paper-generation", generator="local")
    result = bp.run_benchmark("stingray", str(chat_dir), "stingray-sample", tmp_path / "generation", settings,
                              limit=1, progress=False)
    assert set(result.rows["method"]) == {"generation"} and set(result.rows["prompt_format"]) == {"chat"}
    assert {"response", "valid"} <= set(result.rows.columns) and "valid" in set(result.summary["metric"])
    assert (tmp_path / "generation" / "generations.jsonl").exists() and result.figures[-1].exists()
    assert result.identity["protocol"] == "paper-generation" and result.identity["answer"] == "generate"
    assert set(result.summary["protocol"]) == {"paper-generation"}
    with pytest.raises(BabelprobeError, match="--protocol paper runs --answer likelihood; drop --answer generate"):
        benchmark_settings(sr, "paper", answer="generation")  # the old value, read as the new one


def test_cli_on_the_raw_csvs_reports_what_it_skipped(tmp_path, tiny_long_dir, capsys):
    data, out = write_raw(tmp_path / "StingrayBench" / "data"), tmp_path / "raw"
    assert main(["bench", "stingray", "--model", str(tiny_long_dir), "--items", str(data.parent), "--limit", "5",
                 "--out", str(out), "--no-progress", "--tasks", "usage"]) == 0
    captured = capsys.readouterr()
    assert "skipped 2 of 5 records" in captured.err and "records skipped (cannot be scored)" in captured.out
    summary = pd.read_csv(out / "summary.csv")
    assert value(summary, "records_skipped", pair="en_de", subset="false_friend") == 2
    assert summary.loc[summary["metric"] == "records_skipped", "n"].tolist() == [5, 3]
    skipped = pd.read_csv(out / "skipped_records.csv")
    assert len(skipped) == 3 and skipped["source"].str.contains("en_de.csv:4").any()


def test_cli_bad_data_is_one_line(tmp_path, tiny_dir, capsys):
    code = main(["bench", "stingray", "--model", str(tiny_dir), "--data", str(tmp_path / "missing"),
                 "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("babelprobe: error:") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_default_model_on_the_sample(default_lm):
    records = sr.load_stingray("stingray-sample", limit=1)
    rows = sr.score_stingray(default_lm, records, progress=False)
    requests = sr.build_requests(records, split_words=False)  # likelihood: "w1, w2" as likelihood_eval.py
    for k in (0, 11):  # an English–German semantic and a Japanese usage question against a plain forward pass
        expected = _reference_scores(default_lm, requests["prompt"][k], requests["options"][k])
        assert json.loads(rows["scores"][k]) == pytest.approx(expected, abs=1e-3)
    summary = sr.stingray_summary(rows)
    cells = summary[summary["task"].isin(sr.TASKS)]
    assert cells["accuracy"].between(0, 1).all() and len(cells) == 8


def test_hub_configs_are_read_through_datasets(monkeypatch):
    """Offline stand-in for `datasets.load_dataset('StingrayBench/StingrayBench', config, split='test')`."""
    import datasets

    class Split:
        def __init__(self, frame):
            self.frame = frame

        def to_pandas(self):
            return self.frame

    asked = []

    def fake_load(name, config, split):
        asked.append((name, config, split))
        record = {**GOOD, "semantic_appropriate_label": 2, "word": "Arm, Arm"} if config.endswith("_common") else GOOD
        return Split(pd.DataFrame([record]))

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    records = sr.load_stingray("hf:StingrayBench/StingrayBench")
    assert len(asked) == 8 and {a[2] for a in asked} == {"test"}
    assert sorted(set(records["pair"])) == ["en_de", "id_ms", "id_tl", "zh_ja"] and len(records) == 8
    assert records["_source"].iloc[0] == "hf:StingrayBench/StingrayBench[en_de] row 1"

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(BabelprobeError, match="cannot load hub dataset .*download its files"):
        sr.load_stingray("StingrayBench/StingrayBench")


def test_true_cognate_usage_words_as_each_released_script_passes_them():
    records = sr.load_stingray("stingray-sample", limit=None)
    cognate = records[(records["subset"] == "true_cognate") & records["word"].str.contains(",")].iloc[[0]]
    word = cognate.iloc[0]["word"]
    first, second = (w.strip() for w in word.split(",", 1))
    usage = sr.build_requests(cognate, split_words=False)
    usage = usage[usage["task"] == "usage"]
    assert all(q.startswith(f"Is the usage of {word} in this sentence") for q in usage["question"])  # likelihood_eval.py
    split = sr.build_requests(cognate)
    split = split[split["task"] == "usage"].set_index("side")["question"]
    assert split["L1"].startswith(f"Is the usage of {first} in") and split["L2"].startswith(f"Is the usage of {second} in")
