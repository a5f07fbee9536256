"""What the scorecard says in tables and sentences: the counts of the paper's claims (`tally`)
and their sentences, the findings table (`findings`) and the landing page's box (`headline`),
the verdicts of a sentence that speaks for several rows (`verdicts_text`), and how the profile's
task departs from the paper's (`task_note`, `departures_text`)."""

from __future__ import annotations

import math
import re

import pandas as pd

from ..core.data import copy_level
from ..core.paper import profile as paper_profile
from ..core.recipe import deviations
from .scorecard_rules import CLOSE, VERDICTS, agreement, is_own
from .scorecard_stage import is_provisional


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """'1 head', '2 heads'; `nouns`: an irregular plural, or a verb's ('1 differs', '2 differ')."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def percent(x: float, digits: int = 1) -> str:
    """x as a percentage ('1.3%'); a non-zero x that would show as 0.0% is "less than 0.05%"."""
    shown = f"{x:.{digits}%}"
    if x and float(shown.rstrip("%")) == 0:
        return f"less than {0.5 * 10**-digits:g}%"
    return shown


def counts_clause(t: dict[str, int]) -> str:
    """'41 reproduced, 23 differ, 1 is too close to tell and 12 have nothing to test here' (and
    how many are provisional, where any is) from `tally`'s counts, each verb agreeing with its count."""
    parts = [
        f"{t['reproduced']:,} reproduced",
        plural(t["differ"], "differs", "differ"),
        plural(t["too close"], "is too close to tell", "are too close to tell"),
        plural(t["not tested"], "has nothing to test here", "have nothing to test here"),
    ]
    if t["provisional"]:
        parts.append(
            plural(t["provisional"], "is provisional", "are provisional") + " (read at the end of a run cut "
            "short)"
        )
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def verdicts_text(verdicts, noun: str = "row", nouns: str | None = None) -> str:
    """How many of `verdicts` say each `agreement`, in `VERDICTS` order: "all 12 rows unlike the
    paper", "the one row as in the paper", "of the 12 rows, 3 as in the paper and 9 unlike the paper"."""
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


def verdict_counts(verdicts) -> str:
    """'5 matches, 2 differs': how often each verdict occurs, most frequent first."""

    counts = pd.Series(list(verdicts), dtype=object).value_counts()
    return ", ".join(f"{counts.get(v, 0)} {v}" for v in counts.index)


# --- counts of the paper's claims --------------------------------------------------------


def paper_rows(rows: list[dict]) -> list[dict]:
    """The rows that test claims of the paper: what every count of reproduced claims reads."""
    return [r for r in rows if not is_own(r)]


def own_rows(rows: list[dict]) -> list[dict]:
    """The findings of our own, beyond the paper (`OWN`): shown apart, never counted with the paper's."""
    return [r for r in rows if is_own(r)]


REPRODUCED = ("matches", "same direction", "same order")


def tally(rows: list[dict]) -> dict[str, int]:
    """Counts of the paper's claims (`paper_rows`): reproduced, differ, too close, not tested,
    provisional; a provisional row counts there alone, whatever its verdict."""
    rows = paper_rows(rows)
    firm = [r for r in rows if not is_provisional(r)]
    return {
        "rows": len(rows),
        "reproduced": sum(r["verdict"] in REPRODUCED for r in firm),
        "differ": sum(r["verdict"] == "differs" for r in firm),
        "too close": sum(r["verdict"] == CLOSE for r in firm),
        "not tested": sum(r["verdict"] in ("n/a", "cannot fail") for r in firm),
        "provisional": len(rows) - len(firm),
    }


def provisional_split(rows: list[dict]) -> dict[str, int]:
    """The paper's provisional rows by their verdict so far: agree, differ, too close to tell."""
    late = [r for r in paper_rows(rows) if is_provisional(r)]
    return {
        "provisional": len(late),
        "agree": sum(r["verdict"] in REPRODUCED for r in late),
        "differ": sum(r["verdict"] == "differs" for r in late),
        "too close": sum(r["verdict"] == CLOSE for r in late),
    }


def provisional_text(rows: list[dict]) -> str:
    """'37 provisional: 20 agree, 17 differ so far' (`provisional_split`); '0 provisional' where none is."""
    p = provisional_split(rows)
    if not p["provisional"]:
        return "0 provisional"
    close = f", {p['too close']} too close to tell" if p["too close"] else ""
    return (
        f"{p['provisional']} provisional: {plural(p['agree'], 'agrees', 'agree')}, "
        f"{plural(p['differ'], 'differs', 'differ')}{close} so far"
    )


def tally_text(rows: list[dict], what: str) -> str:
    """'Of the 70 claims WHAT, 30 reproduced, ...': `tally` in a sentence (`counts_clause`)."""
    t = tally(rows)
    return f"Of the {plural(t['rows'], 'claim')} {what}, {counts_clause(t)}."


# --- the findings table ------------------------------------------------------------------


def row_order(row: dict) -> tuple:
    """Sort key of a row: experiment number (findings of our own last), then chapter; so the
    order does not depend on which chapter finished first."""
    m = re.match(r"E(\d+)", row["id"])
    return (int(m.group(1)) if m else math.inf, row.get("chapter") or "")


NUMBER = re.compile(r"\d[\d,.]*")  # a number in a cause's text (`causes`: causes alike but for their numbers)


def causes(rows: list[dict]) -> str:
    """Why the firm rows that differ or are too close to tell do so: the distinct recorded causes
    (those alike but for their numbers said once, with a count), else "not traced" where a row
    differs, else "—"."""
    open_ = [r for r in rows if r["verdict"] in ("differs", CLOSE) and not is_provisional(r)]
    alike: dict[str, list[str]] = {}
    for cause in dict.fromkeys(r["cause"] for r in open_ if r.get("cause")):
        alike.setdefault(NUMBER.sub("#", cause), []).append(cause)
    if alike:
        return "; ".join(
            said[0]
            if len(said) == 1
            else f"{said[0]} (and {plural(len(said) - 1, 'more row')} alike, each with its own numbers in "
            "the scorecard)"
            for said in alike.values()
        )
    return "not traced" if any(r["verdict"] == "differs" for r in open_) else "—"


def home(rows: list[dict]) -> str | None:
    """The chapter an experiment's rows link to: the one with most firm rows that differ, else most
    too close to tell, else the first by name; None without a chapter."""
    named = [r for r in rows if r.get("chapter")]
    for verdict in ("differs", CLOSE):
        at = [r["chapter"] for r in named if r["verdict"] == verdict and not is_provisional(r)]
        if at:
            return min(set(at), key=lambda c: (-at.count(c), c))
    return min((r["chapter"] for r in named), default=None)


def findings(rows: list[dict], link: str | None = None):
    """One line per experiment of the paper: its `tally` counts and `causes`; with `link` (a path
    prefix, e.g. "_executed/"), each experiment links to its `home` chapter."""

    rows = paper_rows(rows)
    out = []
    for e in sorted({r["id"] for r in rows}, key=lambda i: row_order({"id": i})):
        rs = [r for r in rows if r["id"] == e]
        t = tally(rs)
        where = home(rs)
        name = e if link is None or not where else f'<a href="{link}{where}.html">{e}</a>'
        out.append(
            {
                "experiment": name,
                "rows": len(rs),
                "reproduced": t["reproduced"],
                "differs": t["differ"],
                "too close to tell": t["too close"],
                "not tested": t["not tested"],
                "provisional": t["provisional"],
                "why it differs": causes(rs),
            }
        )
    return pd.DataFrame(
        out,
        columns=[
            "experiment",
            "rows",
            "reproduced",
            "differs",
            "too close to tell",
            "not tested",
            "provisional",
            "why it differs",
        ],
    )


# Experiments whose rows test the classical solvers alone, on the paper's task, with no model:
# the landing page counts them apart from the claims about the model (a row of theirs whose
# quantity starts with "BERT" sets the model against the solver, and counts with the model).
SOLVER_ONLY = ("E17",)


def headline(rows: list[dict]) -> dict[str, str]:
    """The landing page's results box: claims about the model and about the solvers alone
    (`SOLVER_ONLY`) counted apart, the experiments reproduced in full, those with claims that
    differ, and our own findings, counted on their own."""
    own = own_rows(rows)
    rows = paper_rows(rows)
    counts = lambda rs, what: f"Of the {plural(len(rs), 'claim')} {what}, {counts_clause(tally(rs))}."
    full, partial = [], []
    for e in sorted({r["id"] for r in rows}, key=lambda i: row_order({"id": i})):
        every = [r for r in rows if r["id"] == e]
        rs = [r for r in every if not is_provisional(r)]
        bad = [r for r in rs if r["verdict"] == "differs"]
        good = [r for r in rs if r["verdict"] in REPRODUCED]
        close = [r for r in rs if r["verdict"] == CLOSE]
        if bad:
            partial.append(f"{e} ({len(bad)})")
        elif good and not close and len(rs) == len(every):  # a provisional or too-close row leaves it open
            full.append(e)
    solver_only = lambda r: r["id"] in SOLVER_ONLY and not r["quantity"].startswith("BERT")
    model = [r for r in rows if not solver_only(r)]
    solver = [r for r in rows if solver_only(r)]
    n = lambda verdict: sum(r["verdict"] == verdict for r in own)
    return {
        "landing_model": counts(model, "about the model"),
        "landing_solvers": counts(solver, f"about the classical solvers alone ({', '.join(SOLVER_ONLY)})"),
        "landing_reproduced": ("Reproduced in full: " + ", ".join(full) + ".")
        if full
        else "No experiment reproduced in full.",
        "landing_differs": (
            "With claims that differ (how many): " + ", ".join(partial) + "; the table below says why."
        )
        if partial
        else "No claim differs.",
        "landing_own": (
            f"Beyond the paper, {plural(len(own), 'finding')} of our own and of the 2025 follow-up, "
            f"counted apart: {plural(n('holds'), 'holds', 'hold')}, "
            f"{plural(n('fails'), 'does not', 'do not')}, "
            f"{plural(n(CLOSE), 'is too close to tell', 'are too close to tell')} and "
            f"{plural(n('n/a'), 'has nothing to test here', 'have nothing to test here')}."
        ),
    }


def setting_counts(rows: list[dict], where: str) -> str:
    """The landing page's line for one edition (`where`): its `tally` in one sentence."""
    t = tally(rows)
    return (
        f"{where[:1].upper()}{where[1:]}: {t['reproduced']:,} reproduced, "
        f"{plural(t['differ'], 'differs', 'differ')}, "
        f"{t['too close']:,} too close to tell, {t['not tested']:,} n/a (nothing to test, or true by "
        "construction), "
        f"{provisional_text(rows)} (read at the end of a run cut short), of {plural(t['rows'], 'claim')}."
    )


# --- the profile's task ----------------------------------------------------------------


def task_departures(profile) -> list[str]:
    """The data keys where `profile`'s task departs from the paper's (empty: the paper's task)."""

    return [d["key"] for d in deviations(profile, paper_profile()) if d["key"].startswith("data.")]


def task_note(profile) -> str:
    """One sentence: whether `profile` trains the paper's task, and if not, how its rows compare."""

    paper = paper_profile()
    keys = task_departures(profile)
    if not keys:
        return "This profile's task is the paper's: every row compares like with like."
    return (
        f"This profile's task is not the paper's (it differs in {', '.join(keys)}): its copying level "
        "E[X²] is "
        f"{copy_level(profile.data.rank):.3f}, the paper's {copy_level(paper.data.rank):.3f}. "
        "Rows that need no model (E17) run on the paper's task; every row that reads the model compares a "
        "scale-free quantity, named in the row (a loss over its own task's E[X²], a ratio of two losses on "
        "the "
        "same matrices, a step over another step), and no number is multiplied across tasks."
    )


def departures_count(profile) -> str:
    """How many keys `profile` departs from the paper's task and recipe in, in one sentence."""

    n = len(deviations(profile, paper_profile()))
    if not n:
        return f"Profile {profile.name} departs from the paper's task and recipe in nothing."
    return (
        f"Profile {profile.name} departs from the paper's task and recipe in {plural(n, 'key')} "
        "(see the first chapter)."
    )


def departures_text(profile) -> str:
    """Every key where `profile` departs from the paper's task and recipe, in one sentence."""

    fmt = lambda v: f"{v:g}" if isinstance(v, float) else str(v)
    rows = deviations(profile, paper_profile())
    if not rows:
        return f"Profile {profile.name} departs from the paper's task and recipe in nothing."
    return (
        f"Profile {profile.name} departs from the paper's task and recipe in {len(rows)} keys: "
        + "; ".join(f"{d['key']} {fmt(d['profile'])} (paper: {fmt(d['paper'])})" for d in rows)
        + "."
    )
