"""The family conformance suite (issue 43): every decoder family babelprobe supports, each command's core
against a reference independent of babelprobe, on tiny random models built here from transformers
configs (tests/families.py).

    extract                    = HF `hidden_states` (layers 0..L-1) and a hand hook on the last block (layer L),
                                 through each of its backends (hf, nnsight, transformer_lens)
    score direct               = log-softmax of the HF forward's own logits (plain batches, and the prefix
                                 tree that `score direct` and `compare` run by default)
    score meta                 = the same, for the answer tokens after a shared prompt (the KV-cached tree)
    compare (one pass)         = compare's direct scoring with the store filled by the same forward passes (its
                                 default on an accelerator): HF's log-probs and hidden states, as above
    lens                       = the HF forward's logits, from the last layer's extracted state
    patch                      = a state written into itself changes nothing; the unpatched copy is HF's
    neurons                    = a hand hook on each family's MLP (tests/families.py NEURONS; a mixture of
                                 experts: HF's own eager expert loop, its act_fn calls mapped back to experts)
    intervene --method neurons = a hand edit of the down projection's input (experts: of act_fn's output)
    sae                        = the SAE pass reads the state extraction stores
    bfloat16 states            = a bfloat16 model's last-token states are bfloat16 values (why compare's store
                                 of them is bfloat16 by default: the same numbers in half the bytes)
    no read back               = the passes of scoring, extraction and compare's one pass ask the device for no
                                 value (`HostReads`: what would make a GPU's host wait between passes)

Extract (hf), score direct, score meta and compare's one pass run each family twice: with eager attention and,
where transformers has it for the family, with SDPA (what `from_pretrained` loads by default, and where
babelprobe's passes switch to their own SDPA without the mask's read back: `models.sync_free_attention`).
With BABELPROBE_TEST_DEVICE=cuda babelprobe's side runs on the GPU, its references on the CPU
(`bash perf/gpu_check.sh tests`).

A family or command babelprobe cannot support is an explicit refusal, checked here (`EXPECTED`). The
README's table of families × commands is rendered from the same `EXPECTED` by `family_table()`, and a test
checks README holds exactly it (`python -m tests.test_families` prints it).
`-m families` selects the suite.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from babelprobe.errors import BabelprobeError
from tests.families import (
    ATTENTIONS,
    BLOCKS,
    CONFIGS,
    DOWN,
    MOE,
    NEURONS,
    SHARED_EXPERT,
    STRUCTURAL,
    build,
    family_lm,
)
from tests.host_reads import HostReads

pytestmark = [pytest.mark.families, pytest.mark.usefixtures("one_thread")]

FAMILIES = tuple(CONFIGS)
COMMANDS = ("extract", "score direct", "score meta", "compare (one pass)", "lens", "patch", "neurons",
            "intervene --method neurons", "sae")
SHARED_REFUSAL = "mixtures of experts .* with a shared expert"


def expected(family: str, command: str) -> str:
    """"ok" (equals its reference) or the words of its one-line refusal."""
    if family in SHARED_EXPERT and command in ("neurons", "intervene --method neurons"):
        return SHARED_REFUSAL
    return "ok"


EXPECTED = {(f, c): expected(f, c) for f in FAMILIES for c in COMMANDS}

TEXTS = {"en": ["A dog can bark.", "A cat can climb trees.", "An eagle can fly."],
         "de": ["Ein Hund kann bellen.", "Eine Katze kann klettern."]}

# Tolerances. Babelprobe's passes batch and pad texts that the references run one at a time, so the float32
# matrix products differ in their summation order only: each output ~ eps32 (1.2e-7) × sqrt(terms) × the
# magnitude of the summands, compounded over the 3 blocks of these models (d = 32, I = 48). States are O(1)
# to O(10) (Granite's embedding multiplier 3), so 1e-5 relative plus 1e-5 absolute leaves a factor ≥ 10 over
# that; a log-prob is a difference of a logit and a logsumexp over 600 tokens, both O(10): 1e-5 × 10 = 1e-4.
STATE_TOL = dict(rtol=1e-5, atol=1e-5)
LOGPROB_TOL = dict(rtol=0, atol=1e-4)


def ids_of(lm, text: str) -> torch.Tensor:
    return torch.tensor([lm.encode([text])[0].ids])


def hf_forward(model, ids: torch.Tensor):
    with torch.inference_mode():
        return model(input_ids=ids, output_hidden_states=True, use_cache=False)


def last_block_output(model, family: str, ids: torch.Tensor) -> torch.Tensor:
    """The output of the last decoder block, read by a hook written here (HF's last hidden state is after
    the final norm)."""
    seen = {}
    block = model.get_submodule(BLOCKS[family])[-1]
    handle = block.register_forward_hook(lambda m, a, out: seen.__setitem__("h", out if torch.is_tensor(out) else out[0]))
    try:
        hf_forward(model, ids)
    finally:
        handle.remove()
    return seen["h"]


def items_frame() -> pd.DataFrame:
    from babelprobe.items import load_items

    rows = [{"item_id": f"{lang}-{i}", "pair_id": f"{lang}-{i // 2}", "language": lang, "subset": "s",
             "label": i % 2, "text": text} for lang, texts in TEXTS.items() for i, text in enumerate(texts)]
    return load_items(pd.DataFrame(rows))


def refuses(family: str, command: str):
    """pytest.raises for a refusal `EXPECTED` declares, else a context that expects nothing."""
    import contextlib

    words = EXPECTED[(family, command)]
    return contextlib.nullcontext() if words == "ok" else pytest.raises(BabelprobeError, match=words)


# ------------------------------------------------------------------------------------------ the checks

# extraction through each backend on the eager models, and hf's through SDPA where a family has it
EXTRACTIONS = [*((f, "eager", b) for f in FAMILIES for b in ("hf", "nnsight", "transformer_lens")),
               *((f, a, "hf") for f, a in ATTENTIONS if a != "eager")]


@pytest.mark.parametrize("family,attention,backend", EXTRACTIONS)
def test_extract_equals_hf_hidden_states(family, attention, backend, tmp_path):
    from babelprobe.extract import open_store
    from babelprobe.extract.run import extract

    lm, (model, _) = family_lm(family, attention), build(family, attention=attention)
    items = items_frame()
    extract(lm, items, tmp_path / "store", layers="all", pool="both", backend=backend, progress=False)
    store = open_store(tmp_path / "store")
    assert store.manifest["backend"]["name"] == backend
    assert_states_are_hf(lm, model, family, store, items)


def assert_states_are_hf(lm, model, family: str, store, items: pd.DataFrame) -> None:
    """Every layer of every row of a store of both poolings = HF's hidden states of the row's item's text: the
    last token's, and the mean over the tokens after BOS."""
    texts = dict(zip(items["item_id"], items["text"]))
    assert store.layers == list(range(lm.n_layers + 1)) and sorted(store.keys["item_id"]) == sorted(texts)
    for row, text in enumerate(store.keys["item_id"].map(texts)):
        ids = ids_of(lm, text)
        reference = list(hf_forward(model, ids).hidden_states[: lm.n_layers]) + [last_block_output(model, family, ids)]
        for layer, hidden in enumerate(reference):
            last = store.read(layer, pool="last", rows=np.array([row]))[0]
            mean = store.read(layer, pool="mean", rows=np.array([row]))[0]
            np.testing.assert_allclose(last, hidden[0, -1].numpy(), **STATE_TOL, err_msg=f"{text!r}, layer {layer}")
            np.testing.assert_allclose(mean, hidden[0, 1:].mean(0).numpy(), **STATE_TOL,
                                       err_msg=f"{text!r}, layer {layer}")


def hf_logprobs(model, ids: torch.Tensor) -> np.ndarray:
    """log p(token t | tokens before it) for t = 1.., from the HF forward's own logits."""
    logits = hf_forward(model, ids).logits[0].double()
    return torch.log_softmax(logits[:-1], -1).gather(1, ids[0, 1:, None])[:, 0].numpy()


@pytest.mark.parametrize("family,attention", ATTENTIONS)
def test_direct_scores_equal_hf_log_probs(family, attention):
    from babelprobe.benchmarks.core.logprobs import token_logprobs

    lm, (model, _) = family_lm(family, attention), build(family, attention=attention)
    texts = [t for values in TEXTS.values() for t in values]
    scored = token_logprobs(lm, texts, batch_tokens=64, progress=False)
    for text, mine in zip(texts, scored):
        np.testing.assert_allclose(mine.logprobs, hf_logprobs(model, ids_of(lm, text)), **LOGPROB_TOL)


# minimal pairs whose texts share starts (BOS, "A dog can", "A cat can climb"), so the prefix tree branches
PAIRS = {"en": [("A dog can bark.", "A dog can fly."), ("A cat can climb trees.", "A cat can climb clouds.")],
         "de": [("Ein Hund kann bellen.", "Ein Hund kann fliegen.")]}


def pair_items() -> pd.DataFrame:
    from babelprobe.items import load_items

    rows = [{"item_id": f"{lang}-{k}-{label}", "pair_id": f"{lang}-{k}", "language": lang, "subset": "s",
             "label": label, "text": text}
            for lang, pairs in PAIRS.items() for k, pair in enumerate(pairs) for label, text in zip((1, 0), pair)]
    return load_items(pd.DataFrame(rows))


def assert_pair_scores_are_hf_sums(lm, model, table: pd.DataFrame) -> None:
    """Each text's score (direct's default reduction, the sum) = the sum of HF's log-probs of its tokens, each
    within LOGPROB_TOL (so the sum within that times the tokens)."""
    assert len(table) == sum(map(len, PAIRS.values()))
    for side in ("good", "bad"):
        for text, score in zip(table[f"text_{side}"], table[f"score_{side}"]):
            reference = hf_logprobs(model, ids_of(lm, text))
            np.testing.assert_allclose(score, reference.sum(), rtol=0, atol=LOGPROB_TOL["atol"] * len(reference),
                                       err_msg=text)


@pytest.mark.parametrize("family,attention", ATTENTIONS)
def test_direct_scores_through_the_prefix_tree_equal_hf_log_probs(family, attention, monkeypatch):
    """`score direct`'s default path: the pairs' texts as a prefix tree, a shared start run once (KV cache)."""
    import babelprobe.benchmarks.direct as direct

    real, trees = direct.run_prefix, []

    def spied(lm, plan, **options):
        trees.append(plan)
        return real(lm, plan, **options)

    monkeypatch.setattr(direct, "run_prefix", spied)
    lm, (model, _) = family_lm(family, attention), build(family, attention=attention)
    assert_pair_scores_are_hf_sums(lm, model, direct.score_direct(lm, pair_items(), batch_tokens=64, progress=False))
    assert trees, "direct scoring did not take the prefix tree"


@pytest.mark.parametrize("family,attention", ATTENTIONS)
def test_compares_one_pass_gives_hf_scores_and_hidden_states(family, attention, tmp_path):
    """compare on an accelerator: direct scoring whose forward passes also fill the store (`extract.fused`)."""
    from babelprobe.benchmarks.scoring import DirectSettings, score_direct_capturing
    from babelprobe.extract import open_store
    from babelprobe.extract.fused import StoreCapture
    from babelprobe.extract.settings import ExtractSettings

    lm, (model, _) = family_lm(family, attention), build(family, attention=attention)
    items = pair_items()
    capture = StoreCapture(lm, items, tmp_path / "store", ExtractSettings(pool="both"), batch_tokens=64)
    with capture:
        table = score_direct_capturing(lm, items, tmp_path / "direct.csv", DirectSettings(), capture,
                                       batch_tokens=64, progress=False)
    assert_pair_scores_are_hf_sums(lm, model, table)
    store = open_store(tmp_path / "store")
    assert store.manifest["complete"] and "fused" in store.manifest
    assert_states_are_hf(lm, model, family, store, items)


@pytest.mark.parametrize("family,attention", ATTENTIONS)
def test_meta_answer_scores_equal_hf_log_probs(family, attention):
    from babelprobe.benchmarks.core.prefix import shared_prefix_logprobs

    lm, (model, _) = family_lm(family, attention), build(family, attention=attention)
    prompt = "Which concept has the property? The answer is"
    texts = [f"{prompt} {word}" for word in ("yes", "dog", "Katze")]
    scored = shared_prefix_logprobs(lm, texts, [len(prompt)] * len(texts), progress=False)
    for text, mine in zip(texts, scored):
        encoding = lm.encode([text])[0]
        positions = [p for p in range(1, len(encoding.ids)) if encoding.offsets[p][1] > len(prompt)]
        reference = hf_logprobs(model, torch.tensor([encoding.ids]))[[p - 1 for p in positions]]
        assert len(positions) >= 1
        np.testing.assert_allclose(mine.logprobs, reference, **LOGPROB_TOL)


@pytest.mark.parametrize("inference", [False, True], ids=["autograd", "inference_mode"])
def test_host_reads_sees_what_makes_a_gpu_wait(inference):
    """Each statement that reads a device value back is seen once, where it was called, also under inference mode
    (every pass's), where some composite operators reach the mode whole; integer indices, a three-argument
    `where`, a `repeat_interleave` told its size and a queued copy are not."""
    x = torch.arange(6.0)
    reads = [lambda: x.sum().item(), lambda: int(x.sum()), lambda: x[x > 2], lambda: bool((x > 0).all()),
             lambda: x.nonzero(), lambda: x.nonzero(as_tuple=True), lambda: torch.where(x > 2), lambda: x.argwhere(),
             lambda: torch.allclose(x, x), lambda: torch.bincount(x.long()),
             lambda: torch.repeat_interleave(torch.tensor([1, 2]))]
    quiet = [lambda: x[torch.tensor([0, 2])], lambda: torch.where(x > 2, x, 0.0),
             lambda: torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)]
    for statement in reads + quiet:
        with torch.inference_mode(inference), HostReads() as seen:
            statement()
        assert len(seen.seen) == (statement in reads), seen.seen
        assert all("test_families.py:" in where for _, where in seen.seen)
    # a copy to the host from a device (here the meta device: the copy itself then fails) unless it is queued
    on_device = torch.empty(3, device="meta")
    for copy, waits in ((lambda: on_device.cpu(), True), (lambda: torch.empty(3).copy_(on_device), True),
                        (lambda: on_device.to("cpu", non_blocking=True), False)):
        with HostReads() as seen, pytest.raises(NotImplementedError):
            copy()
        assert [name.endswith("(to the host)") for name, _ in seen.seen] == ([True] if waits else [])


@pytest.mark.parametrize("family,attention", ATTENTIONS)
def test_passes_wait_for_no_value_from_the_device(family, attention, tmp_path, monkeypatch):
    """Scoring (plain batches and the prefix trees of direct and meta), extraction and compare's fused pass launch
    every pass without reading a value back (`HostReads`): on a GPU the host then queues the next pass while the
    device runs this one, and reads each chunk's results back once, on another thread (issue 40). The CPU's own
    projection in blocks of the vocabulary is replaced by the accelerators' (it indexes by flags on the host), and
    the token meter counts as it does there. The SAE pass reads back only what the host cannot know: its codes'
    non-zeros, once per chunk."""
    import babelprobe.benchmarks.core.logprobs as logprobs
    from babelprobe.benchmarks.core.prefix import shared_prefix_logprobs
    from babelprobe.benchmarks.direct import score_direct
    from babelprobe.benchmarks.scoring import DirectSettings, score_direct_capturing
    from babelprobe.extract.fused import StoreCapture
    from babelprobe.extract.run import extract
    from babelprobe.extract.settings import ExtractSettings
    from babelprobe.sae.stats import sae_stats

    monkeypatch.setattr(logprobs, "_blockwise", lambda lm, device: False)
    monkeypatch.setattr("babelprobe.models.reads_are_free", lambda device: False)  # `runs.TokenMeter` as on a GPU
    lm, items = family_lm(family, attention), pair_items()
    texts = [t for values in TEXTS.values() for t in values]
    with HostReads() as reads:
        logprobs.token_logprobs(lm, texts, batch_tokens=64, progress=False)
        shared_prefix_logprobs(lm, texts, [4] * len(texts), batch_tokens=64, progress=False)
        score_direct(lm, items, batch_tokens=64, progress=False)
        extract(lm, items, tmp_path / "store", layers="all", pool="both", progress=False)
        with StoreCapture(lm, items, tmp_path / "fused", ExtractSettings(pool="both"), batch_tokens=64) as capture:
            score_direct_capturing(lm, items, tmp_path / "direct.csv", DirectSettings(), capture, batch_tokens=64,
                                   progress=False)
    assert not reads.seen, f"{family} ({attention}) reads back: {sorted(set(reads.seen))}"
    with HostReads() as reads:  # the SAE pass reads the codes' non-zeros back, once per chunk (`nonzero(as_tuple=True)`,
        sae_stats(lm, items, random_sae(lm, layer=2), batch_tokens=64)  # `nonzero_numpy` under inference mode)
    seen = {what for what, _ in reads.seen if not what.endswith("(to the host)")}  # its copies: tests/test_sae.py
    assert seen == {"nonzero_numpy"}, f"{family} ({attention}): {sorted(set(reads.seen))}"


@pytest.mark.parametrize("family", FAMILIES)
def test_lens_at_the_last_layer_is_the_models_logits(family, tmp_path):
    from babelprobe.extract import open_store
    from babelprobe.extract.run import extract
    from babelprobe.latent.lens import lens_logits

    lm, (model, _) = family_lm(family), build(family)
    items = items_frame()
    extract(lm, items, tmp_path / "store", layers=str(lm.n_layers), pool="last", progress=False)
    lens = lens_logits(lm, torch.from_numpy(open_store(tmp_path / "store").read(lm.n_layers))).numpy()
    for row, text in enumerate(items["text"]):
        real = hf_forward(model, ids_of(lm, text)).logits[0, -1].numpy()
        np.testing.assert_allclose(lens[row], real, rtol=1e-5, atol=1e-5 * np.abs(real).max())


@pytest.mark.parametrize("family", FAMILIES)
def test_a_state_patched_into_itself_changes_nothing(family):
    from babelprobe.patching.core import UNPATCHED, Target, patched_copies, read_states, token_set_probs

    lm, (model, _) = family_lm(family), build(family)
    encodings = lm.encode(TEXTS["en"])
    at = [len(e.ids) - 2 for e in encodings]
    read = [[len(e.ids) - 1] for e in encodings]
    states, _ = read_states(lm, encodings, at, read)
    every = tuple(range(1, lm.n_layers + 1))
    copies = [UNPATCHED, (0, (1,)), (0, (lm.n_layers,)), (0, every)]
    targets = [Target(e.ids, a, r, states[i:i + 1], copies) for i, (e, a, r) in enumerate(zip(encodings, at, read))]
    finals = patched_copies(lm, targets, batch_tokens=64)
    for encoding, final, r in zip(encodings, finals, read):
        hf = hf_forward(model, torch.tensor([encoding.ids]))
        np.testing.assert_allclose(final[0].numpy(), hf.hidden_states[-1][0, r].numpy(), **STATE_TOL)
        for copy in final[1:]:
            np.testing.assert_allclose(copy.numpy(), final[0].numpy(), **STATE_TOL)
        probs = token_set_probs(lm, final[0], [[[5, 6], [7]]])
        real = torch.softmax(hf.logits[0, r[0]].double(), -1)
        np.testing.assert_allclose(probs[0], [real[[5, 6]].sum(), real[7]], rtol=1e-4, atol=1e-7)


class EagerExperts:
    """HF's eager expert loop watched from outside (its `act_fn` calls mapped to experts as the loop makes
    them: the experts hit, in ascending order; each one's tokens in `torch.where(expert_mask[e])` order),
    for every block of a mixture-of-experts model while the context is open. `on_act(layer, expert, out)`
    may return a replacement of one call's activation."""

    def __init__(self, model, family: str, on_act):
        self.model, self.on_act = model, on_act
        self.experts = [block.get_submodule(NEURONS[family][1]) for block in model.get_submodule(BLOCKS[family])]

    def __enter__(self):
        self.saved = self.model.config._experts_implementation
        self.model.config._experts_implementation = "eager"
        self.handles, self.calls = [], {}
        for layer, experts in enumerate(self.experts, start=1):
            self.handles.append(experts.register_forward_pre_hook(self._routing(layer)))
            self.handles.append(experts.act_fn.register_forward_hook(self._act(layer)))
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.model.config._experts_implementation = self.saved

    def _routing(self, layer):
        def hook(module, args):
            top_k_index = args[1]
            mask = torch.nn.functional.one_hot(top_k_index, num_classes=module.num_experts + 1).permute(2, 1, 0)
            hit = [int(e) for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()[:, 0] if e < module.num_experts]
            self.calls[layer] = [(e, torch.where(mask[e])[1]) for e in hit]
            self.tokens = args[0].shape[0]
        return hook

    def _act(self, layer):
        def hook(module, args, out):
            expert, tokens = self.calls[layer].pop(0)
            return self.on_act(layer, expert, tokens, out)
        return hook


def hand_activations(model, family: str, ids: torch.Tensor) -> list[np.ndarray]:
    """Every block's MLP activation [tokens, I] of one text, by a hook written here (tests/families.py NEURONS;
    experts: [tokens, E·I], 0 where a token is not routed to the expert)."""
    from tests.families import _act, _gelu_bloom

    kind, path = NEURONS[family]
    if kind == "experts":
        dense = {}

        def keep(layer, expert, tokens, out):
            config = model.config
            n, width = config.num_local_experts if hasattr(config, "num_local_experts") else config.num_experts, \
                out.shape[-1]
            dense.setdefault(layer, torch.zeros(ids.shape[1], n, width))[tokens, expert] = out
        with EagerExperts(model, family, keep):
            hf_forward(model, ids)
        return [dense[layer].flatten(1).double().numpy() for layer in sorted(dense)]
    act = None if kind == "down" else _gelu_bloom() if family == "bloom" else _act(model.config)
    blocks = model.get_submodule(BLOCKS[family])
    seen = {}

    def keep(k):
        if kind == "down":  # OPT's blocks flatten the batch to [tokens, d] before their MLP
            return lambda m, args: seen.__setitem__(k, args[0][0] if args[0].dim() == 3 else args[0])
        if kind == "fused":
            return lambda m, args, out: seen.__setitem__(k, act(out[0].chunk(2, dim=-1)[0]))
        return lambda m, args, out: seen.__setitem__(k, act(out[0]))

    modules = [block.get_submodule(path) for block in blocks]
    handles = [m.register_forward_pre_hook(keep(k)) if kind == "down" else m.register_forward_hook(keep(k))
               for k, m in enumerate(modules)]
    try:
        hf_forward(model, ids)
    finally:
        for handle in handles:
            handle.remove()
    return [seen[k].double().numpy() for k in range(len(modules))]


@pytest.mark.parametrize("family", FAMILIES)
def test_neuron_counts_equal_a_hand_hook(family):
    from babelprobe.neurons.run import neuron_stats

    lm, (model, _) = family_lm(family), build(family)
    with refuses(family, "neurons"):
        stats = neuron_stats(lm, TEXTS, batch_tokens=64)
    if EXPECTED[(family, "neurons")] != "ok":
        return
    for k, language in enumerate(stats.languages):
        acts = [hand_activations(model, family, ids_of(lm, text)) for text in TEXTS[language]]
        counts = np.stack([sum((a[layer][1:] > 0).sum(0) for a in acts) for layer in range(lm.n_layers)])
        # an activation within rounding of 0 may count on one side in a batch and the other alone (neurons/mlp.py)
        assert np.abs(stats.over_zero[:, :, k] - counts).sum() <= 2, family
        assert stats.n_tokens[k] == sum(len(lm.encode([t])[0].ids) - 1 for t in TEXTS[language])
    assert stats.over_zero.shape[1] == acts[0][0].shape[1]


@pytest.mark.parametrize("family", FAMILIES)
def test_switching_neurons_off_equals_a_hand_edit_of_the_down_projection(family):
    from babelprobe.neurons.mlp import deactivated

    lm, (model, _) = family_lm(family), build(family)
    n_units = lm.parts.width or 48  # a mixture of experts: E·I
    off = {1: [0, n_units // 4 + 1, n_units // 2 + 2, 3 * n_units // 4 + 3], lm.n_layers: [3, n_units - 1]}
    ids = ids_of(lm, TEXTS["en"][1])
    with refuses(family, "intervene --method neurons"):
        with deactivated(lm, off):
            mine = hf_forward(model, ids).logits
    if EXPECTED[(family, "intervene --method neurons")] != "ok":
        return
    if family in MOE:  # the eager expert loop, each expert's selected units set to 0 in its act_fn output
        per_expert = model.get_submodule(BLOCKS[family])[0].get_submodule(NEURONS[family][1]).down_proj.shape[-1]

        def switch_off(layer, expert, tokens, out):
            units = [i % per_expert for i in off.get(layer, []) if i // per_expert == expert]
            out = out.clone()
            out[:, units] = 0
            return out
        with EagerExperts(model, family, switch_off):
            reference = hf_forward(model, ids).logits
        with EagerExperts(model, family, lambda *a: None):
            untouched = hf_forward(model, ids).logits
        assert (reference - untouched).abs().max() > 1e-4
        # babelprobe runs the grouped experts, the reference the eager loop: the same sums in another order
        np.testing.assert_allclose(mine.numpy(), reference.numpy(), rtol=1e-5, atol=1e-5 * reference.abs().max().item())
        return
    blocks = model.get_submodule(BLOCKS[family])

    def zero(indices):
        def hook(module, args):
            x = args[0].clone()
            x[..., indices] = 0
            return (x, *args[1:])
        return hook

    handles = [blocks[layer - 1].get_submodule(DOWN[family]).register_forward_pre_hook(zero(idx))
               for layer, idx in off.items()]
    try:
        reference = hf_forward(model, ids).logits
    finally:
        for handle in handles:
            handle.remove()
    untouched = hf_forward(model, ids).logits
    assert (reference - untouched).abs().max() > 1e-4  # the hand edit changes the logits: the check has teeth
    np.testing.assert_allclose(mine.numpy(), reference.numpy(), rtol=1e-6, atol=1e-6 * reference.abs().max().item())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_sae_pass_reads_the_state_extraction_stores(family, tmp_path):
    from babelprobe.extract import open_store
    from babelprobe.extract.run import extract
    from babelprobe.sae.stats import sae_stats

    lm = family_lm(family)
    layer = 2
    items = items_frame()
    stats = sae_stats(lm, items, random_sae(lm, layer), batch_tokens=64)
    extract(lm, items, tmp_path / "store", layers=str(layer), pool="last", progress=False)
    np.testing.assert_allclose(stats.last, open_store(tmp_path / "store").read(layer), **STATE_TOL)
    assert stats.n_tokens.sum() == sum(len(e.ids) - 1 for e in lm.encode(items["text"].tolist()))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_bfloat16_models_last_token_states_are_bfloat16_values(family, tmp_path):
    """Why compare stores a bfloat16 model's last-token rows in bfloat16 unless asked otherwise
    (`extract.settings.exact_dtype`): every state extraction stores of them, through each backend, is a
    bfloat16 value already (the blocks' outputs), so rounding it to bfloat16 changes no bit of it."""
    import copy

    from babelprobe.extract import open_store
    from babelprobe.extract.run import extract
    from babelprobe.models import wrap_model
    from tests.families import DEVICE

    model, tokenizer = build(family)
    half = wrap_model(copy.deepcopy(model).to(DEVICE, torch.bfloat16), tokenizer, name=f"tiny-{family}-bf16")
    # TransformerLens 4's bridge fails on a bfloat16 OLMo or OLMo 2 (its attention multiplies float32 weights by
    # bfloat16 values: "expected scalar type Float but found BFloat16"), in float32 it runs (above)
    backends = ("hf", "nnsight") if family in ("olmo", "olmo2") else ("hf", "nnsight", "transformer_lens")
    for backend in backends:
        extract(half, items_frame(), tmp_path / backend, layers="all", pool="last", dtype="float32",
                backend=backend, progress=False)
        store = open_store(tmp_path / backend)
        for layer in store.layers:
            values = torch.from_numpy(store.read(layer))
            assert values.abs().max() > 0 and torch.equal(values.to(torch.bfloat16).float(), values), (backend, layer)


def random_sae(lm, layer: int):
    """A ReLU SAE of 64 random features at `layer`, decoder the encoder's transpose."""
    from babelprobe.sae.weights import SAE

    W_enc = torch.randn(lm.d_model, 64, generator=torch.Generator().manual_seed(0))
    return SAE(W_enc=W_enc, W_dec=W_enc.T.contiguous(), b_enc=torch.zeros(64), b_dec=torch.zeros(lm.d_model),
               architecture="standard", layer=layer, path="random")


# ------------------------------------------------------------------------------ the table and refusals

def test_the_tables_embedding_columns_say_what_layer_0_holds():
    """Layer 0 (block 1's input) = the embedding × embed_scale, through embed_norm, where the positions are
    inside attention (rotary, alibi): the table's declared embedding columns, checked against HF."""
    from babelprobe.sites import families

    table = families()
    checked = 0
    for family in FAMILIES:
        lm, (model, _) = family_lm(family), build(family)
        row = lm.parts.family
        if family in STRUCTURAL:
            assert row.source == "structural" and family not in table
            continue
        assert row.source == "table" and lm.parts.embed is model.get_input_embeddings()
        if row.positions not in ("rotary", "alibi"):
            continue
        ids = ids_of(lm, TEXTS["de"][0])
        raw = torch.nn.functional.embedding(ids, model.get_input_embeddings().weight)
        expected_0 = raw * row.embed_multiplier(model.config)
        if row.embed_norm != "-":
            expected_0 = model.get_submodule(row.embed_norm)(expected_0)
        np.testing.assert_allclose(hf_forward(model, ids).hidden_states[0].numpy(), expected_0.detach().numpy(),
                                   **STATE_TOL, err_msg=family)
        checked += 1
    assert checked >= 15


def test_every_row_of_the_table_has_a_tiny_model_here():
    """A row added to babelprobe/data/families.csv comes with its family in this suite."""
    from babelprobe.sites import families

    covered = {CONFIGS[family](600).model_type for family in FAMILIES}
    assert set(families()) <= covered, sorted(set(families()) - covered)


def test_a_row_that_does_not_fit_the_model_falls_back_to_the_checked_structural_rule(monkeypatch):
    """A module renamed in another transformers version (GPT-NeoX's head: `embed_out` in 4.x, `lm_head` in 5,
    the row says `lm_head|embed_out`), or remote code under a known model_type: the row's paths are tried,
    then the structural rule, checked by the model's own forward."""
    from dataclasses import replace

    from babelprobe.models import wrap_model
    from babelprobe.sites import table

    model, tokenizer = build("gpt_neox")
    assert wrap_model(model, tokenizer).parts.head is model.lm_head
    moved = {**table.families(), "gpt_neox": replace(table.families()["gpt_neox"], blocks="gpt_neox.blocks")}
    monkeypatch.setattr(table, "families", lambda: moved)
    parts = wrap_model(model, tokenizer).parts
    assert parts.family.source == "structural" and parts.layers is model.gpt_neox.layers
    assert parts.final_norm is model.gpt_neox.final_layer_norm and not parts.missing


def test_a_family_outside_the_table_that_scales_its_logits_is_refused(monkeypatch):
    from babelprobe.models import wrap_model
    from babelprobe.sites import table

    without = {k: v for k, v in table.families().items() if k != "cohere"}
    monkeypatch.setattr(table, "families", lambda: without)
    model, tokenizer = build("cohere")
    with pytest.raises(BabelprobeError, match="cannot tell how cohere computes its logits.*logit_scale"):
        wrap_model(model, tokenizer)


def test_the_structural_rule_is_checked_by_the_models_own_forward(monkeypatch):
    """A family outside the table whose forward does something to the logits that its config does not say
    (here: doubles them) is refused, not scored wrong."""
    from transformers import LlamaForCausalLM

    from babelprobe.models import wrap_model
    from babelprobe.sites import table

    class Doubling(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 2
            return out

    model, tokenizer = build("llama")
    doubled = Doubling(model.config).eval()
    doubled.load_state_dict(model.state_dict())
    without = {k: v for k, v in table.families().items() if k != "llama"}
    monkeypatch.setattr(table, "families", lambda: without)
    with pytest.raises(BabelprobeError, match="head applied to its final states is not the model's own logits"):
        wrap_model(doubled, tokenizer)
    assert wrap_model(model, tokenizer).parts.family.source == "structural"  # the same model, undoubled, passes


def test_an_encoder_decoder_is_refused_from_its_config_before_any_weights_load(tmp_path, capsys):
    from transformers import MT5Config

    from babelprobe.models import load_model
    from tests.cli_errors import refused

    MT5Config(vocab_size=600, d_model=32, d_ff=48, num_layers=2, num_heads=4).save_pretrained(tmp_path / "mt5")
    # no weights in the folder: a refusal that came after loading them would be another error
    with pytest.raises(BabelprobeError, match=r"is an encoder-decoder \(mt5\); babelprobe needs a decoder-only"):
        load_model(str(tmp_path / "mt5"))
    refused(["score", "direct", "--model", tmp_path / "mt5", "--items", "xcomps-sample", "--limit", "1",
             "--out", tmp_path / "o.csv"], capsys, tmp_path / "o.csv", "encoder-decoder (mt5)")


# ------------------------------------------------------------------------------------- the commands

@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    """Model folders of a few families, for the commands themselves."""
    out = {}
    for family in ("bloom", "xglm", "cohere", "olmo2"):
        model, tokenizer = build(family)
        path = tmp_path_factory.mktemp(family)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        out[family] = path
    return out


@pytest.mark.parametrize("family", ["bloom", "xglm"])
def test_the_neurons_command_on_bloom_and_xglm_equals_a_hand_hook(family, family_dirs, tmp_path):
    from babelprobe.cli import main
    from babelprobe.items import load_items
    from babelprobe.neurons.lape import NeuronStats

    out = tmp_path / "neu"
    assert main(["neurons", "--model", str(family_dirs[family]), "--items", "xcomps-sample", "--languages", "en,de",
                 "--limit", "1", "--min-tokens", "5", "--out", str(out), "--no-progress"]) == 0
    stats = NeuronStats.read(out / "activation.h5")
    items = load_items("xcomps-sample", languages=["en", "de"], limit=1)
    lm, (model, _) = family_lm(family), build(family)
    for k, language in enumerate(stats.languages):
        texts = items.loc[items["language"] == language, "text"]
        acts = [hand_activations(model, family, ids_of(lm, text)) for text in texts]
        counts = np.stack([sum((a[layer][1:] > 0).sum(0) for a in acts) for layer in range(lm.n_layers)])
        assert np.abs(stats.over_zero[:, :, k] - counts).sum() <= 2


def test_score_direct_on_cohere_equals_hf(family_dirs, tmp_path):
    from babelprobe.cli import main
    from babelprobe.tables import read_table

    out = tmp_path / "direct.csv"
    assert main(["score", "direct", "--model", str(family_dirs["cohere"]), "--items", "xcomps-sample", "--languages",
                 "en", "--limit", "2", "--out", str(out), "--no-progress"]) == 0
    rows = read_table(out)
    lm, (model, _) = family_lm("cohere"), build("cohere")
    for text, score in zip(rows["text_good"], rows["score_good"]):
        assert score == pytest.approx(hf_logprobs(model, ids_of(lm, text)).sum(), abs=1e-4 * len(text))


def test_no_effect_is_reported_for_neurons_that_were_not_selected(family_dirs, tmp_path, capsys):
    """OLMo-2's tiny random model has activation probabilities at 1, so LAPE's τ_bar is 1 and no neuron belongs
    to any language (as in the released identify.py): `intervene --method neurons` refuses, before the model
    loads, instead of reporting effects of exactly zero."""
    from babelprobe.cli import main
    from babelprobe.neurons.edits import with_neurons
    from tests.cli_errors import refused

    neu = tmp_path / "neu"
    assert main(["neurons", "--model", str(family_dirs["olmo2"]), "--items", "xcomps-sample", "--languages", "en,de",
                 "--limit", "2", "--min-tokens", "5", "--out", str(neu), "--no-progress"]) == 0
    base = ["intervene", "--method", "neurons", "--neurons", neu, "--model", family_dirs["olmo2"], "--items",
            "xcomps-sample", "--languages", "en,de", "--limit", "2", "--readouts", "direct", "--out", tmp_path / "o",
            "--no-progress"]
    refused(base, capsys, tmp_path / "o", "selects no neurons of de, en at --top-rate 0.01",
            "switching nothing off has no effect to report")
    refused(base + ["--off", "en"], capsys, tmp_path / "o", "selects no neurons of en")
    # where some languages have neurons, the default --off leaves the others out, with a note
    sets = {"de": {1: [3]}, "en": {}, "ru": {2: []}}
    assert with_neurons(sets, explicit=False, where="neu/", top_rate=0.01, bar=0.5) == ("de",)
    assert "selects no neurons of en, ru" in capsys.readouterr().out
    with pytest.raises(BabelprobeError, match="selects no neurons of en, ru"):
        with_neurons(sets, explicit=True, where="neu/", top_rate=0.01, bar=0.5)


# ---------------------------------------------------------------------------------------- README table

def family_table() -> str:
    """The README's table of families × commands, from `EXPECTED` (every cell is a check of this suite)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from babelprobe.sites import families

    lines = ["| family | transformers class | sites | " + " | ".join(f"`{c}`" for c in COMMANDS) + " |",
             "|---" * (3 + len(COMMANDS)) + "|"]
    for family in FAMILIES:
        model_type = CONFIGS[family](600).model_type
        source = "table" if model_type in families() else "structural rule"
        cells = ["✓" if EXPECTED[(family, c)] == "ok" else "refused: shared expert" for c in COMMANDS]
        lines.append(f"| {family} | {MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]} | {source} | " + " | ".join(cells)
                     + " |")
    lines.append("| mt5 | MT5ForConditionalGeneration | — | " + " | ".join(["refused: encoder-decoder"] * len(COMMANDS))
                 + " |")
    return "\n".join(lines)


def readme_table(text: str) -> str:
    start, end = "<!-- families:start -->", "<!-- families:end -->"
    assert start in text and end in text, "README has no families table between its markers"
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def test_the_readme_table_is_the_suites():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert readme_table(readme) == family_table(), "README's families table is stale: python -m tests.test_families"


if __name__ == "__main__":
    print(family_table())
