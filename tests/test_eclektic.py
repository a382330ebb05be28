"""ECLeKTiC: the loader on the release's format (main and popular pages), the prompts and the judge prompt
against the paper's appendix, the string judge on hand-checked cases, the paper's metrics and margins on
hand-computed examples and on the counts of the paper's Fig. 5, the LLM judge, and the CLI (default and
paper protocol, outputs, resume, refusal, HTTP)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from babelprobe.benchmarks import eclektic
from babelprobe.benchmarks.base import Models, benchmark_settings
from babelprobe.benchmarks.core.generate import local_generator
from babelprobe.benchmarks.eclektic import (
    PROMPT_SETS,
    Settings,
    answer_found,
    answering_generator,
    closed_book_prompts,
    condition,
    eclektic_summary,
    first_line,
    format_summary,
    judge_llm,
    judge_template,
    load_eclektic,
    normalize_answer,
    prompt_templates,
    run_eclektic,
    transfer_pairs,
    word_recall,
)
from babelprobe.cli import main
from babelprobe.errors import BabelprobeError
from tests.test_generate_http import SECRET, OpenAIStub
from tests.tiny import tiny_lm

PAPERS = Path(__file__).resolve().parents[2] / "shared" / "papers"


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


RELEASED = {  # the release's layout: source fields as question/answer/content, translations as L_q/L_a/L_c
    "q_id": "q-7", "original_lang": "id", "title": "Prasasti Sarwadharma", "url": "https://id.wikipedia.org/wiki/x",
    "content": "Prasasti Sarwadharma ditulis pada tahun 1269.", "question": "Kapan Prasasti Sarwadharma ditulis?",
    "answer": "1269", "en_q": "When was the Sarwadharma inscription written?", "en_a": "1269",
    "en_c": "The Sarwadharma inscription was written in 1269.", "de_q": "Wann wurde die Sarwadharma-Inschrift verfasst?",
    "de_a": "1269", "de_c": "Die Sarwadharma-Inschrift wurde 1269 verfasst."}


# ------------------------------------------------------------------------------------------------ loading

def test_bundled_sample_has_one_source_row_per_question():
    q = load_eclektic("eclektic-sample")
    assert len(q) == 50 and q["q_id"].nunique() == 10
    assert set(q["language"]) == {"en", "de", "fr", "es", "ja"}
    assert (q[q["subset"] == "source"].groupby("q_id").size() == 1).all()
    assert (q["subset"] == "source").eq(q["language"] == q["source_language"]).all()
    row = q[(q["q_id"] == "de-001") & (q["language"] == "ja")].iloc[0]
    assert (row["answer"], row["subset"], row["item_id"], row["pair_id"]) == ("デトモルト", "target", "de-001:ja", "de-001")
    assert row["original_context"] == q[q["item_id"] == "de-001:de"].iloc[0]["context"]  # the German context
    assert {"item_id", "pair_id", "language", "subset", "label", "text"} <= set(q.columns)


def test_release_layout_with_source_fields_only_as_question_answer(tmp_path):
    q = load_eclektic(write_jsonl(tmp_path / "eclektic_main.jsonl", [RELEASED]))
    source = q[q["subset"] == "source"].iloc[0]
    assert (source["language"], source["question"], source["context"]) == ("id", RELEASED["question"], RELEASED["content"])
    assert sorted(q["language"]) == ["de", "en", "id"]
    assert set(q["original_context"]) == {RELEASED["content"]}
    assert load_eclektic(tmp_path).shape == q.shape  # a directory holding the file works too


def test_popular_pages_variant_asks_only_the_languages_it_has():
    """§5: each question is asked in its source language and only the target languages given for it."""
    q = load_eclektic("eclektic-popular-sample")
    raw = [json.loads(line) for line in
           (Path(eclektic.BUNDLED["eclektic-popular-sample"].location)).read_text(encoding="utf-8").splitlines()]
    for record in raw:
        expected = {k[:-2] for k in record if re.fullmatch(r"[a-z]{2}_q", k)}
        assert set(q[q["q_id"] == record["q_id"]]["language"]) == expected
    assert len(q) == sum(len([k for k in r if re.fullmatch(r"[a-z]{2}_q", k)]) for r in raw)
    assert q.groupby("q_id")["language"].nunique().nunique() > 1  # not every question in every language


def test_long_layout_and_selection(tmp_path):
    rows = [{"q_id": "a", "original_lang": "en", "lang": "en", "question": "Q?", "answer": "A"},
            {"q_id": "a", "original_lang": "en", "lang": "fr", "question": "Q ?", "answer": "A"},
            {"q_id": "b", "original_lang": "fr", "lang": "fr", "question": "Q2 ?", "answer": "B"}]
    q = load_eclektic(write_jsonl(tmp_path / "long.jsonl", rows))
    assert list(q["subset"]) == ["source", "target", "source"]
    assert set(load_eclektic("eclektic-sample", languages=["en", "de"], limit=1)["item_id"]) == {
        "en-001:en", "en-001:de", "de-001:de", "de-001:en"}


@pytest.mark.parametrize("change,message", [
    ({"original_lang": None}, r"eclektic_main.jsonl:2: missing field 'original_lang'"),
    ({"de_a": ""}, r"question q-7 has de_q but no answer in field 'de_a'"),
    ({"original_lang": "xx"}, r"jsonl:2: original_lang 'xx' of question q-7 is not an ISO 639-1 code"),
    ({"question": "", "original_lang": "fr"}, r"no question in its source language 'fr'"),
])
def test_bad_records_name_the_file_field_and_value(tmp_path, change, message):
    record = {k: v for k, v in {**RELEASED, **change, "q_id": "q-8"}.items() if v is not None}
    with pytest.raises(BabelprobeError, match=message.replace("q-7", "q-8")):
        load_eclektic(write_jsonl(tmp_path / "eclektic_main.jsonl", [RELEASED, record]))


def test_other_bad_sources(tmp_path):
    with pytest.raises(BabelprobeError, match="appears twice"):
        load_eclektic(write_jsonl(tmp_path / "dup.jsonl", [RELEASED, RELEASED]))
    with pytest.raises(BabelprobeError, match="not ECLeKTic records"):
        load_eclektic(write_jsonl(tmp_path / "other.jsonl", [{"text": "x"}]))
    with pytest.raises(BabelprobeError, match="language ko not in eclektic-sample"):
        load_eclektic("eclektic-sample", languages=["en", "ko"])
    with pytest.raises(BabelprobeError, match="neither eclektic-sample"):
        load_eclektic(tmp_path / "missing.jsonl")


# ------------------------------------------------------------------------------------ the paper's prompts

def paper_text() -> str:
    found = [p for p in sorted(PAPERS.glob("*.txt")) if "A.2 Judging Prompt" in p.read_text(encoding="utf-8")]
    if not found:
        pytest.skip("the ECLeKTiC paper is not in ../shared/papers")
    return found[0].read_text(encoding="utf-8")


def paragraphs(text: str, start: str, end: str) -> list[str]:
    """The paragraphs of the paper between two headings, markdown escapes undone; Fig. 5's table and
    caption (printed in the middle of App. A.2) left out."""
    section = text[text.index(start) + len(start):text.index(end)]
    kept = []
    for block in section.split("\n\n"):
        block = block.strip().replace("\\_", "_").replace("\\*", "*")
        if block and "%" not in block and not block.startswith("Figure"):
            kept.append(block)
    return kept


def test_judge_prompt_is_app_a2_verbatim():
    expected = "\n\n".join(paragraphs(paper_text(), "A.2 Judging Prompt", "## A.3"))
    assert judge_template() == expected
    assert expected.endswith("Answer: {predicted_answer}\n\nOutput:")


def test_closed_book_and_hint_templates_are_app_a3_verbatim():
    """Each condition of Table 3: its heading in App. A.3, then its template's paragraphs."""
    names = {"Closed-book": "closed-book", "General hint": "general-hint", "Source language name":
             "source-language-name", "Source language title": "source-language-title",
             "Cross-lingual open-book": "cross-lingual-open-book"}
    templates, current = {}, None
    for block in paragraphs(paper_text(), "A.3 Prompts for Ablation in Section 4.4", "# B Per-Language"):
        heading = block.strip("#* ")
        if heading in names:
            current = names[heading]
            continue
        templates.setdefault(current, []).append(re.sub(r"^#+ ", "", block))  # '# {question}': a heading mark
    assert set(templates) == set(names.values())
    for name, parts in templates.items():
        assert prompt_templates(name) == {"*": "\n\n".join(parts)}, name


def test_hint_conditions_fill_the_source_language_title_and_context():
    q = load_eclektic("eclektic-sample", languages=["en", "de"], limit=1)
    row = q[q["item_id"] == "de-001:en"]
    question = row.iloc[0]["question"]
    german = q[q["item_id"] == "de-001:de"].iloc[0]
    prompts = {name: closed_book_prompts(row, prompt_templates(name))[0] for name in PROMPT_SETS}
    assert prompts["closed-book"] == question
    assert prompts["general-hint"] == ("Answer the following question based on your knowledge in another "
                                       f"language.\n\n{question}")
    assert prompts["source-language-name"] == ("Answer the following question based on your knowledge in "
                                               f"German.\n\n{question}")
    assert prompts["source-language-title"] == ("Answer the following question based on your knowledge in "
                                                f"German about Hermannsdenkmal.\n\n{question}")
    assert prompts["cross-lingual-open-book"] == f"Context: {german['context']} {question}"
    assert prompts["qa"] == f"Question: {question}\nAnswer:"
    # A question that holds a placeholder's text is not filled twice; a missing title is a clear error.
    tricky = row.assign(question="What is {original_title}?")
    assert closed_book_prompts(tricky, prompt_templates("source-language-title")).pop().endswith(
        "\n\nWhat is {original_title}?")
    with pytest.raises(BabelprobeError, match=r"uses \{original_title\} but question de-001 has none \(field 'title'"):
        closed_book_prompts(row.assign(title=""), prompt_templates("source-language-title"))


def test_own_prompt_file_and_its_mistakes(tmp_path):
    own = tmp_path / "mine.tsv"
    own.write_text("language\ttemplate\n*\tQ ({in_lang}): {question}\n", encoding="utf-8")
    q = load_eclektic("eclektic-sample", languages=["en", "de"], limit=1)
    assert closed_book_prompts(q.iloc[[1]], prompt_templates(path=own))[0].startswith("Q (German): ")
    own.write_text("language\ttemplate\n*\t{question} {answer}\n", encoding="utf-8")
    with pytest.raises(BabelprobeError, match=r"unknown placeholder\(s\) \{answer\}"):
        prompt_templates(path=own)


# ------------------------------------------------------------------------------------------------ settings

@pytest.mark.parametrize("values,prompt_set,cut", [
    ({}, "qa", True),  # a base model continuing text: the qa frame, its first line
    ({"generator": "openai:m@http://127.0.0.1:9/v1"}, "closed-book", False),  # a chat endpoint: the bare question
    ({"chat_template": True}, "closed-book", False),
    ({"generator": "openai-completions:m@http://127.0.0.1:9/v1"}, "qa", True),
    ({"prompt_set": "general-hint"}, "general-hint", False),
    ({"prompt_set": "qa", "answer_cut": "none"}, "qa", False),
    ({"prompt_set": "closed-book", "answer_cut": "first-line"}, "closed-book", True),
])
def test_default_prompt_and_cut_follow_the_answerer(values, prompt_set, cut):
    settings = benchmark_settings(eclektic, **values)
    assert (condition(settings), first_line(settings), settings.protocol) == (prompt_set, cut, "default")


def test_paper_preset_and_setting_mistakes():
    paper = benchmark_settings(eclektic, "paper", judge="self")
    assert (paper.protocol, condition(paper), first_line(paper), paper.judge, paper.chat_template) == (
        "paper", "closed-book", False, "self", "auto")
    assert benchmark_settings(eclektic, "paper", judge="llm").judge == "self"  # the old spelling
    assert benchmark_settings(eclektic, "paper", judge="llm:local").judge == "llm:local"
    with pytest.raises(BabelprobeError, match="--protocol paper needs --judge: the paper judged .* Gemini 2.0 Flash"):
        benchmark_settings(eclektic, "paper")  # the paper's judge is not the answering model: say which
    with pytest.raises(BabelprobeError, match="use match, self or llm:SPEC"):
        Settings(judge="gemini")
    with pytest.raises(BabelprobeError, match="not a generator spec"):
        Settings(judge="llm:gemini-2.0-flash")
    with pytest.raises(BabelprobeError, match="--chat-template applies to local generators"):
        Settings(generator="openai:m@http://127.0.0.1:9/v1", chat_template=True)


def test_chat_template_sends_the_bare_question_as_a_user_turn():
    lm = tiny_lm("llama", max_positions=512)
    lm.tokenizer.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
    generator = answering_generator(Models(lm), Settings(chat_template=True))
    assert generator.name == f"local:{lm.name} (chat template)"  # never shares a cache entry with plain prompts
    question = "Which river flows through Heidelberg?"
    rendered = f"<|user|>{question}\n<|assistant|>"
    assert generator.generate([question], max_new_tokens=5) == local_generator(lm).generate([rendered], max_new_tokens=5)


def test_chat_template_auto_follows_the_model(tiny_long, tmp_path):
    """`--chat-template auto`: the chat template and the bare question (closed-book) when the local model
    has a template, plain text and the qa frame when it has none; before the model is known, `check`
    accepts both prompt sets and `condition` asks which."""
    chat = tiny_lm("llama", max_positions=512)
    chat.tokenizer.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
    settings = Settings(chat_template="auto", max_new_tokens=3)
    with pytest.raises(BabelprobeError, match="depends on whether the model has a chat template"):
        condition(settings)
    data = load_eclektic("eclektic-sample", languages=["en", "de"], limit=1)
    eclektic.check(data, settings)
    for lm, method, generator in ((chat, "closed-book", f"local:{chat.name} (chat template)"),
                                  (tiny_long, "qa", f"local:{tiny_long.name}")):
        rows = eclektic.run(data, Models(lm), settings, progress=False)
        assert set(rows["method"]) == {method} and set(rows["generator"]) == {generator}
        assert set(rows["answer_cut"]) == {"none" if method == "closed-book" else "first-line"}


# ------------------------------------------------------------------------------------------- string judge

@pytest.mark.parametrize("answer,prediction,found", [
    ("Dorset", "It is in Dorset, England.", True),
    ("Avon", "the River Avon.", True),
    ("Avon", "Havon", False),  # not at a word start
    ("1269", "It was written in 1,269", True),  # digit grouping
    ("Comté", "COMTÉ cheese", True),
    ("Neckar", "der Rhein", False),
    ("金沢", "石川県金沢市です。", True),  # no spaces in Japanese: anywhere
    ("서울", "서울에 있습니다", True),  # Korean particles attach to the word
    ("Buñol", "Bunol", False),
    ("", "anything", False),
])
def test_string_judge_hand_checked(answer, prediction, found):
    assert answer_found(answer, prediction) is found


def test_normalisation_and_recall():
    assert normalize_answer("  Sir   Edmund-Hillary! ") == "sir edmund hillary"
    assert word_recall("Sir Edmund Hillary", "Edmund Hillary climbed it") == pytest.approx(2 / 3)
    assert word_recall("香川", "香川県") == 1.0


# ------------------------------------------------------------------------------------------------ metrics

def rows_from(data) -> pd.DataFrame:
    rows = pd.DataFrame(data, columns=["q_id", "source_language", "language", "correct"])
    rows["subset"] = np.where(rows["language"] == rows["source_language"], "source", "target")
    return rows


def hand_rows() -> pd.DataFrame:
    """q1 (en): right in en, de right, fr wrong; q2 (en): wrong in en, de and fr right; q3 (de): right in de,
    en and fr right."""
    return rows_from([("q1", "en", "en", True), ("q1", "en", "de", True), ("q1", "en", "fr", False),
                      ("q2", "en", "en", False), ("q2", "en", "de", True), ("q2", "en", "fr", True),
                      ("q3", "de", "de", True), ("q3", "de", "en", True), ("q3", "de", "fr", True)])


def indexed(summary: pd.DataFrame) -> pd.DataFrame:
    return summary.set_index(["metric", "average", "source_language", "target_language"])


def test_metrics_match_the_paper_definitions_on_a_hand_computed_example():
    pairs = transfer_pairs(hand_rows())
    assert list(pairs["success"]) == [True, False, False, False, True, True]
    s = indexed(eclektic_summary(hand_rows()))
    assert s.loc[("overall_success", "pooled", "all", "all"), "value"] == pytest.approx(3 / 6)
    assert s.loc[("transfer_score", "pooled", "all", "all"), "value"] == pytest.approx(3 / 4)  # q1's and q3's pairs
    assert s.loc[("source_accuracy", "pooled", "all", "all"), "value"] == pytest.approx(2 / 3)
    assert s.loc[("overall_success", "pooled", "en", "de"), ["k", "n"]].tolist() == [1, 2]
    assert s.loc[("transfer_score", "pooled", "en", "de"), ["k", "n"]].tolist() == [1, 1]
    assert s.loc[("transfer_score", "pooled", "en", "fr"), "value"] == 0
    assert s.loc[("overall_success", "pooled", "all", "fr"), "value"] == pytest.approx(1 / 3)
    # One pair per question in a cell: Wilson; several per question overall: a bootstrap over questions.
    assert s.loc[("overall_success", "pooled", "en", "de"), "interval"] == "wilson"
    assert s.loc[("overall_success", "pooled", "all", "all"), "interval"] == "bootstrap over questions"
    low, high = s.loc[("overall_success", "pooled", "all", "all"), ["ci_low", "ci_high"]]
    assert 0 <= low <= 0.5 <= high <= 1


def test_macro_margins_against_hand_sums():
    """Cells of unequal size: the paper's margins (means of the cells, diagonal included) differ from
    pooling. en has two questions (q1 right in en, q2 wrong), de one (q3, right), fr one (q4, wrong)."""
    rows = rows_from([("q1", "en", "en", True), ("q1", "en", "de", True), ("q1", "en", "fr", False),
                      ("q2", "en", "en", False), ("q2", "en", "de", True), ("q2", "en", "fr", True),
                      ("q3", "de", "de", True), ("q3", "de", "en", True), ("q3", "de", "fr", True),
                      ("q4", "fr", "fr", False), ("q4", "fr", "en", True), ("q4", "fr", "de", False)])
    s = indexed(eclektic_summary(rows))
    macro = lambda metric, src, tgt: s.loc[(metric, "macro", src, tgt), "value"]  # noqa: E731
    # Success cells: en→en 1/2, en→de 1/2, en→fr 0/2; de→de 1, de→en 1, de→fr 1; fr→fr 0, fr→en 0, fr→de 0.
    assert macro("overall_success", "en", "all") == pytest.approx((1 / 2 + 1 / 2 + 0) / 3)
    assert macro("overall_success", "all", "de") == pytest.approx((1 / 2 + 1 + 0) / 3)  # target de, over sources
    assert macro("overall_success", "all", "en") == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert macro("overall_success", "all", "fr") == pytest.approx((0 + 1 + 0) / 3)
    pooled_de = s.loc[("overall_success", "pooled", "all", "de"), "value"]
    assert pooled_de == pytest.approx((1 + 0) / 3)  # q1→de, q2→de (fails: q2 wrong in en), q4→de: pooled, t ≠ s
    # Transfer cells (only questions right in their source): en→{en, de, fr} = 1, 1, 0; de→* = 1; fr: none.
    assert macro("transfer_score", "en", "all") == pytest.approx(2 / 3)
    assert macro("transfer_score", "all", "fr") == pytest.approx((0 + 1) / 2)  # fr's own cell has no question
    assert np.isnan(macro("transfer_score", "fr", "all"))
    # Intervals: a bootstrap within source languages, and the normal approximation of the mean of cells.
    row = s.loc[("overall_success", "macro", "all", "de")]
    assert row["interval"] == "bootstrap over questions within source languages"
    cells = np.array([1 / 2, 1, 0]), np.array([2, 1, 1])
    half = 1.959963984540054 * np.sqrt(np.sum(cells[0] * (1 - cells[0]) / cells[1])) / 3
    assert (row["wald_low"], row["wald_high"]) == pytest.approx((row["value"] - half, row["value"] + half))
    assert row["ci_low"] <= row["value"] <= row["ci_high"]


def test_all_right_gives_degenerate_intervals():
    rows = rows_from([(q, s, t, True) for q, s in (("a", "en"), ("b", "en"), ("c", "de")) for t in ("en", "de")])
    s = indexed(eclektic_summary(rows))
    for key in (("overall_success", "macro", "all", "de"), ("transfer_score", "macro", "en", "all")):
        assert s.loc[key, ["value", "ci_low", "ci_high", "wald_low", "wald_high"]].tolist() == [1, 1, 1, 1, 1]


def figure5_counts(text: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Fig. 5 (Gemini 2.0 Pro, overall success): rows are target languages, columns source languages;
    each cell 'p% k/n'; the line after the table holds the per-source averages."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("de\t") and "% " in line)
    k, n = [], []
    for line in lines[first:first + 12]:
        cells = re.findall(r"[\d.]+% (\d+)/(\d+)", line)
        assert len(cells) == 12, line
        k.append([int(a) for a, _ in cells])
        n.append([int(b) for _, b in cells])
    averages = [float(v) for v in re.findall(r"([\d.]+)%", lines[first + 12])]
    return averages, np.array(k), np.array(n)


def test_fig5_counts_reproduce_the_papers_margins_and_table2(capsys):
    """Rows rebuilt from Fig. 5's counts give Table 2's overall success of Gemini 2.0 Pro with its ±
    (normal approximation over examples), the ± of its transfer score and Fig. 5's per-source averages."""
    averages, k, n = figure5_counts(paper_text())
    langs = ["de", "en", "fr", "es", "it", "pt", "id", "he", "hi", "ko", "ja", "zh"]  # Fig. 5's order
    data = []
    for j, s in enumerate(langs):  # source s has n[0, j] questions; k[j, j] are right in s
        for q in range(n[0, j]):
            data += [(f"{s}{q}", s, t, bool(q < k[i, j]) if i != j else bool(q < k[j, j]))
                     for i, t in enumerate(langs)]  # success s→t needs s right: the first k[i, j] of the k[j, j]
    summary = eclektic_summary(rows_from(data), n_boot=200)
    s = indexed(summary)
    overall = s.loc[("overall_success", "pooled", "all", "all")]
    transfer = s.loc[("transfer_score", "pooled", "all", "all")]
    assert f"{100 * overall['value']:.1f}" == "41.6"  # Table 2
    assert f"{100 * (overall['wald_high'] - overall['wald_low']) / 2:.1f}" == "1.5"
    assert f"{100 * (transfer['wald_high'] - transfer['wald_low']) / 2:.1f}" == "1.8"
    for lang, printed in zip(langs, averages):  # Fig. 5's bottom row (within the rounding of the figure)
        assert abs(100 * s.loc[("overall_success", "macro", lang, "all"), "value"] - printed) <= 0.1, lang
    text = format_summary(summary)
    assert "41.6±1.5" in text and "per target language" in text


# -------------------------------------------------------------------------------------------- LLM judge

class Scripted:
    """A judge that says YES exactly when the prediction (after 'Answer:') contains 'Detmold'."""

    name = "scripted-judge"

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, max_new_tokens=64, stop=None):
        self.prompts += prompts
        return [" YES" if "Detmold" in p.split("Answer:")[-1] else "NO." for p in prompts]


def test_llm_judge_uses_the_app_a2_prompt_with_the_target_context():
    rows = load_eclektic("eclektic-sample", languages=["en", "de"], limit=1)
    rows["prediction"] = ["Detmold" if q == "de-001" else "London" for q in rows["q_id"]]
    judge = Scripted()
    judged = judge_llm(rows, judge)
    assert list(judged["correct"]) == [q == "de-001" for q in judged["q_id"]]
    row = rows.iloc[0]
    names = {"en": "English", "de": "German"}
    assert judge.prompts[0] == (
        "**Task:** Determine if an answer to the question is supported by a given text.\n\n"
        f"**Input (in {names[row['language']]}):** - Text - Question - Answer\n\n"
        "**Single Word Output (in English):** - YES: Answer is derived from the text. - NO: Answer is not "
        f"derived from the text.\n\nText: {row['context']}\n\nQuestion: {row['question']}\n\n"
        f"Answer: {row['prediction']}\n\nOutput:")
    with pytest.raises(BabelprobeError, match="needs the context"):
        judge_llm(rows.assign(context=""), judge)


def test_run_with_the_local_generator(tiny_long, tmp_path):
    questions = load_eclektic("eclektic-sample", languages=["en", "de"], limit=1)
    rows = run_eclektic(local_generator(tiny_long), questions, prompt_templates("qa"), max_new_tokens=4,
                        first_line=True, cache=tmp_path / "g.jsonl", method="qa")
    assert {"pair_id", "language", "subset", "method", "correct", "prediction", "prompt"} <= set(rows.columns)
    assert rows["prompt"].str.endswith(("Answer:", "Antwort:")).all() and set(rows["method"]) == {"qa"}
    expected = local_generator(tiny_long).generate(list(rows["prompt"]), max_new_tokens=4, stop=["\n"])
    assert list(rows["prediction"]) == [e.strip() for e in expected]
    assert len((tmp_path / "g.jsonl").read_text().splitlines()) == 4
    # Uncut: the whole continuation (stripped), not its first line.
    whole = run_eclektic(local_generator(tiny_long), questions, prompt_templates("closed-book"), max_new_tokens=12)
    expected = local_generator(tiny_long).generate(list(questions["question"]), max_new_tokens=12)
    assert list(whole["prediction"]) == [e.strip() for e in expected]
    assert set(whole["answer_cut"]) == {"none"}


# ---------------------------------------------------------------------------------------------------- CLI

def cli(*args) -> int:
    return main(["bench", "eclektic", *map(str, args), "--no-progress"])


def test_cli_writes_rows_summary_figure_and_resumes(tiny_long_dir, tmp_path, capsys):
    out = tmp_path / "ek"
    base = ["--model", tiny_long_dir, "--data", "eclektic-sample", "--langs", "en,de", "--limit", "1",
            "--max-new-tokens", "3", "--out", out]
    assert cli(*base) == 0
    printed = capsys.readouterr().out
    assert "protocol default" in printed and "overall_success" in printed and "transfer score" in printed
    for name in ("items.csv", "summary.csv", "eclektic.pdf", "eclektic.png", "run.json", "generations.jsonl"):
        assert (out / name).exists(), name
    rows = pd.read_csv(out / "items.csv")
    assert len(rows) == 4 and set(rows["method"]) == {"qa"} and set(rows["answer_cut"]) == {"first-line"}
    assert set(pd.read_csv(out / "summary.csv")["protocol"]) == {"default"}
    cache = (out / "generations.jsonl").read_text()
    assert cli(*base) == 0  # the same command again: everything comes from the cache
    assert (out / "generations.jsonl").read_text() == cache
    other = tiny_lm("llama", max_positions=512, seed=7)
    other_dir = tmp_path / "other"
    other.model.save_pretrained(other_dir)
    other.tokenizer.save_pretrained(other_dir)
    capsys.readouterr()
    assert cli(*[other_dir if a == tiny_long_dir else a for a in base]) == 2
    err = capsys.readouterr().err  # (before it: the HF weight-loading progress bar)
    assert err.strip().splitlines()[-1].startswith("babelprobe: error:") and "--overwrite" in err
    assert "Traceback" not in err
    assert cli(*[other_dir if a == tiny_long_dir else a for a in base], "--overwrite") == 0


def test_cli_runs_the_paper_protocol_with_the_local_generator(tiny_long_dir, tmp_path, capsys):
    out = tmp_path / "paper"
    assert cli("--model", tiny_long_dir, "--items", "eclektic-sample", "--langs", "en,de", "--limit", "1",
               "--generator", "local", "--protocol", "paper", "--judge", "self", "--max-new-tokens", "6", "--out", out) == 0
    printed = capsys.readouterr().out
    assert "protocol paper" in printed and "judge self" in printed
    rows = pd.read_csv(out / "items.csv", keep_default_na=False)
    assert list(rows["prompt"]) == list(rows["question"])  # the bare question (§3.2, App. A.3)
    assert set(rows["method"]) == {"closed-book"} and set(rows["answer_cut"]) == {"none"}
    assert set(rows["judge"]) == {"self"} and set(rows["protocol"]) == {"paper"}
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["protocol"]) == {"paper"} and set(summary["judge"]) == set(rows["judge"])
    assert json.loads((out / "run.json").read_text())["protocol"] == "paper"
    judged = [json.loads(line)["key"] for line in (out / "generations.jsonl").read_text().splitlines()]
    judge_prompts = [key for key in judged if "**Task:** Determine if an answer" in key]
    assert len(judge_prompts) == len(rows)  # one App. A.2 prompt per answer, beside the answers


def test_cli_scores_the_popular_pages_sample(tiny_long_dir, tmp_path, capsys):
    out = tmp_path / "popular"
    assert cli("--model", tiny_long_dir, "--items", "eclektic-popular-sample", "--langs", "en,de,es",
               "--max-new-tokens", "2", "--out", out) == 0
    rows = pd.read_csv(out / "items.csv")
    expected = load_eclektic("eclektic-popular-sample", languages=["en", "de", "es"])
    assert sorted(rows["item_id"]) == sorted(expected["item_id"])
    summary = pd.read_csv(out / "summary.csv", keep_default_na=False)
    pairs = summary[(summary["metric"] == "overall_success") & (summary["average"] == "pooled")
                    & (summary["source_language"] == "all") & (summary["target_language"] == "all")]
    assert pairs.iloc[0]["n"] == (expected["subset"] == "target").sum()


def test_cli_over_http_keeps_the_key_out_and_resumes_after_failures(tiny_long, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BP_TEST_KEY", SECRET)
    out = tmp_path / "ek-http"
    local = local_generator(tiny_long)
    args = ["--data", "eclektic-sample", "--langs", "en,de,fr", "--limit", "1", "--max-new-tokens", "3",
            "--api-key-env", "BP_TEST_KEY", "--retries", "1", "--timeout", "5", "--out", out]
    # A server that answers 5 requests and then fails for good: the run stops with a one-line error...
    with OpenAIStub(local, faults=[None] * 5, always="503") as server:
        status = cli("--generator", f"openai-completions:tiny@{server.url}", *args)
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("babelprobe: error:") and "HTTP 503" in err
    done = len((out / "generations.jsonl").read_text().splitlines())
    assert done == 5  # ...and keeps the answers it got (each saved as it arrived)
    with OpenAIStub(local, port=server.port) as server:  # the server is back, at the same address
        assert cli("--generator", f"openai-completions:tiny@{server.url}", *args) == 0
        assert len(server.requests) == 9 - done  # the rerun asks only for the 4 of 9 still missing
    printed = capsys.readouterr()
    for path in out.iterdir():
        assert SECRET not in path.read_text(encoding="utf-8", errors="replace"), path.name
    assert SECRET not in printed.out + printed.err
    assert all(r["headers"]["Authorization"] == f"Bearer {SECRET}" for r in server.requests)
