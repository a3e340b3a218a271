"""Federated averaging and centralised training, with snapshots for attacks during training.

:func:`federated_averaging` follows the CVB paper's protocol (§V-A): the
training images are split IID over ``N`` clients; each client holds out a
validation share; in every communication round each client starts from the
global model, trains for ``local_epochs`` epochs with Adam on cross-entropy
(plus ``β·KL`` of any variational bottleneck, Eq. 3), and the server averages
the client models weighted by their number of samples (McMahan et al. 2017).
Test accuracy is evaluated after every round; training stops early when the
mean validation loss over clients has not improved for ``patience`` rounds.
Defaults from the authors' code (dAI-SY-Group/ConvolutionalVariationalBottleneck,
configs/fedavg.yaml): 10 clients, 1 local epoch, batch size 64, Adam with
lr 1e-3 and betas (0.9, 0.999), patience 40; each client's Adam state persists
across rounds (src/training.py keeps a per-client optimiser state).

:func:`train` is the centralised loop the Bayes paper's Figure 2 needs (attack
ATS and Soteria after each of the first training steps): mini-batch Adam with
an optional augmentation hook (:class:`leakagelib.defenses.ats.ATSAugmentation`)
and snapshots after chosen optimiser steps.

Both return plain ``state_dict`` snapshots, so an attack can be run on the
model "as it was at step t". Used by the chapters "Breaking heuristic
defenses" and "Variational bottlenecks".
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .defenses.base import GradientDefense, NoDefense
from .defenses.bottlenecks import kl_loss

__all__ = [
    "FLResult",
    "TrainResult",
    "accuracy",
    "evaluate",
    "federated_averaging",
    "iid_split",
    "train",
]

Augment = Callable[[Tensor, torch.Generator | None], Tensor]
State = dict[str, Tensor]


def _check_data(images: Tensor, labels: Tensor, what: str) -> None:
    if images.dim() != 4:
        raise ValueError(f"{what} images must be N×C×H×W, got shape {tuple(images.shape)}")
    if labels.dim() != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{what} labels must be a vector of length {images.shape[0]}, got {tuple(labels.shape)}"
        )


def _snapshot(model: nn.Module) -> State:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def training_loss(model: nn.Module, images: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy plus the β-weighted KL terms of the model's bottlenecks (CVB Eq. 3)."""
    return F.cross_entropy(model(images), labels) + kl_loss(model)


@torch.no_grad()
def evaluate(
    model: nn.Module, images: Tensor, labels: Tensor, *, batch_size: int = 512
) -> tuple[float, float]:
    """(mean training loss, accuracy) of ``model`` in eval mode on the given data."""
    _check_data(images, labels, "evaluation")
    was_training = model.training
    model.eval()
    total_loss, correct = 0.0, 0
    try:
        for lo in range(0, images.shape[0], batch_size):
            x, y = images[lo : lo + batch_size], labels[lo : lo + batch_size]
            out = model(x)
            total_loss += float((F.cross_entropy(out, y) + kl_loss(model)) * x.shape[0])
            correct += int((out.argmax(dim=1) == y).sum())
    finally:
        model.train(was_training)
    n = images.shape[0]
    return total_loss / n, correct / n


def accuracy(model: nn.Module, images: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy of ``model`` (eval mode) on the given data."""
    return evaluate(model, images, labels)[1]


def iid_split(n: int, clients: int, generator: torch.Generator | None = None) -> list[Tensor]:
    """A random partition of ``range(n)`` into ``clients`` parts of (almost) equal size."""
    if clients < 1:
        raise ValueError(f"clients must be at least 1, got {clients}")
    if n < clients:
        raise ValueError(f"cannot split {n} samples over {clients} clients")
    return list(torch.randperm(n, generator=generator).tensor_split(clients))


@dataclass
class FLResult:
    """What :func:`federated_averaging` returns.

    ``history`` holds one dict per round: ``round`` (1-based), ``val_loss``
    (mean over clients), ``test_accuracy`` (None without test data).
    ``snapshots`` maps a round (0 = the initial model) to the global
    ``state_dict`` after it.
    """

    model: nn.Module
    history: list[dict[str, Any]] = field(default_factory=list)
    snapshots: dict[int, State] = field(default_factory=dict)
    stopped_early: bool = False


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


def _local_epochs(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    images: Tensor,
    labels: Tensor,
    *,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    augment: Augment | None,
    defense: GradientDefense,
) -> None:
    model.train()
    n = images.shape[0]
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for lo in range(0, n, batch_size):
            idx = order[lo : lo + batch_size].to(images.device)
            x, y = images[idx], labels[idx]
            if augment is not None:
                x = augment(x, generator)
            _step(model, optimizer, x, y, defense, generator)


def federated_averaging(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    *,
    rounds: int,
    clients: int = 10,
    local_epochs: int = 1,
    batch_size: int = 64,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    val_fraction: float = 0.1,
    patience: int | None = 40,
    test: tuple[Tensor, Tensor] | None = None,
    snapshot_rounds: Iterable[int] = (),
    augment: Augment | None = None,
    defense: GradientDefense | None = None,
    seed: int = 0,
) -> FLResult:
    """Train a deep copy of ``model`` with FedAvg over IID clients (the CVB paper's protocol).

    ``images`` (normalised as the model expects) and ``labels`` are the pooled
    training data, split IID over ``clients``; each keeps ``val_fraction`` of
    its share (at least one sample) for validation and early stopping
    (``patience=None``: none). ``snapshot_rounds``: rounds whose global state to
    keep (0 = before training). Every local step's update goes through
    ``defense`` (DP-SGD, compression, ...; CVB paper §VI-C). Randomness comes
    from ``seed`` (the bottlenecks' sampling too, via torch's global generator).
    """
    _check_fedavg(images, labels, test, rounds=rounds, epochs=local_epochs, batch=batch_size)
    defense = NoDefense() if defense is None else defense
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    global_model = copy.deepcopy(model)
    shards = _client_shards(images.shape[0], clients, val_fraction, g, images.device)
    locals_ = [copy.deepcopy(global_model) for _ in range(clients)]
    optimizers = [torch.optim.Adam(m.parameters(), lr=lr, betas=betas) for m in locals_]
    wanted = set(snapshot_rounds)
    result = FLResult(
        model=global_model, snapshots={0: _snapshot(global_model)} if 0 in wanted else {}
    )
    best, since_best = float("inf"), 0
    sizes = torch.tensor([len(tr) for tr, _ in shards], dtype=torch.float64)
    weights = sizes / sizes.sum()
    for rnd in range(1, rounds + 1):
        val_loss = _round(
            global_model, list(zip(locals_, optimizers, shards, strict=True)), images, labels,
            weights, epochs=local_epochs, batch_size=batch_size, generator=g, augment=augment,
            defense=defense,
        )  # fmt: skip
        test_acc = accuracy(global_model, *test) if test is not None else None
        result.history.append({"round": rnd, "val_loss": val_loss, "test_accuracy": test_acc})
        if rnd in wanted:
            result.snapshots[rnd] = _snapshot(global_model)
        if patience is not None and val_loss is not None:
            best, since_best = (val_loss, 0) if val_loss < best else (best, since_best + 1)
            if since_best and since_best >= patience:
                result.stopped_early = True
                break
    return result


def _check_fedavg(
    images: Tensor,
    labels: Tensor,
    test: tuple[Tensor, Tensor] | None,
    *,
    rounds: int,
    epochs: int,
    batch: int,
) -> None:
    """:func:`federated_averaging`'s checks, made before any training."""
    _check_data(images, labels, "training")
    if rounds < 0 or epochs < 1 or batch < 1:
        raise ValueError(
            f"need rounds >= 0, local_epochs >= 1, batch_size >= 1; got {rounds}, {epochs}, {batch}"
        )
    if test is not None:
        _check_data(*test, "test")


def _round(
    global_model: nn.Module,
    clients: list[tuple[nn.Module, torch.optim.Optimizer, tuple[Tensor, Tensor]]],
    images: Tensor,
    labels: Tensor,
    weights: Tensor,
    **local: Any,
) -> float | None:
    """One FedAvg round: every client trains from the global state, then the states are averaged.

    ``clients`` holds each client's model, optimiser and (training, validation)
    indices; ``local`` the arguments of :func:`_local_epochs`. Returns the mean
    validation loss of the clients' models (``None`` without validation data).
    """
    state = global_model.state_dict()
    val_losses = []
    for model, opt, (tr, va) in clients:
        model.load_state_dict(state)
        _local_epochs(model, opt, images[tr], labels[tr], **local)
        if len(va):
            val_losses.append(evaluate(model, images[va], labels[va])[0])
    global_model.load_state_dict(_average(state, [m for m, _, _ in clients], weights))
    return sum(val_losses) / len(val_losses) if val_losses else None


def _client_shards(
    n: int, clients: int, val_fraction: float, g: torch.Generator, device: torch.device
) -> list[tuple[Tensor, Tensor]]:
    """Each client's (training, validation) indices: an IID split, ``val_fraction`` held out."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    shards = []
    for part in iid_split(n, clients, g):
        n_val = max(1, round(val_fraction * len(part))) if val_fraction > 0 else 0
        if n_val >= len(part):
            raise ValueError(
                f"a client with {len(part)} samples cannot hold out {n_val} for validation"
            )
        part = part.to(device)
        shards.append((part[n_val:], part[:n_val]))
    return shards


def _average(state: State, locals_: list[nn.Module], weights: Tensor) -> State:
    """FedAvg: the clients' states averaged with ``weights`` (their training-set shares).

    Integer buffers (batch-norm counters) are not averaged: the first client's are taken.
    """
    averaged = {}
    for key, value in state.items():
        stacked = torch.stack([m.state_dict()[key].double() for m in locals_])
        if value.is_floating_point():
            w = weights.to(stacked.device).reshape(-1, *([1] * value.dim()))
            averaged[key] = (stacked * w).sum(dim=0).to(value.dtype)
        else:
            averaged[key] = locals_[0].state_dict()[key].clone()
    return averaged


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained copy, per-step losses and the snapshots by step."""

    model: nn.Module
    losses: list[float] = field(default_factory=list)
    snapshots: dict[int, State] = field(default_factory=dict)


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
) -> TrainResult:
    """Centralised mini-batch training of a copy of ``model`` for ``steps`` optimiser steps.

    Batches are drawn by reshuffling the data every epoch; ``augment`` is applied
    to each batch (ATS) and ``defense`` to each step's gradient (see
    :func:`federated_averaging`). ``snapshot_steps`` are the steps after which to keep
    the state (0 = before the first step). ``optimizer`` is ``"adam"`` or
    ``"sgd"``. The Bayes paper trains its ATS and Soteria networks with batch
    size 32 (A.1, A.2).
    """
    _check_data(images, labels, "training")
    if steps < 0 or batch_size < 1:
        raise ValueError(f"need steps >= 0 and batch_size >= 1, got {steps}, {batch_size}")
    defense = NoDefense() if defense is None else defense
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    net = copy.deepcopy(model)
    if optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(net.parameters(), lr=lr)
    else:
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    wanted = set(snapshot_steps)
    result = TrainResult(model=net)
    if 0 in wanted:
        result.snapshots[0] = _snapshot(net)
    n = images.shape[0]
    order = torch.randperm(n, generator=g)
    cursor = 0
    net.train()
    for step in range(1, steps + 1):
        if cursor + batch_size > n:
            order, cursor = torch.randperm(n, generator=g), 0
        idx = order[cursor : cursor + batch_size].to(images.device)
        cursor += batch_size
        x, y = images[idx], labels[idx]
        if augment is not None:
            x = augment(x, g)
        loss = _step(net, opt, x, y, defense, g)
        result.losses.append(float(loss))
        if step in wanted:
            result.snapshots[step] = _snapshot(net)
    return result
