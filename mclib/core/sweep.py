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

`cap_minutes`, `after_drop`, `resume` and `seeds` may also be given per setting. Runs
start in file order, each setting's seeds in turn (`order: by-setting`), or with
`order: by-seed` the first seed of every setting before the second of any, so that a sweep
cut short has read every setting once. Every
key and every profile the sweep would train is checked before anything runs: a bad one
is a one-line `ConfigError` naming it. A run stops at its profile's steps, at its cap or
`after_drop` steps past its drop (`mclib.core.metrics.find_drop`), whichever comes first.

Runs live in RUNS/NAME-seedS (default runs/sweep/), each an ordinary run folder with a
`sweep.json` naming the sweep that trains it; a worker trains each (`mclib.core.sweep_run`).
One row per finished run is appended to the results table (default RUNS/STEM.csv;
`scripts/sweep_cpu_profile.py` appends to docs/data/cpu_sweep.csv) the moment it finishes,
and its loss curve, thinned, to the curves table beside it (STEM_curves.csv,
`mclib.core.sweep_figure.keep_curves`), so that a committed table keeps the curves after the
run folders are gone; a figure (default RUNS/STEM.png) is drawn from the two.

Resumable: a run that already has its row (same sweep file name, setting and seed) is
skipped; a run that was cut (sweep killed, worker lost) continues from its newest
checkpoint, and its cap counts training time since the sweep first started it. A folder
left by another sweep is started afresh unless `resume: true`.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from .atomic import write_atomic
from .config import ConfigError, load_profile, profile_path, read_yaml
from .runs import run_name
from .sweep_figure import draw_figure, keep_curves
from .sweep_run import EVENT, SweepRun, train_sweep_run

log = logging.getLogger(__name__)

TOP_KEYS = ("base", "cap_minutes", "after_drop", "seeds", "order", "resume", "threads", "cluster", "settings")
ORDERS = ("by-setting", "by-seed")
SETTING_KEYS = ("name", "overrides", "cap_minutes", "after_drop", "resume", "seeds")


def _check_keys(raw: Any, known: tuple, where: str) -> None:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} is not a mapping")
    for key in raw:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key} (known: {', '.join(known)})")


def _number(value, key: str, where: str, kind=float, allow_none=True):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ConfigError(f"{where}: {key} = {value!r} is not {'an integer' if kind is int else 'a number'}")
    if value < 0:
        raise ConfigError(f"{where}: {key} = {value!r} must not be negative")
    return kind(value)


def _seeds(value, where: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise ConfigError(f"{where}: seeds = {value!r} is not a non-empty list of integers")
    return value


def load_sweep(path: str | Path, runs: str | Path = "runs/sweep", threads: int | None = None) -> list[SweepRun]:
    """Every run of the sweep file at `path`, checked (keys, values, each run's profile)."""
    path = Path(path)
    spec = read_yaml(path, "sweep")
    where = str(path)
    _check_keys(spec, TOP_KEYS, where)
    if not isinstance(spec.get("settings"), list) or not spec["settings"]:
        raise ConfigError(f"{where}: settings must be a non-empty list of {{name, overrides}}")
    base = load_profile(profile_path(str(spec.get("base", "cpu"))))
    threads = threads if threads is not None else _number(spec.get("threads"), "threads", where, int)
    if threads is None:
        threads = base.train.threads or 1
    top = {"cap_minutes": _number(spec.get("cap_minutes"), "cap_minutes", where),
           "after_drop": _number(spec.get("after_drop"), "after_drop", where, int),
           "resume": bool(spec.get("resume", False)),
           "seeds": _seeds(spec.get("seeds", [base.seed]), where)}
    order = spec.get("order", ORDERS[0])
    if order not in ORDERS:
        raise ConfigError(f"{where}: order = {order!r} is not one of {', '.join(ORDERS)}")
    out, rank, names = [], [], set()  # rank: the run's place among its setting's seeds
    for i, s in enumerate(spec["settings"]):
        here = f"{where}: settings[{i}]"
        _check_keys(s, SETTING_KEYS, here)
        name = s.get("name")
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigError(f"{here}: name = {name!r} is not a folder name")
        if name in names:
            raise ConfigError(f"{here}: name {name!r} is used twice")
        names.add(name)
        overrides = s.get("overrides") or {}
        if not isinstance(overrides, dict):
            raise ConfigError(f"{here} ({name}): overrides = {overrides!r} is not a mapping")
        cap = _number(s.get("cap_minutes", top["cap_minutes"]), "cap_minutes", here)
        after = _number(s.get("after_drop", top["after_drop"]), "after_drop", here, int)
        seeds = _seeds(s.get("seeds", top["seeds"]), here)
        for nth, seed in enumerate(seeds):
            try:
                profile = base.replace(**{**overrides, "seed": seed, "train.threads": threads})
            except ConfigError as e:
                raise ConfigError(f"{here} ({name}): {e}") from None
            except (TypeError, KeyError, AttributeError) as e:  # an override whose section is not a profile's
                raise ConfigError(f"{here} ({name}): overrides: unknown key {e}") from None
            out.append(SweepRun(path.name, name, seed, overrides, profile, Path(runs) / run_name(name, seed),
                                cap, after, bool(s.get("resume", top["resume"]))))
            rank.append(nth)
    if order == "by-seed":  # stable: within one seed rank, settings keep the file's order
        out = [r for _, r in sorted(zip(rank, out), key=lambda pair: pair[0])]
    return out


def sweep_cluster(path: str | Path) -> str | None:
    """The `cluster` key of a sweep file (None: not given)."""
    spec = read_yaml(path, "sweep")
    return spec.get("cluster") if isinstance(spec, dict) else None


# --- in the client ----------------------------------------------------------------------

def finished(results: Path, runs: list[SweepRun]) -> set[tuple[str, str, int]]:
    """(sweep, setting, seed) of the runs that already have a row in `results`."""
    if not results.is_file():
        return set()
    import pandas as pd

    old = pd.read_csv(results)
    if not {"sweep", "setting", "seed"} <= set(old.columns):
        return set()
    return {(str(a), str(b), int(c)) for a, b, c in zip(old["sweep"], old["setting"], old["seed"])}


def append_row(results: Path, row: dict) -> None:
    """Add one row to the results table (written whole to a temporary file, then renamed)."""
    import pandas as pd

    results.parent.mkdir(parents=True, exist_ok=True)
    old = pd.read_csv(results) if results.exists() else pd.DataFrame()
    write_atomic(results, pd.concat([old, pd.DataFrame([row])], ignore_index=True).to_csv(index=False))


def _progress_line(name: str, done: int, failed: int, waiting: int, running: dict[str, tuple[int, int]]) -> str:
    each = ", ".join(f"{label} step {step}/{steps}" for label, (step, steps) in sorted(running.items()))
    return (f"sweep {name}: {done} done, {len(running)} running{f' ({each})' if each else ''}, "
            f"{failed} failed, {waiting} waiting")


def memory_here(device: str) -> int | None:
    """Bytes of memory a run on `device` can have on this machine: the first GPU's, or the
    physical RAM (None: unknown)."""
    import torch

    if device == "cuda":
        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(runs: list[SweepRun]) -> None:
    """Refuse, with one line naming the setting and its estimated size, a sweep whose rows
    would not fit in this machine's memory (`mclib.core.flops.train_memory_bytes`, an upper
    bound); a sweep sent to another cluster is checked by nobody here."""
    from .flops import train_memory_bytes

    for r in runs:
        need, have = train_memory_bytes(r.profile), memory_here(r.profile.train.device)
        if have is not None and need > have:
            raise ConfigError(f"sweep setting {r.setting}: a run needs about {need / 2**30:.1f} GiB "
                              f"(mclib.core.flops.train_memory_bytes) but {r.profile.train.device} here has "
                              f"{have / 2**30:.1f} GiB; make train.batch or the model smaller")


def run_sweep(path: str | Path, cluster: str | None = None, runs: str | Path = "runs/sweep",
              results: str | Path | None = None, figure: str | Path | None = None, *, threads: int | None = None,
              progress_every: float = 30.0) -> int:
    """Run a sweep file (module doc); returns the number of runs that failed (0: all done).
    Progress lines are logged (INFO: `python -m mclib sweep` prints them on stdout)."""
    from .jobs import cluster as dask_cluster
    from .jobs import needs_gpu, resolve_address

    path = Path(path)
    from .precision import with_device

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
            done, failed = _drive(client, pending, results, path.name, done, every=progress_every,
                                  redraw=record)
    record()
    for label, error in failed:
        log.info(f"sweep {path.name}: {label} failed: {error}")
    log.info(f"sweep {path.name}: {done} of {len(todo)} runs done, {len(failed)} failed; table {results}, "
             f"figure {figure}")
    return len(failed)


def _drive(client, pending: list[SweepRun], results: Path, name: str, done: int, *, every: float, redraw):
    """Submit the pending runs and wait, appending each finished run's row to `results` and
    redrawing the figure after it (a sweep cut by a wall cap still leaves a figure of its
    rows); a progress line every `every` seconds. Returns (done, failed)."""
    from .jobs import first_done, resources_for

    # priority: the runs start in the sweep's order (`order`); without it Dask orders tasks
    # submitted together by their keys, i.e. alphabetically by setting name
    futures = {client.submit(train_sweep_run, r, key=f"sweep-{run_name(r.setting, r.seed)}-{os.urandom(4).hex()}",
                             pure=False, resources=resources_for(r.profile), priority=len(pending) - i): r
               for i, r in enumerate(pending)}
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
                failed.append((run.label, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"))
        if finished_now or time.monotonic() - last >= every:
            last = time.monotonic()
            steps: dict[str, tuple[int, int]] = {}
            for _, event in client.get_events(EVENT):
                steps[event["run"]] = (event["step"], event["steps"]) if event["state"] == "running" else None
            running = {futures[f].label: steps[futures[f].label] for f in left if steps.get(futures[f].label)}
            log.info(_progress_line(name, done, len(failed), len(left) - len(running), running))
    return done, failed
