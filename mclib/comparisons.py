"""BERT against classical matrix completion on the same matrices (E16, E17, E18 and
two stronger methods). One call per table of the baselines chapter:

    nuclear_sweep(model, cfg.data, p_masks, 512, seed)           # E16: BERT vs min ‖U‖_*
    regularised_table(cfg.data, lams, 256, seed, model)          # E17 (+ BERT on the same matrices)
    ood_table(model, cfg.data, 1024, seed, solver_matrices=512)  # E18: Gaussian, Laplace vs uniform
    classical_table(model, cfg.data, 512, seed)                  # BERT, nuclear norm, soft-impute, ALS

Every method sees the batch `sample_eval_batch(data, n, seed)`: the same seed gives the
same matrices, so BERT and a solver are compared matrix by matrix. Across the p_masks of
E16 the matrices are the same too, and the masks are nested (an entry masked at p is
masked at every larger p), because masks come from the same uniform draws.

Losses are pooled over entries, as everywhere in the book; the standard error ("_se")
treats matrices as the independent units (the ratio estimator's delta-method error:
entries of one matrix are not independent).
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pandas as pd

from . import baselines as B
from .evaluate import predict, sample_eval_batch

LOSSES = ("L", "L_obs", "L_mask")
FACTOR_VARIANCE = {"uniform": 1 / 3, "gaussian": 0.5 ** 2, "laplace": 2 * 0.25 ** 2}  # Var of one factor entry
SOFT_IMPUTE_LAM = 5e-4  # the smallest λ of E17's list: converges in < 3000 steps, where 1e-5 does not


def pooled(values: np.ndarray, where: np.ndarray) -> tuple[float, float]:
    """Pooled mean of `values` over `where` (`[batch, n, n]`), and its standard error with
    matrices as the units: R = Σ s_i / Σ c_i, se² = Σ (s_i − R c_i)² / (b (b−1) c̄²)."""
    s = (values * where).reshape(len(values), -1).sum(1)
    c = where.reshape(len(values), -1).sum(1).astype(float)
    if c.sum() == 0:
        return float("nan"), float("nan")
    r = s.sum() / c.sum()
    b = len(values)
    se = np.sqrt(((s - r * c) ** 2).sum() / (b * (b - 1))) / c.mean() if b > 1 else float("nan")
    return float(r), float(se)


def per_matrix_l_mask(pred: np.ndarray, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`[matrices with a masked entry]`: each matrix's own mean squared error over its masked entries."""
    sq = ((pred - x) ** 2 * mask).reshape(len(x), -1).sum(1)
    c = mask.reshape(len(x), -1).sum(1)
    return sq[c > 0] / c[c > 0]


def completion_row(pred, x, mask) -> dict[str, float]:
    """L, L_obs, L_mask with standard errors, the median per-matrix L_mask, and the mean
    nuclear norm (with its standard error) of the completed matrices."""
    pred, x, mask = (np.asarray(a.numpy() if hasattr(a, "numpy") else a, dtype=float) for a in (pred, x, mask))
    mask = mask.astype(bool)
    sq = (pred - x) ** 2
    row = {}
    for name, where in (("L", np.ones_like(mask)), ("L_obs", ~mask), ("L_mask", mask)):
        row[name], row[f"{name}_se"] = pooled(sq, where)
    row["median_L_mask"] = float(np.median(per_matrix_l_mask(pred, x, mask)))
    nuc = B.nuclear_norm(pred)
    row["nuclear"], row["nuclear_se"] = float(nuc.mean()), float(nuc.std(ddof=1) / np.sqrt(len(nuc)))
    return row


def _batch(data, n_matrices: int, seed: int, p_mask: float | None = None, dist: str | None = None):
    data = getattr(data, "data", data)
    if p_mask is not None:
        data = dataclasses.replace(data, p_mask=p_mask)
    b = sample_eval_batch(data, n_matrices, seed, dist)
    return b, b.x.double().numpy(), b.mask.numpy()


def _bert(model, batch) -> np.ndarray:
    return predict(model, batch).double().numpy()


_NUCLEAR_CACHE: dict[str, np.ndarray] = {}


def _nuclear(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`nuclear_norm_complete`, remembered for the last 32 batches: E16 at the training
    p_mask and `classical_table` solve the same matrices (~6 ms each), once."""
    key = hashlib.sha1(x.tobytes() + mask.tobytes() + str(x.shape).encode()).hexdigest()
    if key not in _NUCLEAR_CACHE:
        if len(_NUCLEAR_CACHE) >= 32:  # E16 solves one batch per p_mask (~0.2 MB each)
            _NUCLEAR_CACHE.pop(next(iter(_NUCLEAR_CACHE)))
        _NUCLEAR_CACHE[key] = B.nuclear_norm_complete(x, mask)
    return _NUCLEAR_CACHE[key].copy()


def nuclear_sweep(model, data, p_masks, n_matrices: int, seed: int) -> pd.DataFrame:
    """E16: for each p_mask, BERT and min ‖U‖_* s.t. U = X on Ω on the same matrices.

    One row per (p_mask, method) with `completion_row`'s columns; method "truth" is X
    itself (its nuclear norm is the reference; its losses are 0)."""
    rows = []
    for p in p_masks:
        batch, x, mask = _batch(data, n_matrices, seed, p_mask=p)
        for method, pred in (("BERT", _bert(model, batch)), ("nuclear norm", _nuclear(x, mask)),
                             ("truth", x)):
            rows.append({"p_mask": p, "method": method, **completion_row(pred, x, mask)})
    return pd.DataFrame(rows)


def regularised_table(data, lams, n_matrices: int, seed: int, model=None) -> pd.DataFrame:
    """E17: per λ, min (1/|Ω|) Σ_Ω (U − X)² + λ‖U‖_* on the same matrices; one row per λ
    (lam, L_obs, L_mask, L and their _se), and a last row "BERT" (lam NaN) if a model is given."""
    batch, x, mask = _batch(data, n_matrices, seed)
    rows = [{"method": f"λ = {lam:g}", "lam": lam, **completion_row(B.regularised_nuclear_norm(x, mask, lam), x, mask)}
            for lam in lams]
    if model is not None:
        rows.append({"method": "BERT", "lam": float("nan"), **completion_row(_bert(model, batch), x, mask)})
    return pd.DataFrame(rows)


def copy_level(dist: str, rank: int) -> float:
    """E[X²] for X = U Vᵀ with iid zero-mean factors: rank · Var(u)²; the L_mask of a model
    that outputs 0 at masked entries (2/9 for rank 2, uniform)."""
    if dist not in FACTOR_VARIANCE:
        raise ValueError(f"dist {dist!r} is not one of {', '.join(FACTOR_VARIANCE)}")
    return rank * FACTOR_VARIANCE[dist] ** 2


def ood_table(model, data, n_matrices: int, seed: int, dists=("uniform", "gaussian", "laplace"),
              solver_matrices: int | None = None) -> pd.DataFrame:
    """E18: BERT and the E16 solver on matrices whose factors are drawn from each
    distribution, same masking and rounding. The solver sees the first `solver_matrices`
    of BERT's matrices (None: all; 0: no solver rows), since it costs ~6 ms a matrix.
    Extra columns: matrices; copy_level (E[X²]); L_mask_rel = L_mask / E[X²] (scale-free);
    outside = the share of entries beyond ±rank, the largest |x| uniform factors can give
    (values training never showed)."""
    d = getattr(data, "data", data)
    rows = []
    for dist in dists:
        batch, x, mask = _batch(data, n_matrices, seed, dist=dist)
        k = n_matrices if solver_matrices is None else min(solver_matrices, n_matrices)
        methods = [("BERT", _bert(model, batch), n_matrices)]
        if k > 0:
            methods.append(("nuclear norm", _nuclear(x[:k], mask[:k]), k))
        level = copy_level(dist, d.rank)
        outside = float((np.abs(x) > d.rank).mean())
        for method, pred, m in methods:
            row = completion_row(pred, x[:m], mask[:m])
            rows.append({"dist": dist, "method": method, "matrices": m, **row, "copy_level": level,
                         "L_mask_rel": row["L_mask"] / level, "outside": outside})
    return pd.DataFrame(rows)


def classical_methods(rank: int) -> dict:
    """name -> method(x, mask) of the classical comparison (numpy `[b, n, n]` in and out)."""
    return {
        "nuclear norm": lambda x, m: B.nuclear_norm_complete(x, m),
        f"soft-impute, rank {rank}": lambda x, m: B.soft_impute(x, m, SOFT_IMPUTE_LAM, rank=rank),
        f"ALS, rank {rank}": lambda x, m: B.als_complete(x, m, rank),
    }


def classical_table(model, data, n_matrices: int, seed: int) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """BERT and the classical methods on the same matrices at the profile's p_mask.

    Returns the table (one row per method, `completion_row`'s columns) and, per method,
    the per-matrix L_mask (`per_matrix_l_mask`) for a distribution plot."""
    d = getattr(data, "data", data)
    batch, x, mask = _batch(data, n_matrices, seed)
    methods = {**classical_methods(d.rank), "nuclear norm": _nuclear}  # same order; the E16 solution, if computed
    preds = {"BERT": _bert(model, batch), **{k: f(x, mask) for k, f in methods.items()}}
    table = pd.DataFrame([{"method": k, **completion_row(p, x, mask)} for k, p in preds.items()])
    return table, {k: per_matrix_l_mask(p, x, mask) for k, p in preds.items()}
