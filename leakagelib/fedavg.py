"""Federated averaging as the CVB authors run it, with snapshots for attacks during training.

:func:`federated_averaging` follows the CVB paper's protocol (§V-A): the
training images are split IID over ``N`` clients; each client holds out a
validation share; in every communication round each client starts from the
global model, trains for ``local_epochs`` epochs with Adam on cross-entropy
(plus ``β·KL`` of any variational bottleneck, Eq. 3,
:func:`leakagelib.fl.training_loss`), and the server averages the client
models weighted by their number of training samples (McMahan et al. 2017).
The global model is then scored on every client's validation share and on
the test data; training stops early when that validation loss has not
improved for ``patience`` rounds, and the round with the lowest one is the
one reported (:attr:`FLResult.best`).

What the authors' code does (dAI-SY-Group/ConvolutionalVariationalBottleneck),
and so what this module does:

- ``configs/fedavg.yaml``: 10 clients, 1 local epoch, batch size 64, Adam with
  lr 10⁻³, betas (0.9, 0.999) and no weight decay, at most 300 rounds, FedAvg
  weighted by the clients' sample counts (``weigh_sample_quantity``), early
  stopping on the global validation loss with patience 40 and delta 0;
  ``configs/data/*.yaml``: each client's validation split is 0.1.
- A fresh Adam every round: ``src/training.py``, ``Client.train``, loads the
  global state and calls ``FederatedTrainer.reset_optimizer_state``, which
  for Adam empties the optimiser's state (moments and step counts). The
  ``ReduceLROnPlateau`` of ``configs/fedavg.yaml`` (×0.5, patience 15) is
  rebuilt by that same call every round and steps once per local epoch on
  the client's validation loss, so with one epoch per round it never acts;
  the environment's own scheduler is ``None``
  (``SiloFederatedAveragingEnvironment.__init__``). The learning rate is
  therefore constant, and no scheduler is implemented here.
  ``reset_optimizer=False`` keeps each client's Adam state across rounds
  instead.
- The validation loss of the *global* model:
  ``SiloFederatedAveragingEnvironment.train`` evaluates the aggregated model
  on every client's validation split and early-stops on the unweighted mean
  over clients (``evaluate``: ``np.mean``) of its loss — cross-entropy, plus
  β·KL with a bottleneck (``VBLoss``). Each improvement saves the global
  state as the "best" checkpoint, and ``summary(mode='best')`` reports the
  metrics of the round with the lowest validation loss (``src/history.py``,
  ``History.summary``: argmin).

Two details differ, neither of which changes the protocol: a client's
validation loss here is the mean over its images (theirs: the mean of batch
means), and test accuracy is measured on the whole test split (theirs: the
mean of the clients' accuracies on equal shards of it). Used by the chapter
"Variational bottlenecks" (:mod:`leakagelib.experiments.cvb_common`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .attacks.checkpoint import LoopCheckpoint, fingerprint
from .defenses.base import GradientDefense, NoDefense
from .fl import Augment, State, _check_data, _snapshot, _step, accuracy, adam, evaluate

__all__ = ["FLResult", "client_shards", "federated_averaging", "iid_split"]


def iid_split(n: int, clients: int, generator: torch.Generator | None = None) -> list[Tensor]:
    """A random partition of ``range(n)`` into ``clients`` parts of (almost) equal size."""
    if clients < 1:
        raise ValueError(f"clients must be at least 1, got {clients}")
    if n < clients:
        raise ValueError(f"cannot split {n} samples over {clients} clients")
    return list(torch.randperm(n, generator=generator).tensor_split(clients))


def client_shards(
    n: int,
    clients: int,
    *,
    val_fraction: float = 0.1,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> list[tuple[Tensor, Tensor]]:
    """Each client's (training, validation) indices into ``n`` pooled samples.

    Exactly the split :func:`federated_averaging` makes with the same
    ``clients``, ``val_fraction`` and ``seed``: the CVB experiments draw their
    victims from client 0's training indices, as the paper attacks one
    client's training data (§V-B).
    """
    g = torch.Generator().manual_seed(seed)
    return _client_shards(n, clients, val_fraction, g, torch.device(device or "cpu"))


@dataclass
class FLResult:
    """What :func:`federated_averaging` returns.

    ``history`` holds one dict per round: ``round`` (1-based), ``val_loss``
    (the global model's, mean over clients; None without validation data),
    ``test_accuracy`` (None without test data). ``snapshots`` maps a round
    (0 = the initial model) to the global ``state_dict`` after it;
    ``best_state`` is the global state of :attr:`best` (the authors' "best"
    checkpoint), ``model`` the model after the last round.
    """

    model: nn.Module
    history: list[dict[str, Any]] = field(default_factory=list)
    snapshots: dict[int, State] = field(default_factory=dict)
    stopped_early: bool = False
    best_state: State | None = None

    @property
    def best(self) -> dict[str, Any]:
        """The history entry of the round the authors report.

        The first round with the lowest validation loss of the global model
        (their ``summary(mode='best')``); the last round when no client holds
        validation data.
        """
        if not self.history:
            raise ValueError("no round was trained, so there is no best round")
        scored = [h for h in self.history if h["val_loss"] is not None]
        return min(scored, key=lambda h: h["val_loss"]) if scored else self.history[-1]


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
    reset_optimizer: bool = True,
    test: tuple[Tensor, Tensor] | None = None,
    snapshot_rounds: Iterable[int] = (),
    augment: Augment | None = None,
    defense: GradientDefense | None = None,
    seed: int = 0,
    checkpoint: LoopCheckpoint | None = None,
) -> FLResult:
    """Train a deep copy of ``model`` with FedAvg over IID clients (the CVB authors' protocol).

    ``images`` (normalised as the model expects) and ``labels`` are the pooled
    training data, split IID over ``clients`` (:func:`client_shards`); each
    keeps ``val_fraction`` of its share (at least one sample) for validation.
    After every round the global model's validation loss (mean over clients)
    and test accuracy are recorded; ``patience`` rounds without a lower
    validation loss stop training (``None``: never). Each round every client
    starts a fresh Adam at the constant ``lr`` (``reset_optimizer=False``: its
    state carries over). ``snapshot_rounds``: rounds whose global state to keep (0 =
    before training). Every local update goes through ``defense`` (DP-SGD, ...; CVB
    §VI-C). Randomness: ``seed`` (bottleneck noise too, via torch's global generator).
    ``checkpoint`` saves the run after a round every few minutes and resumes it, to the
    result of an uninterrupted run (:mod:`leakagelib.attacks.checkpoint`).
    """
    _check_fedavg(images, labels, test, rounds=rounds, epochs=local_epochs, batch=batch_size,
                  patience=patience)  # fmt: skip
    defense = NoDefense() if defense is None else defense
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    global_model = copy.deepcopy(model)
    shards = _client_shards(images.shape[0], clients, val_fraction, g, images.device)
    locals_ = [copy.deepcopy(global_model) for _ in range(clients)]
    optimizers = [adam(m.parameters(), lr, betas) for m in locals_]
    wanted = set(snapshot_rounds)
    result = FLResult(global_model, snapshots={0: _snapshot(global_model)} if 0 in wanted else {})
    # a fresh Adam every round (the authors'): no optimiser state to keep across rounds
    run = _Run(result, [] if reset_optimizer else optimizers, defense, checkpoint)
    if checkpoint is not None:  # the file belongs to this run; it resumes the batch order
        settings = [rounds, clients, local_epochs, batch_size, lr, betas, val_fraction, patience,
                    reset_optimizer, sorted(wanted), augment is None, defense.describe(), seed]  # fmt: skip
        data = {"images": images, "labels": labels.double(), **global_model.state_dict()}
        checkpoint.bind(fingerprint(settings, data), [g])
    with checkpoint or nullcontext():
        _rounds(run, list(zip(locals_, optimizers, shards, strict=True)), images, labels,
                rounds=rounds, patience=patience, test=test, wanted=wanted,
                reset=reset_optimizer, epochs=local_epochs, batch_size=batch_size, generator=g,
                augment=augment, defense=defense)  # fmt: skip
    return result


def _rounds(
    run: _Run,
    clients: list[tuple[nn.Module, torch.optim.Optimizer, tuple[Tensor, Tensor]]],
    images: Tensor,
    labels: Tensor,
    *,
    rounds: int,
    patience: int | None,
    test: tuple[Tensor, Tensor] | None,
    wanted: set[int],
    reset: bool,
    **local: Any,
) -> None:
    """:func:`federated_averaging`'s rounds, from the first that ``run`` has not trained:
    train, score, keep snapshots and the best state, stop early, save the run when due."""
    result, model = run.result, run.result.model
    sizes = torch.tensor([len(tr) for _, _, (tr, _) in clients], dtype=torch.float64)
    shards = [shard for _, _, shard in clients]
    first = run.restore() + 1  # after a saved run's end: no round left
    for rnd in range(first, rounds + 1) if not run.ended else ():
        _round(model, clients, images, labels, sizes / sizes.sum(), reset=reset, **local)
        val_loss = _validation_loss(model, images, labels, shards)
        test_acc = accuracy(model, *test) if test is not None else None
        result.history.append({"round": rnd, "val_loss": val_loss, "test_accuracy": test_acc})
        if rnd in wanted:
            result.snapshots[rnd] = _snapshot(model)
        result.stopped_early = _stop(result, patience)
        run.saved(rnd)
        if result.stopped_early:
            break
    run.saved(len(result.history), final=True)


class _Run:
    """A training run's state for its checkpoint (:mod:`leakagelib.attacks.checkpoint`): the
    global model, history, best and snapshot states, the clients' optimisers (those that
    keep their state across rounds) and the defense's ledger; the checkpoint adds the
    batch-order and global generators."""

    def __init__(self, result: FLResult, optimizers: list[torch.optim.Optimizer],
                 defense: GradientDefense, checkpoint: LoopCheckpoint | None) -> None:  # fmt: skip
        self.result, self.optimizers, self.defense = result, optimizers, defense
        self.checkpoint, self.ended = checkpoint, False

    def state(self) -> dict[str, Any]:
        """What a checkpoint saves of the run (its ``tick`` calls this when due)."""
        r = self.result
        return {"model": r.model.state_dict(), "history": r.history, "best": r.best_state,
                "snapshots": r.snapshots, "stopped": r.stopped_early,
                "optimizers": [o.state_dict() for o in self.optimizers],
                "defense": self.defense.state_dict()}  # fmt: skip

    def restore(self) -> int:
        """The rounds already trained (0 without a saved run); ``ended`` says whether it ended."""
        saved = None if self.checkpoint is None else self.checkpoint.load()
        if saved is None:
            return 0
        r = self.result
        r.model.load_state_dict(saved["model"])
        r.history, r.best_state = list(saved["history"]), saved["best"]
        r.snapshots, r.stopped_early = dict(saved["snapshots"]), bool(saved["stopped"])
        for opt, state in zip(self.optimizers, saved["optimizers"], strict=True):
            opt.load_state_dict(state)
        self.defense.load_state_dict(saved["defense"])
        self.ended = bool(saved["finished"])
        return len(r.history)

    def saved(self, rounds: int, *, final: bool = False) -> None:
        """After ``rounds`` rounds: save when due (or at the end, once)."""
        if self.checkpoint is not None and not (final and self.ended):
            self.checkpoint.tick(rounds - 1, self.state, final=final)


def _stop(result: FLResult, patience: int | None) -> bool:
    """After a round: keep the global state if its validation loss is the lowest yet, and say
    whether ``patience`` rounds have passed without one (the authors' ``EarlyStopping``, delta 0).
    """
    scored = [h["val_loss"] for h in result.history if h["val_loss"] is not None]
    if not scored or result.history[-1]["val_loss"] is None:
        return False
    best = scored.index(min(scored))
    if best == len(scored) - 1:
        result.best_state = _snapshot(result.model)
    return patience is not None and len(scored) - 1 - best >= patience


def _check_fedavg(
    images: Tensor,
    labels: Tensor,
    test: tuple[Tensor, Tensor] | None,
    *,
    rounds: int,
    epochs: int,
    batch: int,
    patience: int | None,
) -> None:
    """:func:`federated_averaging`'s checks, made before any training."""
    _check_data(images, labels, "training")
    if rounds < 0 or epochs < 1 or batch < 1:
        raise ValueError(
            f"need rounds >= 0, local_epochs >= 1, batch_size >= 1; got {rounds}, {epochs}, {batch}"
        )
    if patience is not None and patience < 1:
        raise ValueError(f"patience must be None or at least 1, got {patience}")
    if test is not None:
        _check_data(*test, "test")


def _round(
    global_model: nn.Module,
    clients: list[tuple[nn.Module, torch.optim.Optimizer, tuple[Tensor, Tensor]]],
    images: Tensor,
    labels: Tensor,
    weights: Tensor,
    *,
    reset: bool,
    **local: Any,
) -> None:
    """One FedAvg round: every client trains from the global state, then the states are averaged.

    ``clients`` holds each client's model, optimiser and (training,
    validation) indices; ``reset`` empties each optimiser's state first (the
    authors' ``reset_optimizer_state``); ``local`` holds the arguments of
    :func:`_local_epochs`.
    """
    state = global_model.state_dict()
    for model, opt, (tr, _) in clients:
        model.load_state_dict(state)
        if reset:
            opt.state.clear()
        _local_epochs(model, opt, images[tr], labels[tr], **local)
    global_model.load_state_dict(_average(state, [m for m, _, _ in clients], weights))


def _validation_loss(
    model: nn.Module, images: Tensor, labels: Tensor, shards: list[tuple[Tensor, Tensor]]
) -> float | None:
    """The mean over clients of ``model``'s loss on each validation share (None without any)."""
    losses = [evaluate(model, images[va], labels[va])[0] for _, va in shards if len(va)]
    return sum(losses) / len(losses) if losses else None


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
