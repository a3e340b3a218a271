"""The cosine likelihood ``-(1 − cos(g, s))``: per update, or one cosine over a block of updates.

Inverting Gradients' distance (Geiping et al. 2020) read as a likelihood
(Balunović et al. 2022, Table 1), and Table 2's cosine attack. Two choices
set the cosines of these papers apart:

* **where the layer weights go** (:func:`cosine_factors`): scaling both
  updates (``"vectors"``: ``w²`` in the dot product and both norms), or the
  dot product only (``"dot"``: the Bayes authors' ``cos_sim_global``,
  eth-sri/bayes-framework-leakage, utils/flax_losses.py lines 133–140);
* **how many updates one cosine spans** (``group``): the Bayes authors'
  Table 2 scripts attack ``--k_batches 10`` single-image updates together,
  with one cosine over all ten (lines 78–86 stack them).

:func:`cosine_sums` forms the sums on the hooked route
(:mod:`.per_attack`) without materialising the factored dense-layer
gradients. Used by the presets of Inverting Gradients and Table 2's cosine
(:mod:`.presets`), the Soteria and bias-removal attacks, and the chapters
"Existing attacks are approximations" and "Bayes versus heuristics under
defenses".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .likelihoods import LayerSelection, Likelihood, Update, Weighted
from .per_attack import Observed, Simulated

__all__ = ["PLACEMENTS", "Cosine", "cosine_factors", "cosine_sums"]

#: Where a weighted cosine puts its layer weights (:func:`cosine_factors`).
PLACEMENTS = ("vectors", "dot")


def cosine_factors(w: Tensor, placement: str) -> tuple[Tensor, Tensor]:
    """A parameter's factors ``(a, b)`` in a weighted cosine ``Σ a⟨g, s⟩ / √(Σ b‖g‖²) √(Σ b‖s‖²)``.

    ``w`` is its layer weight (per setting; 0 where the layer is not
    selected). ``"vectors"``: ``w`` scales both updates, so ``a = b = w²``.
    ``"dot"``: ``w`` multiplies the dot product only and the norms count
    every selected parameter unweighted, ``a = w``, ``b = [w ≠ 0]`` — the
    Bayes authors' ``cos_sim_global`` (utils/flax_losses.py lines 133–140:
    ``lw`` in ``dot`` only, the norms weighted by ``weights``, all ones
    without ``--att_inv_sigma``).
    """
    if placement == "vectors":
        w2 = w**2
        return w2, w2
    if placement == "dot":
        return w, (w != 0).to(w.dtype)
    raise ValueError(f"unknown cosine weight placement {placement!r}; use one of {PLACEMENTS}")


def _concatenated(obs: Observed, weighted: Weighted, placement: str) -> tuple[Tensor, Tensor]:
    """``a·g`` (``H × N × 1 × P``) and ``b`` (``H × 1 × 1 × P``, or ``None`` when all ones)
    over the listed parameters, flat."""
    factors = [cosine_factors(w, placement) for _, w in weighted]
    sizes = [obs.update[k][0].numel() for k, _ in weighted]
    a, b = (torch.cat([f[i][:, None].expand(-1, n) for f, n in zip(factors, sizes, strict=True)],
                      1)[:, None, None] for i in (0, 1))  # fmt: skip
    g = torch.cat([obs.update[k].flatten(1) for k, _ in weighted], 1)[None, :, None]
    return g * a, (None if bool((b == 1).all()) else b)


class _DotAndNorm(torch.autograd.Function):
    """``(⟨s, g_a⟩, Σ b s²)`` over the last axis, and their gradient in ``s`` in two passes.

    ``g_a`` (the weighted observed updates) and ``b`` (``None``: all ones)
    are constants of the attack run. The two sums are batched matrix products
    that read ``s`` once each, where ``(s * g_a).sum()`` and
    ``(s.pow(2) * b).sum()`` wrote four intermediates as large as ``s`` and
    autograd as many again: on the CVB paper's CNN (65,322 parameters, 32
    attacks) those passes were half of an Inverting Gradients step
    (``benchmarks/peers.py``; README, Speed section). The squared norm is an ``einsum``,
    not a product of ``s`` as rows with ``s`` as columns (``1 × P`` by ``P × 1`` per attack):
    that layout took a slow route on the CPU, 1.35 ms against 0.26 for 8 attacks of the CVB
    CNN's 65,322 parameters and 74 against 14 ms for ConvNet-64's 2.9 million (one thread,
    2026-12-01, an Intel Xeon), and summed less accurately (relative error 2.9·10⁻³ against
    float64 at 2.9 million, the ``einsum`` 6.3·10⁻⁵, as the dot product's layout).
    """

    @staticmethod
    def forward(ctx, s: Tensor, g_a: Tensor, b: Tensor | None) -> tuple[Tensor, Tensor]:
        sb = s if b is None else s * b
        dot = (s @ g_a.transpose(-1, -2)).squeeze(-1)
        norm = torch.einsum("...p,...p->...", s, sb)
        ctx.save_for_backward(g_a, sb)
        return dot, norm

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_dot: Tensor, grad_norm: Tensor) -> tuple[Tensor, None, None]:
        g_a, sb = ctx.saved_tensors
        grad = grad_dot.unsqueeze(-1) * g_a
        return grad.addcmul_(2 * grad_norm.unsqueeze(-1), sb), None, None


def cosine_sums(
    sim: Simulated, obs: Observed, weighted: Weighted, placement: str = "vectors"
) -> tuple[Tensor, Tensor]:
    """``Σ_k a_k ⟨s_k, g_k⟩`` and ``Σ_k b_k ‖s_k‖²`` per attack (``H × N × M``).

    ``weighted`` pairs each parameter with its weight ``w_k`` in each of the
    ``H`` settings; ``(a_k, b_k)`` are its :func:`cosine_factors`. The dense
    parameters are concatenated into one vector per attack: one product,
    square and sum instead of one per tensor, and a shorter graph for the
    second backward (a single Inverting Gradients attack ran 5–8 % faster on
    the CPU, on par with breaching's; ``benchmarks/peers.py``); the weighted
    observed vector is made once per attack run (the same list at every
    step). Factored layers add their float64 sums.
    """
    dense = [(k, w) for k, w in weighted if k in sim.dense]
    factored = [(k, cosine_factors(w, placement)) for k, w in weighted if k not in sim.dense]
    dot = sum(a[:, None, None] * sim.inner(k, obs) for k, (a, _) in factored)
    norm = sum(b[:, None, None] * sim.sq_norm(k) for k, (_, b) in factored)
    if dense:
        s = torch.cat([sim.dense[k].flatten(3) for k, _ in dense], 3)  # H × N × M × P
        key = ("cosine", placement, *((k, id(w)) for k, w in dense))
        g_a, b = obs.once(key, lambda: _concatenated(obs, dense, placement))
        dtype = torch.promote_types(s.dtype, g_a.dtype)  # as (s * g_a) would promote
        dense_dot, dense_norm = _DotAndNorm.apply(s.to(dtype), g_a.to(dtype), b)
        dot, norm = dot + dense_dot, norm + dense_norm
    return dot, norm


@dataclass(frozen=True)
class Cosine(Likelihood):
    """``-(1 − cos(g, s))`` over the selected layers, with one global cosine.

    Inverting Gradients' distance (Geiping et al. 2020). ``eps`` keeps the
    norm of a zero update finite (1e-7 as in the Bayes authors' code).

    ``placement`` says where the layer weights ``w`` go
    (:func:`cosine_factors`): ``"vectors"`` (default) scales
    both updates by ``w`` before the dot product and the norms (``w²`` in
    all three); ``"dot"`` multiplies the dot product by ``w`` and leaves the
    norms unweighted over the selected layers, as the Bayes authors'
    ``cos_sim_global`` (utils/flax_losses.py lines 133–140). The two agree
    under uniform weights; Table 2's cosine attack uses ``"dot"``
    (:func:`~leakagelib.experiments.bayes_scenario.table2_attacks`).

    ``group = k`` couples blocks of ``k`` consecutive updates along the
    update axis ``N``: the dot products and squared norms of a block's
    updates are summed (over its updates and layers) into one cosine, and
    each update of the block gets ``(cos − 1) / k``, so that the block's
    summed objective is one cosine: the authors' ``cos_sim_global`` over
    ``--k_batches 10`` single-image updates attacked together
    (utils/flax_losses.py lines 78–86 stack them, lines 133–140 take one
    cosine over all). With their TV averaged over the block's images and
    their distance divided by ``k_batches`` (lines 101, 144), their
    objective is ``(f · (1 − cos) + c · Σᵢ TVᵢ) / k``: ours with β = c/f,
    the heuristic tuner's convention (:mod:`leakagelib.attacks.search`).
    ``N`` must be a multiple of ``k`` (:meth:`check_updates`). A block is
    one attack only on the hooked route (:meth:`batched_log_prob`; the
    ``vmap`` engine refuses a group); with several restarts each update
    still keeps its own best restart. ``group=1`` is the per-update cosine.
    """

    eps: float = 1e-7
    layers: LayerSelection = field(default_factory=LayerSelection)
    group: int = 1
    placement: str = "vectors"

    def __post_init__(self) -> None:
        if isinstance(self.group, bool) or not isinstance(self.group, int) or self.group < 1:
            raise ValueError(f"group must be a positive integer, got {self.group!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"unknown cosine weight placement {self.placement!r}; use one of {PLACEMENTS}"
            )

    def _value(self, dot: Tensor, n_obs: Tensor, n_sim: Tensor, axis: int) -> Tensor:
        """``cos − 1`` from the sums per update, one cosine per block of :attr:`group` along ``axis``."""
        k = self.group
        if k == 1:
            return dot / ((n_obs + self.eps).sqrt() * (n_sim + self.eps).sqrt()) - 1.0
        dot, n_obs, n_sim = torch.broadcast_tensors(dot, n_obs, n_sim)
        shape = dot.shape
        blocks = (*shape[:axis], shape[axis] // k, k, *shape[axis + 1 :])
        dot, n_obs, n_sim = (t.reshape(blocks).sum(axis + 1, keepdim=True)
                             for t in (dot, n_obs, n_sim))  # fmt: skip
        value = dot / ((n_obs + self.eps).sqrt() * (n_sim + self.eps).sqrt()) - 1.0
        return (value / k).expand(blocks).reshape(shape)

    def log_prob(self, observed: Update, simulated: Update, weights: Tensor) -> Tensor:
        if self.group != 1:
            raise ValueError(
                f"Cosine(group={self.group}) compares blocks of updates, and log_prob sees one: "
                "use batched_log_prob (the hooked engine)"
            )
        keys = list(observed)
        a, b = cosine_factors(weights.to(observed[keys[0]].dtype), self.placement)
        dot = sum(a[i] * (observed[k] * simulated[k]).sum() for i, k in enumerate(keys))
        n_obs = sum(b[i] * observed[k].pow(2).sum() for i, k in enumerate(keys))
        n_sim = sum(b[i] * simulated[k].pow(2).sum() for i, k in enumerate(keys))
        return dot / ((n_obs + self.eps).sqrt() * (n_sim + self.eps).sqrt()) - 1.0

    def batched_log_prob(
        self, observed: Observed, simulated: Simulated, weighted: Weighted
    ) -> Tensor:
        dot, n_sim = cosine_sums(simulated, observed, weighted, self.placement)
        self.check_updates(dot.shape[1])
        n_obs = sum(
            cosine_factors(w, self.placement)[1][:, None, None]
            * observed.square(k).to(w.dtype)[None, :, None]
            for k, w in weighted
        )
        return self._value(dot, n_obs, n_sim, axis=1)

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"likelihood": "cosine", "weighting": self.layers.weighting}
        if self.group != 1:
            out["group"] = self.group
        if self.placement != "vectors":
            out["placement"] = self.placement
        return out
