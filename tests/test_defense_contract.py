"""The one contract of every gradient defense: ``share``, an argument-free ``likelihood``, ``describe``."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from leakagelib import defenses
from leakagelib.attacks.likelihoods import Likelihood
from leakagelib.defenses import (
    DPSGD,
    BiasRemoval,
    GaussianNoise,
    GradientCompression,
    GradientDefense,
    LaplaceNoise,
    NoDefense,
    PruneNoise,
    Soteria,
)
from leakagelib.gradients import client_update, per_sample_updates

torch.set_num_threads(1)

N = 3


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(2 * 5 * 5, 6),
        nn.ReLU(),
        nn.Linear(6, 4),
    )


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(N, 1, 5, 5, generator=g), torch.tensor([0, 3, 1])


#: One instance of every gradient defense, built as the chapters build them.
DEFENSES = {
    "none": lambda: NoDefense(),
    "gaussian": lambda: GaussianNoise(0.1),
    "laplace": lambda: LaplaceNoise(0.1),
    "prune+gauss": lambda: PruneNoise("gaussian", 0.1, keep=0.5, mask_seed=1),
    "dpsgd": lambda: DPSGD(1.0, max_grad_norm=1.0),
    "compression": lambda: GradientCompression(0.5),
    "bias-removal": lambda: BiasRemoval(),
    "soteria": lambda: Soteria("3", pruning_rate=0.5),
}


def _all_defense_classes() -> set[type]:
    found, todo = set(), [GradientDefense]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.add(sub)
            todo.append(sub)
    return {c for c in found if not inspect.isabstract(c)}


def test_every_concrete_defense_is_exercised_here() -> None:
    built = {type(make()) for make in DEFENSES.values()}
    assert _all_defense_classes() <= built, _all_defense_classes() - built


@pytest.mark.parametrize("name", list(DEFENSES))
def test_share_returns_one_update_or_n_stacked_ones(name: str) -> None:
    model, (x, y) = net(), batch()
    shapes = {n: p.shape for n, p in model.named_parameters()}
    defense = DEFENSES[name]()
    one = defense.share(model, x, y, torch.Generator().manual_seed(0))
    assert {k: v.shape for k, v in one.items()} == shapes
    per = defense.share(model, x, y, torch.Generator().manual_seed(0), per_image=True)
    assert {k: v.shape for k, v in per.items()} == {k: (N, *s) for k, s in shapes.items()}
    assert all(torch.isfinite(v).all() for v in per.values())
    assert isinstance(defense.describe()["defense"], str)


#: Defenses whose p(g | x) has no tractable form: their likelihood() must say so.
INTRACTABLE = {"compression"}


@pytest.mark.parametrize("name", list(DEFENSES))
def test_likelihood_takes_no_arguments(name: str) -> None:
    defense = DEFENSES[name]()
    params = list(inspect.signature(defense.likelihood).parameters)
    assert params == [], params
    model, (x, y) = net(), batch()
    defense.share(model, x, y, torch.Generator().manual_seed(0))
    if name in INTRACTABLE:
        with pytest.raises(NotImplementedError, match=r"p\(g\|x\)"):
            defense.likelihood()
    else:
        assert isinstance(defense.likelihood(), Likelihood)


def test_the_share_signature_is_the_same_for_every_defense() -> None:
    expected = inspect.signature(GradientDefense.share)
    for cls in _all_defense_classes():
        assert inspect.signature(cls.share) == expected, cls
        assert list(inspect.signature(cls.likelihood).parameters) == ["self"], cls


@pytest.mark.parametrize("name", list(DEFENSES))
def test_share_rejects_a_batch_no_client_could_train_on(name: str) -> None:
    model, (x, y) = net(), batch()
    defense = DEFENSES[name]()
    with pytest.raises(ValueError, match="empty"):
        defense.share(model, x[:0], y[:0])
    bad = x.clone()
    bad[1, 0, 2, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        defense.share(model, bad, y)
    with pytest.raises(ValueError, match="class indices"):
        defense.share(model, x, torch.tensor([0, 4, 1]))  # the model has 4 outputs


def test_noise_on_per_image_shares_draws_as_on_the_stacked_update() -> None:
    """Per-image shares draw exactly what perturbing the stacked per-sample updates drew before."""
    model, (x, y) = net(), batch()
    per = per_sample_updates(model, x, y)
    for make in (lambda: GaussianNoise(0.1), lambda: LaplaceNoise(0.2), DEFENSES["prune+gauss"]):
        shared = make().share(model, x, y, torch.Generator().manual_seed(5), per_image=True)
        expected = make().perturb(per, torch.Generator().manual_seed(5), stacked=True)
        assert all(torch.equal(shared[k], expected[k]) for k in per)


def test_dpsgd_per_image_is_n_one_image_steps_in_turn() -> None:
    model, (x, y) = net(), batch()
    vectorised = DPSGD(0.7, max_grad_norm=0.05).share(
        model, x, y, torch.Generator().manual_seed(3), per_image=True
    )
    dp, gen = DPSGD(0.7, max_grad_norm=0.05), torch.Generator().manual_seed(3)
    steps = [dp.share(model, x[i : i + 1], y[i : i + 1], gen) for i in range(N)]
    for k in vectorised:
        assert torch.allclose(vectorised[k], torch.stack([s[k] for s in steps]), atol=1e-7)


def test_stacked_compression_prunes_each_client_on_its_own() -> None:
    big = torch.arange(1.0, 11.0)
    stacked = {"w": torch.stack([big * 100, big])}  # a global rule would prune all of slice 1
    out = GradientCompression(0.5).perturb(stacked, stacked=True)["w"]
    for i in range(2):
        assert int((out[i] == 0).sum()) == 5
        assert torch.equal(out[i][5:], stacked["w"][i][5:])  # the five largest of each slice kept
    model, (x, y) = net(), batch()
    per_image = GradientCompression(0.5).share(model, x, y, per_image=True)
    for i in range(N):
        alone = GradientCompression(0.5).share(model, x[i : i + 1], y[i : i + 1])
        for k in alone:
            assert torch.allclose(per_image[k][i], alone[k], atol=1e-7)


def test_no_defense_shares_the_update_as_it_is() -> None:
    model, (x, y) = net(), batch()
    shared = NoDefense().share(model, x, y)
    assert all(torch.equal(shared[k], v) for k, v in client_update(model, x, y).items())
    assert NoDefense().describe() == {"defense": "none"}


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: GaussianNoise(float("nan")), "sigma"),
        (lambda: GaussianNoise(float("inf")), "sigma"),
        (lambda: GaussianNoise(0.0), "sigma"),
        (lambda: LaplaceNoise(-1.0), "b"),
        (lambda: LaplaceNoise(float("nan")), "b"),
        (lambda: PruneNoise("gaussian", float("nan")), "scale"),
        (lambda: PruneNoise("gaussian", 0.1, keep=0.0), "keep"),
        (lambda: PruneNoise("gaussian", 0.1, keep=1.5), "keep"),
        (lambda: PruneNoise("uniform", 0.1), "noise"),
        (lambda: GradientCompression(float("nan")), "rate"),
        (lambda: GradientCompression(1.5), "rate"),
        (lambda: Soteria("3", pruning_rate=1.0), "pruning_rate"),
    ],
)
def test_hyper_parameters_are_validated_where_the_defense_is_built(build, named: str) -> None:
    with pytest.raises(ValueError, match=rf"^{named} must be"):
        build()


def test_no_isinstance_on_a_defense_outside_the_defenses_package() -> None:
    names = "|".join(re.escape(n) for n in defenses.__all__)
    pattern = re.compile(rf"isinstance\([^)]*\b({names})\b")
    root = Path(defenses.__file__).parent.parent
    offenders = [
        f"{path.relative_to(root)}:{i}"
        for path in root.rglob("*.py")
        if "defenses" not in path.relative_to(root).parts
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, offenders
