"""placer.limits: what the process may still allocate, and the refusal before work too large
for it (the figures, the part that is too large, a hint)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.errors import DataError, UsageError
from placer.limits import (
    ENV,
    check_allocation,
    check_disk,
    format_bytes,
    free_memory,
    parse_bytes,
)

runner = CliRunner()


@pytest.mark.parametrize(("text", "value"), [
    ("4G", 4 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("3GB", 3 * 10**9),
    ("2000000", 2_000_000), (" 64 k ", 64 << 10), ("1T", 1 << 40),
])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "four", "-1G", "4X", "1e9"])
def test_parse_bytes_refuses_what_it_cannot_read(text):
    with pytest.raises(UsageError) as caught:
        parse_bytes(text)
    assert caught.value.where == ENV and "4G" in (caught.value.hint or "")


def test_format_bytes():
    assert [format_bytes(n) for n in (512, 12 << 10, 240 << 20, int(7.5 * (1 << 30)),
                                      20 << 30)] == ["512 bytes", "12 KiB", "240 MiB",
                                                     "7.5 GiB", "20 GiB"]


def test_the_stated_limit_is_the_bound(monkeypatch):
    monkeypatch.setenv(ENV, "100M")
    assert free_memory() == (100 << 20, f"allowed by {ENV}=100M")
    check_allocation((1000, 1000), "a small table", "smaller")  # 8 MB: below the check
    with pytest.raises(UsageError) as caught:
        check_allocation((993, 993, 16, 64), "the (993, 993, 16, 64) knapsack table",
                         "a smaller --redundant", where="--redundant")
    error = caught.value
    assert str(error) == ("--redundant: needs 7.5 GiB of memory for the (993, 993, 16, 64)"
                          f" knapsack table, more than the 100 MiB allowed by {ENV}=100M")
    assert error.hint is not None and error.hint.startswith("a smaller --redundant")


def test_the_hint_may_say_what_fits(monkeypatch):
    monkeypatch.setenv(ENV, "1G")
    with pytest.raises(DataError) as caught:
        check_allocation(2 << 30, "two gigabytes", lambda free: f"at most {free >> 30} GiB",
                         error=DataError)
    assert caught.value.hint is not None and caught.value.hint.startswith("at most 1 GiB")


def test_without_a_stated_limit_the_machine_answers(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    free, source = free_memory()
    assert free > 0 and source
    check_allocation(64 << 20, "64 MiB", "less")  # a test machine has that


def test_the_address_space_limit_counts(tmp_path):
    """Under ``ulimit -v`` the figure is what the limit leaves beyond what is mapped."""
    code = ("import resource, placer.limits as l;"
            " resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
            " free, source = l.free_memory(); print(free < (1 << 30), source)")
    env = {k: v for k, v in os.environ.items() if k != ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert out.strip() == "True left under the address-space limit (ulimit -v)"


def test_check_disk(tmp_path):
    check_disk(1 << 20, tmp_path, "a small file", "smaller")
    with pytest.raises(UsageError) as caught:
        check_disk(1 << 62, tmp_path, "4 EiB", "fewer `tokens`", where="--tokens")
    assert "of disk for 4 EiB" in str(caught.value) and str(tmp_path) in str(caught.value)


def test_a_command_refused_for_memory_says_the_figures_and_writes_nothing(tmp_path):
    out = tmp_path / "s.npz"
    result = runner.invoke(app, ["synth", str(out), "--experts", "4096", "--clusters", "4096",
                                 "--layers", "1", "--tokens", "100"], env={ENV: "256M"})
    assert result.exit_code == 2, result.stderr
    first, hint = result.stderr.splitlines()[:2]
    assert first == ("error: needs 1.6 GiB of memory for a synthetic trace (4,096 weight tables"
                     " of 4,096 experts (drift phases x topics x clusters)), more than the"
                     f" 256 MiB allowed by {ENV}=256M")
    assert hint.startswith("hint: fewer --clusters or --topics: that part alone takes")
    assert not out.exists() and list(Path(tmp_path).iterdir()) == []
    assert runner.invoke(app, ["synth", str(out), "--experts", "64", "--clusters", "4",
                               "--layers", "1", "--tokens", "100", "-q"],
                         env={ENV: "256M"}).exit_code == 0
