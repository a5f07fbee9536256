"""The step table a lease measures (benchmarks/lease_step.py), and when the last one stands for it.

A full table (every variant of the step checked against eager and timed) takes ~110 s of a
lease, mostly two compiles. It answers for the step as the files that define it are (STEP_FILES:
the model, its attention, the step and the training loop, the graph, the batch, the loss), on
one torch, one kind of device, one precision. So the table of the last lease is committed
(results/lease_step.csv, filed by `slice merge`) with those four in every row, and a lease whose
four are the same measures again only eager and the variant that table chose, each checked and
timed (at most ~30 s). Any one changed, and the lease measures the full table again.

    key(device, precision)      the four for this checkout, this torch, this device
    stands(committed, key)      the variant the committed table chose, where it stands for this lease
    same_files(committed)       whether it measured this checkout's step files (`slice status`)
    adopt(table, committed)     a full table a lease sent back, committed in place of the last one
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from ..core.repo import REPO

COMMITTED = "lease_step.csv"   # beside the ledger (results/): the last full table, with its key in every row
STEP_FILES = ("mclib/core/model.py", "mclib/core/attention.py", "mclib/core/step.py", "mclib/core/precision.py",
              "mclib/core/graphstep.py", "mclib/core/data.py", "mclib/core/metrics.py")
KEY = ("step_hash", "torch", "device", "precision")
CHOSEN = ("eager", "compile", "reduce-overhead", "cuda-graph")  # mclib.lease.slices.TRAINED_STEPS


def step_hash(root: Path = REPO) -> str:
    """sha256 (its first 12 hex digits) of STEP_FILES' names and bytes, in that order."""
    h = hashlib.sha256()
    for name in STEP_FILES:
        h.update(name.encode() + b"\0" + (Path(root) / name).read_bytes() + b"\0")
    return h.hexdigest()[:12]


def key(device: str, precision: str) -> dict:
    """The four a step table answers for: the step's files (`step_hash`), torch, the device's name, the precision."""
    import torch

    return {"step_hash": step_hash(), "torch": torch.__version__, "device": device, "precision": precision}


def stands(committed: Path, now: dict) -> tuple[str | None, str]:
    """(the variant the committed table chose, one line) where its key is `now`'s and it chose one
    (the fastest that passed its check); (None, why not) otherwise: the full table runs."""
    import pandas as pd

    committed = Path(committed)
    if not committed.is_file():
        return None, f"no committed step table at {committed}"
    t = pd.read_csv(committed)
    missing = [k for k in KEY + ("variant", "passed", "ms_step") if k not in t.columns]
    if t.empty or missing:
        return None, f"{committed.name} has no {', '.join(missing) or 'rows'}: a table of an earlier revision"
    first = t.iloc[0]
    changed = [f"{k} {first[k]} -> {now[k]}" for k in KEY if str(first[k]) != str(now[k])]
    if changed:
        return None, f"{committed.name} measured another step: {'; '.join(changed)}"
    ok = t[t["variant"].isin(CHOSEN) & (t["passed"].astype(str) == "True") & t["ms_step"].notna()
           & (t["precision"] == now["precision"])]
    if ok.empty:
        return None, f"{committed.name} has no variant that passed its check"
    best = ok.sort_values("ms_step").iloc[0]
    when = f" of {first['date']}" if "date" in t.columns else ""
    return best["variant"], (f"{committed.name}{when} stands (the same step files {now['step_hash']}, torch "
                             f"{now['torch']}, {now['device']}, {now['precision']}): only eager and its "
                             f"{best['variant']} ({best['ms_step']:.1f} ms) are checked")


def same_files(committed: Path) -> bool:
    """Whether the committed table measured this checkout's step files (torch, device and
    precision are the lease's to tell)."""
    import pandas as pd

    committed = Path(committed)
    if not committed.is_file():
        return False
    t = pd.read_csv(committed)
    return "step_hash" in t.columns and len(t) > 0 and str(t["step_hash"].iloc[0]) == step_hash()


def adopt(table: Path, committed: Path) -> str | None:
    """Commit `table` (a lease's) as `committed` where it is a full table of this revision's
    columns; one line saying so, or None where it is not (a check-only table, an older one)."""
    import pandas as pd

    table, committed = Path(table), Path(committed)
    if not table.is_file():
        return None
    t = pd.read_csv(table)
    if t.empty or "mode" not in t.columns or not (t["mode"] == "full").all() or not set(KEY) <= set(t.columns):
        return None
    tmp = committed.with_name(f".tmp-{committed.name}")
    shutil.copyfile(table, tmp)
    os.replace(tmp, committed)
    return (f"step table of {t['device'].iloc[0]}, torch {t['torch'].iloc[0]}, {t['precision'].iloc[0]}, step files "
            f"{t['step_hash'].iloc[0]}: committed as {committed}")
