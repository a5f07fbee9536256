"""The step tables leases measure (benchmarks/lease_step.py), and when the committed one stands for a lease.

A full table (every variant of the step checked against eager and timed) takes up to ~110 s of a
lease and holds for one KEY: the step's files (STEP_FILES, hashed), torch, device kind, precision.
So each device kind's last full table is committed, side by side in one file with KEY in every row
(results/lease_step.csv, filed by `slice merge`). A lease whose KEY is that of its device's rows
checks and times only eager and the variant that table chose (~30 s); else it measures the full
table. A table's precision (TABLE_PRECISION) is its eager row's: a row for the record at another
precision (bf16) belongs to it all the same. Entry points: `key`, `rows`, `chosen`, `stands`
(a lease), `same_files` (`slice status`), `adopt` (`slice merge`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import torch
import yaml

from ..core.repo import REPO
from ..core.runs import write_atomic
from ..core.step import WAYS

COMMITTED = (
    "lease_step.csv"  # beside the ledger (results/): each device's last full table, its key in every row
)
LEDGER_NAME = "paper-slices.yaml"  # the plan (mclib.lease.slices.LEDGER), whose `device` is the kind lent now
STEP_FILES = (
    "mclib/core/model.py",
    "mclib/core/attention.py",
    "mclib/core/step.py",
    "mclib/core/precision.py",
    "mclib/core/graphstep.py",
    "mclib/core/data.py",
    "mclib/core/metrics.py",
)
KEY = ("step_hash", "torch", "device", "precision")
CHOSEN = tuple(
    WAYS
)  # the variants a slice may train with (mclib.lease.slices.TRAINED_STEPS): every train.step way
TABLE_PRECISION = "table_precision"  # in the committed file: the precision of the table a row belongs to


def step_hash(root: Path = REPO) -> str:
    """sha256 (its first 12 hex digits) of STEP_FILES' names and bytes, in that order."""
    h = hashlib.sha256()
    for name in STEP_FILES:
        h.update(name.encode() + b"\0" + (Path(root) / name).read_bytes() + b"\0")
    return h.hexdigest()[:12]


def key(device: str, precision: str) -> dict:
    """The four a step table answers for: the step's files (`step_hash`), torch, the device's name,
    the precision."""
    return {"step_hash": step_hash(), "torch": torch.__version__, "device": device, "precision": precision}


def _with_table_precision(t):
    """`t` with TABLE_PRECISION in every row: where a row has none (a single lease's table, or a
    committed file of an earlier revision), that of its device's eager row."""
    t = t.copy()
    eager = t[t["variant"] == "eager"].drop_duplicates("device").set_index("device")["precision"]
    derived = t["device"].map(eager).fillna(t["precision"])
    t[TABLE_PRECISION] = t[TABLE_PRECISION].fillna(derived) if TABLE_PRECISION in t else derived
    return t


def rows(t, device: str, precision: str | None = None):
    """The rows of `device`'s table in the committed table `t` (at `precision`, where given)."""
    t = _with_table_precision(t)
    mine = t["device"].astype(str) == str(device)
    if precision is not None:
        mine &= t[TABLE_PRECISION].astype(str) == str(precision)
    return t[mine]


def _read(committed: Path):
    """(the committed table, None), or (None, why not, in one line)."""
    if not committed.is_file():
        return None, f"no committed step table at {committed}"
    t = pd.read_csv(committed)
    missing = [k for k in KEY + ("variant", "passed", "ms_step") if k not in t.columns]
    if t.empty or missing:
        return None, f"{committed.name} has no {', '.join(missing) or 'rows'}: a table of an earlier revision"
    return t, None


def _fastest(t, precision: str):
    """The row of the fastest variant at `precision` that passed its check, or None."""
    ok = t[
        t["variant"].isin(CHOSEN)
        & (t["passed"].astype(str) == "True")
        & t["ms_step"].notna()
        & (t["precision"] == precision)
    ]
    return ok.sort_values("ms_step").iloc[0] if len(ok) else None


def chosen(committed: Path, device: str, precision: str) -> tuple[dict | None, str]:
    """({variant, ms_step, date, device, step_hash} of the variant `device`'s committed table at
    `precision` chose, one line) or (None, why there is none, in one line)."""
    committed = Path(committed)
    t, why = _read(committed)
    if t is None:
        return None, why
    mine = rows(t, device, precision)
    if mine.empty:
        return None, f"{committed.name} has no rows of {device} at {precision}"
    best = _fastest(mine, precision)
    if best is None:
        return None, f"{committed.name} has no variant of {device} at {precision} that passed its check"
    date = str(best["date"]) if "date" in mine.columns else "an undated table"
    found = {
        "variant": best["variant"],
        "ms_step": float(best["ms_step"]),
        "date": date,
        "device": device,
        "step_hash": str(best["step_hash"]),
    }
    return found, (
        f"{found['ms_step']:.1f} ms a step ({found['variant']}, the fastest that passed its check in "
        f"{committed.name}'s table of {device} of {date})"
    )


def stands(committed: Path, now: dict) -> tuple[str | None, str]:
    """(the variant the committed table of `now`'s device chose, one line) where that table's key
    is `now`'s and it chose one (the fastest that passed its check); (None, why not) otherwise:
    the full table runs."""
    committed = Path(committed)
    t, why = _read(committed)
    if t is None:
        return None, why
    mine = rows(t, now["device"])
    if mine.empty:
        return None, f"{committed.name} has no rows of {now['device']}"
    table = mine[mine[TABLE_PRECISION].astype(str) == str(now["precision"])]
    if table.empty:
        return None, f"{committed.name} has no table of {now['device']} at {now['precision']}"
    first = table.iloc[0]
    changed = [
        f"{k} {first[k]} -> {now[k]}" for k in KEY if k != "precision" and str(first[k]) != str(now[k])
    ]
    if changed:
        return None, f"{committed.name} measured another step: {'; '.join(changed)}"
    best = _fastest(table, now["precision"])
    if best is None:
        return None, f"{committed.name} has no variant that passed its check"
    when = f" of {first['date']}" if "date" in t.columns else ""
    return best["variant"], (
        f"{committed.name}{when} stands (the same step files {now['step_hash']}, torch "
        f"{now['torch']}, {now['device']}, {now['precision']}): only eager and its "
        f"{best['variant']} ({best['ms_step']:.1f} ms) are checked"
    )


def planned_device(committed: Path) -> str | None:
    """The device kind the plan beside `committed` names (its `device`: the kind lent now), or None."""
    ledger = Path(committed).parent / LEDGER_NAME
    return (yaml.safe_load(ledger.read_text()) or {}).get("device") if ledger.is_file() else None


def same_files(committed: Path, device: str | None = None) -> bool:
    """Whether `device`'s committed table (default: the device kind the plan beside it names)
    measured this checkout's step files (torch and precision are the lease's to tell)."""
    committed = Path(committed)
    t, _ = _read(committed)
    device = device if device is not None else planned_device(committed)
    if t is None or device is None:
        return False
    mine = rows(t, device)
    return len(mine) > 0 and str(mine["step_hash"].iloc[0]) == step_hash()


def adopt(table: Path, committed: Path) -> str | None:
    """Write `table` (a lease's) into `committed` where it is a full table of this revision's
    columns: its rows replace those of its device at its precision, the other devices' rows are
    kept; written whole, then renamed. One line saying so, or None where it is not a full table
    (a check-only table, an older one)."""
    table, committed = Path(table), Path(committed)
    if not table.is_file():
        return None
    t = pd.read_csv(table)
    full = "mode" in t.columns and (t["mode"] == "full").all()
    if t.empty or not full or not set(KEY) | {"variant"} <= set(t.columns):
        return None
    if t["device"].nunique() != 1:
        raise ValueError(
            f"{table}: a lease's step table holds one device, this one {t['device'].nunique()}: "
            f"{', '.join(map(str, t['device'].unique()))}"
        )
    t = _with_table_precision(t)
    device, precision = t["device"].iloc[0], t[TABLE_PRECISION].iloc[0]
    kept = _with_table_precision(pd.read_csv(committed)) if committed.is_file() else t.iloc[:0]
    kept = kept[~((kept["device"] == device) & (kept[TABLE_PRECISION] == precision))]
    write_atomic(committed, lambda tmp: pd.concat([kept, t], ignore_index=True).to_csv(tmp, index=False))
    others = sorted(set(kept["device"].astype(str)))
    return (
        f"step table of {device}, torch {t['torch'].iloc[0]}, {precision}, "
        f"step files {t['step_hash'].iloc[0]}: "
        f"written as {committed}" + (f" (the rows of {', '.join(others)} kept)" if others else "")
    )
