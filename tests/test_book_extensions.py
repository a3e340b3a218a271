"""The book's own Sphinx extensions (book/_ext) and the pages they generate.

The reproduction index lists every registered experiment with its paper,
chapter and record; the bibliography lists the cited works only, labelled
author–year as the text cites them; the status page states the build's
versions, hardware and commit; the teachers' page counts each chapter's workload; the execution guard keeps nbclient's Output-widget mimic off
the shell channel and names a stalled chapter and cell.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from leakagelib import experiments, records, reporting, verdicts

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"book_ext_{name}", BOOK / "_ext" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reproduction = _load("reproduction")
bibstyle = _load("bibstyle")
provenance = _load("provenance")
execution_guard = _load("execution_guard")
widget_scripts = _load("widget_scripts")
workload = _load("workload")

CHAPTERS = {f"book/{p.stem}": p for p in sorted(BOOK.glob("*.ipynb"))}


def _row_of(lines: list[str], exp_id: str) -> list[str]:
    rows = [line for line in lines if line.startswith(f"| `{exp_id}` |")]
    assert len(rows) == 1, f"{exp_id}: {len(rows)} rows"
    return [c.strip() for c in rows[0].strip("|").split(" | ")]


def test_every_registered_experiment_has_one_row_in_the_index():
    lines = reproduction.index_lines(CHAPTERS)
    assert len(lines) == 2 + len(experiments.available())
    for exp_id in experiments.available():
        row = _row_of(lines, exp_id)
        assert len(row) == 7, row
        assert row[1] == f"{{cite:t}}`{reproduction.paper_key(exp_id)}`"


def test_the_index_reads_each_status_from_the_records():
    lines = reproduction.index_lines(CHAPTERS)
    for exp_id in experiments.available():
        record = records.paper_record(exp_id)
        _, _, _, _, status, time, device = _row_of(lines, exp_id)
        if record is None:
            assert status.startswith("record pending")
            assert (status == "record pending") == (time == "—") == (device == "—")
        else:
            judged = verdicts.verdict(reproduction.judgements(experiments.get(exp_id), record))
            assert status == (
                f"{record['scale']}-scale record (below): {judged}{reproduction.rerun(exp_id)}"
            )
            assert record["provenance"]["device"] in device
            assert time != "—"


def test_every_experiment_is_run_by_a_chapter_of_the_book():
    running = reproduction.running_chapters(CHAPTERS)
    assert set(running) == set(experiments.available())
    assert not [exp_id for exp_id, docs in running.items() if not docs]


def test_the_intros_map_names_the_experiments_each_chapter_runs():
    """Each chapter's row in the introduction's table names exactly the experiments whose ids
    its code quotes (as the reproduction index finds them)."""
    rows = {
        f"book/{m.group(1)}": set(re.findall(r"`([a-z]+/[\w-]+)`", m.group(2)))
        for m in re.finditer(
            r"^\| \{doc\}`(\w+)` \|(.*)\|$", (BOOK / "intro.md").read_text(), re.MULTILINE
        )
    }
    running = reproduction.running_chapters(CHAPTERS)
    for doc in CHAPTERS:
        named = {exp_id for exp_id, docs in running.items() if doc in docs}
        assert rows.get(doc) == named, (doc, rows.get(doc))


def test_commands_and_records_sections_cover_the_registry():
    commands = reproduction.commands_lines()
    for exp_id in experiments.available():
        row = _row_of(commands, exp_id)
        assert row[1] == f"`python -m leakagelib reproduce {exp_id} --scale ci`"
        assert f"--out results/{records.record_filename(exp_id)}`" in row[2]
    dropdowns = [line for line in reproduction.records_lines() if line.startswith(":::{dropdown}")]
    recorded = [i for i in experiments.available() if records.paper_record(i) is not None]
    assert len(dropdowns) == len(recorded)
    assert all(f"`{i}`" in d for i, d in zip(recorded, dropdowns, strict=True))


def test_a_record_with_paper_rows_is_joined_with_them():
    record = {
        "experiment": "rgap/table2-lenet",
        "scale": "paper",
        "rows": [{"model": "lenet", "cond_conv1": 1.0, "mse_dlg": 2.0}],
        "provenance": {"device": "cpu", "wall_seconds": 3.0, "seed": 0, "commit": "abc"},
    }
    exp = experiments.get("rgap/table2-lenet")
    [(_, table)] = reproduction.side_by_side(exp, record)
    lenet = next(r for r in table.rows if r["model"] == "lenet")
    assert lenet["mse_dlg (record)"] == 2.0
    assert (
        lenet["mse_dlg (paper)"]
        == next(r for r in exp.reference if r["model"] == "lenet")["mse_dlg"]
    )
    assert not [c for c in table.columns if c.endswith("(this run)")]


def test_a_study_whose_varied_setting_mixes_text_and_numbers_is_joined_on_it():
    """Figure 9's ``value`` holds positions as text and scales and β as floats: the registry's
    ``on`` names it, whatever its values."""
    exp = experiments.get("cvb/fig9-hyperparams")
    rows = [
        {"study": "position", "value": "3", "ssim": 0.5, "asr": 0.1, "accuracy": 0.6},
        {"study": "scale", "value": 0.125, "ssim": 0.2, "asr": 0.0, "accuracy": 0.5},
        {"study": "beta", "value": 0.1, "ssim": 0.3, "asr": 0.0, "accuracy": 0.7},
    ]
    assert reproduction.split_columns(exp)[0] == ["study", "value"]
    [(_, table)] = reproduction.side_by_side(exp, {"rows": rows})
    joined = {(r["study"], r["value"]): r for r in table.rows}
    assert joined[("scale", 0.125)]["ssim (record)"] == 0.2
    assert joined[("scale", 0.125)]["ssim (paper)"] == 0.1  # Table VIII's row
    assert joined[("position", "3")]["ssim (paper)"] == 0.46


def test_a_count_is_measured_not_a_name_so_a_differing_one_still_joins():
    """Table II's parameter counts are integers, yet its rows are named by position alone."""
    exp = experiments.get("cvb/table2-placement")
    assert reproduction.split_columns(exp) == (
        ["position"],
        ["parameters", "ssim", "asr", "accuracy"],
    )
    rows = [{"position": 0, "parameters": 1, "ssim": 0.5, "asr": 0.5, "accuracy": 0.2}]
    [(_, table)] = reproduction.side_by_side(exp, {"rows": rows})
    none = next(r for r in table.rows if r["position"] == 0)
    assert none["parameters (record)"] == 1 and none["parameters (paper)"] == 65962


def test_a_record_whose_rows_share_names_is_shown_whole():
    record = {"rows": [{"start": "ray", "t": 0.5}, {"start": "ray", "t": 1.5}]}
    exp = experiments.get("rgap/twin-dlg")
    tables = reproduction.side_by_side(exp, record)
    assert [t.rows for _, t in tables] == [record["rows"]]


@pytest.mark.parametrize(
    ("summary", "expected"),
    [
        ("Bayes paper Table 2: PSNR of the Bayes attack.", "Table 2"),
        ("CVB Table VII: accuracy of an MLP.", "Table VII"),
        ("Appendix B, Figure 5 (right): DLG converges.", "Appendix B, Figure 5 (right)"),
        ("PRECODE on an MLP broken exactly (Bayes paper §5–6).", "§5–6"),
        ("Closed-form recovery of each image (Phong et al.).", "—"),
    ],
)
def test_the_table_or_figure_is_read_from_the_summary(summary, expected):
    assert reproduction.where(summary) == expected


def test_an_experiment_outside_the_papers_namespaces_fails_the_build():
    from sphinx.errors import ExtensionError

    with pytest.raises(ExtensionError, match="names no paper"):
        reproduction.paper_key("elsewhere/table1")


def _bib_entries():
    from pybtex.database import parse_file

    return parse_file(str(BOOK / "references.bib")).entries


def test_bibliography_labels_are_author_year():
    entries = _bib_entries()
    labels = dict(
        zip(entries, bibstyle.AuthorYearLabelStyle().format_labels(entries.values()), strict=True)
    )
    assert labels["balunovic2022bayesian"] == "Balunović et al. 2022"
    assert labels["zhu2021rgap"] == "Zhu and Blaschko 2021"
    assert labels["pedregosa2011sklearn"] == "Pedregosa et al. 2011"  # "and others"
    assert labels["vanderwalt2014skimage"] == "van der Walt et al. 2014"
    twice = [entries["zhu2021rgap"], entries["zhu2021rgap"]]
    assert list(bibstyle.AuthorYearLabelStyle().format_labels(twice)) == [
        "Zhu and Blaschko 2021a",
        "Zhu and Blaschko 2021b",
    ]


def _cited_keys() -> set[str]:
    texts = [p.read_text(encoding="utf-8") for p in BOOK.glob("*.md")]
    for nb in BOOK.glob("*.ipynb"):
        texts += ["".join(c["source"]) for c in json.loads(nb.read_text(encoding="utf-8"))["cells"]]
    roles = re.findall(r"\{(?:cite|cite:[a-z]+)\}`([^`]+)`", "\n".join(texts))
    return {key.strip() for group in roles for key in group.split(",")}


def test_the_bibliography_lists_cited_works_only_and_every_citation_resolves():
    text = (BOOK / "bibliography.md").read_text(encoding="utf-8")
    assert "```{bibliography}" in text and ":all:" not in text
    cited = _cited_keys()
    assert cited, "the book cites nothing?"
    assert not cited - set(_bib_entries()), "cited keys missing from references.bib"


def test_build_provenance_states_versions_hardware_and_commit():
    import numpy
    import torch

    import leakagelib

    facts = dict(provenance.facts(ROOT))
    assert facts["leakagelib"] == leakagelib.__version__
    assert facts["Python"].startswith(platform.python_version())
    assert facts["PyTorch"] == torch.__version__
    assert facts["NumPy"] == numpy.__version__
    assert facts["CPU"] and facts["logical CPUs"] and facts["GPU"]
    assert re.match(r"`[0-9a-f]{40}`|unknown", facts["commit"]), facts["commit"]


def test_execution_guard_turns_off_the_widget_sync_and_watches_cells():
    """setup() makes OutputWidget.sync_state send nothing and wraps nbclient's cell execution."""
    import nbclient.client
    import nbclient.output_widget

    widget, client = nbclient.output_widget.OutputWidget, nbclient.client.NotebookClient
    saved = widget.sync_state, client.async_execute_cell

    class App:
        def __init__(self):
            self.events = []

        def connect(self, event, handler):
            self.events.append(event)

    app = App()
    try:
        execution_guard.setup(app)
        assert widget.sync_state is execution_guard._no_sync
        assert client.async_execute_cell is not saved[1]
        assert {"builder-inited", "source-read"} <= set(app.events)
    finally:
        widget.sync_state, client.async_execute_cell = saved


def test_execution_guard_names_the_stalled_chapter_and_cell():
    """The watchdog's message names chapter and cell once the limit has passed, not before."""
    running = {"docname": "book/breaking_defenses", "cell": 18, "since": 100.0}
    assert execution_guard.stalled_message(running, now=400.0, limit=360.0) is None
    message = execution_guard.stalled_message(running, now=500.0, limit=360.0)
    assert "book/breaking_defenses" in message and "cell 18" in message and "400 s" in message
    idle = {"docname": "book/intro", "cell": None, "since": None}
    assert execution_guard.stalled_message(idle, now=1e9, limit=1.0) is None


def test_execution_guard_calls_an_idle_kernel_stalled_and_a_busy_one_slow():
    """A running cell whose kernel used no CPU for IDLE_SECONDS is a stall; before that, or with
    no cell running, there is no message (a busy kernel keeps resetting the idle time)."""
    running = {"docname": "book/rgap_rank", "cell": 21, "since": 10.0, "kernel": 4242}
    limit = execution_guard.IDLE_SECONDS
    assert execution_guard.idle_message(running, idle_for=limit - 1) is None
    message = execution_guard.idle_message(running, idle_for=limit + 5)
    assert "book/rgap_rank" in message and "cell 21" in message and "no CPU" in message
    done = {**running, "cell": None, "since": None}
    assert execution_guard.idle_message(done, idle_for=1e6) is None


def test_execution_guard_sums_the_cpu_of_a_kernel_and_its_children(tmp_path: Path):
    """process_tree_cpu reads /proc-style stat files: the kernel, its child and grandchild count,
    an unrelated process does not; a missing pid or /proc gives None."""
    tick = os.sysconf("SC_CLK_TCK")

    def stat(pid: int, ppid: int, utime: int, stime: int) -> None:
        (tmp_path / str(pid)).mkdir()
        fields = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 5
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (python (kernel)) " + " ".join(fields))

    stat(100, 1, 3 * tick, tick)  # the kernel: 4 s
    stat(101, 100, tick, 0)  # a subprocess of a cell: 1 s
    stat(102, 101, 0, 2 * tick)  # its child: 2 s
    stat(200, 1, 50 * tick, 0)  # another process
    (tmp_path / "self").mkdir()
    assert execution_guard.process_tree_cpu(100, tmp_path) == pytest.approx(7.0)
    assert execution_guard.process_tree_cpu(101, tmp_path) == pytest.approx(3.0)
    assert execution_guard.process_tree_cpu(999, tmp_path) is None
    assert execution_guard.process_tree_cpu(100, tmp_path / "absent") is None


def test_a_record_made_with_changed_settings_says_which():
    record = {
        "experiment": "intro/bias-attack",
        "scale": "paper",
        "rows": [{"image": 0, "psnr": 300.0}],
        "provenance": {"device": "cpu", "wall_seconds": 3.0, "seed": 0, "commit": "abc"},
        "settings_changed": {"victims": {"registered": 100, "used": 16}},
    }
    lines = reproduction.record_lines(experiments.get("intro/bias-attack"), record)
    assert "Settings changed from the registered ones: `victims` 16 (registered: 100)." in lines


def test_a_pending_record_shows_how_far_its_interrupted_run_got(tmp_path, monkeypatch):
    from leakagelib.experiments.resume import PartialRecord

    monkeypatch.setattr(records, "default_results_dir", lambda: tmp_path)
    assert reproduction.pending("bayes/table2") == ("record pending", "—", "—")
    path = tmp_path / "bayes-table2.json.partial"
    PartialRecord(path, {"scale": "ci"}, resume=False).add(["mnist", 0], [{"psnr": 1.0}], 1.0, 4)
    assert reproduction.pending("bayes/table2") == ("record pending", "—", "—"), "not paper scale"
    partial = PartialRecord(path, {"scale": "paper", "seed": 0}, resume=False)
    partial.add(["mnist", 0], [{"psnr": 20.0}], 3720.0, 4, made={"commit": "abc", "device": "cpu"})
    status, time, device = reproduction.pending("bayes/table2")
    assert (status, time, device) == ("record pending: 1 of 4 units run", "1 h 02 min", "cpu")


def test_a_chapters_comparison_shows_the_finished_units_of_a_pending_record(tmp_path, monkeypatch):
    from leakagelib.experiments.resume import PartialRecord

    monkeypatch.setattr(records, "default_results_dir", lambda: tmp_path)
    path = tmp_path / "bayes-table5-priors.json.partial"
    partial = PartialRecord(path, {"scale": "paper", "seed": 0}, resume=False)
    partial.add("gaussian", [{"defense": "gaussian", "psnr_tv": 15.8}], 60.0, 4)
    run = {"rows": [{"defense": "gaussian", "psnr_tv": 12.0}]}
    table = reporting.compare("bayes/table5-priors", run, on=["defense"], values=["psnr_tv"])
    [gaussian] = [r for r in table.rows if r["defense"] == "gaussian"]
    assert (gaussian["psnr_tv (record)"], gaussian["psnr_tv (this run)"]) == (15.8, 12.0)
    assert gaussian["psnr_tv (paper)"] != reporting.MISSING
    laplacian = next(r for r in table.rows if r["defense"] != "gaussian")
    assert laplacian["psnr_tv (record)"] == reporting.MISSING, "an unfinished unit has no row"
    assert table.caption.endswith("(record pending: 1 of 4 units run)")


def test_a_chapters_comparison_says_which_settings_the_records_run_changed(tmp_path, monkeypatch):
    """A CPU run with fewer victims (``reproduce --set victims=32``): the caption says so; a
    partial record beside a finished one is a re-run under way, shown apart from the record."""
    from leakagelib.experiments.resume import PartialRecord

    monkeypatch.setattr(records, "default_results_dir", lambda: tmp_path)
    path = tmp_path / "bayes-table5-priors.json.partial"
    identity = {"scale": "paper", "seed": 0, "changes": {"victims": 32}}
    PartialRecord(path, identity, resume=False).add("gaussian", [{"defense": "gaussian"}], 6.0, 4)
    table = reporting.compare("bayes/table5-priors", None, on=["defense"], values=["psnr_tv"])
    assert table.caption.endswith(
        "(record pending: 1 of 4 units run) (the record's run changed victims to 32)"
    )
    path.unlink()
    record = {"experiment": "bayes/table5-priors", "scale": "paper", "rows": [],
              "provenance": {"device": "cpu", "wall_seconds": 3.0, "seed": 0, "commit": "abc"},
              "settings_changed": {"victims": {"registered": 100, "used": 16}}}  # fmt: skip
    (tmp_path / "bayes-table5-priors.json").write_text(json.dumps(record))
    assert reporting.results_record("bayes/table5-priors")[1] == (
        " (the record's run changed victims to 16)"
    )
    assert reporting.rerun_record("bayes/table5-priors") == (None, "")
    PartialRecord(path, identity, resume=False).add("laplacian", [{"defense": "lap"}], 6.0, 4)
    rerun, note = reporting.rerun_record("bayes/table5-priors")  # beside the finished record
    assert rerun["rows"] == [{"defense": "lap"}] and note.startswith(
        " (re-run under way: 1 of 4 units run)"
    )
    assert reporting.results_record("bayes/table5-priors")[0] == record, "the record still shows"
    assert reproduction.rerun("bayes/table5-priors") == (
        "; a re-run is under way: 1 of 4 units run"
    )


def test_a_records_unit_times_come_from_its_provenance_or_its_partial(tmp_path, monkeypatch):
    """``reporting.unit_times``: each unit's key, seconds and device, finished or pending."""
    from leakagelib.experiments.resume import PartialRecord

    monkeypatch.setattr(records, "default_results_dir", lambda: tmp_path)
    assert reporting.unit_times("cvb/table3-attacks") == []
    path = tmp_path / "cvb-table3-attacks.json.partial"
    partial = PartialRecord(path, {"scale": "paper", "seed": 0}, resume=False)
    partial.add(("mnist", "none", "idlg"), [{"ssim": 0.5}], 349.0, 12, made={"device": "cpu"})
    [(key, seconds, device)] = reporting.unit_times("cvb/table3-attacks")
    assert (key, seconds, device) == (["mnist", "none", "idlg"], 349.0, "cpu")
    path.unlink()
    units = [{"unit": ["mnist", "none", "cpl"], "seconds": 835.0, "device": "cuda"}]
    record = {"experiment": "cvb/table3-attacks", "scale": "paper", "rows": [],
              "provenance": {"device": "cuda", "wall_seconds": 835.0, "seed": 0, "units": units}}  # fmt: skip
    (tmp_path / "cvb-table3-attacks.json").write_text(json.dumps(record))
    assert reporting.unit_times("cvb/table3-attacks") == [(["mnist", "none", "cpl"], 835.0, "cuda")]


def test_the_images_behind_a_record_row_are_the_victims_its_run_used(tmp_path, monkeypatch):
    """``verdicts.images_per_row``: a run's ``--set victims=…`` wins over the registered count,
    for a finished record and for a pending one alike (the chapters judge both)."""
    from leakagelib import experiments, verdicts
    from leakagelib.experiments.resume import PartialRecord

    exp = experiments.get("cvb/table1-ignore")
    registered = exp.config.at("paper").get("victims")
    assert verdicts.images_per_row(exp, {"scale": "paper", "rows": []}) == registered
    assert verdicts.images_per_row(exp, {"scale": "ci", "rows": []}) == exp.config.at("ci").get(
        "victims"
    )
    changed = {"scale": "paper", "settings_changed": {"victims": {"registered": 128, "used": 8}}}
    assert verdicts.images_per_row(exp, changed) == 8
    monkeypatch.setattr(records, "default_results_dir", lambda: tmp_path)
    identity = {"scale": "paper", "seed": 0, "changes": {"victims": 5}}
    path = tmp_path / "cvb-table1-ignore.json.partial"
    PartialRecord(path, identity, resume=False).add("u", [{"position": 0}], 6.0, 11)
    pending, _ = reporting.results_record("cvb/table1-ignore")
    assert verdicts.images_per_row(exp, pending) == 5 != registered


def test_the_widget_manager_leaves_every_page_but_stays_in_myst_nbs_per_page_list():
    """jupyter-book lists every script under _static for every page; the one myst-nb adds to
    pages with widgets (``nb_ipywidgets_js``) is taken off that list, in either form."""
    config = SimpleNamespace(
        nb_ipywidgets_js={"widgets/widgets.js": {"data-jupyter-widgets-cdn": "widgets/"}},
        html_js_files=["widgets/widgets.js", ("widgets/widgets.js", {}), "other.js"],
    )
    widget_scripts.drop_global_widget_manager(None, config)
    assert config.html_js_files == ["other.js"]
    assert "widgets/widgets.js" in config.nb_ipywidgets_js


def _cell(kind: str, source: str, tags: tuple[str, ...] = ()) -> dict:
    return {"cell_type": kind, "source": source, "metadata": {"tags": list(tags)}}


def test_the_workload_counts_what_a_student_reads_and_runs(tmp_path: Path):
    cells = [
        _cell("markdown", "# One two three\n\nFour five {glue:text}`six`."),
        _cell("markdown", "````{exercise} Seven\n:label: x-ex\n\nEight nine.\n````"),
        _cell("markdown", "```{solution-start} x-ex\n:class: dropdown\n```\n\nHidden words."),
        _cell("code", "answer = 1", ("solution",)),
        _cell("markdown", "More hidden.\n```{solution-end}\n```"),
        _cell("code", "shown = 2"),
        _cell("code", "assert shown", ("remove-cell",)),
    ]
    notebook = tmp_path / "chapter.ipynb"
    notebook.write_text(json.dumps({"cells": cells}))
    counts = workload.workload(notebook)
    # "# One two three / Four five six" and "Seven / Eight nine": role names, directive
    # fences and options, and everything between a solution's start and end are not read
    assert counts == {"words": 9, "minutes": 1, "code cells": 1, "exercises": 1}


def test_the_workload_table_has_every_chapter_in_the_tocs_order():
    names = workload.chapters(ROOT)
    assert sorted(names) == sorted(CHAPTERS), "every chapter, and only chapters"
    lines = workload.workload_lines(ROOT)
    assert [line.split(" | ")[0] for line in lines[2:-1]] == [f"| {{doc}}`/{n}`" for n in names]
    total = [c.strip() for c in lines[-1].strip("|").split(" | ")]
    words = sum(workload.workload(ROOT / f"{n}.ipynb")["words"] for n in names)
    assert total[0] == "all chapters" and total[1] == f"{words:,}"
    assert int(total[4]) == sum(len(re.findall(r"\{exercise\}", _prose(n))) for n in names)


def _prose(name: str) -> str:
    cells = json.loads((ROOT / f"{name}.ipynb").read_text())["cells"]
    return "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def test_a_record_resumed_across_devices_names_each_kind():
    """Table III's record: its first unit ran on a lent GPU, the rest on the CPU."""
    units = [{"unit": 0, "device": "cuda"}, {"unit": 1, "device": "cpu"}]
    mixed = {"provenance": {"device": "cpu", "device_name": "x86_64", "units": units}}
    assert reproduction.device(mixed) == "cpu, cuda"
    one = {"provenance": {"device": "cpu", "device_name": "x86_64", "units": units[1:]}}
    assert reproduction.device(one) == "cpu (x86_64)"
