"""Part of chapter 01_train: the sentences it writes about the run. Where the analysis checkpoints
sit and why (and which saved ones were skipped or set aside), the shape of L_mask's drop (one
stretch, or a pause on a shoulder), why training ended and how fast L_mask still moved there.
Each is built from the run's numbers, never typed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..analyses.sharpness import SETTLE
from ..book.chapter import Chapter
from ..book.scorecard_stage import is_cut
from ..core.metrics import CONVERGED_Z, DROP_FRACTION, SLOPE_BLOCKS, end_slope, last_tenth
from ..core.placement import FINAL_FACTOR, PLACE_WINDOW, PLATEAU_TOLERANCE, PRE_FRACTION


def skipped_text(ch: Chapter) -> str:
    """Sentences naming the saved checkpoints skipped as unreadable and those training set aside
    when it resumed (`CheckpointSteps`); "" when there are none."""
    skipped, aside = ch.steps.skipped, ch.steps.set_aside
    out = ""
    if skipped:
        which = "; ".join(f"step {step:,} ({why})" for step, why in sorted(skipped.items()))
        out += (
            f" The book skipped the saved checkpoint{'s' if len(skipped) > 1 else ''} at {which}, "
            "and reads the others."
        )
    if aside:
        out += (
            f" Training set aside {len(aside)} checkpoint{'s' if len(aside) > 1 else ''} it could not read "
            f"({', '.join(f'`{a}`' for a in aside)}, kept in the run folder) and resumed from the newest "
            "intact one."
        )
    return out


def checkpoint_text(ch: Chapter) -> str:
    """Where the checkpoints sit and why, and which were skipped (`skipped_text`)."""
    return _placement_text(ch) + skipped_text(ch)


def _placement_text(ch: Chapter) -> str:
    s = ch.steps
    trans = ", ".join(f"{t:,}" for t in s.transition)
    if s.place != "drop":
        return (
            f"{s.note[:1].upper()}{s.note[1:]}: pre-shift at step {s.pre:,}, transition at "
            f"{trans or 'no step'}, post-shift at step {s.post:,}, {_post_end(ch)}."
        )
    return (
        f"They are placed from this run's drop at step {s.drop:,} (`mclib.core.placement.checkpoint_steps`). "
        f"Pre-shift, step {s.pre:,}: the last saved step at or before {PRE_FRACTION:.0%} of the drop step "
        f"at which the {PLACE_WINDOW}-step mean of L_mask is within {PLATEAU_TOLERANCE:.0%} of E[X²] "
        f"(on the plateau, as the paper's step 4 000 of a ~15 000-step plateau). Transition, steps {trans}: "
        f"spread from step {s.left_plateau:,}, where the model leaves the plateau, to step {s.near_final:,}, "
        f"where L_mask comes within {FINAL_FACTOR:g}x its final level. Post-shift, step {s.post:,}: "
        f"{_post_end(ch)}."
    )


def _post_end(ch: Chapter) -> str:
    """What the post-shift step is: the end of training, or where a cut run was cut."""
    if is_cut(ch.end):
        return (
            f"where training was cut, short of its {ch.end.steps:,} steps, so every row that reads the post "
            "model "
            "or the final level is provisional"
        )
    return "the end of training"


SHAPE_SMOOTH = 100  # steps of the trailing mean the shape is read from


SHOULDER_RATIO = 1 / 3  # a stretch falling at under a third of the fastest rate is a pause ...


SHOULDER_FALL = 1.5  # ... if L_mask fell by at least this factor before it and falls by it again after


@dataclass
class DropShape:
    """How L_mask fell (`drop_shape`), in steps and L_mask levels. shoulder: None for one stretch,
    else (first step, last step, mean level) of the pause in the fall; after: the same for the
    run's final stretch past the shoulder (its last tenth, else all after it)."""

    left_plateau: int
    drop: int
    near_final: int
    shoulder: tuple[int, int, float] | None
    after: tuple[int, int, float] | None = None


def drop_shape(
    metrics: pd.DataFrame,
    drop: int,
    left_plateau: int,
    near_final: int,
    smooth: int = SHAPE_SMOOTH,
    *,
    span: int | None = None,
) -> DropShape:
    """Whether L_mask fell in one stretch or paused on a shoulder. On the `smooth`-step trailing mean
    from `left_plateau`, the fall over each `span` steps (default an eighth of the stretch) is
    log(L(t) / L(t+span)); a shoulder is the slowest stretch falling at under SHOULDER_RATIO of
    the fastest rate with a fall of SHOULDER_FALL or more both before and after it."""
    s = metrics.set_index("step")["L_mask"].rolling(smooth, min_periods=1).mean().loc[left_plateau:]
    last = int(s.index[-1])
    span = span or max(smooth, (last - left_plateau) // 8)
    steps = s.index.to_numpy()
    starts = steps[steps + span <= last]
    shoulder = after = None
    if len(starts) > 1 and s.iloc[0] > s.iloc[-1]:
        at = lambda t: s.reindex(t, method="ffill").to_numpy(dtype=float)
        rate = np.log(at(starts) / at(starts + span))
        before = float(s.iloc[0]) / at(starts) >= SHOULDER_FALL
        falls_after = at(starts + span) / float(s.iloc[-1]) >= SHOULDER_FALL
        pause = before & falls_after & (rate < SHOULDER_RATIO * max(rate.max(), 0))
        if pause.any():
            t = int(starts[np.flatnonzero(pause)[np.argmin(rate[pause])]])
            shoulder = (t, t + span, float(s.loc[t : t + span].mean()))
            past = metrics[metrics["step"] > t + span]
            tail = last_tenth(metrics)
            tail = tail[tail["step"] > t + span] if (tail["step"] > t + span).any() else past
            after = (int(tail["step"].iloc[0]), int(tail["step"].iloc[-1]), float(tail["L_mask"].mean()))
    return DropShape(left_plateau, drop, near_final, shoulder, after)


def shape_text(shape: DropShape | None) -> str:
    """The drop's shape in one sentence; "falling again" after a shoulder only where the final
    stretch (`DropShape.after`) lies below it."""
    if shape is None:
        return "There is no drop to describe."
    where = (
        f"L_mask left the plateau at step {shape.left_plateau:,}, crossed the drop's threshold "
        f"({DROP_FRACTION:g} E[X²]) at step {shape.drop:,} and came within {SETTLE:g}x its final level at "
        "step "
        f"{shape.near_final:,}"
    )
    if shape.shoulder is None:
        return f"{where}, falling in one stretch."
    a, b, level = shape.shoulder
    pause = (
        f"a shoulder near L_mask = {level:.3g} (steps {a:,} to {b:,}, where it fell at under a "
        "third of its fastest rate)"
    )
    if shape.after is None or shape.after[2] >= level:
        ended = (
            ""
            if shape.after is None
            else (
                f": over steps {shape.after[0]:,} to {shape.after[1]:,}, where the run ended, its mean was "
                f"{shape.after[2]:.3g}, not below it"
            )
        )
        return f"{where}; it slowed to {pause} and had not fallen below that level when the run ended{ended}."
    return (
        f"{where}; it fell in two stages, with {pause} before falling again, to a mean of "
        f"{shape.after[2]:.3g} "
        f"over steps {shape.after[0]:,} to {shape.after[1]:,}."
    )


def end_sentence(ch: Chapter) -> str:
    """Why training ended, as a sentence, by `RunEnd.ended`."""
    e = ch.end
    return {
        "converged": f"Training ended by the profile's rule (`train.until: converged`): {e.text}.",
        "cap": f"Training ended at the cap, before the profile's rule fired: the run {e.text}.",
        "steps": f"Training ended after the profile's fixed length: the run {e.text}.",
        "stopped": f"The run {e.text}.",
        "cut": f"Training was cut short of the profile's length: the run {e.text}.",
    }.get(e.ended, f"The run is {e.text}.")


def slope_sentence(ch: Chapter) -> str:
    """How fast L_mask still moved where training ended, ± its standard error (`end_slope` over the
    rule's window, or 2 000 steps), and how that rate is read; "" for a run too short to fit."""
    t = ch.cfg.train
    how = f"a fit of log L_mask to {SLOPE_BLOCKS} block means, ± one standard error" + (
        f"; the rule ends a run once the fall is under {t.min_improvement:.0%} per 1,000 steps even at the "
        f"rate minus {CONVERGED_Z:g} errors"
        if t.until == "converged"
        else ""
    )
    if ch.end.slope is not None and np.isfinite(ch.end.slope):
        return f"The rate is {how}."
    window = t.patience or 2000
    ran = ch.metrics[ch.metrics["step"] <= ch.end.step]
    rate, se = end_slope(ran, window)
    if not np.isfinite(rate):
        return ""
    return (
        f"Over its last {min(window, len(ran)):,} steps L_mask changed by {rate:+.1%} ± {se:.1%} "
        f"per 1 000 steps ({how})."
    )
