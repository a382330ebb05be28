"""The logit lens (against HF's own forward pass and a hand-written numpy norm + unembedding), token sets
(hand-written cases with the real Gemma tokenizer for zh/ja/ru/ar, byte fallback and case) and the
alignment measures (retrieval and linear CKA against numpy computed directly on a small case)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.extract import extract, open_store
from babelprobe.latent.align import align_layers, linear_cka, retrieval_accuracy
from babelprobe.latent.lens import lens_curves, lens_logits, lens_table, lens_turns, meta_prompt_items
from babelprobe.latent.tokens import token_script, token_set
from tests.tiny import tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = {"en": ["A dog can bark.", "A cat can climb trees."], "de": ["Ein Hund kann bellen.", "Eine Katze kann klettern."],
         "zh": ["狗会汪汪叫。", "猫会爬树。"]}
ANSWERS = {"en": ["dog", "cat"], "de": ["Hund", "Katze"], "zh": ["狗", "猫"]}


def small_items() -> pd.DataFrame:
    rows = []
    for language, texts in TEXTS.items():
        for k, text in enumerate(texts):
            rows.append({"item_id": f"{language}-{k}", "pair_id": f"{language}-{k}", "language": language,
                         "subset": "s", "label": 1, "text": text, "parallel_id": f"c{k}",
                         "answer": ANSWERS[language][k]})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def gemma_tiny():
    return tiny_lm("gemma3")  # has final-logit soft-capping (30.0): the lens must apply it


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_lens_at_the_last_layer_is_the_models_next_token_distribution(arch, tmp_path):
    lm = tiny_lm(arch)
    items = small_items()
    extract(lm, items, tmp_path / "acts", pool="last", progress=False)
    store = open_store(tmp_path / "acts")
    lens = lens_logits(lm, torch.from_numpy(store.read(lm.n_layers)))
    for i, encoding in enumerate(lm.encode(items["text"].tolist())):
        with torch.no_grad():
            real = lm.model(input_ids=torch.tensor([encoding.ids])).logits[0, -1]
        assert torch.allclose(lens[i], real, rtol=1e-4, atol=1e-4 * float(real.abs().max()))


def test_lens_at_a_middle_layer_is_the_final_norm_and_unembedding_by_hand(tmp_path):
    lm = tiny_lm("llama")
    items = small_items()
    extract(lm, items, tmp_path / "acts", pool="last", progress=False)
    store = open_store(tmp_path / "acts")
    encoding = lm.encode([items["text"].iloc[0]])[0]
    with torch.no_grad():
        hidden = lm.model(input_ids=torch.tensor([encoding.ids]), output_hidden_states=True).hidden_states
    x = hidden[1][0, -1].numpy().astype(np.float64)  # output of block 1 (HF's own record of it)
    norm = lm.model.model.norm
    normed = x / np.sqrt(np.mean(x ** 2) + norm.variance_epsilon) * norm.weight.detach().numpy()
    expected = lm.model.lm_head.weight.detach().numpy() @ normed
    got = lens_logits(lm, torch.from_numpy(store.read(1, rows=[0])))[0].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_lens_table_probabilities_ranks_and_entropy_match_a_softmax_by_hand(tmp_path, gemma_tiny):
    lm = gemma_tiny
    items = small_items()
    extract(lm, items, tmp_path / "acts", pool="last", progress=False)
    table = lens_table(lm, tmp_path / "acts", items, target="answer", pivot="en", top_k=5, chunk_rows=2,
                       progress=False)
    assert len(table) == len(items) * (lm.n_layers + 1)
    row = table[(table["item_id"] == "de-0") & (table["layer"] == 2)].iloc[0]
    logits = lens_logits(lm, torch.from_numpy(open_store(tmp_path / "acts").read(2, rows=[2])))[0].double().numpy()
    p = np.exp(logits - logits.max())
    p /= p.sum()
    own, pivot = token_set(lm.tokenizer, "Hund"), token_set(lm.tokenizer, "dog")
    own, pivot = sorted(own - pivot), sorted(pivot - own)
    assert row["p_own"] == pytest.approx(p[own].sum(), rel=1e-4)
    assert row["p_pivot"] == pytest.approx(p[pivot].sum(), rel=1e-4)
    assert row["rank_own"] == 1 + (p > p[own].max()).sum()
    assert row["entropy"] == pytest.approx(-(p * np.log(p)).sum(), rel=1e-4)
    assert row["top_token"] == lm.tokenizer.decode([int(p.argmax())])
    assert np.isnan(table.loc[table["language"] == "en", "p_pivot"]).all()  # the pivot has no counterpart
    curves = lens_curves(table, n_boot=200)
    de = curves[(curves["language"] == "de") & (curves["layer"] == 2)].iloc[0]
    assert de["p_own"] == pytest.approx(table[(table["language"] == "de") & (table["layer"] == 2)]["p_own"].mean())
    assert de["p_own_low"] <= de["p_own"] <= de["p_own_high"]
    assert set(lens_turns(curves)["language"]) == {"de", "zh"}


def test_lens_refuses_a_store_of_another_model(tmp_path, gemma_tiny):
    extract(tiny_lm("llama"), small_items(), tmp_path / "acts", pool="last", progress=False)
    with pytest.raises(BabelprobeError, match="another model"):
        lens_table(gemma_tiny, tmp_path / "acts", small_items(), progress=False)


def test_meta_prompts_end_where_the_answer_begins():
    from babelprobe.items import load_items

    items = load_items("xcomps-sample", languages=["en", "zh"], limit=1)
    prompts = meta_prompt_items(items, orders=("gf", "bf"))
    assert len(prompts) == 2 * items["pair_id"].nunique()
    first = prompts[(prompts["language"] == "en") & (prompts["order"] == "gf")].iloc[0]
    assert first["text"].endswith('Answer: "') and first["answer"] == "dog"
    assert f'"{first["answer"]}" or "' in first["text"]  # gf: the acceptable concept is listed first
    zh = prompts[(prompts["language"] == "zh")].iloc[0]
    assert zh["answer"] == "狗" and zh["parallel_id"] == first["parallel_id"]


# ------------------------------------------------------------------------------------------ token sets

def test_token_set_of_a_byte_level_tokenizer_holds_the_words_own_first_token(tiny):
    for word in ("dog", "狗", "Собака"):
        ids = token_set(tiny.tokenizer, word)
        first = tiny.tokenizer(word, add_special_tokens=False)["input_ids"][0]
        assert first in ids  # for 狗 a partial-UTF-8 byte piece: the tokenizer's own way to start it
        for token_id in ids:  # every member spells the beginning of the word (with or without a space)
            text = tiny.tokenizer.decode([token_id])
            if "\ufffd" in text:  # part of a character's bytes: only a spelling's own first token may be one
                starts = [tiny.tokenizer(p + w, add_special_tokens=False)["input_ids"][0]
                          for p in ("", " ") for w in (word, word.lower())]
                assert token_id in starts
                continue
            assert any(s.startswith(text) for s in (word, " " + word, word.lower(), " " + word.lower(),
                                                    word.capitalize(), " " + word.capitalize()))


def test_token_script():
    assert [token_script(t) for t in ("▁dog", "狗", "シ", "한", "со", "كل", "λ", "12", "▁.")] == [
        "Latin", "Han", "Kana", "Hangul", "Cyrillic", "Arabic", "Greek", "none", "none"]


def names(lm, word) -> set[str]:
    return set(lm.tokenizer.convert_ids_to_tokens(sorted(token_set(lm.tokenizer, word))))


@pytest.mark.slow
def test_token_sets_with_the_real_tokenizer(default_lm):
    # Written by hand from Gemma-3's vocabulary: every token that spells the start of the word.
    assert names(default_lm, "狗") == {"狗"}                          # one CJK character, one token
    assert names(default_lm, "长颈鹿") == {"长", "▁长"}                # three characters, three tokens: the first
    assert names(default_lm, "シマウマ") == {"シ", "▁シ"}              # katakana, one token per character
    assert names(default_lm, "犬") == {"犬", "▁犬"}
    russian = names(default_lm, "собака")
    assert {"с", "со", "соб", "▁соба", "▁собак", "С", "Со", "▁Соб"} <= russian
    assert not russian & {"ка", "ба", "▁ка"}
    assert names(default_lm, "كلب") == {"ك", "كل", "▁ك", "▁كل"}       # Arabic, no case
    assert names(default_lm, "𠀀") == {"<0xF0>"}                      # byte fallback: the first byte token
    german = names(default_lm, "Hund")
    assert {"H", "Hund"[:2], "▁Hund", "hund", "▁hund"} <= german
    assert "<0x48>" not in german  # the byte token of "H" is not how the model writes "Hund"


# ------------------------------------------------------------------------------------------ alignment

def test_retrieval_and_cka_against_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 4))
    y = x @ rng.normal(size=(4, 4)) + 0.3 * rng.normal(size=(6, 4))
    # retrieval by hand: cosine of every pair of rows, loop
    hits = 0
    for i in range(6):
        cos = [x[i] @ y[j] / np.linalg.norm(x[i]) / np.linalg.norm(y[j]) for j in range(6)]
        hits += int(np.argmax(cos) == i)
    assert retrieval_accuracy(x, y) == hits / 6
    # CKA by hand through the Gram matrices: HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)), H = I - 11ᵀ/n
    h = np.eye(6) - np.ones((6, 6)) / 6
    k, m = h @ (x @ x.T) @ h, h @ (y @ y.T) @ h
    expected = np.trace(k @ m) / np.sqrt(np.trace(k @ k) * np.trace(m @ m))
    assert linear_cka(x, y) == pytest.approx(expected, rel=1e-10)
    assert linear_cka(x, 3 * x @ np.linalg.qr(rng.normal(size=(4, 4)))[0]) == pytest.approx(1.0)


def test_align_layers_on_a_written_store(tmp_path):
    from babelprobe.extract import write_store

    rng = np.random.default_rng(1)
    n, d, layers = 5, 8, 3
    base = rng.normal(size=(layers, n, d))
    keys, states = [], []
    for language, shift in (("en", 0.0), ("de", 5.0), ("fr", -2.0)):
        noise = 2.0 if language == "fr" else 0.0
        for k in range(n):
            keys.append({"item_id": f"{language}-{k}", "pair_id": f"{language}-{k}", "language": language,
                         "subset": "s", "label": 1, "n_tokens": 3})
            states.append(base[:, k] + shift + noise * rng.normal(size=(layers, d)))
    keys = pd.DataFrame(keys)
    write_store(tmp_path / "acts", keys, last=np.stack(states).astype(np.float32))
    items = keys.assign(text="x", parallel_id=[f"u{k}" for k in range(n)] * 3)
    result = align_layers(tmp_path / "acts", items, pivot="en", progress=False)
    curves, matrix = result["curves"], result["matrix"]
    # de is en shifted by a constant: centring per language removes the shift, so it aligns perfectly
    de = curves[curves["language"] == "de"]
    assert (de["retrieval"] == 1.0).all() and np.allclose(de["cka"], 1.0) and np.allclose(de["cosine"], 1.0)
    # fr, layer 1, by hand: centre each language, retrieve fr -> en, CKA
    store = open_store(tmp_path / "acts")
    x = store.read(1)[10:15]
    y = store.read(1)[0:5]
    x, y = x - x.mean(axis=0), y - y.mean(axis=0)
    cos = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (y / np.linalg.norm(y, axis=1, keepdims=True)).T
    fr = matrix[(matrix["layer"] == 1) & (matrix["language_a"] == "fr") & (matrix["language_b"] == "en")].iloc[0]
    assert fr["retrieval"] == (cos.argmax(axis=1) == np.arange(5)).mean()
    assert fr["cosine"] == pytest.approx(np.diag(cos).mean(), rel=1e-5)
    item = result["items"]
    assert item[(item["layer"] == 1) & (item["item_id"] == "fr-2")]["cosine"].iloc[0] == pytest.approx(cos[2, 2], rel=1e-5)


def test_align_needs_parallel_ids(tmp_path):
    from babelprobe.extract import write_store

    keys = pd.DataFrame({"item_id": ["a", "b"], "pair_id": ["a", "b"], "language": ["en", "de"], "subset": "s",
                         "label": 1, "n_tokens": 2})
    write_store(tmp_path / "acts", keys, last=np.zeros((2, 2, 4), np.float32))
    with pytest.raises(BabelprobeError, match="parallel_id"):
        align_layers(tmp_path / "acts", keys.assign(text="x"), progress=False)


# ---------------------------------------------------------------------------------------------- CLI

def fake_compare(path, items: pd.DataFrame, n_layers: int) -> None:
    """A compare directory's three tables the lens and alignment read, written by hand (every pair correct
    in meta, alternate in direct), and the two they do not read, empty."""
    pairs = items.drop_duplicates("pair_id")[["pair_id", "language", "subset"]].reset_index(drop=True)
    pairs["meta_correct"] = True
    pairs["direct_correct"] = np.arange(len(pairs)) % 2 == 0
    path.mkdir()
    pairs.to_csv(path / "items.csv", index=False)
    languages = sorted(pairs["language"].unique())
    summary = [{"language": lang, "subset": "taxonomic", "method": method, "metric": "accuracy", "value": value}
               for k, lang in enumerate(languages) for method, value in (("meta", 0.5 + 0.1 * k), ("direct", 0.9 - 0.1 * k))]
    pd.DataFrame(summary).to_csv(path / "summary.csv", index=False)
    layers = [{"language": lang, "subset": "taxonomic", "layer": layer, "f1_mean": 0.5 + 0.01 * layer * (k + 1)}
              for k, lang in enumerate(languages) for layer in range(n_layers + 1)]
    pd.DataFrame(layers).to_csv(path / "layers.csv", index=False)
    for name in ("correlations.csv", "agreement.csv"):
        (path / name).write_text("method_a,method_b\n", encoding="utf-8")


def test_lens_and_align_commands_write_tables_and_figures(tmp_path, tiny_dir, tiny, capsys):
    from babelprobe.cli import main
    from babelprobe.items import load_items

    items = load_items("xcomps-sample", languages=["en", "de", "zh"], limit=1)
    fake_compare(tmp_path / "cmp", items, tiny.n_layers)
    common = ["--model", str(tiny_dir), "--items", "xcomps-sample", "--languages", "de,zh", "--limit", "1",
              "--no-progress"]
    assert main(["lens", *common, "--orders", "gf", "--n-boot", "50", "--out", str(tmp_path / "lens"),
                 "--compare", str(tmp_path / "cmp")]) == 0
    lens = pd.read_csv(tmp_path / "lens" / "lens.csv")
    assert set(lens["language"]) == {"en", "de", "zh"}  # the pivot is added for the counterpart answers
    assert len(lens) == 12 * (tiny.n_layers + 1)
    for name in ("curves.csv", "turns.csv", "pairs.csv", "languages.csv", "pair_correlations.csv",
                 "figures/lens_curves.png", "figures/lens_entropy.png"):
        assert (tmp_path / "lens" / name).exists(), name
    pairs = pd.read_csv(tmp_path / "lens" / "pairs.csv")
    assert {"meta_correct", "direct_correct", "final_p_own"} <= set(pairs.columns)
    assert "last-layer check" in capsys.readouterr().out

    three = ["--model", str(tiny_dir), "--items", "xcomps-sample", "--languages", "en,de,zh", "--limit", "1",
             "--no-progress"]
    assert main(["align", *three, "--out", str(tmp_path / "al"), "--store", str(tmp_path / "nowhere")]) == 2
    assert main(["align", *three, "--out", str(tmp_path / "al")]) == 0
    curves = pd.read_csv(tmp_path / "al" / "curves.csv")
    assert set(curves["language"]) == {"de", "zh"} and curves["layer"].nunique() == tiny.n_layers + 1
    for name in ("matrix.csv", "items.csv", "figures/alignment.png", "figures/alignment_matrix.png"):
        assert (tmp_path / "al" / name).exists(), name
    assert main(["align", "--store", str(tmp_path / "al" / "acts"), "--compare", str(tmp_path / "cmp"),
                 "--no-progress", "--out", str(tmp_path / "al2")]) == 0
    correlations = pd.read_csv(tmp_path / "al2" / "correlations.csv")
    language_level = correlations[(correlations["level"] == "language") & (correlations["outcome"] == "meta_accuracy")
                                  & (correlations["alignment"] == "retrieval")]
    assert (language_level["n"] == 2).all()  # de and zh: too few languages for a correlation, reported as NaN
    assert (tmp_path / "al2" / "figures" / "alignment_correlation.png").exists()
