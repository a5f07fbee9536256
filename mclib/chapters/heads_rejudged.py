"""Part of chapter 03_heads: what a GPU lease's recorded rows are judged again by. Rows read at the
pre-shift step away from the paper's marked n/a (`pre_read`), the glued sentences restated beside
today's verdicts (`restated`), a recorded row judged by today's rules (`rejudged`), and the rule
fields of a row recorded without them (`rule_of`).
"""

from __future__ import annotations

import re

from ..analyses.heads import STRUCTURE_THRESHOLD
from ..book.scorecard_rules import CUT
from .copying_rejudged import pre_na
from .heads_readings import E4_CHOICE, E4_EARLIER, E8_SOURCE, e4_na
from .heads_structure import MOSTLY, PROBED, PROBED_MODEL, e11_claim
from .heads_tables import CHAPTER

# what the notebook calls through this module, computed there (e10_masks too, from mclib.analyses.heads)

# The rows of this chapter that read the pre-shift checkpoint: E6's post model with its QKV, E9's
# structure before the drop. On the paper's task they compare with the paper only at its pre step.
PRE_READ = (("E6", "post with pre's QKV / post: L_obs"), ("E9", "largest excess of any head, pre-shift"))


def pre_read(rows: list[dict], pre: int, on_paper_task: bool) -> list[dict]:
    """`rows` with the `PRE_READ` rows n/a where the pre-shift checkpoint is not the paper's pre
    step on the paper's task (`ch02_copying.pre_na`)."""
    na = pre_na(pre, on_paper_task)
    return [
        {**r, "na": na} if na and (r["id"], r["quantity"]) in PRE_READ and not r.get("na") else r
        for r in rows
    ]


def restated(name: str, text: str, rows: list[dict]) -> str | None:
    """The lease's glued sentence `name` reworded from its re-judged `rows` (E11's claim, by
    `e11_claim`), or None when nothing is reworded."""
    if name != "e11_text":
        return None
    row = next((r for r in rows if r["id"] == "E11" and r["quantity"].startswith("row probe")), None)
    head, sep, _ = text.partition(" A linear probe ")
    if row is None or row.get("ours") is None or not sep:
        return None
    return f"{head} {e11_claim(row['verdict'], float(row['ours']))}"


def rejudged(row: dict, recorded) -> tuple[dict, list[str]]:
    """(row, why): a row a GPU lease recorded, judged by today's rules (`mclib.lease.reference.rejudge`):
    E4 n/a under an earlier choice of heads (`E4_EARLIER`) or by `e4_na`; E8's every-layer row
    without the paper's value; E11 naming `PROBED_MODEL`; `PRE_READ` rows by `pre_read`."""
    new, why = dict(row), []
    if row["id"] == "E4":
        reading = row.get("reading", "")
        m = re.search(re.escape(E4_CHOICE) + r": (\d+) ", reading)
        na = (
            E4_EARLIER
            if E4_CHOICE not in reading
            else e4_na(int(m.group(1)))
            if m
            else "the row does not say how many heads it ablated"
        )
        if na:
            new["na"] = na
    if row["id"] == "E8" and row["quantity"].startswith("every layer") and row.get("paper") is not None:
        new["paper"] = None
        why.append(f"the paper's value moved to the last-layer rows ({E8_SOURCE})")
    if row["id"] == "E11" and "12-layer, 12-head" not in row.get("reading", ""):
        new["reading"] = f"{row.get('reading', '')}; {PROBED_MODEL}"
    if (row["id"], row["quantity"]) in PRE_READ and row.get("chapter") == CHAPTER and not row.get("na"):
        glued = (recorded.glued(CHAPTER, "pre_step") or "").replace(",", "")
        pre = int(glued) if glued.isdigit() else None if recorded.steps is None else recorded.steps.pre
        new = (
            pre_read([new], pre, True)[0]
            if pre is not None
            else {**new, "na": "no pre-shift checkpoint could be placed in the run"}
        )
    return new, why


def rule_of(row: dict) -> dict:
    """The rule fields (`scorecard.RULE_FIELDS`) this chapter's rows are judged by, for a row
    recorded without them; {} for a row not its own."""
    i, q = row["id"], row["quantity"]
    if i == "E5":
        return {"reference": 1.0, "sense": "above"}
    if i == "E9" and "excess" in q and "/ drop step" not in q:
        return {
            "reference": STRUCTURE_THRESHOLD,
            "sense": "below" if "pre-shift" in q else "above",
            "margin": CUT,
        }
    if i == "E10" and q.startswith("structured mask: the best head's mass"):
        return {"reference": MOSTLY, "sense": "above", "margin": CUT}
    if i == "E10":
        said = re.search(r"\b(above|below) ([-+\d.e]+) counts", row.get("reading", ""))
        return {"reference": float(said.group(2)), "sense": said.group(1), "margin": CUT} if said else {}
    if i == "E11":
        if q.startswith("value probe"):
            return {"reference": 1.0, "sense": "below", "margin": CUT}
        return {"reference": PROBED, "sense": "above" if q.startswith("singular") else "below", "margin": CUT}
    return {}
