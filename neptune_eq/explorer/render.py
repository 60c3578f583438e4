"""Text and HTML renderings for the explorer: tables, sections, highlighted source.

Text is what the terminal session prints; HTML is what Jupyter shows (`_repr_html_`). HTML is
built by escaping and a little inline styling; Triton source is coloured with pygments when it is
installed, else with a tiny keyword/comment colouring of the escaped text.
"""

from __future__ import annotations

import html
import re
import shutil
import textwrap

_STYLE = ("<style>.nq table{border-collapse:collapse;font-size:12px}.nq th,.nq td{border:1px solid #ddd;"
          "padding:2px 8px;text-align:left;vertical-align:top}.nq th{background:#f4f4f4}"
          ".nq pre{background:#fafafa;border:1px solid #eee;padding:6px;font-size:12px;overflow-x:auto}"
          ".nq .kw{color:#0033b3;font-weight:bold}.nq .cm{color:#8c8c8c;font-style:italic}"
          ".nq .nb{color:#871094}.nq .warn{color:#a00}.nq h4{margin:10px 0 4px 0}</style>")


def terminal_width() -> int:
    """Columns of the terminal (the COLUMNS variable first, as shutil does); 80 when not a terminal."""
    return max(shutil.get_terminal_size((80, 24)).columns, 20)


def fill(text: str, width: int | None) -> str:
    """Prose re-wrapped to `width` columns, paragraph by line (None: as is)."""
    if width is None:
        return text
    return "\n".join(textwrap.fill(line, width, subsequent_indent="  ", break_on_hyphens=False)
                     if len(line) > width else line for line in text.splitlines())


MIN_SHRUNK = 12  # a shrunk column keeps at least this many characters (or its header's)


def text_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None, *,
               width: int | None = None, shrink: set[int] | None = None, drop: tuple[int, ...] = ()) -> str:
    """A plain-text table; columns in `right` are right-aligned, the last column is not padded.

    With `width`, no line is longer than `width` characters, and no row wraps: first the columns in
    `shrink` (default: the last) are narrowed, their long cells cut with an ellipsis; then the
    columns in `drop` are left out, in that order; a table still too wide has its lines cut.
    """
    right = right or set()
    shrink = {len(headers) - 1} if shrink is None else shrink
    keep = list(range(len(headers)))
    if width is not None:
        for k in (None, *drop):
            if k is not None:
                keep.remove(k)
            widths = _fit([_natural(headers, rows, c) for c in keep], [headers[c] for c in keep],
                          [keep.index(c) for c in shrink if c in keep], width)
            if _total(widths) <= width:
                break
    else:
        widths = [_natural(headers, rows, c) for c in keep]
    last = len(keep) - 1

    def fmt(cells: list[str]) -> str:
        out = []
        for k, c in enumerate(keep):
            cell = cut(cells[c], widths[k])
            if k == last and c not in right:
                out.append(cell)
            else:
                out.append(cell.rjust(widths[k]) if c in right else cell.ljust(widths[k]))
        line = "  ".join(out).rstrip()
        return cut(line, width) if width is not None else line

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(headers), cut(sep, width) if width is not None else sep, *(fmt(r) for r in rows)])


def _natural(headers: list[str], rows: list[list[str]], c: int) -> int:
    return max(len(headers[c]), *(len(r[c]) for r in rows)) if rows else len(headers[c])


def _total(widths: list[int]) -> int:
    return sum(widths) + 2 * (len(widths) - 1)


def _fit(widths: list[int], headers: list[str], shrink: list[int], width: int) -> list[int]:
    """Narrow the shrinkable columns, widest first, until the table fits or they are at their minimum."""
    widths = list(widths)
    floor = {k: min(widths[k], max(len(headers[k]), MIN_SHRUNK)) for k in shrink}
    excess = _total(widths) - width
    while excess > 0:
        k = max((k for k in shrink if widths[k] > floor[k]), key=lambda k: widths[k], default=None)
        if k is None:
            break
        widths[k] -= 1
        excess -= 1
    return widths


def cut(text: str, width: int) -> str:
    """`text`, or its first width − 1 characters and an ellipsis."""
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def html_table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_KEYWORDS = r"\b(def|return|for|in|range|if|else|elif|import|from|as|and|or|not|while|None|True|False|with)\b"


def highlight_python(src: str) -> str:
    """HTML for Python/Triton source: pygments if available, else escaped text with light colouring."""
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer
    except ImportError:
        return "<pre>" + "\n".join(_colour_line(line) for line in src.splitlines()) + "</pre>"
    fmt = HtmlFormatter(noclasses=True, nowrap=False, style="default")
    return highlight(src, PythonLexer(), fmt)


def _colour_line(line: str) -> str:
    code, hash_, comment = line.partition("#")
    esc = html.escape(code)
    esc = re.sub(_KEYWORDS, r'<span class="kw">\1</span>', esc)
    esc = re.sub(r"(@triton\.jit|\btl\.\w+)", r'<span class="nb">\1</span>', esc)
    if hash_:
        esc += f'<span class="cm">{html.escape(hash_ + comment)}</span>'
    return esc


def pre(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>"


def wrap(body: str) -> str:
    return f'<div class="nq">{_STYLE}{body}</div>'


class Shown(str):
    """Text that prints as itself in a terminal and renders as HTML in Jupyter.

    `sections` keeps (title, text, kind) so that the HTML form can colour source (kind "python").
    """

    sections: list[tuple[str, str, str]]

    def __new__(cls, text: str, sections: list[tuple[str, str, str]] | None = None):
        obj = super().__new__(cls, text)
        obj.sections = sections or []
        return obj

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p, cycle) -> None:  # IPython's plain-text display
        p.text(str(self))

    def _repr_html_(self) -> str:
        if not self.sections:
            return wrap(pre(str(self)))
        parts = []
        for title, text, kind in self.sections:
            if title:
                parts.append(f"<h4>{html.escape(title)}</h4>")
            parts.append(highlight_python(text) if kind == "python" else pre(text))
        return wrap("".join(parts))


def sections_text(sections: list[tuple[str, str, str]]) -> str:
    out = []
    for title, text, _kind in sections:
        if title:
            out.append(f"== {title} ==")
        out.append(text.rstrip("\n"))
        out.append("")
    return "\n".join(out).rstrip("\n")


__all__ = ["Shown", "cut", "fill", "highlight_python", "html_table", "pre", "sections_text", "terminal_width",
           "text_table", "wrap"]
