"""The Server-Timing header: written and read back, other servers' headers, malformed entries refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.serving.profiling import check_metric_name, format_server_timing, parse_server_timing

stage_names = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)


def test_server_timing_parser_reads_other_servers_headers():
    header = 'cache;desc="Cache Read";dur=23.2, db;dur=53, app;dur=47.2'
    assert parse_server_timing(header) == {"cache": 23.2, "db": 53.0, "app": 47.2}


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ("miss", "no dur"),
        ("db;dur=fast", "not a number"),
        ("db;dur=1, db;dur=2", "appears twice"),
        ("a b;dur=1", "no valid metric name"),
    ],
)
def test_server_timing_parser_rejects_malformed_entries(header, reason):
    with pytest.raises(ValueError, match=reason):
        parse_server_timing(header)


def test_server_timing_parser_allows_whitespace_around_equals_and_semicolons():
    """The vector: ``db; dur = 53`` raised; the W3C grammar allows OWS around ``;`` and ``=``."""
    assert parse_server_timing("db; dur = 53") == {"db": 53.0}
    assert parse_server_timing('cache ;desc = "x" ; dur= 1.5 , db;dur =2') == {"cache": 1.5, "db": 2.0}


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(stage_names, st.floats(min_value=0, max_value=1e5), min_size=1, max_size=6))
def test_server_timing_round_trips_to_the_microsecond(stages_ms):
    parsed = parse_server_timing(format_server_timing(stages_ms))
    assert list(parsed) == list(stages_ms)
    for name, ms in stages_ms.items():
        assert parsed[name] == pytest.approx(ms, abs=5e-4)


@settings(max_examples=100, deadline=None)
@given(
    stages_ms=st.dictionaries(stage_names, st.floats(min_value=0, max_value=1e5), min_size=1, max_size=4),
    spaces=st.lists(st.sampled_from(["", " ", "\t", "  "]), min_size=4, max_size=4),
)
def test_server_timing_parser_ignores_optional_whitespace_anywhere_the_grammar_allows(stages_ms, spaces):
    a, b, c, d = spaces
    header = ",".join(f"{d}{name}{a};{b}dur{c}={d}{ms!r}{a}" for name, ms in stages_ms.items())
    assert parse_server_timing(header) == stages_ms


@pytest.mark.parametrize("name", ["", "two words", "dur;x", 7])
def test_metric_names_must_be_tokens(name):
    with pytest.raises(ValueError, match=r"metric name must be (a str|a non-empty token)"):
        format_server_timing({name: 1.0})
    with pytest.raises(ValueError, match="stage name"):
        check_metric_name(name, what="stage name")


@pytest.mark.parametrize(("ms", "error"), [(-1.0, ValueError), (float("nan"), ValueError), ("3", TypeError)])
def test_durations_must_be_finite_non_negative_numbers(ms, error):
    with pytest.raises(error, match=r"stages_ms\['db'\] must be a finite number >= 0"):
        format_server_timing({"db": ms})
