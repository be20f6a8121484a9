"""The process toolkit (``core.process``, ``core.guard``): ports, exit with the parent, stopping, logs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from course_lib.core.checks import InvalidArgumentError
from course_lib.core.guard import guard_command
from course_lib.core.process import (
    PARENT_DEATHSIG_ENV,
    PARENT_PID_ENV,
    child_env,
    exit_with_parent,
    free_port,
    reserve_port,
    start_child,
    stop_process,
)
from course_lib.core.waiting import wait_until


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_free_port_binds_and_a_reserved_port_is_shared_only_with_reuse_port():
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    reserved = reserve_port()
    try:
        port = reserved.getsockname()[1]
        with socket.socket() as plain, pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))  # nobody else takes it
        with socket.socket() as worker:
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker.bind(("127.0.0.1", port))  # a worker of ours does
            worker.listen()
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
    finally:
        reserved.close()


def test_child_env_names_the_parent_and_the_thread_it_was_started_from():
    env = child_env({"X": "1"})
    assert env[PARENT_PID_ENV] == str(os.getpid()) and env["X"] == "1" and env[PARENT_DEATHSIG_ENV] == "1"
    seen = {}
    thread = threading.Thread(target=lambda: seen.update(child_env()))
    thread.start()
    thread.join()
    assert seen[PARENT_DEATHSIG_ENV] == "0"  # PR_SET_PDEATHSIG would fire when that thread ends


def test_a_child_started_from_a_thread_that_ends_outlives_the_thread_but_not_the_parent(tmp_path):
    """PR_SET_PDEATHSIG is only used from the main thread.

    A worker thread that ends must not kill the child it started.
    """
    script = textwrap.dedent(
        """
        import sys, threading, time
        from course_lib.core.process import start_child
        box = []
        code = "from course_lib.core.process import exit_with_parent; import time; "
        code += "exit_with_parent(); time.sleep(60)"
        t = threading.Thread(target=lambda: box.append(start_child([sys.executable, "-c", code])))
        t.start(); t.join()
        time.sleep(0.5)  # the starting thread is gone; the child must still run
        print(box[0].pid, box[0].running, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid_text, running = parent.stdout.readline().split()
        assert running == "True" and not gone(int(pid_text))
        parent.kill()
        wait_until(lambda: gone(int(pid_text)), timeout_s=2.0, what="the child to follow its parent")
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()


def test_exit_with_parent_refuses_to_start_without_its_parent():
    with pytest.raises(SystemExit, match="already gone"):
        exit_with_parent(parent_pid=os.getpid() + 10_000_000)
    with pytest.raises(InvalidArgumentError, match="check_s"):
        exit_with_parent(check_s=0)


def test_stop_takes_the_whole_group_and_the_log_shows_the_end():
    code = (
        "import subprocess, sys, time; "
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('grandchild', g.pid, flush=True); "
        "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    )
    child = start_child([sys.executable, "-c", code], name="stubborn")
    wait_until(lambda: "grandchild" in child.tail(), timeout_s=30, what="the grandchild")
    grandchild = int(child.tail().split()[-1])
    started = time.monotonic()
    code_ = child.stop(timeout_s=0.5)  # SIGTERM is ignored: SIGKILL after 0.5 s, to the group
    assert code_ == -signal.SIGKILL and time.monotonic() - started < 30
    wait_until(lambda: gone(grandchild), timeout_s=5, what="the grandchild to go with the group")


def test_a_failed_child_reports_the_end_of_its_log():
    child = start_child(
        [sys.executable, "-c", "import sys; sys.stderr.write('x' * 5000 + 'the reason'); sys.exit(3)"]
    )
    child.popen.wait(30)
    with pytest.raises(RuntimeError, match=r"exited with code 3; its log ends with:\nx+the reason$") as err:
        child.check_running()
    assert len(str(err.value)) < 2100  # the end of the log, not all of it
    assert child.stop() == 3 and child.tail() == ""  # closed with the stop


def test_the_guard_stops_its_command_and_removes_its_folder_when_told_to(tmp_path):
    folder = tmp_path / "scratch"
    folder.mkdir()
    (folder / "file").write_text("x")
    guard = start_child(guard_command(["sleep", "60"], remove=[str(folder)]), name="guard")
    wait_until(lambda: psutil.Process(guard.pid).children(), timeout_s=30, what="the guarded command")
    command = psutil.Process(guard.pid).children()[0].pid
    assert stop_process(guard.popen, 10, group=False) == 128 + signal.SIGTERM
    assert not folder.exists()
    wait_until(lambda: gone(command), timeout_s=5, what="the guarded command to stop")
    guard.stop()


def test_a_parent_pid_inherited_from_an_ancestor_is_ignored_and_a_dead_one_is_not():
    code = "from course_lib.core.process import exit_with_parent; print(exit_with_parent())"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for named, expected in ((1, str(os.getpid())), (dead.pid, None)):  # pid 1 lives; the other is gone
        env = {**os.environ, PARENT_PID_ENV: str(named), PARENT_DEATHSIG_ENV: "1"}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        if expected is None:
            assert done.returncode == 1 and "already gone" in done.stderr
        else:
            assert done.returncode == 0 and done.stdout.strip() == expected


def test_a_child_also_exits_when_the_second_process_it_watches_is_gone():
    """``with_pid``: a pool worker whose parent is a fork server exits with the job all the same."""
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    code = (
        "import os, time\n"
        "from course_lib.core.process import exit_with_parent\n"
        f"exit_with_parent(os.getppid(), with_pid={job.pid}, check_s=0.05, exit_code=7)\n"
        "print('watching', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "watching"
        assert child.poll() is None  # the job lives: the child stays
        job.kill()
        job.wait(timeout=10)
        assert child.wait(timeout=30) == 7
    finally:
        for proc in (job, child):
            proc.kill()
            proc.wait()
