"""Window ranges: one parser and one check for every command."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placer.errors import UsageError
from placer.stats.windows import (
    default_split,
    evaluation_parts,
    parse_window_range,
    resolve_window_range,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("2:5", (2, 5)), (":3", (None, 3)), ("4:", (4, None)), (" 1 : 2 ", (1, 2)),
])
def test_parse(text, expected):
    assert parse_window_range(text) == expected


@pytest.mark.parametrize("text", [":", "", "a:b", "1-2", "-1:3", "1:2:3"])
def test_parse_rejects_with_the_option(text):
    with pytest.raises(UsageError, match="expected a window range") as info:
        parse_window_range(text, option="--eval")
    assert info.value.where == "--eval"
    assert info.value.hint


@pytest.mark.parametrize(("rng", "message"), [
    ((5, 2), "window range 5:2 is reversed"),
    ((3, 3), "window range 3:3 is empty"),
    ((2, 9), "window range 2:9 is outside the trace's 8 windows"),
])
def test_resolve_says_what_is_wrong(rng, message):
    with pytest.raises(UsageError, match=message) as info:
        resolve_window_range(rng, 8, option="--fit")
    assert info.value.where == "--fit"


def test_one_window_is_singular():
    with pytest.raises(UsageError, match=r"outside the trace's 1 window$"):
        resolve_window_range((0, 2), 1)


@given(st.integers(min_value=2, max_value=500))
def test_default_split_covers_the_trace_in_two_parts(num_windows):
    (f0, f1), (h0, h1) = default_split(num_windows)
    assert f0 == 0 and f1 == h0 and h1 == num_windows and f1 >= 1 and h1 > h0
    assert evaluation_parts(num_windows) == [("fit", (f0, f1)), ("held-out", (h0, h1))]


def test_fit_alone_holds_out_what_follows():
    assert evaluation_parts(8, fit=(0, 5)) == [("fit", (0, 5)), ("held-out", (5, 8))]
    assert evaluation_parts(8, fit=(None, None)) == [("fit", (0, 8))]
    assert default_split(1) is None


def test_a_reversed_range_suggests_the_swap_only_when_it_fits():
    with pytest.raises(UsageError) as info:
        resolve_window_range((5, 2), 8)
    assert info.value.hint.startswith("write it 2:5;")
    with pytest.raises(UsageError) as info:
        resolve_window_range((5, 2), 1)
    assert "write it" not in info.value.hint
