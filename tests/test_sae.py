"""The SAE view (`babelprobe.sae`, `babelprobe sae`): both weight layouts, SAELens' encode/decode against
numpy, a trained SAE's fit, monolinguality against hand means, the hook against the store, feature
ablation, and the bad-input catalogue (docs/reliability.md S1-S5). No downloads: every SAE is made here."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

import babelprobe as bp
from babelprobe.cli import main
from babelprobe.errors import BabelprobeError
from babelprobe.sae.stats import SAEStats, sae_stats
from babelprobe.sae.weights import SAE, load_sae, save_sae
from tests.test_corpus_readout import released_layers_nll
from tests.tiny import tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------------------- fixtures

def planted(d_in: int = 4, d_sae: int = 6, seed: int = 0) -> dict:
    """A JumpReLU SAE in Gemma Scope 2 spelling: feature s reads (and writes) coordinate s mod d_in, with
    sign ±1, and has the known threshold θ_s = 0.1·(s + 1); biases are small and random."""
    g = torch.Generator().manual_seed(seed)
    w_enc = torch.zeros(d_in, d_sae)
    for s in range(d_sae):
        w_enc[s % d_in, s] = 1.0 if s < d_in else -1.0
    return {"w_enc": w_enc, "w_dec": w_enc.T.clone() * 0.5, "b_enc": 0.05 * torch.randn(d_sae, generator=g),
            "b_dec": 0.1 * torch.randn(d_in, generator=g), "threshold": 0.1 * torch.arange(1, d_sae + 1).float()}


def gemma_scope_folder(path, tensors: dict, layer: int, config: bool = True):
    path.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "params.safetensors"))
    if config:
        (path / "config.json").write_text(json.dumps({"architecture": "jump_relu",
                                                      "hf_hook_point_in": f"model.layers.{layer - 1}.output"}))
    return path


def saelens_folder(path, tensors: dict, layer: int, architecture: str = "jumprelu", **cfg):
    path.mkdir(parents=True)
    names = {"w_enc": "W_enc", "w_dec": "W_dec", "b_enc": "b_enc", "b_dec": "b_dec", "threshold": "threshold"}
    save_file({names[k]: v.contiguous() for k, v in tensors.items()}, str(path / "sae_weights.safetensors"))
    d_in, d_sae = tensors["w_enc"].shape
    config = {"architecture": architecture, "d_in": d_in, "d_sae": d_sae, "dtype": "float32",
              "apply_b_dec_to_input": False, "normalize_activations": "none",
              "metadata": {"hook_name": f"blocks.{layer - 1}.hook_resid_post", "sae_lens_version": "6.0.0"}, **cfg}
    (path / "cfg.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    """The tiny Gemma-3-style model, a small multilingual item set and its store (every layer, last and mean)."""
    root = tmp_path_factory.mktemp("sae")
    lm = tiny_lm("gemma3")
    items = bp.load_items("xcomps-sample", languages=["en", "de", "zh"], limit=4)
    bp.extract_activations(lm, items, root / "acts", pool="both", progress=False)
    return root, lm, items


# ---------------------------------------------------------------------------------- weights, layouts

def test_both_layouts_load_identically(tmp_path):
    tensors = planted()
    a = load_sae(gemma_scope_folder(tmp_path / "gs", tensors, layer=4))
    b = load_sae(saelens_folder(tmp_path / "sl", tensors, layer=4))
    assert a.layout == "gemma-scope-2" and b.layout == "saelens"
    assert a.layer == b.layer == 4 and a.architecture == b.architecture == "jumprelu"
    for name in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    x = torch.randn(50, 4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.encode(x), b.encode(x)) and torch.equal(a.decode(a.encode(x)), b.decode(b.encode(x)))
    # the planted structure: feature s fires exactly when its pre-activation passes its own threshold
    pre = (x @ tensors["w_enc"] + tensors["b_enc"]).numpy()
    assert np.array_equal(a.encode(x).numpy() > 0, pre > tensors["threshold"].numpy())
    # a Gemma Scope 2 folder without config.json: the folder's name says the layer (resid_post/layer_N)
    c = load_sae(gemma_scope_folder(tmp_path / "resid_post" / "layer_3_width_16k_l0_small", tensors, 0, config=False))
    assert c.layer == 4 and c.hook == "model.layers.3.output"
    # and save_sae writes both layouts back
    for layout in ("saelens", "gemma-scope-2"):
        again = load_sae(save_sae(a, tmp_path / f"again-{layout}", layout=layout))
        assert again.layer == 4 and torch.equal(again.encode(x), a.encode(x))


def test_gemma_scope_config_gives_the_published_l0_and_other_sites_are_refused(tmp_path):
    from babelprobe.errors import BabelprobeError

    tensors = planted()
    folder = gemma_scope_folder(tmp_path / "resid_post" / "layer_5_width_16k_l0_medium", tensors, layer=6)
    config = json.loads((folder / "config.json").read_text())
    # the released config.json's keys (google/gemma-scope-2-*: width, l0, type, affine_connection)
    (folder / "config.json").write_text(json.dumps({**config, "l0": 60, "width": 6, "type": "sae",
                                                    "affine_connection": False}))
    sae = load_sae(folder)
    assert sae.layer == 6 and sae.info["l0_published"] == 60 and sae.describe()["l0_published"] == 60
    # `sae fetch`'s record without a registry L0 (no sae_lens) leaves the config's
    (folder / "babelprobe_sae.json").write_text(json.dumps({"release": "r", "sae_id": "i", "l0_published": None}))
    assert load_sae(folder).info["l0_published"] == 60
    transcoder = gemma_scope_folder(tmp_path / "transcoder" / "layer_5_width_16k_l0_big", tensors, layer=6)
    (transcoder / "config.json").write_text(json.dumps({**config, "type": "transcoder"}))
    with pytest.raises(BabelprobeError, match="a transcoder"):
        load_sae(transcoder)
    # without config.json, a folder of another site is not read as the residual stream
    mlp = gemma_scope_folder(tmp_path / "mlp_out" / "layer_5_width_16k_l0_big", tensors, 0, config=False)
    with pytest.raises(BabelprobeError, match="mlp_out folder, not a residual-stream SAE"):
        load_sae(mlp, layer=6)


def _reference(x, W_enc, W_dec, b_enc, b_dec, apply_b_dec, architecture, threshold=None, k=None):
    """SAELens' encode and decode written out in numpy (module docstring of babelprobe.sae.weights)."""
    pre = (x - b_dec * apply_b_dec) @ W_enc + b_enc
    if architecture == "jumprelu":
        f = np.maximum(pre, 0) * (pre > threshold)
    elif architecture == "standard":
        f = np.maximum(pre, 0)
    else:
        f = np.zeros_like(pre)
        top = np.argsort(-pre, axis=1)[:, :k]
        np.put_along_axis(f, top, np.maximum(np.take_along_axis(pre, top, 1), 0), 1)
    return f, f @ W_dec + b_dec


@pytest.mark.parametrize("apply_b_dec", [False, True])
@pytest.mark.parametrize("architecture", ["jumprelu", "standard", "topk"])
def test_encode_decode_equal_numpy_on_a_hand_case(architecture, apply_b_dec):
    # 2-d inputs, 3 features
    W_enc = np.array([[1.0, -0.5, 0.25], [0.5, 1.0, -1.0]], dtype=np.float32)
    W_dec = np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0]], dtype=np.float32)
    b_enc = np.array([0.1, -0.2, 0.0], dtype=np.float32)
    b_dec = np.array([0.5, -0.5], dtype=np.float32)
    threshold = np.array([0.3, 0.3, 0.3], dtype=np.float32)
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5]], dtype=np.float32)
    sae = SAE(W_enc=torch.tensor(W_enc), W_dec=torch.tensor(W_dec), b_enc=torch.tensor(b_enc),
              b_dec=torch.tensor(b_dec), architecture=architecture,
              threshold=torch.tensor(threshold) if architecture == "jumprelu" else None,
              k=1 if architecture == "topk" else None, apply_b_dec_to_input=apply_b_dec, layer=1)
    f = sae.encode(torch.tensor(x)).numpy()
    want_f, want_x = _reference(x, W_enc, W_dec, b_enc, b_dec, apply_b_dec, architecture, threshold, k=1)
    np.testing.assert_allclose(f, want_f, atol=1e-6)
    np.testing.assert_allclose(sae.decode(torch.tensor(f)).numpy(), want_x, atol=1e-6)
    if architecture == "jumprelu" and not apply_b_dec:
        # by hand: x = (1, 0) gives pre = (1.1, −0.7, 0.25): only feature 0 passes θ = 0.3
        np.testing.assert_allclose(f[0], [1.1, 0.0, 0.0], atol=1e-6)
        np.testing.assert_allclose(sae.decode(torch.tensor(f))[0].numpy(), [1.6, -0.5], atol=1e-6)


@pytest.mark.parametrize("architecture", ["jumprelu", "standard", "topk", "topk-rescaled"])
def test_sae_lens_agrees_when_installed(tmp_path, architecture):
    sae_lens = pytest.importorskip("sae_lens")
    g = torch.Generator().manual_seed(2)
    rescaled = architecture == "topk-rescaled"
    architecture = architecture.removesuffix("-rescaled")
    sae = SAE(W_enc=torch.randn(8, 16, generator=g), W_dec=torch.randn(16, 8, generator=g),
              b_enc=torch.randn(16, generator=g), b_dec=torch.randn(8, generator=g), architecture=architecture,
              threshold=torch.rand(16, generator=g) if architecture == "jumprelu" else None,
              k=3 if architecture == "topk" else None, apply_b_dec_to_input=architecture != "jumprelu", layer=2,
              rescale_acts_by_decoder_norm=rescaled)
    theirs = sae_lens.SAE.load_from_disk(save_sae(sae, tmp_path / "sae"))
    x = torch.randn(20, 8, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(sae.encode(x), theirs.encode(x))
        torch.testing.assert_close(sae.decode(sae.encode(x)), theirs.decode(theirs.encode(x)))


def test_sae_lens_gemma_3_loader_agrees_when_installed(tmp_path, monkeypatch):
    """A Gemma Scope 2 folder read by SAELens' own `gemma_3` loader (its hub calls served from the folder):
    the same codes and reconstructions, apply_b_dec_to_input False, and its hook blocks.N.hook_resid_post
    (model.layers.N.output) is our layer N+1."""
    sae_lens = pytest.importorskip("sae_lens")
    loaders = pytest.importorskip("sae_lens.loading.pretrained_sae_loaders")
    from safetensors import safe_open

    g = torch.Generator().manual_seed(6)
    tensors = {"w_enc": torch.randn(8, 16, generator=g), "w_dec": torch.randn(16, 8, generator=g),
               "b_enc": torch.randn(16, generator=g), "b_dec": torch.randn(8, generator=g),
               "threshold": torch.rand(16, generator=g)}
    folder_name = "resid_post/layer_5_width_16k_l0_small"
    folder = gemma_scope_folder(tmp_path / folder_name, tensors, layer=6)
    (folder / "config.json").write_text(json.dumps({  # the released config.json's keys
        "model_name": "google/gemma-3-270m-pt", "architecture": "jump_relu", "hf_hook_point_in": "model.layers.5.output",
        "hf_hook_point_out": "model.layers.5.output", "width": 16, "l0": 20, "affine_connection": False, "type": "sae"}))

    def download(repo_id, filename=None, subfolder=None, **kwargs):
        return str(tmp_path / (f"{subfolder}/{filename}" if subfolder else filename))

    def shapes(repo_id, filename):
        with safe_open(str(tmp_path / filename), "pt") as f:
            return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}

    monkeypatch.setattr(loaders, "hf_hub_download", download)
    monkeypatch.setattr(loaders, "get_safetensors_tensor_shapes", shapes)
    theirs = sae_lens.SAE.from_pretrained("gemma-scope-2-270m-pt-res", "layer_5_width_16k_l0_small")
    ours = load_sae(tmp_path / folder_name)
    assert theirs.cfg.metadata.hook_name == "blocks.5.hook_resid_post" and ours.layer == 6
    assert theirs.cfg.apply_b_dec_to_input is False and ours.apply_b_dec_to_input is False
    x = torch.randn(20, 8, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(ours.encode(x), theirs.encode(x))
        torch.testing.assert_close(ours.decode(ours.encode(x)), theirs.decode(theirs.encode(x)))


# ------------------------------------------------------------------------------------- the stats pass

def test_monolinguality_equals_hand_means():
    # μ per language (rows: en, de, zh) and feature (columns), from sums over 2, 4 and 5 tokens
    mu = np.array([[1.0, 0.0], [0.5, 2.0], [0.2, 0.4]])
    n = np.array([2, 4, 5])
    stats = SAEStats(layer=1, languages=["de", "en", "zh"], n_tokens=n, sum_f=mu * n[:, None],
                     count=np.ones((3, 2)), sq_error=np.zeros(3), sum_x=np.zeros((3, 2)), sum_sq=np.ones(3))
    # ν = μ_L − mean of the other two languages' μ, by hand
    want = np.array([[1.0 - (0.5 + 0.2) / 2, 0.0 - (2.0 + 0.4) / 2],
                     [0.5 - (1.0 + 0.2) / 2, 2.0 - (0.0 + 0.4) / 2],
                     [0.2 - (1.0 + 0.5) / 2, 0.4 - (0.0 + 2.0) / 2]])
    np.testing.assert_allclose(stats.nu(), want)
    assert stats.ranks().tolist() == [[1, 2], [2, 1], [1, 2]]
    table = stats.features(top=1)
    assert set(table["feature"]) == {0, 1} and len(table) == 6


def test_feature_sets_take_ranks_after_the_skipped_ones_as_the_release_slices_them():
    """Deng et al.'s `top_index_per_lan[:, start_idx:start_idx + topk_feature_num]` over features in ν order:
    --ablate 1 --ablate-from 1 removes each language's second most specific feature; its controls come from
    the features that fire on the language, none of the skipped or removed ones."""
    from babelprobe.sae.edits import feature_sets
    from babelprobe.sae.settings import Settings
    from babelprobe.settings import settings_for

    mu = np.array([[3.0, 0.0, 2.0, 1.0, 0.5, 0.2], [0.0, 3.0, 0.1, 0.2, 2.0, 1.0]])  # μ per language (en, zh)
    n = np.array([10, 10])
    stats = SAEStats(layer=1, languages=["en", "zh"], n_tokens=n, sum_f=mu * n[:, None], count=(mu > 0) * 5.0,
                     sq_error=np.zeros(2), sum_x=np.zeros((2, 2)), sum_sq=np.ones(2))
    by_nu = np.argsort(-(mu - mu[::-1]), axis=1, kind="stable")  # ν with two languages: μ_L − μ_other
    for start, k in [(0, 1), (0, 2), (1, 1)]:  # the release README's three Section 5 runs
        sets = feature_sets(stats, k, n_random=2, seed=0, skip=start)
        for g, language in enumerate(["en", "zh"]):
            assert sets[language]["features"].tolist() == by_nu[g, start:start + k].tolist()
            for draw in ("random-0", "random-1"):
                control = sets[language][draw]
                assert len(control) == k and not set(control) & set(by_nu[g, :start + k])
                assert (mu[g, control] > 0).all()
    paper = settings_for(Settings, "paper")
    assert (paper.ablate_mode, paper.ablate, paper.ablate_from) == ("projection", 1, 0)
    with pytest.raises(BabelprobeError, match="--protocol paper runs --ablate 1; drop --ablate 2"):
        settings_for(Settings, "paper", ablate=2)
    with pytest.raises(BabelprobeError, match="--ablate-from"):
        Settings(ablate_from=-1)


def test_fit_warning_when_the_tokens_fit_worse_than_their_mean():
    from babelprobe.analysis.sae import fit_warning

    def fit(fvu_tokens):
        return pd.DataFrame({"layer": 6, "language": ["en", "all", "en", "all"], "fvu": [2.0, fvu_tokens, 0.3, 0.3],
                             "l0": 10.0, "l0_published": np.nan, "n_tokens": 5,
                             "states": ["tokens", "tokens", "last", "last"]})

    assert fit_warning(fit(0.9)) is None
    assert fit_warning(fit(24.4)).startswith("FVU 24.40 over every token but BOS, against 0.30 on the last-token")


def _hooked_token_states(lm, texts, block: int) -> list[torch.Tensor]:
    """Each text's hidden states at `model.model.layers[block]`'s output, read by our own hook, one text
    at a time (no padding)."""
    caught = {}
    handle = lm.model.model.layers[block].register_forward_hook(
        lambda module, args, output: caught.__setitem__("h", output[0] if isinstance(output, tuple) else output))
    states = []
    try:
        for encoding in lm.encode(texts):
            with torch.no_grad():
                lm.model(torch.tensor([encoding.ids]))
            states.append(caught["h"][0].clone())
    finally:
        handle.remove()
    return states


def test_hooked_output_equals_store_layer_and_the_pass_counts_every_token_but_bos(tiny_store, monkeypatch):
    root, lm, items = tiny_store
    # a small working memory: the pass splits the rows, and the non-zero codes it decodes, into many blocks
    monkeypatch.setattr("babelprobe.sae.stats.CHUNK_BYTES", 4096)
    block = 1  # model.layers.1.output = babelprobe layer 2
    hooked = _hooked_token_states(lm, items["text"].tolist(), block)
    store = bp.open_store(root / "acts")
    np.testing.assert_allclose(np.stack([h[-1].numpy() for h in hooked]), store.read(block + 1, pool="last"),
                               rtol=1e-5, atol=1e-5)
    g = torch.Generator().manual_seed(3)
    sae = SAE(W_enc=torch.randn(32, 24, generator=g), W_dec=torch.randn(24, 32, generator=g) * 0.2,
              b_enc=torch.randn(24, generator=g) * 0.1, b_dec=torch.randn(32, generator=g) * 0.1,
              threshold=torch.rand(24, generator=g), layer=block + 1, hook=f"model.layers.{block}.output")
    stats = sae_stats(lm, items, sae, batch_tokens=64)
    np.testing.assert_allclose(stats.last, store.read(block + 1, pool="last"), rtol=1e-5, atol=1e-5)
    for g_index, language in enumerate(stats.languages):
        tokens = torch.cat([h[1:] for h, lang in zip(hooked, items["language"]) if lang == language])  # BOS out
        f = sae.encode(tokens)
        assert stats.n_tokens[g_index] == len(tokens)
        np.testing.assert_allclose(stats.sum_f[g_index], f.double().sum(0).numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(stats.count[g_index], (f > 0).sum(0).numpy())
        error = float((tokens - sae.decode(f)).double().square().sum())
        variance = float((tokens.double() - tokens.double().mean(0)).square().sum())
        assert stats.fit().set_index("language").loc[language, "fvu"] == pytest.approx(error / variance, rel=1e-4)


def test_the_pass_reads_back_only_the_codes_non_zeros_and_copies_its_last_states_a_block_at_a_time(tiny_store,
                                                                                                     monkeypatch):
    """A batch reads back from the device (`HostReads`: on a GPU the host would wait there for the pass that made
    it) only the codes' non-zeros, once per chunk: the positions that count, their languages and the token counts
    come from the host's batch, and the sums stay on the device until `result`. The last-token states leave it a
    block of texts at a time, not per batch."""
    import babelprobe.sae.stats as stats
    from tests.host_reads import HostReads, batches_and_copies

    _, lm, items = tiny_store
    monkeypatch.setattr(stats.HostRows, "BLOCK_BYTES", 4 * lm.d_model * 7)  # 7 texts a block
    monkeypatch.setattr(stats, "CHUNK_BYTES", 3 * 4 * 16 * 10)  # chunks of 10 tokens (the SAE's 16 features)
    batches, copies = batches_and_copies(monkeypatch, stats)
    chunks = []
    encode = SAE.encode
    monkeypatch.setattr(SAE, "encode", lambda self, x: chunks.append(len(x)) or encode(self, x))
    with HostReads() as reads:
        result = sae_stats(lm, items, load_sae_like(lm, layer=2), batch_tokens=64)
    assert len(batches) >= 3 and len(chunks) > len(batches)
    assert [what for what, _ in reads.seen] == ["nonzero_numpy"] * len(chunks)  # (inference mode's name)
    assert all(where.startswith(stats.__file__) for _, where in reads.seen)
    blocks, sums = copies[:-5], copies[-5:]  # `result`: five sums, once
    assert len(blocks) < len(batches)
    assert sum(rows for rows, _ in blocks) == len(items) and all(width == lm.d_model for _, width in blocks)
    assert all(rows <= max(7, max(map(len, batches))) for rows, _ in blocks)
    assert [shape[0] for shape in sums] == [len(result.languages)] * 5


# --------------------------------------------------------------------------------------------- ablation

def test_ablating_an_empty_feature_set_changes_nothing(tiny_store):
    from babelprobe.interventions.edits import Intervention
    from babelprobe.sae.edits import FeatureAblation

    _, lm, items = tiny_store
    sae = load_sae_like(lm, layer=2)
    before = bp.score_direct(lm, items, progress=False)
    with Intervention(lm, {2: FeatureAblation(sae, [])}):
        after = bp.score_direct(lm, items, progress=False)
    pd.testing.assert_frame_equal(before, after)
    # a non-empty set does change them, and only its features' share of the reconstruction is removed
    h = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(4))
    edit = FeatureAblation(sae, [0, 3], skip_first=True)
    f = sae.encode(h)
    want = h - f[..., [0, 3]] @ sae.W_dec[[0, 3]]
    want[:, 0] = h[:, 0]
    torch.testing.assert_close(edit(h), want)


def load_sae_like(lm, layer: int) -> SAE:
    g = torch.Generator().manual_seed(5)
    return SAE(W_enc=torch.randn(lm.d_model, 16, generator=g), W_dec=torch.randn(16, lm.d_model, generator=g),
               b_enc=torch.zeros(16), b_dec=torch.zeros(lm.d_model), threshold=torch.full((16,), 0.1), layer=layer)


# ------------------------------------------------------------------------------------- the whole command

def test_cli_train_run_and_report(tiny_store, tmp_path, capsys, tiny_dir):
    root, _, _ = tiny_store
    items = tmp_path / "items.jsonl"
    bp.write_items(bp.load_items("xcomps-sample", languages=["en", "de"], limit=3), items)
    acts = tmp_path / "acts"
    assert main(["extract", "--model", str(tiny_dir), "--items", str(items), "--out", str(acts), "--no-progress"]) == 0
    assert main(["sae", "train", "--model", str(tiny_dir), "--corpus", "udhr", "--languages", "en,de", "--layer", "2",
                 "--width", "32", "--k", "4", "--tokens", "5120", "--batch-size", "256", "--window", "32",
                 "--out", str(tmp_path / "sae"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "trained a 32-feature topk SAE on layer 2" in printed and "held-out" in printed
    out = tmp_path / "run"
    argv = ["sae", "--model", str(tiny_dir), "--items", str(items), "--sae", str(tmp_path / "sae"), "--acts", str(acts),
            "--out", str(out), "--ks", "1,4", "--folds", "3", "--ablate", "1", "--ablate-from", "1", "--random", "1",
            "--n-boot", "50", "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "sparse vs dense probe F1" in printed and "ablation" in printed
    fit, probes = pd.read_csv(out / "fit.csv"), pd.read_csv(out / "sparse_probe.csv")
    assert set(fit["states"]) == {"tokens", "last"} and set(fit["language"]) == {"en", "de", "all"}
    assert sorted(probes["k"].unique()) == [1, 4] and probes["dense_f1"].notna().all()
    ablate = pd.read_csv(out / "ablate.csv")
    assert list(ablate.columns[:8]) == ["pair_id", "language", "subset", "feature_set", "method", "margin",
                                        "margin_base", "correct"]
    assert set(ablate["feature_set"]) == {"language", "random-0"}
    # --ablate 1 --ablate-from 1: each language's second most specific feature (features.csv's rank 2)
    edits = pd.read_csv(out / "ablate" / "interventions.csv").query("direction == 'features'")
    second = pd.read_csv(out / "features.csv").query("rank == 2").set_index("language")["feature"]
    assert edits.astype({"features": str}).groupby("language")["features"].unique().map(list).to_dict() == {
        language: [str(second[language])] for language in ("en", "de")}
    assert (out / "ablate" / "summary.csv").exists()  # the interventions runner's own summary
    # its `all` cells pool the languages (each pair losing its own language's features), one per readout × direction
    summary = pd.read_csv(out / "ablate" / "summary.csv")
    pooled = summary[summary["language"] == "all"]
    assert not pooled.duplicated(["readout", "direction"]).any()
    own = summary[(summary["language"] != "all") & (summary["direction"] == "features")]
    assert set(pooled.loc[pooled["direction"] == "features", "n"]) == {own.groupby("readout")["n"].sum().iloc[0]}
    # a rerun reuses every stage
    assert main(argv) == 0
    assert main(["report", "--results", str(out)]) == 0
    written = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert written == ["sae_ablation.png", "sae_fit.png", "sae_monolinguality.png", "sae_vs_dense.png"]


# ------------------------------------------------------------------------ bad input (reliability S1-S5)

def fails(argv: list, capsys, needle: str, out) -> None:
    """The CLI exits 2 with one error line holding `needle` and no traceback, and `out` was not created."""
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("babelprobe: error:")]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err
    assert not out.exists()


def _run_argv(tiny_dir, sae, out):
    return ["sae", "--model", tiny_dir, "--items", "xcomps-sample", "--languages", "en,de", "--limit", "2",
            "--sae", sae, "--out", out, "--folds", "2", "--no-progress"]


def test_S1_sae_of_another_width(tmp_path, capsys, tiny_dir):
    sae = gemma_scope_folder(tmp_path / "wide", planted(d_in=1152, d_sae=8), layer=2)
    fails(_run_argv(tiny_dir, sae, tmp_path / "out"), capsys, "SAE d_in 1152 ≠ model d_model 32", tmp_path / "out")


def test_S2_layer_beyond_the_model(tmp_path, capsys, tiny_dir):
    sae = gemma_scope_folder(tmp_path / "deep", planted(d_in=32, d_sae=8), layer=21)
    fails(_run_argv(tiny_dir, sae, tmp_path / "out"), capsys, "reads layer 21 (model.layers.20.output), beyond the "
          "model's layers 0..3", tmp_path / "out")


def test_S3_unknown_architecture(tmp_path, capsys, tiny_dir):
    sae = saelens_folder(tmp_path / "gated", planted(d_in=32, d_sae=8), layer=2, architecture="gated")
    fails(_run_argv(tiny_dir, sae, tmp_path / "out"), capsys, "unknown architecture 'gated'", tmp_path / "out")


def test_S4_missing_tensor_is_named(tmp_path, capsys, tiny_dir):
    tensors = planted(d_in=32, d_sae=8)
    del tensors["threshold"]
    sae = gemma_scope_folder(tmp_path / "nothreshold", tensors, layer=2)
    fails(_run_argv(tiny_dir, sae, tmp_path / "out"), capsys, "has no tensor 'threshold'", tmp_path / "out")


def test_S5_fetch_offline(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once, when it was imported
    fails(["sae", "fetch", "--release", "gemma-scope-2-270m-pt-res", "--sae-id", "layer_12_width_16k_l0_medium",
           "--out", tmp_path / "fetched"], capsys,
          "cannot reach huggingface.co; fetch the folder elsewhere, pass --sae DIR", tmp_path / "fetched")
    assert not any(p.name.startswith(".fetched") for p in tmp_path.iterdir())


def test_intervene_draws_the_sae_ablation_figure_from_its_summary(tmp_path):
    """`intervene --method sae` draws sae_ablation from its own summary (its rows, summary and figures are
    intervene's): one bar per language and feature set, at the summary's values."""
    from babelprobe.analysis.interventions import SOURCE_FIGURES, figure_plan

    rows = [{"language": lang, "edit_source": "sae_features", "method": "sae", "layers": "6", "alpha": 1.0,
             "readout": readout, "direction": direction,
             "value": value, "ci_low": value - 0.1, "ci_high": value + 0.1}
            for lang, shift in (("en", 0.0), ("zh", 1.0))
            for readout in ("direct_accuracy", "direct_margin")
            for direction, value in (("features", -0.5 - shift), ("random", 0.1), ("features−random", -0.6))]
    summary = pd.DataFrame(rows)
    assert "sae_features" in SOURCE_FIGURES
    plan = figure_plan(summary, None)
    assert [name for name, _, _ in plan] == ["sae_ablation"]
    fig = plan[0][1]()
    heights = sorted(round(p.get_height(), 6) for p in fig.axes[0].patches)
    assert heights == [-1.5, -0.5, 0.1, 0.1]


# ------------------------------------------------------------- several layers at once (--also-sae)

def saes_at(d: int, layers: tuple[int, ...], d_sae: int = 16) -> list[SAE]:
    """Random JumpReLU SAEs reading `layers` (a low threshold: most features fire somewhere)."""
    g = torch.Generator().manual_seed(7)
    return [SAE(W_enc=torch.randn(d, d_sae, generator=g), W_dec=torch.randn(d_sae, d, generator=g),
                b_enc=torch.zeros(d_sae), b_dec=torch.zeros(d), threshold=torch.full((d_sae,), 0.1), layer=layer)
            for layer in layers]


def lines_rows(lm, lines: list[str]) -> list[list[int]]:
    return [[lm.bos_token_id, *lm.tokenizer(t, add_special_tokens=False)["input_ids"]] for t in lines]


# the hooked blocks' outputs feed one or two more blocks of float32 arithmetic: ~1e-6 apart, as in
# test_corpus_readout's one-layer case
TWO_LAYER_RTOL = 1e-4


def test_two_layers_ablated_at_once_equal_deng_et_al_s_hooks_at_both(tiny):
    from babelprobe.interventions.corpus_readout import row_nll
    from babelprobe.interventions.edits import Intervention
    from babelprobe.sae.edits import ProjectionAblation
    from tests.test_corpus_readout import LINES

    saes, features = saes_at(tiny.d_model, (1, 2)), ([3, 7], [0, 5])
    rows = lines_rows(tiny, LINES["de"])
    with Intervention(tiny, {sae.layer: ProjectionAblation(sae, idx) for sae, idx in zip(saes, features)}):
        ours = row_nll(tiny, rows)
    np.testing.assert_allclose(ours, released_layers_nll(tiny, rows, saes, features), rtol=TWO_LAYER_RTOL)
    # the second layer's edit counts: the first alone is another number
    one = released_layers_nll(tiny, rows, saes[:1], features[:1])
    assert np.abs(np.asarray(ours) - one).max() > 10 * TWO_LAYER_RTOL * np.abs(one).max()


def top_by_hand(path, language: str) -> int:
    """The language's most specific feature of a stats pass, ν by hand (latent_analysis.py: μ_L − mean of
    the other languages' μ), from the sums `babelprobe sae` saved."""
    with np.load(path) as z:
        mu = z["sum_f"] / z["n_tokens"][:, None]
        languages = [str(x) for x in z["languages"]]
    g = languages.index(language)
    nu = mu[g] - np.delete(mu, g, axis=0).mean(0)
    return int(np.argmax(nu))


def test_sae_also_sae_ablation_equals_the_released_two_layer_ce_loss(tmp_path, tiny, tiny_dir):
    """`sae --sae L1 --also-sae L2 --protocol paper`, then intervene's CE readout of that directory: each
    language's edit is its most specific feature at each layer (each ranked by its own SAE on the same
    items), projected out at both layers in the same forward (inference.py --modified_layer_num 2)."""
    from babelprobe.corpus import read_corpus
    from babelprobe.interventions.corpus_readout import readout_rows
    from tests.test_corpus_readout import corpus_folder

    saes = saes_at(tiny.d_model, (1, 2))
    folders = [save_sae(sae, tmp_path / f"sae{sae.layer}") for sae in saes]
    out = tmp_path / "run"
    argv = ["sae", "--model", tiny_dir, "--items", "xcomps-sample", "--languages", "en,de", "--limit", "2",
            "--sae", folders[0], "--also-sae", folders[1], "--protocol", "paper", "--folds", "2", "--random", "1",
            "--n-boot", "10", "--out", out, "--no-progress"]
    assert main([str(a) for a in argv]) == 0
    top = {language: [top_by_hand(out / "stats.npz", language), top_by_hand(out / "also" / "L2.npz", language)]
           for language in ("en", "de")}
    ablate = pd.read_csv(out / "ablate.csv").query("feature_set == 'language'")
    assert {(r.language, str(r.features), r.also_features) for r in ablate.itertuples()} == {
        (language, str(first), f"2: {second}") for language, (first, second) in top.items()}
    assert set(pd.read_csv(out / "ablate.csv").query("feature_set != 'language'")["also_features"].str[:3]) == {"2: "}

    folder = corpus_folder(tmp_path)
    ppl = tmp_path / "ppl"
    assert main([str(a) for a in ["intervene", "--model", tiny_dir, "--method", "sae", "--sae", out, "--readouts",
                                  "ppl", "--corpus", folder, "--corpus-rows", "lines", "--ablate-mode", "projection",
                                  "--random", "0", "--out", ppl, "--no-progress"]]) == 0
    table = pd.read_csv(ppl / "corpus.csv").set_index(["off", "language"])
    settings = type("S", (), {"corpus_rows": "lines", "window": 8, "tokens": None})()
    for off, language in (("de", "ru"), ("en", "de")):
        rows = readout_rows(tiny, read_corpus(folder), settings)[language]
        assert rows == lines_rows(tiny, read_corpus(folder).heldout[language])
        want = np.mean(released_layers_nll(tiny, rows, saes, [[top[off][0]], [top[off][1]]]))
        assert table.loc[(off, language), "nll"] == pytest.approx(want, rel=TWO_LAYER_RTOL)
        assert table.loc[(off, language), "also_features"] == f"2: {top[off][1]}"


@pytest.mark.parametrize("case", ["same layer", "beyond the model", "ablate 0", "another width", "no layer",
                                  "paper gap"])
def test_inconsistent_also_sae_is_one_line_before_the_model_loads(tmp_path, capsys, tiny_dir, monkeypatch, case):
    import babelprobe.models

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the inputs were checked")

    monkeypatch.setattr(babelprobe.models, "load_model", no_model)
    main_sae = gemma_scope_folder(tmp_path / "l2", planted(d_in=32, d_sae=8), layer=2)
    layer, width, extra, needle = {
        "same layer": (2, 32, [], "reads layer 2, as"),
        "beyond the model": (5, 32, [], "reads layer 5 (model.layers.4.output), beyond the model's layers 0..3"),
        "ablate 0": (3, 32, ["--ablate", "0"], "--also-sae adds layers to the ablation, and --ablate 0"),
        "another width": (3, 16, [], "reads states of width 16, --sae"),
        "no layer": (3, 32, [], "--also-sae takes folders that name their layer"),
        "paper gap": (1, 32, ["--protocol", "paper"], "--sae and --also-sae give layers 1, 2: give SAEs of layers 3 .. 3"),
    }[case]
    also = gemma_scope_folder(tmp_path / "also", planted(d_in=width, d_sae=8), layer=layer, config=case != "no layer")
    fails([*_run_argv(tiny_dir, main_sae, tmp_path / "out"), "--also-sae", also, *extra], capsys, needle,
          tmp_path / "out")
