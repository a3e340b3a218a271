"""Tests of leakagelib.attacks: likelihoods, priors, the batched loop, presets and search."""

from __future__ import annotations

import math

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
)
from leakagelib.attacks.loop import sample_ball
from leakagelib.attacks.search import Grid, log_beta_grid, search
from leakagelib.gradients import client_update, per_sample_updates

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
    kw = dict(labels=y, likelihood=Gaussian(), input_shape=(1, 4, 4), stacked=True)
    penalty = BatchNormStatistics(net)

    def bn_gap(beta: float) -> float:
        cfg = AttackConfig(steps=40, lr=0.05, schedule="constant", beta=beta)
        prior = gradinversion(tv=0.0, l2=0.0, bn=1.0)
        gen = torch.Generator().manual_seed(0)
        res = reconstruct(net, ups, prior=prior, config=cfg, generator=gen, **kw)
        assert torch.isfinite(res.images).all()
        return -float(penalty.log_prob(res.images[0, 0, 0].unsqueeze(0)))

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
        client_update(net, x, y),
        input_shape=(1, 3, 3),
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.isfinite(res.images).all()
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
        stacked=True,
    )
    assert res.images.shape == (1, 2, 1, 1, 3, 3)
    err = (res.images[0, :, 0] - x).abs().max()
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
        stacked=True,
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
    kw = dict(labels=y, prior=TotalVariation(2), config=cfg, input_shape=(1, 3, 3), stacked=True)
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
    assert torch.allclose(a.images, b.images, atol=1e-4)


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
        stacked=True,
        bounds=(lo, hi),
    )
    assert float(res.images.min()) >= -1 - 1e-6 and float(res.images.max()) <= 1 + 1e-6
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
            stacked=True,
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
            stacked=True,
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
            stacked=True,
        )


# ---------------------------------------------------------------- presets


def test_table1_presets_parts():
    assert presets.dlg().parts()["prior"] == {"prior": "uniform"}
    assert presets.dlg().parts()["likelihood"]["likelihood"] == "gaussian"
    ig = presets.inverting_gradients().parts()
    assert ig["likelihood"]["likelihood"] == "cosine" and ig["prior"]["prior"] == "tv"
    bayes = presets.bayes(Laplace(0.1))
    assert bayes.config.lr == 0.5 and bayes.config.decay == 0.94 and bayes.config.steps == 200


def test_dlg_recovers_image_and_label_and_idlg_reads_label():
    net = tiny_net(1)
    x = torch.rand(1, 1, 3, 3)
    y = torch.tensor([2])
    g = client_update(net, x, y)
    res = presets.dlg(steps=30)(
        net, g, input_shape=(1, 3, 3), num_images=1, generator=torch.Generator().manual_seed(0)
    )
    assert int(res.labels[0, 0, 0]) == 2
    assert float((res.images[0, 0] - x).abs().max()) < 1e-2
    res = presets.idlg(steps=30)(net, g, input_shape=(1, 3, 3))
    assert float((res.images[0, 0] - x).abs().max()) < 1e-2


# ---------------------------------------------------------------- search


def test_log_beta_grid_matches_the_authors_range():
    grid = log_beta_grid()
    assert grid[0] == 1e7 and grid[-1] >= 5e-6 and grid[-1] / 2 < 5e-6
    assert all(math.isclose(a / b, 2.0) for a, b in zip(grid, grid[1:], strict=False))


def test_search_prefers_a_working_beta_over_a_crushing_one():
    net, x, y, ups = _problem(2)
    noisy = {k: v + 0.005 * torch.randn_like(v) for k, v in ups.items()}
    cfg = AttackConfig(steps=150, lr=0.1, decay=0.99)
    found = search(
        net,
        noisy,
        labels=y.unsqueeze(1),
        truth=x.unsqueeze(1),
        denormalize=lambda t: t,
        attacks={"l2": Gaussian(), "l1": Laplace()},
        prior=GaussianPrior(mean=0.5),
        config=cfg,
        input_shape=(1, 3, 3),
        betas=[1e4, 1e-3],
        refine=2,
        grid=Grid(
            lr_factors=(1.0,),
            decays=(0.99,),
            beta_factors=(1.0,),
            weightings=("uniform", "exponential"),
        ),
    )
    assert found.best["l2"].beta < 1.0 and found.best["l1"].beta < 1.0
    assert {r["stage"] for r in found.rows} == {"log-beta", "linear-beta", "grid"}
    assert len(found.rows) == 2 * 2 + 2 * 2 + 2 * 2


def test_given_initial_points_start_the_attack_there():
    """R-GAP → DLG starts from given images: one vanishing step leaves them in place."""
    net, x, y, ups = _problem(1)
    start = torch.rand(1, *x.shape[1:])
    cfg = AttackConfig(steps=1, lr=1e-9)
    got = reconstruct(
        net,
        {k: v[0] for k, v in ups.items()},
        labels=y[:1],
        likelihood=Gaussian(),
        prior=Uniform(),
        config=cfg,
        input_shape=tuple(x.shape[1:]),
        initial=start,
    )
    torch.testing.assert_close(got.images[0, 0], start)
    with pytest.raises(ValueError, match="initial must have shape"):
        reconstruct(
            net,
            {k: v[0] for k, v in ups.items()},
            labels=y[:1],
            likelihood=Gaussian(),
            prior=Uniform(),
            config=cfg,
            input_shape=tuple(x.shape[1:]),
            initial=torch.rand(2, 1, *x.shape[1:]),
        )


def test_the_loop_names_a_float64_model():
    net = tiny_net().double()
    x, y = torch.rand(1, 1, 3, 3, dtype=torch.float64), torch.tensor([1])
    with pytest.raises(ValueError, match="float32"):
        reconstruct(
            net,
            client_update(net, x, y),
            labels=y,
            likelihood=Gaussian(),
            prior=Uniform(),
            input_shape=(1, 3, 3),
        )
