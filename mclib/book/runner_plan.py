"""Which runs a build trains (`plan_runs` -> `Plan`), from the runs each chapter declares it reads
(`Reads`); and which chapters the build executes, as its kernels see them (`asked`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..analyses.freezing import LONGEST_FIRST, pending_groups
from ..core import train as core_train  # read at call time: tests replace its seed_jobs
from ..core.checkpoints import saved_steps
from ..core.runs import freeze_dir, seed_run_dirs

ASKED = "MCLIB_BOOK_CHAPTERS"  # the chapters a build executes, comma-separated, for its kernels (`asked`)


@dataclass(frozen=True)
class Reads:
    """Runs a chapter reads beside the book's run (other seeds, E15's groups): its spec's `runs_read(cfg)`."""

    seeds: tuple[int, ...] = ()
    e15: tuple[str, ...] = ()


def asked() -> list[str] | None:
    """The chapters the running build executes ($MCLIB_BOOK_CHAPTERS); None outside a build."""
    value = os.environ.get(ASKED)
    return None if value is None else [n for n in value.split(",") if n]


@contextlib.contextmanager
def _asking(names: list[str]):
    """$MCLIB_BOOK_CHAPTERS set to `names` while the chapters run, restored afterwards."""
    old = os.environ.get(ASKED)
    os.environ[ASKED] = ",".join(names)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ASKED, None)
        else:
            os.environ[ASKED] = old


@dataclass
class Plan:
    """What a build trains: `train`, {run: the chapter that trains it}; `trainers`, the chapters
    asked that declare `trains_runs`; `line`, which runs train, where and why, which are complete
    and which are left out; `error`, one line naming a run read that nothing trains, else None."""

    train: dict[str, str]
    trainers: list[str]
    line: str
    error: str | None
    runs: dict = field(default_factory=dict)  # {run: folder} of every run the chapters asked read


def _runs_text(runs: list[str], readers: dict[str, list[str]], every: set[str]) -> str:
    """ "seed 1 (every chapter), seeds 2, 3 (07_beyond)": the runs, those of one kind with the same
    readers together."""
    groups: list[tuple[str, tuple, list[str]]] = []
    for run in runs:
        kind, what = run.split(" ", 1)
        why = ("every chapter",) if set(readers[run]) == every else tuple(readers[run])
        if groups and groups[-1][:2] == (kind, why):
            groups[-1][2].append(what)
        else:
            groups.append((kind, why, [what]))
    return ", ".join(
        f"{kind + 's' if kind == 'seed' and len(w) > 1 else kind} {', '.join(w)} ({', '.join(why)})"
        for kind, why, w in groups
    )


def _runs_of(cfg, folders: dict, reads: dict[str, Reads], main: list[str]) -> dict[str, list[str]]:
    """{run: the chapters of `reads` that read it}, seeds first, then E15 longest first; the
    book's run read by `main`."""
    readers = {f"seed {cfg.seed}": list(main)} if main else {}
    for s in folders:
        for n, r in reads.items():
            if s in r.seeds:
                readers.setdefault(f"seed {s}", []).append(n)
    for g in LONGEST_FIRST:
        for n, r in reads.items():
            if g in r.e15:
                readers.setdefault(f"E15 {g}", []).append(n)
    return readers


def _plan_text(cfg, *, train: dict, unread: list, done: list, readers: dict, left: dict, book, toc) -> str:
    """The plan's line: where each run trains, those read as they are, complete, left out."""
    parts = []
    for where in dict.fromkeys(train.values()):
        parts.append(
            f"training in {where}: " + _runs_text([r for r in train if train[r] == where], readers, set(book))
        )
    if not train:
        parts.append(
            "training: none" + ("" if cfg.analysis.train_in_book else " (analysis.train_in_book: false)")
        )
    if unread:
        parts.append("read as they are, not complete: " + _runs_text(unread, readers, set(book)))
    if done:
        parts.append("complete: " + _runs_text(done, readers, set(book)))
    if left:
        parts.append("left out, no chapter asked reads them: " + _runs_text(list(left), left, set(toc)))
    return "runs: " + "; ".join(parts)


def plan_runs(
    cfg,
    run_dir: Path,
    out: Path,
    *,
    toc: list[str],
    book: list[str],
    every: dict[str, Reads],
    trainers: list[str],
    toc_trainers: list[str],
) -> Plan:
    """`mclib.book.runner.plan` given the declarations: `toc`, the toc's chapters; `book`, those
    asked; `every`, the toc's `Reads`; `trainers` and `toc_trainers`, those that train runs."""
    mine = {n: r for n, r in every.items() if n in book}
    folders = seed_run_dirs(cfg, run_dir)

    readers = _runs_of(cfg, folders, mine, book)
    if not readers:
        return Plan({}, trainers, "", None)
    left = {
        run: chapters_ for run, chapters_ in _runs_of(cfg, folders, every, toc).items() if run not in readers
    }
    paths = {
        run: folders[int(run.split()[1])] if run.startswith("seed") else freeze_dir(run_dir, run.split()[1])
        for run in readers
    }
    pending_seeds = {job[0].seed for job in core_train.seed_jobs(cfg, run_dir)}
    groups = [run.split()[1] for run in readers if run.startswith("E15")]
    pending_e15 = set(
        groups if cfg.seed in pending_seeds or not groups else pending_groups(cfg, run_dir, groups)
    )
    pending = [
        run
        for run in readers
        if (run.startswith("seed") and int(run.split()[1]) in pending_seeds)
        or (run.startswith("E15") and run.split()[1] in pending_e15)
    ]
    main, train, unread = f"seed {cfg.seed}", {}, []
    for run in pending:
        declaring = [n for n in readers[run] if run != main or n in mine and cfg.seed in mine[n].seeds]
        if not cfg.analysis.train_in_book:
            unread.append(run)
        elif trainers:
            train[run] = trainers[0]
        elif declaring and (
            run != main or saved_steps(paths[main])
        ):  # every chapter opens the book's run first
            train[run] = declaring[0]
        else:
            unread.append(run)
    missing = [run for run in unread if not saved_steps(paths[run])]
    shown = lambda run: f"{run} ({os.path.relpath(paths[run], out)})"
    add = f"add {', '.join(toc_trainers) or 'the training chapter'}"
    error = None
    if missing:
        why = (
            "this book does not train (analysis.train_in_book: false)"
            if not cfg.analysis.train_in_book
            else f"no chapter asked trains them ({add})"
        )
        error = f"{', '.join(book)}: {len(missing)} run(s) read are not trained, and {why}: " + ", ".join(
            shown(run) for run in missing
        )
    elif main in pending and any(
        run.startswith("E15") and where not in trainers for run, where in train.items()
    ):
        error = (
            f"{', '.join(book)}: E15's runs start from the book's run's last checkpoint, and {shown(main)} "
            f"is not complete ({add})"
        )
    done = [run for run in readers if run not in pending]
    text = _plan_text(
        cfg, train=train, unread=unread, done=done, readers=readers, left=left, book=book, toc=toc
    )
    return Plan(train, trainers, text, error, paths)
