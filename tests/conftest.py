"""Shared pytest configuration.

Fixtures live in the test module that uses them, each with a docstring saying
what it is; only what several modules need belongs here.
"""

from __future__ import annotations

import os

# Tests must read the same output a user sees without colour codes.
os.environ.setdefault("NO_COLOR", "1")
os.environ.setdefault("COLUMNS", "160")
