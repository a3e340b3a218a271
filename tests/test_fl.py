"""Federated averaging, centralised training and their snapshots."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from leakagelib import data
from leakagelib.defenses import CVB, DPSGD, GradientCompression, insert_bottleneck
from leakagelib.fedavg import FLResult, client_shards, federated_averaging, iid_split
from leakagelib.fl import accuracy, adam, evaluate, train, training_loss


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, ...]:
    x, y, norm = data.load("digits", split="train")
    xt, yt, _ = data.load("digits", split="test")
    return norm.normalize(x), y, norm.normalize(xt), yt


def test_iid_split_is_a_partition() -> None:
    parts = iid_split(103, 10, torch.Generator().manual_seed(0))
    assert len(parts) == 10 and {len(p) for p in parts} <= {10, 11}
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.arange(103))
    with pytest.raises(ValueError, match="cannot split"):
        iid_split(3, 5)


def _full_batch_fedavg(*, reset: bool) -> tuple[nn.Module, nn.Module]:
    """One client, full batch, four rounds: FedAvg's model and local Adam's, as the CVB authors'
    client resets its optimiser each round (``reset``: a fresh Adam per step) or not."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(40, 1, 8, 8, generator=g), torch.randint(0, 10, (40,), generator=g)
    model = mlp()
    result = federated_averaging(
        model, x, y, rounds=4, clients=1, batch_size=40, val_fraction=0.0, lr=1e-2, patience=None,
        reset_optimizer=reset,
    )  # fmt: skip
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), mlp().state_dict().values(), strict=True)
    )
    reference = mlp()
    opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for _ in range(4):  # full batch: one Adam step per round
        if reset:
            opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
        opt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        opt.step()
    return result.model, reference


@pytest.mark.parametrize("reset", [True, False])
def test_one_client_fedavg_equals_local_adam_training(reset: bool) -> None:
    ours, reference = _full_batch_fedavg(reset=reset)
    for (name, a), b in zip(
        ours.state_dict().items(), reference.state_dict().values(), strict=True
    ):
        assert torch.allclose(a, b, atol=1e-5), name


def test_a_fresh_adam_each_round_differs_from_a_kept_one() -> None:
    fresh, kept = _full_batch_fedavg(reset=True)[0], _full_batch_fedavg(reset=False)[0]
    assert not all(
        torch.allclose(a, b, atol=1e-4)
        for a, b in zip(fresh.state_dict().values(), kept.state_dict().values(), strict=True)
    )


def test_fedavg_of_identical_clients_equals_local_training() -> None:
    seed, clients, per = 3, 3, 12
    parts = iid_split(clients * per, clients, torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(2)
    base_x, base_y = (
        torch.randn(per, 1, 8, 8, generator=g),
        torch.randint(0, 10, (per,), generator=g),
    )
    x, y = torch.empty(clients * per, 1, 8, 8), torch.empty(clients * per, dtype=torch.long)
    for part in parts:  # every client receives the same images, in the same order
        x[part], y[part] = base_x, base_y
    fed = federated_averaging(
        mlp(), x, y, rounds=3, clients=clients, batch_size=per, val_fraction=0.0, lr=1e-2,
        patience=None, seed=seed,
    )  # fmt: skip
    solo = federated_averaging(
        mlp(), base_x, base_y, rounds=3, clients=1, batch_size=per, val_fraction=0.0, lr=1e-2,
        patience=None,
    )  # fmt: skip
    for a, b in zip(fed.model.state_dict().values(), solo.model.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_accuracy_improves_over_rounds_and_snapshots_are_kept(digits) -> None:
    x, y, xt, yt = digits
    result = federated_averaging(
        mlp(),
        x,
        y,
        rounds=4,
        clients=4,
        batch_size=32,
        lr=3e-3,
        test=(xt, yt),
        snapshot_rounds=(0, 2),
    )
    accs = [h["test_accuracy"] for h in result.history]
    assert len(accs) == 4 and accs[-1] > 0.8
    initial = mlp()
    initial.load_state_dict(result.snapshots[0])
    assert accuracy(initial, xt, yt) < 0.3 < accs[0] <= max(accs)
    assert sorted(result.snapshots) == [0, 2]
    assert all(h["val_loss"] is not None for h in result.history)


def test_validation_loss_is_the_global_models_and_the_best_round_is_reported(digits) -> None:
    """The CVB authors early-stop on the aggregated model's validation loss (mean over clients)
    and report the round with the lowest one (src/training.py, src/history.py)."""
    x, y, xt, yt = digits
    x, y = x[:300], y[:300]
    result = federated_averaging(
        mlp(), x, y, rounds=5, clients=3, batch_size=16, lr=3e-2, test=(xt, yt),
        snapshot_rounds=range(6), seed=4,
    )  # fmt: skip
    shards = client_shards(300, 3, val_fraction=0.1, seed=4)
    last = [evaluate(result.model, x[va], y[va])[0] for _, va in shards]
    assert result.history[-1]["val_loss"] == pytest.approx(sum(last) / 3, rel=1e-6)
    best = result.best
    assert best["val_loss"] == min(h["val_loss"] for h in result.history)
    assert all(
        torch.equal(result.best_state[k], v) for k, v in result.snapshots[best["round"]].items()
    )
    # the reported round is the lowest validation loss, not the last round
    history = [
        {"round": 1, "val_loss": 0.9, "test_accuracy": 0.5},
        {"round": 2, "val_loss": 0.4, "test_accuracy": 0.7},
        {"round": 3, "val_loss": 0.6, "test_accuracy": 0.8},
        {"round": 4, "val_loss": 0.4, "test_accuracy": 0.9},
    ]
    assert FLResult(model=mlp(), history=history).best["round"] == 2
    no_validation = [{"round": r, "val_loss": None, "test_accuracy": 0.1 * r} for r in (1, 2)]
    assert FLResult(model=mlp(), history=no_validation).best["round"] == 2
    with pytest.raises(ValueError, match="no round was trained"):
        _ = FLResult(model=mlp()).best


def test_client_shards_are_the_split_fedavg_trains_on() -> None:
    shards = client_shards(50, 4, val_fraction=0.2, seed=3)
    everything = torch.cat([torch.cat(pair) for pair in shards])
    assert torch.equal(torch.sort(everything).values, torch.arange(50))
    assert all(len(va) == max(1, round(0.2 * (len(tr) + len(va)))) for tr, va in shards)
    assert all(
        torch.equal(a[0], b[0])
        for a, b in zip(shards, client_shards(50, 4, val_fraction=0.2, seed=3), strict=True)
    )
    assert not torch.equal(shards[0][0], client_shards(50, 4, val_fraction=0.2, seed=4)[0][0])


def test_early_stopping_on_validation_loss(digits) -> None:
    x, y, _, _ = digits
    frozen = federated_averaging(
        mlp(), x[:200], y[:200], rounds=10, clients=2, lr=1e-12, patience=2
    )
    assert frozen.stopped_early and len(frozen.history) < 10


def test_centralised_training_with_augmentation_and_snapshots(digits) -> None:
    x, y, xt, yt = digits
    calls = []

    def augment(batch: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        calls.append(batch.shape[0])
        return batch

    result = train(
        mlp(), x, y, steps=60, batch_size=32, lr=3e-3, augment=augment, snapshot_steps=(0, 10, 60)
    )
    assert len(calls) == 60 and set(calls) == {32}
    assert sorted(result.snapshots) == [0, 10, 60]
    assert sum(result.losses[-10:]) < sum(result.losses[:10])
    assert accuracy(result.model, xt, yt) > 0.7
    with pytest.raises(ValueError, match="optimizer"):
        train(mlp(), x, y, steps=1, optimizer="rmsprop")


def _assert_takes_torchs_steps(trained, x, y, make_optimizer, atol: float, make_scheduler=None):
    """``trained`` (5 steps of ``train`` on all of ``x`` as one batch) equals five steps of the
    PyTorch optimiser ``make_optimizer(parameters)`` from the same start, its
    scheduler ``make_scheduler(optimizer)`` (if given) stepped after each."""
    reference = mlp()
    opt = make_optimizer(reference.parameters())
    scheduler = None if make_scheduler is None else make_scheduler(opt)
    for _ in range(5):  # one batch of all the images: their order does not matter
        opt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
    for (name, a), b in zip(
        trained.state_dict().items(), reference.state_dict().values(), strict=True
    ):
        assert torch.allclose(a, b, atol=atol), name


def test_train_takes_adams_fused_kernel_with_the_default_adams_steps(digits) -> None:
    """``train``'s Adam is PyTorch's, fused: five steps land where the default kernel's do."""
    x, y = digits[0][:32], digits[1][:32]
    assert adam(mlp().parameters(), 1e-3).defaults["fused"] is True
    ours = train(mlp(), x, y, steps=5, batch_size=32, lr=1e-2).model
    _assert_takes_torchs_steps(
        ours, x, y, lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False), 1e-5
    )
    assert not torch.equal(ours[1].weight, mlp()[1].weight)  # it did train


def test_train_runs_inversefeds_conservative_sgd(digits) -> None:
    """SGD with momentum 0.9, Nesterov and weight decay 5e-4 at lr 0.1 (the Bayes authors' ATS
    training) takes PyTorch's steps; Adam refuses SGD's settings, and Nesterov needs momentum."""
    x, y = digits[0][:32], digits[1][:32]
    sgd = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}
    ours = train(mlp(), x, y, steps=5, batch_size=32, **sgd).model
    torch_sgd = {k: v for k, v in sgd.items() if k != "optimizer"}
    _assert_takes_torchs_steps(ours, x, y, lambda p: torch.optim.SGD(p, **torch_sgd), 1e-6)
    plain = train(mlp(), x, y, steps=5, batch_size=32, optimizer="sgd", lr=0.1).model
    assert not torch.allclose(plain[1].weight, ours[1].weight)  # momentum made a difference
    with pytest.raises(ValueError, match="are SGD's"):
        train(mlp(), x, y, steps=1, momentum=0.9)
    with pytest.raises(ValueError, match="each milestone must be"):
        train(mlp(), x, y, steps=1, milestones=[-1])
    with pytest.raises(ValueError, match="nesterov needs a momentum"):
        train(mlp(), x, y, steps=1, optimizer="sgd", nesterov=True)
    with pytest.raises(ValueError, match="momentum must be"):
        train(mlp(), x, y, steps=1, optimizer="sgd", momentum=-0.1)


def test_train_drops_the_rate_at_its_milestones_as_pytorchs_multisteplr(digits) -> None:
    """Milestones 0, 2 and 2 (one before the first step, two after the second) take the steps
    of PyTorch's MultiStepLR stepped after every step; Adam's weight decay is PyTorch's."""
    x, y = digits[0][:32], digits[1][:32]
    ours = train(mlp(), x, y, steps=5, batch_size=32, optimizer="sgd", lr=0.5, momentum=0.9,
                 milestones=[2, 0, 2], gamma=0.5).model  # fmt: skip
    _assert_takes_torchs_steps(
        ours, x, y, lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9), 1e-6,
        lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, [0, 2, 2], gamma=0.5),
    )  # fmt: skip
    flat = train(mlp(), x, y, steps=5, batch_size=32, optimizer="sgd", lr=0.5, momentum=0.9)
    assert not torch.allclose(flat.model[1].weight, ours[1].weight)  # the drops acted
    decayed = train(mlp(), x, y, steps=5, batch_size=32, lr=1e-2, weight_decay=0.1).model
    _assert_takes_torchs_steps(
        decayed, x, y, lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1), 1e-5
    )


def test_a_run_continued_from_its_state_goes_on_exactly_as_it_would_have(digits) -> None:
    """Seven steps through a reshuffle (batches of 100 of 300 images), with an augmentation that
    draws from the generator: continued from step 4's state, in a run of its own and with a
    different schedule from there on, the result is the uninterrupted run's."""
    x, y = digits[0][:300], digits[1][:300]

    def jitter(batch: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
        return batch + 0.1 * torch.randn(batch.shape, generator=g)

    common = {"batch_size": 100, "augment": jitter, "optimizer": "sgd", "lr": 0.1,
              "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}  # fmt: skip
    for later in ([], [5, 5]):
        whole = train(mlp(), x, y, steps=7, milestones=later, **common)
        part = train(mlp(), x, y, steps=4, state_steps=[4], **common)
        rest = train(mlp(), x, y, steps=7, milestones=later, start=part.states[4], **common)
        assert part.losses + rest.losses == whole.losses
        for (name, a), b in zip(
            rest.model.state_dict().items(), whole.model.state_dict().values(), strict=True
        ):
            assert torch.equal(a, b), (later, name)
    with pytest.raises(ValueError, match="past the run's 3 steps"):
        train(mlp(), x, y, steps=3, start=part.states[4], **common)


def test_training_loss_adds_the_bottleneck_kl() -> None:
    conv = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10))
    model = insert_bottleneck(conv, CVB(4, kernel_size=3, beta=1.0), 1)
    x, y = torch.randn(3, 1, 8, 8), torch.tensor([1, 2, 3])
    torch.manual_seed(0)
    total = training_loss(model, x, y)
    torch.manual_seed(0)
    ce = F.cross_entropy(model(x), y)
    kl = model.get_submodule("bottleneck").last_kl
    assert float(total.detach()) == pytest.approx(float((ce + kl).detach()), rel=1e-5)
    assert float(kl.detach()) > 0


def test_gradient_defenses_act_on_every_training_step(digits) -> None:
    x, y, _, _ = digits
    model = mlp()
    frozen = train(model, x, y, steps=5, defense=GradientCompression(1.0))
    for a, b in zip(frozen.model.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # every gradient entry pruned: nothing moves
    plain = train(model, x, y, steps=5, optimizer="sgd", lr=0.1)
    dp = train(model, x, y, steps=5, optimizer="sgd", lr=0.1, defense=DPSGD(0.0, max_grad_norm=1e6))
    for a, b in zip(plain.model.state_dict().values(), dp.model.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)  # no noise, no effective clipping: plain SGD


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"labels": -100}, ValueError, "labels must be class indices in 0..9"),
        ({"lr": float("nan")}, ValueError, "lr must be a finite number > 0"),
        ({"steps": 2.5}, TypeError, "steps must be an integer >= 0 (optimiser steps)"),
    ],
)
def test_training_refuses_an_ignored_label_or_a_bad_hyperparameter(digits, change, error, message):
    """PyTorch's cross-entropy silently drops the label -100 from the mean; Adam fails on a NaN lr
    only inside torch; a fractional step count fails inside range(): each is named up front."""
    x, y, _, _ = digits
    labels = y[:8].clone()
    if "labels" in change:
        labels[3] = change["labels"]
    options = {"steps": 1, "lr": 1e-3} | {k: v for k, v in change.items() if k != "labels"}
    with pytest.raises(error, match=re.escape(message)):
        train(mlp(), x[:8], labels, **options)
