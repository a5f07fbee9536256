"""The chapters: one module per page of the book, which its notebook only calls.

Naming rule: book/NN_name.ipynb is served by mclib.chapters.chNN_name (mclib/chapters/chNN_name.py);
the book's runner finds a chapter's module by that name alone (`mclib.book.runner.chapter_modules`,
`declared_by`), so a module named chNN_* here is a chapter and nothing else is. A part of a
chapter or what several of its readings share lives here under a plain name:

    ch01_train.py ... ch09_appendix.py, ch99_scorecard.py
                  the chapters: `CHAPTER`, `readings(ch, ...)` (scorecard rows and the sentences
                  that state them), `scorecard_table(ch, rows)`, and what each declares to the
                  machinery by name (`idle_work`, `runs_read`, `curve_rows`, `site_part`, ...)
    followup.py   chapter 07's last section: the authors' 2025 follow-up's claims on this task
    heads_tables.py, heads_readings.py
                  chapter 03's parts: what it computes from the run (its notebook calls them
                  through ch03_heads), and the rows and sentences of E3-E9 and E11
    baselines_readings.py
                  chapter 06's closing sentences and scorecard rows, from its tables alone

Its place among the rooms (tests/test_layers.py), bottom to top: core, analyses, the book's
machinery (mclib/book: runner, chapter protocol, scorecard, plots), the GPU lease
(mclib/lease), then this room; only the command line (mclib/__main__.py) sits above it.
Nothing below imports a chapter: the machinery reaches them by name, through the toc.
"""
