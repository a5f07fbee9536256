"""A Sphinx extension of this book (_config.yml, `local_extensions`): text a chapter glues
into its prose reads as the prose around it.

myst-nb pastes a glued value (`{glue:text}`) as the plain text of its text/plain output, in
a <span class="pasted-text">, and its own stylesheet sets that span in bold. The chapters'
sentences name code the way the rest of the book does, in Markdown backticks, which plain
text would show as literal backticks. This extension turns each `code` span of a pasted
text into an inline literal, as MyST renders it anywhere else; the bold goes in
book/_static/tables.css. Everything else in the text stays as it was."""

from __future__ import annotations

import re

from docutils import nodes

CODE = re.compile(r"`([^`\n]+)`")


def literal_code_spans(node: nodes.Element) -> bool:
    """Replace the text of `node` (a pasted text) by text and inline literals, one per
    `code` span. Returns whether anything changed."""
    text = node.astext()
    if "`" not in text or not CODE.search(text):
        return False
    children, at = [], 0
    for m in CODE.finditer(text):
        if m.start() > at:
            children.append(nodes.Text(text[at : m.start()]))
        children.append(nodes.literal(m.group(1), m.group(1)))
        at = m.end()
    if at < len(text):
        children.append(nodes.Text(text[at:]))
    node.children = []
    node.extend(children)
    return True


def pasted_texts(doctree: nodes.Node):
    return [n for n in doctree.findall(nodes.inline) if "pasted-text" in n.get("classes", [])]


def on_doctree_resolved(app, doctree, docname) -> None:
    for node in pasted_texts(doctree):  # glue from this page and, resolved by now, from others
        literal_code_spans(node)


def setup(app):
    app.connect("doctree-resolved", on_doctree_resolved)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
