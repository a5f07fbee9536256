"""The book: what turns runs into pages.

    runner.py        `python -m mclib book`: papermill runs the chapters, Jupyter Book 1 renders
                     (the chapters' declarations: `declared`)
    chapter.py       `open_chapter`, every chapter's first call; downloads; departures from the paper
    scorecard.py     one row per claim of the paper, the rule per kind of claim, the copying levels
    plots.py         every figure
    loss_tables.py   how chapters 02 and 03 show loss tables (computed by mclib.analyses.loss_tables)
    export.py        `python -m mclib export RUN`: a run's metrics as TensorBoard or W&B files

This is the machinery the chapters share. The chapters themselves (book/NN_name.ipynb calls
mclib.chapters.chNN_name) are a room of their own, mclib/chapters/, two floors up: the GPU
lease's machinery (the ledger, slices, the paper setting's rows, its part of the site),
mclib/lease/, sits between this room and the chapters. Nothing here imports a chapter: the
runner finds each by name through the toc (`chapter_modules`, `declared`).
"""
import warnings

# Importing the model imports transformers, which imports tqdm.auto; in a kernel without
# ipywidgets that warns on stderr at import time, before a chapter's `open_chapter` could
# filter it (`notebook_setup`). Every chapter imports this package first (mclib/chapters/__init__.py).
warnings.filterwarnings("ignore", message="IProgress not found")
