"""A federated training run killed halfway and resumed from its checkpoint ends as the
uninterrupted run: the same rounds, best state, final model and DP-SGD privacy ledger, with a
variational bottleneck drawing its noise from torch's global generator all along."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from leakagelib import data, fedavg
from leakagelib.attacks.checkpoint import LoopCheckpoint
from leakagelib.defenses import CVB, DPSGD, insert_bottleneck
from leakagelib.fedavg import federated_averaging


class Killed(Exception):
    """Stands for the end of a session in the middle of training."""


def _model() -> nn.Module:
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(256, 10))  # fmt: skip
    return insert_bottleneck(conv, CVB(4, kernel_size=3, beta=0.1), 1)


def _train(checkpoint=None, dp=None, reset=False) -> fedavg.FLResult:
    x, y, norm = data.load("digits", split="train", n=160)
    xt, yt, _ = data.load("digits", split="test", n=40)
    return federated_averaging(
        _model(), norm.normalize(x), y, rounds=6, clients=4, batch_size=16, lr=3e-3,
        test=(norm.normalize(xt), yt), patience=None, reset_optimizer=reset,
        defense=dp or DPSGD(0.5, 1.0, sample_rate=0.4), seed=3, checkpoint=checkpoint,
    )  # fmt: skip


@pytest.mark.parametrize("reset", [False, True])  # Adam kept across rounds, or fresh (the authors')
def test_a_killed_training_run_resumes_to_the_uninterrupted_result(reset, tmp_path, monkeypatch):
    ledgers = [DPSGD(0.5, 1.0, sample_rate=0.4) for _ in range(2)]
    whole = _train(dp=ledgers[0], reset=reset)
    path = tmp_path / "training.pt"
    validation = fedavg._validation_loss
    seen: list[int] = []

    def killed_in_round_4(*args, **kwargs):
        seen.append(1)
        if len(seen) == 4:
            raise Killed
        return validation(*args, **kwargs)

    monkeypatch.setattr(fedavg, "_validation_loss", killed_in_round_4)
    with pytest.raises(Killed):
        _train(LoopCheckpoint(path, every_s=0), reset=reset)
    monkeypatch.setattr(fedavg, "_validation_loss", validation)
    resumed = _train(LoopCheckpoint(path, every_s=0), dp=ledgers[1], reset=reset)
    assert resumed.history == whole.history  # rounds 1-3 from the file, 4-6 trained again
    assert ledgers[1].steps == ledgers[0].steps and ledgers[1].spent() == ledgers[0].spent()
    for a, b in zip(resumed.model.state_dict().values(), whole.model.state_dict().values(),
                    strict=True):  # fmt: skip
        assert torch.equal(a, b)
    for key, value in whole.best_state.items():
        assert torch.equal(resumed.best_state[key], value)
    again = _train(LoopCheckpoint(path, every_s=0), reset=reset)  # after the end: no round
    assert again.history == whole.history


def test_the_privacy_ledger_survives_the_checkpoint():
    dp = DPSGD(0.5, 1.0, sample_rate=0.4)
    for _ in range(3):
        dp.accountant.step(noise_multiplier=0.5, sample_rate=0.4)
        dp.steps += 1
    fresh = DPSGD(0.5, 1.0, sample_rate=0.4)
    fresh.load_state_dict(dp.state_dict())
    assert fresh.steps == 3 and fresh.spent() == dp.spent()
