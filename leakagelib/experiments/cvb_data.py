"""The CVB experiments' data: the federation's training pool, victims from client 0, accuracy.

The CVB paper trains with FedAvg over IID clients (§V-A) and attacks one
client: "a victim dataset composed of 128 images is randomly sampled from
the training data of one client for each dataset" (§V-B). So every CVB
experiment builds one pool of training images (:func:`training_pool`: the
training split brought to the authors' 3×32×32, the first ``n_train`` at
ci), splits it over ``clients`` exactly as :func:`leakagelib.fedavg.federated_averaging`
does with the run's seed (:func:`leakagelib.fedavg.client_shards`), draws
the victims from client 0's training share (:func:`load_victims`; as many
as :func:`victim_count` says, checked before any attack by
:func:`check_victims`) and trains on the same pool (:func:`fedavg_accuracy`).
:func:`victim_notes` says in the
record's ``data`` field which images were attacked. The settings come from
``ctx.config`` (:data:`~.cvb_common.TRAINING`'s ``clients``,
``val_fraction``, ``n_train``...). Re-exported by :mod:`.cvb_common`; run by
the chapter "Variational bottlenecks".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import Normalizer
from ..defenses import GradientDefense
from ..fedavg import client_shards, federated_averaging
from .registry import Context

__all__ = [
    "Pool",
    "Victims",
    "check_victims",
    "fedavg_accuracy",
    "load_victims",
    "to_rgb32",
    "training_pool",
    "victim_count",
    "victim_fields",
    "victim_notes",
    "victim_positions",
]


class Victims(NamedTuple):
    """The attacked images (N × 3 × 32 × 32 in [0, 1]), their labels and the normaliser."""

    images: Tensor
    labels: Tensor
    norm: Normalizer


class Pool(NamedTuple):
    """The federation's training images (3×32×32 in [0, 1]), labels, normaliser, source indices.

    ``indices[i]`` is the position of image ``i`` in the dataset's stored
    order (:attr:`leakagelib.data.Dataset.indices`), or ``i`` itself when the
    source gives none.
    """

    images: Tensor
    labels: Tensor
    norm: Normalizer
    indices: Tensor


def to_rgb32(images: Tensor, norm: Normalizer) -> tuple[Tensor, Normalizer]:
    """Images brought to the authors' 3×32×32: resized to 32×32, a grey channel repeated."""
    if images.shape[-2:] != (32, 32):
        images = F.interpolate(images, size=(32, 32), mode="bilinear", align_corners=False).clamp(
            0, 1
        )
    if images.shape[1] == 1:
        images = images.repeat(1, 3, 1, 1)
        norm = Normalizer(mean=norm.mean * 3, std=norm.std * 3)
    return images, norm


def training_pool(ctx: Context, logical: str) -> Pool:
    """The training images of ``logical`` that the run's FedAvg splits over its clients.

    The training split (in the order ``ctx.dataset`` loads it with the run's
    seed) as the authors feed it (:func:`to_rgb32`), cut to its first
    ``ctx.config.n_train`` images unless that is ``None``.
    """
    ds = ctx.dataset(logical, split="train")
    images, norm = to_rgb32(ds.images, ds.normalizer)
    indices = ds.indices if ds.indices is not None else torch.arange(len(ds))
    n = ctx.config.n_train
    keep = slice(None) if n is None else slice(0, n)
    return Pool(images[keep], ds.labels[keep], norm, indices[keep])


def victim_count(ctx: Context, logical: str) -> int:
    """How many victims of ``logical`` a run attacks: its ``victims_at`` entry, else ``victims``.

    ``victims_at`` (:data:`~.cvb_common.ATTACK`, empty as registered) serves a
    dataset whose client 0 holds fewer training images than the paper's 128:
    the 500-image CIFAR-10 sample gives client 0 of 10 only 36, so Table III
    runs there with ``--set 'victims_at={"cifar10": 32}'`` and its other
    datasets keep ``victims``. A record made so lists it in ``settings_changed``
    and its rows say their ``n`` (:func:`victim_fields`).
    """
    return int((ctx.config.get("victims_at") or {}).get(logical, ctx.config.victims))


def victim_fields(ctx: Context, logical: str) -> dict[str, int]:
    """``{"n": count}`` for the rows of a dataset whose count is not the run's ``victims``, else ``{}``.

    So :func:`leakagelib.verdicts.judge` gives such a row the interval of its
    own count (:func:`leakagelib.verdicts.images_per_row` reads ``victims``).
    """
    count = victim_count(ctx, logical)
    return {} if count == ctx.config.victims else {"n": count}


def check_victims(ctx: Context, datasets: Iterable[str]) -> None:
    """Raise before any attack if ``victims_at`` names another dataset or a count cannot be drawn.

    Each count must be a positive integer that client 0's training share of
    its dataset holds (:func:`victim_positions` raises, naming the share). An
    experiment whose victims load lazily, one dataset at a time, calls this
    first, so that a bad count stops the run before hours of other units.
    """
    datasets = list(datasets)
    at = ctx.config.get("victims_at") or {}
    unknown = sorted(set(at) - set(datasets))
    if unknown:
        raise ValueError(f"victims_at names {unknown}, which this run does not use ({datasets})")
    for logical, count in at.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"victims of {logical}: {count!r}; it must be a positive integer")
    for logical in datasets:
        victim_positions(ctx, training_pool(ctx, logical), victim_count(ctx, logical),
                         logical=logical)  # fmt: skip


def victim_positions(ctx: Context, pool: Pool, n: int, *, logical: str = "") -> Tensor:
    """Positions in ``pool`` of ``n`` victims: a seeded draw from client 0's training share.

    Client 0's share is the one :func:`leakagelib.fedavg.client_shards` gives
    with the run's ``clients``, ``val_fraction`` and seed (that of
    :func:`fedavg_accuracy`'s training); its validation images are never
    drawn. The draw is ``randperm`` with the run's seed. Too few images in the
    share raise, naming ``logical`` and the ``--set`` that draws fewer.
    """
    s = ctx.config
    train0, _ = client_shards(len(pool.labels), s.clients, val_fraction=s.val_fraction,
                              seed=ctx.seed)[0]  # fmt: skip
    if n > len(train0):
        name = logical or "the dataset"
        raise ValueError(
            f"asked for {n} victims of {name}, but client 0 trains on only {len(train0)} of "
            f"its images (n_train={s.n_train}, clients={s.clients}); draw fewer with "
            f"--set 'victims_at={{\"{name}\": {min(len(train0), 32)}}}' (or --set victims=N)"
        )
    order = torch.randperm(len(train0), generator=torch.Generator().manual_seed(ctx.seed))
    return train0[order[:n]]


def load_victims(ctx: Context, logical: str, n: int | None = None) -> Victims:
    """``n`` training images of client 0 of ``logical`` (:func:`victim_positions`), 3×32×32.

    ``n`` defaults to the run's count for ``logical`` (:func:`victim_count`).
    """
    n = victim_count(ctx, logical) if n is None else n
    pool = training_pool(ctx, logical)
    chosen = victim_positions(ctx, pool, n, logical=logical)
    return Victims(pool.images[chosen], pool.labels[chosen], pool.norm)


def victim_notes(ctx: Context, datasets: Iterable[str]) -> dict[str, str]:
    """What the record's ``data`` field says of each dataset's victims (:func:`load_victims`).

    ``{logical: "SPEC; victims: ..."}``: the spec that stood for it, the
    rule that drew the victims, and their indices in the dataset's stored
    order (for an ``.npz`` the file's; compare the ``train`` entry of an
    overridden dataset's record).
    """
    s, notes = ctx.config, {}
    for logical in datasets:
        pool, n = training_pool(ctx, logical), victim_count(ctx, logical)
        chosen = pool.indices[victim_positions(ctx, pool, n, logical=logical)].tolist()
        notes[logical] = (
            f"{ctx.resolve(logical)}; victims: {n} of the training images of client 0 of "
            f"{s.clients} (FedAvg's IID split of {len(pool.labels)} training images with "
            f"validation share {s.val_fraction}, seed {ctx.seed}), drawn with "
            f"randperm(seed={ctx.seed}); their indices in the stored order: {chosen}"
        )
    return notes


def fedavg_accuracy(
    ctx: Context, model: nn.Module, logical: str, *, defense: GradientDefense | None = None
) -> float:
    """Test accuracy of FedAvg training of ``model`` on ``logical``'s pool, at the best round.

    :func:`leakagelib.fedavg.federated_averaging` with ``ctx.config``'s
    :data:`~.cvb_common.TRAINING` values and the run's seed, on
    :func:`training_pool`; the accuracy of the round with the lowest
    validation loss, as the authors report it (:attr:`leakagelib.fedavg.FLResult.best`).
    In a command-line run the training saves itself every few minutes and resumes
    (:meth:`~leakagelib.experiments.Context.checkpoint`).
    """
    s, device = ctx.config, ctx.device
    pool = training_pool(ctx, logical)
    xt, yt, norm = ctx.dataset(logical, split="test")
    xt, _ = to_rgb32(xt, norm)
    result = federated_averaging(
        model, pool.norm.normalize(pool.images).to(device), pool.labels.to(device),
        rounds=s.rounds, clients=s.clients, patience=s.patience, batch_size=s.batch_size,
        val_fraction=s.val_fraction, test=(pool.norm.normalize(xt).to(device), yt.to(device)),
        defense=defense, seed=ctx.seed, checkpoint=ctx.checkpoint(),
    )  # fmt: skip
    return float(result.best["test_accuracy"]) if result.history else float("nan")


def with_victims(
    ctx: Context, rows: list[dict[str, Any]], datasets: Iterable[str], **notes: str
) -> dict[str, Any]:
    """An experiment's return value: ``rows`` and the record's notes on the victims of ``datasets``.

    ``notes`` (logical name → text) are added as they are (Table VI's skipped datasets).
    """
    return {"rows": rows, "data": {**victim_notes(ctx, datasets), **notes}}
