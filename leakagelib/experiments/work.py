"""What an experiment's run will compute, counted before it runs (for ``campaign``'s estimates).

An experiment declares its work on its registration,
``@experiment(..., work=fn)``: ``fn(ctx)`` returns, for every unit its run
will compute (in the order of :meth:`~leakagelib.experiments.Context.units`;
an experiment that is not split into units is one unit), the :class:`Load` s
that dominate that unit's time. A load is so many sequential steps, each on
so many images, of one *kind* on one model (:class:`Net`):

* ``"attack"``: one evaluation of a gradient-matching objective and its
  gradient with respect to the input (one step of Adam; L-BFGS makes up to
  :data:`LBFGS_EVALUATIONS` of them per step, and is counted at that maximum):
  Inverting Gradients' cosine on undefended updates unless the load names its
  :class:`Objective` (the Bayes attack's pruned likelihood costs up to twice as
  much per step);
* ``"train"``: one optimiser step of training on a batch;
* ``"forward"``: one evaluation pass (accuracy, validation loss);
* ``"solve"``: one R-GAP closed-form solve per image (``images`` solves);
* ``"diagnose"``: the same with R-GAP's diagnostics (``diagnostics=True``:
  each layer's exact rank and condition number, which take several times
  the solve itself; Table 2's condition numbers).

The counts come from ``ctx.config`` and the sizes of the data (:func:`split_size`);
nothing is trained or attacked. :mod:`.estimate` turns them into seconds with
step times probed on the device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from .. import data as _data

if TYPE_CHECKING:
    from ..attacks import Attack
    from ..defenses import GradientDefense
    from .registry import Context

__all__ = [
    "KINDS",
    "LBFGS_EVALUATIONS",
    "Load",
    "Net",
    "Objective",
    "WorkFn",
    "evaluation_load",
    "image_shape",
    "split_size",
]

#: The kinds of step a :class:`Load` counts (module docstring).
KINDS = ("attack", "train", "forward", "solve", "diagnose")

#: Objective evaluations counted per L-BFGS step: the ``lbfgs_iterations`` default of
#: :class:`leakagelib.attacks.AttackConfig` (20 inner iterations; it may stop earlier).
LBFGS_EVALUATIONS = 20

#: Images per evaluation pass (:func:`leakagelib.fl.evaluate`'s batch).
EVALUATION_BATCH = 512

#: Training and test split sizes of the datasets the paper-scale runs load
#: (torchvision; MedMNIST v2 at 28×28, whose validation split is not used).
SPLIT_SIZES: dict[str, dict[str, int]] = {
    "mnist": {"train": 60_000, "test": 10_000},
    "fashion-mnist": {"train": 60_000, "test": 10_000},
    "cifar10": {"train": 50_000, "test": 10_000},
    "cifar100": {"train": 50_000, "test": 10_000},
    "pneumoniamnist": {"train": 4_708, "test": 624},
    "dermamnist": {"train": 7_007, "test": 2_005},
    "retinamnist": {"train": 1_080, "test": 400},
    "bloodmnist": {"train": 11_959, "test": 3_421},
}


@dataclass(frozen=True)
class Net:
    """A model the probes can build: ``key`` names it in the plan, ``build()`` makes it.

    For ``"attack"``, ``"train"`` and ``"forward"`` loads ``build()`` returns
    a classifier of ``classes`` outputs taking ``in_shape`` inputs (a model of
    the same cost as the experiment's: a one-logit R-GAP network is probed
    with ten); for ``"solve"`` loads the one-logit float64 network R-GAP attacks.
    """

    key: str
    build: Callable[[], nn.Module] = field(compare=False, repr=False)
    in_shape: tuple[int, ...]
    classes: int = 10


@dataclass(frozen=True)
class Objective:
    """What an ``"attack"`` load's steps evaluate, where it is not Inverting Gradients' cosine.

    ``key`` names it in the plan (and keys the probes' cache); ``defense()``
    makes the defense whose updates are attacked (``None``: the plain
    gradient), and ``attack(defense)`` the attack, once the defense has
    shared the probe's updates (a pruning defense draws its mask then). The
    probe runs the attack's likelihood and prior with its own step count,
    one restart and one Monte-Carlo sample (the load's images already count
    those).
    """

    key: str
    attack: Callable[[GradientDefense | None], Attack] = field(compare=False, repr=False)
    defense: Callable[[], GradientDefense] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Load:
    """``steps`` sequential steps of ``kind`` (:data:`KINDS`), each on ``images`` images of ``net``
    (an attack's steps evaluating ``objective``, default Inverting Gradients' cosine)."""

    net: Net
    kind: str
    images: int
    steps: int = 1
    objective: Objective | None = None

    @property
    def label(self) -> str:
        """The model as the plan names it, with the objective where the load names one."""
        return self.net.key if self.objective is None else f"{self.net.key}, {self.objective.key}"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.images < 1 or self.steps < 0:
            raise ValueError(
                f"a load needs images >= 1 and steps >= 0, got images={self.images}, "
                f"steps={self.steps}"
            )
        if self.objective is not None and self.kind != "attack":
            raise ValueError(
                f"only an attack load evaluates an objective, not a {self.kind!r} load"
            )


#: A registration's work declaration: the loads of each unit of a run in ``ctx``.
WorkFn = Callable[["Context"], list[list[Load]]]


@cache
def _shape(spec: str) -> tuple[int, ...]:
    """``N × C × H × W`` of an embedded dataset or an ``.npz`` file (its header only)."""
    if spec in _data.EMBEDDED:
        return tuple(_data.EMBEDDED[spec][0]().images.shape)
    from ..data.npz import NpzArchive

    with NpzArchive(Path(spec).expanduser()) as archive:
        return archive.headers(("images",), (), "an .npz dataset holds 'images'")["images"].shape


def split_size(ctx: Context, logical: str, split: str, stand_in: str | None = None) -> int:
    """Images in ``split`` ("train" or "test") of what stands for ``logical`` in a run in ``ctx``.

    Published sizes for the datasets themselves (:data:`SPLIT_SIZES`), the
    split rule of :func:`leakagelib.data.split_indices` for embedded data and
    ``.npz`` files (read header-first); nothing is downloaded. ``stand_in`` as
    in :meth:`~leakagelib.experiments.Context.resolve`.
    """
    spec = ctx.resolve(logical, stand_in)
    if spec in SPLIT_SIZES:
        return SPLIT_SIZES[spec][split]
    return len(_data.split_indices(_shape(spec)[0], split))


def image_shape(ctx: Context, logical: str, stand_in: str | None = None) -> tuple[int, ...]:
    """``C × H × W`` of the images that stand for ``logical`` in a run in ``ctx``.

    The published format of a torchvision or MedMNIST dataset
    (:data:`leakagelib.data.FORMATS`), the images of embedded data, an
    ``.npz`` file's header; nothing is downloaded. ``stand_in`` as in
    :meth:`~leakagelib.experiments.Context.resolve`.
    """
    spec = ctx.resolve(logical, stand_in)
    if spec in _data.FORMATS:
        fmt = _data.FORMATS[spec]
        return (fmt.channels, *fmt.size)
    return tuple(_shape(spec)[1:])


def evaluation_load(net: Net, images: int, passes: int = 1) -> Load:
    """``passes`` evaluation passes over ``images`` images, in :data:`EVALUATION_BATCH` batches."""
    batch = min(images, EVALUATION_BATCH)
    return Load(net, "forward", batch, passes * math.ceil(images / batch))
