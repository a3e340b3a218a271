"""Least squares for R-GAP's per-layer systems, exploiting their structure.

Algorithm 1 of Zhu & Blaschko (2021) takes ``x = A⁺ b`` with A = [W; K] (the
authors' code calls a dense ``np.linalg.lstsq``, minutes per image on two
cores). With exact gradients the system is consistent, so *any* subset of
constraints of full column rank gives the same x; the routes, fastest first:

* **per-channel gradient solve** — K = I_C ⊗ B (see
  :func:`~leakagelib.rgap.constraints.gradient_block`); when B has full column
  rank, every input channel is ``B⁺ g_c``: one small dense (H·W)×(H·W) system
  with C right-hand sides;
* **weight-only solve** — when W alone has full column rank (tall first
  layers), the sparse normal equations WᵀW x = Wᵀz factor with little fill
  (local stencils), in tens of milliseconds;
* **projected solve** — otherwise, satisfy K exactly per channel and fit W in
  the null space of B (:func:`projected_solve`), a small dense problem whose
  rank is the layer's exact rank;
* **stacked solve** — all constraints, rows scaled to unit norm, sparse normal
  equations (SuperLU). A singular system (a rank-deficient layer) is solved
  with a vanishing Tikhonov term, which tends to the pseudo-inverse solution.

The stacked solve (or its dense ``np.linalg.lstsq`` variant, the reference)
is also what noisy updates want: it averages over every constraint.
:func:`solve_layer` takes the fastest route for one layer (what
:func:`~leakagelib.rgap.recursive.rgap` calls) and :func:`exact_rank` gives a
layer's rank and condition number. The benchmark ``benchmarks/rgap_speed.py`` times them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from .constraints import LayerConstraints, gradient_block, gradient_rhs

__all__ = [
    "SOLVERS",
    "Solution",
    "exact_rank",
    "least_squares",
    "GradientSplit",
    "gram_lstsq",
    "projected_solve",
    "solve_layer",
    "split_gradient",
    "weight_only_solve",
]

#: A factor pivot (or eigenvalue of a Gram matrix) below this fraction of the
#: largest counts as zero: cond(A) up to about 3e6 is treated as full rank.
GRAM_RTOL = 1e-13

#: Relative Tikhonov term used for singular (rank-deficient) stacked systems.
RIDGE = 1e-12


@dataclass
class Solution:
    """A least-squares solution with how it was found."""

    x: np.ndarray
    solver: str
    residual: float = float("nan")  # ‖Ax − b‖ / ‖b‖ over the layer's full system
    rank: int | None = None
    condition: float | None = None


def _factor(gram: sp.spmatrix) -> spla.SuperLU | None:
    """Sparse LU of a symmetric positive (semi-)definite Gram matrix, None if singular."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", spla.MatrixRankWarning)
            lu = spla.splu(gram.tocsc(), permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0)
    except (RuntimeError, spla.MatrixRankWarning):
        return None
    pivots = np.abs(lu.U.diagonal())
    if pivots.size == 0 or pivots.min() <= GRAM_RTOL * pivots.max():
        return None
    return lu


@dataclass
class GradientSplit:
    """What the gradient constraints K = I_C ⊗ B fix, and what they leave free.

    ``particular`` (H·W × C) solves every channel's ``B x_c = g_c`` in the
    least-squares sense, orthogonal to the null space of B, and ``null`` (H·W ×
    n₀) spans that null space: every solution is ``particular + null @ α``.
    """

    particular: np.ndarray
    null: np.ndarray
    rank: int


def split_gradient(block: sp.csr_matrix, rhs: np.ndarray) -> GradientSplit:
    """Eigen-decompose BᵀB once and solve all channels (``rhs``: rows × C)."""
    gram = (block.T @ block).toarray()
    vals, vecs = np.linalg.eigh(gram)
    keep = vals > GRAM_RTOL * max(float(vals[-1]), 0.0) if vals.size else vals > 0
    v = vecs[:, keep]
    particular = v @ ((v.T @ (block.T @ rhs)) / vals[keep][:, None])
    return GradientSplit(particular, vecs[:, ~keep], int(keep.sum()))


def gram_lstsq(m: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, int]:
    """Minimum-norm least squares of a dense tall ``m`` through its Gram matrix; and its rank.

    A Cholesky factor of mᵀm when its pivots show full rank; otherwise one
    symmetric eigen-decomposition (BLAS-3 throughout, several times faster than
    pivoted QR or SVD on a shared CPU). Eigenvalues below λ_max · n · ε count as
    zero, i.e. singular values below σ_max·√(n·ε) ≈ 1e-7·σ_max.
    """
    gram = m.T @ m
    rhs_n = m.T @ rhs
    tol = max(m.shape) * np.finfo(np.float64).eps
    try:  # full rank, the common case: a Cholesky factor is ~10x cheaper than eigh
        factor = scipy.linalg.cho_factor(gram, check_finite=False)
        pivots = np.diag(factor[0]) ** 2
        if pivots.min() > tol * pivots.max():
            return scipy.linalg.cho_solve(factor, rhs_n, check_finite=False), m.shape[1]
    except np.linalg.LinAlgError:
        pass
    vals, vecs = np.linalg.eigh(gram)
    if vals.size == 0 or vals[-1] <= 0:
        return np.zeros(m.shape[1]), 0
    keep = vals > vals[-1] * tol
    v = vecs[:, keep]
    return v @ ((v.T @ rhs_n) / vals[keep]), int(keep.sum())


def projected_solve(
    weight: sp.csr_matrix, z: np.ndarray, split: GradientSplit, channels: int
) -> tuple[np.ndarray, int]:
    """Satisfy the gradient constraints exactly and the weight constraints in the
    least-squares sense within their null space; also return rank([W; K]).

    x = x_p + (I_C ⊗ N) α with α = (W (I_C ⊗ N))⁺ (z − W x_p); the stacked
    system's rank is C·rank(B) + rank(W (I_C ⊗ N)).
    """
    x_p = split.particular.T.ravel()
    hw, n0 = split.null.shape
    if n0 == 0:
        return x_p, channels * split.rank
    wn = np.hstack([weight[:, c * hw : (c + 1) * hw] @ split.null for c in range(channels)])
    alpha, rank_wn = gram_lstsq(wn, z - weight @ x_p)
    x = x_p + (alpha.reshape(channels, n0) @ split.null.T).ravel()
    return x, channels * split.rank + int(rank_wn)


def weight_only_solve(weight: sp.csr_matrix, z: np.ndarray) -> np.ndarray | None:
    """The solution of ``W x = z`` when W alone has full column rank, else None."""
    if weight.shape[0] < weight.shape[1]:
        return None
    lu = _factor(weight.T @ weight)
    return None if lu is None else lu.solve(weight.T @ z)


def _unit_rows(a: sp.csr_matrix, b: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
    norms = np.sqrt(np.asarray(a.multiply(a).sum(axis=1)).ravel())
    scale = np.where(norms > 0, 1.0 / np.where(norms > 0, norms, 1.0), 0.0)
    return sp.diags(scale) @ a, scale * b


def least_squares(a: sp.csr_matrix, b: np.ndarray, *, dense: bool = False) -> Solution:
    """The least-squares solution of the stacked system ``a x = b`` (see module doc).

    Rows are scaled to unit norm first, so weight and gradient constraints,
    whose magnitudes differ by orders, count alike.
    """
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"A has {a.shape[0]} rows but b has {b.shape[0]} entries")
    a, b = _unit_rows(sp.csr_matrix(a), np.asarray(b, dtype=np.float64))
    if dense:
        return Solution(np.linalg.lstsq(a.toarray(), b, rcond=None)[0], "dense")
    gram = (a.T @ a).tocsc()
    rhs = a.T @ b
    lu = _factor(gram)
    if lu is not None:
        return Solution(lu.solve(rhs), "stacked")
    scale = float(gram.diagonal().max()) if gram.shape[0] else 1.0
    ridge = gram + RIDGE * scale * sp.identity(gram.shape[0], format="csc")
    lu = spla.splu(ridge, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0)
    return Solution(lu.solve(rhs), "stacked-ridge")


#: Largest condition number the sparse route of :func:`exact_rank` reports by
#: itself; beyond it (cond² near 1/ε) the dense eigen-decomposition decides.
SPARSE_COND_MAX = 1e5


#: Gram matrices with more than this fraction of non-zeros are factored densely.
DENSE_FRACTION = 0.05


def _sparse_extremes(gram: sp.csc_matrix) -> tuple[float, float] | None:
    """(λ_min, λ_max) of a sparse SPD Gram matrix via Lanczos, None if it is not factorable.

    λ_max by ``eigsh`` on the Gram matrix, λ_min as 1 / λ_max of its inverse
    applied through a factor (shift-invert at 0): a sparse LU, or a dense
    Cholesky factor when the Gram matrix is mostly filled — a quarter of the
    flops of the tridiagonalisation behind a dense ``eigvalsh``. Lanczos starts
    from a seeded vector, so the result is the same in every run.
    """
    n = gram.shape[0]
    if n < 3:
        return None
    if gram.nnz > DENSE_FRACTION * n * n:  # a convolution's K rows span whole channels
        dense = gram.toarray()
        try:
            factor = scipy.linalg.cho_factor(dense, check_finite=False)
        except np.linalg.LinAlgError:
            return None
        op: sp.spmatrix | np.ndarray = dense

        def solve(v: np.ndarray) -> np.ndarray:
            return scipy.linalg.cho_solve(factor, v, check_finite=False)

    else:
        lu = _factor(gram)
        if lu is None:
            return None
        op, solve = gram, lu.solve
    # a fixed start vector: ARPACK's default is random, which made the condition
    # numbers differ between runs in the last digits
    v0 = np.random.default_rng(0).standard_normal(n)
    try:
        lmax = float(spla.eigsh(op, k=1, which="LA", v0=v0, return_eigenvectors=False)[0])
        inv = spla.LinearOperator((n, n), matvec=solve, dtype=np.float64)
        inv_max = float(spla.eigsh(inv, k=1, which="LA", v0=v0, return_eigenvectors=False)[0])
    except spla.ArpackError:
        return None
    if not (lmax > 0 and inv_max > 0):
        return None
    return 1.0 / inv_max, lmax


def exact_rank(a: sp.spmatrix | np.ndarray) -> tuple[int, float]:
    """Numerical rank and condition number (σ_max over the smallest kept σ) of ``a``.

    The singular values come from the eigenvalues of the n×n Gram matrix aᵀa
    (much cheaper than an SVD of a tall a on a shared CPU); they resolve σ down
    to about σ_max·√(n·ε) ≈ 1e-7·σ_max, which bounds the condition numbers
    this reports. A full-rank, well-conditioned a (cond below
    ``SPARSE_COND_MAX``, the common case) is settled from the Gram matrix's
    two extreme eigenvalues by sparse Lanczos; otherwise all eigenvalues are
    computed densely. Used for R-GAP's per-layer diagnostics (Table 2 of the paper).
    """
    a = sp.csr_matrix(a) if not sp.issparse(a) else a.tocsr()
    if a.shape[0] == 0 or a.shape[1] == 0:
        return 0, float("inf")
    gram = (a.T @ a).tocsc()
    tol = max(a.shape) * np.finfo(np.float64).eps
    extremes = _sparse_extremes(gram)
    if extremes is not None:
        lmin, lmax = extremes
        if lmin > tol * lmax and lmax / lmin < SPARSE_COND_MAX**2:
            return a.shape[1], float(np.sqrt(lmax / lmin))
    eig = np.linalg.eigvalsh(gram.toarray())
    if eig[-1] <= 0:
        return 0, float("inf")
    keep = eig > eig[-1] * tol
    return int(keep.sum()), float(np.sqrt(eig[-1] / eig[keep][0]))


#: The per-layer solvers :func:`solve_layer` (and :func:`~leakagelib.rgap.recursive.rgap`) take.
SOLVERS = ("auto", "stacked", "dense")

#: Largest number of free directions (C_in × dim null(B)) for which the projected
#: dense solve is used; beyond it the sparse stacked solve is cheaper.
PROJECTED_MAX_FREE = 4000


def solve_layer(system: LayerConstraints, k: np.ndarray, solver: str) -> Solution:
    """Solve one layer's constraints (k: the layer's output gradient) by the fastest exact route.

    ``solver`` "auto" tries the routes of the module docstring, fastest first;
    "stacked" and "dense" solve the whole stacked system (:func:`least_squares`).
    The solution carries the relative residual of the layer's full system.
    """
    geom = system.geometry
    if solver == "auto":
        block = gradient_block(geom, k)
        hw = geom.height * geom.width
        split = None
        if block.shape[0] >= hw:  # B can have full column rank only if it is tall
            split = split_gradient(block, gradient_rhs(geom, system.grad))
        # B (hence K) of full column rank, or W of full column rank (a
        # non-singular factor), certifies that the layer is full rank
        if split is not None and split.null.shape[1] == 0:
            sol = Solution(split.particular.T.ravel(), "per-channel", rank=geom.n_in)
            return _finish(system, sol)
        x = weight_only_solve(system.weight, system.z)
        if x is not None:
            return _finish(system, Solution(x, "weight-only", rank=geom.n_in))
        if split is None and geom.in_channels * (hw - block.shape[0]) <= PROJECTED_MAX_FREE:
            split = split_gradient(block, gradient_rhs(geom, system.grad))
        if split is not None and geom.in_channels * split.null.shape[1] <= PROJECTED_MAX_FREE:
            x, rank = projected_solve(system.weight, system.z, split, geom.in_channels)
            return _finish(system, Solution(x, "projected", rank=rank))
        sol = least_squares(system.matrix, system.rhs)
    else:
        sol = least_squares(system.matrix, system.rhs, dense=solver == "dense")
    return _finish(system, sol)


def _finish(system: LayerConstraints, sol: Solution) -> Solution:
    """``sol`` with the relative residual of the layer's full stacked system attached."""
    a, b = system.matrix, system.rhs
    sol.residual = float(np.linalg.norm(a @ sol.x - b) / max(np.linalg.norm(b), 1e-300))
    return sol
