"""DP-SGD, gradient compression, Soteria and the ATS augmentation policies."""

from __future__ import annotations

import math

import pytest
import torch
from opacus.accountants import RDPAccountant
from torch import nn

from leakagelib.attacks.likelihoods import Cosine, Gaussian
from leakagelib.defenses.ats import POLICY_TABLE, ATSAugmentation, _magnitude, parse_policy
from leakagelib.defenses.compression import GradientCompression, prune_smallest
from leakagelib.defenses.dpsgd import DPSGD, ClippedGaussian, clip_per_sample, epsilon_spent
from leakagelib.defenses.soteria import Soteria, layer_drop_likelihoods, soteria_scores
from leakagelib.gradients import client_update, per_sample_updates


def small_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 12),
        nn.ReLU(),
        nn.Linear(12, 3),
    )


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(5, 1, 6, 6, generator=g), torch.tensor([0, 1, 2, 0, 1])


def flat_norms(updates: dict[str, torch.Tensor]) -> torch.Tensor:
    n = next(iter(updates.values())).shape[0]
    return torch.sqrt(sum(g.reshape(n, -1).pow(2).sum(1) for g in updates.values()))


# ----------------------------------------------------------------------------- DP-SGD


def test_clipping_bounds_every_per_sample_norm(batch) -> None:
    per = per_sample_updates(small_net(), *batch)
    norms = flat_norms(per)
    c = float(norms.median())
    clipped = clip_per_sample(per, c)
    after = flat_norms(clipped)
    assert bool((after <= c * (1 + 1e-5)).all())
    small = norms <= c
    assert torch.allclose(after[small], norms[small])  # below the bound: unchanged
    assert torch.allclose(after[~small], torch.full_like(after[~small], c), rtol=1e-5)


def test_dpsgd_without_noise_is_the_mean_clipped_gradient(batch) -> None:
    net = small_net()
    loose = DPSGD(0.0, max_grad_norm=1e6).privatize(net, *batch)
    exact = client_update(net, *batch)
    for k in exact:
        assert torch.allclose(loose[k], exact[k], atol=1e-6)
    tight = DPSGD(0.0, max_grad_norm=1e-3).privatize(net, *batch)
    assert float(flat_norms({k: v.unsqueeze(0) for k, v in tight.items()})) <= 1e-3 * (1 + 1e-5)


def test_dpsgd_noise_has_the_stated_scale() -> None:
    zeros = {"w": torch.zeros(4, 20000)}
    dp = DPSGD(2.0, max_grad_norm=0.5)
    out = dp.apply(zeros, torch.Generator().manual_seed(0))
    assert float(out["w"].std()) == pytest.approx(2.0 * 0.5 / 4, rel=0.03)
    assert dp.steps == 1
    with pytest.raises(ValueError, match="per-sample"):
        dp.apply({"a": torch.zeros(3, 2), "b": torch.zeros(4, 2)})


def test_epsilon_falls_as_the_noise_multiplier_rises() -> None:
    eps = [epsilon_spent(s, 0.01, 1000, 1e-5) for s in (0.6, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in zip(eps, eps[1:], strict=False))
    assert epsilon_spent(1.0, 0.01, 2000, 1e-5) > epsilon_spent(1.0, 0.01, 1000, 1e-5)
    acc = RDPAccountant()
    for _ in range(10):
        acc.step(noise_multiplier=1.3, sample_rate=0.05)
    assert epsilon_spent(1.3, 0.05, 10, 1e-5) == pytest.approx(acc.get_epsilon(1e-5))
    assert math.isinf(epsilon_spent(0.0, 0.1, 1, 1e-5))
    dp = DPSGD(1.0, sample_rate=0.1)
    for _ in range(3):
        dp.apply({"w": torch.ones(2, 3)})
    assert dp.spent() == (pytest.approx(epsilon_spent(1.0, 0.1, 3, 1e-5)), 1e-5)


def test_dp_likelihood_is_clipped_gaussian(batch) -> None:
    dp = DPSGD(1.0, max_grad_norm=0.1)
    lik = dp.likelihood(batch_size=1)
    assert isinstance(lik, ClippedGaussian) and lik.sigma == pytest.approx(0.1)
    g = client_update(small_net(), batch[0][:1], batch[1][:1])
    clipped = {k: v.unsqueeze(0) for k, v in g.items()}
    clipped = {k: v[0] for k, v in clip_per_sample(clipped, 0.1).items()}
    w = lik.weights(list(g))
    assert float(lik.log_prob(clipped, g, w)) == pytest.approx(0.0, abs=1e-6)
    assert float(lik.log_prob(g, g, w)) < 0  # the unclipped gradient is not what DP-SGD sends


# ------------------------------------------------------------------------ compression


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.5, 0.9, 1.0])
def test_compression_zeroes_exactly_the_share_per_layer(rate: float) -> None:
    g = torch.Generator().manual_seed(1)
    update = {"a": torch.randn(7, 9, generator=g) + 0.01, "b": torch.randn(13, generator=g) + 0.01}
    out = GradientCompression(rate).apply(update)
    for k, v in update.items():
        pruned = out[k] == 0
        assert int(pruned.sum()) == round(rate * v.numel())
        if 0 < int(pruned.sum()) < v.numel():  # the kept entries are the largest ones
            assert float(v[~pruned].abs().min()) >= float(v[pruned].abs().max())
        assert torch.equal(out[k][~pruned], v[~pruned])
    with pytest.raises(ValueError, match="pruning rate"):
        prune_smallest(torch.ones(3), 1.5)
    with pytest.raises(NotImplementedError):
        GradientCompression(rate).likelihood()


# ---------------------------------------------------------------------------- Soteria


def test_soteria_scores_match_the_reference_loop(batch) -> None:
    net = small_net().eval()
    images = batch[0]
    scores = soteria_scores(net, images, "3", chunk=5)
    # Reference: one backward pass per feature, as in jeremy313/Soteria.
    x = images.clone().requires_grad_(True)
    r = net[2](net[1](net[0](x)))
    expected = torch.zeros(r.shape[1])
    for f in range(r.shape[1]):
        (grad,) = torch.autograd.grad(r[:, f].sum(), x, retain_graph=True)
        expected[f] = (grad.reshape(x.shape[0], -1).norm(dim=1) / (r[:, f].detach() + 0.1)).sum()
    assert torch.allclose(scores, expected, rtol=1e-5, atol=1e-6)


def test_soteria_prunes_columns_of_the_defended_layer_only(batch) -> None:
    net = small_net().eval()
    defense = Soteria("3", pruning_rate=0.75)
    shared = defense.defend(net, *batch)
    clean = client_update(net, *batch)
    mask = defense.mask
    assert mask is not None and mask.numel() == 144
    assert int((mask == 0).sum()) == 108  # 75 % of 144 features, no ties in the scores
    assert torch.equal(shared["3.weight"][:, mask == 0], torch.zeros(12, 108))
    assert torch.equal(shared["3.weight"][:, mask == 1], clean["3.weight"][:, mask == 1])
    for k in clean:
        if k != "3.weight":
            assert torch.equal(shared[k], clean[k])
    with pytest.raises(TypeError, match="fully connected"):
        Soteria("0").fit(net, batch[0])
    with pytest.raises(RuntimeError, match="fit"):
        Soteria("3").apply(clean)


def test_soteria_layer_drop_likelihood_ignores_the_defended_layer(batch) -> None:
    net = small_net()
    names = [n for n, _ in net.named_parameters()]
    lik = Soteria("3").likelihood()
    assert isinstance(lik, Cosine)
    assert lik.layers.mask(names) == [True, True, False, False, True, True]
    assert isinstance(Soteria("3").likelihood("gaussian"), Gaussian)
    assert list(layer_drop_likelihoods(net)) == ["3", "5"]


# -------------------------------------------------------------------------------- ATS


def test_policy_table_and_parsing() -> None:
    assert len(POLICY_TABLE) == 50
    assert [POLICY_TABLE[i] for i in (7, 4, 15)] == [
        ("translateY", 2),
        ("sharpness", 1),
        ("brightness", 9),
    ]
    assert [POLICY_TABLE[i] for i in (21, 13, 3)] == [
        ("translateX", 5),
        ("brightness", 5),
        ("translateX", 9),
    ]
    assert _magnitude("translateX", 9) == pytest.approx(150 / 331)
    assert _magnitude("brightness", 9) == pytest.approx(0.5)
    assert parse_policy("21-13-3+7-4-15") == [[21, 13, 3], [7, 4, 15]]
    with pytest.raises(ValueError, match="outside"):
        parse_policy("7-50")
    with pytest.raises(ValueError, match="integers"):
        parse_policy("7-a")


def test_ats_augmentation_is_seeded_and_changes_images() -> None:
    images = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for policy in ("7-4-15", "21-13-3", "21-13-3+7-4-15"):
        aug = ATSAugmentation(policy)
        a = aug(images, torch.Generator().manual_seed(3))
        b = aug(images, torch.Generator().manual_seed(3))
        assert a.shape == images.shape and torch.equal(a, b)
        assert float(a.min()) >= 0 and float(a.max()) <= 1
        assert not torch.allclose(a, images)
    invert = ATSAugmentation("29", crop_flip=False)  # invert, always applied
    assert torch.allclose(invert(images), 1 - images)
    shifted = ATSAugmentation("3", crop_flip=False)(images)  # translateX by 15 px
    black_columns = (shifted == 0).all(dim=(1, 2)).sum(dim=1)  # per image, either side
    assert bool((black_columns == 15).all())
