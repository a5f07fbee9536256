"""The book: what turns runs into pages.

    runner.py        `python -m mclib book`: papermill runs the chapters, Jupyter Book 1 renders
                     (the chapters' declarations: `declared`)
    chapter.py       `open_chapter`, every chapter's first call; downloads; departures from the paper
    scorecard.py     one row per claim of the paper, the rule per kind of claim, the copying levels
    plots.py         every figure
    loss_tables.py   how chapters 02 and 03 show loss tables (computed by mclib.analyses.loss_tables)
    ch01_train.py ... ch99_scorecard.py
                     one module per chapter: book/NN_name.ipynb calls mclib/book/chNN_name.py

The GPU lease's machinery (the ledger, slices, the paper setting's rows, its part of the
site) is a room of its own, mclib/lease/, between this room's machinery and its chapters.
"""
import warnings

# Importing the model imports transformers, which imports tqdm.auto; in a kernel without
# ipywidgets that warns on stderr at import time, before a chapter's `open_chapter` could
# filter it (`notebook_setup`). Every chapter imports this package first.
warnings.filterwarnings("ignore", message="IProgress not found")
