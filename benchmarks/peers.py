"""Side by side with the peers: our attacks and a reference implementation, same work, one process.

Two comparisons, each printed as a markdown table and as JSON lines:

**Inverting Gradients** (``--only ig``) against breaching's ``invertinggradients``
attack (JonasGeiping/breaching 0.1.2 from the package index), on the zoo's
``convnet`` at width 16 and 64 and the CVB paper's ``cvb-cnn``, CIFAR-10-sized
inputs. For each model it runs, interleaved in one process:

* our batched attack on ``--images`` independent single-image updates (one program);
* our per-image loop and breaching's per-image loop, the two sides alternating
  image by image (ours, breaching, breaching, ours, ...), so that a drift of the
  shared machine hits both;
* a *single attack* of each side is one element of those loops: the table gives
  the median over the loop's images.

Equal work, checked rather than assumed:

* **same weights** — our model is built, then its state dict is copied by
  position into the peer's model (shapes checked), and the two must give the
  same logits on the attacked images. ``convnet`` uses breaching's own zoo
  class (``breaching.cases.models.model_preparation.ConvNet``), which matches
  ours layer for layer (conv0–conv7 with BatchNorm and ReLU, MaxPool 3 after
  conv5 and conv7, Linear(36·width)); ``cvb-cnn`` has no breaching
  counterpart, so :class:`PeerCvbCnn` below writes it as a plain torch module;
* **same images** — real CIFAR-10 test images (``--data``, default
  ``../shared/data/cifar10_test_0_499.npz``, loaded with
  :func:`leakagelib.data.load` and normalised with the Inverting Gradients
  constants, which are breaching's); when the file is absent, the embedded
  ``patches`` stand-in, and the output says so;
* **same observed gradients** — the per-image updates are computed once (our
  :func:`~leakagelib.gradients.per_sample_updates`, model in eval mode) and
  handed to both sides; breaching gets the server's BatchNorm buffers, so it
  too runs the network in eval mode;
* **same start images** — drawn once from N(0, 1) (breaching's ``randn``
  init, our ``init="normal"``) and passed to both (our ``initial=``,
  breaching's ``reconstruct(..., initial_data=...)``);
* **same hyper-parameters** — cosine distance without layer weights, TV,
  Adam on the *sign* of the gradient (breaching ``signed: hard``), lr
  ``--lr``, box constraint to the valid pixel range, step decay by 10 at
  3/8, 5/8, 7/8 of the run, ``--iterations`` steps, labels given.

Conventions that differ, and how they are matched:

* **TV weight.** breaching's TV is ``scale · mean(|Δ_w x| + |Δ_h x|)`` over
  ``n·C·H·W`` positions (a zero-padded difference convolution); ours, in the
  Inverting Gradients preset, is inversefed's ``β · (mean |Δ_h x| + mean |Δ_w x|)``,
  each direction averaged over its own ``C·(H−1)·W`` interior differences
  (:class:`~leakagelib.attacks.TotalVariation` with ``reduction="mean"``). On
  square images the weights agree when ``β = scale · (H−1)/H`` — 0.969 on
  3×32×32, printed with the run. breaching's padded convolution also counts
  the last row and column against zero (``|x|`` at the border, ``2·C·H`` more
  terms); ours does not. That changes the prior slightly, not the work per step.
* **Step decay.** breaching's milestones are ``it // 2.667, it // 1.6, it // 1.142``,
  ours ``int(it·3/8), int(it·5/8), int(it·7/8)``: they can differ by one step;
  both sets are printed.
* **Which iterate is returned.** breaching keeps the iterate that follows the
  step at which the objective (evaluated before that step) was lowest; ours
  returns the last iterate. With the decayed step size these are close; the
  PSNR column shows what each side reached, and the run prints the PSNR of our
  reconstructions against breaching's (high means the two runs followed the
  same path).
* breaching's cosine has no epsilon, ours adds 1e-7 to the squared norms.

**R-GAP** (``--only rgap``) on CNN6 (``cnn6``, one logit, logistic loss,
3×32×32, at initialisation): our :func:`leakagelib.rgap.rgap` (float64,
structured solver) against the reference's method — the R-GAP authors' code
(JunyiZhu-AI/R-GAP, ``main.py`` and ``recursive_attack.py``), which builds each
convolution's gradient, weight and padding constraints as one *dense* matrix
and solves it with ``np.linalg.lstsq``, and finds μ from ``⟨∇w, w⟩`` by Adam,
lr 0.01, 30,000 steps (``inverse_udldu`` there; breaching's ``rgap.yaml``:
``step_size: 0.01, steps: 30_000``; the paper, §3.1.1 and Eq. 11, says only
that μ is derived from ``∂ℓ/∂μ · μ = −μ / (1 + e^μ)``). The reference side calls breaching's port of those
functions (``breaching.attacks.auxiliaries.recursive_attack``: ``inverse_udldu``,
``r_gap``, ``peeling``, ``fcn_reconstruction``, the LeakyReLU inverse and
derivative), float32 as the authors ran it, driven by the recursion of the
authors' ``main.py`` written out in :func:`reference_rgap` (breaching's own
wrapper fixes ``y = 0.1`` for a bias-free last layer, which is not the paper's
binary setting, so it is not used). Both sides get the same CNN6 weights
(float32, ours in a float64 copy), the same images in [0, 1] and the label the
authors' code picks (the opposite of the prediction). Reported: seconds per
image and the MSE of the reconstruction against the image; the reference's
time includes the μ fit, which is also shown on its own. numpy's BLAS is held
to ``--threads`` threads too (threadpoolctl).

Install (breaching is a benchmark-only dependency, never the library's; it
goes into ``.peers/``, which git ignores)::

    .venv/bin/pip install --target .peers --no-deps -r benchmarks/requirements-peers.txt

breaching's other requirements (torch, torchvision, scipy, lpips, and PyYAML and
packaging through them) are already in the project's environment. No network is
needed at run time: the attack configuration is composed from the hydra files
inside the package. ``tests/test_peers_benchmark.py`` checks that the peer
networks compute our function and that the TV conversion and the two attacks
agree (it skips where breaching is absent).

Run (one thread, as the targets are stated)::

    .venv/bin/python benchmarks/peers.py --threads 1 --iterations 50 --json /tmp/peers.jsonl
    .venv/bin/python benchmarks/peers.py --only ig --models convnet16 cvb-cnn --iterations 200

On the 2-core machine (shared, one thread) ConvNet width 64 costs about 0.6 s
per image-iteration on each side and the reference's R-GAP 9–14 minutes per
image, so the default run (50 iterations, 8 images, 1 R-GAP image) takes about
half an hour.

On a GPU (README, Speed: the H100 table)::

    python benchmarks/peers.py --only ig --device cuda --iterations 200 --images 16

``--device cuda`` puts both sides' models, images, updates and start images
on the GPU (the start images are still drawn on the CPU, so they are the same
images as on the CPU) and waits for the GPU before reading each clock; R-GAP
has no GPU route here (the reference is numpy), so it needs ``--only ig``.

Options: ``--device`` (``cpu`` or ``cuda``), ``--models`` (subset of
``convnet16 convnet64 cvb-cnn``), ``--images`` (default 8), ``--iterations``,
``--lr``, ``--tv`` (breaching's convention), ``--seed``, ``--data``,
``--peers-dir``, ``--rgap-images``, ``--rgap-mu-steps``.
Without breaching the script still runs our side of both comparisons and
says why the peer is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import statistics
import sys
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from leakagelib.attacks import image_bounds, preset
from leakagelib.data import load
from leakagelib.gradients import client_update, per_sample_updates, stack_updates
from leakagelib.metrics import mse, psnr
from leakagelib.models import build
from leakagelib.rgap import rgap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import matmul_peak, sync  # noqa: E402  (benchmarks/ is not a package)

REPO = Path(__file__).resolve().parents[1]
SHARED_CIFAR = REPO.parent / "shared" / "data" / "cifar10_test_0_499.npz"
SHAPE = (3, 32, 32)
#: Our zoo entries by benchmark name: (registry id, keyword options).
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "convnet16": ("convnet", {"width": 16}),
    "convnet64": ("convnet", {"width": 64}),
    "cvb-cnn": ("cvb-cnn", {}),
}


# ------------------------------------------------------------------------------------------
# The peer: breaching, imported from its own folder
# ------------------------------------------------------------------------------------------


def import_breaching(peers_dir: Path) -> ModuleType | str:
    """breaching imported from ``peers_dir`` (appended to ``sys.path``), or why it cannot be."""
    if peers_dir.is_dir() and str(peers_dir) not in sys.path:
        sys.path.append(str(peers_dir))
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # its torch.jit.script decorators
            import breaching
            import breaching.attacks.auxiliaries.recursive_attack  # noqa: F401
            from breaching.cases.models import model_preparation  # noqa: F401
    except Exception as error:  # any import failure is reported, not raised
        return (
            f"breaching is not importable from {peers_dir} ({type(error).__name__}: {error}); "
            "install it with: .venv/bin/pip install --target .peers --no-deps "
            "-r benchmarks/requirements-peers.txt"
        )
    return breaching


class PeerCvbCnn(nn.Module):
    """The CVB paper's CNN as a plain torch module, the peer side of ``cvb-cnn``.

    breaching's zoo has no such network. Three Conv(k=5, stride 2, no padding)
    → ReLU with 16, 32, 64 channels, flatten, Linear(64 → classes): the layers
    of :func:`leakagelib.models.cvb_nets.build_cvb_cnn`, in the same parameter order.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=2),
            nn.ReLU(),
            nn.Conv2d(16, 32, 5, stride=2),
            nn.ReLU(),
            nn.Conv2d(32, 64, 5, stride=2),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


class PeerCNN6(nn.Module):
    """R-GAP's CNN6 laid out as the authors' ``models/CNN6.py``: a list of (layer, act) blocks.

    Bias-free convolutions (12, 36, 36, 36, 64, 128 channels; kernel 4 then 3;
    strides 2, 2, 1, 1, 2, 1; padding 2 then 1), LeakyReLU(0.2), a bias-free
    Linear(3200 → 1) with an identity activation. ``forward`` returns the
    logit and the input shape of every block, as the authors' does.
    """

    def __init__(self) -> None:
        super().__init__()
        plan = [(3, 12, 4, 2, 2), (12, 36, 3, 2, 1), (36, 36, 3, 1, 1)]
        plan += [(36, 36, 3, 1, 1), (36, 64, 3, 2, 1), (64, 128, 3, 1, 1)]
        blocks = [
            nn.Sequential(
                OrderedDict(
                    layer=nn.Conv2d(i, o, k, stride=s, padding=p, bias=False),
                    act=nn.LeakyReLU(0.2),
                )
            )
            for i, o, k, s, p in plan
        ]
        fc = OrderedDict(layer=nn.Linear(3200, 1, bias=False), act=nn.Identity())
        self.body = nn.ModuleList([*blocks, nn.Sequential(fc)])

    def forward(self, x: Tensor) -> tuple[Tensor, list[torch.Size]]:
        shapes = []
        for block in self.body:
            if isinstance(block.layer, nn.Linear):
                x = x.flatten(1)
            shapes.append(x.shape)
            x = block(x)
        return x, shapes


def copy_weights(ours: nn.Module, peer: nn.Module) -> nn.Module:
    """Load ``ours``' state dict into ``peer`` by position (names differ), shapes checked."""
    src, dst = ours.state_dict(), peer.state_dict()
    shapes = [tuple(v.shape) for v in src.values()], [tuple(v.shape) for v in dst.values()]
    if shapes[0] != shapes[1]:
        raise ValueError(f"the peer's state dict does not match ours: {shapes[1]} vs {shapes[0]}")
    peer.load_state_dict(dict(zip(dst.keys(), src.values(), strict=True)))
    return peer


def peer_model(name: str, ours: nn.Module, breaching: ModuleType) -> nn.Module:
    """The peer's network for benchmark model ``name``, holding ``ours``' weights, in eval mode,
    on ``ours``' device."""
    registry_id, options = MODELS[name]
    if registry_id == "convnet":
        from breaching.cases.models.model_preparation import ConvNet

        peer: nn.Module = ConvNet(width=options["width"], num_classes=10, num_channels=3)
    else:
        peer = PeerCvbCnn(num_classes=10)
    return copy_weights(ours, peer).eval().to(next(ours.parameters()).device)


def check_same_function(
    ours: Callable[[Tensor], Tensor], peer: Callable[[Tensor], Tensor], x: Tensor
) -> float:
    """The largest logit difference of the two models on ``x``; raise if they disagree."""
    with torch.no_grad():
        gap = float((ours(x) - peer(x)).abs().max())
    if not gap < 1e-4:
        raise AssertionError(f"our model and the peer's give different logits (max gap {gap:.2e})")
    return gap


# ------------------------------------------------------------------------------------------
# Inverting Gradients
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IGSettings:
    """The attack's hyper-parameters, in breaching's TV convention (see the module docstring)."""

    iterations: int
    lr: float
    tv: float

    @property
    def tv_ours(self) -> float:
        """Our TV weight β (inversefed's per-direction means) for breaching's ``scale``."""
        return self.tv * (SHAPE[1] - 1) / SHAPE[1]

    def milestones(self) -> dict[str, list[int]]:
        """The steps where each side divides the learning rate by 10."""
        it = self.iterations
        return {
            "ours": [int(it * f) for f in (3 / 8, 5 / 8, 7 / 8)],
            "breaching": [int(it // d) for d in (2.667, 1.6, 1.142)],
        }


@dataclass
class Victims:
    """The attacked images (normalised), labels, updates, start images and pixel box."""

    images: Tensor
    labels: Tensor
    updates: dict[str, Tensor]
    start: Tensor
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str

    def denormalize(self, x: Tensor) -> Tensor:
        m = torch.tensor(self.mean, device=x.device).reshape(1, -1, 1, 1)
        s = torch.tensor(self.std, device=x.device).reshape(1, -1, 1, 1)
        return (x * s + m).clamp(0.0, 1.0)

    def psnr(self, reconstructions: Tensor, index: slice | None = None) -> float:
        """Mean PSNR (dB) of de-normalised ``reconstructions`` against the victims ``index``."""
        truth = self.images[index if index is not None else slice(None)]
        return float(psnr(self.denormalize(reconstructions), self.denormalize(truth)).mean())


def load_cifar(n: int, data: Path, seed: int) -> tuple[Any, str]:
    """``n`` CIFAR-10 test images from ``data`` (first ``n``), or the ``patches`` stand-in."""
    if data.is_file():
        ds = load(
            str(data), n=n, shuffle=False, split="all", constants="ig", constants_of="cifar10"
        )
        return ds, f"CIFAR-10 test images 0..{n - 1} from {data}"
    ds = load("patches", n=n, seed=seed, constants="ig", constants_of="cifar10")
    return ds, f"STAND-IN: embedded 'patches' ({data} is absent), NOT real CIFAR-10"


def victims_for(model: nn.Module, ds: Any, source: str, seed: int) -> Victims:
    """Normalised images, per-image updates of ``model`` and start images drawn once (on the
    CPU, so both devices start from the same images), all on ``model``'s device."""
    device = next(model.parameters()).device
    x = ds.normalizer.normalize(ds.images).to(device)
    y = ds.labels.to(device)
    updates = per_sample_updates(model, x, y)
    gen = torch.Generator().manual_seed(seed)
    start = torch.randn((x.shape[0], 1, *SHAPE), generator=gen).to(device)
    norm = ds.normalizer
    return Victims(x, y, updates, start, tuple(norm.mean), tuple(norm.std), source)


def ours_attack(model: nn.Module, v: Victims, index: slice, s: IGSettings) -> tuple[Tensor, float]:
    """Our Inverting Gradients on the victims ``index`` as one program: (reconstructions, seconds)."""
    attack = preset(
        "inverting-gradients",
        steps=s.iterations,
        tv=s.tv_ours,
        lr=s.lr,
        signed=True,
        box=True,
        schedule="step",
        decay=0.1,
    )
    updates = {k: u[index] for k, u in v.updates.items()}
    sync(v.images.device.type)
    start = time.perf_counter()
    result = attack(
        model,
        updates,
        input_shape=SHAPE,
        labels=v.labels[index],
        bounds=image_bounds(v.mean, v.std),
        initial=v.start[index],
    )
    sync(v.images.device.type)
    return result.inputs(), time.perf_counter() - start


def breaching_attacker(breaching: ModuleType, peer: nn.Module, s: IGSettings) -> Any:
    """breaching's ``invertinggradients`` attacker with our iterations, lr and TV scale."""
    overrides = [
        f"optim.max_iterations={s.iterations}",
        f"optim.step_size={s.lr}",
        f"regularization.total_variation.scale={s.tv}",
        f"optim.callback={10**9}",
    ]
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hydra's notice that breaching gives no version_base
        cfg = breaching.get_attack_config("invertinggradients", overrides=overrides)
    setup = {"device": next(peer.parameters()).device, "dtype": torch.float}
    return breaching.attacks.prepare_attack(peer, nn.CrossEntropyLoss(), cfg, setup)


def breaching_attack(attacker: Any, peer: nn.Module, v: Victims, i: int) -> tuple[Tensor, float]:
    """breaching's attack on victim ``i`` (one image): (reconstruction, seconds)."""
    meta = SimpleNamespace(shape=SHAPE, mean=v.mean, std=v.std, modality="vision")
    payload = [
        {
            "parameters": [p.detach() for p in peer.parameters()],
            "buffers": [b.detach() for b in peer.buffers()],
            "metadata": meta,
        }
    ]
    shared = [
        {
            "gradients": [u[i] for u in v.updates.values()],
            "buffers": None,
            "metadata": {
                "num_data_points": 1,
                "labels": v.labels[i : i + 1],
                "local_hyperparams": None,
            },
        }
    ]
    sync(v.images.device.type)
    start = time.perf_counter()
    out, _ = attacker.reconstruct(payload, shared, {}, initial_data=v.start[i])
    sync(v.images.device.type)
    return out["data"].detach(), time.perf_counter() - start


@dataclass
class Row:
    """One line of the table and of the JSON output."""

    bench: str
    model: str
    run: str
    images: int
    steps: int
    seconds: float
    quality: float | None
    speedup: float | None = None
    gflop: float | None = None  # per image-iteration (IG)

    def per_step(self) -> float:
        return self.seconds / self.steps

    def to_json(self, head: dict[str, Any]) -> str:
        """One JSON line: ``head`` (date, machine), the row, PSNR (IG) or MSE (R-GAP) by name."""
        fields = asdict(self)
        if self.bench == "ig":
            fields["psnr_db"] = fields.pop("quality")
            fields["s_per_iteration"] = self.per_step()
            fields["gflop_per_image_iteration"] = fields.pop("gflop")
        else:  # R-GAP has no iterations: one solve per image
            fields["mse"] = fields.pop("quality")
            fields["s_per_image"] = self.seconds / self.images
            del fields["steps"], fields["gflop"]
        return json.dumps({**head, **fields})


def iteration_gflop(run: Callable[[IGSettings], Any], s: IGSettings) -> float:
    """GFLOP of one iteration of one attack: counted runs of 4 and 2 iterations, differenced.

    The difference leaves out the work done once per attack (the update's
    norms, the final evaluation). Counted on one image by plain autograd:
    :class:`FlopCounterMode` overcounts the weight gradient of a grouped
    convolution (our batched route) by its number of groups.
    """
    counts = []
    for iterations in (2, 4):
        with FlopCounterMode(display=False) as counter:
            run(IGSettings(iterations, s.lr, s.tv))
        counts.append(counter.get_total_flops())
    return (counts[1] - counts[0]) / 2 / 1e9


def _run_loops(
    model: nn.Module, peer: nn.Module | None, attacker: Any, v: Victims, s: IGSettings
) -> dict[str, Any]:
    """Both per-image loops, interleaved image by image (order alternating); times and images."""
    n = v.images.shape[0]
    times: dict[str, list[float]] = {"ours": [], "breaching": []}
    recs: dict[str, list[Tensor]] = {"ours": [], "breaching": []}
    for i in range(n):
        sides = ["ours", "breaching"] if i % 2 == 0 else ["breaching", "ours"]
        for side in sides:
            if side == "ours":
                rec, sec = ours_attack(model, v, slice(i, i + 1), s)
            elif peer is not None:
                rec, sec = breaching_attack(attacker, peer, v, i)
            else:
                continue
            times[side].append(sec)
            recs[side].append(rec)
    return {"times": times, "recs": {k: torch.cat(r) for k, r in recs.items() if r}}


def run_ig_model(
    name: str,
    ds: Any,
    source: str,
    s: IGSettings,
    breaching: ModuleType | None,
    seed: int,
    device: str = "cpu",
) -> tuple[list[Row], dict[str, Any]]:
    """Every Inverting Gradients run of one model on ``device``; rows and notes (model check,
    agreement)."""
    registry_id, options = MODELS[name]
    torch.manual_seed(seed)
    model = build(registry_id, SHAPE, 10, **options).eval().to(device)
    v = victims_for(model, ds, source, seed)
    n, notes = v.images.shape[0], {}
    peer = attacker = None
    if breaching is not None:
        peer = peer_model(name, model, breaching)
        notes["max_logit_gap"] = check_same_function(model, peer, v.images)
        attacker = breaching_attacker(breaching, peer, s)
        warm = breaching_attacker(breaching, peer, IGSettings(2, s.lr, s.tv))
        breaching_attack(warm, peer, v, 0)
    ours_attack(model, v, slice(0, 1), IGSettings(2, s.lr, s.tv))  # warm-up
    gflop = iteration_gflop(lambda t: ours_attack(model, v, slice(0, 1), t), s)
    if breaching is not None:
        peer_gflop = iteration_gflop(
            lambda t: breaching_attack(breaching_attacker(breaching, peer, t), peer, v, 0), s
        )
        notes["gflop_per_iteration"] = {"ours": gflop, "breaching": peer_gflop}
    batch, t_batch = ours_attack(model, v, slice(None), s)
    loops = _run_loops(model, peer, attacker, v, s)
    t_loop = {k: sum(t) for k, t in loops["times"].items() if t}
    ref_loop = t_loop.get("breaching")
    rows = [Row("ig", name, f"ours, batched ({n} images, one program)", n, s.iterations,
                t_batch, v.psnr(batch), None if ref_loop is None else ref_loop / t_batch, gflop)]  # fmt: skip
    for side in t_loop:
        label = f"{side}, per-image loop ({n} images)"
        speed = None if ref_loop is None else ref_loop / t_loop[side]
        rec = loops["recs"][side]
        rows.append(
            Row("ig", name, label, n, s.iterations, t_loop[side], v.psnr(rec), speed, gflop)
        )
    single = {k: statistics.median(t) for k, t in loops["times"].items() if t}
    for side in single:
        speed = None if "breaching" not in single else single["breaching"] / single[side]
        label = f"{side}, single attack (median of {n})"
        rows.append(Row("ig", name, label, 1, s.iterations, single[side], None, speed, gflop))
    if len(loops["recs"]) == 2:
        a, b = (v.denormalize(loops["recs"][k]) for k in ("ours", "breaching"))
        notes["psnr_ours_vs_breaching_db"] = float(psnr(a, b).mean())
    return rows, notes


# ------------------------------------------------------------------------------------------
# R-GAP
# ------------------------------------------------------------------------------------------


def reference_rgap(
    peer: PeerCNN6, grads: list[Tensor], y: float, x: Tensor, aux: ModuleType, mu_steps: int
) -> tuple[np.ndarray, float]:
    """The R-GAP authors' recursion (their ``main.py``) on the float32 ``peer``: (input, μ seconds).

    From the last layer down: μ from ``⟨∇w, w⟩`` by Adam (``aux.inverse_udldu``),
    ``k = ∂ℓ/∂μ = −y / (1 + e^u)``; the linear layer's input from its gradient
    (``aux.fcn_reconstruction``); then for each convolution the pre-activation
    (inverse LeakyReLU), ``k`` carried back through the previous layer's
    (dense, circulant) weight matrix with the padding peeled off, and the
    layer's input from one dense least-squares problem (``aux.r_gap``).
    """
    _, shapes = peer(x)
    blocks = list(peer.body)
    setup = {"device": torch.device("cpu"), "dtype": torch.float32}
    k = x_ = last_w = out = None
    mu_seconds = 0.0
    for i in reversed(range(len(blocks))):
        layer, act = blocks[i].layer, blocks[i].act
        g, w = grads[i].numpy(), layer.weight.detach().numpy()
        if k is None:
            udldu = float(np.dot(g.reshape(-1), w.reshape(-1)))
            start = time.perf_counter()
            u = aux.inverse_udldu(udldu, setup, step_size=0.01, steps=mu_steps)
            mu_seconds = time.perf_counter() - start
            k = np.array([[-y / (1 + np.exp(u))]], dtype=np.float32)
        else:
            slope = act.negative_slope
            da = aux.derive_leakyrelu(x_, slope=slope)
            out = aux.inverse_leakyrelu(x_, slope=slope)
            above = blocks[i + 1].layer
            padding = above.padding[0] if isinstance(above, nn.Conv2d) else 0
            in_shape = np.array(shapes[i + 1])
            in_shape[0] = 1
            mask = aux.peeling(in_shape=in_shape, padding=padding)
            k = np.multiply(np.matmul(last_w.transpose(), k)[mask], da.transpose())
        if isinstance(layer, nn.Conv2d):
            x_, last_w = aux.r_gap(out=out, k=k, x_shape=shapes[i], module=layer, g=g, weight=w)
        else:
            x_, last_w = aux.fcn_reconstruction(k=k, gradient=g), w
    return np.asarray(x_).reshape(x.shape), mu_seconds


def _ours_rgap(model: nn.Module, x: Tensor, y: Tensor) -> tuple[float, float]:
    """Our R-GAP on one image ``x`` (float32, in [0, 1]) through float64 ``model``: (s, MSE)."""
    update = stack_updates([client_update(model, x.double(), y, loss="logistic")])
    start = time.perf_counter()
    rec = rgap(model, update, y, input_shape=SHAPE).inputs()
    seconds = time.perf_counter() - start
    return seconds, float(mse(rec, x.double()))


def _reference_one(
    peer: PeerCNN6, x: Tensor, y: Tensor, aux: ModuleType, mu_steps: int
) -> tuple[float, float, float]:
    """The reference's R-GAP on one image through float32 ``peer``: (s, s of the μ fit, MSE)."""
    logit, _ = peer(x)
    target = (y.float() + 1) / 2  # the authors' 0/1 target of their sigmoid cross-entropy
    loss = nn.functional.binary_cross_entropy_with_logits(logit.reshape(-1), target)
    grads = [g.detach() for g in torch.autograd.grad(loss, list(peer.parameters()))]
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # it prints residuals and ranks
        rec, mu_seconds = reference_rgap(peer, grads, float(y[0]), x, aux, mu_steps)
    seconds = time.perf_counter() - start
    return seconds, mu_seconds, float(mse(torch.from_numpy(rec).double(), x.double()))


def run_rgap(ds: Any, breaching: ModuleType | None, mu_steps: int, seed: int) -> list[Row]:
    """Ours and the reference's R-GAP on each image of ``ds`` (in [0, 1]), alternating order."""
    torch.manual_seed(seed)
    model = build("cnn6", SHAPE, 1).eval()
    ours64 = build("cnn6", SHAPE, 1).double().eval()
    ours64.load_state_dict(model.state_dict())
    peer = copy_weights(model, PeerCNN6()).eval()
    x = ds.images.float()
    with torch.no_grad():
        check_same_function(model, lambda t: peer(t)[0], x)
        y = torch.where(model(x).reshape(-1) > 0, -1, 1).long()  # the authors' reversed label
    aux = None if breaching is None else breaching.attacks.auxiliaries.recursive_attack
    _ours_rgap(ours64, x[:1], y[:1])  # warm-up
    runs: dict[str, list[tuple[float, ...]]] = {"ours": [], "reference": []}
    for i in range(x.shape[0]):
        xi, yi = x[i : i + 1], y[i : i + 1]
        for side in ["ours", "reference"] if i % 2 == 0 else ["reference", "ours"]:
            if side == "ours":
                runs["ours"].append(_ours_rgap(ours64, xi, yi))
            elif aux is not None:
                runs["reference"].append(_reference_one(peer, xi, yi, aux, mu_steps))
    n = x.shape[0]
    ours_s = sum(r[0] for r in runs["ours"])
    ours_mse = statistics.mean(r[-1] for r in runs["ours"])
    rows = [
        Row("rgap", "cnn6", "ours (structured solver, exact μ, float64)", n, 1, ours_s, ours_mse)
    ]
    if runs["reference"]:
        ref = sum(r[0] for r in runs["reference"])
        rows[0].speedup = ref / ours_s
        label = f"reference method (dense lstsq, μ by Adam {mu_steps} steps, float32)"
        ref_mse = statistics.mean(r[-1] for r in runs["reference"])
        rows.append(Row("rgap", "cnn6", label, n, 1, ref, ref_mse, 1.0))
        mu = sum(r[1] for r in runs["reference"])
        rows.append(Row("rgap", "cnn6", "  of which μ by Adam", n, 1, mu, None))
    return rows


# ------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------


def _version(package: str) -> str:
    """The installed version of ``package`` (breaching has no ``__version__``)."""
    from importlib.metadata import version

    return version(package)


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def print_tables(rows: list[Row], peak: float) -> None:
    """The markdown tables: Inverting Gradients (s/iteration, PSNR, share of ``peak`` FLOP/s)
    and R-GAP (s/image, MSE)."""
    ig = [r for r in rows if r.bench == "ig"]
    if ig:
        print(f"(share of peak: GFLOP per image-iteration × image-iterations/s over the "
              f"{peak / 1e9:.0f} GFLOP/s float32 matrix-multiply peak measured in this run)")  # fmt: skip
        print("| model | run | s / iteration | image-iterations / s | GFLOP / image-iteration "
              "| share of peak | PSNR (dB) | × breaching |")  # fmt: skip
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in ig:
            rate = r.images * r.steps / r.seconds
            share = None if r.gflop is None else r.gflop * 1e9 * rate / peak
            print(f"| {r.model} | {r.run} | {r.per_step():.4f} | {rate:.1f} | "
                  f"{_fmt(r.gflop, '.3g')} | {_fmt(share, '.0%')} | "
                  f"{_fmt(r.quality, '.2f')} | {_fmt(r.speedup, '.2f')} |")  # fmt: skip
        print()
    rg = [r for r in rows if r.bench == "rgap"]
    if rg:
        print("| model | run | s / image | MSE | × reference |")
        print("| --- | --- | ---: | ---: | ---: |")
        for r in rg:
            print(f"| {r.model} | {r.run} | {r.seconds / r.images:.3f} | "
                  f"{_fmt(r.quality, '.2e')} | {_fmt(r.speedup, '.1f')} |")  # fmt: skip
        print()


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("all", "ig", "rgap"), default="all")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (Inverting Gradients only)")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--tv", type=float, default=0.2, help="TV scale, breaching's convention")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=SHARED_CIFAR)
    parser.add_argument("--peers-dir", type=Path, default=REPO / ".peers")
    parser.add_argument("--rgap-images", type=int, default=1)
    parser.add_argument("--rgap-mu-steps", type=int, default=30_000)
    parser.add_argument("--json", type=Path, default=None, help="also write JSON lines here")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    torch.set_num_threads(args.threads)
    peer = import_breaching(args.peers_dir)
    breaching = peer if isinstance(peer, ModuleType) else None
    s = IGSettings(args.iterations, args.lr, args.tv)
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    peer_text = f"breaching {_version('breaching')}" if breaching else str(peer)
    if args.device != "cpu" and args.only != "ig":
        raise SystemExit("--device applies to Inverting Gradients only: add --only ig")
    device_name = torch.cuda.get_device_name(args.device) if args.device != "cpu" else "cpu"
    head = {"date": stamp, "nproc": os.cpu_count(), "threads": args.threads, "device": device_name,
            "torch": torch.__version__, "numpy": np.__version__, "peer": peer_text}  # fmt: skip
    print(f"# peers benchmark, {stamp}, {device_name}, nproc {head['nproc']}, "
          f"{args.threads} thread(s), "
          f"torch {torch.__version__}, numpy {np.__version__}")  # fmt: skip
    print(f"peer: {peer_text}")
    rows: list[Row] = []
    notes: dict[str, Any] = {}
    with threadpool_limits(limits=args.threads):
        if args.only in ("all", "ig"):
            ds, source = load_cifar(args.images, args.data, args.seed)
            print(f"images: {source}")
            print(f"Inverting Gradients: {args.iterations} iterations, lr {args.lr}, signed Adam, "
                  f"box, step decay at {s.milestones()}; TV scale {args.tv} (breaching, mean over "
                  f"C·H·W) = β {s.tv_ours:.4g} (ours, inversefed's mean per direction over "
                  f"C·(H−1)·W) — factor (H−1)/H = {(SHAPE[1] - 1) / SHAPE[1]:.4g}")  # fmt: skip
            for name in args.models:
                model_rows, notes[name] = run_ig_model(
                    name, ds, source, s, breaching, args.seed, args.device
                )
                rows += model_rows
                print(f"{name}: {json.dumps(notes[name])}", flush=True)
        if args.only in ("all", "rgap"):
            ds, source = load_cifar(args.rgap_images, args.data, args.seed)
            print(f"R-GAP images: {source} (in [0, 1], not normalised, as the authors' code)")
            rows += run_rgap(ds, breaching, args.rgap_mu_steps, args.seed)
    with threadpool_limits(limits=args.threads):
        peak = matmul_peak(args.device)
    head["peak_gflops"] = peak / 1e9
    print()
    print_tables(rows, peak)
    lines = [r.to_json(head) for r in rows]
    print("\n".join(lines))
    if args.json is not None:
        args.json.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
