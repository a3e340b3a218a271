"""The library's ``.npz`` dataset format, checked from the file's headers before pixels are read.

A file holds ``images`` (uint8 ``N x C x H x W``, 0-255), ``labels`` (integers, one per image)
and optionally ``classes`` (the class names, index = label) -- the format of the project's
shared MNIST/CIFAR-10 samples. ``--data mnist=PATH.npz`` (``load(PATH, constants_of="mnist")``)
gives one for a logical dataset; the file must then look like that dataset (:data:`FORMATS`):
its channels, its image size unless the caller resizes (``check_size=False``, e.g. for an
experiment that resizes every image to 32 x 32) and labels below its class count.

Everything about shapes is checked from the headers (:class:`~leakagelib.data.npz.NpzArchive`)
before data is read: dtype, rank, a channels-last layout (with the ``np.transpose`` that fixes
it), an empty file, the channels and size of the dataset it stands for, and matching
image/label counts. Labels are then read and checked against the class count; of the images,
only the ``n`` selected ones are read and converted to float.

A file is split like the embedded datasets (:func:`~leakagelib.data.dataset.split_indices`):
``"test"`` is the first fifth of a fixed seeded permutation of its images, ``"train"`` the
rest, ``"all"`` the whole file. The ``n`` images are chosen within the part from the header's
image count alone, before any image is read.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from .dataset import Dataset, formula, selection, split_indices
from .external import FORMATS, MEDMNIST, ImageFormat
from .normalization import measured_from_counts, normalizer_for
from .npz import ArrayHeader, NpzArchive, require_memory

_NEEDS = "an .npz dataset needs 'images' (uint8 N x C x H x W) and 'labels'"


def check_images(
    path: Path, header: ArrayHeader, dataset: str | None, check_size: bool = True
) -> None:
    """Refuse ``images`` that are not uint8 ``N x C x H x W`` (with ``N >= 1``), and, when the
    file stands for ``dataset`` (a key of :data:`FORMATS`), images of other channels or size.
    """
    shape = header.shape
    if header.dtype != np.uint8:
        raise ValueError(
            f"{path}: 'images' must be uint8 (0-255); got dtype {header.dtype}. Convert images "
            f"in [0, 1] with (images * 255).round().astype(np.uint8)."
        )
    if len(shape) != 4:
        hint = " For greyscale N x H x W images add the channel axis: images[:, None]."
        raise ValueError(
            f"{path}: 'images' must have rank 4 (N x C x H x W); got shape {shape}."
            + (hint if len(shape) == 3 else "")
        )
    if shape[3] in (1, 3) and shape[1] not in (1, 3):
        raise ValueError(
            f"{path}: 'images' has shape {shape}, which looks channels-last (N x H x W x C with "
            f"{shape[3]} channel(s)); this library reads N x C x H x W. Convert before saving: "
            f"images = np.transpose(images, (0, 3, 1, 2))."
        )
    if shape[0] == 0 or 0 in shape[1:]:
        raise ValueError(
            f"{path}: 'images' has shape {shape}: the file holds no images (or empty ones); an "
            f".npz dataset needs at least one image of at least one pixel."
        )
    expected = FORMATS.get(dataset) if dataset is not None else None
    if expected is not None:
        _check_against(path, shape, dataset, expected, check_size)


def _check_against(
    path: Path, shape: tuple[int, ...], dataset: str, expected: ImageFormat, check_size: bool
) -> None:
    """Refuse images whose channels (or, with ``check_size``, size) differ from ``expected``."""
    if shape[1] != expected.channels:
        raise ValueError(
            f"{path}: 'images' has shape {shape}, i.e. {shape[1]} channel(s), but the file is "
            f"given for {dataset!r}, whose images have {expected.channels} channel(s); pass a "
            f"file of {dataset} images (N x {expected.channels} x H x W)."
        )
    height, width = expected.size
    if check_size and shape[2:] != expected.size:
        raise ValueError(
            f"{path}: 'images' has shape {shape}, i.e. {shape[2]}x{shape[3]} images, but the "
            f"file is given for {dataset!r}, whose images are {height}x{width}; pass "
            f"{height}x{width} images, or load(..., check_size=False) when the experiment "
            f"resizes the images itself."
        )


def check_labels_header(path: Path, header: ArrayHeader, count: int) -> None:
    """Refuse ``labels`` that are not a 1-D integer array of ``count`` entries."""
    if len(header.shape) != 1 or not np.issubdtype(header.dtype, np.integer):
        raise ValueError(
            f"{path}: 'labels' must be a 1-D integer array; got dtype {header.dtype}, "
            f"shape {header.shape}."
        )
    if header.shape[0] != count:
        raise ValueError(f"{path}: {count} images but {header.shape[0]} labels; counts must match.")


def check_label_values(
    path: Path, labels: np.ndarray, classes: list[str] | None, dataset: str | None
) -> None:
    """Refuse labels outside ``[0, K)``, ``K`` the file's class count and, when the file stands
    for a dataset of :data:`FORMATS`, that dataset's."""
    low, high = int(labels.min()), int(labels.max())
    if low < 0:
        raise ValueError(
            f"{path}: labels must be non-negative class indices; found {low} (image "
            f"{int(labels.argmin())})."
        )
    if classes is not None and high >= len(classes):
        raise ValueError(
            f"{path}: label {high} (image {int(labels.argmax())}) has no name among the "
            f"{len(classes)} classes."
        )
    expected = FORMATS.get(dataset) if dataset is not None else None
    if expected is not None and high >= expected.classes:
        raise ValueError(
            f"{path}: label {high} (image {int(labels.argmax())}) is out of range for "
            f"{dataset!r}, which has {expected.classes} classes (labels 0 to "
            f"{expected.classes - 1}); pass the file for the dataset it holds."
        )
    if high > np.iinfo(np.int64).max:
        raise ValueError(f"{path}: label {high} does not fit an int64 class index.")


def _classes(archive: NpzArchive, header: ArrayHeader | None) -> list[str] | None:
    """The class names, or None when the file has no ``classes``."""
    if header is None:
        return None
    if len(header.shape) != 1 or header.dtype.kind not in "US":
        raise ValueError(
            f"{archive.path}: 'classes' must be a 1-D array of strings; got dtype "
            f"{header.dtype}, shape {header.shape}."
        )
    return [str(c) for c in archive.read(header).tolist()]


def _channel_counts(archive: NpzArchive, header: ArrayHeader) -> np.ndarray:
    """``C x 256`` histogram of the byte values of every image, read block by block."""
    counts = np.zeros((header.shape[1], 256), np.int64)
    for block in archive.blocks(header):
        for channel in range(header.shape[1]):
            counts[channel] += np.bincount(block[:, channel].ravel(), minlength=256)
    return counts


def _choose(
    spec: str, count: int, split: str, n: int | None, seed: int, shuffle: bool
) -> tuple[torch.Tensor, str]:
    """File positions of the ``n`` images to read from ``split`` of ``count``, and their
    :func:`~leakagelib.data.dataset.formula`."""
    part = split_indices(count, split)
    hint = (
        ""
        if split == "all"
        else f" That is the {split!r} part of the file's {count} images; pass split='all' to "
        f"load from all of them."
    )
    order = part[selection(len(part), n, seed, shuffle, spec, hint)]
    source = f"split_indices({count}, {split!r})"
    return order, formula(source, len(part), n, seed, shuffle)


def check_file(spec: str, dataset: str) -> None:
    """The checks :func:`load_npz` makes before it reads any image, for a file given for
    ``dataset``: the arrays present, the images' dtype, rank, layout and channels (not their
    size, which an experiment may resize), the declared sizes against the archive, and the
    labels. The command line runs it for every ``--data`` file before a run starts, so that a bad
    file for a dataset an experiment loads late does not fail after hours of work."""
    with NpzArchive(Path(spec).expanduser()) as archive:
        headers = archive.headers(("images", "labels"), ("classes",), _NEEDS)
        images = headers["images"]
        check_images(archive.path, images, dataset, check_size=False)
        check_labels_header(archive.path, headers["labels"], images.shape[0])
        classes = _classes(archive, headers.get("classes"))
        check_label_values(archive.path, archive.read(headers["labels"]), classes, dataset)


def load_npz(
    spec: str,
    n: int | None,
    seed: int,
    shuffle: bool,
    split: str,
    constants: str,
    constants_of: str | None,
    check_size: bool,
) -> Dataset:
    """``n`` images of an ``.npz`` file in this library's format; see :func:`leakagelib.data.load`.

    ``spec`` is the path as given (the dataset's ``name``). ``split`` picks the part of the
    file (module docstring); the dataset's ``indices`` are positions in the file.
    ``constants_of`` is the dataset the file stands for: its normalisation constants apply and
    its format is checked (module docstring). Without it the normaliser is measured on all of
    the file's images (every part); so it is for a MedMNIST dataset, which has no published
    constants.
    """
    with NpzArchive(Path(spec).expanduser()) as archive:
        headers = archive.headers(("images", "labels"), ("classes",), _NEEDS)
        images = headers["images"]
        check_images(archive.path, images, constants_of, check_size)
        check_labels_header(archive.path, headers["labels"], images.shape[0])
        classes = _classes(archive, headers.get("classes"))
        labels = archive.read(headers["labels"])
        check_label_values(archive.path, labels, classes, constants_of)
        normalizer = normalizer_for(
            constants,
            None if constants_of in MEDMNIST else constants_of,
            lambda: measured_from_counts(_channel_counts(archive, images)),
        )
        order, chosen = _choose(spec, images.shape[0], split, n, seed, shuffle)
        # the selected uint8 rows twice (read in file order, then reordered) and as float32
        require_memory(
            archive.path,
            len(order) * math.prod(images.shape[1:]) * 6,
            f"{len(order)} images of shape {images.shape[1:]}",
        )
        picked = archive.rows(images, order.numpy())
    array = picked.astype(np.float32)
    array /= 255.0
    tensor_labels = torch.from_numpy(labels.astype(np.int64)[order.numpy()])
    return Dataset(torch.from_numpy(array), tensor_labels, normalizer, spec, classes, order, chosen)
