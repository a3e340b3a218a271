"""Attack throughput: optimisation-attack steps per second, by engine, batched versus looped.

Runs the Bayes attack (the ``bayes`` preset: Gaussian likelihood, TV prior,
Adam) on ``bayes-cnn`` with MNIST-sized inputs (1×28×28):

* one image;
* ``--images`` (64) independent attacks as one batched program, by each
  engine of :class:`leakagelib.attacks.AttackConfig` — ``hooks`` (one forward
  and backward pass of all candidates, per-attack gradients from recorded
  activations, dense layers kept as factors: :mod:`leakagelib.attacks.per_attack`)
  and ``vmap`` (:func:`torch.func.vmap` over attacks);
* the same attacks one after another in a Python loop (what the peers do).

It reports image-steps per second (steps × images / seconds), the FLOPs of
one image-step (one attack's step by plain autograd, counted by
:class:`torch.utils.flop_counter.FlopCounterMode`: the work every route must
do; the counter overcounts the weight gradient of a grouped convolution by its
number of groups, so the batched step is not counted directly) and the
batched rate's share of this machine's float32 matrix-multiply peak, measured
on the spot with a 2048² matrix product. ``--profile`` prints the operators
that take a step's time.

What the profile showed, and what was tried (2-core CPU, see the README's
Speed section for the numbers):

* Under ``vmap`` most of a step went to element-wise passes (subtract,
  square, sum, their backward) over the materialised per-attack gradient of
  ``fc1`` (64 × 100 × 3136 floats): memory traffic, not arithmetic. The hooked
  engine never builds it — the Gaussian and cosine likelihoods need only
  ``‖s‖²`` and ``⟨s, g⟩``, which the factors give — and that is most of its
  gain. Those inner products run in float64 (so that ``‖s − g‖²`` keeps its
  accuracy near convergence); a float32 version was not faster here.
* The per-attack convolution weight gradients were batched matrix products
  of unfolded inputs (Opacus's grad sampler) and then took the largest share
  of a step, with the unfold/fold copies. One native *grouped* kernel (the
  attacks as groups) is faster for all but the smallest layers (the
  measurements are in :mod:`leakagelib.attacks.per_attack`); the README's
  Speed section has the throughput before and after.
* The per-sample weight gradients under ``vmap`` (grouped convolutions) were
  *not* the main cost, contrary to a first profile taken on a loaded machine.
* A profile of the hooked step shows zero-filled ``64 × 32 × 28 × 28``
  tensors: differentiating ReLU's and average pooling's backward a second
  time, autograd builds a zero derivative with respect to their input and
  adds it in. ReLU and pooling as autograd functions whose backward reads a
  detached input (so no such zeros are built; the iterates stay bit for bit
  the same) measured 977–1,028 image-steps/s against 975–1,025 without them
  on 2 threads and 585–650 against 553–603 on one (three interleaved runs
  each, 64 attacks, 10 steps; 2026-11-27, the paper-scale run paused): within
  the runs' spread, so they were not kept; again with freed memory kept
  (below) on 2026-11-28: 967–1,010 against 943–996.
* glibc hands the step's freed 6.4 MB activation blocks back to the kernel
  and faults them in again (204,389 minor faults in 20 steps); with
  ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=2147483647`` it
  keeps them (39,204, the one-off float64 copy of ``fc1``'s update) and the
  batch runs 1.1–1.8× faster; the loop does not change. The record's
  ``allocator`` names the settings a run had.

Usage: ``python benchmarks/attack_throughput.py [--steps 20] [--images 64]
[--threads N] [--profile [--device cuda]]`` (without ``--profile`` it measures on the CPU
and, where there is one, on the GPU).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from machine import allocator_settings, matmul_peak, sync
from torch.utils.flop_counter import FlopCounterMode

from leakagelib.attacks import Gaussian, preset
from leakagelib.gradients import per_sample_updates
from leakagelib.models import build

SHAPE = (1, 28, 28)


def _attack(model, updates, labels, steps: int, device: str, engine: str) -> float:
    """Seconds for one ``steps``-step batched attack on the stacked ``updates``."""
    attack = preset("bayes", likelihood=Gaussian(0.1), beta=0.1, steps=steps)
    attack = attack.with_config(engine=engine)
    sync(device)
    start = time.perf_counter()
    attack(model, updates, labels=labels, input_shape=SHAPE, device=device)
    sync(device)
    return time.perf_counter() - start


def image_step_flops(model, updates, labels, device: str) -> int:
    """FLOPs of one attack's step (forward, backward and double backward) on one image."""
    attack = preset("bayes", likelihood=Gaussian(0.1), beta=0.1, steps=1)
    one = {k: v[:1] for k, v in updates.items()}
    with FlopCounterMode(display=False) as counter:
        attack(model, one, labels=labels[:1], input_shape=SHAPE, device=device)
    return counter.get_total_flops() // 2  # one step plus the final evaluation


def measure(device: str, steps: int, images: int) -> dict[str, object]:
    """Image-steps per second for 1 image, ``images`` batched by each engine, and looped."""
    torch.manual_seed(0)
    model = build("bayes-cnn", SHAPE, 10).to(device)
    x = torch.rand(images, *SHAPE, device=device)
    y = torch.arange(images, device=device) % 10
    ups = per_sample_updates(model, x, y)
    one = {k: v[:1] for k, v in ups.items()}
    _attack(model, one, y[:1], 2, device, "hooks")  # warm-up (allocations, kernels)
    out: dict[str, object] = {"device": device, "images": images, "steps": steps}
    out["threads"] = torch.get_num_threads()
    out["allocator"] = allocator_settings()
    out["one_image"] = steps / _attack(model, one, y[:1], steps, device, "auto")
    for engine in ("hooks", "vmap"):
        out[f"batched_{engine}"] = steps * images / _attack(model, ups, y, steps, device, engine)
    loop = sum(
        _attack(
            model, {k: v[i : i + 1] for k, v in ups.items()}, y[i : i + 1], steps, device, "auto"
        )
        for i in range(images)
    )
    out["looped"] = steps * images / loop
    out["speedup_hooks_vs_loop"] = out["batched_hooks"] / out["looped"]
    out["speedup_hooks_vs_vmap"] = out["batched_hooks"] / out["batched_vmap"]
    flops = image_step_flops(model, ups, y, device)
    peak = matmul_peak(device)
    out["gflop_per_step"] = flops * images / 1e9
    out["peak_gflops"] = peak / 1e9
    out["share_of_peak"] = flops * out["batched_hooks"] / peak
    return out


def profile(device: str, images: int) -> None:
    """Print the operators that take the time of a few batched hooked steps (on a GPU, by their
    kernels' time: Bayes Table 2's paper-scale search runs up to 19,800 attacks in one batch)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.manual_seed(0)
    model = build("bayes-cnn", SHAPE, 10).to(device)
    y = torch.arange(images, device=device) % 10
    ups = per_sample_updates(model, torch.rand(images, *SHAPE, device=device), y)
    _attack(model, ups, y, 2, device, "hooks")  # warm-up (allocations, kernel choices)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
    with torch_profile(activities=activities, record_shapes=True) as prof:
        _attack(model, ups, y, 8, device, "hooks")
    table = prof.key_averages(group_by_input_shape=True)
    order = "self_cpu_time_total" if device == "cpu" else "self_device_time_total"
    print(table.table(sort_by=order, row_limit=20, max_shapes_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--profile", action="store_true", help="print an operator profile")
    parser.add_argument("--device", default="cpu", help="the device --profile runs on")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.profile:
        profile(args.device, args.images)
        return
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        print(json.dumps(measure(device, args.steps, args.images)), flush=True)


if __name__ == "__main__":
    main()
