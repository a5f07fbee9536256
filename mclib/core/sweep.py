"""Sweeps: profile overrides x seeds on a Dask cluster (`python -m mclib sweep FILE.yaml`).

A sweep file (sweeps/*.yaml):

    base: cpu-7x7            # a profile name (params/NAME.yaml) or a YAML path
    cap_minutes: 30          # optional: a run stops after this much training time
    after_drop: 300          # optional: a run stops this many steps after its drop
    seeds: [1, 2]
    order: by-seed           # optional: seed 1 of every setting before seed 2 of any (default by-setting)
    resume: false            # true: continue runs of an earlier sweep with the same names
    threads: 1               # optional: torch threads a run (default: the base profile's, else 1)
    cluster: tcp://HOST:8786 # optional: where the runs go (default: this machine)
    settings:
      - {name: h64-lr1e-3, overrides: {train.lr: 1.0e-3}}
      - {name: wide, overrides: {model.hidden: 128}, seeds: [1], cap_minutes: 60}

`cap_minutes`, `after_drop`, `resume` and `seeds` may also be given per setting. Every key
(the schema `_Sweep`) and every profile is checked before anything runs (a bad one: a one-line
`ConfigError` naming the file, the key and the value). A
run stops at its profile's steps, its cap, or `after_drop` steps past its drop, whichever
comes first. Runs live in RUNS/NAME-seedS (default runs/sweep/), trained by workers
(`mclib.core.sweep_run`); each finished run appends its row to the results table (default
RUNS/STEM.csv) and its thinned curve to STEM_curves.csv, and the figure (RUNS/STEM.png) is
redrawn from both (`mclib.core.sweep_figure`). Resumable: a run with a row is skipped, a cut
one continues from its newest checkpoint (its cap counting from the sweep's first start), a
folder of another sweep is started afresh unless `resume: true`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import torch
from pydantic import ValidationError

from .atomic import write_atomic
from .config import ConfigError, load_profile, profile_path, read_yaml
from .flops import train_memory_bytes
from .jobs import cluster as dask_cluster
from .jobs import first_done, needs_gpu, resolve_address, resources_for
from .precision import with_device
from .runs import run_name
from .schema import NOT_NEGATIVE, Bool, Float, Int, Schema, Str, at_least_one, check, one_of, problems
from .sweep_figure import draw_figure, keep_curves
from .sweep_run import EVENT, SweepRun, train_sweep_run

log = logging.getLogger(__name__)

ORDERS = ("by-setting", "by-seed")

NonNegFloat, NonNegInt = Annotated[Float, NOT_NEGATIVE], Annotated[Int, NOT_NEGATIVE]
Seeds = Annotated[list[Int], at_least_one("seed")]


class _Setting(Schema):
    name: Annotated[Str, check(lambda v: bool(v) and "/" not in v, "is not a folder name")]
    overrides: dict[str, Any] | None = None  # dotted profile keys (Profile.replace), checked with the base
    cap_minutes: NonNegFloat | None = None  # these four: the sweep's own where not given
    after_drop: NonNegInt | None = None
    resume: Bool | None = None
    seeds: Seeds | None = None


class _Sweep(Schema):
    base: Str = "cpu"
    cap_minutes: NonNegFloat | None = None
    after_drop: NonNegInt | None = None
    seeds: Seeds | None = None  # None: the base profile's seed
    order: Annotated[Str, one_of(ORDERS)] = ORDERS[0]
    resume: Bool = False
    threads: NonNegInt | None = None
    cluster: Str | None = None
    settings: Annotated[list[_Setting], at_least_one("setting")]


def read_sweep(path: str | Path) -> _Sweep:
    """The sweep file at `path`, checked against its schema; the first bad key or value is a
    ConfigError of one line naming the file, the key and the value."""
    try:
        return _Sweep.model_validate(read_yaml(path, "sweep"))
    except ValidationError as e:
        raise ConfigError(f"{path}: {problems(e, _Sweep, 'sweep')[0][1]}") from None


def load_sweep(
    path: str | Path, runs: str | Path = "runs/sweep", threads: int | None = None
) -> list[SweepRun]:
    """Every run of the sweep file at `path`, checked (keys, values, each run's profile)."""
    path = Path(path)
    spec = read_sweep(path)
    base = load_profile(profile_path(spec.base))
    threads = threads if threads is not None else spec.threads
    if threads is None:
        threads = base.train.threads or 1
    out, rank, names = [], [], set()  # rank: the run's place among its setting's seeds
    for i, s in enumerate(spec.settings):
        here = f"{path}: settings[{i}]"
        if s.name in names:
            raise ConfigError(f"{here}.name = {s.name!r} is used twice")
        names.add(s.name)
        given = s.model_fields_set  # a key given as null (cap_minutes: null) is null here, not the sweep's
        cap = s.cap_minutes if "cap_minutes" in given else spec.cap_minutes
        after = s.after_drop if "after_drop" in given else spec.after_drop
        resume = s.resume if s.resume is not None else spec.resume
        overrides = s.overrides or {}
        for nth, seed in enumerate(s.seeds or spec.seeds or [base.seed]):
            try:
                profile = base.replace(**{**overrides, "seed": seed, "train.threads": threads})
            except ConfigError as e:
                raise ConfigError(f"{here} ({s.name}): {e}") from None
            out.append(
                SweepRun(
                    path.name,
                    s.name,
                    seed,
                    overrides,
                    profile,
                    Path(runs) / run_name(s.name, seed),
                    cap,
                    after,
                    resume,
                )
            )
            rank.append(nth)
    if spec.order == "by-seed":  # stable: within one seed rank, settings keep the file's order
        out = [r for _, r in sorted(zip(rank, out), key=lambda pair: pair[0])]
    return out


def sweep_cluster(path: str | Path) -> str | None:
    """The `cluster` key of a sweep file (None: not given)."""
    return read_sweep(path).cluster


# --- in the client ----------------------------------------------------------------------


def finished(results: Path, runs: list[SweepRun]) -> set[tuple[str, str, int]]:
    """(sweep, setting, seed) of the runs that already have a row in `results`."""
    if not results.is_file():
        return set()
    old = pd.read_csv(results)
    if not {"sweep", "setting", "seed"} <= set(old.columns):
        return set()
    return {(str(a), str(b), int(c)) for a, b, c in zip(old["sweep"], old["setting"], old["seed"])}


def append_row(results: Path, row: dict) -> None:
    """Add one row to the results table (written whole to a temporary file, then renamed)."""
    results.parent.mkdir(parents=True, exist_ok=True)
    old = pd.read_csv(results) if results.exists() else pd.DataFrame()
    write_atomic(results, pd.concat([old, pd.DataFrame([row])], ignore_index=True).to_csv(index=False))


def _progress_line(
    name: str, done: int, failed: int, waiting: int, running: dict[str, tuple[int, int]]
) -> str:
    each = ", ".join(f"{label} step {step}/{steps}" for label, (step, steps) in sorted(running.items()))
    return (
        f"sweep {name}: {done} done, {len(running)} running{f' ({each})' if each else ''}, "
        f"{failed} failed, {waiting} waiting"
    )


def memory_here(device: str) -> int | None:
    """Bytes of memory a run on `device` can have here: the first GPU's, or physical RAM (None: unknown)."""
    if device == "cuda":
        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(runs: list[SweepRun]) -> None:
    """Refuse, in one line naming the setting, a sweep run that would not fit this machine's memory
    (`mclib.core.flops.train_memory_bytes`, an upper bound)."""
    for r in runs:
        need, have = train_memory_bytes(r.profile), memory_here(r.profile.train.device)
        if have is not None and need > have:
            raise ConfigError(
                f"sweep setting {r.setting}: a run needs about {need / 2**30:.1f} GiB "
                f"(mclib.core.flops.train_memory_bytes) but {r.profile.train.device} here has "
                f"{have / 2**30:.1f} GiB; make train.batch or the model smaller"
            )


def run_sweep(
    path: str | Path,
    cluster: str | None = None,
    runs: str | Path = "runs/sweep",
    results: str | Path | None = None,
    figure: str | Path | None = None,
    *,
    threads: int | None = None,
    progress_every: float = 30.0,
) -> int:
    """Run a sweep file (module doc); returns the number of runs that failed (0: all done).
    Progress lines are logged (INFO: `python -m mclib sweep` prints them on stdout)."""
    path = Path(path)
    todo = load_sweep(path, runs, threads)  # every key and profile checked before anything runs
    for r in todo:
        r.profile = with_device(r.profile)  # resolved here, once: the workers train where this process chose
    if cluster is None:
        cluster = sweep_cluster(path)
    results = Path(results) if results else Path(runs) / f"{path.stem}.csv"
    figure = Path(figure) if figure else Path(runs) / f"{path.stem}.png"
    have = finished(results, todo)
    pending = [r for r in todo if (r.sweep, r.setting, r.seed) not in have]
    done, failed = len(todo) - len(pending), []
    log.info(f"sweep {path.name}: {len(todo)} runs, {done} already in {results}, {len(pending)} to train")

    def record():  # after each row: its curve kept beside the table, and the figure drawn from both
        keep_curves(results, path.name, Path(runs))
        draw_figure(results, path.name, figure)

    if pending and resolve_address(cluster) is None:
        check_fits(pending)  # this machine trains them: refuse a row that cannot fit, before any starts
    if pending:
        gpu = any(needs_gpu(r.profile) for r in pending)
        with dask_cluster(cluster, threads_per_run=pending[0].profile.train.threads, gpu=gpu) as client:
            done, failed = _drive(
                client, pending, results, path.name, done, every=progress_every, redraw=record
            )
    record()
    for label, error in failed:
        log.info(f"sweep {path.name}: {label} failed: {error}")
    log.info(
        f"sweep {path.name}: {done} of {len(todo)} runs done, {len(failed)} failed; table {results}, "
        f"figure {figure}"
    )
    return len(failed)


def _drive(client, pending: list[SweepRun], results: Path, name: str, done: int, *, every: float, redraw):
    """Submit the pending runs in the sweep's order and wait, appending each finished run's row and
    redrawing; a progress line every `every` seconds. Returns (done, failed)."""
    # priority: the runs start in the sweep's order (`order`); without it Dask orders tasks
    # submitted together by their keys, i.e. alphabetically by setting name
    futures = {
        client.submit(
            train_sweep_run,
            r,
            key=f"sweep-{run_name(r.setting, r.seed)}-{os.urandom(4).hex()}",
            pure=False,
            resources=resources_for(r.profile),
            priority=len(pending) - i,
        ): r
        for i, r in enumerate(pending)
    }
    left, failed, last = set(futures), [], 0.0
    while left:
        # woken by the first run to end, or when the next progress line is due
        first_done(client, list(left), max(0.05, every - (time.monotonic() - last)))
        finished_now = {f for f in left if f.done()}
        left -= finished_now
        for f in finished_now:
            run = futures[f]
            if f.status == "finished":
                append_row(results, f.result())
                redraw()
                done += 1
            else:
                error = f.exception()
                failed.append(
                    (run.label, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
                )
        if finished_now or time.monotonic() - last >= every:
            last = time.monotonic()
            steps: dict[str, tuple[int, int]] = {}
            for _, event in client.get_events(EVENT):
                steps[event["run"]] = (event["step"], event["steps"]) if event["state"] == "running" else None
            running = {futures[f].label: steps[futures[f].label] for f in left if steps.get(futures[f].label)}
            log.info(_progress_line(name, done, len(failed), len(left) - len(running), running))
    return done, failed
