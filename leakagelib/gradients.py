"""Client updates: what a federated client shares with the server.

An update is an ordered ``dict`` from parameter name to tensor, in the order of
``model.named_parameters()`` and holding only trainable parameters — the
"ordered, named per-layer structure" that defenses perturb and attacks read.

Two ways to compute one:

* :func:`client_update`, :func:`local_update` and :func:`per_sample_updates`
  evaluate a real model on real data (what the client does);
* :func:`functional_gradient` returns a *pure* function of
  ``(params, images, labels)``, which attacks differentiate through and batch
  with :func:`torch.func.vmap` (what the attacker simulates).

Label recovery (:func:`recover_label_idlg`, :func:`recover_labels_batch`) reads
labels off the last layer's gradient. :func:`check_batch` and
:func:`check_update` reject input no client could produce (an empty batch,
NaN pixels, labels that are not class indices of the model, non-finite
updates) with a message that names the argument and the fix. Introduced in the
chapter "What a client update reveals".
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from .losses import MARGIN_LOSSES, client_loss
from .validation import require_count, require_number

Update = dict[str, Tensor]

#: What a client's update is (:func:`client_update`), as every record's provenance states it
#: (:func:`leakagelib.records.provenance`); records made before the β·KL term entered the
#: update (2026-11-27) lack the key, so a chapter can tell which update a record attacked.
CLIENT_UPDATE = (
    "the training loss's gradient: the task loss plus β·KL of any variational bottleneck"
)

__all__ = [
    "CLIENT_UPDATE",
    "Update",
    "check_batch",
    "check_update",
    "client_update",
    "functional_gradient",
    "local_update",
    "params_of",
    "per_sample_norms",
    "per_sample_updates",
    "recover_label_idlg",
    "recover_labels_batch",
    "stack_updates",
]


def _num_classes(model: nn.Module, images: Tensor) -> int:
    """The model's number of outputs, preferably without a forward pass.

    Read off the last parametrised module when it is an ``nn.Linear`` (every
    classifier of the zoo). Otherwise one image is passed forward in eval mode
    with the random-number state forked, so that a bottleneck's noise draw or a
    batch-norm statistics update cannot change what the caller computes next.
    """
    last = None
    for module in model.modules():
        if any(True for _ in module.parameters(recurse=False)):
            last = module
    if isinstance(last, nn.Linear):
        return last.out_features
    modes = [(m, m.training) for m in model.modules()]
    devices = [images.device] if images.device.type == "cuda" else []
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            return int(model(images[:1]).shape[-1])
    finally:
        for module, training in modes:
            module.train(training)


def check_batch(model: nn.Module, images: Tensor, labels: Tensor, *, loss: str = "ce") -> None:
    """Raise for a batch no client could train on, naming the argument and the fix.

    ``images`` must be a non-empty finite ``N×C×H×W`` tensor and ``labels`` a
    vector of ``N`` integer class indices of the model's outputs: PyTorch's
    cross-entropy silently drops the label −100 (its ``ignore_index``) from the
    mean, and an out-of-range label fails obscurely inside ``vmap``. The
    logistic loss (R-GAP) takes labels in {−1, +1} instead.
    """
    if not isinstance(images, Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"images must be N×C×H×W, got shape {shape}")
    if images.shape[0] == 0:
        raise ValueError(
            "images is an empty batch (N = 0); a client update needs at least one image"
        )
    if not bool(torch.isfinite(images).all()):
        raise ValueError("images contain NaN or infinite values; clean or re-normalise the batch")
    if not isinstance(labels, Tensor) or labels.dim() != 1 or labels.shape[0] != images.shape[0]:
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(
            f"labels must be a vector of length {images.shape[0]} (one per image), got shape {shape}"
        )
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(
            f"labels must be integer class indices, got dtype {labels.dtype}; use labels.long()"
        )
    if loss in MARGIN_LOSSES:
        if not bool(((labels == 1) | (labels == -1)).all()):
            raise ValueError(f"the {loss} loss takes labels in {{-1, +1}}")
        return
    classes = _num_classes(model, images)
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= classes:
        raise ValueError(
            f"labels must be class indices in 0..{classes - 1} for this model's {classes} outputs, "
            f"got values {low}..{high}"
        )


def _all_finite(t: Tensor) -> bool:
    """Whether every entry of ``t`` is finite: its minimum and maximum are (NaN propagates).

    Two reductions, without the boolean copy of ``isfinite(t).all()`` — about
    35× faster on a 20-million-entry stacked update, which every attack checks.
    """
    if t.numel() == 0:
        return True
    low, high = torch.aminmax(t.detach())
    return bool(torch.isfinite(low) & torch.isfinite(high))


def params_of(model: nn.Module) -> Update:
    """A detached copy of the model's trainable parameters, in order."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def client_update(model: nn.Module, images: Tensor, labels: Tensor, *, loss: str = "ce") -> Update:
    """The gradient of the training loss over ``images`` — the update of one FedSGD client.

    The training loss is the mean ``loss``, plus β·KL for a model with a
    variational bottleneck (:func:`client_loss`). The model's parameters are
    not changed and its ``.grad`` fields are not touched.
    """
    check_batch(model, images, labels, loss=loss)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    value = client_loss(model, model(images), labels, loss=loss)
    grads = torch.autograd.grad(value, params)
    return {n: g.detach() for n, g in zip(names, grads, strict=True)}


def local_update(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    *,
    steps: int,
    lr: float,
    batch_size: int | None = None,
    loss: str = "ce",
) -> Update:
    """The weight difference θ₀ − θ_K after ``steps`` local SGD steps (a FedAvg client).

    Mini-batches of ``batch_size`` (default: the whole set) are taken in order,
    cycling through the data, so the update is deterministic. With
    ``steps=1`` and the full batch it equals ``lr * client_update(...)``.
    """
    check_batch(model, images, labels, loss=loss)
    require_count("steps", steps, "local SGD steps")
    require_number("lr", lr, "the local SGD step size", low=0.0, low_open=True)
    n = images.shape[0]
    bs = n if batch_size is None else int(batch_size)
    if not 1 <= bs <= n:
        raise ValueError(f"batch_size must be between 1 and {n}, got {batch_size}")
    local = copy.deepcopy(model)
    start = params_of(local)
    opt = torch.optim.SGD([p for p in local.parameters() if p.requires_grad], lr=lr)
    for step in range(steps):
        lo = (step * bs) % n
        idx = torch.arange(lo, lo + bs, device=images.device) % n
        opt.zero_grad()
        client_loss(local, local(images[idx]), labels[idx], loss=loss).backward()
        opt.step()
    end = params_of(local)
    return {k: start[k] - end[k] for k in start}


def functional_gradient(
    model: nn.Module, *, loss: str = "ce"
) -> Callable[[Update, Tensor, Tensor], Update]:
    """A pure ``fn(params, images, labels) -> Update``: the gradient of the training loss.

    Built on :func:`torch.func.functional_call`, so it composes with
    :func:`torch.func.grad` (attacks differentiate the gradient with respect to
    the input) and :func:`torch.func.vmap` (many attacks in one program).
    Buffers are read from ``model``; parameters come from ``params``. The loss
    is :func:`client_loss`'s (β·KL included for a model with a bottleneck).
    """
    buffers = dict(model.named_buffers())

    def value(params: Update, images: Tensor, labels: Tensor) -> Tensor:
        outputs = functional_call(model, {**params, **buffers}, (images,))
        return client_loss(model, outputs, labels, loss=loss)

    return grad(value)


def per_sample_updates(
    model: nn.Module, images: Tensor, labels: Tensor, *, loss: str = "ce"
) -> Update:
    """Each image's own gradient, stacked: every tensor gains a leading N dimension.

    One vectorised program (``vmap`` over ``grad``), no Python loop over
    samples; DP-SGD clips these before it averages them. Models with a
    variational bottleneck draw independent noise for each image.
    """
    check_batch(model, images, labels, loss=loss)
    gradient = functional_gradient(model, loss=loss)

    def one(params: Update, x: Tensor, y: Tensor) -> Update:
        return gradient(params, x.unsqueeze(0), y.unsqueeze(0))

    # randomness="different": a stochastic bottleneck samples fresh noise for every image
    return vmap(one, in_dims=(None, 0, 0), randomness="different")(params_of(model), images, labels)


def per_sample_norms(updates: Update) -> Tensor:
    """Each sample's gradient norm in a stacked update (leading dimension N), taken over all
    parameter tensors together (Opacus's "flat" norm): what DP-SGD clips, and how far an
    update stands out of a defense's noise (the chapters "Bayes versus heuristics under
    defenses" and "CVB against DP-SGD and gradient compression")."""
    if not updates:
        raise ValueError("the stacked update is empty")
    return torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in updates.values()))


def stack_updates(updates: Sequence[Update]) -> Update:
    """Several updates of one model as one stacked update (a leading dimension ``N``).

    The form every attack takes: ``stack_updates([update])`` is a single
    client's update as a batch of one.
    """
    updates = list(updates)
    if not updates:
        raise ValueError("stack_updates needs at least one update")
    return {k: torch.stack([u[k] for u in updates]) for k in updates[0]}


def check_update(model: nn.Module, update: Update, *, stacked: bool = False) -> int:
    """Raise ``ValueError`` naming the first way ``update`` does not fit ``model``.

    ``update`` maps every trainable parameter's name to a finite tensor of
    that parameter's shape; with ``stacked=True`` every tensor has one more,
    leading dimension ``N`` (one update per client, the attacks' input) and
    ``N`` is returned (1 otherwise).
    """
    if not isinstance(update, dict):
        raise ValueError(
            f"an update is a dict of parameter name → tensor, got {type(update).__name__}"
        )
    expected = {n: p.shape for n, p in model.named_parameters() if p.requires_grad}
    missing = [n for n in expected if n not in update]
    if missing:
        raise ValueError(f"update lacks the gradients of parameters {missing}")
    extra = [n for n in update if n not in expected]
    if extra:
        raise ValueError(
            f"update has entries {extra} that are not trainable parameters of the model"
        )
    leading = {}
    for name, shape in expected.items():
        got = update[name]
        if not isinstance(got, Tensor):
            raise ValueError(f"update[{name!r}] is a {type(got).__name__}, not a tensor")
        if stacked and got.dim() == len(shape) + 1 and got.shape[1:] == shape:
            leading[name] = got.shape[0]
        elif stacked:
            raise ValueError(
                f"update[{name!r}] has shape {tuple(got.shape)}, expected (N, *{tuple(shape)}): "
                "a stacked update has one leading dimension N, one slice per client"
            )
        elif got.shape != shape:
            raise ValueError(
                f"update[{name!r}] has shape {tuple(got.shape)}, the parameter has {tuple(shape)}"
            )
        if not _all_finite(got):
            raise ValueError(
                f"update[{name!r}] contains NaN or infinite entries; a client update is finite"
            )
    if stacked and len(set(leading.values())) > 1:
        raise ValueError(
            f"a stacked update needs the same leading dimension N in every tensor, got {leading}"
        )
    return next(iter(leading.values())) if stacked else 1


def _last_layer(model: nn.Module, update: Update) -> tuple[Tensor, Tensor | None]:
    """The last fully connected layer's weight gradient (K×D) and its bias gradient, if any.

    "Last" in the model's parameter order (``model.named_parameters()``), not
    in the order of the dict's keys, which a defense or a user may have changed.
    """
    check_update(model, update)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    for name in reversed(names):
        g = update[name]
        if g.dim() == 2:
            bias = update.get(name[: -len("weight")] + "bias") if name.endswith("weight") else None
            return g, bias
    raise ValueError("update has no 2-D (fully connected) weight gradient to read labels from")


def recover_label_idlg(model: nn.Module, update: Update) -> int:
    """The label of a single image from its cross-entropy gradient (iDLG, Zhao et al. 2020).

    For cross-entropy, the last layer's bias gradient is ``softmax(z) − onehot(y)``
    — negative only at the true label. Without a bias, the weight gradient's row
    ``k`` is that same factor times the (non-negative, after ReLU or sigmoid)
    penultimate features, so the true label's row is the one with a negative sum.
    The last layer is the last in ``model``'s parameter order.
    """
    weight, bias = _last_layer(model, update)
    if bias is not None:
        return int(torch.argmin(bias).item())
    return int(torch.argmin(weight.sum(dim=1)).item())


def recover_labels_batch(model: nn.Module, update: Update, n: int) -> Tensor:
    """The ``n`` labels of a batch from its mean cross-entropy gradient (sorted).

    The rule of GradInversion (Yin et al. 2021, §3.2): for a batch of distinct
    labels, the rows of the last layer's weight gradient that belong to a label
    present in the batch have a strongly negative minimum entry; the ``n``
    rows with the most negative minima are the labels. It assumes non-negative
    penultimate features and no repeated label (the paper's setting); with
    repeats it still returns ``n`` distinct classes. The last layer is the last
    in ``model``'s parameter order.
    """
    require_count("n", n, "the batch's number of images")
    weight, _ = _last_layer(model, update)
    if not 1 <= n <= weight.shape[0]:
        raise ValueError(
            f"n must be between 1 and the number of classes {weight.shape[0]}, got {n}"
        )
    minima = weight.min(dim=1).values
    return torch.sort(torch.argsort(minima)[:n]).values
