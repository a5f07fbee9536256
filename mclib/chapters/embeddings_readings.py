"""Chapter 04's closing sentences and scorecard rows (`mclib.chapters.ch04_embeddings`
re-exports what it uses): the cut-offs each figure-only claim of the paper is judged against
(STRONG, CLUSTERED, ALIGNED, DIP, by the direction rule with no added margin), the checkpoint
before the drop E13 and E14 read (`before_the_drop`), and the glue and rows of E12 (the value
tokens' embedding components), E13 (the final arrangement before the drop; n/a by `e13_na`
when the final layout is read too soon after) and E14 (the position embeddings' clusters and
middle-row norm), every sentence worded by the verdicts of the rows it speaks for
(`embedding_readings`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..book.scorecard import claim
from ..book.scorecard_rules import CUT, POSITIVE, agreement, agreements, row_verdict

STRONG = 0.8  # |Pearson r| above this: a component "tracks" a feature
CLUSTERED = 0.25  # a silhouette above this: visible clusters
ALIGNED = 0.9  # centred alignment above this: "the final arrangement"
DIP = 0.95  # middle-row norm / mean norm below this: "a dip"
# E13 compares a checkpoint before the drop with the final layout; the final one must lie at least
# this many times the tested checkpoint's step, or an alignment above ALIGNED says little: the paper
# read 50 000 against 14 000 (3.6x), and a layout 3 591 steps on (16 591 against 13 000, a cut run)
# can barely have moved.
E13_AFTER = 2.0


def e13_na(tested: int, final: int) -> str | None:
    """Why E13 cannot test step `tested` against the final layout at `final` (read less than
    E13_AFTER times later), or None."""
    if final >= E13_AFTER * tested:
        return None
    return (
        f"the final layout is read at step {final:,}, only {final - tested:,} steps after the checkpoint it "
        f"tests (step {tested:,}): too close for the test to fail; at least {E13_AFTER:g}× its step counts "
        "(the paper: 50,000 against 14,000)"
    )


def _said(row: dict) -> tuple[str, bool]:
    """(agreement phrase, whether the claim holds) from the verdict `row` will get."""
    v = row_verdict(row)
    return agreement(v), v in POSITIVE.values()


@dataclass(frozen=True)
class Before:
    """E13's and E14's checkpoint before the drop: `last` (a row of `embedding_progress`), or None
    and `missing`, why there is none."""

    last: pd.Series | None
    missing: str | None


def before_the_drop(progress: pd.DataFrame, drop: int | None) -> Before:
    """The last saved checkpoint before the drop, or why there is none (no drop, or none saved before it)."""
    last = (
        progress[progress["step"] < drop].iloc[-1]
        if drop is not None and (progress["step"] < drop).any()
        else None
    )
    return Before(
        last,
        "no drop in this run"
        if drop is None
        else None
        if last is not None
        else "no saved checkpoint before the drop",
    )


def e12_readings(tracks: pd.DataFrame, symmetry: float) -> tuple[dict, list[dict]]:
    """(glue, rows) of E12 at post: the norms' symmetry, the component closest to |x| and whether the
    other tracks sign(x)."""
    t = tracks.set_index("component")
    abs_c = int(t["abs_x"].idxmax())  # the component closest to |x|; the other is checked for sign(x)
    other = next(c for c in t.index if c != abs_c)
    abs_r, sign_r, x_r = t.loc[abs_c, "abs_x"], t.loc[other, "sign_x"], t.loc[other, "x"]
    tracks_text = (
        f"the component closest to |x| (component {abs_c}) has |r| = {abs_r:.2f} with |x|, and the other "
        f"|r| = {sign_r:.2f} with the sign of x ({x_r:.2f} with x itself)"
    )
    rows = [
        claim(
            "E12",
            "token-norm symmetry: corr(‖e(x)‖, ‖e(−x)‖), post",
            float(symmetry),
            f"{'symmetric' if symmetry > STRONG else 'not symmetric'} about 0 (paper: symmetric)",
            kind="direction",
            reference=STRONG,
            sense="above",
            margin=CUT,
        ),
        claim(
            "E12",
            "|r| of a token PCA component with |x|, post",
            float(abs_r),
            f"{'tracks' if abs_r > STRONG else 'does not track'} |x| (paper: one component does)",
            kind="direction",
            reference=STRONG,
            sense="above",
            margin=CUT,
        ),
        claim(
            "E12",
            "|r| of the other component with sign(x), post",
            float(sign_r),
            f"{'tracks' if sign_r > STRONG else 'does not track'} the sign (paper: it does); with x: "
            f"{x_r:.2f}",
            kind="direction",
            reference=STRONG,
            sense="above",
            margin=CUT,
        ),
    ]
    (_, abs_holds), (_, sign_holds) = _said(rows[1]), _said(rows[2])
    tracks_claim = ("one component tracks |x|" if abs_holds else "no component tracks |x|") + (
        " and the other the sign" if sign_holds else ", and the other does not track the sign"
    )
    tracks_claim += ", " + agreements({"for |x|": row_verdict(rows[1]), "for the sign": row_verdict(rows[2])})
    return {
        "symmetry": float(symmetry),
        "symmetry_text": "symmetric about 0" if symmetry > STRONG else "not symmetric about 0",
        "tracks_text": tracks_text,
        "tracks_claim": tracks_claim,
    }, rows


def e13_readings(
    progress: pd.DataFrame, summary: pd.DataFrame, before: Before, drop: int | None, *, post_step: int
) -> tuple[dict, list[dict]]:
    """(glue, rows) of E13: centred token alignment with the final layout at `before`; n/a where the
    embeddings start aligned or `e13_na` says so."""
    reached = progress.loc[progress["token_alignment"] >= ALIGNED, "step"]
    aligned_at = int(reached.iloc[0]) if len(reached) else None
    s = summary.set_index("step")
    init_align = float(s.loc[0, "alignment_centred"]) if 0 in s.index else None
    align_text = (
        f"reached {ALIGNED} at step {aligned_at:,}"
        if aligned_at is not None
        else f"did not reach {ALIGNED} at any saved checkpoint"
    ) + ("" if init_align is None else f" (at initialisation it was {init_align:.2f})")
    early = (
        f"the embeddings start that close to their final layout (centred alignment {init_align:.2f} at "
        "initialisation), so reaching it says nothing about the drop"
        if init_align is not None and init_align >= ALIGNED
        else None
    )
    last, no_before = before.last, before.missing
    row = claim(
        "E13",
        "centred token alignment with the final layout, last checkpoint before the drop",
        None if last is None else float(last.token_alignment),
        "",
        kind="direction",
        reference=ALIGNED,
        sense="above",
        margin=CUT,
        na=no_before or early or e13_na(int(last.step), post_step),
    )
    align_said, aligned = _said(row)
    too_close = None if last is None else e13_na(int(last.step), post_step)
    if early:
        align_claim = (
            "but the embeddings start that close to their final layout, so this says nothing about the drop"
        )
    elif too_close and not no_before:
        align_claim = f"but it is not tested against the drop here: {too_close}"
    elif drop is None:
        align_claim = "with no drop to compare against"
    elif no_before:
        align_claim = "with no saved checkpoint before the drop to compare"
    else:
        align_claim = (
            f"{'and' if aligned else 'but'} at the last checkpoint before the drop at step {drop:,} it is "
            f"{'above' if aligned else 'not above'} {ALIGNED}, {align_said}"
        )
    row["reading"] = (
        f"{align_text}, {align_claim} (paper: the final arrangement comes before the drop; "
        f"above {ALIGNED} counts)"
    )
    return {"align_text": align_text, "align_claim": align_claim}, [row]


def e14_readings(
    progress: pd.DataFrame, before: Before, drop: int | None, *, post_step: int
) -> tuple[dict, list[dict]]:
    """(glue, rows) of E14: column silhouette before the drop and at the end, and the middle row's norm."""
    first, last = progress.iloc[0], progress.set_index("step").loc[post_step]
    col_post, row_post, mid = last["column_silhouette"], last["row_silhouette"], last["middle_row_norm"]
    before_drop, no_before = before.last, before.missing
    if drop is not None and (progress["step"] >= drop).any() and before_drop is not None:
        after = progress[progress["step"] >= drop].iloc[0]
        cluster_text = (
            f"the column silhouette was {before_drop.column_silhouette:.2f} at step "
            f"{int(before_drop.step):,}, the last checkpoint before the drop, and "
            f"{after.column_silhouette:.2f} at step {int(after.step):,}, the first after it; at the end "
            f"it is {col_post:.2f} (grouped by row: {row_post:.2f})"
        )
    else:
        cluster_text = (
            f"the column silhouette went from {first.column_silhouette:.2f} at step {int(first.step):,} to "
            f"{col_post:.2f} at step {post_step:,} (grouped by row: {row_post:.2f})"
        )
    rows = [
        claim(
            "E14",
            "column silhouette of the position embeddings, last checkpoint before the drop",
            None if before_drop is None else float(before_drop.column_silhouette),
            "",
            kind="direction",
            reference=CLUSTERED,
            sense="below",
            margin=CUT,
            na=no_before,
        ),
        claim(
            "E14",
            "column silhouette of the position embeddings, post",
            float(col_post),
            "",
            kind="direction",
            reference=CLUSTERED,
            sense="above",
            margin=CUT,
        ),
        claim(
            "E14",
            "middle-row position norm / mean position norm, post",
            float(mid),
            f"{'a dip' if mid < DIP else 'no dip'} in the middle row (paper: a dip at positions ~21–26; "
            "below "
            f"{DIP} counts)",
            kind="direction",
            reference=DIP,
            sense="below",
            margin=CUT,
        ),
    ]
    return {
        "cluster_text": cluster_text,
        "cluster_claim": _cluster_claim(rows, no_before, row_post),
        "mid_norm": float(mid),
    }, rows


def _cluster_claim(rows: list[dict], no_before: str | None, row_post: float) -> str:
    """E14's sentence on columns clustering only after the drop, by the verdicts of `rows[0]` (before)
    and `rows[1]` (end), whose readings it sets."""
    (pre_said, apart_before), (post_said, clustered) = _said(rows[0]), _said(rows[1])
    at_end = (
        f"the columns cluster by the end of the run, {post_said}"
        if clustered
        else f"no column clusters (silhouette above {CLUSTERED}) by the end of the run, {post_said}"
    )
    if no_before:
        cluster_claim = (
            f"whether the columns cluster only after a drop cannot be tested ({no_before}); {at_end}"
        )
        pre_reading = pre_said  # `record` adds the reason
    else:
        before = (
            "the columns do not cluster before the drop"
            if apart_before
            else "the columns already cluster before the drop"
        )
        pre_reading = f"{before}, {pre_said}"
        cluster_claim = (
            f"the columns cluster only after the drop, {post_said}"
            if apart_before and clustered
            else f"{before}, {pre_said}; {at_end}"
        )
    rows[0]["reading"] = (
        f"{pre_reading} (paper: no column clusters before the drop; below {CLUSTERED} counts)"
    )
    rows[1]["reading"] = (
        f"{'columns cluster' if clustered else 'no column clusters'}, {post_said} (row: "
        f"{row_post:.2f}); paper: they cluster after the drop; above {CLUSTERED} counts"
    )
    return cluster_claim


def embedding_readings(
    progress: pd.DataFrame,
    summary: pd.DataFrame,
    tracks: pd.DataFrame,
    symmetry: float,
    drop: int | None,
    *,
    post_step: int,
) -> tuple[dict, list[dict]]:
    """(glue, rows) of E12-E14 from `embedding_progress` (`progress`), `token_projections`' summary,
    post's `component_tracks` and `norm_symmetry`; every sentence comparing with the paper is worded
    by the verdicts of the rows it speaks for."""
    before = before_the_drop(progress, drop)
    glue, rows = {}, []
    for part_glue, part_rows in (
        e12_readings(tracks, symmetry),
        e13_readings(progress, summary, before, drop, post_step=post_step),
        e14_readings(progress, before, drop, post_step=post_step),
    ):
        glue.update(part_glue)
        rows += part_rows
    return {**glue, "post_step": f"{post_step:,}"}, rows
