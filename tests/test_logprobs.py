"""The token log-prob core against an independent plain forward pass, on tiny random models."""

import numpy as np
import pytest
import torch

from babelprobe.benchmarks.core.logprobs import _logsumexp_, length_batches, token_logprobs
from babelprobe.errors import BabelprobeError
from tests.tiny import tiny_lm

TEXTS = ["A dog can bark.", "Ein Hund kann bellen.", "狗会汪汪叫。", "犬は吠える。", "개는 짖을 수 있다.",
         "Собака умеет лаять.", "Con chó có thể sủa.", "x"]


def reference_token_logprobs(lm, text):
    """Unpadded single sentence, the model's own full forward pass, float64 log-softmax."""
    ids = torch.tensor([lm.encode([text])[0].ids])
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return np.array([logp[j - 1, ids[0, j]].item() for j in range(1, ids.shape[1])])


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_matches_plain_forward_pass(arch, side):
    lm = tiny_lm(arch)
    scored = token_logprobs(lm, TEXTS, padding_side=side, batch_tokens=40, progress=False)
    for text, s in zip(TEXTS, scored):
        np.testing.assert_allclose(s.logprobs, reference_token_logprobs(lm, text), atol=1e-5)
        assert s.n_tokens == len(lm.encode([text])[0].ids) - 1  # every token after BOS


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2", "llama-bias"])
def test_blockwise_projection_matches_plain_forward_pass(arch, monkeypatch):
    """A CPU projects the vocabulary a block at a time (`CPU_VOCAB_BLOCK`): blocks of 64 ids, the last one
    short, and 7 rows at a time, against the model's own forward (Gemma-3's soft-cap, a head with a bias)."""
    import babelprobe.benchmarks.core.logprobs as logprobs

    lm = tiny_lm(arch.split("-")[0])
    if arch.endswith("bias"):
        head = lm.model.lm_head
        head.bias = torch.nn.Parameter(torch.randn(head.out_features, generator=torch.Generator().manual_seed(1)))
    vocab = lm.parts.head.weight.shape[0]
    assert vocab % 64 and vocab > 64 * 5
    monkeypatch.setattr(logprobs, "CPU_VOCAB_BLOCK", 64)
    monkeypatch.setattr(logprobs, "CPU_ROWS", 7)
    slices = []
    original = lm.parts.logits
    monkeypatch.setattr(lm.parts, "logits", lambda hidden, vocab=None: slices.append(vocab) or original(hidden, vocab))
    scored = token_logprobs(lm, TEXTS, batch_tokens=40, progress=False)
    assert slices and all(s is not None and s.stop - s.start == 64 for s in slices)
    for text, s in zip(TEXTS, scored):
        np.testing.assert_allclose(s.logprobs, reference_token_logprobs(lm, text), atol=1e-5)


ALIKE = ["A dog can bark.", "A dog can fly.", "A dog", "A cat can bark.", "Ein Hund kann bellen.", "Ein Hund schläft."]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("blocked", [True, False], ids=["cpu-blocks", "whole-vocabulary"])
def test_texts_that_start_alike_share_their_states(side, blocked, monkeypatch):
    """A batch projects one state per distinct token prefix before a scored token (every text's first token
    from the same BOS state, the 'A dog' texts' common start once), 3 states at a time, with the CPU's
    vocabulary blocks and an accelerator's whole vocabulary; the log-probs stay the plain forward pass's."""
    import babelprobe.benchmarks.core.logprobs as logprobs

    lm = tiny_lm("llama")
    vocab = lm.parts.head.weight.shape[0]
    monkeypatch.setattr(logprobs, "_blockwise", lambda lm, device: blocked)
    monkeypatch.setattr(logprobs, "CPU_ROWS", 3)
    monkeypatch.setattr(logprobs, "LOGIT_CHUNK_BYTES", 4 * vocab * 3)
    monkeypatch.setattr(logprobs, "pass_tokens", lambda device: 10**6)  # one batch
    projected, gathered = [], logprobs._gathered_logprobs

    def counting(lm, states, token_ids, state_of=None):
        projected.append(len(states))
        return gathered(lm, states, token_ids, state_of)

    monkeypatch.setattr(logprobs, "_gathered_logprobs", counting)
    scored = token_logprobs(lm, ALIKE, padding_side=side, batch_tokens=4096, progress=False)
    for text, s in zip(ALIKE, scored):
        np.testing.assert_allclose(s.logprobs, reference_token_logprobs(lm, text), atol=1e-5)
    encoded = [lm.encode([t])[0].ids for t in ALIKE]
    distinct = {tuple(ids[:p]) for ids in encoded for p in range(1, len(ids))}
    assert projected == [len(distinct)] and len(distinct) < sum(len(ids) - 1 for ids in encoded) - len(ALIKE)


def test_batched_equals_one_at_a_time(tiny):
    together = token_logprobs(tiny, TEXTS, batch_tokens=4096, progress=False)
    alone = [token_logprobs(tiny, [t], progress=False)[0] for t in TEXTS]
    for a, b in zip(together, alone):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_continuation_given_prefix_is_the_chain_rule_remainder(tiny):
    text, prefix = "Ein Hund kann bellen.", "Ein Hund"
    full = token_logprobs(tiny, [text], progress=False)[0]
    cont = token_logprobs(tiny, [text], score_from=[len(prefix)], progress=False)[0]
    assert not cont.spans_join
    assert all(end > len(prefix) for _, end in cont.offsets)
    # log p(text) = log p(prefix tokens) + log p(continuation tokens | prefix)
    n_prefix = full.n_tokens - cont.n_tokens
    np.testing.assert_allclose(full.logprobs[n_prefix:], cont.logprobs, atol=1e-6)
    assert all(end <= len(prefix) for _, end in full.offsets[:n_prefix])


def test_token_spanning_the_join_is_scored_and_flagged(tiny):
    text = "Ein Hund kann bellen."
    enc = tiny.encode([text])[0]
    start, end = next((s, e) for s, e in enc.offsets[1:] if e - s > 2)
    scored = token_logprobs(tiny, [text], score_from=[start + 1], progress=False)[0]
    assert scored.spans_join and scored.offsets[0] == (start, end)


def test_without_bos_the_first_token_is_not_scored():
    lm = tiny_lm("llama", bos=False)
    assert lm.bos_policy == "none"
    scored = token_logprobs(lm, ["A dog can bark."], progress=False)[0]
    assert scored.n_tokens == len(lm.encode(["A dog can bark."])[0].ids) - 1
    np.testing.assert_allclose(scored.logprobs, reference_token_logprobs(lm, "A dog can bark."), atol=1e-5)


def test_over_length_text_is_an_error_unless_truncated():
    lm = tiny_lm("llama", max_positions=8)
    long = "Кошка умеет лазить по деревьям. " * 3
    with pytest.raises(BabelprobeError, match=r"item long-1 has \d+ tokens, more than the model's context of 8"):
        token_logprobs(lm, ["ok", long], names=["ok-1", "long-1"], progress=False)
    scored = token_logprobs(lm, [long], truncate=True, progress=False)[0]
    assert scored.truncated and scored.n_tokens == 7


def test_length_batches_respect_budget_and_cover_everything():
    lengths = [5, 17, 3, 9, 9, 30, 1]
    batches = length_batches(lengths, batch_tokens=30)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 30
    assert [lengths[b[0]] for b in batches] == sorted((lengths[b[0]] for b in batches), reverse=True)


def test_duplicates_are_scored_once_and_returned_in_order(tiny, monkeypatch):
    import babelprobe.benchmarks.core.logprobs as core

    seen = []
    original = core._score_batch
    monkeypatch.setattr(core, "_score_batch", lambda lm, inputs, *a: seen.extend(inputs["input_ids"]) or
                        original(lm, inputs, *a))
    out = token_logprobs(tiny, ["a b", "c d", "a b"], progress=False)
    assert len(seen) == 2  # rows through the model
    np.testing.assert_array_equal(out[0].logprobs, out[2].logprobs)


def test_option_scores_are_continuations_of_the_prompt(tiny):
    from babelprobe.benchmarks.core.choices import choose, option_scores

    prompt = "Which concept has the property? Answer: "
    scores = option_scores(tiny, [prompt, "A dog"], [["dog", "cat", "eagle"], [" can bark.", " can fly."]],
                           progress=False)
    assert [len(s) for s in scores] == [3, 2]
    full = reference_token_logprobs(tiny, prompt + "cat")  # entry j-1 is token j
    offsets = tiny.encode([prompt + "cat"])[0].offsets
    option_tokens = [j for j in range(1, len(offsets)) if offsets[j][1] > len(prompt)]
    assert scores[0][1] == pytest.approx(full[[j - 1 for j in option_tokens]].sum(), abs=1e-5)
    assert choose(tiny, [prompt], [["dog", "cat", "eagle"]], progress=False)[0] == int(np.argmax(scores[0]))


def test_in_place_logsumexp_matches_float64():
    """The in-place log-sum-exp of the vocabulary projection against float64 on wide, large-valued rows."""
    logits = torch.randn(6, 50_000, generator=torch.Generator().manual_seed(0)) * 20 + 300
    logits[2] -= 600  # far below zero: shifting by the row maximum keeps exp() in range
    expected = torch.logsumexp(logits.double(), dim=-1)
    np.testing.assert_allclose(_logsumexp_(logits.clone()).double(), expected, rtol=1e-6)
