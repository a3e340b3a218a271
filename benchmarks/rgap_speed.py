"""How fast is R-GAP? CNN6 on a 3×32×32 image, on the CPU.

Compares, per image:

* R-GAP with the structured solver (``solver="auto"``: per-channel gradient
  solves, weight-only sparse solves, projected solves — see
  :mod:`leakagelib.rgap.solve`) and with every constraint stacked into one
  sparse least-squares problem (``solver="stacked"``);
* building the constraint matrices of the first convolutions as sparse
  matrices from the layer geometry (what R-GAP does) against building them
  densely from Jacobians
  (``torch.autograd.functional.jacobian`` of the convolution and of its
  weight gradient), which is what a dense implementation pays before solving;
* DLG (L-BFGS, label known) run to ``--dlg-steps`` steps.

Usage: ``python benchmarks/rgap_speed.py [--images 2] [--dlg-steps 10] [--dense-layers 2]
[--threads 2]``.
Prints a table; the numbers for the README come from this script.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch.autograd.functional import jacobian
from torch.nn.grad import conv2d_weight

from leakagelib.data import load
from leakagelib.gradients import client_update, per_sample_updates, stack_updates
from leakagelib.models import build
from leakagelib.rgap import dlg_logistic, rgap
from leakagelib.rgap.chain import chain_of
from leakagelib.rgap.constraints import gradient_matrix, weight_matrix

SHAPE = (3, 32, 32)


def _setup(n: int):
    torch.manual_seed(0)
    model = build("cnn6", in_shape=SHAPE, num_classes=1).double()
    x = load("patches", n=n, seed=0).images.double()
    with torch.no_grad():
        y = torch.where(model(x).reshape(-1) > 0, -1, 1).long()
    return model, x, y


def _time_rgap(model, x, y, solver: str) -> tuple[float, float]:
    """Median seconds per image and mean MSE of R-GAP with ``solver``, one update at a time."""
    times, errors = [], []
    for i in range(x.shape[0]):
        update = stack_updates([client_update(model, x[i : i + 1], y[i : i + 1], loss="logistic")])
        start = time.perf_counter()
        res = rgap(model, update, y[i : i + 1], input_shape=SHAPE, solver=solver)
        times.append(time.perf_counter() - start)
        errors.append(float(((res.inputs() - x[i : i + 1]) ** 2).mean()))
    return float(np.median(times)), float(np.mean(errors))


def _time_matrices(model, x, layers: int) -> tuple[float, float]:
    """Seconds to build W and K of the first ``layers`` convolutions: sparse, then dense.

    The dense route takes Jacobians of the convolution (forward mode) and of
    its weight gradient (reverse mode, vectorised); beyond the first layers its
    matrices alone need gigabytes (K of conv6 is 73,728 × 1,600 doubles).
    """
    stages = [s for s in chain_of(model, SHAPE) if isinstance(s.layer, torch.nn.Conv2d)][:layers]
    inputs, h = [], x[:1]
    with torch.no_grad():
        for module in list(model.children())[1:]:
            if isinstance(module, torch.nn.Conv2d):
                inputs.append(h)
            h = module(h)
    inputs = inputs[:layers]
    ks = [torch.randn(1, *s.out_shape, dtype=torch.float64) for s in stages]
    start = time.perf_counter()
    for s, k in zip(stages, ks, strict=True):
        weight_matrix(s.geometry, s.layer.weight.detach().numpy())
        gradient_matrix(s.geometry, k.numpy())
    sparse = time.perf_counter() - start
    start = time.perf_counter()
    for s, k, inp in zip(stages, ks, inputs, strict=True):
        conv = s.layer
        w = conv.weight.detach()
        jacobian(lambda v, c=conv: c(v), inp, vectorize=True, strategy="forward-mode")
        jacobian(
            lambda v, w=w, k=k, c=conv: conv2d_weight(v, w.shape, k, c.stride, c.padding),
            inp,
            vectorize=True,
        )
    dense = time.perf_counter() - start
    return sparse, dense


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--dlg-steps", type=int, default=10)
    parser.add_argument("--dense-layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, x, y = _setup(args.images)
    rows = []
    for solver in ("auto", "stacked"):
        sec, err = _time_rgap(model, x, y, solver)
        rows.append((f"R-GAP ({solver})", sec, err))
    updates = per_sample_updates(model, x, y, loss="logistic")
    start = time.perf_counter()
    rec = dlg_logistic(model, updates, y, input_shape=SHAPE, steps=args.dlg_steps).inputs()
    dlg_sec = (time.perf_counter() - start) / args.images
    rows.append((f"DLG ({args.dlg_steps} L-BFGS steps)", dlg_sec, float(((rec - x) ** 2).mean())))
    sparse, dense = _time_matrices(model, x, args.dense_layers)
    rows.append((f"build W, K of {args.dense_layers} convs: sparse", sparse, float("nan")))
    rows.append((f"build W, K of {args.dense_layers} convs: dense Jacobian", dense, float("nan")))
    print(f"CNN6 on 3x32x32, float64, {args.images} images, {torch.get_num_threads()} threads")
    print(f"{'method':<40} {'seconds/image':>14} {'MSE':>10}")
    for name, sec, err in rows:
        print(f"{name:<40} {sec:>14.3f} {err:>10.2e}")


if __name__ == "__main__":
    main()
