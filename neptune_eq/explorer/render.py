"""Text and HTML renderings for the explorer: tables, sections, highlighted source.

Text is what the terminal session prints; HTML is what Jupyter shows (`_repr_html_`). HTML is
built by escaping and a little inline styling; Triton source is coloured with pygments when it is
installed, else with a tiny keyword/comment colouring of the escaped text.
"""

from __future__ import annotations

import html
import re

_STYLE = ("<style>.nq table{border-collapse:collapse;font-size:12px}.nq th,.nq td{border:1px solid #ddd;"
          "padding:2px 8px;text-align:left;vertical-align:top}.nq th{background:#f4f4f4}"
          ".nq pre{background:#fafafa;border:1px solid #eee;padding:6px;font-size:12px;overflow-x:auto}"
          ".nq .kw{color:#0033b3;font-weight:bold}.nq .cm{color:#8c8c8c;font-style:italic}"
          ".nq .nb{color:#871094}.nq .warn{color:#a00}.nq h4{margin:10px 0 4px 0}</style>")


def text_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """A plain-text table; columns in `right` are right-aligned, the last column is not padded."""
    right = right or set()
    widths = [max(len(h), *(len(r[k]) for r in rows)) if rows else len(h) for k, h in enumerate(headers)]

    def fmt(cells: list[str]) -> str:
        out = []
        for k, cell in enumerate(cells):
            if k == len(cells) - 1 and k not in right:
                out.append(cell)
            else:
                out.append(cell.rjust(widths[k]) if k in right else cell.ljust(widths[k]))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(headers), sep, *(fmt(r) for r in rows)])


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


__all__ = ["Shown", "highlight_python", "html_table", "pre", "sections_text", "text_table", "wrap"]
