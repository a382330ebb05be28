"""Second-order information shared by the probes of a layer: one factorisation of the layer's
standardised Gram matrix, used as the preconditioner of every problem fitted on that layer's activations
(the folds, the all-rows probe, the control tasks), and a cheap estimate of how ill-conditioned the
activations are, which decides whether the factorisation is worth its cost.

Why: real activations are ill-conditioned. Standardised last-token states of Gemma-3-270M have a
covariance spectrum that falls as a power law (slope ≈ −1.5 over the first 300 eigenvalues, condition
5.7e4–3.3e6 by layer), so a first-order solver needs hundreds of iterations (scikit-learn's lbfgs: ~600
at 4000 × 2048 with that spectrum, tol 1e-4). The Hessian of the L2 logistic objective
C·Σ logloss + ½‖w‖² on standardised features Z is I + C·Zᵀ diag(p(1−p)) Z ≤ I + (C/4)·ZᵀZ, its value at
w = 0; with that bound as preconditioner M, L-BFGS run in the coordinates u = Lᵀw (M = LLᵀ) needs ~15–30
iterations on such data (LIBLINEAR's TRON preconditions its Newton-CG with a diagonal of the same
matrix; here the whole matrix is affordable because it is built once per layer and shared).

Shared: every problem of a layer standardises the same rows X (its own training rows, its own mean and
scale), so ZₚᵀZₚ ≈ mₚ · Rₚ G Rₚ, with G the correlation matrix of all n rows (unit diagonal) and
Rₚ = diag(σ_all / σₚ) the ratio of the standardisations. One Gram XᵀX (n·d² multiply-adds) and one
Cholesky factorisation LLᵀ = I + a·G (d³/3) per layer and distinct C serve all problems: problem p uses
Mₚ = Rₚ L Lᵀ Rₚ with a = C·m̄/4 (m̄ the mean training count; the folds' 0.8·n and the all-rows n differ
by 25%, which a preconditioner tolerates). The intercept is preconditioned by its own curvature at
w = 0, C·mₚ/4 (the standardised features are centred on the training rows, so it decouples there).

Conditioning estimate (`conditioning`): the spread of G's eigenvalues, mean(λ²)/mean(λ)², relative to
isotropic activations of the same shape, from one product each way with X and 8 random vectors (no d × d
matrix). Isotropic activations measure ~1, a power law of slope −1.5 ~30–90 at d = 640–1024, spectra
log-spaced over 6 decades ~6. The preconditioner's n·d² is recovered only on spread spectra: on
isotropic ones the same Gram saves half of L-BFGS's iterations but costs more than that (measured: CPU
time 0.32 against 0.19 s at 1000 × 1024, 10.6 against 8.6 s at 8000 × 4096, 2 layers, 6 problems).

Precision: the Gram is formed in the working dtype (float32 by default); the factorisation is retried in
float64, with a growing ridge if need be (a preconditioner may be perturbed; the objective is not), when
the float32 one fails, as it can once a·λ₁ approaches 1/ε.
"""

from __future__ import annotations

import torch

KAPPA_MIN = 3.0  # precondition when `conditioning` is at least this (see choose_method)
CURVATURE = 0.0625  # p(1 − p) the preconditioner assumes (the Hessian at w = 0 has 0.25; see below)


def inverse_scale(var: torch.Tensor) -> torch.Tensor:
    """1/σ from variances [..., d]; 1 for (near-)constant features, whose variance is round-off."""
    eps = torch.finfo(var.dtype).eps
    constant = var <= eps * var.amax(-1, keepdim=True).clamp_min(torch.finfo(var.dtype).tiny)
    return torch.where(constant, torch.ones_like(var), var.rsqrt())


def conditioning(Xc: torch.Tensor, block: int = 8, seed: int = 0) -> torch.Tensor:
    """How ill-conditioned each layer's standardised activations are, cheaply: [Lc].

    The spread of the eigenvalues λ of the correlation matrix G = D Xcᵀ Xc D / n (D = 1/σ),
    mean(λ²) / mean(λ)², divided by its value for isotropic activations of the same shape, 1 + d/n
    (Marchenko–Pastur): about 1 for isotropic activations, ≫ 1 when a few directions carry most of the
    variance, as in real activations (a power law of slope −1.5 at d = 1024: ~90) — the spectra on which
    L-BFGS needs hundreds of iterations. mean(λ²) = tr(G²)/d comes from Hutchinson's estimator, E‖Gv‖²
    = tr(G²) for Gaussian v, with `block` vectors: one product each way with X, no d × d matrix. At most
    max(1024, d) rows are used (evenly spaced), which keeps the cost a few percent of a solve.

    Xc [Lc, n, d] are the layers' activations centred on their mean."""
    Lc, n, d = Xc.shape
    rows = max(1024, d)
    X = Xc if n <= rows else Xc[:, torch.linspace(0, n - 1, rows, device=Xc.device).long()]
    X = X - X.mean(1, keepdim=True)
    var = X.square().mean(1)  # [Lc, d]
    inv = inverse_scale(var)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    V = torch.randn(Lc, d, block, generator=generator, dtype=Xc.dtype).to(Xc.device)
    GV = inv[..., None] * (X.mT @ (X @ (inv[..., None] * V))) / X.shape[1]
    mean = (var * inv.square()).sum(-1) / d  # tr(G)/d: 1, less the constant features
    mean_square = GV.square().sum(1).mean(-1) / d
    return mean_square / mean.square().clamp_min(torch.finfo(Xc.dtype).tiny) / (1 + d / X.shape[1])


def gram(X: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """XᵀX [d, d] of X [n, d], computing only the blocks on and below the diagonal (the rest mirrored):
    ~60% of a full product's flops once d spans several blocks."""
    d = X.shape[-1]
    if d <= block:
        return X.mT @ X
    G = torch.empty(d, d, dtype=X.dtype, device=X.device)
    starts = list(range(0, d, block))
    for i in starts:
        rows = X[:, i:i + block].mT
        G[i:i + block, : i + block] = rows @ X[:, : i + block]
        G[: i, i:i + block] = G[i:i + block, : i].mT
    return G


def cholesky(A: torch.Tensor, leaf: int = 128) -> tuple[torch.Tensor, bool]:
    """The lower Cholesky factor of the SPD matrices A [..., d, d], and whether it succeeded.

    Recursive 2 × 2 blocking (factor, triangular solve, symmetric update, factor), so that most of the
    work is matrix products: on a CPU core ~2.5x faster than LAPACK's potrf through torch at d = 1024–2048
    (measured: 10 against 25 ms, 52 against 126 ms); on CUDA it is the same few large kernels."""
    d = A.shape[-1]
    if d <= leaf:
        L, info = torch.linalg.cholesky_ex(A)
        return L, not bool((info > 0).any())
    h = d // 2
    L11, ok = cholesky(A[..., :h, :h], leaf)
    if not ok:
        return L11, False
    L21 = torch.linalg.solve_triangular(L11, A[..., h:, :h].mT, upper=False).mT
    L22, ok = cholesky(torch.baddbmm(A[..., h:, h:], L21, L21.mT, alpha=-1) if A.ndim == 3 else
                       A[..., h:, h:] - L21 @ L21.mT, leaf)
    if not ok:
        return L22, False
    L = torch.zeros_like(A)
    L[..., :h, :h], L[..., h:, :h], L[..., h:, h:] = L11, L21, L22
    return L, True


class GramPreconditioner:
    """The preconditioner of every problem of a chunk's layers, from one factorisation per layer (and
    distinct C). Vectors are [Lc, P, d + 1] in the problems' standardised coordinates, intercept last.

    `white(g)` maps a gradient to the whitened coordinates u = LᵀRw (g_u = L⁻¹R⁻¹g), `unwhite(v)` a
    direction back (R⁻¹L⁻ᵀv): L-BFGS run on (white(g), unwhite(direction)) is L-BFGS preconditioned by
    M = RLLᵀR, with its own (s, y) history kept in the whitened coordinates."""

    def __init__(self, Xc: torch.Tensor, scale: torch.Tensor, C: torch.Tensor, counts: torch.Tensor):
        """Xc [Lc, n, d] centred activations; scale [Lc, P, d] each problem's standardisation; C [Lc, P];
        counts [P] training rows per problem."""
        Lc, n, d = Xc.shape
        self.R = torch.empty_like(scale)
        self.intercept = (C * counts * CURVATURE).sqrt()  # [Lc, P]: the intercept's curvature at w = 0, square-rooted
        self.factors, self.classes = [], []  # per layer: the Cholesky factors [K, d, d] and each problem's class
        self.ridge = 0.0  # the largest ridge a factorisation needed (0: none)
        for j in range(Lc):
            G = gram(Xc[j])
            inv_all = inverse_scale(G.diagonal() / n)
            G.mul_(inv_all[:, None]).mul_(inv_all[None, :] / n)  # the correlation matrix, in place
            self.R[j] = (scale[j] * inv_all).reciprocal().clamp(0.25, 4.0)  # σ_all/σₚ, kept near 1
            values, index = torch.unique(C[j], return_inverse=True)
            a = torch.stack([C[j, index == k].mean() * counts[index == k].to(C.dtype).mean() * CURVATURE
                             for k in range(len(values))])
            self.factors.append(self._factor(G, a))
            self.classes.append(index)
            del G

    def _factor(self, G: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Cholesky factors of I + a_k·G for each a_k: [K, d, d] in G's dtype (G is overwritten)."""
        A = G.mul_(a[0])[None] if len(a) == 1 else a[:, None, None] * G
        A.diagonal(dim1=-2, dim2=-1).add_(1)
        L, ok = cholesky(A)
        if ok:
            return L
        A = A.double()  # float32 rounding made it indefinite: again in float64, with a ridge if need be
        ridge = 0.0
        for _ in range(12):
            L, ok = cholesky(A + ridge * torch.eye(A.shape[-1], dtype=A.dtype, device=A.device))
            if ok:
                self.ridge = max(self.ridge, ridge)
                return L.to(G.dtype)
            ridge = max(10 * ridge, 1e-7 * float(a.max()))
        raise RuntimeError("the Gram preconditioner could not be factorised")  # not reached for finite data

    def white(self, g: torch.Tensor) -> torch.Tensor:
        d = g.shape[-1] - 1
        out = torch.empty_like(g)
        out[..., d] = g[..., d] / self.intercept
        self._solve(g[..., :d] / self.R, out[..., :d], transpose=False)
        return out

    def unwhite(self, v: torch.Tensor) -> torch.Tensor:
        d = v.shape[-1] - 1
        out = torch.empty_like(v)
        out[..., d] = v[..., d] / self.intercept
        self._solve(v[..., :d], out[..., :d], transpose=True)
        out[..., :d] /= self.R
        return out

    def _solve(self, B: torch.Tensor, out: torch.Tensor, transpose: bool) -> None:
        """out[j, p] = L⁻¹B[j, p] (or L⁻ᵀ) with the factor of problem p's class at layer j."""
        for j, (L, index) in enumerate(zip(self.factors, self.classes, strict=True)):
            for k in range(len(L)):
                cols = slice(None) if len(L) == 1 else index == k
                factor = L[k].mT if transpose else L[k]
                out[j, cols] = torch.linalg.solve_triangular(factor, B[j, cols].mT, upper=transpose).mT

    @staticmethod
    def bytes_per_layer(d: int, itemsize: int, classes: int = 1) -> int:
        """Working memory for one layer: the Gram, its factors, and a float64 transient of one factorisation."""
        return (1 + classes) * d * d * itemsize + 2 * d * d * 8
