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
`sweep.json` naming the sweep that trains it. One row per finished run is appended to
the results table (default RUNS/STEM.csv; `scripts/sweep_cpu_profile.py` appends to
docs/data/cpu_sweep.csv) the moment it finishes, and its loss curve, thinned, to the
curves table beside it (STEM_curves.csv, `keep_curves`), so that a committed table keeps
the curves after the run folders are gone; a figure (default RUNS/STEM.png) is drawn
from the two.

Resumable: a run that already has its row (same sweep file name, setting and seed) is
skipped; a run that was cut (sweep killed, worker lost) continues from its newest
checkpoint, and its cap counts training time since the sweep first started it. A folder
left by another sweep is started afresh unless `resume: true`.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from .config import ConfigError, Profile, load_profile, profile_path, read_yaml
from .metrics import DROP_WINDOW
from .runs import METRICS, run_name

TOP_KEYS = ("base", "cap_minutes", "after_drop", "seeds", "order", "resume", "threads", "cluster", "settings")
ORDERS = ("by-setting", "by-seed")
SETTING_KEYS = ("name", "overrides", "cap_minutes", "after_drop", "resume", "seeds")
EVENT = "mclib-sweep"  # the Dask event topic on which runs report their step


@dataclass
class SweepRun:
    """One run of a sweep: what a worker needs to train it and to write its row."""
    sweep: str                  # the sweep file's name (the results table's `sweep` column)
    setting: str
    seed: int
    overrides: dict[str, Any]
    profile: Profile            # base + overrides + seed + threads
    run_dir: Path
    cap_minutes: float | None = None
    after_drop: int | None = None
    resume: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.setting} s{self.seed}"


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


# --- in a worker --------------------------------------------------------------------------

def _report(run: SweepRun, step: int, state: str) -> None:
    """Tell the client this run's step (a Dask event; nothing outside a worker)."""
    try:
        from distributed import get_worker

        get_worker().log_event(EVENT, {"run": run.label, "step": step, "steps": run.profile.train.steps,
                                       "state": state})
    except (ImportError, ValueError):
        pass


def _start_wall(run: SweepRun) -> float:
    """The run's training time when this sweep first started it (its cap counts from there),
    kept in the folder's sweep.json; a folder of another sweep is removed unless resume."""
    from .checkpoints import train_wall
    from .runs import SWEEP_MARKER, write_atomic

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
    write_atomic(marker, lambda tmp: tmp.write_text(json.dumps({**mine, "wall0": wall0})))
    return wall0


def train_sweep_run(run: SweepRun) -> dict:
    """Train (or resume, or find stopped) one run of a sweep; its results row. Runs on a worker."""
    from .ending import stop_after_drop
    from .metrics import drop_column
    from .train import train

    wall0 = _start_wall(run)
    past_drop = (stop_after_drop(run.profile.data.rank, run.after_drop, drop_column(run.profile))
                 if run.after_drop is not None else None)
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
    """The levers of a run, resolved (the base profile may change between rounds, so a
    row names its whole setting, not only its overrides). Tables written before 9842a40 (2026-11-26)
    removed the CPU search's levers keep their columns (mix_rank, mix_fraction,
    position_init_std, attn_logit_scale, qk_norm, optimizer, embedding_lr); a row appended
    now leaves them empty (`append_row`)."""
    d, m, t = profile.data, profile.model, profile.train
    return {"n": d.n, "rank": d.rank, "p_mask": d.p_mask,
            "kind": m.kind, "layers": m.layers, "heads": m.heads, "hidden": m.hidden, "init_std": m.init_std,
            "attn_bias": m.attn_bias, "attn_bias_target": m.attn_bias_target,
            "batch": t.batch, "lr": t.lr, "warmup": t.warmup, "beta2": t.beta2, "grad_clip": t.grad_clip}


def end_rule(profile: Profile) -> str:
    """How a run's length was decided, for its row: "steps" (a fixed length) or "slope
    WINDOW MIN" (`mclib.core.metrics.converged`: the fitted slope over WINDOW steps, under
    MIN per 1 000 steps). Rows written before 2026-11-25 read "window-means 1000 0.05":
    the rule of the time compared two 1 000-step means, and ended runs earlier."""
    t = profile.train
    return "steps" if t.until == "steps" else f"slope {t.patience} {t.min_improvement:g}"


def how_it_ended(end, drop: int | None, steps: int, after_drop: int | None) -> str:
    """The row's `ended`: the run's own ending (`mclib.core.ending.RunEnd.ended`: converged,
    cap, steps, unfinished), with a sweep's stop told apart: "after drop" (the sweep's
    after_drop) or "wall cap" (its cap_minutes, the only other stop a sweep makes)."""
    if end is None:
        return "unfinished"
    if end.ended != "stopped":
        return end.ended
    return "after drop" if after_drop is not None and drop is not None and steps >= drop + after_drop else "wall cap"


def summarise(run: SweepRun) -> dict:
    """One results row from a run folder (also for a run that was stopped by hand). The
    setting is the one the run saved, not the base profile as it is now."""
    from .ending import run_end
    from .metrics import drop_column, find_drop, plateau_stats
    from .runs import load_metrics, run_profile

    profile = run_profile(run.run_dir)
    m = load_metrics(run.run_dir)
    drop = find_drop(m, profile.data.rank, column=drop_column(profile))
    wall = float(m["wall"].dropna().iloc[-1])
    steps = int(m["step"].iloc[-1])
    ms_per_step = 1000 * wall / steps  # drop_minutes is the drop step at this mean pace (also over a resume)
    stats = plateau_stats(m, drop)
    return {"setting": run.setting, "seed": run.seed, "overrides": json.dumps(run.overrides),
            "drop_step": drop, "drop_minutes": None if drop is None else round(drop * ms_per_step / 60000, 2),
            "steps_run": steps, "ms_per_step": round(ms_per_step, 1),
            "threads": profile.train.threads, **{k: round(v, 5) for k, v in stats.items()},
            "cap_minutes": run.cap_minutes, "end_rule": end_rule(profile),
            "ended": how_it_ended(run_end(run.run_dir), drop, steps, run.after_drop), "date": time.strftime("%Y-%m-%d"),
            "matrices": steps * profile.train.batch, **setting_columns(profile),
            "wall_minutes": round(wall / 60, 2), "sweep": run.sweep, **run.extra}


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
    tmp = results.with_name(".tmp-" + results.name)
    pd.concat([old, pd.DataFrame([row])], ignore_index=True).to_csv(tmp, index=False)
    os.replace(tmp, results)


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
              progress_every: float = 30.0, out=None) -> int:
    """Run a sweep file (module doc); returns the number of runs that failed (0: all done).
    Progress lines go to `out` (default: sys.stdout)."""
    out = out or sys.stdout
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
    print(f"sweep {path.name}: {len(todo)} runs, {done} already in {results}, {len(pending)} to train", file=out,
          flush=True)

    def record():  # after each row: its curve kept beside the table, and the figure drawn from both
        keep_curves(results, path.name, Path(runs))
        draw_figure(results, path.name, figure)

    if pending and resolve_address(cluster) is None:
        check_fits(pending)  # this machine trains them: refuse a row that cannot fit, before any starts
    if pending:
        gpu = any(needs_gpu(r.profile) for r in pending)
        with dask_cluster(cluster, threads_per_run=pending[0].profile.train.threads, gpu=gpu) as client:
            done, failed = _drive(client, pending, results, path.name, done, every=progress_every, out=out,
                                  redraw=record)
    record()
    for label, error in failed:
        print(f"sweep {path.name}: {label} failed: {error}", file=out)
    print(f"sweep {path.name}: {done} of {len(todo)} runs done, {len(failed)} failed; table {results}, "
          f"figure {figure}", file=out, flush=True)
    return len(failed)


def _drive(client, pending: list[SweepRun], results: Path, name: str, done: int, *, every: float, out, redraw):
    """Submit the pending runs and wait, appending each finished run's row to `results` and
    redrawing the figure after it (a sweep cut by a wall cap still leaves a figure of its
    rows); a progress line every `every` seconds. Returns (done, failed)."""
    from .jobs import resources_for

    # priority: the runs start in the sweep's order (`order`); without it Dask orders tasks
    # submitted together by their keys, i.e. alphabetically by setting name
    futures = {client.submit(train_sweep_run, r, key=f"sweep-{run_name(r.setting, r.seed)}-{os.urandom(4).hex()}",
                             pure=False, resources=resources_for(r.profile), priority=len(pending) - i): r
               for i, r in enumerate(pending)}
    left, failed, last = set(futures), [], 0.0
    while left:
        time.sleep(0.5)
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
            print(_progress_line(name, done, len(failed), len(left) - len(running), running), file=out, flush=True)
    return done, failed


CURVE_POINTS = 200  # points kept per run, spaced evenly in log(step): enough for a log-x plot


def curves_path(results: Path) -> Path:
    """Where the curves of a results table are kept: beside it, STEM_curves.csv."""
    return results.with_name(f"{results.stem}_curves.csv")


def thinned_curve(m, points: int = CURVE_POINTS):
    """A run's L_mask curve (`m`: its metrics table) as `find_drop` reads it (the trailing
    DROP_WINDOW-step mean of the training batch), at `points` logged steps spaced evenly in
    log(step), the last step included. Columns: step, L_mask."""
    import numpy as np

    smooth = m["L_mask"].rolling(DROP_WINDOW, min_periods=1).mean()
    at = np.unique(np.geomspace(1, len(m), num=min(points, len(m))).round().astype(int) - 1)
    return m.iloc[at][["step"]].assign(L_mask=smooth.iloc[at].round(6).to_numpy()).reset_index(drop=True)


def keep_curves(results: Path, sweep: str, runs: Path) -> int:
    """Write the curves table (`curves_path`): for every row of `sweep` in `results` whose
    run folder is here and ended at the row's `steps_run`, its thinned curve
    (`thinned_curve`), taken afresh (a row trained again replaces its old curve); for the
    other rows, the curve kept before, if any (a folder on another machine, or one that is
    not this row's run). Written atomically (`write_atomic`). Returns the number of rows
    with a curve."""
    import pandas as pd

    from .runs import load_metrics, write_atomic

    if not results.is_file():
        return 0
    rows = pd.read_csv(results)
    rows = rows[rows["sweep"] == sweep] if "sweep" in rows.columns else rows.assign(sweep=sweep)
    path = curves_path(results)
    columns = ["sweep", "setting", "seed", "step", "L_mask"]
    old = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=columns)
    kept = {k: c for k, c in old.groupby(["sweep", "setting", "seed"])}
    table = [c for (w, _, _), c in kept.items() if w != sweep]   # other sweeps' curves, as they were
    for row in rows.itertuples():
        folder = runs / run_name(row.setting, int(row.seed))
        m = load_metrics(folder) if (folder / METRICS).is_file() else None
        here = m is not None and int(m["step"].iloc[-1]) == int(row.steps_run)
        curve = (thinned_curve(m).assign(sweep=sweep, setting=row.setting, seed=int(row.seed)) if here
                 else kept.get((sweep, row.setting, int(row.seed))))
        if curve is not None:
            table.append(curve[columns])
    whole = pd.concat(table, ignore_index=True) if table else pd.DataFrame(columns=columns)
    write_atomic(path, lambda tmp: whole.to_csv(tmp, index=False))
    return sum(1 for c in table if (c["sweep"] == sweep).all())


def setting_colours(settings: list[str]) -> dict[str, tuple]:
    """A colour per setting, distinct up to 20 settings (tab10, then tab20: a sweep of 11
    settings would reuse tab10's first colour for its last)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(settings) <= 10 else "tab20"]
    return {s: cmap(i % cmap.N) for i, s in enumerate(settings)}


def draw_figure(results: Path, sweep: str, path: Path) -> Path | None:
    """The runs of `sweep` in the results table: L_mask against matrices seen, one line per
    run (a colour per setting) from the curves table (`keep_curves`), beside each run's
    drop (a dot), or how far it got without one (a hollow triangle), by setting. A run
    with no kept curve has no line, and the title says how many of the runs are drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    if not results.is_file():
        return None
    df = pd.read_csv(results)
    df = df[df["sweep"] == sweep] if "sweep" in df.columns else df
    if df.empty:
        return None
    kept = pd.read_csv(curves_path(results)) if curves_path(results).is_file() else None
    curves = {} if kept is None else {k: c for k, c in kept[kept["sweep"] == sweep].groupby(["setting", "seed"])}
    settings = list(dict.fromkeys(df["setting"]))
    colours = setting_colours(settings)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    drawn = 0
    for row in df.itertuples():
        curve = curves.get((row.setting, int(row.seed)))
        if curve is not None:
            drawn += 1
            left.plot(curve["step"] * row.batch, curve["L_mask"], color=colours[row.setting], lw=0.8, alpha=0.8)
        if pd.notna(row.drop_step):
            right.scatter([settings.index(row.setting)], [row.drop_step * row.batch], color=colours[row.setting], s=40)
        else:
            right.scatter([settings.index(row.setting)], [row.matrices], color=colours[row.setting], marker="^",
                          facecolors="none", s=40)
    for s in settings:
        left.plot([], [], color=colours[s], label=s)
    which = "every run" if drawn == len(df) else f"{drawn} of {len(df)} runs (the others' curves were not kept)"
    left.set(xlabel="matrices seen", ylabel=f"L_mask (training batch, {DROP_WINDOW}-step mean)")
    left.set_title(f"{sweep}: {which}", fontsize=10)
    if drawn:
        left.set(xscale="log", yscale="log")
        left.legend(fontsize=7)
    else:
        left.text(0.5, 0.5, f"no curve kept in {curves_path(results)}", ha="center", transform=left.transAxes)
    right.set_xticks(range(len(settings)), settings, rotation=30, ha="right", fontsize=7)
    right.set(yscale="log", ylabel="matrices seen", title="drop (dot) or none by (triangle)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
