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
