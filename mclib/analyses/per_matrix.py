"""A method's per-matrix values on a batch (`matrix_stats`: squared errors summed over the
observed and the masked entries, the nuclear norm), and the rows with standard errors built
from them: all that `mclib.analyses.comparisons` reads, and its solver cache keeps, of a method.

Errors treat matrices as the units: pooled means the ratio estimator's (`evaluate.pooled`);
two methods on the same matrices the paired error of per-matrix differences (`paired`);
means over matrices std / √b; shares √(p(1−p)/b); medians an order-statistic error (`median_se`).
"""

from __future__ import annotations

import numpy as np

from .baselines import nuclear_norm
from .evaluate import pooled_sums


def median_se(values: np.ndarray, z: float = 1.96) -> float:
    """Distribution-free standard error of the median of `values`: half the width between the
    order statistics at ranks b/2 ∓ z√b/2 (an approximate 95 % interval), over z; NaN for < 2 values."""
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


STATS = ("sse_obs", "sse_mask", "nuclear")  # `matrix_stats`: all that a table reads of a method's output


def _arrays(*arrays):
    return [np.asarray(a.numpy() if hasattr(a, "numpy") else a, dtype=float) for a in arrays]


def _counts(mask) -> tuple[np.ndarray, np.ndarray]:
    """`[batch]` numbers of observed and of masked entries of each matrix."""
    m = np.asarray(mask.numpy() if hasattr(mask, "numpy") else mask, dtype=bool).reshape(len(mask), -1)
    c_mask = m.sum(1).astype(float)
    return m.shape[1] - c_mask, c_mask


def matrix_stats(pred, x, mask) -> dict[str, np.ndarray]:
    """Per matrix (`[batch]` each): sse_obs and sse_mask, the sums of (pred − x)² over its
    observed and over its masked entries, and nuclear, the nuclear norm of pred."""
    pred, x, mask = _arrays(pred, x, mask)
    m = mask.astype(bool).reshape(len(x), -1)
    sq = ((pred - x) ** 2).reshape(len(x), -1)
    return {"sse_obs": (sq * ~m).sum(1), "sse_mask": (sq * m).sum(1), "nuclear": nuclear_norm(pred)}


def matrix_l_mask(stats: dict, mask) -> np.ndarray:
    """`[matrices with a masked entry]`: each one's own L_mask, from a method's `matrix_stats`."""
    _, c = _counts(mask)
    return stats["sse_mask"][c > 0] / c[c > 0]


def per_matrix_l_mask(pred: np.ndarray, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`[matrices with a masked entry]`: each matrix's own mean squared error over its masked entries."""
    return matrix_l_mask(matrix_stats(pred, x, mask), mask)


def stats_row(stats: dict, mask) -> dict[str, float]:
    """`completion_row` from a method's `matrix_stats` on the matrices masked by `mask`."""
    c_obs, c_mask = _counts(mask)
    row = {}
    for name, s, c in (
        ("L", stats["sse_obs"] + stats["sse_mask"], c_obs + c_mask),
        ("L_obs", stats["sse_obs"], c_obs),
        ("L_mask", stats["sse_mask"], c_mask),
    ):
        row[name], row[f"{name}_se"] = pooled_sums(s, c)
    per = matrix_l_mask(stats, mask)
    row["median_L_mask"], row["median_L_mask_se"] = float(np.median(per)), median_se(per)
    nuc = stats["nuclear"]
    row["nuclear"], row["nuclear_se"] = float(nuc.mean()), float(nuc.std(ddof=1) / np.sqrt(len(nuc)))
    return row


def completion_row(pred, x, mask) -> dict[str, float]:
    """L, L_obs, L_mask, median per-matrix L_mask and mean nuclear norm of `pred`, each with _se."""
    return stats_row(matrix_stats(pred, x, mask), mask)


def stats_paired(a: dict, b: dict, mask) -> dict[str, float]:
    """`paired` from the two methods' `matrix_stats` on the same matrices."""
    c_obs, c_mask = _counts(mask)
    row = {}
    row["d_L"], row["d_L_se"] = pooled_sums(
        (a["sse_obs"] + a["sse_mask"]) - (b["sse_obs"] + b["sse_mask"]), c_obs + c_mask
    )
    row["d_L_mask"], row["d_L_mask_se"] = pooled_sums(a["sse_mask"] - b["sse_mask"], c_mask)
    better = matrix_l_mask(a, mask) < matrix_l_mask(b, mask)
    row["a_better"] = float(better.mean()) if len(better) else float("nan")
    row["a_better_se"] = share_se(row["a_better"], len(better))
    return row


def paired(pred_a, pred_b, x, mask) -> dict[str, float]:
    """a minus b on the same matrices: d_L, d_L_mask (< 0: a better), a_better (share), each
    with a paired _se."""
    return stats_paired(matrix_stats(pred_a, x, mask), matrix_stats(pred_b, x, mask), mask)
