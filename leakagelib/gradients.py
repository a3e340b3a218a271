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
labels off the last layer's gradient. Introduced in the chapter "What a client
update reveals".
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

Update = dict[str, Tensor]
LossFn = Callable[[Tensor, Tensor], Tensor]

__all__ = [
    "Update",
    "check_update",
    "client_update",
    "functional_gradient",
    "local_update",
    "loss_function",
    "params_of",
    "per_sample_updates",
    "recover_label_idlg",
    "recover_labels_batch",
]


def _cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of ``logits`` (N×K) against integer ``labels`` (N)."""
    return F.cross_entropy(logits, labels)


def _logistic(outputs: Tensor, labels: Tensor) -> Tensor:
    """R-GAP's binary loss: mean of log(1 + exp(-y·μ)), y ∈ {-1, +1}, μ the single logit.

    R-GAP (Zhu & Blaschko 2021, §3) analyses a network with one output and this
    loss, because ∂ℓ/∂μ = -y/(1 + e^{yμ}) then ties the scalar μ to the gradient.
    """
    mu = outputs.reshape(outputs.shape[0], -1)
    if mu.shape[1] != 1:
        raise ValueError(
            f"the logistic loss needs one output per sample, got {tuple(outputs.shape)}"
        )
    y = labels.to(mu.dtype).reshape(-1)
    return F.softplus(-y * mu[:, 0]).mean()


_LOSSES: dict[str, LossFn] = {"ce": _cross_entropy, "logistic": _logistic}


def loss_function(name: str) -> LossFn:
    """The loss ``name`` ("ce" or "logistic") as ``fn(outputs, labels) -> scalar``."""
    if name not in _LOSSES:
        raise KeyError(f"unknown loss {name!r}; available losses: {', '.join(sorted(_LOSSES))}")
    return _LOSSES[name]


def _check_batch(images: Tensor, labels: Tensor, loss: str) -> None:
    if images.dim() != 4:
        raise ValueError(f"images must be N×C×H×W, got shape {tuple(images.shape)}")
    if labels.dim() != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"labels must be a vector of length {images.shape[0]} (one per image), "
            f"got shape {tuple(labels.shape)}"
        )
    if loss == "logistic" and not bool(((labels == 1) | (labels == -1)).all()):
        raise ValueError("the logistic loss takes labels in {-1, +1}")


def params_of(model: nn.Module) -> Update:
    """A detached copy of the model's trainable parameters, in order."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def client_update(model: nn.Module, images: Tensor, labels: Tensor, *, loss: str = "ce") -> Update:
    """The gradient of the mean loss over ``images`` — the update of one FedSGD client.

    The model's parameters are not changed and its ``.grad`` fields are not touched.
    """
    _check_batch(images, labels, loss)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    value = loss_function(loss)(model(images), labels)
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
    _check_batch(images, labels, loss)
    if steps < 1 or lr <= 0:
        raise ValueError(f"local_update needs steps >= 1 and lr > 0, got steps={steps}, lr={lr}")
    n = images.shape[0]
    bs = n if batch_size is None else int(batch_size)
    if not 1 <= bs <= n:
        raise ValueError(f"batch_size must be between 1 and {n}, got {batch_size}")
    local = copy.deepcopy(model)
    start = params_of(local)
    opt = torch.optim.SGD([p for p in local.parameters() if p.requires_grad], lr=lr)
    fn = loss_function(loss)
    for step in range(steps):
        lo = (step * bs) % n
        idx = torch.arange(lo, lo + bs, device=images.device) % n
        opt.zero_grad()
        fn(local(images[idx]), labels[idx]).backward()
        opt.step()
    end = params_of(local)
    return {k: start[k] - end[k] for k in start}


def functional_gradient(
    model: nn.Module, *, loss: str = "ce"
) -> Callable[[Update, Tensor, Tensor], Update]:
    """A pure ``fn(params, images, labels) -> Update``: the gradient of the mean loss.

    Built on :func:`torch.func.functional_call`, so it composes with
    :func:`torch.func.grad` (attacks differentiate the gradient with respect to
    the input) and :func:`torch.func.vmap` (many attacks in one program).
    Buffers are read from ``model``; parameters come from ``params``.
    """
    fn = loss_function(loss)
    buffers = dict(model.named_buffers())

    def value(params: Update, images: Tensor, labels: Tensor) -> Tensor:
        return fn(functional_call(model, {**params, **buffers}, (images,)), labels)

    return grad(value)


def per_sample_updates(
    model: nn.Module, images: Tensor, labels: Tensor, *, loss: str = "ce"
) -> Update:
    """Each image's own gradient, stacked: every tensor gains a leading N dimension.

    One vectorised program (``vmap`` over ``grad``), no Python loop over
    samples; DP-SGD clips these before it averages them. Models with a
    variational bottleneck draw independent noise for each image.
    """
    _check_batch(images, labels, loss)
    gradient = functional_gradient(model, loss=loss)

    def one(params: Update, x: Tensor, y: Tensor) -> Update:
        return gradient(params, x.unsqueeze(0), y.unsqueeze(0))

    # randomness="different": a stochastic bottleneck samples fresh noise for every image
    return vmap(one, in_dims=(None, 0, 0), randomness="different")(params_of(model), images, labels)


def check_update(model: nn.Module, update: Update) -> None:
    """Raise ``ValueError`` naming the first way ``update`` does not fit ``model``."""
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
    for name, shape in expected.items():
        got = update[name]
        if not isinstance(got, Tensor):
            raise ValueError(f"update[{name!r}] is a {type(got).__name__}, not a tensor")
        if got.shape != shape:
            raise ValueError(
                f"update[{name!r}] has shape {tuple(got.shape)}, the parameter has {tuple(shape)}"
            )


def _last_layer(update: Update) -> tuple[Tensor, Tensor | None]:
    """The last fully connected layer's weight gradient (K×D) and its bias gradient, if any."""
    names = list(update)
    for i in range(len(names) - 1, -1, -1):
        g = update[names[i]]
        if g.dim() == 2:
            bias = (
                update.get(names[i][: -len("weight")] + "bias")
                if names[i].endswith("weight")
                else None
            )
            return g, bias
    raise ValueError("update has no 2-D (fully connected) weight gradient to read labels from")


def recover_label_idlg(update: Update) -> int:
    """The label of a single image from its cross-entropy gradient (iDLG, Zhao et al. 2020).

    For cross-entropy, the last layer's bias gradient is ``softmax(z) − onehot(y)``
    — negative only at the true label. Without a bias, the weight gradient's row
    ``k`` is that same factor times the (non-negative, after ReLU or sigmoid)
    penultimate features, so the true label's row is the one with a negative sum.
    """
    weight, bias = _last_layer(update)
    if bias is not None:
        return int(torch.argmin(bias).item())
    return int(torch.argmin(weight.sum(dim=1)).item())


def recover_labels_batch(update: Update, n: int) -> Tensor:
    """The ``n`` labels of a batch from its mean cross-entropy gradient (sorted).

    The rule of GradInversion (Yin et al. 2021, §3.2): for a batch of distinct
    labels, the rows of the last layer's weight gradient that belong to a label
    present in the batch have a strongly negative minimum entry; the ``n``
    rows with the most negative minima are the labels. It assumes non-negative
    penultimate features and no repeated label (the paper's setting); with
    repeats it still returns ``n`` distinct classes.
    """
    weight, _ = _last_layer(update)
    if not 1 <= n <= weight.shape[0]:
        raise ValueError(
            f"n must be between 1 and the number of classes {weight.shape[0]}, got {n}"
        )
    minima = weight.min(dim=1).values
    return torch.sort(torch.argsort(minima)[:n]).values
