"""The networks of the Bayes-framework paper (Balunović et al., ICLR 2022).

* ``bayes-cnn`` — the CNN of its Table 2 (and of its DP/pruning experiments),
  built as the authors' Flax code builds it.
* ``convbig`` — appendix Table 3, the network of the Soteria experiment.
* ``convnet`` — appendix Table 4, Gao et al.'s ConvNet of the ATS experiment.
* ``mlp`` — the fully connected network of the PRECODE experiment (§6: five
  layers of 500 ReLU units), with any widths for the other MLPs of the papers.

All four are ``nn.Sequential`` of named stages (see
:mod:`leakagelib.models.staging`); each builder's docstring lists the stages,
i.e. the positions after which a bottleneck can be inserted. Used by the
chapters on the Bayesian framework and on breaking defenses.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from .init import initialise
from .registry import register
from .staging import activation as make_activation
from .staging import dry_run_shape, norm_layer, staged

__all__ = ["PRECODE_INIT_SCALE", "build_bayes_cnn", "build_convbig", "build_convnet", "build_mlp"]

#: Half-width of the uniform initialisation in the Bayes authors' PRECODE training
#: script (``defense_attacks/precode/train.py``, ``--weight_init`` default).
PRECODE_INIT_SCALE = 0.05


def _seq(**layers: nn.Module) -> nn.Sequential:
    """A stage: an ``nn.Sequential`` with named layers in keyword order."""
    return nn.Sequential(OrderedDict(layers))


def _flat_features(
    feature_stages: list[tuple[str, nn.Module]], in_shape: tuple[int, int, int], name: str
) -> int:
    """Number of features after ``feature_stages`` and flattening, from one dry run."""
    return int(dry_run_shape(nn.Sequential(OrderedDict(feature_stages)), in_shape, name).numel())


def _two_conv_features(
    channels: int, *, second_kernel: int, bias: bool
) -> list[tuple[str, nn.Module]]:
    """The feature extractor shared by ``bayes-cnn`` and ``convbig``.

    Conv(32, 3×3, pad 1) → ReLU → AvgPool 2 → Conv(64, k×k, pad 1) → ReLU →
    AvgPool 2 → flatten; the two networks differ only in the second kernel.
    """

    def block(c_in: int, c_out: int, k: int) -> nn.Sequential:
        conv = nn.Conv2d(c_in, c_out, k, padding=1, bias=bias)
        return _seq(conv=conv, act=nn.ReLU(), pool=nn.AvgPool2d(2))

    return [
        ("conv1", block(channels, 32, 3)),
        ("conv2", block(32, 64, second_kernel)),
        ("flatten", nn.Flatten()),
    ]


@register("bayes-cnn")
def build_bayes_cnn(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = True,
    init: str = "lecun",
) -> nn.Sequential:
    """Bayes paper, Table 2 "cnn": Conv(32, 3×3, same) → ReLU → AvgPool 2 → Conv(64, 3×3,
    same) → ReLU → AvgPool 2 → Dense(100) → ReLU → Dense(num_classes).

    Architecture from the authors' ``CNN`` in eth-sri/bayes-framework-leakage,
    ``bayes_optimal_attack/models/base_flax.py`` (Flax ``nn.Conv`` pads "SAME",
    ``nn.avg_pool`` is unpadded). The final ``log_softmax`` there is left to
    the loss (cross-entropy on logits is the same function). 333,526
    parameters on 1×28×28 with 10 classes, 430,102 on 3×32×32.

    Options: ``bias`` (every layer's bias), ``init`` — default ``"lecun"``,
    Flax's defaults (LeCun-normal weights, zero biases) as in the authors'
    code; ``"torch"`` gives PyTorch's defaults, whose gradients are about 4×
    smaller (see :mod:`leakagelib.models.init`).

    Stages: ``input``, ``conv1``, ``conv2``, ``flatten``, ``fc1``, ``fc2``.
    """
    features = _two_conv_features(in_shape[0], second_kernel=3, bias=bias)
    n = _flat_features(features, in_shape, "bayes-cnn")
    model = staged(
        in_shape,
        "bayes-cnn",
        [
            *features,
            ("fc1", _seq(linear=nn.Linear(n, 100, bias=bias), act=nn.ReLU())),
            ("fc2", _seq(linear=nn.Linear(100, num_classes, bias=bias))),
        ],
    )
    return initialise(model, init)


@register("convbig")
def build_convbig(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = True,
    init: str = "torch",
    hidden: tuple[int, int] = (2000, 1000),
) -> nn.Sequential:
    """Bayes paper, appendix Table 3 "ConvBig", the network of the Soteria experiment.

    Conv(32, 3×3, pad 1) → ReLU → AvgPool 2 → Conv(64, 1×1, pad 1) → ReLU →
    AvgPool 2 → Linear(2000) → ReLU → Linear(1000) → ReLU → Linear(num_classes).
    The 1×1 convolution with padding 1 is as printed in Table 3 and as in the
    authors' ``RefConvLarge`` (eth-sri/bayes-framework-leakage,
    ``defense_attacks/soteria/inversefed/nn/models.py``); on 3×32×32 it yields
    the 5,184 features of the table and 12,384,018 parameters for 10 classes.
    Soteria defends ``fc1``, "the largest linear layer, directly after the
    convolutions" (§6).

    Options: ``bias``; ``init`` — default ``"torch"``: this experiment ran in
    the authors' PyTorch code (built on inverting-gradients) with PyTorch's
    default initialisation, not in their Flax code; ``"lecun"`` is available;
    ``hidden`` — the widths of ``fc1`` and ``fc2`` (default the table's
    (2000, 1000)). The chapter "Breaking heuristic defenses" uses (128, 1024) on
    1×28×28 digits at ci scale, which keeps the table's split of the weights
    (about 80 % in ``fc1``, 20 % in ``fc2``) at a size a CPU attacks in seconds.

    Stages: ``input``, ``conv1``, ``conv2``, ``flatten``, ``fc1``, ``fc2``, ``fc3``.
    """
    if len(hidden) != 2 or min(hidden) < 1:
        raise ValueError(f"hidden must be two positive widths (fc1, fc2), got {hidden!r}")
    h1, h2 = (int(h) for h in hidden)
    features = _two_conv_features(in_shape[0], second_kernel=1, bias=bias)
    n = _flat_features(features, in_shape, "convbig")
    model = staged(
        in_shape,
        "convbig",
        [
            *features,
            ("fc1", _seq(linear=nn.Linear(n, h1, bias=bias), act=nn.ReLU())),
            ("fc2", _seq(linear=nn.Linear(h1, h2, bias=bias), act=nn.ReLU())),
            ("fc3", _seq(linear=nn.Linear(h2, num_classes, bias=bias))),
        ],
    )
    return initialise(model, init)


@register("convnet")
def build_convnet(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = True,
    width: int = 64,
    norm: str = "batch",
    init: str = "torch",
) -> nn.Sequential:
    """Bayes paper, appendix Table 4: Gao et al.'s ConvNet of the ATS experiment (width 64).

    Eight blocks Conv(3×3, pad 1) → norm → ReLU with widths w, 2w, 2w, 4w, 4w,
    4w, then MaxPool 3, then 4w, 4w, then MaxPool 3 and Linear(36w → classes)
    on 32×32 inputs. Table 4 prints nine convolutions because it transcribes
    the authors' code (eth-sri/bayes-framework-leakage,
    ``defense_attacks/ats/inversefed/nn/models.py``, class ``ConvNet``), whose
    ``OrderedDict`` lists the key ``conv6`` (with ``bn6``, ``relu6``) twice; the
    repeated key replaces the first entry, so the network that ran — built
    here — has eight (conv0–conv7). Its last line prints "Linear(36 * width,
    3)"; the code has ``num_classes`` outputs.

    Options: ``bias`` (convolution and linear biases; the code has them),
    ``width`` (default 64, the paper's), ``norm`` — ``"batch"`` (default, the
    code's BatchNorm; call ``model.eval()`` before per-sample ``vmap``),
    ``"group"`` (2 groups) or ``"none"``; ``init`` (default ``"torch"``, the
    code's).

    Stages: ``input``, ``conv0`` … ``conv5``, ``pool0``, ``conv6``, ``conv7``,
    ``pool1``, ``flatten``, ``linear``.
    """
    if width < 1:
        raise ValueError(f"width must be a positive integer, got {width}")
    plan = [1, 2, 2, 4, 4, 4, "pool", 4, 4, "pool"]
    features: list[tuple[str, nn.Module]] = []
    channels, conv_i, pool_i = in_shape[0], 0, 0
    for step in plan:
        if step == "pool":
            features.append((f"pool{pool_i}", nn.MaxPool2d(3)))
            pool_i += 1
            continue
        out = step * width
        block = _seq(
            conv=nn.Conv2d(channels, out, 3, padding=1, bias=bias),
            norm=norm_layer(norm, out),
            act=nn.ReLU(),
        )
        features.append((f"conv{conv_i}", block))
        channels, conv_i = out, conv_i + 1
    features.append(("flatten", nn.Flatten()))
    n = _flat_features(features, in_shape, "convnet")
    model = staged(
        in_shape,
        "convnet",
        [*features, ("linear", nn.Linear(n, num_classes, bias=bias))],
    )
    return initialise(model, init)


@register("mlp")
def build_mlp(
    in_shape: tuple[int, int, int],
    num_classes: int,
    *,
    bias: bool = True,
    widths: tuple[int, ...] = (500, 500, 500, 500, 500),
    activation: str = "relu",
    norm: str = "none",
    init: str = "uniform",
    init_scale: float | None = None,
) -> nn.Sequential:
    """A fully connected network: flatten → [Linear(w) → norm → act] per width → Linear(classes).

    Defaults are the PRECODE experiment of the Bayes paper (§6, "MLP
    architecture consisting of 5 layers with 500 neurons each and ReLU
    activations"), initialised as the authors' PRECODE training script does —
    every weight and bias from U(−0.05, 0.05) (eth-sri/bayes-framework-leakage,
    ``defense_attacks/precode/train.py``, ``--weight_init`` default 0.05).
    That script's network continues with Linear(500 → 256) → ReLU, the
    variational bottleneck (K = 256) and Linear(256 → 500) → ReLU before the
    classifier: ``widths=(500,) * 5 + (256, 500)`` with the bottleneck inserted
    after stage ``fc6`` reproduces it.

    Other MLPs of the papers: the Bayes paper's synthetic study (a 2-layer MLP
    in Flax, ``MLP_Flax`` in ``base_flax.py``: ``widths=(w,)``, ``init="lecun"``);
    CVB Table VII's MLP (four linear layers with batch norm and ReLU:
    ``norm="batch"``, ``bias`` on/off; its width is lost in the extraction).

    Options: ``bias``; ``widths`` (hidden sizes, may be empty: a linear model);
    ``activation`` ("relu", "leaky_relu", "sigmoid", "tanh", "gelu",
    "identity"); ``norm`` ("none" or "batch", BatchNorm1d after each hidden
    linear layer); ``init`` and ``init_scale`` (see
    :mod:`leakagelib.models.init`; ``init_scale`` only with ``"uniform"``,
    where it defaults to :data:`PRECODE_INIT_SCALE` = 0.05).

    Stages: ``input``, ``flatten``, ``fc1`` … ``fcL`` (L = len(widths)), ``head``.
    """
    if any(int(w) < 1 for w in widths):
        raise ValueError(f"widths must be positive integers, got {tuple(widths)}")
    if norm not in ("none", "batch"):
        raise ValueError(f"mlp norm must be 'none' or 'batch', got {norm!r}")
    fan_in = in_shape[0] * in_shape[1] * in_shape[2]
    hidden: list[tuple[str, nn.Module]] = []
    for i, w in enumerate(map(int, widths), start=1):
        layer = _seq(
            linear=nn.Linear(fan_in, w, bias=bias),
            norm=norm_layer(norm, w, dims=1),
            act=make_activation(activation),
        )
        hidden.append((f"fc{i}", layer))
        fan_in = w
    model = staged(
        in_shape,
        "mlp",
        [("flatten", nn.Flatten()), *hidden, ("head", nn.Linear(fan_in, num_classes, bias=bias))],
    )
    if init == "uniform" and init_scale is None:
        init_scale = PRECODE_INIT_SCALE
    return initialise(model, init, scale=init_scale)
