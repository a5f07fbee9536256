"""mclib: the library behind the book "Abrupt Learning in Transformers: matrix completion".

Five rooms, one folder each; an arrow only points down the list (tests/test_layers.py), and
the command line (mclib/__main__.py) sits above them all:

    chapters/  one module per chapter, which its notebook only calls
               (book/NN_name.ipynb <-> mclib/chapters/chNN_name.py)
    lease/     the paper's own setting trained and analysed in slices on a lent GPU
    book/      the machinery the chapters share: the runner (papermill + Jupyter Book), the
               chapter protocol, the scorecard, the figures
    analyses/  one module per kind of measurement on a trained model (attention hooks,
               interventions, evaluation, heads, probes, embeddings, progress, baselines, freezing)
    core/      profiles, data, model, the training step and loop, run folders, Dask jobs, sweeps,
               the paper's numbers

Each folder's __init__.py lists its modules. The protocol of every experiment (E1-E20)
is docs/protocol.md.
"""
