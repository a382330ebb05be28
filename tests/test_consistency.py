"""Multilingual self-consistency: the prompts against the paper text, the released data layouts (PAWS-X,
XNLI), the conditions' prompts, answer mapping (§3.2), likelihood answers against a plain HF forward
pass, the metrics on hand-computed cases (consistency, App. D, ROUGE), COMET plumbing, and the CLI in
both protocols (local and over HTTP)."""

from __future__ import annotations

import json
import re
import sys
import types
import unicodedata
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sacrebleu
import torch

from babelprobe.benchmarks.consistency import (
    PARTS,
    PROTOCOLS,
    Settings,
    answer_likelihood,
    condition_requests,
    consistency_summary,
    load_consistency,
    load_prompts,
    make_senses,
    map_answer,
    prepare,
    read_source,
    rouge_scores,
    run_consistency,
    sense_requests,
    summarize,
    unquote,
    with_consistency,
)
from babelprobe.cli import main
from babelprobe.errors import BabelprobeError
from tests.test_generate_http import OpenAIStub
from tests.tiny import tiny_lm

PAPER = Path(__file__).resolve().parents[2] / "shared" / "papers" / "002_72e778b5e4d65377.txt"
PROMPTS = load_prompts()


@pytest.fixture(scope="module")
def lm():
    return tiny_lm("llama", max_positions=1024)


class Translator:
    """A stand-in translator: '<de> text' for a translation into German, '<para> text' for a paraphrase;
    with `references`, a translation is looked up there instead (a perfect translator). It reads both
    the one-shot prompt and App. C's."""

    name = "scripted-translator"

    def __init__(self, references: dict[tuple[str, str], str] | None = None):
        self.references = references or {}

    def generate(self, prompts, max_new_tokens=64, stop=None, temperature=0.0, seed=0):
        return [self.one(p) for p in prompts]

    def one(self, prompt: str) -> str:
        lines = prompt.split("\n")
        if lines[-1] == "Paraphrase:":
            return f" <para> {lines[-2].split(': ', 1)[1]}\nmore"
        paper = re.fullmatch(r'Please translate the following text into (\w+): "(.*)"', prompt, re.S)
        name, text = paper.groups() if paper else (lines[-1][:-1], lines[-2].split(": ", 1)[1])
        code = {"German": "de", "French": "fr", "Chinese": "zh"}[name]
        return " " + self.references.get((text, code), f"<{code}> {text}") + "\nignored second line"


# --------------------------------------------------------------------------------- prompts vs the paper

def normalise(text: str) -> str:
    """The paper's PDF text and a template made comparable: full-width forms folded (NFKC), curly
    quotes straight, words split over a line joined, all white space removed."""
    text = unicodedata.normalize("NFKC", text).replace("“", '"').replace("”", '"').replace("’", "'")
    text = re.sub(r"(\w)-\s*\n\s*(\w)", r"\1\2", text)
    return re.sub(r"\s+", "", text)


@pytest.fixture(scope="module")
def paper() -> str:
    if not PAPER.is_file():
        pytest.skip("the paper text (../shared/papers) is not here")
    return PAPER.read_text(encoding="utf-8")


def section(text: str, start: str, end: str) -> str:
    return text[text.index(start):text.index(end, text.index(start))]


def table_6(paper: str) -> dict[tuple[str, str], str]:
    """Table 6's original instructions, {(task, language): text}: a row is `TASK?\tI_{xx}\ttext`, a text
    broken over lines continues in `\t\ttext`; PAWS-X's rows come first, then XNLI's."""
    rows = []
    for line in section(paper, "Task\tLanguage\tInstruction", "Table 6:").splitlines()[1:]:
        cells = line.split("\t")
        if len(cells) >= 3 and cells[1]:
            rows.append([cells[1], cells[2]])
        elif rows:
            rows[-1][1] += "\n" + cells[-1]
    table, seen = {}, set()
    for label, text in rows:
        language = re.fullmatch(r"I_\{(en|de|zh)\}", label)
        if language:
            task = "xnli" if (label in seen) else "paws-x"
            seen.add(label)
            table[task, language.group(1)] = re.sub(r"\s*⁷$", "", text)  # footnote 7's mark
    return table


@pytest.mark.parametrize("task", ["paws-x", "xnli"])
@pytest.mark.parametrize("language", ["en", "de", "zh"])
def test_task_prompts_are_table_6(paper, task, language):
    """App. B, Table 6: the original instruction I_en, I_de or I_zh of the task, around "[sentence_1]" and
    "[sentence_2]", whole (white space aside: the PDF text drops and adds spaces around Chinese)."""
    row = normalise(table_6(paper)[task, language]).replace('句子I:"', '句子1:"')  # the PDF reads this 1 as I
    prompt = PROMPTS.question(PROMPTS.instruction(task, language), ["[sentence_1]", "[sentence_2]"], language, cue=False)
    assert normalise(prompt) == row
    assert prompt.startswith(PROMPTS.instruction(task, language)["prefix"] + " ")


def test_translation_prompts_are_app_c(paper):
    app_c = normalise(section(paper, "C Translation instructions", "D Inconsistencies"))
    english = PROMPTS.paper[("en", "*")].format(target="German/Chinese", text="[text]")
    assert normalise(english) in app_c
    for source in ("de", "zh"):
        assert normalise(PROMPTS.translation("[text]", source, "en", "paper")[0]) in app_c


def test_paper_preset_decoding_is_section_3_1(paper):
    methods = " ".join(section(paper, "3.1 Model and hyperparameters", "3.2 Benchmarking").split())
    preset = PROTOCOLS["paper"]
    assert float(re.search(r"temperature to (\d+(?:\.\d+)?)", methods).group(1)) == preset["temperature"]
    answer, translation = re.search(r"tokens to (\d+) for benchmarking.*?and (\d+) for translation", methods).groups()
    assert (int(answer), int(translation)) == (preset["answer_tokens"], preset["max_new_tokens"])


def test_instructions_are_translated_in_three_parts():
    """§3.3: prefix, the word for "sentence" and suffix in separate requests, recomposed."""
    data = load_consistency("consistency-sample", limit=1, targets=["de"])
    requests = sense_requests(data, Settings(translation_prompt="paper", baseline="none"))
    instruction = requests[requests["item_id"] == ""]
    assert list(instruction["field"]) == list(PARTS)
    assert list(instruction["prompt"]) == [f'Please translate the following text into German: "{t}"' for t in
                                           PROMPTS.instruction("paws-x", "en").values()]
    senses = make_senses(Translator(), requests)
    questions = condition_requests(data, senses, Settings(translation_prompt="paper", baseline="none", cue=False))
    t = questions[questions["condition"] == "T"].iloc[0]
    s1, s2 = data.items.at[0, "sentence1"], data.items.at[0, "sentence2"]
    assert t["prompt"] == ('<de> Do the following sentences have the same meaning? <de> Sentence 1: "<de> '
                           f'{s1}" <de> Sentence 2: "<de> {s2}" <de> Please answer with "yes" or "no".')


# ---------------------------------------------------------------------------------------------- answers

@pytest.mark.parametrize("response,language,label,how", [
    ("The answer is yes", "en", 1, "contains"),  # §3.2: containing the template answer is valid
    ("Yes, the sentences have the same meaning.", "en", 1, "start"),
    (" no", "en", 0, "match"), ('"YES"', "en", 1, "match"), ("Nein.", "de", 0, "match"), ('"ja"', "de", 1, "match"),
    ("Die Antwort ist ja.", "de", 1, "contains"), ("Oui", "fr", 1, "match"),
    ("不是。", "zh", 0, "match"), ("是的，意思相同", "zh", 1, "start"), ("这两个句子的意思不是相同的", "zh", 0, "contains"),
    ("maybe", "en", -1, "none"), ("Yesterday", "en", -1, "none"), ("", "en", -1, "empty"),
    ("I cannot say yes or no", "en", -1, "ambiguous"),
])
def test_answers_map_to_labels(response, language, label, how):
    assert map_answer(response, PROMPTS_TASKS["paws-x"].words(language)) == (label, how)


PROMPTS_TASKS = {name: load_consistency(sample).task for name, sample in
                 (("paws-x", "consistency-sample"), ("xnli", "consistency-xnli-sample"))}


@pytest.mark.parametrize("response,label", [
    ("(B)", 2), ("A", 0), ("C.", 1), ("The answer is C.", 1), ("(A) the first sentence entails the second", 0),
    ("A sentence pair like this is hard", -1), ("Antwort", -1), ("B or C", 2),
])
def test_xnli_letters(response, label):
    """A, B, C (App. B) -> entailment 0, contradiction 2, neither 1; "A" the article is no answer."""
    assert map_answer(response, PROMPTS_TASKS["xnli"].words("de"))[0] == label


def test_translations_lose_one_pair_of_quotes():
    assert unquote(' "Haben die Sätze die gleiche Bedeutung?" ') == "Haben die Sätze die gleiche Bedeutung?"
    assert unquote('"Bitte antworte mit "ja" oder "nein"."') == 'Bitte antworte mit "ja" oder "nein".'
    assert unquote('"ja" oder "nein"') == '"ja" oder "nein"'
    assert unquote("「是」") == "是"


# --------------------------------------------------------------------------------------- data layouts

def write_tsv(path: Path, header: list[str], rows: list[list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join("\t".join(map(str, r)) for r in [header, *rows]) + "\n", encoding="utf-8")
    return path


PAWSX = {"en": [[1, 'In 1990 he moved to "Berlin" with his wife.', "With his wife, he moved to Berlin in 1990.", 1],
                [2, "Anna sold the car to Peter.", "Peter sold the car to Anna.", 0],
                [3, "The river flows into the lake.", "The lake flows into the river.", 0]],
         "de": [[1, 'Im Jahr 1990 zog er mit seiner Frau nach "Berlin".', "Mit seiner Frau zog er 1990 nach Berlin.", 1],
                [2, "Anna verkaufte das Auto an Peter.", "", 0],
                [3, "Der Fluss mündet in den See.", "Der See mündet in den Fluss.", 0]]}


def test_pawsx_release_tsv(tmp_path):
    """Mimics the PAWS-X release: x-final/<lang>/test_2k.tsv, header id/sentence1/sentence2/label, no
    quoting (a " is text), the language only in the folder name. A record with an empty sentence is
    skipped and counted; its id loses its German reference."""
    for lang, rows in PAWSX.items():
        write_tsv(tmp_path / "x-final" / lang / "test_2k.tsv", ["id", "sentence1", "sentence2", "label"], rows)
    write_tsv(tmp_path / "x-final" / "de" / "dev_2k.tsv", ["id", "sentence1", "sentence2", "label"], PAWSX["de"])
    data = load_consistency(tmp_path / "x-final")  # a directory: its test files only
    assert data.task.name == "paws-x" and list(data.items["id"]) == ["1", "2", "3"]
    assert data.items.at[0, "sentence1"] == 'In 1990 he moved to "Berlin" with his wife.'
    assert data.items.at[0, "sentence2_de"] == PAWSX["de"][0][2] and pd.isna(data.items.at[1, "sentence2_de"])
    assert data.targets == ["de"]
    assert data.skipped[["id", "language", "reason"]].values.tolist() == [["2", "de", "empty sentence2"]]
    assert data.skipped.at[0, "source"].endswith("x-final/de/test_2k.tsv:3")
    one = load_consistency(tmp_path / "x-final" / "de" / "test_2k.tsv")
    assert set(one.items["language"]) == {"de"} and len(one.items) == 2 and len(one.skipped) == 1


def test_pawsx_hub_export(tmp_path):
    """Mimics the hub export of google-research-datasets/paws-x: <config>/test-00000-of-00001.parquet with
    id (int), sentence1, sentence2, label (int) and no language column."""
    for lang, rows in PAWSX.items():
        frame = pd.DataFrame(rows, columns=["id", "sentence1", "sentence2", "label"]).astype({"id": "int32"})
        (tmp_path / lang).mkdir()
        frame.to_parquet(tmp_path / lang / "test-00000-of-00001.parquet")
    data = load_consistency(tmp_path)
    assert set(data.items["language"]) == {"en"} and data.targets == ["de"] and len(data.skipped) == 1
    german = load_consistency(tmp_path, language="de")  # the other direction: German is the source
    assert list(german.items["id"]) == ["1", "3"] and german.targets == ["en"]
    lone = tmp_path / "download.parquet"
    (tmp_path / "en" / "test-00000-of-00001.parquet").rename(lone)
    with pytest.raises(BabelprobeError, match=r"download.parquet: cannot tell the language.*--language de"):
        load_consistency(lone)
    assert set(load_consistency(lone, language="en").items["language"]) == {"en"}


def test_hub_config_names_the_language(monkeypatch):
    """`hf:NAME:CONFIG` (online in real use; here `datasets.load_dataset` is replaced by the PAWS-X hub
    export's shape): the config is the language."""
    import datasets

    asked = []

    def load_dataset(name, config, split):
        asked.append((name, config, split))
        return datasets.Dataset.from_pandas(pd.DataFrame(PAWSX[config], columns=["id", "sentence1", "sentence2", "label"]))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    data = load_consistency("hf:google-research-datasets/paws-x:de", targets=["en"])
    assert asked == [("google-research-datasets/paws-x", "de", "test")]
    assert set(data.items["language"]) == {"de"} and list(data.items["id"]) == ["1", "3"]
    assert data.skipped.at[0, "source"] == "hf:google-research-datasets/paws-x:de row 2"


XNLI_HEADER = ["language", "gold_label", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse",
               "sentence2_parse", "sentence1", "sentence2", "promptID", "pairID", "genre", "label1", "label2",
               "label3", "label4", "label5", "sentence1_tokenized", "sentence2_tokenized", "match"]
XNLI = [("en", "entailment", "The man is sleeping.", "A man rests.", "1"),
        ("en", "contradiction", "The shop opens at nine.", "The shop never opens.", "2"),
        ("en", "-", "She said \"hello\".", "She spoke.", "3"),
        ("de", "entailment", "Der Mann schläft.", "Ein Mann ruht.", "1"),
        ("de", "contradiction", "Der Laden öffnet um neun.", "Der Laden öffnet nie.", "2"),
        ("zh", "entailment", "那个人在睡觉。", "一个人在休息。", "1"),
        ("zh", "neutral", "商店九点开门。", "商店很受欢迎。", "2")]


def xnli_record(language, gold, premise, hypothesis, pair):
    return {"language": language, "gold_label": gold, "sentence1": premise, "sentence2": hypothesis, "promptID": pair,
            "pairID": pair, "genre": "facetoface", "annotator_labels": [gold], "match": "True",
            "sentence1_tokenized": premise, "sentence2_tokenized": hypothesis}


def test_xnli_release_tsv_and_jsonl(tmp_path):
    """Mimics the XNLI 1.0 release: XNLI-1.0/xnli.test.tsv (the columns of the release, no quoting) and
    xnli.test.jsonl (one object per line), every language in one file, gold_label strings, pairID
    shared by a pair's translations. A record whose gold_label is no label ('-') is skipped and counted."""
    rows = [[r["language"], r["gold_label"], "", "", "", "", r["sentence1"], r["sentence2"], r["promptID"],
             r["pairID"], r["genre"], r["gold_label"], "", "", "", "", r["sentence1"], r["sentence2"], r["match"]]
            for r in (xnli_record(*x) for x in XNLI)]
    tsv = write_tsv(tmp_path / "XNLI-1.0" / "xnli.test.tsv", XNLI_HEADER, rows)
    jsonl = tmp_path / "XNLI-1.0" / "xnli.test.jsonl"
    jsonl.write_text("".join(json.dumps(xnli_record(*x), ensure_ascii=False) + "\n" for x in XNLI), encoding="utf-8")
    for path in (tsv, jsonl):
        data = load_consistency(path)
        assert data.task.name == "xnli" and list(data.items["id"]) == ["1", "2"]
        assert list(data.items["label"]) == [0, 2] and data.targets == ["de", "zh"]
        assert data.items.at[0, "premise_de"] == "Der Mann schläft." and data.items.at[1, "hypothesis_zh"] == "商店很受欢迎。"
        assert data.skipped[["id", "language"]].values.tolist() == [["3", "en"]]
        assert data.skipped.at[0, "reason"].startswith("label - not among")
        chinese = load_consistency(path, language="zh")  # a source other than English: the paper's I_zh
        assert list(chinese.items["label"]) == [0, 1] and chinese.targets == ["de", "en"]


def test_xnli_hub_per_language_export(tmp_path):
    """Mimics the hub's per-language XNLI export (facebook/xnli, config de): <lang>/test-00000-of-00001.parquet
    with premise, hypothesis, label (0 entailment, 1 neutral, 2 contradiction), no id and no language:
    the files of one split are parallel row by row."""
    for lang in ("en", "de"):
        part = [x for x in XNLI if x[0] == lang and x[1] != "-"]
        frame = pd.DataFrame({"premise": [x[2] for x in part], "hypothesis": [x[3] for x in part],
                              "label": [{"entailment": 0, "contradiction": 2}[x[1]] for x in part]})
        (tmp_path / lang).mkdir()
        frame.to_parquet(tmp_path / lang / "test-00000-of-00001.parquet")
    data = load_consistency(tmp_path)
    assert data.task.name == "xnli" and list(data.items["label"]) == [0, 2]
    assert list(data.items["premise_de"]) == ["Der Mann schläft.", "Der Laden öffnet um neun."]


def test_unusable_data_is_named(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps({"item_id": "a", "task": "paws-x", "language": "en", "sentence1": "A", "label": 1}) + "\n")
    with pytest.raises(BabelprobeError, match="records lack the field 'sentence2'"):
        load_consistency(path)
    with pytest.raises(BabelprobeError, match="unknown task 'boolq'"):
        load_consistency(path, task="boolq")
    twice = write_tsv(tmp_path / "en" / "test.tsv", ["id", "sentence1", "sentence2", "label"],
                      [[1, "a", "b", 0], [1, "c", "d", 1]])
    with pytest.raises(BabelprobeError, match=r"id 1 appears twice in language en .*test.tsv:2.*test.tsv:3"):
        load_consistency(twice)
    with pytest.raises(BabelprobeError, match=r"no usable records in the source language 'fr'"):
        load_consistency("consistency-sample", language="fr")


# ------------------------------------------------------------------------------------------- conditions

def build(data, translator=None, settings=None):
    settings = settings or Settings()
    senses = make_senses(translator or Translator(), sense_requests(data, settings), settings)
    return condition_requests(data, senses, settings)


def test_each_condition_uses_the_right_senses():
    data = load_consistency("consistency-sample", limit=2, targets=["de"])
    q = build(data).set_index(["item_id", "condition"])
    s1, s1_de = data.items.at[0, "sentence1"], data.items.at[0, "sentence1_de"]
    en = PROMPTS.instruction("paws-x", "en")
    de = {p: f"<de> {t}" for p, t in en.items()}
    para = {p: f"<para> {t}" for p, t in en.items()}
    expect = {"orig": (en, s1, "Answer:"), "T": (de, f"<de> {s1}", "Antwort:"), "I": (de, s1, "Antwort:"),
              "X": (en, f"<de> {s1}", "Answer:"), "R": (de, s1_de, "Antwort:"), "P": (para, f"<para> {s1}", "Answer:")}
    for condition, (parts, sentence, cue) in expect.items():
        row = q.loc[("pawsx-001", condition)]
        assert row["input_sentence1"] == sentence
        assert row["prompt"] == (f'{parts["prefix"]} {parts["sentence"]} 1: "{sentence}" {parts["sentence"]} 2: '
                                 f'"{row["input_sentence2"]}" {parts["suffix"]}\n{cue}')
    assert sorted(q.index.get_level_values(1).unique()) == ["I", "P", "R", "T", "X", "orig"]
    assert q.loc[("pawsx-001", "I"), "instruction_reference"] == " ".join(PROMPTS.instruction("paws-x", "de").values())


def test_mixed_condition_asks_the_native_instruction_around_the_original_input():
    """Table 9 (App. F): original input X of the source language with the native instruction I of another."""
    data = load_consistency("consistency-sample", limit=2, targets=["de"])
    q = build(data, settings=Settings(mixed=True)).set_index(["item_id", "condition"])
    row = q.loc[("pawsx-001", "M")]
    de, s1 = PROMPTS.instruction("paws-x", "de"), data.items.at[0, "sentence1"]
    assert row["input_sentence1"] == s1 and (row["instruction_language"], row["input_language"]) == ("de", "en")
    assert row["prompt"] == (f'{de["prefix"]} {de["sentence"]} 1: "{s1}" {de["sentence"]} 2: '
                             f'"{row["input_sentence2"]}" {de["suffix"]}\nAntwort:')
    assert "M" not in build(data).set_index(["item_id", "condition"]).index.get_level_values(1)


def reference_answer(lm, prompt: str, words: dict[int, list[str]], sep: str = " ") -> int:
    """Independent of babelprobe's scoring core: one plain HF forward pass per prompt+word."""
    scores = {}
    for label, variants in words.items():
        per_variant = []
        for word in variants:
            p_ids = [lm.tokenizer.bos_token_id] + lm.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            full = [lm.tokenizer.bos_token_id] + lm.tokenizer(prompt + sep + word, add_special_tokens=False)["input_ids"]
            assert full[:len(p_ids)] == p_ids  # the word's tokens do not merge with the prompt's end here
            n = len(full) - len(p_ids)  # the word's tokens; the n states before them predict them
            with torch.inference_mode():
                logits = lm.model(torch.tensor([full]), logits_to_keep=n + 1).logits[0, :-1].double()
            per_variant.append(sum(logits.log_softmax(-1)[k, full[len(p_ids) + k]].item() for k in range(n)))
        scores[label] = np.logaddexp.reduce(per_variant)
    return max(scores, key=scores.get)


def test_likelihood_answers_match_a_plain_forward_pass(lm):
    data = load_consistency("consistency-sample", limit=2, targets=["de"])
    q = build(data)
    answered = answer_likelihood(lm, q, data.task)
    expected = [reference_answer(lm, p, data.task.words(lang)) for p, lang in zip(q["prompt"], q["instruction_language"])]
    assert list(answered["prediction"]) == expected
    assert all(set(json.loads(s)) == {"0", "1"} for s in answered["scores"])


# ---------------------------------------------------------------------------------------------- metrics

def hand_rows(**columns) -> pd.DataFrame:
    base = {"item_id": list("abcd") * 2, "condition": ["orig"] * 4 + ["X"] * 4, "language": ["en"] * 4 + ["de"] * 4,
            "label": [1, 1, 0, 0] * 2, "method": "likelihood"}
    return pd.DataFrame({**base, **columns})


def test_consistency_metrics_on_a_hand_computed_case():
    rows = with_consistency(hand_rows(prediction=[1, 0, 1, 0, 1, 1, 0, 0], chrf=[np.nan] * 4 + [10.0, 20, 30, 40],
                                      bleu=[np.nan] * 4 + [60.0, 50, 40, 10]))
    assert list(rows["orig_correct"][:4]) == [True, False, False, True]
    assert list(rows["consistent"][4:]) == [True, False, False, True]
    s = consistency_summary(rows).set_index(["metric", "language", "condition", "group"])
    assert s.loc[("consistency", "de", "X", "all"), ["k", "n"]].tolist() == [2, 4]
    assert s.loc[("consistency", "de", "X", "orig_correct"), "value"] == 1.0
    assert s.loc[("consistency", "de", "X", "orig_incorrect"), "value"] == 0.0
    assert s.loc[("accuracy", "de", "X", "all"), "value"] == 1.0  # X answers are all right
    # App. D: items a (BLEU 60) and b (50) have BLEU >= 50; a is consistent, b is not
    assert s.loc[("consistency", "de", "X", "bleu>=50"), ["k", "n"]].tolist() == [1, 2]
    assert s.loc[("share_bleu>=50", "de", "X", "all"), ["k", "n"]].tolist() == [2, 4]
    r = np.corrcoef([60, 50, 40, 10], [1, 0, 0, 1])[0, 1]
    assert s.loc[("corr_bleu_consistent", "de", "X", "all"), "value"] == pytest.approx(r)


def test_invalid_answers_count_as_their_own_label():
    """Footnote 3: a response that maps to no label gets a label of its own (-1)."""
    rows = with_consistency(hand_rows(prediction=[1, -1, -1, 0, 1, -1, 0, -1], method="generate"))
    assert list(rows["consistent"][4:]) == [True, True, False, False]
    s = consistency_summary(rows).set_index(["metric", "language", "condition", "group"])
    assert s.loc[("valid", "en", "orig", "all"), ["k", "n"]].tolist() == [2, 4]
    assert s.loc[("valid", "de", "X", "all"), ["k", "n"]].tolist() == [2, 4]


def test_rouge_with_the_package_on_a_hand_case():
    """ROUGE-1/2/L F-measures counted by hand: 'the cat sat on the mat' against 'the cat lay on the mat'
    shares 5 of 6 words, 3 of 5 bigrams and a 5-word common subsequence; 我爱猫 against 我喜欢猫 (one
    token per character) 2 of 3 and 2 of 4 characters, no bigram, a 2-character subsequence."""
    f = lambda p, r: 2 * p * r / (p + r)  # noqa: E731
    english = rouge_scores(["the cat sat on the mat"], ["the cat lay on the mat"])
    assert english == pytest.approx({"rouge1": 5 / 6, "rouge2": 3 / 5, "rougeL": 5 / 6})
    chinese = rouge_scores(["我爱猫"], ["我喜欢猫"])
    assert chinese == pytest.approx({"rouge1": f(2 / 3, 2 / 4), "rouge2": 0.0, "rougeL": f(2 / 3, 2 / 4)})
    both = rouge_scores(["the cat sat on the mat", "我爱猫"], ["the cat lay on the mat", "我喜欢猫"])
    assert both["rouge1"] == pytest.approx((5 / 6 + f(2 / 3, 2 / 4)) / 2)


def test_a_perfect_translator_scores_100_and_T_equals_R(lm):
    data = load_consistency("consistency-sample", limit=4, targets=["de", "zh"])
    items = data.items
    references = {(items.at[i, f], lang): items.at[i, f"{f}_{lang}"]
                  for i in items.index for f in data.task.fields for lang in ("de", "zh")}
    for lang in ("de", "zh"):
        for part in PARTS:
            references[(PROMPTS.instruction("paws-x", "en")[part], lang)] = PROMPTS.instruction("paws-x", lang)[part]
    rows = run_consistency(data, Translator(references), lm=lm)
    summary = summarize(rows)
    quality = summary[summary["metric"].isin(["bleu", "chrf"])]
    assert np.allclose(quality["value"], 100.0) and len(quality) == 8
    assert np.allclose(summary[summary["metric"].str.startswith("rouge")]["value"], 1.0)
    t = rows[rows["condition"] == "T"].set_index(["item_id", "language"])
    r = rows[rows["condition"] == "R"].set_index(["item_id", "language"])
    assert (t["prediction"] == r["prediction"]).all() and (t["prompt"] == r["prompt"]).all()
    assert np.allclose(t["chrf"], 100.0)
    # and an imperfect one is scored by sacrebleu as such
    data = load_consistency("consistency-sample", limit=4, targets=["de"])
    rows = run_consistency(data, Translator(), lm=lm)
    t = rows[rows["condition"] == "T"].iloc[0]
    ref = data.items.set_index("item_id").loc[t["item_id"]]
    expected = np.mean([sacrebleu.sentence_chrf(t[f"input_{f}"], [ref[f"{f}_de"]]).score for f in data.task.fields])
    assert t["chrf"] == pytest.approx(expected)


class Copier(Translator):
    """Returns the source text for German and the prompt's own example sentence for French."""

    def one(self, prompt: str) -> str:
        text = prompt.split("\n")[-2].split(": ", 1)[1]
        return PROMPTS.example["fr"] if prompt.endswith("French:") else text


def test_degenerate_senses_are_flagged_and_counted(lm):
    data = load_consistency("consistency-sample", limit=2, targets=["de", "fr"])
    rows = run_consistency(data, Copier(), Settings(baseline="none"), lm=lm)
    summary = summarize(rows)
    t = rows[rows["condition"] == "T"].set_index("language")
    assert set(t.loc["de", "instruction_status"]) == {"copy of source"} == set(t.loc["de", "input_status"])
    assert set(t.loc["fr", "instruction_status"]) == {"copy of example"}
    assert set(rows[rows["condition"] == "R"]["input_status"]) == {"reference"}
    assert set(rows[rows["condition"] == "orig"]["instruction_status"]) == {"original"}
    s = summary.set_index(["metric", "language", "condition", "group"])
    assert s.loc[("sense_copy_of_source", "de", "translated", "input"), ["k", "n"]].tolist() == [4, 4]
    assert s.loc[("sense_copy_of_example", "fr", "translated", "instruction"), ["k", "n"]].tolist() == [3, 3]
    assert set(t.loc["fr", "instruction_status_sentence"]) == {"copy of example"}  # each part has its status
    assert s.loc[("sense_copy_of_source", "fr", "translated", "input"), "value"] == 0.0


def test_settings_that_cannot_run(lm):
    data = load_consistency("consistency-sample", limit=2, targets=["de"])
    with pytest.raises(BabelprobeError, match="rerun baseline .* --temperature above 0"):
        run_consistency(data, Translator(), Settings(baseline="rerun"), lm=lm)
    with pytest.raises(BabelprobeError, match="no target language"):
        run_consistency(load_consistency("consistency-sample", limit=2, targets=["en"]), Translator(), lm=lm)
    with pytest.raises(BabelprobeError, match="no label words for language 'sw'"):
        run_consistency(load_consistency("consistency-sample", limit=2, targets=["sw"]), Translator(), lm=lm)
    with pytest.raises(BabelprobeError, match=r"no App. C translation prompt from 'de' into 'fr'"):
        PROMPTS.translation("Satz", "de", "fr", "paper")


def test_comet_is_an_optional_extra(monkeypatch, lm):
    """Without the extra: one clear line. With it (a stand-in `comet` module here; the real one
    downloads the model): each item's score is the mean of its two texts', the summary their mean."""
    data = load_consistency("consistency-sample", limit=2, targets=["de"])
    monkeypatch.setitem(sys.modules, "comet", None)
    with pytest.raises(BabelprobeError, match=r"COMET-22 needs the optional extra: pip install 'babelprobe\[comet\]'"):
        run_consistency(data, Translator(), Settings(baseline="none", comet=True), lm=lm)
    fake = types.ModuleType("comet")
    asked = []

    class Model:
        def predict(self, samples, batch_size, gpus, progress_bar):
            asked.extend(samples)
            return types.SimpleNamespace(scores=[0.1 * (i + 1) for i in range(len(samples))])

    fake.download_model = lambda name: f"/cache/{name}"
    fake.load_from_checkpoint = lambda path: Model() if path == "/cache/Unbabel/wmt22-comet-da" else None
    monkeypatch.setitem(sys.modules, "comet", fake)
    rows = run_consistency(data, Translator(), Settings(baseline="none", comet=True), lm=lm)
    assert [s["mt"] for s in asked[:2]] == [f"<de> {data.items.at[0, f]}" for f in data.task.fields]
    x = rows[rows["condition"] == "X"].set_index("item_id")["comet"]
    assert x.tolist() == pytest.approx([0.15, 0.35])
    comet = summarize(rows).query("metric == 'comet'")
    assert comet["value"].tolist() == pytest.approx([0.25])


# -------------------------------------------------------------------------------------------------- CLI

def cli(*args) -> int:
    return main(["bench", "consistency", *map(str, args), "--no-progress"])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, lm):
    path = tmp_path_factory.mktemp("tiny-1024")
    lm.model.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    return path


def test_cli_default_protocol_writes_rows_summary_and_figure(model_dir, tmp_path, capsys):
    out = tmp_path / "sc"
    assert cli("--model", model_dir, "--data", "consistency-sample", "--limit", "3", "--langs", "de",
               "--max-new-tokens", "6", "--out", out) == 0
    printed = capsys.readouterr().out
    assert "protocol: default" in printed and "consistency with orig answers" in printed and "rouge1" in printed
    rows = pd.read_csv(out / "items.csv")
    assert len(rows) == 3 * 6 and set(rows["condition"]) == {"orig", "T", "I", "X", "R", "P"}
    assert {"pair_id", "id", "language", "subset", "method", "correct", "consistent"} <= set(rows.columns)
    summary = pd.read_csv(out / "summary.csv")
    assert {"accuracy", "consistency", "bleu", "chrf", "rouge1", "rouge2", "rougeL"} <= set(summary["metric"])
    assert (out / "consistency.pdf").exists() and (out / "consistency.png").exists()
    # the summary is computable from the written rows alone
    again = summarize(rows)
    key = ["metric", "language", "condition", "group"]
    again[key], summary[key] = again[key].fillna(""), summary[key].fillna("")  # CSV writes "" as empty
    merged = summary.merge(again, on=key, suffixes=("", "_again"))
    assert len(merged) == len(summary) == len(again)
    assert np.allclose(merged["value"], merged["value_again"], equal_nan=True)


def test_cli_paper_protocol_on_the_sample(model_dir, tmp_path, capsys):
    """`--protocol paper` from the CLI with the local generator: App. B/C prompts, answers generated at
    temperature 0.25 and mapped by §3.2, the rerun baseline sampled with the next seed. The tiny test
    model has a 1024-token context, so each translation is bounded lower than the paper's 2048."""
    out = tmp_path / "paper"
    assert cli("--model", model_dir, "--data", "consistency-sample", "--limit", "2", "--langs", "de",
               "--protocol", "paper", "--generator", "local", "--max-new-tokens", "24", "--out", out) == 0
    printed = capsys.readouterr().out
    assert "protocol: paper" in printed and "valid answers" in printed
    rows = pd.read_csv(out / "items.csv")
    assert set(rows["condition"]) == {"orig", "T", "I", "X", "R", "rerun"} and set(rows["method"]) == {"generate"}
    assert set(rows["protocol"]) == {"paper"} and rows["match"].isin(["match", "start", "contains", "none",
                                                                        "ambiguous", "empty"]).all()
    orig = rows[rows["condition"] == "orig"].iloc[0]
    assert orig["prompt"].startswith("Do the following sentences have the same meaning? Sentence 1: ")
    assert orig["prompt"].endswith('Please answer with "yes" or "no".')  # no answer cue
    run = json.loads((out / "run.json").read_text())
    assert json.dumps(run).count('"temperature": 0.25') >= 1
    # generation keys: [generator, fingerprint, max_new_tokens, stop, temperature, seed, prompt]
    keys = [json.loads(json.loads(line)["key"]) for line in (out / "generations.jsonl").read_text().splitlines()]
    translations = [k for k in keys if k[-1].startswith("Please translate the following text into German: ")]
    answers = [k for k in keys if k[-1].startswith("Do the following sentences")]
    assert translations and {(k[2], *map(tuple, [k[3]]), k[4], k[5]) for k in translations} == {(24, (), 0.25, 0)}
    assert {(k[2], k[4], k[5]) for k in answers} == {(256, 0.25, 0), (256, 0.25, 1)}  # rerun: the next seed
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["protocol"]) == {"paper"} and "rerun" in set(summary["condition"])


def test_cli_reports_skipped_records_of_a_release_file(model_dir, tmp_path, capsys):
    """A `--limit 5` scoring of an XNLI release file (layout as in test_xnli_release_tsv_and_jsonl):
    the broken record is reported on the terminal, in the summary and as a row."""
    jsonl = tmp_path / "XNLI-1.0" / "xnli.test.jsonl"
    jsonl.parent.mkdir()
    jsonl.write_text("".join(json.dumps(xnli_record(*x), ensure_ascii=False) + "\n" for x in XNLI), encoding="utf-8")
    out = tmp_path / "xnli"
    assert cli("--model", model_dir, "--items", jsonl, "--limit", "5", "--langs", "de", "--baseline", "none",
               "--max-new-tokens", "4", "--out", out) == 0
    printed = capsys.readouterr().out
    assert "skipped 1 records" in printed and "en: 1 × label not among [0, 1, 2]" in printed
    rows = pd.read_csv(out / "items.csv", dtype={"id": str})
    skipped = rows[rows["condition"] == "skipped"]
    assert skipped[["id", "language"]].values.tolist() == [["3", "en"]]
    assert set(rows[rows["condition"] == "orig"]["id"]) == {"1", "2"}
    summary = pd.read_csv(out / "summary.csv")
    assert summary.query("metric == 'skipped'")["n"].tolist() == [1]


def test_cli_generate_answers_over_http_without_a_local_model(lm, tmp_path, capsys):
    from babelprobe.benchmarks.core.generate import local_generator

    out = tmp_path / "sc-http"
    with OpenAIStub(local_generator(lm)) as server:
        assert cli("--model", tmp_path / "no-model-here", "--data", "consistency-sample", "--limit", "2",
                   "--langs", "fr", "--answer", "generate", "--baseline", "none", "--max-new-tokens", "4",
                   "--generator", f"openai-completions:tiny@{server.url}", "--out", out) == 0
    rows = pd.read_csv(out / "items.csv")
    assert set(rows["method"]) == {"generate"} and set(rows["condition"]) == {"orig", "T", "I", "X", "R"}
    assert rows["prediction"].isin([-1, 0, 1]).all()
    # 3 instruction parts + 2 items × 2 fields to translate, then the distinct ones of 2 items × 5 prompts
    assert len(rows) == 10 and len(server.requests) == 3 + 4 + rows["prompt"].nunique()


def test_prepare_applies_the_targets_and_limit_given_to_load():
    from babelprobe.benchmarks.consistency import load

    records = load("consistency-sample", languages=["zh"], limit=3)  # the contract's load only reads
    assert len(records) == len(read_source("consistency-sample")) == 24
    data = prepare(records, Settings())  # the contract's prepare: with the settings (the source language)
    assert len(data.items) == 3 and data.targets == ["zh"]
    assert prepare(records, Settings(), targets=["de"], limit=2).targets == ["de"]


@pytest.mark.slow
def test_default_model_likelihood_answer_matches_a_plain_forward_pass(default_lm):
    data = load_consistency("consistency-sample", limit=1, targets=["de"])
    q = build(data, settings=Settings(baseline="none"))
    q = q[q["condition"].isin(["orig", "R"])]
    answered = answer_likelihood(default_lm, q, data.task)
    expected = [reference_answer(default_lm, p, data.task.words(lang)) for p, lang in zip(q["prompt"], q["instruction_language"])]
    assert list(answered["prediction"]) == expected
