"""How the papers' networks see images: :class:`Normalizer` and the constants each paper's code uses.

Attacks work in normalised space and de-normalise before the metrics
(:mod:`leakagelib.metrics`), as the papers' code does.

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

Data without a table entry is normalised with statistics measured on its own images
(:func:`measured`, or :func:`measured_from_counts` for ``.npz`` files, whose uint8 pixels are
counted without converting the whole file to floats).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


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
        """Mean and std shaped ``C x 1 x 1`` on ``x``'s device and dtype, after checking ``x``."""
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


def normalizer_for(
    constants: str, constants_of: str | None, measured: Callable[[], Normalizer]
) -> Normalizer:
    """Pick the normaliser: identity, a table entry, or (``constants_of=None``) ``measured()``."""
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


def measured(images: torch.Tensor) -> Normalizer:
    """Per-channel mean and (population) std over all pixels of ``images``."""
    flat = images.transpose(0, 1).reshape(images.shape[1], -1).double()
    return Normalizer(tuple(flat.mean(1).tolist()), tuple(flat.std(1, correction=0).tolist()))


def measured_from_counts(counts: np.ndarray) -> Normalizer:
    """Per-channel mean and (population) std of uint8 images from their value histogram.

    ``counts`` is ``C x 256``: how often each byte value occurs in each channel. The
    statistics are those of the float32 images ``value / 255`` that :func:`measured` would
    see (equal up to the rounding of the sums), computed without a float copy of the images.
    """
    values = (np.arange(256, dtype=np.float32) / 255.0).astype(np.float64)
    counts = counts.astype(np.float64)
    total = counts.sum(1)
    mean = counts @ values / total
    var = (counts * (values[None, :] - mean[:, None]) ** 2).sum(1) / total
    return Normalizer(tuple(mean.tolist()), tuple(np.sqrt(var).tolist()))
