"""The chapters: one module per page of the book, which its notebook only calls.

Naming rule: book/NN_name.ipynb is served by mclib.chapters.chNN_name (mclib/chapters/chNN_name.py);
a module named chNN_* here is a chapter and nothing else is. What a chapter declares to the
machinery is its `SPEC` (`mclib.book.spec.ChapterSpec`), which registry.py collects for the toc's
chapters; the rooms above the machinery hand that registry down to it. A part of a
chapter or what several of its readings share lives here under a plain name:

    ch01_train.py ... ch09_appendix.py, ch99_scorecard.py
                  the chapters: `CHAPTER`, `readings(ch, ...)` (scorecard rows and the sentences
                  that state them), `scorecard_table(ch, rows)`, and `SPEC`, what each declares to
                  the machinery (`idle_work`, `runs_read`, `curve_rows`, `site_part`, ...)
    registry.py   the specs of the toc's chapters (`specs`), each read when first asked for
    followup.py   chapter 07's last section: the authors' 2025 follow-up's claims on this task
    heads_tables.py, heads_readings.py
                  chapter 03's parts: what it computes from the run (its notebook calls them
                  through ch03_heads), and the rows and sentences of E3-E9 and E11
    baselines_readings.py
                  chapter 06's closing sentences and scorecard rows, from its tables alone
    heads_plots.py, loss_tables_shown.py
                  the attention maps, loss bars and styled loss tables of chapters 02, 03 and 08
    embeddings_plots.py, baselines_plots.py, scorecard_plots.py
                  the figures of chapters 04, 06 and the scorecard

Its place among the rooms (tests/test_layers.py), bottom to top: core, analyses, the book's
machinery (mclib/book: runner, chapter protocol, scorecard, the shared plot theme), the GPU lease
(mclib/lease), then this room; only the command line (mclib/__main__.py) sits above it.
Nothing below imports a chapter, by name or otherwise: it is handed the chapters' specs.
"""
# The book's package first: its __init__ quiets a warning that importing the model raises in a
# kernel without ipywidgets, before any chapter imports the model.
from .. import book  # noqa: F401
