"""One run of a sweep on a worker (`train_sweep_run`): trained, resumed or found stopped under
the sweep's cap and `after_drop`; it reports its step on a Dask event (`EVENT`) and returns
its row of the results table (`summarise`).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import Profile
from .metrics import drop_column, find_drop, plateau_stats
from .runs import SWEEP_MARKER, load_metrics, run_profile, write_atomic

EVENT = "mclib-sweep"  # the Dask event topic on which runs report their step


@dataclass
class SweepRun:
    """One run of a sweep: what a worker needs to train it and to write its row."""

    sweep: str  # the sweep file's name (the results table's `sweep` column)
    setting: str
    seed: int
    overrides: dict[str, Any]
    profile: Profile  # base + overrides + seed + threads
    run_dir: Path
    cap_minutes: float | None = None
    after_drop: int | None = None
    resume: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.setting} s{self.seed}"


# --- on a worker ---------------------------------------------------------------------------


def _report(run: SweepRun, step: int, state: str) -> None:
    """Tell the client this run's step (a Dask event; nothing outside a worker)."""
    try:
        from distributed import get_worker  # noqa: PLC0415 - on a Dask worker only

        get_worker().log_event(
            EVENT, {"run": run.label, "step": step, "steps": run.profile.train.steps, "state": state}
        )
    except (ImportError, ValueError):
        pass


def _start_wall(run: SweepRun) -> float:
    """The run's training time when this sweep first started it (its cap counts from there), kept
    in sweep.json; a folder of another sweep is removed unless `resume`."""
    from .checkpoints import train_wall  # noqa: PLC0415 - the model stack: on the worker only

    marker = run.run_dir / SWEEP_MARKER
    mine = {"sweep": run.sweep, "setting": run.setting, "seed": run.seed}
    if marker.is_file():
        saved = json.loads(marker.read_text())
        if {k: saved.get(k) for k in mine} == mine:
            return float(saved["wall0"])  # cut earlier in this sweep: continue
    if run.run_dir.exists() and not run.resume:
        shutil.rmtree(run.run_dir)  # a sweep row is one fresh run, unless the sweep continues runs
    wall0 = train_wall(run.run_dir)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(marker, json.dumps({**mine, "wall0": wall0}))
    return wall0


def train_sweep_run(run: SweepRun) -> dict:
    """Train (or resume, or find stopped) one run of a sweep; its results row. Runs on a worker."""
    from .ending import stop_after_drop  # noqa: PLC0415 - the model stack: on the worker only
    from .train import train  # noqa: PLC0415 - the model stack: on the worker only

    wall0 = _start_wall(run)
    past_drop = (
        stop_after_drop(run.profile.data.rank, run.after_drop, drop_column(run.profile))
        if run.after_drop is not None
        else None
    )
    cap = None if run.cap_minutes is None else 60 * run.cap_minutes
    told = [0.0]

    def stop(rows) -> bool:
        now = time.monotonic()
        if now - told[0] > 2:
            told[0] = now
            _report(run, int(rows[-1]["step"]), "running")
        wall = rows[-1].get("wall")
        capped = cap is not None and wall == wall and wall - wall0 > cap  # wall is NaN between flushes
        return capped or (past_drop is not None and past_drop(rows))

    _report(run, 0, "running")
    # the row reads the metrics: under checkpoints.keep: analysis only the newest checkpoint stays
    train(run.profile, run.run_dir, progress=False, stop=stop, newest_only=True)
    row = summarise(run)
    _report(run, row["steps_run"], "done")
    return row


def setting_columns(profile: Profile) -> dict:
    """The run's levers, resolved from its profile (a row names its whole setting, not only its overrides)."""
    d, m, t = profile.data, profile.model, profile.train
    return {
        "n": d.n,
        "rank": d.rank,
        "p_mask": d.p_mask,
        "kind": m.kind,
        "layers": m.layers,
        "heads": m.heads,
        "hidden": m.hidden,
        "init_std": m.init_std,
        "attn_bias": m.attn_bias,
        "attn_bias_target": m.attn_bias_target,
        "batch": t.batch,
        "lr": t.lr,
        "warmup": t.warmup,
        "beta2": t.beta2,
        "grad_clip": t.grad_clip,
    }


def end_rule(profile: Profile) -> str:
    """How a run's length was decided, for its row: "steps", or "slope WINDOW MIN confirmed"
    (`mclib.core.metrics.converged`; rows written before 2026-11-29 read "slope WINDOW MIN", the
    rule without its second window, and compare only among themselves)."""
    t = profile.train
    return "steps" if t.until == "steps" else f"slope {t.patience} {t.min_improvement:g} confirmed"


def how_it_ended(end, drop: int | None, steps: int, after_drop: int | None) -> str:
    """The row's `ended`: the run's `RunEnd.ended`, with a sweep's stop told apart as "after drop"
    or "wall cap"."""
    if end is None:
        return "unfinished"
    if end.ended != "stopped":
        return end.ended
    return (
        "after drop"
        if after_drop is not None and drop is not None and steps >= drop + after_drop
        else "wall cap"
    )


def summarise(run: SweepRun) -> dict:
    """One results row from a run folder, with the setting the run saved (not the base profile as it
    is now)."""
    from .ending import run_end  # noqa: PLC0415 - the model stack: on the worker only

    profile = run_profile(run.run_dir)
    m = load_metrics(run.run_dir)
    drop = find_drop(m, profile.data.rank, column=drop_column(profile))
    wall = float(m["wall"].dropna().iloc[-1])
    steps = int(m["step"].iloc[-1])
    ms_per_step = 1000 * wall / steps  # drop_minutes is the drop step at this mean pace (also over a resume)
    stats = plateau_stats(m, drop)
    return {
        "setting": run.setting,
        "seed": run.seed,
        "overrides": json.dumps(run.overrides),
        "drop_step": drop,
        "drop_minutes": None if drop is None else round(drop * ms_per_step / 60000, 2),
        "steps_run": steps,
        "ms_per_step": round(ms_per_step, 1),
        "threads": profile.train.threads,
        **{k: round(v, 5) for k, v in stats.items()},
        "cap_minutes": run.cap_minutes,
        "end_rule": end_rule(profile),
        "ended": how_it_ended(run_end(run.run_dir), drop, steps, run.after_drop),
        "date": time.strftime("%Y-%m-%d"),
        "matrices": steps * profile.train.batch,
        **setting_columns(profile),
        "wall_minutes": round(wall / 60, 2),
        "sweep": run.sweep,
        **run.extra,
    }
