"""Tests of the model zoo (bayes-cnn, convbig, convnet, mlp, lenet, resnet18, cvb-cnn, vit-small).

Parameter counts are the papers' numbers where they print one (Bayes Table 2
network, ConvBig, the CVB CNN) and otherwise independent references: the
torchvision ResNet-18 count for 10 classes, and hand arithmetic written out
next to each expected value.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from leakagelib.models import build
from leakagelib.models.init import TRUNCATED_NORMAL_STD, lecun_normal_
from leakagelib.models.staging import stages

CIFAR = (3, 32, 32)
MNIST = (1, 28, 28)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "in_shape", "classes", "options", "expected"),
    [
        ("bayes-cnn", MNIST, 10, {}, 333_526),
        ("bayes-cnn", CIFAR, 10, {}, 430_102),
        ("convbig", CIFAR, 10, {}, 12_384_018),
        ("cvb-cnn", CIFAR, 10, {}, 65_962),
        # torchvision.models.resnet18(num_classes=10) has 11,181,642 parameters.
        ("resnet18", CIFAR, 10, {}, 11_181_642),
        # convs 3→64→128→128→256→256→256 | pool | 256→256→256 (3×3, bias) + 2 BN params
        # per channel, then Linear(36·64 → 10): 2,881,920 + 23,050.
        ("convnet", CIFAR, 10, {}, 2_904_970),
        # DLG LeNet on CIFAR-100: 912 + 3,612 + 3,612 + (768·100 + 100).
        ("lenet", CIFAR, 100, {}, 85_036),
        # R-GAP's bias-free LeNet on MNIST with one logit: 300 + 3,600 + 3,600 + 588.
        ("lenet", MNIST, 1, {"bias": False}, 8_088),
        # embed 48·256 + 256 + 65·256; 4 blocks × (2·512 + 4·256² + 2·256²); head 512 + 2,560.
        ("vit-small", CIFAR, 10, {}, 1_609_216),
        # 3072·500 + 500 + 4·(500·500 + 500) + 500·10 + 10.
        ("mlp", CIFAR, 10, {}, 2_543_510),
    ],
)
def test_parameter_counts(name, in_shape, classes, options, expected):
    assert n_params(build(name, in_shape, classes, **options)) == expected


@pytest.mark.parametrize(
    ("name", "in_shape", "classes", "options"),
    [
        ("bayes-cnn", MNIST, 10, {}),
        ("convbig", CIFAR, 10, {}),
        ("convnet", CIFAR, 10, {"width": 8}),
        ("mlp", MNIST, 10, {"widths": (32, 16)}),
        ("lenet", CIFAR, 100, {}),
        ("lenet-leaky", MNIST, 1, {"bias": False}),
        ("resnet18", CIFAR, 10, {"width": 8}),
        ("resnet18", CIFAR, 10, {"width": 8, "stem": "cifar", "norm": "batch"}),
        ("cvb-cnn", CIFAR, 10, {}),
        ("vit-small", CIFAR, 10, {"hidden": 64, "heads": 4, "mlp_width": 64}),
    ],
)
def test_output_shape_and_stages(name, in_shape, classes, options):
    model = build(name, in_shape, classes, **options)
    out = model(torch.rand(3, *in_shape))
    assert out.shape == (3, classes)
    names = stages(model)
    assert names[0] == "input" and len(names) == len(set(names)) >= 3


@pytest.mark.parametrize(
    ("name", "in_shape"),
    [
        ("bayes-cnn", MNIST),
        ("convbig", CIFAR),
        ("convnet", CIFAR),
        ("mlp", MNIST),
        ("lenet", CIFAR),
        ("lenet-leaky", MNIST),
        ("resnet18", CIFAR),
        ("cvb-cnn", CIFAR),
        ("vit-small", CIFAR),
    ],
)
def test_bias_false_removes_every_affine_bias(name, in_shape):
    options = {"width": 8} if name in ("convnet", "resnet18") else {}
    with_bias = build(name, in_shape, 10, bias=True, **options)
    without = build(name, in_shape, 10, bias=False, **options)
    affine = [m for m in without.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert affine and all(m.bias is None for m in affine)
    # Exactly the affine biases disappear; norm layers keep their shifts.
    removed = sum(
        m.bias.numel()
        for m in with_bias.modules()
        if isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None
    )
    assert n_params(with_bias) - n_params(without) == removed
    if name != "resnet18":  # resnet18's convolutions are bias-free in both settings
        assert removed > 0


def test_bayes_cnn_defaults_to_flax_lecun_normal():
    torch.manual_seed(0)
    model = build("bayes-cnn", MNIST, 10)
    for stage, fan_in in (("conv2", 32 * 9), ("fc1", 64 * 7 * 7)):
        layer = model.get_submodule(f"{stage}.{'conv' if stage.startswith('conv') else 'linear'}")
        target = 1 / math.sqrt(fan_in)
        assert layer.weight.std().item() == pytest.approx(target, rel=0.03)
        # truncated at two standard units of the underlying normal
        bound = 2 * target / TRUNCATED_NORMAL_STD
        assert layer.weight.abs().max().item() <= bound + 1e-6
        assert layer.weight.abs().max().item() > 0.9 * bound
        assert torch.count_nonzero(layer.bias) == 0
    # PyTorch's default draw has std 1/sqrt(3 fan_in): clearly different.
    torch_init = build("bayes-cnn", MNIST, 10, init="torch")
    std = torch_init.get_submodule("fc1.linear").weight.std().item()
    assert std == pytest.approx(1 / math.sqrt(3 * 3136), rel=0.03)


def test_lecun_normal_matches_flax_statistics():
    w = torch.empty(400, 250)
    lecun_normal_(w, generator=torch.Generator().manual_seed(1))
    assert w.std().item() == pytest.approx(1 / math.sqrt(250), rel=0.02)
    assert w.mean().abs().item() < 3e-3


def test_dlg_lenet_uses_uniform_half_init():
    model = build("lenet", CIFAR, 100)
    for p in model.parameters():
        assert p.abs().max().item() <= 0.5
    assert model.get_submodule("fc").weight.std().item() == pytest.approx(0.5 / math.sqrt(3), 0.05)
    assert isinstance(model.get_submodule("conv1.act"), nn.Sigmoid)
    leaky = build("lenet-leaky", CIFAR, 10).get_submodule("conv2.act")
    assert isinstance(leaky, nn.LeakyReLU) and leaky.negative_slope == 0.2


def test_cut_skip_changes_the_forward():
    torch.manual_seed(0)
    full = build("resnet18", CIFAR, 10, width=8)
    cut = build("resnet18", CIFAR, 10, width=8, cut_skip=(2,))
    cut.load_state_dict(full.state_dict())  # block 2 has no downsample: same parameters
    x = torch.rand(2, *CIFAR)
    assert not torch.allclose(full(x), cut(x))
    # Cutting a downsampling block (R-GAP Figure 4, Variant 1) drops its 1x1 shortcut.
    variant1 = build("resnet18", CIFAR, 10, width=8, cut_skip=(3,))
    names = dict(variant1.named_parameters())
    assert "layer2.block3.downsample.conv.weight" not in names
    assert "layer2.block3.downsample.conv.weight" in dict(full.named_parameters())
    with pytest.raises(ValueError, match="cut_skip"):
        build("resnet18", CIFAR, 10, cut_skip=(9,))


@pytest.mark.parametrize(
    ("name", "in_shape", "bad"),
    [
        ("bayes-cnn", MNIST, (2, 3, 32, 32)),
        ("cvb-cnn", CIFAR, (2, 3, 28, 28)),
        ("vit-small", CIFAR, (3, 32, 32)),
    ],
)
def test_wrong_input_shape_names_both_shapes(name, in_shape, bad):
    model = build(name, in_shape, 10)
    c, h, w = in_shape
    with pytest.raises(ValueError, match=rf"\(N, {c}, {h}, {w}\), got shape \({bad[0]}, "):
        model(torch.rand(*bad))


def test_bad_options_raise():
    with pytest.raises(ValueError, match="too small"):
        build("cvb-cnn", MNIST, 10)  # CVB resizes MNIST to 3x32x32
    with pytest.raises(ValueError, match="patch size"):
        build("vit-small", MNIST, 10, patch=5)
    with pytest.raises(ValueError, match="init"):
        build("bayes-cnn", MNIST, 10, init="xavier")
    with pytest.raises(ValueError, match="norm"):
        build("resnet18", CIFAR, 10, norm="layer")
    with pytest.raises(TypeError, match="zoo model"):
        stages(nn.Linear(2, 2))


def test_vit_patch_order_matches_authors_rearrange():
    model = build("vit-small", CIFAR, 10)
    x = torch.rand(1, *CIFAR)
    tokens = model.get_submodule("embed")(x)
    embed = model.get_submodule("embed")
    # first patch flattened as (p1 p2 c): rows, columns, then channels
    first = x[0, :, :4, :4].permute(1, 2, 0).reshape(-1)
    expected = embed.linear(first) + embed.position[0, 1]
    assert torch.allclose(tokens[0, 1], expected, atol=1e-5)
    assert tokens.shape == (1, 65, 256)


@pytest.mark.parametrize(
    ("name", "in_shape", "options"),
    [
        ("bayes-cnn", MNIST, {}),
        ("cvb-cnn", CIFAR, {}),
        ("resnet18", (3, 16, 16), {"width": 4}),  # group norm: per sample in training mode
        ("convnet", CIFAR, {"width": 8}),  # batch norm: per sample only in eval mode
    ],
)
def test_per_sample_gradients_under_vmap(name, in_shape, options):
    torch.manual_seed(0)
    model = build(name, in_shape, 10, **options)
    if name == "convnet":
        model.eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.rand(2, *in_shape), torch.tensor([1, 7])

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    batched = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    for i in range(2):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for k, p in model.named_parameters():
            torch.testing.assert_close(batched[k][i], p.grad, rtol=1e-4, atol=1e-6)


def test_build_inserts_a_bottleneck_on_request() -> None:
    plain = build("cvb-cnn", (3, 32, 32), 10)
    cvb = build("cvb-cnn", (3, 32, 32), 10, bottleneck="cvb")
    precode = build("cvb-cnn", (3, 32, 32), 10, bottleneck="precode@1")
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert "cvb" in dict(cvb.named_children()) and "precode" in dict(precode.named_children())
    assert 0 < count(cvb) - count(plain) < count(precode) - count(plain)
    assert cvb(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="unknown bottleneck kind"):
        build("cvb-cnn", (3, 32, 32), 10, bottleneck="vae")


@pytest.mark.parametrize("bad", [2.5, True, 0, "10"])
def test_num_classes_must_be_a_whole_number(bad):
    with pytest.raises(ValueError, match="num_classes must be a whole number of classes"):
        build("mlp", (1, 8, 8), bad)
