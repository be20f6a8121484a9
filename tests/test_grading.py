"""course_lib.grading on a small gradebook built with nbgrader's API (no kernels: seconds, not minutes)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from components import require_component

from course_lib.grading import (
    QUESTION_COLUMNS,
    gradebook_url,
    main,
    question_scores,
    run_nbgrader,
    score_table,
)
from course_lib.grading.sandbox import MECHANISMS

EXERCISES = Path(__file__).resolve().parents[1] / "exercises"
# nbgrader's add_submission trips SQLAlchemy autoflush warnings inside nbgrader itself; they are harmless.
pytestmark = pytest.mark.filterwarnings("ignore:Object of type:sqlalchemy.exc.SAWarning")


@pytest.fixture(scope="module")
def gradebook_file(tmp_path_factory) -> Path:
    """ps1: q1, q2, q10 (3, 2, 1 points), amy fully autograded, bo's q10 never scored; ps2: no submissions;
    ps3: two notebooks with a q1 each, amy scores 1 on both."""
    from nbgrader.api import Gradebook

    path = tmp_path_factory.mktemp("gradebook") / "gradebook.db"
    with pytest.MonkeyPatch.context() as mp:
        # nbgrader runs the `alembic` script by name when it creates a gradebook.
        mp.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        with Gradebook(f"sqlite:///{path}", course_id="inference-workbook") as gb:
            gb.add_assignment("ps1")
            gb.add_notebook("ps1", "ps1")
            for name, points in (("q1", 3), ("q2", 2), ("q10", 1)):
                gb.add_grade_cell(name, "ps1", "ps1", max_score=points, cell_type="code")
            gb.add_assignment("ps2")
            gb.add_assignment("ps3")  # two notebooks that both have a "q1"
            for notebook, points in (("part_a", 1), ("part_b", 2)):
                gb.add_notebook(notebook, "ps3")
                gb.add_grade_cell("q1", notebook, "ps3", max_score=points, cell_type="code")
            for student, scores in (("amy", {"q1": 3, "q2": 0, "q10": 1}), ("bo", {"q1": 1.5, "q2": 2})):
                gb.add_student(student)
                gb.add_submission("ps1", student)
                for name, score in scores.items():
                    grade = gb.find_grade(name, "ps1", "ps1", student)
                    grade.auto_score = score
                    grade.needs_manual_grade = False
            gb.add_submission("ps3", "amy")
            for notebook in ("part_a", "part_b"):
                grade = gb.find_grade("q1", notebook, "ps3", "amy")
                grade.auto_score, grade.needs_manual_grade = 1.0, False
            gb.db.commit()
    return path


@pytest.fixture
def course_root(tmp_path, gradebook_file) -> Path:
    """A course folder holding a fresh copy of the small gradebook."""
    shutil.copy(gradebook_file, tmp_path / "gradebook.db")
    return tmp_path


def test_question_scores_has_one_row_per_student_and_grade_cell_in_natural_order(course_root):
    table = question_scores(course_root, "ps1")
    assert list(table.columns) == list(QUESTION_COLUMNS)
    assert list(zip(table.student_id, table.question, strict=True)) == [
        ("amy", "q1"),
        ("amy", "q2"),
        ("amy", "q10"),
        ("bo", "q1"),
        ("bo", "q2"),
        ("bo", "q10"),
    ]
    assert table.score.tolist() == [3.0, 0.0, 1.0, 1.5, 2.0, 0.0]
    assert table.max_score.tolist() == [3.0, 2.0, 1.0, 3.0, 2.0, 1.0]


def test_a_cell_nobody_scored_is_flagged_not_autograded_and_needing_a_grader(course_root):
    table = question_scores(course_root).set_index(["student_id", "question"])
    assert table.loc[("bo", "q10"), ["score", "autograded", "needs_manual_grade"]].tolist() == [
        0.0,
        False,
        True,
    ]
    assert table.loc[("amy", "q10"), ["autograded", "needs_manual_grade"]].tolist() == [True, False]


def test_a_manual_score_takes_precedence_over_the_autograder(course_root):
    from nbgrader.api import Gradebook

    with Gradebook(gradebook_url(course_root), course_id="inference-workbook") as gb:
        gb.find_grade("q2", "ps1", "ps1", "amy").manual_score = 1.5
        gb.db.commit()
    table = question_scores(course_root, "ps1").set_index(["student_id", "question"])
    assert table.loc[("amy", "q2"), "score"] == 1.5


def test_an_assignment_without_submissions_has_no_rows(course_root):
    assert question_scores(course_root, "ps2").empty


def test_score_table_has_a_column_per_question_with_its_points_and_a_total(course_root):
    table = score_table(course_root, "ps1")
    assert list(table.columns) == ["q1 (3)", "q2 (2)", "q10 (1)", "total (6)"]
    assert table.loc["amy"].tolist() == [3.0, 0.0, 1.0, 4.0]
    assert table.loc["bo", ["q1 (3)", "q2 (2)"]].tolist() == [1.5, 2.0]
    assert table.loc["bo", ["q10 (1)", "total (6)"]].isna().all(), "an unscored question is not a 0"


def test_score_table_prefixes_questions_with_their_notebook_when_there_are_several(course_root):
    table = score_table(course_root, "ps3")
    assert list(table.columns) == ["part_a/q1 (1)", "part_b/q1 (2)", "total (3)"]
    assert table.loc["amy"].tolist() == [1.0, 1.0, 2.0]


def test_reading_scores_leaves_the_gradebook_file_unchanged(course_root):
    before = hashlib.sha256((course_root / "gradebook.db").read_bytes()).hexdigest()
    question_scores(course_root)
    score_table(course_root, "ps1")
    assert hashlib.sha256((course_root / "gradebook.db").read_bytes()).hexdigest() == before


def test_unknown_assignment_is_a_value_error_naming_it_and_the_known_ones(course_root):
    with pytest.raises(ValueError, match=r"'ps9' is not in the gradebook.*'ps1', 'ps2', 'ps3'"):
        question_scores(course_root, "ps9")


def test_score_table_needs_an_assignment_with_submissions(course_root):
    with pytest.raises(ValueError, match="assignment is required"):
        score_table(course_root)
    with pytest.raises(ValueError, match="'ps2' has no submissions"):
        score_table(course_root, "ps2")


def test_a_course_without_gradebook_says_to_generate_the_assignment_first(tmp_path):
    with pytest.raises(FileNotFoundError, match="nbgrader generate_assignment"):
        question_scores(tmp_path)
    assert not (tmp_path / "gradebook.db").exists(), "reading must not create an empty gradebook"


def test_a_course_root_that_is_not_a_folder_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="course_root must be an existing nbgrader course folder"):
        gradebook_url(tmp_path / "missing")


def test_run_nbgrader_needs_a_subcommand():
    with pytest.raises(ValueError, match="args must be non-empty"):
        run_nbgrader()


def test_command_line_prints_a_score_table_per_assignment_with_submissions(course_root, capsys):
    main(["--course-root", str(course_root)])
    out = capsys.readouterr().out
    assert out.startswith("ps1\n") and "ps2" not in out, "ps2 has no submissions"
    assert "q10 (1)" in out and "total (6)" in out
    amy = next(line for line in out.splitlines() if line.startswith("amy"))
    assert amy.split() == ["amy", "3.0", "0.0", "1.0", "4.0"]


# --- safe grading: sandbox, screen, report, command line (one real kernel, a few seconds) --------------


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("get_ipython().events.register('pre_run_cell', print)", "get_ipython"),
        ("ip.ast_transformers.append(x)", "AST transformer"),
        ("import sys\nsys.settrace(f)", "settrace"),
        ("import inspect\nline = inspect.stack()[1]", "inspect.stack"),
        ("from inspect import currentframe", "currentframe"),
        ("import subprocess", "subprocess"),
        ("import sqlite3", "sqlite3"),
        ("import site", "site"),
        ("import os\nos._exit(0)", "os._exit"),
        ("open('../../gradebook.db', 'w')", "outside its folder"),
        ("open(path, 'a')", "computed path"),
        ("%time x = 1\nget_ipython()", "get_ipython"),
        ("def broken(:\n    get_ipython", "get_ipython"),
        ("import IPython\nIPython.get_ipython().kernel", "get_ipython"),
        ("from IPython.core.interactiveshell import InteractiveShell", "reaches into IPython"),
        ("import jupyter_client.session", "jupyter_client"),
        ("import sys\nsys.modules['math'] = proxy", "sys.modules"),
        ("import os\nos.rename(a, b)", "os.rename"),
        ("from pathlib import Path\nPath(name).replace(target)", ".replace"),
        ("import os as _os\n_os.fork()", "os.fork"),
        ("import course_lib.grading.kernel_side as ks\nks.serve = mine", "grader's own code"),
        ("from course_lib.grading import kernel_side", "grader's own code"),
    ],
)
def test_screen_flags_kernel_level_code(source, reason):
    from course_lib.grading.screen import scan_source

    found = scan_source(source)
    assert any(reason in why for why in found), found


@pytest.mark.parametrize(
    "source",
    [
        "import math\nimport numpy as np\nfrom fractions import Fraction\nx = math.isclose(1, 1)",
        "open('results.csv', 'w').write('x')\nprint(open('../data.csv').read())",
        "import warnings, logging\nwarnings.warn('slow')\nlogging.warning('x')",
        "# subprocess and get_ipython in a comment are fine\ns = 'sqlite3'",
        "from IPython.display import display, HTML\ndisplay(HTML('<b>p99</b>'))",
        "renamed = stage_ms.rename(columns={'a_ms': 'a'})\nlabel = 'p99_ms'.replace('_ms', '')",
        "import pandas as pd\nframe = pd.DataFrame()\nframe.replace(0, 1).rename(index=str)",
        "from pathlib import Path\nPath('results.csv').write_text('x')",
    ],
)
def test_screen_leaves_ordinary_code_alone(source):
    from course_lib.grading.screen import scan_source

    assert scan_source(source) == []


def test_without_any_sandbox_autograde_refuses_and_names_both_mechanisms(monkeypatch, capsys, tmp_path):
    from course_lib.grading import cli, sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name, **kw: None)
    check = sandbox.find_sandbox()
    assert check.mechanism is None and "bubblewrap (`bwrap`) is not installed" in check.reason
    assert "util-linux's `unshare`" in check.reason
    monkeypatch.setattr(cli, "find_sandbox", sandbox.find_sandbox)
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\n")
    with pytest.raises(SystemExit) as stopped:
        main(["autograde", "ps1", "--course-root", str(tmp_path)])
    assert stopped.value.code == cli.EXIT_NO_SANDBOX
    err = capsys.readouterr().err
    assert "Refusing to autograde ps1: bubblewrap" in err and "`unshare`" in err and "--unsafe" in err
    with pytest.raises(ValueError, match="prefer must be one of"):
        sandbox.find_sandbox("docker")


def test_autograde_refuses_when_the_course_configuration_does_not_load(tmp_path, capsys):
    """nbgrader itself logs a broken nbgrader_config.py and grades with its defaults: unsandboxed."""
    from course_lib.grading import cli

    (tmp_path / "nbgrader_config.py").write_text(
        "c = get_config()\nfrom course_lib.grading import nothing_here\n"
    )
    with pytest.raises(SystemExit) as stopped:
        main(
            ["autograde", "ps1", "--course-root", str(tmp_path), "--", "--GuardedExecute.notebook_budget_s=9"]
        )
    assert stopped.value.code == cli.EXIT_BAD_CONFIG
    assert "raises ImportError" in capsys.readouterr().err
    assert cli.config_error(EXERCISES) is None, "the course's own configuration loads"


@pytest.mark.needs("unshare")
def test_without_bwrap_auto_falls_back_to_unshare(monkeypatch):
    from course_lib.grading import sandbox

    which = sandbox.shutil.which
    monkeypatch.setattr(
        sandbox.shutil, "which", lambda name, **kw: None if name == "bwrap" else which(name, **kw)
    )
    check = sandbox.find_sandbox()
    assert (check.mechanism, check.executable) == ("unshare", which("unshare")), check.reason


def _view(tmp_path, **limits):
    from course_lib.grading.view import kernel_view

    (tmp_path / "seed").mkdir(exist_ok=True)
    (tmp_path / "conn").mkdir(exist_ok=True)
    return kernel_view(
        ["python", "-m", "ipykernel_launcher"],
        cwd="/course/autograded/amy/ps1",
        seed_dir=str(tmp_path / "seed"),
        connection_dir=str(tmp_path / "conn"),
        env={"SECRET_TOKEN": "x", "LANG": "C.UTF-8"},
        **limits,
    )


def test_bwrap_command_hides_the_course_writes_nothing_to_the_host_and_limits_the_kernel(tmp_path):
    from course_lib.grading.sandbox import bwrap_command
    from course_lib.grading.view import IPC_DIR, SEED_DIR

    view = _view(tmp_path, memory_limit_bytes=123, cpu_limit_s=7, max_processes=9, cwd_size_bytes=5 * 1024**2)
    cmd = bwrap_command(view, bwrap="/usr/bin/bwrap")
    assert cmd[:6] == [
        "/usr/bin/bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]
    assert "--share-net" not in cmd and "--clearenv" in cmd and "SECRET_TOKEN" not in cmd
    assert "--bind" not in cmd and "--dev-bind" not in cmd, "no host folder is writable inside"
    tmpfs = {cmd[i + 3]: int(cmd[i + 1]) for i, arg in enumerate(cmd) if arg == "--size"}
    assert tmpfs == {
        "/tmp": 256 * 1024**2,
        "/dev/shm": 64 * 1024**2,
        "/course/autograded/amy/ps1": 5 * 1024**2,
        IPC_DIR: 1024**2,
    }
    assert ["--ro-bind", str(tmp_path / "seed"), SEED_DIR] == cmd[
        cmd.index(SEED_DIR) - 2 : cmd.index(SEED_DIR) + 1
    ]
    assert cmd[cmd.index("/dev/shm") + 1 : cmd.index("/dev/shm") + 3] == ["--remount-ro", "/dev"]
    binds = [cmd[i + 2] for i, arg in enumerate(cmd) if arg == "--ro-bind"]
    assert all(not b.startswith("/course") for b in binds)
    assert cmd[-9:] == [
        "123",
        "7",
        str(256 * 1024**2),
        "9",
        SEED_DIR,
        "/course/autograded/amy/ps1",
        "python",
        "-m",
        "ipykernel_launcher",
    ]


def test_unshare_command_makes_every_namespace_drops_privileges_and_needs_its_tools(tmp_path):
    from course_lib.grading.unshare import find_tools, unshare_command

    cmd = unshare_command(_view(tmp_path, memory_limit_bytes=123), root_dir=str(tmp_path / "root"))
    script = cmd[cmd.index("-c") + 1]
    assert cmd[1:4] == ["--pdeathsig", "KILL", "--"], "unshare dies with the grader"
    for flag in ("--user", "--mount", "--net", "--pid", "--fork", "--kill-child=SIGKILL"):
        assert flag in cmd[: cmd.index("-c")]
    assert "pivot_root" in script and "--bounding-set=-all" in script and " -i " in script
    assert "SECRET_TOKEN" not in " ".join(cmd) and "LANG=C.UTF-8" in script
    assert "--bind" not in script.split("ro() {")[0], "only read-only binds"
    assert f'size={256 * 1024**2} grading-mem "$R"/course/autograded/amy/ps1' in script
    assert f"size={64 * 1024**2} grading-shm" in script and 'remount,bind,ro,nosuid "$R/dev"' in script
    assert cmd[-9:-5] == ["123", "900", str(256 * 1024**2), "0"] or cmd[-9:-5] == [
        "123",
        "600",
        str(256 * 1024**2),
        "0",
    ]
    tools = {**find_tools(), "pivot_root": None}
    with pytest.raises(FileNotFoundError, match=r"missing: \['pivot_root'\]"):
        unshare_command(_view(tmp_path), root_dir=str(tmp_path), tools=tools)


KERNEL_PROBE = r"""
import json, os, socket, subprocess, sys
found = {"cwd_files": sorted(os.listdir("."))}
for name, folder in (("cwd", "."), ("tmp", "/tmp"), ("shm", "/dev/shm")):
    try:
        with open(os.path.join(folder, "big.bin"), "wb") as fh:
            fh.write(b"x" * (3 * 1024**2))
        found["full_" + name] = False
    except OSError:
        found["full_" + name] = True
    if os.path.exists(os.path.join(folder, "big.bin")):
        os.remove(os.path.join(folder, "big.bin"))
conn = os.path.dirname(sys.argv[sys.argv.index("-f") + 1])  # the folder of the connection file
for name, path in (("dev", "/dev/new"), ("conn", os.path.join(conn, "x"))):
    try:
        open(path, "w").close()
        found["wrote_" + name] = True
    except OSError:
        found["wrote_" + name] = False
found["sees_gradebook"] = os.path.exists("../../../gradebook.db")
found["sees_sibling"] = os.path.exists("../../bo")
found["sees_shadow"] = os.path.exists("/etc/shadow")
import course_lib, pandas  # the course environment works inside
for name, path in (
    ("course_lib", os.path.join(os.path.dirname(course_lib.__file__), "x.py")),
    ("venv", sys.prefix + "/x.py"),
    ("root", "/x"),
):
    try:
        open(path, "w").close()
        found["wrote_" + name] = True
    except OSError:
        found["wrote_" + name] = False
# Run as root, the kernel owns the host's device nodes and sysctls: both must be out of its reach. The
# probes change nothing: the mode /dev/null already has; a sysctl opened for writing, never written.
for name, change in (
    ("dev_null_mode", lambda: os.chmod("/dev/null", 0o666)),
    ("sysctl", lambda: os.close(os.open("/proc/sys/kernel/panic", os.O_WRONLY))),
):
    try:
        change()
        found["may_change_" + name] = True
    except OSError:
        found["may_change_" + name] = False
open("scratch.txt", "w").write("mine")
try:
    socket.create_connection(("1.1.1.1", 80), timeout=2)
    found["network"] = True
except OSError:
    found["network"] = False
subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(300)  # DETACHED-PROBE"], start_new_session=True
)
print(json.dumps(found))
"""


async def _execute(kc, code: str) -> tuple[str, list[str]]:
    """Run code on an async kernel client; (status, stdout and error names)."""
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(msg["content"]["ename"])

    reply = await kc.execute_interactive(code, timeout=60, output_hook=hook)
    return reply["content"]["status"], out


def _in_sandboxed_kernel(tmp_path, scenario, sandbox: str = "auto", **manager_options):
    """Run ``scenario(kc, km, folder)`` against a kernel in the ``sandbox`` mechanism whose notebook
    folder is tmp/course/autograded/amy/ps1 (a data file and the notebook, which must not be copied in)."""
    from course_lib.grading.manager import SandboxedKernelManager

    require_component("grading sandbox" if sandbox == "auto" else sandbox)
    folder = tmp_path / "course" / "autograded" / "amy" / "ps1"
    folder.mkdir(parents=True)
    (folder / "data.csv").write_text("x\n1\n")
    (folder / "ps1.ipynb").write_text("{}")
    (tmp_path / "course" / "gradebook.db").write_text("grades")
    (tmp_path / "course" / "autograded" / "bo").mkdir()

    async def run():
        small = 2 * 1024**2  # in-memory folders of 2 MiB: a 3 MiB file does not fit
        km = SandboxedKernelManager(
            kernel_name="python3",
            sandbox=sandbox,
            tmp_size_bytes=small,
            shm_size_bytes=small,
            cwd_size_bytes=small,
            **manager_options,
        )
        await km.start_kernel(cwd=str(folder))  # a failed start kills its own sandbox (tested below)
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            await scenario(kc, km, folder)
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)

    asyncio.run(run())


def _processes_with_marker(marker: bytes) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes():
                found.append(entry.name)
        except OSError:
            continue
    return found


def test_a_seed_that_cannot_be_copied_leaves_no_scratch_folder(tmp_path, monkeypatch):
    import tempfile

    from course_lib.grading import manager

    require_component("grading sandbox")

    def fail(src: Path, dest: Path) -> None:
        dest.mkdir()
        (dest / "partial").write_text("copied before the failure")
        raise OSError("a folder vanished while it was copied")

    monkeypatch.setattr(manager, "_copy_seed", fail)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the scratch folder is made
    km = manager.SandboxedKernelManager(kernel_name="python3")
    with pytest.raises(OSError, match="vanished"):
        asyncio.run(km.start_kernel(cwd=str(tmp_path)))
    assert not list(tmp_path.glob("grading-*"))


@pytest.mark.parametrize("sandbox", MECHANISMS)
def test_a_kernel_whose_sockets_never_listen_is_killed_with_its_scratch_folder(
    tmp_path, monkeypatch, sandbox
):
    """A start that fails after the sandbox was launched leaves no process and no scratch folder behind."""
    import tempfile

    from course_lib.core.waiting import wait_until
    from course_lib.grading import manager

    require_component(sandbox)
    marker = str(tmp_path).encode()  # the sandbox's command lines name its scratch folder, made in tmp_path
    launched: list[list[str]] = []

    async def never(self, top: int) -> str:
        await asyncio.to_thread(
            wait_until, lambda: _processes_with_marker(marker), timeout_s=30, what="the sandbox to start"
        )
        launched.append(_processes_with_marker(marker))
        raise TimeoutError("the sandboxed kernel's sockets were not all listening within 0 s")

    monkeypatch.setattr(manager.SandboxedKernelManager, "_wait_for_sockets", never)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "course").mkdir()
    km = manager.SandboxedKernelManager(kernel_name="python3", sandbox=sandbox)
    with pytest.raises(TimeoutError, match="listening"):
        asyncio.run(km.start_kernel(cwd=str(tmp_path / "course")))
    assert launched, "the sandbox was running when the wait failed"
    wait_until(lambda: not _processes_with_marker(marker), timeout_s=30, what="the sandbox to die")
    assert not list(tmp_path.glob("grading-*"))


def test_the_kernel_is_the_process_that_holds_its_sockets_once_they_listen(tmp_path):
    """A socket bound but not listening refuses connections, and the grader's sockets never retry; a
    child that shares the sandbox's namespaces but not the sockets (it may exit at any time) is not taken."""
    import socket
    import subprocess

    from course_lib.grading.manager import holds_listening_sockets

    path = str(tmp_path / "kernel-1")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(path)
        assert not holds_listening_sockets(os.getpid(), [path])
        sock.listen()
        assert holds_listening_sockets(os.getpid(), [path])
        assert not holds_listening_sockets(os.getpid(), [path, str(tmp_path / "kernel-2")])
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )
        try:
            assert not holds_listening_sockets(child.pid, [path]), "same namespaces, but not its socket"
        finally:
            child.communicate(b"")
    assert not holds_listening_sockets(-1, [path]), "a process that has gone holds nothing"


@pytest.mark.parametrize("sandbox", MECHANISMS)
def test_a_sandboxed_kernel_sees_only_its_scratch_copy_and_cannot_write_or_connect_out(tmp_path, sandbox):
    from course_lib.core.waiting import wait_until

    async def scenario(kc, km, folder):
        status, out = await _execute(kc, KERNEL_PROBE)
        assert status == "ok", out
        assert json.loads(out[-1]) == {
            "cwd_files": ["data.csv"],
            "full_cwd": True,
            "full_tmp": True,
            "full_shm": True,
            "wrote_dev": False,
            "wrote_conn": False,
            "sees_gradebook": False,
            "sees_sibling": False,
            "sees_shadow": False,
            "wrote_course_lib": False,
            "wrote_venv": False,
            "wrote_root": False,
            "may_change_dev_null_mode": False,
            "may_change_sysctl": False,
            "network": False,
        }
        assert not (folder / "scratch.txt").exists(), "writes stay in the private scratch copy"
        assert _processes_with_marker(b"DETACHED-PROBE"), "the detached child runs while its kernel does"

    _in_sandboxed_kernel(tmp_path, scenario, sandbox)
    wait_until(lambda: not _processes_with_marker(b"DETACHED-PROBE"), timeout_s=30, what="the child to die")


@pytest.mark.parametrize("sandbox", MECHANISMS)
def test_a_sandboxed_kernel_that_kills_itself_dies(tmp_path, sandbox):
    """The out-of-memory killer's way: the grader must see a dead kernel, not a hang."""
    from course_lib.core.waiting import async_wait_until

    async def scenario(kc, km, folder):
        kc.execute("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")

        async def dead():
            return not await km.is_alive()

        await async_wait_until(dead, timeout_s=30, interval_s=0.05, what="the kernel to die")

    _in_sandboxed_kernel(tmp_path, scenario, sandbox)


def test_the_watchdog_kills_a_sandboxed_kernel_whose_children_take_too_much_memory(tmp_path):
    """The mode used where no cgroup can be made (an ordinary user without a delegated cgroup)."""
    from course_lib.core.waiting import async_wait_until

    hog = (
        "import os\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        block = bytearray(300 * 1024**2)\n"
        "        for i in range(0, len(block), 4096):\n"
        "            block[i] = 1\n"
        "        __import__('time').sleep(60)\n"
        "        os._exit(0)\n"
        "__import__('time').sleep(60)\n"
    )

    async def scenario(kc, km, folder):
        kc.execute(hog)

        async def dead():
            return not await km.is_alive()

        await async_wait_until(dead, timeout_s=60, interval_s=0.05, what="the watchdog to kill the sandbox")
        assert km.events() == ["memory limit reached: the watchdog killed the sandbox"]
        assert 0 < km.peak_memory_bytes() <= 512 * 1024**2 + 400 * 1024**2

    _in_sandboxed_kernel(tmp_path, scenario, containment="watchdog", sandbox_memory_bytes=512 * 1024**2)


BURNERS = (
    "import os\n"
    "for _ in range(3):  # CPU burners that would compete with the baseline while it is timed\n"
    "    if os.fork() == 0:\n"
    "        while True:\n"
    "            pass\n"
)


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (stat fields 14 and 15)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("sandbox", MECHANISMS)
def test_a_paused_sandbox_runs_nothing_until_the_block_ends(tmp_path, sandbox):
    """What the speed checks rely on: while the baseline is timed, nothing of the submission runs."""
    import time

    from course_lib.core.waiting import async_wait_until
    from course_lib.grading.limits import sandbox_processes

    async def scenario(kc, km, folder):
        status, out = await _execute(kc, BURNERS)
        assert status == "ok", out
        top = km.provisioner.process.pid

        async def burning():
            return len(sandbox_processes(top)) >= 4 + 1  # the kernel, 3 burners, the sandbox's own

        await async_wait_until(burning, timeout_s=30, interval_s=0.05, what="the burners to start")
        with km.paused() as stopped:
            assert set(sandbox_processes(top)) <= set(stopped)
            assert {_state(pid) for pid in stopped} <= {"T", "t"}, "every process is stopped"
            before = {pid: _cpu_ticks(pid) for pid in stopped}
            time.sleep(0.5)
            assert {pid: _cpu_ticks(pid) for pid in stopped} == before, "no CPU used while paused"
        burners = [pid for pid in sandbox_processes(top) if _state(pid) == "R"]
        start = {pid: _cpu_ticks(pid) for pid in burners}
        time.sleep(0.5)
        assert burners and any(_cpu_ticks(pid) > start[pid] for pid in burners), "they run again after it"

    _in_sandboxed_kernel(tmp_path, scenario, sandbox)


def test_an_interpreter_started_through_a_relative_path_is_shown_to_the_kernel_at_its_absolute_path(
    tmp_path, monkeypatch
):
    """``../.venv/bin/python -m course_lib.grading`` run from exercises/.

    ``exercises/..`` is not in the sandbox: the kernel sees the interpreter at its absolute path.
    """
    import os

    from course_lib.grading.view import kernel_view

    relative = os.path.join(os.path.dirname(sys.executable), "..", "bin", os.path.basename(sys.executable))
    monkeypatch.setattr(sys, "executable", relative)
    (tmp_path / "seed").mkdir()
    view = kernel_view(
        [relative, "-m", "ipykernel_launcher"], cwd="/c", seed_dir=str(tmp_path / "seed"), connection_dir="/c"
    )
    python = os.path.abspath(relative)
    assert view.command[0] == python and python in view.command[1:], view.command
    assert ".." not in python.split(os.sep)
    assert any(dest == os.path.dirname(python) for _, dest in view.read_only), view.read_only


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="user ids are POSIX")
def test_autograde_warns_when_it_grades_as_root(monkeypatch):
    from course_lib.grading.cli import root_note

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    note = root_note()
    assert note is not None and "as root" in note and "ordinary user" in note
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert root_note() is None
