"""BERT against classical matrix completion (E16-E18, soft-impute, ALS), and the solvers
alone on the paper's task: one call per table of chapter 06.

    task = paper.task()                                 # params/paper.yaml's data: 7×7, rank 2, p 0.3
    nuclear_sweep(None, task, p_masks, 1024, seed)      # E16's solver curve, the paper's task
    regularised_table(task, lams, 2048, seed)           # E17, the paper's task
    classical_table(None, task, 1024, seed)             # nuclear norm, soft-impute, ALS, the paper's task
    nuclear_sweep(model, cfg.data, p_masks, 512, seed)  # E16: BERT vs min ‖U‖_*, the profile's task
    classical_table(model, cfg.data, 512, seed)         # BERT beside the classical methods, same matrices
    ood_table(model, cfg.data, 1024, seed, solver_matrices=512)  # E18: Gaussian, Laplace vs uniform
    ... (..., solves=open_solves(path))                 # each: the solvers' results from a cache file

The solvers need no model, so their tables are also computed on the paper's task, beside
the paper's numbers; BERT meets a solver only on its own profile's task. Every method sees
`sample_eval_batch(data, n, seed)`, so they are compared matrix by matrix (across E16's
p_masks the matrices are the same and the masks nested). Standard errors ("_se") treat
matrices as the units (`mclib.analyses.per_matrix`).

The solvers' results are kept by `mclib.analyses.solver_cache` (`Solves`, `open_solves`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd

from ..analyses import baselines as B
from ..analyses.evaluate import predict, sample_eval_batch
from ..analyses.per_matrix import matrix_l_mask, matrix_stats, stats_paired, stats_row
from ..core import paper
from ..core.config import DataConfig
from ..core.data import copy_level
from ..core.paper import PAPER_E17

# the solver cache's names, also read from here (chapter 06, its tests)
from .solver_cache import NEEDS_CVXPY as NEEDS_CVXPY
from .solver_cache import SESSION, Solves
from .solver_cache import Block as Block
from .solver_cache import SolverCacheError as SolverCacheError
from .solver_cache import open_solves as open_solves
from .solver_cache import read_solves as read_solves

LOSSES = ("L", "L_obs", "L_mask")
SOFT_IMPUTE_LAM = 5e-4  # the smallest λ of E17's list: converges in < 3000 steps, where 1e-5 does not


# --- the tables -------------------------------------------------------------------------------


def _batch(
    data: DataConfig, n_matrices: int, seed: int, p_mask: float | None = None, dist: str | None = None
):
    """The batch every method sees, as numpy x `[batch, n, n]` float64 and mask bool, and `about`
    the draw (ABOUT)."""
    if p_mask is not None:
        data = dataclasses.replace(data, p_mask=p_mask)
    b = sample_eval_batch(data, n_matrices, seed, dist)
    about = {
        "n": int(data.n),
        "rank": int(data.rank),
        "p_mask": float(data.p_mask),
        "dist": dist or data.dist,
        "seed": int(seed),
        "matrices": int(n_matrices),
    }
    return b, b.x.double().numpy(), b.mask.numpy(), about


def _bert(model, batch) -> dict[str, np.ndarray]:
    """BERT's `matrix_stats` on `batch`."""
    return matrix_stats(predict(model, batch).double().numpy(), batch.x.double().numpy(), batch.mask.numpy())


NUCLEAR = (B.nuclear_norm_complete, {})  # E16's solver: (method, its arguments)


def nuclear_sweep(
    model, data: DataConfig, p_masks, n_matrices: int, seed: int, *, solves: Solves | None = None
) -> pd.DataFrame:
    """E16: for each p_mask, min ‖U‖_* s.t. U = X on Ω, and BERT on the same matrices.
    One row per (p_mask, method: BERT, nuclear norm, truth = X itself) with
    `per_matrix.completion_row`'s columns; BERT's rows add `per_matrix.paired`'s for BERT minus
    the solver. model None: the solver alone. solves: default SESSION (solved in this process)."""
    solves = SESSION if solves is None else solves
    rows = []
    for p in p_masks:
        batch, x, mask, about = _batch(data, n_matrices, seed, p_mask=p)
        solver = solves.get("nuclear norm", NUCLEAR, x, mask, about)
        if model is not None:
            bert = _bert(model, batch)
            rows.append(
                {"p_mask": p, "method": "BERT", **stats_row(bert, mask), **stats_paired(bert, solver, mask)}
            )
        for method, st in (("nuclear norm", solver), ("truth", matrix_stats(x, x, mask))):
            rows.append({"p_mask": p, "method": method, **stats_row(st, mask)})
    return pd.DataFrame(rows)


def regularised_table(
    data: DataConfig, lams, n_matrices: int, seed: int, model=None, *, solves: Solves | None = None
) -> pd.DataFrame:
    """E17: per λ, min (1/|Ω|) Σ_Ω (U − X)² + λ‖U‖_* on the same matrices; one row per λ
    (lam, L_obs, L_mask, L and their _se), and a last row "BERT" (lam NaN) if a model is given."""
    solves = SESSION if solves is None else solves
    batch, x, mask, about = _batch(data, n_matrices, seed)
    rows = [
        {
            "method": f"λ = {lam:g}",
            "lam": lam,
            **stats_row(
                solves.get(
                    f"regularised, λ = {lam:g}", (B.regularised_nuclear_norm, {"lam": lam}), x, mask, about
                ),
                mask,
            ),
        }
        for lam in lams
    ]
    if model is not None:
        rows.append({"method": "BERT", "lam": float("nan"), **stats_row(_bert(model, batch), mask)})
    return pd.DataFrame(rows)


E17_LOSSES = ("L_obs", "L_mask", "L")  # the order of mclib.core.paper.PAPER_E17's tuples


def e17_beside_paper(reg: pd.DataFrame) -> pd.DataFrame:
    """`regularised_table`'s λ rows beside the paper's E17 numbers, one row per (λ, loss):
    lam, quantity, ours, se, paper, rel_dev = ours / paper − 1, z = (ours − paper) / se
    (how many of our standard errors the paper's value lies away). λs the paper does not
    report are left out."""

    rows = []
    for r in reg[reg["method"] != "BERT"].to_dict("records"):
        if r["lam"] not in PAPER_E17:
            continue
        for q, theirs in zip(E17_LOSSES, PAPER_E17[r["lam"]]):
            rows.append(
                {
                    "lam": r["lam"],
                    "quantity": q,
                    "ours": r[q],
                    "se": r[f"{q}_se"],
                    "paper": theirs,
                    "rel_dev": r[q] / theirs - 1,
                    "z": (r[q] - theirs) / r[f"{q}_se"],
                }
            )
    return pd.DataFrame(rows)


def ood_table(
    model,
    data: DataConfig,
    n_matrices: int,
    seed: int,
    dists=("uniform", "gaussian", "laplace"),
    *,
    solver_matrices: int | None = None,
    solves: Solves | None = None,
) -> pd.DataFrame:
    """E18: BERT and the E16 solver on matrices with factors from each of `dists`. The solver
    sees the first `solver_matrices` (None: all; 0: none); model None: the solver alone.
    Extra columns: matrices, copy_level (E[X²]), L_mask_rel = L_mask / E[X²], outside (share
    of entries beyond ±rank, values training never showed)."""
    solves = SESSION if solves is None else solves
    d = data
    rows = []
    for dist in dists:
        batch, x, mask, about = _batch(data, n_matrices, seed, dist=dist)
        k = n_matrices if solver_matrices is None else min(solver_matrices, n_matrices)
        methods = [] if model is None else [("BERT", _bert(model, batch), n_matrices)]
        if k > 0:
            methods.append(("nuclear norm", solves.get("nuclear norm", NUCLEAR, x[:k], mask[:k], about), k))
        level = copy_level(d.rank, dist)
        outside = float((np.abs(x) > d.rank).mean())
        for method, st, m in methods:
            row = stats_row(st, mask[:m])
            rows.append(
                {
                    "dist": dist,
                    "method": method,
                    "matrices": m,
                    **row,
                    "copy_level": level,
                    "L_mask_rel": row["L_mask"] / level,
                    "outside": outside,
                }
            )
    return pd.DataFrame(rows)


def classical_methods(rank: int) -> dict[str, tuple[Callable, dict]]:
    """name -> (method, its arguments) of the classical comparison: method(x, mask, **arguments),
    numpy `[b, n, n]` in and out."""
    return {
        "nuclear norm": NUCLEAR,
        f"soft-impute, rank {rank}": (B.soft_impute, {"lam": SOFT_IMPUTE_LAM, "rank": rank}),
        f"ALS, rank {rank}": (B.als_complete, {"rank": rank}),
    }


def classical_table(
    model, data: DataConfig, n_matrices: int, seed: int, *, solves: Solves | None = None
) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """`classical_methods` and BERT (model None: left out) on the same matrices. Returns the
    table (one row per method, `per_matrix.completion_row`'s columns, plus BERT minus that
    method as BERT_d_L, BERT_d_L_mask, BERT_better and their _se) and {method: per-matrix L_mask}."""
    solves = SESSION if solves is None else solves
    batch, x, mask, about = _batch(data, n_matrices, seed)
    stats = {} if model is None else {"BERT": _bert(model, batch)}
    stats.update({k: solves.get(k, how, x, mask, about) for k, how in classical_methods(data.rank).items()})
    rows = []
    for k, st in stats.items():
        row = {"method": k, **stats_row(st, mask)}
        if model is not None and k != "BERT":
            row.update(
                {
                    f"BERT_{q.replace('a_better', 'better')}": v
                    for q, v in stats_paired(stats["BERT"], st, mask).items()
                }
            )
        rows.append(row)
    return pd.DataFrame(rows), {k: matrix_l_mask(st, mask) for k, st in stats.items()}


def main(argv=None) -> None:
    """`python -m mclib.analyses.comparisons [--matrices 2048] [--seed 0]`: E17 on the paper's task
    (CVXPY, Clarabel), printed beside the paper's table (a few minutes for 2048 matrices)."""

    ap = argparse.ArgumentParser(prog="python -m mclib.analyses.comparisons", description=main.__doc__)
    ap.add_argument("--matrices", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    task = paper.task()
    reg = regularised_table(task, list(PAPER_E17), args.matrices, args.seed)
    t = e17_beside_paper(reg)
    print(
        f"E17 on the paper's task ({task.n}x{task.n}, rank {task.rank}, p_mask {task.p_mask:g}, {task.dist} "
        f"factors), {args.matrices} matrices, evaluation seed {args.seed}"
    )
    print(
        t[["lam", "quantity", "ours", "se", "paper", "rel_dev", "z"]].to_string(
            index=False,
            formatters={
                "lam": "{:g}".format,
                "ours": "{:.5g}".format,
                "se": "{:.2g}".format,
                "paper": "{:.5g}".format,
                "rel_dev": "{:+.1%}".format,
                "z": "{:+.1f}".format,
            },
        )
    )


if __name__ == "__main__":
    main()
