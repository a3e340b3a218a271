"""The Bayes paper's figure claims as paired comparisons over images, read off a run's rows.

Each function returns the :class:`~leakagelib.experiments.paired.PairedGap`
intervals a claim rests on; the claim holds when every interval's ``low`` is
above 0. The chapters "Bayes versus heuristics under defenses" (Figure 7) and
"Breaking heuristic defenses" (Figures 2, 5 and 6) assert them in hidden cells for
their seed, and ``tests/test_bayes_claims.py`` for :data:`~.paired.CLAIM_SEEDS`, so that one
definition of each claim serves both.

:func:`table2_against_paper` and :func:`table5_against_paper` set a
paper-scale record of Tables 2 and 5 beside the paper's numbers, with
intervals over its images, and :func:`fig2_record_text` reads Fig. 2's record
in words (:func:`fig2_network_text` what its Soteria networks had learned,
:func:`collapsed_steps` which of them collapsed);
:func:`table2_misses` lists where Table 2's record and the paper disagree. What the
step-500 network's training pool changes in Table 2's cells (``bayes/table2-pool``) is
read in :mod:`.bayes_pool_claims`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .paired import PairedGap, mean_interval, paired_interval


def fig7_gains(rows: Sequence[dict]) -> dict[str, PairedGap]:
    """Figure 7 (A.6): the most Monte-Carlo samples against the fewest, on the same images.

    ``"area"`` compares the area under the PSNR-per-step curve (the paper's
    reading: more samples converge faster), ``"final"`` the last PSNR. The
    claim asserted is ``"area"``.
    """
    by_k = {r["k"]: r for r in rows}
    few, many = by_k[min(by_k)], by_k[max(by_k)]
    return {
        "area": paired_interval(many["psnr_mean_per_image"], few["psnr_mean_per_image"]),
        "final": paired_interval(many["psnr_per_image"], few["psnr_per_image"]),
    }


def fig5_gains(rows: Sequence[dict]) -> dict[str, PairedGap]:
    """Figure 5: the layer-drop attack on a Soteria-defended layer, on the same images.

    ``"drop over direct"``: with ``fc1`` defended, dropping it beats attacking
    the defended gradient directly; ``"fc2 over fc1"``: defending the smaller
    ``fc2`` instead (Fig. 5d) leaves the attack even better off.
    """
    per = {(r["defended"], r["attack"]): r["psnr_per_image"] for r in rows}
    return {
        "drop over direct": paired_interval(per["fc1", "layer-drop"], per["fc1", "direct"]),
        "fc2 over fc1": paired_interval(per["fc2", "layer-drop"], per["fc1", "layer-drop"]),
    }


def fig5_chosen(rows: Sequence[dict]) -> dict[str, set[str]]:
    """Per defended layer, the layers the attack that does not know it chose, over the images.

    The claim (§5: "simply run the attack for all"): the candidate that best matches the
    layers it reads (:func:`~leakagelib.defenses.layer_drop_attack`) finds the defended
    layer, ``{"fc1": {"fc1"}, "fc2": {"fc2"}}``. Checked with either layer defended, since with ``fc1`` alone a rule that merely favoured
    the largest layer would pass.
    """
    chosen: dict[str, set[str]] = {}
    for r in rows:
        if r["attack"] == "layer-drop, layer unknown":
            chosen.setdefault(r["defended"], set()).update(r["chosen"])
    return chosen


def fig2_gains(rows: Sequence[dict], fig3_step: int) -> dict[str, PairedGap]:
    """Figure 2 (Soteria): leakage falls with training, and early on layer-drop beats direct.

    ``"falls"`` compares the layer-drop attack at the first and the last
    training step it was run after (Soteria's steps, not ATS's); ``"beats at
    step s"``, for every such step up to Fig. 3's ``fig3_step``, the
    layer-drop attack against the direct one.
    """
    per = {(r["defense"], r["step"]): r["psnr_per_image"] for r in rows}
    steps = sorted({r["step"] for r in rows if r["defense"] == "soteria"})
    gains = {"falls": paired_interval(per["soteria", steps[0]], per["soteria", steps[-1]])}
    for s in _early_steps(steps, fig3_step):
        gains[f"beats at step {s}"] = _layer_drop_gain(per, s)
    return gains


def _early_steps(steps: Sequence[int], fig3_step: int) -> list[int]:
    """The Soteria ``steps`` at which the layer-drop attack is compared with the direct one:
    those up to Fig. 3's ``fig3_step`` (:func:`fig2_gains`, :func:`fig2_record_text`)."""
    return [s for s in steps if s <= fig3_step]


def _layer_drop_gain(per: dict[tuple[str, int], list[float]], step: int) -> PairedGap:
    """After ``step``, the layer-drop attack on Soteria against the direct attack, paired over
    the images (``per``: each (defense, step)'s PSNR per image)."""
    return paired_interval(per["soteria", step], per["soteria (direct attack)", step])


def ats_gains(rows: Sequence[dict], fig3_step: int) -> dict[str, PairedGap]:
    """Figure 2 (ATS) and Figure 6: Inverting Gradients leaks less as the network trains.

    For each ATS policy with two steps or more (``rows``' defenses ``"ats <policy>"``):
    ``"<policy> falls"`` compares its PSNR before its first and after its last training step
    (§6: "early in training, networks are very vulnerable"), and ``"<policy> falls after step
    s"`` Fig. 3's step ``fig3_step`` with the last (A.2, Fig. 6: quality "starts to decline
    after 10 steps"), each on the same images (a policy's victims and its attack's start stay
    the same at every step).
    """
    per = {(r["defense"], r["step"]): r["psnr_per_image"] for r in rows}
    gains = {}
    for defense in dict.fromkeys(r["defense"] for r in rows if r["defense"].startswith("ats")):
        steps = sorted(s for d, s in per if d == defense)
        if len(steps) < 2:
            continue
        policy, last = defense.removeprefix("ats "), per[defense, steps[-1]]
        gains[f"{policy} falls"] = paired_interval(per[defense, steps[0]], last)
        if steps[0] < fig3_step < steps[-1] and fig3_step in steps:
            gains[f"{policy} falls after step {fig3_step}"] = paired_interval(
                per[defense, fig3_step], last
            )
    return gains


def fig2_record_text(
    rows: Sequence[dict], note: str, fig3_step: int, networks: Sequence[dict] = ()
) -> str:
    """The chapter's sentence on Fig. 2's paper-scale record (``rows``; ``note`` says how many
    units a pending one has, as :func:`leakagelib.reporting.results_record` gives it): each ATS
    policy's mean PSNR after the steps the record has; at Soteria's first step, the layer-drop
    attack against the direct one (as :func:`fig2_gains` pairs them); once there are two
    Soteria steps, its fall between the first and the last whose network had not collapsed
    (:func:`collapsed_steps` of ``networks``, the record's Soteria networks); and how far apart
    the two attacks score on the collapsed networks. Numbers read, never typed."""
    psnr = {(r["defense"], r["step"]): r["psnr"] for r in rows}
    per = {(r["defense"], r["step"]): r["psnr_per_image"] for r in rows}
    parts = []
    for policy in dict.fromkeys(r["defense"] for r in rows if r["defense"].startswith("ats")):
        when = {s: f"after {s} step{'s' * (s != 1)}" if s else "before training"
                for d, s in psnr if d == policy}  # fmt: skip
        points = ", ".join(f"{psnr[policy, s]:.1f} dB {when[s]}" for s in sorted(when))
        parts.append(f"Inverting Gradients on ATS {policy.removeprefix('ats ')} reaches {points}")
    steps = sorted(s for d, s in psnr if d == "soteria")
    if _early_steps(steps, fig3_step):
        beats = _layer_drop_gain(per, steps[0])
        parts.append(
            f"the layer-drop attack on Soteria reaches {psnr['soteria', steps[0]]:.1f} dB after "
            f"step {steps[0]}, {beats.mean:.1f} dB more than the direct attack on the same "
            f"{beats.n} images (95 % interval {beats.low:.1f} to {beats.high:.1f} dB)"
        )
    dead = [s for s in collapsed_steps(networks) if s in steps]
    alive = [s for s in steps if s not in dead]
    if len(alive) > 1:
        falls = paired_interval(per["soteria", alive[0]], per["soteria", alive[-1]])
        verb, sign = ("loses", 1) if falls.mean >= 0 else ("gains", -1)
        low, high = sorted((sign * falls.low, sign * falls.high))
        parts.append(
            f"between steps {alive[0]} and {alive[-1]} the layer-drop attack {verb} "
            f"{sign * falls.mean:.1f} dB (95 % interval {low:.1f} to {high:.1f} dB)"
        )
    if dead:
        apart = max(abs(a - b) for s in dead
                    for a, b in zip(per["soteria", s], per["soteria (direct attack)", s],
                                    strict=True))  # fmt: skip
        alike = "the same" if apart == 0 else f"within {apart:.2g} dB of each other"
        parts.append(
            f"after steps {', '.join(map(str, dead))}, whose networks had collapsed (below), the "
            f"layer-drop and the direct attack score {alike} on every image"
        )
    if not parts:
        return "No unit of the paper-scale record has been made yet."
    return f"In the paper-scale record{note}, " + "; ".join(parts) + "."


#: The share of its training images a network classifies right from which
#: :func:`fig2_network_text` says it has memorised them.
MEMORISED = 0.99

#: The share of its training images under which a Soteria network that trained longer than one
#: that had memorised them counts as collapsed (:func:`collapsed_steps`): twice chance for ten
#: classes.
COLLAPSED = 0.2


def collapsed_steps(networks: Sequence[dict]) -> list[int]:
    """The steps of the Soteria networks in a Fig. 2 record (``networks``, as
    :func:`fig2_network_text` takes them) whose training collapsed: each classifies fewer than
    :data:`COLLAPSED` of its training images right, where a run of fewer steps had memorised them
    (:data:`MEMORISED`). The Soteria attacks on such a network read no image from its update.

    Measured: in the record of ``bayes/fig2-training`` the runs of 8, 9 and 10 epochs (made on
    2026-12-02 on an AMD EPYC with AVX-512, one thread) each classify 11.75 % of their 400
    training images right, the share of the most frequent class, at a mean loss of 2.28951, the
    entropy of those 400 labels (2.28951): a network that gives every image the labels'
    frequencies. The same code, seeds and data run afresh on 2026-12-07 (an AMD EPYC without
    AVX-512, one thread, commit 1a9126c, ``leakagelib.fl.train`` with the runs' settings from
    :func:`.bayes_training.epoch_run`) trained the runs of 8 and 10 epochs to 100 % of their
    training images (loss 0.0009 and 0.0011), after a first epoch at rate 0.1 whose batch loss
    had spiked to 16.7: on a few hundred images the authors' schedule is at the edge of
    stability, and the rounding of another CPU's kernels decides whether a run collapses. The
    chapter "Breaking heuristic defenses" reads the record with it.
    """
    trained = sorted((n for n in networks if n["step"] > 0), key=lambda n: n["step"])
    first = next((n["step"] for n in trained if n["train_accuracy"] >= MEMORISED), None)
    if first is None:
        return []
    return [n["step"] for n in trained if n["step"] > first and n["train_accuracy"] < COLLAPSED]


def fig2_network_text(networks: Sequence[dict]) -> str:
    """The chapter's sentence on how closely the Soteria networks of Fig. 2's record fit what
    they trained on (``networks``: :func:`~.bayes_fig2_records.record_networks`, the trained ones
    read): after each training run its mean loss and accuracy on its training images against
    its loss on the victims, and from which epoch on it classifies at least :data:`MEMORISED`
    of its training images right (the paper's networks see each of CIFAR-10's training images
    once an epoch, so a record made on a few hundred of them is not the paper's from there
    on). Numbers read, never typed."""
    trained = [n for n in networks if n["step"] > 0]
    if not trained:
        return "The record has not measured what its Soteria networks learned yet."

    def when(n: dict) -> str:
        epoch = n["epoch"]
        return f"epoch {epoch:.0f}" if epoch >= 1 and epoch == round(epoch) else f"step {n['step']}"

    fits = "; ".join(
        f"after {when(n)}, {n['train_loss']:.3g} ({100 * n['train_accuracy']:.0f} %) and "
        f"{n['victim_loss']:.3g}"
        for n in trained
    )
    text = (
        f"The record's Soteria networks train on {trained[0]['train_images']:,d} images, cycled. "
        "Their mean cross-entropy on those images (with the share they classify right) and on "
        f"the victims: {fits}."
    )
    memorised = [n for n in trained if n["train_accuracy"] >= MEMORISED]
    if memorised:
        text += (
            f" From {when(memorised[0])} on, the record's network has memorised its "
            f"{memorised[0]['train_images']:,d} training images, so the record's Soteria points "
            "from there on attack a network unlike the paper's and do not measure its curve."
        )
    dead = [n for n in trained if n["step"] in collapsed_steps(trained)]
    if dead:
        best = max(n["train_accuracy"] for n in trained if n["step"] < dead[0]["step"])
        text += (
            f" From {when(dead[0])} on the runs collapsed: their networks classify at most "
            f"{100 * max(n['train_accuracy'] for n in dead):.0f} % of their training images "
            f"right, where a shorter run had classified {100 * best:.0f} %, and the record's "
            "Soteria points there measure no trained network."
        )
    return text


def table5_against_paper(rows: Sequence[dict], reference: Sequence[dict]) -> dict[str, dict]:
    """Table 5 (A.4), a record's rows beside the paper's, per defense the record has.

    For each prior, ``"tv"`` and ``"tv_range"``: the record's mean PSNR with
    its interval over the images (:func:`.paired.mean_interval`) and the
    paper's number (``"paper_tv"``, ``"paper_tv_range"``); ``"gain"``, the
    pixel-range prior's paired gain over TV alone on the same images, beside
    the paper's (``"paper_gain"``). The chapter "Bayes versus heuristics under
    defenses" reads its paper-scale record with it.
    """
    paper = {r["defense"]: r for r in reference}
    out = {}
    for r in rows:
        tv, tv_range = r["psnr_per_image_tv"], r["psnr_per_image_tv_range"]
        p = paper[r["defense"]]
        out[r["defense"]] = {
            "tv": mean_interval(tv),
            "tv_range": mean_interval(tv_range),
            "gain": paired_interval(tv_range, tv),
            "paper_tv": p["psnr_tv"],
            "paper_tv_range": p["psnr_tv_range"],
            "paper_gain": p["psnr_tv_range"] - p["psnr_tv"],
        }
    return out


def table2_against_paper(rows: Sequence[dict], reference: Sequence[dict]) -> dict[tuple, dict]:
    """Table 2, a record's cells beside the paper's, per (dataset, defense, step) the record has.

    ``"psnr"``: per attack, the record's mean PSNR with its interval over the
    images (:func:`.paired.mean_interval`); ``"paper"``: the paper's PSNR per
    attack; ``"gaps"``: the Bayes attack's paired gain over each heuristic
    attack on the same images, beside the paper's (``"paper_gaps"``: the
    difference of its two numbers). The paper's claim is that the gains are
    positive under pruning. The chapter "Bayes versus heuristics under
    defenses" reads its paper-scale record with it.
    """
    paper = {(r["dataset"], r["defense"], r["step"], r["attack"]): r["psnr"] for r in reference}
    cells: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        cell = cells.setdefault((r["dataset"], r["defense"], r["step"]), {})
        cell[r["attack"]] = r["psnr_per_image"]
    out = {}
    for key, per in cells.items():
        heuristics = [a for a in per if a != "bayes"]
        out[key] = {
            "psnr": {a: mean_interval(v) for a, v in per.items()},
            "paper": {a: paper[(*key, a)] for a in per},
            "gaps": {a: paired_interval(per["bayes"], per[a]) for a in heuristics},
            "paper_gaps": {a: paper[(*key, "bayes")] - paper[(*key, a)] for a in heuristics},
        }
    return out


def table2_misses(
    against: dict[tuple, dict], *, paper_spread: bool = False
) -> dict[str, dict[str, list[tuple]]]:
    """Per attack, the cells of :func:`table2_against_paper` whose paper PSNR lies outside the
    record's interval: ``{"below": [...], "above": [...]}``, ``below`` where the record's interval
    lies below the paper's number (the record's attack is weaker there).

    ``paper_spread=True`` counts the paper's own sampling error as well, taking it equal to the
    record's: the paper's mean is over other images (its victims are 100 images of the
    training set, drawn at random by the authors' code; this project's records attack images
    of the test sets, the samples a machine without network has), so the two means differ by
    the sampling error of both, about √2 times the record's alone, and the interval's
    half-width is widened by √2.

    The chapter "Bayes versus heuristics under defenses" states both counts under its record
    table, so that a systematic miss (one attack short of the paper in most cells) shows.
    """
    widen = math.sqrt(2) if paper_spread else 1.0
    out: dict[str, dict[str, list[tuple]]] = {}
    for key, cell in against.items():
        for attack, got in cell["psnr"].items():
            misses = out.setdefault(attack, {"below": [], "above": []})
            paper = cell["paper"][attack]
            if got.mean + widen * (got.high - got.mean) < paper:
                misses["below"].append(key)
            elif got.mean - widen * (got.mean - got.low) > paper:
                misses["above"].append(key)
    return out


def table2_pruning_lead(against: dict[tuple, dict]) -> dict:
    """Table 2's finding under pruning, read from :func:`table2_against_paper`'s cells: the
    Bayes attack beats each heuristic the paper's Bayes beats there (§6, Table 2).

    ``"cells"``: the pruning cells' keys; over their (cell, heuristic) comparisons:
    ``"compared"`` how many there are, ``"ahead"`` in how many the Bayes attack's paired gain
    has its interval above zero, ``"paper_ahead"`` in how many the paper's Bayes number is
    above the heuristic's, and ``"behind"`` the ``(cell, heuristic, gap)`` where the paper's
    Bayes is ahead and the run's is not. The chapter "Bayes versus heuristics under defenses"
    asserts ``behind`` empty on its paper-scale record, and the tests on the committed one.
    """
    pruned = {k: c for k, c in against.items() if k[1].startswith("prune")}
    pairs = [(k, a, g, c["paper_gaps"][a] > 0) for k, c in pruned.items()
             for a, g in c["gaps"].items()]  # fmt: skip
    return {
        "cells": list(pruned),
        "compared": len(pairs),
        "ahead": sum(g.low > 0 for _, _, g, _ in pairs),
        "paper_ahead": sum(paper for *_, paper in pairs),
        "behind": [(k, a, g) for k, a, g, paper in pairs if paper and g.low <= 0],
    }
