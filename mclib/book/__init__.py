"""The book: what turns runs into pages.

    runner.py        `python -m mclib book`: the toc, what chapters declare (`declared`), `plan`, `build`
    runner_plan.py   which runs a build trains, and who trains them
    runner_execute.py one chapter through papermill, its paths made relative
    runner_beside.py the training chapter in a process of its own, the others beside it
    runner_progress.py the training's one progress line
    runner_site.py   the site's toc and the Jupyter Book 1 build (a partial one too)
    chapter.py       `open_chapter`, every chapter's first call; downloads; departures from the paper
    scorecard.py     a row's fields, recording (under a lock) and loading; `claim`
    scorecard_rules.py the rule per kind of claim, the words a sentence says them with, the copying levels
    scorecard_stage.py a row that reads the end of a run cut short (provisional)
    scorecard_tables.py the counts, tables and sentences made from the rows
    plots_*.py       the figures, by family: plots_base (the theme, `closed`), _curves, _heads, _embeddings,
                     _baselines, _scorecard
    loss_tables.py   how chapters 02 and 03 show loss tables (computed by mclib.analyses.loss_tables)
    export.py        `python -m mclib export RUN`: a run's metrics as TensorBoard or W&B files

This is the machinery the chapters share. The chapters themselves (book/NN_name.ipynb calls
mclib.chapters.chNN_name) are a room of their own, mclib/chapters/, two floors up: the GPU
lease's machinery (the ledger, slices, the paper setting's rows, its part of the site),
mclib/lease/, sits between this room and the chapters. Nothing here imports a chapter: the
runner finds each by name through the toc (`chapter_modules`, `declared`).
"""
