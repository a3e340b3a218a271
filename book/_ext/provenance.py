"""The ``{build-provenance}`` directive: what built the book, measured while it builds.

``book/status.md`` shows it beside the execution table: the versions of
leakagelib, Python, PyTorch and NumPy; the CPU (model, logical CPUs, those
the build could use) and GPU; the commit the book was built from (and
whether the working tree had uncommitted changes); the build's date. Every
value is read at build time, never typed; the page is re-read on every
build so that it cannot go stale.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


def _git(args: list[str], cwd: Path) -> str | None:
    """The output of ``git ARGS`` in ``cwd``, or ``None`` outside a repository (or without git)."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit(root: Path) -> str:
    """The commit ``root`` is checked out at, noting uncommitted changes to tracked files."""
    head = _git(["rev-parse", "HEAD"], root)
    if head is None:
        return "unknown (not built from a git checkout)"
    dirty = _git(["status", "--porcelain", "--untracked-files=no"], root)
    return f"`{head}`" + (" with uncommitted changes" if dirty else "")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, ``sysctl`` on macOS), else its architecture."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except OSError:
            pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_count() -> str:
    """Logical CPUs, and how many of them this process may use where that is fewer."""
    total = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    return f"{total}" if usable == total else f"{total} ({usable} available to the build)"


def gpu() -> str:
    """The GPUs PyTorch sees, or that there are none (the chapters then ran on the CPU)."""
    import torch

    if not torch.cuda.is_available():
        return "none (the chapters ran on the CPU)"
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return ", ".join(names) + f" (CUDA {torch.version.cuda})"


def facts(root: Path) -> list[tuple[str, str]]:
    """(what, value) rows describing this build."""
    import numpy
    import torch

    import leakagelib

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [
        ("leakagelib", leakagelib.__version__),
        ("Python", f"{platform.python_version()} ({platform.python_implementation()})"),
        ("PyTorch", torch.__version__),
        ("NumPy", numpy.__version__),
        ("operating system", f"{platform.system()} {platform.release()} ({platform.machine()})"),
        ("CPU", cpu_model()),
        ("logical CPUs", cpu_count()),
        ("GPU", gpu()),
        ("commit", commit(root)),
        ("built", now),
    ]


def _escape(text: str) -> str:
    """``text`` safe in a Markdown table cell."""
    return text.replace("|", "\\|")


class BuildProvenance(SphinxDirective):
    """A table of the versions, hardware and commit of the build that made this page."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        self.env.note_reread()
        rows = facts(Path(self.env.srcdir))
        lines = ["| | this build |", "| --- | --- |"]
        lines += [f"| {what} | {_escape(value)} |" for what, value in rows]
        container = nodes.container(classes=["build-provenance"])
        self.state.nested_parse(StringList(lines, source="build-provenance"), 0, container)
        return [container]


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("build-provenance", BuildProvenance)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
