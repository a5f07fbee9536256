"""The scorecard: one row per claim of the paper the book tests, each with a verdict, and,
counted apart, findings of our own beyond the paper (kind "finding", `OWN`).

A chapter builds rows with `claim` and records them (`record_rows`, `recorded_table`) in the run
folder's scorecard.json, keyed by (experiment id, quantity), so a chapter run again replaces its
rows; book/99_scorecard.ipynb renders them. A row's kind picks its rule (scorecard_rules.RULES),
which gives the verdict, and a sentence takes its words from that verdict (`agreement`). On a
task other than the paper's, a row compares a scale-free quantity (a loss over E[X²], a ratio of
losses, a step over a step), named in its quantity. Rules: scorecard_rules; rows of a run cut
short: scorecard_stage; counts, tables and sentences: scorecard_tables.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pandas as pd
from filelock import FileLock

from ..core.runs import SCORECARD, SCORECARD_LOCK, write_atomic
from .scorecard_rules import CLOSE, _missing, contradiction, interval, judge
from .scorecard_stage import Stage, provisional, run_stage, shown_verdict
from .scorecard_tables import row_order

FIELDS = (
    "id",
    "quantity",
    "kind",
    "paper",
    "ours",
    "se",
    "spread",
    "reading",
    "verdict",
    "chapter",
    "provisional",
)
# Kept in a row only where given: its cause (only in a row that differs or cannot tell) and what its
# rule needs besides the numbers (RULE_FIELDS), so that a recorded row can be judged again.
RULE_FIELDS = ("margin", "reference", "sense", "values", "order", "span", "rounding")
SHOWN = ("id", "quantity", "kind", "paper", "ours", "se", "spread", "verdict", "reading", "cause")


def load(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / SCORECARD
    return json.loads(path.read_text()) if path.is_file() else []


def _write(run_dir: str | Path, rows: list[dict]) -> None:
    # a reader never sees half a file
    write_atomic(Path(run_dir) / SCORECARD, json.dumps(rows, indent=1))


@contextlib.contextmanager
def locked(run_dir: str | Path):
    """scorecard.json read and written by one process at a time (chapters may execute side by
    side): a `filelock.FileLock` on a file beside it, held for one read-and-write."""
    if not Path(run_dir).is_dir():  # no folder yet: no rows to keep
        yield
        return
    with FileLock(Path(run_dir) / SCORECARD_LOCK):
        yield


def forget_chapter(run_dir: str | Path, chapter: str) -> None:
    """Drop the rows `chapter` recorded, so that a row it no longer records does not linger."""
    with locked(run_dir):
        rows = load(run_dir)
        if any(r["chapter"] == chapter for r in rows):
            _write(run_dir, [r for r in rows if r["chapter"] != chapter])


def record(
    run_dir: str | Path,
    id: str,
    quantity: str,
    paper=None,
    ours=None,
    *,
    reading: str = "",
    kind: str = "number",
    se=None,
    spread=None,
    chapter: str = "",
    at: Stage | None = None,
    cause: str = "",
    **rule_kw,
) -> dict:
    """Add or replace the row (id, quantity), judged by `judge`, and return it. rule_kw: margin,
    reference, sense, values, order, span, rounding (kept in the row, `RULE_FIELDS`) or na (a reason:
    nothing to test). at: the run's `Stage` (rows reading a cut run's end are marked provisional).
    cause: one sentence on why the row differs, kept only where the verdict is "differs" or `CLOSE`.
    Raises ValueError where `reading` uses other agreement words than the verdict's (`agreement`)."""
    clean = lambda x: None if _missing(x) else float(x)  # JSON has no NaN
    v = judge(kind, paper=paper, ours=ours, se=se, spread=spread, **rule_kw)
    said = contradiction(reading, v)
    if said:
        raise ValueError(
            f"the reading of {id} {quantity!r} says {said!r} but its verdict is {v!r}: build the "
            "reading's comparison with `agreement(verdict)`"
        )
    if rule_kw.get("na"):
        reading = f"{reading}; n/a: {rule_kw['na']}" if reading else f"n/a: {rule_kw['na']}"
    row = {
        "id": id,
        "quantity": quantity,
        "kind": kind,
        "paper": clean(paper),
        "ours": clean(ours),
        "se": clean(se),
        "spread": clean(spread),
        "reading": reading,
        "verdict": v,
        "chapter": chapter,
        **{k: rule_kw[k] for k in RULE_FIELDS if rule_kw.get(k) is not None},
    }  # what judging it again needs
    if cause and v in ("differs", CLOSE):
        row["cause"] = cause
    row = provisional([row], at)[0]
    with locked(run_dir):
        rows = [r for r in load(run_dir) if (r["id"], r["quantity"]) != (id, quantity)] + [row]
        rows.sort(key=row_order)  # by experiment, then chapter; stable: a chapter's rows keep their order
        _write(run_dir, rows)
    return row


def record_rows(run_dir: str | Path, rows: list[dict], chapter: str) -> list[dict]:
    """`record` each of `rows` for `chapter`, provisional where the run was cut (`run_stage`)."""
    at = run_stage(run_dir)
    return [record(run_dir, **r, chapter=chapter, at=at) for r in rows]


# --- what a chapter adds -------------------------------------------------------------------


def claim(id, quantity, ours, reading, paper=None, *, kind="number", **rule) -> dict:
    """Keyword arguments for `record`; rule: se, spread, margin, reference, sense, values, order, na."""
    return {
        "id": id,
        "quantity": quantity,
        "paper": paper,
        "ours": ours,
        "reading": reading,
        "kind": kind,
        **rule,
    }


def recorded_table(
    run_dir: str | Path,
    rows: list[dict],
    chapter: str,
    columns=("id", "quantity", "paper", "ours", "se", "verdict", "reading"),
    caption: str = "The numbers this chapter adds to the scorecard.",
):
    """`record_rows`, shown as a styled table of `columns`; "interval" is the interval of ours
    that each row's rule reads (`scorecard_rules.interval`)."""

    recorded = record_rows(run_dir, rows, chapter)
    reach = lambda r: "—" if (i := interval(r)) is None else f"{i[0]:.3g} – {i[1]:.3g}"
    shown = pd.DataFrame([{**r, "verdict": shown_verdict(r), "interval": reach(r)} for r in recorded])[
        list(columns)
    ]
    formats = {"paper": "{:.3g}", "ours": "{:.3g}", "se": "{:.2g}", "spread": "{:.2g}"}
    return (
        shown.rename(columns={"se": "s.e."})
        .style.hide(axis="index")
        .format({("s.e." if k == "se" else k): f for k, f in formats.items() if k in columns}, na_rep="—")
        .set_caption(caption)
    )
