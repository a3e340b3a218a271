"""ATS: the augmentation policies of Automatic Transformation Search (Gao et al. 2021).

ATS trains on heavily augmented images so that the network's gradients are
hard to invert. A *policy* is a sequence of indices into a fixed table of 50
single transformations (each an AutoAugment operation at one magnitude), e.g.
``"7-4-15"``; a hybrid ``"21-13-3+7-4-15"`` applies one of its sequences,
drawn uniformly per image. The Bayes paper attacks the three policies that
work best for ConvNet on CIFAR-100, "7-4-15", "21-13-3" and their hybrid (A.2).

Facts from the authors' code (gaow0007/ATSPrivacy): the table (``policy.py``)
and the operations with their magnitude ranges (``autoaugment.py``: each entry
is applied always — its probability field is unused — and signed magnitudes
take a random sign); a policy is applied after ``RandomCrop(32, padding=4)``
and a random horizontal flip (``benchmark/comm.py``, ``build_transform`` in
"aug" mode); hybrids split on ``+`` and pick one sequence per image
(``sub_transform``). Here the operations are torchvision's tensor transforms
on images in [0, 1], so no PIL round trip is needed; translations fill with
black and rotations with mid-grey as there.

Used by the chapter "Breaking heuristic defenses" and ``bayes/fig2-training``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["POLICY_TABLE", "ATSAugmentation", "parse_policy"]


def _linspace(lo: float, hi: float, i: int) -> float:
    return lo + (hi - lo) * i / 9.0


#: The 50 single transformations, as (operation, magnitude index 0..9), in the authors' order.
POLICY_TABLE: tuple[tuple[str, int], ...] = (
    ("invert", 7), ("contrast", 6), ("rotate", 2), ("translateX", 9), ("sharpness", 1),
    ("sharpness", 3), ("shearY", 2), ("translateY", 2), ("autocontrast", 5), ("equalize", 2),
    ("shearY", 5), ("posterize", 5), ("color", 3), ("brightness", 5), ("sharpness", 9),
    ("brightness", 9), ("equalize", 5), ("equalize", 1), ("contrast", 7), ("sharpness", 5),
    ("color", 5), ("translateX", 5), ("equalize", 7), ("autocontrast", 8), ("translateY", 3),
    ("sharpness", 6), ("brightness", 6), ("color", 8), ("solarize", 0), ("invert", 0),
    ("equalize", 0), ("autocontrast", 0), ("equalize", 8), ("equalize", 4), ("color", 5),
    ("equalize", 5), ("autocontrast", 4), ("solarize", 4), ("brightness", 3), ("color", 0),
    ("solarize", 1), ("autocontrast", 0), ("translateY", 3), ("translateY", 3), ("autocontrast", 1),
    ("solarize", 1), ("equalize", 5), ("invert", 0), ("translateY", 3), ("autocontrast", 1),
)  # fmt: skip


def _magnitude(op: str, index: int) -> float:
    """The operation's magnitude at ``index`` (the ranges of the authors' ``SubPolicy``)."""
    ranges = {
        "shearX": (0.0, 0.3),
        "shearY": (0.0, 0.3),
        "translateX": (0.0, 150 / 331),
        "translateY": (0.0, 150 / 331),
        "rotate": (0.0, 30.0),
        "color": (0.0, 0.5),
        "solarize": (256.0, 0.0),
        "contrast": (0.0, 0.5),
        "sharpness": (0.0, 0.5),
        "brightness": (0.0, 0.5),
    }
    if op == "posterize":
        return float(round(_linspace(8.0, 4.0, index)))
    if op in ranges:
        return _linspace(*ranges[op], index)
    return 0.0


def _to_uint8(img: Tensor) -> Tensor:
    return (img.clamp(0, 1) * 255).round().to(torch.uint8)


def _from_uint8(img: Tensor) -> Tensor:
    return img.to(torch.float32) / 255.0


def _apply(op: str, m: float, img: Tensor, sign: float) -> Tensor:
    """One operation on a C×H×W image in [0, 1]; ``sign`` is the random ±1 of signed magnitudes."""
    import torchvision.transforms.v2.functional as TF  # here, not above: loads torch._dynamo (s)
    from torchvision.transforms import InterpolationMode

    nearest, bicubic = InterpolationMode.NEAREST, InterpolationMode.BICUBIC
    h, w = img.shape[-2:]
    if op in ("shearX", "shearY"):
        deg = math.degrees(math.atan(m)) * sign
        shear = [deg, 0.0] if op == "shearX" else [0.0, deg]
        return TF.affine(
            img,
            angle=0.0,
            translate=[0, 0],
            scale=1.0,
            shear=shear,
            interpolation=bicubic,
            fill=0.0,
        ).clamp(0, 1)
    if op in ("translateX", "translateY"):
        shift = [round(m * w * sign), 0] if op == "translateX" else [0, round(m * h * sign)]
        return TF.affine(
            img,
            angle=0.0,
            translate=shift,
            scale=1.0,
            shear=[0.0, 0.0],
            interpolation=nearest,
            fill=0.0,
        )
    if op == "rotate":
        return TF.rotate(img, m, interpolation=nearest, fill=128 / 255)
    if op == "color":
        return TF.adjust_saturation(img, 1 + m * sign) if img.shape[0] == 3 else img
    if op == "contrast":
        return TF.adjust_contrast(img, 1 + m * sign)
    if op == "sharpness":
        return TF.adjust_sharpness(img, 1 + m * sign)
    if op == "brightness":
        return TF.adjust_brightness(img, 1 + m * sign)
    if op == "posterize":
        return _from_uint8(TF.posterize(_to_uint8(img), int(m)))
    if op == "solarize":
        return _from_uint8(TF.solarize(_to_uint8(img), m))
    if op == "autocontrast":
        return TF.autocontrast(img)
    if op == "equalize":
        return _from_uint8(TF.equalize(_to_uint8(img)))
    if op == "invert":
        return TF.invert(img)
    raise KeyError(f"unknown ATS operation {op!r}")  # pragma: no cover - the table is fixed


def parse_policy(policy: str) -> list[list[int]]:
    """``"7-4-15"`` → ``[[7, 4, 15]]``; ``"21-13-3+7-4-15"`` → two sequences (a hybrid)."""
    if not isinstance(policy, str) or not policy.strip():
        raise ValueError(f"an ATS policy is a string like '7-4-15', got {policy!r}")
    out = []
    for part in policy.split("+"):
        try:
            seq = [int(i) for i in part.strip().split("-")]
        except ValueError as err:
            raise ValueError(
                f"cannot read ATS policy {policy!r}: {part!r} is not '-'-joined integers"
            ) from err
        bad = [i for i in seq if not 0 <= i < len(POLICY_TABLE)]
        if bad:
            raise ValueError(
                f"ATS policy {policy!r} names transformations {bad} outside 0..{len(POLICY_TABLE) - 1}"
            )
        out.append(seq)
    return out


class ATSAugmentation:
    """Apply an ATS policy to a client's images (N×C×H×W in [0, 1]); returns new images.

    ``crop_flip`` (default on, as in the authors' training) first takes a random
    crop after 4-pixel zero padding and flips horizontally with probability
    1/2. All randomness comes from ``generator``, so a seeded call is
    reproducible. Used as the ``augment`` hook of :func:`leakagelib.fl.train`.
    """

    def __init__(self, policy: str, *, crop_flip: bool = True) -> None:
        self.policy = policy
        self.sequences = parse_policy(policy)
        self.crop_flip = crop_flip

    def __call__(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if images.dim() != 4:
            raise ValueError(f"images must be N×C×H×W, got shape {tuple(images.shape)}")
        out = []
        for img in images.detach().cpu():
            out.append(self._one(img, generator))
        return torch.stack(out).to(images.device, images.dtype)

    def _one(self, img: Tensor, g: torch.Generator | None) -> Tensor:
        def rand() -> float:
            return float(torch.rand((), generator=g))

        if self.crop_flip:
            h, w = img.shape[-2:]
            padded = torch.nn.functional.pad(img, (4, 4, 4, 4))
            top = int(torch.randint(0, 9, (), generator=g))
            left = int(torch.randint(0, 9, (), generator=g))
            img = padded[:, top : top + h, left : left + w]
            if rand() < 0.5:
                img = img.flip(-1)  # a horizontal flip
        seq = self.sequences[int(torch.randint(0, len(self.sequences), (), generator=g))]
        for index in seq:
            op, level = POLICY_TABLE[index]
            sign = 1.0 if rand() < 0.5 else -1.0
            img = _apply(op, _magnitude(op, level), img, sign)
        return img.clamp(0, 1)

    def describe(self) -> dict[str, str]:
        return {"defense": "ats", "policy": self.policy}
