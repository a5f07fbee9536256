"""The training loop (docs/protocol.md, §1.4): `train`, `train_group`, and the seeds side by side.

A run lives in one folder (`mclib.core.runs`), trained by one process at a time (`only_trainer`).
Training a folder again resumes from its newest checkpoint; on the CPU the result is
bit-identical to an uninterrupted run. Logged metrics are those of the training batch's own
forward pass, before the update (the authors re-ran the model after it); `eval_*` columns are
fresh matrices every `eval_every` steps. A run whose checkpoints would not fit its disk is
refused before it starts (`check_disk`). The step and the run are `mclib.core.step`; several
runs go to a Dask cluster through `mclib.core.jobs`.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock, Timeout
from tqdm.auto import tqdm

from .checkpoints import check_disk
from .config import Profile
from .ending import is_complete, record_end, stop_after_drop
from .jobs import local_workers, needs_gpu, run_profile_jobs
from .metrics import LOSS_NAMES, drop_column
from .model import MatrixBert
from .precision import resolve_device, set_precision, with_device
from .runs import LOCK, seed_run_dirs
from .step import TrainingRun, train_step
from .variants import auto_step

log = logging.getLogger(__name__)


def train(
    profile: Profile,
    run_dir: str | Path,
    progress: bool = True,
    stop: Callable[[list[dict]], bool] | None = None,
    init_model: MatrixBert | None = None,
    *,
    newest_only: bool = False,
    deadline: float | None = None,
) -> Path:
    """Train (or resume) `profile` in `run_dir` and return it; the arguments are `Job`'s, and
    deadline (a `time.time()`) or SIGTERM/SIGINT saves a resumable checkpoint and ends "cut"."""
    return train_group(
        [Job(profile, Path(run_dir), stop, init_model, newest_only)], progress=progress, deadline=deadline
    )[0]


@dataclass
class Job:
    """One run of a `train_group` call: what `train` takes."""

    profile: Profile
    run_dir: Path
    stop: Callable[[list[dict]], bool] | None = (
        None  # asked with the rows at every flush: True ends the run ("stopped")
    )
    init_model: MatrixBert | None = (
        None  # start from this model (E15); its frozen parameters stay frozen on resume
    )
    newest_only: bool = False  # with checkpoints.keep: analysis, keep only the newest checkpoint


def process_key(profile: Profile) -> tuple:
    """What runs of one `train_group` call must share (device, precision, torch threads): process-wide
    settings. Everything else may differ."""
    t = profile.train
    return str(resolve_device(t.device)), t.precision, t.threads


def train_group(jobs: list[Job], progress: bool = False, deadline: float | None = None) -> list[Path]:
    """Train (or resume) several runs in one process, stepped one after another, each with its own
    model and Adam (so its numbers do not depend on its neighbours). Returns the folders."""
    if not jobs:
        return []
    if len({process_key(j.profile) for j in jobs}) > 1:
        raise ValueError(
            "runs trained in one process need equal process_key(profile) (device, precision, threads): "
            + ", ".join(f"{j.run_dir}" for j in jobs)
        )
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
    """An exclusive lock on run_dir/.lock while this process trains the folder (the OS drops it
    when the process dies); a second trainer gets a one-line error."""
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
    """While training, SIGTERM and SIGINT ask the loop to save and end "cut"; a second signal raises
    KeyboardInterrupt. Installed only in the main thread (not in a Dask worker's)."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning(
            f"mclib: {signal.Signals(signum).name}: saving at the next step, then ending (again: stop now)"
        )

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _train(jobs: list[Job], progress: bool, deadline: float | None = None) -> None:
    """The loop. Each pass: runs that have ended record their end and leave; one `train_step` of
    the others; then per run: evaluate (every eval_every), flush and ask the stop rule (every
    log_every), checkpoint (every save_every and at the end). On a cut (`deadline` or a signal)
    every run flushes, saves a resumable checkpoint and ends "cut"."""
    t = jobs[0].profile.train
    device = resolve_device(t.device)
    set_precision(device, t.precision)
    if t.threads:
        torch.set_num_threads(t.threads)
    runs = [TrainingRun(j, device, chosen=auto_step(j.profile, device)) for j in jobs]  # set up, or resume
    training = [r for r in runs if not r.finished]
    check_disk([(r.profile, r.dir, r.job.newest_only) for r in training])
    lead = (training or runs)[0]
    bar = tqdm(
        total=lead.t.steps,
        initial=lead.step,
        desc=f"train {lead.profile.name}",
        disable=not progress or not training,
        unit="step",
        dynamic_ncols=True,
    )
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
            flushing = [
                i for i, r in enumerate(runs) if cut or r.step % r.t.log_every == 0 or r.step in r.save_at
            ]
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


# --- several runs side by side, on a Dask cluster (mclib.core.jobs) --------------------------


def parallel_runs(profile: Profile) -> int:
    """How many runs of `profile` train at once on the local cluster
    (`mclib.core.jobs.local_workers`)."""
    return local_workers(profile.train.threads, needs_gpu(profile))


def _seed_stop(profile: Profile, after_drop: int | None):
    if after_drop is None:
        return None
    return stop_after_drop(profile.data.rank, after_drop, drop_column(profile))


def train_seed(profile: Profile, run_dir: Path, after_drop: int | None) -> Path:
    """One job of `seed_jobs`: train (or resume) the run, stopping `after_drop` steps past its drop
    (then keeping only its newest checkpoint)."""
    return train(
        profile,
        run_dir,
        progress=False,
        stop=_seed_stop(profile, after_drop),
        newest_only=after_drop is not None,
    )


def seed_jobs(profile: Profile, run_dir: str | Path) -> list[tuple[Profile, Path, int | None]]:
    """The incomplete runs of `seed_run_dirs` as `train_seed` arguments (profile, folder, after_drop),
    the book's run first: it trains to the last step, the others stop `analysis.after_drop` steps
    after their drop (None: to the last step)."""
    after = profile.analysis.after_drop
    profile = with_device(profile)
    jobs = [
        (profile.replace(seed=s), d, None if s == profile.seed else after)
        for s, d in seed_run_dirs(profile, run_dir).items()
    ]
    return [job for job in jobs if not is_complete(job[0], job[1], _seed_stop(job[0], job[2]))]


def train_seeds(profile: Profile, run_dir: str | Path, cluster: str | None = None) -> dict[int, Path]:
    """Train (or find complete) every run of `seed_run_dirs` on a Dask cluster (`cluster`: its
    address, default local or $MCLIB_CLUSTER); returns {seed: folder}."""
    run_profile_jobs(profile, train_seed, seed_jobs(profile, run_dir), cluster)
    return seed_run_dirs(profile, run_dir)
