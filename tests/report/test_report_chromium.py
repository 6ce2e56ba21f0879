"""The compare and report pages as a browser shows them: headless Chromium at 1400 px.

The compare page puts a one-node scenario (dgx-h100, 8 GPUs) next to a 72-GPU one
(gb200-nvl72); the report page puts two placements side by side.  For each page
the test

1. takes a full-page screenshot at 1400 px width (kept under the test's tmp dir, and
   copied to ``$PLACER_TEST_ARTIFACTS`` when that variable names a folder);
2. loads a copy of the page with a measuring script and reads back, from the DOM
   Chromium dumps, every text's computed font size and every picture's displayed
   width, then checks that no text is under 8 px: the page's own text, and the
   text inside each picture (its smallest text, which the report records as
   ``data-min-text-px``, scaled by how much the browser shrank the picture);
3. checks that every picture has a caption and alternative text.

Skipped when no Chromium is installed (``chromium``, ``chromium-browser`` or
``google-chrome`` on PATH), except under ``PLACER_REQUIRE_BROWSER=1`` (CI), where that
fails; tests/report/test_plots_readable.py checks the pictures' text
sizes everywhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placer.cli.main import app

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _browser() -> str | None:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


#: ``.ci/run`` sets it: there a missing browser fails these tests instead of skipping them
#: (``make test-setup`` installs Debian's chromium).
REQUIRED = os.environ.get("PLACER_REQUIRE_BROWSER") == "1"
_MISSING = (f"no headless browser: none of {', '.join(BROWSERS)} is on PATH"
            " (`make test-setup`, or apt-get install chromium)")

pytestmark = [pytest.mark.slow]


@pytest.fixture(autouse=True)
def _needs_browser() -> None:
    if _browser() is None:
        if REQUIRED:
            pytest.fail(f"PLACER_REQUIRE_BROWSER=1 but {_MISSING}")
        pytest.skip(_MISSING)

BUNDLED = Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz"
WIDTH = 1400
MIN_TEXT_PX = 8.0
#: Tallest screenshot taken (a page taller than this is cut, not squeezed).
MAX_HEIGHT = 16000
runner = CliRunner()

#: Appended to a copy of the page: measures it once loaded and writes the figures
#: as JSON into a <pre id="placer-measure"> that --dump-dom prints.
MEASURE = """<script>
window.addEventListener("load", () => {
  const texts = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const el = node.parentElement;
    if (!node.textContent.trim() || el.tagName === "SCRIPT") continue;
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) continue;
    texts.push([node.textContent.trim().slice(0, 60), parseFloat(getComputedStyle(el).fontSize)]);
  }
  const images = [...document.images].map((img) => {
    const figure = img.closest("figure");
    const caption = figure ? figure.querySelector("figcaption") : null;
    return {alt: img.alt, natural: img.naturalWidth, shown: img.clientWidth,
            smallest: parseFloat(img.dataset.minTextPx || "NaN"),
            caption: caption ? caption.textContent : ""};
  });
  const out = document.createElement("pre");
  out.id = "placer-measure";
  out.textContent = JSON.stringify({
    width: document.documentElement.clientWidth,
    height: document.documentElement.scrollHeight, texts: texts, images: images});
  document.body.appendChild(out);
});
</script>"""


def _chromium(*args: str) -> str:
    browser = _browser()
    assert browser is not None
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--force-device-scale-factor=1", *args],
        capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _measure(page: Path, tmp_path: Path) -> dict:
    probe = tmp_path / f"{page.stem}-measure.html"
    probe.write_text(page.read_text().replace("</body>", MEASURE + "\n</body>"))
    dom = _chromium("--virtual-time-budget=20000", f"--window-size={WIDTH},1000",
                    "--dump-dom", probe.as_uri())
    found = re.search(r'<pre id="placer-measure">(.*?)</pre>', dom, re.DOTALL)
    assert found, "the measuring script did not run"
    return json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<")
                      .replace("&gt;", ">").replace("&quot;", '"'))


def _screenshot(page: Path, height: int, tmp_path: Path) -> Path:
    shot = tmp_path / f"{page.stem}-{WIDTH}px.png"
    _chromium(f"--screenshot={shot}", f"--window-size={WIDTH},{min(height, MAX_HEIGHT)}",
              page.as_uri())
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert int.from_bytes(data[16:20], "big") == WIDTH
    artifacts = os.environ.get("PLACER_TEST_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy2(shot, Path(artifacts) / shot.name)
    return shot


def _check_readable(measured: dict, what: str) -> None:
    assert measured["width"] == WIDTH, what
    small = [(text, px) for text, px in measured["texts"] if px < MIN_TEXT_PX]
    assert not small, f"{what}: text under {MIN_TEXT_PX} px: {small[:5]}"
    assert measured["images"], what
    for image in measured["images"]:
        name = image["alt"][:60]
        assert image["caption"].strip() and image["alt"].strip(), f"{what}: unlabelled picture"
        assert image["natural"] > 0, f"{what}: {name}: the picture did not load"
        assert image["smallest"] is not None, f"{what}: {name}: no data-min-text-px"
        shown_px = image["smallest"] * image["shown"] / image["natural"]
        assert shown_px >= MIN_TEXT_PX, (
            f"{what}: {name}: smallest text {image['smallest']} px shown at"
            f" {image['shown']:.0f}/{image['natural']} px wide = {shown_px:.1f} px")


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """The compare page (dgx-h100 next to gb200-nvl72) and a report page (two placements)."""
    folder = tmp_path_factory.mktemp("pages")
    compare = folder / "compare.html"
    args = ["compare", str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "-t", "gb200-nvl72",
            "-s", "eplb,cpsat", "--time-limit", "2", "--report",
            str(compare), "-q"]
    with pytest.MonkeyPatch.context() as patch:  # the page quotes the command line
        patch.setattr(sys, "argv", ["placer", *args])
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    plans = []
    for solver, redundant in (("eplb", "8"), ("linear", "0")):
        plans.append(folder / f"{solver}.json")
        result = runner.invoke(app, ["plan", str(BUNDLED), "-t", "dgx-h100", "-m", "gpt-oss-20b",
                                     "--solver", solver, "--redundant", redundant,
                                     "-o", str(plans[-1])])
        assert result.exit_code == 0, result.stderr
    report = folder / "report.html"
    args = ["report", str(BUNDLED), "-p", str(plans[0]), "-p", str(plans[1]),
            "-t", "dgx-h100", "-m", "gpt-oss-20b", "-o", str(report), "-q"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["placer", *args])
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    return {"compare": compare, "report": report}


def test_compare_page_with_1_node_and_72_gpus_side_by_side_is_readable(pages, tmp_path):
    page = pages["compare"].read_text()
    assert "<h3>baseline: dgx-h100 R=0 eplb</h3>" in page
    assert re.search(r"<h3>lowest p99: gb200-nvl72 R=\d+ \w+</h3>", page)
    measured = _measure(pages["compare"], tmp_path)
    _check_readable(measured, "compare page")
    shot = _screenshot(pages["compare"], measured["height"], tmp_path)
    assert shot.stat().st_size > 50_000  # a page of tables and pictures, not a blank one


def test_report_page_is_readable(pages, tmp_path):
    measured = _measure(pages["report"], tmp_path)
    _check_readable(measured, "report page")
    shot = _screenshot(pages["report"], measured["height"], tmp_path)
    assert shot.stat().st_size > 50_000
