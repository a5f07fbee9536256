"""The closing sentences of the embeddings, freezing and baselines chapters (04-06), and
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

from .comparisons import E17_LOSSES, e17_beside_paper, pm, within_error
from ..analyses.freezing import drop_text, paper_pattern
from ..core.paper import PAPER_E15, PAPER_E17_MATRICES
from .scorecard import MARGINS, number, ratio

STRONG = 0.8      # |Pearson r| above this: a component "tracks" a feature
CLUSTERED = 0.25  # a silhouette above this: visible clusters
ALIGNED = 0.9     # centred alignment above this: "the final arrangement"
DIP = 0.95        # middle-row norm / mean norm below this: "a dip"
# A solver's number on the paper's task "matches" the paper's when the paper's value lies
# within ours ± (2 standard errors + SOLVER_RTOL of the paper's value). 10 %: about the
# sampling error of the paper's own 256-matrix L_mask (our per-matrix spread gives 8-9 %),
# which the paper does not report; two significant figures of a number, give or take one.
SOLVER_RTOL = 0.10
SE_TARGET = 0.05  # sample sizes aim at a standard error under 5 % of the value
CUT = 0.0  # the direction rule's margin for a cut-off this module defines (STRONG, ALIGNED, ...): the cut-off is the claim
E15_QUICK = 0.1   # a re-initialised run dropping within a tenth of the main run's drop step has "no plateau"
E15_ORDER = [["mlp", "token"], ["attention"], ["positional"]]  # the paper's order of the re-initialised runs' drops


def _row(id, quantity, ours, reading, paper=None, kind="number", **rule) -> dict:
    """Keyword arguments for `scorecard.record`: rule holds se, spread, margin, reference and
    sense (a direction), values and order (an ordering) or na (nothing to test)."""
    return {"id": id, "quantity": quantity, "paper": paper, "ours": ours, "reading": reading, "kind": kind, **rule}


# --- 04: embeddings (E12-E14) ------------------------------------------------------------

def embedding_readings(progress: pd.DataFrame, summary: pd.DataFrame, tracks: pd.DataFrame, symmetry: float,
                       drop: int | None, post_step: int) -> tuple[dict, list[dict]]:
    """progress: `embedding_progress` (every checkpoint); summary: `token_projections`'s
    summary, with the initialisation as step 0 if available; tracks: `component_tracks`
    of the post checkpoint's PCA plane; symmetry: `norm_symmetry` at post."""
    t = tracks.set_index("component")
    abs_c = int(t["abs_x"].idxmax())  # the component closest to |x|; the other is checked for sign(x)
    other = next(c for c in t.index if c != abs_c)
    abs_r, sign_r, x_r = t.loc[abs_c, "abs_x"], t.loc[other, "sign_x"], t.loc[other, "x"]
    tracks_text = (f"the component closest to |x| (component {abs_c}) has |r| = {abs_r:.2f} with |x|, and the other "
                   f"|r| = {sign_r:.2f} with the sign of x ({x_r:.2f} with x itself)")
    tracks_claim = ("one component tracks |x| and the other the sign, as in the paper" if abs_r > STRONG and sign_r > STRONG
                    else "not what the paper shows (" + ("no component tracks |x|" if abs_r <= STRONG else
                                                         "the second component does not track the sign") + ")")

    reached = progress.loc[progress["token_alignment"] >= ALIGNED, "step"]
    aligned_at = int(reached.iloc[0]) if len(reached) else None
    s = summary.set_index("step")
    init_align = float(s.loc[0, "alignment_centred"]) if 0 in s.index else None
    align_text = ((f"reached {ALIGNED} at step {aligned_at:,}" if aligned_at is not None else
                   f"did not reach {ALIGNED} at any saved checkpoint")
                  + ("" if init_align is None else f" (at initialisation it was {init_align:.2f})"))
    if init_align is not None and init_align >= ALIGNED:
        align_claim = "but the embeddings start that close to their final layout, so this says nothing about the drop"
    elif drop is None:
        align_claim = "with no drop to compare against"
    elif aligned_at is not None and aligned_at < drop:
        align_claim = f"before the drop at step {drop:,}, as the paper says"
    else:
        align_claim = f"not before the drop at step {drop:,}, unlike the paper"

    first, last = progress.iloc[0], progress.set_index("step").loc[post_step]
    col_post, row_post, mid = last["column_silhouette"], last["row_silhouette"], last["middle_row_norm"]
    if drop is not None and (progress["step"] < drop).any() and (progress["step"] >= drop).any():
        before, after = progress[progress["step"] < drop].iloc[-1], progress[progress["step"] >= drop].iloc[0]
        cluster_text = (f"the column silhouette was {before.column_silhouette:.2f} at step {int(before.step):,}, the "
                        f"last checkpoint before the drop, and {after.column_silhouette:.2f} at step "
                        f"{int(after.step):,}, the first after it; at the end it is {col_post:.2f} (grouped by row: "
                        f"{row_post:.2f})")
        cluster_claim = ("the columns cluster only after the drop, as in the paper"
                         if before.column_silhouette < CLUSTERED <= col_post else
                         "the columns already cluster before the drop, unlike the paper"
                         if before.column_silhouette >= CLUSTERED else
                         f"no column clusters (silhouette ≥ {CLUSTERED}) by the end of the run, unlike the paper")
    else:
        cluster_text = (f"the column silhouette went from {first.column_silhouette:.2f} at step {int(first.step):,} to "
                        f"{col_post:.2f} at step {post_step:,} (grouped by row: {row_post:.2f})")
        cluster_claim = ("whether clusters appear only after a drop cannot be tested without a drop" if drop is None
                         else "no checkpoint on both sides of the drop to compare")

    glue = {"symmetry": float(symmetry),
            "symmetry_text": "symmetric about 0" if symmetry > STRONG else "not symmetric about 0",
            "tracks_text": tracks_text, "tracks_claim": tracks_claim, "align_text": align_text,
            "align_claim": align_claim, "cluster_text": cluster_text, "cluster_claim": cluster_claim,
            "mid_norm": float(mid), "post_step": f"{post_step:,}"}
    before_drop = (progress[progress["step"] < drop].iloc[-1] if drop is not None and (progress["step"] < drop).any()
                   else None)
    no_before = ("no drop in this run" if drop is None else
                 None if before_drop is not None else "no saved checkpoint before the drop")
    early = (f"the embeddings start that close to their final layout (centred alignment {init_align:.2f} at "
             "initialisation), so reaching it says nothing about the drop"
             if init_align is not None and init_align >= ALIGNED else None)
    rows = [
        _row("E12", "token-norm symmetry: corr(‖e(x)‖, ‖e(−x)‖), post", float(symmetry),
             f"{'symmetric' if symmetry > STRONG else 'not symmetric'} about 0 (paper: symmetric)",
             kind="direction", reference=STRONG, sense="above", margin=CUT),
        _row("E12", "|r| of a token PCA component with |x|, post", float(abs_r),
             f"{'tracks' if abs_r > STRONG else 'does not track'} |x| (paper: one component does)",
             kind="direction", reference=STRONG, sense="above", margin=CUT),
        _row("E12", "|r| of the other component with sign(x), post", float(sign_r),
             f"{'tracks' if sign_r > STRONG else 'does not track'} the sign (paper: it does); with x: {x_r:.2f}",
             kind="direction", reference=STRONG, sense="above", margin=CUT),
        _row("E13", "centred token alignment with the final layout, last checkpoint before the drop",
             None if before_drop is None else float(before_drop.token_alignment),
             f"{align_text}, {align_claim} (paper: the final arrangement comes before the drop; "
             f"above {ALIGNED} counts)", kind="direction", reference=ALIGNED, sense="above", margin=CUT, na=no_before or early),
        _row("E14", "column silhouette of the position embeddings, last checkpoint before the drop",
             None if before_drop is None else float(before_drop.column_silhouette),
             f"{cluster_claim} (paper: no column clusters before the drop; below {CLUSTERED} counts)",
             kind="direction", reference=CLUSTERED, sense="below", margin=CUT, na=no_before),
        _row("E14", "column silhouette of the position embeddings, post", float(col_post),
             f"{'columns cluster' if col_post >= CLUSTERED else 'no column clusters'} (row: {row_post:.2f}); "
             f"paper: they cluster after the drop; above {CLUSTERED} counts", kind="direction", reference=CLUSTERED,
             sense="above", margin=CUT),
        _row("E14", "middle-row position norm / mean position norm, post", float(mid),
             f"{'a dip' if mid < DIP else 'no dip'} in the middle row (paper: a dip at positions ~21–26; below "
             f"{DIP} counts)", kind="direction", reference=DIP, sense="below", margin=CUT),
    ]
    return glue, rows


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


# --- 06: baselines (E16-E18, classical methods) --------------------------------------------

def _e16_same_matrices(sweep: pd.DataFrame, classical: pd.DataFrame, p_train: float) -> tuple[str, list[dict]]:
    """E16 on the profile's task: BERT and the solver on the same matrices (paired errors)."""
    at = classical.set_index("method")
    bert, nuc = at.loc["BERT"], at.loc["nuclear norm"]
    d, d_se = nuc.BERT_d_L, nuc.BERT_d_L_se
    if within_error(d, d_se):
        diff = ("within two standard errors of zero, so these matrices cannot tell the two apart (the paper: "
                "BERT lower)")
    elif d < 0:
        diff = "BERT lower by more than two standard errors, as in the paper"
    else:
        diff = "BERT higher by more than two standard errors, unlike the paper"
    share, share_se = nuc.BERT_better, nuc.BERT_better_se
    most = "lower" if share - 2 * share_se > 0.5 else "higher" if share + 2 * share_se < 0.5 else None
    pooled_says = None if within_error(d, d_se) else "lower" if d < 0 else "higher"
    if most == pooled_says:
        per_matrix = "the same story as the pooled means"
    else:
        per_matrix = (f"{'on most matrices BERT is ' + most if most else 'neither is better on most matrices'}, "
                      "another story than the pooled means tell, which the matrices with the largest errors dominate")
    true_nuc = float(sweep.loc[sweep["method"] == "truth", "nuclear"].iloc[0])  # the same X at every p_mask
    b = sweep[sweep["method"] == "BERT"].set_index("p_mask")
    groups = {"below": [], "above": [], "within error of": []}
    for p, r in b.iterrows():
        key = "within error of" if within_error(r.d_L, r.d_L_se) else "below" if r.d_L < 0 else "above"
        groups[key].append(f"{p:g}")
    across = "; ".join(f"{k} it at p_mask {', '.join(v)}" for k, v in groups.items() if v)
    text = (f"At the training p_mask {p_train:g}, on the same matrices, BERT's L is {pm(bert.L, bert.L_se)} and the "
            f"solver's {pm(nuc.L, nuc.L_se)}; the paired difference BERT − solver is {pm(d, d_se)}: {diff}. "
            f"Matrix by matrix, the median matrix's L_mask is {pm(bert.median_L_mask, bert.median_L_mask_se)} for "
            f"BERT and {pm(nuc.median_L_mask, nuc.median_L_mask_se)} for the solver, and BERT's own L_mask is the "
            f"lower on {nuc.BERT_better:.0%} ± {nuc.BERT_better_se:.0%} of the matrices: {per_matrix}. "
            f"Across mask rates (paired differences, two standard errors) BERT is "
            f"{across}. The mean nuclear norm of BERT's outputs is {pm(bert.nuclear, bert.nuclear_se)} against the "
            f"solver's {pm(nuc.nuclear, nuc.nuclear_se)} (true X: {true_nuc:.3f}): "
            + ("larger, as in the paper" if bert.nuclear > nuc.nuclear else "smaller, unlike the paper"))
    rows = [_row("E16", f"BERT L / solver L at p_mask {p_train:g} (profile's task, same matrices)",
                 float(bert.L / nuc.L), kind="direction", reference=1.0, sense="below", se=float(d_se / nuc.L),
                 reading=
                 f"BERT − solver {pm(d, d_se)} (paired s.e.): {diff.split(',')[0]}; BERT's per-matrix L_mask lower "
                 f"on {nuc.BERT_better:.0%} of the matrices"),
            _row("E16", f"BERT ‖X̂‖_* / solver ‖U‖_* at p_mask {p_train:g} (profile's task, same matrices)",
                 float(bert.nuclear / nuc.nuclear), kind="direction", reference=1.0, sense="above",
                 se=float(bert.nuclear / nuc.nuclear * np.hypot(bert.nuclear_se / bert.nuclear, nuc.nuclear_se / nuc.nuclear)),
                 reading=
                 f"BERT {'larger' if bert.nuclear > nuc.nuclear else 'smaller'} (paper: larger); "
                 f"{pm(bert.nuclear, bert.nuclear_se)} vs {pm(nuc.nuclear, nuc.nuclear_se)}")]
    return text, rows


def _e16_solver(solver_sweep: pd.DataFrame, task) -> str:
    """E16's solver curve on the paper's task (no model): L ± s.e. across p_mask."""
    s = solver_sweep[solver_sweep["method"] == "nuclear norm"].set_index("p_mask").sort_index()
    lo, hi = s.iloc[0], s.iloc[-1]
    noisy = [f"{p:g}" for p, r in s.iterrows() if r.L_se > SE_TARGET * r.L]
    text = (f"On the paper's task the solver's L rises from {pm(lo.L, lo.L_se)} at p_mask {s.index[0]:g} to "
            f"{pm(hi.L, hi.L_se)} at {s.index[-1]:g}")
    if task.p_mask in s.index:
        at = s.loc[task.p_mask]
        text += f"; at the paper's p_mask {task.p_mask:g} it is {pm(at.L, at.L_se)} (L_mask {pm(at.L_mask, at.L_mask_se)})"
    if not noisy:
        return text + f". The standard error is under {SE_TARGET:.0%} of the value at every p_mask"
    text += f". The standard error is above {SE_TARGET:.0%} of the value at p_mask {', '.join(noisy)}"
    first = s.loc[[p for p in s.index if f"{p:g}" in noisy][0]]
    if first.median_L_mask < first.L_mask / 3:  # heavy-tailed per-matrix errors: a few matrices make the mean
        text += (f"; at {noisy[0]} the median matrix's L_mask is {pm(first.median_L_mask, first.median_L_mask_se)} "
                 f"against the pooled {pm(first.L_mask, first.L_mask_se)}: a few badly completed matrices make "
                 "most of the mean")
    return text


def _z_range(z: pd.Series) -> str:
    """'1.2 to 1.4 standard errors below' (or above, or 'between −0.5 and +0.8 standard errors from')."""
    if (z < 0).all() or (z > 0).all():
        a = z.abs()
        return f"{a.min():.1f} to {a.max():.1f} standard errors {'below' if (z < 0).all() else 'above'}"
    return f"between {z.min():+.1f} and {z.max():+.1f} standard errors from"


def _e17(reg: pd.DataFrame, n_regularised: int) -> tuple[str, list[dict]]:
    """E17 on the paper's task against the paper's table: verdict rows (rule: SOLVER_RTOL)."""
    beside = e17_beside_paper(reg)
    rows, ok = [], {q: [] for q in E17_LOSSES}
    for r in beside.to_dict("records"):
        v = number(r["paper"], r["ours"], se=r["se"], margin=SOLVER_RTOL)  # what scorecard.record gives the row
        ok[r["quantity"]].append(v == "matches")
        rows.append({**_row("E17", f"λ = {r['lam']:g}: {r['quantity']} (paper's task)", float(r["ours"]),
                            f"{pm(r['ours'], r['se'])} (s.e. over {n_regularised} matrices of the paper's task); "
                            f"{abs(r['z']):.1f} s.e. {'below' if r['z'] < 0 else 'above'} the paper's value "
                            f"({r['rel_dev']:+.1%} of it)",
                            paper=r["paper"]),
                     "se": float(r["se"]), "margin": SOLVER_RTOL})
    obs, mask = (beside[beside["quantity"] == q] for q in ("L_obs", "L_mask"))
    own_se = mask["se"] * (n_regularised / PAPER_E17_MATRICES) ** 0.5 / mask["ours"]  # the paper's sample's error
    text = (f"L_obs {'matches' if all(ok['L_obs']) else 'does not match'} the paper's at every λ "
            f"({sum(ok['L_obs'])} of {len(ok['L_obs'])} within the rule; deviations {obs.rel_dev.min():+.1%} to "
            f"{obs.rel_dev.max():+.1%}): it measures how far the regulariser pulls U off the observed entries, "
            f"which λ sets. L_mask, the error on the entries that matter, is {pm(mask.ours.iloc[0], mask.se.iloc[0])} "
            f"at the smallest λ and {pm(mask.ours.iloc[-1], mask.se.iloc[-1])} at the largest, against the paper's "
            f"{mask.paper.iloc[0]:.4f} and {mask.paper.iloc[-1]:.4f}: ours lie {_z_range(mask.z)} the paper's "
            f"({mask.rel_dev.min():+.0%} to {mask.rel_dev.max():+.0%}), {sum(ok['L_mask'])} of {len(ok['L_mask'])} "
            f"within the rule. The paper's own means, over "
            f"{PAPER_E17_MATRICES} matrices, carry a sampling error of about {own_se.mean():.0%} (our per-matrix spread "
            f"at their sample size), and every λ sees the same matrices, so the five L_mask move together")
    if (reg["method"] == "BERT").any():  # only when BERT was trained on these matrices' task
        bert = reg.set_index("method").loc["BERT"]
        lam = reg[reg["method"] != "BERT"]
        text += (f"; BERT's L_mask on the same matrices is {pm(bert.L_mask, bert.L_mask_se)}, "
                 + ("below every λ" if bert.L_mask < lam.L_mask.min() else
                    "above every λ" if bert.L_mask > lam.L_mask.max() else "within the range of the λ"))
    return text, rows


def _solvers(solvers: pd.DataFrame, task) -> str:
    """The classical methods on the paper's task (no model)."""
    at = solvers.set_index("method")
    return (f"On the paper's task at p_mask {task.p_mask:g} the pooled L_mask is "
            + ", ".join(f"{pm(r.L_mask, r.L_mask_se)} for {m}" for m, r in at.iterrows())
            + "; the median matrix's L_mask is "
            + ", ".join(f"{pm(r.median_L_mask, r.median_L_mask_se)} for {m}" for m, r in at.iterrows()))


def baseline_readings(sweep: pd.DataFrame, reg: pd.DataFrame, ood: pd.DataFrame, classical: pd.DataFrame,
                      p_train: float, rank: int, n_regularised: int, solver_sweep: pd.DataFrame,
                      solvers: pd.DataFrame, task) -> tuple[dict, list[dict]]:
    """The tables of `mclib.book.comparisons`. On the profile's task, with BERT on the same
    matrices: sweep (nuclear_sweep), ood (ood_table), classical (classical_table). On the
    paper's task `task` (`mclib.core.paper.task()`), solvers alone, whatever the profile:
    reg (regularised_table, E17), solver_sweep (nuclear_sweep without a model),
    solvers (classical_table without a model). No number is rescaled across tasks.

    E17's rows compare a number with the paper's on the same task: the verdict is
    "matches" when |ours − paper| ≤ 2·s.e. + SOLVER_RTOL·|paper| (`scorecard.number` with
    se = our standard error over matrices), else "differs"."""
    e16, rows = _e16_same_matrices(sweep, classical, p_train)
    e17, e17_rows = _e17(reg, n_regularised)
    rows += e17_rows
    bert_ood = ood[ood["method"] == "BERT"].set_index("dist")
    uni = bert_ood.loc["uniform"]
    e18 = []
    for dist in [d for d in bert_ood.index if d != "uniform"]:
        o = bert_ood.loc[dist]
        rel = o.L_mask_rel / uni.L_mask_rel  # L_mask / E[X²] of this distribution over uniform's: scale-free
        rel_se = rel * np.hypot(o.L_mask_se / o.L_mask, uni.L_mask_se / uni.L_mask)
        v = ratio(1.0, rel, se=rel_se)  # the paper: "close to" uniform's, i.e. a ratio of 1 (scorecard's ratio rule)
        said = {"matches": "similar, as the paper says", "differs": "not similar, unlike the paper"}[v]
        e18.append(f"{dist} factors: L_mask / E[X²] {pm(o.L_mask_rel, o.L_mask_rel * o.L_mask_se / o.L_mask)} against "
                   f"uniform's {pm(uni.L_mask_rel, uni.L_mask_rel * uni.L_mask_se / uni.L_mask)}, a ratio of "
                   f"{pm(rel, rel_se)}: {said} (the ratio rule: within a factor {1 + MARGINS['ratio']:g} of 1, "
                   "widened by two standard errors)")
        rows.append(_row("E18", f"BERT (L_mask / E[X²]), {dist} over uniform factors", float(rel),
                         f"{said}; L_mask / E[X²] {o.L_mask_rel:.3f} vs {uni.L_mask_rel:.3f}",
                         paper=1.0, kind="ratio", se=float(rel_se)))

    at = classical.set_index("method")
    bert = at.loc["BERT"]
    als, soft = f"ALS, rank {rank}", f"soft-impute, rank {rank}"
    best = at["L_mask"].idxmin()
    a = at.loc[als]
    classical_text = (f"on the profile's task, pooled over all masked entries, BERT's L_mask "
                      f"({pm(bert.L_mask, bert.L_mask_se)}) ranks {int((at['L_mask'] < bert.L_mask).sum()) + 1} of "
                      f"{len(at)}" + ("" if best == "BERT" else f", behind {best} ({pm(at.loc[best, 'L_mask'], at.loc[best, 'L_mask_se'])})")
                      + f"; BERT − ALS on the same matrices is {pm(a.BERT_d_L_mask, a.BERT_d_L_mask_se)}"
                      + (" (within error)" if within_error(a.BERT_d_L_mask, a.BERT_d_L_mask_se) else "")
                      + f". Matrix by matrix, the median matrix's L_mask is {pm(bert.median_L_mask, bert.median_L_mask_se)} "
                      f"for BERT, {pm(a.median_L_mask, a.median_L_mask_se)} for ALS and "
                      f"{pm(at.loc[soft, 'median_L_mask'], at.loc[soft, 'median_L_mask_se'])} for soft-impute (rounding "
                      f"to 0.01 alone costs about 1e-5), and BERT is better than ALS on {a.BERT_better:.0%} ± "
                      f"{a.BERT_better_se:.0%} of the matrices")
    glue = {"e16": e16, "e16_solver": _e16_solver(solver_sweep, task), "e17": e17, "e18": "; ".join(e18),
            "classical": classical_text, "solvers": _solvers(solvers, task)}
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
