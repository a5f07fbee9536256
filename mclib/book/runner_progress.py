"""The training's one progress line while a chapter runs (`_report_training`): each run that
moved, its step out of `expected_steps`, its measured step (`step_ms`) and the time left.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from pathlib import Path

import yaml
from tqdm.auto import tqdm

from ..core import metrics as core_metrics  # read at call time: tests replace its find_drop
from ..core.checkpoints import resumable_steps
from ..core.config import ConfigError
from ..core.jobs import local_workers
from ..core.runs import END, METRICS, PROFILE, checkpoint_dir, load_metrics, run_profile
from .runner_plan import Plan


def expected_steps(folder: Path, cfg=None) -> int:
    """The step a run is expected to end at: where it ended (end.json at its newest checkpoint);
    an E15 run not yet dropped, at the main run's drop (if before its cap); another seed than
    `cfg`'s that has dropped, `analysis.after_drop` steps later; else its cap, `train.steps`."""
    folder, profile = Path(folder), run_profile(folder)
    steps, cap = resumable_steps(folder), profile.train.steps
    if steps and (folder / END).is_file():
        end = json.loads((folder / END).read_text())
        if end.get("step") == steps[-1] and end.get("ended") != "cut":
            return steps[-1]
    drop = lambda run: (
        core_metrics.find_drop(load_metrics(run), rank=profile.data.rank)
        if (run / METRICS).is_file()
        else None
    )
    if (
        folder.parent.name == "freeze"
        and drop(folder) is None
        and (main := drop(folder.parent.parent)) is not None
    ):
        return min(cap, main)
    after = cfg.analysis.after_drop if cfg is not None and profile.seed != cfg.seed else None
    if after is not None and (own := drop(folder)) is not None:
        return min(cap, own + after)
    return cap


def step_ms(folder: Path, over: int = 1000) -> float | None:
    """The run's ms a step over its last `over` steps (metrics.csv's `wall`); None before two timed rows."""

    m = load_metrics(folder)
    timed = m.loc[m["wall"].notna(), ["step", "wall"]] if "wall" in m else m.iloc[:0]
    if len(timed) < 2:
        return None
    last = timed.iloc[-1]
    first = timed[timed["step"] <= last["step"] - over]
    first = first.iloc[-1] if len(first) else timed.iloc[0]
    return 1000 * float(last["wall"] - first["wall"]) / float(last["step"] - first["step"])


def median_step_ms(metrics) -> float | None:
    """The median ms a step over the intervals of `metrics`' `wall` column; None before two timed rows."""
    timed = metrics.loc[metrics["wall"].notna(), ["step", "wall"]] if "wall" in metrics else metrics.iloc[:0]
    d = timed.diff().dropna()
    d = d[d["step"] > 0]
    return float((1000 * d["wall"] / d["step"]).median()) if len(d) else None


def training_status(root: Path, since: float, cfg=None) -> list[str]:
    """ "NAME step/expected at N ms a step" for each run folder under `root` with a checkpoint
    saved after `since` (a time.time())."""

    out = []
    for prof in sorted(Path(root).glob(f"**/{PROFILE}")):
        folder = prof.parent
        try:  # a run may be writing its folder right now, or be an old one that no longer loads: skip it
            steps = resumable_steps(folder)  # the newest checkpoint always has its train state
            if steps and checkpoint_dir(folder, steps[-1]).stat().st_mtime >= since:
                ms = step_ms(folder) if (folder / METRICS).is_file() else None
                out.append(
                    f"{folder.relative_to(root).as_posix()} {steps[-1]:,}/{expected_steps(folder, cfg):,}"
                    + (f" at {ms:.0f} ms a step" if ms else "")
                )
        except (OSError, ValueError, KeyError, ConfigError, yaml.YAMLError):
            continue
    return out


def time_left(runs: dict[str, Path], cfg, workers: int) -> float | None:
    """Seconds of training left to `runs` ({name: folder}) from each one's steps left and
    measured step (untimed runs take the mean): the longer of the work spread over `workers` and
    the book's run followed by its longest E15 run. None before any step is measured."""

    left, ms = {}, {}
    for name, folder in runs.items():
        try:
            started = (folder / PROFILE).is_file()
            steps = resumable_steps(folder) if started else []
            if started:
                expected = expected_steps(folder, cfg)
            else:  # its cap: E15's, or the profile's
                expected = cfg.analysis.freeze_steps if name.startswith("E15") else cfg.train.steps
            left[name] = max(0, expected - (steps[-1] if steps else 0))
            if started and (folder / METRICS).is_file() and (t := step_ms(folder)):
                ms[name] = t
        except (OSError, ValueError, KeyError, ConfigError, yaml.YAMLError):
            continue
    if not ms:
        return None
    mean = sum(ms.values()) / len(ms)
    seconds = {name: n * ms.get(name, mean) / 1000 for name, n in left.items()}
    e15 = [t for name, t in seconds.items() if name.startswith("E15")]
    chain = seconds.get(f"seed {cfg.seed}", 0.0) + max(e15, default=0.0)
    return max(chain, sum(seconds.values()) / max(1, workers))


def sooner(runs: dict[str, Path], cfg) -> bool:
    """Whether `time_left` is only an upper bound: a run not ended may stop early on its rule
    (`train.until: converged`; every E15 run)."""

    return any(
        not (Path(folder) / END).is_file() and (name.startswith("E15") or cfg.train.until == "converged")
        for name, folder in runs.items()
    )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


@contextlib.contextmanager
def _report_training(root: Path, every: float = 60.0, runs: Plan | None = None, cfg=None):
    """While a chapter runs, print at most every `every` seconds the runs under `root` that saved
    a checkpoint since the last line (`training_status`) and, given the build's `runs` and `cfg`,
    the training left to them (`time_left`) while one of them moved."""

    # file times come from a coarser clock than time.time() and can lag it by a tick:
    # a second of slack, so a checkpoint saved just after the start is not missed
    done, since = threading.Event(), time.time() - 1.0
    pending = {name: runs.runs[name] for name in runs.train} if runs is not None and cfg is not None else {}
    names = set()
    for folder in pending.values():
        with contextlib.suppress(ValueError):  # a run folder outside root is not among the lines
            names.add(Path(folder).relative_to(root).as_posix())
    workers = local_workers(cfg.train.threads) if cfg is not None else 1

    def watch():
        shown: set[str] = set()
        while not done.wait(every):
            moved = [
                s for s in training_status(root, since, cfg) if s not in shown
            ]  # a finished run drops out
            if moved:
                # the training left is the build's runs' (`pending`): said only while one of them moved, never
                # "0 s" beside a run a chapter trains on its own (chapter 08's GPT runs)
                planned = any(s.split(" ", 1)[0] in names for s in moved)
                left = time_left(pending, cfg, workers) if planned else None
                tqdm.write(
                    "  training: "
                    + ", ".join(moved)
                    + (
                        f"; {'at most ' if sooner(pending, cfg) else ''}about {_minutes(left)} of training "
                        "left"
                        if left is not None
                        else ""
                    ),
                    file=sys.stdout,
                )
                shown.update(moved)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
