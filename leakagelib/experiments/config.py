"""An experiment's settings at both scales, side by side (flax's ``get_config()``, one per experiment).

Every registered experiment declares a :class:`ScaleConfig`: the values it
uses at ``--scale ci`` and at ``--scale paper``, and for each paper value the
place in the paper (or the authors' code) it comes from. The experiment reads
the values of its run's scale as attributes of ``ctx.config``
(:attr:`leakagelib.experiments.Context.config`); a reader sees all of them at
once with ``experiments.get(ID).config`` or, as a table,
``experiments.get(ID).config.table()``.

Used by every module of :mod:`leakagelib.experiments`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ScaleConfig", "Settings"]


class Settings(Mapping[str, Any]):
    """The read-only values of one scale: ``settings.steps`` or ``settings["steps"]``."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(
                f"this experiment has no setting {name!r}; it has {sorted(self._values)}"
            ) from None

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Settings({self._values!r})"


@dataclass(frozen=True)
class ScaleConfig:
    """An experiment's values at ``ci`` and ``paper`` scale, with the source of each paper value.

    ``ci`` and ``paper`` must name the same settings; ``sources`` maps a
    setting to where its paper value comes from (a paper section, table or
    the authors' script), and a setting whose value is ours says so there.
    """

    ci: Mapping[str, Any]
    paper: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if set(self.ci) != set(self.paper):
            only_ci = sorted(set(self.ci) - set(self.paper))
            only_paper = sorted(set(self.paper) - set(self.ci))
            raise ValueError(
                f"ci and paper must name the same settings: only at ci {only_ci}, "
                f"only at paper {only_paper}"
            )
        unknown = sorted(set(self.sources) - set(self.ci))
        if unknown:
            raise ValueError(f"sources name settings the config does not have: {unknown}")

    def at(self, scale: str) -> Settings:
        """The values of ``scale`` (``"ci"`` or ``"paper"``)."""
        if scale not in ("ci", "paper"):
            raise ValueError(f"unknown scale {scale!r}; use 'ci' or 'paper'")
        return Settings(self.ci if scale == "ci" else self.paper)

    def changed(self, scale: str, changes: Mapping[str, Any]) -> ScaleConfig:
        """This config with ``changes`` to the values of ``scale`` (``reproduce --set``).

        Every name must be a setting of the config and every new value of the
        old one's kind (an integer for an integer, a number for a float, a
        tuple or list for a tuple); a mismatch raises, naming it. The sources
        stay: a record made with changes lists them (``settings_changed``).
        """
        values = dict(self.at(scale))
        for name, value in changes.items():
            if name not in values:
                raise KeyError(f"this experiment has no setting {name!r}; it has {sorted(values)}")
            values[name] = _same_kind(name, values[name], value)
        both = {"ci": self.ci, "paper": self.paper, scale: values}
        return ScaleConfig(ci=both["ci"], paper=both["paper"], sources=self.sources)

    def table(self) -> list[dict[str, Any]]:
        """One row per setting: ``setting``, ``ci``, ``paper``, ``source`` (for chapters)."""
        return [
            {
                "setting": key,
                "ci": self.ci[key],
                "paper": self.paper[key],
                "source": self.sources.get(key, ""),
            }
            for key in self.ci
        ]


def _same_kind(name: str, old: Any, new: Any) -> Any:
    """``new`` as a value that may replace ``old``: of its type, after turning a list into a
    tuple and an integer into a float where ``old`` is one (``None`` takes anything)."""
    if isinstance(old, tuple) and isinstance(new, list):
        new = tuple(new)
    if isinstance(old, float) and type(new) is int:
        new = float(new)
    if old is not None and type(new) is not type(old):
        raise ValueError(f"setting {name!r} is {old!r} ({type(old).__name__}); {new!r} is not one")
    return new


#: The config of an experiment that has no scale-dependent settings.
EMPTY = ScaleConfig(ci={}, paper={})
