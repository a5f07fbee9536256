"""The analyses: one module per kind of measurement on a trained model. They read models
and run folders (mclib.core) and return numbers and tables; they draw nothing.

    attention.py      head ablation and activation patching as hooks (core.hooks)
    interventions.py  token replacement, QKV switching and position permutation (hooks), re-initialisation
    evaluate.py       L, L_obs, L_mask of a model (+ hooks) on fresh matrices; activation patching; pooled errors
    loss_tables.py    losses under ablations and changed models, one batch a table, with errors (E3-E8)
    heads.py          attention maps, head scores, head classes
    probes.py         linear probes on hidden states
    embeddings.py     token and position embeddings: norms, PCA, t-SNE, clustering scores
    progress.py       progress measures per checkpoint; lead times
    baselines.py      nuclear norm (CVXPY), soft-impute, alternating least squares
    comparisons.py    BERT beside those solvers on the same matrices (E16-E18); the solvers' results, kept
    per_matrix.py     a method's per-matrix values on a batch, and the rows with standard errors from them
    freezing.py       component re-initialisation runs (E15)
    sharpness.py      how abrupt a drop is: plateau and fall, in steps
    margins.py        the relative margins of the scorecard's rules (the book's rules and E15's early stop read them)
    sizes.py          the width/depth sweep's claims (E20)
"""
