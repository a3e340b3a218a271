"""The CVB experiments attack one client's training images (CVB paper §V-B), the very images
FedAvg gives client 0, and their records say which ones; accuracy is the best round's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leakagelib.experiments import cvb_data
from leakagelib.experiments.cvb_analysis import PROTOCOL
from leakagelib.experiments.cvb_common import cnn
from leakagelib.experiments.registry import Context
from leakagelib.fedavg import FLResult, client_shards


def _ctx(seed: int = 0, **data: str) -> Context:
    return Context(scale="ci", seed=seed, progress=False, settings=PROTOCOL, data=data)


@pytest.mark.parametrize("seed", [0, 3])
def test_victims_are_training_images_of_client_0(seed: int) -> None:
    ctx = _ctx(seed)
    s = ctx.config
    pool = cvb_data.training_pool(ctx, "cifar10")
    assert len(pool.labels) == s.n_train and pool.images.shape[1:] == (3, 32, 32)
    shards = client_shards(s.n_train, s.clients, val_fraction=s.val_fraction, seed=seed)
    victims = cvb_data.load_victims(ctx, "cifar10", 4)
    positions = cvb_data.victim_positions(ctx, pool, 4)
    assert set(positions.tolist()) <= set(shards[0][0].tolist())  # client 0, training share
    assert torch.equal(victims.images, pool.images[positions])
    assert torch.equal(victims.labels, pool.labels[positions])
    others = torch.cat([shards[0][1], *(torch.cat(pair) for pair in shards[1:])])
    for image in victims.images:  # no other client's image, nor client 0's validation ones
        assert not (pool.images[others] == image).flatten(1).all(1).any()
    with pytest.raises(ValueError, match="client 0 trains on only"):
        cvb_data.load_victims(ctx, "cifar10", len(shards[0][0]) + 1)


def test_fedavg_trains_client_0_on_the_victims(monkeypatch) -> None:
    ctx = _ctx(1)
    seen = {}

    def fake(model, images, labels, **kwargs):
        seen.update(images=images, kwargs=kwargs)
        history = [
            {"round": 1, "val_loss": 2.0, "test_accuracy": 0.3},
            {"round": 2, "val_loss": 1.0, "test_accuracy": 0.6},
            {"round": 3, "val_loss": 1.5, "test_accuracy": 0.9},
        ]
        return FLResult(model=model, history=history)

    monkeypatch.setattr(cvb_data, "federated_averaging", fake)
    accuracy = cvb_data.fedavg_accuracy(ctx, cnn(), "mnist")
    assert accuracy == 0.6  # the round with the lowest validation loss, not the last
    kwargs, s = seen["kwargs"], ctx.config
    assert (kwargs["clients"], kwargs["val_fraction"], kwargs["seed"]) == (s.clients, 0.1, 1)
    train0 = client_shards(len(seen["images"]), s.clients, val_fraction=0.1, seed=1)[0][0]
    victims = cvb_data.load_victims(ctx, "mnist", 3)
    trained = seen["images"][train0]
    for image in victims.norm.normalize(victims.images):
        assert (trained - image).abs().flatten(1).amax(1).min() < 1e-6


def test_the_note_names_the_victims_by_their_file_indices(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("LEAKAGELIB_DATA", raising=False)
    rng = np.random.default_rng(0)
    path = tmp_path / "cifar.npz"
    np.savez(path, images=rng.integers(0, 256, (400, 3, 32, 32), dtype=np.uint8),
             labels=np.arange(400) % 10)  # fmt: skip
    three = PROTOCOL.changed("ci", {"victims": 3})
    ctx = Context(scale="ci", seed=2, progress=False, settings=three, data={"cifar10": str(path)})
    note = cvb_data.victim_notes(ctx, ["cifar10"])["cifar10"]
    pool = cvb_data.training_pool(ctx, "cifar10")
    chosen = pool.indices[cvb_data.victim_positions(ctx, pool, 3)].tolist()
    assert note.startswith(f"{path}; victims: 3 of the training images of client 0 of 2")
    assert note.endswith(f"their indices in the stored order: {chosen}")
    stored = np.load(path)["images"]
    victims = cvb_data.load_victims(ctx, "cifar10", 3)
    assert np.array_equal((victims.images * 255).round().byte().numpy(), stored[chosen])
    train_part = set(ctx.dataset("cifar10", split="train").indices.tolist())
    assert set(chosen) <= train_part  # never an image of the file's test part


def test_victims_at_draws_a_dataset_s_own_count_and_leaves_the_others_alone() -> None:
    """``victims_at`` (Table III on the 500-image CIFAR-10 sample) changes one dataset's draw;
    the other datasets' victims are those of a run without it, image for image."""
    plain = _ctx(0)
    changed = Context(scale="ci", seed=0, progress=False, data={},
                      settings=PROTOCOL.changed("ci", {"victims_at": {"cifar10": 5}}))  # fmt: skip
    assert cvb_data.victim_count(changed, "cifar10") == 5
    assert cvb_data.victim_count(changed, "mnist") == plain.config.victims == 2
    assert len(cvb_data.load_victims(changed, "cifar10").labels) == 5
    assert torch.equal(
        cvb_data.load_victims(changed, "mnist").images, cvb_data.load_victims(plain, "mnist").images
    )
    assert cvb_data.victim_fields(changed, "cifar10") == {"n": 5}  # a row says its own count
    assert (
        cvb_data.victim_fields(changed, "mnist") == cvb_data.victim_fields(plain, "cifar10") == {}
    )
    assert "victims: 5 of" in cvb_data.victim_notes(changed, ["cifar10"])["cifar10"]


@pytest.mark.parametrize(
    ("victims_at", "message"),
    [
        ({"svhn": 3}, r"victims_at names \['svhn'\]"),
        ({"cifar10": 0}, "must be a positive integer"),
        ({"cifar10": 2.5}, "must be a positive integer"),
        ({"cifar10": 10_000}, "victims of cifar10, but client 0 trains on only"),
    ],
)
def test_a_count_that_cannot_be_drawn_stops_the_run_before_any_attack(victims_at, message) -> None:
    ctx = Context(scale="ci", seed=0, progress=False, data={},
                  settings=PROTOCOL.changed("ci", {"victims_at": victims_at}))  # fmt: skip
    with pytest.raises(ValueError, match=message):
        cvb_data.check_victims(ctx, ["mnist", "cifar10"])
