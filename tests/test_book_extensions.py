"""The book's two Sphinx extensions (book/_ext, _config.yml `local_extensions`), on made-up
nodes and HTML: glued text shows its `code` spans as code; table cells without a space
stay whole and column names break after underscores. The slow tests see them in the
built book (test_book.py, test_book_browser.py)."""

import sys
from pathlib import Path

from docutils import nodes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
import glued_text  # noqa: E402
import table_cells  # noqa: E402


def _pasted(text: str) -> nodes.inline:
    return nodes.inline(text, text, classes=["pasted-text"])


def test_glued_text_shows_its_code_spans_as_code():
    node = _pasted("placed at step 9 (`mclib.core.placement.checkpoint_steps`), ended by `train.until`.")
    assert glued_text.literal_code_spans(node)
    assert [type(c).__name__ for c in node.children] == ["Text", "literal", "Text", "literal", "Text"]
    assert node.astext() == "placed at step 9 (mclib.core.placement.checkpoint_steps), ended by train.until."
    assert [c.astext() for c in node.children if isinstance(c, nodes.literal)] == [
        "mclib.core.placement.checkpoint_steps",
        "train.until",
    ]


def test_glued_text_without_code_and_other_inlines_are_left_alone():
    plain, lone = _pasted("0.0103 ± 0.00053"), _pasted("a lone ` backtick")
    assert not glued_text.literal_code_spans(plain) and not glued_text.literal_code_spans(lone)
    assert plain.astext() == "0.0103 ± 0.00053" and lone.astext() == "a lone ` backtick"
    doc = nodes.paragraph("", "", _pasted("`a`"), nodes.inline("`b`", "`b`", classes=["other"]))
    assert len(glued_text.pasted_texts(doc)) == 1


def test_table_cells_keep_numbers_whole_and_break_column_names_after_underscores():
    html = (
        '<style></style><table id="T"><caption>c_1</caption><thead><tr><th class="col_heading">lead_time</th>'
        '<th>paper L_obs</th></tr></thead><tbody><tr><td class="data row0 col0">1.74e-05</td>'
        "<td>reached the cap</td><td><b>x_y</b></td><td></td></tr></tbody></table><p>a_b 1e-05</p>"
    )
    out = table_cells.readable_cells(html)
    assert '<th class="col_heading">lead_<wbr>time</th>' in out and "<th>paper L_<wbr>obs</th>" in out
    assert '<td class="nowrap data row0 col0">1.74e-05</td>' in out  # no space: one line
    assert "<td>reached the cap</td>" in out and "<td></td>" in out  # text wraps; empty stays
    assert '<td class="nowrap"><b>x_y</b></td>' in out  # tags inside are kept
    assert out.endswith("<p>a_b 1e-05</p>") and "<caption>c_1</caption>" in out  # outside cells: unchanged
