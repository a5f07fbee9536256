"""The core: what a run is and how it trains. Nothing here knows about analyses or the book.

    config.py       profiles (params/*.yaml) as typed dataclasses, validated; one-line errors
    data.py         low-rank matrices, masks, the tokenizer
    model.py        BertModel + linear read-out, model_type matrix-bert (AutoModel loads it); checkpoints are HF folders
    card.py         a checkpoint's model card: huggingface_hub's ModelCard, the weights' sha256
    attention.py    mclib's attention function (QK-LayerNorm, hook points), registered with transformers
    hooks.py        every activation by name (TransformerLens' scheme): hooks(), run_with_cache()
    metrics.py      L, L_obs, L_mask, mask value; `find_drop`, the one definition of the drop
    step.py         the optimiser, one training step, and the run it steps (set up, resumed, evaluated, saved)
    train.py        the loop (online data, exact resume), one trainer a folder
    runs.py         a run folder: its layout and name, its profile and metrics files, atomic writes
    checkpoints.py  a run's checkpoints: saved, read, damaged and set aside, resumed from; which stay on disk
    ending.py       how a run ends: its stop rules, end.json, whether it is complete
    placement.py    the analysis checkpoints of a trained run: pre, transition, post
    jobs.py         several runs at once on Dask: local cluster, a scheduler's address, SLURM/PBS
    sweep.py        `python -m mclib sweep FILE.yaml`: settings x seeds, resumable
    sweep_run.py    one run of a sweep on a worker, and its row of the results table
    sweep_figure.py the curves table and the figure of a sweep's results
    flops.py        FLOPs of a training step
    paper.py        what the paper reports, and its profile (params/paper.yaml)
    repo.py         the repository this code runs from: its root, git revision, the hash of mclib's sources
"""
