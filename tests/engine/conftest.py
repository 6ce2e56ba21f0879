"""The engine tier runs in vLLM's own environment (``tests/engine/run.sh``, ``make
test-engine``).  Elsewhere (the main ``.venv``, where vLLM is not installed) its tests
are not collected; with ``PLACER_REQUIRE_VLLM=1`` a missing vLLM fails the run instead."""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("PLACER_REQUIRE_VLLM") == "1":
        raise pytest.UsageError("PLACER_REQUIRE_VLLM=1 but vllm is not installed here:"
                                " run the engine tier with `make test-engine`")
    collect_ignore_glob = ["test_*.py"]
