"""Trained networks kept beside a partial record, so that a resumed run does not train again.

A paper-scale unit often trains a network before it attacks it: Table 2's
step-500 networks (:mod:`.bayes_scenario`), Fig. 4 of the R-GAP paper
(:mod:`.rgap_resnet_skip`), Fig. 2's ConvBig, whose snapshots twelve units
attack (:mod:`.bayes_soteria`). A command-line run saves the trained network
in a checkpoint file beside its partial record (:mod:`.resume`) and a resumed
run reads it back, on the same update to the last bit: retrained on a GPU,
whose convolution and pooling gradients are not deterministic, the network
would differ, and an attack's checkpoint on it would be refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from torch import Tensor, nn

from ..attacks.checkpoint import LoopCheckpoint, fingerprint
from ..fl import TrainResult, TrainState

__all__ = ["keep_state", "kept_run", "kept_state", "kept_training"]


def kept_training(
    checkpoint: LoopCheckpoint | None,
    net: nn.Module,
    train: Callable[[], nn.Module],
    *,
    parts: Sequence[Any],
    data: Mapping[str, Tensor],
) -> nn.Module:
    """``train()``'s network, its weights kept in ``checkpoint`` once it is trained.

    A unit killed in an attack that follows its training resumes the attack only on the same
    update: retrained on a GPU, whose convolution and pooling gradients are not deterministic,
    the network would differ in its last bits and the attack's checkpoint be refused. So a
    command-line run (``checkpoint`` given, :meth:`~leakagelib.experiments.Context.checkpoint`)
    saves the weights when training ends and reads them back into ``net`` instead of training
    again. The file belongs to the training that ``parts`` (its settings) and ``data`` (its
    inputs and ``net``'s initial weights) describe. Used by Figure 4 of the R-GAP paper and
    the Bayes paper's step-500 networks.
    """
    kept = kept_run(checkpoint, net, lambda: TrainResult(model=train()), parts=parts, data=data)
    # a network read back (into ``net``) comes in evaluation mode, as these units take it
    return net.eval() if kept.model is net else kept.model


def kept_run(
    checkpoint: LoopCheckpoint | None,
    net: nn.Module,
    train: Callable[[], TrainResult],
    *,
    parts: Sequence[Any],
    data: Mapping[str, Tensor],
) -> TrainResult:
    """``train()``'s result (network, losses and snapshots), kept in ``checkpoint`` once it ends.

    As :func:`kept_training`, for a training whose snapshots several units attack (Fig. 2's
    ConvBig, 15,620 steps: about an hour on this project's CPU): its file
    (:meth:`PartialRecord.kept`) stays beside the partial record until the run's last unit,
    so a run resumed in another process reads the network back into ``net`` instead of
    training it again.
    """
    if checkpoint is None:
        return train()
    checkpoint.bind(fingerprint(list(parts), data), [])
    saved = checkpoint.load()
    if saved is not None:  # (files of kept_training before 2026-11-29 hold the weights alone)
        net.load_state_dict(saved["weights"])
        losses, snapshots = saved.get("losses", []), saved.get("snapshots", {})
        return TrainResult(model=net.train(), losses=losses, snapshots=snapshots)
    result = train()
    state = {"weights": result.model.state_dict(), "losses": result.losses}
    checkpoint.tick(0, lambda: {**state, "snapshots": result.snapshots}, final=True)
    return result


def kept_state(
    checkpoint: LoopCheckpoint | None, *, parts: Sequence[Any], data: Mapping[str, Tensor]
) -> TrainState | None:
    """The training state (:class:`~leakagelib.fl.TrainState`) kept in ``checkpoint`` for the
    training ``parts`` and ``data`` describe, as for :func:`kept_run`; ``None`` without one.

    Fig. 2's Soteria runs whose schedules agree for some epochs continue from one another's
    (:func:`.bayes_soteria.trained_convbig`).
    """
    if checkpoint is None:
        return None
    checkpoint.bind(fingerprint(list(parts), data), [])
    saved = checkpoint.load()
    return None if saved is None else TrainState(**saved["state"])


def keep_state(
    checkpoint: LoopCheckpoint | None,
    state: TrainState,
    *,
    parts: Sequence[Any],
    data: Mapping[str, Tensor],
) -> None:
    """Keep ``state`` in ``checkpoint`` for :func:`kept_state` (nothing without a checkpoint)."""
    if checkpoint is not None:
        checkpoint.bind(fingerprint(list(parts), data), [])
        checkpoint.tick(0, lambda: {"state": asdict(state)}, final=True)
