"""What a record says of a dataset replaced with ``--data``: which of its images played which role.

Used by :func:`leakagelib.experiments.run` for the record's ``data`` field
(every chapter's records in ``results/`` carry one).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import data as _data

__all__ = ["LISTED_INDICES", "data_entry"]

#: Most image indices a record lists for one split of an overridden dataset; beyond that it
#: gives their count and the selections that drew them (exact, see :func:`data_entry`).
LISTED_INDICES = 300


def data_entry(spec: str, uses: dict[tuple[str, str], torch.Tensor]) -> dict[str, Any]:
    """What a record says of an overridden dataset: which of its images played which role.

    ``{"spec": spec, "split_rule": ..., "test": {...}, "train": {...}}``: for
    every split the run loaded (``"test"``: attacked images and test
    accuracy; ``"train"``: training), the ``count`` of distinct images, the
    ``selection`` formulas that drew them (:func:`leakagelib.data.dataset.formula`,
    in source positions: the file's for an ``.npz``) and, when there are at
    most :data:`LISTED_INDICES`, the sorted ``indices`` themselves.
    ``split_rule`` (:data:`leakagelib.data.SPLIT_RULE`) defines the
    ``split_indices`` of those formulas, for ``.npz`` files and embedded data.
    """
    entry: dict[str, Any] = {"spec": spec}
    if spec.endswith(".npz") or spec in _data.EMBEDDED:
        entry["split_rule"] = _data.SPLIT_RULE
    for split in ("test", "train", "all"):
        loads = {chosen: idx for (part, chosen), idx in uses.items() if part == split}
        if not loads:
            continue
        union = torch.unique(torch.cat(list(loads.values())))
        role: dict[str, Any] = {"count": int(union.numel()), "selection": sorted(loads)}
        if union.numel() <= LISTED_INDICES:
            role["indices"] = union.tolist()
        entry[split] = role
    return entry
