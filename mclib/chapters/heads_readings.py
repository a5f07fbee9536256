"""Chapter 03's scorecard rows and the sentences that state them, for E3-E9: each function
returns (glue, rows) from `mclib.chapters.heads_tables`' tables; `ch03_heads.readings` joins them
with E10's and E11's (`heads_structure`). Every row is scale-free: a ratio of losses on the same
matrices, a loss over E[X²], a head score.
"""

from __future__ import annotations

import math

import pandas as pd

from ..analyses.heads import LABELS, STRUCTURE_THRESHOLD
from ..analyses.loss_tables import UNABLATED, lookup, permutation_errors, ratio_and_se, ratio_se, value_and_se
from ..book.scorecard import claim as _row
from ..book.scorecard_rules import CUT, agreement, agreements, row_verdict
from ..book.scorecard_tables import plural
from ..core.metrics import COPIES, DROP_FRACTION, PLATEAU_BAND
from ..core.paper import PAPER, PAPER_HEADS

# E11's row-probe wording, from heads_structure, read through this module by the tests
from .heads_structure import e11_claim as e11_claim
from .heads_tables import E4_SET, E6_MODEL
from .loss_tables_shown import READING_NAMES, SHORT, matching_reading_text


def ratio_cause(changed: float, unchanged: float, paper: tuple[float, float], what: str) -> str:
    """A sentence on why a ratio of L_obs (the `what` model's over post's, each over E[X²]) differs
    from the paper's (`paper`): which of its two terms is further from the paper's."""
    a, b = changed / paper[0], unchanged / paper[1]
    where = (
        f"mostly in the {what} model"
        if abs(math.log(a)) > abs(math.log(b))
        else "mostly in the unchanged model's copying, the ratio's denominator"
    )
    return (
        f"over E[X²], the {what} L_obs is {a:.2g}× the paper's and the unchanged {b:.2g}×, so the ratio is "
        f"{a / b:.2g}× the paper's: the difference is {where}; not traced further"
    )


def ablated_text(ours: float, paper: float, verdict: str) -> str:
    """Where post's L_mask lands with every head ablated (`ours` over E[X²]; the paper's `paper`), by
    the row's `verdict`: "back at the copying level" only where it agrees with the paper, else which
    side of the level and by how much."""
    near = abs(ours - 1) < PLATEAU_BAND
    if near and verdict != "differs":
        where = "back at the copying level"
    else:
        side = "above" if ours > 1 else "below"
        where = (
            f"{abs(ours - 1):.0%} {side} the copying level"
            if near
            else "well below the copying level"
            if ours < 1
            else "above the copying level"
        )
    return f"{ours:.3g} E[X²], {where}, {agreement(verdict)} ({paper:.3g} E[X²] on its own task)"


def e3_rows(abl: pd.DataFrame, levels: tuple[float, float]) -> tuple[dict, list[dict]]:
    """E3: the post model's losses over E[X²], and with every head ablated under both readings."""
    level, paper_level = levels
    rows = []
    un = value_and_se(abl, "L_mask", **UNABLATED)
    rows.append(
        _row(
            "E3",
            "post L_mask / E[X²]",
            un[0] / level,
            "completes" if un[0] / level < DROP_FRACTION else "does not complete",
            paper=PAPER[("E3", "post L_mask")] / paper_level,
            se=un[1] / level,
        )
    )
    ob = value_and_se(abl, "L_obs", **UNABLATED)
    rows.append(
        _row(
            "E3",
            "post L_obs / E[X²]",
            ob[0] / level,
            "how precisely the observed entries come back",
            paper=PAPER[("E3", "post L_obs")] / paper_level,
            se=ob[1] / level,
            cause="the observed entries come back less precisely than in the paper's model; not traced "
            "further (the same procedure as the authors' code)",
        )
    )
    verdicts = []
    for mode in ("uniform", "batch_mean"):
        a = value_and_se(abl, "L_mask", ablated="all heads", reading=mode)
        row = _row(
            "E3",
            f"post, every head ablated, {READING_NAMES[mode]}: L_mask / E[X²]",
            a[0] / level,
            "",
            paper=PAPER[("E3", "post ablated L_mask")] / paper_level,
            se=a[1] / level,
        )
        verdicts.append(row_verdict(row))
        rows.append({**row, "reading": ablated_text(row["ours"], row["paper"], verdicts[-1])})
        ratio, se = ratio_and_se(abl, "L_obs", {"ablated": "all heads", "reading": mode}, UNABLATED)
        ablated = value_and_se(abl, "L_obs", ablated="all heads", reading=mode)[0]
        rows.append(
            _row(
                "E3",
                f"post, every head ablated, {READING_NAMES[mode]}: ablated / unablated L_obs",
                ratio,
                f"{ratio:.3g} ± {se:.2g}",
                paper=PAPER[("E3", "post ablated L_obs")] / PAPER[("E3", "post L_obs")],
                kind="ratio",
                se=se,
                cause=ratio_cause(
                    ablated / level,
                    ob[0] / level,
                    (
                        PAPER[("E3", "post ablated L_obs")] / paper_level,
                        PAPER[("E3", "post L_obs")] / paper_level,
                    ),
                    "ablated",
                ),
            )
        )
    return {
        "e3_match": matching_reading_text(verdicts, "the paper's ablated L_mask / E[X²] (number rule)")
    }, rows


# E4's rows name their heads so (`e4_choice`); a recorded row without these words reads as
# recorded under the earlier choice of heads (`rejudged`: `E4_EARLIER`)
E4_CHOICE = "every head our scores leave unlabelled ('other')"
E4_EARLIER = (
    "recorded under the book's earlier choice of heads (our 'other' heads in the paper's layers, at most its "
    "five, the least structured first), a choice that passes almost whatever the model does; E4 now ablates "
    + E4_CHOICE
)


def e4_na(n_heads: int) -> str | None:
    """Why E4 has nothing to test with `n_heads` heads in `E4_SET` (none unlabelled), or None."""
    return None if n_heads else "our scores leave no head of this run unlabelled ('other'): nothing to ablate"


def e4_heads(n_heads: int, total: int | None) -> str:
    """How many heads E4 ablates: "4 of 32 heads" (or "4 heads" where the total is not known)."""
    return f"{n_heads} of {total} heads" if total else plural(n_heads, "head")


def e4_choice(n_heads: int, total: int | None, which: str) -> str:
    """E4's heads and why, from the numbers: the `n_heads` of `total` unlabelled (named in `which`),
    against the paper's count of uninterpretable heads."""
    paper_count = len(PAPER_HEADS["uninterpretable"])
    than = "as many as" if n_heads == paper_count else "more than" if n_heads > paper_count else "fewer than"
    return (
        f"{E4_CHOICE}: {e4_heads(n_heads, total)}"
        + (f" ({which})" if which else "")
        + f", {than} the paper's {paper_count}; all of them, as the paper's {paper_count} are all the "
        "heads it could "
        "not interpret, and not a count of the least structured, which passes almost whatever the model does"
    )


def e4_cause(n_heads: int, total: int | None) -> str:
    """Why E4 may differ: our count of unlabelled heads against the paper's five of 32."""
    paper = len(PAPER_HEADS["uninterpretable"])
    of = "" if total is None else f" of {total}"
    more = (
        "more heads than the paper's, so heads that do part of the work may be among them"
        if n_heads > paper
        else "no more heads than the paper's"
    )
    return (
        f"{n_heads}{of} heads are unlabelled here against the paper's {paper} of 32: {more}; not "
        "traced further"
    )


def e4_rows(abl: pd.DataFrame) -> tuple[dict, list[dict]]:
    """E4: every unlabelled head ablated (`E4_SET`), by the ratio rule against the paper's "no
    significant effect"; n/a where no head is unlabelled (`e4_na`)."""
    rows = []
    e4_abl, every = abl[abl["ablated"] == E4_SET], abl[abl["ablated"] == "all heads"]
    n_e4, which = (int(e4_abl["heads"].iloc[0]), e4_abl["which"].iloc[0]) if len(e4_abl) else (0, "")
    total = int(every["heads"].iloc[0]) if len(every) else None
    na, choice = e4_na(n_e4), e4_choice(n_e4, total, which)
    e4 = []
    for mode in ("uniform", "batch_mean"):
        for q in ("L_mask", "L_obs"):
            ratio, se = (
                ratio_and_se(abl, q, {"ablated": E4_SET, "reading": mode}, UNABLATED)
                if n_e4
                else (None, None)
            )
            rows.append(
                _row(
                    "E4",
                    f"'other' heads ablated, {READING_NAMES[mode]}: ablated / unablated {q}",
                    ratio,
                    choice + ("" if ratio is None else f"; {ratio:.3g} ± {se:.2g}"),
                    paper=PAPER[("E4", f"ablated {q}")] / PAPER[("E4", q)],
                    kind="ratio",
                    se=se,
                    na=na,
                    cause=e4_cause(n_e4, total),
                )
            )
            if q == "L_mask" and not na:
                e4.append((mode, ratio, row_verdict(rows[-1])))
    paper_e4 = PAPER[("E4", "ablated L_mask")] / PAPER[("E4", "L_mask")]
    text = (
        f"E4 has nothing to test here ({na})"
        if not e4
        else f"ablating {E4_CHOICE}, {e4_heads(n_e4, total)} ({which}), multiplies L_mask by "
        + " and ".join(f"{ratio:.3g} under the {SHORT[m]} reading" for m, ratio, _ in e4)
        + f', against the paper\'s {paper_e4:.2f} for its five heads ("no significant effect"): '
        + agreements({f"under the {SHORT[m]} reading": v for m, _, v in e4})
        + " (ratio rule)"
    )
    return {"e4_text": text}, rows


def e5_rows(abl: pd.DataFrame, groups: dict) -> tuple[dict, list[dict]]:
    """E5: every group hurts (the paper; its numbers are lost): ablated / unablated L_mask above 1."""
    rows, parts = [], []
    for lab in [l for l in LABELS if l != "other"]:
        said = []
        for mode in ("uniform", "batch_mean"):
            has = bool(groups.get(lab))
            ratio, se = (
                ratio_and_se(abl, "L_mask", {"ablated": f"{lab} heads", "reading": mode}, UNABLATED)
                if has
                else (None, None)
            )
            rows.append(
                _row(
                    "E5",
                    f"{lab} heads ablated, {READING_NAMES[mode]}: ablated / unablated L_mask",
                    ratio,
                    plural(len(groups.get(lab, [])), "head")
                    + ("" if ratio is None else f"; {ratio:.3g} ± {se:.2g}"),
                    kind="direction",
                    reference=1.0,
                    sense="above",
                    se=se,
                    na=None if has else f"no head of this run is labelled '{lab}'",
                )
            )
            if has:
                said.append((mode, ratio))
        if said:
            parts.append(
                f"{lab} heads: " + ", ".join(f"{ratio:.3g}× ({m.replace('_', '-')})" for m, ratio in said)
            )
    text = (
        "the two readings test different claims. The uniform reading replaces a head's whole pattern, its "
        "fixed "
        "positional part included, so it tests whether the group's attention pattern matters at all. The "
        "batch "
        "mean keeps what every input shares: a head that always attends along the query's row or column has "
        "about "
        "the same map on every input, so its batch mean is that map and ablating it changes little; this "
        "reading "
        "tests only the input-dependent part of the attention. L_mask, ablated over unablated: "
        + ("; ".join(parts) if parts else "every group of our labels is empty in this run")
    )
    return {"e5_text": text}, rows


def e6_e7_rows(e67: pd.DataFrame, perm: pd.DataFrame, levels: tuple[float, float]) -> tuple[dict, list[dict]]:
    """E6: the post model with the pre-shift QKV; E7: its positions permuted (the mean over permutations)."""
    level, paper_level = levels
    rows = []
    post = {"model": "post"}
    ratio, se = ratio_and_se(e67, "L_obs", {"model": E6_MODEL}, post)
    rows.append(
        _row(
            "E6",
            "post with pre's QKV / post: L_obs",
            ratio,
            f"{ratio:.3g} ± {se:.2g}",
            paper=PAPER[("E6", "pre-QKV into post L_obs")] / PAPER[("E3", "post L_obs")],
            kind="ratio",
            se=se,
        )
    )
    pm_, pm_se = perm["L_mask"].mean(), permutation_errors(perm)["L_mask_se"]
    rows.append(
        _row(
            "E7",
            f"positions permuted (mean of {len(perm)}): L_mask / E[X²]",
            pm_ / level,
            f"{'above' if pm_ > level else 'below'} the copying level; permutations range "
            f"{perm.L_mask.min() / level:.3g} to {perm.L_mask.max() / level:.3g}",
            paper=PAPER[("E7", "L_mask")] / paper_level,
            se=pm_se / level,
        )
    )
    po = value_and_se(e67, "L_obs", **post)
    po_obs, po_obs_se = perm["L_obs"].mean(), float(perm["L_obs_se"].mean())
    rows.append(
        _row(
            "E7",
            "positions permuted / unpermuted: L_obs",
            po_obs / po[0],
            "how much the permutation disturbs copying",
            paper=PAPER[("E7", "L_obs")] / PAPER[("E3", "post L_obs")],
            kind="ratio",
            se=ratio_se(po_obs, po_obs_se, *po),
            cause=ratio_cause(
                po_obs / level,
                po[0] / level,
                (PAPER[("E7", "L_obs")] / paper_level, PAPER[("E3", "post L_obs")] / paper_level),
                "permuted",
            )
            + " (the authors' src/embed.py permutes the same rows, once)",
        )
    )
    return {}, rows


# What the authors' code runs for E8: github.com/pulkitgopalani/tf-matcomp, src/patch.py (revision
# 5afce89) writes the clean run's states into the run on −X with `patch_mask[3, :, :, :] = 1`, the
# last of the 4 layers only, of the checkpoint at epoch 49999 (src/configs/patch.yaml): its 0.014 is
# the last-layer reading, the headline here; the text's every-layer reading is ours.
E8_SOURCE = "the authors' src/patch.py patches only the last layer (patch_mask[3] of 4), at step 49 999"
# Why the last-layer rows may differ: the paper's number may not be that reading. Its 0.014 lies within
# its own unpatched post L_mask (E3's 0.0128, E4's 0.01428), which is what patching every layer gives by
# construction.
E8_OPEN = (
    "it lies within the paper's own unpatched L_mask "
    f"({PAPER[('E3', 'post L_mask')]:g}-{PAPER[('E4', 'L_mask')]:g}), "
    "which patching every layer gives by construction, while its released code patches the last layer only, "
    "as here"
)
E8_CAUSE = (
    f"which reading the paper's {PAPER[('E8', 'masked MSE to X')]:g} is cannot be settled from "
    f"the paper: {E8_OPEN}"
)


def e8_rows(e8: pd.DataFrame, abl: pd.DataFrame, levels: tuple[float, float]) -> tuple[dict, list[dict]]:
    """E8: the last layer patched (the authors' code, `E8_SOURCE`) against the paper's numbers; every
    layer patched (the text's reading) without a paper's value, since it equals `abl`'s unpatched
    L_mask by construction."""
    level, paper_level = levels
    un = value_and_se(abl, "L_mask", **UNABLATED)
    x_last, nx_last = (lookup(e8, c, patched="last layer") for c in ("masked_vs_X", "masked_vs_negX"))
    x_all = lookup(e8, "masked_vs_X", patched="all layers")
    rows = [
        _row(
            "E8",
            "last layer patched: masked MSE to X / E[X²]",
            x_last / level,
            ("the patched run outputs X" if x_last < COPIES * level else "the patched run does not output X")
            + f" ({E8_SOURCE})",
            paper=PAPER[("E8", "masked MSE to X")] / paper_level,
            cause=E8_CAUSE,
        ),
        _row(
            "E8",
            "last layer patched: masked MSE to −X / E[X²]",
            nx_last / level,
            "4 means an output of X (E[(X − (−X))²] = 4 E[X²])",
            paper=PAPER[("E8", "masked MSE to -X")] / paper_level,
            cause=E8_CAUSE,
        ),
        _row(
            "E8",
            "every layer patched: masked MSE to X / E[X²]",
            x_all / level,
            f"equals the unpatched L_mask / E[X²] ({un[0] / level:.4g}) by construction; the text's reading",
            kind="by construction",
        ),
    ]
    said = agreement(row_verdict(rows[0]))
    text = (
        f"The reading the authors' code runs: {E8_SOURCE} (github.com/pulkitgopalani/tf-matcomp, "
        "src/patch.py and "
        "src/configs/patch.yaml). Whether the paper's 0.014 comes from it is open: "
        f"{E8_OPEN}. With the last layer patched, our masked MSE to X is "
        f"{x_last:.3g} ({x_last / level:.3g} E[X²], against the paper's "
        f"{PAPER[('E8', 'masked MSE to X')] / paper_level:.3g} "
        f"E[X²]), {said}, and to −X {nx_last:.3g} ({nx_last / level:.3g} E[X²], where 4 means an output of "
        "exactly X). "
        "The paper's text patches every layer; that reading is ours alone: the masked MSE to X is then "
        f"{x_all:.4g}, "
        f"and the unpatched L_mask on the same matrices is {un[0]:.4g}, the same number, as it has to be. At "
        "a masked "
        "position the input is the MASK token and the position, the same for X and −X; once every layer's "
        "attention "
        "output there comes from the run on X, the masked positions' states are those of the run on X, "
        "whatever the "
        "observed entries say, so that reading cannot fail"
    )
    return {"e8_text": text}, rows


def e9_rows(scores: pd.DataFrame, pre_scores: pd.DataFrame | None) -> tuple[dict, list[dict]]:
    """E9: row, column and self heads after the drop, no structure before it."""
    rows = []
    top = scores[["row_excess", "column_excess", "self_excess"]].max()
    last = scores[scores["layer"] == scores["layer"].max()]["self_excess"].max()
    for q, v in (
        ("largest row excess of any head, post", top["row_excess"]),
        ("largest column excess of any head, post", top["column_excess"]),
        ("largest self excess of a last-layer head, post", last),
    ):
        rows.append(
            _row(
                "E9",
                q,
                float(v),
                f"{'such a' if v >= STRUCTURE_THRESHOLD else 'no such'} head (above "
                f"{STRUCTURE_THRESHOLD:g} counts: half-way from uniform to pure)",
                kind="direction",
                reference=STRUCTURE_THRESHOLD,
                sense="above",
                margin=CUT,
            )
        )
    pre_top = (
        None
        if pre_scores is None
        else float(pre_scores[["row_excess", "column_excess", "self_excess"]].max().max())
    )
    rows.append(
        _row(
            "E9",
            "largest excess of any head, pre-shift",
            pre_top,
            "no structure before the drop"
            if pre_top is not None and pre_top < STRUCTURE_THRESHOLD
            else "structure before the drop",
            kind="direction",
            reference=STRUCTURE_THRESHOLD,
            sense="below",
            margin=CUT,
            na=None if pre_scores is not None else "no pre-shift checkpoint saved",
        )
    )
    text = (
        f"the largest row excess of any head is {top['row_excess']:.2f}, column {top['column_excess']:.2f}, "
        f"self in the last layer {last:.2f}"
        + ("" if pre_top is None else f"; before the drop the largest excess is {pre_top:.2f}")
    )
    return {"e9_text": text}, rows
