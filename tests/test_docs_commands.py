"""Every console example of docs/*.md runs as written, as the README's do.

Each page's ``$ ...`` commands run in order in a working directory of their own, holding
a copy of the bundled traces and the files the page names (``readme_fixtures.DOC_INPUTS``:
small files shaped like the real ones, or the very file a page shows); every output line
a page shows under a command must still be printed, figures masked
(``readme_fixtures.check_examples``).  A command that cannot run in a test (a 605 MB
trace, a search against the wall clock) is shown without ``$`` and says why.

Relative links of the README and docs/*.md must name files that exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from readme_fixtures import REPO, check_examples, doc_examples, docs_workdir

DOCS = sorted(p.name for p in (REPO / "docs").glob("*.md"))

#: Pages with console examples, and how many each has at least (a page that loses its
#: ``$`` lines, say to a changed fence, fails here instead of passing with nothing run).
EXAMPLES = {"calibrate.md": 1, "cli.md": 6, "compare.md": 15, "engines.md": 14,
            "evaluate.md": 5, "hardware.md": 7, "limits.md": 8, "models.md": 3,
            "placement.md": 12, "planner.md": 1, "stats.md": 5, "traces.md": 3}


def _examples(doc: str):
    return doc_examples((REPO / "docs" / doc).read_text(encoding="utf-8"))


def test_every_page_with_examples_is_checked() -> None:
    assert {d for d in DOCS if _examples(d)} == set(EXAMPLES)
    for doc, least in EXAMPLES.items():
        assert len(_examples(doc)) >= least, doc


@pytest.mark.slow
@pytest.mark.parametrize("doc", sorted(EXAMPLES))
def test_every_docs_command_runs_as_written(doc: str, tmp_path: Path) -> None:
    """Each command exits 0 (1 or 2 where the page shows an ``error:``), and every line
    the page shows under it is still printed (figures masked)."""
    examples = _examples(doc)
    compared = check_examples(examples, docs_workdir(tmp_path / "work", doc), name=doc)
    assert compared >= len([e for e in examples if e.shown])


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
