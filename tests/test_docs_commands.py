"""Every console example of docs/*.md runs as written, as the README's do.

Each page's ``$ ...`` commands run in order in a working directory of their own, holding
a copy of the bundled traces and the files the page names (``readme_fixtures.DOC_INPUTS``:
small files shaped like the real ones, or the very file a page shows); every output line
a page shows under a command must still be printed, figures masked
(``readme_fixtures.check_example``).  A command that cannot run in a test (a 605 MB
trace, a search against the wall clock) is shown without ``$`` and says why.

Each command is a test of its own, run in this process with the plans' search cut
(``console``); the slowest are left to the slow tier (:data:`SLOW`).

Relative links of the README and docs/*.md must name files that exist.
"""

from __future__ import annotations

import re

import pytest
from readme_fixtures import REPO, Example, Walkthrough, doc_examples, docs_workdir, example_params

DOCS = sorted(p.name for p in (REPO / "docs").glob("*.md"))

#: Pages with console examples, and how many each has at least (a page that loses its
#: ``$`` lines, say to a changed fence, fails here instead of passing with nothing run).
EXAMPLES = {"calibrate.md": 1, "cli.md": 6, "compare.md": 15, "engines.md": 14,
            "evaluate.md": 5, "hardware.md": 7, "limits.md": 8, "models.md": 3,
            "placement.md": 12, "planner.md": 1, "replay.md": 1, "stats.md": 5,
            "traces.md": 3}

#: Commands left to the slow tier, per page (a part of the command: why).
SLOW = {
    "calibrate.md": {"placer calibrate": "the fit replays DeepEP's benchmark cases, 20 s"},
    "compare.md": {
        "dsv3.npz": "a DeepSeek-V3 trace and 8 scenarios of it with a report, 15 s",
        "-r auto --engine sglang": "a redundancy search on two clusters, 20-30 s",
        "placer report": "seven pictures, 6 s",
        "ls report-png": "lists the pictures of the report above",
    },
    "engines.md": {
        "placer plan expert_statistic": "DeepSeek-V3 plans of TensorRT-LLM statistics, 5 s each",
        "ascend.json --format": "exports the eplb-valid plan above",
        "moe_load_balancer.yaml --model": "imports the TensorRT-LLM file the plan above wrote",
    },
    "evaluate.md": {"qwen3-30b-a3b": "a 16,384-token Qwen3 trace, planned and judged, 15 s"},
    "limits.md": {"laughs.yaml": "a YAML alias bomb expanded to its limit, 3 s"},
    "stats.md": {"ds-demo.npz": "16,384 DeepSeek-V3 tokens over 58 layers, 6 s"},
}


def _examples(doc: str) -> list[Example]:
    return doc_examples((REPO / "docs" / doc).read_text(encoding="utf-8"))


def test_every_page_with_examples_is_checked() -> None:
    assert {d for d in DOCS if _examples(d)} == set(EXAMPLES)
    for doc, least in EXAMPLES.items():
        assert len(_examples(doc)) >= least, doc
        assert sum(len(e.shown) for e in _examples(doc)) >= 1, doc  # outputs are compared
    for doc, keys in SLOW.items():
        for key in keys:
            assert any(key in e.command for e in _examples(doc)), f"{doc}: no {key!r}"


class _Pages:
    """A :class:`Walkthrough` per page, made when its first example runs."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory, self.pages = factory, {}

    def __getitem__(self, doc: str) -> Walkthrough:
        if doc not in self.pages:
            folder = self.factory.mktemp(doc.removesuffix(".md")) / "work"
            self.pages[doc] = Walkthrough(_examples(doc), docs_workdir(folder, doc), doc,
                                          SLOW.get(doc))
        return self.pages[doc]


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> _Pages:
    return _Pages(tmp_path_factory)


@pytest.mark.parametrize(("doc", "example"), [
    pytest.param(doc, p.values[0], id=p.id, marks=p.marks)
    for doc in sorted(EXAMPLES) for p in example_params(_examples(doc), doc, SLOW.get(doc))])
def test_docs_command_runs_as_written(doc: str, example: Example, pages: _Pages) -> None:
    """The command exits 0 (1 or 2 where the page shows an ``error:``), and every line the
    page shows under it is still printed (figures masked)."""
    assert pages[doc].check(example) == len(example.shown)


#: ``[text](target)`` links; images too.
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", ["README.md", *(f"docs/{d}" for d in DOCS)])
def test_relative_links_name_files_that_exist(page: str) -> None:
    path = REPO / page
    text = path.read_text(encoding="utf-8")
    dangling = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or an anchor of the same page
        if not (path.parent / target.split("#", 1)[0]).exists():
            dangling.append(target)
    assert dangling == [], f"{page} links to files that do not exist: {dangling}"


#: Files named in prose: a path out of the repository (``../x``), or a top-level
#: ``NAME.md`` (``DESIGN.md``).
_CITED = re.compile(r"(?<![\w/.-])(\.\./[\w./-]*\w|[A-Z][A-Z_]+\.md)\b")


@pytest.mark.parametrize("page", ["README.md", *(f"docs/{d}" for d in DOCS)])
def test_prose_cites_files_of_the_repository(page: str) -> None:
    path = REPO / page
    cited = _CITED.findall(path.read_text(encoding="utf-8"))
    missing = [c for c in cited if not ((path.parent / c).exists() or (REPO / c).exists()
                                        or (REPO / "docs" / c).exists())]
    assert missing == [], f"{page} cites files this repository does not have: {missing}"
