"""The training loop (docs/protocol.md, §1.4) that survives interruption.

A run lives in one folder (`mclib.core.runs`: its layout and files; its checkpoints
`mclib.core.checkpoints`, its end `mclib.core.ending`); one process trains it at a time
(`only_trainer`). Running `train` again on the same folder resumes
from the newest checkpoint; on the CPU the result is bit-identical to a run that was
never interrupted (the data generator, Adam's state and the step are all restored).

Metrics are those of the training batch itself, from the forward pass that computes
the gradient (before the update). The authors instead re-ran the model on the same
batch after the update; our numbers are therefore one update "older" and cost no
extra forward pass. `eval_*` columns are fresh matrices every `eval_every` steps.

Several runs (seeds, E15's runs, sweeps) train side by side on a Dask cluster
(`mclib.core.jobs`: worker processes on this machine, one thread each when the profile pins
`train.threads: 1`, or a cluster's workers); a run's numbers do not depend on which
process trains it.

The step and the run it steps are `mclib.core.step` (`train_step`, `_Run`); the device and
precision `mclib.core.precision`; how `train.step: auto` runs on CUDA `mclib.core.variants`
(`choose`). This file is the loop around the step (`_train`), read top to bottom; each step of
a run's life has one place, which the loop calls in turn: set up and resume (`_Run`, from
`mclib.core.checkpoints.resume_run`), end (`mclib.core.ending.record_end`, at the top of each
pass, for a run that ended in the last pass or before this process: the rule, a stop, the cap,
a deadline, a signal), step (`train_step`), evaluate (`_Run.evaluate`), flush the logged losses
and ask the stop rule (`_Run.flush`, `mclib.core.ending.stop_rule`), save (`_Run.save`).
Several runs of one `train_group` call each own their model and Adam; the step goes over them
one after another. (Until revision d54ea56, 2026-11-26, a second copy of the architecture,
`mclib/core/stacked.py`, trained R runs stacked into one model: `train.fast`.)
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from filelock import FileLock, Timeout
from tqdm.auto import tqdm

from .checkpoints import check_disk
from .config import Profile
from .ending import is_complete, record_end, stop_after_drop
from .metrics import LOSS_NAMES, drop_column
from .model import MatrixBert
from .precision import resolve_device, set_precision, with_device
from .runs import LOCK, seed_run_dirs
from .step import _Run, train_step
from .variants import auto_step

log = logging.getLogger(__name__)


def train(profile: Profile, run_dir: str | Path, progress: bool = True,
          stop: Callable[[list[dict]], bool] | None = None,
          init_model: MatrixBert | None = None, *, newest_only: bool = False, deadline: float | None = None) -> Path:
    """Train (or resume) `profile` in `run_dir`; returns run_dir.

    One trainer at a time per folder: a second process that tries to train the same
    folder gets a one-line error instead of interleaving its checkpoints with the first's.

    stop: called with the metric rows at every log flush; returning True ends the run
    early with a checkpoint (used by the profile sweep to stop soon after the drop).
    With `train.until: converged` the profile's own rule (`mclib.core.ending.convergence_stop`)
    is checked the same way, `train.steps` being the cap. When a run ends, `end.json`
    records why (`mclib.core.ending.run_end`: converged, cap, steps or stopped).
    init_model: start from this model instead of a fresh one (E15: a model with one
    component re-initialised and the rest frozen); its frozen parameters stay frozen,
    also after a resume.
    newest_only: with `checkpoints.keep: analysis`, keep only the newest checkpoint (a run
    of which the book reads the metrics and the end: other seeds, E15's runs).
    A run whose checkpoints would not fit on its disk (`mclib.core.checkpoints.check_disk`) is
    refused before it starts, with a one-line error.
    deadline: a `time.time()` at which the run saves a resumable checkpoint and ends "cut"
    (end.json; SIGTERM and SIGINT do the same); training it again continues from there.
    """
    return train_group([Job(profile, Path(run_dir), stop, init_model, newest_only)], progress=progress,
                       deadline=deadline)[0]


@dataclass
class Job:
    """One run of a `train_group` call: what `train` takes."""
    profile: Profile
    run_dir: Path
    stop: Callable[[list[dict]], bool] | None = None
    init_model: MatrixBert | None = None
    newest_only: bool = False


def process_key(profile: Profile) -> tuple:
    """Runs of one `train_group` call share this key: what a process sets once for all of
    them (the device, the precision's TF32 switch, torch's thread count). Everything else
    (architecture, seeds, lrs, warm-up, step counts, frozen groups, compile) may differ."""
    t = profile.train
    return str(resolve_device(t.device)), t.precision, t.threads


def train_group(jobs: list[Job], progress: bool = False, deadline: float | None = None) -> list[Path]:
    """Train (or resume) several runs in one process, stepped one after another (`train_step`):
    each run its own model and Adam, so its numbers do not depend on which runs it trained
    beside (tests/test_train.py). Returns the folders."""
    if not jobs:
        return []
    if len({process_key(j.profile) for j in jobs}) > 1:
        raise ValueError("runs trained in one process need equal process_key(profile) (device, precision, threads): "
                         + ", ".join(f"{j.run_dir}" for j in jobs))
    threads = torch.get_num_threads()
    try:
        with contextlib.ExitStack() as locks:
            for j in jobs:
                j.run_dir.mkdir(parents=True, exist_ok=True)
                locks.enter_context(only_trainer(j.run_dir))
            _train(jobs, progress, deadline)
        return [j.run_dir for j in jobs]
    finally:
        torch.set_num_threads(threads)  # train.threads holds for the run, not for the caller after it


@contextlib.contextmanager
def only_trainer(run_dir: Path):
    """An exclusive lock on run_dir/.lock for as long as this process trains the folder
    (the OS drops it when the process dies, so a killed run never leaves it stale)."""
    try:
        lock = FileLock(run_dir / LOCK, timeout=0)
        lock.acquire()
    except Timeout:
        raise RuntimeError(f"run folder {str(run_dir)!r} is being trained by another process") from None
    try:
        yield
    finally:
        lock.release()


class _CutSignals:
    """While training, SIGTERM and SIGINT ask the loop to save and end (the run ends "cut",
    `mclib.core.ending.RunEnd`) instead of dying between checkpoints; a second signal
    raises KeyboardInterrupt at once. Only the main thread can take signals: elsewhere (a
    Dask worker's thread) nothing is installed."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning(f"mclib: {signal.Signals(signum).name}: saving at the next step, then ending (again: stop now)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _train(jobs: list[Job], progress: bool, deadline: float | None = None) -> None:
    """The loop. Each pass: the runs that have ended (rule, stop, cap or cut, in the last pass
    or before this process) record their end and leave; a `train_step` of every other run; then
    per run, in this order: evaluate (every eval_every), flush the logged losses and ask the
    stop rule (every log_every), checkpoint (every save_every, and at the end; Adam's state
    every state_every). A cut comes from `deadline` (a `time.time()`) or a signal
    (`_CutSignals`): every run then flushes, saves a resumable checkpoint and ends "cut" at the
    step it reached."""
    t = jobs[0].profile.train
    device = resolve_device(t.device)
    set_precision(device, t.precision)
    if t.threads:
        torch.set_num_threads(t.threads)
    runs = [_Run(j, device, chosen=auto_step(j.profile, device)) for j in jobs]  # set up, or resume
    training = [r for r in runs if not r.finished]
    check_disk([(r.profile, r.dir, r.job.newest_only) for r in training])
    lead = (training or runs)[0]
    bar = tqdm(total=lead.t.steps, initial=lead.step, desc=f"train {lead.profile.name}",
               disable=not progress or not training, unit="step", dynamic_ncols=True)
    tick = time.perf_counter()
    with _CutSignals() as signals:
        while True:
            for r in runs:  # end: a run that ended (at set up, or in the last pass) records why (end.json)
                if r.finished and r.step:
                    record_end(r.dir, r.profile, r.rows, r.step, r.reason)
            runs = [r for r in runs if not r.finished]
            if not runs:
                break
            train_step(runs)
            for r in runs:
                if r.step % r.t.eval_every == 0:  # evaluate: fresh matrices of the run's eval generator
                    r.evals[r.step] = dict(zip(LOSS_NAMES, r.evaluate().cpu().tolist()))
            cut = signals.requested or (deadline is not None and time.time() >= deadline)
            flushing = [i for i, r in enumerate(runs) if cut or r.step % r.t.log_every == 0 or r.step in r.save_at]
            if device.type == "cuda" and flushing:
                # the steps queued since the last flush finish here: their time is the steps' own (`wall`),
                # not the flush's; without this sync, `wall` counted the host's queueing alone
                torch.cuda.synchronize(device)
            now = time.perf_counter()
            for r in runs:
                r.wall += now - tick
            tick = now
            for i in flushing:
                r = runs[i]
                # why the run ends here: its rule or stop, else the cut (a deadline, a signal), else none
                r.reason = r.flush() or ("cut" if cut and r.step < r.t.steps else None)
                if r is lead:
                    bar.update(r.step - bar.n)
                    bar.set_postfix(L_obs=f"{r.rows[-1]['L_obs']:.2e}", L_mask=f"{r.rows[-1]['L_mask']:.3f}")
                if r.step in r.save_at or r.finished:
                    r.save(r.finished)
            tick = time.perf_counter()  # checkpoint I/O is not training time
    bar.close()


# --- several runs side by side --------------------------------------------------------------
# On a Dask cluster (mclib.core.jobs): the local one by default, a running scheduler or a batch
# system when $MCLIB_CLUSTER (the CLI's --cluster) names one.

def parallel_runs(profile: Profile) -> int:
    """How many runs of `profile` train at once on the local cluster (`mclib.core.jobs.local_workers`):
    on the CPU with `train.threads` pinned, as many as the cores hold at that many threads
    each; on a GPU, or with torch's default threads (0), one run at a time."""
    from .jobs import local_workers, needs_gpu

    return local_workers(profile.train.threads, needs_gpu(profile))


def _seed_stop(profile: Profile, after_drop: int | None):
    if after_drop is None:
        return None
    return stop_after_drop(profile.data.rank, after_drop, drop_column(profile))


def train_seed(profile: Profile, run_dir: Path, after_drop: int | None) -> Path:
    """One job of `seed_jobs`: train (or resume) the run, stopping `after_drop` steps past its
    drop; such a run (another seed: the book reads its metrics) keeps only its newest checkpoint
    under `checkpoints.keep: analysis`."""
    return train(profile, run_dir, progress=False, stop=_seed_stop(profile, after_drop),
                 newest_only=after_drop is not None)


def seed_jobs(profile: Profile, run_dir: str | Path) -> list[tuple[Profile, Path, int | None]]:
    """The runs of `seed_run_dirs` that are not complete, as `train_seed` arguments
    (profile, folder, after_drop), the book's run first. The book's run trains to the
    profile's last step; the others stop `analysis.after_drop` steps after their drop
    (None: they too train to the last step), since what the book reads from them is the drop."""
    after = profile.analysis.after_drop
    profile = with_device(profile)
    jobs = [(profile.replace(seed=s), d, None if s == profile.seed else after)
            for s, d in seed_run_dirs(profile, run_dir).items()]
    return [job for job in jobs if not is_complete(job[0], job[1], _seed_stop(job[0], job[2]))]


def train_seeds(profile: Profile, run_dir: str | Path, cluster: str | None = None) -> dict[int, Path]:
    """Train (resume, or find complete) every run of `seed_run_dirs`, side by side on a
    Dask cluster (`mclib.core.jobs.run_profile_jobs`; cluster: its address, default the local
    one or $MCLIB_CLUSTER); returns {seed: folder}. Nothing starts when all are complete."""
    from .jobs import run_profile_jobs

    run_profile_jobs(profile, train_seed, seed_jobs(profile, run_dir), cluster)
    return seed_run_dirs(profile, run_dir)
