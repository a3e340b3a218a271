"""The grouped cosine (``Cosine(group=k)``): the Bayes authors' ``cos_sim_global`` over k updates.

Their Table 2 scripts attack ``--k_batches 10`` single-image updates together
with one cosine over all of them (eth-sri/bayes-framework-leakage,
utils/flax_losses.py lines 133–140): ``1 + (−Σ lw⟨x, y⟩) / (√(Σ|x|² + 1e-7) ·
√(Σ|y|² + 1e-7))``, the sums over the block's updates and layers, ``lw`` on
the dot product only. These tests hold ours to that formula on random
tensors, on the hooked route's :meth:`batched_log_prob` (dense and factored
layers), and check that ``group=1`` is the cosine as it was.
"""

from __future__ import annotations

import pytest
import torch

from leakagelib import experiments
from leakagelib.attacks import AttackConfig, Cosine, LayerSelection, Setting, Uniform
from leakagelib.attacks.objective import batched_objective
from leakagelib.attacks.per_attack import Observed, Simulated
from leakagelib.experiments import Context, bayes_scenario
from leakagelib.gradients import functional_gradient, params_of, per_sample_updates
from leakagelib.models import build

NAMES = ("c.weight", "c.bias", "fc.weight", "fc.bias")
SHAPES = {"c.weight": (3, 2, 2), "c.bias": (3,), "fc.weight": (4, 5), "fc.bias": (4,)}


def _weights() -> torch.Tensor:
    """Two settings' layer weights: uniform and exponential (``H × parameters``)."""
    return torch.stack(
        [LayerSelection(weighting=w).weights(NAMES) for w in ("uniform", "exponential")]
    ).float()


def _authors(g: dict, s: dict, lw: torch.Tensor, block: range, placement: str) -> torch.Tensor:
    """``-(1 + (−Σ lw⟨g, s⟩) / (√(Σ|g|² + ε) √(Σ|s|² + ε)))`` over the block: theirs with "dot"."""
    a, b = (lw, torch.ones_like(lw)) if placement == "dot" else (lw**2, lw**2)
    dot = sum(a[i] * (g[k][j] * s[k][j]).sum() for i, k in enumerate(NAMES) for j in block)
    n_g = sum(b[i] * g[k][j].pow(2).sum() for i, k in enumerate(NAMES) for j in block)
    n_s = sum(b[i] * s[k][j].pow(2).sum() for i, k in enumerate(NAMES) for j in block)
    return -(1 + (-dot) / (torch.sqrt(n_g + 1e-7) * torch.sqrt(n_s + 1e-7)))


def _old_cosine(g: dict, s: dict, w: torch.Tensor) -> torch.Tensor:
    """The cosine's log_prob as it was before groups and placements, expression for expression."""
    dot = sum(w[i] ** 2 * (g[k] * s[k]).sum() for i, k in enumerate(g))
    n_obs = sum(w[i] ** 2 * g[k].pow(2).sum() for i, k in enumerate(g))
    n_sim = sum(w[i] ** 2 * s[k].pow(2).sum() for i, k in enumerate(g))
    return dot / ((n_obs + 1e-7).sqrt() * (n_sim + 1e-7).sqrt()) - 1.0


def test_group_one_is_the_cosine_as_it_was():
    gen = torch.Generator().manual_seed(0)
    N = 4
    g = {k: torch.randn(N, *v, generator=gen) for k, v in SHAPES.items()}
    s = {k: torch.randn(N, *v, generator=gen) for k, v in SHAPES.items()}
    for w in _weights():
        old = torch.stack([_old_cosine({k: v[j] for k, v in g.items()},
                                       {k: v[j] for k, v in s.items()}, w) for j in range(N)])  # fmt: skip
        new = torch.stack([Cosine().log_prob({k: v[j] for k, v in g.items()},
                                             {k: v[j] for k, v in s.items()}, w)
                           for j in range(N)])  # fmt: skip
        assert torch.equal(old, new)
    # the hooked route, per (setting, update, restart), against the old per-update formula
    H, M, w = 2, 3, _weights()
    sim = {k: torch.randn(H, N, M, *v, generator=gen) for k, v in SHAPES.items()}
    out = Cosine().batched_log_prob(Observed(g), Simulated(sim, {}),
                                    [(k, w[:, i]) for i, k in enumerate(NAMES)])  # fmt: skip
    ref = torch.tensor([[[float(_old_cosine({k: v[n] for k, v in g.items()},
                                            {k: v[h, n, m] for k, v in sim.items()}, w[h]))
                          for m in range(M)] for n in range(N)] for h in range(H)])  # fmt: skip
    assert torch.allclose(out, ref, atol=1e-6)
    assert Cosine().describe() == {"likelihood": "cosine", "weighting": "uniform"}


@pytest.mark.parametrize("placement", ["dot", "vectors"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_group_is_one_cosine_over_its_block_shared_out(placement, k):
    """The hooked route against the authors' formula over each block; each member gets 1/k of it."""
    gen = torch.Generator().manual_seed(k)
    H, N, M, rows = 2, 6, 3, 2
    w = _weights()
    g = {n: torch.randn(N, *v, generator=gen) for n, v in SHAPES.items()}
    dense = {n: torch.randn(H, N, M, *SHAPES[n], generator=gen) for n in NAMES if n != "fc.weight"}
    factors = {"fc.weight": (torch.randn(H, N, M, rows, 4, generator=gen),
                             torch.randn(H, N, M, rows, 5, generator=gen))}  # fmt: skip
    sim = Simulated(dense, factors)
    lik = Cosine(group=k, placement=placement)
    out = lik.batched_log_prob(Observed(g), sim, [(n, w[:, i]) for i, n in enumerate(NAMES)])
    s = {n: sim.tensor(n) for n in NAMES}
    for h in range(H):
        for m in range(M):
            for start in range(0, N, k):
                block = range(start, start + k)
                ref = _authors(g, {n: v[h, :, m] for n, v in s.items()}, w[h], block, placement)
                assert torch.allclose(out[h, start : start + k, m], ref / k, atol=1e-6)


def test_block_objective_gradient_is_the_authors_through_the_attack_objective():
    """The loop's objective (hooked route, bayes-cnn with a factored dense layer): its gradient
    for the iterates of two blocks of two updates is that of Σ_blocks (1 − cos_block)."""
    torch.manual_seed(0)
    model = build("bayes-cnn", (1, 8, 8), 10)
    N, k = 4, 2
    x0, y = torch.rand(N, 1, 8, 8), torch.arange(N) % 10
    observed = per_sample_updates(model, x0, y)
    names = list(observed)
    lik = Cosine(group=k, placement="dot")
    settings = [Setting(0.1, 1.0, 0.0, weighting="exponential")]
    shape = (1, N, 1, 1, 1, 8, 8)
    f = batched_objective(model, observed, y[:, None], settings, lik, Uniform(), AttackConfig(),
                          shape=shape, loss="ce", device=torch.device("cpu"))  # fmt: skip
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    grad, _, value = f(x, torch.zeros(1, N, 1, 1, 1), torch.zeros(1, N, 1, 1, 1, 1, 8, 8))
    # the authors' loss, written out with per-image gradients of the candidates
    w = LayerSelection().weights(names, "exponential").float()
    xr = x[0, :, 0].clone().requires_grad_()
    gradient, params = functional_gradient(model), params_of(model)
    sims = [gradient(params, xr[j], y[j : j + 1]) for j in range(N)]
    total = 0.0
    for start in range(0, N, k):
        block = range(start, start + k)
        dot = sum(w[i] * (observed[n][j] * sims[j][n]).sum() for i, n in enumerate(names)
                  for j in block)  # fmt: skip
        n_g = sum(observed[n][j].pow(2).sum() for n in names for j in block)
        n_s = sum(sims[j][n].pow(2).sum() for n in names for j in block)
        total = total + 1 + (-dot) / (torch.sqrt(n_g + 1e-7) * torch.sqrt(n_s + 1e-7))
    (ref,) = torch.autograd.grad(total, xr)
    assert torch.allclose(value.sum(), total.detach(), atol=1e-5)
    assert torch.allclose(grad[0, :, 0], ref, atol=1e-5 * float(ref.abs().max()))


def test_both_engines_agree_on_the_dot_placement():
    """``placement="dot"`` per update: log_prob (vmap engine) and the hooked sums give one
    objective and gradient under exponential layer weights."""
    torch.manual_seed(0)
    model = build("bayes-cnn", (1, 8, 8), 10)
    y = torch.arange(2)
    observed = per_sample_updates(model, torch.rand(2, 1, 8, 8), y)
    settings = [Setting(0.1, 1.0, 0.0, weighting="exponential")]
    shape = (1, 2, 1, 1, 1, 8, 8)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    out = []
    for engine in ("vmap", "hooks"):
        f = batched_objective(model, observed, y[:, None], settings, Cosine(placement="dot"),
                              Uniform(), AttackConfig(engine=engine), shape=shape, loss="ce",
                              device=torch.device("cpu"))  # fmt: skip
        out.append(f(x, torch.zeros(1, 2, 1, 1, 1), torch.zeros(1, 2, 1, 1, 1, 1, 8, 8)))
    (g_vmap, _, v_vmap), (g_hooks, _, v_hooks) = out
    assert torch.allclose(v_vmap, v_hooks, atol=1e-6)
    assert torch.allclose(g_vmap, g_hooks, atol=1e-5 * float(g_vmap.abs().max()))


def test_updates_that_do_not_fill_whole_blocks_are_refused_early():
    lik = Cosine(group=4)
    g = {n: torch.randn(6, *v) for n, v in SHAPES.items()}
    with pytest.raises(ValueError, match=r"group=4.*N = 6 updates, not a multiple of 4"):
        lik.check_updates(6)
    with pytest.raises(ValueError, match="use batched_log_prob"):
        lik.log_prob({n: v[0] for n, v in g.items()}, {n: v[0] for n, v in g.items()},
                     torch.ones(len(NAMES)))  # fmt: skip
    with pytest.raises(ValueError, match="group must be a positive integer"):
        Cosine(group=0)
    with pytest.raises(ValueError, match="placement"):
        Cosine(placement="norms")
    torch.manual_seed(0)
    model = build("bayes-cnn", (1, 8, 8), 10)
    y = torch.arange(3)
    observed = per_sample_updates(model, torch.rand(3, 1, 8, 8), y)
    args = (model, observed, y[:, None], [Setting(0.1, 1.0, 0.0)], Cosine(group=2), Uniform())
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="N = 3 updates, not a multiple of 2"):
        batched_objective(*args, AttackConfig(), shape=(1, 3, 1, 1, 1, 8, 8), loss="ce",
                          device=cpu)  # fmt: skip
    two = {n: v[:2] for n, v in observed.items()}
    args = (model, two, y[:2, None], *args[3:])
    with pytest.raises(ValueError, match="only the hooked route"):
        batched_objective(*args, AttackConfig(engine="vmap"), shape=(1, 2, 1, 1, 1, 8, 8),
                          loss="ce", device=cpu)  # fmt: skip


def test_table2_runs_the_authors_global_cosine_and_tunes_on_ten_victims():
    table2 = experiments.get("bayes/table2").config
    paper, ci = table2.at("paper"), table2.at("ci")
    assert (paper.tune_victims, paper.cosine_group, paper.victims) == (10, 10, 100)
    assert (ci.tune_victims, ci.cosine_group) == (1, 1)  # ci: as cheap as before
    assert "n_attack = 1" in table2.sources["tune_victims"]
    table5 = experiments.get("bayes/table5-priors").config
    assert table5.at("paper").tune_victims == 1 and "cosine_group" not in table5.paper
    defense = bayes_scenario.make_defense("prune+gauss")
    attacks = bayes_scenario.table2_attacks(defense, ("l2", "cosine"), steps=3, cosine_group=10)
    assert attacks["cosine"].likelihood == Cosine(group=10, placement="dot")
    assert attacks["cosine"].prior is attacks["l2"].prior
    small = table2.changed("ci", {"victims": 6, "cosine_group": 4})
    ctx = Context(scale="ci", progress=False, settings=small)
    with pytest.raises(ValueError, match="victims = 6 is not a multiple of cosine_group = 4"):
        experiments.get("bayes/table2").fn(ctx)


@pytest.mark.parametrize("weighted", [False, True])
def test_the_fused_dot_and_norm_has_the_plain_sums_and_their_gradient(weighted: bool):
    """The dense sums of :func:`cosine_sums` (two matrix products and a two-pass gradient) give
    ``(s * g_a).sum()`` and ``(s² * b).sum()`` and the same gradient in ``s``, to float64 rounding."""
    from leakagelib.attacks.cosine import _DotAndNorm

    gen = torch.Generator().manual_seed(0)
    s = torch.randn(2, 3, 4, 50, generator=gen, dtype=torch.float64, requires_grad=True)
    g_a = torch.randn(2, 3, 1, 50, generator=gen, dtype=torch.float64)
    b = torch.rand(2, 1, 1, 50, generator=gen, dtype=torch.float64) if weighted else None
    dot, norm = _DotAndNorm.apply(s, g_a, b)
    plain_dot = (s * g_a).sum(3)
    plain_norm = (s.pow(2) * (1.0 if b is None else b)).sum(3)
    torch.testing.assert_close(dot, plain_dot)
    torch.testing.assert_close(norm, plain_norm)
    up, un = torch.randn(2, 2, 3, 4, generator=gen, dtype=torch.float64).unbind(0)
    (fused,) = torch.autograd.grad((dot * up + norm * un).sum(), s)
    (plain,) = torch.autograd.grad((plain_dot * up + plain_norm * un).sum(), s)
    torch.testing.assert_close(fused, plain)


def test_the_fused_norm_keeps_float32_accuracy_over_millions_of_parameters():
    """Over a million float32 entries per attack (ConvNet-64 has 2.9 million) the squared norm
    stays within 2·10⁻⁴ of its float64 value: summed as rows-by-columns products it was off by
    about 10⁻³ here (README, Speed: the form that also took a slow route)."""
    from leakagelib.attacks.cosine import _DotAndNorm

    gen = torch.Generator().manual_seed(0)
    s = torch.randn(1, 4, 1, 2**20, generator=gen) * torch.rand(1, 4, 1, 2**20, generator=gen) ** 4
    _, norm = _DotAndNorm.apply(s, torch.zeros(1, 4, 1, 2**20), None)
    exact = s.double().pow(2).sum(3)
    assert ((norm.double() - exact).abs() / exact).max() < 2e-4
