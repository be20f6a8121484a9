"""Splitting the cores between a server and its load tools, and pinning a block (course_lib.core.affinity)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest

from course_lib.core.affinity import CoreSplit, pin_option, pinned, pinned_text, split_cores


def test_split_cores_gives_the_server_the_first_cores_and_the_tools_the_rest():
    split = split_cores(2, cores=[5, 1, 3, 2, 4, 1])
    assert split == CoreSplit(server=(1, 2), tools=(3, 4, 5))
    assert split.describe() == {"server_cores": [1, 2], "tool_cores": [3, 4, 5]}
    assert split.text() == "server on cores 1-2, load tools on cores 3-5"
    assert split_cores(1, cores=[0, 2, 3, 7]).text() == "server on cores 0, load tools on cores 2-3,7"


@pytest.mark.parametrize("n", [0, -1, 4, 9])
def test_split_cores_refuses_a_server_share_that_leaves_no_core_for_the_tools(n):
    with pytest.raises(ValueError, match="server_cores"):
        split_cores(n, cores=[0, 1, 2, 3])


def test_split_cores_defaults_to_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 5, 7})  # as under `taskset -c 2,5,7`
    assert split_cores(1) == CoreSplit(server=(2,), tools=(5, 7))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1})  # as under `taskset -c 1`
    with pytest.raises(ValueError, match=r"pinning needs at least 2 usable cores .* may use 1: \[1\]"):
        split_cores(1)


def test_pin_option_is_none_for_zero_and_names_what_is_wrong_otherwise(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert pin_option("0") is None
    assert pin_option("2") == CoreSplit(server=(0, 1), tools=(2,))
    with pytest.raises(argparse.ArgumentTypeError, match="'two' is not a whole number"):
        pin_option("two")
    with pytest.raises(argparse.ArgumentTypeError, match="leaves no core for the load tools"):
        pin_option("3")


def test_pinned_sets_the_cores_for_the_block_children_inherit_them_and_the_old_set_comes_back():
    before = os.sched_getaffinity(0)
    core = min(before)
    child = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    with pinned([core]):
        assert os.sched_getaffinity(0) == {core}
        assert subprocess.run(child, capture_output=True, text=True, check=True).stdout.strip() == f"[{core}]"
    assert os.sched_getaffinity(0) == before
    with pytest.raises(RuntimeError), pinned([core]):
        raise RuntimeError("the block failed")
    assert os.sched_getaffinity(0) == before  # restored on an error too
    with pinned(None):
        assert os.sched_getaffinity(0) == before


def test_pinned_refuses_an_empty_set_and_a_core_this_process_may_not_use():
    before = os.sched_getaffinity(0)
    with pytest.raises(ValueError, match="cores=\\[\\] is empty"), pinned([]):
        pass
    with (
        pytest.raises(ValueError, match=re.escape(f"may use only cores {sorted(before)}")),
        pinned([max(before) + 4096]),
    ):
        pass
    with pytest.raises(ValueError, match=r"cores\[0\] must be an integer >= 0"), pinned([-1]):
        pass
    core = min(before)
    with pinned([core]), pytest.raises(ValueError, match="may use only cores"), pinned([core, core + 1]):
        pass  # inside a pinned block a nested one can only narrow
    assert os.sched_getaffinity(0) == before


def test_a_records_pinned_field_reads_back_as_the_split_and_as_a_provenance_phrase():
    split = split_cores(2, cores=range(6))
    assert CoreSplit.from_record(split.describe()) == split
    assert pinned_text(split.describe()) == ", pinned: server on cores 0-1, load tools on cores 2-5"
    assert pinned_text(None) == ""  # records made before the option, or without it, read as before
    assert pinned_text({"server_cores": []}) == ", pinned: {'server_cores': []} (not a core split)"


@pytest.mark.parametrize(
    ("server", "tools", "match"),
    [
        ((), (1,), "server must be non-empty"),
        ((0,), (), "tools must be non-empty"),
        ((0, 1), (1, 2), r"share core\(s\) \[1\]"),
        ((-1,), (1,), r"server\[0\] must be an integer >= 0"),
        ((0,), ("1",), r"tools\[0\] must be an integer >= 0"),
        ((1, 1), (2,), "names a core twice"),
    ],
)
def test_a_core_split_refuses_an_empty_side_a_shared_core_and_a_bad_id(server, tools, match):
    with pytest.raises(ValueError, match=match):
        CoreSplit(server=server, tools=tools)
