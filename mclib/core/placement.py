"""Where a run's analysis checkpoints sit: pre on the plateau, the transition around the drop,
post at the end. `checkpoint_steps` reads a trained run and places them (`place_checkpoints`)
from its measured drop or the profile's fixed steps: the one definition the analyses and the book read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .checkpoints import damaged_steps, saved_steps, set_aside_dirs
from .config import Checkpoints, Profile
from .data import copy_level
from .metrics import find_drop
from .runs import CHECKPOINTS, load_metrics, run_profile


@dataclass
class CheckpointSteps(Checkpoints):
    """The analysis checkpoints of one run (pre, transition, post, as `Checkpoints`), plus how:
    place "drop" or "fixed"; note, one sentence saying which and why; drop (`find_drop`, or None);
    left_plateau, near_final: the bounds of the transition window (None with "fixed"); skipped:
    saved checkpoints that cannot be read, with why; set_aside: folders training set aside."""

    note: str = ""
    drop: int | None = None
    left_plateau: int | None = None
    near_final: int | None = None
    saved: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(
        default_factory=dict
    )  # saved checkpoints that cannot be read (`damaged_steps`)
    set_aside: list[str] = field(
        default_factory=list
    )  # checkpoints/damaged-step_N folders (`set_aside_dirs`)


PRE_FRACTION = 0.3  # pre: at most this fraction of the drop step (the paper: 4 000 of ~15 000)
# "On the plateau" for a smoothed curve: L_mask within 10 % of E[X²] (one reading: metrics.PLATEAU_BAND)
PLATEAU_TOLERANCE = 0.1
FINAL_FACTOR = 2.0  # transition ends where smoothed L_mask is within 2x its final level
MAX_TRANSITION = 4  # transition checkpoints at most (the paper has 4)
PLACE_WINDOW = 200  # steps of the trailing mean used to place them


def place_checkpoints(
    metrics: pd.DataFrame,
    saved: list[int],
    rank: int,
    fixed: Checkpoints,
    place: str = "drop",
    *,
    window: int = PLACE_WINDOW,
) -> CheckpointSteps:
    """Choose the analysis checkpoints among a run's `saved` steps from its metrics.

    place "drop" (the run has a drop d), with L_mask smoothed by a trailing `window`-step mean:
      pre         the latest saved step <= PRE_FRACTION·d on the copying plateau (within
                  PLATEAU_TOLERANCE of E[X²] = rank/9); else the latest such step before the model
                  leaves the plateau; else the first saved step
      transition  up to MAX_TRANSITION saved steps spread evenly from where the model leaves the
                  plateau (the last step before d at >= 90 % of E[X²]) to where L_mask is within
                  FINAL_FACTOR of its final level; pre and post excluded; never empty
      post        the last saved step
    place "fixed", or no drop: `fixed`'s steps, capped at the last saved step; `note` says why."""
    saved = sorted(saved)
    if not saved:
        raise ValueError("the run has no saved checkpoint")
    last = saved[-1]
    drop = find_drop(metrics, rank=rank)

    def fixed_steps(note: str) -> CheckpointSteps:
        post = min(fixed.post, last)
        return CheckpointSteps(
            place="fixed",
            pre=min(fixed.pre, last),
            transition=[s for s in fixed.transition if s < post],
            post=post,
            note=note,
            drop=drop,
            saved=saved,
        )

    if place == "fixed":
        return fixed_steps("the profile's fixed steps (checkpoints.place: fixed)")
    if drop is None:
        return fixed_steps("the run did not drop, so the profile's fixed steps stand in")
    plateau = copy_level(rank)
    smooth = metrics.set_index("step")["L_mask"].rolling(window, min_periods=1).mean()
    at = lambda s: float(smooth.loc[:s].iloc[-1])  # the trailing mean at step s
    before = smooth.loc[:drop]
    high = before[before >= (1 - PLATEAU_TOLERANCE) * plateau]
    left = int(high.index[-1]) if len(high) else int(before.index[0])
    on_plateau = [s for s in saved if s <= left and abs(at(s) / plateau - 1) <= PLATEAU_TOLERANCE]
    early = [s for s in on_plateau if s <= PRE_FRACTION * drop]
    pre = early[-1] if early else on_plateau[-1] if on_plateau else saved[0]
    final = at(last)
    after = smooth.loc[drop:]
    near = after[after <= FINAL_FACTOR * final]
    near_final = int(near.index[0]) if len(near) else last
    start = max([s for s in saved if s <= left], default=saved[0])
    end = min([s for s in saved if s >= near_final], default=last)
    window_steps = [s for s in saved if start <= s <= end and s not in (pre, last)]
    if len(window_steps) > MAX_TRANSITION:
        idx = np.linspace(0, len(window_steps) - 1, MAX_TRANSITION).round().astype(int)
        window_steps = [window_steps[i] for i in sorted(set(idx))]
    if not window_steps:
        inner = [s for s in saved if s not in (pre, last)] or saved
        window_steps = [min(inner, key=lambda s: abs(s - drop))]
    return CheckpointSteps(
        place="drop",
        pre=pre,
        transition=window_steps,
        post=last,
        note=f"placed from the run's drop at step {drop:,}",
        drop=drop,
        left_plateau=left,
        near_final=near_final,
        saved=saved,
    )


def checkpoint_steps(run_dir: str | Path, profile: Profile | None = None) -> CheckpointSteps:
    """The analysis checkpoints of the run in `run_dir` (`place_checkpoints`, with the profile's
    `checkpoints.place`; profile: default the run's own), among its readable saved steps."""
    run_dir = Path(run_dir)
    profile = profile or run_profile(run_dir)
    done = saved_steps(run_dir)
    if not done:
        raise FileNotFoundError(f"no checkpoint in {run_dir}: the run has not started")
    metrics = load_metrics(run_dir)
    metrics = metrics[metrics["step"] <= done[-1]]
    skipped = damaged_steps(run_dir)
    fixed = profile.checkpoints
    # a fixed step that cannot be read: the transition goes without it, pre and post take the saved
    # step before
    if skipped:
        before = lambda s: s if s not in skipped else max([d for d in done if d < s], default=done[0])
        fixed = dataclasses.replace(
            fixed,
            pre=before(fixed.pre),
            post=before(fixed.post),
            transition=[t for t in fixed.transition if t not in skipped],
        )
    steps = place_checkpoints(metrics, done, profile.data.rank, fixed, profile.checkpoints.place)
    steps.skipped = skipped
    steps.set_aside = [f"{CHECKPOINTS}/{d.name}" for d in set_aside_dirs(run_dir)]
    return steps
