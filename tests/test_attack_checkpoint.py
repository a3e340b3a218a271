"""An attack killed halfway and resumed from its checkpoint ends exactly where the uninterrupted
attack ends (Adam with the plateau schedule and ball samples, L-BFGS per attack, a CVB network
that draws noise in every forward pass), and a paper-scale unit keeps its attacks' checkpoints
(and Figure 4's its trained network) beside its partial record until the unit is saved."""

from __future__ import annotations

import os
import signal
from functools import partial

import pytest
import torch

from leakagelib.attacks import AttackConfig, Gaussian, Uniform, reconstruct
from leakagelib.attacks.checkpoint import LoopCheckpoint
from leakagelib.cli import _graceful_signals
from leakagelib.experiments import cvb_analysis
from leakagelib.experiments.cvb_common import (
    CVB_DEFAULT,
    attack_layers,
    cnn,
    cvb_attack,
    run_attack,
)
from leakagelib.experiments.registry import Context
from leakagelib.experiments.resume import PartialRecord
from leakagelib.gradients import per_sample_updates


class Killed(Exception):
    """Stands for the end of a session or a command's time limit."""


def _stop_at(step: int | None):
    def callback(t: int, _x: torch.Tensor) -> None:
        if t == step:
            raise Killed

    return callback


def _tiny(config: AttackConfig, checkpoint=None, callback=None, *, victims=1, rounding=0.0):
    """A small attack on three victims (drawn with seed ``victims``); ``rounding`` moves every
    update by that relative amount, as float32 sums on another number of threads do."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(9, 6), torch.nn.Sigmoid(),
                              torch.nn.Linear(6, 4))  # fmt: skip
    x = torch.rand(3, 1, 3, 3, generator=torch.Generator().manual_seed(victims))
    y = torch.arange(3) % 4
    updates = {k: u * (1 + rounding) for k, u in per_sample_updates(net, x, y).items()}
    return reconstruct(
        net, updates, labels=y, likelihood=Gaussian(2**-0.5),
        prior=Uniform(), config=config, input_shape=(1, 3, 3),
        generator=torch.Generator().manual_seed(5), callback=callback, checkpoint=checkpoint,
    )  # fmt: skip


CONFIGS = {
    "adam, plateau, best iterate, ball samples": AttackConfig(
        steps=40, optimizer="adam", lr=0.3, schedule="plateau", decay=0.5, plateau_patience=2,
        stop_patience=15, keep_best=True, mc_samples=2, delta=0.05, beta=0.0,
    ),
    "L-BFGS per attack": AttackConfig(
        steps=12, optimizer="lbfgs", lr=0.5, schedule="plateau", decay=0.1, plateau_patience=2,
        stop_patience=6, keep_best=True, lbfgs_iterations=4, beta=0.0,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_killed_attack_resumed_from_its_checkpoint_ends_as_the_uninterrupted_one(name, tmp_path):
    config = CONFIGS[name]
    whole = _tiny(config)
    path = tmp_path / "attack.pt"
    with pytest.raises(Killed):
        _tiny(config, LoopCheckpoint(path, every_s=0), _stop_at(5))
    assert path.exists()
    seen: list[int] = []
    resumed = _tiny(config, LoopCheckpoint(path, every_s=0), lambda t, _x: seen.append(t))
    assert seen[0] == 6  # it went on after the last step the killed run saved
    assert torch.equal(resumed.images, whole.images)
    assert torch.equal(resumed.objective, whole.objective)
    assert resumed.history == whole.history
    again: list[int] = []  # a finished attack's checkpoint: the result, without a step
    final = _tiny(config, LoopCheckpoint(path, every_s=0), lambda t, _x: again.append(t))
    assert again == [] and torch.equal(final.images, whole.images)


def test_a_checkpoint_of_another_attack_is_refused(tmp_path):
    config = CONFIGS["L-BFGS per attack"]
    path = tmp_path / "attack.pt"
    _tiny(config, LoopCheckpoint(path, every_s=0))
    with pytest.raises(ValueError, match="checkpoint of another attack"):
        _tiny(config.with_(lr=0.25), LoopCheckpoint(path, every_s=0))


def test_a_checkpoint_resumes_on_updates_rounded_otherwise_but_not_on_other_victims(tmp_path):
    """The same victims' updates in other last bits (another thread count) resume the attack;
    other victims' updates are another attack."""
    config = CONFIGS["adam, plateau, best iterate, ball samples"]
    whole = _tiny(config)
    path = tmp_path / "attack.pt"
    with pytest.raises(Killed):
        _tiny(config, LoopCheckpoint(path, every_s=0), _stop_at(5))
    with pytest.raises(ValueError, match="checkpoint of another attack"):
        _tiny(config, LoopCheckpoint(path, every_s=0), victims=2)
    with pytest.raises(ValueError, match="checkpoint of another attack"):  # beyond float rounding
        _tiny(config, LoopCheckpoint(path, every_s=0), rounding=1e-3)
    seen: list[int] = []
    resumed = _tiny(config, LoopCheckpoint(path, every_s=0), lambda t, _x: seen.append(t),
                    rounding=1e-7)  # fmt: skip
    assert seen[0] == 6
    assert torch.allclose(resumed.images, whole.images, atol=1e-4)


def test_a_checkpoint_saved_on_another_device_is_refused_by_name(tmp_path):
    """Its generators' states belong to the device it ran on (a GPU's do not fit the CPU's)."""
    config = CONFIGS["L-BFGS per attack"]
    path = tmp_path / "attack.pt"
    _tiny(config, LoopCheckpoint(path, every_s=0))
    saved = torch.load(path, weights_only=True)
    torch.save({**saved, "devices": ["cuda:0"]}, path)
    with pytest.raises(ValueError, match="saved by the attack running on cuda:0; resume it there"):
        _tiny(config, LoopCheckpoint(path, every_s=0))


def _cvb_unit(ctx: Context, stop: int | None) -> list[dict]:
    """Inverting Gradients against the CNN with CVB (its noise comes from torch's global
    generator) on two MNIST stand-ins, as Table III's units run it."""
    model = cnn(CVB_DEFAULT, seed=ctx.seed)
    attack = cvb_attack("inverting-gradients", ctx.config, include=attack_layers(model), steps=10)
    victims = cvb_analysis.victims("mnist", 2)
    _, result = run_attack(ctx, model, victims, attack, callback=_stop_at(stop))
    return [{"images": result.images.flatten().tolist(), "history": result.history}]


def test_a_unit_killed_in_its_attack_resumes_it_and_drops_the_checkpoint_when_saved(
    tmp_path, monkeypatch
):
    monkeypatch.setattr("leakagelib.attacks.checkpoint.CHECKPOINT_EVERY_S", 0.0)
    whole = Context(progress=False, settings=cvb_analysis.PROTOCOL)
    [expected] = whole.units([("cvb", "ig")], lambda key: _cvb_unit(whole, None), "unit")

    def ctx() -> Context:
        partial = PartialRecord(tmp_path / "r.json.partial", {"experiment": "t"}, resume=True)
        return Context(progress=False, settings=cvb_analysis.PROTOCOL, partial=partial)

    first = ctx()
    with pytest.raises(Killed):
        first.units([("cvb", "ig")], lambda key: _cvb_unit(first, 4), "unit")
    folder = tmp_path / "r.json.partial.attacks"
    assert len(list(folder.glob("*-0.pt"))) == 1  # the unit's first attack, saved as it ran
    second = ctx()
    [resumed] = second.units([("cvb", "ig")], lambda key: _cvb_unit(second, None), "unit")
    assert resumed == expected
    assert not folder.exists()  # the unit is in the partial record: its checkpoint is gone
    assert second.partial.seconds[next(iter(second.partial.seconds))] > 0


def test_a_signal_lets_the_running_attack_save_its_step_and_stop(tmp_path):
    """SIGTERM (``timeout`` on a lent GPU) under the command line's handlers: the attack
    saves at the end of its step and stops; resumed, it ends as the uninterrupted one."""
    config = CONFIGS["adam, plateau, best iterate, ball samples"]
    whole = _tiny(config)
    path = tmp_path / "attack.pt"

    def signal_at_3(t: int, _x: torch.Tensor) -> None:
        if t == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    with _graceful_signals(), pytest.raises(KeyboardInterrupt, match="stopped after step 4"):
        _tiny(config, LoopCheckpoint(path), signal_at_3)  # saves only when asked to
    seen: list[int] = []
    resumed = _tiny(config, LoopCheckpoint(path), lambda t, _x: seen.append(t))
    assert seen[0] == 5 and torch.equal(resumed.images, whole.images)
    assert resumed.history == whole.history
    with _graceful_signals(), pytest.raises(KeyboardInterrupt):  # no attack running: at once
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_signal_in_the_last_step_keeps_the_finished_attack_and_still_stops(tmp_path):
    config = CONFIGS["L-BFGS per attack"]
    whole = _tiny(config)
    last = len(whole.history) - 1
    path = tmp_path / "attack.pt"

    def signal_at_last(t: int, _x: torch.Tensor) -> None:
        if t == last:
            os.kill(os.getpid(), signal.SIGTERM)

    with _graceful_signals(), pytest.raises(KeyboardInterrupt):
        _tiny(config, LoopCheckpoint(path), signal_at_last)
    seen: list[int] = []
    again = _tiny(config, LoopCheckpoint(path), lambda t, _x: seen.append(t))
    assert seen == [] and torch.equal(again.images, whole.images)  # kept, not run again


def _partial(path) -> PartialRecord:
    """The partial record of a command-line run in ``path``, resumed if it exists."""
    return PartialRecord(path, {"experiment": path.stem}, resume=True)


def _killed_at(step: int, run, path, monkeypatch) -> list[tuple[int, bool]]:
    """Run ``run(partial=...)`` with every checkpoint saved at once, kill it when a loop is
    about to save after ``step`` (not final), and return the saves it asked for, in order."""
    tick, ticks = LoopCheckpoint.tick, []

    def killed(self, t, state, *, final=False):
        ticks.append((t, final))
        if (t, final) == (step, False):
            raise Killed
        tick(self, t, state, final=final)

    monkeypatch.setattr(LoopCheckpoint, "tick", killed)
    with pytest.raises(Killed):
        run(partial=_partial(path))
    monkeypatch.setattr(LoopCheckpoint, "tick", tick)
    return ticks


def test_figure4_resumes_a_unit_killed_in_its_attack_from_the_checkpoint(tmp_path, monkeypatch):
    """``rgap/fig4-resnet-skip`` (24,000 attack steps per network at paper scale): a run killed
    in its first network's attack resumes that attack at the step it saved, on the trained
    network it kept (not trained again), and ends with the uninterrupted run's rows."""
    from leakagelib import experiments
    from leakagelib.experiments import rgap_resnet_skip

    monkeypatch.setattr("leakagelib.attacks.checkpoint.CHECKPOINT_EVERY_S", 0.0)
    fig4 = partial(experiments.run, "rgap/fig4-resnet-skip", progress=False,
                   changes={"attack_steps": 8, "victims": 1})  # fmt: skip
    whole = fig4()["rows"]
    load, train = LoopCheckpoint.load, rgap_resnet_skip._train_best
    loaded, trained = [], []
    path = tmp_path / "f.json.partial"
    ticks = _killed_at(4, fig4, path, monkeypatch)
    assert ticks == [(0, True), (0, False), (1, False), (2, False), (3, False), (4, False)]
    monkeypatch.setattr(
        LoopCheckpoint, "load", lambda self: loaded.append(load(self)) or loaded[-1]
    )
    monkeypatch.setattr(rgap_resnet_skip, "_train_best", lambda *a: trained.append(1) or train(*a))
    resumed = fig4(partial=_partial(path))["rows"]
    # the first network's weights as trained (step 0, final), its attack saved after step 3
    assert [(s["step"], s["finished"]) for s in loaded[:2]] == [(1, True), (4, False)]
    assert len(trained) == 2  # only the two networks not reached before the kill
    assert resumed == whole


def test_table2_resumes_a_unit_killed_in_its_search_on_the_network_it_kept(tmp_path, monkeypatch):
    """``bayes/table2`` (hours a unit on a CPU at paper scale): a run killed in the search of a
    step-500 cell keeps the trained network and the finished programs of the search; resumed,
    it trains nothing, replays those programs and ends with the uninterrupted run's rows."""
    from leakagelib import experiments, fl
    from leakagelib.attacks import search as search_module

    monkeypatch.setattr("leakagelib.attacks.checkpoint.CHECKPOINT_EVERY_S", 0.0)
    monkeypatch.setattr("leakagelib.attacks.programs.CPU_PROGRAM_ATTACKS", 2)  # many programs
    changes = {"datasets": ("mnist",), "train_steps": (3,), "steps": 3, "victims": 2}
    table2 = partial(experiments.run, "bayes/table2", progress=False, changes=changes)
    whole = table2()["rows"]
    train, run_together = fl.train, search_module.run_together
    trained, programs = [], []
    path = tmp_path / "t.json.partial"
    ticks = _killed_at(2, table2, path, monkeypatch)
    # the network kept as trained (step 0, final), then the search's programs 0, 1 and 2
    assert ticks == [(0, True), (0, False), (1, False), (2, False)]
    monkeypatch.setattr(fl, "train", lambda *a, **k: trained.append(1) or train(*a, **k))
    monkeypatch.setattr(
        search_module, "run_together", lambda **k: programs.append(1) or run_together(**k)
    )
    resumed = table2(partial=_partial(path))["rows"]
    assert trained == []
    fresh = len(programs)
    programs.clear()
    table2(partial=None)  # how many programs the search runs in all
    assert fresh == len(programs) - 2  # programs 0 and 1 were saved before the kill
    assert resumed == whole


def test_fig2_resumes_an_ats_unit_killed_in_its_attack_on_the_network_it_kept(
    tmp_path, monkeypatch
):
    """``bayes/fig2-training``'s ATS units (at paper scale the policy's 1,000 training steps take
    about an hour on a CPU, and a GPU would train another network): a run killed in the first
    ATS attack keeps the policy's trained network and snapshots; resumed, it trains no ATS
    network, resumes the attack and ends with the uninterrupted run's rows."""
    from leakagelib import experiments
    from leakagelib.experiments import bayes_ats

    monkeypatch.setattr("leakagelib.attacks.checkpoint.CHECKPOINT_EVERY_S", 0.0)
    changes = {"train_steps": (0, 2), "fig3_step": 2, "fig6_steps": (2,), "ats_attack_steps": 4,
               "ats_victims": 1, "fig3_victims": 1, "soteria_victims": 1, "soteria_epochs": (0,),
               "hidden": (64, 32), "attack_steps": 2}  # fmt: skip
    fig2 = partial(experiments.run, "bayes/fig2-training", progress=False, changes=changes)
    whole = fig2()["rows"]
    path = tmp_path / "f.json.partial"
    ticks = _killed_at(2, fig2, path, monkeypatch)
    assert ticks[:3] == [(0, True), (0, False), (1, False)]  # the network, then the attack
    assert [p.name for p in (tmp_path / "f.json.partial.attacks").glob("ats-*.pt")] == [
        "ats-7-4-15.pt"
    ]
    train, trained = bayes_ats.train, []
    monkeypatch.setattr(bayes_ats, "train", lambda *a, **k: trained.append(1) or train(*a, **k))
    resumed = fig2(partial=_partial(path))["rows"]
    assert trained == []
    assert resumed == whole
