"""The training chapter beside the others: in a process of its own while it trains E15's runs,
with the chapters that read neither them nor other chapters' records executing beside it.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from .runner_execute import _execute, _why
from .runner_plan import Plan

READY = "MCLIB_BOOK_READY"  # where the training chapter's kernel says that only E15's runs still train
READY_FILE = (
    ".training-ready"  # that file, in OUT/book/_executed/ (`mclib.book.chapter.train_runs` creates it)
)


def alongside(templates: list[Path], runs: Plan, cfg) -> str | None:
    """The chapter to execute beside the others, or None (one after another): the training
    chapter where it is asked and trains E15's runs in this build (`plan`). It runs apart
    (`_execute_apart`), and once its kernel creates the file READY names (only E15's runs still
    train), the chapters that do not `waits_for_trainer` execute beside it."""
    names = [t.stem for t in templates]
    trainer = next((n for n in runs.trainers if n in names), None)
    if trainer is None:
        return None
    return (
        trainer
        if any(run.startswith("E15") and where == trainer for run, where in runs.train.items())
        else None
    )


def _execute_in_process(
    template: Path, output: Path, params: dict, timeout: float | None, *, paths: dict, env: dict
) -> str | None:
    os.environ.update(env)
    try:
        _execute(template, output, params, timeout, False, paths=paths)
    except BaseException as e:  # noqa: BLE001 - handed back as one line
        return _why(e)
    return None


def _execute_apart(
    template: Path, output: Path, params: dict, timeout: float | None, *, paths: dict, ready: Path
) -> str | None:
    """`_execute` in a spawned process (its stderr and cell bar its own), its kernel told the READY
    file; None, or why it failed (`_why`)."""

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(
            _execute_in_process, template, output, params, timeout, paths=paths, env={READY: str(ready)}
        ).result()


def _beside(state: dict, work, ready: Path, poll: float = 1.0) -> None:
    """Start `work` on a thread (`state["thread"]`); return once `ready` exists or the work has ended."""
    ready.unlink(missing_ok=True)
    state["thread"] = thread = threading.Thread(target=work, daemon=True)
    thread.start()
    while thread.is_alive() and not ready.exists():
        time.sleep(poll)
