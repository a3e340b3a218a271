"""The ℓ1 and pruned likelihoods' residual sums: a CPU's plan against a GPU's, and materialised.

Times one forward and backward pass of
:func:`leakagelib.attacks.residuals.residual_sums` (``Σ |g − m ⊙ s|`` and
``Σ (g − m ⊙ s)²`` over ``bayes-cnn``'s ``fc1``, 100 × 4,096, one image per
attack, ten observed updates) for the attacks of one search stage of a Table 2
CIFAR-10 unit (``--attacks``, default 4,800: the ℓ1 attack's 480 grid
candidates on ten tuning victims), three ways:

* ``cpu plan``: chunks of :data:`~leakagelib.attacks.residuals.CHUNK_BYTES`,
  the observed updates added attack by attack in place;
* ``gpu plan``: chunks of :data:`~leakagelib.attacks.residuals.GPU_CHUNK_BYTES`,
  each chunk's observed updates gathered in one indexing;
* ``materialised``: every attack's ``s`` built at once, as before the module
  (on a CPU only with ``--attacks`` small enough for the memory).

The library picks the plan by the device (``residuals._plan``); the README's
Speed section has the numbers. Usage::

    python benchmarks/residuals_speed.py --device cuda
    python benchmarks/residuals_speed.py --device cpu --attacks 240
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from machine import sync

from leakagelib.attacks import residuals
from leakagelib.attacks.per_attack import Observed, Simulated

OUT, IN, VICTIMS = 100, 4096, 10


def _materialised(d: torch.Tensor, a: torch.Tensor, g: torch.Tensor, power: int,
                  mask: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    s = d.transpose(-1, -2) @ a
    r = g[None, :, None] - (s if mask is None else s * mask)
    return (r.abs() if power == 1 else r.square()).sum((-1, -2))


def _factored(plan: tuple[int, bool]) -> Callable[..., torch.Tensor]:
    def run(d: torch.Tensor, a: torch.Tensor, g: torch.Tensor, power: int,
            mask: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        saved, residuals._plan = residuals._plan, lambda device: plan
        try:
            return residuals.residual_sums(Simulated({}, {"w": (d, a)}), "w",
                                           Observed({"w": g}), power, mask)  # fmt: skip
        finally:
            residuals._plan = saved

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--attacks", type=int, default=4800)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-materialised", action="store_true")
    args = parser.parse_args()
    if args.attacks % VICTIMS:
        parser.error(f"--attacks must be a multiple of {VICTIMS} (the observed updates)")
    gen = torch.Generator().manual_seed(0)
    shape = (args.attacks // VICTIMS, VICTIMS, 1, 1)
    d = torch.randn(*shape, OUT, generator=gen).to(args.device).requires_grad_()
    a = torch.randn(*shape, IN, generator=gen).to(args.device).requires_grad_()
    g = torch.randn(VICTIMS, OUT, IN, generator=gen).to(args.device)
    mask = (torch.rand(OUT, IN, generator=gen) < 0.5).float().to(args.device)
    ways = {"cpu plan": _factored((residuals.CHUNK_BYTES, False)),
            "gpu plan": _factored((residuals.GPU_CHUNK_BYTES, True))}  # fmt: skip
    if not args.skip_materialised:
        ways["materialised"] = _materialised
    print(
        f"{args.attacks} attacks of fc1 ({OUT} × {IN}) on {args.device}, torch {torch.__version__}"
        f"{' (' + torch.cuda.get_device_name() + ')' if args.device.startswith('cuda') else ''}"
    )
    for power, masked in ((1, False), (1, True), (2, True)):
        m = mask if masked else None
        times, values = {}, {}
        for name, way in ways.items():
            runs = []
            for _ in range(args.repeats + 1):  # the first warms up
                sync(args.device)
                start = time.perf_counter()
                value = way(d, a, g, power, m)
                grads = torch.autograd.grad(value.sum(), (d, a))
                sync(args.device)
                runs.append(time.perf_counter() - start)
            del grads
            times[name], values[name] = min(runs[1:]), value.detach()
        first = next(iter(values.values()))
        for value in values.values():  # the three ways compute one sum
            torch.testing.assert_close(value, first, rtol=1e-4, atol=0)
        label = f"{'|r|' if power == 1 else 'r²'}{', pruned' if masked else ''}"
        print(f"{label:12s}" + "".join(f"  {k}: {1e3 * v:8.1f} ms" for k, v in times.items()))


if __name__ == "__main__":
    main()
