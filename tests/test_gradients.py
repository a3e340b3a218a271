"""Client updates, per-sample gradients, update checking and label recovery."""

import re

import pytest
import torch
from torch import nn

from leakagelib import gradients as G
from leakagelib.defenses.bottlenecks import CVB
from leakagelib.defenses.surgery import insert_bottleneck
from leakagelib.losses import loss_function


def small_cnn(num_classes: int = 10) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, 16),
        nn.ReLU(),
        nn.Linear(16, num_classes),
    )


def batch(n: int = 6, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_client_update_matches_autograd_and_keeps_order():
    model = small_cnn()
    x, y = batch()
    update = G.client_update(model, x, y)
    assert list(update) == [n for n, _ in model.named_parameters()]
    nn.functional.cross_entropy(model(x), y).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(update[name], p.grad)


def test_client_update_skips_frozen_parameters():
    model = small_cnn()
    model[0].weight.requires_grad_(False)
    x, y = batch()
    assert "0.weight" not in G.client_update(model, x, y)


def test_per_sample_updates_average_to_the_batch_update():
    model = small_cnn()
    x, y = batch(5)
    per = G.per_sample_updates(model, x, y)
    full = G.client_update(model, x, y)
    for name, g in full.items():
        assert per[name].shape == (5, *g.shape)
        torch.testing.assert_close(per[name].mean(0), g, rtol=1e-5, atol=1e-6)
    single = G.client_update(model, x[2:3], y[2:3])
    for name in full:
        torch.testing.assert_close(per[name][2], single[name], rtol=1e-5, atol=1e-6)


def test_functional_gradient_is_differentiable_in_the_input():
    model = small_cnn()
    x, y = batch(1)
    fg = G.functional_gradient(model)
    params = G.params_of(model)
    target = G.client_update(model, x, y)

    def distance(dummy: torch.Tensor) -> torch.Tensor:
        g = fg(params, dummy, y)
        return sum(((g[k] - target[k]) ** 2).sum() for k in g)

    assert distance(x).item() < 1e-10
    dummy = torch.rand_like(x)
    d = torch.func.grad(distance)(dummy)
    assert d.shape == x.shape and d.abs().sum() > 0


def test_local_update_one_step_is_lr_times_gradient():
    model = small_cnn()
    x, y = batch(4)
    one = G.local_update(model, x, y, steps=1, lr=0.1)
    grad = G.client_update(model, x, y)
    for name in grad:
        torch.testing.assert_close(one[name], 0.1 * grad[name], rtol=1e-4, atol=1e-6)
    several = G.local_update(model, x, y, steps=3, lr=0.1, batch_size=2)
    assert any((several[k] - one[k]).abs().max() > 1e-6 for k in one)
    # the model itself is untouched
    torch.testing.assert_close(G.client_update(model, x, y)["5.bias"], grad["5.bias"])


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"steps": 1, "lr": float("nan")}, ValueError, "lr must be a finite number > 0"),
        ({"steps": 1, "lr": float("inf")}, ValueError, "lr must be a finite number > 0"),
        ({"steps": 2.5, "lr": 0.1}, TypeError, "steps must be an integer >= 1 (local SGD steps)"),
    ],
)
def test_local_update_refuses_a_bad_step_count_or_size(options, error, message):
    model = small_cnn()
    x, y = batch(2)
    with pytest.raises(error, match=re.escape(message)):
        G.local_update(model, x, y, **options)


def test_batch_label_recovery_needs_a_whole_number_of_images():
    model = small_cnn()
    x, y = batch(2)
    with pytest.raises(TypeError, match=re.escape("n must be an integer >= 1")):
        G.recover_labels_batch(model, G.client_update(model, x, y), 2.5)


def test_logistic_loss_matches_formula_and_checks_labels():
    out = torch.tensor([[0.3], [-1.2]])
    y = torch.tensor([1, -1])
    expected = torch.log1p(torch.exp(-y * out[:, 0])).mean()
    torch.testing.assert_close(loss_function("logistic")(out, y), expected)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 1, bias=False))
    with pytest.raises(ValueError, match="-1, \\+1"):
        G.client_update(model, torch.rand(2, 1, 8, 8), torch.tensor([0, 1]), loss="logistic")


def test_bad_inputs_are_named():
    model = small_cnn()
    x, y = batch(3)
    with pytest.raises(KeyError, match="unknown loss 'mse'"):
        loss_function("mse")
    with pytest.raises(ValueError, match="N×C×H×W"):
        G.client_update(model, x[0], y)
    with pytest.raises(ValueError, match="one per image"):
        G.client_update(model, x, y[:2])
    update = G.client_update(model, x, y)
    G.check_update(model, update)
    broken = dict(update)
    broken["3.weight"] = broken["3.weight"][:, :5]
    with pytest.raises(ValueError, match=r"update\['3.weight'\] has shape"):
        G.check_update(model, broken)
    with pytest.raises(ValueError, match="lacks"):
        G.check_update(model, {k: v for k, v in update.items() if k != "5.bias"})
    with pytest.raises(ValueError, match="not trainable parameters"):
        G.check_update(model, {**update, "extra.weight": torch.zeros(1)})


def test_idlg_recovers_every_single_label():
    model = small_cnn()
    x, _ = batch(20, seed=3)
    y = torch.arange(20) % 10
    per = G.per_sample_updates(model, x, y)
    recovered = [G.recover_label_idlg(model, {k: v[i] for k, v in per.items()}) for i in range(20)]
    assert recovered == y.tolist()
    # without the bias the weight-row rule still works (features are ReLU outputs)
    model[5] = nn.Linear(16, 10, bias=False)
    per = G.per_sample_updates(model, x, y)
    recovered = [G.recover_label_idlg(model, {k: v[i] for k, v in per.items()}) for i in range(20)]
    assert recovered == y.tolist()


def test_label_recovery_reads_the_last_layer_in_the_models_order_not_the_dicts():
    """With its keys reversed, the old rule read the first fully connected layer (labels >= 10)."""
    model = small_cnn()
    x, _ = batch(1, seed=4)
    y = torch.tensor([7])
    update = G.client_update(model, x, y)
    reversed_keys = dict(reversed(list(update.items())))
    assert list(reversed_keys)[-1] == "0.weight"
    assert G.recover_label_idlg(model, reversed_keys) == 7
    labels = torch.tensor([1, 4, 6])
    batch_update = G.client_update(model, batch(3, seed=5)[0], labels)
    reversed_batch = dict(reversed(list(batch_update.items())))
    assert G.recover_labels_batch(model, reversed_batch, 3).tolist() == labels.tolist()


def test_batch_label_recovery_accuracy():
    """GradInversion's rule on batches of distinct labels: measured accuracy ≥ 95%."""
    correct = total = 0
    for seed in range(10):
        model = small_cnn(num_classes=20)
        g = torch.Generator().manual_seed(seed)
        y = torch.randperm(20, generator=g)[:8]
        x = torch.rand(8, 1, 8, 8, generator=g)
        got = G.recover_labels_batch(model, G.client_update(model, x, y), 8)
        correct += len(set(got.tolist()) & set(y.tolist()))
        total += 8
    assert correct / total >= 0.95
    with pytest.raises(ValueError, match="between 1 and"):
        G.recover_labels_batch(model, G.client_update(model, x, y), 21)


@pytest.mark.parametrize("compute", [G.client_update, G.per_sample_updates])
def test_batches_no_client_could_train_on_are_rejected(compute):
    model = small_cnn()
    x, y = batch(3)
    with pytest.raises(ValueError, match="empty batch"):
        compute(model, x[:0], y[:0])
    nan = x.clone()
    nan[1, 0, 2, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite"):
        compute(model, nan, y)
    inf = x.clone()
    inf[0, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN or infinite"):
        compute(model, inf, y)
    with pytest.raises(ValueError, match=r"class indices in 0\.\.9 .* got values -100\.\."):
        compute(model, x, torch.tensor([0, -100, 3]))
    with pytest.raises(ValueError, match=r"class indices in 0\.\.9 .* got values \d+\.\.10"):
        compute(model, x, torch.tensor([0, 10, 3]))
    with pytest.raises(ValueError, match="integer class indices.*labels.long"):
        compute(model, x, y.float())
    with pytest.raises(ValueError, match="integer class indices"):
        compute(model, x, torch.tensor([True, False, True]))


def test_the_class_count_of_a_model_that_does_not_end_in_a_linear_layer():
    """Read off one forward pass that leaves the random state and BatchNorm statistics alone."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 8), nn.BatchNorm2d(3), nn.Flatten(), nn.Dropout(0.5))
    x, _ = batch(2)
    before = model[1].running_mean.clone()
    state = torch.random.get_rng_state()
    with pytest.raises(ValueError, match=r"class indices in 0\.\.2"):
        G.client_update(model, x, torch.tensor([0, 3]))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(model[1].running_mean, before) and model.training


def test_check_update_rejects_non_finite_entries_and_checks_stacked_updates():
    model = small_cnn()
    x, y = batch(2)
    update = G.client_update(model, x, y)
    bad = {**update, "5.bias": update["5.bias"].clone()}
    bad["5.bias"][3] = float("inf")
    with pytest.raises(ValueError, match=r"update\['5.bias'\] contains NaN or infinite"):
        G.check_update(model, bad)
    per = G.per_sample_updates(model, x, y)
    assert G.check_update(model, per, stacked=True) == 2
    with pytest.raises(ValueError, match="one leading dimension N"):
        G.check_update(model, update, stacked=True)
    with pytest.raises(ValueError, match="same leading dimension N"):
        G.check_update(model, {**per, "5.bias": per["5.bias"][:1]}, stacked=True)
    assert torch.equal(G.stack_updates([update, update])["5.bias"][1], update["5.bias"])


def _cvb_net(beta: float) -> nn.Module:
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(256, 10))  # fmt: skip
    return insert_bottleneck(conv, CVB(4, kernel_size=3, beta=beta, kl="reference"), 1)


@pytest.mark.parametrize("route", ["client_update", "functional_gradient", "per_sample"])
def test_the_update_of_a_bottleneck_model_is_the_gradient_of_its_training_loss(route, monkeypatch):
    """Cross-entropy plus β·KL (the CVB authors' shared update): β reaches the encoders and
    every layer before the bottleneck, not the decoder and the layers after it."""
    monkeypatch.setattr(torch, "randn_like", torch.zeros_like)  # the same noise for both β
    x, y = batch(2)

    def update(beta: float) -> dict:
        model = _cvb_net(beta)
        if route == "client_update":
            return G.client_update(model, x, y)
        if route == "functional_gradient":
            return G.functional_gradient(model)(G.params_of(model), x, y)
        return {k: v.mean(0) for k, v in G.per_sample_updates(model, x, y).items()}

    low, high = update(0.0), update(1.0)
    changed = {k for k in low if not torch.allclose(low[k], high[k])}
    assert changed == {"0.weight", "0.bias", "bottleneck.mu_encoder.weight",
                       "bottleneck.std_encoder.weight"}, changed  # fmt: skip
    model = _cvb_net(1.0)
    out = model(x)
    total = nn.functional.cross_entropy(out, y) + model.get_submodule("bottleneck").last_kl
    expected = torch.autograd.grad(total, list(model.parameters()))
    for (name, _), g in zip(model.named_parameters(), expected, strict=True):
        torch.testing.assert_close(high[name], g, rtol=1e-5, atol=1e-7)


def test_per_sample_norms_take_every_parameter_of_one_sample_together():
    updates = {"w": torch.tensor([[[3.0, 0.0]], [[1.0, 1.0]]]), "b": torch.tensor([[4.0], [1.0]])}
    norms = G.per_sample_norms(updates)
    assert torch.allclose(norms, torch.tensor([5.0, 3.0**0.5]))
    with pytest.raises(ValueError, match="empty"):
        G.per_sample_norms({})
