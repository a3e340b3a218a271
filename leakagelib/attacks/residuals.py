"""Element-wise likelihoods of the per-attack gradients, without materialising them all at once.

The Gaussian and cosine likelihoods need only squared norms and inner products,
which :class:`~.per_attack.Simulated` computes from a dense layer's two factors
(``s = Σ_r δ_r a_rᵀ``). The Laplace likelihood of the ℓ1 attack and the pruned
likelihoods of the Bayes paper's Table 2 (a known keep-mask ``m``) need every
entry: ``Σ |g − m ⊙ s|`` or ``Σ (g − m ⊙ s)²``. Materialising ``s`` for every
attack of a batched program, then its residual and the residual's gradient,
streamed hundreds of megabytes per step through memory: on a CIFAR-10 unit of
Table 2 (``bayes-cnn``'s ``fc1`` is 100 × 4,096, so 1.6 MB per attack) an ℓ1
candidate cost about 2.3 times a Gaussian one, a pruned-Laplace candidate 4.6
times (one thread, 2026-11-28). :func:`residual_sums` instead builds ``s`` for
a few attacks at a time, small enough to stay in the caches, and its backward
pass builds it again rather than keeping it: the gradients with respect to the
factors are ``∂/∂δ_r = a_r Dᵀ`` and ``∂/∂a_r = D δ_r`` with ``D`` the
residual's derivative, so nothing of the size of ``s`` outlives a chunk.
``tests/test_per_attack.py`` checks values and gradients against the
materialised form. Used by :class:`~.likelihoods.Laplace` and
:class:`~.likelihoods.Pruned`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from .per_attack import Observed, Simulated

__all__ = ["CHUNK_BYTES", "residual_sums"]

#: Bytes of simulated gradient built at once (a chunk of attacks): a few times a core's L2.
CHUNK_BYTES = 4 * 2**20


def _phi(r: Tensor, power: int) -> Tensor:
    return r.abs() if power == 1 else r.square()


def _dphi(r: Tensor, power: int) -> Tensor:
    return r.sign() if power == 1 else 2.0 * r


class _FactoredResiduals(torch.autograd.Function):
    """``Σ φ(g_n − m ⊙ δᵀa)`` for attacks ``A × rows × out`` (δ) and ``A × rows × in`` (a), the
    attack's observed update ``g[n]`` chosen by ``which`` (``A`` indices), in chunks."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        d: Tensor,
        a: Tensor,
        g: Tensor,
        which: Tensor,
        mask: Tensor | None,
        power: int,
    ) -> Tensor:
        ctx.save_for_backward(d, a, g, which, mask)
        ctx.power = power
        out = d.new_empty(d.shape[0])
        for lo, hi in _chunks(d.shape[0], g[0].numel() * d.element_size()):
            r = _residual(d[lo:hi], a[lo:hi], g, which[lo:hi], mask)
            out[lo:hi] = _phi(r, power).sum((-1, -2))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        d, a, g, which, mask = ctx.saved_tensors
        grad_d, grad_a = torch.empty_like(d), torch.empty_like(a)
        for lo, hi in _chunks(d.shape[0], g[0].numel() * d.element_size()):
            r = _residual(d[lo:hi], a[lo:hi], g, which[lo:hi], mask)
            # s enters with the sign −1 (r = g − m ⊙ s): ∂/∂s = −m ⊙ φ'(r) · grad
            ds = _dphi(r, ctx.power).mul_(-grad[lo:hi, None, None])
            if mask is not None:
                ds.mul_(mask)
            grad_d[lo:hi] = a[lo:hi] @ ds.transpose(-1, -2)
            grad_a[lo:hi] = d[lo:hi] @ ds
        return grad_d, grad_a, None, None, None, None


def _chunks(total: int, bytes_per_attack: int) -> list[tuple[int, int]]:
    """Bounds of consecutive chunks of ``total`` attacks, :data:`CHUNK_BYTES` of ``s`` each."""
    step = max(1, CHUNK_BYTES // max(1, bytes_per_attack))
    return [(lo, min(total, lo + step)) for lo in range(0, total, step)]


def _residual(d: Tensor, a: Tensor, g: Tensor, which: Tensor, mask: Tensor | None) -> Tensor:
    """``g[which] − m ⊙ δᵀa`` for a chunk of attacks (``chunk × out × in``)."""
    s = d.transpose(-1, -2) @ a
    if mask is not None:
        s = s * mask
    return g.index_select(0, which) - s


def residual_sums(
    simulated: Simulated, name: str, observed: Observed, power: int, mask: Tensor | None = None
) -> Tensor:
    """``Σ |g − m ⊙ s|`` (``power`` 1) or ``Σ (g − m ⊙ s)²`` (``power`` 2) over parameter
    ``name`` for every attack (``H × N × M``), ``m`` the keep-mask (``None``: all entries)."""
    if power not in (1, 2):
        raise ValueError(f"power must be 1 or 2, got {power}")
    g = observed.update[name]
    if name in simulated.dense:
        s = simulated.dense[name]
        s = s if mask is None else s * mask
        return _phi(g[None, :, None] - s, power).flatten(3).sum(3)
    d, a = simulated.factors[name]
    H, N, M = d.shape[:3]
    which = torch.arange(N, device=d.device)[None, :, None].expand(H, N, M).reshape(-1)
    flat = _FactoredResiduals.apply(
        d.reshape(H * N * M, *d.shape[3:]),
        a.reshape(H * N * M, *a.shape[3:]),
        g,
        which,
        mask,
        power,
    )
    return flat.reshape(H, N, M)
