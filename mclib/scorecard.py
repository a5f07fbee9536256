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
FIELDS = ("id", "quantity", "paper", "ours", "spread", "reading", "verdict", "chapter")
VERDICTS = ("matches", "same direction", "differs", "n/a")


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def verdict(paper: float | None, ours: float | None, rtol: float = 0.5,
            spread: float | None = None, reference: float | None = None) -> str:
    """Compare our number with the paper's.

    matches         |ours - paper| <= rtol·|paper| + 2·spread
                    (spread: the std across seeds, 0 with one seed)
    same direction  not within tolerance, but both on the same side of `reference`
                    (e.g. both losses far below the copying plateau, both drops
                    before the end of training): the paper's claim holds, not its number
    differs         otherwise, or we have no number (e.g. no drop happened)
    n/a             the paper gives no number
    """
    if _missing(paper):
        return "n/a"
    if _missing(ours):
        return "differs"
    if abs(ours - paper) <= rtol * abs(paper) + 2 * (0.0 if _missing(spread) else spread):
        return "matches"
    if reference is not None and (ours < reference) == (paper < reference):
        return "same direction"
    return "differs"


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
           reading: str, spread: float | None = None, chapter: str = "", **verdict_kw) -> dict:
    """Add or replace the row (id, quantity); the verdict is computed here. Returns the row."""
    clean = lambda x: None if _missing(x) else float(x)  # JSON has no NaN
    row = {"id": id, "quantity": quantity, "paper": clean(paper), "ours": clean(ours),
           "spread": clean(spread), "reading": reading,
           "verdict": verdict(paper, ours, spread=spread, **verdict_kw), "chapter": chapter}
    rows = [r for r in load(run_dir) if (r["id"], r["quantity"]) != (id, quantity)] + [row]
    rows.sort(key=_order)  # stable: rows of one experiment keep their order
    _write(run_dir, rows)
    return row
