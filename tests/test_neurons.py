"""Language-specific neurons (LAPE): counts inside the forward pass against a numpy reference from hooked
per-token activations, the definitions against a hand-computed case, a planted neuron, switching neurons
off against a hand edit of the MLP's down projection, the commands, the report and bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

import babelprobe as bp
from babelprobe.benchmarks.core.logprobs import token_logprobs
from babelprobe.cli import main
from babelprobe.neurons.lape import NeuronStats, kth_smallest, lape_scores, select_lape
from babelprobe.neurons.mlp import deactivated
from babelprobe.neurons.run import neuron_stats
from babelprobe.tables import read_table
from tests.cli_errors import refused
from tests.tiny import tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = ("llama", "gemma3", "gpt2")
TEXTS = {"en": ["A dog can bark", "A cat can climb trees", "An eagle can fly", "A chair has four legs",
                "The answer is yes"],
         "de": ["Ein Hund kann bellen", "Eine Katze kann klettern", "Ein Adler kann fliegen"],
         "ru": ["Собака умеет лаять", "Кошка умеет лазить по деревьям", "Собака и кошка", "Кошка умеет лаять"]}


def mlp_parts(lm, arch: str):
    """Per block, by hand: the MLP, its activation module and the module its down projection is."""
    mlps = [block.mlp for block in lm.parts.layers]
    if arch == "gpt2":
        return mlps, [m.act for m in mlps], [m.c_proj for m in mlps]
    return mlps, [m.act_fn for m in mlps], [m.down_proj for m in mlps]


def hooked_activations(lm, arch: str, text: str) -> list[np.ndarray]:
    """Every layer's activations [tokens, I] of one text run alone (no padding), read by a hook of our own."""
    _, acts, _ = mlp_parts(lm, arch)
    seen = {}
    handles = [m.register_forward_hook(lambda mod, a, out, k=k: seen.__setitem__(k, out[0].double().numpy()))
               for k, m in enumerate(acts)]
    try:
        ids = torch.tensor([lm.encode([text])[0].ids])
        with torch.inference_mode():
            lm.parts.body(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return [seen[k] for k in range(len(acts))]


# ------------------------------------------------------------------------------------- counting

@pytest.mark.parametrize("arch", ARCHS)
def test_counts_equal_a_numpy_reference_whatever_the_batching_and_padding(arch):
    lm = tiny_lm(arch, max_positions=512, seed=2)
    items = bp.load_items("xcomps-sample", languages=["en", "de", "ru"], limit=2)
    texts = {code: part["text"].tolist() for code, part in items.groupby("language")}
    reference = {}
    for code, values in texts.items():
        total, n = 0, 0
        for text in values:
            acts = hooked_activations(lm, arch, text)
            total = total + np.stack([(a[1:] > 0).sum(axis=0) for a in acts])  # BOS (position 0) not counted
            n += len(acts[0]) - 1
        reference[code] = (total, n)
    longest = max(len(e.ids) for e in lm.encode(items["text"].tolist()))
    for batch_tokens, padding in ((1, "right"), (8 * longest, "right"), (8 * longest, "left")):
        stats = neuron_stats(lm, items, batch_tokens=batch_tokens, padding=padding)
        assert stats.languages == ["de", "en", "ru"]
        for k, code in enumerate(stats.languages):
            np.testing.assert_array_equal(stats.over_zero[:, :, k], reference[code][0], err_msg=f"{padding} {code}")
            assert stats.n_tokens[k] == reference[code][1]


def test_counting_batches_reads_nothing_back_until_the_counts_are_taken():
    """`NeuronCounter.run` keeps its token count where the batch is (on a GPU a read per batch would make the host
    wait for every pass); `take` reads counts and tokens back once."""
    from babelprobe.models import pad_batch
    from babelprobe.neurons.mlp import NeuronCounter
    from tests.host_reads import HostReads

    lm = tiny_lm("llama", seed=2)
    batches = [pad_batch(lm.encode(texts), lm.pad_token_id, "right", lm.device)
               for texts in (["A dog can bark.", "Ein Hund"], ["Кошка спит."])]
    with NeuronCounter(lm) as counter, HostReads() as reads:
        for batch in batches:
            counter.run(batch)
    assert reads.seen == []
    counts, n = counter.take()
    assert n == sum(int(b["attention_mask"].sum()) - len(b["attention_mask"]) for b in batches)  # BOS left out
    assert counts.shape[0] == lm.n_layers and counter.n_tokens == 0


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_gated_activation_is_act_of_gate_before_the_up_product(arch):
    """What is counted in a gated MLP: act_fn(gate_proj(x)) (the released activation.py), by hand from the
    MLP's input."""
    lm = tiny_lm(arch, seed=2)
    mlp = lm.parts.layers[1].mlp
    seen = {}
    h1 = mlp.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0]))
    h2 = mlp.act_fn.register_forward_hook(lambda m, a, out: seen.__setitem__("act", out))
    with torch.inference_mode():
        lm.parts.body(input_ids=torch.tensor([lm.encode(["A dog can bark."])[0].ids]), use_cache=False)
    h1.remove(), h2.remove()
    gate = seen["x"].double() @ mlp.gate_proj.weight.detach().double().T
    by_hand = torch.nn.functional.silu(gate) if arch == "llama" else \
        torch.nn.functional.gelu(gate, approximate="tanh")
    np.testing.assert_allclose(seen["act"].double(), by_hand, atol=1e-5)
    assert ((seen["act"] > 0) == (gate > 0)).all()  # SiLU and GELU-tanh are > 0 exactly where their input is


# -------------------------------------------------------------------------------------- definitions

def hand_stats() -> NeuronStats:
    """One layer, 4 neurons, 3 languages of 10 tokens: p = (0.9, 0, 0), (0.5, 0.5, 0.5), (0.2, 0.1, 0), (0, 0, 0)."""
    p = np.array([[0.9, 0, 0], [0.5, 0.5, 0.5], [0.2, 0.1, 0], [0, 0, 0]])
    return NeuronStats((p * 10).round().astype(int)[None], [10, 10, 10], ["en", "de", "zh"])


def test_lape_of_a_hand_case():
    stats = hand_stats()
    raw = lape_scores(stats.p)[0]
    two_thirds = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    np.testing.assert_allclose(raw, [0.0, math.log(3), two_thirds, 0.0], atol=1e-12)  # 0·ln0 = 0, no NaN
    # the 12 probabilities sorted: six 0, 0.1, 0.2, 0.5, 0.5, 0.5, 0.9
    assert kth_smallest(stats.p, 0.95) == 0.5  # round(11.4) = 11th smallest
    lape = select_lape(stats, top_rate=0.5, filter_rate=0.5, bar_ratio=0.6)
    assert lape.tau == 0.0 and lape.bar == 0.1  # 6th and round(7.2) = 7th smallest
    table = lape.table.set_index("neuron")
    assert table.loc[3, "lape"] == np.inf  # no p above τ
    np.testing.assert_allclose(table.loc[[0, 1, 2], "lape"], [0.0, math.log(3), two_thirds])
    assert table["selected"].tolist() == [True, False, True, False]  # round(0.5 · 4) = 2 lowest: neurons 0 and 2
    assert table.loc[0, "languages"] == "en" and table.loc[2, "languages"] == "en"  # 0.2 > 0.1; 0.1 is not
    assert {k: v.tolist() for k, v in lape.neurons("en").items()} == {1: [0, 2]}
    assert lape.neurons("de") == {} and lape.neurons("zh") == {}
    counts = lape.counts.set_index("language")["n_selected"]
    assert counts.to_dict() == {"en": 2, "de": 0, "zh": 0}
    # the released defaults: τ = 0.5, and p = 0.5 is not above it: only neuron 0 is left a finite LAPE
    default = select_lape(stats).table.set_index("neuron")
    assert default.loc[0, "lape"] == 0.0 and np.isinf(default.loc[[1, 2, 3], "lape"]).all()
    assert default["selected"].sum() == round(0.01 * 4)  # 0 neurons at 1% of 4


def test_a_selection_where_no_neuron_has_a_language_reads_back(tmp_path):
    """Every activation probability at 1 (OLMo-2's tiny random model): τ_bar is 1, no neuron belongs to a language,
    lape.csv's `languages` column is all empty, and pandas reads it as float NaN; it reads back as empty strings,
    without pandas' warning that filling floats with a string will raise."""
    import warnings

    from babelprobe.neurons.lape import Lape
    from babelprobe.tables import write_table

    lape = select_lape(NeuronStats(np.full((1, 4, 2), 10), [10, 10], ["en", "de"]), top_rate=0.5)
    assert (lape.table["languages"] == "").all()
    write_table(lape.table, tmp_path / "lape.csv")
    write_table(lape.counts, tmp_path / "neurons.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = Lape.read(tmp_path, ["en", "de"], [0.5])
    assert back.table["languages"].tolist() == [""] * 4
    assert back.neurons("en") == {} and back.neurons("de") == {}


def test_the_selection_equals_torch_steps_of_the_released_identify():
    """Random counts through the released identify.py's steps, written here in torch (kthvalue, topk of the
    smallest, NaN → 0): the same τ, τ_bar, LAPE, selected neurons and languages as select_lape."""
    rng = np.random.default_rng(7)
    n = rng.integers(200, 400, 5)
    over_zero = rng.binomial(n, rng.beta(0.5, 0.5, (4, 50, 5)))
    over_zero[0, :3] = 0  # neurons that never fire: p̃ is 0/0 → 0
    codes = ["en", "de", "zh", "ja", "ru"]
    lape = select_lape(NeuronStats(over_zero, n, codes), top_rate=0.1, filter_rate=0.95, bar_ratio=0.9)

    probs = torch.tensor(over_zero, dtype=torch.float64) / torch.tensor(n, dtype=torch.float64)
    normed = probs / probs.sum(dim=-1, keepdim=True)
    normed[torch.isnan(normed)] = 0
    entropy = -(normed * torch.where(normed > 0, normed.log(), 0)).sum(dim=-1)
    flat = probs.flatten()
    tau = flat.kthvalue(round(len(flat) * 0.95)).values.item()
    entropy[(probs > tau).sum(dim=-1) == 0] = torch.inf
    _, index = entropy.flatten().topk(round(entropy.numel() * 0.1), largest=False)
    layer, neuron = index // entropy.shape[1], index % entropy.shape[1]
    bar = flat.kthvalue(round(len(flat) * 0.9)).values.item()

    assert (lape.tau, lape.bar) == (tau, bar)
    np.testing.assert_allclose(lape.table["lape"].to_numpy(), entropy.flatten().numpy(), rtol=0, atol=1e-12)
    assert torch.isfinite(entropy.flatten()[index]).all()  # no ties at +∞ that could be broken either way
    mine = lape.table[lape.table["selected"]]
    assert set(zip(mine["layer"] - 1, mine["neuron"])) == set(zip(layer.tolist(), neuron.tolist()))
    for k, code in enumerate(codes):
        member = probs[layer, neuron, k] > bar
        expected = {(int(l_) + 1, int(i)) for l_, i in zip(layer[member], neuron[member])}
        assert {(l_, int(i)) for l_, idx in lape.neurons(code).items() for i in idx} == expected, code


def test_top_rate_takes_a_list():
    lape = select_lape(hand_stats(), top_rate=[0.25, 0.5], filter_rate=0.5, bar_ratio=0.6)
    assert lape.table["selected"].sum() == 1  # the first rate
    totals = lape.counts.groupby("top_rate")["n_selected"].sum()
    assert totals.to_dict() == {0.25: 1, 0.5: 2}
    assert lape.neurons("en", top_rate=0.5)[1].tolist() == [0, 2]


def planted_gpt2(texts: dict, layer: int = 1, neuron: int = 5):
    """A tiny GPT-2 whose neuron `neuron` of block `layer` fires on the tokens only Russian texts have (and
    on nothing else): their embeddings get a large component along a direction e that no other MLP weight
    reads, and that neuron reads 2·e with bias −8."""
    lm = tiny_lm("gpt2", seed=3)
    tok = lm.tokenizer
    ids = {code: {i for t in values for i in tok(t, add_special_tokens=False)["input_ids"]}
           for code, values in texts.items()}
    only_ru = sorted(ids["ru"] - ids["en"] - ids["de"])
    e = np.random.default_rng(0).standard_normal(lm.d_model)
    e -= e.mean()  # orthogonal to the all-ones direction that LayerNorm removes
    e = torch.tensor(e / np.linalg.norm(e), dtype=torch.float32)
    with torch.no_grad():
        lm.model.transformer.wte.weight[only_ru] += 100 * e
        for block in lm.parts.layers:  # Conv1D: out = x @ weight + bias, weight [d, I]
            block.mlp.c_fc.weight -= torch.outer(e, e @ block.mlp.c_fc.weight)
        planted = lm.parts.layers[layer - 1].mlp.c_fc
        planted.weight[:, neuron] = 2 * e
        planted.bias[neuron] = -8.0
    return lm


def test_a_planted_neuron_is_selected_for_its_language_only():
    lm = planted_gpt2(TEXTS)
    stats = neuron_stats(lm, TEXTS)
    k = {code: i for i, code in enumerate(stats.languages)}
    p = stats.p[0, 5]
    assert p[k["ru"]] == 1.0 and p[k["en"]] == 0 and p[k["de"]] == 0
    lape = select_lape(stats)
    row = lape.table[(lape.table["layer"] == 1) & (lape.table["neuron"] == 5)].iloc[0]
    assert row["lape"] == 0.0 and row["rank"] == 1 and row["selected"] and row["languages"] == "ru"
    assert 5 in lape.neurons("ru").get(1, [])
    assert 5 not in lape.neurons("en").get(1, []) and 5 not in lape.neurons("de").get(1, [])


# ------------------------------------------------------------------------------------ switching off

@pytest.mark.parametrize("arch", ARCHS)
def test_deactivation_equals_a_hand_edit_of_the_down_projection_input(arch):
    lm = tiny_lm(arch, max_positions=512, seed=4)
    texts = ["A dog can bark.", "Собака умеет лаять.", "猫会爬树。"]
    neurons = {1: [0, 5, 9], 3: [2, 7, 11, 30]}
    _, _, downs = mlp_parts(lm, arch)

    def zero_input(indices):
        def hook(module, args):
            x = args[0].clone()
            x[..., indices] = 0
            return (x, *args[1:])
        return hook

    handles = [downs[layer - 1].register_forward_pre_hook(zero_input(idx)) for layer, idx in neurons.items()]
    try:
        by_hand = [r.logprobs for r in token_logprobs(lm, texts, progress=False)]
    finally:
        for h in handles:
            h.remove()
    plain = [r.logprobs for r in token_logprobs(lm, texts, progress=False)]
    with deactivated(lm, neurons):
        switched = [r.logprobs for r in token_logprobs(lm, texts, progress=False)]
    for a, b, c in zip(switched, by_hand, plain):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
        assert np.abs(a - c).max() > 1e-4  # switching them off changed something
    with deactivated(lm, {}):  # an empty set changes nothing
        empty = [r.logprobs for r in token_logprobs(lm, texts, progress=False)]
    for a, c in zip(empty, plain):
        np.testing.assert_array_equal(a, c)
    after = [r.logprobs for r in token_logprobs(lm, texts, progress=False)]
    for a, c in zip(after, plain):  # the hooks are gone
        np.testing.assert_array_equal(a, c)


def test_neuron_sets_out_of_range_are_refused(tiny):
    with pytest.raises(bp.BabelprobeError, match="MLP layers are 1..3"):
        deactivated(tiny, {4: [0]})
    with pytest.raises(bp.BabelprobeError, match="neurons 0..63"):
        deactivated(tiny, {1: [64]})


# ------------------------------------------------------------------------------ commands and report

def neurons_args(model_dir, out, *extra):
    return ["neurons", "--model", str(model_dir), "--items", "xcomps-sample", "--languages", "en,de", "--limit", "2",
            "--min-tokens", "50", "--top-rate", "0.05,0.1", "--out", str(out), "--no-progress", *extra]


def deact_args(model_dir, neu, out, *extra):
    return ["intervene", "--method", "neurons", "--neurons", str(neu), "--model", str(model_dir), "--items",
            "xcomps-sample", "--languages", "en,de", "--subsets", "taxonomic", "--limit", "2", "--random", "2",
            "--n-boot", "50", "--out", str(out), "--no-progress", *extra]


@pytest.fixture(scope="module")
def neu(tiny_long_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("neurons") / "neu"
    assert main(neurons_args(tiny_long_dir, out)) == 0
    return out


def test_the_neurons_command_writes_its_files(neu, tiny_long):
    with __import__("h5py").File(neu / "activation.h5") as f:
        over_zero, n_tokens = f["over_zero"][()], f["n_tokens"][()]
        assert [x.decode() if isinstance(x, bytes) else x for x in f["languages"][()]] == ["de", "en"]
        assert f["layers"][()].tolist() == [1, 2, 3]
    items = bp.load_items("xcomps-sample", languages=["en", "de"], limit=2)
    again = neuron_stats(tiny_long, items)
    np.testing.assert_array_equal(over_zero, again.over_zero)
    np.testing.assert_array_equal(n_tokens, again.n_tokens)
    table, counts = read_table(neu / "lape.csv"), read_table(neu / "neurons.csv")
    assert list(table.columns[:6]) == ["layer", "neuron", "lape", "p_max", "selected", "languages"]
    assert len(table) == 3 * 64 and table["selected"].sum() == round(0.05 * 3 * 64)
    assert set(counts["top_rate"]) == {0.05, 0.1} and list(counts.columns) == ["top_rate", "language", "layer",
                                                                                 "n_selected"]
    manifest = json.loads((neu / "neurons.json").read_text())
    assert manifest["selection"]["tau"] == kth_smallest(over_zero / n_tokens, 0.95)
    assert (neu / "figures" / "lape_layers.png").exists() and (neu / "figures" / "lape_overlap.png").exists()


def test_switching_neurons_off_through_intervene_and_the_report(neu, tiny_long_dir, tiny_long, tmp_path, capsys):
    from babelprobe.neurons.run import read_run

    out = neu / "deact"
    assert main(deact_args(tiny_long_dir, neu, out, "--off", "en", "--readouts", "direct,meta")) == 0
    assert "neurons − random" in capsys.readouterr().out
    rows = read_table(out / "interventions.csv")
    assert set(rows["edit_source"]) == {"neurons"} and set(rows["off"]) == {"en"}
    assert rows.groupby("direction")["draw"].nunique().to_dict() == {"neurons": 1, "random": 2}
    assert rows.groupby("direction")["n_neurons"].first().nunique() == 1  # as many random neurons as selected
    # a row's scores are those of the direct scorer with en's neurons switched off
    lape, _ = read_run(neu)
    items = bp.load_items("xcomps-sample", languages=["en", "de"], subsets=["taxonomic"], limit=2)
    with deactivated(tiny_long, lape.neurons("en", 0.05)):
        direct = bp.score_direct(tiny_long, items, progress=False).set_index("pair_id")
    mine = rows[rows["direction"] == "neurons"].set_index("pair_id")
    np.testing.assert_allclose(mine.loc[direct.index, "direct_score_good"], direct["score_good"], atol=1e-5)
    plain = bp.score_direct(tiny_long, items, progress=False).set_index("pair_id")
    np.testing.assert_allclose(mine.loc[plain.index, "direct_score_good_base"], plain["score_good"], atol=1e-5)
    assert main(["report", "--results", str(neu), "--n-boot", "20"]) == 0
    for name in ("lape_layers.png", "lape_overlap.png", "lape_deactivation.png", "report.md", "lape_per_layer.csv"):
        assert (neu / "figures" / name).exists(), name
    text = (neu / "figures" / "report.md").read_text()
    assert "## Switching neurons off" in text and "neurons off en" in text


def test_the_probe_readout_under_switched_off_neurons(neu, tiny_long_dir, tmp_path):
    from babelprobe.extract import extract
    from babelprobe.interventions.readouts import pooled_states
    from babelprobe.models import load_model
    from babelprobe.neurons.run import read_run

    items = bp.load_items("xcomps-sample", languages=["en", "de"], subsets=["taxonomic"], limit=3)
    lm = load_model(str(tiny_long_dir))
    extract(lm, items, tmp_path / "acts", layers="0-3", progress=False)
    bp.probe(tmp_path / "acts", folds=3, n_boot=20, workers=1).write(tmp_path / "neuro.csv")
    out = tmp_path / "deact"
    argv = deact_args(tiny_long_dir, neu, out, "--off", "de", "--readouts", "direct,probe", "--random", "1",
                      "--probes", str(tmp_path), "--layers", "2")
    argv[argv.index("--limit") + 1] = "3"
    assert main(argv) == 0
    rows = read_table(out / "interventions.csv")
    assert set(rows["layer"]) == {2} and rows["probe_margin"].notna().all() and rows["probe_margin_base"].notna().all()
    probes = bp.load_probes(tmp_path / "neuro.probes.h5")
    lape, _ = read_run(neu)
    en = items[items["language"] == "en"].reset_index(drop=True)
    with deactivated(lm, lape.neurons("de", 0.05)):
        states = pooled_states(lm, en["text"].tolist(), [2])[:, 0]
    scores = pd.Series(probes.score(states, {"language": "en", "subset": "taxonomic"}, 2), index=en["item_id"])
    mine = rows[(rows["direction"] == "neurons") & (rows["language"] == "en")].set_index("pair_id")
    pairs = bp.to_pairs(en).set_index("pair_id")
    np.testing.assert_allclose(mine.loc[pairs.index, "probe_score_good"],
                               scores.loc[pairs["item_id_good"]].to_numpy(), atol=1e-4)


# ------------------------------------------------------------- bad input (docs/reliability.md, N1-N8)

def test_N1_a_language_under_min_tokens(tiny_long_dir, tmp_path, capsys):
    argv = neurons_args(tiny_long_dir, tmp_path / "o")
    argv[argv.index("--min-tokens") + 1] = "100000"
    refused(argv, capsys, tmp_path / "o", "language de has", "tokens to count, fewer than --min-tokens 100000",
            "; so do en (", "give them more text")  # every short language named at once


def test_N2_fewer_than_two_languages(tiny_long_dir, tmp_path, capsys):
    argv = neurons_args(tiny_long_dir, tmp_path / "o")
    argv[argv.index("--languages") + 1] = "en"
    refused(argv, capsys, tmp_path / "o", "LAPE compares languages: the texts have only en")


def test_N3_an_mlp_whose_neurons_cannot_be_read(tiny_long_dir, tmp_path, capsys, monkeypatch):
    # the table says llama's MLPs are mixtures of experts with a shared expert (tests/test_families.py refuses
    # a real Qwen2-MoE)
    from dataclasses import replace

    from babelprobe.sites import table

    moe = {**table.families(), "llama": replace(table.families()["llama"], mlp="moe-shared", activation="mlp")}
    monkeypatch.setattr(table, "families", lambda: moe)
    refused(neurons_args(tiny_long_dir, tmp_path / "o"), capsys, tmp_path / "o",
            "the MLPs of llama are mixtures of experts (LlamaMLP)")


def test_N4_neurons_of_another_model(neu, tiny_dir, tmp_path, capsys):
    argv = deact_args(tiny_dir, neu, tmp_path / "o", "--readouts", "direct")
    refused(argv, capsys, tmp_path / "o", f"--neurons {neu} were found in another model (fingerprint")


def test_N5_a_language_the_neurons_run_does_not_have(neu, tiny_long_dir, tmp_path, capsys):
    refused(deact_args(tiny_long_dir, neu, tmp_path / "o", "--off", "zh"), capsys, tmp_path / "o",
            f"--off zh: the neurons in {neu} are of de, en")


def test_N6_neurons_input_missing_or_unfinished(neu, tiny_long_dir, tmp_path, capsys):
    argv = deact_args(tiny_long_dir, tmp_path / "nowhere", tmp_path / "o")
    refused(argv, capsys, tmp_path / "o", f"--neurons {tmp_path / 'nowhere'}: no such directory")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "activation.h5").write_bytes((neu / "activation.h5").read_bytes())
    refused(deact_args(tiny_long_dir, tmp_path / "half", tmp_path / "o"), capsys, tmp_path / "o",
            "is not a finished neurons directory (no lape.csv); run `babelprobe neurons`")
    argv = deact_args(tiny_long_dir, neu, tmp_path / "o")
    del argv[argv.index("--neurons"):argv.index("--neurons") + 2]
    refused(argv, capsys, tmp_path / "o", "give --neurons DIR")


def test_N7_settings_that_do_not_go_together(neu, tiny_long_dir, tmp_path, capsys):
    out = tmp_path / "o"
    refused(deact_args(tiny_long_dir, neu, out, "--alpha", "0.5"), capsys, out, "--alpha: --method neurons")
    refused(deact_args(tiny_long_dir, neu, out, "--readouts", "probe"), capsys, out,
            "--readouts probe reads a probe: give --probes")
    argv = deact_args(tiny_long_dir, neu, out, "--off", "en")
    argv[argv.index("--method") + 1] = "ablate"
    refused(argv, capsys, out, "--off goes with --method neurons")
    refused(neurons_args(tiny_long_dir, out, "--top-rate", "0"), capsys, out, "--top-rate must lie in (0, 1]")


def test_N8_corpus_that_is_not_there_or_not_named_by_language(tiny_long_dir, tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["neurons", "--model", str(tiny_long_dir), "--corpus", str(tmp_path / "wiki"), "--out", str(out)]
    refused(argv, capsys, out, f"--corpus {tmp_path / 'wiki'}: no such file or directory")
    (tmp_path / "wiki").mkdir()
    (tmp_path / "wiki" / "english.txt").write_text("A dog can bark.\n")
    refused(argv, capsys, out, "english.txt: 'english' is not an ISO 639-1 language code")
    refused(["neurons", "--model", str(tiny_long_dir), "--protocol", "paper", "--out", str(out)], capsys, out,
            "--protocol paper counts a text corpus")
    refused([*argv, "--items", "xcomps-sample"], capsys, out, "--corpus counts text files")


def test_a_corpus_is_cut_into_windows(tiny_long_dir, tiny_long, tmp_path):
    corpus = tmp_path / "wiki"
    (corpus / "heldout").mkdir(parents=True)
    for code, values in TEXTS.items():  # the training part is counted: every line here, held-out text beside it
        (corpus / f"{code}.txt").write_text("\n".join(values * 3) + "\n", encoding="utf-8")
        (corpus / "heldout" / f"{code}.txt").write_text(values[0] + "\n", encoding="utf-8")
    out = tmp_path / "neu"
    assert main(["neurons", "--model", str(tiny_long_dir), "--corpus", str(corpus), "--window", "7",
                 "--min-tokens", "10", "--out", str(out), "--no-progress"]) == 0
    with __import__("h5py").File(out / "activation.h5") as f:
        n_tokens = f["n_tokens"][()]
    ids = {code: tiny_long.tokenizer("\n".join(values * 3), add_special_tokens=False)["input_ids"]  # one stream
           for code, values in TEXTS.items()}
    assert n_tokens.tolist() == [len(ids[c]) for c in ("de", "en", "ru")]  # every token once, BOS not counted
    rows = [[tiny_long.bos_token_id] + ids["en"][s:s + 7] for s in range(0, len(ids["en"]), 7)]
    reference = 0
    for row in rows:  # each window run alone, by our own hook
        seen = {}
        act = tiny_long.parts.layers[0].mlp.act_fn
        handle = act.register_forward_hook(lambda m, a, o, seen=seen: seen.__setitem__("a", o[0].numpy()))
        with torch.inference_mode():
            tiny_long.parts.body(input_ids=torch.tensor([row]), use_cache=False)
        handle.remove()
        reference = reference + (seen["a"][1:] > 0).sum(axis=0)
    with __import__("h5py").File(out / "activation.h5") as f:
        np.testing.assert_array_equal(f["over_zero"][0, :, 1], reference)


def test_the_overlap_figure_says_when_no_language_has_a_selected_neuron(tmp_path):
    """lape_overlap's Jaccard heatmap of the languages' selected neuron sets, against sets worked out by hand; and
    where no neuron is selected (a random model's activation probabilities at 1), a note instead of an empty
    heatmap, saved without matplotlib's warnings about a collapsed image."""
    import warnings

    from babelprobe.analysis.neurons import jaccard_matrix, plot_lape_overlap
    from babelprobe.analysis.style import save

    table = pd.DataFrame({"layer": [0, 0, 1, 1], "neuron": [1, 2, 1, 3], "selected": [True, True, True, False],
                          "languages": ["en,de", "en", "de", None]})
    matrix = jaccard_matrix(table)
    assert matrix.loc["en", "de"] == pytest.approx(1 / 3) and matrix.loc["de", "de"] == 1.0  # {(0,1),(0,2)} vs {(0,1),(1,1)}
    none = table.assign(selected=False)
    assert jaccard_matrix(none).empty
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plot_lape_overlap(none)
        texts = [t.get_text() for t in fig.axes[0].texts]
        assert texts == ["No language has a selected neuron: no overlap to show"]
        assert [p.suffix for p in save(fig, tmp_path / "lape_overlap")] == [".pdf", ".png"]
        assert len(plot_lape_overlap(table).axes) == 2  # the heatmap and its colour bar
