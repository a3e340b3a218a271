"""Verdicts of the reproduction index (leakagelib.verdicts): each rule can both hold and fail."""

from __future__ import annotations

import math

import pytest

from leakagelib import verdicts


def test_a_mean_with_per_image_values_gets_the_t_free_normal_interval():
    row = {"psnr": 2.0, "psnr_per_image": [1.0, 2.0, 3.0]}
    low, high = verdicts.interval(row, "psnr", n=None)
    half = verdicts.Z95 * 1.0 / math.sqrt(3)  # sample sd of 1, 2, 3 is 1
    assert (low, high) == pytest.approx((2.0 - half, 2.0 + half))


def test_a_mean_with_a_std_needs_the_number_of_images():
    row = {"ssim": 0.5, "ssim_std": 0.2}
    assert verdicts.interval(row, "ssim", n=None) is None
    low, high = verdicts.interval(row, "ssim", n=16)
    assert (low, high) == pytest.approx((0.5 - verdicts.Z95 * 0.05, 0.5 + verdicts.Z95 * 0.05))
    assert verdicts.interval({**row, "n": 4}, "ssim", n=16)[1] == pytest.approx(0.5 + 0.196, 1e-3)


def test_a_share_gets_a_wilson_interval_that_stays_in_0_1():
    low, high = verdicts.interval({"asr": 1.0}, "asr", n=32)
    assert high == 1.0 and 0.85 < low < 0.9  # Wilson: 32 of 32 still allows about 89 %
    low, high = verdicts.interval({"asr": 0.0}, "asr", n=32)
    assert low == 0.0 and 0.1 < high < 0.12


def test_values_without_a_spread_or_not_finite_are_not_judged():
    assert verdicts.interval({"accuracy": 0.6}, "accuracy", n=100) is None
    assert verdicts.interval({"psnr": 3.0, "psnr_per_image": [1.0, "inf"]}, "psnr", n=None) is None
    assert verdicts.interval({"twin": True}, "twin", n=10) is None


def test_judge_joins_rows_and_reads_counts_bounds_and_intervals():
    paper = [
        {"position": 0, "parameters": 100, "asr": 0.97},
        {"position": 1, "parameters": 200, "asr": 0.01},
        {"position": 2, "psnr": "> 150", "ra_i": -14000.0},
    ]
    record = [
        {"position": 0, "parameters": 100, "asr": 1.0},
        {"position": 1, "parameters": 201, "asr": 0.5},
        {"position": 2, "psnr": 160.0, "psnr_per_image": [159.0, 161.0], "ra_i": -13744},
    ]
    found = verdicts.judge(
        paper, record, on=["position"], columns=["parameters", "asr", "psnr", "ra_i"], n=32
    )
    agreed = {(j.row[0][1], j.column): j.agrees for j in found}
    assert agreed == {
        (0, "parameters"): True,
        (0, "asr"): True,
        (1, "parameters"): False,
        (1, "asr"): False,
        (2, "psnr"): True,  # a rounded RA-i of the paper's is not held against an exact count
    }
    assert verdicts.verdict(found) == "diverges (2 of 5 values outside)"
    assert verdicts.verdict([j for j in found if j.agrees]).startswith("reproduced (3 of 3")
    assert verdicts.verdict([]).startswith("not judged")
    assert "paper 0.01 outside the record's [" in str(found[3])


def test_a_bound_fails_when_the_interval_crosses_it():
    found = verdicts.judge(
        [{"k": 1, "psnr": "> 150"}],
        [{"k": 1, "psnr": 151.0, "psnr_std": 10.0, "n": 4}],
        ["k"],
        ["psnr"],
    )
    assert [j.agrees for j in found] == [False]


def test_per_image_values_are_found_under_either_naming():
    row = {"psnr_tv": 2.0, "psnr_per_image_tv": [1.0, 2.0, 3.0], "psnr_tv_range": 9.0}
    assert verdicts.interval(row, "psnr_tv", n=None) is not None
    assert verdicts.interval(row, "psnr_tv_range", n=None) is None


def test_a_bound_of_every_image_is_judged_on_each_record_row():
    paper = [{"image": verdicts.EVERY_IMAGE, "psnr": "> 150", "label": 3}]
    rows = [{"image": i, "psnr": p, "label": 3} for i, p in enumerate([161.8, 155.1, 170.0])]
    found = verdicts.judge(paper, rows, ["image"], ["psnr", "label"])
    assert [j.row for j in found] == [(("image", 0),), (("image", 1),), (("image", 2),)]
    assert all(j.agrees and j.low == j.high == j.record for j in found)  # the label: no bound
    assert verdicts.verdict(found) == "reproduced (3 of 3 values inside)"
    rows[1]["psnr"] = 149.0  # one image below the bound
    found = verdicts.judge(paper, rows, ["image"], ["psnr"])
    assert [j.agrees for j in found] == [True, False, True]
    assert "image 1: psnr, paper > 150 outside the record's 149" in str(found[1])
    assert verdicts.verdict(found) == "diverges (1 of 3 values outside)"


def test_a_rounded_number_of_the_papers_stands_for_all_that_round_to_it():
    """The paper prints SSIM to two decimals: its "0.00" agrees with a record whose interval
    reaches 0.005, and not with one that starts above it; counts keep no width."""
    assert verdicts.rounding([0.76, 0.0, 0.32]) == pytest.approx(0.005)
    assert verdicts.rounding([0.9141, 1.0, 0.124]) == pytest.approx(5e-5)
    assert verdicts.rounding([3, 1.0]) == 0.0
    paper = [{"cell": "a", "ssim": 0.0}, {"cell": "b", "ssim": 0.76}]
    near = {"cell": "a", "ssim": 0.0046, "ssim_per_image": [0.0040, 0.0046, 0.0052]}
    far = {"cell": "a", "ssim": 0.0086, "ssim_per_image": [0.0080, 0.0086, 0.0092]}
    below = {"cell": "b", "ssim": 0.74, "ssim_per_image": [0.7395, 0.74, 0.7405]}
    found = verdicts.judge(paper, [near, below], on=["cell"], columns=["ssim"])
    assert [j.agrees for j in found] == [True, False]
    assert str(found[0]).endswith("(within its rounding, ±0.005)")
    assert "rounding" not in str(found[1])
    assert not verdicts.judge(paper, [far], on=["cell"], columns=["ssim"])[0].agrees


def _three_sides() -> list[verdicts.Judgement]:
    """The paper's SSIM 0.5 against three records: inside, below and above their intervals."""
    paper = [{"k": "a", "ssim": 0.5}, {"k": "b", "ssim": 0.5}, {"k": "c", "ssim": 0.5}]
    rows = [
        {"k": "a", "ssim": 0.51, "ssim_std": 0.1},
        {"k": "b", "ssim": 0.2, "ssim_std": 0.01},
        {"k": "c", "ssim": 0.8, "ssim_std": 0.01},
    ]
    return verdicts.judge(paper, rows, ("k",), ("ssim",), 100)


def test_a_judgement_says_on_which_side_of_the_paper_the_record_lies():
    judged = _three_sides()
    assert [j.side for j in judged] == ["inside", "below", "above"]
    bound = verdicts.judge([{"k": "a", "psnr": "> 150"}], [{"k": "a", "psnr": 20.0,
                           "psnr_std": 1.0}], ("k",), ("psnr",), 100)  # fmt: skip
    assert [j.side for j in bound] == ["outside"]


def test_sides_name_the_rows_of_each_side_and_victims_per_row_the_counts():
    judged = _three_sides()
    listed = verdicts.sides(judged, lambda r: r["k"].upper())
    assert listed == {"inside": "A", "below": "B", "above": "C", "outside": "none"}
    cifar = [{"dataset": "mnist"}, {"dataset": "cifar10", "n": 32}]
    assert verdicts.victims_per_row(cifar, 128, str.upper) == (
        "victims per row: 128 on MNIST, 32 on CIFAR10"
    )
    assert verdicts.victims_per_row(cifar[:1], 128, str.upper) == "128 victims per row"


def test_agreement_says_per_column_where_the_record_lies_against_the_paper():
    """One clause per judged column, naming the rows on each side; a column without an
    interval says nothing, and a missed bound is named."""
    paper = [{"k": "a", "ssim": 0.5, "psnr": "> 150"}, {"k": "b", "ssim": 0.5}]
    rows = [
        {"k": "a", "ssim": 0.51, "ssim_std": 0.1, "psnr": 20.0, "psnr_std": 1.0},
        {"k": "b", "ssim": 0.2, "ssim_std": 0.01, "accuracy": 0.9},
    ]
    said = verdicts.agreement(
        paper, rows, ("k",), {"ssim": "SSIM", "accuracy": "accuracy", "psnr": "PSNR"},
        lambda r: r["k"].upper(), 100,
    )  # fmt: skip
    assert said == [
        "its SSIM agrees with the paper's (to the 95 % interval) for A, is lower for B and "
        "higher for none",
        "its PSNR agrees with the paper's (to the 95 % interval) for none, is lower for none "
        "and higher for none, and misses the paper's bound for A",
    ]


def test_the_setting_a_record_ran_with_is_its_change_else_the_registered_value():
    """``verdicts.setting_used``: what ``cvb_attacks`` reads to tell a Table III record that kept
    the lowest-loss iterate (a run changed ``best_iterate`` to "recorded") from one that follows
    the authors' rule (the registered value)."""
    from leakagelib import experiments

    exp = experiments.get("cvb/table3-attacks")
    registered = exp.config.at("paper").get("best_iterate")
    assert registered != "recorded"
    assert verdicts.setting_used(exp, {"scale": "paper"}, "best_iterate") == registered
    first = {"scale": "paper", "settings_changed": {"best_iterate": {"used": "recorded"}}}
    assert verdicts.setting_used(exp, first, "best_iterate") == "recorded"
    assert verdicts.setting_used(exp, first, "no-such-setting") is None
