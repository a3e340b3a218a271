"""The work the Bayes paper's experiments declare, for ``campaign``'s estimates (:mod:`.work`).

Every ``bayes/*`` experiment registers one of these functions as its
``work=``: for each unit of its run, in the order of
:meth:`~leakagelib.experiments.Context.units`, the loads that dominate the
unit's time, counted from ``ctx.config`` and the shapes and sizes of the
run's data (nothing is trained or attacked):

* an attack of ``steps`` Adam steps on ``H`` settings × ``N`` updates, each
  with ``R`` restarts and ``k`` Monte-Carlo samples, is ``steps`` attack steps
  on ``H·N·R·k`` images: the batched program evaluates every one of them at
  each step (:mod:`leakagelib.attacks.loop`);
* A.3's search (:func:`~.bayes_scenario.tune`) is such an attack per stage,
  its candidates (:func:`~leakagelib.attacks.search.stage_sizes`) being the
  settings and the tuning victims the updates; the final attacks are every
  tuned attack on every victim (:func:`~.bayes_scenario.attack_tuned`);
* training before the attacks — the "step 500" network of Tables 2 and 5
  (batch ``train_batch``), Fig. 2's and Fig. 5's ConvNet and ConvBig (batch
  :data:`~.bayes_soteria.TRAIN_BATCH`) — counts in the unit that first needs
  the network, as a run trains each network once;
* Soteria's fit (:meth:`~leakagelib.defenses.Soteria.share`) on every victim
  takes one backward pass to the input per input feature of the defended
  layer, counted as a forward pass of the victims through the network each
  (measured on ConvBig: 2.9 s counted for 5.9 s taken at ci scale, 68 s
  for 39 s at paper scale, ``fc1`` defended);
* the per-image gradients of the victims count as one training step on them
  where nothing else is computed (``bayes/precode-mlp``, whose closed-form
  attack is a least-squares solve per image).

An attack load of Tables 2 and 5 and Fig. 7 names its
:class:`~.work.Objective` (the attack's likelihood against the unit's
defense, with the Bayes TV prior), so the probes time that objective rather
than Inverting Gradients' cosine: per step they differ by up to about twice
(the Bayes attack against prune + Laplace took 0.60 s a step on 12 settings ×
10 victims of 3×32×32, ℓ2 0.29–0.32 s; one thread, 2026-11-28). Left out: loading
the data, the victims' updates beside the attacks, scoring, and ATS's
augmentation of the training batches. The Bayes
experiments' modules register these functions, so they are imported here
only inside the functions (once every module is loaded).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from .. import models
from ..attacks import Attack, AttackConfig, preset
from ..attacks.search import stage_sizes
from ..defenses import GaussianNoise, GradientDefense
from .bayes_scenario import NUM_CLASSES, make_defense, table2_attacks, tuners
from .registry import Context
from .work import Load, Net, Objective, image_shape, split_size

__all__ = [
    "bayes_cnn_net",
    "fig2_work",
    "fig4_work",
    "fig5_work",
    "fig7_work",
    "pool_rate_work",
    "pool_work",
    "precode_work",
    "table2_work",
    "table5_work",
]


def _dims(shape: Sequence[int]) -> str:
    """``1×28×28``: a shape as the plan names it."""
    return "×".join(str(d) for d in shape)


def bayes_cnn_net(shape: tuple[int, ...]) -> Net:
    """``bayes-cnn`` on ``shape`` inputs, as :func:`~.bayes_scenario.scenario` builds it."""
    return Net(
        f"bayes-cnn {_dims(shape)}", lambda: models.build("bayes-cnn", shape, NUM_CLASSES), shape
    )


def _convbig_net(shape: tuple[int, ...], hidden: tuple[int, int]) -> Net:
    """ConvBig with fully connected widths ``hidden``, as :func:`~.bayes_soteria.convbig` builds it."""
    from .bayes_soteria import convbig

    key = f"convbig {'-'.join(map(str, hidden))} {_dims(shape)}"
    return Net(key, lambda: convbig(shape, hidden, seed=0), shape)


def _attack(net: Net, loop: AttackConfig, images: int, objective: Objective | None = None) -> Load:
    """``loop``'s attack on ``images`` (settings × updates): its steps, restarts and MC samples,
    each step evaluating ``objective`` (default Inverting Gradients' cosine)."""
    return Load(net, "attack", images * loop.restarts * loop.mc_samples, loop.steps, objective)


def _bayes_objective(attack: str, defense: str) -> Objective:
    """Table 2's ``attack`` (a key of :data:`~.bayes_scenario.ATTACKS`) against ``defense`` (a
    key of :data:`~.bayes_scenario.DEFENSES`), as the run builds it (the Bayes TV prior)."""

    def build(noise: GradientDefense | None) -> Attack:
        return table2_attacks(noise, [attack], steps=1)[attack]

    return Objective(f"{attack} on {defense}", build, lambda: make_defense(defense))


def _training(net: Net, batch: int, steps: int) -> list[Load]:
    """``steps`` training steps of ``batch`` images; none when the network is attacked untrained."""
    return [Load(net, "train", batch, steps)] if steps > 0 else []


def _tuned(
    ctx: Context,
    net: Net,
    groups: Sequence[Sequence[str]],
    final: Sequence[int],
    defense: str,
    distance: dict[str, str] | None = None,
) -> list[Load]:
    """A.3's search, then ``final[i]`` tuned attacks of ``groups[i]`` on every victim (none at 0).

    The search's stages are counted from the attacks' tuners
    (:func:`~.bayes_scenario.tuners`; ``distance`` as there): at paper scale
    41 + 20 + 480 settings per heuristic attack and 24 + 20 + 540 for Bayes,
    each on ``tune_victims`` images (Table 2: the authors' ten at paper scale,
    which makes its search ten times the load of a one-victim search; Table
    5: one). Table 2's grouped cosine costs what a per-image one does.

    A group is attacks that share one likelihood object: the batched program
    evaluates each distinct likelihood on its own settings
    (:mod:`leakagelib.attacks.objective`), so each group is loads of its own
    (measured at ci scale: Table 2's four attacks together take as long as
    each alone, summed). All of Table 2's and Table 5's attacks run the loop
    of the ``bayes`` preset (the heuristic ones with another distance), at
    ``steps`` steps, each group's steps evaluating its first attack's distance
    (``distance``'s, else its own) against ``defense`` (Table 5's priors are
    probed with TV alone: its range term is one element-wise pass).
    """
    cfg, loads = ctx.config, []
    loop = preset("l2", steps=cfg.steps).config
    for group, chosen in zip(groups, final, strict=True):
        found = tuners(cfg, group, defense=defense, distance=distance)
        stages = stage_sizes(list(found.values()))
        objective = _bayes_objective((distance or {}).get(group[0], group[0]), defense)
        loads += [_attack(net, loop, n * cfg.tune_victims, objective) for n in stages.values()]
        if chosen:  # 0: the search alone, its setting attacked elsewhere
            loads.append(_attack(net, loop, chosen * cfg.victims, objective))
    return loads


def table2_work(ctx: Context) -> list[list[Load]]:
    """``bayes/table2``: per (dataset, training step, defense), the network's training (at step
    500, under the defense), the search for the four attacks and their final attacks."""
    cfg, units = ctx.config, []
    for dataset in cfg.datasets:
        net = bayes_cnn_net(image_shape(ctx, dataset))
        for step in cfg.train_steps:
            for defense in cfg.defenses:
                loads = _training(net, cfg.train_batch, step)
                groups = [[a] for a in cfg.attacks]
                loads += _tuned(ctx, net, groups, [1] * len(cfg.attacks), defense)
                units.append(loads)
    return units


def pool_work(ctx: Context) -> list[list[Load]]:
    """``bayes/table2-pool``: per (defense, network seed), for each share of the pool the
    network's training and every attack on every victim; at ci the first share's search too
    (at paper scale the settings are the Table 2 record's)."""
    cfg, units = ctx.config, []
    net = bayes_cnn_net(image_shape(ctx, cfg.dataset))
    for defense in cfg.defenses:
        for _ in cfg.seeds:
            loads = []
            for k, _ in enumerate(cfg.pools):
                loads += _training(net, cfg.train_batch, cfg.train_step)
                loads += _cell_attacks(ctx, net, defense, k == 0 and cfg.tuned_from == "search")
            units.append(loads)
    return units


def pool_rate_work(ctx: Context) -> list[list[Load]]:
    """``bayes/table2-pool-rate``: per (defense, network seed), for each share of the pool the
    network's training and the cosine at every rate on ``rate_victims`` victims; at ci the
    first share's search for the cosine too (at paper scale the setting is the Table 2
    record's)."""
    cfg, units = ctx.config, []
    net = bayes_cnn_net(image_shape(ctx, cfg.dataset))
    loop = preset("l2", steps=cfg.steps).config
    for defense in cfg.defenses:
        cosine = _bayes_objective("cosine", defense)
        for _ in cfg.seeds:
            loads = []
            for k, _ in enumerate(cfg.pools):
                loads += _training(net, cfg.train_batch, cfg.train_step)
                if k == 0 and cfg.tuned_from == "search":
                    loads += _tuned(ctx, net, [["cosine"]], [0], defense)
                loads.append(_attack(net, loop, len(cfg.rate_factors) * cfg.rate_victims, cosine))
            units.append(loads)
    return units


def networks_work(ctx: Context) -> list[list[Load]]:
    """``bayes/table2-networks``: per (cell, network seed), the network's training (after
    training) and every attack on every victim; at ci the unit's search too (at paper scale
    the settings are the Table 2 record's)."""
    cfg, units = ctx.config, []
    for dataset, step, defense in cfg.cells:
        net = bayes_cnn_net(image_shape(ctx, dataset))
        for _ in cfg.seeds:
            searched = _cell_attacks(ctx, net, defense, cfg.tuned_from == "search")
            units.append(_training(net, cfg.train_batch, step) + searched)
    return units


def _cell_attacks(ctx: Context, net: Net, defense: str, search: bool) -> list[Load]:
    """A Table 2 cell's attacks on one network (:func:`pool_work`, :func:`networks_work`):
    every attack of the config on every victim, after the ci search when ``search``."""
    cfg = ctx.config
    if search:
        groups = [[a] for a in cfg.attacks]
        return _tuned(ctx, net, groups, [1] * len(groups), defense)
    loop = preset("l2", steps=cfg.steps).config
    return [_attack(net, loop, cfg.victims, _bayes_objective(a, defense)) for a in cfg.attacks]


def table5_work(ctx: Context) -> list[list[Load]]:
    """``bayes/table5-priors``: per defense, the network's training (each unit trains its own,
    under its defense), the search for the TV prior and every φ, and the final attacks of TV and
    the chosen φ (all with one ℓ2 likelihood object)."""
    cfg = ctx.config
    net = bayes_cnn_net(image_shape(ctx, "mnist"))
    priors = ["tv", *(f"tv+range:{phi:g}" for phi in cfg.phis)]
    distance = dict.fromkeys(priors, "l2")
    training = _training(net, cfg.train_batch, cfg.train_step)
    return [training + _tuned(ctx, net, [priors], [2], d, distance) for d in cfg.defenses]


def fig7_work(ctx: Context) -> list[list[Load]]:
    """``bayes/fig7-mc-samples``: per k, the Bayes attack on every victim with k ball samples
    (one restart: the preset's default), its likelihood the Gaussian noise's."""
    cfg = ctx.config
    net = bayes_cnn_net(image_shape(ctx, "mnist"))

    def build(noise: GradientDefense | None) -> Attack:
        return preset("bayes", likelihood=noise.likelihood(), beta=cfg.beta)

    objective = Objective(
        f"bayes on gaussian {cfg.noise:g}", build, lambda: GaussianNoise(cfg.noise)
    )
    return [[Load(net, "attack", cfg.victims * k, cfg.steps, objective)] for k in cfg.mc_samples]


def _soteria_fit(net: Net, model: nn.Module, layer: str, victims: int) -> Load:
    """Soteria's fit on ``victims`` images: a pass per input feature of ``layer`` (module docstring)."""
    return Load(net, "forward", victims, model.get_submodule(layer).in_features)


def _soteria_net(ctx: Context) -> tuple[Net, nn.Module]:
    """ConvBig at the run's settings on the Soteria victims' shape, and one built copy of it."""
    from .bayes_soteria import SOTERIA_STAND_IN

    net = _convbig_net(image_shape(ctx, "cifar10", SOTERIA_STAND_IN), ctx.config.hidden)
    return net, net.build()


def fig5_work(ctx: Context) -> list[list[Load]]:
    """``bayes/fig5-soteria-layers``: ConvBig's training (before the first unit); per defended
    layer (``fc1``, ``fc2``) Soteria's fit and one batched attack of the layer-drop candidate of
    every linear layer and the direct attack."""
    from ..defenses import layer_drop_likelihoods
    from .bayes_soteria import TRAIN_BATCH

    cfg = ctx.config
    net, model = _soteria_net(ctx)
    candidates = len(layer_drop_likelihoods(model, cfg.likelihood)) + 1
    attack = Load(net, "attack", candidates * cfg.victims, cfg.attack_steps)
    return [
        [*_training(net, TRAIN_BATCH, cfg.train_steps),
         _soteria_fit(net, model, "fc1.linear", cfg.victims), attack],
        [_soteria_fit(net, model, "fc2.linear", cfg.victims), attack],
    ]  # fmt: skip


def fig2_work(ctx: Context) -> list[list[Load]]:
    """``bayes/fig2-training``: per ATS policy its ConvNet's training (in its first unit) and per
    step Inverting Gradients on its victims; then per Soteria step ConvBig's own training run
    (:func:`.bayes_defenses.soteria_runs`), Soteria's fit on ``fc1`` and the layer-drop and
    direct attacks together, and after it the unit that measures that network's fit: one pass
    over its training split and the victims (the network the Soteria unit kept); at Fig. 3's
    step each defense attacks ``fig3_victims`` images if more."""
    from .bayes_ats import ATS_STAND_IN
    from .bayes_defenses import soteria_runs
    from .bayes_soteria import SOTERIA_STAND_IN, TRAIN_BATCH

    cfg = ctx.config
    steps, longest = cfg.train_steps, max(cfg.train_steps)
    shape = image_shape(ctx, "cifar10", ATS_STAND_IN)
    convnet = Net(f"convnet-{cfg.ats_width} {_dims(shape)}", lambda: models.build(
        "convnet", in_shape=shape, num_classes=10, width=cfg.ats_width).eval(), shape)  # fmt: skip
    # eval mode, as the run attacks it (batch norm with running statistics); the training probe
    # switches to train mode itself
    ig = preset("inverting-gradients", steps=cfg.ats_attack_steps, tv=cfg.ats_tv,
                signed=cfg.ats_signed)  # fmt: skip

    def victims(n: int, step: int) -> int:
        return max(n, cfg.fig3_victims) if step == cfg.fig3_step else n

    units = [
        [
            *(_training(convnet, TRAIN_BATCH, longest) if i == 0 else []),
            _attack(convnet, ig.config, victims(cfg.ats_victims, step)),
        ]
        for _ in cfg.ats_policies
        for i, step in enumerate(steps)
    ]
    net, model = _soteria_net(ctx)
    trained_on = split_size(ctx, "cifar10", "train", SOTERIA_STAND_IN)
    for step, run in sorted(soteria_runs(ctx).items()):
        n = victims(cfg.soteria_victims, step)
        units.append([
            *_training(net, TRAIN_BATCH, run["steps"]),
            _soteria_fit(net, model, "fc1.linear", n),
            Load(net, "attack", 2 * n, cfg.attack_steps),
        ])  # fmt: skip
        units.append([Load(net, "forward", trained_on + cfg.soteria_victims)])
    return units


def fig4_work(ctx: Context) -> list[list[Load]]:
    """``bayes/fig4-synthetic`` (one unit): each of the four attacks on every sample in turn."""
    from ..bayes_risk import SyntheticGaussian
    from .bayes_synthetic import synthetic_attacks

    cfg = ctx.config
    net = Net(
        f"synthetic-mlp {cfg.dim}-{cfg.hidden}-{cfg.classes}",
        lambda: SyntheticGaussian(dim=cfg.dim, num_classes=cfg.classes, hidden=cfg.hidden).model,
        (1, 1, cfg.dim),  # the task's inputs as 1 × 1 × dim "images"
        cfg.classes,
    )
    return [[_attack(net, a.config, cfg.samples) for a in synthetic_attacks(cfg.noise).values()]]


def precode_work(ctx: Context) -> list[list[Load]]:
    """``bayes/precode-mlp`` (one unit): the PRECODE MLP's training, then the victims' per-image
    gradients."""
    from .bayes_precode import precode_network
    from .bayes_soteria import TRAIN_BATCH

    shape = image_shape(ctx, "cifar10")
    net = Net(f"precode-mlp {_dims(shape)}", lambda: precode_network(shape), shape)
    training = _training(net, TRAIN_BATCH, ctx.config.train_steps)
    return [[*training, Load(net, "train", ctx.config.victims)]]
