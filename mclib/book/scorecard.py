"""The scorecard: every claim of the paper the book tests, one row each, with a verdict;
and, apart, the findings of our own beyond the paper.

A chapter records a row per claim with `record(run_dir, ...)`; rows live in the run
folder's scorecard.json (`mclib.core.runs.SCORECARD`), keyed by (experiment id, quantity), so re-running a chapter
replaces its rows instead of adding duplicates. `book/99_scorecard.ipynb` renders them.

Each row names its *kind* of claim, and the kind's rule (one function per kind, in
`RULES`) gives the verdict. Every rule can come out "differs": the tolerance is two
standard errors of our measurement plus a stated relative margin (`MARGINS`), never a
blanket factor. Each rule has a band that counts as agreeing with the paper (the paper's
number ± its margin; beyond the reference by its margin) and sets our estimate's interval,
± two standard errors, against it: inside the band, the positive verdict; outside it, "differs";
reaching both, "too close to tell" (`CLOSE`), counted apart from both. `rules_table()` prints the rules from the functions' docstrings, so the
book states them without typing them twice.

A chapter's sentence that compares with the paper ("as in the paper", "unlike the paper")
takes those words from the verdict of the row it speaks for (`agreement`, with the verdict
from `row_verdict`), never from a test of its own, so prose and scorecard cannot disagree;
`record` refuses a row whose reading says otherwise than its verdict.

A finding beyond the paper (chapter 07's lead, the 2025 follow-up's claims carried to this
task) is a row of kind "finding" (`OWN`): judged by its own rule (`finding`, the direction
rule's test, worded "holds" or "fails"), its sentence says "holds here" or "does not hold
here", never "as in the paper", and it is counted apart: `paper_rows` leaves it out of
every count of the paper's claims (`headline`, `findings`, chapter 99), and `own_rows`
gives chapter 99 its own table and counts.

No number is multiplied across tasks into a verdict. When the profile's task is not the
paper's, a row compares a scale-free quantity (a loss over its own task's copying level
E[X²], a ratio of two losses on the same matrices, a step as a fraction of another
step), and says which in its quantity.

Here: a row's fields, recording and loading (`record`, `load`, under a lock: `locked`), and
what a chapter adds (`claim`, `recorded_table`). The rules are in scorecard_rules, a run cut
short (provisional rows) in scorecard_stage, the counts, tables and sentences in scorecard_tables.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

from filelock import FileLock

from ..core.runs import SCORECARD, SCORECARD_LOCK, write_atomic
from .scorecard_rules import CLOSE, _missing, contradiction, interval, judge
from .scorecard_stage import Stage, provisional, run_stage, shown_verdict
from .scorecard_tables import row_order

FIELDS = ("id", "quantity", "kind", "paper", "ours", "se", "spread", "reading", "verdict", "chapter", "provisional")
# A row's cause (why it differs from the paper, where a chapter found it) is kept only in a row that differs or
# cannot tell (`record`): like RULE_FIELDS, not in every row.
# What a rule needs besides the numbers (a direction's reference, sense and margin; an ordering's
# values and order; a number's or ratio's span over several readings and its rounding spread): `record`
# keeps them in the row, so a recorded row can be judged again by today's rule.
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
    """scorecard.json read and written by one process at a time: two chapters may execute
    side by side (`mclib.book.runner`, the training chapter beside the others), each
    `record` reading the rows, adding its own and writing them back. An exclusive lock on
    a file beside it (`filelock.FileLock`), held for one read-and-write."""
    if not Path(run_dir).is_dir():  # no folder yet: no rows to keep
        yield
        return
    with FileLock(Path(run_dir) / SCORECARD_LOCK):
        yield


def forget_chapter(run_dir: str | Path, chapter: str) -> None:
    """Drop the rows a chapter recorded: called before the chapter runs again, so that a
    row it no longer records (a renamed quantity, an experiment removed) does not linger."""
    with locked(run_dir):
        rows = load(run_dir)
        if any(r["chapter"] == chapter for r in rows):
            _write(run_dir, [r for r in rows if r["chapter"] != chapter])


def record(run_dir: str | Path, id: str, quantity: str, paper=None, ours=None, *, reading: str = "",
           kind: str = "number", se=None, spread=None, chapter: str = "", at: Stage | None = None,
           cause: str = "", **rule_kw) -> dict:
    """Add or replace the row (id, quantity); the verdict is computed here by `judge`
    (rule_kw: margin, reference and sense for a direction, values and order for an
    ordering, span for a number or ratio read several times, na for a claim with nothing
    to test; each but na kept in the row, `RULE_FIELDS`, so that it can be judged again),
    and marked provisional where the row reads the end of a
    run cut short (`at`: the run's `Stage`; `provisional`). cause: why the row differs from the
    paper, one sentence, where the chapter found it (kept only where the verdict is not a
    positive one: a cause of nothing is not shown). Returns the row."""
    clean = lambda x: None if _missing(x) else float(x)  # JSON has no NaN
    v = judge(kind, paper=paper, ours=ours, se=se, spread=spread, **rule_kw)
    said = contradiction(reading, v)
    if said:
        raise ValueError(f"the reading of {id} {quantity!r} says {said!r} but its verdict is {v!r}: build the "
                         "reading's comparison with `agreement(verdict)`")
    if rule_kw.get("na"):
        reading = f"{reading}; n/a: {rule_kw['na']}" if reading else f"n/a: {rule_kw['na']}"
    row = {"id": id, "quantity": quantity, "kind": kind, "paper": clean(paper), "ours": clean(ours),
           "se": clean(se), "spread": clean(spread), "reading": reading, "verdict": v, "chapter": chapter,
           **{k: rule_kw[k] for k in RULE_FIELDS if rule_kw.get(k) is not None}}  # what judging it again needs
    if cause and v in ("differs", CLOSE):
        row["cause"] = cause
    row = provisional([row], at)[0]
    with locked(run_dir):
        rows = [r for r in load(run_dir) if (r["id"], r["quantity"]) != (id, quantity)] + [row]
        rows.sort(key=row_order)  # by experiment, then chapter; stable: a chapter's rows keep their order
        _write(run_dir, rows)
    return row


def record_rows(run_dir: str | Path, rows: list[dict], chapter: str) -> list[dict]:
    """`record` every row (keyword arguments, as the chapters' modules build them) for
    `chapter`, each marked provisional where it reads the end of the run in `run_dir` and
    that run was cut (`run_stage`); returns the recorded rows, verdicts included."""
    at = run_stage(run_dir)
    return [record(run_dir, **r, chapter=chapter, at=at) for r in rows]


# --- what a chapter adds -------------------------------------------------------------------

def claim(id, quantity, ours, reading, paper=None, *, kind="number", **rule) -> dict:
    """Keyword arguments for `record` (a chapter builds its rows with this, then records them
    with `recorded_table`): rule holds se, spread, margin, reference and sense (a
    direction), values and order (an ordering) or na (nothing to test)."""
    return {"id": id, "quantity": quantity, "paper": paper, "ours": ours, "reading": reading, "kind": kind, **rule}


def recorded_table(run_dir: str | Path, rows: list[dict], chapter: str,
                   columns=("id", "quantity", "paper", "ours", "se", "verdict", "reading"),
                   caption: str = "The numbers this chapter adds to the scorecard."):
    """`record_rows`, shown as the styled table the chapter shows under its closing
    paragraph, with the chosen columns (the verdicts as `record` computed them); the column
    "interval" is the interval of ours that each row's rule reads (`scorecard_rules.interval`)."""
    import pandas as pd

    recorded = record_rows(run_dir, rows, chapter)
    reach = lambda r: "—" if (i := interval(r)) is None else f"{i[0]:.3g} – {i[1]:.3g}"
    shown = pd.DataFrame([{**r, "verdict": shown_verdict(r), "interval": reach(r)} for r in recorded])[list(columns)]
    formats = {"paper": "{:.3g}", "ours": "{:.3g}", "se": "{:.2g}", "spread": "{:.2g}"}
    return (shown.rename(columns={"se": "s.e."}).style.hide(axis="index")
            .format({("s.e." if k == "se" else k): f for k, f in formats.items() if k in columns}, na_rep="—")
            .set_caption(caption))
