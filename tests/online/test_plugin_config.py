"""The plugin's configuration: a YAML file or key=value pairs, read strictly, and off
unless set."""

from __future__ import annotations

import logging
import sys

import pytest

from placer.errors import PlacerError, UsageError
from placer.online.config import ENV, inline, read_config
from placer.online.vllm import register


def test_inline_pairs_give_the_settings() -> None:
    config = read_config("topology=2x-dgx-h100, model=qwen3-30b-a3b, max_moves=32,"
                         "horizon=500,workload=prefill,dtype=fp8,async=false")
    assert (config.topology.num_gpus, config.model.name) == (16, "qwen3-30b-a3b")
    s = config.settings
    assert (s.max_moves, s.horizon, s.regime.workload, s.dtype, s.asynchronous) == (
        32, 500, "prefill", "fp8", False)
    assert config.source == ENV


def test_defaults_and_the_inline_form_round_trip() -> None:
    text = inline(topology="4x-dgx-h100", model="deepseek-v3")
    assert text == "topology=4x-dgx-h100,model=deepseek-v3"
    s = read_config(text).settings
    assert (s.max_moves, s.horizon, s.regime.engine, s.regime.workload, s.asynchronous) == (
        None, 1000, "vllm", "decode", True)
    again = read_config(inline(topology="4x-dgx-h100", model="deepseek-v3", max_moves=64,
                               horizon=250, asynchronous=False)).settings
    assert (again.max_moves, again.horizon, again.asynchronous) == (64, 250, False)


def test_a_file_holds_the_same_keys(tmp_path) -> None:
    path = tmp_path / "online.yaml"
    path.write_text("topology: 2x-dgx-h100\nmodel: qwen3-30b-a3b\nmax_moves: none\n")
    config = read_config(str(path))
    assert config.settings.max_moves is None and config.source == str(path)


def test_a_typo_names_the_file_line_and_key(tmp_path) -> None:
    path = tmp_path / "online.yaml"
    path.write_text("topology: 2x-dgx-h100\nmodel: qwen3-30b-a3b\nhorizn: 10\n")
    with pytest.raises(UsageError) as info:
        read_config(str(path))
    assert "horizn" in str(info.value) and "did you mean 'horizon'" in info.value.hint


@pytest.mark.parametrize(("value", "message"), [
    ("topology=2x-dgx-h100", "missing key 'model'"),
    ("topology=2x-dgx-h100,model=qwen3-30b-a3b,horizon=0", "horizon must be at least 1"),
    ("topology=2x-dgx-h100,model=qwen3-30b-a3b,workload=train", "unknown workload"),
    ("topology=2x-dgx-h100,model=qwen3-30b-a3b,oops", "expected key=value"),
    ("topology=no-such-cluster,model=qwen3-30b-a3b", "no-such-cluster"),
])
def test_bad_values_are_errors_with_a_hint(value, message) -> None:
    with pytest.raises(PlacerError, match=message) as info:
        read_config(value)
    assert info.value.hint


def test_unset_the_plugin_does_nothing(monkeypatch) -> None:
    """Installing placer never changes an engine: without the variable, the entry point
    returns before it imports anything of vLLM (not installed here)."""
    monkeypatch.delenv(ENV, raising=False)
    register()
    monkeypatch.setenv(ENV, "  ")
    register()
    assert "vllm" not in sys.modules


def test_a_bad_configuration_leaves_vllm_as_it_is_with_a_warning(monkeypatch,
                                                                 caplog) -> None:
    monkeypatch.setenv(ENV, "topology=2x-dgx-h100,model=qwen3-30b-a3b,max_moves=-3")
    with caplog.at_level(logging.WARNING, logger="vllm.placer"):
        register()
    assert "vllm" not in sys.modules
    [line] = caplog.messages
    assert "vLLM's default policy runs" in line and "max_moves must be at least 0" in line


def test_the_entry_point_never_raises(monkeypatch, caplog) -> None:
    """vLLM calls the entry point unguarded at start: any failure (here vLLM's policy
    table cannot be imported, as vLLM is not installed in this environment) is a warning
    and vLLM's default."""
    monkeypatch.setenv(ENV, "topology=2x-dgx-h100,model=qwen3-30b-a3b")
    with caplog.at_level(logging.WARNING, logger="vllm.placer"):
        register()
    [line] = caplog.messages
    assert "vLLM's default policy runs" in line and "vllm" in line
