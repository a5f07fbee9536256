"""BERT against classical matrix completion (E16, E17, E18 and two stronger methods), and
the solvers alone on the paper's task: the numbers, with their errors. One call per table
of the baselines chapter (which words and shows them: mclib.book.ch06_baselines):

    task = paper.task()                                          # params/paper.yaml's data: 7×7, rank 2, p 0.3
    nuclear_sweep(None, task, p_masks, 1024, seed)               # E16's solver curve, the paper's task
    regularised_table(task, lams, 2048, seed)                    # E17, the paper's task
    classical_table(None, task, 1024, seed)                      # nuclear norm, soft-impute, ALS, the paper's task
    nuclear_sweep(model, cfg.data, p_masks, 512, seed)           # E16: BERT vs min ‖U‖_*, the profile's task
    classical_table(model, cfg.data, 512, seed)                  # BERT beside the classical methods, same matrices
    ood_table(model, cfg.data, 1024, seed, solver_matrices=512)  # E18: Gaussian, Laplace vs uniform

The solvers need no model, so their tables are computed on the paper's task whatever the
profile, and compared with the paper's numbers as they are. BERT is compared with a solver
only on the matrices of its own (the profile's) task, matrix by matrix.

Every method sees the batch `sample_eval_batch(data, n, seed)`: the same seed gives the
same matrices, so BERT and a solver are compared matrix by matrix. Across the p_masks of
E16 the matrices are the same too, and the masks are nested (an entry masked at p is
masked at every larger p), because masks come from the same uniform draws.

Errors. Losses are pooled over entries, as everywhere in the book; every estimate comes
with a standard error ("_se") that treats matrices as the independent units (entries of
one matrix are not independent):
  - a pooled mean R = Σ s_i / Σ c_i (s_i: matrix i's sum of squared errors over the
    entries in question, c_i: their number) has the ratio estimator's delta-method error
    se² = Σ (s_i − R c_i)² / (b (b−1) c̄²)  (`pooled`);
  - a difference of two methods on the same matrices is pooled from the per-matrix
    differences s_i^a − s_i^b, so it has the paired error (`paired`), much smaller than
    the two separate errors combined when the methods fail on the same matrices;
  - a mean over matrices (the nuclear norm) has std / √b; a share of matrices √(p(1−p)/b);
    a median over matrices the distribution-free order-statistic error (`median_se`).
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pandas as pd

from ..analyses import baselines as B
from ..analyses.evaluate import predict, sample_eval_batch
from ..core import paper
from ..core.config import DataConfig
from ..core.data import copy_level

LOSSES = ("L", "L_obs", "L_mask")
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


def median_se(values: np.ndarray, z: float = 1.96) -> float:
    """Distribution-free standard error of the median of `values` (one per matrix): the
    order statistics at ranks b/2 ∓ z√b/2 bound an approximate 95 % interval for the
    median (binomial argument), and the error is that interval's half-width over z.
    NaN for fewer than 2 values."""
    v = np.sort(np.asarray(values, dtype=float))
    b = len(v)
    if b < 2:
        return float("nan")
    lo = int(np.clip(np.floor(b / 2 - z * np.sqrt(b) / 2), 0, b - 1))
    hi = int(np.clip(np.ceil(b / 2 + z * np.sqrt(b) / 2), 0, b - 1))
    return float((v[hi] - v[lo]) / (2 * z))


def share_se(share: float, b: int) -> float:
    """Binomial standard error √(p(1−p)/b) of a share p of b matrices (NaN for b < 2)."""
    return float(np.sqrt(share * (1 - share) / b)) if b > 1 else float("nan")


def per_matrix_l_mask(pred: np.ndarray, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`[matrices with a masked entry]`: each matrix's own mean squared error over its masked entries."""
    sq = ((pred - x) ** 2 * mask).reshape(len(x), -1).sum(1)
    c = mask.reshape(len(x), -1).sum(1)
    return sq[c > 0] / c[c > 0]


def _arrays(*arrays):
    return [np.asarray(a.numpy() if hasattr(a, "numpy") else a, dtype=float) for a in arrays]


def completion_row(pred, x, mask) -> dict[str, float]:
    """L, L_obs, L_mask with standard errors, the median per-matrix L_mask (and its
    `median_se`), and the mean nuclear norm (with its standard error) of the completed
    matrices."""
    pred, x, mask = _arrays(pred, x, mask)
    mask = mask.astype(bool)
    sq = (pred - x) ** 2
    row = {}
    for name, where in (("L", np.ones_like(mask)), ("L_obs", ~mask), ("L_mask", mask)):
        row[name], row[f"{name}_se"] = pooled(sq, where)
    per = per_matrix_l_mask(pred, x, mask)
    row["median_L_mask"], row["median_L_mask_se"] = float(np.median(per)), median_se(per)
    nuc = B.nuclear_norm(pred)
    row["nuclear"], row["nuclear_se"] = float(nuc.mean()), float(nuc.std(ddof=1) / np.sqrt(len(nuc)))
    return row


def paired(pred_a, pred_b, x, mask) -> dict[str, float]:
    """Method a minus method b on the same matrices, with paired standard errors:
    d_L, d_L_mask (pooled over the per-matrix differences of squared-error sums, see
    `pooled`; negative = a better) and their _se; a_better (± a_better_se): the share of
    matrices with a masked entry whose own L_mask is strictly lower with a."""
    pred_a, pred_b, x, mask = _arrays(pred_a, pred_b, x, mask)
    mask = mask.astype(bool)
    diff = (pred_a - x) ** 2 - (pred_b - x) ** 2
    row = {}
    for name, where in (("d_L", np.ones_like(mask)), ("d_L_mask", mask)):
        row[name], row[f"{name}_se"] = pooled(diff, where)
    better = per_matrix_l_mask(pred_a, x, mask) < per_matrix_l_mask(pred_b, x, mask)
    row["a_better"] = float(better.mean()) if len(better) else float("nan")
    row["a_better_se"] = share_se(row["a_better"], len(better))
    return row


def _batch(data: DataConfig, n_matrices: int, seed: int, p_mask: float | None = None, dist: str | None = None):
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


def nuclear_sweep(model, data: DataConfig, p_masks, n_matrices: int, seed: int) -> pd.DataFrame:
    """E16: for each p_mask, min ‖U‖_* s.t. U = X on Ω, and BERT on the same matrices.

    One row per (p_mask, method) with `completion_row`'s columns; method "truth" is X
    itself (its nuclear norm is the reference; its losses are 0). model None: the solver
    alone (e.g. on `paper.task()`, which BERT of another task cannot read). BERT's rows
    also carry `paired`'s columns for BERT minus the solver (d_L, d_L_mask, a_better =
    the share of matrices where BERT's L_mask is lower; NaN on the other rows)."""
    rows = []
    for p in p_masks:
        batch, x, mask = _batch(data, n_matrices, seed, p_mask=p)
        solver = _nuclear(x, mask)
        if model is not None:
            bert = _bert(model, batch)
            rows.append({"p_mask": p, "method": "BERT", **completion_row(bert, x, mask),
                         **paired(bert, solver, x, mask)})
        for method, pred in (("nuclear norm", solver), ("truth", x)):
            rows.append({"p_mask": p, "method": method, **completion_row(pred, x, mask)})
    return pd.DataFrame(rows)


def regularised_table(data: DataConfig, lams, n_matrices: int, seed: int, model=None) -> pd.DataFrame:
    """E17: per λ, min (1/|Ω|) Σ_Ω (U − X)² + λ‖U‖_* on the same matrices; one row per λ
    (lam, L_obs, L_mask, L and their _se), and a last row "BERT" (lam NaN) if a model is given."""
    batch, x, mask = _batch(data, n_matrices, seed)
    rows = [{"method": f"λ = {lam:g}", "lam": lam, **completion_row(B.regularised_nuclear_norm(x, mask, lam), x, mask)}
            for lam in lams]
    if model is not None:
        rows.append({"method": "BERT", "lam": float("nan"), **completion_row(_bert(model, batch), x, mask)})
    return pd.DataFrame(rows)


E17_LOSSES = ("L_obs", "L_mask", "L")  # the order of mclib.core.paper.PAPER_E17's tuples


def e17_beside_paper(reg: pd.DataFrame) -> pd.DataFrame:
    """`regularised_table`'s λ rows beside the paper's E17 numbers, one row per (λ, loss):
    lam, quantity, ours, se, paper, rel_dev = ours / paper − 1, z = (ours − paper) / se
    (how many of our standard errors the paper's value lies away). λs the paper does not
    report are left out."""
    from ..core.paper import PAPER_E17

    rows = []
    for r in reg[reg["method"] != "BERT"].to_dict("records"):
        if r["lam"] not in PAPER_E17:
            continue
        for q, theirs in zip(E17_LOSSES, PAPER_E17[r["lam"]]):
            rows.append({"lam": r["lam"], "quantity": q, "ours": r[q], "se": r[f"{q}_se"], "paper": theirs,
                         "rel_dev": r[q] / theirs - 1, "z": (r[q] - theirs) / r[f"{q}_se"]})
    return pd.DataFrame(rows)


def ood_table(model, data: DataConfig, n_matrices: int, seed: int, dists=("uniform", "gaussian", "laplace"),
              *, solver_matrices: int | None = None) -> pd.DataFrame:
    """E18: BERT and the E16 solver on matrices whose factors are drawn from each
    distribution, same masking and rounding. The solver sees the first `solver_matrices`
    of BERT's matrices (None: all; 0: no solver rows), since it costs ~6 ms a matrix.
    Extra columns: matrices; copy_level (E[X²]); L_mask_rel = L_mask / E[X²] (scale-free);
    outside = the share of entries beyond ±rank, the largest |x| uniform factors can give
    (values training never showed)."""
    d = data
    rows = []
    for dist in dists:
        batch, x, mask = _batch(data, n_matrices, seed, dist=dist)
        k = n_matrices if solver_matrices is None else min(solver_matrices, n_matrices)
        methods = [("BERT", _bert(model, batch), n_matrices)]
        if k > 0:
            methods.append(("nuclear norm", _nuclear(x[:k], mask[:k]), k))
        level = copy_level(d.rank, dist)
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


def classical_table(model, data: DataConfig, n_matrices: int, seed: int) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """The classical methods (nuclear norm, soft-impute and ALS with the task's rank) and
    BERT on the same matrices at the task's p_mask; model None: the methods alone (e.g. on
    `paper.task()`).

    Returns the table (one row per method, `completion_row`'s columns; with a model, each
    method's row also has `paired`'s columns for BERT minus that method, as BERT_d_L,
    BERT_d_L_se, BERT_d_L_mask, BERT_d_L_mask_se, BERT_better, BERT_better_se) and, per
    method, the per-matrix L_mask (`per_matrix_l_mask`) for a distribution plot."""
    d = data
    batch, x, mask = _batch(data, n_matrices, seed)
    methods = {**classical_methods(d.rank), "nuclear norm": _nuclear}  # same order; the E16 solution, if computed
    preds = {} if model is None else {"BERT": _bert(model, batch)}
    preds.update({k: f(x, mask) for k, f in methods.items()})
    rows = []
    for k, p in preds.items():
        row = {"method": k, **completion_row(p, x, mask)}
        if model is not None and k != "BERT":
            row.update({f"BERT_{q.replace('a_better', 'better')}": v for q, v in paired(preds["BERT"], p, x, mask).items()})
        rows.append(row)
    return pd.DataFrame(rows), {k: per_matrix_l_mask(p, x, mask) for k, p in preds.items()}


def main(argv=None) -> None:
    """`python -m mclib.analyses.comparisons [--matrices 2048] [--seed 0]`: E17 on the paper's task
    (CVXPY, Clarabel), printed beside the paper's table (a few minutes for 2048 matrices)."""
    import argparse

    from ..core.paper import PAPER_E17

    ap = argparse.ArgumentParser(prog="python -m mclib.analyses.comparisons", description=main.__doc__)
    ap.add_argument("--matrices", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    task = paper.task()
    reg = regularised_table(task, list(PAPER_E17), args.matrices, args.seed)
    t = e17_beside_paper(reg)
    print(f"E17 on the paper's task ({task.n}x{task.n}, rank {task.rank}, p_mask {task.p_mask:g}, {task.dist} "
          f"factors), {args.matrices} matrices, evaluation seed {args.seed}")
    print(t[["lam", "quantity", "ours", "se", "paper", "rel_dev", "z"]].to_string(
        index=False, formatters={"lam": "{:g}".format, "ours": "{:.5g}".format, "se": "{:.2g}".format,
                                 "paper": "{:.5g}".format, "rel_dev": "{:+.1%}".format,
                                 "z": "{:+.1f}".format}))


if __name__ == "__main__":
    main()
