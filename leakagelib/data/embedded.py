"""The embedded datasets: no network, built from images shipped inside installed packages.

``"digits"`` (scikit-learn's 8x8 handwritten digits), ``"digits28"`` (the same digits placed in
a 28x28 MNIST-like frame, the CI stand-in for MNIST), ``"faces"`` (scikit-image's 25x25 LFW
subset, face vs non-face) and ``"patches"`` (3x32x32 crops of colour photographs, the CI
stand-in for CIFAR-10). Every chapter that runs at ``ci`` scale attacks these images.

They have no official train/test split; :func:`~leakagelib.data.dataset.split_indices` fixes
one that never changes (the same rule splits ``.npz`` files): a permutation drawn once with the
fixed seed :data:`~leakagelib.data.dataset.SPLIT_SEED` orders the images, its first fifth is
``"test"`` (in that shuffled order, so the first ``n`` test images mix the classes, as MNIST's
and CIFAR-10's test sets do), the rest ``"train"``; ``"all"`` returns every image in stored
order.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import torch

from .dataset import Raw


@cache
def _digits() -> Raw:
    """scikit-learn's digits: 1797 images, 8x8, counts 0..16 scaled to [0, 1] by /16."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    return Raw(images, labels, [str(c) for c in bunch.target_names])


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
def _digits28() -> Raw:
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
    return Raw(images, raw.labels, raw.classes)


@cache
def _faces() -> Raw:
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
    return Raw(images, labels, ["non-face", "face"])


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
def _patches() -> Raw:
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
    return Raw(images, torch.tensor(labels, dtype=torch.int64), classes)


#: Embedded datasets: name -> (builder, description).
EMBEDDED: dict[str, tuple[Callable[[], Raw], str]] = {
    "digits": (_digits, "scikit-learn digits, 1797 x 1x8x8, 10 classes"),
    "digits28": (_digits28, "scikit-learn digits in an MNIST-like 1x28x28 frame (MNIST stand-in)"),
    "faces": (_faces, "scikit-image LFW subset, 200 x 1x25x25, face=1 / non-face=0"),
    "patches": (_patches, "640 x 3x32x32 crops of 10 photographs (CIFAR-10 stand-in)"),
}
