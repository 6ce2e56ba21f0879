"""One self-contained HTML file: text, tables and pictures embedded as base64 PNG.

The page needs no network: no scripts, fonts, style sheets or images are
fetched; the CSS is inline and every picture is a ``data:image/png;base64``
URI. Building the page is pure (:func:`render_html` returns a string); the CLI
writes it.

Example::

    page = render_html("placer report", [
        Section("Summary", blocks=(Text("12 layers, 64 experts"),
                                   Table(("metric", "value"), (("tokens", "8192"),)))),
        Section("Pictures", blocks=(Picture(png_bytes, "Expert load"),)),
    ])
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Text:
    """A paragraph of plain text (escaped; no markup)."""

    text: str


@dataclass(frozen=True)
class Table:
    """A table of already formatted cells.

    Attributes
    ----------
    columns: header cells.
    rows: one tuple of cells per row, each as long as ``columns``.
    caption: shown above the table.
    numeric: columns (indices) aligned right; default: every column whose
        cells all look like numbers.
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""
    numeric: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(f"row {i} has {len(row)} cells for {len(self.columns)} columns")


@dataclass(frozen=True)
class Picture:
    """A PNG image with a caption.

    Attributes
    ----------
    png: the PNG file's bytes.
    caption: shown under the image; also its ``alt`` text unless ``alt`` is given.
    alt: text for screen readers.
    min_text_px: height in pixels of the smallest text drawn in the image, when known
        (written as ``data-min-text-px`` so a browser check can scale it by the
        displayed size).
    """

    png: bytes
    caption: str
    alt: str = ""
    min_text_px: float | None = None

    def __post_init__(self) -> None:
        if not self.png.startswith(b"\x89PNG\r\n\x1a\n"):
            raise ValueError("Picture.png must hold PNG bytes")

    @property
    def size(self) -> tuple[int, int]:
        """``(width, height)`` in pixels, from the PNG header."""
        return int.from_bytes(self.png[16:20], "big"), int.from_bytes(self.png[20:24], "big")


@dataclass(frozen=True)
class Code:
    """A line of code or a command, shown in a monospace font and wrapped when long."""

    text: str


@dataclass(frozen=True)
class SideBySide:
    """Blocks laid out in columns (for example one column per placement).

    ``stack=True`` puts them one under the other instead, each at full width
    (for pictures too wide to share a row).
    """

    blocks: tuple[Block, ...]
    titles: tuple[str, ...] = ()
    stack: bool = False


Block = Text | Code | Table | Picture | SideBySide


@dataclass(frozen=True)
class Section:
    """A titled part of the report; its anchor is derived from the title."""

    title: str
    blocks: tuple[Block, ...] = field(default_factory=tuple)
    intro: str = ""

    @property
    def anchor(self) -> str:
        return _slug(self.title)


#: Tables with more columns than this use a smaller font (11 px) and tighter cells, so
#: that a comparison of 20-odd columns fits a 1400 px window (a wider one scrolls
#: sideways inside its box; the page itself never does).
WIDE_TABLE_COLUMNS = 12

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
       margin: 0 auto; max-width: 1400px; padding: 1.5em 1.5em; color: #1b1b1b;
       background: #ffffff; line-height: 1.45; }
h1 { font-size: 1.7em; margin-bottom: 0.2em; }
h2 { font-size: 1.3em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
h3 { font-size: 1.05em; margin: 0.6em 0 0.3em; }
.subtitle { color: #555; margin-top: 0; }
nav ol { columns: 2; padding-left: 1.4em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.85em; }
caption { text-align: left; font-weight: 600; padding-bottom: 0.3em; }
th, td { border: 1px solid #d0d0d0; padding: 0.25em 0.45em; vertical-align: top; }
td { white-space: nowrap; }
td.wrap { white-space: normal; }
th { background: #f2f2f2; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.wide { font-size: 0.7em; }
table.wide th, table.wide td { padding: 0.2em 0.3em; }
td:first-child { white-space: nowrap; }
tr:nth-child(even) td { background: #fafafa; }
figure { margin: 0.6em 0 1.4em; }
figure img { max-width: 100%; height: auto; border: 1px solid #e4e4e4; }
figcaption { color: #444; font-size: 0.9em; margin-top: 0.3em; }
.side { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
.side > div { flex: 1 1 400px; min-width: 0; }
.side.stack > div { flex-basis: 100%; }
.scroll { overflow-x: auto; }
footer { color: #777; font-size: 0.85em; margin-top: 3em; }
pre { background: #f6f6f6; border: 1px solid #e0e0e0; padding: 0.5em 0.7em; font-size: 0.85em;
      white-space: pre-wrap; overflow-wrap: anywhere; }
"""


def render_html(
    title: str,
    sections: Sequence[Section],
    *,
    subtitle: str = "",
    footer: str = "",
) -> str:
    """The whole report as one HTML document.

    Parameters
    ----------
    title: page and first-heading title.
    sections: in order; a table of contents links to each.
    subtitle: a line under the title (inputs, date).
    footer: a line at the end (tool and version).

    Returns
    -------
    ``str``: a complete, self-contained HTML5 document.
    """
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{_esc(title)}</h1>",
    ]
    if subtitle:
        parts.append(f'<p class="subtitle">{_esc(subtitle)}</p>')
    if len(sections) > 1:
        parts.append("<nav><ol>")
        parts.extend(f'<li><a href="#{s.anchor}">{_esc(s.title)}</a></li>' for s in sections)
        parts.append("</ol></nav>")
    for section in sections:
        parts.append(f'<section id="{section.anchor}">')
        parts.append(f"<h2>{_esc(section.title)}</h2>")
        if section.intro:
            parts.append(f"<p>{_esc(section.intro)}</p>")
        parts.extend(_block(b) for b in section.blocks)
        parts.append("</section>")
    if footer:
        parts.append(f"<footer>{_esc(footer)}</footer>")
    parts.extend(["</body>", "</html>", ""])
    return "\n".join(parts)


def _block(block: Block) -> str:
    if isinstance(block, Text):
        return f"<p>{_esc(block.text)}</p>"
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Code):
        return f"<pre><code>{_esc(block.text)}</code></pre>"
    if isinstance(block, Picture):
        data = base64.b64encode(block.png).decode("ascii")
        alt = block.alt or block.caption
        width, height = block.size
        smallest = ("" if block.min_text_px is None
                    else f' data-min-text-px="{block.min_text_px:.1f}"')
        return (
            f'<figure><img src="data:image/png;base64,{data}" alt="{_esc(alt)}"'
            f' width="{width}" height="{height}"{smallest}>'
            f"<figcaption>{_esc(block.caption)}</figcaption></figure>"
        )
    if isinstance(block, SideBySide):
        cols = []
        for i, inner in enumerate(block.blocks):
            heading = f"<h3>{_esc(block.titles[i])}</h3>" if i < len(block.titles) else ""
            cols.append(f"<div>{heading}{_block(inner)}</div>")
        css = "side stack" if block.stack else "side"
        return f'<div class="{css}">{"".join(cols)}</div>'
    raise TypeError(f"not a report block: {type(block).__name__}")


def _table(table: Table) -> str:
    numeric = table.numeric
    if numeric is None:
        numeric = tuple(
            j for j in range(len(table.columns))
            if table.rows and all(_looks_numeric(r[j]) for r in table.rows)
        )
    wide = len(table.columns) > WIDE_TABLE_COLUMNS
    out = ['<div class="scroll"><table class="wide">' if wide else '<div class="scroll"><table>']
    if table.caption:
        out.append(f"<caption>{_esc(table.caption)}</caption>")
    out.append("<thead><tr>" + "".join(f"<th>{_esc(c)}</th>" for c in table.columns)
               + "</tr></thead><tbody>")
    for row in table.rows:
        cells = "".join(
            f'<td class="num">{_esc(c)}</td>' if j in numeric else f"<td>{_esc(c)}</td>"
            for j, c in enumerate(row)
        )
        out.append(f"<tr>{cells}</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


_NUMBER = re.compile(r"^[-+]?(\d[\d,]*\.?\d*|\.\d+)([eE][-+]?\d+)?\s*[%x]?$")


def _looks_numeric(cell: str) -> bool:
    return cell in ("", "-") or bool(_NUMBER.match(cell.strip()))


def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


def _slug(title: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return slug or "section"
