"""The README's records table (tools/records_table.py) is the one ``results/`` gives today."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("records_table", ROOT / "tools" / "records_table.py")
records_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(records_table)


def test_the_readme_holds_the_current_records_table(capsys):
    status = records_table.main(["--check", str(ROOT / "README.md")])
    assert status == 0, (
        capsys.readouterr().out
    )  # run: python tools/records_table.py --write README.md


def test_the_table_has_every_experiment_and_a_stale_copy_is_found(tmp_path: Path):
    from leakagelib import experiments

    table = records_table.table_lines()
    assert len(table) == 2 + len(experiments.available())
    readme = tmp_path / "README.md"
    start, end = records_table.START, records_table.END
    readme.write_text(f"intro\n{start}\n| old | table |\n{end}\nrest\n")
    assert records_table.main(["--check", str(readme)]) == 1
    assert records_table.main(["--write", str(readme)]) == 0
    assert readme.read_text() == f"intro\n{start}\n" + "\n".join(table) + f"\n{end}\nrest\n"
    assert records_table.main(["--check", str(readme)]) == 0
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no <!-- records-table"):
        records_table.main(["--write", str(readme)])
