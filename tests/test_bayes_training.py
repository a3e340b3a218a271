"""The Bayes authors' training recipes (``experiments.bayes_training``): their schedule's quirks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from leakagelib import data
from leakagelib.experiments.bayes_training import (
    CONSERVATIVE,
    epoch_rates,
    epoch_run,
    inversefed_milestones,
    shared_epochs,
    stepwise_run,
)
from leakagelib.fl import train


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


def _authors_loop(x: torch.Tensor, y: torch.Tensor, epochs: int, per_epoch: int) -> nn.Module:
    """inversefed's ``train`` as the authors ran it: conservative SGD, a MultiStepLR built on
    the run's own epoch count and stepped after each epoch (one batch of all of ``x`` per step)."""
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True)
    sched = torch.optim.lr_scheduler.MultiStepLR(
        opt, milestones=[epochs // 2.667, epochs // 1.6, epochs // 1.142], gamma=0.1
    )
    for _ in range(epochs):
        for _ in range(per_epoch):
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()
        sched.step()
    return net


def test_the_milestones_are_the_runs_own_and_a_step_wise_run_starts_at_a_thousandth() -> None:
    assert inversefed_milestones(1) == [0, 0, 0]
    assert inversefed_milestones(3) == [1, 1, 2]
    assert inversefed_milestones(10) == [3, 6, 8]
    run = stepwise_run(10)
    assert run["steps"] == 10 and run["milestones"] == [0, 0, 0]
    assert {k: run[k] for k in CONSERVATIVE} == CONSERVATIVE
    assert epoch_run(10, 1562)["milestones"] == [4686, 9372, 12496]


def test_an_epoch_run_takes_the_authors_steps() -> None:
    """Runs of 1, 2 and 3 epochs of two steps each land where the authors' loop does, and
    differ from one another (each run's schedule is its own)."""
    images, labels, norm = data.load("digits", n=48, split="train")
    x, y = norm.normalize(images), labels
    ends = []
    for epochs in (1, 2, 3):
        ours = train(_net(), x, y, batch_size=48, **epoch_run(epochs, 2)).model
        theirs = _authors_loop(x, y, epochs, 2)
        for (name, a), b in zip(
            ours.state_dict().items(), theirs.state_dict().values(), strict=True
        ):
            assert torch.allclose(a, b, atol=1e-6), (epochs, name)
        ends.append(ours[1].weight.detach())
    change = [float((w - _net()[1].weight.detach()).norm()) for w in ends]
    assert change[0] < change[1] / 10 < change[2] / 10, change  # 10⁻⁴, then 10⁻², then 0.1 first


def test_runs_share_the_epochs_their_schedules_agree_on() -> None:
    """Fig. 2's Soteria runs of 0–10 epochs, each started from the latest state an earlier
    run kept at one of its shared epochs, train 35 epochs instead of 55."""
    assert shared_epochs(4, range(11)) == [1, 2]  # with 3 (0.1 first) and with 5 (0.1, 0.01)
    assert shared_epochs(2, range(11)) == []  # 0.01 first: no other run starts so
    kept: set[tuple[float, ...]] = set()
    trained = 0
    for epochs in range(11):
        points = shared_epochs(epochs, range(11))
        rates = epoch_rates(epochs)
        start = max((k for k in points if tuple(rates[:k]) in kept), default=0)
        trained += epochs - start
        kept |= {tuple(rates[:k]) for k in points}
    assert trained == 35
