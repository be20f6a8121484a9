"""``make course``'s runner: which lessons it runs, what it writes, its exit status and its errors."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course_lib.course_runner import lesson_paths, main


def _lesson(path: Path, source: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_lesson_paths_expand_folders_keep_order_and_drop_repeats(tmp_path: Path) -> None:
    folder = tmp_path / "lessons"
    folder.mkdir()
    b = _lesson(folder / "02_b.ipynb", "x = 2")
    a = _lesson(folder / "01_a.ipynb", "x = 1")
    (folder / "notes.txt").write_text("not a lesson")
    extra = _lesson(tmp_path / "99_extra.ipynb", "x = 9")
    assert lesson_paths(folder) == [a, b]
    assert lesson_paths([extra, folder, b]) == [extra, a, b]


def test_lesson_paths_name_the_bad_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.ipynb"):
        lesson_paths([tmp_path / "missing.ipynb"])
    text = tmp_path / "notes.txt"
    text.write_text("x")
    with pytest.raises(ValueError, match=r"notes\.txt.*not a notebook"):
        lesson_paths([text])


def test_main_runs_only_the_named_lesson_and_reports_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ok = _lesson(tmp_path / "01_ok.ipynb", "answer = 6 * 7\nprint(answer)")
    _lesson(tmp_path / "02_bad.ipynb", "raise RuntimeError('planted failure')")
    out = tmp_path / "out"
    assert main([str(ok), "--out", str(out), "--budget-s", "600"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["01_ok.html", "01_ok.ipynb"]
    executed = nbformat.read(out / "01_ok.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "42\n"
    assert "1 lesson," in capsys.readouterr().out

    assert main([str(tmp_path), "--out", str(out), "--budget-s", "600"]) == 1
    table = capsys.readouterr().out
    assert "01_ok" in table and "02_bad" in table and "planted failure" in table
    assert "\x1b[" not in table  # the traceback's colour codes are not copied into the table
    assert (out / "02_bad.ipynb").is_file()  # a failing lesson's executed copy is kept to read


def test_main_refuses_a_missing_path_with_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _lesson(tmp_path / "05_cpu_gpu_cost.ipynb", "x = 5")
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "05_cpu_gpu_cost.ipnyb")])  # a typo a student makes
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "usage:" not in err
    assert (
        "05_cpu_gpu_cost.ipnyb" in err and f"did you mean {str(tmp_path / '05_cpu_gpu_cost.ipynb')!r}" in err
    )
    with pytest.raises(SystemExit):
        main([])
    assert "name a folder of lessons" in capsys.readouterr().err
