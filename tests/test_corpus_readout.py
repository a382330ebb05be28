"""The corpus readout of interventions (`--readouts ppl`) and Deng et al.'s projection ablation, each against
a hand computation: Hugging Face's own forward pass and loss, and the released formulas written out here
(RUCAIBox/Language-Specific-Neurons ppl.py; Mongjin/multilingual-llm-features SAE/inference.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from babelprobe.interventions.corpus_readout import corpus_nll, readout_rows, row_nll

pytestmark = pytest.mark.usefixtures("one_thread")

LINES = {"en": ["A dog can bark.", "A cat can climb trees.", "An eagle can fly.", "A chair has four legs."],
         "de": ["Ein Hund kann bellen.", "Eine Katze kann klettern.", "Un chien peut aboyer."],
         "ru": ["Собака умеет лаять.", "Кошка умеет лазить по деревьям."]}
# float32 logits over a 600-token vocabulary, a log-softmax and a mean of ≤ 40 terms: a few ulps of the
# values (≈ 6.4, so ~1e-6 each) add up to well under 1e-5 relative; 1e-5 leaves room for kernel choice
RTOL = 1e-5


def corpus_folder(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "heldout").mkdir(parents=True)
    for code, lines in LINES.items():
        (folder / f"{code}.txt").write_text("\n".join(lines * 2) + "\n", encoding="utf-8")
        (folder / "heldout" / f"{code}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def released_ppl(lm, rows) -> float:
    """ppl.py's number for rows of token ids: per row the mean of the prompt log-probs after the first
    token (vLLM's prompt_logprobs, `if r` drops the first), the mean over rows, negated."""
    per_row = []
    with torch.inference_mode():
        for row in rows:
            logits = lm.model(input_ids=torch.tensor([row])).logits[0].double()
            logprobs = torch.log_softmax(logits, dim=-1)
            per_row.append(np.mean([float(logprobs[i - 1, row[i]]) for i in range(1, len(row))]))
    return -float(np.mean(per_row))


def test_row_nll_equals_the_released_ppl_arithmetic_on_packed_rows(tiny):
    from babelprobe.corpus import pack_rows

    rows = pack_rows(tiny, LINES["en"], 7, keep_last=True)
    assert len(rows) > 2 and len({len(r) for r in rows}) == 2  # full rows and a shorter last one
    ours = corpus_nll(tiny, {"en": rows}, batch_tokens=16).set_index("language")  # several batches, padded
    assert ours.loc["en", "nll"] == pytest.approx(released_ppl(tiny, rows), rel=RTOL)
    assert ours.loc["en", "ppl"] == pytest.approx(np.exp(released_ppl(tiny, rows)), rel=RTOL)
    assert ours.loc["en", "n_tokens"] == sum(len(r) - 1 for r in rows)


def test_the_lines_rows_give_deng_et_al_s_cross_entropy(tiny):
    """compute_ce_loss: one text per forward, HF's loss with labels[:, 0] = -100, averaged over texts."""
    settings = type("S", (), {"corpus_rows": "lines", "window": 8, "tokens": None})()
    corpus = type("C", (), {"heldout": {"en": LINES["en"]}})()
    rows = readout_rows(tiny, corpus, settings)["en"]
    losses = []
    with torch.inference_mode():
        for line in LINES["en"]:
            # Gemma's and Llama's tokenizers put BOS first (the tiny one adds none: put it here)
            ids = torch.tensor([[tiny.bos_token_id, *tiny.tokenizer(line, add_special_tokens=False).input_ids]])
            labels = ids.clone()
            labels[:, 0] = -100
            losses.append(float(tiny.model(ids, labels=labels).loss))
    assert [r[0] for r in rows] == [tiny.bos_token_id] * len(LINES["en"])
    np.testing.assert_allclose(row_nll(tiny, rows), losses, rtol=RTOL)


def deng_edit(h: torch.Tensor, W_dec: torch.Tensor, idx: list[int]) -> torch.Tensor:
    """SAE/inference.py add_hook_to_change_activation_ablation, written out: the directions are columns of
    W_dec.T, each divided by its squared norm, the coefficients the raw projections act @ W_dec.T."""
    direction = W_dec.T[:, idx]
    norm = torch.norm(direction, dim=0) ** 2
    direction = direction / norm
    coefficient = (h @ W_dec.T)[..., idx]
    return h - coefficient @ direction.T


def released_layers_nll(lm, rows, saes, features) -> list[float]:
    """SAE/inference.py with --modified_layer_num N, written out: for i < N,
    add_hook_to_change_activation_ablation(layer + i) hooks model.layers[layer + i] (babelprobe layer
    layer + i + 1) with that layer's own SAE and features, all at once; then compute_ce_loss (one text per
    forward, Hugging Face's loss with the first label masked)."""
    def hook_for(sae, idx):
        def hook(module, args, output):
            act = output[0] if isinstance(output, tuple) else output
            new = deng_edit(act, sae.W_dec, [int(i) for i in idx])
            return (new, *output[1:]) if isinstance(output, tuple) else new
        return hook

    handles = [lm.parts.layers[sae.layer - 1].register_forward_hook(hook_for(sae, idx))
               for sae, idx in zip(saes, features)]
    losses = []
    try:
        with torch.inference_mode():
            for row in rows:
                ids = torch.tensor([row])
                labels = ids.clone()
                labels[:, 0] = -100
                losses.append(float(lm.model(ids, labels=labels).loss))
    finally:
        for handle in handles:
            handle.remove()
    return losses


def test_the_projection_ablation_is_deng_et_al_s_formula_on_a_hand_case():
    from babelprobe.sae.edits import ProjectionAblation
    from babelprobe.sae.weights import SAE

    g = torch.Generator().manual_seed(0)
    W_dec = torch.randn(6, 4, generator=g)
    W_dec[1] = W_dec[0] + 0.3 * W_dec[1]  # two features that are far from orthogonal: one term each
    sae = SAE(W_enc=torch.randn(4, 6, generator=g), W_dec=W_dec, b_enc=torch.zeros(6), b_dec=torch.zeros(4),
              architecture="standard")
    h = torch.randn(2, 3, 4, generator=g)
    edited = ProjectionAblation(sae, [1, 0])(h)
    torch.testing.assert_close(edited, deng_edit(h, W_dec, [0, 1]), rtol=1e-5, atol=1e-6)
    # one feature: its direction projected out exactly
    single = ProjectionAblation(sae, [3])(h)
    torch.testing.assert_close(single @ W_dec[3], torch.zeros(2, 3), rtol=0, atol=1e-5)
    assert torch.equal(ProjectionAblation(sae, [])(h), h)


def test_the_ce_readout_under_the_projection_ablation_equals_a_hand_hooked_forward(tiny):
    from babelprobe.interventions.edits import Intervention
    from babelprobe.sae.edits import ProjectionAblation
    from babelprobe.sae.weights import SAE

    g = torch.Generator().manual_seed(1)
    d = tiny.d_model
    W_dec = torch.randn(16, d, generator=g)
    sae = SAE(W_enc=torch.randn(d, 16, generator=g), W_dec=W_dec, b_enc=torch.zeros(16), b_dec=torch.zeros(d),
              architecture="standard", layer=2)
    idx = [2, 5, 9]
    rows = [[tiny.bos_token_id, *tiny.tokenizer(t, add_special_tokens=False)["input_ids"]] for t in LINES["de"]]
    with Intervention(tiny, {2: ProjectionAblation(sae, idx)}):
        ours = row_nll(tiny, rows)

    losses = released_layers_nll(tiny, rows, [sae], [idx])  # Deng et al.'s hook on model.layers[1]: layer 2
    np.testing.assert_allclose(ours, losses, rtol=1e-4)  # the hooked block's output feeds 1 more block: ~1e-6


def test_intervene_reads_the_ppl_change_matrix_of_language_neurons(tiny_long, tmp_path):
    import babelprobe as bp

    folder = corpus_folder(tmp_path)
    neu = tmp_path / "neu"
    bp.language_neurons(tiny_long, corpus=folder, out=neu, min_tokens=5, figures=False, progress=False,
                        top_rate=0.05, window=8)
    result = bp.intervene(tiny_long, None, out=tmp_path / "ppl", neurons=neu, corpus=folder, methods="neurons",
                          readouts="ppl", n_random=1, window=6, progress=False)
    table = result.corpus
    assert result.rows.empty and set(table["off"]) == set(LINES) and set(table["language"]) == set(LINES)
    assert len(table) == 3 * 3 * 2  # off × evaluated language × (neurons, one random draw)
    np.testing.assert_allclose(table["delta_ppl"], table["ppl"] - table["ppl_base"], rtol=1e-12)
    # the baseline is the unedited model's readout, computed independently here
    from babelprobe.corpus import pack_rows

    for code in LINES:
        rows = pack_rows(tiny_long, LINES[code], 6, keep_last=True)
        base = table[table["language"] == code]["nll_base"].iloc[0]
        assert base == pytest.approx(released_ppl(tiny_long, rows), rel=RTOL)
    # switching a language's neurons off is ppl.py's mask: the same numbers by hand
    from babelprobe.neurons import deactivated
    from babelprobe.neurons.run import read_run

    lape, _ = read_run(neu)
    with deactivated(tiny_long, lape.neurons("de", 0.05)):
        rows = pack_rows(tiny_long, LINES["ru"], 6, keep_last=True)
        expected = released_ppl(tiny_long, rows)
    cell = table[(table["off"] == "de") & (table["language"] == "ru") & (table["direction"] == "neurons")]
    assert cell["nll"].iloc[0] == pytest.approx(expected, rel=RTOL)
    assert (tmp_path / "ppl" / "corpus.csv").exists() and (tmp_path / "ppl" / "figures" / "ppl_change.png").exists()
    pd.testing.assert_frame_equal(bp.intervene(tiny_long, None, out=tmp_path / "ppl", neurons=neu, corpus=folder,
                                               methods="neurons", readouts="ppl", n_random=1, window=6,
                                               progress=False, figures=False).corpus, table, check_dtype=False)


def test_ppl_readout_refusals(tiny_long, tmp_path):
    import babelprobe as bp
    from babelprobe.errors import BabelprobeError

    with pytest.raises(BabelprobeError, match="give --corpus"):
        bp.intervene(tiny_long, None, out=tmp_path / "a", methods="neurons", readouts="ppl", neurons=tmp_path)
    with pytest.raises(BabelprobeError, match="goes with --method neurons or sae"):
        bp.intervene(tiny_long, None, out=tmp_path / "a", methods="ablate", readouts="ppl", corpus="udhr")
    with pytest.raises(BabelprobeError, match="--ablate-mode goes with --method sae"):
        bp.intervene(tiny_long, None, out=tmp_path / "a", methods="neurons", ablate_mode="projection")
    with pytest.raises(BabelprobeError, match="add --readouts ppl"):
        bp.intervene(tiny_long, "xcomps-sample", out=tmp_path / "a", methods="neurons", corpus="udhr",
                     neurons=tmp_path)
    assert not (tmp_path / "a").exists()


def test_an_interrupted_ppl_readout_resumes_after_the_edits_it_finished(tiny_long, tmp_path, monkeypatch):
    """Ctrl-C inside the corpus readout keeps every finished edit (corpus.partial.jsonl); the same call
    resumes, reading only the edits left, and gives the table of an uninterrupted run."""
    import babelprobe as bp
    from babelprobe.interventions import corpus_readout

    folder = corpus_folder(tmp_path)
    neu = tmp_path / "neu"
    bp.language_neurons(tiny_long, corpus=folder, out=neu, min_tokens=5, figures=False, progress=False,
                        top_rate=0.05, window=8)
    options = dict(neurons=neu, corpus=folder, methods="neurons", readouts="ppl", n_random=1, window=6,
                   progress=False, figures=False)
    whole = bp.intervene(tiny_long, None, out=tmp_path / "whole", **options).corpus
    real, calls = corpus_readout.corpus_nll, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # the baseline and two edits done
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(corpus_readout, "corpus_nll", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bp.intervene(tiny_long, None, out=tmp_path / "cut", **options)
    assert len((tmp_path / "cut" / "corpus.partial.jsonl").read_text().splitlines()) == 3
    calls.clear()
    monkeypatch.setattr(corpus_readout, "corpus_nll", lambda *a, **k: calls.append(1) or real(*a, **k))
    resumed = bp.intervene(tiny_long, None, out=tmp_path / "cut", **options).corpus
    assert len(calls) == len(whole) // len(LINES) - 2  # the edits left: all but the two finished
    pd.testing.assert_frame_equal(resumed, whole, check_exact=True)
    assert not (tmp_path / "cut" / "corpus.partial.jsonl").exists()
