"""DLG with one L-BFGS per image: our batched per-attack L-BFGS against torch's, image by image.

DLG's code (and R-GAP's Tables 1–2, experiments ``rgap/table1`` and
``rgap/table2-lenet``) runs ``torch.optim.LBFGS`` on each image alone. Ours
(:func:`leakagelib.attacks.lbfgs.lbfgs_per_attack`, through
:func:`leakagelib.rgap.dlg_logistic` with ``per_attack=True``) runs every
image's L-BFGS in one program: the objective of all images is evaluated at
once and every L-BFGS scalar is kept per image, so each image follows the
path torch's L-BFGS takes on it alone. This script runs both on the same
LeNet (R-GAP's Table 2 network, logistic loss, one logit), the same images
and the same N(0, 1) starts, one thread, and reports seconds per L-BFGS step
for all images, the share of our time spent evaluating the objective (the
rest is L-BFGS's own bookkeeping), and the mean MSE each reaches (equal
paths give equal errors).

What it showed (README, Speed section): our per-attack L-BFGS used to shift
every image's whole history of curvature pairs (images × 100 × 3,072 floats)
at every iteration, which took three quarters of the time; the history is
now a ring written in place, and the objective's evaluations dominate.

Usage: ``python benchmarks/lbfgs_per_attack.py [--images 32] [--steps 3]
[--data cifar10=PATH.npz]`` (the embedded CIFAR-sized ``patches`` otherwise).
"""

from __future__ import annotations

import argparse
import time

import torch

from leakagelib.attacks import lbfgs
from leakagelib.data import load
from leakagelib.gradients import per_sample_updates
from leakagelib.models import build
from leakagelib.rgap import dlg_logistic

SHAPE = (3, 32, 32)


def _setup(n: int, spec: str):
    """R-GAP's LeNet (one logit, float64, PyTorch's initialisation), ``n`` images, their updates."""
    torch.manual_seed(0)
    model = build("lenet", in_shape=SHAPE, num_classes=1, bias=False, init="torch").double()
    x = load(spec, n=n, seed=0).images.double()
    with torch.no_grad():
        y = torch.where(model(x).reshape(-1) > 0, -1, 1).long()
    return model, x, y, per_sample_updates(model, x, y, loss="logistic")


def _ours(model, x, y, updates, start, steps: int) -> tuple[float, float, float]:
    """Seconds, the objective's share of them, and the mean MSE of all images' L-BFGS at once."""
    spent = [0.0]
    step = lbfgs._step

    def timed_closure(*args):  # time the closure the L-BFGS step calls (args[6])
        closure = args[6]

        def inner(v):
            start = time.perf_counter()
            out = closure(v)
            spent[0] += time.perf_counter() - start
            return out

        return step(*args[:6], inner, *args[7:])

    lbfgs._step = timed_closure
    try:
        began = time.perf_counter()
        res = dlg_logistic(model, updates, y, input_shape=SHAPE, steps=steps, initial=start,
                           per_attack=True)  # fmt: skip
        seconds = time.perf_counter() - began
    finally:
        lbfgs._step = step
    mse = float(((res.inputs().double() - x) ** 2).mean())
    return seconds, spent[0] / seconds, mse


def _torch_loop(model, x, y, updates, start, steps: int) -> tuple[float, float]:
    """Seconds and mean MSE of torch.optim.LBFGS on each image alone (DLG's code path)."""
    began, errors = time.perf_counter(), []
    for i in range(x.shape[0]):
        one = {k: v[i : i + 1] for k, v in updates.items()}
        res = dlg_logistic(model, one, y[i : i + 1], input_shape=SHAPE, steps=steps,
                           initial=start[i : i + 1])  # fmt: skip
        errors.append(float(((res.inputs().double() - x[i : i + 1]) ** 2).mean()))
    return time.perf_counter() - began, sum(errors) / len(errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data", default="cifar10=patches", help="cifar10=SPEC (an .npz path)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, x, y, updates = _setup(args.images, args.data.partition("=")[2])
    print(f"DLG, LeNet 3×32×32 (one logit), {args.images} images, {args.steps} L-BFGS steps, "
          f"{args.threads} thread(s); torch {torch.__version__}")  # fmt: skip
    start = torch.randn((args.images, *SHAPE), generator=torch.Generator().manual_seed(1))
    ours, share, ours_mse = _ours(model, x, y, updates, start, args.steps)
    theirs, theirs_mse = _torch_loop(model, x, y, updates, start, args.steps)
    print("| route | s per L-BFGS step (all images) | objective's share | mean MSE |")
    print("| --- | --- | --- | --- |")
    print(f"| ours, per-attack L-BFGS in one program | {ours / args.steps:.3f} "
          f"({theirs / ours:.2f}× the loop) | {share:.0%} | {ours_mse:.3g} |")  # fmt: skip
    print(
        f"| torch.optim.LBFGS, image by image | {theirs / args.steps:.3f} | — | {theirs_mse:.3g} |"
    )


if __name__ == "__main__":
    main()
