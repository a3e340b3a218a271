"""Every chapter's install cell is the pinned one tools/install_cells.py writes from _config.yml.

The repository URL lives in one place (``repository.url`` in ``_config.yml``):
the launch buttons read it, and so does every chapter's install cell, which
installs the release tag ``v<version>``. No placeholder hub is configured.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("install_cells", ROOT / "tools" / "install_cells.py")
install_cells = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install_cells)


def _expected() -> str:
    config = install_cells.read_config()
    return install_cells.install_source(
        install_cells.repository_url(config), install_cells.package_version()
    )


def test_every_chapter_has_one_install_cell_matching_the_config():
    chapters = install_cells.chapters()
    assert chapters, "no notebooks in _toc.yml"
    for path in chapters:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        tagged = [c for c in cells if install_cells.TAG in c["metadata"].get("tags", [])]
        assert len(tagged) == 1, f"{path.name}: {len(tagged)} install cells"
        assert "".join(tagged[0]["source"]) == _expected(), (
            f"{path.name}: stale install cell; run python tools/install_cells.py"
        )


def test_the_install_is_pinned_to_the_release_tag_of_the_configured_repository():
    url = install_cells.read_config()["repository"]["url"].rstrip("/")
    version = install_cells.package_version()
    assert f'%pip install --quiet "leakagelib @ git+{url}@v{version}"' in _expected()


def test_no_placeholder_hub_is_configured():
    launch = install_cells.read_config().get("launch_buttons") or {}
    assert "example" not in str(launch.get("jupyterhub_url", ""))


def test_a_chapter_without_an_install_cell_gets_one_after_its_parameters(tmp_path):
    nb = {
        "cells": [
            {"cell_type": "markdown", "id": "a", "metadata": {}, "source": ["# T"]},
            {
                "cell_type": "code",
                "execution_count": None,
                "id": "b",
                "metadata": {"tags": ["parameters"]},
                "outputs": [],
                "source": ['SCALE = "ci"'],
            },
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path = tmp_path / "chapter.ipynb"
    path.write_text(json.dumps(nb, indent=1) + "\n", encoding="utf-8")
    assert install_cells.rewrite(path, "print(1)\n", check=True)
    assert json.loads(path.read_text())["cells"][1]["id"] == "b"  # --check changes nothing
    assert install_cells.rewrite(path, "print(1)\n")
    cells = json.loads(path.read_text())["cells"]
    assert [c["id"] for c in cells] == ["a", "b", "install-leakagelib"]
    assert cells[2]["source"] == ["print(1)\n"] and cells[2]["metadata"]["tags"] == [
        "install-leakagelib"
    ]
    assert not install_cells.rewrite(path, "print(1)\n")  # written once, then unchanged


def test_a_repository_url_that_is_not_https_is_refused():
    with pytest.raises(ValueError, match="https"):
        install_cells.repository_url({"repository": {"url": "git@github.com:a/b.git"}})
    assert install_cells.repository_url({"repository": {"url": "https://x.org/a/b.git/"}}) == (
        "https://x.org/a/b"
    )


def test_hub_links_open_each_chapter_through_nbgitpuller():
    config = {"repository": {"url": "https://github.com/me/fork", "branch": "course"}}
    [link] = install_cells.hub_links(
        "https://hub.uni.edu/", config, [ROOT / "book" / "client_updates.ipynb"]
    )
    assert link == (
        "https://hub.uni.edu/hub/user-redirect/git-pull?repo=https://github.com/me/fork"
        "&urlpath=tree/fork/book/client_updates.ipynb&branch=course"
    )
