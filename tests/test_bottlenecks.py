"""PRECODE, CVB, their placement in zoo models, and the gradient analysis tools."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from leakagelib import models
from leakagelib.analysis import entry_trace, layer_cosine, similarity_trace
from leakagelib.defenses.bottlenecks import (
    CVB,
    PRECODE,
    TokenGrid,
    adaptive_size,
    bottlenecks,
    kl_loss,
    kl_loss_rows,
)
from leakagelib.defenses.surgery import (
    apply_bottleneck_option,
    attacked_parameters,
    insert_bottleneck,
    stochastic_parameters,
)
from leakagelib.gradients import client_update

SHAPE = (3, 32, 32)


@pytest.fixture(scope="module")
def cnn() -> nn.Module:
    torch.manual_seed(0)
    return models.build("cvb-cnn", in_shape=SHAPE, num_classes=10)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_precode_parameter_counts_match_cvb_table_2(cnn: nn.Module) -> None:
    # CVB paper Table II: the baseline CNN and bias-free PRECODE (K = C/2) at positions 3, 2, 1.
    assert n_params(cnn) == 65_962
    expected = {3: 72_106, 2: 104_362, 1: 141_226}
    for pos, total in expected.items():
        spec = {"kind": "precode", "position": pos, "K": "adaptive", "bias": False}
        assert n_params(apply_bottleneck_option(cnn, spec, SHAPE)) == total


def test_cvb_parameter_formula_and_fewer_than_precode(cnn: nn.Module) -> None:
    for pos, channels in ((1, 16), (2, 32), (3, 64)):
        with_cvb = apply_bottleneck_option(cnn, {"kind": "cvb", "position": pos}, SHAPE)
        ((_, vb),) = bottlenecks(with_cvb)
        k, K = 5, adaptive_size(channels)
        assert vb.added_parameters == 2 * k * k * channels * K + K * channels
        assert n_params(with_cvb) - n_params(cnn) == vb.added_parameters
        for precode in (
            {"kind": "precode", "position": pos},
            {"kind": "precode", "position": pos, "K": "adaptive"},
        ):
            with_precode = apply_bottleneck_option(cnn, precode, SHAPE)
            if pos < 3:  # at 1×1 maps (position 3) a k×k convolution has no advantage
                assert vb.added_parameters < bottlenecks(with_precode)[0][1].added_parameters


def test_adaptive_size_follows_the_authors_rule() -> None:
    assert [adaptive_size(c) for c in (3, 7, 8, 16, 65)] == [8, 8, 4, 8, 32]
    with pytest.raises(ValueError, match="positive"):
        adaptive_size(0)


def test_scale_sets_bottleneck_channels() -> None:
    assert CVB(16, scale=0.25).K == 4
    assert CVB(16, scale=2.0).K == 32
    with pytest.raises(ValueError, match="not both"):
        CVB(16, K=4, scale=0.5)


@pytest.mark.parametrize("kl", ["gaussian", "reference"])
def test_kl_terms_are_non_negative(kl: str) -> None:
    torch.manual_seed(1)
    vb = CVB(6, kernel_size=3, kl=kl)
    for _ in range(3):
        vb(3 * torch.randn(4, 6, 7, 7))
        assert float(vb.last_kl.detach()) >= 0
    pre = PRECODE((6, 4, 4), K=16)
    pre(torch.randn(5, 6, 4, 4))
    assert float(pre.last_kl.detach()) >= 0


def test_kl_vanishes_exactly_at_the_standard_normal() -> None:
    pre = PRECODE((10,), K=4)
    with torch.no_grad():
        pre.encoder.weight.zero_()
        pre.encoder.bias[:4] = 0.0
        pre.encoder.bias[4:] = math.log(math.e - 1.0)  # softplus → σ = 1
    pre(torch.randn(3, 10))
    assert abs(float(pre.last_kl.detach())) < 1e-6
    with torch.no_grad():
        pre.encoder.bias[:4] = 1.0  # μ = 1: KL = K·½·1² nats = 2 nats = 2/ln 2 bits
    pre(torch.randn(3, 10))
    assert float(pre.last_kl.detach()) == pytest.approx(2.0 / math.log(2.0), rel=1e-5)


def test_forward_keeps_shape_and_is_stochastic(cnn: nn.Module) -> None:
    model = apply_bottleneck_option(cnn, "cvb@1", SHAPE)
    x = torch.rand(2, *SHAPE)
    a, b = model(x), model(x)
    assert a.shape == (2, 10)
    assert not torch.allclose(a, b)
    assert torch.equal(cnn(x), cnn(x))  # the original is untouched and deterministic


def test_kl_loss_is_the_beta_weighted_sum(cnn: nn.Module) -> None:
    model = apply_bottleneck_option(cnn, {"kind": "cvb", "position": [1, 2], "beta": 0.5}, SHAPE)
    model(torch.rand(3, *SHAPE))
    found = bottlenecks(model)
    assert [n for n, _ in found] == ["cvb_1", "cvb_2"]
    total = sum(0.5 * float(m.last_kl.detach()) for _, m in found)
    assert float(kl_loss(model).detach()) == pytest.approx(total)
    assert float(kl_loss(cnn)) == 0.0


@pytest.mark.parametrize("spec", [{"kind": "cvb", "position": [1, 2], "kl": "reference"},
                                  {"kind": "precode", "position": 3}], ids=["cvb", "precode"])  # fmt: skip
def test_each_row_has_its_own_kl_term(cnn: nn.Module, spec: dict, monkeypatch) -> None:
    """The per-row terms average to the batch's, and a row's does not depend on the others
    (what lets the hooked attack engine give every attack the KL of its own rows); the noise
    is held at zero, since a second bottleneck's KL depends on the first one's draw."""
    monkeypatch.setattr(torch, "randn_like", torch.zeros_like)
    model = apply_bottleneck_option(cnn, spec, SHAPE)
    x = torch.rand(3, *SHAPE)
    model(x)
    rows = kl_loss_rows(model).detach()
    assert rows.shape == (3,) and len(set(rows.tolist())) == 3
    assert float(rows.mean()) == pytest.approx(float(kl_loss(model).detach()), rel=1e-6)
    model(x[1:2])
    assert float(kl_loss_rows(model).detach()[0]) == pytest.approx(float(rows[1]), rel=1e-5)
    assert kl_loss_rows(cnn) is None


def test_ignore_selection_splits_at_the_decoder(cnn: nn.Module) -> None:
    model = apply_bottleneck_option(cnn, "cvb@1", SHAPE)
    assert attacked_parameters(model) == [
        "conv1.conv.weight",
        "conv1.conv.bias",
        "cvb.mu_encoder.weight",
        "cvb.std_encoder.weight",
    ]
    assert stochastic_parameters(model)[0] == "cvb.decoder.weight"
    assert stochastic_parameters(model)[-1] == "head.bias"
    assert stochastic_parameters(cnn) == []
    # The gradients of the decoder and later layers change with the noise; the input is fixed.
    x, y = torch.rand(1, *SHAPE), torch.tensor([3])
    torch.manual_seed(0)
    g1 = client_update(model, x, y)
    torch.manual_seed(1)
    g2 = client_update(model, x, y)
    for name in stochastic_parameters(model):
        assert not torch.allclose(g1[name], g2[name])


def test_original_parameter_names_survive_insertion(cnn: nn.Module) -> None:
    model = apply_bottleneck_option(cnn, "precode", SHAPE)
    names = [n for n, _ in model.named_parameters()]
    for n, _ in cnn.named_parameters():
        assert n in names
    assert [n for n, _ in model.named_children()][-3:] == ["precode", "flatten", "head"]


def test_vit_tokens_are_reshaped_to_a_grid() -> None:
    torch.manual_seed(0)
    vit = models.build("vit-small", in_shape=SHAPE, num_classes=10)
    model = apply_bottleneck_option(
        vit, {"kind": "cvb", "position": "block1", "kernel_size": 3}, SHAPE
    )
    grid = model.get_submodule("cvb")
    assert isinstance(grid, TokenGrid)
    assert grid.bottleneck.in_channels == 65 and grid.bottleneck.K == 32 and grid.side == 16
    assert model(torch.rand(2, *SHAPE)).shape == (2, 10)
    with pytest.raises(ValueError, match="square"):
        TokenGrid(CVB(65), 250)


def test_resnet_insertion_by_stage_name() -> None:
    torch.manual_seed(0)
    net = models.build("resnet18", in_shape=SHAPE, num_classes=10)
    model = apply_bottleneck_option(net, {"kind": "cvb", "position": "layer1", "beta": 5e-5}, SHAPE)
    assert [n for n, _ in model.named_children()][2:4] == ["layer1", "cvb"]
    assert model(torch.rand(2, *SHAPE)).shape == (2, 10)


def test_insert_a_ready_module_and_a_factory(cnn: nn.Module) -> None:
    ready = insert_bottleneck(cnn, CVB(16, kernel_size=3), 1)
    assert ready.get_submodule("bottleneck").kernel_size == 3
    on_input = insert_bottleneck(cnn, lambda s: CVB(s[0]), 0, in_shape=SHAPE)
    assert [n for n, _ in on_input.named_children()][:3] == ["input", "bottleneck", "conv1"]
    assert on_input(torch.rand(1, *SHAPE)).shape == (1, 10)


def test_bad_specs_raise_clear_errors(cnn: nn.Module) -> None:
    with pytest.raises(ValueError, match="unknown bottleneck kind"):
        apply_bottleneck_option(cnn, "vae@1", SHAPE)
    with pytest.raises(ValueError, match="position must be between"):
        apply_bottleneck_option(cnn, "cvb@9", SHAPE)
    with pytest.raises(KeyError, match="no child"):
        apply_bottleneck_option(cnn, "cvb@conv9", SHAPE)
    with pytest.raises(KeyError, match="kind"):
        apply_bottleneck_option(cnn, {"position": 1}, SHAPE)
    with pytest.raises(ValueError, match="in_shape"):
        insert_bottleneck(cnn, lambda s: CVB(s[0]), 1)
    with pytest.raises(TypeError, match="nn.Sequential"):
        insert_bottleneck(nn.Linear(3, 3), CVB(3), 1)
    with pytest.raises(ValueError, match="C×H×W"):
        apply_bottleneck_option(cnn, "cvb@4", SHAPE)  # after the classifier: logits, not maps
    with pytest.raises(ValueError, match="shape"):
        PRECODE((4,), K=2)(torch.randn(2, 5))
    with pytest.raises(ValueError, match="kernel_size"):
        CVB(4, kernel_size=4)
    assert apply_bottleneck_option(cnn, None, SHAPE) is cnn


def test_layer_cosine_and_traces(cnn: nn.Module) -> None:
    x, y = torch.rand(1, *SHAPE), torch.tensor([2])
    g = client_update(cnn, x, y)
    neg = {k: -v for k, v in g.items()}
    assert all(v == pytest.approx(1.0) for v in layer_cosine(g, g).values())
    assert all(v == pytest.approx(-1.0) for v in layer_cosine(g, neg).values())
    iterates = torch.stack([torch.rand(1, *SHAPE), x])
    trace = similarity_trace(cnn, g, iterates, y)
    assert list(trace) == ["conv1.conv", "conv2.conv", "conv3.conv", "head"]
    for values in trace.values():
        assert values.shape == (2,) and values[1] == pytest.approx(1.0)
        assert values[0] < 0.9999
    # With a CVB the decoder's gradient at the true input no longer matches the client's.
    model = apply_bottleneck_option(cnn, "cvb@1", SHAPE)
    torch.manual_seed(5)
    target = client_update(model, x, y)
    noisy = similarity_trace(model, target, x.unsqueeze(0), y)
    assert float(noisy["cvb.decoder"][0]) < 0.999
    entries = entry_trace(cnn, iterates, y, {"head.weight": 0, "conv1.conv.weight": 7})
    assert entries["head.weight"][1] == pytest.approx(float(g["head.weight"].reshape(-1)[0]))


def test_attacks_and_per_sample_gradients_run_on_stochastic_models() -> None:
    """vmap must let each attack and each image draw its own bottleneck noise."""
    from leakagelib.attacks import AttackConfig, Gaussian, Uniform, reconstruct
    from leakagelib.gradients import per_sample_updates

    torch.manual_seed(0)
    model = models.build("cvb-cnn", (3, 32, 32), 10, bottleneck="cvb")
    x, y = torch.rand(2, 3, 32, 32), torch.tensor([1, 2])
    ups = per_sample_updates(model, x, y)
    assert ups["head.weight"].shape[0] == 2
    res = reconstruct(
        model,
        ups,
        labels=y,
        likelihood=Gaussian(),
        prior=Uniform(),
        config=AttackConfig(steps=2, lr=0.1),
        input_shape=(3, 32, 32),
    )
    assert torch.isfinite(res.inputs()).all()


def test_precode_mlp_is_broken_exactly_by_the_closed_form_attack() -> None:
    """Bayes paper §6 (issue claim): every image through a PRECODE MLP above 100 dB."""
    from leakagelib.experiments import run

    rows = run("bayes/precode-mlp", "ci", progress=False)["rows"]
    assert len(rows) == 8
    assert all(r["psnr"] > 100 for r in rows), [r["psnr"] for r in rows]


def test_cvb_attack_sets_each_preset_to_the_authors_values() -> None:
    """cvb_common.cvb_attack: presets by id with the CVB protocol's overrides, nothing re-built."""
    from leakagelib.attacks import Cosine, Gaussian, TotalVariation
    from leakagelib.experiments.cvb_common import ATTACK, cvb_attack

    ci, paper = ATTACK.at("ci"), ATTACK.at("paper")
    ig = cvb_attack("inverting-gradients", paper, include=["conv1.conv.weight"])
    assert ig.name == "inverting-gradients" and isinstance(ig.likelihood, Cosine)
    # the authors' TV (src/loss.py) averages each direction, as inversefed does
    assert ig.prior == TotalVariation(power=1, reduction="mean") and ig.labels == "given"
    assert (ig.config.steps, ig.config.lr, ig.config.beta) == (20_000, 1.0, 0.1)
    assert ig.config.signed and ig.config.box and ig.config.init == "normal"
    # configs/attacks/IG.yaml: ReduceLROnPlateau ×0.1 after 400, stop after 4000, below 1e-5
    loop = (ig.config.schedule, ig.config.decay, ig.config.plateau_patience,
            ig.config.stop_patience, ig.config.stop_below, ig.config.keep_best)  # fmt: skip
    assert loop == ("plateau", 0.1, 400, 4000, 1e-5, True)
    assert ig.likelihood.layers.include == ["conv1.conv.weight"]
    # configs/models/*.yaml: 0.1 for the CNN and ResNet-18, 1e-4 for the ViT, at both scales
    for scale in (ci, paper):
        betas = {a: cvb_attack("inverting-gradients", scale, architecture=a).config.beta
                 for a in ("cnn", "resnet18", "vit")}  # fmt: skip
        assert betas == {"cnn": 0.1, "resnet18": 0.1, "vit": 1e-4}
    with pytest.raises(ValueError, match="unknown architecture 'mlp'"):
        cvb_attack("inverting-gradients", ci, architecture="mlp")
    idlg = cvb_attack("idlg", ci)
    assert isinstance(idlg.likelihood, Gaussian)
    assert idlg.likelihood.sigma == pytest.approx(2**-0.5)  # ‖g − s‖², the authors' GL2
    assert (idlg.config.steps, idlg.config.lr, idlg.config.beta) == (10, 1.0, 0.0)
    assert idlg.config.optimizer == "lbfgs" and idlg.config.box and idlg.labels == "given"
    assert (idlg.config.schedule, idlg.config.plateau_patience, idlg.config.stop_patience) == (
        "plateau",
        40,
        400,
    )
    cpl = cvb_attack("cpl", paper, steps=7, lr=0.5)
    assert (cpl.config.steps, cpl.config.lr, cpl.config.init) == (7, 0.5, "normal")
    assert not cpl.config.box and cpl.labels == "given" and cpl.config.keep_best
    # src/attacks.py, attack_batch: the iterate after the best step, for every attack and scale
    assert {cvb_attack(a, scale).config.best_iterate
            for a in ("inverting-gradients", "idlg", "cpl") for scale in (ci, paper)} == {
        "after-step"
    }  # fmt: skip
    kept = ATTACK.changed("paper", {"best_iterate": "recorded"}).at("paper")
    assert cvb_attack("idlg", kept).config.best_iterate == "recorded"
    assert cpl.parts()["prior"] == {"prior": "logit-label-distance"}
    # the label weight is the model config's attack.regularization, which overrides CPL.yaml's 0.01
    for scale in (ci, paper):
        alphas = {a: cvb_attack("cpl", scale, architecture=a).config.beta
                  for a in ("cnn", "resnet18", "vit")}  # fmt: skip
        assert alphas == {"cnn": 0.1, "resnet18": 0.1, "vit": 1e-4}
    with pytest.raises(ValueError, match="unknown attack 'dlg'"):
        cvb_attack("dlg", ci)


def test_cvb_experiments_store_their_config_and_the_papers_rows() -> None:
    """Every cvb/* experiment: protocol values in its config, reference rows keyed like its rows."""
    from leakagelib import experiments, reporting
    from leakagelib.experiments.cvb_common import ATTACK, TRAINING

    ids = [i for i in experiments.available() if i.startswith("cvb/")]
    assert len(ids) == 8
    for experiment_id in ids:
        exp = experiments.get(experiment_id)
        assert exp.datasets, experiment_id
        assert set(exp.config.ci) & (set(ATTACK.ci) | set(TRAINING.ci)), experiment_id
        assert all(key in exp.config.sources for key in exp.config.ci), experiment_id
        for row in exp.reference:
            assert set(row) <= set(exp.row_keys), (experiment_id, row)
    table2 = experiments.get("cvb/table2-placement").config
    assert table2.at("ci").victims == 2 and table2.at("paper").rounds == 300
    run = {"rows": [{"position": 0, "parameters": 65_962, "ssim": 0.4}]}
    shown = reporting.compare(
        "cvb/table2-placement", run, on=("position",), values=("parameters", "ssim"), record=None
    ).rows
    assert shown[0]["parameters (paper)"] == shown[0]["parameters (this run)"] == 65_962
    assert shown[0]["ssim (paper)"] == reporting.MISSING and shown[0]["ssim (this run)"] == 0.4
    assert [r["position"] for r in shown] == [0, 3, 2, 1]


def test_gradient_trace_follows_the_attack_and_overrides_apply() -> None:
    """cvb_analysis.gradient_trace (CVB Fig. 6) sees every iterate; steps and callback reach it."""
    from leakagelib.experiments.cvb_analysis import attack_ssim, gradient_trace, victims
    from leakagelib.experiments.cvb_common import PRECODE_TABLE2, cnn

    images, labels, norm = victims("mnist", 2, scale="ci", seed=0)
    assert images.shape == (2, *SHAPE) and norm.mean == (norm.mean[0],) * 3
    model = cnn({**PRECODE_TABLE2, "position": 3}, seed=0)
    trace = gradient_trace(model, images, labels, norm, steps=3)
    assert {"conv1.conv", "precode.encoder", "precode.decoder", "head"} <= set(trace)
    assert all(v.shape == (3,) and torch.isfinite(v).all() for v in trace.values())
    seen: list[int] = []
    ssim, recon = attack_ssim(
        model, images, labels, norm, steps=2, lr=0.5, callback=lambda t, _: seen.append(t)
    )
    assert seen == [0, 1] and ssim.shape == (2,) and recon.shape == images.shape


def test_attack_ssim_is_fixed_by_its_seed_and_offset() -> None:
    """cvb_analysis.attack_ssim draws noise and initialisation from seed and offset only."""
    from leakagelib.experiments.cvb_analysis import attack_ssim, victims
    from leakagelib.experiments.cvb_common import CVB_DEFAULT, cnn

    images, labels, norm = victims("cifar10", 2, scale="ci", seed=0)
    model = cnn(CVB_DEFAULT, seed=0)

    def ssim(**seeding: int) -> torch.Tensor:
        return attack_ssim(model, images, labels, norm, steps=2, **seeding)[0]

    assert torch.equal(ssim(seed=3), ssim(seed=3))
    assert not torch.equal(ssim(seed=3), ssim(seed=4))
    assert not torch.equal(ssim(seed=3), ssim(seed=3, offset=1))


def test_dp_noise_lowers_closed_form_psnr_and_epsilon() -> None:
    """Issue claim (chapter "Variational bottlenecks"): PSNR and ε both fall as σ rises."""
    import warnings

    from leakagelib import metrics
    from leakagelib.attacks import closed_form
    from leakagelib.defenses import DPSGD, epsilon_spent
    from leakagelib.experiments.cvb_analysis import victims

    images, labels, norm = victims("mnist", 2, scale="ci", seed=0)
    x = norm.normalize(images).double()
    torch.manual_seed(0)
    mlp = models.build("mlp", in_shape=SHAPE, num_classes=10, widths=(100,)).double()
    psnr, eps = [], []
    for sigma in (1e-4, 1e-3, 1e-2):
        dp, gen = (
            DPSGD(sigma, max_grad_norm=1.0, sample_rate=0.01),
            torch.Generator().manual_seed(0),
        )
        shared = dp.share(mlp, x, labels, gen, per_image=True)  # each image a one-step client
        rec = closed_form.bias_attack(mlp, shared, labels, input_shape=SHAPE).inputs()
        psnr.append(float(metrics.psnr(norm.denormalize(rec).float().clamp(0, 1), images).mean()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            eps.append(epsilon_spent(sigma, 0.01, 1000, 1e-5))
    assert psnr[0] > psnr[1] > psnr[2], psnr
    assert eps[0] > eps[1] > eps[2], eps


def test_table6_runs_on_the_medmnist_files_it_finds_and_names_the_rest(tmp_path, monkeypatch):
    """cvb/table6-medical reads MedMNIST release files from the data root; absent ones are noted."""
    import numpy as np

    from leakagelib import experiments

    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "pneumoniamnist.npz",
        train_images=rng.integers(0, 256, (64, 28, 28), dtype=np.uint8),
        train_labels=rng.integers(0, 2, (64, 1)),
        test_images=rng.integers(0, 256, (4, 28, 28), dtype=np.uint8),
        test_labels=np.array([[0], [1], [0], [1]]),
    )
    monkeypatch.setenv("LEAKAGELIB_DATA_ROOT", str(tmp_path))
    monkeypatch.delenv("LEAKAGELIB_DATA", raising=False)
    record = experiments.run("cvb/table6-medical", "ci", progress=False)
    assert [(r["dataset"], r["defense"]) for r in record["rows"]] == [
        ("pneumoniamnist", "none"),
        ("pneumoniamnist", "cvb"),
    ]
    assert all(0.0 <= r["accuracy"] <= 1.0 and -1.0 <= r["ssim"] <= 1.0 for r in record["rows"])
    for row in record["rows"]:  # Fig. 12: the victims beside their reconstructions
        original, recon = (np.array(row["pictures"][k]) for k in ("original", "reconstruction"))
        assert original.shape == recon.shape and original.shape[1:] == (3, 32, 32)
        assert 0 < len(original) <= 4 and 0.0 <= min(original.min(), recon.min())
        assert max(original.max(), recon.max()) <= 1.0
    assert record["data"]["dermamnist"].startswith("skipped: MedMNIST file")
    # a dataset whose client 0 holds fewer images than victims stops the run before any attack
    np.savez(
        tmp_path / "retinamnist.npz",
        train_images=rng.integers(0, 256, (4, 28, 28, 3), dtype=np.uint8),  # 1 for client 0
        train_labels=np.array([[0], [1], [2], [3]]),
        test_images=rng.integers(0, 256, (2, 28, 28, 3), dtype=np.uint8),
        test_labels=np.array([[0], [1]]),
    )

    def no_attack(*args: object, **kwargs: object) -> None:  # not even PneumoniaMNIST's, first
        raise AssertionError("an attack ran before every dataset's victims were checked")

    monkeypatch.setattr(experiments.cvb_architectures, "run_attack", no_attack)
    with pytest.raises(ValueError, match="victims of retinamnist, but client 0 trains on only"):
        experiments.run("cvb/table6-medical", "ci", progress=False)
    (tmp_path / "retinamnist.npz").unlink()
    (tmp_path / "pneumoniamnist.npz").unlink()
    with pytest.raises(RuntimeError, match="pip install medmnist"):
        experiments.run("cvb/table6-medical", "ci", progress=False)


def test_table3_paper_branch_runs_on_both_datasets(tmp_path, monkeypatch):
    """cvb/table3-attacks through its paper-scale code (both datasets, MNIST resized to the
    authors' 3×32×32, every attack and defense), with victims and attack steps shrunk."""
    from dataclasses import replace

    import numpy as np

    from leakagelib import data, experiments
    from leakagelib.experiments import cvb_defenses, registry
    from leakagelib.experiments.cvb_common import ATTACKS

    exp = experiments.get("cvb/table3-attacks")
    config = replace(exp.config, paper={**exp.config.paper, "victims": 2})
    monkeypatch.setitem(registry._EXPERIMENTS, exp.id, replace(exp, config=config))
    paths = {}
    for logical, spec in (("mnist", "digits28"), ("cifar10", "patches")):
        images, labels, _ = data.load(spec, n=160, split="all", shuffle=False)
        paths[logical] = str(tmp_path / f"{logical}.npz")
        np.savez(paths[logical], images=(images * 255).round().byte().numpy(), labels=labels)
    attack = cvb_defenses.cvb_attack
    monkeypatch.setattr(
        cvb_defenses, "cvb_attack", lambda *a, **kw: attack(*a, **kw).with_config(steps=2)
    )
    record = experiments.run("cvb/table3-attacks", "paper", data=paths, progress=False)
    keys = {(r["dataset"], r["defense"], r["attack"]) for r in record["rows"]}
    assert keys == {
        (d, f, a) for d in ("mnist", "cifar10") for f in ("none", "cvb") for a in ATTACKS
    }
    assert record["scale"] == "paper" and record["data"]["mnist"]["spec"] == paths["mnist"]
    assert "victims: 2 of the training images of client 0 of 10" in record["data"]["mnist"]["note"]


def test_table1_variants_at_position_2_also_leave_out_conv3() -> None:
    """CVB Table I at position 2 (between conv2 and conv3) has six rows, two leaving out conv3."""
    from leakagelib import experiments
    from leakagelib.experiments.cvb_common import PRECODE_TABLE2
    from leakagelib.experiments.cvb_common import cnn as cvb_cnn
    from leakagelib.experiments.cvb_precode import VARIANTS, ignore_variants, table1_units

    model = cvb_cnn({**PRECODE_TABLE2, "position": 2})
    names = [n for n, _ in model.named_parameters()]
    variants = ignore_variants(model, 2)
    assert list(variants) == list(VARIANTS[2]) and len(variants) == 6
    layers = {v: sorted({n.rsplit(".", 1)[0] for n in set(names) - set(kept)})
              for v, kept in variants.items()}  # fmt: skip
    assert layers == {
        "all": [],
        "without classifier": ["head"],
        "without conv3": ["conv3.conv"],
        "without decoder": ["precode.decoder"],
        "without decoder and conv3": ["conv3.conv", "precode.decoder"],
        "without decoder and later": ["conv3.conv", "head", "precode.decoder"],
    }
    assert list(ignore_variants(cvb_cnn({**PRECODE_TABLE2, "position": 3}), 3)) == list(VARIANTS[3])
    with pytest.raises(ValueError, match="Table I places PRECODE at"):
        ignore_variants(model, 1)
    exp = experiments.get("cvb/table1-ignore")
    paper = {(r["position"], r["attacked"]) for r in exp.reference}
    assert set(table1_units(exp.config.at("paper"))) == paper  # every row of the paper's table
