"""DP-SGD, gradient compression, Soteria and the ATS augmentation policies."""

from __future__ import annotations

import math

import pytest
import torch
from opacus.accountants import RDPAccountant
from torch import nn

from leakagelib import data, metrics
from leakagelib.attacks import AttackConfig, TotalVariation, image_bounds
from leakagelib.attacks.cosine import Cosine
from leakagelib.attacks.likelihoods import Gaussian
from leakagelib.defenses import (
    DPSGD,
    ATSAugmentation,
    ClippedGaussian,
    GradientCompression,
    Soteria,
    epsilon_spent,
    layer_drop_attack,
    layer_drop_likelihoods,
)
from leakagelib.defenses.ats import POLICY_TABLE, _magnitude, parse_policy
from leakagelib.defenses.compression import prune_smallest
from leakagelib.defenses.dpsgd import clip_per_sample
from leakagelib.defenses.soteria import _kept_layer_residuals, soteria_scores
from leakagelib.experiments.bayes_soteria import convbig
from leakagelib.fl import train
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
    loose = DPSGD(0.0, max_grad_norm=1e6).share(net, *batch)
    exact = client_update(net, *batch)
    for k in exact:
        assert torch.allclose(loose[k], exact[k], atol=1e-6)
    tight = DPSGD(0.0, max_grad_norm=1e-3).share(net, *batch)
    assert float(flat_norms({k: v.unsqueeze(0) for k, v in tight.items()})) <= 1e-3 * (1 + 1e-5)


def test_dpsgd_noise_has_the_stated_scale(batch) -> None:
    torch.manual_seed(0)
    wide = nn.Sequential(nn.Flatten(), nn.Linear(36, 500), nn.ReLU(), nn.Linear(500, 3))
    x, y = batch[0][:4], batch[1][:4]
    dp = DPSGD(2.0, max_grad_norm=0.5)
    noisy = dp.share(wide, x, y, torch.Generator().manual_seed(0))
    clean = DPSGD(0.0, max_grad_norm=0.5).share(wide, x, y)
    noise = torch.cat([(noisy[k] - clean[k]).flatten() for k in clean])
    assert noise.numel() > 19_000
    assert float(noise.std()) == pytest.approx(2.0 * 0.5 / 4, rel=0.03)
    assert dp.steps == 1
    with pytest.raises(ValueError, match="per-sample"):
        clip_per_sample({"a": torch.zeros(3, 2), "b": torch.zeros(4, 2)}, 1.0)


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
    assert dp.spent() == (0.0, 1e-5)
    net = small_net()
    for _ in range(3):
        dp.share(net, torch.rand(2, 1, 6, 6), torch.tensor([0, 1]))
    assert dp.steps == 3
    assert dp.spent() == (pytest.approx(epsilon_spent(1.0, 0.1, 3, 1e-5)), 1e-5)


@pytest.mark.parametrize(
    ("sigma", "rate", "steps", "expected"),
    [
        (0.6, 0.01, 1000, 8.665908110192095),
        (1.3, 0.05, 10, 1.1873256509368273),
        (4.0, 0.2, 37, 1.3681538473921124),
        (0.8, 0.0168, 25000, 36.266346309439776),
    ],
)
def test_epsilon_from_the_public_accountant_api_equals_the_previous_value(
    sigma: float, rate: float, steps: int, expected: float
) -> None:
    """The values the library computed when it wrote Opacus's history directly (one entry)."""
    assert epsilon_spent(sigma, rate, steps, 1e-5) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"noise_multiplier": float("nan")}, "noise_multiplier"),
        ({"noise_multiplier": float("inf")}, "noise_multiplier"),
        ({"noise_multiplier": -0.1}, "noise_multiplier"),
        ({"noise_multiplier": 1.0, "max_grad_norm": 0.0}, "max_grad_norm"),
        ({"noise_multiplier": 1.0, "max_grad_norm": float("nan")}, "max_grad_norm"),
        ({"noise_multiplier": 1.0, "sample_rate": 0.0}, "sample_rate"),
        ({"noise_multiplier": 1.0, "sample_rate": 1.5}, "sample_rate"),
        ({"noise_multiplier": 1.0, "delta": 1.0}, "delta"),
        ({"noise_multiplier": 1.0, "batch_size": 0}, "batch_size"),
    ],
)
def test_dpsgd_rejects_bad_hyper_parameters_by_name(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        DPSGD(**kwargs)
    if named in ("noise_multiplier", "sample_rate", "delta"):
        args = {"noise_multiplier": 1.0, "sample_rate": 0.1, "delta": 1e-5, **kwargs}
        with pytest.raises(ValueError, match=named):
            epsilon_spent(args["noise_multiplier"], args["sample_rate"], 10, args["delta"])


def test_dp_likelihood_is_clipped_gaussian(batch) -> None:
    with pytest.raises(ValueError, match="batch size"):
        DPSGD(1.0, max_grad_norm=0.1).likelihood()  # no share yet, no batch_size given
    dp = DPSGD(1.0, max_grad_norm=0.1, batch_size=1)
    lik = dp.likelihood()
    assert isinstance(lik, ClippedGaussian) and lik.sigma == pytest.approx(0.1)
    dp.share(small_net(), *batch)  # the last share's batch size wins
    assert dp.likelihood().sigma == pytest.approx(0.1 / 5)
    dp.share(small_net(), *batch, per_image=True)  # every image a client with a batch of one
    assert dp.likelihood().sigma == pytest.approx(0.1)
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
    out = GradientCompression(rate).perturb(update)
    for k, v in update.items():
        pruned = out[k] == 0
        assert int(pruned.sum()) == round(rate * v.numel())
        if 0 < int(pruned.sum()) < v.numel():  # the kept entries are the largest ones
            assert float(v[~pruned].abs().min()) >= float(v[pruned].abs().max())
        assert torch.equal(out[k][~pruned], v[~pruned])
    with pytest.raises(ValueError, match="rate must be in"):
        prune_smallest(torch.ones(3), 1.5)
    with pytest.raises(NotImplementedError):
        GradientCompression(rate).likelihood()


# ---------------------------------------------------------------------------- Soteria


@pytest.mark.parametrize("layer", ["3", "5"])
def test_soteria_scores_match_the_reference_loop(batch, layer: str) -> None:
    """Layer 3 reads 144 features of a 36-pixel image (forward mode, over the pixels), layer 5
    reads 12 (reverse mode, over the features); both in several passes of 8 rows."""
    net = small_net().eval()
    images = batch[0]
    scores = soteria_scores(net, images, layer, rows=8)
    # Reference: one backward pass per feature, as in jeremy313/Soteria.
    x = images.clone().requires_grad_(True)
    r = net[: int(layer)](x)
    expected = torch.zeros(r.shape[1])
    for f in range(r.shape[1]):
        (grad,) = torch.autograd.grad(r[:, f].sum(), x, retain_graph=True)
        expected[f] = (grad.reshape(x.shape[0], -1).norm(dim=1) / (r[:, f].detach() + 0.1)).sum()
    assert torch.allclose(scores, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="rows must be a positive integer"):
        soteria_scores(net, images, layer, rows=0)
    per_image = soteria_scores(net, images, layer, per_image=True)
    assert per_image.shape == (5, r.shape[1])
    assert torch.allclose(per_image.sum(dim=0), expected, rtol=1e-5, atol=1e-6)


def test_soteria_prunes_columns_of_the_defended_layer_only(batch) -> None:
    net = small_net().eval()
    defense = Soteria("3", pruning_rate=0.75)
    shared = defense.share(net, *batch)
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
        Soteria("0").share(net, *batch)


def test_soteria_per_image_fits_one_mask_per_client(batch) -> None:
    net = small_net().eval()
    defense = Soteria("3", pruning_rate=0.75)
    shared = defense.share(net, *batch, per_image=True)
    masks = defense.mask
    assert masks is not None and masks.shape == (5, 144)
    assert shared["3.weight"].shape == (5, 12, 144)
    for i in range(5):  # image i's slice is what a client holding only image i sends
        alone = Soteria("3", pruning_rate=0.75)
        one = alone.share(net, batch[0][i : i + 1], batch[1][i : i + 1])
        assert torch.equal(alone.mask, masks[i])
        for k in one:
            assert torch.allclose(shared[k][i], one[k], atol=1e-6)


def test_soteria_layer_drop_likelihood_ignores_the_defended_layer(batch) -> None:
    net = small_net()
    names = [n for n, _ in net.named_parameters()]
    lik = Soteria("3").likelihood()
    assert isinstance(lik, Cosine)
    assert lik.layers.mask(names) == [True, True, False, False, True, True]
    assert isinstance(Soteria("3", attack="gaussian").likelihood(), Gaussian)
    with pytest.raises(ValueError, match="attack must be one of"):
        Soteria("3", attack="l2")
    with pytest.raises(ValueError, match="pruning_rate"):
        Soteria("3", pruning_rate=float("nan"))
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


# --------------------------------------------------- the layer-drop attack (Bayes §5, Fig. 5)


def _soteria_digits(hidden: tuple[int, int], n: int):
    """ConvBig of the given widths, trained 10 steps (batch 32) on the 8×8 digits, and the first
    n test digits as client images: the Soteria scenario of Fig. 5, small enough for a test."""
    images, labels, norm = data.load("digits", n=n, shuffle=False)
    train_x, train_y, _ = data.load("digits", split="train", seed=0)
    net = convbig((1, 8, 8), hidden, seed=0)
    trained = train(net, norm.normalize(train_x), train_y, steps=10, batch_size=32, seed=0)
    return trained.model, images, labels, norm


def test_layer_drop_attack_beats_the_direct_attack_and_finds_the_defended_layer() -> None:
    net, images, labels, norm = _soteria_digits((64, 32), n=2)
    x = norm.normalize(images)
    soteria = Soteria("fc1.linear", pruning_rate=0.8)
    stacked = soteria.share(net, x, labels, per_image=True)
    config = AttackConfig(steps=150, lr=0.3, schedule="constant", beta=1e-6, box=True)
    result = layer_drop_attack(
        net, stacked, labels=labels, input_shape=(1, 8, 8), prior=TotalVariation(),
        config=config, kind="gaussian", extra={"direct": Gaussian()},
        bounds=image_bounds(norm.mean, norm.std), generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert list(result.candidates) == ["fc1.linear", "fc2.linear", "fc3.linear", "direct"]
    assert result.objective.shape == (4, 2)
    assert result.chosen == ["fc1.linear", "fc1.linear"]  # never "direct": extras are not chosen
    assert result.images.shape == (2, 1, 1, 8, 8)
    assert torch.equal(result.images, result.candidates["fc1.linear"])

    def psnr(t: torch.Tensor) -> torch.Tensor:
        return metrics.psnr(norm.denormalize(t[:, 0]).clamp(0, 1), images)

    drop, direct = psnr(result.candidates["fc1.linear"]), psnr(result.candidates["direct"])
    assert bool((drop > direct + 5).all()), (drop, direct)


@pytest.mark.parametrize("defended", ["fc1.linear", "fc2.linear", "fc3.linear"])
def test_the_choice_score_vanishes_only_for_the_defended_layer_at_the_true_image(defended) -> None:
    """Given the client's own image for every candidate, the candidate that drops the defended
    layer matches all it reads (score ~0) and every other one reads the pruned gradient."""
    net, images, labels, norm = _soteria_digits((64, 32), n=2)
    x = norm.normalize(images)
    stacked = Soteria(defended, pruning_rate=0.8).share(net, x, labels, per_image=True)
    layers = ["fc1.linear", "fc2.linear", "fc3.linear"]
    truth = x.unsqueeze(1).unsqueeze(0).expand(len(layers), -1, -1, -1, -1, -1)  # L × N × 1 × ...
    score = _kept_layer_residuals(net, stacked, labels, truth, layers)
    right = layers.index(defended)
    assert bool((score[right] < 1e-8).all()), score
    others = torch.cat([score[:right], score[right + 1 :]])
    assert bool((others > 1e-3).all()), score


def test_layer_drop_attack_rejects_unknown_layers_and_clashing_extras(batch) -> None:
    net = small_net()
    update = {k: v.unsqueeze(0) for k, v in client_update(net, batch[0][:1], batch[1][:1]).items()}
    args = dict(labels=batch[1][:1], input_shape=(1, 6, 6), prior=TotalVariation(),
                config=AttackConfig(steps=1))  # fmt: skip
    with pytest.raises(KeyError, match="not fully connected"):
        layer_drop_attack(net, update, layers=["0"], **args)
    with pytest.raises(ValueError, match="clash"):
        layer_drop_attack(net, update, extra={"3": Cosine()}, **args)
    one = layer_drop_attack(net, update, layers=["5"], **args)
    assert list(one.candidates) == ["5"] and one.chosen == ["5"]
