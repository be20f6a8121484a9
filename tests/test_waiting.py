"""wait_until: returns the first truthy value, names what it waited for on timeout, checks its arguments."""

from __future__ import annotations

import asyncio
import threading

import pytest

from course_lib.core.waiting import async_wait_until, wait_until


def test_returns_the_first_truthy_value():
    values = iter([None, 0, "", "ready", "later"])
    assert wait_until(lambda: next(values), timeout_s=5, interval_s=0.001) == "ready"


def test_waits_for_an_event_set_by_another_thread():
    event = threading.Event()
    threading.Timer(0.01, event.set).start()
    assert wait_until(event.is_set, timeout_s=10) is True


def test_timeout_names_what_it_waited_for():
    with pytest.raises(TimeoutError, match="the server to answer"):
        wait_until(lambda: False, timeout_s=0.02, interval_s=0.01, what="the server to answer")


@pytest.mark.parametrize(("timeout_s", "interval_s"), [(0, 0.01), (-1, 0.01), (1, 0), (0.1, 0.5)])
def test_bad_arguments_are_refused(timeout_s, interval_s):
    with pytest.raises(ValueError, match=r"timeout_s|interval_s"):
        wait_until(lambda: True, timeout_s=timeout_s, interval_s=interval_s)


def test_async_version_accepts_plain_and_awaitable_predicates():
    async def main():
        box = {"n": 0}

        def bump():
            box["n"] += 1
            return box["n"] >= 3

        async def ready():
            return box["n"] >= 3

        assert await async_wait_until(bump, timeout_s=5) is True
        assert await async_wait_until(ready, timeout_s=5) is True
        with pytest.raises(TimeoutError, match="nothing"):
            await async_wait_until(lambda: False, timeout_s=0.01, interval_s=0.005, what="nothing")

    asyncio.run(main())
