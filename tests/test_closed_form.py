"""The closed-form (Phong et al.) recovery from a fully connected layer with bias."""

import pytest
import torch
from torch import nn

from leakagelib.attacks import AttackResult
from leakagelib.attacks.closed_form import (
    bias_attack,
    first_linear_layer,
    linear_inputs,
    recover_input_from_linear,
    recover_linear_inputs,
)
from leakagelib.gradients import client_update, per_sample_updates, stack_updates


def mlp(bias: bool = True) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 6 * 6, 32, bias=bias), nn.ReLU(), nn.Linear(32, 5)
    ).double()


def test_recovers_stacked_updates_exactly_in_float64_as_an_attack_result():
    model = mlp()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(7, 3, 6, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (7,), generator=g)
    result = bias_attack(model, per_sample_updates(model, x, y), y, input_shape=(3, 6, 6))
    assert isinstance(result, AttackResult) and result.num_settings == 1
    assert result.per_update().shape == (7, 1, 3, 6, 6)  # N × n × input, one restart
    assert result.restarts_of().shape == (7, 1, 1, 3, 6, 6)
    assert (result.inputs() - x).abs().max() < 1e-12
    assert result.objective_of().shape == (7,) and float(result.objective_of().max()) < 1e-20
    one = bias_attack(
        model, stack_updates([client_update(model, x[:1], y[:1])]), input_shape=(3, 6, 6)
    )
    assert (one.inputs() - x[:1]).abs().max() < 1e-12


def test_a_batch_gradient_gives_a_mixture_not_an_image_and_a_large_residual():
    model = mlp()
    x = torch.rand(4, 3, 6, 6, dtype=torch.float64)
    mixed = stack_updates([client_update(model, x, torch.arange(4))])
    result = bias_attack(model, mixed, input_shape=(3, 6, 6))
    assert min((result.inputs()[0] - xi).abs().max() for xi in x) > 1e-3
    assert float(result.objective_of()[0]) > 1e-3  # no rank-one fit: not one image's gradient


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="no bias"):
        first_linear_layer(mlp(bias=False))
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(64, 2))
    with pytest.raises(ValueError, match="Conv2d"):
        first_linear_layer(conv)
    with pytest.raises(ValueError, match="every bias gradient is zero"):
        recover_input_from_linear(torch.ones(2, 3), torch.zeros(2))
    with pytest.raises(ValueError, match="expected"):
        recover_input_from_linear(torch.ones(2, 3), torch.zeros(3))
    model = mlp()
    update = client_update(model, torch.rand(1, 3, 6, 6, dtype=torch.float64), torch.tensor([1]))
    with pytest.raises(ValueError, match="input_shape"):
        bias_attack(model, stack_updates([update]), input_shape=(3, 5, 5))
    with pytest.raises(ValueError, match="lacks the gradient"):
        bias_attack(model, {"3.weight": update["3.weight"][None]}, input_shape=(3, 6, 6))
    with pytest.raises(ValueError, match="one leading dimension N"):
        bias_attack(model, update, input_shape=(3, 6, 6))


def test_every_biased_layer_reveals_its_input():
    model = mlp()
    x = torch.rand(3, 3, 6, 6, dtype=torch.float64)
    y = torch.tensor([0, 2, 4])
    recovered = recover_linear_inputs(model, per_sample_updates(model, x, y))
    true = linear_inputs(model, x)
    assert list(recovered) == ["1", "3"] == list(true)
    for name in recovered:
        assert (recovered[name] - true[name]).abs().max() < 1e-10
