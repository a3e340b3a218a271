"""Tests for the validation of ``.npz`` datasets (leakagelib.data.npz and npz_format).

One test per class of bad input: wrong channels or size for the dataset a file stands for,
channels-last layout, labels out of range, empty files, headers declaring more data than the
file holds, more memory than available; and the good path: only the ``n`` images asked for
are read, with the same images as before. Then the fixed train/test split of a file: two
disjoint parts that cover it, the same on every call, whatever ``n`` and ``seed``.
"""

from __future__ import annotations

import io
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from leakagelib import data
from leakagelib.data import Normalizer, load


def _write(path: Path, images: np.ndarray, labels: np.ndarray | None = None, **extra) -> str:
    labels = np.zeros(len(images), np.int64) if labels is None else labels
    np.savez(path, images=images, labels=labels, **extra)
    return str(path)


def _grey(n: int = 4, size: int = 28) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (n, 1, size, size), dtype=np.uint8)


# ------------------------------------------------------------------ the dataset a file stands for


@pytest.mark.parametrize(
    ("dataset", "shape", "channels"),
    [
        ("mnist", (4, 3, 28, 28), 1),
        ("cifar10", (4, 1, 32, 32), 3),
        ("dermamnist", (4, 1, 28, 28), 3),
    ],
)
def test_channels_must_match_the_dataset(tmp_path: Path, dataset: str, shape, channels) -> None:
    path = _write(tmp_path / "x.npz", np.zeros(shape, np.uint8))
    with pytest.raises(ValueError) as info:
        load(path, constants_of=dataset)
    message = str(info.value)
    assert path in message and str(shape) in message and repr(dataset) in message
    assert f"have {channels} channel(s)" in message


def test_size_must_match_unless_the_caller_resizes(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.npz", _grey(size=32))
    with pytest.raises(ValueError) as info:
        load(path, constants_of="mnist")
    message = str(info.value)
    assert path in message and "32x32 images" in message and "are 28x28" in message
    assert "check_size=False" in message
    ds = load(path, constants_of="mnist", check_size=False, split="all")
    assert ds.images.shape == (4, 1, 32, 32) and ds.normalizer == Normalizer((0.1307,), (0.3081,))


@pytest.mark.parametrize("constants_of", [None, "mnist", "cifar10"])
@pytest.mark.parametrize("shape", [(4, 28, 28, 1), (4, 32, 32, 3)])
def test_channels_last_is_named_with_the_fix(tmp_path: Path, shape, constants_of) -> None:
    path = _write(tmp_path / "x.npz", np.zeros(shape, np.uint8))
    with pytest.raises(ValueError) as info:
        load(path, constants_of=constants_of)
    message = str(info.value)
    assert "channels-last" in message and str(shape) in message
    assert "np.transpose(images, (0, 3, 1, 2))" in message


def test_greyscale_without_channel_axis_says_how_to_add_it(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.npz", np.zeros((4, 28, 28), np.uint8))
    with pytest.raises(ValueError, match=r"rank 4.*images\[:, None\]"):
        load(path, constants_of="mnist")


# ------------------------------------------------------------------ labels


@pytest.mark.parametrize(
    ("labels", "constants_of", "extra", "words"),
    [
        ([0, 1, 10, 2], "mnist", {}, ["label 10", "'mnist'", "10 classes"]),
        ([0, 1, 12, 2], "fashion-mnist", {}, ["label 12", "'fashion-mnist'", "image 2"]),
        ([0, 2, 1, 0], "pneumoniamnist", {}, ["label 2", "2 classes"]),
        ([0, -3, 1, 0], "mnist", {}, ["non-negative", "found -3", "image 1"]),
        ([0, -3, 1, 0], None, {}, ["non-negative", "found -3"]),
        ([0, 3, 1, 0], None, {"classes": np.array(list("abc"))}, ["label 3", "3 classes"]),
    ],
)
def test_labels_out_of_range_name_the_value(tmp_path: Path, labels, constants_of, extra, words):
    path = _write(tmp_path / "x.npz", _grey(), np.array(labels), **extra)
    with pytest.raises(ValueError) as info:
        load(path, constants_of=constants_of)
    assert all(word in str(info.value) for word in [path, *words]), str(info.value)


def test_medmnist_stand_in_file_is_measured_and_checked(tmp_path: Path) -> None:
    images = _grey()
    path = _write(tmp_path / "x.npz", images, np.array([0, 1, 1, 0]))
    ds = load(path, constants_of="pneumoniamnist")  # no published constants: measured
    assert ds.normalizer.mean[0] == pytest.approx(images.mean() / 255)
    assert load(path, constants="none", constants_of="pneumoniamnist").normalizer == (
        Normalizer.identity()
    )


# ------------------------------------------------------------------ empty and lying files


@pytest.mark.parametrize("shape", [(0, 1, 28, 28), (3, 1, 0, 28)])
def test_empty_files_are_rejected(tmp_path: Path, shape) -> None:
    path = _write(tmp_path / "x.npz", np.zeros(shape, np.uint8), np.zeros(shape[0], np.int64))
    with pytest.raises(ValueError, match="holds no images"):
        load(path)


def _giant_archive(path: Path, compression: int) -> str:
    """An archive whose 'images' header declares 784000 x 1 x 1000 x 1000 bytes (730 GiB)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_2_0(
        header, {"descr": "|u1", "fortran_order": False, "shape": (784_000, 1, 1000, 1000)}
    )
    labels = io.BytesIO()
    np.save(labels, np.zeros(784_000, np.int64)[:2])
    with zipfile.ZipFile(path, "w", compression) as archive:
        archive.writestr("images.npy", header.getvalue() + bytes(1000))
        archive.writestr("labels.npy", labels.getvalue())
    return str(path)


@pytest.mark.parametrize(
    ("compression", "words"),
    [(zipfile.ZIP_STORED, "holds only 1000 bytes"), (zipfile.ZIP_DEFLATED, "1032-fold")],
)
def test_header_declaring_more_than_the_file_holds(tmp_path: Path, compression, words) -> None:
    path = _giant_archive(tmp_path / "giant.npz", compression)
    with pytest.raises(ValueError) as info:
        load(path, n=1)
    message = str(info.value)
    assert path in message and "(784000, 1, 1000, 1000)" in message and "730.2 GiB" in message
    assert words in message and "corrupt or crafted" in message


def test_truncated_data_is_named(tmp_path: Path) -> None:
    array = io.BytesIO()
    np.save(array, np.zeros((2, 1, 3, 3), np.uint8))
    labels = io.BytesIO()
    np.save(labels, np.zeros(2, np.int64))
    path = tmp_path / "short.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("images.npy", array.getvalue()[:-4])
        archive.writestr("labels.npy", labels.getvalue())
    with pytest.raises(ValueError, match="holds only 14 bytes of its data"):
        load(str(path))


def test_more_than_available_memory_is_refused_before_reading(tmp_path: Path, monkeypatch):
    path = _write(tmp_path / "x.npz", _grey(n=50))
    monkeypatch.setattr(data.npz, "available_memory", lambda: 100_000)
    with pytest.raises(MemoryError, match=r"50 images of shape \(1, 28, 28\) need .* n="):
        load(path, constants_of="mnist", split="all")
    assert len(load(path, n=2, constants_of="mnist", split="all")) == 2


# ------------------------------------------------------------------ reading only what is needed


def test_a_small_compressed_file_with_n_1_stays_small(tmp_path: Path) -> None:
    """74 MB of zeros compress to a small file; n=1 must not inflate them (nor 295 MB of floats)."""
    path = tmp_path / "zeros.npz"
    np.savez_compressed(
        path, images=np.zeros((6000, 3, 64, 64), np.uint8), labels=np.zeros(6000, np.int64)
    )
    assert path.stat().st_size < 1_000_000
    tracemalloc.start()
    try:
        ds = load(str(path), n=1, constants_of="cifar10", check_size=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ds.images.shape == (1, 3, 64, 64) and float(ds.images.abs().max()) == 0.0
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"


@pytest.mark.parametrize("fortran", [False, True])
@pytest.mark.parametrize("compressed", [False, True])
def test_selected_rows_equal_the_whole_file_selection(tmp_path: Path, fortran, compressed):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (40, 3, 5, 6), dtype=np.uint8)
    images = np.asfortranarray(images) if fortran else images
    labels = rng.integers(0, 7, 40).astype(">i4")  # big-endian labels are read as such
    path = tmp_path / "x.npz"
    (np.savez_compressed if compressed else np.savez)(path, images=images, labels=labels)
    for n, seed, shuffle in [(None, 0, True), (7, 3, True), (5, 0, False), (40, 9, False)]:
        ds = load(str(path), n=n, seed=seed, shuffle=shuffle, split="all")
        total = 40 if n is None else n
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(40, generator=gen)[:total] if shuffle else torch.arange(total)
        expected = torch.from_numpy(images.astype(np.float32) / 255.0)[order]
        assert torch.equal(ds.images, expected) and ds.images.is_contiguous()
        assert torch.equal(ds.labels, torch.from_numpy(labels.astype(np.int64))[order])
    flat = images.transpose(1, 0, 2, 3).reshape(3, -1).astype(np.float32) / 255.0
    assert ds.normalizer.mean == pytest.approx(flat.astype(np.float64).mean(1).tolist(), abs=1e-12)
    assert ds.normalizer.std == pytest.approx(flat.astype(np.float64).std(1).tolist(), abs=1e-12)


# ------------------------------------------------------------------ the train/test split of a file


def _randperm(count: int, seed: int) -> torch.Tensor:
    return torch.randperm(count, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("count", [2, 5, 6, 41, 1000])
def test_parts_are_disjoint_and_cover_the_file(tmp_path: Path, count: int) -> None:
    images = np.random.default_rng(count).integers(0, 256, (count, 1, 3, 2), dtype=np.uint8)
    labels = np.arange(count) % 7
    path = _write(tmp_path / "x.npz", images, labels)
    test, train = load(path, split="test"), load(path, split="train")
    test_idx, train_idx = test.indices.tolist(), train.indices.tolist()
    assert not set(test_idx) & set(train_idx)
    assert sorted(test_idx + train_idx) == list(range(count))
    assert len(test_idx) == (count + 4) // 5  # a fifth, rounded up, as for the embedded data
    for ds in (test, train):  # each image is the file's image at the index the dataset reports
        assert torch.equal(ds.images, torch.from_numpy(images[ds.indices.numpy()] / 255).float())
        assert ds.labels.tolist() == labels[ds.indices.numpy()].tolist()
    whole = load(path, split="all", shuffle=False)
    assert whole.indices.tolist() == list(range(count)) and len(whole) == count


def test_parts_are_the_embedded_rule_and_fixed_whatever_n_and_seed(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.npz", _grey(n=50))
    for split in ("test", "train"):
        part = data.split_indices(50, split)
        assert set(load(path, split=split).indices.tolist()) == set(part.tolist())
        assert torch.equal(load(path, split=split, shuffle=False).indices, part)
        for n, seed in [(1, 0), (3, 5), (8, 123), (None, 7)]:
            picked = load(path, n=n, seed=seed, split=split).indices
            assert set(picked.tolist()) <= set(part.tolist())
            assert torch.equal(picked, load(path, n=n, seed=seed, split=split).indices)
    # a larger file draws its own permutation, but the same one on every call
    big = _write(tmp_path / "big.npz", _grey(n=60))
    assert torch.equal(load(big, split="test").indices, load(big, split="test").indices)


@pytest.mark.parametrize(
    ("n", "seed", "shuffle", "split"),
    [(3, 0, True, "test"), (None, 4, True, "train"), (5, 0, False, "train"), (None, 0, False, "test"),
     (7, 2, True, "all")],
)  # fmt: skip
def test_selection_formula_gives_the_indices(tmp_path: Path, n, seed, shuffle, split) -> None:
    path = _write(tmp_path / "x.npz", _grey(n=30))
    ds = load(path, n=n, seed=seed, shuffle=shuffle, split=split)
    names = {"split_indices": data.split_indices, "randperm": _randperm}
    assert torch.equal(eval(ds.selection, names), ds.indices), ds.selection


def test_too_many_images_of_a_part_names_the_part(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.npz", _grey(n=10))
    with pytest.raises(ValueError, match=r"n=3 .* holds only 2\. That is the 'test' part of the "
                       r"file's 10 images; pass split='all'"):  # fmt: skip
        load(path, n=3)
    one = _write(tmp_path / "one.npz", _grey(n=1))
    assert len(load(one)) == 1
    with pytest.raises(ValueError, match=r"holds no images\. That is the 'train' part"):
        load(one, split="train")


def test_only_the_part_s_images_are_read(tmp_path: Path, monkeypatch) -> None:
    path = _write(tmp_path / "x.npz", _grey(n=40))
    asked: list[list[int]] = []
    rows = data.npz.NpzArchive.rows

    def spy(self, header, indices):
        asked.append(sorted(indices.tolist()))
        return rows(self, header, indices)

    monkeypatch.setattr(data.npz.NpzArchive, "rows", spy)
    ds = load(path, n=3, split="train")
    assert asked == [sorted(ds.indices.tolist())] and len(asked[0]) == 3
