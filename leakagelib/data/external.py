"""Datasets read from disk and downloaded only on request: torchvision and MedMNIST.

* torchvision (:data:`TORCHVISION`): ``"mnist"``, ``"fashion-mnist"``, ``"cifar10"``,
  ``"cifar100"``, read from ``root`` and downloaded only with ``download=True``. The chapters
  run on them at ``paper`` scale.
* MedMNIST (Yang et al. 2023, :data:`MEDMNIST`), the medical datasets of the CVB paper's
  Table VI: ``"pneumoniamnist"``, ``"dermamnist"``, ``"retinamnist"``, ``"bloodmnist"``, read
  from the release file ``root/NAME.npz`` and fetched by the ``medmnist`` package only with
  ``download=True``.

:data:`FORMATS` says what the images of each of these datasets look like; an ``.npz`` file
given for one of them is checked against it (:mod:`leakagelib.data.npz_format`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .dataset import Raw
from .npz import read_arrays

#: torchvision datasets: name -> (torchvision class name, embedded stand-in).
TORCHVISION: dict[str, tuple[str, str]] = {
    "mnist": ("MNIST", "digits28"),
    "fashion-mnist": ("FashionMNIST", "digits28"),
    "cifar10": ("CIFAR10", "patches"),
    "cifar100": ("CIFAR100", "patches"),
}

#: MedMNIST datasets of the CVB paper's Table VI, read from ``root`` or fetched by ``medmnist``.
MEDMNIST: tuple[str, ...] = ("pneumoniamnist", "dermamnist", "retinamnist", "bloodmnist")


class ImageFormat(NamedTuple):
    """Channels, image size ``(H, W)`` and class count of a dataset's images."""

    channels: int
    size: tuple[int, int]
    classes: int


#: The images of each torchvision and MedMNIST dataset (MedMNIST at its 28 x 28 release size;
#: class counts from the MedMNIST v2 paper's table of datasets).
FORMATS: dict[str, ImageFormat] = {
    "mnist": ImageFormat(1, (28, 28), 10),
    "fashion-mnist": ImageFormat(1, (28, 28), 10),
    "cifar10": ImageFormat(3, (32, 32), 10),
    "cifar100": ImageFormat(3, (32, 32), 100),
    "pneumoniamnist": ImageFormat(1, (28, 28), 2),
    "dermamnist": ImageFormat(3, (28, 28), 7),
    "retinamnist": ImageFormat(3, (28, 28), 5),
    "bloodmnist": ImageFormat(3, (28, 28), 8),
}


def default_root() -> Path:
    """Where torchvision datasets live: ``$LEAKAGELIB_DATA_ROOT`` or ``~/.cache/leakagelib``."""
    env = os.environ.get("LEAKAGELIB_DATA_ROOT")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "leakagelib"


def load_torchvision(
    name: str, split: str, root: str | os.PathLike[str] | None, download: bool
) -> Raw:
    """Every image of a torchvision dataset's ``split``, read from ``root`` (default
    :func:`default_root`); a missing dataset is downloaded only with ``download``, else the
    error names the offline alternatives (the embedded stand-in, an ``.npz`` via ``--data``).
    """
    import torchvision

    if split not in ("test", "train"):
        raise ValueError(
            f"torchvision dataset {name!r} has splits 'test' and 'train', not {split!r}."
        )
    class_name, stand_in = TORCHVISION[name]
    folder = Path(root).expanduser() if root is not None else default_root()
    cls = getattr(torchvision.datasets, class_name)
    hint = (
        f"Offline alternatives: the embedded stand-in {stand_in!r} "
        f"(load({stand_in!r}, constants_of={name!r})), or an .npz file with uint8 'images' "
        f"(N x C x H x W) and 'labels', passed as load('path.npz', constants_of={name!r}) or on "
        f"the command line as --data {name}=path.npz."
    )
    try:
        ds = cls(str(folder), train=split == "train", download=download)
    except RuntimeError as error:
        if not download:
            raise FileNotFoundError(
                f"torchvision dataset {name!r} ({split}) was not found under {folder} and "
                f"download=False. Pass download=True on a machine with network access (or set "
                f"$LEAKAGELIB_DATA_ROOT / root= to where it is). {hint}"
            ) from error
        raise RuntimeError(
            f"Could not download torchvision dataset {name!r} into {folder}: {error}. {hint}"
        ) from error
    except OSError as error:  # network failures (URLError is an OSError) during download
        raise RuntimeError(
            f"Could not download torchvision dataset {name!r} into {folder}: {error}. {hint}"
        ) from error
    data = np.asarray(ds.data)
    array = data[:, None] if data.ndim == 3 else data.transpose(0, 3, 1, 2)
    images = torch.from_numpy(array.astype(np.float32) / 255.0)
    labels = torch.as_tensor(np.asarray(ds.targets), dtype=torch.int64)
    return Raw(images, labels, [str(c) for c in ds.classes])


def _medmnist_hint(name: str, folder: Path) -> str:
    """Every way to get MedMNIST dataset ``name``, for the errors of a missing file."""
    return (
        f"MedMNIST is not embedded: with network access, install the 'medmnist' package and "
        f"load({name!r}, download=True) (on the command line: reproduce ... --download), which "
        f"stores {name}.npz under {folder}; or put that file there yourself (root= or "
        f"$LEAKAGELIB_DATA_ROOT), or pass an .npz in this library's format as --data {name}=PATH."
    )


def _medmnist_file(name: str, split: str, folder: Path, download: bool) -> Path:
    """``folder/{name}.npz``, fetched by the ``medmnist`` package when missing and ``download``."""
    path = folder / f"{name}.npz"
    if path.is_file():
        return path
    hint = _medmnist_hint(name, folder)
    if not download:
        raise FileNotFoundError(f"MedMNIST file {path} not found and download=False. {hint}")
    try:
        import medmnist
    except ImportError as error:
        raise RuntimeError(
            f"Downloading {name!r} needs the 'medmnist' package (pip install medmnist). {hint}"
        ) from error
    folder.mkdir(parents=True, exist_ok=True)
    dataset_class = getattr(medmnist, medmnist.INFO[name]["python_class"])
    try:
        dataset_class(split=split, root=str(folder), download=True)
    except (RuntimeError, OSError) as error:  # network failures are OSErrors
        raise RuntimeError(f"Could not download {name!r} into {folder}: {error}. {hint}") from error
    return path


def load_medmnist(
    name: str, split: str, root: str | os.PathLike[str] | None, download: bool
) -> Raw:
    """A MedMNIST v2 dataset at 28 x 28 (Yang et al. 2023), as the CVB paper's Table VI uses.

    The MedMNIST release file ``{name}.npz`` holds ``{split}_images`` (uint8
    N x H x W, or N x H x W x 3 for colour) and ``{split}_labels`` (N x 1) for
    the splits train, val and test. It is read from ``root`` header-first and never
    unpickled (:mod:`leakagelib.data.npz`); with ``download=True`` a missing file is
    fetched by the ``medmnist`` package, which writes the same file.
    """
    if split not in ("test", "train"):
        raise ValueError(
            f"MedMNIST dataset {name!r} is loaded as 'test' or 'train', not {split!r}."
        )
    folder = Path(root).expanduser() if root is not None else default_root()
    path = _medmnist_file(name, split, folder, download)
    arrays = read_arrays(
        path,
        (f"{split}_images", f"{split}_labels"),
        (),
        f"a MedMNIST file holds '{split}_images' and '{split}_labels'",
    )
    images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise ValueError(
            f"{path}: '{split}_images' must be uint8 N x H x W or N x H x W x C; got dtype "
            f"{images.dtype}, shape {images.shape}."
        )
    labels = labels.reshape(len(labels), -1) if labels.ndim else labels
    if labels.ndim != 2 or labels.shape[1] != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"{path}: '{split}_labels' must hold one integer label per image (N x 1); got dtype "
            f"{labels.dtype}, shape {arrays[f'{split}_labels'].shape}."
        )
    if labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{path}: {images.shape[0]} images but {labels.shape[0]} labels; counts must match."
        )
    array = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
    tensor = torch.from_numpy(np.ascontiguousarray(array).astype(np.float32) / 255.0)
    return Raw(tensor, torch.from_numpy(labels[:, 0].astype(np.int64)), None)
