"""Part of chapter 02_copying: the sentences it writes. How E2's rows read beside the paper's
(and why the checkpoints around the pre step swing), and the "What we found" sentences on
copying, the pre-shift L_obs, E2's token in place of MASK, E3's ablation and E6's switched
attention weights, each built from the chapter's tables and row verdicts.
"""

from __future__ import annotations

import pandas as pd

from ..analyses.loss_tables import lookup
from ..book.scorecard_rules import CLOSE, MARGINS, agreement, row_verdict
from ..book.scorecard_stage import PAPER_PRE
from ..book.scorecard_tables import percent, verdicts_text
from ..core.metrics import COPIES, DROP_FRACTION, copies
from ..core.paper import PAPER

NO_EFFECT = 0.05  # E3: ablating every head changes L_mask by less than 5 %: attention plays no part


def e2_swing(steps: str, low: float, high: float) -> str:
    """ "the checkpoints of steps 2,000-5,000 run from 0.9 to 9.5× the paper's" (low, high: over the
    paper's)."""
    return f"the checkpoints of steps {steps} run from {low:.2g} to {high:.2g}× the paper's"


def e2_cause(verdict: str, steps: str, low: float, high: float) -> str:
    """Why an E2 row read over the plateau's checkpoints is close or differs: its checkpoints' range
    (low, high: over the paper's) beside the band of the paper's value."""
    swing = e2_swing(steps, low, high)
    band = f"within a factor {1 + MARGINS['ratio']:g} of it"
    if verdict == CLOSE:
        return (
            f"copying on the plateau swings from one saved step to the next ({swing}): that range reaches "
            "both "
            f"{band} and beyond it, so one checkpoint of the paper's cannot be placed"
        )
    return f"every checkpoint on the plateau lies beyond {band} ({swing}); not traced further"


def e2_ratio_text(rows: list[dict]) -> str:
    """The sentence on E2's rows against the paper's numbers (ratio rule): their range of ours over
    the paper's and how many say each verdict."""
    if rows and rows[0].get("na"):
        return f"E2 has nothing to compare here ({rows[0]['na']})"
    ratios = [r["ours"] / r["paper"] for r in rows]
    several = any(r.get("span") is not None for r in rows)
    ours = (
        "the lowest to the highest reading of the plateau's checkpoints around the pre step, each ± two "
        "standard "
        "errors, since one checkpoint's copying swings by several times from one saved step to the next"
        if several
        else "our value ± two standard errors"
    )
    return (
        f"Set against the paper's numbers themselves (ratio rule: within a factor {1 + MARGINS['ratio']:g}, "
        f"{ours}), "
        f"ours run from {min(ratios):.2g} to {max(ratios):.2g} times the paper's: "
        + verdicts_text(row_verdict(r) for r in rows)
    )


def copy_text(base: dict, level: float) -> str:
    """Whether the pre model copies (`mclib.core.metrics.copies`), and if not, why not."""
    if copies(base["L_obs"], base["L_mask"], level):
        return "copies: the observed entries come back almost exactly and the masked ones stay near 0"
    return (
        "does not behave like a copying model: "
        + ("L_obs is not small" if base["L_obs"] >= COPIES * level else "L_mask is far from E[X²]")
        + ", so the checks below test a model that is not on the plateau the paper describes"
    )


def pre_l_obs_text(curve: float, fresh: float, paper: float, *, step: int, window: int) -> str:
    """The sentence placing the paper's pre-shift L_obs (E3, one checkpoint on fresh matrices) between
    this chapter's `fresh` reading at `step` and E1's `curve` (the mean of the `window` training
    batches ending there), each over E[X²], and which lie below COPIES."""
    side = "below" if curve < fresh else "above"
    both = (
        "both lie below"
        if max(curve, fresh) < COPIES
        else "only the curve's lies below"
        if curve < COPIES
        else "only this chapter's lies below"
        if fresh < COPIES
        else "neither lies below"
    )
    return (
        f"The paper's pre-shift L_obs, {paper:.2g}·E[X²] (its E3, at step {PAPER_PRE:,}), is one "
        "checkpoint's "
        f"reading on fresh matrices, the kind this chapter makes ({fresh:.2g}·E[X²] at step {step:,}); the "
        f"training chapter's E1 row sets it beside the training curve instead, {curve:.2g}·E[X²] at the same "
        "step, "
        f"{max(curve, fresh) / min(curve, fresh):.2g}× {side} this chapter's, because the curve is the mean "
        "over "
        f"the {window} training batches ending there, each scored by the model of its own step as it "
        "trained, "
        f"while one checkpoint on fresh matrices sees a single step of copying that swings from step to step "
        f"({both} {COPIES:g}·E[X²], the copying criterion E1's row is judged by)"
    )


def e2_text(e2: pd.DataFrame, level: float) -> str:
    """Whether every L'_mask lies below COPIES·E[X²]: the model outputs the value it reads."""
    lp = e2["L'_mask"]
    if lp.max() < COPIES * level:
        return (
            f"outputs the value whose token it reads: L'_mask stays between {lp.min():.1e} and {lp.max():.1e}"
        )
    return f"does not simply output the value whose token it reads: L'_mask reaches {lp.max():.1e}"


def e3_text(e3: pd.DataFrame) -> str:
    """Whether ablating every head changes the pre model's L_mask by NO_EFFECT or more, with the
    paper's numbers (agreement is `e3_match`)."""
    un, ab_u, ab_b = (
        lookup(e3, "L_mask", ablated=a, reading=r)
        for a, r in [("none", "—"), ("all heads", "uniform"), ("all heads", "batch_mean")]
    )
    change = max(abs(ab_u - un), abs(ab_b - un)) / un
    paper = f"the paper: {PAPER[('E3', 'pre L_mask')]} → {PAPER[('E3', 'pre ablated L_mask')]}"
    if change < NO_EFFECT:
        by = percent(change)  # "less than 0.05%" where the change rounds to 0.0%
        return (
            f"changes L_mask by {by if by.startswith('less') else 'at most ' + by} ({un:.4f} → {ab_u:.4f} "
            "uniform, "
            f"{ab_b:.4f} batch mean; {paper}): attention plays no part in what the model does here"
        )
    return (
        f"changes L_mask by {change:.0%} ({un:.4f} → {ab_u:.4f} uniform, {ab_b:.4f} batch mean; {paper}): "
        "this model's attention already matters"
    )


def e6_text(e6: pd.DataFrame, level: float, paper_rel: float, verdict: str) -> str:
    """Whether post's Q, K, V make the pre model complete (L_mask below DROP_FRACTION·E[X²]), worded
    by `verdict` of the E6 L_mask row (paper value `paper_rel`)."""
    sw = e6.set_index("model").loc["pre with post's QKV"]
    what = (
        "does not let it complete the matrix"
        if sw.L_mask > DROP_FRACTION * level
        else "lets it complete the matrix in part, so here the attention weights carry much of what "
        "the drop learns"
    )
    return (
        f"{what}: L_mask is {sw.L_mask:.3f}, {sw.L_mask / level:.3g} E[X²], {agreement(verdict)} "
        f"({paper_rel:.3g} E[X²] on its own task, number rule), and L_obs {sw.L_obs:.1e} (the paper: "
        f"{PAPER[('E6', 'post-QKV into pre L_obs')]:.0e})"
    )
