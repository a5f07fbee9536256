"""A run cut short: how far the run a chapter reads got (`Stage`, `run_stage`), and the
provisional mark on every row that reads its end (`reads_late`, `provisional`), which a table
shows beside the verdict (`shown_verdict`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..core import paper
from ..core.data import copy_level
from ..core.ending import RunEnd
from ..core.metrics import end_slope, window_mean
from ..core.runs import END, METRICS, run_profile
from .scorecard_rules import _missing, _se, is_own

# The paper's "pre" and "post" (EXPERIMENTS.md §2): the steps its numbers were read at.
PAPER_PRE, PAPER_POST = 4_000, 50_000
# Experiments whose every row reads the run's last model (post), whatever their quantity
# says; other rows read it when their quantity names it (`LATE_WORDS`), e.g. E3's "post ...",
# E6's "pre with post's QKV", E1's "final L", and E1's "fall steps" (the fall ends where L_mask comes
# within a factor of its final level, so a run cut short ends its fall sooner).
LATE_IDS = ("E4", "E5", "E7", "E8", "E10", "E11", "E12", "E13", "E16", "E18")
LATE_WORDS = re.compile(r"\b(post|final|fall)\b")


def reads_late(row: dict) -> bool:
    """Whether `row` reads the run's end: a row of `LATE_IDS`, a quantity matching `LATE_WORDS`,
    or a BERT row of E17; never a finding of our own (those read the plateau and the drop)."""
    if is_own(row):
        return False
    return (
        row["id"] in LATE_IDS
        or bool(LATE_WORDS.search(row["quantity"]))
        or (row["id"] == "E17" and row["quantity"].startswith("BERT"))
    )


@dataclass(frozen=True)
class Stage:
    """How far the run a chapter reads got, for the rows that read its end (`reads_late`).

    step: where its last model and final level are read; planned: the steps it was to train;
    cut: ended "cut" or "unfinished" before `planned` (`is_cut`); rel: L_mask / E[X²] over the
    window ending at `step` (`window_mean`); paper_rel: the paper's post L_mask / E[X²] (step
    50 000); slope, slope_se: L_mask's relative change per 1 000 steps over the last 2 000."""

    step: int
    planned: int
    cut: bool
    rel: float | None = None
    paper_rel: float | None = None
    slope: float | None = None
    slope_se: float | None = None

    @property
    def note(self) -> str:
        """The line a provisional row carries (step read, L_mask there against the paper's, how fast
        it still fell); "" for a run not cut."""
        if not self.cut:
            return ""
        level = "" if _missing(self.rel) else f"; L_mask there {self.rel:.3g}·E[X²]"
        if not _missing(self.rel) and not _missing(self.paper_rel) and self.paper_rel > 0:
            level += (
                f", {self.rel / self.paper_rel:.3g}× the paper's at step {PAPER_POST:,} "
                f"({self.paper_rel:.3g}·E[X²])"
            )
        fall = (
            ""
            if _missing(self.slope)
            else f"; still changing {self.slope:+.1%} ± {_se(self.slope_se):.1%} per 1,000 steps"
        )
        return f"reads step {self.step:,} of a run cut short of its {self.planned:,}{level}{fall}"

    @property
    def comparisons(self) -> str:
        """A clause on what the rows that read the run's end compare: the paper's end, or provisionally."""
        if not self.cut:
            return "the comparisons below read the run's end, as the paper reads its own"
        return (
            f"the comparisons below are provisional: the run was cut at step {self.step:,} of its "
            f"{self.planned:,}, and the paper read its model at step {PAPER_POST:,}"
        )


def is_cut(end) -> bool:
    """Whether a `RunEnd` ended "cut" or "unfinished" before its steps; None (no end.json) is not."""
    return end is not None and end.ended in ("cut", "unfinished") and end.step < end.steps


def stage(end, metrics, rank: int) -> Stage:
    """The `Stage` of a run from its `RunEnd` and metrics (the rows up to its end)."""

    ran = metrics[metrics["step"] <= end.step] if metrics is not None else None
    rel = slope = slope_se = None
    if ran is not None and len(ran):
        rel = float(window_mean(ran, end.step)["L_mask"]) / copy_level(rank)
        slope, slope_se = end_slope(ran, 2000)
    return Stage(
        step=int(end.step),
        planned=int(end.steps),
        cut=is_cut(end),
        rel=rel,
        paper_rel=paper.PAPER[("E3", "post L_mask")] / copy_level(paper.task().rank),
        slope=slope,
        slope_se=slope_se,
    )


def run_stage(run_dir: str | Path) -> Stage | None:
    """The `Stage` of the run in `run_dir` (its end.json and metrics), or None without end.json."""

    run_dir = Path(run_dir)
    if not (run_dir / END).is_file():
        return None

    end = RunEnd.from_json(json.loads((run_dir / END).read_text()))
    metrics = None
    for name in (METRICS, METRICS + ".gz"):
        if (run_dir / name).is_file():
            metrics = pd.read_csv(run_dir / name)
            break
    try:
        rank = run_profile(run_dir).data.rank
    except (FileNotFoundError, OSError, ValueError):
        rank = 2
    return stage(end, metrics, rank)


def provisional(rows: list[dict], at: Stage | None) -> list[dict]:
    """`rows`, each that reads the end of a cut run (`reads_late`; not n/a or cannot fail) marked
    with `Stage.note`, the others with None; verdicts unchanged."""
    mark = at.note if at is not None and at.cut else ""
    return [
        {
            **r,
            "provisional": (mark or None)
            if reads_late(r) and r.get("verdict") not in ("n/a", "cannot fail")
            else None,
        }
        for r in rows
    ]


def is_provisional(row: dict) -> bool:
    return bool(row.get("provisional"))


def shown_verdict(row: dict) -> str:
    """The verdict as a table shows it: "differs, provisional" for a provisional row."""
    return f"{row['verdict']}, provisional" if is_provisional(row) else row["verdict"]
