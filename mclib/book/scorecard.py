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
"""
from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..core.runs import SCORECARD, write_atomic

FIELDS = ("id", "quantity", "kind", "paper", "ours", "se", "spread", "reading", "verdict", "chapter", "provisional")
# A row's cause (why it differs from the paper, where a chapter found it) is kept only in a row that differs or
# cannot tell (`record`): like RULE_FIELDS, not in every row.
# What a rule needs besides the numbers (a direction's reference, sense and margin; an ordering's
# values and order): `record` keeps them in the row, so a recorded row can be judged again by today's rule.
RULE_FIELDS = ("margin", "reference", "sense", "values", "order")
SHOWN = ("id", "quantity", "kind", "paper", "ours", "se", "spread", "verdict", "reading", "cause")

RANDOM_LEVEL = 1 / 3  # E[X²] of E2's "random" matrices (iid Unif[-1, 1] entries), whatever the rank


def copy_levels(rank: int) -> dict[str, tuple[float, float]]:
    """The copying levels model rows divide by: kind of matrix -> (our E[X²], the paper's).
    Low-rank matrices have E[X²] = rank/9; E2's random matrices 1/3 on both tasks (their
    rows are not rescaled)."""
    from ..core import paper
    from ..core.data import copy_level

    return {"low-rank": (copy_level(rank), copy_level(paper.task().rank)),
            "random": (RANDOM_LEVEL, RANDOM_LEVEL)}


# The relative margins of the rules, each added to two standard errors of our number.
MARGINS = {
    # A number: 10 %, about the sampling error of the paper's own means (256 matrices; our
    # per-matrix spread gives 8-9 % at that size, and the paper reports no error), i.e. two
    # significant figures give or take one.
    "number": 0.10,
    # A ratio of two losses measured on the same matrices (ablated / unablated, switched /
    # unswitched): 25 % on the log scale (a factor 1.25 either way). The ratio is the
    # scale-free part of an intervention's effect; a quarter allows for the paper's two
    # sampling errors (~10 % each) and a model of another size, no more.
    "ratio": 0.25,
    # A direction (ours above or below a stated reference): beyond the reference by 10 %
    # of it, so a value sitting on the reference does not count either way.
    "direction": 0.10,
    # A finding of our own: as a direction, for the same reason (0 for a cut-off, CUT).
    "finding": 0.10,
    # An ordering of events (steps): each later item later by 10 % of its step, so two
    # events at about the same checkpoint are not an ordering.
    "ordering": 0.10,
}
# The direction rule's margin when its reference is a cut-off the book defines (a chapter's
# STRONG, ALIGNED, ...): the cut-off is then the claim itself, so no margin is added.
CUT = 0.0
POSITIVE = {"number": "matches", "ratio": "matches", "direction": "same direction", "ordering": "same order",
            "by construction": "cannot fail", "finding": "holds"}
# The verdict of a rule whose interval (our estimate ± two standard errors) reaches both the
# band that counts as agreeing with the paper and the band that counts as differing.
CLOSE = "too close to tell"
VERDICTS = ("matches", "same direction", "same order", "differs", CLOSE, "n/a", "cannot fail", "holds", "fails")
# The kinds of claim that are ours, not the paper's: never counted among the paper's claims.
OWN = ("finding",)


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _se(*errors) -> float:
    """Errors combined in quadrature; missing ones count 0."""
    return math.sqrt(sum(0.0 if _missing(e) else float(e) ** 2 for e in errors))


def _banded(lo: float, hi: float, band_lo: float, band_hi: float, positive: str) -> str:
    """Our interval [lo, hi] against the band that counts as agreeing, [band_lo, band_hi]:
    `positive` when the interval lies inside it, "differs" when it lies outside, `CLOSE`
    when it reaches both."""
    if band_lo <= lo and hi <= band_hi:
        return positive
    if hi < band_lo or lo > band_hi:
        return "differs"
    return CLOSE


def number(paper: float | None, ours: float | None, se: float | None = None, spread: float | None = None,
           margin: float | None = None) -> str:
    """A number, as the paper reports it (on the same task, or a scale-free quantity of
    the profile's task). The band that agrees: within margin·|paper| of the paper's number,
    margin 10 %; our interval: ours ± 2·√(se² + spread²), with se our standard error,
    spread the standard deviation over seeds (a single run of the paper is one draw).
    *matches* when the interval lies inside the band; *differs* when it lies outside it
    (|ours − paper| > 2·√(se² + spread²) + margin·|paper|), or when we have no number
    (e.g. no drop); *too close to tell* when it reaches both; *n/a* when the paper gives none."""
    if _missing(paper):
        return "n/a"
    if _missing(ours):
        return "differs"
    m = MARGINS["number"] if margin is None else margin
    half = 2 * _se(se, spread)
    return _banded(ours - half, ours + half, paper - m * abs(paper), paper + m * abs(paper), "matches")


def ratio(paper: float | None, ours: float | None, se: float | None = None, spread: float | None = None,
          margin: float | None = None) -> str:
    """A ratio of two losses on the same matrices (e.g. ablated over unablated L_mask),
    compared on the log scale. The band that agrees: within a factor 1 + margin of the
    paper's ratio, margin 25 %; our interval: ln(ours) ± 2·√(se² + spread²) / ours.
    *matches* when the interval lies inside the band; *differs* when it lies outside it
    (|ln(ours / paper)| > ln(1 + margin) + 2·√(se² + spread²) / ours), or when ours is
    missing or not positive; *too close to tell* when it reaches both; *n/a* when the paper
    gives none. A claim of "no effect" is a ratio of 1 (or the paper's measured ratio)."""
    if _missing(paper):
        return "n/a"
    if _missing(ours) or ours <= 0 or paper <= 0:
        return "differs"
    m = MARGINS["ratio"] if margin is None else margin
    x, half, band = math.log(ours), 2 * _se(se, spread) / ours, math.log1p(m)
    return _banded(x - half, x + half, math.log(paper) - band, math.log(paper) + band, "matches")


def direction(ours: float | None, reference: float, sense: str, se: float | None = None,
              spread: float | None = None, *, margin: float | None = None, paper: float | None = None) -> str:
    """A direction: the paper says the quantity lies *above* or *below* a stated reference
    (a copying level, a ratio of 1, a threshold the chapter names). The band that agrees:
    beyond the reference on that side by more than margin·|reference|, margin 10 % (0 when
    the reference is a cut-off the book defines as the claim itself, e.g. |r| > 0.8 for
    "tracks"; the row says so); our interval: ours ± 2·√(se² + spread²). *same direction*
    when the interval lies inside the band; *differs* when it lies outside it (on the other
    side, or within the margin), or when we have no number; *too close to tell* when it
    reaches both. The paper's own value, if given, must lie on the claimed side (a check of
    the row, not of our run)."""
    if sense not in ("above", "below"):
        raise ValueError(f"sense must be 'above' or 'below', not {sense!r}")
    s = 1.0 if sense == "above" else -1.0
    if not _missing(paper) and s * (paper - reference) <= 0:
        raise ValueError(f"the paper's value {paper} is not {sense} the reference {reference}")
    m = MARGINS["direction"] if margin is None else margin
    if _beyond(ours, reference, s, se=se, spread=spread, margin=m):
        return "same direction"
    if _missing(ours) or s * (ours - reference) + 2 * _se(se, spread) <= m * abs(reference):
        return "differs"
    return CLOSE


def _beyond(ours, reference: float, s: float, *, se, spread, margin: float) -> bool:
    """Whether ours lies beyond the reference on side s (+1 above, -1 below) by more than
    2·√(se² + spread²) + margin·|reference| (False without a number): the test of the
    direction and finding rules."""
    return not _missing(ours) and s * (ours - reference) > 2 * _se(se, spread) + margin * abs(reference)


def finding(ours: float | None, reference: float, sense: str, se: float | None = None,
            spread: float | None = None, *, margin: float | None = None) -> str:
    """A finding of our own, beyond the paper (chapter 07's lead, the 2025 follow-up's claims
    tested on this task): the quantity lies *above* or *below* a stated reference. *holds*
    when ours lies beyond the reference on that side by more than 2·√(se² + spread²) +
    margin·|reference|, margin 10 % (0 when the reference is a cut-off the row names);
    *fails* otherwise (on the other side, or too close to tell), or when we have no
    number. Shown apart from the paper's claims and never counted among them."""
    if sense not in ("above", "below"):
        raise ValueError(f"sense must be 'above' or 'below', not {sense!r}")
    m = MARGINS["finding"] if margin is None else margin
    return "holds" if _beyond(ours, reference, 1.0 if sense == "above" else -1.0, se=se, spread=spread,
                              margin=m) else "fails"


def ordering(values: dict, order: list, margin: float | None = None, se: float | None = None) -> str:
    """An ordering of events by step (e.g. which re-initialised run drops first): `order`
    lists tiers, earliest first; a missing value (the event did not happen within the
    run) is later than any that did. For each pair, the band that agrees: the later item
    later by more than margin·(its step), margin 10 %; our interval: the gap ± 2·se.
    *same order* when every pair's interval lies inside its band; *differs* when a pair's
    lies outside it (reversed, tied, or the earlier never happened); *too close to tell*
    otherwise (a pair whose interval reaches both)."""
    m = MARGINS["ordering"] if margin is None else margin
    at = {k: math.inf if _missing(v) else float(v) for k, v in values.items()}
    close = False
    for i, early in enumerate(order):
        for late in order[i + 1:]:
            for a in early:
                for b in late:
                    if math.isinf(at[a]):
                        return "differs"
                    gap, need = at[b] - at[a], m * abs(at[b] if math.isfinite(at[b]) else at[a])
                    if gap + 2 * _se(se) <= need:
                        return "differs"
                    close = close or not gap - 2 * _se(se) > need
    return CLOSE if close else "same order"


def by_construction(*_, **__) -> str:
    """A reading that equals another number by construction (e.g. E8 with every layer
    patched: at a masked position the token and the position are the same for X and −X,
    so the patched run's masked states are the source run's and its MSE to X is the
    unpatched L_mask): *cannot fail*, shown for completeness and never counted as
    agreement."""
    return "cannot fail"


RULES = {"number": number, "ratio": ratio, "direction": direction, "ordering": ordering,
         "by construction": by_construction, "finding": finding}

# How a sentence says a verdict: every positive verdict of the paper's kinds agrees with the
# paper; a finding of our own holds or does not, and never names the paper.
AGREEMENT = {"matches": "as in the paper", "same direction": "as in the paper", "same order": "as in the paper",
             "differs": "unlike the paper", CLOSE: "too close to tell",
             "n/a": "not tested here", "cannot fail": "true by construction",
             "holds": "holds here", "fails": "does not hold here"}


def agreement(verdict: str) -> str:
    """The words a chapter's sentence uses for the verdict of the row it speaks for:
    "as in the paper" (matches, same direction, same order), "unlike the paper" (differs),
    "too close to tell" (too close to tell), "not tested here" (n/a),
    "true by construction" (cannot fail); for a finding of our
    own, "holds here" (holds) or "does not hold here" (fails)."""
    if verdict not in AGREEMENT:
        raise ValueError(f"unknown verdict {verdict!r}; one of {', '.join(VERDICTS)}")
    return AGREEMENT[verdict]


def agreements(verdicts: dict[str, str]) -> str:
    """`agreement` for a sentence that speaks for several rows. verdicts: {how the sentence
    names the row (e.g. "under the uniform reading"): its verdict}. One phrase when they
    agree; otherwise each row's phrase with its name, e.g. "as in the paper under the
    uniform reading, unlike the paper under the batch-mean reading"."""
    phrases = {agreement(v) for v in verdicts.values()}
    if len(phrases) == 1:
        return phrases.pop()
    return ", ".join(f"{agreement(v)} {name}" for name, v in verdicts.items())


def verdicts_text(verdicts, noun: str = "row", nouns: str | None = None) -> str:
    """How many of `verdicts` say each `agreement`, every count from the verdicts themselves:
    "all 12 rows unlike the paper", "the one row as in the paper", "of the 12 rows, 3 as in
    the paper, 8 unlike the paper and 1 too close to tell" (phrases in the order of `VERDICTS`)."""
    verdicts = list(verdicts)
    counts: dict[str, int] = {}
    for v in sorted(verdicts, key=lambda v: VERDICTS.index(v) if v in VERDICTS else len(VERDICTS)):
        counts[agreement(v)] = counts.get(agreement(v), 0) + 1
    many = nouns or noun + "s"
    if not verdicts:
        return f"no {many}"
    if len(counts) == 1:
        phrase = next(iter(counts))
        return f"the one {noun} {phrase}" if len(verdicts) == 1 else f"all {len(verdicts):,} {many} {phrase}"
    parts = [f"{k:,} {phrase}" for phrase, k in counts.items()]
    return f"of the {plural(len(verdicts), noun, nouns)}, " + ", ".join(parts[:-1]) + f" and {parts[-1]}"


def contradiction(reading: str, verdict: str) -> str | None:
    """The agreement phrase in `reading` that another verdict would use than `verdict`
    (e.g. "as in the paper" on a row that differs), or None: what `record` refuses."""
    own = agreement(verdict)
    for phrase in sorted(set(AGREEMENT.values()) - {own}):
        if phrase in reading and own not in reading:
            return phrase
    return None


def rules_table():
    """The rules as a table (kind, the positive verdict, margin, rule), from the rule
    functions' docstrings: what the scorecard page shows."""
    import pandas as pd

    def text(f):
        return " ".join(f.__doc__.split())
    return pd.DataFrame([{"kind": k, "positive verdict": POSITIVE[k],
                          "margin": f"{MARGINS[k]:.0%}" if k in MARGINS else "—", "rule": text(f)}
                         for k, f in RULES.items()])


def task_departures(profile) -> list[str]:
    """The data keys where `profile`'s task departs from the paper's (empty: the paper's task)."""
    from ..core.config import deviations
    from ..core.paper import profile as paper_profile

    return [d["key"] for d in deviations(profile, paper_profile()) if d["key"].startswith("data.")]


def task_note(profile) -> str:
    """One sentence for the scorecard page: whether `profile` trains the paper's task, and
    if not, how the model rows compare (scale-free quantities, no rescaling)."""
    from ..core.paper import profile as paper_profile
    from ..core.data import copy_level

    paper = paper_profile()
    keys = task_departures(profile)
    if not keys:
        return "This profile's task is the paper's: every row compares like with like."
    return (f"This profile's task is not the paper's (it differs in {', '.join(keys)}): its copying level E[X²] is "
            f"{copy_level(profile.data.rank):.3f}, the paper's {copy_level(paper.data.rank):.3f}. "
            "Rows that need no model (E17) run on the paper's task; every row that reads the model compares a "
            "scale-free quantity, named in the row (a loss over its own task's E[X²], a ratio of two losses on the "
            "same matrices, a step over another step), and no number is multiplied across tasks.")


# --- a cut run: provisional verdicts ------------------------------------------------------

# The paper's "pre" and "post" (EXPERIMENTS.md §2): the steps its numbers were read at.
PAPER_PRE, PAPER_POST = 4_000, 50_000
# Experiments whose every row reads the run's last model (post), whatever their quantity
# says; other rows read it when their quantity names it (`LATE_WORDS`), e.g. E3's "post ...",
# E6's "pre with post's QKV", E1's "final L", and E1's "fall steps" (the fall ends where L_mask comes
# within a factor of its final level, so a run cut short ends its fall sooner).
LATE_IDS = ("E4", "E5", "E7", "E8", "E10", "E11", "E12", "E13", "E16", "E18")
LATE_WORDS = re.compile(r"\b(post|final|fall)\b")


def reads_late(row: dict) -> bool:
    """Whether `row` reads a model or a level of the run's end (post, final, "after"): a
    row of `LATE_IDS`, a quantity naming post or final, or a BERT row of E17 (BERT's post
    model beside the solvers). Findings of our own read the plateau and the drop, not the end."""
    if is_own(row):
        return False
    return (row["id"] in LATE_IDS or bool(LATE_WORDS.search(row["quantity"]))
            or (row["id"] == "E17" and row["quantity"].startswith("BERT")))


@dataclass(frozen=True)
class Stage:
    """How far the run a chapter reads got, for the rows that read its end (`reads_late`).

    step: the step its last model and final level are read at (the run's end);
    planned: the length it was to train (the profile's train.steps; the paper's 50 000 on its task);
    cut: a deadline, a signal or an unfinished run ended it before `planned` (RunEnd "cut",
         "unfinished"); a run that converged, reached its cap or trained its steps is not cut;
    rel: L_mask / E[X²] over the window ending at `step` (`window_mean`, as `find_drop` reads a loss);
    paper_rel: the paper's post L_mask / E[X²] (its E3 post L_mask, step 50 000);
    slope, slope_se: L_mask's relative change per 1 000 steps over the run's last 2 000 (`end_slope`)."""
    step: int
    planned: int
    cut: bool
    rel: float | None = None
    paper_rel: float | None = None
    slope: float | None = None
    slope_se: float | None = None

    @property
    def note(self) -> str:
        """One line a provisional row carries: the step read, L_mask there and its ratio to the
        paper's at step 50 000, and how fast the run still fell; "" for a run not cut."""
        if not self.cut:
            return ""
        level = "" if _missing(self.rel) else f"; L_mask there {self.rel:.3g}·E[X²]"
        if not _missing(self.rel) and not _missing(self.paper_rel) and self.paper_rel > 0:
            level += f", {self.rel / self.paper_rel:.3g}× the paper's at step {PAPER_POST:,} ({self.paper_rel:.3g}·E[X²])"
        fall = ("" if _missing(self.slope) else
                f"; still changing {self.slope:+.1%} ± {_se(self.slope_se):.1%} per 1,000 steps")
        return f"reads step {self.step:,} of a run cut short of its {self.planned:,}{level}{fall}"

    @property
    def comparisons(self) -> str:
        """What the rows that read the run's end compare, as a clause: the paper's end
        ("the paper's", for a run not cut) or a cut run's provisional reading."""
        if not self.cut:
            return "the comparisons below read the run's end, as the paper reads its own"
        return (f"the comparisons below are provisional: the run was cut at step {self.step:,} of its "
                f"{self.planned:,}, and the paper read its model at step {PAPER_POST:,}")


def is_cut(end) -> bool:
    """Whether a run (its `RunEnd`) was cut short of the length it was to train: a deadline, a
    signal or an unfinished run ("cut", "unfinished") before its train.steps. A run with no
    end.json yet (None: still training, or stopped before it ended) is not known to be cut."""
    return end is not None and end.ended in ("cut", "unfinished") and end.step < end.steps


def stage(end, metrics, rank: int) -> Stage:
    """The `Stage` of a run from its `RunEnd` and metrics (the rows up to its end)."""
    from ..core import paper
    from ..core.data import copy_level
    from ..core.metrics import end_slope, window_mean

    ran = metrics[metrics["step"] <= end.step] if metrics is not None else None
    rel = slope = slope_se = None
    if ran is not None and len(ran):
        rel = float(window_mean(ran, end.step)["L_mask"]) / copy_level(rank)
        slope, slope_se = end_slope(ran, 2000)
    return Stage(step=int(end.step), planned=int(end.steps), cut=is_cut(end),
                 rel=rel, paper_rel=paper.PAPER[("E3", "post L_mask")] / copy_level(paper.task().rank),
                 slope=slope, slope_se=slope_se)


def run_stage(run_dir: str | Path) -> Stage | None:
    """The `Stage` of the run in `run_dir` (its end.json and metrics), or None where it has
    neither (a folder that holds rows but no run)."""
    from ..core.ending import RunEnd
    from ..core.runs import END, METRICS, run_profile

    run_dir = Path(run_dir)
    if not (run_dir / END).is_file():
        return None
    import pandas as pd

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
    """`rows` with the provisional mark set: every row that reads the run's end
    (`reads_late`) and has a verdict to give (not n/a, not cannot fail) carries `Stage.note` while the run
    is cut; the others carry None. The verdict itself stays the rule's."""
    mark = at.note if at is not None and at.cut else ""
    return [{**r, "provisional": (mark or None) if reads_late(r) and r.get("verdict") not in ("n/a", "cannot fail")
             else None} for r in rows]


def is_provisional(row: dict) -> bool:
    return bool(row.get("provisional"))


def shown_verdict(row: dict) -> str:
    """The verdict as a table shows it: "differs, provisional" for a provisional row."""
    return f"{row['verdict']}, provisional" if is_provisional(row) else row["verdict"]


def tally(rows: list[dict]) -> dict[str, int]:
    """Counts of the paper's claims (`paper_rows`): reproduced (`REPRODUCED`), differ,
    too close to tell (`CLOSE`), not tested (n/a, cannot fail) and provisional, each row in
    one of them: a provisional row is counted there, whatever its verdict, and in no other."""
    rows = paper_rows(rows)
    firm = [r for r in rows if not is_provisional(r)]
    return {"rows": len(rows), "reproduced": sum(r["verdict"] in REPRODUCED for r in firm),
            "differ": sum(r["verdict"] == "differs" for r in firm),
            "too close": sum(r["verdict"] == CLOSE for r in firm),
            "not tested": sum(r["verdict"] in ("n/a", "cannot fail") for r in firm),
            "provisional": len(rows) - len(firm)}


def provisional_split(rows: list[dict]) -> dict[str, int]:
    """The provisional rows of the paper's claims (`tally`'s "provisional") by what their verdict
    says so far: agree (`REPRODUCED`), differ, too close to tell (`CLOSE`)."""
    late = [r for r in paper_rows(rows) if is_provisional(r)]
    return {"provisional": len(late), "agree": sum(r["verdict"] in REPRODUCED for r in late),
            "differ": sum(r["verdict"] == "differs" for r in late), "too close": sum(r["verdict"] == CLOSE for r in late)}


def provisional_text(rows: list[dict]) -> str:
    """'37 provisional: 20 agree, 17 differ so far' (', 1 too close to tell' where one is), from
    `provisional_split`; '0 provisional' when none is."""
    p = provisional_split(rows)
    if not p["provisional"]:
        return "0 provisional"
    close = f", {p['too close']} too close to tell" if p["too close"] else ""
    return f"{p['provisional']} provisional: {p['agree']} agree, {p['differ']} differ{close} so far"


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """'1 head', '2 heads' ('1 matrix', '2 matrices' with nouns): a count and its noun, agreeing."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def tally_text(rows: list[dict], what: str) -> str:
    """'Of the 70 claims WHAT, 30 reproduced, 10 differ, 2 are too close to tell, 5 have nothing
    to test and 23 are provisional': `tally` in a sentence."""
    t = tally(rows)
    return (f"Of the {plural(t['rows'], 'claim')} {what}, {t['reproduced']} reproduced, {t['differ']} differ, "
            f"{t['too close']} {'is' if t['too close'] == 1 else 'are'} too close to tell, "
            f"{t['not tested']} have nothing to test here and {t['provisional']} are provisional (they read the end "
            "of a run cut short of its length).")


def load(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / SCORECARD
    return json.loads(path.read_text()) if path.is_file() else []


def _order(row: dict):
    # E2 before E10: sort by the experiment's number, then keep recording order
    m = re.match(r"E(\d+)", row["id"])
    return int(m.group(1)) if m else math.inf


def _write(run_dir: str | Path, rows: list[dict]) -> None:
    # a reader never sees half a file
    write_atomic(Path(run_dir) / SCORECARD, lambda tmp: tmp.write_text(json.dumps(rows, indent=1)))


try:
    import fcntl
except ImportError:  # not on Windows: there the book executes one chapter at a time (`CAN_LOCK`)
    fcntl = None
CAN_LOCK = fcntl is not None
LOCK = ".scorecard.lock"  # beside scorecard.json


@contextlib.contextmanager
def locked(run_dir: str | Path):
    """scorecard.json read and written by one process at a time: two chapters may execute
    side by side (`mclib.book.runner`, the training chapter beside the others), each
    `record` reading the rows, adding its own and writing them back. An exclusive lock on
    a file beside it, held for one read-and-write; nothing where `CAN_LOCK` is false."""
    if fcntl is None or not Path(run_dir).is_dir():  # no folder yet: no rows to keep
        yield
        return
    with open(Path(run_dir) / LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def forget_chapter(run_dir: str | Path, chapter: str) -> None:
    """Drop the rows a chapter recorded: called before the chapter runs again, so that a
    row it no longer records (a renamed quantity, an experiment removed) does not linger."""
    with locked(run_dir):
        rows = load(run_dir)
        if any(r["chapter"] == chapter for r in rows):
            _write(run_dir, [r for r in rows if r["chapter"] != chapter])


def judge(kind: str = "number", paper=None, ours=None, se=None, spread=None, *, margin=None, reference=None,
          sense=None, values=None, order=None, na: str | None = None) -> str:
    """The verdict of one row by its kind's rule (`RULES`); `na` (a reason) makes it
    "n/a" (e.g. an empty group: nothing to test)."""
    if na:
        return "n/a"
    if kind in ("number", "ratio"):
        return RULES[kind](paper, ours, se=se, spread=spread, margin=margin)
    if kind == "direction":
        return direction(ours, reference, sense, se=se, spread=spread, margin=margin, paper=paper)
    if kind == "finding":
        if not _missing(paper):
            raise ValueError(f"a finding of our own has no paper's value, not {paper}")
        return finding(ours, reference, sense, se=se, spread=spread, margin=margin)
    if kind == "ordering":
        return ordering(values, order, margin=margin, se=se)
    if kind == "by construction":
        return by_construction()
    raise ValueError(f"unknown kind of claim {kind!r}; one of {', '.join(RULES)}")


def record(run_dir: str | Path, id: str, quantity: str, paper=None, ours=None, *, reading: str = "",
           kind: str = "number", se=None, spread=None, chapter: str = "", at: Stage | None = None,
           cause: str = "", **rule_kw) -> dict:
    """Add or replace the row (id, quantity); the verdict is computed here by `judge`
    (rule_kw: margin, reference and sense for a direction, values and order for an
    ordering, na for a claim with nothing to test; each but na kept in the row, `RULE_FIELDS`,
    so that it can be judged again), and marked provisional where the row reads the end of a
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
        rows.sort(key=_order)  # stable: rows of one experiment keep their order
        _write(run_dir, rows)
    return row


def row_verdict(row: dict) -> str:
    """The verdict `record` will give `row` (a `claim`), without writing it: what a
    sentence that speaks for the row passes to `agreement`."""
    rule = {k: row[k] for k in ("se", "spread", "margin", "reference", "sense", "values", "order", "na") if k in row}
    return judge(row.get("kind", "number"), paper=row.get("paper"), ours=row.get("ours"), **rule)


def record_rows(run_dir: str | Path, rows: list[dict], chapter: str) -> list[dict]:
    """`record` every row (keyword arguments, as the chapters' modules build them) for
    `chapter`, each marked provisional where it reads the end of the run in `run_dir` and
    that run was cut (`run_stage`); returns the recorded rows, verdicts included."""
    at = run_stage(run_dir)
    return [record(run_dir, **r, chapter=chapter, at=at) for r in rows]


def verdict_counts(verdicts) -> str:
    """'5 matches, 2 differs, ...': how often each verdict occurs in `verdicts` (e.g. the
    verdict column of `recorded_table`'s data), most frequent first."""
    import pandas as pd

    counts = pd.Series(list(verdicts), dtype=object).value_counts()
    return ", ".join(f"{counts.get(v, 0)} {v}" for v in counts.index)


# --- the findings table ------------------------------------------------------------------

def is_own(row: dict) -> bool:
    """Whether `row` is a finding of our own (its kind is in `OWN`), not a claim of the paper."""
    return row.get("kind", "number") in OWN


def paper_rows(rows: list[dict]) -> list[dict]:
    """The rows that test claims of the paper: what every count of reproduced claims reads."""
    return [r for r in rows if not is_own(r)]


def own_rows(rows: list[dict]) -> list[dict]:
    """The findings of our own, beyond the paper (`OWN`): shown apart, never counted with the paper's."""
    return [r for r in rows if is_own(r)]


def causes(rows: list[dict]) -> str:
    """Why the firm rows of `rows` that differ or are too close to tell do so, in one cell: the
    distinct causes the chapters recorded (`record`'s cause), in order, else "not traced" where
    a row differs and none says why, else "—"."""
    open_ = [r for r in rows if r["verdict"] in ("differs", CLOSE) and not is_provisional(r)]
    said = list(dict.fromkeys(r["cause"] for r in open_ if r.get("cause")))
    if said:
        return "; ".join(said)
    return "not traced" if any(r["verdict"] == "differs" for r in open_) else "—"


def findings(rows: list[dict], link: str | None = None):
    """The findings table a reader scans first: one line per experiment of the paper (findings
    of our own left out, `paper_rows`), its counts (rows, reproduced, differs, too close to
    tell, not tested, provisional: `tally`) and why its rows differ (`causes`). With `link`
    (a path prefix, e.g. "" beside the chapters' pages or "_executed/" from the landing page),
    each experiment links to the chapter that recorded its first row."""
    import pandas as pd

    rows = paper_rows(rows)
    out = []
    for e in sorted({r["id"] for r in rows}, key=lambda i: _order({"id": i})):
        rs = [r for r in rows if r["id"] == e]
        t = tally(rs)
        where = next((r.get("chapter") for r in rs if r.get("chapter")), None)
        name = e if link is None or not where else f'<a href="{link}{where}.html">{e}</a>'
        out.append({"experiment": name, "rows": len(rs), "reproduced": t["reproduced"], "differs": t["differ"],
                    "too close to tell": t["too close"], "not tested": t["not tested"],
                    "provisional": t["provisional"], "why it differs": causes(rs)})
    return pd.DataFrame(out, columns=["experiment", "rows", "reproduced", "differs", "too close to tell", "not tested",
                                      "provisional", "why it differs"])


# Experiments whose rows test the classical solvers alone, on the paper's task, with no model:
# the landing page counts them apart from the claims about the model (a row of theirs whose
# quantity starts with "BERT" sets the model against the solver, and counts with the model).
SOLVER_ONLY = ("E17",)
REPRODUCED = ("matches", "same direction", "same order")


def headline(rows: list[dict]) -> dict[str, str]:
    """The landing page's results box, one plain sentence each: the claims about the model
    and those about the solvers alone (`SOLVER_ONLY`) counted apart, then the experiments
    that reproduced in full and those with claims that differ (how many; why is the findings
    table's, `findings`, which the box shows below them); last, our own findings, counted on
    their own (`own_rows`: none of them is among the paper's claims above)."""
    own = own_rows(rows)
    rows = paper_rows(rows)
    def counts(rs, what):
        t = tally(rs)
        late = f" and {t['provisional']} are provisional (read at the end of a run cut short)" if t["provisional"] else ""
        close = (f"{t['too close']} {'is' if t['too close'] == 1 else 'are'} too close to tell"
                 + (" (our value ± two standard errors reaches both what agrees with the paper and what does not)"
                    if t["too close"] else "") + ", ")
        return (f"Of the {plural(len(rs), 'claim')} {what}, {t['reproduced']} reproduced (match the paper's number, or point or "
                f"order the way it says), {t['differ']} differ, {close}{'' if late else 'and '}{t['not tested']} have "
                f"nothing to test here{late}.")

    full, partial = [], []
    for e in sorted({r["id"] for r in rows}, key=lambda i: _order({"id": i})):
        every = [r for r in rows if r["id"] == e]
        rs = [r for r in every if not is_provisional(r)]
        bad = [r for r in rs if r["verdict"] == "differs"]
        good = [r for r in rs if r["verdict"] in REPRODUCED]
        close = [r for r in rs if r["verdict"] == CLOSE]
        if bad:
            partial.append(f"{e} ({plural(len(bad), 'claim')})")
        elif good and not close and len(rs) == len(every):  # a provisional or too-close row leaves it open
            full.append(e)
    solver_only = lambda r: r["id"] in SOLVER_ONLY and not r["quantity"].startswith("BERT")
    model = [r for r in rows if not solver_only(r)]
    solver = [r for r in rows if solver_only(r)]
    return {"landing_model": counts(model, "about the model"),
            "landing_solvers": counts(solver, f"about the classical solvers alone ({', '.join(SOLVER_ONLY)}, on "
                                              "the paper's task, no model)"),
            "landing_reproduced": ("Reproduced in full: " + ", ".join(full) + ".") if full else
                                  "No experiment reproduced in full.",
            "landing_differs": ("With claims that differ: " + ", ".join(partial) + "; the table below gives each "
                                "experiment's counts and why its claims differ.") if partial else
                               "No claim differs; the table below gives each experiment's counts.",
            "landing_own": (f"Beyond the paper, {len(own)} findings tested here (our own, and the 2025 follow-up's "
                            "claims on this task), counted apart from its claims: "
                            f"{sum(r['verdict'] == 'holds' for r in own)} hold, "
                            f"{sum(r['verdict'] == 'fails' for r in own)} do not and "
                            f"{sum(r['verdict'] == 'n/a' for r in own)} have nothing to test here.")}


def setting_counts(rows: list[dict], where: str) -> str:
    """The landing page's line for one edition (`where`: "the laptop edition", "the paper's
    own setting"): its counts of the paper's claims (`tally`) in one sentence, the provisional
    ones split by what they say so far (`provisional_text`)."""
    t = tally(rows)
    return (f"{where[:1].upper()}{where[1:]}: {t['reproduced']} reproduced, {t['differ']} differ, "
            f"{t['too close']} too close to tell, {t['not tested']} n/a (nothing to test, or true by construction), "
            f"{provisional_text(rows)} (read at the end of a run cut short), of {t['rows']} claims.")


def departures_text(profile) -> str:
    """Every key where `profile` departs from the paper's task and recipe, in one sentence
    (`mclib.core.config.deviations`)."""
    from ..core.config import deviations
    from ..core.paper import profile as paper_profile

    fmt = lambda v: f"{v:g}" if isinstance(v, float) else str(v)
    rows = deviations(profile, paper_profile())
    if not rows:
        return f"Profile {profile.name} departs from the paper's task and recipe in nothing."
    return (f"Profile {profile.name} departs from the paper's task and recipe in {len(rows)} keys: "
            + "; ".join(f"{d['key']} {fmt(d['profile'])} (paper: {fmt(d['paper'])})" for d in rows) + ".")


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
    paragraph, with the chosen columns (the verdicts as `record` computed them)."""
    import pandas as pd

    recorded = record_rows(run_dir, rows, chapter)
    shown = pd.DataFrame([{**r, "verdict": shown_verdict(r)} for r in recorded])[list(columns)]
    formats = {"paper": "{:.3g}", "ours": "{:.3g}", "se": "{:.2g}", "spread": "{:.2g}"}
    return (shown.rename(columns={"se": "s.e."}).style.hide(axis="index")
            .format({("s.e." if k == "se" else k): f for k, f in formats.items() if k in columns}, na_rep="—")
            .set_caption(caption))
