"""`shared_prefix_logprobs` (each prompt run once, its answers from the KV cache) against an independent
plain forward pass of every full prompt+answer string, on tiny random models (Llama, Gemma-3 with
sliding-window layers shorter than the prompts, GPT-2; with and without BOS; eager and sdpa attention)."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from babelprobe.benchmarks.core.logprobs import token_logprobs
from babelprobe.benchmarks.core.prefix import shared_prefix_logprobs
from babelprobe.models import wrap_model
from tests.tiny import tiny_config, tiny_lm, tiny_tokenizer

PROMPTS = ['Which concept has the property: "can bark", "dog" or "cat"? Answer: "',
           'Which concept has the property: "can climb trees", "Katze" or "Hund"? Answer: "',
           '哪个概念最有可能具有以下属性："会爬树"，"猫"还是"狗"？答案："',
           "A"]
ANSWERS = ['dog"', 'Katze"', "Hund", '猫"', "x", " can bark."]


def requests():
    """Every prompt with every answer (shared contexts), plus whole texts and a text given twice."""
    texts = [p + a for p in PROMPTS for a in ANSWERS] + ["A dog can bark.", "A dog can bark."]
    starts = [len(p) for p in PROMPTS for _ in ANSWERS] + [0, 0]
    return texts, starts


def reference(lm, text, start):
    """log p of the tokens ending after `start`, from the model's own forward pass over the whole
    unpadded text (HF logits, float64 log-softmax): no cache, no batching, no gathering."""
    enc = lm.encode([text])[0]
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([enc.ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return np.array([logp[p - 1, enc.ids[p]].item() for p in range(1, len(enc.ids)) if enc.offsets[p][1] > start])


def gemma_mixed(attn: str):
    """A tiny Gemma-3 whose layers are sliding (window 4, shorter than every prompt), full, sliding."""
    tokenizer = tiny_tokenizer()
    config = tiny_config("gemma3", len(tokenizer))
    config.layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn)
    return wrap_model(model, tokenizer, name=f"tiny-gemma3-mixed-{attn}")


MODELS = {"llama": lambda: tiny_lm("llama"), "gemma3": lambda: tiny_lm("gemma3"), "gpt2": lambda: tiny_lm("gpt2"),
          "llama-nobos": lambda: tiny_lm("llama", bos=False), "gemma3-mixed-eager": lambda: gemma_mixed("eager"),
          "gemma3-mixed-sdpa": lambda: gemma_mixed("sdpa")}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize(("past", "stack"), [(None, True), (8, True), (None, False)],
                         ids=["cpu-batches", "accelerator-batches", "kv-per-layer"])
def test_matches_plain_forward_pass(name, past, stack, monkeypatch):
    """Also with an accelerator's batches (`prefix.past_budget`: the budget bounds the new tokens, the copied
    past may be 8 times as large), which hold more rows of longer pasts, and its projection (every logit of a
    chunk of states, not vocabulary blocks), and with the keys and values kept per
    layer (as for a model dispatched over devices) instead of in one tensor."""
    import babelprobe.benchmarks.core.logprobs as logprobs
    import babelprobe.benchmarks.core.prefix as prefix
    from babelprobe.models import ACCELERATOR_PASS_TOKENS, CPU_PASS_TOKENS

    monkeypatch.setattr(prefix, "past_budget", lambda device: past)
    monkeypatch.setattr(prefix, "pass_tokens",
                        lambda device: CPU_PASS_TOKENS if past is None else ACCELERATOR_PASS_TOKENS)
    monkeypatch.setattr(prefix, "STACK_KV", stack)
    monkeypatch.setattr(logprobs, "_blockwise", lambda lm, device: past is None)  # an accelerator: every logit
    if past is not None:  # and fresh tensors each batch, as a GPU's allocator gives them (not a CPU's kept memory)
        monkeypatch.setattr(prefix, "keeps_memory", lambda device: False)
    lm = MODELS[name]()
    vocab = lm.parts.head.weight.shape[0]
    texts, starts = requests()
    expected = [reference(lm, text, start) for text, start in zip(texts, starts)]
    # one big batch; many small batches and chunks (a node's past then comes from earlier batches), their
    # states projected 5 at a time (collected over batches and cut) in blocks of 64 token ids
    for options, rows, block in (({"batch_tokens": 4096}, 1024, 4096),
                                 ({"batch_tokens": 60, "chunk_tokens": 50}, 5, 64)):
        monkeypatch.setattr(logprobs, "CPU_ROWS", rows)
        monkeypatch.setattr(logprobs, "LOGIT_CHUNK_BYTES", 4 * vocab * rows)
        monkeypatch.setattr(logprobs, "CPU_VOCAB_BLOCK", block)
        scored = shared_prefix_logprobs(lm, texts, starts, progress=False, **options)
        for text, start, s, e in zip(texts, starts, scored, expected):
            assert s.n_tokens == len(e) > 0
            np.testing.assert_allclose(s.logprobs, e, atol=2e-5, err_msg=f"{name} {options}: {text!r} from {start}")



@pytest.mark.parametrize("past", [None, 2], ids=["cpu", "accelerator"])
def test_segment_batches_within_budget_at_the_cheapest_cuts(past):
    """A level's segments: each in one batch, every batch within the budget (a CPU's: rows × (longest past +
    longest segment); an accelerator's: rows × longest segment, rows × longest past ≤ 2 budgets), and the
    batching costs (padded new tokens + a pass's cost each) the least of every way to cut the sorted segments
    (enumerated on small levels); on a large level, with passes free no segment shares a batch with a longer one."""
    from itertools import combinations

    from babelprobe.benchmarks.core.prefix import _segment_batches

    def fits(batch, lengths, pasts, budget):
        wn, wp = lengths[batch].max(), pasts[batch].max()
        if past is None:
            return len(batch) * (wp + wn) <= budget or len(batch) == 1
        return len(batch) * wn <= budget and len(batch) * wp <= past * budget or len(batch) == 1

    def cost(batches, lengths, pass_cost):
        return sum(len(b) * lengths[b].max() + pass_cost for b in batches)

    rng = np.random.default_rng(5)
    for trial in range(40):
        lengths, pasts = rng.integers(1, 8, size=9), rng.integers(0, 12, size=9)
        budget, pass_cost = int(rng.choice([16, 30, 60])), int(rng.integers(0, 25))
        order = sorted(range(9), key=lambda j: (-lengths[j], -pasts[j]))
        ways = ([order[a:b] for a, b in zip((0, *cuts), (*cuts, 9))]
                for k in range(9) for cuts in combinations(range(1, 9), k))
        least = min(cost(w, lengths, pass_cost) for w in ways if all(fits(b, lengths, pasts, budget) for b in w))
        batches = _segment_batches(lengths, pasts, budget, past, pass_cost)
        assert sorted(j for b in batches for j in b) == list(range(9))
        assert all(fits(b, lengths, pasts, budget) for b in batches)
        assert cost(batches, lengths, pass_cost) == least, (trial, budget, pass_cost)
    lengths, pasts = rng.integers(1, 30, size=400), rng.integers(0, 60, size=400)
    batches = _segment_batches(lengths, pasts, 512, past, 0)
    assert sorted(j for b in batches for j in b) == list(range(400))
    assert all(fits(b, lengths, pasts, 512) for b in batches)
    assert all(len(set(lengths[b].tolist())) == 1 for b in batches)


def test_prefix_tree_against_a_trie_of_prefixes():
    """The tree of sorted sequences (built from arrays) against a trie built from the distinct prefixes
    themselves: one node per distinct prefix, each token of each sequence at its prefix's node, a node's parent
    its prefix less one token, nodes numbered in the order their prefixes first come (depth first), and the
    segments (chains without branches) at their depth among segments; with repeated, nested and empty-tailed
    sequences, a few tokens wide (many shared starts) and many."""
    from babelprobe.benchmarks.core.prefix import _common_prefixes, _padded, _PrefixTree

    rng = np.random.default_rng(11)
    for trial in range(30):
        vocab = int(rng.choice([2, 3, 50]))
        sequences = [tuple(rng.integers(0, vocab, size=rng.integers(1, 9)).tolist()) for _ in range(rng.integers(1, 40))]
        sequences += [sequences[0], sequences[-1][:1]]  # a repeat and a prefix of another
        sequences.sort()
        tree = _PrefixTree(_padded([[*s, 7] for s in sequences]), np.array([len(s) for s in sequences]),
                           np.array(_common_prefixes(sequences)))
        prefixes = list(dict.fromkeys(s[:j + 1] for s in sequences for j in range(len(s))))  # first-come order
        node = {prefix: k + 1 for k, prefix in enumerate(prefixes)}
        assert tree.n_nodes == len(prefixes) + 1
        for k, s in enumerate(sequences):
            assert tree.paths[k, :len(s)].tolist() == [node[s[:j + 1]] for j in range(len(s))]
            assert (tree.paths[k, len(s):] == -1).all()
        assert tree.parent.tolist() == [-1] + [node.get(p[:-1], 0) for p in prefixes]
        assert tree.token[1:].tolist() == [p[-1] for p in prefixes]
        assert tree.depth[1:].tolist() == [len(p) - 1 for p in prefixes]
        children = {}
        for p in prefixes:
            children.setdefault(p[:-1], []).append(p)
        starts = [p for p in prefixes if len(p) == 1 or len(children[p[:-1]]) > 1]  # a segment starts here
        level = {}
        for p in starts:  # prefixes come parents first
            above = next((p[:j] for j in range(len(p) - 1, 0, -1) if p[:j] in level), None)
            level[p] = 0 if above is None else level[above] + 1
        for depth, (firsts, lengths) in enumerate(tree.levels):
            assert firsts.tolist() == [node[p] for p in starts if level[p] == depth]
            for first, length in zip(firsts.tolist(), lengths.tolist()):  # a chain of single children
                chain = [prefixes[first - 1]]
                while len(children.get(chain[-1], [])) == 1 and children[chain[-1]][0] not in level:
                    chain.append(children[chain[-1]][0])
                assert length == len(chain), trial
        assert sum(len(firsts) for firsts, _ in tree.levels) == len(starts)


@pytest.mark.parametrize("cells", [None, 0], ids=["numpy", "python"])
def test_sequences_sorted_as_python_sorts_their_tuples(monkeypatch, cells):
    """`_sorted_prefixes` (the first `lengths` tokens of each sequence) against Python's `sorted` of those tokens
    as tuples, ties in index order, and the common prefix of each with the one before counted token by token:
    with repeats, prefixes of others, sequences longer than what is sorted of them and token 0; in numpy and,
    past `SORT_CELLS`, in Python."""
    import babelprobe.benchmarks.core.prefix as prefix

    if cells is not None:
        monkeypatch.setattr(prefix, "SORT_CELLS", cells)
    rng = np.random.default_rng(5)
    for trial in range(40):
        vocab = int(rng.choice([1, 2, 3, 1000]))
        many = 3000 if trial % 10 == 0 else 60  # many ties: a sort that is not stable shows
        sequences = [rng.integers(0, vocab, size=rng.integers(1, 12)).tolist() for _ in range(rng.integers(1, many))]
        sequences += [list(sequences[0]), sequences[-1][:1], [*sequences[0], 0]]
        lengths = [int(rng.integers(1, len(s) + 1)) for s in sequences]
        keys = [tuple(s[:k]) for s, k in zip(sequences, lengths)]
        expected = sorted(range(len(keys)), key=keys.__getitem__)
        order, common = prefix._sorted_prefixes(sequences, lengths)
        assert order.tolist() == expected, trial
        previous = [()] + [keys[i] for i in expected[:-1]]
        shared = [next((j for j, (a, b) in enumerate(zip(k, p)) if a != b), min(len(k), len(p)))
                  for k, p in zip((keys[i] for i in expected), previous)]
        assert common.tolist() == shared, trial
    order, common = prefix._sorted_prefixes([], [])
    assert order.size == common.size == 0


@pytest.mark.parametrize(("room_budgets", "past", "chunk_budgets"), [(None, 8, 16), (3, 3, 3), (0.5, 1, 2)],
                         ids=["ample", "small-gpu", "tiny-gpu"])
def test_accelerator_plans_fit_the_device_memory(tiny, monkeypatch, room_budgets, past, chunk_budgets):
    """On CUDA (here its memory stood in for) a batch's copied past and a chunk's kept keys and values stay
    within `kv_room`, a quarter of the device's memory beyond the weights: with room for 3 budgets' keys and
    values, 3 past tokens per budget token and chunks of 3 budgets; with less than one, 1 and the least chunk (2
    budgets); with ample room the constants (8 and 16 budgets). The scores stay the plain forward pass's."""
    import babelprobe.benchmarks.core.prefix as prefix

    budget, kv = 40, prefix._kv_bytes_per_token(tiny)
    weights = sum(p.numel() * p.element_size() for p in (*tiny.model.parameters(), *tiny.model.buffers()))
    room = 10**15 if room_budgets is None else int(room_budgets * budget * kv)
    monkeypatch.setattr(prefix, "past_budget", lambda device: prefix.PAST_PER_TOKEN)
    monkeypatch.setattr(prefix, "_device_total", lambda device: weights + 4 * room + 3)
    assert prefix.kv_room(tiny) == room
    seen, plan_tree, chunks = {}, prefix._plan_tree, prefix._prefix_chunks

    def planned(*args):  # (tree, ids, targets, first_slot, batch_tokens, past, pad_id, pin)
        seen["past"] = args[5]
        return plan_tree(*args)

    def chunked(lengths, common, chunk_tokens):
        seen["chunk"] = chunk_tokens
        return chunks(lengths, common, chunk_tokens)

    monkeypatch.setattr(prefix, "_plan_tree", planned)
    monkeypatch.setattr(prefix, "_prefix_chunks", chunked)
    texts, starts = requests()
    scored = shared_prefix_logprobs(tiny, texts, starts, batch_tokens=budget, progress=False)
    assert seen == {"past": past, "chunk": chunk_budgets * budget}
    for text, start, s in zip(texts, starts, scored):
        np.testing.assert_allclose(s.logprobs, reference(tiny, text, start), atol=2e-5)
    monkeypatch.undo()
    assert prefix.kv_room(tiny) is None  # a CPU: no limit from memory

def test_same_tokens_and_flags_as_the_core(tiny):
    texts, starts = requests()
    texts.append("Ein Hund kann bellen.")
    enc = tiny.encode([texts[-1]])[0]
    starts.append(next(s for s, e in enc.offsets[1:] if e - s > 2) + 1)  # inside a token: spans the join
    shared = shared_prefix_logprobs(tiny, texts, starts, progress=False)
    core = token_logprobs(tiny, texts, starts, progress=False)
    assert shared[-1].spans_join
    for a, b in zip(shared, core):
        assert (a.ids, a.offsets, a.spans_join, a.truncated) == (b.ids, b.offsets, b.spans_join, b.truncated)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-5)


def test_every_distinct_prefix_is_run_once(tiny, monkeypatch):
    """The body sees each distinct token prefix of the texts once: the prompts' common opening once,
    each prompt once for all its answers."""
    texts, starts = requests()
    run = []
    body = tiny.parts.body

    def counting_body(**kw):
        width = kw["input_ids"].shape[1]
        run.append(int(kw["attention_mask"][:, -width:].sum()))  # real (unpadded) new tokens
        return body(**kw)

    monkeypatch.setattr(tiny.parts, "body", counting_body)
    shared_prefix_logprobs(tiny, texts, starts, progress=False)
    prefixes = set()
    for text, start in set(zip(texts, starts)):
        enc = tiny.encode([text])[0]
        last = max(p for p in range(1, len(enc.ids)) if enc.offsets[p][1] > start)
        prefixes |= {tuple(enc.ids[:j]) for j in range(1, last + 1)}  # inputs: up to the last scored token
    assert sum(run) == len(prefixes)
    assert sum(run) < sum(len(tiny.encode([t])[0].ids) for t in set(texts)) / 2  # far fewer than unshared


def test_each_predicting_state_is_projected_once(tiny, monkeypatch):
    """Only the states that predict scored tokens reach the vocabulary projection, each once: a prompt's last
    state predicts the first token of all its answers (the distinct token prefixes before scored tokens)."""
    import babelprobe.benchmarks.core.prefix as prefix

    texts, starts = requests()
    projected, gathered = [], prefix._gathered_logprobs

    def counting(lm, states, token_ids, state_of=None):
        projected.append(len(states))
        return gathered(lm, states, token_ids, state_of)

    monkeypatch.setattr(prefix, "_gathered_logprobs", counting)
    scored = shared_prefix_logprobs(tiny, texts, starts, progress=False)
    states = set()
    for text, start in set(zip(texts, starts)):
        enc = tiny.encode([text])[0]
        states |= {tuple(enc.ids[:p]) for p in range(1, len(enc.ids)) if enc.offsets[p][1] > start}
    assert sum(projected) == len(states) < sum(s.n_tokens for s in set_of(texts, starts, scored))


def set_of(texts, starts, scored):
    """One result per distinct (text, start) request."""
    return list({(t, s): r for t, s, r in zip(texts, starts, scored)}.values())


def test_nothing_to_score_and_truncation():
    lm = tiny_lm("llama", max_positions=12)
    long = PROMPTS[0] + 'dog"'
    scored = shared_prefix_logprobs(lm, ["A dog", long, "A dog can bark."], [5, len(PROMPTS[0]), 2],
                                    truncate=True, progress=False)
    assert scored[0].n_tokens == 0 and not scored[0].spans_join  # empty continuation
    assert scored[1].truncated and scored[1].n_tokens == 0  # the answer was cut off
    np.testing.assert_allclose(scored[2].logprobs, reference(lm, "A dog can bark.", 2), atol=2e-5)


def test_passes_never_read_the_mask_back(monkeypatch):
    """transformers' SDPA mask check (`_ignore_causal_mask_sdpa`: `padding_mask.all()`, a device read on a GPU)
    is not made in the prefix tree's passes (`prefix.sync_free_attention`), the attention is SDPA as before,
    and the model's setting is restored afterwards."""
    import transformers.masking_utils as masking

    lm = MODELS["gemma3-mixed-sdpa"]()  # sliding and full layers: both masks made without the check
    config = lm.parts.body.config
    assert config._attn_implementation == "sdpa"
    texts, starts = requests()
    expected = [reference(lm, text, start) for text, start in zip(texts, starts)]

    def read_back(*args, **kwargs):
        raise AssertionError("the mask was read back")

    monkeypatch.setattr(masking, "_ignore_causal_mask_sdpa", read_back)
    scored = shared_prefix_logprobs(lm, texts, starts, batch_tokens=60, chunk_tokens=50, progress=False)
    for s, e in zip(scored, expected):
        np.testing.assert_allclose(s.logprobs, e, atol=2e-5)
    assert config._attn_implementation == "sdpa"
    with pytest.raises(AssertionError, match="read back"):  # transformers' own path does read it
        lm.parts.body(input_ids=torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[0, 1, 1]]))


def test_a_model_with_its_own_sdpa_branch_keeps_its_attention():
    """Falcon's attention runs SDPA only where the implementation is named "sdpa" and otherwise adds the mask to
    its scores; the mask of babelprobe's own name is SDPA's boolean one, so switching Falcon (with no attention
    interface) would let every token see the ones after it. It keeps its attention, and scores as HF's own
    forward of each text alone."""
    from transformers import FalconConfig

    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    config = FalconConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          pad_token_id=0, bos_token_id=2, eos_token_id=1)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").eval()
    lm = wrap_model(model, tokenizer, name="tiny-falcon-sdpa")
    assert not getattr(lm.parts.body, "_supports_attention_backend", False)
    texts, starts = requests()
    scored = shared_prefix_logprobs(lm, texts, starts, batch_tokens=60, progress=False)
    for text, start, s in zip(texts, starts, scored):
        np.testing.assert_allclose(s.logprobs, reference(lm, text, start), atol=2e-5)
    assert lm.parts.body.config._attn_implementation == "sdpa"


def test_passes_keep_cudnn_attention_off(monkeypatch):
    """torch's cuDNN attention builds a plan on the host for every new shape (a prefix tree's passes all differ),
    so the scorers' passes switch that backend off for their own attention calls only (`without_cudnn_attention`)
    and the user's setting is back afterwards."""
    lm = MODELS["gemma3-mixed-sdpa"]()
    sdpa, seen = torch.nn.functional.scaled_dot_product_attention, []

    def recording(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    texts, starts = requests()
    torch.backends.cuda.enable_cudnn_sdp(True)
    shared_prefix_logprobs(lm, texts, starts, batch_tokens=60, progress=False)
    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()


def llama_sdpa():
    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama", len(tokenizer)), dtype=torch.float32,
                                             attn_implementation="sdpa")
    return wrap_model(model, tokenizer, name="tiny-llama-sdpa")


@pytest.mark.parametrize("build", [llama_sdpa, MODELS["gemma3-mixed-sdpa"]], ids=["llama", "gemma3-mixed"])
def test_grouped_queries_attend_without_repeated_keys(build, monkeypatch):
    """The passes' attention stacks the query heads that share a key/value head (`models.packed_gqa_attention`)
    instead of repeating keys and values per head (transformers' `repeat_kv` with a mask): the scores still
    equal the plain forward pass (itself transformers' SDPA with repeated keys), and no key or value is repeated."""
    import transformers.integrations.sdpa_attention as sdpa

    import babelprobe.models as models

    lm = build()
    config = lm.parts.body.config
    assert config._attn_implementation == "sdpa" and config.num_key_value_heads < config.num_attention_heads
    texts, starts = requests()
    expected = [reference(lm, text, start) for text, start in zip(texts, starts)]
    packed, calls = models.packed_gqa_attention, []

    def counted(*args, **kwargs):
        calls.append(packed(*args, **kwargs) is not None)
        return packed(*args, **kwargs)

    def repeated(*args, **kwargs):
        raise AssertionError("keys and values were repeated per head")

    monkeypatch.setattr(models, "packed_gqa_attention", counted)
    monkeypatch.setattr(sdpa, "repeat_kv", repeated)
    scored = shared_prefix_logprobs(lm, texts, starts, batch_tokens=60, chunk_tokens=50, progress=False)
    for s, e in zip(scored, expected):
        np.testing.assert_allclose(s.logprobs, e, atol=2e-5)
    assert calls and all(calls)


@pytest.mark.parametrize("build", [llama_sdpa, MODELS["gemma3-mixed-sdpa"]], ids=["llama", "gemma3-mixed"])
def test_a_pass_writes_its_keys_after_the_gathered_past_without_concatenating(build, monkeypatch):
    """A batch's past is gathered with room for its new tokens, which the pass writes in place
    (`prefix._in_place_layers`): transformers' layer never concatenates a past with new keys (made to fail here),
    and the scores still equal the plain forward pass's, sliding layers included."""
    from transformers.cache_utils import DynamicLayer

    lm = build()
    texts, starts = requests()
    expected = [reference(lm, text, start) for text, start in zip(texts, starts)]
    update = DynamicLayer.update

    def no_concatenation(self, key_states, value_states, *args, **kwargs):
        if self.is_initialized and self.keys is not None and self.keys.numel():
            raise AssertionError("a past was concatenated with new keys")
        return update(self, key_states, value_states, *args, **kwargs)

    monkeypatch.setattr(DynamicLayer, "update", no_concatenation)
    scored = shared_prefix_logprobs(lm, texts, starts, batch_tokens=60, chunk_tokens=50, progress=False)
    for s, e in zip(scored, expected):
        np.testing.assert_allclose(s.logprobs, e, atol=2e-5)


def test_the_past_is_gathered_into_kept_memory_on_a_cpu(monkeypatch):
    """On a CPU every batch's past is copied into one tensor and every chunk's node rows into another, each made
    once for the plan's largest (`prefix._KeptMemory`: memory touched for the first time costs more there than
    the copy), over many small batches and chunks; the scores still equal the plain forward pass's."""
    import babelprobe.benchmarks.core.prefix as prefix

    lm = tiny_lm("llama")
    texts, starts = requests()
    expected = [reference(lm, text, start) for text, start in zip(texts, starts)]
    rooms, stacks, gathered = [], [], prefix._NodeKV._gathered  # kept referenced: no address is reused

    def recorded(self, rows):
        stacks.append(self.stacked)
        rooms.append(gathered(self, rows))
        return rooms[-1]

    monkeypatch.setattr(prefix._NodeKV, "_gathered", recorded)
    scored = shared_prefix_logprobs(lm, texts, starts, batch_tokens=60, chunk_tokens=50, progress=False)
    assert len(rooms) >= 10 and len({id(t) for t in stacks}) >= 3  # gathers, chunks
    assert len({t.untyped_storage().data_ptr() for t in rooms}) == 1
    assert len({t.untyped_storage().data_ptr() for t in stacks}) == 1
    for s, e in zip(scored, expected):
        np.testing.assert_allclose(s.logprobs, e, atol=2e-5)
