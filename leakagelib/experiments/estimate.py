"""How long an experiment will take on this device, estimated before it starts (``campaign``'s plan).

The experiment's declared work (:mod:`.work`: per unit, so many steps of a
kind on so many images of a model) times the seconds such a step takes here,
which a *probe* measures (:func:`step_seconds`): a few real steps on random
images of that model, after one warm-up step, until :data:`PROBE_SECONDS`
have passed (at least :data:`PROBE_MIN_STEPS`). An attack step is a step of
the library's own Inverting Gradients loop
(:meth:`~leakagelib.experiments.Case.attack`), or of the attack the load's
:class:`~.work.Objective` builds, on updates through its defense (the Bayes
paper's Tables 2 and 5 and Fig. 7), a training step one Adam step
on the cross-entropy, a forward step an evaluation pass, a solve one R-GAP
solve of one image (a model's first solve timed apart, see :func:`_solves`).
A step is probed at the load's batch up to :data:`PROBE_CAPS`; beyond, its
time is extrapolated linearly from the two largest batches probed: two
images and the first cap, and an attack step also at
:data:`~leakagelib.attacks.programs.CPU_PROGRAM_ATTACKS` where that step,
extrapolated, stays under :data:`PROBE_STEP_LIMIT` (larger batches usually
run more efficiently, so this errs long; a probe of a program's size also
keeps the timing noise of two small probes from being multiplied up to
Table 2's stages of 5,400 attacks). Probes are cached per
(model, kind, batch) in an :class:`Estimator`, so a campaign probes each
model once: about a minute and a half for every CVB and R-GAP experiment at paper
scale on the project's busy 2-core CPU, most of it R-GAP's rank-deficient
networks and the ResNet-18 and ViT of CVB's Table V.

It is an estimate: L-BFGS counts its maximum of evaluations per step,
training all its rounds (early stopping may end it sooner), DP-SGD's
per-sample steps count as plain ones, and what no load names (loading
data, scoring) is left out. Used by ``python -m leakagelib campaign``
(:mod:`leakagelib.cli`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F

from .. import fl
from ..attacks.programs import CPU_PROGRAM_ATTACKS
from .registry import Context, Experiment
from .work import Load, Net, Objective

__all__ = ["Estimate", "Estimator", "format_duration", "step_seconds"]

#: Seconds a probe spends timing steps of one (model, kind, batch), after its warm-up step.
PROBE_SECONDS = 0.3
#: Fewest timed steps of a probe (one suffices for a step longer than :data:`PROBE_SECONDS`).
PROBE_MIN_STEPS = 1
#: Most timed steps of a probe.
PROBE_MAX_STEPS = 50
#: Batches probed per kind beyond two images, smallest first; larger loads are extrapolated
#: (module docstring). An attack's second is the search's program on a CPU: beyond it, a stage
#: runs as more programs of that size (:mod:`leakagelib.attacks.programs`).
PROBE_CAPS = {"attack": (8, CPU_PROGRAM_ATTACKS), "train": (16,), "forward": (64,)}
#: Seconds a step at a further cap may take, extrapolated, for the probe to time it.
PROBE_STEP_LIMIT = 1.0


class _Enough(Exception):
    """Raised by :class:`_Stopwatch` to end a probe's loop."""


class _Stopwatch:
    """Marks the end of every step; raises :class:`_Enough` once it has timed enough of them."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.marks: list[float] = []

    def tick(self, *_: object) -> None:
        """End of a step (the first one is the warm-up, which is not timed)."""
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        self.marks.append(time.perf_counter())
        timed = len(self.marks) - 1
        spent = self.marks[-1] - self.marks[0]
        if timed >= PROBE_MAX_STEPS or (timed >= PROBE_MIN_STEPS and spent >= PROBE_SECONDS):
            raise _Enough

    def run(self, loop: Callable[[], None]) -> float:
        """Run ``loop`` (which calls :meth:`tick` after each step) until enough; seconds per step."""
        try:
            loop()
        except _Enough:
            return (self.marks[-1] - self.marks[0]) / (len(self.marks) - 1)
        raise RuntimeError("a probe's loop ended before it had timed enough steps")


def _inputs(
    net: Net, batch: int, device: str
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """``net`` built on ``device``, ``batch`` random images in [0, 1] and random labels."""
    gen = torch.Generator().manual_seed(0)
    model = net.build().to(device)
    images = torch.rand((batch, *net.in_shape), generator=gen)
    labels = torch.randint(net.classes, (batch,), generator=gen)
    return model, images, labels


def _attack_step(net: Net, batch: int, device: str, objective: Objective | None = None) -> float:
    """Seconds per step of Inverting Gradients (or ``objective``'s attack, through its defense)
    on ``batch`` single-image updates of ``net``."""
    from ..attacks import preset
    from ..data import Normalizer
    from .case import build_case

    defense = objective.defense() if objective is not None and objective.defense else None
    model, images, labels = _inputs(net, batch, device)
    case = build_case(model, images, labels, Normalizer.identity(), defense=defense, device=device)
    attack = preset("inverting-gradients") if objective is None else objective.attack(defense)
    attack = attack.with_config(steps=PROBE_MAX_STEPS + 2, restarts=1, mc_samples=1)
    watch = _Stopwatch(device)
    gen = torch.Generator().manual_seed(0)
    return watch.run(lambda: case.attack(attack, generator=gen, callback=watch.tick))


def _train_step(net: Net, batch: int, device: str) -> float:
    """Seconds per Adam step on the cross-entropy of a ``batch`` of images, ``net`` in train mode."""
    model, images, labels = _inputs(net, batch, device)
    images, labels = images.to(device), labels.to(device)
    opt = fl.adam(model.parameters(), 1e-3)
    watch = _Stopwatch(device)

    def loop() -> None:
        model.train()
        while True:
            opt.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            opt.step()
            watch.tick()

    return watch.run(loop)


def _forward_step(net: Net, batch: int, device: str) -> float:
    """Seconds per evaluation pass over a ``batch`` of images, ``net`` in eval mode."""
    model, images, _ = _inputs(net, batch, device)
    images = images.to(device)
    watch = _Stopwatch(device)

    def loop() -> None:
        model.eval()
        with torch.no_grad():
            while True:
                model(images)
                watch.tick()

    return watch.run(loop)


def _solves(net: Net, images: int, device: str, *, diagnostics: bool = False) -> float:
    """Seconds of R-GAP solving ``images`` random images one by one on ``net`` (one logit, float64).

    ``diagnostics`` as :func:`leakagelib.rgap.rgap`'s (a ``"diagnose"`` load).

    The first solve also builds the sparsity patterns R-GAP caches per layer
    shape; when it is short (under ten :data:`PROBE_SECONDS`), a second one
    times the solves after it.
    """
    from ..data import Normalizer
    from ..rgap import rgap
    from .case import build_case
    from .rgap_common import labels_mu_negative

    model = net.build().to(device)
    image = torch.rand((1, *net.in_shape), generator=torch.Generator().manual_seed(0))
    image = image.to(device=device, dtype=torch.float64)
    labels = labels_mu_negative(model, image)
    case = build_case(model, image, labels, Normalizer.identity(), device=device, loss="logistic")

    def solve() -> float:
        start = time.perf_counter()
        rgap(case.model, case.updates, case.labels, input_shape=net.in_shape,
             diagnostics=diagnostics)  # fmt: skip
        return time.perf_counter() - start

    first = solve()
    later = solve() if images > 1 and first < 10 * PROBE_SECONDS else first
    return first + (images - 1) * later


_PROBES: dict[str, Callable[..., float]] = {
    "attack": _attack_step,
    "train": _train_step,
    "forward": _forward_step,
}


def step_seconds(
    net: Net, kind: str, images: int, device: str, objective: Objective | None = None
) -> float:
    """Seconds one step of ``kind`` on ``images`` images of ``net`` takes on ``device`` (probed).

    A solve (or diagnose) step is ``images`` solves of one image each; an attack step
    evaluates ``objective`` (default Inverting Gradients'). Batches above
    :data:`PROBE_CAPS` are extrapolated linearly from the two largest probed,
    the smallest being two images (batch norm needs two to train).
    """
    if kind in ("solve", "diagnose"):
        return _solves(net, images, device, diagnostics=kind == "diagnose")
    caps = PROBE_CAPS[kind]
    probe = _PROBES[kind] if objective is None else partial(_PROBES[kind], objective=objective)
    if images <= caps[0]:
        return probe(net, images, device)
    points = [(2, probe(net, 2, device)), (caps[0], probe(net, caps[0], device))]
    for cap in caps[1:]:
        if _line(points, cap) > PROBE_STEP_LIMIT:
            break
        points.append((min(cap, images), probe(net, min(cap, images), device)))
        if images <= cap:
            return points[-1][1]
    return _line(points, images)


def _line(points: list[tuple[int, float]], images: int) -> float:
    """A step's seconds at ``images`` on the line through the last two probed (batch, seconds);
    never below the last one (a timing's noise can make the slope negative)."""
    (a, ta), (b, tb) = points[-2:]
    return tb + (images - b) * max(tb - ta, 0.0) / (b - a)


def format_duration(seconds: float) -> str:
    """``seconds`` in a unit a reader plans with: s, min, h or days."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


@dataclass
class Estimate:
    """An experiment's estimated seconds, its unit count and its loads' totals.

    ``totals`` maps (the load's :attr:`~.work.Load.label`, kind, images per step) to
    (steps in all, probed seconds per step).
    """

    seconds: float
    units: int
    totals: dict[tuple[str, str, int], tuple[int, float]] = field(default_factory=dict)

    def describe(self) -> str:
        """``about 2.1 h (estimate: 12 units; cvb-cnn: 240,000 attack steps of 128 images ...)``.

        The three loads that take longest are named, with their probed step times.
        """
        ranked = sorted(self.totals.items(), key=lambda kv: -kv[1][0] * kv[1][1])
        parts = [_describe_load(*key, *value) for key, value in ranked[:3]]
        if len(ranked) > 3:
            parts.append(_plural(len(ranked) - 3, "more load"))
        return (
            f"about {format_duration(self.seconds)} (estimate: "
            + "; ".join([_plural(self.units, "unit"), *parts])
            + ")"
        )


def _plural(count: int, noun: str) -> str:
    """``"1 unit"``, ``"12 units"``, ``"1,000 more loads"``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _step_time(seconds: float) -> str:
    """A probed step time: ms below a second, three figures below 90 s, else :func:`format_duration`."""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    return f"{seconds:.3g} s" if seconds < 90 else format_duration(seconds)


def _describe_load(net: str, kind: str, images: int, steps: int, seconds: float) -> str:
    """One load's totals: ``cvb-cnn: 80,000 attack steps of 128 images at 625 ms each``."""
    if kind in ("solve", "diagnose"):
        what = _plural(steps * images, "R-GAP solve")
        what += " with diagnostics" if kind == "diagnose" else ""
        return f"{net}: {what} at {_step_time(seconds / images)} each"
    return (
        f"{net}: {_plural(steps, kind + ' step')} of {_plural(images, 'image')} "
        f"at {_step_time(seconds)} each"
    )


class Estimator:
    """Estimates of experiments' times on one device, probing each model's step once."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self._paces: dict[tuple[str, str, int], float] = {}

    @property
    def probed(self) -> bool:
        """Whether any step has been probed (an estimate was made)."""
        return bool(self._paces)

    def pace(self, load: Load) -> float:
        """Seconds per step of ``load`` (probed on first use)."""
        key = (load.label, load.kind, load.images)
        if key not in self._paces:
            self._paces[key] = step_seconds(
                load.net, load.kind, load.images, self.device, load.objective
            )
        return self._paces[key]

    def of_work(self, units: list[list[Load]]) -> Estimate:
        """The estimate of a run whose units carry these loads."""
        estimate = Estimate(seconds=0.0, units=len(units))
        for unit in units:
            for load in unit:
                pace = self.pace(load)
                key = (load.label, load.kind, load.images)
                steps, _ = estimate.totals.get(key, (0, pace))
                estimate.totals[key] = (steps + load.steps, pace)
                estimate.seconds += load.steps * pace
        return estimate

    def of(
        self, exp: Experiment, scale: str, data: dict[str, str] | None = None
    ) -> Estimate | None:
        """The estimate of a run of ``exp`` at ``scale``; ``None`` if it declares no work."""
        if exp.work is None:
            return None
        ctx = Context(scale=scale, device=self.device, data=dict(data or {}), progress=False,
                      settings=exp.config)  # fmt: skip
        return self.of_work(exp.work(ctx))
