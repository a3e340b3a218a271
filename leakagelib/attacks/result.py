"""What every attack returns: :class:`AttackResult`, with named accessors instead of positional indexing.

The optimisation loop (:mod:`.loop`) runs ``H`` settings × ``N`` shared
updates × ``R`` restarts × ``n`` inputs per update in one program; the
closed-form bias attack (:mod:`.closed_form`) fills the same type with
``H = R = n = 1``. Callers ask for what they need by name —
``result.inputs()`` for one reconstruction per attacked input (what metrics
take), ``result.per_update()`` to keep the inputs of each update together,
``result.objective_of("l2")`` for one attack of a batch — so no caller needs
to know the tensor layout. Used by every chapter that runs an attack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from .config import Setting

__all__ = ["AttackResult"]


@dataclass
class AttackResult:
    """The reconstructions of a batch of attacks, with every restart kept.

    Fields (``H`` settings, ``N`` updates, ``R`` restarts, ``n`` inputs per update):

    * ``images``: ``H × N × n × (input shape)``, the best restart per setting
      and update, in the model's input space (normalised);
    * ``objective``: ``H × N``, its final objective (the negative log
      posterior up to constants; for the bias attack, the fit residual);
    * ``all_images`` and ``all_objective``: every restart, ``H × N × R × ...``;
    * ``settings``: the :class:`Setting` of each of the ``H`` attacks;
    * ``labels``: ``H × N × n`` label estimates when labels were optimised (DLG);
      R-GAP reports the label each update used (given or recovered); else ``None``;
    * ``history``: the mean objective per step;
    * ``names``: optional unique names of the ``H`` settings (the attack ids
      when several attacks run as settings of one batch), so that accessors
      take ``setting="l2"`` as well as ``setting=1``;
    * ``details``: optional per-update details of a closed-form attack, one
      entry per update (R-GAP's :class:`~leakagelib.rgap.recursive.RGAPDetails`:
      per-layer reports with rank certificates, every μ-root's candidate).

    The accessors below take ``setting`` as an index or one of ``names``.
    """

    images: Tensor
    objective: Tensor
    all_images: Tensor
    all_objective: Tensor
    settings: list[Setting]
    labels: Tensor | None = None
    history: list[float] = field(default_factory=list)
    names: list[str] | None = None
    details: list[Any] | None = None

    def __post_init__(self) -> None:
        if self.names is not None:
            self.names = list(self.names)
            if len(self.names) != self.images.shape[0] or len(set(self.names)) != len(self.names):
                raise ValueError(
                    f"names must be {self.images.shape[0]} unique names, one per setting, "
                    f"got {self.names}"
                )
        if self.details is not None and len(self.details) != self.images.shape[1]:
            raise ValueError(
                f"details must hold one entry per update ({self.images.shape[1]}), "
                f"got {len(self.details)}"
            )

    @classmethod
    def one_per_update(
        cls,
        images: Tensor,
        objective: Tensor,
        *,
        labels: Tensor | None = None,
        details: list[Any] | None = None,
    ) -> AttackResult:
        """A closed-form attack's result: one reconstruction per update (``H = R = n = 1``).

        ``images`` are ``N × (input shape)``, ``objective`` ``N`` (the attack's
        fit criterion), ``labels`` ``N`` when the attack reports them.
        """
        n = images.shape[0]
        batched = images.reshape(1, n, 1, *images.shape[1:])
        objective = objective.reshape(1, n)
        return cls(
            images=batched,
            objective=objective,
            all_images=batched.unsqueeze(2),
            all_objective=objective.unsqueeze(2),
            settings=[],
            labels=None if labels is None else labels.reshape(1, n, 1),
            details=details,
        )

    @property
    def num_settings(self) -> int:
        """``H``, the number of settings (attacks) run in the batch."""
        return int(self.images.shape[0])

    def index(self, setting: int | str) -> int:
        """The position of ``setting`` (an index, negative allowed, or one of ``names``)."""
        if isinstance(setting, str):
            if self.names is None or setting not in self.names:
                raise KeyError(f"no setting named {setting!r}; the names are {self.names}")
            return self.names.index(setting)
        h = self.num_settings
        if isinstance(setting, bool) or not isinstance(setting, int) or not -h <= setting < h:
            raise IndexError(f"setting must be an index in [-{h}, {h}) or a name, got {setting!r}")
        return setting % h

    def per_update(self, setting: int | str = 0) -> Tensor:
        """``N × n × (input shape)``: the best restart's inputs, grouped by update."""
        return self.images[self.index(setting)]

    def inputs(self, setting: int | str = 0) -> Tensor:
        """``(N·n) × (input shape)``: one reconstruction per attacked input, in update order.

        With one input per update (the usual single-image client) this is
        ``N × C × H × W``, aligned with the victims' images — what metrics take.
        """
        per = self.per_update(setting)
        return per.reshape(per.shape[0] * per.shape[1], *per.shape[2:])

    def objective_of(self, setting: int | str = 0) -> Tensor:
        """``N``: the final objective of the reported (best) restart of each update."""
        return self.objective[self.index(setting)]

    def restarts_of(self, setting: int | str = 0) -> Tensor:
        """``N × R × n × (input shape)``: every restart's inputs, reported or not."""
        return self.all_images[self.index(setting)]

    def labels_of(self, setting: int | str = 0) -> Tensor | None:
        """``N × n`` label estimates when labels were optimised, else ``None``."""
        return None if self.labels is None else self.labels[self.index(setting)]

    def setting_of(self, setting: int | str = 0) -> Setting:
        """The :class:`Setting` that ``setting`` ran with."""
        return self.settings[self.index(setting)]
