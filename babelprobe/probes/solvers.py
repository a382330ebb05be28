"""Logistic-regression probes: a batched torch solver that fits many problems (folds × layers) at once,
and scikit-learn's `LogisticRegression` as the reference.

Both solve scikit-learn's L2 problem on features standardised with the mean and standard deviation of
the training rows only (like `StandardScaler` fitted on the training fold):

    minimise over w, b:   C · Σ_i logloss(y_i, z_i·w + b)  +  ½‖w‖²        (the intercept b is not penalised)

The torch solver is Newton's method with a backtracking line search, run on a whole batch of problems
in lock-step. It picks the cheaper exact formulation per batch: when a problem has fewer training rows
m than features d (640 dims, ~100 rows per fold here) it works in the m-dimensional row space
(w = Zᵀa, so every Newton step is an m × m Cholesky solve on the kernel K = ZZᵀ); otherwise it solves
the (d+1) × (d+1) primal Newton system. Both give the same optimum, which scikit-learn's lbfgs
approaches to its tolerance (its default tol=1e-4 stops visibly short of it).

Problems leave the batch as they converge, and a step longer than Newton's is taken when it lowers the
objective more: together ~5 factorisations per problem instead of ~7. Everything is float32 by
default, with a tolerance matched to it: on Gemma-3-270M activations the decision scores stay within
3e-4 of the largest score of an all-float64 fit, with no sign changes in 129,200 scores (the same as
float64 Newton iterations on the same float32 data); `dtype=float64` gives the exact optimum (tests
compare it with scikit-learn run to tol=1e-10). Linear solves use Cholesky only (batched LU in some CPU
builds of torch fails on well-posed systems).

`fit_predict(X, y, train, C)` is the entry point of both solvers: X [n, layers, d] activations, one
row of labels and one training mask per problem; it returns the decision score of every row for every
problem and layer, so held-out rows give out-of-fold scores and other languages give transfer scores.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from babelprobe.errors import BabelprobeError

SOLVERS = ("torch", "sklearn")


# ------------------------------------------------------------------------------------------ devices

def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """`None`/"auto": CUDA when available, else CPU."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except RuntimeError as err:
        raise BabelprobeError(f"unknown --device {device!r}; use cpu, cuda or cuda:N") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BabelprobeError("--device cuda was asked for but torch sees no CUDA GPU; use --device cpu")
    return device


def default_dtype(device: torch.device) -> torch.dtype:
    """float32 on any device: decision scores within ~3e-4 (relative) of an all-float64 fit (tests check
    1e-4 on small problems), at about half the memory traffic of float64."""
    return torch.float32


def default_tol(dtype: torch.dtype) -> float:
    """Stop when the Newton decrement gᵀH⁻¹g (≈ 2 × (objective − optimum)) falls below tol × C × m, or when
    it is already small and stops shrinking (round-off floor); the last Newton step is still taken.
    Newton converges quadratically, so after that step the decrement is about its square: ~1e-16 × C × m
    for float64 data, ~1e-12 × C × m for float32 data (whose own rounding moves the optimum more)."""
    return 1e-8 if dtype == torch.float64 else 1e-6


def _converged(decrement: torch.Tensor, previous: torch.Tensor, scale: torch.Tensor, tol: float) -> torch.Tensor:
    """Per problem: whether its Newton decrement is below tolerance, or small and no longer shrinking."""
    small = decrement <= tol * scale
    nearly = decrement <= (1e-3 * tol) ** 0.5 * scale  # e.g. 3e-6 × C·m in float64
    stalled = nearly & (decrement >= 0.5 * previous)
    return small | stalled


def _keep(mask: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rows of each tensor where `mask` holds: the problems still being solved."""
    return tuple(x[mask] for x in tensors)


# --------------------------------------------------------------------------------- the Newton solver

def fit_logistic(Z: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, C: torch.Tensor, *,
                 max_iter: int = 100, tol: float | None = None, formulation: str = "auto"):
    """Fit a batch of L2 logistic regressions with Newton's method (scikit-learn's objective).

    Parameters
    ----------
    Z : [B, m, d] standardised training features (padding rows may hold anything; they get weight 0).
    y : [B, m] labels in {0, 1}.
    weight : [B, m] 1 for a training row, 0 for padding.
    C : [B] inverse regularisation strength (scikit-learn's `C`).
    max_iter : Newton iterations at most (it usually needs 5–15).
    tol : convergence threshold on the Newton decrement relative to C × m (default by dtype).
    formulation : "dual" (m × m systems, for m < d), "primal" ((d+1) × (d+1) systems) or "auto".

    Returns
    -------
    coef : [B, d] weights on the standardised features; intercept : [B]; n_iter : int.
    """
    tol = default_tol(Z.dtype) if tol is None else tol
    C, y, weight = C.to(Z.dtype), y.to(Z.dtype), weight.to(Z.dtype)
    if _formulation(formulation, *Z.shape[1:]) == "primal":
        return newton_primal(Z, y, weight, C, max_iter, tol)
    a, intercept, n_iter = newton_dual(Z @ Z.mT, y, weight, C, max_iter, tol)
    return (a[:, None, :] @ Z)[:, 0], intercept, n_iter


def _formulation(formulation: str, m: int, d: int) -> str:
    if formulation == "auto":
        return "dual" if m < d else "primal"
    if formulation not in ("dual", "primal"):
        raise ValueError(f"unknown formulation {formulation!r}; use auto, dual or primal")
    return formulation


def _loss_terms(f: torch.Tensor, y: torch.Tensor, s: torch.Tensor, C: torch.Tensor):
    """Residual r = ∂loss/∂f, curvature D = ∂²loss/∂f² of C·Σ s·logloss(y, f), per row.

    The curvature of saturated rows is floored at 1e-10: it changes the Hessian negligibly (not the
    gradient, so not the optimum) and keeps subnormal numbers, which are very slow on CPUs, out."""
    p = torch.sigmoid(f)
    r = C[:, None] * s * (p - y)
    D = C[:, None] * s * (p * (1 - p)).clamp_min(1e-10)
    return r, D


LONG_STEPS = (1.0, 1.5, 2.0, 3.0)


def _line_search(f, df, y, s, C, reg0, reg1, reg2, slope, steps=12):
    """The step length t per problem: the best of the full Newton step and a few longer ones when the
    full step is acceptable (Armijo), else backtracking over t = ½, ¼, ...

    Far from the optimum the Newton steps of a logistic loss fall short (the curvature shrinks as the
    margins grow), so a longer step often lowers the objective more and saves an iteration; near the
    optimum t = 1 is the best and quadratic convergence is kept. Only the loss along f − t·df is
    evaluated, which is cheap next to a Newton solve.

    The objective along the step is C·Σ s·logloss(y, f − t·df) + ½(reg0 − 2t·reg1 + t²·reg2); `slope`
    is the Newton decrement gᵀΔ (≥ 0)."""
    t = torch.tensor(LONG_STEPS, dtype=f.dtype, device=f.device)
    ok, obj = _armijo(f, df, y, s, C, reg0, reg1, reg2, slope, t)
    if bool(ok[0].all()):
        return t[torch.where(ok, obj, torch.inf).argmin(0)]
    t = 0.5 ** torch.arange(steps, dtype=f.dtype, device=f.device)  # [T]
    ok, obj = _armijo(f, df, y, s, C, reg0, reg1, reg2, slope, t)
    # the largest step that decreases enough; near the optimum round-off can refuse all: take the best
    first_ok = torch.where(ok.any(0), ok.float().argmax(0), obj.argmin(0))
    return t[first_ok]


def _armijo(f, df, y, s, C, reg0, reg1, reg2, slope, t):
    """For steps t [T]: whether each problem's objective decreases enough (Armijo), and the objective."""
    ft = f[None] - t[:, None, None] * df[None]  # [T, B, m]
    loss = (C[None, :, None] * s[None] * (torch.nn.functional.softplus(ft) - y[None] * ft)).sum(-1)
    obj = loss + 0.5 * (reg0[None] - 2 * t[:, None] * reg1[None] + t[:, None] ** 2 * reg2[None])
    obj0 = (C[:, None] * s * (torch.nn.functional.softplus(f) - y * f)).sum(-1) + 0.5 * reg0
    return obj <= obj0[None] - 1e-4 * t[:, None] * slope[None], obj


def newton_dual(K, y, s, C, max_iter, tol):
    """Newton in the row space: w = Zᵀa and f = Ka + b with the kernel K = ZZᵀ [B, m, m]; returns
    (a [B, m], b [B], n_iter). Exact, and cheap when m < d.

    Rows with weight s = 0 (padding) keep a = 0, so they never influence the fit. The Newton system
    (I + Zᵀ D Z) Δw = Zᵀu is solved through (I + DK)⁻¹ = I − Q(I + QKQ)⁻¹QK with Q = D^½ (symmetric
    positive definite, so Cholesky), and the unpenalised intercept through its Schur complement.

    A problem leaves the batch as soon as it has converged (after its last, full Newton step, which
    squares the remaining error), so stragglers do not make the others factorise again."""
    B, m = y.shape
    a_out, b_out = torch.zeros_like(y), torch.zeros(B, dtype=K.dtype, device=K.device)
    index = torch.arange(B, device=K.device)  # which problems are still in the batch
    a = torch.zeros_like(y)
    Ka = torch.zeros_like(y)  # K @ a, kept up to date instead of recomputed
    b = torch.zeros(B, dtype=K.dtype, device=K.device)
    scale = C * s.sum(1)
    previous = torch.full_like(scale, torch.inf)
    n_iter = 0
    for n_iter in range(1, max_iter + 1):  # noqa: B007 (returned after the loop)
        f = Ka + b[:, None]
        r, D = _loss_terms(f, y, s, C)
        u = r + a  # the gradient in w is Zᵀu; in b it is Σr
        Q = D.sqrt()
        M = (Q[:, :, None] * K).mul_(Q[:, None, :])  # QKQ in two passes, one allocation
        M.diagonal(dim1=-2, dim2=-1).add_(1)
        chol, _ = torch.linalg.cholesky_ex(M)
        rhs = torch.stack([u, D], -1)  # both right-hand sides at once
        # K is symmetric: rhsᵀK is the fast way round for batched products with few columns
        z = torch.cholesky_solve(Q[..., None] * (rhs.mT @ K).mT, chol)
        sol = rhs - Q[..., None] * z
        Su, SD = sol[..., 0], sol[..., 1]
        db = (Su.sum(1) - a.sum(1)) / SD.sum(1).clamp_min(torch.finfo(K.dtype).tiny)
        da = Su - SD * db[:, None]
        Kda = (da[:, None, :] @ K)[:, 0]
        decrement = (u * Kda).sum(1) + r.sum(1) * db
        done = _converged(decrement, previous, scale, tol)
        if bool(done.any()):
            a_out[index[done]], b_out[index[done]] = (a - da)[done], (b - db)[done]
            if bool(done.all()):
                return a_out, b_out, n_iter
            index, K, y, s, C, scale, a, Ka, b, f, da, Kda, db, decrement = _keep(
                ~done, index, K, y, s, C, scale, a, Ka, b, f, da, Kda, db, decrement)
        previous = decrement
        t = _line_search(f, Kda + db[:, None], y, s, C, (a * Ka).sum(1), (a * Kda).sum(1), (da * Kda).sum(1),
                         decrement)
        a = a - t[:, None] * da
        Ka = Ka - t[:, None] * Kda
        b = b - t * db
    a_out[index], b_out[index] = a, b  # max_iter reached
    return a_out, b_out, n_iter


def newton_primal(Z, y, s, C, max_iter, tol):
    """Newton on (w, b) directly: a (d+1) × (d+1) Cholesky solve per problem (for m ≥ d); returns
    (w [B, d], b [B], n_iter). Padding rows (s = 0) contribute nothing. Converged problems leave the
    batch, as in `newton_dual`."""
    B, m, d = Z.shape
    Za = torch.cat([Z, s[..., None]], -1)  # the intercept column (0 on padding rows)
    penalty = torch.ones(d + 1, dtype=Z.dtype, device=Z.device)
    penalty[-1] = 0
    w = torch.zeros(B, d + 1, dtype=Z.dtype, device=Z.device)
    w_out = torch.zeros_like(w)
    index = torch.arange(B, device=Z.device)
    scale = C * s.sum(1)
    previous = torch.full_like(scale, torch.inf)
    n_iter = 0
    for n_iter in range(1, max_iter + 1):  # noqa: B007 (returned after the loop)
        f = (Za @ w[..., None])[..., 0]
        r, D = _loss_terms(f, y, s, C)
        g = (Za.mT @ r[..., None])[..., 0] + penalty * w
        H = Za.mT @ (D[..., None] * Za) + torch.diag(penalty)
        chol, info = torch.linalg.cholesky_ex(H)
        if bool((info > 0).any()):  # only when every row is saturated: a tiny ridge on b keeps it solvable
            H = H + torch.diag(1e-12 * (1 - penalty) * H.diagonal(dim1=-2, dim2=-1).amax(-1, keepdim=True)[0])
            chol, _ = torch.linalg.cholesky_ex(H)
        step = torch.cholesky_solve(g[..., None], chol)[..., 0]
        decrement = (g * step).sum(1)
        done = _converged(decrement, previous, scale, tol)
        if bool(done.any()):
            w_out[index[done]] = (w - step)[done]
            if bool(done.all()):
                break
            index, Za, y, s, C, scale, w, f, step, decrement = _keep(
                ~done, index, Za, y, s, C, scale, w, f, step, decrement)
        previous = decrement
        wd, sd = w[:, :d], step[:, :d]
        t = _line_search(f, (Za @ step[..., None])[..., 0], y, s, C, (wd * wd).sum(1), (wd * sd).sum(1),
                         (sd * sd).sum(1), decrement)
        w = w - t[:, None] * step
    else:
        w_out[index] = w  # max_iter reached
    return w_out[:, :d], w_out[:, d], n_iter


# ------------------------------------------------------------------------------ batched fit + predict

def _as_problem_C(C, P: int, L: int) -> np.ndarray:
    """C as a float array [P, L] from a number, a per-problem [P] or a per-problem-and-layer [P, L] array."""
    C = np.asarray(C, dtype=np.float64)
    if C.ndim == 0:
        return np.full((P, L), float(C))
    if C.ndim == 1:
        return np.repeat(C[:, None], L, axis=1)
    return C


def _padded_rows(train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per problem, the indices of its training rows padded to a common length, and a 0/1 weight mask."""
    counts = train.sum(1)
    m = int(counts.max())
    idx = np.zeros((len(train), m), dtype=np.int64)
    weight = np.zeros((len(train), m))
    for p, row in enumerate(train):
        rows = np.flatnonzero(row)
        idx[p, : len(rows)] = rows
        weight[p, : len(rows)] = 1
    return idx, weight


def layer_chunk(n: int, m: int, d: int, P: int, L: int, itemsize: int, memory_gb: float) -> int:
    """How many layers to process at once so that the working set stays under `memory_gb`."""
    side = min(m, d + 1)
    per_layer = P * (3 * m * d + 2 * n * d + 4 * side * side + 16 * m) * itemsize
    return int(max(1, min(L, memory_gb * 2**30 // max(per_layer, 1))))


def fit_predict(X, y: np.ndarray, train: np.ndarray, C=1.0, *, solver: str = "torch", device=None,
                dtype=None, max_iter: int | None = None, tol: float | None = None,
                memory_gb: float = 2.0, n_jobs: int | None = None, formulation: str = "auto") -> np.ndarray:
    """Fit one probe per problem and layer on the problem's training rows; score every row.

    Parameters
    ----------
    X : float array [n, L, d] (numpy or torch): activations of n rows at L layers.
    y : int array [P, n] of labels in {0, 1} (one row per problem: fold, control task, train language).
    train : bool array [P, n]: the training rows of each problem (standardisation and fit use only them).
    C : number, [P] or [P, L] array (scikit-learn's `C`; per problem and layer for nested selection).
    solver : "torch" (batched Newton) or "sklearn" (`StandardScaler` + `LogisticRegression` per problem
        and layer, in parallel over `n_jobs` processes).
    device, dtype : for torch (default: CUDA if available; float32 data, with float64 Newton steps on CPU).
    max_iter : Newton iterations (torch, default 100) or lbfgs iterations (sklearn, default 1000).
    tol : torch: Newton-decrement tolerance (default by dtype); sklearn: `LogisticRegression(tol=...)`
        (default scikit-learn's 1e-4, at which lbfgs can stop visibly short of the optimum).
    memory_gb : working-memory budget of the torch solver; layers are processed in chunks to fit it.

    Returns
    -------
    scores : float64 array [P, L, n]: decision function (z·w + b) of every row; > 0 predicts label 1.
        A problem whose training rows all carry one label gets the constant score ±1 (that label).
    """
    y = np.asarray(y)
    train = np.asarray(train, dtype=bool)
    n, L, d = X.shape
    Cs = _as_problem_C(C, len(y), L)
    if not train.any(1).all():
        raise ValueError("every problem needs at least one training row")
    # a problem whose training rows all have one label has no finite optimum: it is the constant
    # classifier of that label (score ±1 everywhere), and stays out of the solver
    positives = (y * train).sum(1)
    single = (positives == 0) | (positives == train.sum(1))
    if single.any():
        out = np.empty((len(y), L, n))
        out[single] = np.where(positives[single] > 0, 1.0, -1.0)[:, None, None]
        if (~single).any():
            out[~single] = fit_predict(X, y[~single], train[~single], Cs[~single], solver=solver, device=device,
                                       dtype=dtype, max_iter=max_iter, tol=tol, memory_gb=memory_gb, n_jobs=n_jobs,
                                       formulation=formulation)
        return out
    if solver == "sklearn":
        return _fit_predict_sklearn(np.asarray(X), y, train, Cs, max_iter=max_iter or 1000, tol=tol or 1e-4,
                                    n_jobs=n_jobs)
    if solver != "torch":
        raise ValueError(f"unknown solver {solver!r}; use one of {SOLVERS}")
    device = resolve_device(device)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or default_dtype(device))
    P = len(y)
    idx, weight = _padded_rows(train)
    m = idx.shape[1]
    formulation = _formulation(formulation, m, d)
    idx_t = torch.as_tensor(idx, device=device)
    w = torch.as_tensor(weight, dtype=dtype, device=device)
    ytr = torch.as_tensor(np.take_along_axis(y, idx, 1), dtype=dtype, device=device)
    share = torch.as_tensor(train / train.sum(1, keepdims=True), dtype=dtype, device=device)  # [P, n]
    out = np.empty((P, L, n))
    step = layer_chunk(n, m, d, P, L, torch.finfo(dtype).bits // 8, memory_gb)
    for l0 in range(0, L, step):
        l1 = min(L, l0 + step)
        Lc = l1 - l0
        # batches are layer-major: problem (layer j, problem p) is row j * P + p
        Xc = torch.as_tensor(X[:, l0:l1]).to(device=device, dtype=dtype).transpose(0, 1)  # [Lc, n, d]
        # centre on all rows first: the fits do not depend on it, and it keeps the expansions below
        # (E[x²] − μ², x·w − μ·w) free of cancellation when activations sit far from 0
        Xc = Xc - Xc.mean(1, keepdim=True)
        mean, scale = _train_moments(Xc, share, train.sum(1))  # [Lc, P, d] each
        inv = 1 / scale
        Z = Xc.index_select(1, idx_t.reshape(-1)).reshape(Lc, P, m, d)  # (faster than Xc[:, idx_t])
        Z = Z.sub_(mean[:, :, None]).mul_(inv[:, :, None]).reshape(Lc * P, m, d)  # standardised training rows
        yb = ytr.repeat(Lc, 1)
        wb = w.repeat(Lc, 1)
        Cb = torch.as_tensor(Cs[:, l0:l1].T.reshape(-1), dtype=dtype, device=device)
        if formulation == "dual":
            a, intercept, _ = newton_dual(Z @ Z.mT, yb, wb, Cb, max_iter or 100,
                                          default_tol(dtype) if tol is None else tol)
            coef = (a[:, None, :] @ Z)[:, 0]  # Zᵀa (a row times Z is fast)
        else:
            coef, intercept, _ = newton_primal(Z, yb, wb, Cb, max_iter or 100,
                                               default_tol(dtype) if tol is None else tol)
        del Z
        coef = coef.reshape(Lc, P, d) * inv  # back to (centred) raw units: x·(w/σ) + (b − μ·w/σ)
        intercept = intercept.reshape(Lc, P) - (mean * coef).sum(-1)
        scores = coef @ Xc.mT + intercept[..., None]  # [Lc, P, n]
        out[:, l0:l1] = scores.double().cpu().numpy().transpose(1, 0, 2)
    return out


def _train_moments(Xc: torch.Tensor, share: torch.Tensor, counts: np.ndarray):
    """Mean and scale [Lc, P, d] of each problem's training rows (`share` [P, n] = mask / count), as
    matrix products; near-constant features get scale 1, with scikit-learn's `StandardScaler` rule."""
    mean = share @ Xc
    var = (share @ (Xc * Xc) - mean * mean).clamp_min(0)
    count = torch.as_tensor(counts, dtype=Xc.dtype, device=Xc.device)[None, :, None]
    eps = torch.finfo(Xc.dtype).eps
    constant = var <= count * eps * var + (count * mean * eps) ** 2
    return mean, torch.where(constant, torch.ones_like(var), var.sqrt())


def _fit_predict_sklearn(X: np.ndarray, y: np.ndarray, train: np.ndarray, Cs: np.ndarray, *, max_iter: int,
                         tol: float, n_jobs: int | None) -> np.ndarray:
    """The reference: a scikit-learn pipeline per problem and layer (in float64, as scikit-learn
    recommends), layers spread over `n_jobs` processes."""
    from joblib import Parallel, delayed

    L = X.shape[1]
    parts = Parallel(n_jobs=n_jobs)(
        delayed(_sklearn_layer)(np.ascontiguousarray(X[:, layer], dtype=np.float64), y, train, Cs[:, layer],
                                max_iter, tol)
        for layer in range(L))
    not_converged = sum(count for _, count in parts)
    if not_converged:
        warnings.warn(f"{not_converged} of {len(y) * L} scikit-learn fits stopped at max_iter={max_iter} before "
                      "converging; raise max_iter", RuntimeWarning, stacklevel=3)
    return np.stack([scores for scores, _ in parts], axis=1)


def _sklearn_layer(X: np.ndarray, y: np.ndarray, train: np.ndarray, Cs: np.ndarray, max_iter: int, tol: float):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    out = np.empty((len(y), len(X)))
    not_converged = 0
    for p in range(len(y)):
        model = make_pipeline(StandardScaler(), LogisticRegression(C=float(Cs[p]), tol=tol, max_iter=max_iter))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(X[train[p]], y[p, train[p]])
        not_converged += int(model[-1].n_iter_[0] >= max_iter)
        out[p] = model.decision_function(X)
    return out, not_converged
