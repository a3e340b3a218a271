"""Bias removal: it stops the closed-form attack, and its matched likelihood still recovers x."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from leakagelib.attacks import AttackConfig, Uniform, reconstruct
from leakagelib.attacks.closed_form import recover_inputs_from_update
from leakagelib.defenses.bias_removal import BiasRemoval, is_bias
from leakagelib.gradients import client_update, per_sample_updates

torch.set_num_threads(1)


def mlp(bias: bool = True) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(9, 6, bias=bias), nn.Sigmoid(), nn.Linear(6, 4, bias=bias)
    )


def test_only_the_bias_entries_are_zeroed_and_the_input_is_untouched():
    net = mlp()
    update = client_update(net, torch.rand(1, 1, 3, 3), torch.tensor([1]))
    before = {k: v.clone() for k, v in update.items()}
    shared = BiasRemoval()(update)
    assert set(shared) == set(update)
    for k, g in shared.items():
        assert g.shape == update[k].shape
        if is_bias(k):
            assert torch.count_nonzero(g) == 0 and torch.count_nonzero(update[k]) > 0
        else:
            assert torch.equal(g, update[k])
    assert all(torch.equal(before[k], update[k]) for k in update)


def test_it_stops_the_closed_form_attack_that_breaks_the_undefended_update():
    net = mlp()
    x = torch.rand(1, 1, 3, 3)
    update = client_update(net, x, torch.tensor([2]))
    recovered = recover_inputs_from_update(net, update, (1, 3, 3))
    assert torch.allclose(recovered.reshape(x.shape), x, atol=1e-5)
    with pytest.raises(ValueError, match="bias gradient is zero"):
        recover_inputs_from_update(net, BiasRemoval()(update), (1, 3, 3))


def test_the_matched_likelihood_reads_weights_only_and_still_recovers_the_input():
    net = mlp()
    x = torch.rand(2, 1, 3, 3)
    y = torch.tensor([0, 3])
    shared = {k: v.clone() for k, v in per_sample_updates(net, x, y).items()}
    for k in shared:
        if is_bias(k):
            shared[k].zero_()
    likelihood = BiasRemoval().likelihood()
    names = list(shared)
    weights = likelihood.layers.weights(names)
    assert [bool(w > 0) for w in weights] == [not is_bias(n) for n in names]
    cfg = AttackConfig(steps=400, lr=0.1, schedule="exponential", decay=0.995, beta=0.0)
    res = reconstruct(
        net,
        shared,
        labels=y,
        likelihood=likelihood,
        prior=Uniform(),
        config=cfg,
        input_shape=(1, 3, 3),
        stacked=True,
        generator=torch.Generator().manual_seed(0),
    )
    recon = res.images.reshape(2, 1, 3, 3)
    assert float((recon - x).pow(2).mean()) < 1e-3


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="no bias gradients"):
        BiasRemoval()(client_update(mlp(bias=False), torch.rand(1, 1, 3, 3), torch.tensor([0])))
    with pytest.raises(ValueError, match="kind"):
        BiasRemoval().likelihood("laplace")
    assert BiasRemoval().describe() == {"defense": "bias-removal"}
