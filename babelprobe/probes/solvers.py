"""Logistic-regression probes: batched torch solvers that fit many problems (folds × controls × layers)
at once, and scikit-learn's `LogisticRegression` as the reference.

All solve scikit-learn's L2 problem on features standardised with the mean and standard deviation of
the training rows only (like `StandardScaler` fitted on the training fold):

    minimise over w, b:   C · Σ_i logloss(y_i, z_i·w + b)  +  ½‖w‖²        (the intercept b is not penalised)

(scikit-learn's lbfgs minimises the same function divided by C·m: the same optimum.) Two torch methods:

**"newton"**: Newton's method with a backtracking line search, run on a whole batch of problems in
lock-step. It picks the cheaper exact formulation per batch: when a problem has fewer training rows
m than features d (640 dims, ~100 rows per fold here) it works in the m-dimensional row space
(w = Zᵀa, so every Newton step is an m × m Cholesky solve on the kernel K = ZZᵀ); otherwise it solves
the (d+1) × (d+1) primal Newton system. Both give the same optimum, which scikit-learn's lbfgs
approaches to its tolerance (its default tol=1e-4 stops visibly short of it). Problems leave the batch
as they converge, and a step longer than Newton's is taken when it lowers the objective more: together
~5 factorisations per problem instead of ~7. Everything is float32 by default, with a tolerance matched
to it: on Gemma-3-270M activations the decision scores stay within 3e-4 of the largest score of an
all-float64 fit, with no sign changes in 129,200 scores (the same as float64 Newton iterations on the
same float32 data); `dtype=float64` gives the exact optimum (tests compare it with scikit-learn run to
tol=1e-10). Linear solves use Cholesky only (batched LU in some CPU builds of torch fails on well-posed
systems). Its cost grows as min(m, d)³ per step and its memory as min(m, d)² per problem.

**"lbfgs"**: L-BFGS (10 pairs of history, like scikit-learn's) whose iterations cost O(n·d) per layer
and no [m, m] or [d, d] matrix: the problems of a layer share the layer's activations X and use their
standardised features only through products, Z·v = X(v/σ) − μ·(v/σ) and Zᵀr = (Xᵀr − μ·Σr)/σ, so one
iteration is two passes over X for all of the layer's problems together (one skinny matrix product
each way). The step length is the minimum of the objective along the direction, found by a few 1-D
Newton steps on the cached Z·direction (no further pass). It stops with scikit-learn's own criterion:
the largest gradient component of the mean objective below `tol`.

**"plbfgs"**: the same L-BFGS preconditioned by second-order information that the layer's problems
share (`babelprobe.probes.precondition`): one Gram matrix XᵀX per layer (n·d² multiply-adds) and one
Cholesky factorisation of I + c·C·m·G (G the correlation matrix of all rows; d³/3) serve every problem
of the layer, each through the ratio of its standardisation to the all-rows one; the two-loop recursion
runs in the whitened coordinates, so an iteration costs two triangular solves more than L-BFGS's. Real
activations are ill-conditioned (standardised Gemma-3-270M states: a power-law spectrum, condition
5.7e4–3.3e6), and there L-BFGS needs hundreds of iterations (scikit-learn's: ~800 at 4000 × 2048 with
that spectrum, tol 1e-4) where the preconditioned one needs ~20.

On a CPU with several torch threads, all split a chunk's layers between threads of one core each (like
the groups of a sweep side by side).

`solver="torch"` chooses (`choose_method`) by size, memory and conditioning: exact Newton while
min(m, d + 1) ≤ `exact_max` (768 on a CPU, 2048 on an accelerator) and one layer of its systems fits in `memory_gb`; otherwise "plbfgs"
when one layer's d × d factors fit in `memory_gb` and the activations measure as ill-conditioned
(`precondition.conditioning` of the first chunk's layers, median ≥ 3: isotropic activations measure ~1,
Gemma-3-270M's 14–440, a −1.5 power law 55–240), plain L-BFGS else (there the Gram's cost is not
recovered: measured CPU time 0.32 against 0.19 s at 1000 × 1024, 10.6 against 8.6 s at 8000 × 4096, 2
layers × 6 problems). Measured on one CPU core (5 folds + the all-rows probe, m the all-rows count): on
synthetic planted-signal data L-BFGS needs ~50–130 iterations and overtakes exact Newton from
min(m, d + 1) ≈ 500; on Gemma-3-270M activations (640 dims) it needs ~120–190 and exact Newton stays 2–3×
faster even at m = 544 and m = 5440 (primal (d+1)-sized systems). Newton is hopeless once both m and d
reach thousands (minutes per layer at 4000 × 2048).

`fit_predict(X, y, train, C)` is the entry point of every solver: X [n, layers, d] activations, one
row of labels and one training mask per problem; it returns the decision score of every row for every
problem and layer, so held-out rows give out-of-fold scores and other languages give transfer scores,
and with `return_fit=True` also the probes themselves (`LinearFit`: weights in raw activation units,
intercept, standardisation, the method and each problem's iteration count).
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.models import reads_are_free
from babelprobe.probes.precondition import KAPPA_MIN, GramPreconditioner, conditioning

SOLVERS = ("torch", "newton", "lbfgs", "plbfgs", "sklearn")  # "torch": chosen by size, memory, conditioning
EXACT_MAX = 768  # solver="torch" uses exact Newton while min(m, d + 1) is at most this on a CPU (see above)
# ... and on an accelerator, where a pass's launches and reads back cost more than its arithmetic: a
# quarter-XCOMPS group (1,796 items × 4096 dims, 5 folds + the all-rows probe, 8 layers of a random-weight
# Llama's states, /tmp script) took exact Newton 6 iterations, 1,902 operators and 32 reads back, plbfgs 58-63
# iterations, 57,232 operators and 707 reads, for the same CPU time (20 s on one core). Newton's dual systems at
# m = 2048 (m²·d to form, m³/3 per iteration) are ~10 TFLOP for such a group's 33 layers: a fraction of a
# second on an H100; above it (m > d: primal (d+1)² systems, m·d² each) L-BFGS needs few iterations anyway.
ACCELERATOR_EXACT_MAX = 2048


def default_exact_max(device: torch.device) -> int:
    """`exact_max` when none is given: EXACT_MAX on a CPU, ACCELERATOR_EXACT_MAX elsewhere."""
    return EXACT_MAX if device.type == "cpu" else ACCELERATOR_EXACT_MAX
LBFGS_MEMORY = 10  # (s, y) pairs kept, as scikit-learn's lbfgs (scipy's maxcor)


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


def _finished_first(done: torch.Tensor) -> tuple[int, torch.Tensor | None]:
    """How many problems are done (the iteration's one read back) and, if any, every problem's place, the done ones
    first, each part in its order: integer indices, where each boolean index would read the flags back again."""
    n_done = int(done.sum())
    return n_done, torch.argsort((~done).to(torch.uint8), stable=True) if n_done else None


def _keep(rows: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rows `rows` of each tensor: the problems still being solved."""
    return tuple(x[rows] for x in tensors)


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
    long = torch.tensor(LONG_STEPS, dtype=f.dtype, device=f.device)
    long_ok, long_obj = _armijo(f, df, y, s, C, reg0, reg1, reg2, slope, long)
    every_full, free = long_ok[0].all(), reads_are_free(f.device)

    def longer():  # the full step or a longer one, whichever lowers the objective most
        return long[torch.where(long_ok, long_obj, torch.inf).argmin(0)]

    if free and bool(every_full):
        return longer()
    # elsewhere the backtracking steps are evaluated whatever the flag, and chosen on the device (no read back)
    t = 0.5 ** torch.arange(steps, dtype=f.dtype, device=f.device)  # [T]
    ok, obj = _armijo(f, df, y, s, C, reg0, reg1, reg2, slope, t)
    # the largest step that decreases enough; near the optimum round-off can refuse all: take the best
    shorter = t[torch.where(ok.any(0), ok.float().argmax(0), obj.argmin(0))]
    if free:
        return shorter
    return torch.where(every_full, longer(), shorter)


def _armijo(f, df, y, s, C, reg0, reg1, reg2, slope, t):
    """For steps t [T]: whether each problem's objective decreases enough (Armijo), and the objective."""
    ft = f[None] - t[:, None, None] * df[None]  # [T, B, m]
    loss = (C[None, :, None] * s[None] * (torch.nn.functional.softplus(ft) - y[None] * ft)).sum(-1)
    obj = loss + 0.5 * (reg0[None] - 2 * t[:, None] * reg1[None] + t[:, None] ** 2 * reg2[None])
    obj0 = (C[:, None] * s * (torch.nn.functional.softplus(f) - y * f)).sum(-1) + 0.5 * reg0
    return obj <= obj0[None] - 1e-4 * t[:, None] * slope[None], obj


def newton_dual(K, y, s, C, max_iter, tol, iterations: torch.Tensor | None = None):
    """Newton in the row space: w = Zᵀa and f = Ka + b with the kernel K = ZZᵀ [B, m, m]; returns
    (a [B, m], b [B], n_iter). Exact, and cheap when m < d.

    Rows with weight s = 0 (padding) keep a = 0, so they never influence the fit. The Newton system
    (I + Zᵀ D Z) Δw = Zᵀu is solved through (I + DK)⁻¹ = I − Q(I + QKQ)⁻¹QK with Q = D^½ (symmetric
    positive definite, so Cholesky), and the unpenalised intercept through its Schur complement.

    A problem leaves the batch as soon as it has converged (after its last, full Newton step, which
    squares the remaining error), so stragglers do not make the others factorise again. `iterations`
    [B] (optional) receives each problem's own count of Newton iterations."""
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
        n_done, order = _finished_first(_converged(decrement, previous, scale, tol))
        if n_done:
            done = order[:n_done]
            a_out[index[done]], b_out[index[done]] = (a - da)[done], (b - db)[done]
            if iterations is not None:
                iterations[index[done]] = n_iter
            if n_done == len(order):
                return a_out, b_out, n_iter
            index, K, y, s, C, scale, a, Ka, b, f, da, Kda, db, decrement = _keep(
                order[n_done:], index, K, y, s, C, scale, a, Ka, b, f, da, Kda, db, decrement)
        previous = decrement
        t = _line_search(f, Kda + db[:, None], y, s, C, (a * Ka).sum(1), (a * Kda).sum(1), (da * Kda).sum(1),
                         decrement)
        a = a - t[:, None] * da
        Ka = Ka - t[:, None] * Kda
        b = b - t * db
    a_out[index], b_out[index] = a, b  # max_iter reached
    if iterations is not None:
        iterations[index] = n_iter
    return a_out, b_out, n_iter


def newton_primal(Z, y, s, C, max_iter, tol, iterations: torch.Tensor | None = None):
    """Newton on (w, b) directly: a (d+1) × (d+1) Cholesky solve per problem (for m ≥ d); returns
    (w [B, d], b [B], n_iter). Padding rows (s = 0) contribute nothing. Converged problems leave the
    batch, as in `newton_dual` (`iterations` likewise)."""
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
        n_done, order = _finished_first(_converged(decrement, previous, scale, tol))
        if n_done:
            done = order[:n_done]
            w_out[index[done]] = (w - step)[done]
            if iterations is not None:
                iterations[index[done]] = n_iter
            if n_done == len(order):
                break
            index, Za, y, s, C, scale, w, f, step, decrement = _keep(
                order[n_done:], index, Za, y, s, C, scale, w, f, step, decrement)
        previous = decrement
        wd, sd = w[:, :d], step[:, :d]
        t = _line_search(f, (Za @ step[..., None])[..., 0], y, s, C, (wd * wd).sum(1), (wd * sd).sum(1),
                         (sd * sd).sum(1), decrement)
        w = w - t[:, None] * step
    else:
        w_out[index] = w  # max_iter reached
        if iterations is not None:
            iterations[index] = n_iter
    return w_out[:, :d], w_out[:, d], n_iter


# ------------------------------------------------------------------ L-BFGS on activations shared by layer

class SharedFeatures:
    """The standardised training features Z = (X − μ)/σ of every problem, used through products only.

    X [Lc, n, d]: the (centred) activations of all n rows at Lc layers, shared by the P problems of each
    layer; mean, scale [Lc, P, d]: each problem's standardisation. Vectors in the standardised space
    carry the intercept as their last coordinate ([Lc, P, d+1]); row vectors are [Lc, P, n], over all n
    rows (the training masks weight them). `active` [Lc, P] (a bool array on the host) says which
    problems are still being solved: only their columns enter the products (the others come back as
    zeros), so problems that converged early, e.g. the folds before the all-rows probe, cost nothing more.
    """

    def __init__(self, X: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor):
        self.X, self.mean, self.inv = X, mean, 1 / scale
        self.d = X.shape[-1]

    def forward(self, V: torch.Tensor, active: np.ndarray) -> torch.Tensor:
        """Z·v + b for every problem: [Lc, P, d+1] -> [Lc, P, n]."""
        u = V[..., : self.d] * self.inv  # the weights in (centred) raw units
        out = torch.zeros(*V.shape[:2], self.X.shape[1], dtype=V.dtype, device=V.device)
        for j, cols in _active_columns(active, V.device):
            out[j, cols] = (self.X[j] @ u[j, cols].T).T  # [n, d] @ [d, P]: the fast way round for few columns
        return out - (u * self.mean).sum(-1, keepdim=True) + V[..., self.d:]

    def backward(self, R: torch.Tensor, active: np.ndarray) -> torch.Tensor:
        """(Zᵀr, Σr) for every problem: [Lc, P, n] -> [Lc, P, d+1]."""
        total = R.sum(-1, keepdim=True)
        XtR = torch.zeros(*R.shape[:2], self.d, dtype=R.dtype, device=R.device)
        for j, cols in _active_columns(active, R.device):
            XtR[j, cols] = R[j, cols] @ self.X[j]
        return torch.cat([(XtR - self.mean * total) * self.inv, total], -1)


def _active_columns(active: np.ndarray, device: torch.device):
    """(layer, columns) for each layer with a problem still being solved: a slice when all are, else indices."""
    for j, row in enumerate(active):
        if row.all():
            yield j, slice(None)
        elif row.any():
            yield j, torch.as_tensor(np.flatnonzero(row), device=device)


def lbfgs(Z: SharedFeatures, y: torch.Tensor, s: torch.Tensor, C: torch.Tensor, *, tol: float,
          max_iter: int, memory: int = LBFGS_MEMORY, precondition: GramPreconditioner | None = None):
    """Batched L-BFGS on scikit-learn's L2 logistic problem, every problem of every layer in lock-step.

    Parameters
    ----------
    Z : the problems' standardised features (`SharedFeatures`).
    y, s : [P, n] labels in {0, 1} and training weights (1 train, 0 not), the same at every layer.
    C : [Lc, P] scikit-learn's C per layer and problem.
    tol : scikit-learn's `tol`: stop when max |gradient| of the mean objective (the objective / (C·m))
        is at most tol, i.e. max |g| ≤ tol·C·m here.
    max_iter : iterations at most; problems still above tol then are reported (RuntimeWarning).
    precondition : a `GramPreconditioner` of these layers and problems, or None. With it, the two-loop
        recursion and its (s, y) history work in the whitened coordinates u = LᵀRw (gradients through
        `white`, directions back through `unwhite`), i.e. the initial inverse Hessian is M⁻¹ instead of
        γ·I; the line search and the stopping test stay in the problems' own coordinates.

    Returns
    -------
    W : [Lc, P, d+1] weights on the standardised features, intercept last; n_iter : int (the batch's);
    iterations : int64 [Lc, P], the iterations each problem was still being solved.
    """
    Lc, P = C.shape
    d, n = Z.d, y.shape[-1]
    white = precondition.white if precondition is not None else (lambda v: v)
    unwhite = precondition.unwhite if precondition is not None else (lambda v: v)
    penalty = torch.ones(d + 1, dtype=y.dtype, device=y.device)
    penalty[-1] = 0  # the intercept is not penalised
    W = torch.zeros(Lc, P, d + 1, dtype=y.dtype, device=y.device)
    f = torch.zeros(Lc, P, n, dtype=y.dtype, device=y.device)  # Z·w + b, kept up to date
    Cs = C[..., None] * s  # [Lc, P, n]: each row's weight in the loss
    history_s = torch.zeros(memory, Lc, P, d + 1, dtype=y.dtype, device=y.device)
    history_y, rho = torch.zeros_like(history_s), torch.zeros(memory, Lc, P, dtype=y.dtype, device=y.device)
    gamma = torch.ones(Lc, P, dtype=y.dtype, device=y.device)  # scale of the initial inverse Hessian
    threshold = tol * C * s.sum(-1)
    g = Z.backward(Cs * (torch.sigmoid(f) - y), np.ones((Lc, P), dtype=bool))
    gu = white(g)  # the gradient in the coordinates the history lives in
    active = torch.ones(Lc, P, dtype=torch.bool, device=y.device)
    iterations = torch.zeros(Lc, P, dtype=torch.int64, device=y.device)
    n_iter = 0
    for n_iter in range(max_iter):  # noqa: B007 (returned after the loop)
        active &= g.abs().amax(-1) > threshold
        on_host = active.cpu().numpy()
        if not on_host.any():
            break
        iterations += active
        if n_iter == 0 and precondition is None:
            gamma = 1 / g.norm(dim=-1).clamp_min(torch.finfo(y.dtype).tiny)  # a first step of unit length
        on = active.to(y.dtype)
        pu = _two_loop(gu, history_s, history_y, rho, gamma, n_iter, memory) * -on[..., None]
        p = unwhite(pu)
        q = Z.forward(p, on_host)
        t = _line_minimum(f, q, y, Cs, (penalty * W * p).sum(-1), (penalty * p * p).sum(-1)) * on
        W = W + t[..., None] * p
        f = f + t[..., None] * q
        g_new = Z.backward(Cs * (torch.sigmoid(f) - y), on_host) + penalty * W
        g_new = torch.where(active[..., None], g_new, g)
        gu_new = torch.where(active[..., None], white(g_new), gu)
        step, change = t[..., None] * pu, gu_new - gu
        sy, yy = (step * change).sum(-1), (change * change).sum(-1)
        good = active & (sy > 1e-10 * yy) & (yy > 0)  # curvature pairs that keep the update positive definite
        slot = n_iter % memory
        history_s[slot], history_y[slot] = step * good[..., None], change * good[..., None]
        rho[slot] = torch.where(good, 1 / torch.where(good, sy, 1), 0)
        gamma = torch.where(good, sy / torch.where(good, yy, 1), gamma)
        g, gu = g_new, gu_new
    else:
        stuck = int((g.abs().amax(-1) > threshold).sum())
        if stuck:
            warnings.warn(f"{stuck} of {Lc * P} lbfgs probes stopped at max_iter={max_iter} before reaching "
                          f"tol={tol}; raise max_iter", RuntimeWarning, stacklevel=3)
    return W, n_iter, iterations


def _two_loop(g, history_s, history_y, rho, gamma, n_iter, memory):
    """H·g with L-BFGS's inverse-Hessian estimate H (the two-loop recursion), per problem."""
    q = g.clone()
    order = [(n_iter - 1 - k) % memory for k in range(min(n_iter, memory))]  # newest first
    alphas = []
    for i in order:
        a = rho[i] * (history_s[i] * q).sum(-1)
        q -= a[..., None] * history_y[i]
        alphas.append(a)
    q *= gamma[..., None]
    for i, a in zip(reversed(order), reversed(alphas), strict=True):
        b = rho[i] * (history_y[i] * q).sum(-1)
        q += (a - b)[..., None] * history_s[i]
    return q


# `_line_minimum` on an accelerator reads back whether all have stopped after this many steps only: in L-BFGS
# sweeps of synthetic groups (600-1,000 pairs, 5 folds, /tmp script) 45% of the searches had settled by step 3 and
# most of the rest were still moving at step 10, the last
LINE_CHECK_AT = 3


def _line_minimum(f, q, y, Cs, wp, pp, steps: int = 10):
    """Per problem, t ≥ 0 minimising φ(t) = Σ Cs·logloss(y, f + t·q) + ½‖w + t·p‖² (penalised part),
    given q = Z·p, wp = w·p and pp = p·p: safeguarded 1-D Newton (φ is convex; φ'(0) < 0 for a descent
    direction), starting from L-BFGS's natural step t = 1, bracketing the minimum and bisecting when a
    Newton step leaves the bracket; at most `steps` steps. A problem's t stops moving once its step is
    below round-off (near the optimum after 2–3 steps), and the search ends when all have stopped, so
    each problem's t does not depend on the others in the batch. Costs O(n) per step, no pass over the
    features."""
    t = torch.ones_like(wp)
    low, high = torch.zeros_like(wp), torch.full_like(wp, torch.inf)
    tiny = torch.finfo(wp.dtype).tiny
    settled = 1e3 * torch.finfo(wp.dtype).eps
    moving = torch.ones_like(wp, dtype=torch.bool)
    Cq, Cq2 = Cs * q, Cs * q * q  # the loss terms' weights along the line, computed once
    # whether all have stopped is read back after every step on a CPU, elsewhere once, after LINE_CHECK_AT steps
    # (a settled t no longer changes: the steps after it change nothing but the time)
    free = reads_are_free(wp.device)
    for k in range(1, steps + 1):
        prob = torch.sigmoid(f + t[..., None] * q)
        slope = ((prob - y) * Cq).sum(-1) + wp + t * pp
        curve = (prob * (1 - prob) * Cq2).sum(-1) + pp
        high = torch.where(slope > 0, t, high)
        low = torch.where(slope <= 0, t, low)
        newton = t - slope / curve.clamp_min(tiny)
        inside = (newton > low) & (newton < high)
        fallback = torch.where(torch.isinf(high), 4 * t, (low + high) / 2)  # grow, or bisect the bracket
        step = torch.where(inside, newton, fallback) - t
        t = torch.where(moving, t + step, t)
        moving &= step.abs() > settled * t
        if (free or k == LINE_CHECK_AT) and not bool(moving.any()):
            break
    return t


# ------------------------------------------------------------------------------ batched fit + predict

@dataclass
class LinearFit:
    """Fitted probes in raw activation units, one per problem and layer: score(x) = x·coef + intercept.

    coef [P, L, d], intercept [P, L]: the probe applied to raw activations (the standardisation folded
    in: coef = w/σ, intercept = b − μ·coef for the weights w, b on standardised features); mean, scale
    [P, L, d]: that standardisation (the training rows' mean and `StandardScaler` scale). A problem whose
    training rows carry one label is the constant classifier: coef 0, intercept ±1, mean and scale NaN.
    `method` says which solver fitted it ("newton", "lbfgs", "plbfgs" or "sklearn"); `n_iter` [P, L]
    how many iterations each problem took (Newton iterations, L-BFGS iterations or scikit-learn's
    `n_iter_`; 0 for constant problems); `info` what the choice was based on ("conditioning": the
    estimate of each layer's, see `babelprobe.probes.precondition.conditioning`; NaN where not made)."""

    coef: np.ndarray
    intercept: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    method: str
    n_iter: np.ndarray | None = None
    info: dict = field(default_factory=dict)


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


def exact_bytes_per_layer(n: int, m: int, d: int, P: int, itemsize: int) -> int:
    """Working memory of exact Newton for one layer of P problems: the standardised rows, the m × m or
    (d+1) × (d+1) systems and their factors, the centred activations."""
    side = min(m, d + 1)
    return P * (3 * m * d + 4 * side * side + 16 * m) * itemsize + 2 * n * d * itemsize


def lbfgs_bytes_per_layer(n: int, d: int, P: int, itemsize: int, memory: int = LBFGS_MEMORY) -> int:
    """Working memory of L-BFGS for one layer of P problems: the centred activations, the history and
    the per-row vectors (no matrix beyond the activations themselves)."""
    return (n * d + P * (2 * memory + 12) * (d + 1) + 24 * P * n) * itemsize


def plbfgs_bytes_per_layer(n: int, d: int, P: int, itemsize: int, classes: int = 1) -> int:
    """Working memory of preconditioned L-BFGS for one layer: L-BFGS's, plus the layer's Gram matrix and
    its Cholesky factors (one per distinct C), d × d each."""
    return lbfgs_bytes_per_layer(n, d, P, itemsize) + GramPreconditioner.bytes_per_layer(d, itemsize, classes)


def bytes_per_layer(method: str, n: int, m: int, d: int, P: int, itemsize: int, classes: int = 1) -> int:
    if method == "newton":
        return exact_bytes_per_layer(n, m, d, P, itemsize)
    if method == "plbfgs":
        return plbfgs_bytes_per_layer(n, d, P, itemsize, classes)
    return lbfgs_bytes_per_layer(n, d, P, itemsize)


def layer_chunk(n: int, m: int, d: int, P: int, L: int, itemsize: int, memory_gb: float,
                method: str = "newton", classes: int = 1) -> int:
    """How many layers to process at once so that the working set stays under `memory_gb` (at least one)."""
    per_layer = bytes_per_layer(method, n, m, d, P, itemsize, classes)
    transient = n * d * itemsize  # one layer at a time while centring and standardising
    return int(max(1, min(L, (memory_gb * 2**30 - transient) // max(per_layer, 1))))


def choose_method(solver: str, n: int, m: int, d: int, P: int, itemsize: int, memory_gb: float,
                  exact_max: int = EXACT_MAX, conditioning: float | None = None, classes: int = 1) -> str:
    """"newton", "lbfgs" or "plbfgs" for the torch solvers: `solver` if it names one, else (solver="torch"):

    - exact Newton while min(m, d + 1) ≤ exact_max and one layer of it fits in `memory_gb` (a few
      factorisations of min(m, d + 1)-sized systems per problem: the cheapest below that size);
    - else L-BFGS preconditioned by the layer's Gram ("plbfgs") when one layer's d × d factors fit in
      `memory_gb` and the activations are ill-conditioned: `conditioning` (the spread of the eigenvalues
      of the layers' correlation matrix relative to isotropic activations', `precondition.conditioning`;
      None = not measured yet, taken as ill-conditioned) at least KAPPA_MIN (3); isotropic activations
      measure ~1, power-law spectra like real activations' 30–90;
    - else plain L-BFGS (well-conditioned activations, where the Gram's n·d² would not be recovered, or
      too little memory for d × d matrices)."""
    exact_fits = exact_bytes_per_layer(n, m, d, P, itemsize) <= memory_gb * 2**30
    if solver == "newton":
        if not exact_fits:
            need = exact_bytes_per_layer(n, m, d, P, itemsize) / 2**30
            raise BabelprobeError(f"--solver newton needs {need:.1f} GB for one layer of {P} problems with {m} training "
                                  f"rows × {d} dims, more than --memory-gb {memory_gb:g}; raise --memory-gb or use "
                                  "--solver lbfgs (or torch, which chooses)")
        return "newton"
    if solver in ("lbfgs", "plbfgs"):
        return solver
    if min(m, d + 1) <= exact_max and exact_fits:
        return "newton"
    gram_fits = plbfgs_bytes_per_layer(n, d, P, itemsize, classes) + n * d * itemsize <= memory_gb * 2**30
    ill = conditioning is None or conditioning >= KAPPA_MIN
    return "plbfgs" if gram_fits and ill else "lbfgs"


def fit_predict(X, y: np.ndarray, train: np.ndarray, C=1.0, *, solver: str = "torch", device=None,
                dtype=None, max_iter: int | None = None, tol: float | None = None,
                memory_gb: float = 2.0, n_jobs: int | None = None, formulation: str = "auto",
                exact_max: int | None = None, return_fit: bool = False):
    """Fit one probe per problem and layer on the problem's training rows; score every row.

    Parameters
    ----------
    X : float array [n, L, d] (numpy or torch): activations of n rows at L layers.
    y : int array [P, n] of labels in {0, 1} (one row per problem: fold, control task, train language).
    train : bool array [P, n]: the training rows of each problem (standardisation and fit use only them).
    C : number, [P] or [P, L] array (scikit-learn's `C`; per problem and layer for nested selection).
    solver : "torch" (batched; exact Newton, L-BFGS or L-BFGS preconditioned by each layer's Gram,
        chosen by size, memory and conditioning: see `choose_method`), "newton", "lbfgs", "plbfgs", or
        "sklearn" (`StandardScaler` + `LogisticRegression` per problem and layer, in parallel over
        `n_jobs` processes).
    device, dtype : for torch (default: CUDA if available; float32).
    max_iter : Newton iterations (newton, default 100) or lbfgs iterations (lbfgs and sklearn, default 1000).
    tol : newton: Newton-decrement tolerance relative to C × m (default by dtype); (p)lbfgs: scikit-learn's
        gradient tolerance (default 1e-6); sklearn: `LogisticRegression(tol=...)` (default scikit-learn's
        1e-4, at which lbfgs can stop visibly short of the optimum).
    memory_gb : working-memory budget of the torch solvers; layers are processed in chunks to fit it.
    exact_max : the size up to which solver="torch" uses exact Newton (min(m, d + 1), m the most training rows;
        default `default_exact_max` of the device).
    return_fit : also return the fitted probes (`LinearFit`).

    Returns
    -------
    scores : float64 array [P, L, n]: decision function (x·w + b) of every row; > 0 predicts label 1.
        A problem whose training rows all carry one label gets the constant score ±1 (that label).
    fit : `LinearFit` (only with return_fit=True).
    """
    y = np.asarray(y)
    train = np.asarray(train, dtype=bool)
    n, L, d = X.shape
    Cs = _as_problem_C(C, len(y), L)
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; use one of {SOLVERS}")
    if not train.any(1).all():
        raise ValueError("every problem needs at least one training row")
    # a problem whose training rows all have one label has no finite optimum: it is the constant
    # classifier of that label (score ±1 everywhere), and stays out of the solver
    positives = (y * train).sum(1)
    single = (positives == 0) | (positives == train.sum(1))
    if single.any():
        constant = np.where(positives[single] > 0, 1.0, -1.0)
        out = np.empty((len(y), L, n))
        out[single] = constant[:, None, None]
        fit = LinearFit(np.zeros((len(y), L, d)), np.zeros((len(y), L)), np.full((len(y), L, d), np.nan),
                        np.full((len(y), L, d), np.nan), "constant", np.zeros((len(y), L), dtype=np.int64))
        fit.intercept[single] = constant[:, None]
        if (~single).any():
            out[~single], rest = fit_predict(X, y[~single], train[~single], Cs[~single], solver=solver, device=device,
                                             dtype=dtype, max_iter=max_iter, tol=tol, memory_gb=memory_gb,
                                             n_jobs=n_jobs, formulation=formulation, exact_max=exact_max,
                                             return_fit=True)
            for name in ("coef", "intercept", "mean", "scale", "n_iter"):
                getattr(fit, name)[~single] = getattr(rest, name)
            fit.method, fit.info = rest.method, rest.info
        return (out, fit) if return_fit else out
    if solver == "sklearn":
        scores, fit = _fit_predict_sklearn(np.asarray(X), y, train, Cs, max_iter=max_iter or 1000, tol=tol or 1e-4,
                                           n_jobs=n_jobs)
    else:
        scores, fit = _fit_predict_torch(X, y, train, Cs, solver=solver, device=device, dtype=dtype,
                                         max_iter=max_iter, tol=tol, memory_gb=memory_gb, formulation=formulation,
                                         exact_max=exact_max, keep_fit=return_fit)
    return (scores, fit) if return_fit else scores


def _fit_predict_torch(X, y, train, Cs, *, solver, device, dtype, max_iter, tol, memory_gb, formulation, exact_max,
                       keep_fit):
    device = resolve_device(device)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or default_dtype(device))
    exact_max = default_exact_max(device) if exact_max is None else exact_max
    n, L, d = X.shape
    P = len(y)
    counts = train.sum(1)
    m = int(counts.max())
    itemsize = torch.finfo(dtype).bits // 8
    classes = max(len(np.unique(Cs[:, layer])) for layer in range(L))  # distinct C per layer: Gram factors
    method = choose_method(solver, n, m, d, P, itemsize, memory_gb, exact_max, classes=classes)
    share = torch.as_tensor(train / counts[:, None], dtype=dtype, device=device)  # [P, n]
    counts_t = torch.as_tensor(counts, dtype=dtype, device=device)
    scores = np.empty((P, L, n))
    n_iter = np.zeros((P, L), dtype=np.int64)
    info = {"conditioning": np.full(L, np.nan)}  # `precondition.conditioning` of each layer, where estimated
    # chunks sized for the method chosen so far ("plbfgs" needs the most of the iterative ones)
    step = layer_chunk(n, m, d, P, L, itemsize, memory_gb, method, classes)
    fit = None  # the fitted probes, kept only when asked for ([P, L, d] arrays)
    if keep_fit:
        fit = LinearFit(np.empty((P, L, d)), np.empty((P, L)), np.empty((P, L, d)), np.empty((P, L, d)), method,
                        n_iter, info)
    for l0 in range(0, L, step):
        l1 = min(L, l0 + step)
        Xc, centre = _centred(X, l0, l1, device, dtype)  # [Lc, n, d], [Lc, d]
        mean, scale = _train_moments(Xc, share, counts)  # [Lc, P, d] each
        C = torch.as_tensor(Cs[:, l0:l1].T, dtype=dtype, device=device)  # [Lc, P]
        if method == "plbfgs" and solver in ("torch", "plbfgs"):
            # how ill-conditioned these layers are; on the first chunk, it decides whether to precondition
            kappa = conditioning(Xc).double().cpu().numpy()
            info["conditioning"][l0:l1] = kappa
            if l0 == 0 and solver == "torch":
                method = choose_method(solver, n, m, d, P, itemsize, memory_gb, exact_max,
                                       conditioning=float(np.median(kappa)), classes=classes)
        if method == "newton":
            solve = partial(_newton_chunk, Xc, mean, scale, y, train, C, max_iter or 100,
                            default_tol(dtype) if tol is None else tol, formulation)
        else:
            solve = partial(_lbfgs_chunk, Xc, mean, scale, y, train, C, counts_t, max_iter or 1000,
                            1e-6 if tol is None else tol, method == "plbfgs")
        coef, intercept, iterations = _by_layer_threads(solve, l1 - l0, device)
        n_iter[:, l0:l1] = iterations.cpu().numpy().T
        # back to raw units: x·(w/σ) + (b − μ·w/σ), with coef = w/σ and x centred
        part = coef @ Xc.mT + intercept[..., None]  # [Lc, P, n]
        scores[:, l0:l1] = part.double().cpu().numpy().transpose(1, 0, 2)
        if keep_fit:  # the probes on raw activations: the centring folded into the intercept and the mean
            used = centre.to(dtype).double()[:, None]  # [Lc, 1, d]: what was subtracted
            fit.coef[:, l0:l1] = _host(coef)
            fit.intercept[:, l0:l1] = _host(intercept.double() - (coef.double() * used).sum(-1))
            fit.mean[:, l0:l1] = _host(mean.double() + used)
            fit.scale[:, l0:l1] = _host(scale)
    if keep_fit:
        fit.method = method
    return scores, fit


def _host(t: torch.Tensor) -> np.ndarray:
    """[Lc, P, ...] on the device -> float64 [P, Lc, ...] in numpy."""
    return t.double().cpu().numpy().swapaxes(0, 1)


def _centred(X, l0: int, l1: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Layers l0..l1 of X as [Lc, n, d] on the device, each centred on the mean of all rows (returned [Lc, d]).

    Fits do not depend on the centring; it keeps the expansions (E[x²] − μ², x·w − μ·w) free of
    cancellation when activations sit far from 0. Built one layer at a time: one copy, no transient."""
    n, _, d = X.shape
    Xc = torch.empty(l1 - l0, n, d, dtype=dtype, device=device)
    centre = torch.empty(l1 - l0, d, dtype=torch.float64, device=device)
    for j in range(l1 - l0):
        layer = torch.as_tensor(X[:, l0 + j]).to(device=device, dtype=dtype)
        centre[j] = layer.double().mean(0)
        torch.sub(layer, centre[j].to(dtype), out=Xc[j])
    return Xc, centre


def _newton_chunk(Xc, mean, scale, y, train, C, max_iter, tol, formulation, at: slice):
    """Exact Newton for every problem of the layers `at` of a chunk: coef [La, P, d] (raw units),
    intercept [La, P], Newton iterations [La, P].

    Problems are batched by training size: a batch pads every problem to its largest m, and the cost
    grows as m³, so e.g. the all-rows probe does not inflate the folds' systems."""
    Xc, mean, scale, C = Xc[at], mean[at], scale[at], C[at]
    Lc, n, d = Xc.shape
    P = len(y)
    coef = torch.empty(Lc, P, d, dtype=Xc.dtype, device=Xc.device)
    intercept = torch.empty(Lc, P, dtype=Xc.dtype, device=Xc.device)
    iterations = torch.zeros(Lc, P, dtype=torch.int64, device=Xc.device)
    for problems in _size_classes(train.sum(1)):
        k = len(problems)
        idx, weight = _padded_rows(train[problems])
        m = idx.shape[1]
        idx_t = torch.as_tensor(idx, device=Xc.device)
        inv = 1 / scale[:, problems]
        Z = Xc.index_select(1, idx_t.reshape(-1)).reshape(Lc, k, m, d)  # (faster than Xc[:, idx_t])
        Z = Z.sub_(mean[:, problems, None]).mul_(inv[:, :, None]).reshape(Lc * k, m, d)  # standardised rows
        # batches are layer-major: problem (layer j, problem p) is row j * k + p
        yb = torch.as_tensor(np.take_along_axis(y[problems], idx, 1), dtype=Xc.dtype, device=Xc.device).repeat(Lc, 1)
        wb = torch.as_tensor(weight, dtype=Xc.dtype, device=Xc.device).repeat(Lc, 1)
        Cb = C[:, problems].reshape(-1)
        counted = torch.zeros(Lc * k, dtype=torch.int64, device=Xc.device)
        if _formulation(formulation, m, d) == "dual":
            a, b, _ = newton_dual(Z @ Z.mT, yb, wb, Cb, max_iter, tol, counted)
            w = (a[:, None, :] @ Z)[:, 0]  # Zᵀa (a row times Z is fast)
        else:
            w, b, _ = newton_primal(Z, yb, wb, Cb, max_iter, tol, counted)
        del Z
        iterations[:, problems] = counted.reshape(Lc, k)
        raw = w.reshape(Lc, k, d) * inv
        coef[:, problems] = raw
        intercept[:, problems] = b.reshape(Lc, k) - (mean[:, problems] * raw).sum(-1)
    return coef, intercept, iterations


def _size_classes(counts: np.ndarray, ratio: float = 1.2) -> list[np.ndarray]:
    """Problem indices grouped so that within a group the largest training set is < ratio × the smallest."""
    order = np.argsort(counts, kind="stable")
    classes, start = [], 0
    for i in range(1, len(order) + 1):
        if i == len(order) or counts[order[i]] >= ratio * counts[order[start]]:
            classes.append(np.sort(order[start:i]))
            start = i
    return classes


def _lbfgs_chunk(Xc, mean, scale, y, train, C, counts, max_iter, tol, precondition: bool, at: slice):
    """L-BFGS for every problem of the layers `at` of a chunk, preconditioned by each layer's Gram when
    `precondition`: coef [La, P, d] (raw units), intercept [La, P], iterations [La, P]."""
    Xc, mean, scale, C = Xc[at], mean[at], scale[at], C[at]
    d = Xc.shape[-1]
    yt = torch.as_tensor(y, dtype=Xc.dtype, device=Xc.device)
    st = torch.as_tensor(train, dtype=Xc.dtype, device=Xc.device)
    shared = GramPreconditioner(Xc, scale, C, counts) if precondition else None
    W, _, iterations = lbfgs(SharedFeatures(Xc, mean, scale), yt, st, C, tol=tol, max_iter=max_iter,
                             precondition=shared)
    coef = W[..., :d] / scale
    return coef, W[..., d] - (mean * coef).sum(-1), iterations


def _by_layer_threads(solve, Lc: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """solve(layers: slice) -> (coef, intercept, iterations) for a chunk's layers. On a CPU with several torch
    threads, the layers are split between that many threads of one core each (like the groups of a sweep):
    the solvers' small factorisations and few-column products do not spread well over cores, and threads
    that wait for each other inside one operation stall on a busy machine."""
    threads = min(torch.get_num_threads(), Lc) if device.type == "cpu" else 1
    if threads == 1:
        return solve(slice(0, Lc))
    bounds = np.linspace(0, Lc, threads + 1).round().astype(int)
    with single_threaded(), ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(solve, [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]))
    return tuple(torch.cat(outputs) for outputs in zip(*parts, strict=True))


@contextmanager
def single_threaded():
    """torch and the BLAS libraries on one thread each (restored afterwards), for work spread over threads."""
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            yield
    finally:
        torch.set_num_threads(threads)


def load_linalg(device: torch.device | None) -> None:
    """torch's linear algebra loaded for `device` from this thread, before threads solve on it: on CUDA the solver
    library loads on first use, and two threads first using it at once fail with "lazy wrapper should be called at
    most once" (pytorch/pytorch#90613; seen on an H200 with torch 2.11 when a sweep's two groups started together)."""
    if device is not None and device.type == "cuda":
        torch.linalg.cholesky_ex(torch.eye(1, device=device))


def _train_moments(Xc: torch.Tensor, share: torch.Tensor, counts: np.ndarray):
    """Mean and scale [Lc, P, d] of each problem's training rows (`share` [P, n] = mask / count), as
    matrix products, a layer at a time (x² is a transient of one layer); near-constant features get
    scale 1, with scikit-learn's `StandardScaler` rule."""
    Lc, _, d = Xc.shape
    mean = torch.empty(Lc, len(share), d, dtype=Xc.dtype, device=Xc.device)
    var = torch.empty_like(mean)
    for j in range(Lc):
        mean[j] = share @ Xc[j]
        var[j] = share @ Xc[j].square()
    var = (var - mean * mean).clamp_min(0)
    count = torch.as_tensor(counts, dtype=Xc.dtype, device=Xc.device)[None, :, None]
    eps = torch.finfo(Xc.dtype).eps
    constant = var <= count * eps * var + (count * mean * eps) ** 2
    return mean, torch.where(constant, torch.ones_like(var), var.sqrt())


def _fit_predict_sklearn(X: np.ndarray, y: np.ndarray, train: np.ndarray, Cs: np.ndarray, *, max_iter: int,
                         tol: float, n_jobs: int | None) -> tuple[np.ndarray, LinearFit]:
    """The reference: a scikit-learn pipeline per problem and layer (in float64, as scikit-learn
    recommends), layers spread over `n_jobs` processes."""
    from joblib import Parallel, delayed

    L = X.shape[1]
    parts = Parallel(n_jobs=n_jobs)(
        delayed(_sklearn_layer)(np.ascontiguousarray(X[:, layer], dtype=np.float64), y, train, Cs[:, layer],
                                max_iter, tol)
        for layer in range(L))
    not_converged = sum(part[-1] for part in parts)
    if not_converged:
        warnings.warn(f"{not_converged} of {len(y) * L} scikit-learn fits stopped at max_iter={max_iter} before "
                      "converging; raise max_iter", RuntimeWarning, stacklevel=3)
    scores, coef, intercept, mean, scale, n_iter = (np.stack([part[i] for part in parts], axis=1) for i in range(6))
    return scores, LinearFit(coef, intercept, mean, scale, "sklearn", n_iter)


def _sklearn_layer(X: np.ndarray, y: np.ndarray, train: np.ndarray, Cs: np.ndarray, max_iter: int, tol: float):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    P, (n, d) = len(y), X.shape
    scores, coef, intercept = np.empty((P, n)), np.empty((P, d)), np.empty(P)
    mean, scale, n_iter = np.empty((P, d)), np.empty((P, d)), np.empty(P, dtype=np.int64)
    not_converged = 0
    for p in range(P):
        model = make_pipeline(StandardScaler(), LogisticRegression(C=float(Cs[p]), tol=tol, max_iter=max_iter))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(X[train[p]], y[p, train[p]])
        n_iter[p] = model[-1].n_iter_[0]
        not_converged += int(n_iter[p] >= max_iter)
        scores[p] = model.decision_function(X)
        scaler, logistic = model
        mean[p], scale[p] = scaler.mean_, scaler.scale_
        coef[p] = logistic.coef_[0] / scaler.scale_
        intercept[p] = logistic.intercept_[0] - scaler.mean_ @ coef[p]
    return scores, coef, intercept, mean, scale, n_iter, not_converged
