"""The closing sentences of the freezing chapter (05) and of chapters 01-03, and
their scorecard rows, computed from the chapters' numbers.

Each function returns (glue, rows): `glue` maps the names the chapter's "What we
found" paragraph glues to strings or floats; `rows` are keyword arguments for
`mclib.book.scorecard.record(run_dir, **row, chapter=...)`. The sentences are built here, not
typed in the chapter, so that they read right whatever the run did: with a drop or
without (the smoke profile), with the paper's result or against it.

Where the paper states a result in words only (E12-E16, E18), a row's `paper` is None
(verdict n/a) and its `reading` says whether the claim holds here.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..analyses.freezing import drop_text, paper_pattern
from ..core.paper import PAPER_E15
from .scorecard import CUT, claim

E15_QUICK = 0.1   # a re-initialised run dropping within a tenth of the main run's drop step has "no plateau"
E15_ORDER = [["mlp", "token"], ["attention"], ["positional"]]  # the paper's order of the re-initialised runs' drops


_row = claim  # the rows' keyword arguments for `scorecard.record`


# --- 05: component re-initialisation (E15) -------------------------------------------------

def freeze_readings(table: pd.DataFrame, steps: int, main_drop: int | None) -> tuple[dict, list[dict]]:
    """table: `freeze_summary`; steps: the length of each run; main_drop: the main run's drop."""
    drops = {g: (None if pd.isna(d) else int(d)) for g, d in zip(table["group"], table["drop"])}
    pattern = paper_pattern(table)
    order = sorted((g for g, d in drops.items() if d is not None), key=drops.get)
    if not order:
        found = f"none of the four runs dropped within its {steps:,} steps"
        verdict_text = ("too short to check the paper's ordering" if main_drop is None or steps < main_drop else
                        f"yet the main run, trained from scratch, dropped by step {main_drop:,}")
    else:
        found = ("the runs dropped in the order " + ", ".join(f"{g} (step {drops[g]:,})" for g in order)
                 + ("" if len(order) == len(drops) else "; " + ", ".join(g for g in drops if g not in order)
                    + f" did not drop within {steps:,} steps"))
        if pattern["fast_first"]:
            verdict_text = "the MLP and token-embedding runs recover first, " + (
                "and the positional run takes longest, as in the paper" if pattern["positional_last"]
                else "but the positional run is not the slowest, unlike the paper")
        else:
            verdict_text = ("which is not the paper's picture of the MLP and token-embedding runs recovering first"
                            + (", though the positional run does take longest" if pattern["positional_last"] else ""))
    main_text = (f"The main run, trained from scratch, dropped at step {main_drop:,}." if main_drop is not None
                 else "The main run, trained from scratch, did not drop.")
    glue = {"found": found, "verdict_text": verdict_text, "main_text": main_text, "freeze_steps": f"{steps:,}"}
    # The paper's picture (Fig. 8, NeurIPS version) as claims: mlp and token runs have no plateau (they drop
    # within a tenth of the main run's plateau), attention and positional runs sit on one and then drop, and
    # the positional run is the last.
    rows = []
    for g, d in drops.items():
        quick = g in ("mlp", "token")
        rows.append(_row("E15", f"steps to the drop / main run's drop step, {g} re-initialised",
                         None if d is None or not main_drop else d / main_drop,
                         f"{drop_text(d, steps)} (paper: {PAPER_E15.get(g, 'not reported')}); "
                         f"{'below' if quick else 'above'} {E15_QUICK:g} counts",
                         kind="direction", reference=E15_QUICK, sense="below" if quick else "above",
                         na=None if main_drop else "the main run has no drop to measure against"))
    rows.append(_row("E15", "order of the drops: mlp and token, then attention, then positional", None,
                     ", ".join(f"{g} {'no drop' if drops[g] is None else f'{drops[g]:,}'}" for g in drops),
                     kind="ordering", values=dict(drops), order=E15_ORDER))
    return glue, rows


# --- 01-03: training, copying, heads (E1-E11) ------------------------------------------------
# Every model row compares a scale-free quantity: a loss over its own task's copying level
# E[X²] (`copy_levels`), or a ratio of two losses on the same matrices. No loss is rescaled.

COPIES = 0.1       # a loss below a tenth of E[X²]: the model returns that value (copies it)
COMPLETES = 0.5    # L_mask below half of E[X²]: the model completes (the drop's threshold)
STRUCTURED = 0.5   # a head's excess (row, column, self) of at least 0.5: `heads.STRUCTURE_THRESHOLD`
MOSTLY = 0.5       # E10: a head that attends to an entry puts most of its attention there
PROBED = 0.5       # E11: a probe "recovers" its target when it explains at least half its variance
RANDOM_LEVEL = 1 / 3  # E[X²] of E2's "random" matrices (iid Unif[-1, 1] entries), whatever the rank
READING_NAMES = {"uniform": "uniform (the paper's text)", "batch_mean": "batch mean (the released code)"}
SHORT = {"uniform": "uniform", "batch_mean": "batch-mean"}


def copy_levels(rank: int) -> dict[str, tuple[float, float]]:
    """kind of matrix -> (our E[X²], the paper's): low-rank matrices have E[X²] = rank/9, E2's
    random matrices 1/3 on both tasks (their rows are not rescaled)."""
    from ..core import paper
    from ..core.data import copy_level

    return {"low-rank": (copy_level(rank), copy_level(paper.task().rank)),
            "random": (RANDOM_LEVEL, RANDOM_LEVEL)}


def _val(table, col, **where):
    from .experiments import lookup
    return lookup(table, col, **where), lookup(table, f"{col}_se", **where)


def _ratio(table, col, num: dict, den: dict):
    """(num / den, its standard error) of `col` between two rows of one table (same matrices)."""
    from .experiments import ratio_se
    (a, a_se), (b, b_se) = _val(table, col, **num), _val(table, col, **den)
    return a / b, ratio_se(a, a_se, b, b_se)


def _which_match(verdicts: list[str], what: str) -> str:
    """Which ablation reading gives the paper's number, from the verdicts of the (uniform,
    batch mean) rows: e.g. 'the uniform reading (the paper's text) matches the paper's X;
    the batch-mean reading (the released code) does not'."""
    names = {"uniform": "the uniform reading (the paper's text)", "batch_mean": "the batch-mean reading (the released code)"}
    ok = [m for m, v in zip(("uniform", "batch_mean"), verdicts) if v == "matches"]
    if len(ok) == 2:
        return f"both readings match {what}"
    if not ok:
        return f"neither reading matches {what}"
    other = "batch_mean" if ok[0] == "uniform" else "uniform"
    return f"{names[ok[0]]} matches {what}; {names[other]} does not"


def training_rows(drop, steps: int, pre: dict, final_L: float, final_L_se: float, p_mask: float, rank: int,
                  paper_steps: int, seeds: dict | None = None) -> list[dict]:
    """E1 rows (01_train): the pre-shift checkpoint's L_mask / E[X²] (a number: the plateau
    is the copying level), its L_obs / E[X²] (below COPIES: the model copies), a drop at all
    (final L_mask below COMPLETES·E[X²]), the final L over a copying model's L (p_mask·E[X²]),
    and the drop step as a fraction of training (number; `seeds`: mean and spread over seeds)."""
    from ..core.paper import PAPER

    ours_lvl, paper_lvl = copy_levels(rank)["low-rank"]
    frac, spread = (drop / steps if drop else None), None
    if seeds:
        frac, spread = seeds["mean"], seeds.get("std")
    return [
        _row("E1", "pre-shift L_mask / E[X²]", pre["L_mask"] / ours_lvl,
             "on the copying plateau" if abs(pre["L_mask"] / ours_lvl - 1) < 0.2 else "off the copying plateau",
             paper=PAPER[("E3", "pre L_mask")] / paper_lvl, se=pre.get("L_mask_se", 0) / ours_lvl),
        _row("E1", "pre-shift L_obs / E[X²]", pre["L_obs"] / ours_lvl,
             f"{'copies' if pre['L_obs'] / ours_lvl < COPIES else 'does not copy'} the observed entries (below "
             f"{COPIES:g} counts)", paper=PAPER[("E3", "pre L_obs")] / paper_lvl, kind="direction",
             reference=COPIES, sense="below", margin=CUT, se=pre.get("L_obs_se", 0) / ours_lvl),
        _row("E1", "final L / (p_mask · E[X²]), last 10 % of steps", final_L / (p_mask * ours_lvl),
             "the paper's final L over its copying model's L (paper: 50 000 steps)",
             paper=PAPER[("E1", "final L (W)")] / (0.3 * paper_lvl), se=final_L_se / (p_mask * ours_lvl)),
        _row("E1", "drop step / training steps", frac,
             (f"drop at step {drop:,} of {steps:,}" if drop else f"no drop in {steps:,} steps")
             + "; a profile's length is its own choice, so this fraction says when the drop came in this run, "
               "not a property of the model", paper=PAPER[("E1", "drop step")] / paper_steps, spread=spread),
    ]


def copying_readings(e2: pd.DataFrame, e3: pd.DataFrame, e6: pd.DataFrame, rank: int) -> tuple[dict, list[dict]]:
    """02_copying: E2 (every row over its own kind's E[X²]: direction, below COPIES), E3 at
    the pre-shift checkpoint (ablated / unablated L_mask and L_obs, ratio rule, both
    readings), E6 (pre with post's QKV: L_mask / E[X²] a number, L_obs over the pre model's a
    ratio). glue: e3_match, the sentence naming the reading that matches."""
    from ..core.paper import PAPER, PAPER_E2

    levels = copy_levels(rank)
    rows = []
    for r in e2.to_dict("records"):
        ours_lvl, paper_lvl = levels[r["matrices"]]
        paper = PAPER_E2[(r["matrices"], None if r["token"] == "MASK" else float(r["token"]))]
        for q, i in (("L'_mask", 0), ("L_obs", 1)):
            rows.append(_row("E2", f"{r['matrices']}, {r['token']}: {q} / E[X²]", r[q] / ours_lvl,
                             ("outputs the token's value" if q == "L'_mask" else "copies the observed entries")
                             if r[q] / ours_lvl < COPIES else ("does not output the token's value" if q == "L'_mask"
                                                               else "does not copy the observed entries"),
                             paper=paper[i] / paper_lvl, kind="direction", reference=COPIES, sense="below",
                             margin=CUT, se=r[f"{q}_se"] / ours_lvl))
    none = {"ablated": "none", "reading": "—"}
    verdicts = []
    for mode in ("uniform", "batch_mean"):
        for q in ("L_mask", "L_obs"):
            ours, se = _ratio(e3, q, {"ablated": "all heads", "reading": mode}, none)
            paper = PAPER[("E3", f"pre ablated {q}")] / PAPER[("E3", f"pre {q}")]
            rows.append(_row("E3", f"pre, every head ablated, {READING_NAMES[mode]}: ablated / unablated {q}", ours,
                             f"{ours:.3g} ± {se:.2g} (paper {paper:.3g}: no effect)", paper=paper, kind="ratio", se=se))
            if q == "L_mask":
                verdicts.append(number_or_ratio(rows[-1]))
    level = levels["low-rank"][0]
    sw = {q: _val(e6, q, model="pre with post's QKV") for q in ("L_mask", "L_obs")}
    rows.append(_row("E6", "pre with post's QKV: L_mask / E[X²]", sw["L_mask"][0] / level,
                     "does not complete" if sw["L_mask"][0] / level > COMPLETES else "completes in part",
                     paper=PAPER[("E6", "post-QKV into pre L_mask")] / levels["low-rank"][1], se=sw["L_mask"][1] / level))
    from .experiments import ratio_se
    base = _val(e3, "L_obs", **none)  # the same matrices (same size and seed)
    ours, se = sw["L_obs"][0] / base[0], ratio_se(*sw["L_obs"], *base)
    rows.append(_row("E6", "pre with post's QKV / pre: L_obs", ours, "how much the switch disturbs copying",
                     paper=PAPER[("E6", "post-QKV into pre L_obs")] / PAPER[("E3", "pre L_obs")], kind="ratio", se=se))
    glue = {"e3_match": _which_match(verdicts, "the paper's ratio of ablated to unablated L_mask (ratio rule)")}
    return glue, rows


def number_or_ratio(row: dict) -> str:
    """The verdict `scorecard.record` will give `row` (without writing it)."""
    from .scorecard import judge
    rule = {k: row[k] for k in ("se", "spread", "margin", "reference", "sense", "values", "order", "na") if k in row}
    return judge(row.get("kind", "number"), paper=row.get("paper"), ours=row.get("ours"), **rule)


def heads_readings(abl: pd.DataFrame, e67: pd.DataFrame, perm: pd.DataFrame, e8: pd.DataFrame, groups: dict,
                   scores: pd.DataFrame, pre_scores: pd.DataFrame | None, lone: float, lone_chance: float,
                   probes: pd.DataFrame, rank: int, layers: int) -> tuple[dict, list[dict]]:
    """03_heads at the post-shift checkpoint. abl: `ablation_table` with "all heads" and
    "<label> heads" sets; e67: `model_table` with "post", "post with pre's QKV (E6)"; perm:
    its permuted rows; e8: `patching_table`; groups: `head_groups`; scores: `head_scores`
    at post (pre_scores at the pre-shift checkpoint, if saved); lone: the E10 best head's
    mass on the lone observed entry (lone_chance: a uniform head's); probes: `probe_layers`.
    glue: e3_match, e4_text, e5_text, e8_text, e9_text, e10_text, e11_text, e11_layer."""
    from .experiments import lookup, ratio_se
    from ..analyses.heads import LABELS
    from ..core.paper import PAPER

    level, paper_level = copy_levels(rank)["low-rank"]
    none = {"ablated": "none", "reading": "—"}
    rows, glue = [], {}
    un = _val(abl, "L_mask", **none)
    rows.append(_row("E3", "post L_mask / E[X²]", un[0] / level, "completes" if un[0] / level < COMPLETES else
                     "does not complete", paper=PAPER[("E3", "post L_mask")] / paper_level, se=un[1] / level))
    ob = _val(abl, "L_obs", **none)
    rows.append(_row("E3", "post L_obs / E[X²]", ob[0] / level, "how precisely the observed entries come back",
                     paper=PAPER[("E3", "post L_obs")] / paper_level, se=ob[1] / level))
    verdicts = []
    for mode in ("uniform", "batch_mean"):
        a = _val(abl, "L_mask", ablated="all heads", reading=mode)
        rows.append(_row("E3", f"post, every head ablated, {READING_NAMES[mode]}: L_mask / E[X²]", a[0] / level,
                         "back at the copying level" if abs(a[0] / level - 1) < 0.2 else
                         ("well below the copying level" if a[0] < level else "above the copying level"),
                         paper=PAPER[("E3", "post ablated L_mask")] / paper_level, se=a[1] / level))
        verdicts.append(number_or_ratio(rows[-1]))
        r, se = _ratio(abl, "L_obs", {"ablated": "all heads", "reading": mode}, none)
        rows.append(_row("E3", f"post, every head ablated, {READING_NAMES[mode]}: ablated / unablated L_obs", r,
                         f"{r:.3g} ± {se:.2g}", paper=PAPER[("E3", "post ablated L_obs")] / PAPER[("E3", "post L_obs")],
                         kind="ratio", se=se))
    glue["e3_match"] = _which_match(verdicts, "the paper's ablated L_mask / E[X²] (number rule)")

    # E4: our 'other' heads in place of the authors' five; the paper: no significant effect (its ratio 1.10)
    n_other = len(groups.get("other", []))
    e4 = []
    for mode in ("uniform", "batch_mean"):
        for q in ("L_mask", "L_obs"):
            r, se = _ratio(abl, q, {"ablated": "other heads", "reading": mode}, none) if n_other else (None, None)
            rows.append(_row("E4", f"'other' heads ablated, {READING_NAMES[mode]}: ablated / unablated {q}", r,
                             f"our {n_other} 'other' heads" + ("" if r is None else f"; {r:.3g} ± {se:.2g}"),
                             paper=PAPER[("E4", f"ablated {q}")] / PAPER[("E4", q)], kind="ratio", se=se,
                             na=None if n_other else "no head of this run is labelled 'other'"))
            if q == "L_mask" and n_other:
                e4.append((mode, r, number_or_ratio(rows[-1])))
    paper_e4 = PAPER[("E4", "ablated L_mask")] / PAPER[("E4", "L_mask")]
    glue["e4_text"] = ("no head of this run is labelled 'other', so there is nothing to ablate (n/a)" if not e4 else
                       f"ablating our {n_other} 'other' heads multiplies L_mask by "
                       + " and ".join(f"{r:.3g} under the {SHORT[m]} reading" for m, r, _ in e4)
                       + f", against the paper's {paper_e4:.2f} for its five heads (\"no significant effect\"): "
                       + ("the same, by the ratio rule" if all(v == "matches" for *_, v in e4) else
                          "a different result (" + "; ".join(f"{SHORT[m]}: {v}" for m, _, v in e4) + ", ratio rule)"))

    # E5: every group hurts (the paper; its numbers are lost): ablated / unablated L_mask above 1
    parts = []
    for lab in [l for l in LABELS if l != "other"]:
        said = []
        for mode in ("uniform", "batch_mean"):
            has = bool(groups.get(lab))
            r, se = _ratio(abl, "L_mask", {"ablated": f"{lab} heads", "reading": mode}, none) if has else (None, None)
            rows.append(_row("E5", f"{lab} heads ablated, {READING_NAMES[mode]}: ablated / unablated L_mask", r,
                             f"{len(groups.get(lab, []))} heads" + ("" if r is None else f"; {r:.3g} ± {se:.2g}"),
                             kind="direction", reference=1.0, sense="above", se=se,
                             na=None if has else f"no head of this run is labelled '{lab}'"))
            if has:
                said.append((mode, r))
        if said:
            parts.append(f"{lab} heads: " + ", ".join(f"{r:.3g}× ({m.replace('_', '-')})" for m, r in said))
    glue["e5_text"] = (
        "the two readings test different claims. The uniform reading replaces a head's whole pattern, its fixed "
        "positional part included, so it tests whether the group's attention pattern matters at all. The batch "
        "mean keeps what every input shares: a head that always attends along the query's row or column has about "
        "the same map on every input, so its batch mean is that map and ablating it changes little; this reading "
        "tests only the input-dependent part of the attention. L_mask, ablated over unablated: "
        + ("; ".join(parts) if parts else "every group of our labels is empty in this run"))

    # E6, E7
    post = {"model": "post"}
    r, se = _ratio(e67, "L_obs", {"model": "post with pre's QKV (E6)"}, post)
    rows.append(_row("E6", "post with pre's QKV / post: L_obs", r, f"{r:.3g} ± {se:.2g}",
                     paper=PAPER[("E6", "pre-QKV into post L_obs")] / PAPER[("E3", "post L_obs")], kind="ratio", se=se))
    pm_ = perm["L_mask"].mean()
    pm_se = float(np.hypot(perm["L_mask"].std(ddof=1) / np.sqrt(len(perm)) if len(perm) > 1 else 0,
                           perm["L_mask_se"].mean()))
    rows.append(_row("E7", f"positions permuted (mean of {len(perm)}): L_mask / E[X²]", pm_ / level,
                     f"{'above' if pm_ > level else 'below'} the copying level; permutations range "
                     f"{perm.L_mask.min() / level:.3g} to {perm.L_mask.max() / level:.3g}",
                     paper=PAPER[("E7", "L_mask")] / paper_level, se=pm_se / level))
    po = _val(e67, "L_obs", **post)
    po_obs, po_obs_se = perm["L_obs"].mean(), float(perm["L_obs_se"].mean())
    rows.append(_row("E7", f"positions permuted / unpermuted: L_obs", po_obs / po[0],
                     "how much the permutation disturbs copying", paper=PAPER[("E7", "L_obs")] / PAPER[("E3", "post L_obs")],
                     kind="ratio", se=ratio_se(po_obs, po_obs_se, *po)))

    # E8: the last layer is the informative reading; every layer patched cannot fail
    x_last, nx_last = (lookup(e8, c, patched="last layer") for c in ("masked_vs_X", "masked_vs_negX"))
    x_all = lookup(e8, "masked_vs_X", patched="all layers")
    rows.append(_row("E8", "last layer patched: masked MSE to X / E[X²]", x_last / level,
                     "the patched run outputs X" if x_last < COPIES * level else "the patched run does not output X",
                     paper=PAPER[("E8", "masked MSE to X")] / paper_level))
    rows.append(_row("E8", "last layer patched: masked MSE to −X / E[X²]", nx_last / level,
                     "4 means an output of X (E[(X − (−X))²] = 4 E[X²])",
                     paper=PAPER[("E8", "masked MSE to -X")] / paper_level))
    rows.append(_row("E8", "every layer patched: masked MSE to X / E[X²]", x_all / level,
                     f"equals the unpatched L_mask / E[X²] ({un[0] / level:.4g}) by construction",
                     paper=PAPER[("E8", "masked MSE to X")] / paper_level, kind="by construction"))
    glue["e8_text"] = (
        f"With every layer patched the masked MSE to X is {x_all:.4g}, and the unpatched L_mask on the same "
        f"matrices is {un[0]:.4g}: the same number, and it has to be. At a masked position the input is the MASK "
        "token and the position, the same for X and −X; once every layer's attention output there comes from the run "
        "on X, the masked positions' states are those of the run on X, whatever the observed entries say. This "
        "reading cannot fail, in the paper too, whose 0.014 sits next to its own unpatched L_mask "
        f"({PAPER[('E3', 'post L_mask')]} in E3, {PAPER[('E4', 'L_mask')]} in E4). The last-layer reading is the "
        f"informative one: there the masked MSE to X is {x_last:.3g} ({x_last / level:.3g} E[X²]; the paper's "
        f"reading: {PAPER[('E8', 'masked MSE to X')] / paper_level:.3g} E[X²]) and to −X {nx_last:.3g} "
        f"({nx_last / level:.3g} E[X²], where 4 means an output of exactly X)")

    # E9: row, column and self heads after the drop, no structure before it
    top = scores[["row_excess", "column_excess", "self_excess"]].max()
    last = scores[scores["layer"] == scores["layer"].max()]["self_excess"].max()
    for q, v in (("largest row excess of any head, post", top["row_excess"]),
                 ("largest column excess of any head, post", top["column_excess"]),
                 ("largest self excess of a last-layer head, post", last)):
        rows.append(_row("E9", q, float(v), f"{'a' if v >= STRUCTURED else 'no'} such head (above {STRUCTURED:g} "
                         "counts: half-way from uniform to pure)", kind="direction", reference=STRUCTURED,
                         sense="above", margin=CUT))
    pre_top = (None if pre_scores is None else
               float(pre_scores[["row_excess", "column_excess", "self_excess"]].max().max()))
    rows.append(_row("E9", "largest excess of any head, pre-shift", pre_top,
                     "no structure before the drop" if pre_top is not None and pre_top < STRUCTURED else
                     "structure before the drop", kind="direction", reference=STRUCTURED, sense="below", margin=CUT,
                     na=None if pre_scores is not None else "no pre-shift checkpoint saved"))
    glue["e9_text"] = (f"the largest row excess of any head is {top['row_excess']:.2f}, column {top['column_excess']:.2f}, "
                       f"self in the last layer {last:.2f}" + ("" if pre_top is None else
                                                               f"; before the drop the largest excess is {pre_top:.2f}"))

    # E10
    rows.append(_row("E10", "structured mask: the best head's mass on the lone observed entry", float(lone),
                     f"a uniform head: {lone_chance:.3f}; above {MOSTLY:g} counts (most of its attention)",
                     kind="direction", reference=MOSTLY, sense="above", margin=CUT))
    glue["e10_text"] = (f"the head that attends most to the lone observed entry of a masked row puts {lone:.3f} of its "
                        f"attention there (a uniform head: {lone_chance:.3f}): "
                        + ("most of it, as the paper describes" if lone > MOSTLY else
                           "more than chance but not most of it, a weaker version of what the paper describes"
                           if lone > lone_chance else "no more than chance, unlike the paper"))

    # E11: one layer for the text and the table: the lowest test MSE relative to predicting 0
    row_p = probes[(probes.target == "row") & (probes.positions == "masked")].assign(rel=lambda d: d.mse / d.mse_zero)
    best = row_p.loc[row_p["rel"].idxmin()]
    holds = best.rel < PROBED
    rows.append(_row("E11", "row probe at masked positions: best layer's test MSE / MSE of predicting 0",
                     float(best.rel), f"layer {int(best.layer)} of {layers}; explains {1 - best.rel:.0%} of the "
                     f"variance (paper: recovered, best at layers 3–4 of 12; below {PROBED:g} counts)",
                     kind="direction", reference=PROBED, sense="below", margin=CUT))
    glue["e11_layer"] = int(best.layer)
    glue["e11_text"] = (
        f"The probe for the observed row does best at layer {int(best.layer)} of {layers} (0 = the embeddings), "
        f"with a test MSE {best.rel:.2f} times that of predicting 0 (|cos| {best.abs_cos:.2f}): it explains "
        f"{1 - best.rel:.0%} of the target's variance. "
        + ("The paper's claim that a linear probe recovers the row holds here" if holds else
           "The paper's claim that a linear probe recovers the row does not hold here: the row is at most weakly, "
           "and not linearly, present in the masked positions' hidden states"))
    return glue, rows



def window_se(metrics: pd.DataFrame, step: int, window: int = 50, columns=("L", "L_obs", "L_mask")) -> dict:
    """The standard errors of the `window`-step means ending at `step` (each step's batch
    loss one draw): {"L_se": ..., ...}."""
    w = metrics[(metrics["step"] > step - window) & (metrics["step"] <= step)]
    return {f"{c}_se": float(w[c].std(ddof=1) / np.sqrt(len(w))) if len(w) > 1 else float("nan") for c in columns}
