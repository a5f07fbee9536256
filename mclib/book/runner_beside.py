"""The training chapter beside the others: where it trains E15's runs, it executes in a
process of its own, and once its kernel says that only those still train, the chapters that
read neither them nor other chapters' records execute beside it (`alongside`; which chapters
wait for it: `mclib.book.runner.waits_for_trainer`)."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from .runner_execute import _execute, _why
from .runner_plan import Plan

READY = "MCLIB_BOOK_READY"  # where the training chapter's kernel says that only E15's runs still train
READY_FILE = ".training-ready"  # that file, in OUT/book/_executed/ (`mclib.book.chapter.train_runs` creates it)


def alongside(templates: list[Path], runs: Plan, cfg) -> str | None:
    """The chapter that executes beside the others, or None (one chapter after another).

    E15's runs start from the book's run's last checkpoint and train for a third of the
    book's CPU time; while the last of them trains, a core idles. So where the training
    chapter is asked and trains E15's runs in this build (`plan`), it executes in a process
    of its own (`_execute_apart`), and once its kernel says that every run but E15's is
    complete (the file READY names), the chapters that read neither E15's runs nor other
    chapters' records (`waits_for_trainer`) execute beside it (scorecard.json's lock,
    `scorecard.locked`, holds on every OS)."""
    names = [t.stem for t in templates]
    trainer = next((n for n in runs.trainers if n in names), None)
    if trainer is None:
        return None
    return trainer if any(run.startswith("E15") and where == trainer for run, where in runs.train.items()) else None


def _execute_in_process(template: Path, output: Path, params: dict, timeout: float | None, *, paths: dict,
                        env: dict) -> str | None:
    os.environ.update(env)
    try:
        _execute(template, output, params, timeout, False, paths=paths)
    except BaseException as e:  # noqa: BLE001 - handed back as one line
        return _why(e)
    return None


def _execute_apart(template: Path, output: Path, params: dict, timeout: float | None, *, paths: dict,
                   ready: Path) -> str | None:
    """`_execute` in a process of its own (its kernel's stderr, papermill's cell bar and the
    redirected file descriptor 2 are that process's, not this one's, where other chapters
    execute meanwhile), its kernel told where to say that only E15's runs still train (READY);
    None, or why it failed (`_why`)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_execute_in_process, template, output, params, timeout, paths=paths,
                           env={READY: str(ready)}).result()


def _beside(state: dict, work, ready: Path, poll: float = 1.0) -> None:
    """Start `work` on a thread (`state["thread"]`) and return once the file `ready` exists or
    the work has ended."""
    ready.unlink(missing_ok=True)
    state["thread"] = thread = threading.Thread(target=work, daemon=True)
    thread.start()
    while thread.is_alive() and not ready.exists():
        time.sleep(poll)
