"""Training for attacks during training: the client's loss and step, centralised training.

:func:`training_loss` is every client's objective (cross-entropy plus the
β·KL of any variational bottleneck, CVB paper Eq. 3); :func:`evaluate` and
:func:`accuracy` score a model. Federated averaging as the CVB authors run
it lives in :mod:`leakagelib.fedavg`, built on the same local step.

:func:`train` is the centralised loop the Bayes paper's Figure 2 needs (attack
ATS and Soteria after each of the first training steps): mini-batch Adam or
SGD with learning-rate drops at chosen steps, an optional augmentation hook
(:class:`leakagelib.defenses.ats.ATSAugmentation`) and snapshots after chosen
optimiser steps. It returns plain ``state_dict`` snapshots, so an attack can be
run on the model "as it was at step t", and, where asked, states
(:class:`TrainState`) that another run continues from. Used by
the chapter "Breaking heuristic defenses" and the R-GAP rank experiments;
the chapter "Variational bottlenecks" trains through :mod:`leakagelib.fedavg`.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .defenses.base import GradientDefense, NoDefense
from .gradients import check_batch
from .losses import client_loss
from .validation import require_count, require_number

__all__ = ["TrainResult", "TrainState", "accuracy", "adam", "evaluate", "train", "training_loss"]

Augment = Callable[[Tensor, torch.Generator | None], Tensor]
State = dict[str, Tensor]


def _check_data(images: Tensor, labels: Tensor, what: str) -> None:
    """Shapes only, for :mod:`.fedavg`'s checks made before a model is at hand (with a model,
    :func:`~leakagelib.gradients.check_batch` checks values and classes too)."""
    if images.dim() != 4:
        raise ValueError(f"{what} images must be N×C×H×W, got shape {tuple(images.shape)}")
    if labels.dim() != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{what} labels must be a vector of length {images.shape[0]}, got {tuple(labels.shape)}"
        )


def _snapshot(model: nn.Module) -> State:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def training_loss(model: nn.Module, images: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy plus the β-weighted KL terms of the model's bottlenecks (CVB Eq. 3).

    :func:`leakagelib.losses.client_loss` of the model's outputs on ``images``:
    the loss whose gradient a client also shares as its update.
    """
    return client_loss(model, model(images), labels)


@torch.no_grad()
def evaluate(
    model: nn.Module, images: Tensor, labels: Tensor, *, batch_size: int = 512
) -> tuple[float, float]:
    """(mean training loss, accuracy) of ``model`` in eval mode on the given data."""
    check_batch(model, images, labels)  # finite images, labels in the model's classes
    was_training = model.training
    model.eval()
    total_loss, correct = 0.0, 0
    try:
        for lo in range(0, images.shape[0], batch_size):
            x, y = images[lo : lo + batch_size], labels[lo : lo + batch_size]
            out = model(x)
            total_loss += float(client_loss(model, out, y) * x.shape[0])
            correct += int((out.argmax(dim=1) == y).sum())
    finally:
        model.train(was_training)
    n = images.shape[0]
    return total_loss / n, correct / n


def accuracy(model: nn.Module, images: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy of ``model`` (eval mode) on the given data."""
    return evaluate(model, images, labels)[1]


def _step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: Tensor,
    y: Tensor,
    defense: GradientDefense,
    generator: torch.Generator | None,
) -> Tensor:
    """One optimiser step on the update ``defense`` shares for the batch; returns its training loss.

    The client's objective is :func:`training_loss` (cross-entropy plus any
    bottleneck's β·KL). A defense that evaluates it on the whole batch (every
    defense but DP-SGD) reports the loss of that very forward pass, so no
    extra pass draws a bottleneck's noise or moves batch-norm statistics;
    DP-SGD evaluates it once per image inside its per-sample transform, and
    the batch's loss is then computed afterwards without gradients.
    """
    seen: list[Tensor] = []

    def objective(net: nn.Module, images: Tensor, labels: Tensor) -> Tensor:
        value = training_loss(net, images, labels)
        if images is x:  # the whole batch, not one image inside a per-sample transform
            seen.append(value.detach())
        return value

    optimizer.zero_grad()
    params = dict((n, p) for n, p in model.named_parameters() if p.requires_grad)
    grads = defense.share(model, x, y, generator, loss=objective)
    if seen:
        loss = seen[-1]
    else:
        with torch.no_grad():
            loss = training_loss(model, x, y)
    for name, p in params.items():
        p.grad = grads[name].to(p.dtype)
    optimizer.step()
    return loss


def adam(
    params: Iterable[nn.Parameter],
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.0,
) -> torch.optim.Adam:
    """PyTorch's Adam (default ε, ``weight_decay`` its L2 term) with its fused kernel where the
    parameters allow it.

    The fused kernel makes one pass over each tensor where the default CPU
    implementation makes about ten; the update is the same up to float rounding
    (after ten steps on ConvBig, parameters within 2e-5 of the default's). It
    took a training step of ConvBig (12.4 million parameters, batch 32; Bayes
    Fig. 2's Soteria network, 15,620 steps) from 376 to 170 ms on this project's
    CPU, the optimiser's share from 226 to 24 ms (2026-11-29, one thread, a
    paper-scale run beside it). :func:`train`, the clients of
    :func:`leakagelib.fedavg.federated_averaging` and the campaign's estimate of
    a training step use it.
    """
    params = list(params)
    return torch.optim.Adam(
        params, lr=lr, betas=betas, weight_decay=weight_decay, fused=_fusable(params)
    )


def _fusable(params: list[nn.Parameter]) -> bool:
    """Whether PyTorch's fused optimiser kernels take ``params`` (floating point, CPU or CUDA)."""
    return bool(params) and all(
        p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params
    )


def _optimizer(
    net: nn.Module, kind: str, lr: float, momentum: float, nesterov: bool, weight_decay: float
) -> torch.optim.Optimizer:
    """:func:`train`'s optimiser, its settings checked: Adam (:func:`adam`) or SGD, fused as
    Adam is (an optimiser step of ConvBig with momentum, Nesterov and weight decay took 7 ms
    fused against 58 ms, 2026-11-29, two threads on this project's CPU)."""
    require_number("momentum", momentum, "SGD's momentum", low=0.0, low_open=False)
    require_number("weight_decay", weight_decay, "the L2 penalty", low=0.0, low_open=False)
    if kind == "adam":
        if momentum or nesterov:
            raise ValueError("momentum and nesterov are SGD's: pass optimizer='sgd'")
        return adam(net.parameters(), lr, weight_decay=weight_decay)
    if kind != "sgd":
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {kind!r}")
    if nesterov and not momentum:
        raise ValueError("nesterov needs a momentum above 0")
    params = list(net.parameters())
    return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov,
                           weight_decay=weight_decay, fused=_fusable(params))  # fmt: skip


@dataclass
class TrainState:
    """Where :func:`train` stood after ``step`` steps, enough to continue exactly as it would
    have gone on: the network's and the optimiser's state, the batch order and the
    generators' states. The Bayes Fig. 2 runs whose schedules agree for some epochs start from
    one (:mod:`leakagelib.experiments.bayes_training`)."""

    step: int
    weights: State
    optimizer: dict[str, Any]
    generator: Tensor
    global_generator: Tensor
    order: Tensor
    cursor: int


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained copy, per-step losses (of the steps it took),
    the snapshots by step and the states (:class:`TrainState`) by step."""

    model: nn.Module
    losses: list[float] = field(default_factory=list)
    snapshots: dict[int, State] = field(default_factory=dict)
    states: dict[int, TrainState] = field(default_factory=dict)


def _schedule(lr: float, gamma: float, milestones: Iterable[int]) -> Callable[[int], float]:
    """:func:`train`'s rate at each step (from 1), its settings checked first."""
    require_number("lr", lr, "the optimiser's step size", low=0.0, low_open=True)
    require_number("gamma", gamma, "the factor of each rate drop", low=0.0, low_open=True)
    drops = list(milestones)
    for m in drops:
        require_count("each milestone", m, "steps before a rate drop", low=0)
    drops.sort()
    return lambda step: lr * gamma ** bisect.bisect_right(drops, step - 1)


class _Batches:
    """The indices of :func:`train`'s batches: whole batches of a permutation of ``n``, a new
    permutation (from ``g``) when the next batch would not fit."""

    def __init__(self, n: int, batch_size: int, g: torch.Generator, start: TrainState | None):
        self.n, self.batch_size, self.g = n, batch_size, g
        self.order = torch.randperm(n, generator=g) if start is None else start.order.clone()
        self.cursor = 0 if start is None else start.cursor

    def next(self) -> Tensor:
        if self.cursor + self.batch_size > self.n:
            self.order, self.cursor = torch.randperm(self.n, generator=self.g), 0
        self.cursor += self.batch_size
        return self.order[self.cursor - self.batch_size : self.cursor]


def train(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    *,
    steps: int,
    batch_size: int = 32,
    lr: float = 1e-3,
    optimizer: str = "adam",
    augment: Augment | None = None,
    defense: GradientDefense | None = None,
    snapshot_steps: Iterable[int] = (),
    seed: int = 0,
    momentum: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    milestones: Iterable[int] = (),
    gamma: float = 0.1,
    start: TrainState | None = None,
    state_steps: Iterable[int] = (),
) -> TrainResult:
    """Centralised mini-batch training of a copy of ``model`` for ``steps`` optimiser steps.

    Batches are drawn by reshuffling the data every epoch; ``augment`` is applied to each
    batch (ATS) and ``defense`` to each step's gradient (see :func:`federated_averaging`);
    ``snapshot_steps`` are the steps after which to keep the weights (0: before the first).
    ``optimizer`` is ``"adam"`` (:func:`adam`) or ``"sgd"`` with PyTorch's ``momentum`` and
    ``nesterov``; both take ``weight_decay`` (PyTorch's L2 term). The rate is ``lr`` times
    ``gamma`` per milestone at or below the steps taken, as PyTorch's ``MultiStepLR`` stepped
    every step (a milestone 0 acts before the first; :mod:`.experiments.bayes_training`).
    ``start`` continues a :class:`TrainState` of a run on the same data, batch size and
    optimiser as that run would have gone on; ``state_steps`` are the steps to keep one after.
    """
    check_batch(model, images, labels)  # finite images, labels in the model's classes
    require_count("steps", steps, "optimiser steps", low=0)
    require_count("batch_size", batch_size, "images per step")
    rate = _schedule(lr, gamma, milestones)
    defense = NoDefense() if defense is None else defense
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    net = copy.deepcopy(model)
    opt = _optimizer(net, optimizer, lr, momentum, nesterov, weight_decay)
    batches = _Batches(images.shape[0], batch_size, g, start)
    first = 1 if start is None else _resume(net, opt, g, start, steps)
    wanted, keep = set(snapshot_steps), set(state_steps)
    result = TrainResult(model=net, snapshots={0: _snapshot(net)} if 0 in wanted else {})
    net.train()
    for step in range(first, steps + 1):
        idx = batches.next().to(images.device)
        x, y = images[idx], labels[idx]
        opt.param_groups[0]["lr"] = rate(step)  # (train's optimisers have one group)
        if augment is not None:
            x = augment(x, g)
        loss = _step(net, opt, x, y, defense, g)
        result.losses.append(float(loss))
        if step in wanted:
            result.snapshots[step] = _snapshot(net)
        if step in keep:
            result.states[step] = _state(step, net, opt, g, batches)
    return result


def _state(
    step: int, net: nn.Module, opt: torch.optim.Optimizer, g: torch.Generator, batches: _Batches
) -> TrainState:
    """:func:`train`'s :class:`TrainState` after ``step`` steps (copies, as training goes on)."""
    return TrainState(step, _snapshot(net), copy.deepcopy(opt.state_dict()), g.get_state(),
                      torch.get_rng_state(), batches.order.clone(), batches.cursor)  # fmt: skip


def _resume(
    net: nn.Module, opt: torch.optim.Optimizer, g: torch.Generator, start: TrainState, steps: int
) -> int:
    """Put ``start`` into :func:`train`'s network, optimiser and generators; the first step."""
    if start.step > steps:
        raise ValueError(f"start is after step {start.step}, past the run's {steps} steps")
    net.load_state_dict(start.weights)
    opt.load_state_dict(copy.deepcopy(start.optimizer))
    g.set_state(start.generator)
    torch.set_rng_state(start.global_generator)
    return start.step + 1
