"""Tests of leakagelib.attacks: likelihoods, priors, the batched loop, presets and search."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from leakagelib.attacks import (
    AttackConfig,
    BatchNormStatistics,
    Cosine,
    Gaussian,
    GaussianPrior,
    LabelAlignment,
    Laplace,
    LayerSelection,
    PixelRange,
    Pruned,
    Setting,
    TotalVariation,
    Uniform,
    WeightedSum,
    gradinversion,
    image_bounds,
    presets,
    reconstruct,
    run_together,
)
from leakagelib.attacks.loop import sample_ball
from leakagelib.attacks.optimizers import ADAM_EPS, adam_loop, annealed
from leakagelib.attacks.search import (
    BAYES_FACTORS,
    HEURISTIC_FACTORS,
    BayesGrid,
    HeuristicGrid,
    Tuner,
    search,
)
from leakagelib.gradients import client_update, per_sample_updates, stack_updates

torch.set_num_threads(1)


def tiny_net(seed: int = 0) -> nn.Module:
    """A 1×3×3 → 4 network: small enough for exact recovery in a few hundred steps."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(9, 6), nn.Sigmoid(), nn.Linear(6, 4))


def rand_update(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(3, 2, generator=g),
        "a.bias": torch.randn(3, generator=g),
        "b.weight": torch.randn(2, 3, generator=g),
    }


# ---------------------------------------------------------------- likelihoods


def test_gaussian_and_laplace_match_their_formulas():
    g, s = rand_update(0), rand_update(1)
    w = torch.ones(3, dtype=torch.float64)
    sq = sum(((g[k] - s[k]) ** 2).sum() for k in g)
    ab = sum((g[k] - s[k]).abs().sum() for k in g)
    assert torch.allclose(Gaussian(0.5).log_prob(g, s, w), -sq / (2 * 0.25))
    assert torch.allclose(Laplace(0.2).log_prob(g, s, w), -ab / 0.2)


def test_cosine_is_zero_for_parallel_and_minus_two_for_opposite():
    g = rand_update(0)
    w = torch.ones(3)
    assert abs(float(Cosine().log_prob(g, {k: 3 * v for k, v in g.items()}, w))) < 1e-6
    assert abs(float(Cosine().log_prob(g, {k: -v for k, v in g.items()}, w)) + 2) < 1e-6


def test_pruned_known_mask_and_mixture():
    g, s = rand_update(0), rand_update(1)
    w = torch.ones(3)
    masks = {k: (torch.rand_like(v) < 0.5).float() for k, v in s.items()}
    known = Pruned("gaussian", 0.3, masks=masks).log_prob(g, s, w)
    expect = Gaussian(0.3).log_prob(g, {k: masks[k] * s[k] for k in s}, w)
    assert torch.allclose(known, expect)
    # keep = 1 is no pruning at all
    assert torch.allclose(
        Pruned("laplace", 0.3, keep=1.0).log_prob(g, s, w), Laplace(0.3).log_prob(g, s, w)
    )
    # the mixture, entry by entry
    mix = Pruned("gaussian", 0.3, keep=0.5).log_prob(g, s, w)
    brute = 0.0
    for k in g:
        a = 0.5 * torch.exp(-((g[k] - s[k]) ** 2) / (2 * 0.09))
        b = 0.5 * torch.exp(-(g[k] ** 2) / (2 * 0.09))
        brute = brute + torch.log(a + b).sum()
    assert torch.allclose(mix, brute, atol=1e-4)


def test_layer_selection_names_indices_predicates_and_weights():
    names = ["conv.weight", "conv.bias", "fc.weight", "fc.bias", "out.weight"]
    assert LayerSelection().weights(names).tolist() == [1, 1, 1, 1, 1]
    assert LayerSelection(include=["fc.weight"]).weights(names).tolist() == [0, 0, 1, 0, 0]
    assert LayerSelection(include=[-1]).weights(names).tolist() == [0, 0, 0, 0, 1]
    pred = LayerSelection(include=lambda n: not n.startswith("conv"))
    assert pred.weights(names).tolist() == [0, 0, 1, 1, 1]
    exp = LayerSelection(weighting="exponential").weights(names)
    assert torch.allclose(
        exp, torch.tensor([1, 1, math.exp(-1), math.exp(-1), math.exp(-2)]).double()
    )
    # ranks count selected layers only
    sub = LayerSelection(include=[1, 2], weighting="exponential").weights(names)
    assert torch.allclose(sub, torch.tensor([0, 0, 1, 1, math.exp(-1)]).double())


def test_layer_selection_errors():
    names = ["a.weight", "b.weight"]
    with pytest.raises(KeyError, match="lacks"):
        LayerSelection(include=["nope"]).weights(names)
    with pytest.raises(ValueError, match="keeps no parameter"):
        LayerSelection(include=lambda n: False).weights(names)
    with pytest.raises(ValueError, match="out of range"):
        LayerSelection(include=[5]).weights(names)
    with pytest.raises(ValueError, match="weighting"):
        LayerSelection(weighting="linear")
    with pytest.raises(ValueError, match="positive"):
        Gaussian(0.0)


# ---------------------------------------------------------------- priors


def test_priors_values():
    x = torch.zeros(1, 1, 3, 3)
    x[0, 0, 1, 1] = 1.0
    assert float(TotalVariation(1).log_prob(x)) == -4.0
    assert float(TotalVariation(2).log_prob(2 * x)) == -16.0
    assert float(Uniform().log_prob(x)) == 0.0
    assert float(GaussianPrior(std=1.0).log_prob(x)) == -0.5
    pr = PixelRange(mean=(0.5,), std=(0.25,))
    assert float(pr.log_prob(torch.zeros(2, 1, 2, 2))) == 0.0  # u = 0.5 inside [0, 1]
    assert math.isclose(float(pr.log_prob(torch.full((1, 1, 1, 1), 4.0))), -0.25)  # u = 1.5
    combo = 0.3 * TotalVariation(1) + 0.7 * pr
    assert isinstance(combo, WeightedSum)
    y = torch.randn(2, 1, 3, 3)
    expect = 0.3 * TotalVariation(1).log_prob(y) + 0.7 * pr.log_prob(y)
    assert torch.allclose(combo.log_prob(y), expect)
    with pytest.raises(ValueError, match="n×C×H×W"):
        TotalVariation().log_prob(torch.zeros(3, 4))


def _tv_by_hand(x: np.ndarray, power: int, mean: bool) -> float:
    """Anisotropic TV from numpy's differences, per image then averaged; ``mean`` per direction."""
    per_image = []
    for image in x:
        total = 0.0
        for axis in (1, 2):  # H, then W of a C×H×W image
            d = np.abs(np.diff(image, axis=axis)) ** power
            total += d.mean() if mean else d.sum()
        per_image.append(total)
    return float(np.mean(per_image))


@pytest.mark.parametrize("power", [1, 2])
def test_tv_mean_reduction_is_the_sum_over_each_directions_count(power: int) -> None:
    """inversefed's convention: each direction's sum divided by its C·(H−1)·W or C·H·(W−1) pairs."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 5, 7, generator=gen, dtype=torch.float64)
    summed = -float(TotalVariation(power, reduction="sum").log_prob(x))
    mean = -float(TotalVariation(power, reduction="mean").log_prob(x))
    assert math.isclose(summed, _tv_by_hand(x.numpy(), power, mean=False), rel_tol=1e-12)
    assert math.isclose(mean, _tv_by_hand(x.numpy(), power, mean=True), rel_tol=1e-12)
    dh = (x[:, :, 1:] - x[:, :, :-1]).abs().pow(power).sum((1, 2, 3))
    dw = (x[..., 1:] - x[..., :-1]).abs().pow(power).sum((1, 2, 3))
    assert math.isclose(mean, float((dh / (2 * 4 * 7) + dw / (2 * 5 * 6)).mean()), rel_tol=1e-12)
    # on a square image the two conventions differ by the factor C·(H−1)·W (2,976 on 3×32×32)
    sq = torch.randn(2, 3, 32, 32, generator=gen, dtype=torch.float64)
    ratio = TotalVariation(power, "sum").log_prob(sq) / TotalVariation(power, "mean").log_prob(sq)
    assert math.isclose(float(ratio), 3 * 31 * 32, rel_tol=1e-12)


def test_tv_of_the_bayes_code_on_a_hand_computed_image() -> None:
    """Squared differences summed per image, averaged over images (the Bayes authors' TV)."""
    x = torch.tensor([[[[1.0, 2.0], [4.0, 8.0]]], [[[0.0, 0.0], [0.0, 0.0]]]])
    # vertical pairs (4 − 1)² + (8 − 2)² = 45, horizontal (2 − 1)² + (8 − 4)² = 17
    assert float(TotalVariation(2, reduction="sum").log_prob(x[:1])) == -62.0
    assert float(TotalVariation(2, reduction="sum").log_prob(x)) == -31.0  # mean over images
    assert float(TotalVariation(2, reduction="mean").log_prob(x[:1])) == -(45 / 2 + 17 / 2)
    assert float(TotalVariation(1, reduction="mean").log_prob(x[:1])) == -(9 / 2 + 5 / 2)


@pytest.mark.parametrize("reduction", ["avg", "Mean", None])
def test_tv_rejects_an_unknown_reduction(reduction: object) -> None:
    with pytest.raises(ValueError, match="reduction must be one of"):
        TotalVariation(1, reduction=reduction)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="power must be 1 or 2"):
        TotalVariation(3, reduction="mean")


def test_each_preset_uses_its_sources_tv_convention() -> None:
    """IG: inversefed's mean per direction (weight 1e-4, its --tv default); Bayes: the authors' sum."""
    ig = presets.inverting_gradients()
    assert ig.prior == TotalVariation(power=1, reduction="mean") and ig.config.beta == 1e-4
    assert presets.bayes(Gaussian()).prior == TotalVariation(power=2, reduction="sum")
    tv_term = presets.grad_inversion().prior.terms[0][1]
    assert tv_term == TotalVariation(power=1, reduction="mean")
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    inversefed = (x[..., 1:] - x[..., :-1]).abs().mean() + (
        x[..., 1:, :] - x[..., :-1, :]
    ).abs().mean()
    assert torch.allclose(-ig.prior.log_prob(x), inversefed)


def bn_net(seed: int = 0) -> nn.Module:
    """A 1×4×4 → 3 network with one BatchNorm layer, in eval mode."""
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(32, 3)
    )
    return net.eval()


def test_batchnorm_prior_is_zero_exactly_at_the_running_statistics():
    net = bn_net().requires_grad_(False)
    x = torch.rand(4, 1, 4, 4)
    with torch.no_grad():
        feats = net[0](x)  # the BatchNorm layer's input
        net[1].running_mean.copy_(feats.mean((0, 2, 3)))
        net[1].running_var.copy_(feats.var((0, 2, 3), unbiased=False))
    prior = BatchNormStatistics(net)
    assert abs(float(prior.log_prob(x))) < 1e-6
    other = torch.rand(4, 1, 4, 4) * 3.0
    assert float(prior.log_prob(other)) < -1e-2
    # the penalty is the plain ℓ2 norms of the mean and variance gaps
    f = net[0](other)
    gap = (f.mean((0, 2, 3)) - net[1].running_mean).norm()
    gap = gap + (f.var((0, 2, 3), unbiased=False) - net[1].running_var).norm()
    assert torch.isclose(prior.log_prob(other), -gap, atol=1e-6)


def test_batchnorm_prior_names_its_misuse():
    with pytest.raises(ValueError, match="not bound"):
        BatchNormStatistics().log_prob(torch.rand(1, 1, 4, 4))
    with pytest.raises(ValueError, match="no"):  # a model without BatchNorm
        BatchNormStatistics().bind(tiny_net())
    with pytest.raises(ValueError, match=r"model\.eval\(\)"):
        BatchNormStatistics(bn_net().train()).log_prob(torch.rand(2, 1, 4, 4))
    with pytest.raises(ValueError, match="non-negative"):
        gradinversion(bn=-1.0)


def test_gradinversion_with_batchnorm_runs_in_the_batched_loop_and_pulls_towards_the_stats():
    """The BN term is bound to the attacked model by the loop and differentiated under vmap."""
    net = bn_net(1)
    x = torch.rand(2, 1, 4, 4)
    y = torch.tensor([0, 2])
    ups = per_sample_updates(net, x, y)
    kw = dict(labels=y, likelihood=Gaussian(), input_shape=(1, 4, 4))
    penalty = BatchNormStatistics(net)

    def bn_gap(beta: float) -> float:
        cfg = AttackConfig(steps=40, lr=0.05, schedule="constant", beta=beta)
        prior = gradinversion(tv=0.0, l2=0.0, bn=1.0)
        gen = torch.Generator().manual_seed(0)
        res = reconstruct(net, ups, prior=prior, config=cfg, generator=gen, **kw)
        assert torch.isfinite(res.inputs()).all()
        return -float(penalty.log_prob(res.inputs()[:1]))

    assert bn_gap(10.0) < bn_gap(0.0)


def test_label_alignment_prior_scores_agreement_with_the_label():
    net = tiny_net()
    x = torch.rand(3, 1, 3, 3)
    probs = torch.softmax(net(x), -1)
    y = torch.tensor([0, 1, 3])
    prior = LabelAlignment(net)
    expect = -(probs - nn.functional.one_hot(y, 4).float()).pow(2).sum(-1).mean()
    assert torch.isclose(prior.log_prob_given(x, y), expect)
    soft = torch.softmax(torch.randn(3, 4), -1)  # DLG's optimised soft labels
    assert torch.isclose(prior.log_prob_given(x, soft), -(probs - soft).pow(2).sum(-1).mean())
    # the label the network already predicts scores higher than any other
    top = probs.argmax(-1)
    assert float(prior.log_prob_given(x, top)) > float(prior.log_prob_given(x, (top + 1) % 4))
    with pytest.raises(ValueError, match="labels"):
        prior.log_prob(x)
    with pytest.raises(ValueError, match="not bound"):
        LabelAlignment().log_prob_given(x, y)


def test_cpl_label_term_is_a_prior_the_loop_binds():
    assert presets.cpl().parts()["prior"] == {"prior": "uniform"}
    attack = presets.cpl(steps=3, label_weight=0.5)
    assert attack.parts()["prior"] == {"prior": "label-alignment"}
    assert attack.config.beta == 0.5
    net, x, y = tiny_net(), torch.rand(1, 1, 3, 3), torch.tensor([2])
    res = attack(
        net,
        stack_updates([client_update(net, x, y)]),
        input_shape=(1, 3, 3),
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.isfinite(res.inputs()).all()
    with pytest.raises(ValueError, match="non-negative"):
        presets.cpl(label_weight=-1.0)


# ---------------------------------------------------------------- the loop


def _problem(n_updates: int = 2):
    net = tiny_net()
    x = torch.rand(n_updates, 1, 3, 3)
    y = torch.arange(n_updates) % 4
    return net, x, y, per_sample_updates(net, x, y)


def test_noise_free_attack_recovers_inputs():
    net, x, y, ups = _problem(2)
    cfg = AttackConfig(steps=300, lr=0.1, schedule="exponential", decay=0.995, beta=0.0)
    res = reconstruct(
        net,
        ups,
        labels=y,
        likelihood=Gaussian(),
        prior=Uniform(),
        config=cfg,
        input_shape=(1, 3, 3),
    )
    assert res.images.shape == (1, 2, 1, 1, 3, 3)  # H × N × n × input
    err = (res.inputs() - x).abs().max()
    assert err < 1e-2, err


def test_settings_in_one_batch_equal_separate_runs():
    net, x, y, ups = _problem(2)
    cfg = AttackConfig(steps=20, lr=0.1, decay=0.97, beta=0.01, restarts=2)
    kw = dict(
        labels=y,
        likelihood=Gaussian(),
        prior=TotalVariation(1),
        config=cfg,
        input_shape=(1, 3, 3),
    )
    s1, s2 = Setting(0.1, 0.97, 0.01), Setting(0.3, 0.9, 1.0)
    both = reconstruct(
        net, ups, settings=[s1, s2], generator=torch.Generator().manual_seed(3), **kw
    )
    one = reconstruct(net, ups, settings=[s2], generator=torch.Generator().manual_seed(3), **kw)
    assert torch.allclose(both.all_images[1], one.all_images[0], atol=1e-5)
    assert not torch.allclose(both.all_images[0], both.all_images[1])
    # the reported restart is the one with the lowest final objective
    best = both.all_objective.argmin(dim=2)
    assert torch.equal(both.objective, both.all_objective.gather(2, best.unsqueeze(2)).squeeze(2))


def test_bayes_and_l2_coincide_under_gaussian_noise():
    """With σ = 0.1, -log p is 100 × the σ = 1 objective; Adam is scale-free (§6, Table 2)."""
    net, x, y, ups = _problem(2)
    cfg = AttackConfig(steps=30, lr=0.2, decay=0.97)
    kw = dict(labels=y, prior=TotalVariation(2), config=cfg, input_shape=(1, 3, 3))
    a = reconstruct(
        net,
        ups,
        likelihood=Gaussian(0.1),
        settings=[Setting(0.2, 0.97, 1.0)],
        generator=torch.Generator().manual_seed(1),
        **kw,
    )
    b = reconstruct(
        net,
        ups,
        likelihood=Gaussian(1.0),
        settings=[Setting(0.2, 0.97, 0.01)],
        generator=torch.Generator().manual_seed(1),
        **kw,
    )
    assert torch.allclose(a.inputs(), b.inputs(), atol=1e-4)


def test_monte_carlo_ball_samples_are_uniform_in_the_ball():
    gen = torch.Generator().manual_seed(0)
    d, delta = 5, 2.0
    z = sample_ball((20000, d), d, delta, gen, torch.device("cpu"))
    r = z.norm(dim=1)
    assert float(r.max()) <= delta + 1e-6
    # radius of a uniform point in a d-ball: E[r] = d/(d+1) δ
    assert abs(float(r.mean()) - d / (d + 1) * delta) < 0.02


def test_mc_samples_and_box_run():
    net, x, y, ups = _problem(1)
    lo, hi = image_bounds((0.5,), (0.5,))
    cfg = AttackConfig(steps=5, mc_samples=3, delta=0.5, box=True, signed=True, init="uniform")
    res = reconstruct(
        net,
        ups,
        labels=y,
        likelihood=Laplace(),
        prior=Uniform(),
        config=cfg,
        input_shape=(1, 3, 3),
        bounds=(lo, hi),
    )
    assert float(res.inputs().min()) >= -1 - 1e-6 and float(res.inputs().max()) <= 1 + 1e-6
    assert len(res.history) == 5


def test_bad_arguments_raise():
    net, x, y, ups = _problem(1)
    with pytest.raises(ValueError, match="disagrees with labels"):
        reconstruct(
            net,
            ups,
            labels=torch.zeros(1, 2, dtype=torch.long),
            num_images=1,
            likelihood=Gaussian(),
            prior=Uniform(),
            input_shape=(1, 3, 3),
        )
    with pytest.raises(ValueError, match="bounds"):
        reconstruct(
            net,
            ups,
            labels=y,
            likelihood=Gaussian(),
            prior=Uniform(),
            config=AttackConfig(box=True),
            input_shape=(1, 3, 3),
        )
    with pytest.raises(ValueError, match="optimizer"):
        AttackConfig(optimizer="sgd")
    with pytest.raises(ValueError, match="L-BFGS"):
        AttackConfig(optimizer="lbfgs", signed=True)
    with pytest.raises(ValueError, match="update"):
        reconstruct(
            net,
            {"x": torch.zeros(1)},
            labels=y[:1],
            likelihood=Gaussian(),
            prior=Uniform(),
            input_shape=(1, 3, 3),
        )
    with pytest.raises(TypeError, match="Likelihood"):
        reconstruct(
            net,
            ups,
            labels=y,
            likelihood="l2",
            prior=Uniform(),
            input_shape=(1, 3, 3),
        )


# ---------------------------------------------------------------- the loop, as before the refactor

#: Numbers computed by running the loop *before* it was split into small functions
#: (leakagelib/attacks/loop.py at commit 7d43c17, ``run_attack`` of 240 lines), on this
#: machine's CPU with one thread; the refactored loop must reproduce them exactly.
ADAM_OBJECTIVE = [
    [[0.045874956995248795, 0.03914245218038559], [0.06344617158174515, 0.043511420488357544]],
    [[0.7924669981002808, 0.6170685291290283], [0.9802276492118835, 0.8789179921150208]],
]
ADAM_PIXELS = (
    [0.3353150188922882, 0.34968411922454834, 0.7908391356468201],
    [0.334190309047699, 0.4449985921382904, 0.5748254656791687],
)
ADAM_LAST_HISTORY = 0.4746670126914978
LBFGS_OBJECTIVE = [
    [
        [3.4903055166068953e-06, 8.526624151272699e-05],
        [4.694544622907415e-05, 0.00011395558249205351],
    ]
]
LBFGS_PIXELS = (
    [0.1520683914422989, 0.47990575432777405, 0.9882494211196899],
    [0.2684427499771118, 0.4614296853542328, 0.7733609080314636],
)
LBFGS_HISTORY = [2.100534439086914, 0.05746220797300339, 0.0006036757258698344]


def _fixed_problem():
    torch.manual_seed(5)
    net = tiny_net()
    x = torch.rand(2, 1, 3, 3, generator=torch.Generator().manual_seed(11))
    y = torch.tensor([1, 3])
    return net, y, per_sample_updates(net, x, y)


@pytest.mark.parametrize("engine", ["vmap", "hooks"])
def test_adam_loop_reproduces_the_numbers_of_the_loop_before_the_refactor(engine):
    """Two settings with two likelihoods, two restarts, MC samples, box: every draw as before.

    To the last float32 bits on the ``vmap`` route the numbers were taken with
    (bit for bit on the CPU that took them; another CPU's kernels may round the
    last bit differently); the hooked route computes the same objective in
    another order, so to float32 rounding.
    """
    net, y, ups = _fixed_problem()
    cfg = AttackConfig(
        steps=12, lr=0.1, decay=0.97, beta=0.01, restarts=2, mc_samples=2, delta=0.1, box=True,
        engine=engine,
    )  # fmt: skip
    res = reconstruct(
        net,
        ups,
        labels=y,
        likelihood=[Gaussian(), Laplace()],
        prior=TotalVariation(1),
        config=cfg,
        settings=[Setting(0.1, 0.97, 0.01), Setting(0.2, 0.9, 0.1)],
        input_shape=(1, 3, 3),
        bounds=image_bounds((0.5,), (0.5,)),
        generator=torch.Generator().manual_seed(3),
    )
    same = _exactly if engine == "vmap" else _to_rounding
    same(res.all_objective, ADAM_OBJECTIVE)
    same(res.per_update(1)[0, 0, 0, 1], ADAM_PIXELS[0])
    same(res.per_update(0)[1, 0, 0, 2], ADAM_PIXELS[1])
    same(torch.tensor(res.history[-1]), ADAM_LAST_HISTORY)


def _exactly(got: torch.Tensor, expected) -> None:
    assert torch.allclose(got, torch.tensor(expected), rtol=1e-5, atol=1e-7)


def _to_rounding(got: torch.Tensor, expected) -> None:
    assert torch.allclose(got, torch.tensor(expected), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("engine", ["vmap", "hooks"])
def test_lbfgs_loop_reproduces_the_numbers_of_the_loop_before_the_refactor(engine):
    """DLG-style L-BFGS with optimised labels and two restarts: every draw as before."""
    net, y, ups = _fixed_problem()
    cfg = AttackConfig(
        steps=3, optimizer="lbfgs", lr=1.0, schedule="constant", decay=1.0, beta=0.0,
        restarts=2, optimize_labels=True, lbfgs_iterations=5, engine=engine,
    )  # fmt: skip
    res = reconstruct(
        net,
        ups,
        labels=None,
        num_images=1,
        likelihood=Gaussian(2**-0.5),
        prior=Uniform(),
        config=cfg,
        input_shape=(1, 3, 3),
        generator=torch.Generator().manual_seed(4),
    )
    same = _exactly if engine == "vmap" else _to_rounding
    same(res.per_update()[0, 0, 0, 0], LBFGS_PIXELS[0])
    same(res.per_update()[1, 0, 0, 1], LBFGS_PIXELS[1])
    assert res.labels_of().tolist() == [[1], [3]]
    if engine == "vmap":  # objectives near 1e-5 are differences of O(1) numbers
        assert torch.allclose(res.all_objective, torch.tensor(LBFGS_OBJECTIVE), rtol=0, atol=1e-8)
        assert torch.allclose(torch.tensor(res.history), torch.tensor(LBFGS_HISTORY), rtol=1e-5)


# ---------------------------------------------------------------- the result's accessors


def test_result_accessors_name_what_positional_indexing_did():
    net, x, y, ups = _problem(3)
    cfg = AttackConfig(steps=3, lr=0.1, restarts=2)
    res = reconstruct(
        net,
        ups,
        labels=y,
        likelihood=[Gaussian(), Laplace()],
        prior=Uniform(),
        config=cfg,
        settings=[cfg.setting(), Setting(0.2, 0.9, 1.0)],
        names=["l2", "l1"],
        input_shape=(1, 3, 3),
    )
    assert res.num_settings == 2
    assert torch.equal(res.per_update("l1"), res.images[1])  # N × n × input
    assert res.per_update(1).shape == (3, 1, 1, 3, 3)
    assert torch.equal(res.inputs("l1"), res.images[1, :, 0])  # (N·n) × input
    assert torch.equal(res.inputs(-1), res.inputs(1))
    assert torch.equal(res.objective_of("l2"), res.objective[0])  # N
    assert res.restarts_of(0).shape == (3, 2, 1, 1, 3, 3)
    assert res.setting_of("l1") == Setting(0.2, 0.9, 1.0)
    assert res.labels_of() is None
    with pytest.raises(KeyError, match="no setting named 'cos'"):
        res.inputs("cos")
    with pytest.raises(IndexError, match="setting must be an index"):
        res.inputs(2)
    with pytest.raises(ValueError, match="unique names"):
        reconstruct(
            net, ups, labels=y, likelihood=Gaussian(), prior=Uniform(), config=cfg,
            input_shape=(1, 3, 3), names=["a", "b"],
        )  # fmt: skip


def test_inputs_flatten_several_images_per_update_in_update_order():
    net = tiny_net()
    x = torch.rand(4, 1, 3, 3)
    y = torch.tensor([0, 1, 2, 3])
    batches = stack_updates([client_update(net, x[:2], y[:2]), client_update(net, x[2:], y[2:])])
    res = reconstruct(
        net,
        batches,
        labels=y.reshape(2, 2),
        likelihood=Gaussian(),
        prior=Uniform(),
        config=AttackConfig(steps=2, lr=0.1),
        input_shape=(1, 3, 3),
    )
    assert res.per_update().shape == (2, 2, 1, 3, 3)
    assert torch.equal(res.inputs()[2], res.per_update()[1, 0])


# ---------------------------------------------------------------- configuration checks


@pytest.mark.parametrize(
    ("field", "value", "error", "words"),
    [
        ("steps", 2.5, TypeError, "steps must be an integer >= 1"),
        ("steps", True, TypeError, "steps must be an integer >= 1"),
        ("steps", 0, ValueError, "steps must be an integer >= 1"),
        ("restarts", 1.0, TypeError, "restarts must be an integer"),
        ("mc_samples", 0, ValueError, "mc_samples must be an integer >= 1"),
        ("lbfgs_iterations", False, TypeError, "lbfgs_iterations must be an integer"),
        ("lr", float("nan"), ValueError, "lr must be a finite number > 0"),
        ("lr", -0.1, ValueError, "lr must be a finite number > 0"),
        ("lr", "0.1", TypeError, "lr must be a finite number"),
        ("beta", float("inf"), ValueError, "beta must be a finite number >= 0"),
        ("beta", -1.0, ValueError, "beta must be a finite number >= 0"),
        ("decay", 1.5, ValueError, "decay must be in (0, 1]"),
        ("decay", 0.0, ValueError, "decay must be a finite number > 0"),
        ("delta", float("nan"), ValueError, "delta must be a finite number >= 0"),
        ("init_scale", 0.0, ValueError, "init_scale must be a finite number > 0"),
        ("optimizer", "sgd", ValueError, "unknown optimizer 'sgd'"),
    ],
)
def test_attack_config_names_the_bad_argument(field, value, error, words):
    with pytest.raises(error, match=re.escape(words)):
        AttackConfig(**{field: value})


def test_setting_checks_its_fields_and_accepts_integers():
    assert Setting(1, 1, 0).lr == 1
    with pytest.raises(ValueError, match=re.escape("lr must be a finite number > 0")):
        Setting(float("nan"), 0.9, 0.1)
    with pytest.raises(ValueError, match="layer weighting"):
        Setting(0.1, 0.9, 0.1, weighting="linear")


def test_attacks_reject_non_finite_and_misshapen_updates():
    net, x, y, ups = _problem(2)
    kw = dict(labels=y, likelihood=Gaussian(), prior=Uniform(), input_shape=(1, 3, 3))
    bad = {**ups, "1.bias": ups["1.bias"].clone()}
    bad["1.bias"][0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"update\['1.bias'\] contains NaN"):
        reconstruct(net, bad, **kw)
    with pytest.raises(ValueError, match="one leading dimension N"):
        reconstruct(net, {k: v[0] for k, v in ups.items()}, **kw)
    with pytest.raises(ValueError, match="labels must be N × n or N with N = 2"):
        reconstruct(net, ups, **{**kw, "labels": y[:1]})


# ---------------------------------------------------------------- presets


def test_table1_presets_parts():
    assert presets.dlg().parts()["prior"] == {"prior": "uniform"}
    assert presets.dlg().parts()["likelihood"]["likelihood"] == "gaussian"
    ig = presets.inverting_gradients().parts()
    assert ig["likelihood"]["likelihood"] == "cosine" and ig["prior"]["prior"] == "tv"
    assert ig["prior"]["reduction"] == "mean"
    bayes = presets.bayes(Laplace(0.1))
    assert bayes.config.lr == 0.5 and bayes.config.decay == 0.94 and bayes.config.steps == 200


def test_presets_build_what_the_experiments_built_before_the_registry():
    """The configs that cvb.attack_config, defenses._ig and bayes._attacks wrote out by hand."""
    layers = LayerSelection(include=["1.weight"])
    ig = presets.inverting_gradients(steps=100, lr=1.0, tv=0.01, include=["1.weight"])
    assert ig.config == AttackConfig(
        steps=100, optimizer="adam", lr=1.0, schedule="step", decay=0.1, signed=True, box=True,
        init="normal", beta=0.01,
    )  # fmt: skip
    assert ig.likelihood == Cosine(layers=layers)
    assert ig.prior == TotalVariation(power=1, reduction="mean")
    lbfgs = dict(steps=2, lr=0.1, sigma=1.0, labels="given", include=["1.weight"])
    old = AttackConfig(steps=2, optimizer="lbfgs", lr=0.1, schedule="constant", beta=0.0)
    # the old configs kept AttackConfig's decay 0.94, which the constant schedule never reads
    idlg, cpl = presets.idlg(box=True, **lbfgs), presets.cpl(**lbfgs)
    assert idlg.config == replace(old, box=True, decay=1.0)
    assert cpl.config == replace(old, init="pattern", decay=1.0)
    assert idlg.likelihood == cpl.likelihood == Gaussian(layers=layers)
    assert idlg.prior == cpl.prior == Uniform() and idlg.labels == cpl.labels == "given"
    ats = presets.inverting_gradients(steps=50, tv=1e-5, signed=False)
    assert ats.config == AttackConfig(
        steps=50, optimizer="adam", lr=0.1, schedule="step", decay=0.1, beta=1e-5, box=True
    )
    assert ats.likelihood == Cosine() and ats.prior == TotalVariation(power=1, reduction="mean")
    table2 = {a: presets.preset(a, steps=50) for a in ("l2", "l1", "cosine")}
    assert [t.likelihood for t in table2.values()] == [Gaussian(), Laplace(), Cosine()]
    for attack in table2.values():  # the Bayes loop; β is the search's to set
        assert replace(attack.config, beta=1.0) == AttackConfig(
            steps=50, lr=0.5, schedule="exponential", decay=0.94
        )
        assert attack.prior == TotalVariation(power=2, reduction="sum")


def test_preset_overrides_and_the_registry():
    assert sorted(presets.PRESETS) == sorted(
        [
            "dlg",
            "idlg",
            "inverting-gradients",
            "cpl",
            "gradinversion",
            "bayes",
            "l2",
            "l1",
            "cosine",
        ]
    )
    for name, make in presets.PRESETS.items():
        attack = make(Gaussian()) if name == "bayes" else make()
        assert attack.name == name  # the id that records use
    attack = presets.preset("inverting-gradients", steps=7, tv=0.5, lr=0.2, restarts=3, box=False)
    cfg = attack.config
    assert (cfg.steps, cfg.beta, cfg.lr, cfg.restarts, cfg.box) == (7, 0.5, 0.2, 3, False)
    assert (
        presets.preset("bayes", likelihood=Laplace(0.1), mc_samples=4, delta=0.5).config.delta
        == 0.5
    )
    assert presets.preset("l1", beta=0.3, steps=5).config.beta == 0.3
    assert presets.dlg(steps=30).with_config(lr=0.5).config.lr == 0.5
    cut = presets.bayes(Gaussian(0.1)).on_layers(include=["1.weight"])
    assert cut.likelihood.layers == LayerSelection(include=["1.weight"])
    assert cut.on_layers(None).likelihood.layers == LayerSelection()
    grad_inv = presets.grad_inversion(bn=0.0, steps=9)
    assert grad_inv.prior == gradinversion(tv=1e-4, l2=1e-6, bn=0.0)
    assert grad_inv.config.steps == 9 and grad_inv.config.optimizer == "adam"


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown attack preset 'cos'.*'cosine'"):
        presets.preset("cos")
    with pytest.raises(TypeError):
        presets.preset("dlg", tv=0.1)  # DLG has no prior weight to set


def test_attacks_that_share_a_loop_run_together_and_others_do_not():
    net, x, y, ups = _problem(2)
    l2, l1 = presets.l2(steps=3), presets.l1(steps=3, beta=0.5)
    both = run_together(net, ups, [l2, l1], labels=y, input_shape=(1, 3, 3))
    assert both.names == ["l2", "l1"] and both.setting_of("l1").beta == 0.5
    alone = l1(net, ups, labels=y, input_shape=(1, 3, 3))
    torch.testing.assert_close(both.inputs("l1"), alone.inputs(), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="differ in their loop"):
        run_together(net, ups, [l2, presets.l1(steps=4)], labels=y, input_shape=(1, 3, 3))
    with pytest.raises(ValueError, match="needs the labels"):
        l2(net, ups, input_shape=(1, 3, 3))


def test_dlg_recovers_image_and_label_and_idlg_reads_label():
    net = tiny_net(1)
    x = torch.rand(1, 1, 3, 3)
    y = torch.tensor([2])
    g = stack_updates([client_update(net, x, y)])
    res = presets.dlg(steps=30)(
        net, g, input_shape=(1, 3, 3), num_images=1, generator=torch.Generator().manual_seed(0)
    )
    assert res.labels_of().tolist() == [[2]]
    assert float((res.inputs() - x).abs().max()) < 1e-2
    res = presets.idlg(steps=30)(net, g, input_shape=(1, 3, 3))
    assert float((res.inputs() - x).abs().max()) < 1e-2


def test_idlg_reads_each_updates_label_from_stacked_updates():
    net, x, y, ups = _problem(3)
    res = presets.idlg(steps=2)(net, ups, input_shape=(1, 3, 3))
    assert res.per_update().shape == (3, 1, 1, 3, 3)
    assert presets.idlg().labels_for(net, ups, None).tolist() == y.unsqueeze(1).tolist()
    with pytest.raises(ValueError, match="one label per update"):
        presets.idlg(steps=2)(net, ups, input_shape=(1, 3, 3), num_images=2)


def test_grad_inversion_preset_runs_with_the_batchnorm_term():
    net = bn_net(1)
    x, y = torch.rand(2, 1, 4, 4), torch.tensor([0, 2])
    attack = presets.grad_inversion(steps=3)
    assert attack.prior.describe()["terms"][-1] == {"weight": 0.1, "prior": "bn-statistics"}
    res = attack(
        net, per_sample_updates(net, x, y), labels=y, input_shape=(1, 4, 4),
        bounds=image_bounds((0.5,), (0.5,)),
    )  # fmt: skip
    assert torch.isfinite(res.inputs()).all() and res.names == ["gradinversion"]


# ---------------------------------------------------------------- search


def test_the_tuners_stage_one_spans_the_range_of_appendix_a3():
    """Heuristic: f = 1e7/2^k while f > 5e-6, so β = 1/f runs from A.3's 1e-7 to 1.1e5 (the
    code's last halving passes A.3's 1e5); Bayes: f = 1000/2^k while f > 1e-4."""
    assert len(HEURISTIC_FACTORS) == 41 and len(BAYES_FACTORS) == 24
    betas = [Tuner().at(f).beta for f in HEURISTIC_FACTORS]
    assert math.isclose(betas[0], 1e-7) and 1e5 < betas[-1] < 2e5
    assert all(math.isclose(b / a, 2.0) for a, b in zip(betas, betas[1:], strict=False))
    assert BAYES_FACTORS[0] == 1e3 and 1e-4 < BAYES_FACTORS[-1] < 2e-4
    assert math.isclose(Tuner(scale=0.5).at(1.0).beta, 0.5), "ℓ2's ½ of the authors' distance"
    assert Tuner().at(1.0).beta_start is None, "stages 1 and 2 keep β constant"


def test_the_paper_grids_have_the_papers_counts_and_the_authors_values():
    """§6: 480 combinations for the heuristic attacks, 540 for the Bayes attack."""
    heuristic = Tuner(grid=HeuristicGrid()).around(1.0)
    bayes = Tuner("bayes", grid=BayesGrid(), noise=0.1).around(1.0)
    assert len(heuristic) == HeuristicGrid().size == 480
    assert len(bayes) == BayesGrid().size == 540
    # heuristic: β = c/(f·m_end) annealed from c/(f·m_start), both multipliers in (1, ½, 1.5, 2)
    ends = {round(1 / s.beta, 9) for s in heuristic}
    starts = {round(1 / (s.beta_start or s.beta), 9) for s in heuristic}
    assert ends == starts == {1.0, 0.5, 1.5, 2.0}
    assert {s.weighting for s in heuristic} == {"uniform", "exponential"}
    assert {round(s.lr, 9) for s in heuristic} == {0.5, 0.4, 0.6}
    # Bayes: β = c ∈ {0.1, 1, 10}, start c / min(f·m·n², 1): with n = 0.1 and f = 1, 100 c / m
    assert {s.beta for s in bayes} == {0.1, 1.0, 10.0}
    assert {round(s.beta_start / s.beta, 6) for s in bayes} == {
        round(100 / m, 6) for m in (1.0, 0.25, 0.5, 1.5, 2.0, 3.0)
    }
    assert 1.0 in {s.decay for s in bayes} and {s.weighting for s in bayes} == {"uniform"}
    with pytest.raises(TypeError, match="BayesGrid"):
        Tuner("bayes", grid=HeuristicGrid())


def test_the_annealed_prior_weight_follows_the_authors_schedule():
    """grad_attack.py: the likelihood's factor goes f_start·α^(t+1), α = (f_end/f_start)^(1/E),
    clamped at f_end; β_t = c/f_t, and the objective is scaled by β/β_t."""
    config = AttackConfig(steps=8, anneal_steps=4)
    settings = [Setting(0.1, 1.0, 1e-2, beta_start=1.0), Setting(0.1, 1.0, 0.5)]
    expected = [10 ** (-2 * min(t + 1, 4) / 4) for t in range(8)]
    for t, want in enumerate(expected):
        beta_t, scale = annealed(config, t, settings)
        assert math.isclose(float(beta_t[0]), want, rel_tol=1e-6)
        assert math.isclose(float(scale[0]), 1e-2 / want, rel_tol=1e-6)
        assert float(beta_t[1]) == 0.5 and float(scale[1]) == 1.0
    assert annealed(AttackConfig(), 0, [Setting(0.1, 1.0, 0.5)]) is None
    with pytest.raises(ValueError, match="anneal_steps"):
        annealed(AttackConfig(), 0, settings)
    with pytest.raises(ValueError, match="beta > 0"):
        Setting(0.1, 1.0, 0.0, beta_start=1.0)
    with pytest.raises(ValueError, match="L-BFGS"):
        AttackConfig(optimizer="lbfgs", anneal_steps=3)


def test_signed_adam_is_torch_adam_on_the_gradients_sign():
    """inversefed's signed loop: ``x.grad.sign_()`` then ``torch.optim.Adam.step()``."""
    target = torch.randn(2, 1, 1, 1, 5)
    x0 = torch.randn(2, 1, 1, 1, 5)

    def evaluate(x, z, d, beta=None):
        return x - target, None, 0.5 * (x - target).pow(2).sum((1, 2, 3, 4))

    config = AttackConfig(steps=6, lr=0.1, decay=1.0, signed=True)
    settings = [Setting(0.1, 1.0, 0.0), Setting(0.05, 1.0, 0.0)]
    ours, _, _ = adam_loop(config, evaluate, x0.clone(), torch.zeros(0), settings,
                           lambda: torch.zeros(1), lambda v: v, range(6), None)  # fmt: skip
    for h, lr in enumerate((0.1, 0.05)):
        ref = x0[h].clone().requires_grad_()
        opt = torch.optim.Adam([ref], lr=lr, eps=ADAM_EPS)
        for _ in range(6):
            opt.zero_grad()
            ref.grad = (ref.detach() - target[h]).sign()
            opt.step()
        torch.testing.assert_close(ours[h], ref.detach())


def test_an_annealed_attack_evaluates_at_beta_t_and_scales_the_objective():
    """The loop passes β_t to the objective and multiplies its value and gradient by β/β_t."""
    seen = []

    def evaluate(x, z, d, beta=None):
        seen.append(beta)
        return torch.ones_like(x), None, torch.ones(x.shape[:3])

    config = AttackConfig(steps=3, anneal_steps=2, decay=1.0)
    settings = [Setting(0.1, 1.0, 0.01, beta_start=1.0)]
    x = torch.zeros(1, 1, 1, 1, 2)
    _, _, history = adam_loop(config, evaluate, x, torch.zeros(0), settings,
                              lambda: torch.zeros(1), lambda v: v, range(3), None)  # fmt: skip
    assert [round(float(b), 6) for b in seen] == [0.1, 0.01, 0.01]
    assert [round(h, 6) for h in history] == [0.1, 1.0, 1.0]


def test_an_annealed_attack_with_equal_ends_is_the_constant_one():
    net, x, y, ups = _problem(1)
    loop = dict(prior=GaussianPrior(mean=0.5), steps=4, lr=0.1, decay=1.0)
    attack = presets.l2(**loop).with_config(anneal_steps=2)
    kw = dict(labels=y[:1].unsqueeze(1), input_shape=(1, 3, 3))
    same = attack(net, ups, settings=[Setting(0.1, 1.0, 0.01, beta_start=0.01)], **kw)
    constant = attack(net, ups, settings=[Setting(0.1, 1.0, 0.01)], **kw)
    torch.testing.assert_close(same.inputs(), constant.inputs())
    moved = attack(net, ups, settings=[Setting(0.1, 1.0, 0.01, beta_start=10.0)], **kw)
    assert not torch.allclose(moved.inputs(), constant.inputs())


def test_search_prefers_a_working_beta_over_a_crushing_one():
    net, x, y, ups = _problem(2)
    noisy = {k: v + 0.005 * torch.randn_like(v) for k, v in ups.items()}
    loop = dict(prior=GaussianPrior(mean=0.5), steps=150, lr=0.1, decay=0.99)
    attacks = {a: f(**loop).with_config(anneal_steps=75) for a, f in (("l2", presets.l2),
                                                                      ("l1", presets.l1))}  # fmt: skip
    grid = HeuristicGrid(end_factors=(1.0,), start_factors=(1.0, 2.0), lr_factors=(1.0,),
                         decays=(0.99,), weightings=("uniform",))  # fmt: skip
    tuner = Tuner(factors=(1e-4, 1e3), refine=2, grid=grid, lr=0.1, decay=0.99)
    found = search(
        net, noisy, labels=y.unsqueeze(1), truth=x.unsqueeze(1), denormalize=lambda t: t,
        attacks=attacks, tuners={"l2": tuner, "l1": tuner}, input_shape=(1, 3, 3),
    )  # fmt: skip
    assert found.best["l2"].beta < 1.0 and found.best["l1"].beta < 1.0
    assert {r["stage"] for r in found.rows} == {"log-beta", "linear-beta", "grid"}
    assert len(found.rows) == 2 * 2 + 2 * 2 + 2 * 2
    with pytest.raises(KeyError, match="no tuner"):
        search(net, noisy, labels=y.unsqueeze(1), truth=x.unsqueeze(1), denormalize=lambda t: t,
               attacks=attacks, tuners={"l2": tuner}, input_shape=(1, 3, 3))  # fmt: skip


def test_given_initial_points_start_the_attack_there():
    """R-GAP → DLG starts from given images: one vanishing step leaves them in place."""
    net, x, y, ups = _problem(1)
    start = torch.rand(1, 1, *x.shape[1:])  # N × n × input
    cfg = AttackConfig(steps=1, lr=1e-9)
    kw = dict(labels=y[:1], likelihood=Gaussian(), prior=Uniform(), config=cfg)
    got = reconstruct(net, ups, input_shape=tuple(x.shape[1:]), initial=start, **kw)
    torch.testing.assert_close(got.per_update(), start)
    with pytest.raises(ValueError, match="initial must have shape"):
        reconstruct(net, ups, input_shape=tuple(x.shape[1:]), initial=start[0], **kw)


def test_the_loop_names_a_float64_model():
    net = tiny_net().double()
    x, y = torch.rand(1, 1, 3, 3, dtype=torch.float64), torch.tensor([1])
    with pytest.raises(ValueError, match="float32"):
        reconstruct(
            net,
            stack_updates([client_update(net, x, y)]),
            labels=y,
            likelihood=Gaussian(),
            prior=Uniform(),
            input_shape=(1, 3, 3),
        )
