"""Datasets for the experiments: embedded stand-ins, torchvision datasets and ``.npz`` files.

Every loader returns a :class:`Dataset` that unpacks as ``images, labels, normalizer = ds``:
images are float32 tensors ``N x C x H x W`` in [0, 1], labels int64 of shape ``N``, and the
:class:`Normalizer` holds the mean/std with which the paper's networks see the images. Attacks
work in normalised space and de-normalise before the metrics (:mod:`leakagelib.metrics`), as
the papers' code does. Every chapter that attacks images loads them here, with :func:`load`.

Sources (``spec``), one module each:

* Embedded, no network (:mod:`~leakagelib.data.embedded`, :data:`EMBEDDED`): ``"digits"``,
  ``"digits28"`` (the CI stand-in for MNIST), ``"faces"`` and ``"patches"`` (the CI stand-in
  for CIFAR-10), with a fixed train/test split (:func:`split_indices`).
* torchvision and MedMNIST, read from ``root`` and downloaded only with ``download=True``
  (:mod:`~leakagelib.data.external`): ``"mnist"``, ``"fashion-mnist"``, ``"cifar10"``,
  ``"cifar100"``; ``"pneumoniamnist"``, ``"dermamnist"``, ``"retinamnist"``, ``"bloodmnist"``
  (normalised with statistics measured on their training split).
* A path ending in ``.npz`` holding ``images`` (uint8 ``N x C x H x W``), ``labels`` and
  optionally ``classes`` -- the format of the project's shared MNIST/CIFAR-10 samples
  (:mod:`~leakagelib.data.npz_format`), read header-first and never unpickled
  (:mod:`~leakagelib.data.npz`). It is split like the embedded datasets: ``"test"`` is the
  first fifth of the fixed permutation :func:`split_indices` of its ``N`` images, ``"train"``
  the rest, ``"all"`` the whole file, so that one file can serve an experiment that trains
  and attacks without attacking an image it trained on.

Every :class:`Dataset` says which images of its source it holds (``indices``, ``selection``),
so that the experiment records can report which images were attacked and which trained on.

Normalisation (:mod:`~leakagelib.data.normalization`, :data:`CONSTANTS`): ``"bayes"``, ``"ig"``
or ``"none"``, each with its source. Which entry applies is decided by ``constants_of``, the
*logical* dataset (e.g. ``"mnist"`` when ``digits28`` or an ``.npz`` file stands in for MNIST).
A torchvision dataset is its own logical dataset. An embedded dataset or ``.npz`` file without
``constants_of`` (or standing for a MedMNIST dataset, which has no published constants) is
normalised with the per-channel mean/std measured on all of its own images (every split, so
the normaliser does not depend on ``n``, ``seed`` or ``split``). For an ``.npz`` file,
``constants_of`` also says what the file must look like (:data:`FORMATS`: channels, size,
class count).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from .dataset import SPLIT_RULE, SPLIT_SEED, Dataset, Raw, pick, split_indices
from .embedded import EMBEDDED, PATCH_GRID, PATCH_SHORT_SIDE, PATCH_SIZE
from .external import (
    FORMATS,
    MEDMNIST,
    TORCHVISION,
    ImageFormat,
    default_root,
    load_medmnist,
    load_torchvision,
)
from .normalization import CONSTANTS, Normalizer, measured, normalizer_for
from .npz_format import load_npz

__all__ = [
    "CONSTANTS",
    "EMBEDDED",
    "FORMATS",
    "MEDMNIST",
    "PATCH_GRID",
    "PATCH_SHORT_SIDE",
    "PATCH_SIZE",
    "SPLIT_RULE",
    "SPLIT_SEED",
    "TORCHVISION",
    "Dataset",
    "ImageFormat",
    "Normalizer",
    "available",
    "default_root",
    "load",
    "split_indices",
]

_SPLITS = ("test", "train", "all")


def available() -> list[str]:
    """Names ``load`` accepts besides ``.npz`` paths: embedded, torchvision, then MedMNIST."""
    return list(EMBEDDED) + list(TORCHVISION) + list(MEDMNIST)


def _source(
    name: str, split: str, root: str | os.PathLike[str] | None, download: bool
) -> tuple[Raw, torch.Tensor, str, Callable[[], torch.Tensor]]:
    """The named dataset's images, the positions of ``split`` among them, that part as a
    :func:`formula` source, and the images to measure the normaliser on."""
    if name in EMBEDDED:
        raw = EMBEDDED[name][0]()
        count = len(raw.labels)
        part = split_indices(count, split)
        return raw, part, f"split_indices({count}, {split!r})", lambda: raw.images
    if name in TORCHVISION:
        raw = load_torchvision(name, split, root, download)
        return raw, torch.arange(len(raw.labels)), f"{name}.{split}", lambda: raw.images
    if name in MEDMNIST:
        raw = load_medmnist(name, split, root, download)
        # no published constants: measured on the training split, whatever split is loaded
        return (
            raw,
            torch.arange(len(raw.labels)),
            f"{name}.{split}",
            lambda: load_medmnist(name, "train", root, False).images,
        )
    raise KeyError(
        f"Unknown dataset {name!r}. Known names: {available()}; anything else must be a "
        f"path ending in .npz."
    )


def load(
    spec: str | os.PathLike[str],
    n: int | None = None,
    seed: int = 0,
    *,
    shuffle: bool = True,
    split: str = "test",
    root: str | os.PathLike[str] | None = None,
    download: bool = False,
    constants: str = "bayes",
    constants_of: str | None = None,
    check_size: bool = True,
) -> Dataset:
    """Load ``n`` images of a dataset with its labels and normaliser.

    Args:
        spec: an embedded name (``digits``, ``digits28``, ``faces``, ``patches``), a torchvision
            name (``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100``), a MedMNIST name
            (``pneumoniamnist``, ``dermamnist``, ``retinamnist``, ``bloodmnist``) or a path
            ending in ``.npz``.
        n: how many images (``None``: all of the split); more than available raises. Of an
            ``.npz`` file only these ``n`` images are read.
        seed: seed of the permutation when ``shuffle`` is true.
        shuffle: true -> a seeded random permutation of the split, then its first ``n``;
            false -> the split's first ``n`` (the papers' "first 100 test images"), in
            :func:`split_indices` order for embedded datasets and .npz files.
        split: ``"test"`` or ``"train"``: the official splits of torchvision and MedMNIST;
            for embedded datasets and .npz files the fixed parts of :func:`split_indices`
            (also ``"all"``), whatever ``n`` and ``seed``.
        root: folder of torchvision and MedMNIST datasets (default ``$LEAKAGELIB_DATA_ROOT`` or
            ``~/.cache/leakagelib``).
        download: let torchvision (or the ``medmnist`` package) download a missing dataset
            (needs network access).
        constants: ``"bayes"``, ``"ig"`` or ``"none"`` (see the module docstring).
        constants_of: the logical dataset whose constants apply (``"mnist"``, ``"cifar10"``,
            ...); defaults to the torchvision name itself, and for embedded data and .npz files
            to measured statistics. An .npz file given with it must hold that dataset's
            channels, image size and labels (:data:`FORMATS`).
        check_size: for an .npz file standing for ``constants_of``, refuse images of another
            size than that dataset's. Pass False only when the caller resizes the images
            itself (e.g. to the 32 x 32 inputs of the CVB networks).

    Raises:
        KeyError: unknown spec or constants. ValueError: bad ``n``/``split`` or a malformed
        .npz (message names the file and the fix). FileNotFoundError: a missing .npz,
        torchvision or MedMNIST dataset (offline). MemoryError: the requested images need
        more memory than is available (raised before allocating).
    """
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}; got {split!r}.")
    text = os.fspath(spec)
    if text.endswith(".npz"):
        return load_npz(text, n, seed, shuffle, split, constants, constants_of, check_size)
    if text in TORCHVISION and constants_of is None:
        constants_of = text
    raw, part, source, measured_on = _source(text, split, root, download)
    table_entry = None if constants_of in MEDMNIST else constants_of
    normalizer = normalizer_for(constants, table_entry, lambda: measured(measured_on()))
    images, labels, indices, chosen = pick(raw, part, source, n, seed, shuffle, text)
    return Dataset(images, labels, normalizer, text, raw.classes, indices, chosen)
