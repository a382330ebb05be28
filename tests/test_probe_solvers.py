"""The batched torch logistic solvers (exact Newton, L-BFGS) against scikit-learn (the reference), the
automatic choice between them, and the probe metrics against sklearn.metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score, roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from babelprobe.errors import BabelprobeError
from babelprobe.probes.metrics import accuracies, aucs, f1_scores
from babelprobe.probes.precondition import KAPPA_MIN, GramPreconditioner, cholesky, conditioning, gram
from babelprobe.probes.solvers import (
    choose_method,
    exact_bytes_per_layer,
    fit_logistic,
    fit_predict,
    layer_chunk,
    lbfgs_bytes_per_layer,
    plbfgs_bytes_per_layer,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: threads only add overhead


def sklearn_exact(X, y, C):
    """scikit-learn's LogisticRegression run to a tight tolerance: the optimum to compare against."""
    return LogisticRegression(C=C, tol=1e-10, max_iter=10_000).fit(X, y)


def standardised(rng, m, d):
    X = rng.normal(size=(m, d)) * rng.uniform(0.5, 2, size=d)
    return (X - X.mean(0)) / X.std(0)


@pytest.mark.parametrize("formulation, m, d, C", [("dual", 40, 60, 1.0), ("dual", 40, 60, 20.0),
                                                  ("primal", 40, 60, 0.05), ("primal", 80, 10, 1.0),
                                                  ("auto", 80, 10, 20.0)])
def test_fit_logistic_reaches_sklearn_optimum(formulation, m, d, C):
    rng = np.random.default_rng(0)
    problems = []
    for _ in range(3):
        X = standardised(rng, m, d)
        y = (X[:, 0] + rng.normal(size=m) > 0.3).astype(float)  # unbalanced, with signal
        problems.append((X, y))
    Z = torch.tensor(np.stack([p[0] for p in problems]))
    Y = torch.tensor(np.stack([p[1] for p in problems]))
    coef, intercept, _ = fit_logistic(Z, Y, torch.ones_like(Y), torch.full((3,), C, dtype=torch.float64),
                                      formulation=formulation)
    for b, (X, y) in enumerate(problems):
        ref = sklearn_exact(X, y, C)
        np.testing.assert_allclose(coef[b].numpy(), ref.coef_[0], atol=1e-5 * max(1, np.abs(ref.coef_).max()))
        np.testing.assert_allclose(intercept[b].item(), ref.intercept_[0], atol=1e-5 * max(1, abs(ref.intercept_[0])))


@pytest.mark.parametrize("formulation", ["dual", "primal"])
def test_problems_that_converge_early_leave_the_batch_unchanged(formulation):
    """A batch mixing fast (strongly regularised) and slow (weakly regularised) problems gives each the
    fit it gets alone, and the slow ones still reach scikit-learn's optimum."""
    rng = np.random.default_rng(8)
    X = np.stack([standardised(rng, 40, 30) for _ in range(4)])
    y = (X[:, :, 0] + 0.3 * rng.normal(size=(4, 40)) > 0).astype(float)
    C = np.array([1e-3, 50.0, 1e-2, 10.0])
    Z, Y = torch.tensor(X), torch.tensor(y)
    coef, intercept, n_iter = fit_logistic(Z, Y, torch.ones_like(Y), torch.tensor(C), formulation=formulation)
    for b in range(4):
        alone, alone_b, alone_iter = fit_logistic(Z[b:b + 1], Y[b:b + 1], torch.ones_like(Y[b:b + 1]),
                                                  torch.tensor(C[b:b + 1]), formulation=formulation)
        np.testing.assert_allclose(coef[b].numpy(), alone[0].numpy(), atol=1e-9)
        assert alone_iter <= n_iter
        ref = sklearn_exact(X[b], y[b], C[b])
        np.testing.assert_allclose(coef[b].numpy(), ref.coef_[0], atol=1e-5 * max(1, np.abs(ref.coef_).max()))
        np.testing.assert_allclose(intercept[b].item(), ref.intercept_[0], atol=1e-5 * max(1, abs(ref.intercept_[0])))


def test_padding_rows_do_not_count():
    """A problem padded with weight-0 rows gives the fit of its real rows only."""
    rng = np.random.default_rng(1)
    X, y = standardised(rng, 30, 50), np.tile([0.0, 1.0], 15)
    junk = rng.normal(size=(10, 50)) * 100
    Z = torch.tensor(np.concatenate([X, junk]))[None]
    Y = torch.tensor(np.concatenate([y, np.ones(10)]))[None]
    W = torch.tensor(np.concatenate([np.ones(30), np.zeros(10)]))[None]
    for formulation in ("dual", "primal"):
        coef, intercept, _ = fit_logistic(Z, Y, W, torch.tensor([1.0]), formulation=formulation)
        ref = sklearn_exact(X, y, 1.0)
        np.testing.assert_allclose(coef[0].numpy(), ref.coef_[0], atol=1e-6)


def test_fit_predict_matches_sklearn_pipeline_on_raw_activations():
    """Standardisation on the training rows only, unequal training sizes, per-problem C, offsets far from 0."""
    rng = np.random.default_rng(2)
    n, L, d = 50, 3, 80
    X = rng.normal(size=(n, L, d)) * rng.uniform(0.1, 30, size=d) + rng.uniform(-500, 500, size=d)
    labels = rng.integers(0, 2, size=n)
    X[:, :, :3] += labels[:, None, None] * 20
    train = np.stack([rng.random(n) < 0.8, rng.random(n) < 0.6, np.arange(n) >= 10])
    y = np.stack([labels, labels, 1 - labels])
    C = np.array([[1.0, 0.1, 5.0], [0.5, 0.5, 0.5], [2.0, 1.0, 0.01]])
    scores = fit_predict(X, y, train, C)
    for p in range(3):
        for layer in range(L):
            ref = make_pipeline(StandardScaler(), LogisticRegression(C=C[p, layer], tol=1e-10, max_iter=10_000))
            ref.fit(X[train[p], layer], y[p, train[p]])
            np.testing.assert_allclose(scores[p, layer], ref.decision_function(X[:, layer]), rtol=1e-4, atol=1e-4)


def test_float32_data_with_float64_newton_stays_close():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 2, 100)).astype(np.float32) + 10
    y = np.tile(np.tile([0, 1], 30), (2, 1))
    X[:, :, 0] += y[0][:, None] * 2
    train = np.stack([np.arange(60) % 4 < 2, np.arange(60) >= 20])
    exact = fit_predict(X, y, train, 1.0, dtype=torch.float64)
    single = fit_predict(X, y, train, 1.0, dtype=torch.float32)
    assert np.abs(exact - single).max() < 1e-4 * np.abs(exact).max()


def test_sklearn_solver_path_gives_the_same_decisions():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(40, 2, 30))
    labels = np.tile([0, 1], 20)
    X[:, :, 0] += labels[:, None] * 1.5
    train = np.stack([np.arange(40) >= 8, np.arange(40) < 32])
    y = np.tile(labels, (2, 1))
    torch_scores = fit_predict(X, y, train, 1.0)
    sk_scores = fit_predict(X, y, train, 1.0, solver="sklearn", n_jobs=1)
    assert sk_scores.shape == torch_scores.shape == (2, 2, 40)
    np.testing.assert_allclose(sk_scores, torch_scores, atol=1e-2)  # lbfgs stops at its own tol=1e-4


def test_single_class_problem_is_the_constant_classifier():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(20, 2, 8))
    y = np.stack([np.ones(20, int), np.tile([0, 1], 10), np.zeros(20, int)])
    train = np.ones((3, 20), bool)
    scores = fit_predict(X, y, train, 1.0)
    assert (scores[0] == 1).all() and (scores[2] == -1).all()
    np.testing.assert_allclose(scores[1], fit_predict(X, y[1:2], train[1:2], 1.0)[0])


@pytest.mark.parametrize("solver", ["newton", "lbfgs", "plbfgs"])
def test_layer_chunking_does_not_change_results(solver):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(30, 5, 20))
    y = np.tile(np.tile([0, 1], 15), (2, 1))
    train = np.stack([np.arange(30) >= 6, np.arange(30) < 24])
    options = dict(solver=solver, dtype=torch.float64, tol=None if solver == "newton" else 1e-10)
    whole = fit_predict(X, y, train, 1.0, **options)
    one_layer = {"newton": exact_bytes_per_layer(30, 24, 20, 2, 8), "lbfgs": lbfgs_bytes_per_layer(30, 20, 2, 8),
                 "plbfgs": plbfgs_bytes_per_layer(30, 20, 2, 8)}[solver]
    assert layer_chunk(30, 24, 20, 2, 5, 8, 1.5 * one_layer / 2**30, solver) == 1
    chunked = fit_predict(X, y, train, 1.0, memory_gb=1.5 * one_layer / 2**30, **options)  # one layer at a time
    np.testing.assert_allclose(whole, chunked, atol=1e-8)


def sklearn_pipelines(X, y, train, C):
    """scikit-learn's pipeline per problem and layer, run to tol=1e-10: (scores [P, L, n], pipelines)."""
    P, (n, L, _) = len(y), X.shape
    scores, models = np.empty((P, L, n)), {}
    for p in range(P):
        for layer in range(L):
            model = make_pipeline(StandardScaler(), LogisticRegression(C=C, tol=1e-10, max_iter=10_000))
            model.fit(X[train[p], layer], y[p, train[p]])
            scores[p, layer], models[p, layer] = model.decision_function(X[:, layer]), model
    return scores, models


def large_case(rng, n=160, L=2, d=48):
    """A problem with m > exact_max=16 (the threshold lowered, so that solver="torch" picks L-BFGS): raw
    activations with offsets and very unequal scales, a planted direction, two folds and an all-rows fit."""
    X = rng.normal(size=(n, L, d)) * rng.uniform(0.1, 30, size=d) + rng.uniform(-300, 300, size=d)
    labels = np.tile([0, 1], n // 2)
    X += np.outer(labels - 0.5, rng.normal(size=d) * 6)[:, None, :] * np.linspace(0.3, 1.0, L)[None, :, None]
    train = np.stack([np.arange(n) % 3 != 0, np.arange(n) % 3 != 1, np.ones(n, bool)])
    return X, np.tile(labels, (3, 1)), train


def test_torch_picks_lbfgs_above_the_threshold_and_reaches_sklearns_optimum():
    """The large-size path: with exact_max lowered, solver="torch" chooses L-BFGS for this size, and its
    scores, raw-unit weights and standardisation equal scikit-learn's pipeline at tol=1e-10 (float64), and
    stay close at the float32 default (no changed decisions)."""
    rng = np.random.default_rng(11)
    X, y, train = large_case(rng)
    n, L, d = X.shape
    # these standardised activations are close to isotropic: the estimate of their conditioning is small
    assert choose_method("torch", n, n, d, 3, 4, 2.0, exact_max=16, conditioning=1.0) == "lbfgs"
    assert choose_method("torch", n, n, d, 3, 4, 2.0) == "newton"  # the default threshold keeps exact Newton here
    ref, models = sklearn_pipelines(X, y, train, 0.5)
    scores, fit = fit_predict(X, y, train, 0.5, exact_max=16, dtype=torch.float64, tol=1e-10, return_fit=True)
    assert fit.method == "lbfgs" and (fit.info["conditioning"] < KAPPA_MIN).all()
    np.testing.assert_allclose(scores, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())
    for (p, layer), model in models.items():
        scaler, logistic = model
        np.testing.assert_allclose(fit.mean[p, layer], scaler.mean_, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(fit.scale[p, layer], scaler.scale_, rtol=1e-9)
        np.testing.assert_allclose(fit.coef[p, layer] * fit.scale[p, layer], logistic.coef_[0], rtol=1e-5,
                                   atol=1e-6 * np.abs(logistic.coef_).max())
        raw = X[:, layer] @ fit.coef[p, layer] + fit.intercept[p, layer]  # the fit applied by hand
        np.testing.assert_allclose(raw, scores[p, layer], rtol=1e-9, atol=1e-9)
    single = fit_predict(X, y, train, 0.5, exact_max=16)  # float32, default tolerance (scikit-learn's 1e-6)
    assert np.abs(single - ref).max() < 2e-3 * np.abs(ref).max()
    assert ((single > 0) == (ref > 0)).mean() > 0.999


def test_lbfgs_problems_that_converge_early_are_left_as_they_were():
    """In one batch, problems with very different C (fast and slow to converge) get the fit each gets alone."""
    rng = np.random.default_rng(12)
    X, y, train = large_case(rng, n=120, L=2, d=30)
    C = np.array([[1e-3, 20.0], [5.0, 1e-2], [0.3, 0.3]])
    together = fit_predict(X, y, train, C, solver="lbfgs", dtype=torch.float64, tol=1e-10)
    for p in range(3):
        alone = fit_predict(X, y[p:p + 1], train[p:p + 1], C[p:p + 1], solver="lbfgs", dtype=torch.float64, tol=1e-10)
        np.testing.assert_allclose(together[p], alone[0], rtol=1e-7, atol=1e-7 * np.abs(alone).max())


def test_lbfgs_layers_in_threads_give_the_same_scores():
    """On a CPU with several torch threads the layers are multiplied in threads: same numbers as one thread."""
    rng = np.random.default_rng(13)
    X, y, train = large_case(rng, n=100, L=3, d=20)
    threads = torch.get_num_threads()
    one = fit_predict(X, y, train, 1.0, solver="lbfgs", dtype=torch.float64, tol=1e-10)
    torch.set_num_threads(2)
    try:
        two = fit_predict(X, y, train, 1.0, solver="lbfgs", dtype=torch.float64, tol=1e-10)
    finally:
        torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads
    np.testing.assert_allclose(one, two, rtol=1e-9, atol=1e-9)


def test_choice_by_size_and_memory():
    gb = 2**30
    assert choose_method("torch", 136, 109, 640, 6, 4, 2.0) == "newton"  # the bundled sample
    assert choose_method("torch", 8000, 6400, 4096, 6, 4, 2.0) == "plbfgs"  # conditioning not yet measured
    assert choose_method("torch", 8000, 6400, 4096, 6, 4, 2.0, conditioning=40.0) == "plbfgs"  # like real ones
    assert choose_method("torch", 8000, 6400, 4096, 6, 4, 2.0, conditioning=1.0) == "lbfgs"  # isotropic
    assert choose_method("torch", 8000, 6400, 4096, 6, 4, 0.4) == "lbfgs"  # the d × d factors would not fit
    assert choose_method("torch", 20_000, 20_000, 64, 6, 4, 2.0) == "newton"  # few dims: (d+1)² systems
    assert choose_method("torch", 400, 320, 640, 6, 4, 1e-3) == "lbfgs"  # exact would not fit one layer
    with pytest.raises(BabelprobeError, match="--solver newton needs .* GB .* --memory-gb 0.001"):
        choose_method("newton", 400, 320, 640, 6, 4, 1e-3)
    # L-BFGS keeps to the budget at the real-workload size: a chunk of layers, nothing quadratic in m or d
    per_layer = lbfgs_bytes_per_layer(20_000, 4096, 6, 4)
    assert per_layer < 1.2 * 20_000 * 4096 * 4
    chunk = layer_chunk(20_000, 16_000, 4096, 6, 33, 4, 2.0, "lbfgs")
    assert chunk >= 1 and chunk * per_layer + 20_000 * 4096 * 4 <= 2.0 * gb


def test_fit_of_the_sklearn_solver_and_of_constant_problems():
    rng = np.random.default_rng(14)
    X = rng.normal(size=(40, 2, 6)) * 5 + 3
    labels = np.tile([0, 1], 20)
    X[:, :, 0] += labels[:, None]
    y = np.stack([labels, np.ones(40, int)])
    train = np.ones((2, 40), bool)
    scores, fit = fit_predict(X, y, train, 1.0, solver="sklearn", n_jobs=1, return_fit=True)
    assert fit.method == "sklearn"
    for layer in range(2):
        np.testing.assert_allclose(X[:, layer] @ fit.coef[0, layer] + fit.intercept[0, layer], scores[0, layer],
                                   rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(fit.mean[0, layer], X[:, layer].mean(0))
    assert (scores[1] == 1).all() and (fit.coef[1] == 0).all() and (fit.intercept[1] == 1).all()
    assert np.isnan(fit.mean[1]).all()


def test_metrics_match_sklearn():
    rng = np.random.default_rng(6)
    labels = rng.integers(0, 2, size=25)
    scores = np.round(rng.normal(size=(4, 25)), 1)  # rounding makes ties, which AUC must average
    scores[3] = -1  # predicts nothing positive: F1 0 (sklearn's zero_division)
    ours = zip(scores, f1_scores(scores, labels), accuracies(scores, labels), aucs(scores, labels), strict=True)
    for row, f1, acc, auc in ours:
        assert f1 == pytest.approx(f1_score(labels, row > 0, zero_division=0))
        assert acc == pytest.approx(accuracy_score(labels, row > 0))
        assert auc == pytest.approx(roc_auc_score(labels, row))
    assert np.isnan(aucs(scores, np.ones(25))).all()
    # a small fold (8 items: the AUC counts pairs instead of ranking), ties included: the same as sklearn's
    small, few = scores[:, :8], labels[:8]
    assert 0 < few.sum() < 8
    for row, auc in zip(small, aucs(small, few), strict=True):
        assert auc == roc_auc_score(few, row)  # halves and quarters: exact either way


# ------------------------------------------------------- L-BFGS preconditioned by each layer's Gram

def ill_conditioned(rng, n=300, L=2, d=40, condition=1e6):
    """Activations whose standardised covariance has condition ~`condition`: latent Gaussians with
    eigenvalues log-spaced from 1 down to 1/condition, turned by one random rotation (so standardising
    keeps the spectrum), then given raw offsets and unequal scales; the label's signal lies along the
    eigenvector at mid-spectrum (variance 1e-3), with three pairs of folds and an all-rows problem."""
    values = np.logspace(0, -np.log10(condition), d)
    rotation = np.linalg.qr(rng.normal(size=(d, d)))[0]
    labels = np.tile([0, 1], n // 2)
    latent = rng.normal(size=(n, L, d)) * np.sqrt(values)
    latent[:, :, d // 2] += (labels - 0.5)[:, None] * 2 * np.sqrt(values[d // 2])
    X = latent @ rotation.T * rng.uniform(0.5, 3, size=d) + rng.uniform(-40, 40, size=d)
    train = np.stack([np.arange(n) % 3 != 0, np.arange(n) % 3 != 1, np.arange(n) % 3 != 2, np.ones(n, bool)])
    return X, np.tile(labels, (4, 1)), train


def test_plbfgs_equals_sklearn_on_ill_conditioned_data():
    """Condition 1e6 (checked on the data): the Gram-preconditioned L-BFGS gives scikit-learn's decision
    function (exact Newton, `newton-cholesky`, run to tol 1e-10) to 1e-4, in a small fraction of plain
    L-BFGS's iterations; solver="torch" (with exact Newton's size limit lowered) measures the conditioning
    and picks it."""
    rng = np.random.default_rng(21)
    X, y, train = ill_conditioned(rng)
    n, L, d = X.shape
    for layer in range(L):
        z = StandardScaler().fit_transform(X[:, layer])
        values = np.linalg.eigvalsh(z.T @ z / n)
        assert values[-1] / values[0] > 1e5
    ref = np.empty((len(y), L, n))
    for p in range(len(y)):
        for layer in range(L):
            model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, solver="newton-cholesky", tol=1e-10,
                                                                      max_iter=1000))
            ref[p, layer] = model.fit(X[train[p], layer], y[p, train[p]]).decision_function(X[:, layer])
    options = dict(dtype=torch.float64, tol=1e-10, max_iter=20_000, return_fit=True)
    scores, fit = fit_predict(X, y, train, 1.0, solver="plbfgs", **options)
    np.testing.assert_allclose(scores, ref, rtol=0, atol=1e-4)
    _, plain = fit_predict(X, y, train, 1.0, solver="lbfgs", **options)
    assert fit.method == "plbfgs" and fit.n_iter.max() * 5 < plain.n_iter.max()
    chosen, fit = fit_predict(X, y, train, 1.0, exact_max=16, **options)
    assert fit.method == "plbfgs" and (fit.info["conditioning"] >= KAPPA_MIN).all()
    np.testing.assert_allclose(chosen, ref, rtol=0, atol=1e-4)
    single = fit_predict(X, y, train, 1.0, solver="plbfgs")  # float32, default tolerance
    assert np.abs(single - ref).max() < 1e-2 * np.abs(ref).max()
    assert ((single > 0) == (ref > 0)).mean() > 0.995


def test_gram_preconditioner_pieces_against_numpy():
    """The Gram (lower blocks only), the blocked Cholesky, the λ₁ estimate and the whitening: each against
    numpy's own computation of the same quantity."""
    rng = np.random.default_rng(22)
    X = torch.tensor(rng.normal(size=(500, 20)) @ rng.normal(size=(20, 300)) + 0.1 * rng.normal(size=(500, 300)))
    np.testing.assert_allclose(gram(X, block=128).numpy(), X.numpy().T @ X.numpy(), rtol=1e-12, atol=1e-9)
    A = gram(X) + torch.eye(300, dtype=X.dtype)
    L, ok = cholesky(A[None], leaf=32)
    assert ok
    np.testing.assert_allclose(L[0].numpy(), np.linalg.cholesky(A.numpy()), rtol=1e-9, atol=1e-9)
    assert not cholesky(A - 2 * torch.eye(300, dtype=X.dtype), leaf=32)[1]  # indefinite: reported
    Xc = X - X.mean(0)
    z = Xc.numpy() / Xc.numpy().std(0)
    values = np.linalg.eigvalsh(z.T @ z / len(z))
    spread = (values ** 2).mean() / values.mean() ** 2 / (1 + 300 / 500)
    estimate = float(conditioning(Xc[None], block=64)[0])  # Hutchinson's estimate: random, unbiased
    assert 0.7 * spread <= estimate <= 1.3 * spread and spread > 10
    isotropic = torch.tensor(rng.normal(size=(2000, 500)))
    assert 0.9 < float(conditioning(isotropic[None] - isotropic.mean(0))[0]) < 1.1
    # problem p's preconditioner is M = R (I + a·G) R with G the correlation matrix, R = σ_all / σₚ
    train = np.arange(500) % 4 != 0
    scale = torch.tensor(Xc.numpy()[train].std(0))[None, None]  # [1, 1, d]
    C, counts = torch.tensor([[2.0]], dtype=X.dtype), torch.tensor([float(train.sum())], dtype=X.dtype)
    shared = GramPreconditioner(Xc[None], scale, C, counts)
    R = Xc.numpy().std(0) / scale[0, 0].numpy()
    from babelprobe.probes.precondition import CURVATURE

    a = 2.0 * train.sum() * CURVATURE
    M = R[:, None] * (np.eye(300) + a * z.T @ z / len(z)) * R[None, :]
    g = torch.tensor(rng.normal(size=(1, 1, 301)))
    got = shared.unwhite(shared.white(g))[0, 0].numpy()
    np.testing.assert_allclose(got[:300], np.linalg.solve(M, g[0, 0, :300].numpy()), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(got[300], g[0, 0, 300].item() / a, rtol=1e-12)


MEMORY = """
import sys
import numpy as np, torch
from babelprobe.probes.solvers import fit_predict

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))

torch.set_num_threads(1)
rng = np.random.default_rng(0)
n, d = 400, 3000  # low rank + noise: ill-conditioned once standardised
X = (rng.normal(size=(n, 10)) @ rng.normal(size=(10, d)) + 0.05 * rng.normal(size=(n, d))).astype(np.float32)[:, None]
y, train = np.tile([0, 1], n // 2)[None], np.ones((1, n), bool)
fit_predict(X[:, :, :50], y, train, 1.0, solver="lbfgs")  # first calls: allocations that stay
for budget in sys.argv[1:]:
    before = status("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident size (VmHWM)
    _, fit = fit_predict(X, y, train, 1.0, memory_gb=float(budget), exact_max=16, max_iter=5, return_fit=True)
    print(budget, fit.method, status("VmHWM:") - before)
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak-RSS reset")
def test_memory_stays_within_the_budget():
    """Measured peak memory (the process's resident high-water mark, reset before each fit) of a layer of
    3000 dims: with a budget too small for its 3000 × 3000 Gram factors the solver falls back to plain
    L-BFGS and stays under the budget; with room it preconditions and the measurement sees the Gram."""
    import subprocess
    import sys

    budgets = (0.04, 1.0)
    done = subprocess.run([sys.executable, "-c", MEMORY, *map(str, budgets)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = {float(b): (method, int(grew)) for b, method, grew in (line.split() for line in done.stdout.splitlines())}
    tiny_method, tiny_peak = runs[0.04]
    assert tiny_method == "lbfgs" and tiny_peak <= 0.04 * 2**30
    method, peak = runs[1.0]
    assert method == "plbfgs" and 3000 * 3000 * 4 <= peak <= 1.0 * 2**30


def test_exact_newton_reaches_further_on_an_accelerator():
    """A quarter-XCOMPS group (1,796 items, 4096 dims, 5 folds + all rows): plbfgs on a CPU, where Newton's
    factorisations cost more than L-BFGS's passes, exact Newton on an accelerator, where each L-BFGS iteration's
    launches and reads back cost more (solvers.ACCELERATOR_EXACT_MAX); a full-XCOMPS group (m > d) is L-BFGS's
    on both."""
    from babelprobe.probes.solvers import ACCELERATOR_EXACT_MAX, EXACT_MAX, default_exact_max

    cpu, gpu = default_exact_max(torch.device("cpu")), default_exact_max(torch.device("meta"))
    assert (cpu, gpu) == (EXACT_MAX, ACCELERATOR_EXACT_MAX)
    quarter, full = (1796, 1437), (7184, 5747)
    assert choose_method("torch", *quarter, 4096, 6, 4, 30.0, exact_max=cpu) == "plbfgs"
    assert choose_method("torch", *quarter, 4096, 6, 4, 30.0, exact_max=gpu) == "newton"
    assert choose_method("torch", *full, 4096, 6, 4, 30.0, exact_max=gpu) == "plbfgs"


def mixed_problems(seed: int, n: int, d: int):
    """Problems of one batch that converge at different iterations (C from 1e-3 to 30), rows of either label."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2, d)) * rng.uniform(0.5, 2, size=d)
    labels = (X[:, 0, 0] + 0.5 * rng.normal(size=n) > 0).astype(int)
    train = rng.random((4, n)) > 0.25
    return X.astype(np.float32), np.tile(labels, (4, 1)), train, np.array([1e-3, 30.0, 0.1, 3.0])


@pytest.mark.parametrize("solver, n, d", [("newton", 40, 60), ("newton", 80, 10), ("lbfgs", 80, 30),
                                          ("plbfgs", 80, 30)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fewer_reads_back_leave_every_fit_as_it_is(solver, n, d, dtype, monkeypatch):
    """On an accelerator the solvers read less back (problems that converge taken out by integer indices, the line
    search's two candidates chosen on the device, L-BFGS's 1-D search stopped by one read): the same operations on
    the same numbers, so the same scores to the last bit (dual and primal Newton, L-BFGS, preconditioned L-BFGS)."""
    import babelprobe.probes.solvers as solvers

    X, y, train, C = mixed_problems(3, n, d)
    here = fit_predict(X, y, train, C, solver=solver, dtype=dtype)
    monkeypatch.setattr(solvers, "reads_are_free", lambda device: False)
    np.testing.assert_array_equal(fit_predict(X, y, train, C, solver=solver, dtype=dtype), here)


def test_the_line_search_picks_the_same_step_with_or_without_its_read(monkeypatch):
    """`_line_search` where every problem takes a full step or longer, and where some must backtrack."""
    import babelprobe.probes.solvers as solvers

    rng = np.random.default_rng(4)
    f, y = torch.tensor(rng.normal(size=(3, 20))), torch.tensor((rng.random((3, 20)) > 0.5).astype(float))
    s, C = torch.ones(3, 20), torch.ones(3, dtype=torch.float64)
    r, _ = solvers._loss_terms(f, y, s, C)
    zero, picked = torch.zeros(3, dtype=torch.float64), {}
    # no penalty along the step (full steps pass), and a steep one on the second problem (it must backtrack)
    for case, penalty in (("full", zero), ("backtrack", torch.tensor([0.0, 1e4, 0.0], dtype=torch.float64))):
        slope = (r * r).sum(1)
        for free in (True, False):
            monkeypatch.setattr(solvers, "reads_are_free", lambda device, free=free: free)
            picked[case, free] = solvers._line_search(f, r, y, s, C, zero, zero, penalty, slope)
        torch.testing.assert_close(picked[case, False], picked[case, True], rtol=0, atol=0)
    assert (picked["full", True] >= 1).all() and (picked["backtrack", True] < 1).any()


@pytest.mark.parametrize("solver, n, d, most", [("newton", 40, 60, 1), ("newton", 80, 10, 2), ("lbfgs", 80, 30, 1)])
def test_an_iteration_reads_back_once_on_an_accelerator(solver, n, d, most, monkeypatch):
    """Each Newton iteration reads back how many problems converged (the primal one also whether a factorisation
    failed), each L-BFGS line search whether its steps have settled (its iteration's read of the problems still
    active is a copy, which `HostReads` does not see on a CPU): at most `most` operator reads per iteration, where a
    boolean index per tensor kept and a read per line-search step made up to 20."""
    import babelprobe.probes.solvers as solvers
    from tests.host_reads import HostReads

    monkeypatch.setattr(solvers, "reads_are_free", lambda device: False)  # the solvers' choices on an accelerator
    X, y, train, C = mixed_problems(5, n, d)
    with HostReads() as reads:
        _, fit = fit_predict(X, y, train, C, solver=solver, return_fit=True)
    iterations = int(fit.n_iter.max())
    assert iterations >= 3 and 0 < len(reads.seen) <= most * iterations, reads.seen
