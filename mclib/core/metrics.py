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
# Where a model's drop is read (`find_drop`'s column): BERT's in L_mask; E19's GPT's in L, as the paper does.
DROP_COLUMN = {"bert": "L_mask", "gpt": "L"}
COPIES = 0.1  # a loss below a tenth of E[X²]: the model returns that value (it copies it)
# One reading is on the copying plateau (`copies`) with L_mask within 20 % of E[X²]; a smoothed
# curve's tolerance is mclib.core.placement.PLATEAU_TOLERANCE (10 %).
PLATEAU_BAND = 0.2
# The drop (`find_drop`), defined here only: the trailing DROP_WINDOW-step mean below DROP_FRACTION·E[X²].
DROP_FRACTION = 0.5  # half-way from the copying plateau to a perfect completion
DROP_WINDOW = 50  # steps of the trailing mean: one batch alone is too noisy to decide on


def _masked_mean(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    # NaN when `where` is empty (e.g. p_mask = 0), rather than a silent 0.
    return (values * where).sum() / where.sum()


def squared_errors(pred: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`[run, batch·n·n]` fp32 (X̂ - X)² of pred `[run, batch, seq or n, n]` against x; their mean is L."""
    return (pred.float().flatten(1) - x.flatten(1)) ** 2


def run_losses(
    pred: torch.Tensor, x: torch.Tensor, mask: torch.Tensor, sq: torch.Tensor | None = None
) -> torch.Tensor:
    """`[run, 4]`: L (all entries), L_obs (Ω), L_mask (Ωᶜ) and mask value (mean |X̂| over Ωᶜ), in
    LOSS_NAMES' order, pooled over each run's batch. pred `[run, batch, seq or n, n]`, x and mask
    `[run, batch, n, n]` (True = masked); sq: `squared_errors(pred, x)` if already computed.
    NaN where a set is empty (e.g. p_mask = 0)."""
    sq = squared_errors(pred, x) if sq is None else sq
    pred, mask = pred.float().flatten(1), mask.flatten(1)
    obs, msk = (~mask).float(), mask.float()
    return torch.stack(
        [
            sq.mean(1),
            (sq * obs).sum(1) / obs.sum(1),
            (sq * msk).sum(1) / msk.sum(1),
            (pred.abs() * msk).sum(1) / msk.sum(1),
        ],
        dim=1,
    )


def losses(pred: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The four losses of one batch (`run_losses` of a single run), as 0-d tensors by name."""
    return dict(zip(LOSS_NAMES, run_losses(pred[None], x[None], mask[None])[0]))


def mse_to(pred: torch.Tensor, target: torch.Tensor, where: torch.Tensor) -> float:
    """Pooled MSE between pred and any target over the entries in `where` (e.g. L'_mask)."""
    return _masked_mean((pred.float().flatten(1) - target.flatten(1)) ** 2, where.flatten(1)).item()


def find_drop(
    metrics: pd.DataFrame,
    rank: int = 2,
    frac: float = DROP_FRACTION,
    window: int = DROP_WINDOW,
    column: str = "L_mask",
) -> int | None:
    """The step of the drop, or None: the first step at which the trailing `window`-step mean of
    `column` falls below `frac` × E[X²] = rank/9 (the copying plateau), a definition used
    everywhere in the project; the mean lags the raw curve by up to `window`/2 steps."""
    threshold = frac * copy_level(rank)
    smooth = metrics[column].rolling(window, min_periods=window).mean()
    below = np.flatnonzero((smooth < threshold).to_numpy())
    return int(metrics["step"].iloc[below[0]]) if len(below) else None


def drop_column(profile) -> str:
    """The loss column the drop of a run of `profile` is read in (`DROP_COLUMN[model.kind]`)."""
    return DROP_COLUMN[profile.model.kind]


def rows_curve(rows: list[dict]) -> pd.DataFrame:
    """Metric rows as a curve (step, L, L_mask), the form `find_drop` and `converged` read."""
    return pd.DataFrame({k: [r[k] for r in rows] for k in ("step", "L", "L_mask")})


def window_mean(metrics: pd.DataFrame, step: int, window: int = DROP_WINDOW) -> pd.Series:
    """Every column's mean over the `window` steps ending at `step` (NaN where there are none)."""
    return metrics[(metrics["step"] > step - window) & (metrics["step"] <= step)].mean(numeric_only=True)


def copies(L_obs: float, L_mask: float, level: float) -> bool:
    """Whether a model copies its input (paper §3.1): L_obs < COPIES·`level` and L_mask within
    PLATEAU_BAND of it."""
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


# The convergence rule's fit (`converged`, `end_slope`): log L_mask against step over SLOPE_BLOCKS
# block means (nearly independent, unlike single batches, so the error is honest); noise widens
# the error and can only delay the verdict (rate - CONVERGED_Z · error must clear the bar).
SLOPE_BLOCKS = 10
CONVERGED_Z = 2.0


def fitted_slope(block_means: np.ndarray, block_steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares slope of log(block mean) against step, per row of `block_means` `[fit, block]`
    (`block_steps` `[block]`): (relative change per 1 000 steps, its OLS standard error), each
    `[fit]`; -0.1 = falling 10 % per 1 000 steps."""
    x = np.asarray(block_steps, dtype=float) / 1000
    y = np.log(np.atleast_2d(np.asarray(block_means, dtype=float)))
    dx = x - x.mean()
    sxx = (dx**2).sum()
    b = (y * dx).sum(axis=1) / sxx
    residual = y - y.mean(axis=1, keepdims=True) - b[:, None] * dx
    se_b = np.sqrt((residual**2).sum(axis=1) / (len(x) - 2) / sxx)
    return np.expm1(b), np.exp(b) * se_b


def end_slope(
    metrics: pd.DataFrame, window: int = 2000, column: str = "L_mask", blocks: int = SLOPE_BLOCKS
) -> tuple[float, float]:
    """How fast `column` still moved at the run's end: `fitted_slope` over the last `window` steps
    in `blocks` blocks; NaN for fewer than `blocks` rows."""
    tail = metrics.tail(window)
    if len(tail) < blocks:
        return float("nan"), float("nan")
    parts = np.array_split(np.arange(len(tail)), blocks)
    x = np.array([tail["step"].to_numpy()[i].mean() for i in parts])
    y = np.array([tail[column].to_numpy(dtype=float)[i].mean() for i in parts])
    rate, se = fitted_slope(y, x)
    return float(rate[0]), float(se[0])


def final_level(
    metrics: pd.DataFrame, window: int = 2000, column: str = "L_mask", blocks: int = SLOPE_BLOCKS
) -> tuple[float, float]:
    """Where `column` ended: its mean over the last `window` steps and that mean's standard error
    from `blocks` block means; NaN for fewer than `blocks` rows."""
    tail = metrics.tail(window)[column].to_numpy(dtype=float)
    if len(tail) < blocks:
        return float("nan"), float("nan")
    means = np.array([part.mean() for part in np.array_split(tail, blocks)])
    return float(tail.mean()), float(means.std(ddof=1) / np.sqrt(blocks))


def converged(
    metrics: pd.DataFrame,
    rank: int = 2,
    patience: int = 2000,
    min_improvement: float = 0.05,
    column: str = "L_mask",
    *,
    blocks: int = SLOPE_BLOCKS,
    z: float = CONVERGED_Z,
    confirm: bool = True,
) -> int | None:
    """The step at which the run counts as converged (`train.until: converged`), or None.

    A flat window: a block end s1 at least `patience` steps after the drop where, over
    (s1 - patience, s1] in `blocks` blocks, the fitted fall of `column` is under
    `min_improvement` per 1 000 steps even at its pessimistic end (rate - z·error > -min_improvement).
    With `confirm` (the rule), the run ends at s = s1 + patience, the first such end whose next
    window (s1, s] confirms it: its mean lies below the flat window's by less than the bar over
    `patience` steps, 1 - (1 - min_improvement)^(patience/1000) (9.75 % for 2 000 steps at 5 %). A
    pause inside the fall (a shoulder) passes the first test and fails the second. The second test
    reads the two means as they are: at the pessimistic end it would almost never pass (the two
    means' error is 4-7 % on the default profile's runs), and the first test already holds noise
    back. confirm=False: s1, the flat window alone. `metrics`: one row per step."""
    drop = find_drop(metrics, rank=rank, column=column)
    if drop is None:
        return None
    block = max(1, patience // blocks)
    steps = metrics["step"].to_numpy()
    values = metrics[column].to_numpy(dtype=float)
    if len(values) < block * blocks:
        return None
    cumsum = np.concatenate([[0.0], np.cumsum(values)])
    means = (cumsum[block:] - cumsum[:-block]) / block  # means[j]: rows j .. j+block-1
    # the candidate ends s1: rows i (the last row of the window) at a block boundary
    last = np.arange(block * blocks - 1, len(values))
    last = last[(steps[last] % block == 0) & (steps[last] - block * blocks >= drop)]
    if not len(last):
        return None
    starts = last[:, None] - block * blocks + 1 + block * np.arange(blocks)[None, :]  # [candidate, block]
    centre = (np.arange(blocks) + 0.5) * block  # the same for every window
    block_means = means[starts]  # [candidate, block]
    rate, se = fitted_slope(block_means, centre)
    flat = np.flatnonzero(rate - z * se > -min_improvement)
    if not confirm:
        return int(steps[last[flat[0]]]) if len(flat) else None
    level = block_means.mean(axis=1)  # the window's mean, [candidate]
    bar = 1 - (1 - min_improvement) ** (patience / 1000)
    position = {int(s): k for k, s in enumerate(steps[last])}
    for a in flat:
        b = position.get(int(steps[last[a]]) + block * blocks)
        if b is None:
            continue  # the next window is not trained yet (or lies past the curve)
        if 1 - level[b] / level[a] < bar:
            return int(steps[last[b]])
    return None
