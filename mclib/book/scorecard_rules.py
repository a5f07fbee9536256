"""The scorecard's rules: one function per kind of claim (`RULES`), which gives a row its
verdict (`judge`, `row_verdict`) from our number, its standard errors and the paper's, with
the margins they allow (`MARGINS`); the words a sentence says each verdict with (`agreement`);
and the copying levels the model's rows divide by (`copy_levels`)."""

from __future__ import annotations

import math

import pandas as pd

from ..analyses.margins import (
    MARGINS,
)  # the rules' margins, defined once there: E15's early stop reads them too
from ..core import paper
from ..core.data import copy_level

RANDOM_LEVEL = 1 / 3  # E[X²] of E2's "random" matrices (iid Unif[-1, 1] entries), whatever the rank


def copy_levels(rank: int) -> dict[str, tuple[float, float]]:
    """Kind of matrix -> (our E[X²], the paper's): low-rank rank/9; E2's random matrices 1/3 on both tasks."""

    return {
        "low-rank": (copy_level(rank), copy_level(paper.task().rank)),
        "random": (RANDOM_LEVEL, RANDOM_LEVEL),
    }


# The direction rule's margin when its reference is a cut-off the book defines (a chapter's
# STRONG, ALIGNED, ...): the cut-off is then the claim itself, so no margin is added.
CUT = 0.0
POSITIVE = {
    "number": "matches",
    "ratio": "matches",
    "direction": "same direction",
    "ordering": "same order",
    "by construction": "cannot fail",
    "finding": "holds",
}
# The verdict of a rule whose interval (our estimate ± two standard errors) reaches both the
# band that counts as agreeing with the paper and the band that counts as differing.
CLOSE = "too close to tell"
VERDICTS = (
    "matches",
    "same direction",
    "same order",
    "differs",
    CLOSE,
    "n/a",
    "cannot fail",
    "holds",
    "fails",
)
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


def _reach(log: bool, ours: float, se=None, spread=None, *, span=None, rounding=None) -> tuple[float, float]:
    """Our interval on a rule's scale (log: a ratio's): ours ± 2·√(se² + spread²); with span (the
    lowest and highest of several readings) from the lowest − 2·se to the highest + 2·se; widened
    on each side by rounding (`mclib.analyses.rounding`). On the log scale an error e at x is e / x,
    a rounding r at ours ln(1 + r / ours)."""
    lo = hi = ours
    half_lo = half_hi = 2 * _se(se, spread)
    if span is not None and not any(_missing(v) for v in span) and (min(span) > 0 or not log):
        lo, hi = float(min(span)), float(max(span))
        half_lo = half_hi = 2 * _se(se)
    r = 0.0 if _missing(rounding) else abs(float(rounding))
    if log:
        r = math.log1p(r / ours) if r else 0.0
        return math.log(lo) - half_lo / lo - r, math.log(hi) + half_hi / hi + r
    return lo - half_lo - r, hi + half_hi + r


def within_rounding(log: bool, ours: float, paper: float, rounding) -> bool:
    """Whether the paper's value lies within the rounding spread of ours (on the rule's scale)."""
    if _missing(rounding) or not rounding:
        return False
    if log:
        return abs(math.log(ours / paper)) <= math.log1p(abs(float(rounding)) / ours)
    return abs(ours - paper) <= abs(float(rounding))


def interval(row: dict) -> tuple[float, float] | None:
    """The interval of ours that a number or ratio row's rule sets against its band (`_reach`), on
    the quantity's own scale; None for other kinds, or where a ratio has no positive value."""
    kind, ours = row.get("kind", "number"), row.get("ours")
    if kind not in ("number", "ratio") or _missing(ours) or (kind == "ratio" and ours <= 0):
        return None
    lo, hi = _reach(
        kind == "ratio",
        ours,
        row.get("se"),
        row.get("spread"),
        span=row.get("span"),
        rounding=row.get("rounding"),
    )
    return (math.exp(lo), math.exp(hi)) if kind == "ratio" else (lo, hi)


def number(
    paper: float | None,
    ours: float | None,
    se: float | None = None,
    spread: float | None = None,
    *,
    margin: float | None = None,
    span=None,
    rounding: float | None = None,
) -> str:
    """A number, as the paper reports it (on the same task, or a scale-free quantity of
    the profile's task). The band that agrees: within margin·|paper| of the paper's number,
    margin 10 %; our interval: ours ± 2·√(se² + spread²), with se our standard error,
    spread the standard deviation over seeds (a single run of the paper is one draw); with
    span (the lowest and highest of several readings of the quantity, e.g. checkpoints along
    a plateau), from the lowest − 2·se to the highest + 2·se instead, so that it reaches no
    further than the readings themselves (`_reach`).
    *matches* when the interval lies inside the band; *differs* when it lies outside it,
    or when we have no number (e.g. no drop); *too close to tell* when it reaches both;
    *n/a* when the paper gives none. rounding: how far changes that alter only the float
    arithmetic moved this quantity in one run: the paper's number within it of ours is *too
    close to tell*, and it widens our interval besides."""
    if _missing(paper):
        return "n/a"
    if _missing(ours):
        return "differs"
    m = MARGINS["number"] if margin is None else margin
    if within_rounding(False, ours, paper, rounding):
        return CLOSE
    lo, hi = _reach(False, ours, se, spread, span=span, rounding=rounding)
    return _banded(lo, hi, paper - m * abs(paper), paper + m * abs(paper), "matches")


def ratio(
    paper: float | None,
    ours: float | None,
    se: float | None = None,
    spread: float | None = None,
    *,
    margin: float | None = None,
    span=None,
    rounding: float | None = None,
) -> str:
    """A ratio of two losses on the same matrices (e.g. ablated over unablated L_mask),
    compared on the log scale. The band that agrees: within a factor 1 + margin of the
    paper's ratio, margin 25 %; our interval: ln(ours) ± 2·√(se² + spread²) / ours; with
    span (the lowest and highest of several readings, e.g. checkpoints along a plateau),
    from ln(lowest) − 2·se / lowest to ln(highest) + 2·se / highest instead, so that it
    reaches no further than the readings themselves.
    *matches* when the interval lies inside the band; *differs* when it lies outside it,
    or when ours is missing or not positive; *too close to tell* when it reaches both;
    *n/a* when the paper gives none. A claim of "no effect" is a ratio of 1 (or the paper's
    measured ratio). rounding: as for a number, in the ratio's units (ln(1 + rounding / ours)
    on the log scale)."""
    if _missing(paper):
        return "n/a"
    if _missing(ours) or ours <= 0 or paper <= 0:
        return "differs"
    m = MARGINS["ratio"] if margin is None else margin
    if within_rounding(True, ours, paper, rounding):
        return CLOSE
    band = math.log1p(m)
    lo, hi = _reach(True, ours, se, spread, span=span, rounding=rounding)
    return _banded(lo, hi, math.log(paper) - band, math.log(paper) + band, "matches")


def band_text(kind: str = "number", margin: float | None = None) -> str:
    """The number or ratio rule in one clause, for a row's `margin` (default the kind's, `MARGINS`)."""
    m = MARGINS[kind] if margin is None else margin
    band = {
        "number": f"the paper's value ± {m:.0%} of it",
        "ratio": f"within a factor {1 + m:g} of the paper's value, either way",
    }[kind]
    return (
        f'"{POSITIVE[kind]}" where our value ± two standard errors lies inside {band}, "differs" where it '
        f'lies wholly outside that band, and "{CLOSE}" where it reaches both'
    )


def direction(
    ours: float | None,
    reference: float,
    sense: str,
    se: float | None = None,
    spread: float | None = None,
    *,
    margin: float | None = None,
    paper: float | None = None,
) -> str:
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
    """Whether ours (missing: False) lies beyond reference on side s (±1) by
    > 2·√(se² + spread²) + margin·|reference|."""
    return not _missing(ours) and s * (ours - reference) > 2 * _se(se, spread) + margin * abs(reference)


def finding(
    ours: float | None,
    reference: float,
    sense: str,
    se: float | None = None,
    spread: float | None = None,
    *,
    margin: float | None = None,
) -> str:
    """A finding of our own, beyond the paper (chapter 07's lead, the 2025 follow-up's claims
    tested on this task): the quantity lies *above* or *below* a stated reference. The band
    where it holds: beyond the reference on that side by more than margin·|reference|, margin
    10 % (0 when the reference is a cut-off the row names); our interval: ours ±
    2·√(se² + spread²). *holds* when the interval lies inside the band; *fails* when it lies
    outside it (on the other side, or within the margin), or when we have no number; *too
    close to tell* when it reaches both. Shown apart from the paper's claims and never
    counted among them."""
    if sense not in ("above", "below"):
        raise ValueError(f"sense must be 'above' or 'below', not {sense!r}")
    s = 1.0 if sense == "above" else -1.0
    m = MARGINS["finding"] if margin is None else margin
    if _beyond(ours, reference, s, se=se, spread=spread, margin=m):
        return "holds"
    if _missing(ours) or s * (ours - reference) + 2 * _se(se, spread) <= m * abs(reference):
        return "fails"
    return CLOSE


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
        for late in order[i + 1 :]:
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


RULES = {
    "number": number,
    "ratio": ratio,
    "direction": direction,
    "ordering": ordering,
    "by construction": by_construction,
    "finding": finding,
}


def judge(
    kind: str = "number",
    paper=None,
    ours=None,
    se=None,
    spread=None,
    *,
    margin=None,
    reference=None,
    sense=None,
    values=None,
    order=None,
    span=None,
    rounding=None,
    na: str | None = None,
) -> str:
    """The verdict of one row by its kind's rule (`RULES`); "n/a" where `na` (a reason) is given."""
    if na:
        return "n/a"
    if kind in ("number", "ratio"):
        return RULES[kind](paper, ours, se=se, spread=spread, margin=margin, span=span, rounding=rounding)
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


def row_verdict(row: dict) -> str:
    """The verdict `record` would give `row` (a `claim`), without writing it."""
    rule = {
        k: row[k]
        for k in ("se", "spread", "margin", "reference", "sense", "values", "order", "span", "rounding", "na")
        if k in row
    }
    return judge(row.get("kind", "number"), paper=row.get("paper"), ours=row.get("ours"), **rule)


def is_own(row: dict) -> bool:
    """Whether `row` is a finding of our own (its kind is in `OWN`), not a claim of the paper."""
    return row.get("kind", "number") in OWN


# How a sentence says a verdict: every positive verdict of the paper's kinds agrees with the
# paper; a finding of our own holds or does not, and never names the paper.
AGREEMENT = {
    "matches": "as in the paper",
    "same direction": "as in the paper",
    "same order": "as in the paper",
    "differs": "unlike the paper",
    CLOSE: "too close to tell",
    "n/a": "not tested here",
    "cannot fail": "true by construction",
    "holds": "holds here",
    "fails": "does not hold here",
}


def agreement(verdict: str) -> str:
    """The words a sentence uses for `verdict` (`AGREEMENT`); ValueError for an unknown verdict."""
    if verdict not in AGREEMENT:
        raise ValueError(f"unknown verdict {verdict!r}; one of {', '.join(VERDICTS)}")
    return AGREEMENT[verdict]


def agreements(verdicts: dict[str, str]) -> str:
    """`agreement` for several rows ({name in the sentence: verdict}): one phrase where they
    agree, else each phrase with its name ("as in the paper under X, unlike the paper under Y")."""
    phrases = {agreement(v) for v in verdicts.values()}
    if len(phrases) == 1:
        return phrases.pop()
    return ", ".join(f"{agreement(v)} {name}" for name, v in verdicts.items())


def contradiction(reading: str, verdict: str) -> str | None:
    """The agreement phrase in `reading` that belongs to another verdict than `verdict`, or None."""
    own = agreement(verdict)
    for phrase in sorted(set(AGREEMENT.values()) - {own}):
        if phrase in reading and own not in reading:
            return phrase
    return None


def rules_table():
    """The rules as the scorecard page shows them: kind, positive verdict, margin, and the rule
    function's docstring."""

    def text(f):
        return " ".join(f.__doc__.split())

    return pd.DataFrame(
        [
            {
                "kind": k,
                "positive verdict": POSITIVE[k],
                "margin": f"{MARGINS[k]:.0%}" if k in MARGINS else "—",
                "rule": text(f),
            }
            for k, f in RULES.items()
        ]
    )
