"""The chapters: one module per page of the book, which its notebook only calls.

book/NN_name.ipynb is served by mclib.chapters.chNN_name, and a module named chNN_* is a
chapter and nothing else is. Each chapter has `CHAPTER`, `readings(ch, ...)` (scorecard rows
and the sentences that state them), `scorecard_table(ch, rows)` and `SPEC`
(`mclib.book.spec.ChapterSpec`), what it declares to the machinery; registry.py collects the
specs. Parts of chapters: train_sentences.py (01), copying_text.py and copying_rejudged.py
(02), heads_tables.py, heads_readings.py, heads_structure.py and heads_rejudged.py (03),
embeddings_readings.py (04), baselines_readings.py (06), beyond_readings.py, followup.py (07's
last section) and followup_intervention.py (07). A chapter's figures live beside it:
heads_plots.py and loss_tables_shown.py (02, 03, 08), embeddings_plots.py (04), baselines_plots.py
(06), scorecard_plots.py (99).

This room sits above core, analyses, book and lease and below the command line
(tests/test_layers.py); nothing below imports a chapter: it is handed the specs.
"""
