"""The metric table covers exactly the evaluator's metrics, once each."""

from __future__ import annotations

import math

import pytest

from placer.evaluate import METRIC_KEYS
from placer.metrics import METRICS, US, cell, metric


def test_one_entry_per_evaluator_metric_in_its_order():
    assert tuple(m.key for m in METRICS) == tuple(METRIC_KEYS)


def test_entries_are_complete_and_times_share_one_unit():
    for m in METRICS:
        assert m.label and m.header and m.unit and m.what, m.key
        assert m.better in ("lower", "higher", ""), m.key
        assert m.fmt.format(1.5)  # a valid pattern
        if m.key.endswith("_us"):
            assert m.unit == US and m.header.endswith(US), m.key
    assert len({m.header for m in METRICS}) == len(METRICS)


@pytest.mark.parametrize("value", [None, math.nan, math.inf])
def test_missing_values_show_as_dash(value):
    assert metric("step_p99_us").cell(value) == "-"
    assert cell("no_such_metric", value) == "-"


def test_formats():
    assert metric("step_p99_us").cell(12345.678) == "12345.7"
    assert metric("bytes_per_token_inter").cell(12345.6) == "12,346"
    assert cell("no_such_metric", 1 / 3) == "0.333333"
