"""The chapters' shared image figures (leakagelib.viz)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from leakagelib import viz  # noqa: E402


def test_show_rows_takes_lists_of_images_of_different_sizes_and_channels():
    digits, patches = torch.rand(2, 1, 28, 28), torch.rand(2, 3, 32, 32)
    rows = {"original": [*digits, *patches], "attack": [*digits[:1]]}
    fig = viz.show_rows(rows, titles={"attack": ["9.9 dB"]})
    axes = fig.axes
    assert len(axes) == 2 * 4, "one row per entry, as many columns as the longest"
    assert axes[0].images[0].get_array().shape == (28, 28)
    assert axes[3].images[0].get_array().shape == (32, 32, 3)
    assert axes[4].get_title() == "9.9 dB" and axes[4].get_ylabel() == "attack"
    assert not axes[5].axison, "a shorter row leaves its remaining cells empty"
    plt.close(fig)
    with pytest.raises(ValueError, match="C×H×W"):
        viz.show_rows({"bad": [torch.rand(28, 28)]})


def test_show_pictures_sets_each_rows_reconstructions_beside_the_originals():
    from leakagelib.records import image_lists

    original, first, second = torch.rand(3, 2, 3, 8, 8).unbind(0)
    rows = [
        {"defense": "none", "pictures": {"original": image_lists(original),
                                         "reconstruction": image_lists(first)}},
        {"defense": "dp"},  # no pictures: left out
        {"defense": "cvb", "pictures": {"original": image_lists(original),
                                        "reconstruction": image_lists(second)}},
    ]  # fmt: skip
    fig = viz.show_pictures(rows, lambda row: row["defense"])
    axes = fig.axes
    assert len(axes) == 2 * 3, "one figure row per victim: the original, then each row's"
    assert [ax.get_title() for ax in axes[:3]] == ["client", "none", "cvb"]
    shown = axes[5].images[0].get_array()  # image 2 as the "cvb" row reconstructed it
    assert abs(shown - second[1].permute(1, 2, 0).numpy()).max() < 1e-3
    plt.close(fig)
    other = {"defense": "gc", "pictures": {"original": image_lists(first),
                                           "reconstruction": image_lists(second)}}  # fmt: skip
    with pytest.raises(ValueError, match="different victims"):
        viz.show_pictures([rows[0], other], lambda row: row["defense"])
    with pytest.raises(ValueError, match="labelled 'none'"):
        viz.show_pictures([rows[0], rows[0]], lambda row: row["defense"])
    with pytest.raises(ValueError, match="no row keeps"):
        viz.show_pictures([rows[1]], lambda row: row["defense"])
