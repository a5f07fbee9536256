"""mclib: the library behind the book "Abrupt Learning in Transformers: matrix completion".

Three layers, one folder each; an arrow only points down the list:

    book/      the runner (papermill + Jupyter Book), the scorecard, the figures, and one
               module per chapter (book/NN_name.ipynb <-> mclib/book/chNN_name.py)
    analyses/  one module per kind of measurement on a trained model (attention hooks,
               interventions, evaluation, heads, probes, embeddings, progress, baselines, freezing)
    core/      profiles, data, model, the training step and loop, run folders, Dask jobs, sweeps,
               the paper's numbers

Each folder's __init__.py lists its modules. The protocol of every experiment (E1-E20)
is docs/protocol.md.
"""
