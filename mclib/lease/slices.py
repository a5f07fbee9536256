"""The paper book in slices, one GPU lease each (docs/gpu.md).

    results/paper-slices.yaml         the plan: the slices in order, what each trains and which
                                      chapters it executes, the step time they are sized with
    results/paper-SLICE-DEVICE-DATE/  a slice done: its runs' small files, executed chapters and
                                      slice.json (device, date, git revision, precision, ends)

A lease's commands are at most 10 minutes and the chapters must run where the weights are,
so a slice is two commands issued back to back (docs/gpu.md gives them exactly):

    python -m mclib slice start  --out-dir W --budget-s B --hold-s S   # refuses a slice that cannot
                                             # fit B seconds; trains detached under its deadline
    python -m mclib slice finish --out-dir W --dest $OUT --left-s L    # waits for it until its
                                             # deadline + 60 s, then stops it; executes the slice's
                                             # chapters (no site); packs results.tgz

Both hold to the device's limits: a command ends COMMAND_SPARE_S before COMMAND_S from when it
began (`--began`, scripts/lease.sh's clock), and the lease's end is the device time left that the
command is given (`--budget-s`, `--left-s`), less the results' way back. A `finish` with nothing
started (a refused `start`, no kit) packs a results.tgz that says why (REFUSED).

and, back on the CPU machine, `python -m mclib slice merge results.tgz` files it under
results/. `python -m mclib slice` alone (a GPU of one's own, no command limit) starts and
finishes the next slice in one process; `slice status` prints the ledger.

Inside a slice no chapter trains (`analysis.train_in_book: false`): training ran before,
and ended at the slice's deadline ("cut", end.json) or by its rule. E15's slices
(`Slice.freeze`) stop the book's run at a fixed step (`source_steps`), the same in each, then
train their group's E15 run from that checkpoint; slice.json's `freeze_ends` says how it ended.
"""
from __future__ import annotations

import datetime
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import yaml

from ..core.config import ConfigError, Profile, load_profile, profile_path, read_yaml
from ..core.repo import REPO, git_revision
from . import steptable
from ..core.runs import END, FREEZE, FREEZE_SOURCE, METRICS, PROFILE, SCORECARD, freeze_dir, run_name, write_atomic

LEDGER = REPO / "results" / "paper-slices.yaml"
STATE = "slice.json"           # in the work folder: the slice in flight; in a result folder: the slice done
RESULTS_TGZ = "results.tgz"    # what a lease sends back: one file (the device tool returns at most 8)
TRAIN_LOG = "slice-train.log"
RETURN_MIB = 16                # the largest file a lease sends back
RUN_FILES = (END, PROFILE, SCORECARD, "step.json")  # copied as they are (step.json: mclib.core.step.STEP_RAN);
                                                     # METRICS is gzipped
METRICS_GZ = METRICS + ".gz"
STEP_TABLE = "lease_step.csv"  # in the work folder: this lease's step measurement (benchmarks/lease_step.py)
STEP_TABLE_S = 3600            # older than this, a table is another lease's: not read
TRAINED_STEPS = ("eager", "compile", "reduce-overhead", "cuda-graph")  # the table's variants a slice may train with
COMPILED_STEPS = ("compile", "reduce-overhead")  # the trainer compiles them again: their first_s is paid again
COLLECT_S = 30                 # packing and the return, in a slice's time
MEASURE_S = 125                # the kit (at most 15 s) and the step's full measurement (at most 110 s) before a slice
CHECK_S = 45                   # the kit and the chosen variant's check alone, where the committed step table stands
                               # (mclib.lease.steptable)
RETURN_S = 20                  # the results' way back, outside the slice (scripts/lease.sh: LEFT_S less it)
COMMAND_S = 600                # the longest a command may run on the device: past it, the command is killed
COMMAND_SPARE_S = 20           # a command ends this long before COMMAND_S (its output's way back)
FINISH_GRACE_S = 60            # past the slice's deadline, the trainer's time to save and end by itself
STOP_S = 30                    # after SIGTERM (save and end "cut"), the trainer's time before it is killed
LOG_TAIL_KIB = 256             # of each log a lease packs, its last this many KiB
REFUSED = "slice-refused.txt"  # in the work folder: why no slice started (a refused `start`; lease.sh without the kit)
START_LOG = "lease-start.log"  # in the work folder: scripts/lease.sh start's output (the step, the plan, any refusal)
STEP_ERRORS = "lease_step_errors.log"  # beside the step table: each variant's traceback (benchmarks/lease_step.py)
LOGS = (START_LOG, TRAIN_LOG, STEP_ERRORS)  # packed (their tails) with every results.tgz


class SliceError(ConfigError):
    """A slice that cannot run (no time, nothing left, a bad ledger); one line."""


@dataclass
class Slice:
    name: str
    what: str
    seeds: list[int]
    chapters: list[str] = field(default_factory=list)
    train_s: float | None = None      # the training deadline; None: train until the run's own end
    min_train_s: float | None = None  # with train_s: the least a lease short of time may shorten it to
    chapters_s: float = 0.0           # the time its chapters may take
    expected_steps: int | None = None  # steps its runs need (a slice without train_s is sized by them)
    results_mib: float = 2.0          # what it may add under results/ (tests/test_travel.py sums them)
    source_steps: int | None = None   # the book's run stops at this step (E15's slices: every one starts
                                      # from the same weights), not at its deadline or its own end
    freeze: list[str] = field(default_factory=list)  # E15's groups trained from that step (`freeze_run`)
    freeze_steps: int | None = None   # their cap (analysis.freeze_steps) where the lease needs one
    min_steps: int | None = None      # the book's run must reach this step within the slice's deadline at
                                      # the step time measured in the lease, else another slice runs there
    valid_from: str | None = None     # a result of this slice dated before (YYYY-MM-DD) trained on an earlier
                                      # path: kept and shown until a newer one comes, but not done
    joins: list[str] = field(default_factory=list)  # slices this one runs together in one lease: it is
                                      # done when they all are, and they are done when it is

    def __post_init__(self):
        from ..analyses.interventions import GROUPS

        bad = [g for g in self.freeze if g not in GROUPS]
        if bad:
            raise SliceError(f"slice {self.name}: freeze group {bad[0]!r} is not one of {', '.join(GROUPS)}")
        if self.freeze and self.source_steps is None:
            raise SliceError(f"slice {self.name}: E15's runs (freeze) need source_steps, the step they start from")


def read_ledger(path: Path = LEDGER) -> dict:
    raw = read_yaml(path, "slice ledger", SliceError)
    try:
        raw["slices"] = [Slice(**s) for s in raw["slices"]]
        raw["name"] = load_profile(profile_path(raw["profile"])).name  # result folders: NAME-SLICE-DEVICE-DATE
    except (KeyError, TypeError) as e:
        raise SliceError(f"slice ledger {str(path)!r}: {e}") from None
    return raw


def record(folder: Path) -> dict:
    """A done slice's slice.json (device, date, git revision, precision, chapters, how runs ended)."""
    return json.loads((Path(folder) / STATE).read_text())


def done(root: Path = LEDGER.parent, name: str = "paper") -> dict[str, Path]:
    """{slice: result folder} of the slices done (a folder holding slice.json), the newest of
    each by the date its slice.json records (the folder's name on a tie)."""
    found = sorted(((record(path.parent).get("date", ""), path.parent.name, path.parent)
                    for path in root.glob(f"{name}-*/{STATE}")), key=lambda t: t[:2])
    return {record(folder)["slice"]: folder for _, _, folder in found}


def is_done(ledger: dict, s: Slice, have: dict[str, Path]) -> bool:
    """Whether slice `s` needs no lease: a result of its own dated from its `valid_from` on,
    a done slice that joins it, or (a joint slice) every slice it joins done."""
    def own(x: Slice) -> bool:
        return x.name in have and (x.valid_from is None or record(have[x.name]).get("date", "") >= x.valid_from)
    by_name = {x.name: x for x in ledger["slices"]}
    if own(s) or any(own(x) and s.name in x.joins for x in ledger["slices"]):
        return True
    return bool(s.joins) and all(n in by_name and own(by_name[n]) for n in s.joins)


def steps_needed(s: Slice) -> int | None:
    """The steps the slice's training must reach: its `min_steps`; for E15's slices the book's run
    to `source_steps` and each group's run to its cap; else its `expected_steps`."""
    if s.min_steps is not None:
        return s.min_steps
    if s.freeze and s.source_steps is not None and s.freeze_steps is not None:
        return s.source_steps + len(s.freeze) * s.freeze_steps
    return s.expected_steps


def why_not(ledger: dict, s: Slice, budget_s: float, step_ms: float) -> str | None:
    """Why slice `s` cannot run in a lease with `budget_s` left at `step_ms` a step (one
    clause), or None where it fits: its time at its floor, and for a slice with a deadline,
    the steps that deadline reaches against the steps it needs."""
    need = needed_s({**ledger, "step_ms": step_ms}, s)
    if s.train_s is not None and s.min_train_s is not None:
        need -= s.train_s - s.min_train_s  # the deadline may shorten that far
    if need > budget_s:
        return (f"needs at least {need:.0f} s (training {need - s.chapters_s - COLLECT_S:.0f} s at {step_ms:g} ms "
                f"a step, chapters {s.chapters_s:.0f} s, packing {COLLECT_S} s) but {budget_s:.0f} s are left")
    steps = steps_needed(s)
    if s.train_s is not None and steps is not None:
        reach = int(train_seconds(s, budget_s) * 1000 / step_ms)
        if reach < steps:
            return (f"its deadline of {train_seconds(s, budget_s):.0f} s reaches about {reach:,} steps at "
                    f"{step_ms:g} ms a step, short of the {steps:,} it needs")
    return None


def next_slice(ledger: dict, root: Path = LEDGER.parent, budget_s: float | None = None,
               step_ms: float | None = None, say=None) -> Slice | None:
    """The first slice of the ledger not done (`is_done`); with `budget_s`, the first that also
    fits this lease at `step_ms` (default the ledger's) a step, each one passed over named in a
    line through `say`. None when nothing is left (or nothing fits)."""
    have = done(root, ledger["name"])
    for s in ledger["slices"]:
        if is_done(ledger, s, have):
            continue
        if budget_s is None:
            return s
        reason = why_not(ledger, s, budget_s, step_ms if step_ms is not None else ledger["step_ms"])
        if reason is None:
            return s
        if say is not None:
            say(f"slice {s.name} passed over: {reason}")
    return None


def slice_profile(ledger: dict, s: Slice) -> Profile:
    """The profile a slice trains and reads: the ledger's, at its precision, with the slice's
    seeds (the first is the book's run), no E15 inside a chapter, no training inside chapters;
    E15's cap where the slice sets one (its own runs, `Slice.freeze`, train before the chapters)."""
    p = load_profile(profile_path(ledger["profile"]))
    cap = {"analysis.freeze_steps": s.freeze_steps} if s.freeze_steps is not None else {}
    return p.replace(**{"seed": s.seeds[0], "train.precision": ledger["precision"],
                        "analysis.seeds": list(s.seeds), "analysis.freeze": False, "analysis.train_in_book": False,
                        **cap})


def needed_s(ledger: dict, s: Slice) -> float:
    """Seconds the slice needs after the machine's start: its training (the deadline, or its
    expected steps at the ledger's step time), its chapters, the packing."""
    train = s.train_s if s.train_s is not None else (s.expected_steps or 0) * ledger["step_ms"] / 1000
    return train + s.chapters_s + COLLECT_S


def train_seconds(s: Slice, budget_s: float) -> float:
    """The slice's training deadline in a lease with `budget_s` left: its train_s, shortened
    (not below min_train_s) so that its chapters and the packing still fit."""
    fit = budget_s - s.chapters_s - COLLECT_S
    if s.train_s is None:
        return fit
    return min(s.train_s, max(fit, s.min_train_s if s.min_train_s is not None else s.train_s))


class Picked(NamedTuple):
    """What `pick_step` chose: the train.step, one line saying which and why, and its measured ms a
    step in this lease's table (None where it fell back to eager without a usable table row)."""
    variant: str
    why: str
    ms: float | None


def pick_step(table: Path, precision: str, device: str | None = None, horizon_s: float | None = None) -> Picked:
    """The step this lease trains with, from its step table (benchmarks/lease_step.py): the fastest
    variant at `precision` that passed its check against eager in that table, with its time; eager
    (the reference every check compares with), with no time, where none did, where the table is
    missing, older than STEP_TABLE_S or from another device (`device`: this machine's, where
    known), the line naming the cause. A variant the table did not check is never picked. With
    `horizon_s` (the seconds the lease has left), a compiled variant is picked only where it pays:
    where, its compile (the table's first_s, which the trainer pays again) taken from the
    horizon, it reaches more steps than the fastest variant that needs no compile."""
    import pandas as pd

    if not Path(table).is_file():
        return Picked("eager", f"training variant: eager (no step table at {table})", None)
    t = pd.read_csv(table)
    if t.empty or not {"variant", "passed", "ms_step", "precision", "time", "device"} <= set(t.columns):
        return Picked("eager", f"training variant: eager ({Path(table).name} is not a step table of this revision)", None)
    if time.time() - float(t["time"].max()) > STEP_TABLE_S:
        return Picked("eager", f"training variant: eager ({Path(table).name} is from an earlier lease)", None)
    if device is not None and not (t["device"] == device).all():
        return Picked("eager", f"training variant: eager ({Path(table).name} was measured on "
                               f"{t['device'].iloc[0]}, this is {device})", None)
    ok = t[t["variant"].isin(TRAINED_STEPS) & (t["passed"].astype(str) == "True") & (t["precision"] == precision)
           & t["ms_step"].notna()]
    if ok.empty:
        return Picked("eager", f"training variant: eager (no variant at {precision} passed its check in "
                               f"{Path(table).name})", None)
    ok = ok.sort_values("ms_step")
    best, unpaid = ok.iloc[0], ""
    if horizon_s is not None and "first_s" in ok and best["variant"] in COMPILED_STEPS:
        plain = ok[~ok["variant"].isin(COMPILED_STEPS)]
        compile_s = float(best["first_s"]) if pd.notna(best["first_s"]) else 0.0
        if len(plain) and (horizon_s - compile_s) / best["ms_step"] < horizon_s / plain["ms_step"].iloc[0]:
            unpaid = (f"; {best['variant']} ({best['ms_step']:.1f} ms) passed over: its {compile_s:.0f} s compile "
                      f"does not pay within {horizon_s:.0f} s")
            best = plain.iloc[0]
    eager = ok[ok["variant"] == "eager"]
    than = f" (eager {eager['ms_step'].iloc[0]:.1f})" if len(eager) and best["variant"] != "eager" else ""
    return Picked(best["variant"], f"training variant: {best['variant']}, {best['ms_step']:.1f} ms a step{than} at "
                                   f"{precision}, {best['check']}{unpaid}", float(best["ms_step"]))


def check_fits(ledger: dict, s: Slice, budget_s: float, step_ms: float | None = None) -> None:
    reason = why_not(ledger, s, budget_s, step_ms if step_ms is not None else ledger["step_ms"])
    if reason is not None:
        raise SliceError(f"slice {s.name} {reason}")


# --- on the GPU machine --------------------------------------------------------------------

def start(out_dir: Path, budget_s: float | None = None, hold_s: float = 0.0, ledger_path: Path = LEDGER, *,
          began: float | None = None, command_s: float | None = None) -> dict:
    """Refuse a slice that cannot fit `budget_s`, the device seconds left for it from now
    (default: the ledger's lease less the machine's start and the return), else write its profile
    and start its training detached (a new process session, which the lease keeps when this
    command returns), then hold this command `hold_s` seconds or until training ends, never past
    COMMAND_S (or `command_s`) less COMMAND_SPARE_S from `began` (when the command began; default
    now). Returns the state written to OUT_DIR/slice.json."""
    began = time.time() if began is None else began
    command_s = COMMAND_S if command_s is None else command_s
    ledger = read_ledger(ledger_path)
    if next_slice(ledger, ledger_path.parent) is None:
        raise SliceError(f"every slice of {ledger_path.name} is done: nothing to start")
    t0 = time.time()
    budget = budget_s if budget_s is not None else ledger["lease_s"] - ledger["start_s"] - RETURN_S
    # the plan follows this lease's own step: the variant that passed its check and its time, else the ledger's
    table = Path(out_dir) / STEP_TABLE
    variant, why, measured = pick_step(table, ledger["precision"], _device_name(), horizon_s=budget)
    step_ms = measured if measured is not None else ledger["step_ms"]
    print(f"lease: {why}; the plan reads {step_ms:g} ms a step "
          f"({'measured in this lease' if measured is not None else 'the ledger step_ms'})", flush=True)
    s = next_slice(ledger, ledger_path.parent, budget, step_ms, say=lambda line: print(line, flush=True))
    if s is None:
        first = next_slice(ledger, ledger_path.parent)
        raise SliceError(f"no slice fits this lease: slice {first.name} {why_not(ledger, first, budget, step_ms)}")
    profile = slice_profile(ledger, s).replace(**{"train.step": variant})
    if s.source_steps is not None and (s.source_steps % profile.train.log_every or s.source_steps > profile.train.steps):
        raise SliceError(f"slice {s.name}: source_steps {s.source_steps} must be a multiple of train.log_every "
                         f"({profile.train.log_every}) and at most train.steps ({profile.train.steps})")
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    ppath = out_dir / f"slice-{s.name}.yaml"
    write_atomic(ppath, lambda f: f.write_text(yaml.safe_dump(profile.to_dict(), sort_keys=False)))
    deadline = t0 + train_seconds(s, budget)
    log = open(out_dir / TRAIN_LOG, "ab")
    e15 = json.dumps({"source_steps": s.source_steps, "freeze": s.freeze})
    proc = subprocess.Popen([sys.executable, "-m", "mclib.lease.slices", str(ppath), str(out_dir), str(deadline), e15],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    state = {"slice": s.name, "pid": proc.pid, "deadline": deadline, "started": t0, "budget_s": budget,
             "profile": str(ppath),
             "chapters": s.chapters, "seeds": s.seeds, "freeze": s.freeze, "git": git_revision(),
             "train_step": variant, "train_step_why": why}
    write_atomic(out_dir / STATE, lambda f: f.write_text(json.dumps(state, indent=1)))
    print(f"slice {s.name}: {s.what}; training started (pid {proc.pid}), deadline in "
          f"{deadline - time.time():.0f} s; log {out_dir / TRAIN_LOG}", flush=True)
    _wait(proc.pid, min(time.time() + hold_s, began + command_s - COMMAND_SPARE_S), out_dir, quiet=hold_s <= 0)
    return state


def train_slice(profile_file: Path, out_dir: Path, deadline: float, source_steps: int | None = None,
                freeze: tuple[str, ...] = ()) -> None:
    """The detached trainer: the slice's seeds one after the other under one deadline; the
    book's run (the first seed) trains toward its last step, or stops at `source_steps`
    where given; the others stop `analysis.after_drop` steps after their drop
    (`mclib.core.train.seed_jobs`). Then E15's runs of the groups in `freeze`, one after
    the other, from the book's run's checkpoint at `source_steps`
    (`mclib.analyses.freezing.freeze_run`: each ends by E15's own rule, its cap, or the deadline)."""
    from ..analyses.freezing import freeze_run
    from ..core.checkpoints import saved_steps
    from ..core.ending import run_end, stop_at_step
    from ..core.runs import default_run_dir
    from ..core.train import _seed_stop, seed_jobs, train

    profile = load_profile(profile_file)
    book_run = default_run_dir(profile, Path(out_dir) / "runs")
    for job_profile, run_dir, after in seed_jobs(profile, book_run):
        if time.time() >= deadline:
            break
        stop = stop_at_step(source_steps) if run_dir == book_run and source_steps is not None else \
            _seed_stop(job_profile, after)
        train(job_profile, run_dir, progress=False, stop=stop, newest_only=after is not None, deadline=deadline)
    if not freeze:
        return
    reached = run_end(book_run).step if saved_steps(book_run) else 0
    if reached != source_steps:  # cut by the deadline first: E15 would start from other weights than planned
        print(f"slice: the book's run reached step {reached:,}, not {source_steps:,}: E15's runs not started",
              flush=True)
        return
    for group in freeze:
        if time.time() >= deadline:
            break
        freeze_run(profile, book_run, group, source_step=source_steps, deadline=deadline)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(")")[-1].split()[0] == "Z")  # a zombie has ended


def _wait(pid: int, until: float, out_dir: Path, quiet: bool = False) -> bool:
    """Wait while `pid` runs, at most until `until`, a progress line every 30 s; True if it ended."""
    from ..book.runner import training_status

    last = 0.0
    while _alive(pid) and time.time() < until:
        if not quiet and time.time() - last >= 30:
            print("  training: " + (", ".join(training_status(out_dir / "runs", 0)) or "starting"), flush=True)
            last = time.time()
        time.sleep(min(1.0, max(0.05, until - time.time())))
    return not _alive(pid)


def _signal(pid: int, sig: int) -> None:
    """`sig` to the trainer's process group (`start` gave it a process group of its own), else to it alone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_training(state: dict, out_dir: Path, until: float) -> str:
    """Wait for the slice's trainer until its deadline + FINISH_GRACE_S (never past `until`),
    then ask it to stop (SIGTERM: the training loop saves a resumable checkpoint and ends "cut"),
    and STOP_S later kill it; how it ended, in one line (slice.json's `training_stop`)."""
    pid, name = state["pid"], state["slice"]
    if _wait(pid, min(state["deadline"] + FINISH_GRACE_S, until - STOP_S), out_dir):
        return "ended by itself"
    late = time.time() - state["deadline"]
    print(f"slice {name}: training still running {late:.0f} s past its deadline: asked to stop (SIGTERM)",
          file=sys.stderr, flush=True)
    _signal(pid, signal.SIGTERM)
    if _wait(pid, min(time.time() + STOP_S, until), out_dir, quiet=True):
        return f"asked to stop (SIGTERM) {late:.0f} s past its deadline; it ended"
    _signal(pid, signal.SIGKILL)
    ended = _wait(pid, time.time() + 5, out_dir, quiet=True)
    line = (f"killed (SIGKILL): still running {late:.0f} s past its deadline and {STOP_S:g} s after SIGTERM"
            + ("" if ended else "; still there 5 s later"))
    print(f"slice {name}: training {line}", file=sys.stderr, flush=True)
    return line


def finish(out_dir: Path, dest: Path, timeout: float | None = None, chapters_s: float | None = None, *,
           left_s: float | None = None, began: float | None = None, command_s: float | None = None) -> Path:
    """Wait for the slice's training (`stop_training`: until its deadline + FINISH_GRACE_S, then
    stopped), execute its chapters (no site) one at a time while the lease leaves time, pack
    results.tgz into `dest`. A chapter that fails or finds no time is named (slice.json), and
    what ran is packed all the same, with the tails of the lease's logs (LOGS) and its step table.

    The lease's end: `left_s` device seconds from `began` (when this command began; default now)
    less RETURN_S, where given, else `chapters_s` from now, else the budget `start` was given;
    never past COMMAND_S (or `command_s`) less COMMAND_SPARE_S from `began`. Issued again on the same machine
    (after a fix travels with the checkout), it executes only the chapters not yet executed
    (slice.json's `chapters_done`), within `chapters_s` seconds from now where given, and packs
    everything again. With no slice
    started (no slice.json), it packs what the work folder holds and why (REFUSED)."""
    from ..book.runner import BookError, build, select_chapters

    began = time.time() if began is None else began
    out_dir, dest = Path(out_dir).resolve(), Path(dest)
    if not (out_dir / STATE).is_file():
        return pack_refused(out_dir, dest)
    state = json.loads((out_dir / STATE).read_text())
    if left_s is not None:
        lease_end = began + left_s - RETURN_S
    elif chapters_s is not None:
        lease_end = time.time() + chapters_s  # issued again: the first budget is spent by then
    else:
        lease_end = state["started"] + state["budget_s"]
    end = min(lease_end, began + (COMMAND_S if command_s is None else command_s) - COMMAND_SPARE_S)
    state["training_stop"] = stop_training(state, out_dir, end - COLLECT_S)
    write_atomic(out_dir / STATE, lambda f: f.write_text(json.dumps(state, indent=1)))
    end_by = end - COLLECT_S  # the chapters may not eat the packing's time
    if chapters_s is not None:
        end_by = min(end_by, time.time() + chapters_s - COLLECT_S)
    done = state.setdefault("chapters_done", [])
    error, skipped = None, []
    for name in state["chapters"]:  # one at a time, each only while the lease has time for it
        if name in done:
            continue
        left = end_by - time.time()
        if error or left < 20:
            skipped.append(name)
            continue
        try:
            build(state["profile"], out_dir=out_dir, templates=select_chapters(name), site=False, progress=False,
                  timeout=int(min(timeout or left, left)))  # papermill takes whole seconds
        except Exception as e:  # whatever a chapter does, what trained is packed
            error = str(e) if isinstance(e, BookError) else f"{name}: {type(e).__name__}: {e}"
            print(f"slice {state['slice']}: {error}", file=sys.stderr)
            if not isinstance(e, BookError):
                traceback.print_exc()
            continue
        done.append(name)
        write_atomic(out_dir / STATE, lambda f: f.write_text(json.dumps(state, indent=1)))
    if skipped:
        print(f"slice {state['slice']}: not run (time or an earlier failure): {', '.join(skipped)}", file=sys.stderr)
    profile = load_profile(state["profile"])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "slice"
        collect(out_dir, folder, name=profile.name, seeds=state["seeds"])
        (folder / f"slice-{state['slice']}.yaml").write_text(Path(state["profile"]).read_text())
        logs = _copy_logs(out_dir, folder)
        ran = _steps_ran(out_dir, profile, state["seeds"])
        record = {"slice": state["slice"], **device_record(), "date": datetime.date.today().isoformat(),
                  "git": state["git"], "precision": profile.train.precision, "profile": profile.name,
                  "chapters": state["chapters"], "chapters_done": done, "chapter_error": error,
                  "chapters_not_run": skipped,
                  "train_step": state.get("train_step"), "train_step_why": state.get("train_step_why"),
                  "train_step_ran": ran, "training_stop": state["training_stop"], "logs": logs,
                  "ends": _read("ends", lambda: _ends(out_dir, profile, state["seeds"])),
                  "freeze_ends": _read("freeze_ends", lambda: _freeze_ends(out_dir, profile, state.get("freeze", [])))}
        (folder / STATE).write_text(json.dumps(record, indent=1))
        path = _pack_into(folder, dest)
    return path


def _read(what: str, read):
    """`read()`, or, where it raises (a run damaged by a kill), the error in one line: the rest is packed all the same."""
    try:
        return read()
    except Exception as e:
        print(f"slice: {what} not read: {type(e).__name__}: {e}", file=sys.stderr)
        return f"not read: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"


def pack_refused(out_dir: Path, dest: Path) -> Path:
    """results.tgz for a lease that started no slice: slice.json with `slice` null and `refused`
    (REFUSED's line, or why there is none), the step table and the logs' tails the work folder holds."""
    out_dir = Path(out_dir)
    why = ((out_dir / REFUSED).read_text().strip() if (out_dir / REFUSED).is_file() else
           f"no {STATE} in {out_dir}: `slice start` was not issued here, or ended before it started a slice")
    print(f"lease: no slice to finish: {why}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "slice"
        folder.mkdir()
        record = {"slice": None, "refused": why, **device_record(), "date": datetime.date.today().isoformat(),
                  "logs": _copy_logs(out_dir, folder)}
        (folder / STATE).write_text(json.dumps(record, indent=1))
        return _pack_into(folder, dest)


def refuse(out_dir: Path, why: str) -> None:
    """Write why no slice starts in this work folder (REFUSED), for `finish` to pack."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / REFUSED, lambda f: f.write_text(why.strip() + "\n"))


def _copy_logs(out_dir: Path, folder: Path) -> list[str]:
    """The step table and the tails (LOG_TAIL_KIB) of the lease's logs in `out_dir`, into `folder`;
    their names. A log cut to its tail says so in its first line."""
    names = []
    if (out_dir / STEP_TABLE).is_file():
        shutil.copy2(out_dir / STEP_TABLE, folder / STEP_TABLE)
        names.append(STEP_TABLE)
    for name in LOGS:
        src = out_dir / name
        if not src.is_file():
            continue
        size = src.stat().st_size
        with open(src, "rb") as f:
            f.seek(max(0, size - LOG_TAIL_KIB * 1024))
            tail = f.read()
        head = f"[the last {LOG_TAIL_KIB} KiB of {size / 1024:.0f} KiB]\n".encode() if size > len(tail) else b""
        (folder / name).write_bytes(head + tail)
        names.append(name)
    return names


def _steps_ran(out_dir: Path, profile: Profile, seeds: list[int]) -> dict:
    """{seed: the run's STEP_RAN (the step variant that ran, and why it fell back)}; None where none."""
    from ..core.step import STEP_RAN

    ran = {}
    for seed in seeds:
        f = out_dir / "runs" / run_name(profile.name, seed) / STEP_RAN
        ran[str(seed)] = json.loads(f.read_text()) if f.is_file() else None
    return ran


def _pack_into(folder: Path, dest: Path) -> Path:
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / RESULTS_TGZ
    record = json.loads((folder / STATE).read_text())
    tmp = dest / (RESULTS_TGZ + ".tmp")
    left_out = _pack(folder, tmp)
    tmp.replace(path)  # a cut pack never reads as whole
    what = f"slice {record['slice']}" if record.get("slice") else "lease (no slice)"
    print(f"{what}: packed {path} ({path.stat().st_size / 2**20:.1f} MiB)"
          + (f"; left out (over {RETURN_MIB} MiB): {', '.join(left_out)}" if left_out else ""), flush=True)
    return path


# --- what a lease sends back: the results folder ---------------------------------------------

def device_record() -> dict:
    """What ran it: the GPU's name, torch and CUDA versions, the date, the git revision."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        rev = ""
    return {"device": gpu, "torch": torch.__version__, "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"),
            "git": rev}


def collect(out: str | Path, dest: str | Path, name: str = "paper", seeds=(1, 2, 3)) -> Path:
    """Copy the small files of a built book in `out` (its runs/ and book/_executed/) to
    `dest`: everything results/ holds, never a checkpoint."""
    out, dest = Path(out), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "device.json").write_text(json.dumps(device_record(), indent=1))
    for seed in seeds:
        src = out / "runs" / run_name(name, seed)
        if not src.is_dir():
            continue
        _copy_run(src, dest / "runs" / src.name, RUN_FILES)
        for group in sorted((src / FREEZE).glob("*")) if (src / FREEZE).is_dir() else []:
            _copy_run(group, freeze_dir(dest / "runs" / src.name, group.name), (END, PROFILE, FREEZE_SOURCE))
    executed = out / "book" / "_executed"
    if executed.is_dir():
        (dest / "book").mkdir(exist_ok=True)
        for f in sorted(executed.glob("*.ipynb")) + [executed / "manifest.json"]:
            if f.is_file():
                shutil.copy2(f, dest / "book" / f.name)
    return dest


def _copy_run(src: Path, dest: Path, files) -> None:
    """A run's metrics (gzipped, written whole, then renamed: a cut copy never reads as
    complete) and its small `files`, into `dest`."""
    if (src / METRICS).is_file():
        dest.mkdir(parents=True, exist_ok=True)
        tmp = dest / (METRICS_GZ + ".tmp")
        with open(src / METRICS, "rb") as f_in, gzip.open(tmp, "wb") as f_out:
            shutil.copyfileobj(f_in, f_out)
        tmp.replace(dest / METRICS_GZ)
    for f in files:
        if (src / f).is_file():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / f, dest / f)


def chapters_executed(record: dict) -> list[str]:
    """The chapters a done slice executed, from its slice.json: `chapters_done` where the record
    has it, else (older records) the planned ones less those `chapters_not_run`."""
    if "chapters_done" in record:
        return list(record["chapters_done"])
    return [c for c in record.get("chapters", []) if c not in (record.get("chapters_not_run") or [])]


def _ends(out_dir: Path, profile: Profile, seeds: list[int]) -> dict:
    from ..core.checkpoints import saved_steps
    from ..core.ending import run_end

    ends = {}
    for seed in seeds:
        run = out_dir / "runs" / run_name(profile.name, seed)
        ends[str(seed)] = run_end(run).__dict__ if saved_steps(run) else None
    return ends


def _freeze_ends(out_dir: Path, profile: Profile, groups: list[str]) -> dict:
    """{group: how its E15 run ended (`mclib.analyses.freezing.freeze_end`, as a dict)} for
    the slice's E15 runs; None for a group that saved nothing."""
    from dataclasses import asdict

    from ..analyses.freezing import freeze_ends
    from ..core.checkpoints import saved_steps

    if not groups:
        return {}
    run = out_dir / "runs" / run_name(profile.name, profile.seed)
    ends = freeze_ends(profile, run, tuple(groups)) if saved_steps(run) else {}
    return {g: asdict(ends[g]) if g in ends and ends[g].steps else None for g in groups}


def _pack(folder: Path, path: Path) -> list[str]:
    """tar.gz of `folder` at `path`, leaving out the largest executed chapters until it is
    under RETURN_MIB; returns what was left out (named in slice.json too)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    left: list[str] = []
    while True:
        with tarfile.open(path, "w:gz") as tar:
            for f in files:
                if f.relative_to(folder).as_posix() not in left:
                    tar.add(f, arcname=f.relative_to(folder).as_posix())
        if path.stat().st_size <= RETURN_MIB * 2**20:
            return left
        notebooks = sorted((f for f in files if f.suffix == ".ipynb" and f.relative_to(folder).as_posix() not in left),
                           key=lambda f: f.stat().st_size)
        if not notebooks:
            raise SliceError(f"{path.name} is {path.stat().st_size / 2**20:.1f} MiB without any chapter, over {RETURN_MIB}")
        left.append(notebooks[-1].relative_to(folder).as_posix())
        record = json.loads((folder / STATE).read_text())
        record["left_out"] = left
        (folder / STATE).write_text(json.dumps(record, indent=1))


# --- on the CPU machine ----------------------------------------------------------------------

def merge(tgz: Path, root: Path = LEDGER.parent, ledger_path: Path = LEDGER) -> Path | None:
    """File a lease's results.tgz under results/paper-SLICE-DEVICE-DATE/. A slice that is not
    the ledger's next, another profile, or another revision than this checkout's is merged
    with a note printed (and kept in slice.json); files left out are named. A full step table
    in it is committed beside the ledger (`steptable.adopt`). A lease that started no slice
    files nothing but that table, and says why in one line (None)."""
    ledger = read_ledger(ledger_path)
    have = done(root, ledger["name"])  # before this one is filed
    open_slices = [s.name for s in ledger["slices"] if not is_done(ledger, s, have)]
    with tarfile.open(tgz) as tar:
        member = next((m for m in tar.getmembers() if m.name.removeprefix("./") == STATE), None)
        if member is None:
            raise SliceError(f"{tgz}: no {STATE} at its top: not a slice's results.tgz")
        record = json.loads(tar.extractfile(member).read())
        if record.get("slice") is None:  # a lease that started no slice: its step table alone is kept
            with tempfile.TemporaryDirectory() as tmp:
                tar.extractall(tmp, filter="data")
                adopted = steptable.adopt(Path(tmp) / STEP_TABLE, root / steptable.COMMITTED)
            print(f"slice merge: the lease started no slice: {record.get('refused')}"
                  + (f"; {adopted}" if adopted else ""))
            return None
        dest = root / f"{record['profile']}-{record['slice']}-{record['device'].replace(' ', '-')}-{record['date']}"
        tar.extractall(dest, filter="data")
    notes = []
    if record["profile"] != ledger["name"]:
        notes.append(f"profile {record['profile']!r}, the ledger's is {ledger['name']!r}")
    if record["slice"] not in open_slices:
        notes.append(f"slice {record['slice']} was not open in the ledger (open: {', '.join(open_slices) or 'none'})")
    if record.get("precision") != ledger["precision"]:
        notes.append(f"trained in {record.get('precision')}, the ledger's precision is {ledger['precision']}")
    if record["git"].split("-")[0] != git_revision().split("-")[0]:
        notes.append(f"ran at revision {record['git']}, this checkout is {git_revision()}")
    planned = next((s for s in ledger["slices"] if s.name == record["slice"]), None)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file()) / 2**20
    if planned is not None and size > planned.results_mib:
        notes.append(f"{size:.1f} MiB under results/, over the slice's budget of {planned.results_mib:g} MiB "
                     "(results_mib; what travels to a lease must stay under 40 MiB)")
    for n in notes + [f"left out on the machine: {f}" for f in record.get("left_out", [])]:
        print(f"slice merge: note: {n}")
    adopted = steptable.adopt(dest / STEP_TABLE, root / steptable.COMMITTED)
    if adopted:
        print(f"slice merge: {adopted}")
    record["merge_notes"] = notes
    write_atomic(dest / STATE, lambda f: f.write_text(json.dumps(record, indent=1)))
    print(f"slice {record['slice']}: merged into {dest}")
    return dest


def status(ledger_path: Path = LEDGER) -> str:
    ledger = read_ledger(ledger_path)
    have = done(ledger_path.parent, ledger["name"])
    lines = []
    for s in ledger["slices"]:
        r = record(have[s.name]) if s.name in have else None
        ran = f"{r['device']}, {r['date']}, revision {r['git']}, {r['precision']}" if r else ""
        if is_done(ledger, s, have):
            lines.append(f"{s.name}: done" + (f" on {ran}" if r else " (by the slices it joins, or one joining it)"))
        else:
            earlier = f"; a result of an earlier path kept as a record ({ran})" if r else ""
            lines.append(f"{s.name}: to do ({s.what}; needs about {needed_s(ledger, s):.0f} s of a lease at the "
                         f"ledger's {ledger['step_ms']:g} ms a step{earlier})")
    if next_slice(ledger, ledger_path.parent) is None:
        return "\n".join(lines + ["next: none, every slice is done"])
    stands = steptable.same_files(ledger_path.parent / steptable.COMMITTED)
    measure = ("the chosen variant's check (the committed step table measured these step files)" if stands else
               "the full step table (no committed one measured these step files)")
    budget = ledger["lease_s"] - ledger["start_s"] - RETURN_S - (CHECK_S if stands else MEASURE_S)
    passed: list[str] = []
    nxt = next_slice(ledger, ledger_path.parent, budget, ledger["step_ms"], say=passed.append)
    lines.append(f"next, in a lease with {budget:.0f} s left after a {ledger['start_s']:g} s start, the kit and "
                 f"{measure}, at the ledger's {ledger['step_ms']:g} ms a step: {nxt.name if nxt else 'none fits'}"
                 + "".join(f"\n  ({p})" for p in passed)
                 + "\n  (a lease picks by the step it measures itself: `slice start`)")
    return "\n".join(lines)


def _device_name() -> str:
    """This machine's training device as benchmarks/lease_step.py names it."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":  # the detached trainer `start` launches
    e15 = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    train_slice(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), e15.get("source_steps"),
                tuple(e15.get("freeze") or ()))
