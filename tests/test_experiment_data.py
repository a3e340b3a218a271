"""Train/test separation of an ``.npz`` given with ``--data``: the experiment registry loads
attacked images from the file's test part and training images from its disjoint train part,
and the record's ``data`` field says which file indices played which role."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from leakagelib import data
from leakagelib.experiments import data_roles, registry

COUNT = 50  # a fifth (10) is the test part, 40 the train part


@pytest.fixture
def mnist_file(tmp_path: Path, monkeypatch) -> str:
    monkeypatch.delenv(registry.DATA_ENV, raising=False)
    rng = np.random.default_rng(0)
    path = tmp_path / "mnist.npz"
    images = rng.integers(0, 256, (COUNT, 1, 28, 28), dtype=np.uint8)
    np.savez(path, images=images, labels=np.arange(COUNT) % 10)
    return str(path)


def _randperm(count: int, seed: int) -> torch.Tensor:
    return torch.randperm(count, generator=torch.Generator().manual_seed(seed))


def test_context_gives_disjoint_parts_of_an_npz_override(mnist_file: str) -> None:
    ctx = registry.Context(scale="ci", data={"mnist": mnist_file}, progress=False)
    attacked = ctx.dataset("mnist", n=4)  # the default split: test
    test = ctx.dataset("mnist", shuffle=False)
    train = ctx.dataset("mnist", split="train")
    assert set(attacked.indices.tolist()) <= set(test.indices.tolist())
    assert not set(test.indices.tolist()) & set(train.indices.tolist())
    assert sorted(test.indices.tolist() + train.indices.tolist()) == list(range(COUNT))
    assert len(test) == 10 and len(train) == 40
    assert train.normalizer == data.Normalizer(*data.CONSTANTS["bayes"]["mnist"])  # MNIST
    # the same parts whatever the run's seed
    other = registry.Context(scale="ci", seed=7, data={"mnist": mnist_file}, progress=False)
    assert set(other.dataset("mnist").indices.tolist()) == set(test.indices.tolist())


@pytest.fixture
def toy(monkeypatch) -> str:
    """A registered experiment that attacks 3 test images and trains on the train part."""
    monkeypatch.setattr(registry, "_EXPERIMENTS", dict(registry._EXPERIMENTS))

    @registry.experiment("test/train-and-attack", row_keys=("attacked",), datasets=("mnist",))
    def _toy(ctx: registry.Context) -> list[dict]:
        """Loads like an experiment that trains a network and attacks it."""
        attacked = ctx.dataset("mnist", n=3)
        trained = ctx.dataset("mnist", split="train")
        return [{"attacked": attacked.indices.tolist(), "trained": trained.indices.tolist()}]

    return "test/train-and-attack"


def test_record_says_which_indices_played_which_role(mnist_file: str, toy: str) -> None:
    record = registry.run(toy, seed=2, data={"mnist": mnist_file}, progress=False)
    json.dumps(record)  # a record is JSON
    entry, row = record["data"]["mnist"], record["rows"][0]
    assert entry["spec"] == mnist_file and entry["split_rule"] == data.SPLIT_RULE
    test, train = entry["test"], entry["train"]
    assert test["selection"] == [f"split_indices({COUNT}, 'test')[randperm(10, seed=2)[:3]]"]
    assert test["count"] == 3 and test["indices"] == sorted(row["attacked"])
    assert train["selection"] == [f"split_indices({COUNT}, 'train')[randperm(40, seed=2)]"]
    assert train["count"] == 40 and train["indices"] == sorted(row["trained"])
    assert not set(test["indices"]) & set(train["indices"])
    names = {"split_indices": data.split_indices, "randperm": _randperm}
    assert eval(test["selection"][0], names).tolist() == row["attacked"]
    assert record["data"]["cifar10"] == "patches"  # a dataset not overridden: as before


def test_large_parts_are_given_as_count_and_rule(mnist_file: str, toy: str, monkeypatch) -> None:
    monkeypatch.setattr(data_roles, "LISTED_INDICES", 5)
    record = registry.run(toy, data={"mnist": mnist_file}, progress=False)
    train = record["data"]["mnist"]["train"]
    assert "indices" not in train and train["count"] == 40
    names = {"split_indices": data.split_indices, "randperm": _randperm}
    rule = eval(train["selection"][0], names).tolist()
    assert rule == record["rows"][0]["trained"]
    assert record["data"]["mnist"]["test"]["indices"] == sorted(record["rows"][0]["attacked"])


def test_an_override_the_run_never_loads_says_so(mnist_file: str, toy: str) -> None:
    record = registry.run(toy, data={"mnist": mnist_file, "cifar10": "c.npz"}, progress=False)
    assert record["data"]["cifar10"] == {"spec": "c.npz", "split_rule": data.SPLIT_RULE}
