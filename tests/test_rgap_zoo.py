"""R-GAP and the rank analysis on every network of the zoo (``leakagelib.models.available()``).

R-GAP attacks the plain chains (the zoo ``mlp`` included, whose ``norm`` slot
is an ``nn.Identity``) and names the first layer it cannot invert otherwise;
the rank analysis counts every model except those with self-attention or a
variational bottleneck, for which it says why.
"""

from __future__ import annotations

import pytest
import torch

from leakagelib import models
from leakagelib.data import load
from leakagelib.gradients import client_update, stack_updates
from leakagelib.rgap import rank_analysis, rgap

SHAPE = (3, 32, 32)

#: The zoo networks that are not plain chains, and the module R-GAP stops at.
NOT_CHAINS = {
    "bayes-cnn": "conv1.pool",
    "convbig": "conv1.pool",
    "convnet": "conv0.norm",
    "resnet18": "stem.norm",
    "resnet101": "stem.norm",
    "vit-small": "embed",
}


@pytest.mark.parametrize("classes", [1, 10])
def test_rgap_recovers_the_zoo_mlp(classes):
    torch.manual_seed(0)
    model = models.build("mlp", in_shape=(1, 8, 8), num_classes=classes).double()
    x = load("digits", n=1, seed=0).images[:1].double()
    label = 1 if classes == 1 else 3
    loss = "logistic" if classes == 1 else "ce"
    update = client_update(model, x, torch.tensor([label]), loss=loss)
    result = rgap(model, stack_updates([update]), [label], input_shape=(1, 8, 8))
    assert float(((result.inputs() - x) ** 2).mean()) < 1e-12


@pytest.mark.parametrize("name", models.available())
def test_rgap_attacks_each_zoo_chain_or_names_the_layer_it_cannot(name):
    torch.manual_seed(0)
    model = models.build(name, in_shape=SHAPE, num_classes=1).double()
    update = {k: torch.zeros(1, *p.shape, dtype=p.dtype) for k, p in model.named_parameters()}
    if name in NOT_CHAINS:
        with pytest.raises(
            TypeError, match=f"R-GAP cannot attack this model: module '{NOT_CHAINS[name]}'"
        ):
            rgap(model, update, [1], input_shape=SHAPE)
    else:  # a zero update is no logistic-loss gradient of any image: μ = 0, not an error
        assert rgap(model, update, [1], input_shape=SHAPE).inputs().shape == (1, *SHAPE)


def _variants():
    for name in models.available():
        yield name, None
        if name not in ("fcn3", "mlp"):  # a CVB needs feature maps or tokens
            yield name, "cvb"
        yield name, "precode"


@pytest.mark.parametrize(("name", "bottleneck"), list(_variants()))
def test_rank_analysis_counts_each_zoo_model_or_says_why_not(name, bottleneck):
    model = models.build(name, in_shape=SHAPE, num_classes=10, bottleneck=bottleneck)
    reason = None  # the first module the analysis meets that it cannot count, and why
    if name == "vit-small" and bottleneck != "cvb":
        reason = r"'block1.attention' \(Attention\): self-attention multiplies"
    elif bottleneck is not None:
        reason = r"\((PRECODE|CVB)\): a variational bottleneck samples a random latent"
    if reason is not None:
        with pytest.raises(TypeError, match=f"rank analysis cannot count module .*{reason}"):
            rank_analysis(model, SHAPE)
    else:
        analysis = rank_analysis(model, SHAPE)
        weighted = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
        assert analysis.ra_i < 0 and len(analysis.layers) <= len(weighted)
