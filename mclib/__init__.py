"""mclib: the library behind the book "Abrupt Learning in Transformers: matrix completion".

Where things are:
    config.py         profiles (params/*.yaml) as typed dataclasses, validated
    data.py           low-rank matrices, masks, the tokenizer
    model.py          BertModel + linear read-out, checkpoints via from_pretrained
    metrics.py        L, L_obs, L_mask, mask value; `find_drop`, the definition of the drop
    train.py          online training with atomic checkpoints and exact resume
    stacked.py        the fast training path: R runs as one stacked model (fused QKV, batched products)
    jobs.py           several runs at once on Dask: a local cluster, a scheduler's address, or SLURM/PBS
    sweep.py          `python -m mclib sweep FILE.yaml`: settings x seeds, resumable, one results table
    attention.py      hook points inside attention: capture, ablate (uniform / batch-mean), patch
    interventions.py  token replacement (E2), QKV switching (E6), position permutation (E7),
                      component re-initialisation (E15)
    evaluate.py       L, L_obs, L_mask of any model + intervention on fresh matrices; E8 patching
    heads.py          attention maps, head scores (row / column / self / mask), head classes
    probes.py         linear probes on hidden states (E11)
    experiments.py    the tables of the copying and heads chapters (E2-E10): one call each
    embeddings.py     token and position embeddings: norms, PCA, t-SNE, clustering scores
    baselines.py      nuclear norm (CVXPY), soft-impute, alternating least squares
    comparisons.py    BERT against those methods on the same matrices (E16-E18 tables)
    freezing.py       the four E15 runs: re-initialise one group, train it, the rest frozen
    readings.py       the closing sentences and scorecard rows of chapters 04-06
    progress.py       progress measures per checkpoint (heads, embeddings, gradients); lead times
    paper.py          the numbers the paper reports
    plots.py          figures
"""
