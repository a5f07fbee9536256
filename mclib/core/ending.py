"""How a run ends: its stop rules, end.json (why and where it ended), and whether it is complete.

A run trains to `train.steps` (the cap), unless its profile's rule (`convergence_stop`,
`train.until: converged`) or a caller's `stop` (`stop_at_step`, `stop_after_drop`), asked at
every log flush, ends it first, or a deadline or signal cuts it; a training loss that is not finite
stops it with `DivergedError`, nothing saved past its last checkpoint. The trainer records the end
(`record_end`, `RunEnd`), `run_end` reads it back, and `is_complete` says without loading a
model whether training the run again would return at once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from .checkpoints import checkpoint_damage, resumable_steps, saved_steps
from .config import Profile
from .metrics import SLOPE_BLOCKS, converged, drop_column, end_slope, find_drop, rows_curve
from .runs import END, checkpoint_dir, load_metrics, run_profile, write_atomic

# --- the stop rules ----------------------------------------------------------------------


class DivergedError(RuntimeError):
    """The training loss is not finite: the run stops before anything past its last checkpoint is
    saved, so the folder still resumes from a sound step."""


def convergence_stop(profile: Profile) -> Callable[[list[dict]], bool] | None:
    """The profile's own end rule as a `stop` (None with `train.until: steps`): true once
    `mclib.core.metrics.converged` finds the run converged."""
    t, rank = profile.train, profile.data.rank
    if t.until != "converged":
        return None
    column = drop_column(profile)
    return lambda rows: (
        bool(rows)
        and converged(rows_curve(rows), rank, t.patience, t.min_improvement, column=column) is not None
    )


def stop_rule(
    profile: Profile, stop: Callable[[list[dict]], bool] | None = None
) -> Callable[[list[dict]], str | None]:
    """Why a run of `profile` ends given its rows so far: "converged" (`convergence_stop`), "stopped"
    (the caller's `stop`) or None (it trains on)."""
    rule = convergence_stop(profile)

    def why(rows: list[dict]) -> str | None:
        if not rows:
            return None
        if rule is not None and rule(rows):
            return "converged"
        if stop is not None and stop(rows):
            return "stopped"
        return None

    return why


def stop_at_step(step: int) -> Callable[[list[dict]], bool]:
    """A `stop` true once the run reached `step` (exact at a multiple of `train.log_every`)."""

    def stop(rows: list[dict]) -> bool:
        return rows[-1]["step"] >= step

    return stop


def stop_after_drop(rank: int, after: int, column: str = "L_mask") -> Callable[[list[dict]], bool]:
    """A `stop` true once the run is `after` steps past its drop (`find_drop` in `column`)."""

    def stop(rows: list[dict]) -> bool:
        curve = pd.DataFrame({"step": [r["step"] for r in rows], column: [r[column] for r in rows]})
        drop = find_drop(curve, rank=rank, column=column)
        return drop is not None and rows[-1]["step"] >= drop + after

    return stop


# --- how a run ended ----------------------------------------------------------------------

ENDINGS = ("converged", "cap", "steps", "stopped", "cut", "unfinished")


@dataclass
class RunEnd:
    """Why and where a run ended (`run_end`).

    ended: "converged" (the profile's rule), "cap" (reached `train.steps` under until: converged),
    "steps" (trained its steps, until: steps), "stopped" (a caller's `stop`, e.g. after_drop),
    "cut" (a deadline or signal; resumable) or "unfinished". step: the newest checkpoint; drop:
    `find_drop`'s step or None. slope, slope_se: with until: converged, L_mask's relative change
    per 1 000 steps over the last `patience` steps and its standard error (`end_slope`), else None."""

    ended: str
    step: int
    drop: int | None
    steps: int  # train.steps of the profile it trained with (the cap with until: converged)
    until: str
    patience: int | None = None
    slope: float | None = None
    slope_se: float | None = None

    @classmethod
    def from_json(cls, record: dict) -> RunEnd:
        """A RunEnd from end.json; keys it does not know are ignored (their slope reads None)."""
        return cls(**{k: v for k, v in record.items() if k in cls.__dataclass_fields__})

    @property
    def text(self) -> str:
        """One phrase for the book, e.g. "L_mask stopped improving at step 26,400 (cap 40,000): it
        changed by -1.2% ± 0.8% per 1,000 steps over its last 2,000"."""
        rate = (
            f"{self.slope:+.1%} ± {self.slope_se:.1%} per 1,000 steps over its last {self.patience:,}"
            if self.slope is not None and self.patience and math.isfinite(self.slope)
            else ""
        )
        return {
            "converged": f"L_mask stopped improving at step {self.step:,} (cap {self.steps:,})"
            + (f": it changed by {rate}" if rate else ""),
            "cap": f"reached the cap of {self.steps:,} steps"
            + (f" while L_mask still changed by {rate}" if rate else ""),
            "steps": f"trained its {self.steps:,} steps",
            "stopped": f"stopped early at step {self.step:,}",
            "cut": f"was cut at step {self.step:,} of {self.steps:,} by its wall-clock deadline",
            "unfinished": f"unfinished at step {self.step:,} of {self.steps:,}",
        }[self.ended]


def end_of_run(
    profile: Profile, rows: list[dict], step: int, stopped: bool = False, cut: bool = False
) -> RunEnd:
    """The `RunEnd` of a run of `profile` whose newest checkpoint is `step`, from its rows up to it
    (stopped: a caller's `stop` ended it there; cut: a deadline or signal did)."""
    t = profile.train
    rule = convergence_stop(profile)
    if rule is not None and rule(rows):
        ended = "converged"
    elif step >= t.steps:
        ended = "cap" if t.until == "converged" else "steps"
    else:
        ended = "stopped" if stopped else "cut" if cut else "unfinished"
    curve, column = rows_curve(rows), drop_column(profile)
    slope = slope_se = None
    if t.until == "converged" and len(curve) >= SLOPE_BLOCKS:
        slope, slope_se = end_slope(curve, t.patience)
    drop = find_drop(curve, rank=profile.data.rank, column=column) if rows else None
    return RunEnd(
        ended, step, drop, t.steps, t.until, t.patience if t.until == "converged" else None, slope, slope_se
    )


def record_end(run_dir: Path, profile: Profile, rows: list[dict], step: int, reason: str | None) -> RunEnd:
    """Write end.json for a run that ended at `step` (its newest checkpoint) unless it already says
    the same; returns the end. reason: "stopped", "cut", the rule's, or None (the cap)."""
    path = Path(run_dir) / END
    recorded = RunEnd.from_json(json.loads(path.read_text())) if ended_at(run_dir, step) else None
    end = end_of_run(
        profile,
        [r for r in rows if r["step"] <= step],
        step,
        stopped=reason == "stopped",
        cut=reason == "cut",
    )
    if end != recorded:
        write_atomic(path, json.dumps(asdict(end)))
    return end


def ended_at(run_dir: str | Path, step: int) -> bool:
    """Whether the run's end.json records an end at `step`."""
    path = Path(run_dir) / END
    return path.is_file() and json.loads(path.read_text()).get("step") == step


def run_end(run_dir: str | Path) -> RunEnd:
    """Why and where the run in `run_dir` ended: its end.json where that names the newest
    checkpoint, else derived from profile and metrics (a caller's `stop` cannot be derived: such a
    run reads "unfinished" until the trainer records it)."""
    run_dir = Path(run_dir)
    done = saved_steps(run_dir)
    if not done:
        raise FileNotFoundError(f"no checkpoint in {run_dir}: the run has not started")
    if ended_at(run_dir, done[-1]):
        return RunEnd.from_json(json.loads((run_dir / END).read_text()))
    rows = [r for r in load_metrics(run_dir).to_dict("records") if r["step"] <= done[-1]]
    return end_of_run(run_profile(run_dir), rows, done[-1])


# --- whether a run is complete -------------------------------------------------------------


def is_complete(
    profile: Profile, run_dir: str | Path, stop: Callable[[list[dict]], bool] | None = None
) -> bool:
    """Whether `train(profile, run_dir, stop=stop)` would return at once: the newest intact
    checkpoint is at the last step, or the profile's rule or `stop` was true there. No model is loaded."""
    done = resumable_steps(run_dir)
    if not done or checkpoint_damage(checkpoint_dir(run_dir, done[-1]), state=True) is not None:
        return False  # nothing saved, or a damaged newest checkpoint that training sets aside
    if done[-1] >= profile.train.steps:
        return True
    if convergence_stop(profile) is None and stop is None:
        return False
    rows = [r for r in load_metrics(run_dir).to_dict("records") if r["step"] <= done[-1]]
    return stop_rule(profile, stop)(rows) is not None
