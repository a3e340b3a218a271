"""Tests for leakagelib.data: embedded datasets, torchvision errors, .npz files, normalisers."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from leakagelib import data
from leakagelib.data import CONSTANTS, Dataset, Normalizer, load, split_indices

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LEAKAGELIB_SHARED_DATA", REPO.parent / "shared" / "data"))

EXPECTED = {
    # name: (count over all splits, C, H, W, number of classes)
    "digits": (1797, 1, 8, 8, 10),
    "digits28": (1797, 1, 28, 28, 10),
    "faces": (200, 1, 25, 25, 2),
    "patches": (640, 3, 32, 32, 10),
}


# ------------------------------------------------------------------------------------------
# Embedded datasets
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(EXPECTED))
def test_embedded_shapes_ranges_and_dtypes(name: str) -> None:
    count, c, h, w, k = EXPECTED[name]
    ds = load(name, split="all", shuffle=False)
    images, labels, normalizer = ds
    assert isinstance(ds, Dataset) and ds.name == name and len(ds) == count
    assert images.shape == (count, c, h, w) and images.dtype == torch.float32
    assert labels.shape == (count,) and labels.dtype == torch.int64
    assert float(images.min()) == 0.0 and float(images.max()) == 1.0
    assert ds.classes is not None and len(ds.classes) == k
    assert sorted(labels.unique().tolist()) == list(range(k))
    assert isinstance(normalizer, Normalizer) and len(normalizer.mean) == c


@pytest.mark.parametrize("name", list(EXPECTED))
def test_embedded_split_is_fixed_disjoint_and_complete(name: str) -> None:
    everything = load(name, split="all", shuffle=False)
    test = load(name, split="test", shuffle=False)
    train = load(name, split="train", shuffle=False)
    assert len(test) + len(train) == len(everything)
    assert len(test) == (len(everything) + 4) // 5
    test_idx, train_idx = (
        split_indices(len(everything), "test"),
        split_indices(len(everything), "train"),
    )
    assert torch.equal(test.images, everything.images[test_idx])
    assert (
        torch.equal(test.indices, test_idx)
        and test.selection == f"split_indices({len(everything)}, 'test')"
    )
    assert torch.equal(train.labels, everything.labels[train_idx])
    assert sorted(torch.cat([test_idx, train_idx]).tolist()) == list(range(len(everything)))
    # the first test images mix the classes (no cyclic-order artefact)
    assert len(set(test.labels[:10].tolist())) >= min(5, len(set(everything.labels.tolist())))


def test_digits_are_sklearn_counts_over_16() -> None:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    ds = load("digits", split="all", shuffle=False)
    assert torch.equal(ds.images[:, 0] * 16, torch.from_numpy(bunch.images.astype(np.float32)))
    assert torch.equal(ds.labels, torch.from_numpy(bunch.target.astype(np.int64)))
    assert ds.classes == [str(i) for i in range(10)]


def test_digits28_is_mnist_like() -> None:
    ds = load("digits28", split="all", shuffle=False)
    x = ds.images[:, 0].double()
    assert torch.equal(ds.labels, load("digits", split="all", shuffle=False).labels)
    # Each digit fits a 20x20 box, like MNIST's size-normalised digits.
    rows = (x > 0).any(2)
    cols = (x > 0).any(1)
    height = rows.shape[1] - rows.float().argmax(1) - rows.flip(1).float().argmax(1)
    width = cols.shape[1] - cols.float().argmax(1) - cols.flip(1).float().argmax(1)
    assert int(height.max()) <= 20 and int(width.max()) <= 20
    assert int(height.min()) >= 16  # the digits fill the box's height, as scaled MNIST does
    # Centre of mass within half a pixel of the frame's centre (whole-pixel shifts).
    coords = torch.arange(28, dtype=torch.float64)
    mass = x.sum((1, 2))
    com_r = (x.sum(2) * coords).sum(1) / mass
    com_c = (x.sum(1) * coords).sum(1) / mass
    assert float((com_r - 13.5).abs().max()) <= 0.5 + 1e-9
    assert float((com_c - 13.5).abs().max()) <= 0.5 + 1e-9


def test_faces_are_100_faces_then_100_non_faces() -> None:
    from skimage.data import lfw_subset

    ds = load("faces", split="all", shuffle=False)
    assert ds.classes == ["non-face", "face"]
    assert ds.labels[:100].eq(1).all() and ds.labels[100:].eq(0).all()
    expected = torch.from_numpy(np.asarray(lfw_subset(), dtype=np.float32))
    assert torch.equal(ds.images[:, 0], expected)


def test_patches_are_structured_deterministic_and_balanced() -> None:
    ds = load("patches", split="all", shuffle=False)
    assert ds.classes is not None
    assert {"astronaut", "chelsea", "coffee", "china", "flower"} <= set(ds.classes)
    assert torch.bincount(ds.labels).tolist() == [64] * 10
    # Crops of downscaled photographs carry structure: no crop is nearly flat.
    assert float(ds.images.flatten(1).std(1).min()) > 0.02
    data.embedded._patches.cache_clear()
    again = load("patches", split="all", shuffle=False)
    assert torch.equal(ds.images, again.images) and torch.equal(ds.labels, again.labels)


# ------------------------------------------------------------------------------------------
# n, seed, shuffle
# ------------------------------------------------------------------------------------------


def test_shuffle_is_seeded_and_first_n_without_shuffle() -> None:
    a = load("digits", n=20, seed=3)
    b = load("digits", n=20, seed=3)
    c = load("digits", n=20, seed=4)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, c.images)
    full = load("digits", shuffle=False)
    first = load("digits", n=7, shuffle=False, seed=99)
    assert torch.equal(first.images, full.images[:7])
    # the shuffled selection is a subset of the split, without repeats
    flat = full.images.flatten(1)
    matches = (a.images.flatten(1)[:, None] == flat[None]).all(2)
    assert matches.any(1).all()


def test_bad_n_and_split() -> None:
    with pytest.raises(ValueError, match="holds only 40"):
        load("faces", n=41)
    with pytest.raises(ValueError, match="positive integer"):
        load("faces", n=0)
    with pytest.raises(ValueError, match="split"):
        load("faces", split="validation")


def test_unknown_spec_names_known_and_npz() -> None:
    with pytest.raises(KeyError) as info:
        load("imagenet")
    message = str(info.value)
    assert "digits28" in message and "cifar10" in message and ".npz" in message


def test_available_lists_embedded_and_torchvision() -> None:
    names = data.available()
    assert set(EXPECTED) <= set(names)
    assert {"mnist", "fashion-mnist", "cifar10", "cifar100"} <= set(names)


# ------------------------------------------------------------------------------------------
# Normalisation
# ------------------------------------------------------------------------------------------


def test_normalizer_round_trip_broadcast_dtype() -> None:
    norm = Normalizer((0.5, 0.25, 0.0), (0.5, 0.25, 2.0))
    x = torch.rand(4, 3, 5, 5, dtype=torch.float64)
    y = norm.normalize(x)
    assert y.dtype == torch.float64
    assert torch.allclose(y[:, 0], (x[:, 0] - 0.5) / 0.5)
    assert torch.allclose(y[:, 2], x[:, 2] / 2.0)
    assert torch.allclose(norm.denormalize(y), x)
    assert torch.allclose(norm.normalize(x[0]), y[0])  # C x H x W works too
    grey = Normalizer((0.1307,), (0.3081,))
    assert torch.allclose(grey.normalize(x), (x - 0.1307) / 0.3081)  # one entry broadcasts
    assert torch.equal(Normalizer.identity().normalize(x), x)
    with pytest.raises(ValueError, match="3 channel constants"):
        norm.normalize(torch.rand(2, 1, 4, 4))
    with pytest.raises(ValueError, match="positive"):
        Normalizer((0.0,), (0.0,))
    with pytest.raises(ValueError, match="as many means"):
        Normalizer((0.0, 1.0), (1.0,))


def test_constants_tables_and_selection() -> None:
    bayes = load("digits28", n=2, constants_of="mnist").normalizer
    assert bayes == Normalizer((0.1307,), (0.3081,))
    ig = load("patches", n=2, constants="ig", constants_of="cifar10").normalizer
    assert ig.mean[0] == pytest.approx(0.4914672374725342, abs=0)
    assert ig.std == CONSTANTS["ig"]["cifar10"][1]
    bayes_cifar = load("patches", n=2, constants_of="cifar10").normalizer
    assert bayes_cifar.std == (0.2023, 0.1994, 0.2010)
    assert load("patches", n=2, constants="none").normalizer == Normalizer.identity()
    with pytest.raises(KeyError, match="fashion-mnist"):
        load("digits28", n=2, constants="ig", constants_of="fashion-mnist")
    with pytest.raises(KeyError, match="constants"):
        load("digits28", n=2, constants="imagenet")


def test_embedded_without_constants_of_uses_measured_statistics() -> None:
    ds = load("patches", n=5, seed=1)
    everything = load("patches", split="all").images
    mean = everything.double().mean((0, 2, 3))
    std = everything.double().transpose(0, 1).reshape(3, -1).std(1, correction=0)
    assert torch.allclose(torch.tensor(ds.normalizer.mean, dtype=torch.float64), mean)
    assert torch.allclose(torch.tensor(ds.normalizer.std, dtype=torch.float64), std)
    # the same normaliser whatever n, seed and split
    assert load("patches", n=50, seed=9, split="train").normalizer == ds.normalizer


# ------------------------------------------------------------------------------------------
# torchvision (offline: only the missing-data path can be exercised)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "stand_in"), [("mnist", "digits28"), ("cifar10", "patches")])
def test_torchvision_missing_names_alternatives(tmp_path: Path, name: str, stand_in: str) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load(name, root=tmp_path)
    message = str(info.value)
    assert stand_in in message and "--data" in message and str(tmp_path) in message
    assert "download=True" in message


def test_torchvision_root_from_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LEAKAGELIB_DATA_ROOT", str(tmp_path / "cache"))
    assert data.default_root() == tmp_path / "cache"
    with pytest.raises(FileNotFoundError, match="cache"):
        load("fashion-mnist")


# ------------------------------------------------------------------------------------------
# .npz files
# ------------------------------------------------------------------------------------------


def _write(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def test_npz_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(6, 3, 4, 5), dtype=np.uint8)
    labels = np.array([0, 1, 2, 1, 0, 2])
    path = _write(tmp_path / "x.npz", images=images, labels=labels, classes=np.array(list("abc")))
    ds = load(str(path), shuffle=False, split="all")
    assert ds.classes == ["a", "b", "c"] and ds.name == str(path)
    assert torch.equal(ds.images, torch.from_numpy(images.astype(np.float32) / 255))
    assert torch.equal(ds.labels, torch.from_numpy(labels))
    assert ds.normalizer.mean[1] == pytest.approx(images[:, 1].mean() / 255)
    # 4x5 images stand for CIFAR-10 only when the caller says it resizes them
    resized = load(path, n=3, split="all", constants_of="cifar10", check_size=False)
    assert resized.normalizer.std == (0.2023, 0.1994, 0.2010)
    no_classes = _write(tmp_path / "y.npz", images=images, labels=labels)
    assert load(no_classes).classes is None


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        ({"images": np.zeros((2, 1, 3, 3), np.uint8)}, "lacks"),
        ({"images": np.zeros((2, 1, 3, 3), np.float32), "labels": np.zeros(2, int)}, "uint8"),
        ({"images": np.zeros((2, 3, 3), np.uint8), "labels": np.zeros(2, int)}, "rank 4"),
        ({"images": np.zeros((2, 1, 3, 3), np.uint8), "labels": np.zeros(3, int)}, "counts"),
        ({"images": np.zeros((2, 1, 3, 3), np.uint8), "labels": np.zeros(2)}, "integer"),
        ({"images": np.zeros((2, 1, 3, 3), np.uint8), "labels": -np.ones(2, int)}, "negative"),
        (
            {
                "images": np.zeros((2, 1, 3, 3), np.uint8),
                "labels": np.array([0, 2]),
                "classes": np.array(["a", "b"]),
            },
            "no name",
        ),
    ],
)
def test_npz_malformed(tmp_path: Path, arrays: dict[str, np.ndarray], match: str) -> None:
    path = _write(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=match):
        load(str(path))


def test_npz_not_an_archive_or_pickled(tmp_path: Path) -> None:
    text = tmp_path / "text.npz"
    text.write_text("not an archive")
    with pytest.raises(ValueError, match="not a readable .npz"):
        load(str(text))
    pickled = _write(
        tmp_path / "pickled.npz",
        images=np.zeros((2, 1, 3, 3), np.uint8),
        labels=np.array([0, 1], dtype=object),
    )
    with pytest.raises(ValueError, match="could not read"):
        load(str(pickled))
    with pytest.raises(FileNotFoundError):
        load(str(tmp_path / "absent.npz"))


# ------------------------------------------------------------------------------------------
# The shared MNIST / CIFAR-10 samples (present in CI beside the checkout)
# ------------------------------------------------------------------------------------------


def _shared(name: str) -> Path:
    path = SHARED / name
    if not path.is_file():
        pytest.skip(
            f"shared data file {path} is absent (set LEAKAGELIB_SHARED_DATA to its folder); "
            f"this test did NOT run"
        )
    return path


def test_shared_mnist_sample() -> None:
    path = str(_shared("mnist_test_0_4999.npz"))
    ds = load(path, n=10, shuffle=False, split="all", constants_of="mnist")
    assert ds.images.shape == (10, 1, 28, 28) and ds.images.dtype == torch.float32
    assert 0.0 <= float(ds.images.min()) and float(ds.images.max()) <= 1.0
    assert ds.labels.tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]  # MNIST test set, in order
    assert ds.classes is not None and len(ds.classes) == 10
    assert ds.normalizer == Normalizer((0.1307,), (0.3081,))
    assert len(load(path, split="all")) == 5000
    assert len(load(path)) == 1000 and len(load(path, split="train")) == 4000


def test_shared_cifar10_sample() -> None:
    path = str(_shared("cifar10_test_0_499.npz"))
    ds = load(path, n=5, shuffle=False, split="all", constants="ig", constants_of="cifar10")
    assert ds.images.shape == (5, 3, 32, 32)
    assert ds.labels.tolist() == [3, 8, 8, 0, 6]  # CIFAR-10 test set, in order
    assert ds.classes is not None and ds.classes[3] == "cat"
    assert ds.normalizer.std == CONSTANTS["ig"]["cifar10"][1]
    shuffled = load(path, n=500, seed=1, split="all")
    assert sorted(shuffled.labels.tolist()) == sorted(load(path, split="all").labels.tolist())


# ---------------------------------------------------------------- MedMNIST


def _medmnist_file(folder: Path, name: str, channels: int, counts=(12, 5)) -> dict:
    """A file in the MedMNIST release layout: {split}_images (N×H×W[×3]) and {split}_labels (N×1)."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in zip(("train", "test"), counts, strict=True):
        shape = (n, 28, 28) if channels == 1 else (n, 28, 28, channels)
        arrays[f"{split}_images"] = rng.integers(0, 256, shape, dtype=np.uint8)
        arrays[f"{split}_labels"] = rng.integers(0, 4, (n, 1)).astype(np.int64)
    arrays["val_images"] = arrays["test_images"][:2]
    arrays["val_labels"] = arrays["test_labels"][:2]
    np.savez(folder / f"{name}.npz", **arrays)
    return arrays


@pytest.mark.parametrize("name, channels", [("pneumoniamnist", 1), ("bloodmnist", 3)])
def test_medmnist_release_file_is_read_as_n_c_h_w(tmp_path: Path, name: str, channels: int):
    arrays = _medmnist_file(tmp_path, name, channels)
    images, labels, norm = load(name, root=tmp_path, shuffle=False)
    assert images.shape == (5, channels, 28, 28) and images.dtype == torch.float32
    raw = arrays["test_images"] if channels == 3 else arrays["test_images"][..., None]
    assert torch.equal(images, torch.from_numpy(raw.transpose(0, 3, 1, 2) / 255.0).float())
    assert labels.tolist() == arrays["test_labels"][:, 0].tolist()
    # the normaliser is measured on the training split, whichever split is loaded
    train = torch.from_numpy(arrays["train_images"].astype(np.float32) / 255.0)
    expect_mean = train.mean() if channels == 1 else train.mean(dim=(0, 1, 2))
    assert torch.allclose(torch.as_tensor(norm.mean).flatten(), expect_mean.flatten(), atol=1e-5)
    assert len(load(name, root=tmp_path, split="train")) == 12
    assert name in data.available()


def test_medmnist_missing_file_names_every_way_to_get_it(tmp_path: Path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"medmnist.*--data dermamnist=PATH"):
        load("dermamnist", root=tmp_path)
    monkeypatch.setitem(__import__("sys").modules, "medmnist", None)  # not installed
    with pytest.raises(RuntimeError, match="pip install medmnist"):
        load("dermamnist", root=tmp_path, download=True)


def test_medmnist_malformed_files_are_named(tmp_path: Path):
    np.savez(tmp_path / "retinamnist.npz", train_images=np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(ValueError, match="test_images"):
        load("retinamnist", root=tmp_path)
    np.savez(
        tmp_path / "retinamnist.npz",
        test_images=np.zeros((2, 28, 28), np.uint8),
        test_labels=np.zeros((2, 3), np.int64),  # multi-label, not one label per image
    )
    with pytest.raises(ValueError, match="one integer label per image"):
        load("retinamnist", root=tmp_path)
    np.savez(
        tmp_path / "retinamnist.npz",
        test_images=np.array([None, None], dtype=object),
        test_labels=np.zeros((2, 1), np.int64),
    )
    with pytest.raises(ValueError, match="could not read"):
        load("retinamnist", root=tmp_path)
    with pytest.raises(ValueError, match="'test' or 'train'"):
        load("retinamnist", root=tmp_path, split="all")
