"""Activation patching (`babelprobe patch`, babelprobe/patching): the patched forward passes against HF's own
forward pass with plain hooks, the paper's exp1/exp2 and the minimal-pair recovery against references
written here, token sets and collisions on a hand case, batch and padding invariance, the command and the
report."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import babelprobe as bp
from babelprobe.cli import main
from babelprobe.interventions.edits import Patch
from babelprobe.patching import translation
from babelprobe.patching.core import UNPATCHED, Target, patched_copies, read_states, token_set_probs
from babelprobe.patching.pairs import check_items
from babelprobe.patching.settings import TranslationSettings
from tests.numeric import float32_rtol, model_rtol
from tests.tiny import tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = ("llama", "gemma3", "gpt2")
TEXTS = ["A dog can bark. The answer is yes.", "Ein Hund kann bellen.", "猫会爬树。 A cat can climb trees.",
         "Un chien peut aboyer.", "Which concept has the property?", "Köpek havlayabilir.", "A chair has four legs.",
         "犬は吠える。"]

# concept_id, then the word in en, de, es, fr (hand-written for the tests)
WORDS = {"dog": ("dog", "Hund", "perro", "chien"), "cat": ("cat", "Katze", "gato", "chat"),
         "house": ("house", "Haus", "casa", "maison"), "tree": ("tree", "Baum", "árbol", "arbre"),
         "water": ("water", "Wasser", "agua", "eau"), "sun": ("sun", "Sonne", "sol", "soleil"),
         "book": ("book", "Buch", "libro", "livre"), "hand": ("hand", "Hand", "mano", "main"),
         "bird": ("bird", "Vogel", "pájaro", "oiseau"), "fish": ("fish", "Fisch", "pez", "poisson"),
         "apple": ("apple", "Apfel", "manzana", "pomme"), "bread": ("bread", "Brot", "pan", "pain")}
LANGS = ("en", "de", "es", "fr")
SETTING = dict(source="de-es", target="fr-en", latent="de", source_pairs="de-es,es-de", shots=2)


@pytest.fixture(scope="module")
def models():
    return {arch: tiny_lm(arch, max_positions=512) for arch in ARCHS}


def concepts_table() -> pd.DataFrame:
    return pd.DataFrame([{"concept_id": c, "language": lang, "word": w} for c, words in WORDS.items()
                         for lang, w in zip(LANGS, words)])


# -------------------------------------------------------------------------- plain-hook references (HF)

def hf_run(lm, ids: list[int], writes: dict[int, tuple[int, torch.Tensor]] | None = None, read: int | None = None):
    """HF's own causal-LM forward (lm.model) of one text with plain forward hooks: `writes` {layer: (position,
    state)} replaces block `layer`'s output there; with `read`, also returns every block's output at that
    position ([L, d]). Returns the float32 logits [seq, vocab] (and the states)."""
    handles, seen = [], {}
    for j, block in enumerate(lm.parts.layers, start=1):
        def hook(module, args, output, j=j):
            h = output if isinstance(output, torch.Tensor) else output[0]
            if writes and j in writes:
                h = h.clone()
                h[0, writes[j][0]] = writes[j][1].to(h.dtype)
            if read is not None:
                seen[j] = h[0, read].float().clone()
            return h if isinstance(output, torch.Tensor) else (h, *output[1:])
        handles.append(block.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            logits = lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    finally:
        for handle in handles:
            handle.remove()
    if read is None:
        return logits
    return logits, torch.stack([seen[j] for j in range(1, lm.n_layers + 1)])


def paper_tokens(tokenizer, words) -> list[int]:
    """`process_tokens_with_tokenization` of the released code (first token without and with a space, the bare
    space's token left out), written out again here."""
    space = tokenizer(" ", add_special_tokens=False).input_ids[0]
    out = []
    for word in words:
        out.append(tokenizer(word, add_special_tokens=False).input_ids[0])
        spaced = tokenizer(" " + word, add_special_tokens=False).input_ids[0]
        if spaced != space:
            out.append(spaced)
    return list(dict.fromkeys(out))


def probability_bound(lm, logits: torch.Tensor) -> float:
    """How far a sum of softmax probabilities may move when the logits carry float32 rounding of the forward
    pass (tests/numeric.py): dp_i = p_i·(dz_i − Σ_j p_j dz_j), so a set's probability moves by at most
    2·max|dz| ≤ 2·model_rtol·max|z|."""
    return 2 * model_rtol(lm) * logits.abs().max().item()


def logits_of(lm, finals: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return lm.parts.logits(finals).float()


# ------------------------------------------------------------------------------------- the edit itself

def test_patch_edit_writes_the_given_states_and_nothing_else(models):
    lm = models["llama"]
    h = torch.randn(3, 5, lm.d_model)
    values = torch.randn(2, lm.d_model)
    out = Patch([0, 2], [4, 1], values)(h)
    expected = h.clone()
    expected[0, 4], expected[2, 1] = values[0], values[1]
    assert torch.equal(out, expected) and not torch.equal(h, out)
    with pytest.raises(ValueError):
        Patch([0, 1], [2], values)


@pytest.mark.parametrize("arch", ARCHS)
def test_copies_equal_hf_forward_with_plain_hooks(models, arch):
    """Every copy (one layer, layers j..L, none) of several targets, against HF's own forward pass with
    plain hooks doing the same writes."""
    lm = models[arch]
    encodings = lm.encode(TEXTS[:4])
    states, _ = read_states(lm, encodings, [len(e.ids) - 1 for e in encodings], [[0]] * 4)
    L = lm.n_layers
    copies = [UNPATCHED] + [(0, (j,)) for j in range(1, L + 1)] + [(0, tuple(range(j, L + 1))) for j in range(1, L + 1)]
    targets = [Target(e.ids, max(1, len(e.ids) - 3), list(range(max(1, len(e.ids) - 3), len(e.ids))),
                      states[[(i + 1) % 4]], copies) for i, e in enumerate(encodings)]
    for target, finals in zip(targets, patched_copies(lm, targets)):
        for copy, (k, layers) in enumerate(target.copies):
            expected = hf_run(lm, target.ids, {j: (target.at, target.sources[k, j - 1]) for j in layers})
            got = logits_of(lm, finals[copy])
            assert torch.allclose(got, expected[target.read], atol=1e-5, rtol=0), (arch, copy)


@pytest.mark.parametrize("arch", ARCHS)
def test_self_patch_leaves_the_logits_equal(models, arch):
    """Writing a text's own states back (each layer alone, and j..L) changes nothing (within float32 rounding of
    the forward pass, `tests/numeric.py`); and the unpatched copy is HF's own forward pass (≤ 1e-5)."""
    lm = models[arch]
    encodings = lm.encode(TEXTS)
    at = [len(e.ids) // 2 for e in encodings]
    states, _ = read_states(lm, encodings, at, [[0]] * len(encodings))
    L = lm.n_layers
    copies = [UNPATCHED] + [(0, (j,)) for j in range(1, L + 1)] + [(0, tuple(range(j, L + 1))) for j in range(1, L + 1)]
    targets = [Target(e.ids, a, list(range(a, len(e.ids))), states[[i]], copies)
               for i, (e, a) in enumerate(zip(encodings, at))]
    for target, finals in zip(targets, patched_copies(lm, targets)):
        logits = logits_of(lm, finals)
        assert (logits - logits[0]).abs().max() <= model_rtol(lm) * logits[0].abs().max()
        assert torch.allclose(logits[0], hf_run(lm, target.ids)[target.read], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_patching_the_last_block_at_the_last_token_gives_the_source_distribution(models, arch):
    """Only the final norm and the head follow block L: the target's next-token distribution becomes the
    source's (≤ 1e-5)."""
    lm = models[arch]
    sources, targets_text = lm.encode(TEXTS[:4]), lm.encode(TEXTS[4:])
    states, _ = read_states(lm, sources, [len(e.ids) - 1 for e in sources], [[0]] * 4)
    targets = [Target(e.ids, len(e.ids) - 1, [len(e.ids) - 1], states[[i]], [(0, (lm.n_layers,))])
               for i, e in enumerate(targets_text)]
    for i, finals in enumerate(patched_copies(lm, targets)):
        got = torch.softmax(logits_of(lm, finals[0, 0]), -1)
        expected = torch.softmax(hf_run(lm, sources[i].ids)[-1], -1)
        assert (got - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("arch", ARCHS)
def test_batch_1_and_8_left_and_right_padding_agree(models, arch):
    """The nnsight #502 class of bug: a patch that lands on the wrong row or column when texts of different
    lengths share a batch. One target per batch against all eight, left against right padding."""
    lm = models[arch]
    encodings = lm.encode(TEXTS)
    states, _ = read_states(lm, encodings, [len(e.ids) - 1 for e in encodings], [[0]] * 8)
    L = lm.n_layers
    copies = [UNPATCHED] + [(0, (j,)) for j in range(1, L + 1)] + [(0, tuple(range(j, L + 1))) for j in range(1, L + 1)]
    targets = [Target(e.ids, max(1, len(e.ids) - 4), [len(e.ids) - 2, len(e.ids) - 1], states[[7 - i]], copies)
               for i, e in enumerate(encodings)]
    reference = patched_copies(lm, targets, batch_tokens=1, padding_side="left")
    # another batch or padding reorders the kernels' sums: float32 rounding of the forward pass, relative to
    # the largest final state (tests/numeric.py), while a patch on a wrong row or column moves a state by O(1)
    bound = model_rtol(lm) * max(a.abs().max().item() for a in reference)
    for batch_tokens, side in ((1, "right"), (10**6, "left"), (10**6, "right")):
        runs = patched_copies(lm, targets, batch_tokens=batch_tokens, padding_side=side)
        assert max((a - b).abs().max().item() for a, b in zip(reference, runs)) <= bound, (batch_tokens, side)
    # the states read for the sources do not depend on the batch either
    one, _ = read_states(lm, encodings, [len(e.ids) - 1 for e in encodings], [[0]] * 8, batch_tokens=1,
                         padding_side="left")
    assert (one - states).abs().max() <= model_rtol(lm) * states.abs().max()


# ------------------------------------------------------------------------------- token sets, collisions

class HandTokenizer:
    """A tokenizer whose first tokens are written by hand (a prompt: one token per character)."""

    TOKENS = {" ": [1], "Hund": [5, 6], " Hund": [7], "狗": [8, 9], " 狗": [1, 8, 9], "cane": [10], " cane": [11],
              "Katze": [12], " Katze": [13], "gatto": [14], " gatto": [11, 15], "猫": [8, 16], " 猫": [1, 8, 16],
              "Vogel": [30], " Vogel": [31], "uccello": [32], " uccello": [33], "鸟": [8, 17], " 鸟": [1, 8, 17]}

    def __call__(self, text, add_special_tokens=False):
        return SimpleNamespace(input_ids=self.TOKENS.get(text, [ord(c) for c in text]))


def test_token_sets_and_collisions_on_a_hand_case():
    tok = HandTokenizer()
    assert translation.first_tokens(tok, ["Hund"]) == [5, 7]
    assert translation.first_tokens(tok, ["狗"]) == [8]  # " 狗" starts with the bare space's token: left out
    assert translation.first_tokens(tok, ["cane", "Hund", "cane"]) == [10, 11, 5, 7]  # synonyms, each token once
    assert translation.no_collisions([[5, 7], [8], [10, 11]])
    assert not translation.no_collisions([[10, 11], [14, 11]])  # " cane" and " gatto" share their first token
    assert not translation.no_collisions([[8], [8]])             # 狗 and 猫 share their first byte token

    # exp1, source zh → it, target zh → de: every pair's four sets are the two concepts in it and in de, so
    # dog and cat collide (" cane", " gatto"), in either order, and the four pairs with bird are kept
    rows = [(c, lang, w) for c, ws in {"dog": ("狗", "cane", "Hund"), "cat": ("猫", "gatto", "Katze"),
                                       "bird": ("鸟", "uccello", "Vogel")}.items() for lang, w in zip(("zh", "it", "de"), ws)]
    words = translation.word_lists(pd.DataFrame(rows, columns=["concept_id", "language", "word"]), ["zh", "it", "de"])
    lm = SimpleNamespace(tokenizer=tok, max_length=10**6, bos_token_id=None)
    prompts = translation.Prompts(words, shots=1, seed=0)
    exp1 = translation.Config("exp1", (("zh", "it"),), ("zh", "de"))
    with pytest.raises(bp.BabelprobeError, match="could only collect 4 of 5 pairs for zh-it → zh-de"):
        translation.plan_pairs(lm, prompts, exp1, 5, seed=0)
    kept = translation.plan_pairs(lm, prompts, exp1, 4, seed=0).pairs
    assert set(zip(kept["src_concept"], kept["tgt_concept"])) == {("dog", "bird"), ("bird", "dog"), ("cat", "bird"),
                                                                 ("bird", "cat")}
    sets = dict(zip(zip(kept["src_concept"], kept["tgt_concept"]), kept["sets"]))
    # source concept in de (target's output), target concept in de, source concept in it, target concept in it
    assert sets["dog", "bird"] == [[5, 7], [30, 31], [10, 11], [32, 33], []]
    assert sets["bird", "cat"] == [[30, 31], [12, 13], [32, 33], [14, 11], []]


def test_the_prompt_is_the_released_template(models):
    words = translation.word_lists(concepts_table(), ["de", "es"])
    prompts = translation.Prompts(words, shots=2, seed=0)
    text = prompts.text("dog", ("de", "es"))
    lines = text.split("\n")
    assert len(lines) == 3 and lines[-1] == 'Deutsch: "Hund" - Español: "'
    for line in lines[:2]:
        de, es = line.removeprefix('Deutsch: "').removesuffix('"').split('" - Español: "')
        assert (de, es) in {(w[1], w[2]) for c, w in WORDS.items() if c != "dog"}
    assert prompts.text("dog", ("de", "es")) == text  # the same prompt whichever experiment asks


# ---------------------------------------------------------------------------- exp1 / exp2 vs reference

@pytest.fixture(scope="module")
def translation_run(models, tmp_path_factory):
    lm = models["gemma3"]
    out = tmp_path_factory.mktemp("patch-translation")
    result = bp.patch_translation(lm, concepts_table(), out=out, n_pairs=3, n_boot=0, figures=False, progress=False,
                                  **SETTING)
    return lm, out, result


def test_exp1_equals_a_plain_hook_reference(translation_run):
    lm, _, result = translation_run
    tok, L = lm.tokenizer, lm.n_layers
    prompts = translation.Prompts(translation.word_lists(concepts_table(), list(LANGS)), 2, 0)
    words = {c: dict(zip(LANGS, w)) for c, w in WORDS.items()}
    rows = result.rows[result.rows["exp"] == "exp1"]
    assert sorted(rows["layer"].unique()) == list(range(1, L + 1))
    for (src, tgt), part in rows.groupby(["src_concept", "tgt_concept"]):
        source, target = (lm.encode([prompts.text(c, p)])[0].ids for c, p in ((src, ("de", "es")), (tgt, ("fr", "en"))))
        logits, states = hf_run(lm, source, read=len(source) - 1)
        sets = {"p_src_concept_tgt_lang": [words[src]["en"]], "p_tgt_concept_tgt_lang": [words[tgt]["en"]],
                "p_src_concept_src_lang": [words[src]["es"]], "p_tgt_concept_src_lang": [words[tgt]["es"]],
                "p_latent": [words[tgt]["de"], words[src]["de"]]}
        base_src = torch.softmax(logits[-1], -1)[paper_tokens(tok, [words[src]["es"]])].sum()
        base_tgt = torch.softmax(hf_run(lm, target)[-1], -1)[paper_tokens(tok, [words[tgt]["en"]])].sum()
        for row in part.itertuples():
            logits = hf_run(lm, target, {row.layer: (len(target) - 1, states[row.layer - 1])})[-1]
            probs, bound = torch.softmax(logits, -1), probability_bound(lm, logits)
            for measure, ws in sets.items():
                assert abs(getattr(row, measure) - probs[paper_tokens(tok, ws)].sum().item()) <= bound, measure
            assert abs(row.base_src - base_src.item()) <= bound and abs(row.base_tgt - base_tgt.item()) <= bound


def test_exp2_equals_a_plain_hook_reference(translation_run):
    """The sources cut after the concept and run alone (the released code's cut prompts), their mean and the
    first written at the target concept's last token into block outputs j..L."""
    lm, _, result = translation_run
    tok, L = lm.tokenizer, lm.n_layers
    prompts = translation.Prompts(translation.word_lists(concepts_table(), list(LANGS)), 2, 0)
    words = {c: dict(zip(LANGS, w)) for c, w in WORDS.items()}
    cut = lambda text: '"'.join(text.split('"')[:-2])  # noqa: E731  (obj_patch_translation.ipynb)
    rows = result.rows[result.rows["exp"] == "exp2"]
    assert set(rows["variant"]) == {"mean", "first"} and rows["p_src_concept_src_lang"].isna().all()
    for (src, tgt), part in rows.groupby(["src_concept", "tgt_concept"]):
        states = []
        for pair in (("de", "es"), ("es", "de")):
            ids = lm.encode([cut(prompts.text(src, pair))])[0].ids
            states.append(hf_run(lm, ids, read=len(ids) - 1)[1])
        written = {"mean": torch.stack(states).mean(0), "first": states[0]}
        target_text = prompts.text(tgt, ("fr", "en"))
        target, at = lm.encode([target_text])[0].ids, len(lm.encode([cut(target_text)])[0].ids) - 1
        for row in part.itertuples():
            writes = {j: (at, written[row.variant][j - 1]) for j in range(row.layer, L + 1)}
            logits = hf_run(lm, target, writes)[-1]
            probs, bound = torch.softmax(logits, -1), probability_bound(lm, logits)
            assert abs(row.p_src_concept_tgt_lang - probs[paper_tokens(tok, [words[src]["en"]])].sum().item()) <= bound
            assert abs(row.p_tgt_concept_tgt_lang - probs[paper_tokens(tok, [words[tgt]["en"]])].sum().item()) <= bound
            # extra_langs=[latent]: the "src + tgt de" set, both concepts' German words, measured as one
            latent = paper_tokens(tok, [words[tgt]["de"], words[src]["de"]])
            assert abs(row.p_latent - probs[latent].sum().item()) <= bound


def test_translation_tables_and_settings(translation_run):
    lm, out, result = translation_run
    assert list(result.rows.columns) == list(translation.COLUMNS)
    assert result.rows.groupby(["exp", "variant"])["pair_idx"].nunique().eq(3).all()
    assert len(result.rows) == 3 * lm.n_layers * 3  # exp1 + exp2 × (mean, first)
    state = json.loads((out / "patch.json").read_text())
    assert state["stages"]["translation"]["source_pairs"] == ["de-es", "es-de"]
    assert (out / "translation_pairs.csv").exists() and (out / "translation_switches.csv").exists()
    # the summary's means are the rows' means
    summary = result.summary.set_index(["exp", "variant", "layer", "measure"])["mean"]
    means = result.rows.groupby(["exp", "variant", "layer"])["p_tgt_concept_tgt_lang"].mean()
    for key, value in means.items():
        assert summary[(*key, "p_tgt_concept_tgt_lang")] == pytest.approx(value)


def test_token_set_probabilities_are_sums_of_the_softmax(models):
    lm = models["llama"]
    finals = torch.randn(3, lm.d_model)
    sets = [[[1, 2], [], [5]], [[7], [8, 9, 10], [3]], [[0], [4], [4, 6]]]
    probs = torch.softmax(logits_of(lm, finals).double(), -1)
    expected = np.array([[probs[i, s].sum().item() for s in row] for i, row in enumerate(sets)])
    # float32 logits and a softmax over the vocabulary, against float64: one reduction of V terms
    bound = float32_rtol(lm.model.config.vocab_size) * logits_of(lm, finals).abs().max().item()
    assert np.allclose(token_set_probs(lm, finals, sets), expected, rtol=0, atol=bound)


# ---------------------------------------------------------------------------------------- minimal pairs

def test_pairs_recovery_equals_a_plain_hook_reference(models, tmp_path):
    lm = models["llama"]
    items = bp.load_items("xcomps-sample", languages=["en", "de"], subsets=["taxonomic", "random"], limit=2)
    result = bp.patch_pairs(lm, items, "en", out=tmp_path, layers="1,3", n_boot=0, figures=False, progress=False)
    rows = result.rows
    assert result.check <= 1e-5  # the unpatched copies are direct's scores of the bad items
    assert set(rows["control"]) == {"source", "target", "other"} and set(rows["layer"]) == {1, 3}
    direct = bp.score_direct(lm, items, conditional=True, progress=False).set_index("pair_id")
    by_id = items.set_index("item_id")
    good = items[items["label"] == 1].drop_duplicates(["language", "parallel_id"]).set_index(["language", "parallel_id"])

    def prefix_state(item_id):  # the item's prefix alone, its last token
        ids = lm.encode([by_id.at[item_id, "prefix"]])[0].ids
        return hf_run(lm, ids, read=len(ids) - 1)[1]

    for row in rows.itertuples():
        pair = direct.loc[row.pair_id]
        assert (row.s_good, row.s_bad) == pytest.approx((pair["score_good"], pair["score_bad"]))
        bad = items[(items["pair_id"] == row.pair_id) & (items["label"] == 0)].iloc[0]
        parallel = row.other_parallel_id if row.control == "other" else row.parallel_id
        source = row.language if row.control == "target" else "en"
        state = prefix_state(good.at[(source, parallel), "item_id"])
        ids = lm.encode([bad["text"]])[0].ids
        at = len(lm.encode([bad["prefix"]])[0].ids) - 1
        logits = hf_run(lm, ids, {j: (at, state[j - 1]) for j in range(row.layer, lm.n_layers + 1)})
        logprobs = torch.log_softmax(logits.double(), -1)
        expected = sum(logprobs[p - 1, ids[p]].item() for p in range(at + 1, len(ids)))
        assert row.s_patched == pytest.approx(expected, abs=1e-4)
        assert row.recovery == pytest.approx((expected - row.s_bad) / (row.s_good - row.s_bad), abs=1e-3)
        if row.control == "other":  # another concept than the pair's two, in the source language
            concepts = {good.loc[("en", row.parallel_id), "prefix"],
                        items.loc[(items["language"] == "en") & (items["parallel_id"] == bad["parallel_id"]), "prefix"]
                        .iloc[0] if (items["parallel_id"] == bad["parallel_id"]).any() else None}
            assert good.loc[("en", row.other_parallel_id), "prefix"] not in concepts


def test_pairs_items_need_parallel_id_and_prefix():
    items = bp.load_items("xcomps-sample", languages=["en"], limit=1)
    with pytest.raises(bp.BabelprobeError, match="no 'parallel_id' field"):
        check_items(items.drop(columns=["parallel_id"]), ("en",))
    with pytest.raises(bp.BabelprobeError, match="no 'prefix' field"):
        check_items(items.drop(columns=["prefix"]), ("en",))
    with pytest.raises(bp.BabelprobeError, match="no items in 'de'"):
        check_items(items, ("de",))


# ------------------------------------------------------------------------------------- command, report

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, models):
    path = tmp_path_factory.mktemp("tiny-patch-model")
    models["gemma3"].model.save_pretrained(path)
    models["gemma3"].tokenizer.save_pretrained(path)
    return path


def test_both_protocols_into_one_directory_and_the_report(tiny_dir, tmp_path, capsys):
    concepts = tmp_path / "concepts.csv"
    concepts_table().to_csv(concepts, index=False)
    out = tmp_path / "patch"
    translation_args = ["patch", "--model", tiny_dir, "--protocol", "translation", "--concepts", concepts,
                        "--n-pairs", "2", "--n-boot", "20", "--out", out, "--no-progress",
                        *[f"--{k.replace('_', '-')}={v}" for k, v in SETTING.items()]]
    assert main([str(a) for a in translation_args]) == 0
    assert "layers where patching moved the output language" in capsys.readouterr().out
    pairs_args = ["patch", "--model", tiny_dir, "--protocol", "pairs", "--languages", "en,de", "--limit", "1",
                  "--sources", "en", "--min-gap", "0", "--n-boot", "20", "--out", out, "--no-progress"]
    assert main([str(a) for a in pairs_args]) == 0
    assert "check: the patch runs' unpatched copies match" in capsys.readouterr().out
    for name in ("translation.csv", "translation_summary.csv", "pairs.csv", "summary.csv", "onsets.csv",
                 "figures/patch_translation.png", "figures/patch_recovery.png"):
        assert (out / name).exists(), name
    stages = json.loads((out / "patch.json").read_text())["stages"]
    assert set(stages) == {"translation", "pairs"}
    pairs = pd.read_csv(out / "pairs.csv")
    assert set(pairs["language"]) == {"en", "de"} and pairs["pair_id"].str.endswith(("-en", "-de")).all()
    # the same command again reuses the rows (the file is not rewritten)
    before = (out / "translation.csv").stat().st_mtime_ns
    assert main([str(a) for a in translation_args]) == 0
    assert (out / "translation.csv").stat().st_mtime_ns == before
    # the report of the directory: both protocols
    assert main(["report", "--results", str(out), "--n-boot", "20"]) == 0
    report = (out / "figures" / "report.md").read_text()
    assert "## Translation" in report and "## Minimal pairs" in report
    # a flag of the other protocol is refused
    assert main([str(a) for a in [*pairs_args[:-1], "--n-pairs", "3"]]) == 2
    assert "--n-pairs applies to --protocol translation" in capsys.readouterr().err
    # the translation again with other settings: its own tables replaced (said on stderr), the pairs' kept
    pairs_before = (out / "pairs.csv").stat().st_mtime_ns
    fewer = [str(a) for a in translation_args]
    fewer[fewer.index("--n-pairs") + 1] = "1"
    assert main(fewer) == 0
    assert "replacing the translation results made with other settings (n_pairs)" in capsys.readouterr().err
    assert pd.read_csv(out / "translation.csv")["pair_idx"].nunique() == 1
    assert (out / "pairs.csv").stat().st_mtime_ns == pairs_before
    assert set(json.loads((out / "patch.json").read_text())["stages"]) == {"translation", "pairs"}
    # --n-boot and --min-gap change only the summaries: the rows are reused, the summary follows
    rows = pd.read_csv(out / "pairs.csv")
    margins = rows["s_good"] - rows["s_bad"]
    gap = float(margins[margins > 0].median())  # signed: pairs decided wrongly never count
    assert main([*[str(a) for a in pairs_args[:-1]], "--min-gap", repr(gap), "--n-boot", "10", "--no-progress"]) == 0
    assert "replacing" not in capsys.readouterr().err
    assert (out / "pairs.csv").stat().st_mtime_ns == pairs_before
    state = json.loads((out / "patch.json").read_text())
    assert state["summaries"]["pairs"] == {"min_gap": gap, "n_boot": 10} and "min_gap" not in state["stages"]["pairs"]
    kept = rows[((rows["s_good"] - rows["s_bad"]) >= gap) & (rows["control"] == "source")]
    summary = pd.read_csv(out / "summary.csv")
    summary = summary[(summary["language"] == "all") & (summary["control"] == "source")].set_index("layer")["n"]
    assert 0 < len(kept) < (rows["control"] == "source").sum()
    assert summary.to_dict() == kept.groupby("layer").size().to_dict()


def test_settings_are_checked(tmp_path):
    with pytest.raises(bp.BabelprobeError, match="the same output language"):
        TranslationSettings(source="de-zh", target="fr-zh")
    with pytest.raises(bp.BabelprobeError, match="--source 'dezh': write a language pair as IN-OUT"):
        TranslationSettings(source="dezh")
    with pytest.raises(bp.BabelprobeError, match="--exp: unknown value 'exp3'"):
        TranslationSettings(exps="exp1,exp3")
    with pytest.raises(bp.BabelprobeError, match="layer 0 .* is not a block output"):
        bp.patch_translation(tiny_lm("llama", max_positions=512), concepts_table(), out=tmp_path / "o", layers="0-2",
                             **SETTING)
    assert not (tmp_path / "o").exists()


def test_an_experiment_not_run_needs_no_words_or_prompt_names():
    """--exp exp1 needs nothing in --source-pairs' languages (here ko and sw: no words, sw no prompt name),
    --exp exp2 nothing in --source's; the latent language needs words (both experiments count its set) but no
    prompt name (it is never written in a prompt)."""
    exp1 = TranslationSettings(exps="exp1", source="de-es", target="fr-en", latent="de", source_pairs="ko-sw", shots=2)
    assert exp1.languages() == ["de", "es", "fr", "en"]
    assert len(translation.check_concepts(concepts_table(), exp1, "concepts.csv")) == len(WORDS)
    exp2 = TranslationSettings(exps="exp2", source="sw-ko", target="fr-en", latent="de", source_pairs="de-es", shots=2)
    assert exp2.languages() == ["fr", "en", "de", "es"]
    assert TranslationSettings(exps="exp2", latent="sw", target="fr-en", source_pairs="de-es").prompt_languages() == \
        ["fr", "en", "de", "es"]  # a latent language without a prompt name is no error
    assert len(translation.check_concepts(concepts_table(), exp2, "concepts.csv")) == len(WORDS)
    with pytest.raises(bp.BabelprobeError, match="language 'sw' has no name"):
        TranslationSettings(source="de-es", target="fr-en", latent="de", source_pairs="ko-sw")


# ------------------------------------------------------------------------------------ the default model

@pytest.mark.slow
def test_default_model_last_layer_patch_gives_the_source_answer(default_lm, tmp_path):
    """Gemma-3-270M, exp1 on the bundled concepts: patching block 18's output at the last token gives the
    source prompt's own answer (its baseline), as the final norm and head are all that follow."""
    result = bp.patch_translation(default_lm, "xcomps-sample", out=tmp_path, exps="exp1", n_pairs=2, layers="18",
                                  n_boot=0, figures=False, progress=False)
    rows = result.rows
    assert np.allclose(rows["p_src_concept_src_lang"], rows["base_src"], atol=1e-5)
    # the patched target now answers as the source prompt, not as itself (its own concept's probability moves)
    assert not np.allclose(rows["p_tgt_concept_tgt_lang"], rows["base_tgt"], atol=1e-5)


# -------------------------------------------------------------- bad input (docs/reliability.md P1-P4)

def _patch_cli(tiny_dir, out, *args) -> int:
    return main([str(a) for a in ["patch", "--model", tiny_dir, "--out", out, "--no-progress", *args]])


def test_P1_pairs_items_without_parallel_id_or_prefix(tiny_dir, tmp_path, capsys):
    items = bp.load_items("xcomps-sample", languages=["en", "de"], limit=1)
    path = tmp_path / "items.csv"
    items.drop(columns=["parallel_id"]).to_csv(path, index=False)
    assert _patch_cli(tiny_dir, tmp_path / "out", "--protocol", "pairs", "--items", path) == 2
    assert "no 'parallel_id' field" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_P2_a_language_with_no_prompt_name(tiny_dir, tmp_path, capsys):
    assert _patch_cli(tiny_dir, tmp_path / "out", "--protocol", "translation", "--target", "fr-sw") == 2
    err = capsys.readouterr().err
    assert err.startswith("babelprobe: error: ") and "sw" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_P3_fewer_concepts_than_shots_plus_one(tiny_dir, tmp_path, capsys):
    concepts = tmp_path / "concepts.csv"
    concepts_table().to_csv(concepts, index=False)
    args = ["--protocol", "translation", "--concepts", concepts, "--shots", "12",
            *[f"--{k.replace('_', '-')}={v}" for k, v in SETTING.items() if k != "shots"]]
    assert _patch_cli(tiny_dir, tmp_path / "out", *args) == 2
    assert "a prompt needs --shots 12 + 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_P4_too_few_pairs_after_collisions(tiny_dir, tmp_path, capsys):
    concepts = tmp_path / "concepts.csv"
    concepts_table().to_csv(concepts, index=False)
    args = ["--protocol", "translation", "--concepts", concepts, "--n-pairs", "500", "--exp", "exp1",
            *[f"--{k.replace('_', '-')}={v}" for k, v in SETTING.items()]]
    assert _patch_cli(tiny_dir, tmp_path / "out", *args) == 2
    assert "of 500 pairs for de-es → fr-en" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
