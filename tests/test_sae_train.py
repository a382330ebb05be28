"""`sae train` on token streams (`babelprobe.sae.train`, `sae.stream`): the SAE it writes, the folding of
the activation scale and decoder norms, SAELens' losses where SAELens imports, checkpoints and resuming,
and the refusals before any model loads."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import babelprobe as bp
from babelprobe.errors import BabelprobeError
from babelprobe.sae.settings import TrainSettings
from babelprobe.sae.train import TrainingSAE, fit, heldout_fit
from babelprobe.sae.weights import load_sae

pytestmark = pytest.mark.usefixtures("one_thread")
LANGUAGES = ["en", "de", "zh"]


def small(**values) -> dict:
    return {"layers": 2, "width": 64, "k": 8, "tokens": 20_480, "batch_size": 256, "window": 32, **values}


def test_a_topk_sae_trained_on_the_token_stream_is_written_and_read_back(tiny, tmp_path):
    result = bp.train_sae(tiny, "udhr", tmp_path / "sae", languages=LANGUAGES, **small())
    fit_table = result.fit.set_index("language")
    assert set(fit_table.index) == {*LANGUAGES, "all"}
    assert fit_table.loc["all", "fvu"] < 0.6 and fit_table["l0"].max() <= 8  # TopK: at most k per token
    sae = load_sae(tmp_path / "sae")  # SAELens layout: cfg.json + sae_weights.safetensors
    assert sae.architecture == "topk" and sae.k == 8 and sae.layer == 2 and sae.apply_b_dec_to_input
    x = torch.randn(5, tiny.d_model, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(sae.encode(x), result.sae.encode(x))
    record = result.record
    assert record["tokens_trained"] == 20_480 and record["steps"] == 80
    assert 0 <= record["dead"]["heldout"] <= 1 and 0 <= record["dead"]["train_window"] <= 1
    assert not (tmp_path / ".sae.checkpoint").exists() and not (tmp_path / ".sae.training").exists()


@pytest.mark.parametrize("architecture", ["topk", "standard", "jumprelu"])
def test_the_saved_sae_is_the_trained_one_in_raw_units(architecture):
    """inference_sae folds the activation scale s (and topk's decoder norms): its reconstruction of x is the
    training SAE's reconstruction of s·x, divided by s."""
    g = torch.Generator().manual_seed(3)
    trainer = TrainingSAE(12, 40, architecture, 5, g)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
        trainer.W_dec.mul_(torch.rand(40, 1, generator=g) + 0.5)  # decoder rows of unequal norms
        if architecture == "jumprelu":
            trainer.threshold.copy_(torch.rand(40, generator=g) * 0.05)
    x, scale = torch.randn(30, 12, generator=g) * 4, 0.37
    losses, f = trainer(x * scale, torch.zeros(40, dtype=torch.bool), 0.0)
    sae = trainer.inference_sae(scale, layer=1)
    recon = sae.decode(sae.encode(x))
    with torch.no_grad():
        pre = (x * scale - trainer.b_dec) @ trainer.W_enc + trainer.b_enc
        if architecture == "topk":
            norms = trainer.W_dec.norm(dim=1)
            want = ((f / norms) @ trainer.W_dec + trainer.b_dec) / scale
        else:
            want = (f @ trainer.W_dec + trainer.b_dec) / scale
    torch.testing.assert_close(recon, want, rtol=1e-4, atol=1e-5)
    assert (sae.encode(x) > 0).sum() == (f > 0).sum() and pre.shape == f.shape


def test_topk_losses_and_gradients_equal_saelens():
    """The same parameters and batch through SAELens' TopKTrainingSAE: the same MSE, AuxK loss and gradients."""
    sae_lens = pytest.importorskip("sae_lens")
    from sae_lens.saes.sae import TrainStepInput

    g = torch.Generator().manual_seed(5)
    ours = TrainingSAE(16, 48, "topk", 4, g)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    theirs = sae_lens.TopKTrainingSAE(sae_lens.TopKTrainingSAEConfig(d_in=16, d_sae=48, k=4))
    theirs.load_state_dict({name: p.detach().clone() for name, p in ours.named_parameters()}, strict=False)
    x = torch.randn(20, 16, generator=g)
    dead = torch.zeros(48, dtype=torch.bool)
    dead[::3] = True
    mine, _ = ours(x, dead, 0.0)
    (mine["mse"] + mine["aux"]).backward()
    out = theirs.training_forward_pass(TrainStepInput(sae_in=x, coefficients={}, dead_neuron_mask=dead,
                                                      n_training_steps=0, is_logging_step=False))
    out.loss.backward()
    assert float(mine["mse"]) == pytest.approx(float(out.losses["mse_loss"]), rel=1e-5)
    assert float(mine["aux"]) == pytest.approx(float(out.losses["auxiliary_reconstruction_loss"]), rel=1e-5)
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, getattr(theirs, name).grad, rtol=1e-4, atol=1e-6)


def test_an_interrupted_training_resumes_from_its_checkpoint(tmp_path):
    settings = TrainSettings(layers="1", width=32, k=4, tokens=64 * 40, batch_size=64, seed=1)
    g = torch.Generator().manual_seed(0)
    data = torch.randn(4096, 8, generator=g) @ torch.randn(8, 8, generator=g)

    def batches(stop_after=None):
        for step in itertools.count():
            if stop_after is not None and step == stop_after:
                raise KeyboardInterrupt
            yield data[(step * 64) % 4096:(step * 64) % 4096 + 64]

    checkpoint, identity = tmp_path / ".sae.checkpoint", {"test": 1}
    with pytest.raises(KeyboardInterrupt):
        fit(None, [], 1, settings, identity=identity, checkpoint=checkpoint, checkpoint_every=10,
            batches=batches(stop_after=4 + 27))  # 4 batches (a tenth of the steps) estimate the scale first
    assert (checkpoint / "state.json").exists() and not (tmp_path / ".sae.checkpoint.new").exists()
    import json

    assert json.loads((checkpoint / "state.json").read_text())["step"] == 20
    resumed, state = fit(None, [], 1, settings, identity=identity, checkpoint=checkpoint, checkpoint_every=10,
                         batches=batches())
    assert state.step == 40 and state.tokens == 40 * 64 and [row[0] for row in state.losses] == [40]
    # another identity does not take the checkpoint over: it starts from step 0
    _, fresh = fit(None, [], 1, settings, identity={"test": 2}, checkpoint=checkpoint, checkpoint_every=1000,
                   batches=batches())
    assert fresh.tokens == 40 * 64 and np.isfinite(fresh.losses[-1][1])


def test_heldout_fit_is_the_fvu_around_each_language_mean(tiny):
    from babelprobe.sae.stream import layer_states
    from babelprobe.sae.weights import SAE

    g = torch.Generator().manual_seed(2)
    d = tiny.d_model
    sae = SAE(W_enc=torch.randn(d, 24, generator=g), W_dec=torch.randn(24, d, generator=g) * 0.1,
              b_enc=torch.zeros(24), b_dec=torch.zeros(d), architecture="standard", layer=2)
    rows = {"en": [[tiny.bos_token_id, 30, 31, 32, 33], [tiny.bos_token_id, 40, 41]],
            "de": [[tiny.bos_token_id, 50, 51, 52]]}
    table, dead = heldout_fit(tiny, sae, rows)
    for code, part in rows.items():
        x = layer_states(tiny, part, 2).double()  # every token but BOS
        error = float((x - sae.decode(sae.encode(x.float())).double()).square().sum())
        variance = float((x - x.mean(0)).square().sum())
        assert table.set_index("language").loc[code, "fvu"] == pytest.approx(error / variance, rel=1e-4)
    assert table.set_index("language").loc["all", "n_tokens"] == 4 + 2 + 3


def test_the_stream_serves_hf_states_and_copies_each_batch_off_the_device_once(tiny, monkeypatch):
    """`sae.stream.run_rows`: every row's states at the layer but BOS, as HF's `hidden_states` give them; a batch
    reads nothing back from the device (`HostReads`: the positions that count come from the host's batch) and
    leaves it in one copy, not a copy per row."""
    import babelprobe.sae.stream as stream
    from tests.host_reads import HostReads, batches_and_copies

    rows = [[tiny.bos_token_id, *range(30, 30 + n)] for n in (5, 2, 7, 3, 0, 4, 6)]
    batches, copies = batches_and_copies(monkeypatch, stream)
    with HostReads() as reads:
        served = dict(stream.run_rows(tiny, rows, 2, batch_tokens=16))
    assert not reads.seen, reads.seen
    assert len(batches) >= 3 and len(copies) == len(batches)
    for i, row in enumerate(rows):
        with torch.inference_mode():
            hidden = tiny.model(torch.tensor([row]), output_hidden_states=True).hidden_states[2][0, 1:]
        torch.testing.assert_close(served[i], hidden, rtol=1e-5, atol=1e-5)  # batched against alone: float32 order


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_sae_trains_on_the_models_gpu_as_on_the_cpu(tmp_path):
    """Trained where the model runs: on a GPU the same SAE as on the CPU, up to float32 arithmetic's drift over
    the steps (the same seeded initialisation and batches)."""
    import copy

    from tests.tiny import tiny_lm

    base, runs = tiny_lm("gemma3"), {}
    for device in ("cpu", "cuda"):
        lm = bp.wrap_model(copy.deepcopy(base.model).to(device), base.tokenizer, name="tiny-gemma3")
        runs[device] = bp.train_sae(lm, "udhr", tmp_path / device, languages=LANGUAGES, **small())
    cpu, gpu = runs["cpu"], runs["cuda"]
    assert gpu.sae.W_enc.device.type == "cpu"  # the result in host memory, as `load_sae` gives it
    torch.testing.assert_close(gpu.sae.W_dec, cpu.sae.W_dec, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(gpu.fit["fvu"], cpu.fit["fvu"], rtol=1e-3)


@pytest.mark.parametrize("values, message", [
    ({"tokens": 100, "batch_size": 256}, "--tokens 100 is less than one --batch-size 256"),
    ({"k": 100, "width": 64}, "--k 100 must not exceed --width 64"),
    ({"architecture": "gated"}, "--architecture"),
    ({"layers": "2,3"}, "an SAE reads one layer"),
])
def test_bad_settings_are_refused_before_the_model_loads(tmp_path, values, message):
    with pytest.raises(BabelprobeError, match=message):
        bp.train_sae("no-such-model-would-load", "udhr", tmp_path / "sae", **{**small(), **values})
    assert not (tmp_path / "sae").exists()


def test_bad_corpus_and_out_are_refused_before_the_model_loads(tmp_path):
    with pytest.raises(BabelprobeError, match="--corpus .*no such file"):
        bp.train_sae("no-such-model", tmp_path / "nothing", tmp_path / "sae", **small())
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(BabelprobeError, match="already holds files"):
        bp.train_sae("no-such-model", "udhr", tmp_path / "taken", **small())
    with pytest.raises(BabelprobeError, match="not an SAE"):
        bp.train_sae("no-such-model", "udhr", tmp_path / "taken", overwrite=True, **small())
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_the_sparsity_coefficient_warms_up_as_saelens_schedules_it(monkeypatch):
    """λ at step s is λ·s/W over the first W = 5% of steps, then λ: SAELens' CoefficientScheduler
    (training/optim.py) starts at 0 and is stepped after each training step (sae_trainer.py)."""
    settings = TrainSettings(layers="1", architecture="standard", width=16, l1=3.0, tokens=64 * 60, batch_size=64)
    data = torch.randn(64 * 60, 8, generator=torch.Generator().manual_seed(0))
    seen, forward = [], TrainingSAE.forward

    def recording(self, x, dead, coefficient):
        seen.append(coefficient)
        return forward(self, x, dead, coefficient)

    monkeypatch.setattr(TrainingSAE, "forward", recording)
    fit(None, [], 1, settings, batches=itertools.cycle(data.split(64)))  # a tenth more estimate the scale first
    warm = 3  # int(60 steps × 0.05)
    expected = [3.0 * s / warm if s < warm else 3.0 for s in range(60)]
    assert seen == pytest.approx(expected, rel=1e-12) and seen[0] == 0.0
