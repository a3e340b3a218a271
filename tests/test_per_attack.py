"""The hooked route of the attack objective equals the ``vmap`` route (leakagelib.attacks.per_attack).

Both engines evaluate the same objective; these tests run them on the same
iterates and compare the objective and its gradients, across the zoo's layer
types (convolution, dense, group norm, batch norm in eval mode, layer norm
via the MLP's norms), the likelihoods (the factored Gaussian and cosine, and
the materialising ℓ1 and pruned ones), layer selections, several settings
with different likelihoods and priors, restarts, Monte-Carlo samples, joint
reconstruction of two images, soft labels, R-GAP's logistic loss, and the
variational bottlenecks (PRECODE, CVB), whose noise each route draws its own
way, compared with that noise held at zero.
"""

from __future__ import annotations

import pytest
import torch

from leakagelib.attacks import (
    AttackConfig,
    Cosine,
    Gaussian,
    Laplace,
    LayerSelection,
    Pruned,
    Setting,
    TotalVariation,
    Uniform,
    residuals,
)
from leakagelib.attacks.objective import batched_objective
from leakagelib.attacks.per_attack import Observed, Simulated, row_losses, unsupported_reason
from leakagelib.gradients import client_update, per_sample_updates, stack_updates
from leakagelib.losses import loss_function
from leakagelib.models import build


def _case(
    name: str, shape: tuple[int, int, int], classes: int = 10, n_updates: int = 2, *,
    eval_mode: bool = False, **kw,
):  # fmt: skip
    torch.manual_seed(0)
    model = build(name, shape, classes, **kw)
    model.train(not eval_mode)
    x = torch.rand(n_updates, *shape)
    y = torch.arange(n_updates) % classes
    return model, per_sample_updates(model, x, y), y[:, None]


def _both(model, observed, labels, settings, lik, prior, config, n=1, restarts=1, k=1):
    """The objective and gradients of both engines on the same random iterates and offsets."""
    H, N = len(settings), next(iter(observed.values())).shape[0]
    input_shape = model[0].in_shape
    shape = (H, N, restarts, n, *input_shape)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=gen)
    z = torch.randn((H, N, restarts, n, 10), generator=gen)
    d = 0.05 * torch.randn((H, N, restarts, k, n, *input_shape), generator=gen)
    out = []
    for engine in ("vmap", "hooks"):
        cfg = config.with_(engine=engine)
        f = batched_objective(
            model, observed, labels, settings, lik, prior, cfg, shape=shape,
            loss="logistic" if labels is not None and labels.min() < 0 else "ce",
            device=torch.device("cpu"),
        )  # fmt: skip
        out.append(f(x, z, d))
    return out


def _close(a, b, rtol=1e-4):
    for u, v in zip(a, b, strict=True):
        if u is None:
            assert v is None
            continue
        scale = u.abs().max().clamp_min(1e-12)
        assert ((u - v).abs().max() / scale) < rtol, (u.flatten()[:5], v.flatten()[:5])


CASES = [
    ("bayes-cnn", (1, 12, 12), {}),
    ("mlp", (1, 8, 8), {}),
    ("lenet", (3, 16, 16), {}),
    ("resnet18", (3, 16, 16), {"width": 4}),
]


@pytest.mark.parametrize("name,shape,kw", CASES)
@pytest.mark.parametrize(
    "lik",
    [Gaussian(0.1), Cosine(), Laplace(0.1), Gaussian(0.1, LayerSelection(include=[0, -1]))],
    ids=["gaussian", "cosine", "laplace", "gaussian-two-layers"],
)
def test_engines_agree_on_one_setting(name, shape, kw, lik):
    model, observed, labels = _case(name, shape, **kw)
    cfg = AttackConfig(steps=1)
    a, b = _both(model, observed, labels, [Setting(0.1, 1.0, 0.3)], lik, TotalVariation(), cfg)
    _close(a, b)


def test_engines_agree_with_mixed_settings_restarts_samples_and_two_images():
    model, observed, _ = _case("bayes-cnn", (1, 10, 10), n_updates=3)
    labels = torch.tensor([[0, 1], [2, 3], [4, 4]])
    masks = {k: (torch.rand(v.shape[1:]) < 0.5).float() for k, v in observed.items()}
    liks = [Gaussian(0.1), Laplace(0.2), Cosine(), Pruned("gaussian", 0.1, 0.5, masks),
            Pruned("laplace", 0.1, 0.5, masks), Pruned("laplace", 0.1, 0.5)]  # fmt: skip
    priors = [TotalVariation(), Uniform(), TotalVariation(), Uniform(), Uniform(), Uniform()]
    settings = [
        Setting(0.1, 1.0, 0.5),
        Setting(0.1, 1.0, 0.0),
        Setting(0.1, 1.0, 2.0, weighting="exponential"),
        Setting(0.1, 1.0, 1.0),
        Setting(0.1, 1.0, 1.0, weighting="exponential"),
        Setting(0.1, 1.0, 1.0),
    ]
    cfg = AttackConfig(steps=1, restarts=2, mc_samples=2, delta=0.1)
    a, b = _both(model, observed, labels, settings, liks, priors, cfg, n=2, restarts=2, k=2)
    _close(a, b)


def test_engines_agree_on_soft_labels():
    model, observed, _ = _case("lenet", (3, 12, 12))
    cfg = AttackConfig(steps=1, optimize_labels=True, optimizer="lbfgs")
    a, b = _both(model, observed, None, [Setting(1.0, 1.0, 0.0)], Gaussian(1.0), Uniform(), cfg)
    _close(a, b)


def test_engines_agree_on_the_logistic_loss():
    model, _, _ = _case("cnn6", (3, 16, 16), classes=1)
    x = torch.rand(2, 3, 16, 16)
    y = torch.tensor([1, -1])
    observed = per_sample_updates(model, x, y, loss="logistic")
    cfg = AttackConfig(steps=1)
    a, b = _both(
        model, observed, y[:, None], [Setting(0.1, 1.0, 0.0)], Gaussian(1.0), Uniform(), cfg
    )
    _close(a, b)


def test_batch_norm_in_eval_mode_is_batched_by_hooks():
    model, observed, labels = _case("convnet", (3, 16, 16), width=8, eval_mode=True)
    assert unsupported_reason(model) is None
    cfg = AttackConfig(steps=1)
    a, b = _both(model, observed, labels, [Setting(0.1, 1.0, 0.1)], Cosine(), TotalVariation(), cfg)
    _close(a, b)


def test_models_that_mix_rows_are_refused_by_hooks_and_use_vmap():
    model, observed, labels = _case("convnet", (3, 16, 16), width=8, eval_mode=True)
    model.train()
    assert "batch statistics" in unsupported_reason(model)
    model.eval()
    model[1].norm.track_running_stats = False
    assert "batch statistics" in unsupported_reason(model)
    shape = (1, 2, 1, 1, 3, 16, 16)
    args = (model, observed, labels, [Setting(0.1, 1.0, 0.1)], Gaussian(0.1), Uniform())
    with pytest.raises(ValueError, match="engine='hooks' cannot batch attacks.*batch statistics"):
        batched_objective(*args, AttackConfig(engine="hooks"), shape=shape, loss="ce",
                          device=torch.device("cpu"))  # fmt: skip
    f = batched_objective(*args, AttackConfig(), shape=shape, loss="ce", device=torch.device("cpu"))
    gx, _, value = f(
        torch.randn(shape), torch.zeros((1, 2, 1, 1, 1)), torch.zeros((1, 2, 1, 1, 1, 3, 16, 16))
    )
    assert gx.shape == shape and value.shape == (1, 2, 1)


def test_row_losses_average_to_the_client_loss():
    out = torch.randn(6, 10)
    y = torch.arange(6)
    assert torch.allclose(row_losses(out, y, "ce").mean(), loss_function("ce")(out, y))
    soft = torch.softmax(torch.randn(6, 10), -1)
    assert torch.allclose(row_losses(out, soft, "ce").mean(), loss_function("ce")(out, soft))
    mu, s = torch.randn(6, 1), torch.tensor([1, -1, 1, 1, -1, -1])
    assert torch.allclose(row_losses(mu, s, "logistic").mean(), loss_function("logistic")(mu, s))
    with pytest.raises(KeyError, match="unknown loss"):
        row_losses(out, y, "hinge")


@pytest.mark.parametrize("lik", [Gaussian(0.1), Cosine()], ids=["gaussian", "cosine"])
def test_engines_agree_on_a_single_attack_of_two_images(lik):
    """One attack takes the plain-autograd branch of the hooked route."""
    model, observed, _ = _case("lenet", (3, 12, 12), n_updates=1)
    labels = torch.tensor([[3, 5]])
    cfg = AttackConfig(steps=1)
    a, b = _both(model, observed, labels, [Setting(0.1, 1.0, 0.2)], lik, TotalVariation(), cfg, n=2)
    _close(a, b)


@pytest.mark.parametrize(
    ("channels", "size", "stride", "rows", "route"),
    [
        (8, 12, 1, 1, "grouped"),
        (6, 11, 2, 3, "grouped"),
        (1, 12, 1, 2, "unfold"),
        (8, 4, 1, 1, "unfold"),
    ],
)
def test_conv_weight_gradients_equal_each_attacks_own_gradient(channels, size, stride, rows, route):
    """Both routes of the per-attack convolution gradients (grouped kernel, unfolded product)."""
    from leakagelib.attacks import per_attack

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(channels, 5, 3, stride=stride, padding=1)
    fan_in, attacks = conv.weight[0].numel(), 4
    a = torch.randn(attacks * rows, channels, size, size, requires_grad=True)
    out = conv(a)
    delta = torch.randn_like(out, requires_grad=True)
    positions = rows * out[0, 0].numel()
    grouped = fan_in > per_attack.UNFOLD_MAX_FAN_IN and positions > per_attack.UNFOLD_MAX_POSITIONS
    assert grouped == (route == "grouped")
    got = per_attack._conv_weight_gradients(conv, a, delta, attacks)
    for i in range(attacks):
        rows_i = slice(i * rows, (i + 1) * rows)
        (own,) = torch.autograd.grad(
            (conv(a[rows_i]) * delta[rows_i]).sum(), conv.weight, retain_graph=True
        )
        torch.testing.assert_close(got[i], own, rtol=1e-4, atol=1e-5)
    # differentiable in both arguments, as the attack's second backward needs
    ga, gd = torch.autograd.grad(got.pow(2).sum(), (a, delta))
    assert ga.abs().sum() > 0 and gd.abs().sum() > 0


#: CVB at position 1 with the authors' KL form (the CVB experiments' update holds its β·KL).
CVB_KL = {"kind": "cvb", "position": 1, "kl": "reference"}


def _bottleneck_case(spec: dict | None, n_updates: int = 2):
    from leakagelib.experiments.cvb_common import cnn

    model = cnn(spec, seed=0)
    torch.manual_seed(0)
    x = torch.rand(n_updates, *model[0].in_shape)
    y = torch.arange(n_updates)
    return model, per_sample_updates(model, x, y), y[:, None]


@pytest.mark.parametrize("spec", [None, {"kind": "cvb", "position": 1},
                                  {"kind": "precode", "position": 3, "K": 32, "bias": False}],
                         ids=["cnn", "cvb", "precode"])  # fmt: skip
@pytest.mark.parametrize("lik", [Gaussian(0.1), Cosine()], ids=["gaussian", "cosine"])
def test_engines_agree_through_bottlenecks_with_the_noise_held_at_zero(spec, lik, monkeypatch):
    """PRECODE and CVB (its encoders' "same" padding included) are batched by hooks; with
    their noise at zero both routes compute one objective."""
    model, observed, labels = _bottleneck_case(spec)
    assert unsupported_reason(model) is None
    monkeypatch.setattr(torch, "randn_like", torch.zeros_like)
    cfg = AttackConfig(steps=1)
    a, b = _both(model, observed, labels, [Setting(0.1, 1.0, 0.1)], lik, TotalVariation(), cfg)
    _close(a, b)


def test_each_attack_draws_its_own_bottleneck_noise():
    """Two attacks on the same update from the same iterate differ through the noise alone,
    and agree once it is held at zero."""
    model, observed, labels = _bottleneck_case({"kind": "cvb", "position": 1}, n_updates=1)
    observed = {k: v.expand(2, *v.shape[1:]) for k, v in observed.items()}
    labels = labels.expand(2, 1)
    shape = (1, 2, 1, 1, *model[0].in_shape)
    x = torch.rand(model[0].in_shape).expand(shape).contiguous()
    z, d = torch.zeros((*shape[:4], 10)), torch.zeros((*shape[:3], 1, *shape[3:]))
    args = (model, observed, labels, [Setting(0.1, 1.0, 0.0)], Gaussian(0.1), Uniform())
    f = batched_objective(*args, AttackConfig(engine="hooks"), shape=shape, loss="ce",
                          device=torch.device("cpu"))  # fmt: skip
    _, _, value = f(x, z, d)
    assert value[0, 0] != value[0, 1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "randn_like", torch.zeros_like)
        _, _, value = f(x, z, d)
    assert value[0, 0] == value[0, 1]


def test_engines_agree_through_a_bottleneck_on_restarts_samples_and_two_images(monkeypatch):
    """Each attack's loss holds the β·KL of its own rows (several rows per attack, several
    attacks per update): the hooked route's per-row sum agrees with vmap's per-attack mean."""
    model, _, _ = _bottleneck_case({**CVB_KL, "beta": 1.0})
    monkeypatch.setattr(torch, "randn_like", torch.zeros_like)
    x = torch.rand(2, 2, *model[0].in_shape)
    labels = torch.tensor([[0, 1], [2, 3]])
    observed = stack_updates(
        [client_update(model, xi, yi) for xi, yi in zip(x, labels, strict=True)]
    )
    cfg = AttackConfig(steps=1, restarts=2, mc_samples=2, delta=0.1)
    settings = [Setting(0.1, 1.0, 0.5)]
    a, b = _both(model, observed, labels, settings, Gaussian(0.1), TotalVariation(), cfg,
                 n=2, restarts=2, k=2)  # fmt: skip
    _close(a, b)


@pytest.mark.parametrize("engine", ["hooks", "vmap"])
def test_the_objective_alone_is_the_objective_of_the_gradient_call(engine):
    """``grad=False`` (the attack's final evaluation) gives the same objective, and no gradient,
    without the backward pass."""
    model, observed, labels = _case("bayes-cnn", (1, 12, 12))
    shape = (2, 2, 1, 1, 1, 12, 12)
    f = batched_objective(
        model, observed, labels, [Setting(0.1, 1.0, 0.3), Setting(0.1, 1.0, 0.0)], Gaussian(0.1),
        TotalVariation(), AttackConfig(engine=engine), shape=shape, loss="ce",
        device=torch.device("cpu"),
    )  # fmt: skip
    x = torch.rand(shape, generator=torch.Generator().manual_seed(2))  # H × N × R × n × image
    z = torch.zeros(2, 2, 1, 1, 10)
    d = torch.zeros(2, 2, 1, 1, 1, 1, 12, 12)
    gx, _, value = f(x, z, d)
    assert gx is not None and gx.abs().sum() > 0
    gx_alone, gz_alone, alone = f(x, z, d, grad=False)
    assert gx_alone is None and gz_alone is None
    torch.testing.assert_close(alone, value)


@pytest.mark.parametrize("power", [1, 2], ids=["abs", "square"])
@pytest.mark.parametrize("masked", [False, True], ids=["all", "masked"])
@pytest.mark.parametrize("chunk", [1, residuals.CHUNK_BYTES], ids=["one-attack", "all-attacks"])
@pytest.mark.parametrize("gather", [False, True], ids=["cpu-plan", "gpu-plan"])
def test_residual_sums_of_factors_equal_the_materialised_ones_chunk_by_chunk(
    power, masked, chunk, gather, monkeypatch
):
    """The ℓ1 and pruned likelihoods' ``Σ φ(g − m ⊙ s)`` from a dense layer's factors, one attack
    per chunk and every attack (of different observed updates) in one, the observed updates
    added attack by attack (a CPU's plan) or gathered per chunk (a GPU's): values and gradients
    as with every ``s`` materialised, the pruned entries' constant included."""
    monkeypatch.setattr(residuals, "_plan", lambda device: (chunk, gather))
    H, N, M, R, out, inp = 2, 3, 2, 2, 5, 7
    d = torch.randn(H, N, M, R, out, dtype=torch.float64, requires_grad=True)
    a = torch.randn(H, N, M, R, inp, dtype=torch.float64, requires_grad=True)
    g = torch.randn(N, out, inp, dtype=torch.float64)
    mask = (torch.rand(out, inp) < 0.5).double() if masked else None
    got = residuals.residual_sums(
        Simulated({}, {"w": (d, a)}), "w", Observed({"w": g}), power, mask
    )
    s = d.transpose(-1, -2) @ a
    r = g[None, :, None] - (s if mask is None else s * mask)
    want = (r.abs() if power == 1 else r.square()).sum((-1, -2))
    torch.testing.assert_close(got, want)
    dense = residuals.residual_sums(Simulated({"w": s}, {}), "w", Observed({"w": g}), power, mask)
    torch.testing.assert_close(dense, want)
    weights = torch.randn(H, N, M, dtype=torch.float64)
    for mine, theirs in zip(
        torch.autograd.grad((got * weights).sum(), (d, a)),
        torch.autograd.grad((want * weights).sum(), (d, a)),
        strict=True,
    ):
        torch.testing.assert_close(mine, theirs)
    with pytest.raises(ValueError, match="power must be 1 or 2"):
        residuals.residual_sums(Simulated({}, {"w": (d, a)}), "w", Observed({"w": g}), 3)
