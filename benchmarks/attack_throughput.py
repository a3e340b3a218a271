"""Attack throughput: optimisation-attack iterations per second, batched versus looped.

Runs the Bayes attack (the ``bayes`` preset: Gaussian likelihood, TV prior,
Adam) on ``bayes-cnn`` with MNIST-sized inputs (1×28×28) in three ways:

* one image;
* 64 images as one batched program (the attack called on the stacked updates:
  vmap over the 64 single-image attacks);
* 64 images attacked one after another in a Python loop (what the peers do).

It reports attack steps per second of each program and image-steps per
second (steps × images / time), on the CPU and, when present, on CUDA.
Usage: ``python benchmarks/attack_throughput.py [--steps 5] [--images 64]``;
``--threads`` pins the CPU thread count (1 for a one-core figure).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from leakagelib.attacks import Gaussian, preset
from leakagelib.gradients import per_sample_updates
from leakagelib.models import build


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _attack(model, updates, labels, steps: int, device: str) -> float:
    """Seconds for one ``steps``-step batched attack on the stacked ``updates``."""
    attack = preset("bayes", likelihood=Gaussian(0.1), beta=0.1, steps=steps)
    _sync(device)
    start = time.perf_counter()
    attack(model, updates, labels=labels, input_shape=(1, 28, 28), device=device)
    _sync(device)
    return time.perf_counter() - start


def measure(device: str, steps: int, images: int) -> dict[str, float]:
    """Iterations per second for 1 image, ``images`` batched, ``images`` looped."""
    torch.manual_seed(0)
    model = build("bayes-cnn", (1, 28, 28), 10).to(device)
    x = torch.randn(images, 1, 28, 28, device=device)
    y = torch.arange(images, device=device) % 10
    ups = per_sample_updates(model, x, y)
    one = {k: v[:1] for k, v in ups.items()}
    _attack(model, one, y[:1], 2, device)  # warm-up (allocations, kernels)
    t_one = _attack(model, one, y[:1], steps, device)
    t_batch = _attack(model, ups, y, steps, device)
    t_loop = sum(
        _attack(model, {k: v[i : i + 1] for k, v in ups.items()}, y[i : i + 1], steps, device)
        for i in range(images)
    )
    return {
        "device": device,
        "images": images,
        "steps": steps,
        "one_image_steps_per_s": steps / t_one,
        "batched_steps_per_s": steps / t_batch,
        "batched_image_steps_per_s": steps * images / t_batch,
        "looped_image_steps_per_s": steps * images / t_loop,
        "speedup_batched_vs_loop": t_loop / t_batch,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        print(json.dumps(measure(device, args.steps, args.images)), flush=True)


if __name__ == "__main__":
    main()
