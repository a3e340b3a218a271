"""Per-attack loop control (plateau schedule, early stopping, best iterate) and L-BFGS per attack."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from leakagelib.attacks import AttackConfig, Gaussian, Uniform, presets, reconstruct
from leakagelib.attacks.control import Watch
from leakagelib.attacks.network_priors import LogitLabelDistance
from leakagelib.gradients import per_sample_updates


def tiny_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(9, 6), nn.Sigmoid(), nn.Linear(6, 4))


def _problem(n: int = 2):
    net = tiny_net()
    x = torch.rand(n, 1, 3, 3, generator=torch.Generator().manual_seed(1))
    y = torch.arange(n) % 4
    return net, y, per_sample_updates(net, x, y)


def _watch(**fields) -> Watch:
    config = AttackConfig(**{"schedule": "plateau", "decay": 0.1, **fields})
    return Watch(config, torch.tensor([1.0, 1.0]).reshape(1, 2, 1))


def _see(watch: Watch, values: list[float], x: torch.Tensor) -> torch.Tensor:
    value = torch.tensor(values).reshape(1, 2, 1)
    watch.record(value, x, torch.zeros(1, 2, 1, 1, 1))
    x_next, _ = watch.settle(value, (x, x + 1), (torch.zeros(1, 2, 1, 1, 1),) * 2)
    return x_next


def test_plateau_lowers_only_the_stalled_attacks_lr_after_patience_bad_steps():
    watch, x = _watch(plateau_patience=2), torch.zeros(1, 2, 1, 1)
    # attack 0 stalls after its first step; attack 1 keeps improving
    for values in ([1.0, 1.0], [1.0, 0.5], [1.0, 0.25]):
        x = _see(watch, values, x)
        assert watch.lr.flatten().tolist() == [1.0, 1.0]
    x = _see(watch, [1.0, 0.125], x)  # the third bad step of attack 0: more than patience 2
    assert watch.lr.flatten().tolist() == pytest.approx([0.1, 1.0])
    for _ in range(2):
        x = _see(watch, [1.0, 0.1], x)
    assert watch.lr.flatten().tolist() == pytest.approx([0.1, 1.0])
    x = _see(watch, [1.0, 0.05], x)  # the count restarted after the drop
    assert watch.lr.flatten().tolist() == pytest.approx([0.01, 1.0])
    # a relative improvement below the threshold 1e-4 counts as a bad step
    slow = _watch(plateau_patience=0)
    _see(slow, [1.0, 1.0], torch.zeros(1, 2, 1, 1))
    _see(slow, [1.0 - 1e-6, 0.5], torch.zeros(1, 2, 1, 1))
    assert slow.lr.flatten().tolist() == pytest.approx([0.1, 1.0])


def test_early_stopping_freezes_the_stopped_attack_and_lets_the_other_go_on():
    watch = _watch(stop_patience=2, plateau_patience=100)
    x = torch.zeros(1, 2, 1, 1)
    x = _see(watch, [1.0, 1.0], x)
    x = _see(watch, [1.0, 0.5], x)
    assert watch.active.flatten().tolist() == [True, True]
    x = _see(watch, [1.0, 0.4], x)  # attack 0: two steps without a strictly lower value
    assert watch.active.flatten().tolist() == [False, True]
    frozen = x[0, 0].clone()
    for value in (0.3, 0.2):
        x = _see(watch, [0.0, value], x)  # a stopped attack's values are no longer read
    assert torch.equal(x[0, 0], frozen) and x[0, 1].item() == 5.0
    below = _watch(stop_below=1e-5)
    _see(below, [1e-6, 1e-4], torch.zeros(1, 2, 1, 1))
    assert below.active.flatten().tolist() == [False, True]


def _run(config: AttackConfig, n: int = 2, callback=None, initial=None, net_y_ups=None):
    net, y, ups = net_y_ups or _problem(n)
    return reconstruct(
        net, ups, labels=y, likelihood=Gaussian(2**-0.5), prior=Uniform(), config=config,
        input_shape=(1, 3, 3), generator=torch.Generator().manual_seed(5), callback=callback,
        initial=initial,
    )  # fmt: skip


@pytest.mark.parametrize("optimizer", ["adam", "lbfgs"])
def test_best_iterate_is_the_one_of_lowest_recorded_objective(optimizer):
    lr = 1.0  # large enough for the objective to go down and up again
    config = AttackConfig(steps=8, optimizer=optimizer, lr=lr, schedule="constant", decay=1.0,
                          beta=0.0, keep_best=True, lbfgs_iterations=3, engine="vmap")  # fmt: skip
    seen: list[torch.Tensor] = []
    res = _run(config, n=1, callback=lambda t, x: seen.append(x.clone()))
    history = torch.tensor(res.history)  # one attack: f(x_t) of each step
    best = int(history.argmin())
    assert 0 < best < len(history) - 1, history  # a best iterate that is not the last
    assert torch.equal(res.all_images[0, 0, 0], seen[best - 1][0, 0, 0])
    assert torch.isclose(res.objective[0, 0], history[best], rtol=1e-5)
    last = _run(config.with_(keep_best=False), n=1)
    assert float(res.objective[0, 0]) < float(last.objective[0, 0])


@pytest.mark.parametrize("optimizer", ["adam", "lbfgs"])
def test_after_step_keeps_the_iterate_that_the_best_step_reached(optimizer):
    """The CVB authors' rule: the iterate after the step whose starting objective was lowest."""
    config = AttackConfig(steps=8, optimizer=optimizer, lr=1.0, schedule="constant", decay=1.0,
                          beta=0.0, keep_best=True, best_iterate="after-step",
                          lbfgs_iterations=3, engine="vmap")  # fmt: skip
    seen: list[torch.Tensor] = []
    res = _run(config, n=1, callback=lambda t, x: seen.append(x.clone()))
    history = torch.tensor(res.history)
    best = int(history.argmin())
    assert 0 < best < len(history) - 1, history
    assert torch.equal(res.all_images[0, 0, 0], seen[best][0, 0, 0])  # x_{t+1}, not x_t
    assert torch.isclose(res.objective[0, 0], history[best + 1], rtol=1e-5)
    recorded = _run(config.with_(best_iterate="recorded"), n=1)
    assert not torch.equal(res.all_images, recorded.all_images)


@pytest.mark.parametrize("best_iterate", ["recorded", "after-step"])
@pytest.mark.parametrize("optimizer", ["adam", "lbfgs"])
def test_a_batch_of_watched_attacks_equals_each_attack_run_alone(optimizer, best_iterate):
    config = AttackConfig(steps=15, optimizer=optimizer, lr=0.3, schedule="plateau", decay=0.5,
                          plateau_patience=1, stop_patience=3, keep_best=True, beta=0.0,
                          best_iterate=best_iterate, lbfgs_iterations=4, engine="vmap")  # fmt: skip
    net, y, ups = _problem(3)
    start = torch.randn(3, 1, 1, 3, 3, generator=torch.Generator().manual_seed(2))
    together = _run(config, initial=start, net_y_ups=(net, y, ups))
    for i in range(3):
        one = {k: v[i : i + 1] for k, v in ups.items()}
        alone = _run(config, initial=start[i : i + 1], net_y_ups=(net, y[i : i + 1], one))
        assert torch.allclose(together.all_images[:, i], alone.all_images[:, 0], atol=1e-5)


def test_lbfgs_per_attack_follows_torchs_lbfgs_on_one_attack():
    """One attack: the per-attack L-BFGS (watched) and torch.optim.LBFGS take the same path."""
    base = AttackConfig(steps=4, optimizer="lbfgs", lr=0.1, schedule="constant", decay=1.0,
                        beta=0.0, lbfgs_iterations=6, lbfgs_history=3, engine="vmap")  # fmt: skip
    torch_path = _run(base, n=1)
    ours = _run(base.with_(stop_below=-1.0), n=1)  # watched, and never stopping
    assert torch.allclose(ours.all_images, torch_path.all_images, atol=1e-5)
    assert torch.allclose(torch.tensor(ours.history), torch.tensor(torch_path.history), rtol=1e-4)


def test_plateau_lowers_adam_steps_in_the_loop():
    """A plateau with patience 0 and a tiny improvement threshold of 1 ends in ever smaller steps."""
    config = AttackConfig(steps=6, lr=0.5, schedule="plateau", decay=0.1, plateau_patience=0,
                          plateau_threshold=0.999, beta=0.0, engine="vmap")  # fmt: skip
    seen: list[torch.Tensor] = []
    _run(config, n=1, callback=lambda t, x: seen.append(x.clone()))
    moves = [float((b - a).abs().max()) for a, b in zip(seen, seen[1:], strict=False)]
    assert all(m2 < m1 for m1, m2 in zip(moves, moves[1:], strict=False)), moves


def test_cvb_cpl_label_term_on_a_hand_computed_case():
    net = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([2])
    # logits (1, 2, 3) minus the class index 2 in every entry: (-1, 0, 1), norm √2
    value = LogitLabelDistance(net).log_prob_given(x, y)
    assert torch.isclose(value, torch.tensor(-(2.0**0.5)))
    attack = presets.cpl(label_weight=0.01, label_term="logits", init="normal")
    assert attack.parts()["prior"] == {"prior": "logit-label-distance"}
    assert attack.config.beta == 0.01 and attack.config.init == "normal"
    with pytest.raises(ValueError, match="soft labels"):
        LogitLabelDistance(net).log_prob_given(x, torch.tensor([[0.0, 0.0, 1.0]]))
    with pytest.raises(ValueError, match="unknown label_term 'onehot'"):
        presets.cpl(label_term="onehot")


@pytest.mark.parametrize(
    ("fields", "error", "words"),
    [
        ({"plateau_patience": -1}, ValueError, "plateau_patience must be an integer >= 0"),
        ({"plateau_patience": 2.5}, TypeError, "plateau_patience must be an integer >= 0"),
        ({"plateau_threshold": 1.0}, ValueError, "plateau_threshold must be below 1"),
        ({"plateau_threshold": -0.1}, ValueError, "plateau_threshold must be a finite number"),
        ({"schedule": "plateau", "decay": 1.0}, ValueError, "decay must be below 1"),
        ({"stop_patience": 0}, ValueError, "stop_patience must be an integer >= 1"),
        ({"stop_below": float("nan")}, ValueError, "stop_below must be a finite number"),
        ({"keep_best": "yes"}, TypeError, "keep_best must be True or False"),
        ({"best_iterate": "last"}, ValueError, "unknown best_iterate 'last'"),
        ({"schedule": "cosine"}, ValueError, "unknown schedule 'cosine'"),
    ],
)
def test_control_arguments_are_checked_by_name(fields, error, words):
    with pytest.raises(error, match=re.escape(words)):
        AttackConfig(**fields)
