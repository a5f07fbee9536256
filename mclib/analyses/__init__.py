"""The analyses: one module per kind of measurement on a trained model. They read models
and run folders (mclib.core) and return numbers and tables; they draw nothing.

Losses and interventions: evaluate, loss_tables, attention (ablation, patching), interventions.
Inside the model: heads, probes, embeddings, progress, plateau, interp (nnsight).
Against solvers: baselines, comparisons (its solver cache: solver_cache), per_matrix. Runs
and sweeps: freezing (E15), sharpness, sizes (E20), precision, rounding. The scorecard's
relative margins: margins.
"""
