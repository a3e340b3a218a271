"""Bias removal: it stops the closed-form attack, and its matched likelihood still recovers x."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from leakagelib.attacks import AttackConfig, Cosine, Uniform, reconstruct
from leakagelib.attacks.closed_form import bias_attack
from leakagelib.defenses import BiasRemoval
from leakagelib.defenses.bias_removal import is_bias
from leakagelib.gradients import client_update, per_sample_updates, stack_updates

torch.set_num_threads(1)


def mlp(bias: bool = True) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(9, 6, bias=bias), nn.Sigmoid(), nn.Linear(6, 4, bias=bias)
    )


def test_only_the_bias_entries_are_zeroed_and_the_input_is_untouched():
    net = mlp()
    x, y = torch.rand(1, 1, 3, 3), torch.tensor([1])
    update = client_update(net, x, y)
    before = {k: v.clone() for k, v in update.items()}
    shared = BiasRemoval().perturb(update)
    assert set(shared) == set(update)
    for k, g in shared.items():
        assert g.shape == update[k].shape
        if is_bias(k):
            assert torch.count_nonzero(g) == 0 and torch.count_nonzero(update[k]) > 0
        else:
            assert torch.equal(g, update[k])
    assert all(torch.equal(before[k], update[k]) for k in update)
    sent = BiasRemoval().share(net, x, y)  # what the client sends: the same
    assert all(torch.equal(sent[k], shared[k]) for k in shared)


def test_it_stops_the_closed_form_attack_that_breaks_the_undefended_update():
    net = mlp()
    x = torch.rand(1, 1, 3, 3)
    update = client_update(net, x, torch.tensor([2]))
    recovered = bias_attack(net, stack_updates([update]), input_shape=(1, 3, 3)).inputs()
    assert torch.allclose(recovered, x, atol=1e-5)
    shared = stack_updates([BiasRemoval().share(net, x, torch.tensor([2]))])
    with pytest.raises(ValueError, match="bias gradient is zero"):
        bias_attack(net, shared, input_shape=(1, 3, 3))


def test_the_matched_likelihood_reads_weights_only_and_still_recovers_the_input():
    net = mlp()
    x = torch.rand(2, 1, 3, 3)
    y = torch.tensor([0, 3])
    shared = BiasRemoval().share(net, x, y, per_image=True)
    per = per_sample_updates(net, x, y)
    assert all(
        torch.equal(shared[k], torch.zeros_like(v) if is_bias(k) else v) for k, v in per.items()
    )
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
        generator=torch.Generator().manual_seed(0),
    )
    recon = res.inputs()
    assert float((recon - x).pow(2).mean()) < 1e-3


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="no bias gradients"):
        BiasRemoval().share(mlp(bias=False), torch.rand(1, 1, 3, 3), torch.tensor([0]))
    with pytest.raises(ValueError, match="attack must be one of"):
        BiasRemoval(attack="laplace")
    assert isinstance(BiasRemoval(attack="cosine").likelihood(), Cosine)
    assert BiasRemoval().describe() == {"defense": "bias-removal"}
