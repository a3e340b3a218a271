"""``tools/keep_progress.sh``: a unit's small checkpoints go into the commit, a large one does not.

A fresh machine resumes a unit stopped halfway only if its checkpoint came
with the clone; the script stages the git-ignored checkpoint files up to a
size (``MAX_MB``) and, once a unit has landed and the campaign removed its
files, their removal.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "keep_progress.sh"


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True)
    return done.stdout


def _staged(repo: Path) -> list[str]:
    return sorted(_git(repo, "diff", "--cached", "--name-status").splitlines())


def test_small_checkpoints_are_staged_large_ones_named_and_landed_ones_removed(tmp_path):
    repo = tmp_path / "repo"
    folder = repo / "results" / "x.json.partial.attacks"
    folder.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("*.partial.attacks/\n")
    (folder / "a-0.pt").write_bytes(b"\0" * 1000)
    (folder / "b-1.pt").write_bytes(b"\0" * 1000)
    (folder / "big.pt").write_bytes(b"\0" * (2 * 1024 * 1024 + 1))
    env = {**os.environ, "MAX_MB": "2"}
    done = subprocess.run([str(SCRIPT)], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "not kept (over 2 MB): results/x.json.partial.attacks/big.pt" in done.stderr
    assert _staged(repo) == [
        "A\tresults/x.json.partial.attacks/a-0.pt",
        "A\tresults/x.json.partial.attacks/b-1.pt",
    ]
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "kept")

    (folder / "a-0.pt").unlink()  # its unit landed
    (folder / "b-1.pt").write_bytes(b"\1" * 1000)  # its search went on
    done = subprocess.run([str(SCRIPT)], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _staged(repo) == [
        "D\tresults/x.json.partial.attacks/a-0.pt",
        "M\tresults/x.json.partial.attacks/b-1.pt",
    ]
