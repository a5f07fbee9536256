"""The closing sentences of the embeddings, freezing and baselines chapters (04-06), and
their scorecard rows, computed from the chapters' numbers.

Each function returns (glue, rows): `glue` maps the names the chapter's "What we
found" paragraph glues to strings or floats; `rows` are keyword arguments for
`mclib.scorecard.record(run_dir, **row, chapter=...)`. The sentences are built here, not
typed in the chapter, so that they read right whatever the run did: with a drop or
without (the smoke profile), with the paper's result or against it.

Where the paper states a result in words only (E12-E16, E18), a row's `paper` is None
(verdict n/a) and its `reading` says whether the claim holds here.
"""
from __future__ import annotations

import pandas as pd

from .freezing import drop_text, paper_pattern
from .paper import PAPER_E15, PAPER_E17
from .scorecard import verdict

STRONG = 0.8      # |Pearson r| above this: a component "tracks" a feature
CLUSTERED = 0.25  # a silhouette above this: visible clusters
ALIGNED = 0.9     # centred alignment above this: "the final arrangement"
DIP = 0.95        # middle-row norm / mean norm below this: "a dip"
E17_LOSSES = ("L_obs", "L_mask", "L")  # the order of PAPER_E17's tuples


def _row(id, quantity, ours, reading, paper=None, scale=1.0) -> dict:
    return {"id": id, "quantity": quantity, "paper": paper, "ours": ours, "reading": reading, "scale": scale}


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
    rows = [
        _row("E12", "token-norm symmetry: corr(‖e(x)‖, ‖e(−x)‖), post", float(symmetry),
             f"{'symmetric' if symmetry > STRONG else 'not symmetric'} about 0 (paper: symmetric)"),
        _row("E12", "|r| of a token PCA component with |x|, post", float(abs_r),
             f"{'tracks' if abs_r > STRONG else 'does not track'} |x| (paper: one component does)"),
        _row("E12", "|r| of the other component with sign(x), post", float(sign_r),
             f"{'tracks' if sign_r > STRONG else 'does not track'} the sign (paper: it does); with x: {x_r:.2f}"),
        _row("E13", f"first step with centred token alignment ≥ {ALIGNED}", aligned_at,
             f"{align_text}, {align_claim} (paper: the final arrangement comes before the drop)"),
        _row("E14", "column silhouette of the position embeddings, post", float(col_post),
             f"{'columns cluster' if col_post >= CLUSTERED else 'no column clusters'} (row: {row_post:.2f}); "
             f"{cluster_claim}"),
        _row("E14", "middle-row position norm / mean position norm, post", float(mid),
             f"{'a dip' if mid < DIP else 'no dip'} in the middle row (paper: a dip at positions ~21–26)"),
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
    rows = [_row("E15", f"steps to the drop, {g} re-initialised", d,
                 f"{drop_text(d, steps)} (paper: {PAPER_E15.get(g, 'not reported')})") for g, d in drops.items()]
    return glue, rows


# --- 06: baselines (E16-E18, classical methods) --------------------------------------------

def baseline_readings(sweep: pd.DataFrame, reg: pd.DataFrame, ood: pd.DataFrame, classical: pd.DataFrame,
                      p_train: float, rank: int, n_regularised: int,
                      scale: float = 1.0) -> tuple[dict, list[dict]]:
    """The tables of `mclib.comparisons`: nuclear_sweep, regularised_table (with its BERT
    row), ood_table, classical_table (with a "BERT better on" column). scale: the
    profile's `mclib.scorecard.loss_scale`, for E17's losses."""
    at = classical.set_index("method")
    bert, nuc = at.loc["BERT"], at.loc["nuclear norm"]
    true_nuc = float(sweep.loc[sweep["method"] == "truth", "nuclear"].iloc[0])  # the same X at every p_mask
    by_p = sweep.pivot(index="p_mask", columns="method", values="L")
    below = [f"{p:g}" for p in by_p.index if by_p.loc[p, "BERT"] < by_p.loc[p, "nuclear norm"]]
    e16 = (f"At the training p_mask {p_train:g} BERT's L is {bert.L:.2e} against the solver's {nuc.L:.2e}, "
           + ("lower, as in the paper" if bert.L < nuc.L else "higher, unlike the paper")
           + "; across mask rates BERT is below the solver "
           + (f"at p_mask {', '.join(below)}" if below else "at no mask rate")
           + f". The mean nuclear norm of BERT's outputs is {bert.nuclear:.3f} against the solver's {nuc.nuclear:.3f} "
           + f"(true X: {true_nuc:.3f}): "
           + ("larger, as in the paper" if bert.nuclear > nuc.nuclear else "smaller, unlike the paper"))
    rows = [_row("E16", f"BERT L / solver L at p_mask {p_train:g}", float(bert.L / nuc.L),
                 f"BERT {'lower' if bert.L < nuc.L else 'higher'} (paper: lower)"),
            _row("E16", f"BERT ‖X̂‖_* / solver ‖U‖_* at p_mask {p_train:g}", float(bert.nuclear / nuc.nuclear),
                 f"BERT {'larger' if bert.nuclear > nuc.nuclear else 'smaller'} (paper: larger)")]

    lam_rows = reg[reg["method"] != "BERT"]
    ok = {q: [] for q in E17_LOSSES}
    obs_dev = 0.0
    for r in lam_rows.to_dict("records"):
        if r["lam"] not in PAPER_E17:
            continue
        for i, q in enumerate(E17_LOSSES):
            paper = PAPER_E17[r["lam"]][i]
            rows.append(_row("E17", f"λ = {r['lam']:g}: {q}", float(r[q]),
                             f"{r[q]:.3g} ± {r[q + '_se']:.1g} (s.e., {n_regularised} matrices)", paper=paper,
                             scale=scale))
            ok[q].append(verdict(paper, r[q], scale=scale) == "matches")  # the verdict scorecard.record gives the row
        obs_dev = max(obs_dev, abs(r["L_obs"] * scale / PAPER_E17[r["lam"]][0] - 1))
    bert_reg = reg.set_index("method").loc["BERT"]
    paper_mask = [v[1] for v in PAPER_E17.values()]
    e17 = (f"L_obs {'matches' if all(ok['L_obs']) else 'does not match'} the paper's at every λ (largest deviation "
           f"{obs_dev:.0%}): it measures how far the regulariser pulls U off the observed entries, which is set "
           f"mostly by λ. L_mask, the error on the entries that matter, is {lam_rows.L_mask.iloc[0]:.3f} at the "
           f"smallest λ and {lam_rows.L_mask.iloc[-1]:.3f} at the largest (range {lam_rows.L_mask.min():.3f}–"
           f"{lam_rows.L_mask.max():.3f}; paper {min(paper_mask):.3f}–{max(paper_mask):.3f}"
           + (f", to be compared with ours ×{scale:g}, the ratio of the two tasks' copying levels" if scale != 1 else "")
           + f"; {sum(ok['L_mask'])} of "
           f"{len(ok['L_mask'])} within the tolerance); BERT's on the same matrices is {bert_reg.L_mask:.3f}, "
           + ("below every λ" if bert_reg.L_mask < lam_rows.L_mask.min() else
              "above every λ" if bert_reg.L_mask > lam_rows.L_mask.max() else "within the range of the λ"))

    bert_ood = ood[ood["method"] == "BERT"].set_index("dist")
    uni = bert_ood.loc["uniform"]
    e18 = []
    for dist in [d for d in bert_ood.index if d != "uniform"]:
        o = bert_ood.loc[dist]
        ratio = o.L / uni.L
        e18.append(f"{dist} factors: L {o.L:.2e} ({ratio:.2f} × uniform's {uni.L:.2e}), L_mask / E[X²] "
                   f"{o.L_mask_rel:.2f} against uniform's {uni.L_mask_rel:.2f}")
        rows.append(_row("E18", f"BERT L, {dist} / uniform factors", float(ratio),
                         f"{'similar' if 0.5 <= ratio <= 2 else 'not similar'} (paper: similar); L_mask / E[X²] "
                         f"{o.L_mask_rel:.2f} vs {uni.L_mask_rel:.2f}"))

    als, soft = f"ALS, rank {rank}", f"soft-impute, rank {rank}"
    best = at["L_mask"].idxmin()
    classical_text = (f"pooled over all masked entries BERT's L_mask ({bert.L_mask:.2e}) ranks "
                      f"{int((at['L_mask'] < bert.L_mask).sum()) + 1} of {len(at)}"
                      + ("" if best == "BERT" else f", behind {best} ({at.loc[best, 'L_mask']:.2e})")
                      + f". Matrix by matrix, the median matrix's L_mask is {bert.median_L_mask:.1e} for BERT, "
                      f"{at.loc[als, 'median_L_mask']:.1e} for ALS and {at.loc[soft, 'median_L_mask']:.1e} for "
                      f"soft-impute (rounding to 0.01 alone costs about 1e-5), and BERT is better than ALS on "
                      f"{at.loc[als, 'BERT better on']:.0%} of the matrices")
    glue = {"e16": e16, "e17": e17, "e18": "; ".join(e18), "classical": classical_text}
    return glue, rows
