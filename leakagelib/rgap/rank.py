"""Rank analysis (Zhu & Blaschko 2021, §4, Appendices C and D).

For every layer i the analysis counts the unknowns ``|x_i|`` (the layer's input,
padding excluded), the gradient constraints ``|W_i|`` (one per weight), the weight
constraints ``|z_i|`` (one per output) and the virtual constraints inherited from
over-determined earlier layers,

    ``|V_i|`` = Σ_{n<i} max(``|z_n|`` − ``|x_n|``, 0) − max(``|x_n|`` − ``|z_n|`` − ``|W_n|``, 0),

and forms the rank analysis index RA-i_i = ``|x_i|`` − ``|W_i|`` − ``|z_i|`` − ``|V_i|``. The
network's RA-i is the largest over layers; that layer is the *critical* one.
Positive RA-i means no attack can recover the input fully.

:func:`rank_analysis` introspects the zoo's models — no hand-written tables:
convolutions and linear layers count as above, parameter-free pooling is
skipped like the paper's figures do (or, on request, counted as a layer without
gradient constraints), element-wise modules (activations,
normalisation) are skipped, and a residual block follows Appendix D: with its
skip connection it is one unit whose input is the block's input, whose weight
constraints are its output, and whose gradient constraints are those of its
last convolution (plus the shortcut's) — for two-layer blocks (ResNet-18's
``BasicBlock``, Figure 6's ``SkipBlock``) and, by the footnote to Appendix D,
three-layer ones (ResNet-101's ``Bottleneck``, Table 4); with the skip cut it is
its convolutions as plain layers.
Two kinds of module fall outside the analysis and raise a ``TypeError`` naming
the module and the reason, before any forward pass: self-attention (``vit-small``:
softmax(QKᵀ)V multiplies the input with itself, so its constraints are not
linear in the layer's input, which the counting assumes) and the variational
bottlenecks PRECODE and CVB (they sample a random latent, so what follows them
is no deterministic function of the input).

``exact=True`` adds, for the plain chains R-GAP attacks, the numerical rank of
each layer's own stacked constraints [W; K] on a live update — what R-GAP can
use. It is computed from the structure K = I_C ⊗ B: rank = C·rank(B) +
rank(W·(I_C ⊗ N_B)) with N_B the null space of B (see
:mod:`leakagelib.rgap.solve`). Chapter "Rank analysis" uses every part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from ..defenses.bottlenecks import VariationalBottleneck
from ..losses import loss_function
from ..models.resnet import BasicBlock
from ..models.resnet101 import Bottleneck
from ..models.rgap_nets import SkipBlock
from ..models.staging import InputCheck
from ..models.vit import Attention
from .chain import chain_of
from .constraints import gradient_block, weight_matrix
from .solve import gram_lstsq, split_gradient, weight_only_solve

__all__ = ["LayerCount", "RankAnalysis", "exact_ranks", "rank_analysis"]

_ELEMENTWISE = (
    nn.ReLU,
    nn.LeakyReLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.GELU,
    nn.Identity,
    nn.BatchNorm2d,
    nn.BatchNorm1d,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.Dropout,
    nn.Dropout2d,
    nn.Flatten,
    InputCheck,
)
_POOLS = (nn.AvgPool2d, nn.MaxPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)
#: Residual blocks: a ``skip`` flag, their convolutions as direct children in forward
#: order, and (ResNets) a ``downsample`` shortcut whose convolution counts with the last.
_RESIDUAL = (BasicBlock, Bottleneck, SkipBlock)


@dataclass
class LayerCount:
    """One layer's (or residual unit's) counts; ``ra_i`` includes the virtual constraints."""

    name: str
    kind: str
    x: int
    w: int
    z: int
    v: int = 0
    rank: int | None = None

    @property
    def local(self) -> int:
        """``|x|`` − ``|W|`` − ``|z|``: the counting deficiency before virtual constraints."""
        return self.x - self.w - self.z

    @property
    def ra_i(self) -> int:
        """``|x|`` − ``|W|`` − ``|z|`` − ``|V|``."""
        return self.local - self.v

    @property
    def deficiency(self) -> int | None:
        """``|x|`` − rank of the layer's own constraints (None when not measured)."""
        return None if self.rank is None else self.x - self.rank


@dataclass
class RankAnalysis:
    """Per-layer counts, the network's RA-i and its critical layer."""

    layers: list[LayerCount] = field(default_factory=list)

    @property
    def ra_i(self) -> int:
        """The network's RA-i: the largest over layers."""
        return max(layer.ra_i for layer in self.layers)

    @property
    def critical(self) -> str:
        """Name of the layer with the largest RA-i."""
        return max(self.layers, key=lambda layer: layer.ra_i).name

    @property
    def local_deficiency(self) -> int | None:
        """Largest ``|x|`` − exact rank over layers (None without the exact mode)."""
        values = [layer.deficiency for layer in self.layers]
        return None if any(v is None for v in values) else max(values)

    def rows(self) -> list[dict]:
        """The table as JSON-able rows."""
        return [
            {
                "layer": c.name,
                "kind": c.kind,
                "x": c.x,
                "w": c.w,
                "z": c.z,
                "v": c.v,
                "ra_i": c.ra_i,
                "rank": c.rank,
            }
            for c in self.layers
        ]


def _shapes(model: nn.Module, in_shape: tuple[int, int, int]) -> dict[int, tuple[int, int]]:
    """Input and output sizes (entries per sample) of every module, by id."""
    sizes: dict[int, tuple[int, int]] = {}
    hooks = []

    def record(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        sizes[id(module)] = (inputs[0][0].numel(), output[0].numel())

    for module in model.modules():
        hooks.append(module.register_forward_hook(record))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            param = next(model.parameters(), None)
            x = torch.zeros(1, *in_shape)
            if param is not None:
                x = x.to(param.device, param.dtype)
            model(x)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return sizes


#: Modules outside the counting of §4, with the reason (module docstring).
_OUTSIDE: tuple[tuple[type, str], ...] = (
    (
        Attention,
        "self-attention multiplies its input with itself (softmax(QKᵀ)V), so its "
        "constraints are not linear in the layer's input as the counting of §4 assumes",
    ),
    (
        VariationalBottleneck,
        "a variational bottleneck samples a random latent, so the layers after it see no "
        "deterministic function of the input to count constraints on",
    ),
)


def _check_countable(model: nn.Module) -> None:
    """Raise ``TypeError`` naming the first module the analysis cannot count, and why."""
    for name, module in model.named_modules():
        for kind, reason in _OUTSIDE:
            if isinstance(module, kind):
                raise TypeError(
                    f"rank analysis cannot count module {name!r} ({type(module).__name__}): "
                    f"{reason}"
                )


def _n_weights(module: nn.Module) -> int:
    return int(module.weight.numel())


def _count(module: nn.Module, name: str, sizes: dict, out: list[LayerCount], pooling: bool) -> None:
    """Append the counts of ``module`` (recursing through containers) to ``out``."""
    if isinstance(module, (nn.Conv2d, nn.Linear)):
        x, z = sizes[id(module)]
        out.append(LayerCount(name, type(module).__name__.lower(), x, _n_weights(module), z))
    elif isinstance(module, _POOLS):
        if pooling:
            x, z = sizes[id(module)]
            out.append(LayerCount(name, "pool", x, 0, z))
    elif isinstance(module, _RESIDUAL):
        convs = [(n, m) for n, m in module.named_children() if isinstance(m, nn.Conv2d)]
        if module.skip:
            x, f = sizes[id(module)]
            w = _n_weights(convs[-1][1])
            if getattr(module, "downsample", None) is not None:
                w += _n_weights(module.downsample.conv)
            out.append(LayerCount(name, "residual", x, w, f))
        else:
            for conv_name, conv in convs:
                _count(conv, f"{name}.{conv_name}", sizes, out, pooling)
    elif isinstance(module, nn.Sequential):
        for child_name, child in module.named_children():
            _count(child, f"{name}.{child_name}" if name else child_name, sizes, out, pooling)
    elif isinstance(module, _ELEMENTWISE):
        return
    else:
        raise TypeError(
            f"rank analysis does not know module {name!r} ({type(module).__name__}); "
            "supported: Conv2d, Linear, pooling, element-wise layers, Sequential, residual blocks "
            "(BasicBlock, Bottleneck, SkipBlock)"
        )


def rank_analysis(
    model: nn.Module,
    in_shape: tuple[int, int, int],
    *,
    exact: bool = False,
    image: Tensor | None = None,
    label: int = 1,
    pooling: bool = False,
) -> RankAnalysis:
    """Count every layer's constraints and virtual constraints (module docstring).

    ``exact=True`` (plain chains with one output only) also measures each
    layer's rank on the update of ``image`` (default: a seeded uniform image)
    with the logistic loss and label ``label``. ``pooling=True`` also counts
    parameter-free pooling as a layer (``|W|`` = 0); the paper's figures count only
    layers with weights, which is the default. Raises ``TypeError`` for
    self-attention and variational bottlenecks (module docstring).
    """
    _check_countable(model)
    sizes = _shapes(model, in_shape)
    counts: list[LayerCount] = []
    _count(model, "", sizes, counts, pooling)
    virtual = 0
    for c in counts:
        c.v = virtual
        virtual += max(c.z - c.x, 0) - max(c.x - c.z - c.w, 0)
    analysis = RankAnalysis(counts)
    if exact:
        ranks = exact_ranks(model, in_shape, image=image, label=label)
        if len(ranks) != len(counts):
            raise ValueError("the exact mode needs a plain chain of Conv2d/Linear layers")
        for c, r in zip(counts, ranks, strict=True):
            c.rank = r
    return analysis


def _layer_rank(geom, weight: np.ndarray, k: np.ndarray, known: np.ndarray) -> int:
    """rank([W; K]) of one layer, through K = I_C ⊗ B (no dense SVD of the whole).

    Cheapest certificates first: B of full column rank, or W alone of full
    column rank (a non-singular sparse factor); otherwise the rank of the
    projected block W·(I_C ⊗ N_B) from its Gram matrix's eigenvalues.
    """
    block = gradient_block(geom, k)
    hw = geom.height * geom.width
    split = None
    if block.shape[0] >= hw:
        split = split_gradient(block, np.zeros((block.shape[0], 1)))
        if split.null.shape[1] == 0:
            return geom.n_in
    w_mat = weight_matrix(geom, weight)[known]
    if weight_only_solve(w_mat, np.zeros(w_mat.shape[0])) is not None:
        return geom.n_in
    if split is None:
        split = split_gradient(block, np.zeros((block.shape[0], 1)))
    n0 = split.null.shape[1]
    wn = np.hstack([w_mat[:, c * hw : (c + 1) * hw] @ split.null for c in range(geom.in_channels)])
    rank_wn = gram_lstsq(wn, np.zeros(wn.shape[0]))[1]
    return geom.in_channels * split.rank + min(rank_wn, geom.in_channels * n0)


def exact_ranks(
    model: nn.Module,
    in_shape: tuple[int, int, int],
    *,
    image: Tensor | None = None,
    label: int = 1,
) -> list[int]:
    """Numerical rank of every layer's stacked constraints [W; K] on a live update.

    The update is the logistic-loss gradient of ``image`` (default: uniform
    noise from a generator seeded with 0) in float64; K uses the true
    ``k = ∂ℓ/∂z`` of each layer, and ReLU outputs that are zero drop their
    weight constraint, exactly as in R-GAP.
    """
    stages = chain_of(model, in_shape)
    if image is None:
        image = torch.rand(1, *in_shape, generator=torch.Generator().manual_seed(0))
    params = {n: p.detach().to(torch.float64) for n, p in model.named_parameters()}
    x = image.detach().to(torch.float64).reshape(1, *in_shape).requires_grad_(True)
    pre: list[Tensor] = []
    for stage in stages:
        layer = stage.layer
        weight = params[stage.weight_key]
        bias = params[stage.bias_key] if stage.bias_key else None
        if isinstance(layer, nn.Conv2d):
            x = x.reshape(1, *stage.in_shape)
            z = torch.nn.functional.conv2d(x, weight, bias, layer.stride, layer.padding)
        else:
            z = torch.nn.functional.linear(x.reshape(1, -1), weight, bias)
        z.retain_grad()
        pre.append(z)
        x = stage.activation(z) if stage.activation is not None else z
    y = torch.tensor([float(label)], dtype=torch.float64)
    loss = loss_function("logistic")(x.reshape(1, -1), y)
    ks = torch.autograd.grad(loss, pre)
    ranks = []
    for i, stage in enumerate(stages):
        known = np.ones(stage.geometry.n_out, dtype=bool)
        if isinstance(stage.activation, nn.ReLU):
            known = pre[i].detach().numpy().ravel() > 0
        ranks.append(
            _layer_rank(
                stage.geometry,
                params[stage.weight_key].numpy(),
                ks[i].numpy().ravel(),
                known,
            )
        )
    return ranks
