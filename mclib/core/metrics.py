"""Losses of docs/protocol.md §1.6 and the operational definition of "the drop".

All means are pooled over every entry of the batch (not per-matrix means).
Shapes: pred, x, mask `[batch, n, n]` (or `[batch, n*n]`; they are flattened).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from .data import copy_level

LOSS_NAMES = ("L", "L_obs", "L_mask", "mask_value")
# Where a model's drop is read (`find_drop`'s column), by model.kind: BERT's in L_mask (it
# starts completing); E19's GPT's in L, where the paper reads its drop (it starts copying the
# observed entries; mclib.core.gpt).
DROP_COLUMN = {"bert": "L_mask", "gpt": "L"}
COPIES = 0.1      # a loss below a tenth of E[X²]: the model returns that value (it copies it)
# A single reading on the copying level (`copies`; a chapter's "on the copying plateau" for one
# window mean or one evaluation): L_mask within 20 % of E[X²], the masked outputs near 0, as a
# copying model's. Its partner for a smoothed curve, which holds to 10 % (where the plateau
# begins and ends: placing checkpoints, a drop's shape), is mclib.core.placement.PLATEAU_TOLERANCE.
PLATEAU_BAND = 0.2
# The drop (`find_drop`): the trailing DROP_WINDOW-step mean of L_mask falls below DROP_FRACTION of the
# copying plateau E[X²]. Defined here only; everything that reads a loss "as the drop does" imports them.
DROP_FRACTION = 0.5  # half-way from the copying plateau to a perfect completion
DROP_WINDOW = 50     # steps of the trailing mean: one batch alone is too noisy to decide on


def _masked_mean(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    # NaN when `where` is empty (e.g. p_mask = 0), rather than a silent 0.
    return (values * where).sum() / where.sum()


def squared_errors(pred: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`[run, batch·n·n]`: (X̂ - X)² of every entry, in fp32. pred `[run, batch, seq]` (or
    `[run, batch, n, n]`), x `[run, batch, n, n]`. Their mean over all entries is L, the loss
    that training differentiates (mclib.core.step.device_step); `run_losses` reads the rest
    from the same values."""
    return (pred.float().flatten(1) - x.flatten(1)) ** 2


def run_losses(pred: torch.Tensor, x: torch.Tensor, mask: torch.Tensor,
               sq: torch.Tensor | None = None) -> torch.Tensor:
    """`[run, 4]`: L (all entries), L_obs (Ω), L_mask (Ωᶜ) and mask value (mean |X̂| over Ωᶜ),
    in the order of LOSS_NAMES, of each run, pooled over its batch. pred `[run, batch, seq]`
    (or `[run, batch, n, n]`), x and mask `[run, batch, n, n]` (mask True = masked).
    sq: `squared_errors(pred, x)` where the caller has them already (the training step, which
    differentiated their mean), so they are not computed twice.
    NaN where a set is empty (e.g. p_mask = 0), rather than a silent 0."""
    sq = squared_errors(pred, x) if sq is None else sq
    pred, mask = pred.float().flatten(1), mask.flatten(1)
    obs, msk = (~mask).float(), mask.float()
    return torch.stack([sq.mean(1),
                        (sq * obs).sum(1) / obs.sum(1),
                        (sq * msk).sum(1) / msk.sum(1),
                        (pred.abs() * msk).sum(1) / msk.sum(1)], dim=1)


def losses(pred: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The four losses of one batch (`run_losses` of a single run), as 0-d tensors by name."""
    return dict(zip(LOSS_NAMES, run_losses(pred[None], x[None], mask[None])[0]))


def mse_to(pred: torch.Tensor, target: torch.Tensor, where: torch.Tensor) -> float:
    """Pooled MSE between pred and any target over the entries in `where` (e.g. L'_mask)."""
    return _masked_mean((pred.float().flatten(1) - target.flatten(1)) ** 2, where.flatten(1)).item()


def find_drop(metrics: pd.DataFrame, rank: int = 2, frac: float = DROP_FRACTION, window: int = DROP_WINDOW,
              column: str = "L_mask") -> int | None:
    """The step of the drop, or None if there is none.

    Definition (used everywhere in the project): the first step at which the trailing
    mean of `column` over `window` steps falls below `frac` × the copying plateau,
    the plateau being E[X²] = rank/9 (the L_mask of a model that outputs 0 at masked
    entries; measured plateaus sit within a few percent of it). The trailing mean
    makes a single lucky batch not count; it delays the reported step by up to
    `window`/2 steps compared with the unsmoothed curve.
    """
    threshold = frac * copy_level(rank)
    smooth = metrics[column].rolling(window, min_periods=window).mean()
    below = np.flatnonzero((smooth < threshold).to_numpy())
    return int(metrics["step"].iloc[below[0]]) if len(below) else None


def drop_column(profile) -> str:
    """The loss column in which the drop of a run of `profile` (a `mclib.core.config.Profile`) is
    read: `DROP_COLUMN` of its `model.kind`."""
    return DROP_COLUMN[profile.model.kind]


def rows_curve(rows: list[dict]) -> pd.DataFrame:
    """Metric rows (as `mclib.core.train` keeps them between flushes) as a curve: step, L, L_mask;
    what a `stop` reads the drop and the convergence rule from."""
    return pd.DataFrame({k: [r[k] for r in rows] for k in ("step", "L", "L_mask")})



def window_mean(metrics: pd.DataFrame, step: int, window: int = DROP_WINDOW) -> pd.Series:
    """Every column's mean over the `window` steps ending at `step` (one batch is noisy;
    by default the drop's window, so a loss at a step is read as `find_drop` reads it);
    NaN where the run has no step in that window."""
    return metrics[(metrics["step"] > step - window) & (metrics["step"] <= step)].mean(numeric_only=True)


def copies(L_obs: float, L_mask: float, level: float) -> bool:
    """The model copies its input (the plateau's behaviour, paper §3.1): the observed
    entries come back (L_obs < COPIES·E[X²]) and the masked outputs stay near 0 (L_mask
    within PLATEAU_BAND of E[X²] = `level`, `copy_level`)."""
    return L_obs < COPIES * level and abs(L_mask / level - 1) < PLATEAU_BAND


def last_tenth(metrics: pd.DataFrame) -> pd.DataFrame:
    """The rows of the last 10 % of steps (at least one): where every "final" loss is read."""
    return metrics.tail(max(1, len(metrics) // 10))


def plateau_stats(metrics: pd.DataFrame, drop: int | None, copy_from: int | None = None) -> dict[str, float]:
    """Mean L_obs and L_mask over the plateau (steps in (copy_from, drop)) and over the last 10% of steps.
    copy_from None: min(200, a quarter of the run), past the first fall to the copying level."""
    last = int(metrics["step"].max())
    if copy_from is None:
        copy_from = min(200, last // 4)
    end = drop if drop is not None else last + 1
    plateau = metrics[(metrics["step"] > copy_from) & (metrics["step"] < end)]
    tail = last_tenth(metrics)
    return {
        "plateau_L_obs": float(plateau["L_obs"].mean()),
        "plateau_L_mask": float(plateau["L_mask"].mean()),
        "final_L_obs": float(tail["L_obs"].mean()),
        "final_L_mask": float(tail["L_mask"].mean()),
    }


# The convergence rule's fit (`converged`, `end_slope`): log L_mask is fitted against the
# step over SLOPE_BLOCKS block means (block means, not single batches: nearly independent,
# so the fit's error is honest), and the run counts as flat only when even the pessimistic
# end of the fitted fall, rate - CONVERGED_Z · error, is under train.min_improvement per
# 1 000 steps. Noise widens the error and so delays the verdict: it cannot fire the rule.
SLOPE_BLOCKS = 10
CONVERGED_Z = 2.0


def fitted_slope(block_means: np.ndarray, block_steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares slope of log(block mean) against the block's step, per row of
    `block_means` `[fit, block]` (`block_steps` `[block]`, shared by every fit): (relative
    change per 1 000 steps, its standard error), each `[fit]`. -0.1 = falling 10 % per
    1 000 steps. The error is the ordinary least-squares one (residual variance over
    blocks - 2 degrees of freedom), as numpy.polyfit(..., cov=True) gives it."""
    x = np.asarray(block_steps, dtype=float) / 1000
    y = np.log(np.atleast_2d(np.asarray(block_means, dtype=float)))
    dx = x - x.mean()
    sxx = (dx ** 2).sum()
    b = (y * dx).sum(axis=1) / sxx
    residual = y - y.mean(axis=1, keepdims=True) - b[:, None] * dx
    se_b = np.sqrt((residual ** 2).sum(axis=1) / (len(x) - 2) / sxx)
    return np.expm1(b), np.exp(b) * se_b


def end_slope(metrics: pd.DataFrame, window: int = 2000, column: str = "L_mask",
              blocks: int = SLOPE_BLOCKS) -> tuple[float, float]:
    """How fast `column` still moved at the end of the run: (relative change per 1 000
    steps, its standard error), `fitted_slope` over the last `window` steps cut into
    `blocks` blocks. NaN where the run is shorter than `blocks` steps."""
    tail = metrics.tail(window)
    if len(tail) < blocks:
        return float("nan"), float("nan")
    parts = np.array_split(np.arange(len(tail)), blocks)
    x = np.array([tail["step"].to_numpy()[i].mean() for i in parts])
    y = np.array([tail[column].to_numpy(dtype=float)[i].mean() for i in parts])
    rate, se = fitted_slope(y, x)
    return float(rate[0]), float(se[0])


def final_level(metrics: pd.DataFrame, window: int = 2000, column: str = "L_mask",
                blocks: int = SLOPE_BLOCKS) -> tuple[float, float]:
    """Where `column` ended: its mean over the last `window` steps and the standard error
    of that mean from `blocks` block means (batches are not independent of their
    neighbours' noise, block means nearly are). NaN for fewer than `blocks` rows."""
    tail = metrics.tail(window)[column].to_numpy(dtype=float)
    if len(tail) < blocks:
        return float("nan"), float("nan")
    means = np.array([part.mean() for part in np.array_split(tail, blocks)])
    return float(tail.mean()), float(means.std(ddof=1) / np.sqrt(blocks))


def converged(metrics: pd.DataFrame, rank: int = 2, patience: int = 2000, min_improvement: float = 0.05,
              column: str = "L_mask", *, blocks: int = SLOPE_BLOCKS, z: float = CONVERGED_Z) -> int | None:
    """The step at which the run counts as converged, or None if it has not.

    Rule (the end of training for `train.until: converged`): the first step s, among the
    ends of blocks of `patience // blocks` steps, such that
    - the run dropped (`find_drop`, at step d) at least `patience` steps before s, so the
      whole window lies after the drop: a plateau (flat but not learned) never counts;
    - over the window of the last `patience` steps (s - patience, s], cut into `blocks`
      blocks, the fitted fall of `column` (`fitted_slope`) is less than
      `min_improvement` per 1 000 steps even at its pessimistic end:
      rate - z · error > -min_improvement.
    A noisy window has a wide error and so does not count as flat: noise can delay the
    end, not bring it forward. `metrics` has one row per step (`metrics.csv`), in order.
    """
    drop = find_drop(metrics, rank=rank, column=column)
    if drop is None:
        return None
    block = max(1, patience // blocks)
    steps = metrics["step"].to_numpy()
    values = metrics[column].to_numpy(dtype=float)
    if len(values) < block * blocks:
        return None
    cumsum = np.concatenate([[0.0], np.cumsum(values)])
    means = (cumsum[block:] - cumsum[:-block]) / block   # means[j]: rows j .. j+block-1
    # the candidate ends s: rows i (the last row of the window) at a block boundary
    last = np.arange(block * blocks - 1, len(values))
    last = last[(steps[last] % block == 0) & (steps[last] - block * blocks >= drop)]
    if not len(last):
        return None
    starts = last[:, None] - block * blocks + 1 + block * np.arange(blocks)[None, :]   # [candidate, block]
    centre = (np.arange(blocks) + 0.5) * block                                          # the same for every window
    rate, se = fitted_slope(means[starts], centre)
    hits = np.flatnonzero(rate - z * se > -min_improvement)
    return int(steps[last[hits[0]]]) if len(hits) else None

