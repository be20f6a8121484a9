"""Intake, deleted-cell restoration and the whole-sandbox limits, without nbgrader's autograde (seconds).

Intake must let through only regular notebook files, check their size before reading them, accept a
byte-order mark and a renamed copy, and refuse everything else; the screen must put deleted cells
back; the sandbox's containment must bound all its processes together.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from course_lib.grading.intake import INTAKE_DIR, intake
from course_lib.grading.report import read_report
from course_lib.grading.screen import restore_missing_cells

MIB = 1024**2


def _notebook(text: str = "x = 1") -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(text)]
    return nbformat.writes(nb)


def _hand_in(root: Path, student: str, files: dict[str, object]) -> Path:
    folder = root / "submitted" / student / "ps1"
    folder.mkdir(parents=True)
    for name, content in files.items():
        path = folder / name
        if isinstance(content, tuple):  # ("link", target)
            os.symlink(content[1], path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(str(content), encoding="utf-8")
    return folder


def test_intake_copies_only_the_notebook_and_reports_every_refused_file(tmp_path):
    (tmp_path / "gradebook.db").write_text("secret grades")
    _hand_in(
        tmp_path,
        "amy",
        {
            "ps1.ipynb": _notebook(),
            "helpers.py": "import os",
            "notes.txt": ("link", "../../../gradebook.db"),
            "shadow": ("link", "/etc/shadow"),
            "timestamp.txt": "2025-01-01 10:00:00",
        },
    )
    (tmp_path / "submitted" / "amy" / "ps1" / "data").mkdir()
    [result] = intake(tmp_path, "ps1", ["ps1"])
    out = tmp_path / INTAKE_DIR / "amy" / "ps1"
    assert sorted(p.name for p in out.iterdir()) == ["ps1.ipynb", "timestamp.txt"]
    assert all(not p.is_symlink() for p in out.iterdir())
    assert sorted(result.refused) == ["data", "helpers.py", "notes.txt", "shadow"]
    lines = "\n".join(result.lines)
    assert (
        "'notes.txt': a symbolic link" in lines
        and "'data': a folder" in lines
        and "'helpers.py': a file" in lines
    )
    report = read_report(tmp_path / "reports", "ps1", "amy")
    assert sorted(report["intake"]["refused"]) == sorted(result.refused)


def test_a_renamed_copy_is_taken_as_the_notebook_and_a_bom_is_read_without_it(tmp_path):
    _hand_in(tmp_path, "bo", {"ps1 (1).ipynb": b"\xef\xbb\xbf" + _notebook("y = 2").encode()})
    _hand_in(tmp_path, "cy", {"PS1-Copy1.ipynb": _notebook(), "ps10.ipynb": _notebook()})
    bo, cy = intake(tmp_path, "ps1", ["ps1"])
    assert bo.accepted == {"ps1": "ps1 (1).ipynb"} and "taken as ps1.ipynb (renamed)" in "\n".join(bo.lines)
    assert "byte-order mark" in "\n".join(bo.lines)
    text = (tmp_path / INTAKE_DIR / "bo" / "ps1" / "ps1.ipynb").read_bytes()
    assert (
        not text.startswith(b"\xef\xbb\xbf")
        and nbformat.reads(text.decode(), as_version=4).cells[0].source == "y = 2"
    )
    assert cy.accepted == {"ps1": "PS1-Copy1.ipynb"} and cy.refused == ["ps10.ipynb"]


def test_an_oversized_notebook_is_refused_without_being_read(tmp_path):
    folder = _hand_in(tmp_path, "dee", {})
    big = folder / "ps1.ipynb"
    with big.open("wb") as fh:  # 300 MB on paper, nothing on disk: reading it would take 300 MB
        fh.truncate(300 * 10**6)
    started = time.perf_counter()
    [result] = intake(tmp_path, "ps1", ["ps1"], max_notebook_bytes=16 * MIB)
    assert time.perf_counter() - started < 5
    assert result.accepted == {} and "larger than the 16 MiB" in result.unreadable["ps1"]
    assert not (tmp_path / INTAKE_DIR / "dee").exists()


def test_a_notebook_that_is_not_json_or_a_link_is_not_graded(tmp_path):
    _hand_in(tmp_path, "eve", {"ps1.ipynb": _notebook()[:40]})
    (tmp_path / "real.ipynb").write_text(_notebook())
    _hand_in(tmp_path, "fay", {"ps1.ipynb": ("link", str(tmp_path / "real.ipynb"))})
    eve, fay = intake(tmp_path, "ps1", ["ps1"])
    assert "not a readable notebook" in eve.unreadable["ps1"]
    assert fay.accepted == {} and fay.refused == ["ps1.ipynb"] and "symbolic link" in fay.lines[0]


def _cell(source: str, grade_id: str, **flags) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {
        "grade_id": grade_id,
        "locked": False,
        "solution": False,
        "grade": False,
        **flags,
    }
    return cell


def test_deleted_cells_are_put_back_after_the_nearest_earlier_cell():
    release = nbformat.v4.new_notebook()
    release.cells = [
        _cell("import math", "setup", locked=True),
        _cell("def f():\n    raise NotImplementedError()", "q1_answer", solution=True),
        _cell("assert f() == 1", "q1", grade=True, locked=True, points=2),
        _cell("def g():\n    raise NotImplementedError()", "q2_answer", solution=True),
        _cell("assert g() == 2", "q2", grade=True, locked=True, points=3),
    ]
    submitted = nbformat.v4.new_notebook()
    submitted.cells = [release.cells[1].copy(), release.cells[2].copy(), nbformat.v4.new_code_cell("my own")]
    submitted.cells[0].source = "def f():\n    return 1"
    events = restore_missing_cells(submitted, release)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in submitted.cells]
    assert ids == ["setup", "q1_answer", "q1", "q2_answer", "q2", None]
    assert submitted.cells[1].source == "def f():\n    return 1", "the student's answer stays"
    assert submitted.cells[3].source.endswith("raise NotImplementedError()"), "a deleted answer is its stub"
    assert len(events) == 3 and "'q2_answer' was missing: the released answer stub" in events[1]


# --- the whole sandbox's limits ----------------------------------------------------------------------

HOG = """
import os, sys, time
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        block = bytearray(int(sys.argv[1]))
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(30)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("prefer", ["auto", "watchdog"])
def test_a_forking_sandbox_is_held_to_its_memory_as_a_whole(prefer):
    """Three children of 200 MiB against a 256 MiB limit for all of them: the limit wins."""
    import psutil

    from course_lib.grading.limits import contain, sandbox_processes

    containment = contain(256 * MIB, 16, prefer=prefer)
    process = subprocess.Popen(containment.wrap([sys.executable, "-c", HOG, str(200 * MIB)]))
    containment.started(process.pid)
    peak = 0
    try:
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            used = 0
            for pid in sandbox_processes(process.pid):
                with contextlib.suppress(psutil.Error):
                    used += psutil.Process(pid).memory_full_info().uss
            peak = max(peak, used)
            if any("limit reached" in e for e in containment.events()) and containment.kind != "watchdog":
                break
            time.sleep(0.02)
        assert any("limit reached" in event for event in containment.events()), containment.events()
    finally:
        containment.close()
        process.kill()
        process.wait()
    slack = 64 * MIB if containment.kind != "watchdog" else 400 * MIB  # the watchdog looks every 0.1 s
    assert peak <= 256 * MIB + slack, f"{containment.kind}: the sandbox reached {peak / MIB:.0f} MiB"


def test_contain_uses_a_delegated_cgroup_v2_when_one_is_writable(monkeypatch, tmp_path):
    from course_lib.grading import limits

    root = tmp_path / "cgroup"
    mine = root / "user.slice" / "me.scope"
    mine.mkdir(parents=True)
    (mine.parent / "cgroup.subtree_control").write_text("cpu memory pids\n")
    monkeypatch.setattr(limits, "_cgroup_mounts", lambda: {"unified": root})
    monkeypatch.setattr(limits, "_own_cgroups", lambda: {"unified": "/user.slice/me.scope"})
    found = limits.contain(512 * MIB, 32, prefer="cgroup2")
    [folder] = found.cgroup_dirs
    assert found.kind == "cgroup2" and folder.parent == mine.parent
    assert (folder / "memory.max").read_text() == str(512 * MIB) and (folder / "pids.max").read_text() == "32"
    assert found.wrap(["true"])[:3] == ["/bin/sh", "-c", limits._JOIN_SCRIPT]
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert found.events() == ["memory limit reached (1 process(es) killed)"]
    for name in ("memory.max", "pids.max", "memory.events", "memory.swap.max"):
        (folder / name).unlink(missing_ok=True)
    found.close()
    assert not folder.exists()
    with pytest.raises(ValueError, match="prefer must be"):
        limits.contain(MIB, 1, prefer="docker")


def test_the_report_says_why_a_kernel_was_replaced(tmp_path):
    """A flood of output ends the kernel; the instructor must read why q1 then fails with a NameError."""
    from course_lib.grading.report import report_text, update_report

    why = "the kernel died while running this cell (killed, out of memory or os._exit)"
    update_report(tmp_path, "ps1", "flood", "replaced", [why], notebook="ps1")
    update_report(tmp_path, "ps1", "calm", "replaced", [], notebook="ps1")
    text = report_text(tmp_path, "ps1")
    assert f"flood\n  ps1: kernel replaced: {why}" in text
    assert text.endswith("nothing to report: calm")
