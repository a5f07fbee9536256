"""Part of chapter 02_copying, shared with chapters 01 and 03: when a row read at the pre-shift
step compares with the paper's number (`pre_na`: on the paper's task only at its pre step), and
how an E2 row a GPU lease read at one checkpoint is judged again over the laptop edition's spread
of the plateau's checkpoints (`one_checkpoint`).
"""

from __future__ import annotations

from ..book.scorecard_stage import PAPER_PRE


def pre_na(step: int, on_paper_task: bool) -> str | None:
    """Why a row read at pre-shift `step` has no paper's number to compare with, or None. On the
    paper's task only PAPER_PRE compares (a copier's losses still fall along the plateau); on
    another task the placed pre step is the analogue."""
    if not on_paper_task or step == PAPER_PRE:
        return None
    return f"read at step {step:,}, not at the paper's pre step {PAPER_PRE:,}, where no checkpoint was read"


def one_checkpoint(row: dict, pre: int, laptop: list[dict] | None) -> tuple[dict, list[str]]:
    """(row, why) for an E2 row read at one checkpoint `pre`: its reading says so, and its span is
    the laptop's same row's checkpoint range as factors of its mean, carried to ours; only the words
    change when the laptop's row is unknown."""
    said = f"read at one checkpoint (step {pre:,}), where the laptop edition reads E2 over the plateau's"
    twin = next(
        (
            r
            for r in laptop or []
            if (r["id"], r["quantity"]) == ("E2", row["quantity"]) and r.get("span") and r.get("ours")
        ),
        None,
    )
    new = {**row, "reading": f"{row.get('reading', '')}; {said}".lstrip("; ")}
    if twin is None or not row.get("ours"):
        return new, [f"{said}; the laptop's spread over them not known here"]
    lo, hi = (row["ours"] * v / twin["ours"] for v in twin["span"])
    new["span"] = (lo, hi)
    new["reading"] += (
        f"; the laptop's checkpoints lay {twin['span'][0] / twin['ours']:.2g}-"
        f"{twin['span'][1] / twin['ours']:.2g}x their mean, carried to this one: {lo:.3g}-{hi:.3g}"
    )
    return new, [f"{said}: judged over the laptop's spread at one checkpoint"]
