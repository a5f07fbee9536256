"""The book: the runner (papermill + Jupyter Book), the scorecard, the figures, and the
modules the chapters call (book/NN_name.ipynb <-> mclib/book/chNN_name.py)."""
import warnings

# Importing the model imports transformers, which imports tqdm.auto; in a kernel without
# ipywidgets that warns on stderr at import time, before a chapter's `open_chapter` could
# filter it (`notebook_setup`). Every chapter imports this package first.
warnings.filterwarnings("ignore", message="IProgress not found")
