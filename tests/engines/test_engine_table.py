"""The serving engines' table: one entry per engine, everything else derived from it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from placer.engines import engine_names, get_engine, register_engine
from placer.regime import (
    ENGINE_POLICY,
    ENGINES,
    EXPORT_ENGINE,
    POLICIES,
    SERVING_ENGINES,
    Regime,
)


def test_every_engine_file_format_has_one_entry_and_every_entry_a_format():
    assert sorted(SERVING_ENGINES) == engine_names()
    for name, entry in SERVING_ENGINES.items():
        assert get_engine(name).engine == entry.title
        assert entry.dispatch is None or entry.dispatch in POLICIES
        assert entry.judged_as is None or entry.judged_as in ENGINES


def test_the_dispatch_and_export_tables_are_the_entries():
    """``--engine`` names the engines with a dispatch rule of their own; an export implies
    the engine whose dispatch its file is served with (vLLM-Ascend: vLLM's)."""
    assert ENGINES == ("sglang", "vllm", "trtllm")
    assert {e: Regime(e).dispatch for e in ENGINES} == ENGINE_POLICY
    assert EXPORT_ENGINE == {"sglang": "sglang", "vllm": "vllm", "trtllm": "trtllm",
                             "vllm-ascend": "vllm"}


def test_a_format_without_an_entry_is_refused():
    fmt = get_engine("sglang")
    with pytest.raises(ValueError, match=r"'sglang-next' .* no matching entry"):
        register_engine(replace(fmt, name="sglang-next"))
    with pytest.raises(ValueError, match="no matching entry"):
        register_engine(replace(fmt, engine="SGLang 2"))
    assert get_engine("sglang") is fmt
