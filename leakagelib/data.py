"""Datasets for the experiments: embedded stand-ins, torchvision datasets and ``.npz`` files.

Every loader returns a :class:`Dataset` that unpacks as ``images, labels, normalizer = ds``:
images are float32 tensors ``N x C x H x W`` in [0, 1], labels int64 of shape ``N``, and the
:class:`Normalizer` holds the mean/std with which the paper's networks see the images. Attacks
work in normalised space and de-normalise before the metrics (:mod:`leakagelib.metrics`), as
the papers' code does. Every chapter that attacks images loads them here.

Sources (``spec``):

* Embedded, no network, shipped inside installed packages (see :data:`EMBEDDED`):
  ``"digits"`` (scikit-learn's 8x8 handwritten digits), ``"digits28"`` (the same digits
  placed in a 28x28 MNIST-like frame, the CI stand-in for MNIST), ``"faces"`` (scikit-image's
  25x25 LFW subset, face vs non-face) and ``"patches"`` (3x32x32 crops of colour photographs,
  the CI stand-in for CIFAR-10).
* torchvision, read from ``root`` and downloaded only with ``download=True``: ``"mnist"``,
  ``"fashion-mnist"``, ``"cifar10"``, ``"cifar100"``.
* MedMNIST (Yang et al. 2023), the medical datasets of the CVB paper's Table VI:
  ``"pneumoniamnist"``, ``"dermamnist"``, ``"retinamnist"``, ``"bloodmnist"``, read from the
  release file ``root/NAME.npz`` and fetched by the ``medmnist`` package only with
  ``download=True``; normalised with statistics measured on their training split.
* A path ending in ``.npz`` holding ``images`` (uint8 ``N x C x H x W``), ``labels`` and
  optionally ``classes`` -- the format of the project's shared MNIST/CIFAR-10 samples.

Embedded datasets have no official train/test split; this module fixes one that never changes:
a permutation drawn once with the fixed seed :data:`SPLIT_SEED` orders the images, its first
fifth is ``"test"`` (in that shuffled order, so the first ``n`` test images mix the classes,
as MNIST's and CIFAR-10's test sets do), the rest ``"train"``; ``"all"`` returns every image
in stored order. For ``.npz`` files ``split`` is ignored: a file holds whatever split it holds.

Normalisation constants (:data:`CONSTANTS`):

* ``"bayes"`` -- the Bayesian-framework code (eth-sri/bayes-framework-leakage, file
  ``bayes_optimal_attack/datasets/common.py``, table ``dataset_cfg``): MNIST (0.1307, 0.3081),
  CIFAR-10 mean (0.4914, 0.4822, 0.4465) std (0.2023, 0.1994, 0.2010), FashionMNIST and
  CIFAR-100 from the same table. Used by the Bayes-framework chapters (Table 2 and the
  defense/attack experiments). Note: that file's FashionMNIST loader passes
  ``Normalize((0.3530,), (0.2860,))``, i.e. mean and std swapped relative to its own table; we
  use the table (mean 0.2860, std 0.3530), which matches the dataset's statistics.
* ``"ig"`` -- Inverting Gradients (``inversefed/consts.py`` of JonasGeiping/inverting-gradients,
  read through a fork with the identical file, jauyong44/invertinggradients): the exact
  training-set statistics, e.g. MNIST (0.13066373765468597, 0.30810782313346863). The CVB code
  uses the same numbers (dAI-SY-Group/ConvolutionalVariationalBottleneck,
  ``configs/data/MNIST.yaml`` and ``configs/data/CIFAR10.yaml``), so the PRECODE/CVB chapters use
  ``"ig"``. There is no FashionMNIST entry there, so ``constants="ig"`` for it raises.
* ``"none"`` -- the identity; R-GAP feeds images in [0, 1] to its networks (its chapters use it).

Which constants apply is decided by ``constants_of`` (the *logical* dataset, e.g. ``"mnist"``
when ``digits28`` or an ``.npz`` file stands in for MNIST). A torchvision dataset is its own
logical dataset. An embedded dataset or ``.npz`` file without ``constants_of`` is normalised with
the per-channel mean/std measured on all of its own images (every split, so the normaliser
does not depend on ``n``, ``seed`` or ``split``).
"""

from __future__ import annotations

import numbers
import os
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "CONSTANTS",
    "EMBEDDED",
    "TORCHVISION",
    "Dataset",
    "Normalizer",
    "available",
    "default_root",
    "load",
    "split_indices",
]


@dataclass(frozen=True)
class Normalizer:
    """Per-channel affine map ``x -> (x - mean) / std`` and its inverse.

    ``mean`` and ``std`` are tuples with one entry per channel; a single entry broadcasts over
    any number of channels. Tensors are ``N x C x H x W`` (or ``C x H x W``); the constants are
    moved to the tensor's device and dtype, so the maps are differentiable and device-agnostic.
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))
        if not self.mean or len(self.mean) != len(self.std):
            raise ValueError(
                f"Normalizer needs as many means as stds (at least one); got mean={self.mean}, "
                f"std={self.std}."
            )
        if any(not np.isfinite(s) or s <= 0 for s in self.std):
            raise ValueError(f"Normalizer std must be positive and finite; got {self.std}.")

    @classmethod
    def identity(cls) -> Normalizer:
        """The identity normaliser (mean 0, std 1), for networks that see [0, 1] images."""
        return cls((0.0,), (1.0,))

    def _constants(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"Normalizer expects a torch.Tensor, got {type(x).__name__}.")
        if x.ndim not in (3, 4):
            raise ValueError(
                f"Normalizer expects N x C x H x W or C x H x W images; got shape {tuple(x.shape)}."
            )
        channels = x.shape[-3]
        if len(self.mean) not in (1, channels):
            raise ValueError(
                f"Normalizer has {len(self.mean)} channel constants but the images have "
                f"{channels} channels (shape {tuple(x.shape)})."
            )
        dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        mean = torch.tensor(self.mean, dtype=dtype, device=x.device).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=dtype, device=x.device).view(-1, 1, 1)
        return mean, std

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Map images in [0, 1] to the network's input space: ``(x - mean) / std``."""
        mean, std = self._constants(x)
        return (x - mean) / std

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Map network inputs back to pixel space: ``x * std + mean`` (no clipping)."""
        mean, std = self._constants(x)
        return x * std + mean


@dataclass
class Dataset:
    """Images, labels and normaliser of one loaded dataset.

    Unpacks as ``images, labels, normalizer = ds``. ``images`` is float32 ``N x C x H x W`` in
    [0, 1], ``labels`` int64 of shape ``N``, ``classes`` the class names (index = label) or
    ``None`` when the source has none, ``name`` the spec it was loaded from.
    """

    images: torch.Tensor
    labels: torch.Tensor
    normalizer: Normalizer
    name: str
    classes: list[str] | None = None

    def __iter__(self) -> Iterator[object]:
        return iter((self.images, self.labels, self.normalizer))

    def __len__(self) -> int:
        return int(self.labels.shape[0])


# --------------------------------------------------------------------------------------------
# Normalisation constants
# --------------------------------------------------------------------------------------------

#: Normalisation constants by convention, then by logical dataset: ``(mean, std)`` tuples.
#: Sources are cited in the module docstring.
CONSTANTS: dict[str, dict[str, tuple[tuple[float, ...], tuple[float, ...]]]] = {
    "bayes": {
        "mnist": ((0.1307,), (0.3081,)),
        "fashion-mnist": ((0.2860,), (0.3530,)),
        "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
        "cifar100": ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
    },
    "ig": {
        "mnist": ((0.13066373765468597,), (0.30810782313346863,)),
        "cifar10": (
            (0.4914672374725342, 0.4822617471218109, 0.4467701315879822),
            (0.24703224003314972, 0.24348513782024384, 0.26158785820007324),
        ),
        "cifar100": (
            (0.5071598291397095, 0.4866936206817627, 0.44120192527770996),
            (0.2673342823982239, 0.2564384639263153, 0.2761504650115967),
        ),
    },
}


def _normalizer_for(
    constants: str, constants_of: str | None, measured: Callable[[], Normalizer]
) -> Normalizer:
    """Pick the normaliser: identity, a table entry, or the measured statistics."""
    if constants == "none":
        return Normalizer.identity()
    if constants not in CONSTANTS:
        raise KeyError(
            f"Unknown normalisation constants {constants!r}; choose one of "
            f"{sorted(CONSTANTS) + ['none']}."
        )
    if constants_of is None:
        return measured()
    table = CONSTANTS[constants]
    if constants_of not in table:
        raise KeyError(
            f"The {constants!r} constants have no entry for dataset {constants_of!r}; "
            f"entries: {sorted(table)}."
        )
    mean, std = table[constants_of]
    return Normalizer(mean, std)


def _measured(images: torch.Tensor) -> Normalizer:
    """Per-channel mean and (population) std over all pixels of ``images``."""
    flat = images.transpose(0, 1).reshape(images.shape[1], -1).double()
    return Normalizer(tuple(flat.mean(1).tolist()), tuple(flat.std(1, correction=0).tolist()))


# --------------------------------------------------------------------------------------------
# Embedded datasets
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Raw:
    images: torch.Tensor  # float32 N x C x H x W in [0, 1]
    labels: torch.Tensor  # int64 N
    classes: list[str] | None


@cache
def _digits() -> _Raw:
    """scikit-learn's digits: 1797 images, 8x8, counts 0..16 scaled to [0, 1] by /16."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    return _Raw(images, labels, [str(c) for c in bunch.target_names])


def _center_of_mass_shift(frame: torch.Tensor, limit: int) -> torch.Tensor:
    """Translate each ``N x 1 x S x S`` image by whole pixels so that its centre of mass sits at
    the frame's centre, the last step of MNIST's preprocessing.

    Shifts are clipped to ``limit`` pixels; with a zero border at least ``limit`` wide the
    cyclic gather below only ever wraps zeros around, so it equals a true translation.
    """
    n, _, size, _ = frame.shape
    coords = torch.arange(size, dtype=torch.float64)
    mass = frame[:, 0].double()
    total = mass.sum((1, 2)).clamp_min(1e-12)
    rows = (mass.sum(2) * coords).sum(1) / total
    cols = (mass.sum(1) * coords).sum(1) / total
    centre = (size - 1) / 2
    dy = torch.round(centre - rows).clamp(-limit, limit).long()
    dx = torch.round(centre - cols).clamp(-limit, limit).long()
    index = torch.arange(size)
    source_rows = (index.view(1, -1) - dy.view(-1, 1)) % size
    source_cols = (index.view(1, -1) - dx.view(-1, 1)) % size
    batch = torch.arange(n).view(-1, 1, 1)
    shifted = frame[:, 0][batch, source_rows.view(n, size, 1), source_cols.view(n, 1, size)]
    return shifted.unsqueeze(1)


@cache
def _digits28() -> _Raw:
    """The digits in a 28x28 frame, built the way MNIST was built from NIST.

    MNIST's digits were size-normalised to fit a 20x20 box (anti-aliased), then placed in a
    28x28 frame so that their centre of mass sits at the centre (LeCun et al., the MNIST page).
    scikit-learn's 8x8 digits are 4x4 block averages of 32x32 bitmaps that already fill their
    box, so each is upsampled 8 -> 20 and centred by mass the same way.

    Interpolation: bilinear (``align_corners=False``, i.e. each 8x8 value is a sample at its
    cell's centre, which is what a block average is). Bilinear stays within the range of its
    neighbours, so the strokes get MNIST's soft anti-aliased edges without the over- and
    undershoot (ringing) that bicubic produces at the 0 <-> 1 edges that dominate these
    images; nearest would give 2.5-pixel blocks that no MNIST digit has.
    """
    raw = _digits()
    box = torch.nn.functional.interpolate(
        raw.images, size=(20, 20), mode="bilinear", align_corners=False
    ).clamp(0.0, 1.0)
    frame = torch.nn.functional.pad(box, (4, 4, 4, 4))
    images = _center_of_mass_shift(frame, limit=4).float().contiguous()
    return _Raw(images, raw.labels, raw.classes)


@cache
def _faces() -> _Raw:
    """scikit-image's LFW subset: 200 grayscale 25x25 images, 100 faces then 100 non-faces.

    The order is the one ``skimage.data.lfw_subset`` documents ("100 first images are faces and
    subsequent 100 are non-faces"), checked here by eye. Labels: face = 1, non-face = 0. The
    file stores floats in [0, 1], used as they are.
    """
    from skimage.data import lfw_subset

    data = np.asarray(lfw_subset(), dtype=np.float32)
    if data.shape != (200, 25, 25):
        raise RuntimeError(f"Unexpected lfw_subset shape {data.shape}; expected (200, 25, 25).")
    images = torch.from_numpy(np.clip(data, 0.0, 1.0)).unsqueeze(1)
    labels = torch.cat([torch.ones(100, dtype=torch.int64), torch.zeros(100, dtype=torch.int64)])
    return _Raw(images, labels, ["non-face", "face"])


#: Short side of each photograph after downscaling, and the crop grid, for ``"patches"``.
PATCH_SHORT_SIDE = 64
PATCH_SIZE = 32
PATCH_GRID = 8


def _photographs() -> dict[str, np.ndarray]:
    """The colour photographs shipped with scikit-image and scikit-learn (no download)."""
    import skimage.data as skd
    from sklearn.datasets import load_sample_images

    photos = {
        "astronaut": skd.astronaut(),
        "chelsea": skd.chelsea(),
        "coffee": skd.coffee(),
        "rocket": skd.rocket(),
        "hubble_deep_field": skd.hubble_deep_field(),
        "retina": skd.retina(),
        "immunohistochemistry": skd.immunohistochemistry(),
        "motorcycle": skd.stereo_motorcycle()[0],
    }
    sample = load_sample_images()
    for path, image in zip(sample.filenames, sample.images, strict=True):
        photos[Path(path).stem] = image  # "china", "flower"
    return photos


@cache
def _patches() -> _Raw:
    """3x32x32 crops of ten colour photographs, labelled by photograph (CIFAR-10 stand-in).

    Each photograph is first downscaled (box filter, i.e. area averaging, like a coarser
    camera) so that its short side is 64 pixels; a 32x32 crop then spans half of the short
    side and holds object-scale structure (a cat's eye and ear, the rim of a cup, a face) as
    a CIFAR-10 image does, not the near-flat texture a crop of the full-resolution photograph
    would be. From each downscaled photograph an 8x8 grid of evenly spaced crops is taken (64
    per photograph, 640 in all, no randomness: the dataset is the same on every machine and
    the seed only orders it). Crops of one photograph overlap; the fixed train/test split
    therefore has overlapping content across splits.
    """
    from PIL import Image

    crops, labels, classes = [], [], []
    for label, (name, photo) in enumerate(_photographs().items()):
        height, width = photo.shape[:2]
        scale = PATCH_SHORT_SIDE / min(height, width)
        size = (max(PATCH_SIZE, round(width * scale)), max(PATCH_SIZE, round(height * scale)))
        small = np.asarray(Image.fromarray(photo[..., :3]).resize(size, Image.Resampling.BOX))
        ys = np.linspace(0, small.shape[0] - PATCH_SIZE, PATCH_GRID).round().astype(int)
        xs = np.linspace(0, small.shape[1] - PATCH_SIZE, PATCH_GRID).round().astype(int)
        for y in ys:
            for x in xs:
                crops.append(small[y : y + PATCH_SIZE, x : x + PATCH_SIZE])
                labels.append(label)
        classes.append(name)
    array = np.stack(crops).transpose(0, 3, 1, 2)
    images = torch.from_numpy(array.astype(np.float32) / 255.0)
    return _Raw(images, torch.tensor(labels, dtype=torch.int64), classes)


#: Embedded datasets: name -> (builder, description).
EMBEDDED: dict[str, tuple[Callable[[], _Raw], str]] = {
    "digits": (_digits, "scikit-learn digits, 1797 x 1x8x8, 10 classes"),
    "digits28": (_digits28, "scikit-learn digits in an MNIST-like 1x28x28 frame (MNIST stand-in)"),
    "faces": (_faces, "scikit-image LFW subset, 200 x 1x25x25, face=1 / non-face=0"),
    "patches": (_patches, "640 x 3x32x32 crops of 10 photographs (CIFAR-10 stand-in)"),
}

#: torchvision datasets: name -> (torchvision class name, embedded stand-in).
TORCHVISION: dict[str, tuple[str, str]] = {
    "mnist": ("MNIST", "digits28"),
    "fashion-mnist": ("FashionMNIST", "digits28"),
    "cifar10": ("CIFAR10", "patches"),
    "cifar100": ("CIFAR100", "patches"),
}

#: MedMNIST datasets of the CVB paper's Table VI, read from ``root`` or fetched by ``medmnist``.
MEDMNIST: tuple[str, ...] = ("pneumoniamnist", "dermamnist", "retinamnist", "bloodmnist")

_SPLITS = ("test", "train", "all")


def available() -> list[str]:
    """Names ``load`` accepts besides ``.npz`` paths: embedded, torchvision, then MedMNIST."""
    return list(EMBEDDED) + list(TORCHVISION) + list(MEDMNIST)


#: Seed of the fixed permutation behind the embedded datasets' train/test split. Taking every
#: fifth image in stored order instead would give a test split of digits 0 and 5 only, because
#: scikit-learn stores its digits in the cyclic order 0, 1, ..., 9, 0, 1, ...
SPLIT_SEED = 20_261_122


def split_indices(count: int, split: str) -> torch.Tensor:
    """Indices of the embedded ``split`` ("test", "train" or "all") among ``count`` images."""
    if split == "all":
        return torch.arange(count)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_test = (count + 4) // 5
    return order[:n_test] if split == "test" else order[n_test:]


def _embedded_split(raw: _Raw, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    keep = split_indices(len(raw.labels), split)
    return raw.images[keep], raw.labels[keep]


# --------------------------------------------------------------------------------------------
# torchvision datasets
# --------------------------------------------------------------------------------------------


def default_root() -> Path:
    """Where torchvision datasets live: ``$LEAKAGELIB_DATA_ROOT`` or ``~/.cache/leakagelib``."""
    env = os.environ.get("LEAKAGELIB_DATA_ROOT")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "leakagelib"


def _torchvision(
    name: str, split: str, root: str | os.PathLike[str] | None, download: bool
) -> _Raw:
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
    return _Raw(images, labels, [str(c) for c in ds.classes])


# --------------------------------------------------------------------------------------------
# MedMNIST
# --------------------------------------------------------------------------------------------


def _medmnist_hint(name: str, folder: Path) -> str:
    return (
        f"MedMNIST is not embedded: with network access, install the 'medmnist' package and "
        f"load({name!r}, download=True) (on the command line: reproduce ... --download), which "
        f"stores {name}.npz under {folder}; or put that file there yourself (root= or "
        f"$LEAKAGELIB_DATA_ROOT), or pass an .npz in this library's format as --data {name}=PATH."
    )


def _medmnist(name: str, split: str, root: str | os.PathLike[str] | None, download: bool) -> _Raw:
    """A MedMNIST v2 dataset at 28 x 28 (Yang et al. 2023), as the CVB paper's Table VI uses.

    The MedMNIST release file ``{name}.npz`` holds ``{split}_images`` (uint8
    N x H x W, or N x H x W x 3 for colour) and ``{split}_labels`` (N x 1) for
    the splits train, val and test. It is read from ``root`` with
    ``allow_pickle=False``; with ``download=True`` a missing file is fetched
    by the ``medmnist`` package, which writes the same file.
    """
    if split not in ("test", "train"):
        raise ValueError(
            f"MedMNIST dataset {name!r} is loaded as 'test' or 'train', not {split!r}."
        )
    folder = Path(root).expanduser() if root is not None else default_root()
    path = folder / f"{name}.npz"
    hint = _medmnist_hint(name, folder)
    if not path.is_file():
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
            raise RuntimeError(
                f"Could not download {name!r} into {folder}: {error}. {hint}"
            ) from error
    arrays = _read_arrays(
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
    return _Raw(tensor, torch.from_numpy(labels[:, 0].astype(np.int64)), None)


# --------------------------------------------------------------------------------------------
# .npz files
# --------------------------------------------------------------------------------------------


def _read_arrays(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...], needs: str
) -> dict[str, np.ndarray]:
    """The ``required`` (and present ``optional``) arrays of an ``.npz`` archive.

    Read with ``allow_pickle=False``; a missing file, a file that is not an
    archive, a missing key (``needs`` says what the format expects) or an
    unreadable (e.g. pickled object) array raises an error that names it.
    """
    if not path.is_file():
        raise FileNotFoundError(f"No .npz file at {path}.")
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
        raise ValueError(f"{path} is not a readable .npz archive: {error}") from error
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} holds a single array (.npy), not an .npz archive of arrays.")
    with archive:
        missing = [key for key in required if key not in archive.files]
        if missing:
            raise ValueError(
                f"{path} lacks the array(s) {missing}; it holds {sorted(archive.files)}, "
                f"but {needs}."
            )
        keys = [*required, *(k for k in optional if k in archive.files)]
        try:
            return {key: archive[key] for key in keys}
        except (ValueError, zipfile.BadZipFile, OSError) as error:
            raise ValueError(f"{path}: could not read its arrays: {error}") from error


def _npz(path: Path) -> _Raw:
    """Read and validate an ``.npz`` file (``allow_pickle=False``); errors name the problem."""
    arrays = _read_arrays(
        path,
        ("images", "labels"),
        ("classes",),
        "an .npz dataset needs 'images' (uint8 N x C x H x W) and 'labels'",
    )
    images, labels, classes = arrays["images"], arrays["labels"], arrays.get("classes")
    if images.dtype != np.uint8:
        raise ValueError(f"{path}: 'images' must be uint8 (0-255); got dtype {images.dtype}.")
    if images.ndim != 4:
        raise ValueError(
            f"{path}: 'images' must have rank 4 (N x C x H x W); got shape {images.shape}."
        )
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"{path}: 'labels' must be a 1-D integer array; got dtype {labels.dtype}, "
            f"shape {labels.shape}."
        )
    if labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{path}: {images.shape[0]} images but {labels.shape[0]} labels; counts must match."
        )
    if labels.size and labels.min() < 0:
        raise ValueError(f"{path}: labels must be non-negative; found {labels.min()}.")
    names = None
    if classes is not None:
        if classes.ndim != 1 or classes.dtype.kind not in "US":
            raise ValueError(
                f"{path}: 'classes' must be a 1-D array of strings; got dtype {classes.dtype}, "
                f"shape {classes.shape}."
            )
        if labels.size and labels.max() >= len(classes):
            raise ValueError(
                f"{path}: label {labels.max()} has no name among the {len(classes)} classes."
            )
        names = [str(c) for c in classes.tolist()]
    tensor = torch.from_numpy(images.astype(np.float32) / 255.0)
    return _Raw(tensor, torch.from_numpy(labels.astype(np.int64)), names)


# --------------------------------------------------------------------------------------------
# load
# --------------------------------------------------------------------------------------------


def _select(
    images: torch.Tensor, labels: torch.Tensor, n: int | None, seed: int, shuffle: bool, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    total = len(labels)
    if n is None:
        n = total
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be a positive integer or None; got {n!r}.")
    n = int(n)
    if n > total:
        raise ValueError(f"Asked for n={n} images but {name!r} (this split) holds only {total}.")
    if shuffle:
        order = torch.randperm(total, generator=torch.Generator().manual_seed(int(seed)))[:n]
    else:
        order = torch.arange(n)
    return images[order].contiguous(), labels[order].contiguous()


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
) -> Dataset:
    """Load ``n`` images of a dataset with its labels and normaliser.

    Args:
        spec: an embedded name (``digits``, ``digits28``, ``faces``, ``patches``), a torchvision
            name (``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100``), a MedMNIST name
            (``pneumoniamnist``, ``dermamnist``, ``retinamnist``, ``bloodmnist``) or a path
            ending in ``.npz``.
        n: how many images (``None``: all of the split); more than available raises.
        seed: seed of the permutation when ``shuffle`` is true.
        shuffle: true -> a seeded random permutation, then the first ``n``; false -> the first
            ``n`` in file order (the papers' "first 100 test images").
        split: ``"test"`` or ``"train"`` (embedded datasets also ``"all"``; ignored for .npz).
        root: folder of torchvision and MedMNIST datasets (default ``$LEAKAGELIB_DATA_ROOT`` or
            ``~/.cache/leakagelib``).
        download: let torchvision (or the ``medmnist`` package) download a missing dataset
            (needs network access).
        constants: ``"bayes"``, ``"ig"`` or ``"none"`` (see the module docstring).
        constants_of: the logical dataset whose constants apply (``"mnist"``, ``"cifar10"``,
            ...); defaults to the torchvision name itself, and for embedded data and .npz files
            to measured statistics.

    Raises:
        KeyError: unknown spec or constants. ValueError: bad ``n``/``split`` or a malformed
        .npz. FileNotFoundError: a missing .npz, torchvision or MedMNIST dataset (offline).
    """
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}; got {split!r}.")
    text = os.fspath(spec)
    if text.endswith(".npz"):
        raw = _npz(Path(text).expanduser())
        images, labels, name = raw.images, raw.labels, text
        measured_on: Callable[[], torch.Tensor] = lambda: raw.images  # noqa: E731
    elif text in EMBEDDED:
        raw = EMBEDDED[text][0]()
        images, labels = _embedded_split(raw, split)
        name, measured_on = text, lambda: raw.images
    elif text in TORCHVISION:
        if constants_of is None:
            constants_of = text
        raw = _torchvision(text, split, root, download)
        images, labels, name, measured_on = raw.images, raw.labels, text, lambda: raw.images
    elif text in MEDMNIST:
        raw = _medmnist(text, split, root, download)
        images, labels, name = raw.images, raw.labels, text
        # no published constants: measured on the training split, whatever split is loaded
        measured_on = lambda: _medmnist(text, "train", root, False).images  # noqa: E731
    else:
        raise KeyError(
            f"Unknown dataset {text!r}. Known names: {available()}; anything else must be a "
            f"path ending in .npz."
        )
    normalizer = _normalizer_for(constants, constants_of, lambda: _measured(measured_on()))
    images, labels = _select(images, labels, n, seed, shuffle, name)
    return Dataset(images, labels, normalizer, name, raw.classes)
