"""The re-judging of the rows a GPU lease recorded, from their recorded values alone (no model is
read): what a chapter's rule may read besides a row (`Recorded`), what each kind of claim needs
(`NEEDS`), and `judge_rows`, which applies the chapters' declared rules, today's verdict rules and
the provisional marks, and says why each row changed. `mclib.lease.reference.rejudge` gathers what
the results hold and hands it here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..book import scorecard, scorecard_rules, scorecard_stage
from ..book.spec import Specs

REJUDGED = "re-judged on the CPU by today's rules"


@dataclass
class Recorded:
    """What a chapter's declared `rejudged(row, recorded)` may read besides the row: the book
    run's stage (`reference.book_stage`), analysis checkpoints (`reference._book_steps`; None where
    they cannot be placed), the text a lease's chapter glued (`glued(chapter, name)`, or None), the
    laptop edition's rows (or None) and the rows of the book run's training curve (`curve()`:
    `reference.training_rows`)."""

    at: scorecard_stage.Stage | None
    steps: object | None
    glued: Callable[[str, str], str | None]
    laptop: list[dict] | None = None
    curve: Callable[[], list[dict]] = list
    rounding: dict = field(
        default_factory=dict
    )  # quantity -> `mclib.analyses.rounding.Spread` at this setting


# What each kind of claim's rule needs besides the numbers (`scorecard_rules.judge`).
NEEDS = {
    "direction": ("reference", "sense"),
    "finding": ("reference", "sense"),
    "ordering": ("values", "order"),
}


NA = "n/a: "  # how a row's reading gives the reason it has nothing to test (`scorecard.record`)


def _lacks(row: dict) -> list[str]:
    return [k for k in NEEDS.get(row.get("kind", "number"), ()) if row.get(k) is None]


def judge_rows(
    found: list[dict], recorded: Recorded, at: scorecard_stage.Stage | None, *, specs: Specs
) -> list[dict]:
    """`found` judged again: each chapter's `rejudged(row, recorded)` (of `specs`), then the fields a
    rule needs recovered by the chapters' `rule_of(row)`, n/a with the reason where one is still
    missing, the row's kind's rule (`scorecard_rules.judge`), and the provisional rows of a run cut
    short at `at` (`scorecard_stage.provisional`). A changed row keeps the lease's verdict in `was`,
    why in `rejudged`."""
    rules = [s.rejudged for s in specs.values() if s.rejudged is not None]
    recover = [s.rule_of for s in specs.values() if s.rule_of is not None]
    out, whys = [], []
    for r in found:
        new, why = dict(r), []
        if r.get("verdict") == "n/a" and not r.get("na") and NA in r.get("reading", ""):
            new["na"] = r["reading"].rsplit(NA, 1)[
                1
            ]  # `scorecard.record` keeps an n/a's reason in the reading alone
        for rule in rules:
            new, reasons = rule(new, recorded)
            why += reasons
        for rule_of in recover:
            for k, v in rule_of(new).items():
                if new.get(k) is None:
                    new[k] = v
        if not new.get("na") and (lacks := _lacks(new)):
            new["na"] = (
                f"the lease recorded no {' or '.join(lacks)} for this {new.get('kind')} row and no "
                "chapter declares one"
            )
        rule = {k: new[k] for k in ("se", "spread", *scorecard.RULE_FIELDS, "na") if k in new}
        new["verdict"] = (
            "n/a"
            if new.get("na")
            else scorecard_rules.judge(
                new.get("kind", "number"), paper=new.get("paper"), ours=new.get("ours"), **rule
            )
        )
        if new.get("na") and f"{NA}{new['na']}" not in new.get("reading", ""):
            new["reading"] = f"{new.get('reading', '')}; {NA}{new['na']}".lstrip("; ")
        out.append(new)
        whys.append(why)
    out = scorecard_stage.provisional(out, at)
    for r, new, why in zip(found, out, whys):
        if new["verdict"] != r["verdict"]:
            why.insert(0, f"{r['verdict']} → {new['verdict']}{_changed_why(new)}")
        if new.get("provisional") and not r.get("provisional"):
            why.append(f"provisional: {new['provisional']}")
        if why:
            new["was"], new["rejudged"] = r["verdict"], "; ".join(why)
    return out


def _changed_why(new: dict) -> str:
    """Why a re-judged row's verdict changed, in brackets after "was → now"."""
    kind = new.get("kind", "number")
    if new.get("na"):
        return f" ({new['na']})"
    if new["verdict"] == scorecard_rules.CLOSE and _within_rounding(new):
        return f" (the paper's value lies within the rounding spread of ours, {new['rounding']:,.4g})"
    if new["verdict"] == scorecard_rules.CLOSE:
        return (
            f" (today's {kind} rule: our value ± two standard errors reaches both what "
            "agrees with the paper and what does not)"
        )
    return f" (today's {kind} rule)"


def _within_rounding(row: dict) -> bool:
    ours, paper = row.get("ours"), row.get("paper")
    return None not in (ours, paper) and scorecard_rules.within_rounding(
        row.get("kind") == "ratio", ours, paper, row.get("rounding")
    )
