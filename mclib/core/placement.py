"""Where a run's analysis checkpoints sit: pre on the plateau, the transition around the drop, post at the end.

`checkpoint_steps` reads a trained run (its saved checkpoints and metrics, `mclib.core.runs`,
`mclib.core.checkpoints`) and places them with `place_checkpoints`, from the run's measured
drop (`checkpoints.place: drop`) or the profile's fixed steps (`place: fixed`, or a run
without a drop): the one definition of checkpoint placement, which the analyses and the
book read.
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
    """The analysis checkpoints of one run, as `checkpoint_steps` chose them: pre,
    transition and post (with `all_steps()`, as `Checkpoints`), plus how.

    place: "drop" (placed from the measured drop) or "fixed" (the profile's steps)
    note: one sentence saying which, and why ("the run did not drop: ...")
    drop: `find_drop`'s step (None: no drop); left_plateau, near_final: the steps that
    bound the transition window (None with place "fixed"); skipped: the saved checkpoints
    left out because a file of theirs cannot be read, each with which and why; set_aside:
    the run folder's checkpoints that training set aside as unreadable when it resumed."""
    note: str = ""
    drop: int | None = None
    left_plateau: int | None = None
    near_final: int | None = None
    saved: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)  # saved checkpoints that cannot be read (`damaged_steps`)
    set_aside: list[str] = field(default_factory=list)  # checkpoints/damaged-step_N folders (`set_aside_dirs`)


PRE_FRACTION = 0.3        # pre: at most this fraction of the drop step (the paper: 4 000 of ~15 000)
# "On the plateau" for a smoothed curve, step by step (a trailing mean: PLACE_WINDOW steps here,
# the drop's window in mclib.analyses.sharpness): L_mask within 10 % of the copying level E[X²];
# where the plateau begins and ends. Its partner for a single reading, 20 %, is
# mclib.core.metrics.PLATEAU_BAND.
PLATEAU_TOLERANCE = 0.1
FINAL_FACTOR = 2.0        # transition ends where smoothed L_mask is within 2x its final level
MAX_TRANSITION = 4        # transition checkpoints at most (the paper has 4)
PLACE_WINDOW = 200        # steps of the trailing mean used to place them


def place_checkpoints(metrics: pd.DataFrame, saved: list[int], rank: int, fixed: Checkpoints,
                      place: str = "drop", *, window: int = PLACE_WINDOW) -> CheckpointSteps:
    """Choose the analysis checkpoints among the `saved` steps of a run from its metrics.

    place "drop" (the run has a drop d = `find_drop`):
      pre         the latest saved step at or before PRE_FRACTION·d (0.3 d; the paper's pre
                  is step 4 000 of a ~15 000-step plateau) at which the model is on the
                  copying plateau (trailing `window`-step mean of L_mask within 10 % of
                  E[X²] = rank/9); if none qualifies, the latest such step before the model
                  leaves the plateau, else the first saved step
      transition  up to MAX_TRANSITION (4) saved steps spread evenly (by index) from the
                  last saved step at or before the model leaves the plateau (the last step
                  before d whose trailing mean is >= 90 % of E[X²]) to the first saved step
                  at which the trailing mean is within 2x the final level (its value at the
                  run's last step); pre and post excluded; never empty (the saved step
                  nearest d when the window holds none)
      post        the last saved step: the end of training (converged, or the cap)
    place "fixed", or a run without a drop: `fixed`'s steps (the profile's `checkpoints`),
    those past the last saved step left out and post at most the last saved step; `note`
    says which and why.
    """
    saved = sorted(saved)
    if not saved:
        raise ValueError("the run has no saved checkpoint")
    last = saved[-1]
    drop = find_drop(metrics, rank=rank)

    def fixed_steps(note: str) -> CheckpointSteps:
        post = min(fixed.post, last)
        return CheckpointSteps(place="fixed", pre=min(fixed.pre, last),
                               transition=[s for s in fixed.transition if s < post], post=post,
                               note=note, drop=drop, saved=saved)

    if place == "fixed":
        return fixed_steps("the profile's fixed steps (checkpoints.place: fixed)")
    if drop is None:
        return fixed_steps("the run did not drop, so the profile's fixed steps stand in")
    plateau = copy_level(rank)
    smooth = metrics.set_index("step")["L_mask"].rolling(window, min_periods=1).mean()
    at = lambda s: float(smooth.loc[:s].iloc[-1])   # the trailing mean at step s
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
    return CheckpointSteps(place="drop", pre=pre, transition=window_steps, post=last,
                           note=f"placed from the run's drop at step {drop:,}", drop=drop, left_plateau=left,
                           near_final=near_final, saved=saved)


def checkpoint_steps(run_dir: str | Path, profile: Profile | None = None) -> CheckpointSteps:
    """The pre-shift, transition and post-shift checkpoints of the run in `run_dir`, placed
    by `place_checkpoints` from its measured drop (profile `checkpoints.place: drop`) or
    the profile's fixed steps (`place: fixed`, or a run without a drop); profile: default
    the run's own profile.yaml. Read after training: the steps are among the saved ones."""
    run_dir = Path(run_dir)
    profile = profile or run_profile(run_dir)
    done = saved_steps(run_dir)
    if not done:
        raise FileNotFoundError(f"no checkpoint in {run_dir}: the run has not started")
    metrics = load_metrics(run_dir)
    metrics = metrics[metrics["step"] <= done[-1]]
    skipped = damaged_steps(run_dir)
    fixed = profile.checkpoints
    if skipped:  # a fixed step that cannot be read: the transition goes without it, pre and post take the saved step before
        before = lambda s: s if s not in skipped else max([d for d in done if d < s], default=done[0])
        fixed = dataclasses.replace(fixed, pre=before(fixed.pre), post=before(fixed.post),
                                    transition=[t for t in fixed.transition if t not in skipped])
    steps = place_checkpoints(metrics, done, profile.data.rank, fixed, profile.checkpoints.place)
    steps.skipped = skipped
    steps.set_aside = [f"{CHECKPOINTS}/{d.name}" for d in set_aside_dirs(run_dir)]
    return steps
