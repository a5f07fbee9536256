"""The scorecard: every number the book compares with the paper, in one table.

A chapter records a row per quantity with `record(run_dir, ...)`; rows live in
`run_dir/scorecard.json`, keyed by (experiment id, quantity), so re-running a chapter
replaces its rows instead of adding duplicates. `book/99_scorecard.ipynb` renders them.

The verdict (see `verdict`) is deliberately crude; the "reading" column says in words
what the number means, and the chapter says the rest.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

FILE = "scorecard.json"
FIELDS = ("id", "quantity", "paper", "ours", "scale", "spread", "reading", "verdict", "chapter")
VERDICTS = ("matches", "same direction", "differs", "n/a")


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def verdict(paper: float | None, ours: float | None, rtol: float = 0.5,
            spread: float | None = None, reference: float | None = None, scale: float = 1.0) -> str:
    """Compare our number with the paper's.

    matches         |ours·scale - paper| <= rtol·|paper| + 2·spread·scale
                    (spread: the std across seeds, 0 with one seed)
    same direction  not within tolerance, but both on the same side of `reference`
                    (ours against reference, the paper's against reference·scale; e.g.
                    both losses far below the copying plateau, both drops before the
                    end of training): the paper's claim holds, not its number
    differs         otherwise, or we have no number (e.g. no drop happened)
    n/a             the paper gives no number

    scale: what our number (and a reference in our units) is multiplied by to be on the
    paper's scale; `loss_scale` for a loss, 1 for anything else.
    """
    if _missing(paper):
        return "n/a"
    if _missing(ours):
        return "differs"
    if abs(ours * scale - paper) <= rtol * abs(paper) + 2 * scale * (0.0 if _missing(spread) else spread):
        return "matches"
    if reference is not None and (ours < reference) == (paper < reference * scale):
        return "same direction"
    return "differs"


def loss_scale(profile) -> float:
    """The paper's copying level E[X²] over `profile`'s: a loss of this profile times this
    is on the paper's scale (1 on the paper's task; 2 on rank-1 matrices, whose E[X²] is
    1/9 against the paper's 2/9). A loss is compared as a fraction of its own task's
    copying level, the one reading that means the same on both tasks."""
    from .config import load_profile, profile_path
    from .data import copy_baseline_mse

    return copy_baseline_mse(load_profile(profile_path("paper")).data.rank) / copy_baseline_mse(profile.data.rank)


def load(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / FILE
    return json.loads(path.read_text()) if path.is_file() else []


def _order(row: dict):
    # E2 before E10: sort by the experiment's number, then keep recording order
    m = re.match(r"E(\d+)", row["id"])
    return int(m.group(1)) if m else math.inf


def _write(run_dir: str | Path, rows: list[dict]) -> None:
    path = Path(run_dir) / FILE
    tmp = path.with_name(f".tmp-{FILE}")
    tmp.write_text(json.dumps(rows, indent=1))
    os.replace(tmp, path)  # a reader never sees half a file


def forget_chapter(run_dir: str | Path, chapter: str) -> None:
    """Drop the rows a chapter recorded: called before the chapter runs again, so that a
    row it no longer records (a renamed quantity, an experiment removed) does not linger."""
    rows = load(run_dir)
    if any(r["chapter"] == chapter for r in rows):
        _write(run_dir, [r for r in rows if r["chapter"] != chapter])


def record(run_dir: str | Path, id: str, quantity: str, paper: float | None, ours: float | None,
           reading: str, spread: float | None = None, chapter: str = "", scale: float = 1.0,
           **verdict_kw) -> dict:
    """Add or replace the row (id, quantity); the verdict is computed here (`scale`: see
    `verdict`; the row keeps our number as measured, and the scale). Returns the row."""
    clean = lambda x: None if _missing(x) else float(x)  # JSON has no NaN
    row = {"id": id, "quantity": quantity, "paper": clean(paper), "ours": clean(ours), "scale": float(scale),
           "spread": clean(spread), "reading": reading,
           "verdict": verdict(paper, ours, spread=spread, scale=scale, **verdict_kw), "chapter": chapter}
    rows = [r for r in load(run_dir) if (r["id"], r["quantity"]) != (id, quantity)] + [row]
    rows.sort(key=_order)  # stable: rows of one experiment keep their order
    _write(run_dir, rows)
    return row
