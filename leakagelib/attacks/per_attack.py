"""Every attack's simulated update from one ordinary forward and backward pass.

An attack compares the observed update ``g`` with ``s(x) = ∇θ ℓ(h_θ(x), y)``
for its own candidate ``x`` and then differentiates that comparison with
respect to ``x``. Batching ``B`` attacks therefore asks for ``B`` *per-attack*
weight gradients, differentiated a second time. Under :func:`torch.func.vmap`
(the general route, :mod:`.objective`) every per-attack gradient of a dense
layer is materialised — 100 × 3136 floats per attack for ``bayes-cnn``'s
``fc1`` — and then subtracted, squared and summed element by element: on the
CPU that memory traffic, not arithmetic, took most of an attack step
(profiled with ``benchmarks/attack_throughput.py --profile``).

This module takes the route of the differential-privacy libraries (Opacus's
grad samplers; the "ghost norm" of Goodfellow 2015 and Li et al. 2022,
*Large language models can be strong differentially private learners*):

1. one forward pass of all attacks' candidates, stacked as rows, through the
   model as it is, with forward hooks recording each parametrised layer's
   input ``a`` and output;
2. one backward pass (``create_graph=True``) to those outputs gives each row's
   backpropagated error ``δ``;
3. a layer's per-attack weight gradient is ``Σ_r δ_r a_rᵀ`` over the rows
   ``r`` of that attack (positions of a convolution, tokens, images).
   Convolutions materialise it with one grouped native kernel (the attacks
   as groups) or, for small layers, unfold and a batched matrix product;
   normalisation layers with a channel sum. Dense layers keep the two factors, because the
   likelihoods that need only inner products (Gaussian, cosine) can use
   ``‖Σ δ_r a_rᵀ‖² = Σ_rr' (δ_r·δ_r')(a_r·a_r')`` and
   ``⟨Σ δ_r a_rᵀ, G⟩ = Σ_r δ_rᵀ G a_r`` and never build the matrix. Those sums
   run in float64, so that ``‖s − g‖² = ‖s‖² − 2⟨s, g⟩ + ‖g‖²`` keeps the
   accuracy of the element-wise float32 difference near convergence.

Only models in which every row is computed on its own qualify
(:func:`unsupported_reason`): a batch-norm layer in training mode mixes the
rows of different attacks, so such models use ``vmap``. Both routes give the
same objective and gradient (``tests/test_per_attack.py``). A variational
bottleneck (PRECODE, CVB; a module that declares ``rows_independent``) draws
each row's noise on its own, so every attack gets noise of its own, as under
``vmap(..., randomness="different")``: the same distribution, other draws
(the tests compare the two routes with the noise held at zero), and each
attack's loss holds the β·KL of its own rows. Used by
every optimisation attack through :func:`leakagelib.attacks.objective.batched_objective`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..losses import kl_rows
from ..models.resnet import BasicBlock
from ..models.staging import InputCheck

__all__ = ["Observed", "Simulated", "row_losses", "simulate", "unsupported_reason"]

_NORMS = (nn.GroupNorm, nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d)
#: Parametrised layers whose per-row weight gradient this module knows.
_PARAMETRISED = (nn.Linear, nn.Conv2d, *_NORMS)
#: Parameter-free layers that compute every row on its own.
_ROWWISE = (
    nn.ReLU, nn.LeakyReLU, nn.Sigmoid, nn.Tanh, nn.GELU, nn.ELU, nn.SiLU, nn.Softplus,
    nn.Identity, nn.Flatten, nn.AvgPool2d, nn.MaxPool2d, nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d, InputCheck,
)  # fmt: skip
#: Containers whose ``forward`` only composes its children row by row.
_CONTAINERS = (nn.Sequential, BasicBlock)


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the hooked route cannot batch attacks on ``model``, or ``None`` when it can."""
    for name, module in model.named_modules():
        where = name or "the model"
        if isinstance(module, nn.Conv2d) and (module.groups != 1 or _padding(module) is None):
            return f"{where} is a grouped or asymmetrically padded convolution"
        if isinstance(module, nn.Conv2d) and module.padding_mode != "zeros":
            return f"{where} pads with {module.padding_mode!r}, not zeros"
        if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d) and (
            module.training or not module.track_running_stats
        ):
            return f"{where} is a batch norm using batch statistics (it mixes attacks' rows)"
        if isinstance(module, (*_PARAMETRISED, *_ROWWISE, *_CONTAINERS)):
            continue
        if getattr(module, "rows_independent", False):  # bottlenecks (defenses.bottlenecks)
            continue
        if any(True for _ in module.children()):
            return (
                f"{where} is a {type(module).__name__}, whose forward is not known to be row-wise"
            )
        return f"{where} is a {type(module).__name__}, not a known row-wise layer"
    return None


def row_losses(outputs: Tensor, target: Tensor, loss: str) -> Tensor:
    """Each row's loss: cross-entropy against class indices or soft labels, or R-GAP's logistic loss.

    The per-row form of :func:`leakagelib.losses.loss_function` (which
    averages them), so that an attack's loss is the mean over its own rows.
    """
    if loss == "ce":
        if target.is_floating_point():
            return -(target * F.log_softmax(outputs, dim=-1)).sum(-1)
        return F.cross_entropy(outputs, target, reduction="none")
    if loss == "logistic":
        return F.softplus(-target.to(outputs.dtype) * outputs.reshape(outputs.shape[0]))
    raise KeyError(f"unknown loss {loss!r}; available losses: ce, logistic")


def _loss_sum(model: nn.Module, outputs: Tensor, target: Tensor, loss: str) -> Tensor:
    """The sum over rows of each row's training loss: its ``loss`` plus its β·KL.

    The KL terms are those of the model's variational bottlenecks on the
    forward pass that gave ``outputs`` — the per-row form of
    :func:`leakagelib.losses.client_loss`, so that each attack's
    simulated update, like the client's, is its training loss's gradient.
    """
    per_row = row_losses(outputs, target, loss)
    kl = kl_rows(model)
    return (per_row if kl is None else per_row + kl).sum()


@contextmanager
def _recording(layers: dict[str, nn.Module]) -> Iterator[dict[str, list[tuple[Tensor, Tensor]]]]:
    """Record every call's (input, output) of ``layers`` while the block runs."""
    calls: dict[str, list[tuple[Tensor, Tensor]]] = {name: [] for name in layers}
    hooks = [
        module.register_forward_hook(lambda _m, i, o, name=name: calls[name].append((i[0], o)))
        for name, module in layers.items()
    ]
    try:
        yield calls
    finally:
        for hook in hooks:
            hook.remove()


def _normalised(module: nn.Module, a: Tensor) -> Tensor:
    """The input of a normalisation layer before its affine map (what γ multiplies)."""
    if isinstance(module, nn.GroupNorm):
        return F.group_norm(a, module.num_groups, eps=module.eps)
    if isinstance(module, nn.LayerNorm):
        return F.layer_norm(a, module.normalized_shape, eps=module.eps)
    shape = (1, -1) + (1,) * (a.dim() - 2)
    mean = module.running_mean.reshape(shape)
    return (a - mean) / (module.running_var.reshape(shape) + module.eps).sqrt()


def _channel_sums(t: Tensor, module: nn.Module, attacks: int) -> Tensor:
    """Sum a per-row tensor over everything but the attack and the affine parameter's axes."""
    if isinstance(module, nn.LayerNorm):
        dims = len(module.normalized_shape)
        return t.reshape(attacks, -1, *t.shape[t.dim() - dims :]).sum(1)
    return t.reshape(attacks, -1, t.shape[1], math.prod(t.shape[2:])).sum((1, 3))


#: A convolution's per-attack weight gradients come from one native grouped kernel (attacks as
#: groups), except for at most ``UNFOLD_MAX_FAN_IN`` inputs per output (C·k·k) or at most
#: ``UNFOLD_MAX_POSITIONS`` output positions per attack, where unfolded products are faster. Measured on the CPU, one thread (2026-11-23; forward of the weight gradients and
#: their double backward, milliseconds, grouped / unfolded / the native kernel once per
#: attack): 8 attacks of ConvNet-16's 16→32 at 32×32: 2.9 / 7.7 / 6.5; ConvNet-64's 256→256 at
#: 32×32: 240 / 383 / 278, at 16×16: 96 / 111 / 90, at 8×8: 67 / 48 / 59; 64 attacks of
#: bayes-cnn's 32→64 at 14×14: 20 / 33 / 71, its 1→32 at 28×28: 4.2 / 3.8 / 69.
UNFOLD_MAX_FAN_IN, UNFOLD_MAX_POSITIONS = 16, 64


def _padding(module: nn.Conv2d) -> tuple[int, ...] | None:
    """The convolution's padding as numbers per side: ``"valid"`` is none, ``"same"`` (stride 1)
    is half the dilated kernel where that is symmetric (odd kernels); ``None`` otherwise."""
    if not isinstance(module.padding, str):
        return tuple(module.padding)
    if module.padding == "valid":
        return (0,) * len(module.kernel_size)
    spans = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size, strict=True)]
    return None if any(s % 2 for s in spans) else tuple(s // 2 for s in spans)


def _conv_weight_gradients(module: nn.Conv2d, a: Tensor, delta: Tensor, attacks: int) -> Tensor:
    """Per-attack weight gradients ``attacks × O × C × k × k`` of one convolution call."""
    rows = a.shape[0] // attacks
    padding = _padding(module)
    fan_in = module.weight[0].numel()
    if fan_in > UNFOLD_MAX_FAN_IN and rows * delta[0, 0].numel() > UNFOLD_MAX_POSITIONS:
        # the attacks' rows side by side as channel groups: n × (attacks·C) × H × W
        a_g = a.reshape(attacks, rows, *a.shape[1:]).transpose(0, 1).flatten(1, 2)
        d_g = delta.reshape(attacks, rows, *delta.shape[1:]).transpose(0, 1).flatten(1, 2)
        weight = module.weight.detach().repeat(attacks, 1, 1, 1)
        grads = torch.ops.aten.convolution_backward(
            d_g, a_g, weight, None, module.stride, padding, module.dilation, False,
            (0, 0), attacks, (False, True, False),
        )[1]  # fmt: skip
        return grads.reshape(attacks, *module.weight.shape)
    u = F.unfold(a, module.kernel_size, module.dilation, padding, module.stride)
    u = u.reshape(attacks, -1, *u.shape[1:])  # attacks × n × C·k·k × L
    d = delta.reshape(attacks, -1, module.out_channels, u.shape[-1])  # attacks × n × O × L
    return torch.einsum("bnol,bnkl->bok", d, u).reshape(attacks, *module.weight.shape)


def _layer_gradients(
    name: str, module: nn.Module, a: Tensor, delta: Tensor, attacks: int, factor: bool
) -> tuple[dict[str, Tensor], dict[str, tuple[Tensor, Tensor]]]:
    """Per-attack gradients of one layer call: dense tensors, and dense-layer factors."""
    dense: dict[str, Tensor] = {}
    factors: dict[str, tuple[Tensor, Tensor]] = {}
    if isinstance(module, nn.Linear):
        d = delta.reshape(attacks, -1, module.out_features)
        x = a.reshape(attacks, -1, module.in_features)
        if factor:
            factors[f"{name}.weight"] = (d, x)
        else:
            dense[f"{name}.weight"] = d.transpose(1, 2) @ x
        if module.bias is not None:
            dense[f"{name}.bias"] = d.sum(1)
    elif isinstance(module, nn.Conv2d):
        dense[f"{name}.weight"] = _conv_weight_gradients(module, a, delta, attacks)
        if module.bias is not None:
            dense[f"{name}.bias"] = delta.reshape(
                attacks, -1, module.out_channels, delta[0, 0].numel()
            ).sum((1, 3))
    else:
        if module.weight is not None:
            dense[f"{name}.weight"] = _channel_sums(delta * _normalised(module, a), module, attacks)
        if module.bias is not None:
            dense[f"{name}.bias"] = _channel_sums(delta, module, attacks)
    return dense, factors


class Observed:
    """The observed updates ``N × ...`` and what the factored inner products need of them.

    Squared norms, float64 copies of the factored dense-layer weights and what
    a likelihood derives from the updates (:meth:`once`: the cosine's weighted
    concatenation, :func:`~.cosine.cosine_sums`) are made once per attack
    run, on first use, not at every step.
    """

    def __init__(self, update: dict[str, Tensor]) -> None:
        self.update = update
        self._wide: dict[str, Tensor] = {}
        self._square: dict[str, Tensor] = {}
        self._made: dict[tuple, object] = {}

    def wide(self, name: str) -> Tensor:
        """The float64 copy of ``update[name]``."""
        if name not in self._wide:
            self._wide[name] = self.update[name].double()
        return self._wide[name]

    def once(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()``, called on the first use of ``key`` in this attack run only."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def square(self, name: str) -> Tensor:
        """``‖g‖²`` of every observed update's ``name`` (``N``, float64), read from the float64
        copy where :meth:`wide` made one (casting anew copied ``fc1``'s 160 MB once more)."""
        if name not in self._square:
            flat = self._wide.get(name, self.update[name]).flatten(1)
            self._square[name] = torch.linalg.vector_norm(flat, dim=1, dtype=torch.float64) ** 2
        return self._square[name]


@dataclass
class Simulated:
    """The simulated updates of ``H × N × M`` attacks (settings, updates, restarts × samples).

    ``dense`` maps a parameter to its per-attack gradients ``H × N × M × shape``;
    ``factors`` maps a dense layer's weight to ``(δ, a)`` with shapes
    ``H × N × M × rows × out`` and ``H × N × M × rows × in``: the gradient is
    ``Σ_rows δ aᵀ``.
    """

    dense: dict[str, Tensor]
    factors: dict[str, tuple[Tensor, Tensor]]

    def select(self, settings: Tensor) -> Simulated:
        """The attacks of the given settings (indices along ``H``)."""
        return Simulated(
            {k: v.index_select(0, settings) for k, v in self.dense.items()},
            {k: (d.index_select(0, settings), a.index_select(0, settings))
             for k, (d, a) in self.factors.items()},
        )  # fmt: skip

    def tensor(self, name: str) -> Tensor:
        """One parameter's per-attack gradients, materialised: ``H × N × M × shape``."""
        if name in self.dense:
            return self.dense[name]
        d, a = self.factors[name]
        return d.transpose(-1, -2) @ a

    def sq_dist(self, name: str, obs: Observed) -> Tensor:
        """``‖s − g‖²`` per attack (``H × N × M``)."""
        if name in self.dense:
            s = self.dense[name]
            g = obs.update[name][None, :, None]
            return (s - g).pow(2).flatten(3).sum(3)
        norm = self._factored_norm(name)
        return (norm - 2.0 * self._factored_inner(name, obs) + obs.square(name)[None, :, None]).to(
            torch.float32
        )

    def inner(self, name: str, obs: Observed) -> Tensor:
        """``⟨s, g⟩`` per attack (``H × N × M``)."""
        if name in self.dense:
            return (self.dense[name] * obs.update[name][None, :, None]).flatten(3).sum(3)
        return self._factored_inner(name, obs).to(torch.float32)

    def sq_norm(self, name: str) -> Tensor:
        """``‖s‖²`` per attack (``H × N × M``)."""
        if name in self.dense:
            return self.dense[name].pow(2).flatten(3).sum(3)
        return self._factored_norm(name).to(torch.float32)

    def _factored_norm(self, name: str) -> Tensor:
        d, a = (t.double() for t in self.factors[name])
        if d.shape[-2] == 1:
            return d.pow(2).sum((-1, -2)) * a.pow(2).sum((-1, -2))
        return ((d @ d.transpose(-1, -2)) * (a @ a.transpose(-1, -2))).sum((-1, -2))

    def _factored_inner(self, name: str, obs: Observed) -> Tensor:
        d, a = (t.double() for t in self.factors[name])
        H, N, M, R, _ = d.shape
        d_n = d.transpose(0, 1).reshape(N, H * M * R, -1)  # rows of update n together
        a_n = a.transpose(0, 1).reshape(N, H * M * R, -1)
        dot = ((d_n @ obs.wide(name)) * a_n).sum(-1)  # N × (H·M·R)
        return dot.reshape(N, H, M, R).sum(-1).transpose(0, 1)


def _factor(module: nn.Module, rows: int) -> bool:
    """Keep a dense layer's gradient factored when that is cheaper than materialising it."""
    out, inp = module.weight.shape
    return rows * (out + inp) < out * inp


def _one_attack(model: nn.Module, rows: Tensor, target: Tensor, loss: str) -> Simulated:
    """A single attack's simulated update by plain autograd (no hooks, nothing factored)."""
    named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    total = _loss_sum(model, model(rows), target, loss) / rows.shape[0]
    grads = torch.autograd.grad(total, [p for _, p in named], create_graph=True, allow_unused=True)
    dense = {
        k: (torch.zeros_like(p) if g is None else g).reshape(1, 1, 1, *p.shape)
        for (k, p), g in zip(named, grads, strict=True)
    }
    return Simulated(dense, {})


def simulate(
    model: nn.Module, rows: Tensor, target: Tensor, lead: tuple[int, int, int], loss: str
) -> Simulated:
    """The simulated update of every attack, differentiable with respect to ``rows``.

    ``rows`` holds the ``H·N·M`` attacks' candidates, ``n`` consecutive rows
    per attack (``(H·N·M·n) × input``), ``target`` their labels (class
    indices or soft labels); ``lead`` is ``(H, N, M)``. An attack's loss is the
    mean over its ``n`` rows of each row's loss plus its bottlenecks' β·KL, as
    a client's update is the gradient of its batch's training loss
    (:func:`leakagelib.losses.client_loss`).
    """
    H, N, M = lead
    attacks = H * N * M
    n = rows.shape[0] // attacks
    layers = {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, _PARAMETRISED) and any(p.requires_grad for p in m.parameters())
    }
    if attacks == 1:  # one attack: its update is the ordinary gradient, as a client computes it
        return _one_attack(model, rows, target, loss)
    with _recording(layers) as calls:
        outputs = model(rows)
    total = _loss_sum(model, outputs, target, loss) / n
    recorded = [(name, a, o) for name in layers for a, o in calls[name]]
    deltas = torch.autograd.grad(total, [o for _, _, o in recorded], create_graph=True)
    dense: dict[str, Tensor] = {}
    factors: dict[str, tuple[Tensor, Tensor]] = {}
    for (name, a, _), delta in zip(recorded, deltas, strict=True):
        module = layers[name]
        factor = isinstance(module, nn.Linear) and len(calls[name]) == 1
        factor = factor and _factor(module, a.numel() // (attacks * module.in_features))
        d_part, f_part = _layer_gradients(name, module, a, delta, attacks, factor)
        for k, v in d_part.items():
            dense[k] = dense[k] + v if k in dense else v
        factors.update(f_part)
    shapes = {k: p.shape for k, p in model.named_parameters() if p.requires_grad}
    factors = {k: (d.reshape(H, N, M, *d.shape[1:]), a.reshape(H, N, M, *a.shape[1:]))
               for k, (d, a) in factors.items() if k in shapes}  # fmt: skip
    # a layer the forward pass never reached has a zero gradient
    dense = {
        k: dense[k].reshape(H, N, M, *shape) if k in dense else rows.new_zeros((H, N, M, *shape))
        for k, shape in shapes.items()
        if k not in factors
    }
    return Simulated(dense, factors)
