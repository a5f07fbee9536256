"""A slice on the GPU machine: `start` refuses one that cannot fit and trains it detached
(`train_slice`, run as `python -m mclib.lease.slices_run`); `finish` waits for that training,
stops it past its deadline (`stop_training`), executes the slice's chapters through the book's
runner and packs results.tgz (slices_pack). The lease's limits are read from `slices` when used
(`slices.COMMAND_S`, ...): a rehearsal on a scaled clock scales them there."""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from ..analyses.freezing import freeze_run
from ..book import runner
from ..book.runner_progress import median_step_ms, training_status
from ..book.spec import Specs
from ..core.checkpoints import saved_steps
from ..core.config import load_profile
from ..core.console import console_logging
from ..core.ending import run_end, stop_at_step
from ..core.repo import REPO, git_revision
from ..core.runs import METRICS, default_run_dir, load_metrics, run_name, write_atomic
from ..core.train import _seed_stop, seed_jobs, train
from . import slices
from .slices import (
    LEDGER,
    STATE,
    STEP_TABLE,
    TRAIN_LOG,
    SliceError,
    next_slice,
    pick_step,
    read_ledger,
    slice_profile,
    train_seconds,
    why_not,
)
from .slices_pack import (
    _copy_logs,
    _ends,
    _freeze_ends,
    _pack_into,
    _read,
    _steps_ran,
    collect,
    device_record,
    pack_refused,
)

log = logging.getLogger(__name__)


def start(
    out_dir: Path,
    budget_s: float | None = None,
    hold_s: float = 0.0,
    ledger_path: Path = LEDGER,
    *,
    began: float | None = None,
    command_s: float | None = None,
) -> dict:
    """Refuse a slice that cannot fit `budget_s`, the device seconds left for it from now
    (default: the ledger's lease less the machine's start and the return), else write its profile
    and start its training detached (a new process session, which the lease keeps when this
    command returns), then hold this command `hold_s` seconds or until training ends, never past
    COMMAND_S (or `command_s`) less COMMAND_SPARE_S from `began` (when the command began; default
    now). Returns the state written to OUT_DIR/slice.json."""
    began = time.time() if began is None else began
    command_s = slices.COMMAND_S if command_s is None else command_s
    ledger = read_ledger(ledger_path)
    if next_slice(ledger, ledger_path.parent) is None:
        raise SliceError(f"every slice of {ledger_path.name} is done: nothing to start")
    t0 = time.time()
    budget = budget_s if budget_s is not None else ledger["lease_s"] - ledger["start_s"] - slices.RETURN_S
    s, profile, variant, why = _plan(ledger, ledger_path, Path(out_dir) / STEP_TABLE, budget)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    ppath = out_dir / f"slice-{s.name}.yaml"
    write_atomic(ppath, yaml.safe_dump(profile.to_dict(), sort_keys=False))
    deadline = t0 + train_seconds(s, budget)
    proc = _launch(ppath, out_dir, deadline, s)
    state = {
        "slice": s.name,
        "pid": proc.pid,
        "deadline": deadline,
        "started": t0,
        "budget_s": budget,
        "profile": str(ppath),
        "chapters": s.chapters,
        "seeds": s.seeds,
        "freeze": s.freeze,
        "git": git_revision(),
        "train_step": variant,
        "train_step_why": why,
    }
    write_atomic(out_dir / STATE, json.dumps(state, indent=1))
    log.info(
        f"slice {s.name}: {s.what}; training started (pid {proc.pid}), deadline in "
        f"{deadline - time.time():.0f} s; log {out_dir / TRAIN_LOG}"
    )
    _wait(
        proc.pid,
        min(time.time() + hold_s, began + command_s - slices.COMMAND_SPARE_S),
        out_dir,
        quiet=hold_s <= 0,
    )
    return state


def _plan(ledger: dict, ledger_path: Path, table: Path, budget: float):
    """(the slice that fits `budget`, its profile, the step variant, the line saying why that
    variant): the plan follows this lease's own step, the variant that passed its check in `table`
    and its time, else the ledger's; SliceError where no slice fits or its source_steps cannot be
    reached."""
    variant, why, measured = pick_step(table, ledger["precision"], _device_name(), horizon_s=budget)
    step_ms = measured if measured is not None else ledger["step_ms"]
    log.info(
        f"lease: {why}; the plan reads {step_ms:g} ms a step "
        f"({'measured in this lease' if measured is not None else 'the ledger step_ms'})"
    )
    s = next_slice(ledger, ledger_path.parent, budget, step_ms, say=log.info)
    if s is None:
        first = next_slice(ledger, ledger_path.parent)
        raise SliceError(
            f"no slice fits this lease: slice {first.name} {why_not(ledger, first, budget, step_ms)}"
        )
    profile = slice_profile(ledger, s).replace(**{"train.step": variant})
    if s.source_steps is not None and (
        s.source_steps % profile.train.log_every or s.source_steps > profile.train.steps
    ):
        raise SliceError(
            f"slice {s.name}: source_steps {s.source_steps} must be a multiple of train.log_every "
            f"({profile.train.log_every}) and at most train.steps ({profile.train.steps})"
        )
    return s, profile, variant, why


def _launch(ppath: Path, out_dir: Path, deadline: float, s) -> subprocess.Popen:
    """The detached trainer of slice `s` (this module run as a script, in a new process session
    the lease keeps), its output appended to TRAIN_LOG."""
    train_log = open(out_dir / TRAIN_LOG, "ab")
    e15 = json.dumps({"source_steps": s.source_steps, "freeze": s.freeze})
    trainer = [sys.executable, "-m", "mclib.lease.slices_run", str(ppath), str(out_dir), str(deadline), e15]
    return subprocess.Popen(
        trainer,
        stdout=train_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        },
    )


# slice.json's `training_stop` where `finish` neither signalled nor killed the trainer: its runs may
# still have ended "cut" (its own deadline), which is their end.json's to say, not this process's
ENDED_ITSELF = "the trainer ended by itself (at its deadline or its run's end)"


def _logging(stop, name: str, every: int):
    """`stop` (or none) as a `train` stop that also prints, to the trainer's log, one line each
    time the run passes a multiple of `every` steps: the step, L_mask and the ms a step since
    the last line (its metrics' `wall`), flushed, so that a cut leaves a trace."""
    last = [0, 0.0]

    def logged(rows: list[dict]) -> bool:
        row = rows[-1]
        if row["step"] // every > last[0] // every and row["wall"] == row["wall"]:  # NaN between flushes
            ms = 1000 * (row["wall"] - last[1]) / max(row["step"] - last[0], 1)
            log.info(f"{name} step {row['step']:,}: L_mask {row['L_mask']:.4g}, {ms:.1f} ms a step")
            last[:] = [row["step"], row["wall"]]
        return stop(rows) if stop is not None else False

    return logged


def train_slice(
    profile_file: Path,
    out_dir: Path,
    deadline: float,
    source_steps: int | None = None,
    freeze: tuple[str, ...] = (),
) -> None:
    """The detached trainer: the slice's seeds in turn under one deadline (`mclib.core.train.seed_jobs`:
    the book's run to its end, or to `source_steps` where given; the others to `analysis.after_drop`
    past their drop), then E15's runs of the groups in `freeze` from the book's run at `source_steps`
    (`mclib.analyses.freezing.freeze_run`). Each seed's run writes a line to TRAIN_LOG every
    TRAIN_LOG_EVERY steps (`_logging`)."""
    profile = load_profile(profile_file)
    book_run = default_run_dir(profile, Path(out_dir) / "runs")
    for job_profile, run_dir, after in seed_jobs(profile, book_run):
        if time.time() >= deadline:
            break
        stop = (
            stop_at_step(source_steps)
            if run_dir == book_run and source_steps is not None
            else _seed_stop(job_profile, after)
        )
        stop = _logging(stop, run_dir.name, slices.TRAIN_LOG_EVERY)
        train(
            job_profile, run_dir, progress=False, stop=stop, newest_only=after is not None, deadline=deadline
        )
    if not freeze:
        return
    reached = run_end(book_run).step if saved_steps(book_run) else 0
    if reached != source_steps:  # cut by the deadline first: E15 would start from other weights than planned
        log.info(
            f"slice: the book's run reached step {reached:,}, not {source_steps:,}: E15's runs not started"
        )
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
    last = 0.0
    while _alive(pid) and time.time() < until:
        if not quiet and time.time() - last >= 30:
            log.info("  training: " + (", ".join(training_status(out_dir / "runs", 0)) or "starting"))
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
    and STOP_S later kill it; how the trainer's process ended, in one line (slice.json's
    `training_stop`): ENDED_ITSELF, "asked to stop (SIGTERM) ..." or "killed (SIGKILL) ...". How
    each run ended ("cut" at the deadline among them) is its end.json's (slice.json's `ends`)."""
    pid, name = state["pid"], state["slice"]
    if _wait(pid, min(state["deadline"] + slices.FINISH_GRACE_S, until - slices.STOP_S), out_dir):
        return ENDED_ITSELF
    late = time.time() - state["deadline"]
    log.warning(
        f"slice {name}: training still running {late:.0f} s past its deadline: asked to stop (SIGTERM)"
    )
    _signal(pid, signal.SIGTERM)
    if _wait(pid, min(time.time() + slices.STOP_S, until), out_dir, quiet=True):
        return f"asked to stop (SIGTERM) {late:.0f} s past its deadline; it ended"
    _signal(pid, signal.SIGKILL)
    ended = _wait(pid, time.time() + 5, out_dir, quiet=True)
    line = (
        f"killed (SIGKILL): still running {late:.0f} s past its deadline and "
        f"{slices.STOP_S:g} s after SIGTERM" + ("" if ended else "; still there 5 s later")
    )
    log.warning(f"slice {name}: training {line}")
    return line


def finish(
    out_dir: Path,
    dest: Path,
    timeout: float | None = None,
    chapters_s: float | None = None,
    *,
    left_s: float | None = None,
    began: float | None = None,
    command_s: float | None = None,
    specs: Specs,
) -> Path:
    """Wait for the slice's training (`stop_training`), execute its chapters (no site) one at a time
    while the lease leaves time, and pack results.tgz into `dest` with the tails of the lease's logs
    (LOGS) and its step table; a chapter that fails or finds no time is named in slice.json, and
    what ran is packed all the same. `specs`: the chapters' declarations, for the book's runner.

    The lease's end: `left_s` device seconds from `began` (default now) less RETURN_S, else
    `chapters_s` from now, else the budget `start` was given; never past COMMAND_S (or `command_s`)
    less COMMAND_SPARE_S from `began`. Issued again on the same machine, it executes only the
    chapters not yet done (slice.json's `chapters_done`) and packs everything again. With no slice
    started (no slice.json), it packs what the work folder holds and why (REFUSED)."""
    began = time.time() if began is None else began
    out_dir, dest = Path(out_dir).resolve(), Path(dest)
    if not (out_dir / STATE).is_file():
        return pack_refused(out_dir, dest)
    state = json.loads((out_dir / STATE).read_text())
    end = _lease_end(state, began, left_s, chapters_s, command_s)
    state["training_stop"] = stop_training(state, out_dir, end - slices.COLLECT_S)
    write_atomic(out_dir / STATE, json.dumps(state, indent=1))
    end_by = end - slices.COLLECT_S  # the chapters may not eat the packing's time
    if chapters_s is not None:
        end_by = min(end_by, time.time() + chapters_s - slices.COLLECT_S)
    error, skipped = _run_chapters(state, out_dir, end_by, timeout, specs)
    return _pack(state, out_dir, dest, error, skipped)


def _lease_end(
    state: dict, began: float, left_s: float | None, chapters_s: float | None, command_s: float | None
) -> float:
    """When `finish` must be done (see there): the lease's end, never past the command's."""
    if left_s is not None:
        lease_end = began + left_s - slices.RETURN_S
    elif chapters_s is not None:
        lease_end = time.time() + chapters_s  # issued again: the first budget is spent by then
    else:
        lease_end = state["started"] + state["budget_s"]
    return min(
        lease_end, began + (slices.COMMAND_S if command_s is None else command_s) - slices.COMMAND_SPARE_S
    )


def _run_chapters(
    state: dict, out_dir: Path, end_by: float, timeout: float | None, specs: Specs
) -> tuple[str | None, list[str]]:
    """The slice's chapters not yet done, one at a time through the book's runner, each only while
    there is time before `end_by`, each one done recorded in slice.json's `chapters_done` as it
    completes; after a failure the rest are not run. (the error in one line or None, the chapters
    not run)."""
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
            runner.build(
                state["profile"],
                out_dir=out_dir,
                templates=runner.select_chapters(name),
                site=False,
                progress=False,
                timeout=int(min(timeout or left, left)),
                specs=specs,
            )  # papermill takes whole seconds
        except Exception as e:  # whatever a chapter does, what trained is packed
            error = str(e) if isinstance(e, runner.BookError) else f"{name}: {type(e).__name__}: {e}"
            log.warning(f"slice {state['slice']}: {error}", exc_info=not isinstance(e, runner.BookError))
            continue
        done.append(name)
        write_atomic(out_dir / STATE, json.dumps(state, indent=1))
    if skipped:
        log.warning(f"slice {state['slice']}: not run (time or an earlier failure): {', '.join(skipped)}")
    return error, skipped


def _pack(state: dict, out_dir: Path, dest: Path, error: str | None, skipped: list[str]) -> Path:
    """results.tgz packed into `dest`: what the slice's runs wrote (`collect`), its profile, the
    logs' tails and its slice.json as the lease ends it (device, chapters, how its runs ended)."""
    profile = load_profile(state["profile"])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "slice"
        collect(out_dir, folder, name=profile.name, seeds=state["seeds"])
        (folder / f"slice-{state['slice']}.yaml").write_text(Path(state["profile"]).read_text())
        logs = _copy_logs(out_dir, folder)
        ran = _steps_ran(out_dir, profile, state["seeds"])
        record = {
            "slice": state["slice"],
            **device_record(),
            "date": datetime.date.today().isoformat(),
            "git": state["git"],
            "precision": profile.train.precision,
            "profile": profile.name,
            "chapters": state["chapters"],
            "chapters_done": state["chapters_done"],
            "chapter_error": error,
            "chapters_not_run": skipped,
            "train_step": state.get("train_step"),
            "train_step_why": state.get("train_step_why"),
            "train_step_ran": ran,
            "training_stop": state["training_stop"],
            "logs": logs,
            "train_deadline_s": round(state["deadline"] - state["started"], 1),
            "achieved": _read("achieved", lambda: _achieved(out_dir, profile, state["seeds"])),
            "ends": _read("ends", lambda: _ends(out_dir, profile, state["seeds"])),
            "freeze_ends": _read(
                "freeze_ends", lambda: _freeze_ends(out_dir, profile, state.get("freeze", []))
            ),
        }
        (folder / STATE).write_text(json.dumps(record, indent=1))
        path = _pack_into(folder, dest)
    return path


def _achieved(out_dir: Path, profile, seeds: list[int]) -> dict:
    """slice.json's `achieved`: {seed: {"steps": its last logged step, "ms_step": its achieved ms
    a step (`median_step_ms`)}}; None for a run that logged nothing."""
    achieved = {}
    for seed in seeds:
        run = out_dir / "runs" / run_name(profile.name, seed)
        m = load_metrics(run) if (run / METRICS).is_file() else None
        ms = median_step_ms(m) if m is not None and len(m) else None
        achieved[str(seed)] = (
            None
            if m is None or m.empty
            else {"steps": int(m["step"].max()), "ms_step": None if ms is None else round(ms, 2)}
        )
    return achieved


def _device_name() -> str:
    """This machine's training device as benchmarks/lease_step.py names it."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":  # the detached trainer `start` launches; its log is TRAIN_LOG
    e15 = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    with console_logging():
        train_slice(
            Path(sys.argv[1]),
            Path(sys.argv[2]),
            float(sys.argv[3]),
            e15.get("source_steps"),
            tuple(e15.get("freeze") or ()),
        )
