"""The report's picture files and resolution checks (library calls, no command line)."""

from __future__ import annotations

import pytest

from placer import constants
from placer.errors import UsageError
from placer.report.files import check_dpi, write_pictures


def test_pictures_land_as_png_files(tmp_path):
    written = write_pictures([("a", b"\x89PNG-a"), ("b", b"\x89PNG-b")], tmp_path / "pics")
    assert [p.name for p in written] == ["a.png", "b.png"]
    assert (tmp_path / "pics" / "b.png").read_bytes() == b"\x89PNG-b"
    assert sorted(p.name for p in (tmp_path / "pics").iterdir()) == ["a.png", "b.png"]


def test_dpi_range():
    low, high = constants.REPORT_DPI_RANGE
    check_dpi(low)
    check_dpi(high)
    for bad in (low - 1, high + 1):
        with pytest.raises(UsageError, match=f"between {low} and {high}"):
            check_dpi(bad)
