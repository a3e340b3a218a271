"""The containers every loader returns, the fixed train/test split, and the choice of ``n`` images.

:class:`Dataset` is what :func:`leakagelib.data.load` hands to every chapter; :class:`Raw` is
what a source (embedded, torchvision, MedMNIST) yields before ``n`` images are selected.
:func:`selection` is shared by all sources, ``.npz`` files included, so that the same ``n``,
``seed`` and ``shuffle`` pick the same images whichever way a dataset is read; :func:`pick`
applies it to a source held in memory.

Sources without an official split -- the embedded datasets and ``.npz`` files -- are split by
:func:`split_indices` (:data:`SPLIT_RULE`), so that an experiment that trains on one part and
attacks images of the other never attacks an image it trained on. :func:`formula` writes down
which images a :class:`Dataset` holds, for the records of :mod:`leakagelib.experiments`.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .normalization import Normalizer


@dataclass
class Dataset:
    """Images, labels and normaliser of one loaded dataset.

    Unpacks as ``images, labels, normalizer = ds``. ``images`` is float32 ``N x C x H x W`` in
    [0, 1], ``labels`` int64 of shape ``N``, ``classes`` the class names (index = label) or
    ``None`` when the source has none, ``name`` the spec it was loaded from.

    ``indices`` says which images these are: their positions (int64, in the order returned) in
    the source's stored order -- the ``.npz`` file, the embedded dataset (all splits), or the
    loaded torchvision/MedMNIST split -- and ``selection`` the same as a :func:`formula`, e.g.
    ``"split_indices(5000, 'test')[randperm(1000, seed=0)[:10]]"``. The experiment records
    report them (:mod:`leakagelib.experiments.registry`). ``None`` and ``""`` for a dataset
    built by hand.
    """

    images: torch.Tensor
    labels: torch.Tensor
    normalizer: Normalizer
    name: str
    classes: list[str] | None = None
    indices: torch.Tensor | None = None
    selection: str = ""

    def __iter__(self) -> Iterator[object]:
        return iter((self.images, self.labels, self.normalizer))

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class Raw:
    """Every image of one source (or split), before ``n`` of them are selected."""

    images: torch.Tensor  # float32 N x C x H x W in [0, 1]
    labels: torch.Tensor  # int64 N
    classes: list[str] | None


#: Seed of the fixed permutation behind the train/test split of the embedded datasets and of
#: ``.npz`` files. Taking every fifth image in stored order instead would give a test split of
#: digits 0 and 5 only, because scikit-learn stores its digits in the cyclic order 0, 1, ..., 9.
SPLIT_SEED = 20_261_122

#: :func:`split_indices` in words, as the experiment records quote it.
SPLIT_RULE = (
    f"split_indices(N, part): torch.randperm(N) drawn with a generator seeded {SPLIT_SEED} "
    f"(leakagelib.data.SPLIT_SEED); its first ceil(N/5) entries are part 'test', the rest part "
    f"'train' (in that order); part 'all' is 0..N-1"
)


def split_indices(count: int, split: str) -> torch.Tensor:
    """Indices of ``split`` ("test", "train" or "all") among ``count`` images (:data:`SPLIT_RULE`).

    The same ``count`` always gives the same parts, whatever ``n`` or ``seed`` a caller then
    selects with; "test" and "train" are disjoint and together hold every index. "test" comes
    in the permutation's order, so that its first images mix the classes even when the source
    stores them by class.
    """
    if split == "all":
        return torch.arange(count)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_test = (count + 4) // 5
    return order[:n_test] if split == "test" else order[n_test:]


def selection(
    total: int, n: int | None, seed: int, shuffle: bool, name: str, hint: str = ""
) -> torch.Tensor:
    """Indices of the ``n`` images to return among ``total``, in the order they are returned.

    ``shuffle`` true: the first ``n`` entries of a permutation seeded with ``seed``; false: the
    first ``n`` images in stored order. ``n=None`` means all. Only ``total`` is needed, so an
    ``.npz`` file's images can be chosen from its header before any of them is read. ``hint``
    ends the error for too large an ``n`` (e.g. how to load more).
    """
    if total == 0:
        raise ValueError(f"{name!r} (this split) holds no images.{hint}")
    if n is None:
        n = total
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be a positive integer or None; got {n!r}.")
    n = int(n)
    if n > total:
        raise ValueError(
            f"Asked for n={n} images but {name!r} (this split) holds only {total}.{hint}"
        )
    if shuffle:
        return torch.randperm(total, generator=torch.Generator().manual_seed(int(seed)))[:n]
    return torch.arange(n)


def pick(
    raw: Raw, part: torch.Tensor, source: str, n: int | None, seed: int, shuffle: bool, name: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """Images, labels, positions in ``raw`` and :func:`formula` of the ``n`` images that
    :func:`selection` picks from ``part`` (positions in ``raw``; ``source`` names it)."""
    indices = part[selection(len(part), n, seed, shuffle, name)]
    images, labels = raw.images[indices].contiguous(), raw.labels[indices].contiguous()
    return images, labels, indices, formula(source, len(part), n, seed, shuffle)


def formula(source: str, total: int, n: int | None, seed: int, shuffle: bool) -> str:
    """Which images :func:`selection` picks from ``source`` (an expression of ``total`` indices).

    E.g. ``formula("split_indices(5000, 'test')", 1000, 10, 0, True)`` is
    ``"split_indices(5000, 'test')[randperm(1000, seed=0)[:10]]"``, where ``randperm(k,
    seed=s)`` is ``torch.randperm(k)`` drawn with a generator seeded ``s``; without ``shuffle``
    it is ``"split_indices(5000, 'test')[:10]"``.
    """
    count = total if n is None else int(n)
    head = "" if count == total else f"[:{count}]"
    return f"{source}[randperm({total}, seed={int(seed)}){head}]" if shuffle else source + head
