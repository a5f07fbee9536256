"""A Sphinx extension of this book (_config.yml, `local_extensions`): the chapters' tables
(pandas Styler HTML, pasted as raw HTML outputs) wrap where a reader expects them to.

A table wider than the text column first narrows by wrapping its cells, and a browser
wraps wherever it may: a number such as 1.74e-05 after its hyphen, a column name such as
lead_time nowhere. Here, in every table of a raw HTML output,
  - a body cell whose text has no space (a number, a name) is marked `nowrap`
    (book/_static/tables.css keeps it on one line), and
  - a column name may break after each underscore (<wbr>), as a name with spaces breaks at
    its spaces.
A table that still does not fit scrolls inside its output box (tables.css)."""

from __future__ import annotations

import re

from docutils import nodes

TABLE = re.compile(r"<table\b.*?</table>", re.S | re.I)
CELL = re.compile(r"<(td|th)\b([^>]*)>(.*?)</\1>", re.S | re.I)
TAG = re.compile(r"(<[^>]+>)")


def _cell(m: re.Match) -> str:
    tag, attrs, body = m.group(1), m.group(2), m.group(3)
    text = TAG.sub("", body).strip()
    if tag.lower() == "th":  # underscores in the text, not inside tags
        body = "".join(
            part if part.startswith("<") else part.replace("_", "_<wbr>") for part in TAG.split(body)
        )
    elif text and not re.search(r"\s", text):
        if re.search(r'\bclass="', attrs):
            attrs = re.sub(r'\bclass="', 'class="nowrap ', attrs, count=1)
        else:
            attrs += ' class="nowrap"'
    return f"<{tag}{attrs}>{body}</{tag}>"


def readable_cells(html: str) -> str:
    """`html` with the cells of each of its tables marked as above; the rest unchanged."""
    return TABLE.sub(lambda t: CELL.sub(_cell, t.group(0)), html)


def on_doctree_resolved(app, doctree, docname) -> None:
    for node in list(doctree.findall(nodes.raw)):
        if node.get("format") == "html" and "<table" in node.astext().lower():
            node.replace(node.children[0], nodes.Text(readable_cells(node.astext())))


def setup(app):
    app.connect("doctree-resolved", on_doctree_resolved)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
