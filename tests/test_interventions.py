"""Interventions (`babelprobe intervene`): edits inside the forward pass against HF's own forward pass and
a hand computation, a planted direction that drives the output, ablation to chance, LEACE's guarantee,
the summary's arithmetic, the command and the report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from babelprobe.analysis import interventions as analysis
from babelprobe.benchmarks.core.logprobs import token_logprobs
from babelprobe.cli import main
from babelprobe.interventions import Erase, Intervention, Project, Steer, fit_leace, intervene, pooled_states
from babelprobe.interventions.directions import ProbeSource
from babelprobe.items import load_items
from babelprobe.probes import ArrayStore, probe
from babelprobe.probes.weights import Probes
from babelprobe.tables import read_table
from tests.cli_errors import refused
from tests.tiny import tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")


def few_items(languages=("en",), limit=2, subsets=("taxonomic", "random")) -> pd.DataFrame:
    return load_items("xcomps-sample", languages=list(languages), subsets=list(subsets), limit=limit)


def hf_states(lm, text: str) -> tuple[torch.Tensor, tuple]:
    """HF's own forward with `output_hidden_states`, the final norm swapped for Identity so that entry L is
    block L's output (HF returns it after the norm): token ids [1, n] and the L+1 states [1, n, d]."""
    ids = torch.tensor([lm.encode([text])[0].ids])
    body, norm = lm.parts.body, lm.parts.body.norm
    body.norm = torch.nn.Identity()
    try:
        with torch.inference_mode():
            states = body(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    finally:
        body.norm = norm
    return ids, states


def manual_logprobs(lm, ids: torch.Tensor, edited: torch.Tensor, layer: int) -> np.ndarray:
    """Log-probs of each token given the ones before, continuing HF's own forward from the hand-edited
    states of `layer`: the blocks after it (the body with its block list cut) fed `inputs_embeds`."""
    body, blocks = lm.parts.body, lm.parts.body.layers
    body.layers = torch.nn.ModuleList(list(blocks)[layer:])
    try:
        with torch.inference_mode():
            hidden = body(inputs_embeds=edited, use_cache=False).last_hidden_state
            logprobs = torch.log_softmax(lm.parts.logits(hidden[0]).double(), dim=-1)
    finally:
        body.layers = blocks
    n = ids.shape[1]
    return logprobs[torch.arange(n - 1), ids[0, 1:]].numpy()


def random_unit(d: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(d)
    return v / np.linalg.norm(v)


def edits_for(lm, alpha: float) -> dict:
    d = lm.d_model
    X = np.random.default_rng(1).standard_normal((40, d)).astype(np.float32)
    labels = np.arange(40) % 2
    X[labels == 1] += random_unit(d, 2).astype(np.float32)
    return {"steer": Steer(alpha * 2.5 * random_unit(d, 3)), "project": Project(random_unit(d, 4), 0.7, alpha),
            "erase": Erase(fit_leace(X, labels), alpha)}


# ------------------------------------------------------------------------------------ the forward pass

@pytest.mark.parametrize("layer", [0, 1, 3])
@pytest.mark.parametrize("kind", ["steer", "project", "erase"])
def test_intervened_forward_equals_the_manual_residual_edit(tiny_long, layer, kind):
    edit = edits_for(tiny_long, alpha=1.0)[kind]
    text = "Ein Hund kann bellen, aber eine Katze kann klettern."
    ids, states = hf_states(tiny_long, text)
    h = states[layer].double()
    if kind == "steer":
        edited = h + edit.tensors["vector"].double()
    elif kind == "project":  # the component along u moved to 0.7, by hand
        u = edit.tensors["unit"].double()
        edited = h - ((h @ u) - 0.7)[..., None] * u
    else:  # LEACE's formula, x − (x − bias) Rᵀ Lᵀ
        left, right, bias = (edit.tensors[k].double() for k in ("left", "right", "bias"))
        edited = h - ((h - bias) @ right.T) @ left.T
    expected = manual_logprobs(tiny_long, ids, edited.float(), layer)
    with Intervention(tiny_long, {layer: edit}):
        got = token_logprobs(tiny_long, [text], progress=False)[0].logprobs
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    unedited = token_logprobs(tiny_long, [text], progress=False)[0].logprobs
    assert np.abs(unedited - expected).max() > 1e-3  # the edit did change something


def test_last_position_edit_changes_only_the_last_state(tiny_long):
    texts = ["A dog can bark.", "Собака умеет лаять.", "猫会爬树。"]
    edit = Steer(3.0 * random_unit(tiny_long.d_model, 5))
    with Intervention(tiny_long, {2: edit}) as hooks:
        last = pooled_states(tiny_long, texts, [2], "last", hooks)[:, 0]
        mean = pooled_states(tiny_long, texts, [2], "mean", hooks)[:, 0]
    for i, text in enumerate(texts):
        _, states = hf_states(tiny_long, text)
        h = states[2][0].double().numpy()
        h_edited = h.copy()
        h_edited[-1] += edit.tensors["vector"].double().numpy()
        np.testing.assert_allclose(last[i], h_edited[-1], atol=1e-5)
        np.testing.assert_allclose(mean[i], h_edited[1:].mean(0), atol=1e-5)  # BOS left out of the mean


def test_alpha_zero_gives_exactly_the_unintervened_scores(tiny_long):
    items = few_items(limit=1)
    texts = items["text"].tolist()
    plain = token_logprobs(tiny_long, texts, progress=False)
    plain_states = pooled_states(tiny_long, texts, [1, 3])
    for name, edit in edits_for(tiny_long, alpha=0.0).items():
        with Intervention(tiny_long, {1: edit}):
            edited = token_logprobs(tiny_long, texts, progress=False)
            states = pooled_states(tiny_long, texts, [1, 3])
        for a, b in zip(plain, edited):
            np.testing.assert_array_equal(a.logprobs, b.logprobs, err_msg=name)
        np.testing.assert_array_equal(plain_states, states, err_msg=name)


# -------------------------------------------------------------------------------- a planted direction

def planted_model(u: np.ndarray, beta: float = 5.0):
    """A tiny Llama whose output depends on its last block's output h only through u·h: the final norm
    is removed and the head is rank one, logits = β·v·(u·h)."""
    lm = tiny_lm("llama", max_positions=512, seed=1)
    lm.parts.body.norm = torch.nn.Identity()
    v = np.random.default_rng(7).standard_normal(lm.parts.head.weight.shape[0])
    with torch.no_grad():
        lm.parts.head.weight.copy_(torch.tensor(beta * np.outer(v, u), dtype=torch.float32))
    return lm


def planted_source(u: np.ndarray, n_layers: int, n_items: int) -> ProbeSource:
    """One probe (no grouping) whose direction at every layer is u."""
    d, layers = len(u), list(range(n_layers + 1))
    groups = pd.DataFrame({"n_train": [n_items], "n_positive": [n_items // 2], "method": ["planted"]})
    probes = Probes(groups, layers, coef=np.tile(u, (1, len(layers), 1)), intercept=np.zeros((1, len(layers))),
                    mean=np.zeros((1, len(layers), d)), scale=np.ones((1, len(layers), d)),
                    C=np.ones((1, len(layers))), by=(), settings={"pool": "last"})
    table = pd.DataFrame({"language": "all", "subset": "all", "layer": layers, "f1_mean": np.nan})
    return ProbeSource(probes, table, pd.DataFrame({"peak_layer": [n_layers]}), Path("planted"), "planted")


def predicted_score(lm, text: str, u: np.ndarray, shift: float) -> float:
    """Sum log-prob of the text's tokens when the last block's output moves by `shift` along u, from the
    un-intervened logits of HF's own forward: the logits move by shift·β·v = shift·(W u)."""
    ids = torch.tensor([lm.encode([text])[0].ids])
    with torch.inference_mode():
        logits = lm.model(input_ids=ids).logits[0].double()
        direction = lm.parts.head.weight.double() @ torch.tensor(u)
    logprobs = torch.log_softmax(logits + shift * direction, dim=-1)
    return float(logprobs[torch.arange(ids.shape[1] - 1), ids[0, 1:]].sum())


def test_steering_a_planted_direction_moves_the_scores_by_the_predicted_amount(tmp_path):
    u = random_unit(32, 11)
    lm = planted_model(u)
    items = few_items(limit=2)
    L = lm.n_layers
    result = intervene(lm, items, planted_source(u, L, len(items)), tmp_path / "steer", layers=str(L),
                       methods="steer", alphas="-4,0,4", n_random=3, shuffled=False, readouts="direct", n_boot=100,
                       figures=False, progress=False)
    rows = result.rows
    # σ: the standard deviation of the last-token states along u, from HF's own forward
    last = np.stack([hf_states(lm, t)[1][L][0, -1].double().numpy() for t in items["text"]])
    sigma = float((last @ u).std())
    probe_rows = rows[rows["direction"] == "probe"]
    np.testing.assert_allclose(probe_rows["sigma"], sigma, rtol=1e-5)
    text = items.set_index("item_id")["text"]
    pairs = items.pivot(index="pair_id", columns="label", values="item_id")
    for _, row in probe_rows.iterrows():
        shift = row["alpha"] * sigma
        good, bad = text[pairs.loc[row["pair_id"], 1]], text[pairs.loc[row["pair_id"], 0]]
        assert row["direct_score_good"] == pytest.approx(predicted_score(lm, good, u, shift), abs=2e-4)
        assert row["direct_score_bad"] == pytest.approx(predicted_score(lm, bad, u, shift), abs=2e-4)
    def moved(part):
        return (part["direct_score_good"] - part["direct_score_good_base"]).abs()

    steered = probe_rows[probe_rows["alpha"] != 0]
    assert moved(steered).mean() > 0.1
    # α = 0: exactly the un-intervened scores, for every direction
    zero = rows[rows["alpha"] == 0]
    np.testing.assert_array_equal(zero["direct_score_good"], zero["direct_score_good_base"])
    np.testing.assert_array_equal(zero["direct_margin"], zero["direct_margin_base"])
    # random directions of the same size move the scores much less (only through their small part along u)
    random_rows = rows[(rows["direction"] == "random") & (rows["alpha"] != 0)]
    assert moved(random_rows).mean() < 0.5 * moved(steered).mean()
    # and a direction orthogonal to u moves nothing at all
    r = random_unit(32, 12)
    r -= (r @ u) * u
    before = token_logprobs(lm, items["text"].tolist(), progress=False)
    with Intervention(lm, {L: Steer(2 * sigma * r / np.linalg.norm(r))}):
        after = token_logprobs(lm, items["text"].tolist(), progress=False)
    for a, b in zip(before, after):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


# ---------------------------------------------------------------------------------- ablation, LEACE

def fitted_source(lm, items: pd.DataFrame, layers=(1, 2)) -> ProbeSource:
    X = pooled_states(lm, items["text"].tolist(), list(layers))
    keys = items[["item_id", "pair_id", "language", "subset", "label"]].reset_index(drop=True)
    result = probe(ArrayStore(keys, last=X, layers=list(layers), n_layers=lm.n_layers), folds=2, n_boot=20, workers=1)
    return ProbeSource(result.probes, result.table, result.peaks, Path("fitted"), "fitted")


def test_ablating_the_probe_direction_brings_the_probe_to_chance(tiny_long, tmp_path):
    items = few_items(languages=("en", "de"), limit=3, subsets=("taxonomic",))
    source = fitted_source(tiny_long, items)
    result = intervene(tiny_long, items, source, tmp_path / "ablate", layers="2", methods="ablate,leace", n_random=2,
                       readouts="probe", n_boot=100, figures=False, progress=False)
    rows = result.rows
    own = rows[(rows["direction"] == "probe") & (rows["method"] == "ablate")]
    assert (own["probe_bacc_base"] == 1.0).all()  # the all-items probes separate their training items
    assert (own["probe_bacc"] == 0.5).all()
    for language, part in own.groupby("language"):  # every score is the intercept: x·ŵ was removed
        probe = source.probes.probe({"language": language, "subset": "taxonomic"}, 2)
        scale = np.abs(part["probe_margin_base"]).max()
        np.testing.assert_allclose(part[["probe_score_good", "probe_score_bad"]], probe.intercept, atol=1e-4 * scale)
    controls = rows[(rows["direction"] == "random") & (rows["method"] == "ablate")]
    assert controls["probe_bacc"].mean() > 0.75  # a random direction leaves the probe working
    checks = result.sanity
    assert checks.loc[(checks["direction"] == "probe"), "at_chance"].all()
    leace = rows[(rows["direction"] == "probe") & (rows["method"] == "leace")]
    assert (leace["probe_bacc"] < leace["probe_bacc_base"]).all()


def test_ablation_defeats_an_independent_sklearn_probe(tiny_long):
    items = few_items(limit=4)
    texts, labels = items["text"].tolist(), items["label"].to_numpy()
    X = pooled_states(tiny_long, texts, [2])[:, 0]
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=5000)).fit(X, labels)
    coef = probe[-1].coef_[0] / probe[0].scale_  # the probe's weights on raw activations
    assert balanced_accuracy_score(labels, probe.predict(X)) == 1.0
    with Intervention(tiny_long, {2: Project(coef, 0.0)}):
        ablated = pooled_states(tiny_long, texts, [2])[:, 0]
    scores = probe.decision_function(ablated)
    assert np.ptp(scores) < 1e-4 * np.ptp(probe.decision_function(X))
    assert balanced_accuracy_score(labels, probe.predict(ablated)) == 0.5


def test_leace_equalises_the_class_means_of_the_edited_states(tiny_long):
    items = few_items(languages=("en", "de"), limit=3)
    texts, labels = items["text"].tolist(), items["label"].to_numpy()
    X = pooled_states(tiny_long, texts, [2])[:, 0]
    with Intervention(tiny_long, {2: Erase(fit_leace(X, labels))}):
        erased = pooled_states(tiny_long, texts, [2])[:, 0]
    gap = lambda A: np.abs(A[labels == 1].mean(0) - A[labels == 0].mean(0)).max()  # noqa: E731
    assert gap(X) > 1e-3
    assert gap(erased) < 1e-5 * max(1.0, np.abs(X).max())


# ----------------------------------------------------------------------------------------- summaries

def test_summary_effects_are_the_mean_paired_differences():
    rng = np.random.default_rng(0)
    rows = []
    for p in range(8):
        for direction, draw in (("probe", 0), ("random", 0), ("random", 1), ("shuffled", 0)):
            before = rng.normal()
            rows.append({"pair_id": f"p{p}", "language": "en" if p < 4 else "de", "subset": "s", "layer": 2 + p % 2,
                         "layer_rule": "peak", "method": "ablate", "ablate_to": "zero", "positions": "all",
                         "alpha": 1.0, "direction": direction, "draw": draw, "direct_margin_base": before,
                         "direct_margin": before + rng.normal(-1 if direction == "probe" else 0, 0.1),
                         "direct_correct_base": before > 0, "direct_correct": rng.random() > 0.5})
    rows = pd.DataFrame(rows)
    summary = analysis.summarize(rows, n_boot=200)
    delta = rows.assign(d=rows["direct_margin"] - rows["direct_margin_base"])
    for language in ("en", "de", "all"):
        part = delta if language == "all" else delta[delta["language"] == language]
        cell = summary[(summary["language"] == language) & (summary["layers"] == "peak") &
                       (summary["readout"] == "direct_margin")].set_index("direction")
        probe = part[part["direction"] == "probe"].set_index("pair_id")["d"]
        random = part[part["direction"] == "random"].groupby("pair_id")["d"].mean()
        assert cell.loc["probe", "value"] == pytest.approx(probe.mean())
        assert cell.loc["random", "value"] == pytest.approx(random.mean())
        assert cell.loc["probe−random", "value"] == pytest.approx((probe - random).mean())
        assert cell.loc["probe", "ci_low"] <= probe.mean() <= cell.loc["probe", "ci_high"]
        assert cell.loc["probe", "n"] == len(probe)
    by_layer = summary[(summary["layers"] == "3") & (summary["language"] == "all") &
                       (summary["readout"] == "direct_accuracy") & (summary["direction"] == "probe")]
    odd = rows[(rows["layer"] == 3) & (rows["direction"] == "probe")]
    expected = (odd["direct_correct"].astype(float) - odd["direct_correct_base"].astype(float)).mean()
    assert by_layer["value"].iloc[0] == pytest.approx(expected)


# ------------------------------------------------------------------------------- command and report

@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory, tiny_long_dir):
    """A store and a probe result of the tiny model (loaded from its directory, as the command does) on a
    few xcomps-sample pairs."""
    from babelprobe.extract import extract
    from babelprobe.models import load_model

    root = tmp_path_factory.mktemp("intervene")
    items = few_items(languages=("en", "de"), limit=3)
    extract(load_model(str(tiny_long_dir)), items, root / "acts", layers="0-3", progress=False,
            source={"source": "xcomps-sample", "languages": ["en", "de"], "subsets": ["taxonomic", "random"],
                    "limit": 3})
    probe(root / "acts", folds=3, n_boot=20, workers=1).write(root / "neuro.csv")
    return root


def cli_args(model_dir, probes, out, *extra):
    return ["intervene", "--model", str(model_dir), "--items", "xcomps-sample", "--languages", "en", "--subsets",
            "taxonomic,random", "--limit", "3", "--probes", str(probes), "--random", "1", "--n-boot", "50",
            "--out", str(out), "--no-progress", *extra]


def test_command_writes_tables_and_figures_reuses_and_refuses(tiny_long_dir, probe_dir, tmp_path, capsys):
    out = tmp_path / "intervene"
    assert main(cli_args(tiny_long_dir, probe_dir, out, "--layers", "peak", "--readouts", "direct,probe")) == 0
    printed = capsys.readouterr().out
    assert "sanity: ablate" in printed and "probe − random" in printed
    rows = read_table(out / "interventions.csv")
    assert {"pair_id", "language", "subset", "layer", "method", "direction", "alpha", "direct_margin",
            "direct_margin_base", "probe_bacc"} <= set(rows.columns)
    assert len(rows) == 6 * 3  # 6 pairs × (probe, one random, shuffled)
    for name in ("summary.csv", "sanity.csv", "intervene.json", "figures/effect_by_layer_ablate_direct_accuracy.png",
                 "figures/f1_vs_effect_ablate.png"):
        assert (out / name).exists(), name
    assert main(cli_args(tiny_long_dir, probe_dir, out, "--layers", "peak", "--readouts", "direct,probe")) == 0
    pd.testing.assert_frame_equal(read_table(out / "interventions.csv"), rows)
    assert main(cli_args(tiny_long_dir, probe_dir, out, "--method", "steer", "--readouts", "direct")) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_command_errors_are_one_line(tiny_long_dir, probe_dir, tmp_path, capsys):
    assert main(cli_args(tiny_long_dir, tmp_path / "nowhere", tmp_path / "a")) == 2
    assert "--probes" in capsys.readouterr().err
    assert main(cli_args(tiny_long_dir, probe_dir, tmp_path / "b", "--layers", "9")) == 2
    assert "layer" in capsys.readouterr().err
    assert main(cli_args(tiny_long_dir, probe_dir, tmp_path / "c", "--method", "erase")) == 2
    assert "--method: unknown value 'erase'" in capsys.readouterr().err


# ------------------------------------------------------------- bad input (docs/reliability.md, I1-I7)

def test_I1_layer_outside_the_store_is_refused_before_fitting(tiny_long_dir, probe_dir, tmp_path, capsys):
    refused(cli_args(tiny_long_dir, probe_dir / "acts", tmp_path / "o", "--layers", "99"), capsys, tmp_path / "o",
            "--layers '99': no probe at layer 99; the probes cover layers 0..3")


def test_I2_probes_that_do_not_exist(tiny_long_dir, tmp_path, capsys):
    refused(cli_args(tiny_long_dir, tmp_path / "nowhere", tmp_path / "o"), capsys, tmp_path / "o",
            f"--probes {tmp_path / 'nowhere'}: no such file or directory")


def test_I3_a_language_the_probes_do_not_cover(tiny_long_dir, probe_dir, tmp_path, capsys):
    argv = cli_args(tiny_long_dir, probe_dir, tmp_path / "o")
    argv[argv.index("--languages") + 1] = "fr"
    refused(argv, capsys, tmp_path / "o", "no probes for fr/", "its groups are de/random")


def test_I4_bad_settings(tiny_long_dir, probe_dir, tmp_path, capsys):
    out = tmp_path / "o"
    refused(cli_args(tiny_long_dir, probe_dir, out, "--method", "erase"), capsys, out, "--method: unknown value 'erase'")
    refused(cli_args(tiny_long_dir, probe_dir, out, "--alpha", "x"), capsys, out, "--alpha: cannot read")
    refused(cli_args(tiny_long_dir, probe_dir, out, "--positions", "last", "--readouts", "direct"), capsys, out,
            "--positions last", "use --readouts probe")
    refused(cli_args(tiny_long_dir, probe_dir, out, "--readouts", "direct,logits"), capsys, out,
            "--readouts: unknown value 'logits'")


def test_peak_and_the_scorers_values_are_spelled_as_elsewhere():
    """`--layers max` is `peak` (extract/layers.py parses both, as for compare); --rule and --reduction offer
    the scorers' values (benchmarks.scoring), checked in the settings too."""
    from babelprobe.benchmarks.scoring import REDUCTIONS, RULES
    from babelprobe.cli import build_parser
    from babelprobe.errors import BabelprobeError
    from babelprobe.interventions.settings import Settings

    assert Settings(layers="max").layers == Settings(layers=" Peak ").layers == "peak"
    with pytest.raises(BabelprobeError, match="--rule: unknown value 'all'"):
        Settings(rule="all")
    command = build_parser()._subparsers._group_actions[0].choices["intervene"]
    choices = {action.dest: tuple(action.choices) for action in command._actions if action.dest in ("rule", "reduction")}
    assert choices == {"rule": RULES, "reduction": REDUCTIONS}


def test_I5_probe_directions_without_probes(tiny_long_dir, tmp_path, capsys):
    argv = cli_args(tiny_long_dir, "x", tmp_path / "o")
    del argv[argv.index("--probes"):argv.index("--probes") + 2]
    refused(argv, capsys, tmp_path / "o", "--method ablate edits along probe directions: give --probes")


def test_I6_probes_of_another_model(tiny_dir, probe_dir, tmp_path, capsys):
    refused(cli_args(tiny_dir, probe_dir / "acts", tmp_path / "o"), capsys, tmp_path / "o",
            "were fitted on another model (fingerprint")


def test_I7_out_holds_another_run(tiny_long_dir, probe_dir, tmp_path, capsys):
    import json

    out = tmp_path / "o"
    out.mkdir()
    (out / "intervene.json").write_text(json.dumps({"fingerprint": "another-model", "stages": {}}))
    (out / "interventions.csv").write_text("pair_id\n")
    refused(cli_args(tiny_long_dir, probe_dir, out), capsys, out, "this directory holds an intervention run of "
            "another model", "fingerprint='another-model'", "--overwrite")


def test_fresh_probes_from_a_store_and_the_report(tiny_long_dir, probe_dir, tmp_path):
    from babelprobe.analysis.report import write_report

    out = probe_dir / "intervene-store"
    assert main(cli_args(tiny_long_dir, probe_dir / "acts", out, "--layers", "1,2", "--method", "steer",
                         "--alpha=-1,0,1", "--readouts", "direct", "--no-shuffled")) == 0
    assert (out / "probes" / "neuro.probes.h5").exists()
    rows = read_table(out / "interventions.csv")
    assert sorted(rows["layer"].unique()) == [1, 2] and sorted(rows["alpha"].unique()) == [-1, 0, 1]
    assert (out / "figures" / "dose_response_steer_direct_margin.png").exists()
    report = write_report(probe_dir, tmp_path / "figures", n_boot=20)
    text = (tmp_path / "figures" / "report.md").read_text(encoding="utf-8")
    assert "## Interventions" in text and "intervene_effect_by_layer_steer_direct_accuracy" in report.figures


def test_refit_after_erasing_the_probe_direction_is_cross_fitted():
    """Erasing a direction fitted on all rows leaks the held-out labels into a refitted probe (on data with
    no signal its F1 moves far from the unedited refit's); the cross-fitted refit, whose direction is fitted
    on each fold's training rows only, stays with it, and with no edit it is exactly the sweep's refit."""
    from babelprobe.interventions.directions import fitted_direction
    from babelprobe.interventions.probe_edits import _crossfit_f1, _refit_f1
    from babelprobe.interventions.settings import Settings
    from babelprobe.probes import synthetic_activations

    settings, base, leaky, cross = Settings(), [], [], []
    for seed in range(6):
        keys, X = synthetic_activations(n_pairs=40, n_layers=1, d_model=128, signal=0.0, seed=seed)
        X = X[:, 1]
        base.append(_refit_f1(X, 1, keys, settings))
        assert _crossfit_f1(X, keys, settings, "ablate", 1.0, alpha=0.0) == base[-1]
        edit = Project(fitted_direction(X, keys["label"].to_numpy(int), 1.0))
        leaky.append(_refit_f1(edit(torch.as_tensor(X)).numpy(), 1, keys, settings))
        cross.append(_crossfit_f1(X, keys, settings, "ablate", 1.0, alpha=1.0))
    assert abs(np.mean(cross) - np.mean(base)) < 0.05
    assert np.mean(leaky) < np.mean(base) - 0.1


def test_a_probe_without_direction_says_what_happened():
    """Default intervene on tiny data can peak at layer 0, where texts that end in the same token have the same
    last-token state: the message says so (both labels present), it does not guess at one label."""
    from babelprobe.errors import BabelprobeError
    from babelprobe.interventions.directions import fitted_direction

    X = np.tile(np.linspace(-1, 1, 8, dtype=np.float32), (6, 1))
    with pytest.raises(BabelprobeError, match=r"en layer 0 has no direction: its 6 states are identical "
                                              r"\(both labels present: 3 and 3\)"):
        fitted_direction(X, np.array([0, 1, 0, 1, 0, 1]), 1.0, where="en layer 0")
    with pytest.raises(BabelprobeError, match="its 6 rows all have label 1"):
        fitted_direction(X + np.arange(6)[:, None], np.ones(6, dtype=int), 1.0)
