"""The meta scorer (metalinguistic prompting): templates, scores against an independent plain forward
pass, the rules for the two orders, position bias, the chat variant, the CLI and bad input."""

import json
import re
import string
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from babelprobe.benchmarks.meta import (
    PROMPT_SETS,
    _decide,
    load_prompts,
    margins,
    position_bias,
    prompts_digest,
    score_meta,
)
from babelprobe.cli import main
from babelprobe.errors import BabelprobeError
from babelprobe.languages import language_table
from tests.tiny import tiny_lm

XCOMPS_LANGUAGES = {"ar", "ca", "de", "el", "es", "fa", "fr", "he", "hu", "ja", "ko", "nl", "ru", "tr", "uk", "vi", "zh"}
PAPER = Path(__file__).resolve().parents[2] / "shared" / "papers" / "003_af80b5b01c4f8a1a.txt"  # XCOMPS
EN_PROMPT = 'Which concept is most likely to have the following property: "{}", "{}" or "{}"? Answer: "'
GEMMA_LIKE_CHAT = ("{{ bos_token }}{% for m in messages %}<start_of_turn>"
                   "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] | trim }}<end_of_turn>\n"
                   "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
PAIRS = [("en", "can bark", "dog", "cat"), ("en", "can fly", "eagle", "chair"), ("de", "kann bellen", "Hund", "Katze"),
         ("zh", "会爬树", "猫", "狗")]


def make_items(pairs=PAIRS, subsets=("taxonomic", "random")) -> pd.DataFrame:
    """XCOMPS-like items: per pair two sentences, the property phrase and both concept words."""
    rows = []
    for k, (lang, prop, good, bad) in enumerate(pairs):
        for subset in subsets:
            pid = f"p{k}-{subset}-{lang}"
            for label, word in ((1, good), (0, bad)):
                rows.append({"item_id": f"{pid}-{label}", "pair_id": pid, "language": lang, "subset": subset,
                             "label": label, "text": f"{word} {prop}.", "property": prop,
                             "acceptable_concept": good, "unacceptable_concept": bad})
    return pd.DataFrame(rows)


def logp_text(lm, text: str) -> float:
    """log p(all tokens of `text` after BOS), from one plain HF forward pass (float64 log-softmax)."""
    ids = lm.encode([text])[0].ids
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return float(sum(logp[j - 1, ids[j]] for j in range(1, len(ids))))


def answer_logp(lm, prompt: str, answer: str) -> float:
    """log p(answer | prompt) by the chain rule: log p(prompt + answer) − log p(prompt). Exact when the
    prompt's tokens are a prefix of the full text's tokens (checked)."""
    full, alone = lm.encode([prompt + answer])[0].ids, lm.encode([prompt])[0].ids
    assert full[:len(alone)] == alone, "the answer merges with the prompt's last token"
    return logp_text(lm, prompt + answer) - logp_text(lm, prompt)


# ----------------------------------------------------------------------------------------- templates

def test_templates_cover_the_xcomps_languages_and_english():
    for name in PROMPT_SETS:
        prompts = load_prompts(name)
        assert set(prompts) == XCOMPS_LANGUAGES | {"en"}, name
        assert prompts["en"].template == EN_PROMPT.format("{property}", "{word1}", "{word2}")
    table = language_table()
    assert set(table.index[table["in_xcomps"] == "yes"]) == XCOMPS_LANGUAGES


def figure8() -> dict[str, str]:
    """The templates printed in XCOMPS Figure 8, read from the paper text: one `xx: template` line per
    language between the English template and the figure's caption."""
    if not PAPER.exists():
        pytest.skip(f"{PAPER} is not here (../shared is not part of the project)")
    text = PAPER.read_text(encoding="utf-8")
    block = text[text.index("\nen: Which concept"):text.index("Figure 8:")]
    return dict(re.findall(r"^([a-z]{2}): (.+)$", block, flags=re.M))


def test_the_xcomps_set_is_figure_8_character_for_character():
    paper, ours = figure8(), load_prompts("xcomps")
    assert len(paper) == 18 and set(paper) == XCOMPS_LANGUAGES | {"en"}
    for language, template in paper.items():
        assert ours[language].template == template, language
        assert template.endswith(ours[language].answer) and ours[language].answer.endswith(': "'), language


def test_the_babelprobe_set_differs_from_figure_8_where_the_readme_says():
    paper, ours = figure8(), load_prompts("xcomps-babelprobe")
    same = {language for language, template in paper.items() if ours[language].template == template}
    assert same == {"en", "ru", "uk"}


@pytest.mark.parametrize("language", sorted(XCOMPS_LANGUAGES | {"en"}))
@pytest.mark.parametrize("name", sorted(PROMPT_SETS))
def test_every_template_has_each_placeholder_once_in_ascii_quotes(name, language):
    prompt = load_prompts(name)[language]
    names = [name for _, name, _, _ in string.Formatter().parse(prompt.template) if name is not None]
    assert sorted(names) == ["property", "word1", "word2"]
    for name in names:
        assert f'"{{{name}}}"' in prompt.template  # the options are delimited like the answer
    assert prompt.close == '"' and prompt.answer.endswith('"') and prompt.template.endswith(prompt.answer)
    assert prompt.question and not prompt.question.endswith(" ")
    assert "\t" not in prompt.template and "\n" not in prompt.template


def test_prompts_digest_changes_with_the_wording_only_for_the_languages_asked(tmp_path):
    paper = (Path(__file__).resolve().parents[1] / "babelprobe/data/prompts/xcomps_meta.tsv").read_text("utf-8")
    mine = tmp_path / "mine.tsv"
    mine.write_text(paper.replace("am wahrscheinlichsten", "am ehesten"), encoding="utf-8")
    assert prompts_digest(str(mine), ["de"]) != prompts_digest("xcomps", ["de"])
    assert prompts_digest(str(mine), ["en", "zh"]) == prompts_digest("xcomps", ["en", "zh"])


# ------------------------------------------------------------------------------------------ scoring

@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_scores_match_a_plain_forward_pass(arch):
    lm = tiny_lm(arch)
    items = make_items(PAIRS[:2])
    out = score_meta(lm, items, progress=False)
    assert len(out) == 4 and (out["method"] == "meta").all()
    for row in out.itertuples():
        prop, good, bad = row.property, row.acceptable_concept, row.unacceptable_concept
        gf, bf = EN_PROMPT.format(prop, good, bad), EN_PROMPT.format(prop, bad, good)
        assert (row.prompt_gf, row.prompt_bf) == (gf, bf)
        assert (row.text_good, row.text_bad) == (good, bad)
        expected = [answer_logp(lm, gf, good + '"'), answer_logp(lm, gf, bad + '"'),
                    answer_logp(lm, bf, good + '"'), answer_logp(lm, bf, bad + '"')]
        got = [row.score_good_gf, row.score_bad_gf, row.score_good_bf, row.score_bad_bf]
        np.testing.assert_allclose(got, expected, atol=5e-5)
        assert row.margin == pytest.approx(expected[0] - expected[1] + expected[2] - expected[3], abs=1e-4)
        assert row.correct == (row.margin > 0) == (row.score_good > row.score_bad)


def test_output_joins_with_direct_on_pair_keys(tiny):
    from babelprobe.benchmarks.direct import score_direct

    items = make_items()
    meta, direct = score_meta(tiny, items, progress=False), score_direct(tiny, items, progress=False)
    keys = ["pair_id", "language", "subset"]
    joined = meta.merge(direct, on=keys, suffixes=("_meta", "_direct"), validate="one_to_one")
    assert len(joined) == len(meta) == len(direct)
    for column in ("pair_id", "language", "subset", "method", "text_good", "text_bad", "score_good", "score_bad",
                   "correct", "rule", "prompt_format", "model", "fingerprint"):
        assert column in meta.columns


def test_without_closing_quote_the_bare_word_is_scored(tiny):
    out = score_meta(tiny, make_items(PAIRS[:1], subsets=("random",)), close_quote=False, progress=False).iloc[0]
    gf = EN_PROMPT.format("can bark", "dog", "cat")
    assert out["score_good_gf"] == pytest.approx(answer_logp(tiny, gf, "dog"), abs=5e-5)
    assert not out["close_quote"]


def test_mean_reduction_divides_by_the_answer_tokens(tiny):
    items = make_items(PAIRS[:1], subsets=("random",))
    total = score_meta(tiny, items, progress=False).iloc[0]
    mean = score_meta(tiny, items, reduction="mean", progress=False).iloc[0]
    assert mean["score_good_gf"] == pytest.approx(total["score_good_gf"] / total["n_tokens_good"])


def test_shared_and_unshared_scoring_agree(tiny):
    items = make_items()
    shared = score_meta(tiny, items, progress=False)
    plain = score_meta(tiny, items, share_prefix=False, padding_side="left", progress=False)
    for column in ("score_good_gf", "score_bad_gf", "score_good_bf", "score_bad_bf"):
        np.testing.assert_allclose(shared[column], plain[column], atol=2e-5)


def test_prompt_language_asks_every_item_in_one_language(tiny):
    out = score_meta(tiny, make_items(PAIRS[2:3]), prompt_language="en", progress=False)
    assert out["prompt_gf"].iloc[0] == EN_PROMPT.format("kann bellen", "Hund", "Katze")
    assert (out["prompt_language"] == "en").all() and (out["language"] == "de").all()
    own = score_meta(tiny, make_items(PAIRS[2:3]), progress=False)
    assert own["prompt_gf"].iloc[0].startswith("Welches Konzept")


# -------------------------------------------------------------------------------------------- rules

# per pair: score(good | gf), score(bad | gf), score(good | bf), score(bad | bf)
SCORES = np.array([[-1.0, -2.0, -1.0, -2.0],   # good wins in both orders
                   [-1.0, -2.0, -3.0, -1.0],   # the first-listed concept wins in both orders
                   [-3.0, -2.0, -1.0, -1.5],   # the second-listed concept wins in both orders
                   [-1.0, -4.0, -3.0, -2.0],   # good wins by much in gf, loses by less in bf
                   [-1.0, -1.0, -1.0, -1.0]])  # ties


@pytest.mark.parametrize("rule, expected", [("sum", [True, False, False, True, False]),
                                            ("both", [True, False, False, False, False]),
                                            ("first", [True, True, False, True, False])])
def test_rules_on_hand_made_scores(rule, expected):
    out = _decide(pd.DataFrame(index=range(len(SCORES))), SCORES, rule)
    assert out["correct"].tolist() == expected
    assert out["first_won_gf"].tolist() == [True, True, False, True, False]
    assert out["first_won_bf"].tolist() == [False, True, False, True, False]
    assert out["consistent"].tolist() == [True, False, False, False, False]
    used = [0] if rule == "first" else [0, 1]
    np.testing.assert_allclose(out["score_good"], SCORES[:, [0, 2]][:, used].mean(axis=1))
    np.testing.assert_allclose(out["score_bad"], SCORES[:, [1, 3]][:, used].mean(axis=1))
    if rule != "both":
        assert (out["correct"] == (out["score_good"] > out["score_bad"])).all()


def test_margins_are_the_documented_formulas():
    d_gf, d_bf = np.array([1.0, -2.0, 0.5]), np.array([-0.5, 3.0, 0.25])
    np.testing.assert_allclose(margins(d_gf, d_bf, "sum"), [0.5, 1.0, 0.75])
    np.testing.assert_allclose(margins(d_gf, d_bf, "both"), [-0.5, -2.0, 0.25])
    np.testing.assert_allclose(margins(d_gf, d_bf, "first"), [1.0, -2.0, 0.5])
    with pytest.raises(BabelprobeError, match="unknown rule 'majority'; use one of sum, both, first"):
        margins(d_gf, d_bf, "majority")


def test_position_bias_counts_first_listed_wins():
    out = _decide(pd.DataFrame({"language": ["en", "en", "en", "de", "de"]}), SCORES, "sum")
    bias = position_bias(out).set_index("language")
    # en: rows 0-2 -> first won in 1 + 2 + 0 of 6 answers; de: rows 3-4 -> 2 + 0 of 4
    assert bias.loc["en", "first_rate"] == pytest.approx(3 / 6)
    assert bias.loc["de", "first_rate"] == pytest.approx(2 / 4)
    assert bias.loc["en", "accuracy_gf"] == pytest.approx(2 / 3) and bias.loc["en", "accuracy_bf"] == pytest.approx(2 / 3)
    assert bias.loc["de", "accuracy_gf"] == pytest.approx(1 / 2) and bias.loc["de", "accuracy_bf"] == 0
    assert bias.loc["en", "consistent"] == pytest.approx(1 / 3)
    assert bias.loc["en", "first_ci_low"] < 0.5 < bias.loc["en", "first_ci_high"]
    overall = position_bias(out, by=None).iloc[0]
    assert overall["n"] == 5 and overall["first_rate"] == pytest.approx(5 / 10)


# --------------------------------------------------------------------------------------------- chat

def test_chat_variant_puts_the_answer_prefix_in_the_assistant_turn():
    lm = tiny_lm("llama")
    lm.tokenizer.chat_template = GEMMA_LIKE_CHAT
    out = score_meta(lm, make_items(PAIRS[:1], subsets=("random",)), chat_template=True, progress=False).iloc[0]
    question = EN_PROMPT.format("can bark", "dog", "cat").removesuffix(' Answer: "')
    expected = f'<start_of_turn>user\n{question}<end_of_turn>\n<start_of_turn>model\nAnswer: "'
    assert out["prompt_gf"] == expected  # no second BOS: encoding puts one first
    assert out["prompt_format"] == "chat"
    assert out["score_good_gf"] == pytest.approx(answer_logp(lm, expected, 'dog"'), abs=5e-5)


def test_chat_template_from_a_file(tiny, tmp_path):
    path = tmp_path / "chat.jinja"
    path.write_text(GEMMA_LIKE_CHAT)
    out = score_meta(tiny, make_items(PAIRS[:1], subsets=("random",)), chat_template=str(path), progress=False)
    assert out["prompt_gf"].iloc[0].startswith("<start_of_turn>user\nWhich concept")


def test_chat_variant_without_a_template_is_an_error(tiny):
    with pytest.raises(BabelprobeError, match="has no chat template .*--chat-template-file"):
        score_meta(tiny, make_items(PAIRS[:1]), chat_template=True, progress=False)


# ---------------------------------------------------------------------------------------- bad input

def test_items_without_concept_words_are_an_error(tiny):
    items = make_items().drop(columns="unacceptable_concept")
    with pytest.raises(BabelprobeError, match="no 'unacceptable_concept' field, which the meta prompt needs"):
        score_meta(tiny, items, progress=False)
    items = make_items()
    items.loc[items["pair_id"] == "p1-random-en", "acceptable_concept"] = " "
    with pytest.raises(BabelprobeError, match="pair 'p1-random-en' has an empty 'acceptable_concept'"):
        score_meta(tiny, items, progress=False)


def test_language_without_a_template_lists_the_available_ones(tiny):
    items = make_items([("it", "può abbaiare", "cane", "gatto")])
    with pytest.raises(BabelprobeError, match=r"no meta prompt for language it .*available: ar, ca, de, el, en, es"):
        score_meta(tiny, items, progress=False)


@pytest.mark.parametrize("content, message", [
    ("lang\ttemplate\n", ":1: missing column 'language'; a prompt file needs the tab-separated columns language, template, answer, close"),
    ('language\ttemplate\tanswer\tclose\nen\t"{property}" "{word1}" A: "\tA: "\t"\n', r"must contain \{word2\} exactly once"),
    ('language\ttemplate\tanswer\tclose\nen\t{property} {word1} {word2} {word1} A: "\tA: "\t"\n', r"\{word1\} exactly once \(found 2\)"),
    ('language\ttemplate\tanswer\tclose\nen\t{property} {word1} {word2} {x} A: "\tA: "\t"\n', r"unknown placeholder\(s\) \{x\}"),
    ('language\ttemplate\tanswer\tclose\nen\t{property} {word1} {word2} A: "\tAnswer: "\t"\n', "must be the end of its template"),
    ('language\ttemplate\tanswer\tclose\nen\t{property} {word1} {word2}\n', ":2: 2 tab-separated fields where the header has 4"),
])
def test_broken_prompt_files_name_the_line_and_problem(tiny, tmp_path, content, message):
    path = tmp_path / "mine.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BabelprobeError, match=message):
        score_meta(tiny, make_items(), prompts=str(path), progress=False)


def test_own_prompt_file_is_used(tiny, tmp_path):
    path = tmp_path / "mine.tsv"
    path.write_text('language\ttemplate\tanswer\tclose\nen\tQ: {property}? "{word1}" / "{word2}"\\nA: "\tA: "\t"\n',
                    encoding="utf-8")
    out = score_meta(tiny, make_items(PAIRS[:1]), prompts=str(path), progress=False)
    assert out["prompt_gf"].iloc[0] == 'Q: can bark? "dog" / "cat"\nA: "'


def test_prompt_longer_than_the_context_names_the_pair_or_is_truncated():
    lm = tiny_lm("llama", max_positions=20)
    items = make_items(PAIRS[:1], subsets=("random",))
    with pytest.raises(BabelprobeError, match=r"item p0-random-en \(gf good\) has \d+ tokens.*--truncate"):
        score_meta(lm, items, progress=False)
    out = score_meta(lm, items, truncate=True, progress=False).iloc[0]
    assert out["truncated"] and np.isnan(out["score_good_gf"]) and not out["correct"]  # missing, not log 1


def test_unknown_options_are_errors(tiny):
    with pytest.raises(BabelprobeError, match="unknown rule 'any'"):
        score_meta(tiny, make_items(), rule="any")
    with pytest.raises(BabelprobeError, match="unknown reduction 'max'"):
        score_meta(tiny, make_items(), reduction="max")
    with pytest.raises(BabelprobeError, match="prompt file 'nope' is neither a bundled one"):
        score_meta(tiny, make_items(), prompts="nope")


# ---------------------------------------------------------------------------------------------- CLI

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny model saved like a real one, so that `--model DIR` loads it."""
    path = tmp_path_factory.mktemp("tiny-model")
    lm = tiny_lm("llama")
    lm.model.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    return path


def write_jsonl(items: pd.DataFrame, path):
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in items.to_dict("records")), encoding="utf-8")
    return path


def test_cli_writes_pairs_and_prints_accuracy_and_position_bias(model_dir, tmp_path, capsys):
    items = write_jsonl(make_items(), tmp_path / "items.jsonl")
    out = tmp_path / "meta.csv"
    code = main(["score", "meta", "--model", str(model_dir), "--items", str(items), "--out", str(out),
                 "--rule", "both", "--languages", "en,de", "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0
    table = pd.read_csv(out)
    assert len(table) == 6 and set(table["language"]) == {"en", "de"} and (table["rule"] == "both").all()
    assert "meta accuracy (rule both, sum, plain prompt)" in printed and "position bias" in printed
    assert "first_rate" in printed and "wrote 6 pairs" in printed


@pytest.mark.parametrize("extra, message", [
    (["--languages", "it"], "no meta prompt for language it"),
    (["--out-suffix"], None),
])
def test_cli_bad_input_is_one_line_and_writes_nothing(model_dir, tmp_path, capsys, extra, message):
    items = write_jsonl(make_items(PAIRS + [("it", "può abbaiare", "cane", "gatto")]), tmp_path / "items.jsonl")
    out = tmp_path / ("meta.txt" if message is None else "meta.csv")
    args = ["score", "meta", "--model", str(model_dir), "--items", str(items), "--out", str(out), "--no-progress"]
    code = main(args + [a for a in extra if a != "--out-suffix"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("babelprobe: error: ") and err.count("\n") == 1
    assert (message or "unknown table format '.txt'") in err
    assert not out.exists()


# ------------------------------------------------------------------------------------- default model

@pytest.mark.slow
def test_default_model_meta_matches_its_own_forward_pass(default_lm):
    pairs = [("en", "can bark", "dog", "cat"), ("de", "kann fliegen", "Adler", "Stuhl"), ("zh", "会爬树", "猫", "狗")]
    out = score_meta(default_lm, make_items(pairs, subsets=("random",)), progress=False)
    for row in out.itertuples():
        expected = [answer_logp(default_lm, row.prompt_gf, row.text_good + '"'),
                    answer_logp(default_lm, row.prompt_bf, row.text_bad + '"')]
        np.testing.assert_allclose([row.score_good_gf, row.score_bad_bf], expected, atol=1e-3)
    assert not out["spans_join"].any() and (out["n_tokens_good"] >= 2).all()  # word + closing quote
    with pytest.raises(BabelprobeError, match="has no chat template"):  # the default model is a base model
        score_meta(default_lm, make_items(pairs[:1]), chat_template=True, progress=False)


def test_prefix_trees_for_an_accelerator_take_chunks_of_tree_pairs_and_score_alike(tmp_path, monkeypatch):
    """Planned as on an accelerator (`prefix.past_budget`), meta scores chunks of `TREE_CHUNK_PAIRS` pairs, the
    first a quarter of them (`runs.FIRST_CHUNK_SHARE`); a CPU's plan keeps the runs' chunks. Either way a pair's
    scores are its own prompts' (float32 rounding apart: the batches differ)."""
    import babelprobe.benchmarks.core.prefix as prefix
    import babelprobe.benchmarks.meta as meta
    import babelprobe.runs as runs
    from babelprobe.benchmarks.scoring import MetaSettings, score_pairs

    lm, items = tiny_lm("llama", max_positions=256), make_items()  # 8 pairs
    monkeypatch.setattr(runs, "CHUNK_PAIRS", 3)
    monkeypatch.setattr(meta, "TREE_CHUNK_PAIRS", 4)
    sizes, prepare = [], meta.MetaScorer.prepare
    monkeypatch.setattr(meta.MetaScorer, "prepare", lambda self, chunk: sizes.append(chunk["pair_id"].nunique())
                        or prepare(self, chunk))
    on_cpu = score_pairs("meta", lm, items, tmp_path / "cpu.csv", MetaSettings(), batch_tokens=64, progress=False)
    assert sizes == [1, 3, 3, 1]
    sizes.clear()
    monkeypatch.setattr(prefix, "past_budget", lambda device: prefix.PAST_PER_TOKEN)
    on_gpu = score_pairs("meta", lm, items, tmp_path / "gpu.csv", MetaSettings(), batch_tokens=64, progress=False)
    assert sizes == [1, 4, 3]
    assert on_gpu["pair_id"].tolist() == on_cpu["pair_id"].tolist() == list(dict.fromkeys(items["pair_id"]))
    for column in ("score_good", "score_bad"):
        np.testing.assert_allclose(on_gpu[column], on_cpu[column], rtol=1e-5, atol=1e-5)
