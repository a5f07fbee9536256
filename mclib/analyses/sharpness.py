"""How abrupt a drop is: how long the loss sat on its plateau, and how quickly it fell,
from one run's `metrics.csv` (E19's GPT and the BERT runs alike).

    plateau  from the first step at which the loss's trailing mean is on the plateau
             (within `band` of the copying level E[X²]) to the last step before the drop
             at which it still is (>= (1 - band)·E[X²]): where it leaves the plateau
    drop     `mclib.core.metrics.find_drop`: the trailing mean falls below half of E[X²]
    fall     from leaving the plateau to the first step after the drop at which the
             trailing mean is within `settle` × its final level (the mean over the run's
             last 10 %, `last_tenth`)

A drop is sudden when plateau / fall exceeds `ABRUPT`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.data import copy_level
from ..core.metrics import DROP_WINDOW, find_drop, last_tenth
from ..core.placement import FINAL_FACTOR, PLATEAU_TOLERANCE

# on the plateau: the smoothed curve within 10 % of E[X²], as the checkpoints are placed
BAND = PLATEAU_TOLERANCE
SETTLE = FINAL_FACTOR  # the fall ends within 2x the final level, where the transition's checkpoints end
ABRUPT = 1.0  # sudden: plateau steps over fall steps above this
WINDOW = DROP_WINDOW  # the trailing mean's window: the drop's (`find_drop`)


@dataclass
class Shape:
    """One run's plateau and fall, in steps (see the module's doc)."""

    start: int  # first step on the plateau
    left: int  # last step on the plateau before the drop
    drop: int
    settled: int  # first step after the drop within SETTLE x the final level
    final: float  # the final level (mean of the column over the last 10 % of steps)

    @property
    def plateau(self) -> int:
        return self.left - self.start

    @property
    def fall(self) -> int:
        return max(1, self.settled - self.left)

    @property
    def ratio(self) -> float:
        """Plateau steps over fall steps: above ABRUPT, the drop is sudden."""
        return self.plateau / self.fall


def shape(
    metrics: pd.DataFrame,
    rank: int,
    column: str = "L_mask",
    band: float = BAND,
    settle: float = SETTLE,
    *,
    window: int = WINDOW,
) -> Shape | None:
    """The plateau and fall of `column` in one run (None: no drop, or no plateau before it)."""
    drop = find_drop(metrics, rank=rank, column=column, window=window)
    if drop is None:
        return None
    level = copy_level(rank)
    steps = metrics["step"].to_numpy()
    smooth = metrics[column].rolling(window, min_periods=window).mean().to_numpy()
    before = steps <= drop
    on = before & (np.abs(smooth / level - 1) <= band)
    if not on.any():
        return None
    start = int(steps[np.flatnonzero(on)[0]])
    high = before & (smooth >= (1 - band) * level)
    left = int(steps[np.flatnonzero(high)[-1]])
    final = float(last_tenth(metrics)[column].mean())
    after = (steps >= drop) & (smooth <= settle * final)
    settled = int(steps[np.flatnonzero(after)[0]]) if after.any() else int(steps[-1])
    return Shape(start, left, drop, settled, final)


def shapes_table(curves: dict, rank: int, column: str = "L_mask") -> pd.DataFrame:
    """One row per run (`curves`: label -> metrics): plateau, fall and their ratio, the
    drop step, and the final level; NaN where the run has no drop."""
    rows = []
    for label, m in curves.items():
        s = shape(m, rank, column)
        rows.append(
            {
                "run": label,
                "drop": None if s is None else s.drop,
                "plateau (steps)": np.nan if s is None else s.plateau,
                "fall (steps)": np.nan if s is None else s.fall,
                "plateau / fall": 0.0 if s is None else round(s.ratio, 2),
                f"final {column}": float(last_tenth(m)[column].mean()),
            }
        )
    table = pd.DataFrame(rows)
    table["drop"] = pd.array(table["drop"], dtype="Int64")
    return table
