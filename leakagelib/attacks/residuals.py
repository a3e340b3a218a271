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
Each chunk's residual is then built in place in ``s``'s buffer, with the
observed update's pruned part summed once per attack run
(:class:`_FactoredResiduals`). On that unit's shapes (120 attacks of 10
victims) a forward and backward pass of the pruned Laplace sum took 196–220 ms
on one thread and 137–139 ms on two, where copying ``g`` for every attack had
taken 341–361 and 213–214; of the pruned Gaussian sum 160–173 and 100–106 ms
against 366–393 and 222 (both versions interleaved in one process, the
paper-scale run paused; 2026-11-28). ``tests/test_per_attack.py`` checks
values and gradients against the materialised form. Used by
:class:`~.likelihoods.Laplace` and :class:`~.likelihoods.Pruned`.

A GPU wants the opposite trade: it pays per kernel launch, not per byte
streamed. Chunks of the CPU's size (two or three attacks) and a Python loop
over the attacks of a chunk launch a few kernels per attack per pass: on a
lent H200 (2026-11-28) the first step-500 CIFAR-10 unit of Table 2 was still
in its search after about five minutes of it, where whole step-0 units had
taken about two minutes on an H100 before this module. So on a GPU a chunk
is :data:`GPU_CHUNK_BYTES` of ``s`` and its observed updates are gathered in
one indexing (:func:`_plan`). ``benchmarks/residuals_speed.py`` times both
plans; on that H200, one pass over the ℓ1 attack's 4,800 grid attacks took
287–371 ms with the CPU's plan and 34–38 ms with the GPU's (the README's
Speed section).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from .per_attack import Observed, Simulated

__all__ = ["CHUNK_BYTES", "GPU_CHUNK_BYTES", "residual_sums"]

#: Bytes of simulated gradient built at once on a CPU (a chunk of attacks): a few times a
#: core's L2.
CHUNK_BYTES = 4 * 2**20
#: Bytes of simulated gradient built at once on a GPU: a few hundred of Table 2's CIFAR-10
#: attacks, so that a pass launches a few kernels per chunk rather than per attack, and a
#: small share of a lent GPU's memory (the chunk's ``s`` and its gathered updates).
GPU_CHUNK_BYTES = 2**30


def _plan(device: torch.device) -> tuple[int, bool]:
    """Bytes of ``s`` per chunk, and whether a chunk gathers its observed updates in one
    indexing (a GPU) rather than adding them attack by attack in place (a CPU, where the
    gathered copy is the cost: see the module docstring)."""
    return (CHUNK_BYTES, False) if device.type == "cpu" else (GPU_CHUNK_BYTES, True)


def _phi(r: Tensor, power: int) -> Tensor:
    return r.abs() if power == 1 else r.square()


class _FactoredResiduals(torch.autograd.Function):
    """``Σ φ(g_n − m ⊙ δᵀa)`` for attacks ``A × rows × out`` (δ) and ``A × rows × in`` (a), the
    attack's observed update ``g[n]`` chosen by ``which`` (``A`` indices), in chunks.

    The sum splits over the mask: on the pruned entries the residual is ``g`` itself, whose
    ``rest[n] = Σ φ((1 − m) ⊙ g_n)`` is computed once per attack run; on the kept ones it is
    ``−t`` with ``t = m ⊙ s − m ⊙ g``, which is 0 on the pruned entries. As φ is even and φ' odd
    with φ'(0) = 0, the sum is ``Σ φ(t) + rest[n]`` and its derivative with respect to ``s`` is
    ``φ'(t)``: no mask or sign left to apply, and each chunk's ``t`` is built in place in the
    buffer of ``s`` (no copy of ``g[which]``), its sum read without writing ``φ(t)``.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        d: Tensor,
        a: Tensor,
        neg_kept: Tensor,
        rest: Tensor,
        which: Tensor,
        mask: Tensor | None,
        power: int,
    ) -> Tensor:
        ctx.save_for_backward(d, a, neg_kept, which, mask)
        ctx.power = power
        out = d.new_empty(d.shape[0])
        for lo, hi, ns in _chunks(which, neg_kept[0].numel() * d.element_size()):
            t = _residual(d[lo:hi], a[lo:hi], neg_kept, ns, mask)
            norms = torch.linalg.vector_norm(t.flatten(1), ord=power, dim=1)
            out[lo:hi] = norms if power == 1 else norms.square()
        return out + rest.index_select(0, which)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        d, a, neg_kept, which, mask = ctx.saved_tensors
        grad_d, grad_a = torch.empty_like(d), torch.empty_like(a)
        scale = grad if ctx.power == 1 else 2.0 * grad  # φ'(t) = sign(t) or 2t
        for lo, hi, ns in _chunks(which, neg_kept[0].numel() * d.element_size()):
            t = _residual(d[lo:hi], a[lo:hi], neg_kept, ns, mask)
            ds = t.sign_() if ctx.power == 1 else t
            torch.matmul(a[lo:hi], ds.transpose(-1, -2), out=grad_d[lo:hi])
            torch.matmul(d[lo:hi], ds, out=grad_a[lo:hi])
        grad_d.mul_(scale[:, None, None])
        grad_a.mul_(scale[:, None, None])
        return grad_d, grad_a, None, None, None, None, None


def _chunks(which: Tensor, bytes_per_attack: int) -> list[tuple[int, int, Tensor | list[int]]]:
    """Bounds of consecutive chunks of the attacks (``which`` gives each one's observed update),
    of :func:`_plan`'s bytes of ``s`` each, with the chunk's indices: a tensor to gather with,
    or a list to loop over (read once per pass, so a GPU synchronises once)."""
    size, gather = _plan(which.device)
    step, total = max(1, size // max(1, bytes_per_attack)), which.shape[0]
    ns = which if gather else which.tolist()
    return [(lo, min(total, lo + step), ns[lo : lo + step]) for lo in range(0, total, step)]


def _residual(
    d: Tensor, a: Tensor, neg_kept: Tensor, which: Tensor | list[int], mask: Tensor | None
) -> Tensor:
    """``t = m ⊙ δᵀa − m ⊙ g[which]`` for a chunk of attacks (``chunk × out × in``), built in
    place: ``neg_kept`` is ``−m ⊙ g`` (``−g`` without a mask)."""
    t = d.transpose(-1, -2) @ a
    if isinstance(which, Tensor):
        g = neg_kept.index_select(0, which)
        return t.add_(g) if mask is None else torch.addcmul(g, t, mask, out=t)
    for k, n in enumerate(which):
        if mask is None:
            t[k].add_(neg_kept[n])
        else:
            torch.addcmul(neg_kept[n], t[k], mask, out=t[k])
    return t


def _split(g: Tensor, mask: Tensor | None, power: int) -> tuple[Tensor, Tensor]:
    """``−m ⊙ g`` and ``Σ φ((1 − m) ⊙ g)`` per observed update (``N``; zeros without a mask)."""
    if mask is None:
        return g.neg(), g.new_zeros(g.shape[0])
    kept = g * mask
    norms = torch.linalg.vector_norm((g - kept).flatten(1), ord=power, dim=1)
    return kept.neg_(), norms if power == 1 else norms.square()


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
    key = ("residuals", name, power, None if mask is None else id(mask))
    neg_kept, rest = observed.once(key, lambda: _split(g, mask, power))
    flat = _FactoredResiduals.apply(
        d.reshape(H * N * M, *d.shape[3:]),
        a.reshape(H * N * M, *a.shape[3:]),
        neg_kept,
        rest,
        which,
        mask,
        power,
    )
    return flat.reshape(H, N, M)
