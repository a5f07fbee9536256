"""The paper book in slices, one GPU lease each (docs/gpu.md): the ledger, what a slice needs and
whether it fits a lease, the step variant it trains with, and the lease's limits.

    results/paper-slices.yaml         the plan: the slices in order, what each trains and which
                                      chapters it executes, the step time they are sized with
    results/paper-SLICE-DEVICE-DATE/  a slice done: its runs' small files, executed chapters and
                                      slice.json (device, date, git revision, precision, ends)

On a lease a slice is two commands (slices_run), since a command runs at most COMMAND_S and the
chapters must run where the weights are: `slice start` refuses a slice that cannot fit the device
time left (`--budget-s`) and trains it detached under its deadline; `slice finish` stops it past
that deadline, executes its chapters (no site, no training) and packs results.tgz, or one saying
why no slice started (REFUSED). Each ends COMMAND_SPARE_S before COMMAND_S from when it began
(`--began`); `slice` alone runs both in one process (a GPU of one's own). On the CPU machine
`slice merge` files results.tgz under results/ (slices_pack), and `slice status` prints the
ledger and the next slice, planned at the step the committed step table (results/lease_step.csv)
chose for the device kind named, else at the ledger's step_ms.

E15's slices (`Slice.freeze`) stop the book's run at a fixed step (`source_steps`), then train
their group's run from it. The limits below are read from here when used: a rehearsal scales them.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from ..analyses.interventions import GROUPS
from ..core import step as step_ways
from ..core.config import ConfigError, Profile, load_profile, profile_path, read_yaml
from ..core.repo import REPO
from ..core.runs import END, METRICS, PROFILE, SCORECARD
from . import steptable

LEDGER = REPO / "results" / steptable.LEDGER_NAME
STATE = "slice.json"  # in the work folder: the slice in flight; in a result folder: the slice done
RESULTS_TGZ = "results.tgz"  # what a lease sends back: one file (the device tool returns at most 8)
TRAIN_LOG = "slice-train.log"
TRAIN_LOG_EVERY = (
    1000  # the detached trainer's line in TRAIN_LOG (step, L_mask, ms a step) every this many steps
)
RETURN_MIB = 16  # the largest file a lease sends back
RUN_FILES = (
    END,
    PROFILE,
    SCORECARD,
    "step.json",
)  # copied as they are (step.json: mclib.core.step.STEP_RAN);
# METRICS is gzipped
METRICS_GZ = METRICS + ".gz"
STEP_TABLE = "lease_step.csv"  # in the work folder: this lease's step measurement (benchmarks/lease_step.py)
STEP_TABLE_S = 3600  # older than this, a table is another lease's: not read
TRAINED_STEPS = (
    steptable.CHOSEN
)  # the table's variants a slice may train with (bf16's rows are for the record)
COMPILED_STEPS = step_ways.COMPILED_STEPS  # the trainer compiles them again: their first_s is paid again
COLLECT_S = 30  # packing and the return, in a slice's time
MEASURE_S = 125  # the kit (at most 15 s) and the step's full measurement (at most 110 s) before a slice
CHECK_S = 45  # the kit and the chosen variant's check alone, where the committed step table stands
# (mclib.lease.steptable)
RETURN_S = 20  # the results' way back, outside the slice (scripts/lease.sh: LEFT_S less it)
COMMAND_S = 600  # the longest a command may run on the device: past it, the command is killed
COMMAND_SPARE_S = 20  # a command ends this long before COMMAND_S (its output's way back)
FINISH_GRACE_S = 60  # past the slice's deadline, the trainer's time to save and end by itself
STOP_S = 30  # after SIGTERM (save and end "cut"), the trainer's time before it is killed
LOG_TAIL_KIB = 256  # of each log a lease packs, its last this many KiB
# in the work folder: why no slice started (a refused `start`; lease.sh without the kit)
REFUSED = "slice-refused.txt"
START_LOG = (
    "lease-start.log"  # in the work folder: scripts/lease.sh start's output (the step, the plan, any refusal)
)
STEP_ERRORS = (
    "lease_step_errors.log"  # beside the step table: each variant's traceback (benchmarks/lease_step.py)
)
LOGS = (START_LOG, TRAIN_LOG, STEP_ERRORS)  # packed (their tails) with every results.tgz


def read_metrics(run: Path) -> pd.DataFrame:
    """A run's metrics (metrics.csv.gz, else metrics.csv), parsed once per file version; a copy each call."""
    path = run / METRICS_GZ if (run / METRICS_GZ).is_file() else run / METRICS
    return _parsed(path, path.stat().st_mtime_ns).copy()


@functools.lru_cache(maxsize=16)
def _parsed(path: Path, version: int) -> pd.DataFrame:
    return pd.read_csv(path)


class SliceError(ConfigError):
    """A slice that cannot run (no time, nothing left, a bad ledger); one line."""


@dataclass
class Slice:
    name: str
    what: str
    seeds: list[int]
    chapters: list[str] = field(default_factory=list)
    train_s: float | None = None  # the training deadline; None: train until the run's own end
    min_train_s: float | None = None  # with train_s: the least a lease short of time may shorten it to
    chapters_s: float = 0.0  # the time its chapters may take
    expected_steps: int | None = None  # steps its runs need (a slice without train_s is sized by them)
    results_mib: float = 2.0  # what it may add under results/ (tests/test_travel.py sums them)
    source_steps: int | None = None  # the book's run stops at this step (E15's slices: every one starts
    # from the same weights), not at its deadline or its own end
    freeze: list[str] = field(default_factory=list)  # E15's groups trained from that step (`freeze_run`)
    freeze_steps: int | None = None  # their cap (analysis.freeze_steps) where the lease needs one
    min_steps: int | None = None  # the book's run must reach this step within the slice's deadline at
    # the step time measured in the lease, else another slice runs there
    valid_from: str | None = None  # a result of this slice dated before (YYYY-MM-DD) trained on an earlier
    # path: kept and shown until a newer one comes, but not done
    joins: list[str] = field(default_factory=list)  # slices this one runs together in one lease: it is
    # done when they all are, and they are done when it is

    def __post_init__(self):
        bad = [g for g in self.freeze if g not in GROUPS]
        if bad:
            raise SliceError(f"slice {self.name}: freeze group {bad[0]!r} is not one of {', '.join(GROUPS)}")
        if self.freeze and self.source_steps is None:
            raise SliceError(
                f"slice {self.name}: E15's runs (freeze) need source_steps, the step they start from"
            )


def read_ledger(path: Path = LEDGER) -> dict:
    raw = read_yaml(path, "slice ledger", SliceError)
    try:
        raw["slices"] = [Slice(**s) for s in raw["slices"]]
        raw["name"] = load_profile(
            profile_path(raw["profile"])
        ).name  # result folders: NAME-SLICE-DEVICE-DATE
        raw.setdefault("device", None)  # the kind of GPU lent now: `slice status` plans with its step table
    except (KeyError, TypeError) as e:
        raise SliceError(f"slice ledger {str(path)!r}: {e}") from None
    return raw


def record(folder: Path) -> dict:
    """A done slice's slice.json (device, date, git revision, precision, chapters, how runs ended)."""
    return json.loads((Path(folder) / STATE).read_text())


def chapters_executed(record: dict) -> list[str]:
    """The chapters a done slice executed, from its slice.json: `chapters_done` where the record
    has it, else the planned ones less those `chapters_not_run`."""
    if "chapters_done" in record:
        return list(record["chapters_done"])
    return [c for c in record.get("chapters", []) if c not in (record.get("chapters_not_run") or [])]


def done(root: Path = LEDGER.parent, name: str = "paper") -> dict[str, Path]:
    """{slice: result folder} of the slices done (a folder holding slice.json), the newest of
    each by the date its slice.json records (the folder's name on a tie)."""
    found = sorted(
        (
            (record(path.parent).get("date", ""), path.parent.name, path.parent)
            for path in root.glob(f"{name}-*/{STATE}")
        ),
        key=lambda t: t[:2],
    )
    return {record(folder)["slice"]: folder for _, _, folder in found}


def is_done(ledger: dict, s: Slice, have: dict[str, Path]) -> bool:
    """Whether slice `s` needs no lease: a result of its own dated from its `valid_from` on,
    a done slice that joins it, or (a joint slice) every slice it joins done."""

    def own(x: Slice) -> bool:
        return x.name in have and (
            x.valid_from is None or record(have[x.name]).get("date", "") >= x.valid_from
        )

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
        return (
            f"needs at least {need:.0f} s (training "
            f"{need - s.chapters_s - COLLECT_S:.0f} s at {step_ms:g} ms "
            f"a step, chapters {s.chapters_s:.0f} s, packing {COLLECT_S} s) but {budget_s:.0f} s are left"
        )
    steps = steps_needed(s)
    if s.train_s is not None and steps is not None:
        reach = int(train_seconds(s, budget_s) * 1000 / step_ms)
        if reach < steps:
            return (
                f"its deadline of {train_seconds(s, budget_s):.0f} s reaches about {reach:,} steps at "
                f"{step_ms:g} ms a step, short of the {steps:,} it needs"
            )
    return None


def next_slice(
    ledger: dict,
    root: Path = LEDGER.parent,
    budget_s: float | None = None,
    step_ms: float | None = None,
    say=None,
) -> Slice | None:
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
    return p.replace(
        **{
            "seed": s.seeds[0],
            "train.precision": ledger["precision"],
            "analysis.seeds": list(s.seeds),
            "analysis.freeze": False,
            "analysis.train_in_book": False,
            **cap,
        }
    )


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


def pick_step(
    table: Path, precision: str, device: str | None = None, horizon_s: float | None = None
) -> Picked:
    """The step this lease trains with: the fastest variant at `precision` that passed its check
    against eager in its step table (benchmarks/lease_step.py); eager, with no time, where none did
    or the table is missing, older than STEP_TABLE_S or of another `device`, the line saying why.
    With `horizon_s` (seconds left), a compiled variant only where, its compile (the table's first_s,
    paid again by the trainer) taken off, it reaches more steps than the fastest uncompiled one."""
    if not Path(table).is_file():
        return Picked("eager", f"training variant: eager (no step table at {table})", None)
    t = pd.read_csv(table)
    if t.empty or not {"variant", "passed", "ms_step", "precision", "time", "device"} <= set(t.columns):
        return Picked(
            "eager",
            f"training variant: eager ({Path(table).name} is not a step table of this revision)",
            None,
        )
    if time.time() - float(t["time"].max()) > STEP_TABLE_S:
        return Picked("eager", f"training variant: eager ({Path(table).name} is from an earlier lease)", None)
    if device is not None and not (t["device"] == device).all():
        return Picked(
            "eager",
            f"training variant: eager ({Path(table).name} was measured on "
            f"{t['device'].iloc[0]}, this is {device})",
            None,
        )
    ok = t[
        t["variant"].isin(TRAINED_STEPS)
        & (t["passed"].astype(str) == "True")
        & (t["precision"] == precision)
        & t["ms_step"].notna()
    ]
    if ok.empty:
        return Picked(
            "eager",
            f"training variant: eager (no variant at {precision} passed its check in {Path(table).name})",
            None,
        )
    ok = ok.sort_values("ms_step")
    best, unpaid = ok.iloc[0], ""
    if horizon_s is not None and "first_s" in ok and best["variant"] in COMPILED_STEPS:
        plain = ok[~ok["variant"].isin(COMPILED_STEPS)]
        compile_s = float(best["first_s"]) if pd.notna(best["first_s"]) else 0.0
        if len(plain) and (horizon_s - compile_s) / best["ms_step"] < horizon_s / plain["ms_step"].iloc[0]:
            unpaid = (
                f"; {best['variant']} ({best['ms_step']:.1f} ms) passed over: its {compile_s:.0f} s compile "
                f"does not pay within {horizon_s:.0f} s"
            )
            best = plain.iloc[0]
    eager = ok[ok["variant"] == "eager"]
    than = f" (eager {eager['ms_step'].iloc[0]:.1f})" if len(eager) and best["variant"] != "eager" else ""
    return Picked(
        best["variant"],
        f"training variant: {best['variant']}, {best['ms_step']:.1f} ms a step{than} at "
        f"{precision}, {best['check']}{unpaid}",
        float(best["ms_step"]),
    )


def check_fits(ledger: dict, s: Slice, budget_s: float, step_ms: float | None = None) -> None:
    reason = why_not(ledger, s, budget_s, step_ms if step_ms is not None else ledger["step_ms"])
    if reason is not None:
        raise SliceError(f"slice {s.name} {reason}")


# --- the ledger's state ----------------------------------------------------------------------


def planning_step(ledger: dict, committed: Path, device: str | None) -> tuple[float, str]:
    """(ms a step, which step it is, in words) `slice status` plans with: the variant `device`'s
    committed step table chose (`steptable.chosen`), else the ledger's step_ms, saying why."""
    if device is None:
        return ledger["step_ms"], f"the ledger's {ledger['step_ms']:g} ms a step (no device named: --device)"
    found, line = steptable.chosen(committed, device, ledger["precision"])
    if found is None:
        return ledger["step_ms"], f"the ledger's {ledger['step_ms']:g} ms a step ({line})"
    return found["ms_step"], line


def status(ledger_path: Path = LEDGER, device: str | None = None) -> str:
    """The ledger's slices, done or to do, and the next one a lease of `device` (default the kind
    the ledger names) would train, planned at `planning_step`'s step."""
    ledger = read_ledger(ledger_path)
    device = device if device is not None else ledger.get("device")
    committed = ledger_path.parent / steptable.COMMITTED
    step_ms, step = planning_step(ledger, committed, device)
    at = {**ledger, "step_ms": step_ms}
    have = done(ledger_path.parent, ledger["name"])
    lines = []
    for s in ledger["slices"]:
        r = record(have[s.name]) if s.name in have else None
        ran = f"{r['device']}, {r['date']}, revision {r['git']}, {r['precision']}" if r else ""
        if is_done(ledger, s, have):
            lines.append(
                f"{s.name}: done" + (f" on {ran}" if r else " (by the slices it joins, or one joining it)")
            )
        else:
            earlier = f"; a result of an earlier path kept as a record ({ran})" if r else ""
            lines.append(
                f"{s.name}: to do ({s.what}; needs about {needed_s(at, s):.0f} s of a lease at "
                f"{step_ms:.1f} ms a step{earlier})"
            )
    if next_slice(ledger, ledger_path.parent) is None:
        return "\n".join(lines + ["next: none, every slice is done"])
    stands = steptable.same_files(committed, device) if device is not None else False
    measure = (
        "the chosen variant's check (the committed step table measured these step files)"
        if stands
        else "the full step table (no committed one of this device measured these step files)"
    )
    budget = ledger["lease_s"] - ledger["start_s"] - RETURN_S - (CHECK_S if stands else MEASURE_S)
    passed: list[str] = []
    nxt = next_slice(ledger, ledger_path.parent, budget, step_ms, say=passed.append)
    lines.append(
        f"next, on {device or 'a device not named'}, in a lease with {budget:.0f} s left after a "
        f"{ledger['start_s']:g} s start, the kit and {measure}, at {step}: {nxt.name if nxt else 'none fits'}"
        + "".join(f"\n  ({p})" for p in passed)
        + "\n  (a lease picks by the step it measures itself: `slice start`)"
    )
    return "\n".join(lines)
