"""One frozen config for batcher knobs and server limits; the command line is generated from it."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.serving.batching.batcher import DynamicBatcher
from course_lib.serving.batching.predict import create_batched_app
from course_lib.serving.server import (
    DEFAULTS,
    ServerConfig,
    add_arguments,
    from_arguments,
    serve_in_thread,
    split_config,
    to_argv,
)


def parse(argv):
    return from_arguments(add_arguments(argparse.ArgumentParser()).parse_args(argv))


def test_defaults_are_written_once_and_used_everywhere():
    assert parse([]) == DEFAULTS
    app_defaults = inspect.signature(create_batched_app).parameters
    for name in (
        "max_batch_size",
        "max_queue_delay_ms",
        "max_queue_size",
        "dedup",
        "instances",
        "run_in_thread",
    ):
        assert app_defaults[name].default == getattr(DEFAULTS, name), name
    assert inspect.signature(DynamicBatcher).parameters["max_queue_size"].default == DEFAULTS.max_queue_size
    assert (
        inspect.signature(serve_in_thread).parameters["max_lifetime_s"].default
        == DEFAULTS.lifetime_s
        == 300.0
    )


@settings(max_examples=50, deadline=None)
@given(
    max_batch_size=st.integers(1, 512),
    max_queue_delay_ms=st.floats(0, 1e4, allow_nan=False),
    preferred=st.lists(st.integers(1, 512), max_size=3),
    dedup=st.booleans(),
    run_in_thread=st.booleans(),
    lifetime_s=st.floats(0.001, 1e6, allow_nan=False),
    max_connections=st.integers(1, 10_000),
)
def test_the_command_line_round_trips_every_field(
    max_batch_size, max_queue_delay_ms, preferred, dedup, run_in_thread, lifetime_s, max_connections
):
    config = ServerConfig(
        max_batch_size=max_batch_size,
        max_queue_delay_ms=max_queue_delay_ms,
        preferred_batch_sizes=[min(size, max_batch_size) for size in preferred],  # valid: <= max_batch_size
        dedup=dedup,
        run_in_thread=run_in_thread,
        lifetime_s=lifetime_s,
        max_connections=max_connections,
    )
    assert parse(to_argv(config)) == config


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lifetime_s": 0}, "lifetime_s must be a finite number > 0, got 0"),
        ({"body_timeout_s": float("inf")}, "body_timeout_s must be a finite number"),
        ({"header_timeout_s": True}, "header_timeout_s must be"),
        ({"max_connections": 0}, "max_connections must be an integer >= 1, got 0"),
        ({"max_queue_wait_s": -0.5}, "max_queue_wait_s must be"),
        ({"max_batch_size": -1}, "max_batch_size must be an integer >= 1, got -1"),
        ({"max_batch_size": "8"}, "max_batch_size must be an integer >= 1, got '8'"),
        ({"max_queue_size": 0}, "max_queue_size must be an integer >= 1, got 0"),
        ({"max_queue_delay_ms": -1.0}, "max_queue_delay_ms must be"),
        (
            {"preferred_batch_sizes": (128,)},
            r"preferred_batch_sizes\[0\] must be an integer >= 1 and <= 64, got 128",
        ),
        ({"instances": 0}, "instances must be an integer >= 1, got 0"),
    ],
)
def test_limits_out_of_range_are_refused_with_their_name(changes, message):
    with pytest.raises(ValueError, match=message):
        ServerConfig(**changes)


def test_the_config_is_frozen_and_split_from_other_options():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.lifetime_s = 1.0  # type: ignore[misc]
    config, rest = split_config({"max_batch_size": 8, "runtime": "xgboost"})
    assert config == DEFAULTS.replace(max_batch_size=8) and rest == {"runtime": "xgboost"}
    assert config.batcher_kwargs()["max_batch_size"] == 8


def test_add_arguments_takes_its_defaults_from_a_config():
    production_like = DEFAULTS.replace(http="httptools", loop="uvloop", max_batch_size=8)
    parser = add_arguments(argparse.ArgumentParser(), production_like)
    assert from_arguments(parser.parse_args([])) == production_like
    assert from_arguments(parser.parse_args(["--http=h11"])) == production_like.replace(http="h11")


def test_a_worker_serves_on_the_listening_socket_it_inherited(monkeypatch):
    """The one way k workers share a port: the starter's socket, named in LISTEN_FD_ENV, claimed once."""
    import os
    import socket

    from course_lib.serving.server import (
        LISTEN_FD_ENV,
        inherit_env,
        inherited_socket,
        shared_listening_socket,
    )

    monkeypatch.delenv(LISTEN_FD_ENV, raising=False)
    assert inherited_socket() is None  # no starter's socket: the server binds its own port
    with shared_listening_socket() as shared:
        assert shared.get_inheritable()
        monkeypatch.setenv(LISTEN_FD_ENV, inherit_env(shared)[LISTEN_FD_ENV])
        worker = inherited_socket()
        assert worker is not None and worker.getsockname() == shared.getsockname()
        assert LISTEN_FD_ENV not in os.environ  # a process this one starts does not claim it too
        with socket.create_connection(shared.getsockname(), timeout=5):
            accepted, _ = worker.accept()  # the one accept queue
            accepted.close()
        worker.detach()  # the same descriptor as `shared`, closed by its with block


def test_start_server_quotes_the_log_of_a_server_that_exits_before_it_is_ready():
    import sys

    from course_lib.serving.server import start_server

    argv = [sys.executable, "-c", "import sys; print('no model here', file=sys.stderr); sys.exit(3)"]
    with pytest.raises(RuntimeError, match=r"exited with code 3(.|\n)*no model here"):
        start_server(argv, name="broken", startup_timeout_s=30)
