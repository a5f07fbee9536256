"""The book: the runner (papermill + Jupyter Book), the scorecard, the figures, and the
modules the chapters call (book/NN_name.ipynb <-> mclib/book/chNN_name.py)."""
