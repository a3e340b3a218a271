"""Write every chapter's install cell from ``_config.yml``; print a course hub's chapter links.

The repository's URL lives in one place, ``repository.url`` in ``_config.yml``:
the book's launch buttons (Colab, Binder, a JupyterHub) read it, and this tool
writes it into the install cell of every chapter, the code cell (tagged
``install-leakagelib``) that installs the library where it is missing, as on
Colab or a fresh hub. The install is pinned to the release tag
``v<version>`` of that repository, the version being ``pyproject.toml``'s (a
release creates the tag: see README, "Releasing"), so a chapter opened from
the site runs against the library it was written for. A fork sets its own URL
in ``_config.yml`` and runs this tool (``make book`` runs it before building).

Usage (from the repository root)::

    python tools/install_cells.py             # rewrite the chapters' install cells
    python tools/install_cells.py --check     # exit 1 naming every chapter whose cell differs
    python tools/install_cells.py --hub URL   # nbgitpuller links to every chapter on hub URL

``tests/test_install_cells.py`` checks that every chapter's cell is the one
this tool writes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import yaml

from leakagelib.records import write_text_atomically

ROOT = Path(__file__).resolve().parents[1]

#: The tag that marks a chapter's install cell.
TAG = "install-leakagelib"

#: Notebook interfaces of ``launch_buttons.notebook_interface`` and their URL paths.
INTERFACES = {"classic": "tree", "jupyterlab": "lab/tree"}


def read_config(root: Path = ROOT) -> dict[str, Any]:
    """The book's ``_config.yml`` as a dict."""
    return yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))


def repository_url(config: dict[str, Any]) -> str:
    """``repository.url`` of ``config``, without a trailing slash or ``.git``; it must be https."""
    url = str((config.get("repository") or {}).get("url", "")).strip().rstrip("/")
    url = url.removesuffix(".git")
    if not re.fullmatch(r"https://[^\s/]+/\S+", url):
        raise ValueError(
            f"_config.yml: repository.url must be an https URL of a repository: {url!r}"
        )
    return url


def package_version(root: Path = ROOT) -> str:
    """The library's version: ``pyproject.toml``'s, which must equal ``leakagelib.__version__``."""
    project = (root / "pyproject.toml").read_text(encoding="utf-8").split("[project]", 1)[-1]
    found = re.search(r'^version\s*=\s*"([^"]+)"', project, re.MULTILINE)
    declared = re.search(
        r'^__version__\s*=\s*"([^"]+)"',
        (root / "leakagelib" / "__init__.py").read_text(encoding="utf-8"),
        re.MULTILINE,
    )
    if not found or not declared:
        raise ValueError("no version in pyproject.toml's [project] or in leakagelib/__init__.py")
    if found.group(1) != declared.group(1):
        raise ValueError(
            f"pyproject.toml says version {found.group(1)}, leakagelib/__init__.py "
            f"{declared.group(1)}: a release sets both"
        )
    return found.group(1)


def install_requirement(url: str, version: str) -> str:
    """The pinned requirement: the library at the release tag ``v<version>`` of ``url``."""
    return f"leakagelib @ git+{url}@v{version}"


def install_source(url: str, version: str) -> str:
    """The source of the install cell every chapter carries."""
    return (
        "# On Colab or a fresh JupyterHub, install the library first (a no-op where it is installed),\n"
        "# at the release this book was built for (tools/install_cells.py writes this cell from\n"
        "# repository.url in _config.yml and the library's version).\n"
        "import importlib.util\n"
        "\n"
        'if importlib.util.find_spec("leakagelib") is None:\n'
        f'    %pip install --quiet "{install_requirement(url, version)}"'
    )


def chapters(root: Path = ROOT) -> list[Path]:
    """The notebooks of ``_toc.yml``, in its order."""
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    files: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("root", "file"):
                if isinstance(node.get(key), str):
                    files.append(node[key])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc)
    return [root / f"{f}.ipynb" for f in files if (root / f"{f}.ipynb").exists()]


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _tags(cell: dict[str, Any]) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def install_cell(nb: dict[str, Any], name: str) -> dict[str, Any]:
    """The install cell of notebook ``nb`` (called ``name`` in errors), found or made.

    The cell tagged :data:`TAG`; else the code cell that runs ``%pip install``
    of ``leakagelib`` (which gets the tag); else a new code cell after the
    parameters cell. A chapter with two tagged cells, or none and no
    parameters cell, is an error.
    """
    cells = nb["cells"]
    tagged = [c for c in cells if TAG in _tags(c)]
    if len(tagged) > 1:
        raise ValueError(f"{name}: {len(tagged)} cells are tagged {TAG}; keep one")
    if tagged:
        return tagged[0]
    for cell in cells:
        text = _source(cell)
        if cell["cell_type"] == "code" and "%pip install" in text and "leakagelib" in text:
            cell.setdefault("metadata", {}).setdefault("tags", []).append(TAG)
            return cell
    params = [i for i, c in enumerate(cells) if "parameters" in _tags(c)]
    if not params:
        raise ValueError(f"{name}: no install cell and no parameters cell to put one after")
    cell = {
        "cell_type": "code",
        "execution_count": None,
        "id": "install-leakagelib",
        "metadata": {"tags": [TAG]},
        "outputs": [],
        "source": [],
    }
    cells.insert(params[0] + 1, cell)
    return cell


def rewrite(path: Path, source: str, *, check: bool = False) -> bool:
    """Give ``path``'s install cell ``source``; True if it differed (written unless ``check``).

    The notebook is written back in the repository's form (JSON with one-space
    indentation, non-ASCII kept, a final newline), so only that cell changes.
    """
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    cell = install_cell(nb, path.name)
    cell["source"] = source.splitlines(keepends=True)
    new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if new == text:
        return False
    if not check:  # atomically: `make test` runs the unit tests, which read chapters, beside it
        write_text_atomically(new, path)
    return True


def hub_links(
    hub: str, config: dict[str, Any], notebooks: list[Path], root: Path = ROOT
) -> list[str]:
    """nbgitpuller links that open each notebook on the JupyterHub at ``hub``.

    The link the book's JupyterHub button makes when a course sets
    ``launch_buttons.jupyterhub_url``: the hub clones (or updates) the
    repository of ``repository.url`` at ``repository.branch`` into the
    student's home and opens the chapter. The hub needs ``nbgitpuller``.
    """
    url = repository_url(config)
    branch = (config.get("repository") or {}).get("branch", "main")
    interface = (config.get("launch_buttons") or {}).get("notebook_interface", "classic")
    prefix = INTERFACES.get(interface, "tree")
    folder = url.rsplit("/", 1)[-1]
    links = []
    for nb in notebooks:
        path = nb.relative_to(root).as_posix()
        query = urlencode(
            {"repo": url, "urlpath": f"{prefix}/{folder}/{path}", "branch": branch}, safe="/:"
        )
        links.append(f"{hub.rstrip('/')}/hub/user-redirect/git-pull?{query}")
    return links


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    parser.add_argument("--hub", metavar="URL", help="print nbgitpuller links for the hub at URL")
    args = parser.parse_args(argv)
    try:
        config = read_config()
        notebooks = chapters()
        if args.hub:
            print("\n".join(hub_links(args.hub, config, notebooks)))
            return 0
        source = install_source(repository_url(config), package_version())
        changed = [nb for nb in notebooks if rewrite(nb, source, check=args.check)]
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    names = ", ".join(nb.relative_to(ROOT).as_posix() for nb in changed)
    if args.check and changed:
        print(f"stale install cells (run python tools/install_cells.py): {names}", file=sys.stderr)
        return 1
    if changed:
        print(f"install cells rewritten: {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
