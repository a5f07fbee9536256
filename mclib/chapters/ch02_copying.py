"""Chapter 02, copying (book/02_copying.ipynb): what the model does on the plateau.

The paper (§3.1) checks at its pre-shift checkpoint that the model copies: E2 (a value's token
in place of MASK comes back as that value), E3 (ablating every head changes nothing), E6 (the
final model's Q, K, V weights do not make it complete). In page order: settings_table,
pre_losses_and_figures, e2_table + e2_shown, e3_e6_tables + e3_e6_shown, readings (scale-free
rows and their sentences), scorecard_table, closing_glue.

`ch` is the chapter's `Chapter`; glue is {name: value}; figures come closed (glued, not shown twice).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pandas as pd
import torch

from ..analyses.evaluate import pooled, predict, sample_eval_batch
from ..analyses.interventions import l_prime_mask, switch_qkv_hooks
from ..analyses.loss_tables import (
    UNABLATED,
    ablation_table,
    all_heads,
    loss_row,
    model_table,
    ratio_and_se,
    ratio_se,
    value_and_se,
)
from ..book.plots_base import closed
from ..book.scorecard import claim as _row
from ..book.scorecard import recorded_table
from ..book.scorecard_rules import copy_levels, row_verdict
from ..book.scorecard_stage import PAPER_PRE
from ..book.scorecard_tables import task_departures, verdict_counts
from ..book.spec import ChapterSpec
from ..core.checkpoints import saved_steps
from ..core.config import DataConfig
from ..core.data import round2
from ..core.metrics import COPIES, DROP_FRACTION, DROP_WINDOW, window_mean
from ..core.paper import PAPER, PAPER_E2
from .copying_rejudged import one_checkpoint, pre_na
from .copying_text import (
    copy_text,
    e2_cause,
    e2_ratio_text,
    e2_swing,
    e2_text,
    e3_text,
    e6_text,
    pre_l_obs_text,
)
from .heads_plots import loss_bars, mask_value_curve, prediction_scatter
from .loss_tables_shown import PAPER_COLUMNS, READING_NAMES, loss_figure, loss_styler, matching_reading_text

CHAPTER = "02_copying"

E2_FILLS = (None, 0.44, -0.24)  # MASK, then the two values of Table 1
E2_MATRICES = {"low-rank": None, "random": "random"}  # label -> dist (None: the profile's, of its rank)
# E2 is also read at up to E2_NEIGHBOURS saved checkpoints each side of pre, within E2_WINDOW times the
# drop step on the plateau: copying swings several-fold between saved steps, far beyond the standard
# error over matrices.
E2_NEIGHBOURS = 2
E2_WINDOW = 0.1


def at_paper_pre(ch):
    """`ch` with its pre-shift model at the paper's pre step (PAPER_PRE) on the paper's task, where
    the run saved that checkpoint, so E2, E3 and E6 compare like with like; else `ch` unchanged."""
    if task_departures(ch.cfg) or ch.steps.pre == PAPER_PRE or PAPER_PRE not in saved_steps(ch.run_dir):
        return ch
    return replace(ch, steps=replace(ch.steps, pre=PAPER_PRE), _models={})


# The glued sentences that state a row's verdict, by the experiment they speak for: the paper
# part sets today's verdict beside a lease's words where its rows were re-judged (`mclib.lease.part.restate`).
SPEAKS_FOR = {"e2_ratio_text": "E2", "e3_match": "E3", "e6_text": "E6"}


def rejudged(row: dict, recorded) -> tuple[dict, list[str]]:
    """(row, why): a row a GPU lease recorded, judged by today's rules (`mclib.lease.reference.rejudge`):
    E2, E3, E6 n/a by `pre_na` at the glued `pre_step2` (else the run's pre step); E2 by the ratio
    rule, over the laptop's spread when read at one checkpoint (`one_checkpoint`)."""
    if row.get("chapter") != CHAPTER or row["id"] not in ("E2", "E3", "E6"):
        return row, []
    new = dict(row)
    if row["id"] == "E2":
        new["kind"] = "ratio"
    glued = (recorded.glued(CHAPTER, "pre_step2") or "").replace(",", "")
    pre = int(glued) if glued.isdigit() else None if recorded.steps is None else recorded.steps.pre
    na = "no pre-shift checkpoint could be placed in the run" if pre is None else pre_na(pre, True)
    if na:
        new["na"] = na
        return new, []
    if row["id"] == "E2" and row.get("span") is None:
        return one_checkpoint(new, pre, recorded.laptop)
    return new, []


def settings_table(ch):
    """The run, the pre-shift checkpoint and the sample sizes, as a styled table."""
    A = ch.cfg.analysis
    return (
        pd.DataFrame(
            {
                "setting": ["run", "pre-shift checkpoint", "evaluation"],
                "value": [
                    ch.where,
                    f"step {ch.steps.pre:,} of {ch.cfg.train.steps:,} ({ch.relative_to_drop(ch.steps.pre)})",
                    f"fresh matrices, seed {A.seed}: {A.copy_matrices} for E2, {A.headline_matrices:,} for "
                    f"the headline, E3 and E6, {A.eval_matrices} for the scatter",
                ],
            }
        )
        .style.hide(axis="index")
        .set_caption("What this chapter looks at.")
    )


def pre_losses_and_figures(ch) -> tuple[dict[str, float], dict]:
    """(base, figures) of the pre-shift model: its losses (L, L_obs, L_mask, mask_value, each with
    `_se`, on `analysis.headline_matrices` matrices) plus abs_x, mean |X| at masked entries (a
    completing model's mask value); figures fig_copy_scatter and fig_mask_value."""
    A = ch.cfg.analysis
    head = sample_eval_batch(ch.cfg.data, A.headline_matrices, A.seed)  # the headline losses, with errors
    base = loss_row(predict(ch.pre, head), head)
    base["abs_x"] = head.x[head.mask].abs().mean().item()
    batch = sample_eval_batch(ch.cfg.data, A.eval_matrices, A.seed)  # the scatter: fewer points
    pred = predict(ch.pre, batch)
    figures = {
        "fig_copy_scatter": closed(
            prediction_scatter(
                batch.x, pred, batch.mask, title=f"Pre-shift checkpoint (step {ch.steps.pre:,})"
            )
        ),
        "fig_mask_value": closed(
            mask_value_curve(
                ch.metrics,
                base["abs_x"],
                ch.drop,
                mark={"pre-shift checkpoint": ch.steps.pre},
                title=f"Mask value during training: profile {ch.cfg.name}, seed {ch.cfg.seed}",
            )
        ),
    }
    return base, figures


# --- E2: a value's token in place of MASK ------------------------------------------------


def fill_label(value: float | None) -> str:
    return "MASK" if value is None else f"{value:g}"


def copy_check(
    model,
    data: DataConfig,
    n_matrices: int,
    seed: int,
    fills: Sequence[float | None] = E2_FILLS,
    *,
    matrices: Mapping[str, str | None] = E2_MATRICES,
) -> pd.DataFrame:
    """E2: every masked token replaced by the token of m (None: MASK, m = 0). One row per
    (matrices, m): L'_mask (mean (X̂ − m)² over masked entries) ± s.e., L_obs, L_mask, mask_value;
    the same matrices and masks for every m of one kind."""
    rows = []
    for label, dist in matrices.items():
        for value in fills:
            batch = sample_eval_batch(data, n_matrices, seed, dist=dist, fill_value=value)
            pred = predict(model, batch)
            m = 0.0 if value is None else float(round2(torch.tensor(float(value))))
            sq = ((pred.float() - m) ** 2).cpu().numpy()
            rows.append(
                {
                    "matrices": label,
                    "token": fill_label(value),
                    "L'_mask": l_prime_mask(pred, batch, value),
                    "L'_mask_se": pooled(sq, batch.mask.cpu().numpy().astype(bool))[1],
                    **loss_row(pred, batch),
                }
            )
    return pd.DataFrame(rows)


def paper_e2(matrices: str, token: str) -> tuple[float, float]:
    """The paper's (L'_mask, L_obs) of E2 for one row of `copy_check`."""
    return PAPER_E2[(matrices, None if token == "MASK" else float(token))]


def neighbour_steps(steps, k: int = E2_NEIGHBOURS, window: float = E2_WINDOW) -> list[int]:
    """The pre step and up to `k` readable saved steps each side, within `window` × the drop step
    and on the plateau, in order; pre alone without a drop. `steps`: a `CheckpointSteps`."""
    if steps.drop is None:
        return [steps.pre]
    end = steps.left_plateau or min(steps.transition, default=steps.drop)
    near = [
        s
        for s in sorted(set(steps.saved) - set(steps.skipped) | {steps.pre})
        if s == steps.pre or (s <= end and abs(s - steps.pre) <= window * steps.drop)
    ]
    i = near.index(steps.pre)
    return near[max(0, i - k) : i + k + 1]


def e2_table(ch) -> pd.DataFrame:
    """`copy_check` at pre with the paper's columns, and across `neighbour_steps` (one checkpoint's
    copying swings several-fold between saved steps): per L'_mask and L_obs, `*_mean`, `*_spread`
    (NaN with one step), `*_low`, `*_high`, and `spread_steps`."""
    A = ch.cfg.analysis
    steps = neighbour_steps(ch.steps)
    each = {s: copy_check(ch.model(s), ch.cfg.data, A.copy_matrices, A.seed) for s in steps}
    e2 = each[ch.steps.pre].copy()
    for q in ("L'_mask", "L_obs"):
        values = pd.concat([t[q] for t in each.values()], axis=1)
        e2[f"{q}_mean"] = values.mean(axis=1)
        e2[f"{q}_spread"] = values.std(axis=1, ddof=1) if len(steps) > 1 else float("nan")
        e2[f"{q}_low"], e2[f"{q}_high"] = values.min(axis=1), values.max(axis=1)
    e2["spread_steps"] = f"{steps[0]:,}-{steps[-1]:,}" if len(steps) > 1 else f"{steps[0]:,}"
    paper = [paper_e2(m, t) for m, t in zip(e2.matrices, e2.token)]
    e2["paper L'_mask"], e2["paper L_obs"] = [p[0] for p in paper], [p[1] for p in paper]
    return e2


def e2_shown(ch, e2: pd.DataFrame) -> tuple[object, dict]:
    """E2's table (styled) and glue: fig_e2, copy_level_e2."""
    cols = ["matrices", "token", "L'_mask", "paper L'_mask", "L_obs", "paper L_obs", "L_mask", "mask_value"]
    numbers, around = cols[2:], ""
    if (
        not e2[["L'_mask_spread", "L_obs_spread"]].isna().all(axis=None)
    ):  # the range the scorecard reads, beside pre's own values
        e2 = e2.assign(
            **{
                f"{q} range": [f"{lo:.2e} – {hi:.2e}" for lo, hi in zip(e2[f"{q}_low"], e2[f"{q}_high"])]
                for q in ("L'_mask", "L_obs")
            }
        )
        cols = cols[:3] + ["L'_mask range"] + cols[3:5] + ["L_obs range"] + cols[5:]
        around = (
            f" The range columns give the lowest and highest reading over the checkpoints of steps "
            f"{e2['spread_steps'].iloc[0]}: the scorecard's verdict sets that range (each end ± two standard "
            "errors) against the paper's value, since one checkpoint's copying swings from one saved step to "
            "the next."
        )
    table = loss_styler(
        e2,
        cols,
        numbers,
        f"E2 at the pre-shift checkpoint (step {ch.steps.pre:,}), "
        f"{ch.cfg.analysis.copy_matrices} fresh matrices per kind; paper: workshop version, step 4 000."
        + around
        + PAPER_COLUMNS,
    )
    levels = copy_levels(ch.cfg.data.rank)  # each kind of matrix over its own E[X²], ours and the paper's
    fig = loss_bars(
        [f"{m}, {t}" for m, t in zip(e2.matrices, e2.token)],
        {"L'_mask": e2["L'_mask"], "L_obs": e2["L_obs"]},
        errors={"L'_mask": e2["L'_mask_se"], "L_obs": e2["L_obs_se"]},
        paper={"L'_mask": e2["paper L'_mask"], "L_obs": e2["paper L_obs"]},
        title=f"E2: masked tokens replaced, pre-shift checkpoint (step {ch.steps.pre:,})",
        level=[levels[m][0] for m in e2.matrices],
        paper_level=[levels[m][1] for m in e2.matrices],
    )
    return table, {"fig_e2": closed(fig), "copy_level_e2": ch.copy_level}


# --- E3 and E6 at the pre-shift checkpoint --------------------------------------------------


def e3_e6_tables(ch) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(e3, e6) on one batch: every head ablated in the pre model, both readings; the pre model
    with post's Q, K, V, and post for scale."""
    A, data = ch.cfg.analysis, ch.cfg.data
    # the headline's matrices: E3's unablated row is then the headline itself, one estimate
    e3 = ablation_table(ch.pre, data, A.headline_matrices, A.seed, {"all heads": all_heads(ch.pre)})
    e6 = model_table(
        {
            "pre with post's QKV": (ch.pre, switch_qkv_hooks(ch.pre, ch.post)),
            f"post (step {ch.steps.post:,})": ch.post,
        },
        data,
        A.headline_matrices,
        A.seed,
    )
    return e3, e6


def e3_e6_shown(ch, e3: pd.DataFrame, e6: pd.DataFrame) -> tuple[object, dict]:
    """E3 and E6 in one table (styled, with the paper's columns) and glue: fig_e3_e6, post_step."""
    P = lambda q: PAPER[q]
    table = pd.concat(
        [
            e3.assign(
                experiment="E3",
                model=["nothing ablated", "all heads ablated, uniform", "all heads ablated, batch mean"],
            ),
            e6.assign(experiment="E6"),
        ],
        ignore_index=True,
    )
    table["paper L_obs"], table["paper L_mask"] = zip(
        (P(("E3", "pre L_obs")), P(("E3", "pre L_mask"))),
        *[(P(("E3", "pre ablated L_obs")), P(("E3", "pre ablated L_mask")))]
        * 2,  # the paper gives one reading
        (P(("E6", "post-QKV into pre L_obs")), P(("E6", "post-QKV into pre L_mask"))),
        (None, None),
    )
    cols = ["experiment", "model", "L_obs", "paper L_obs", "L_mask", "paper L_mask", "mask_value"]
    styled = loss_styler(
        table,
        cols,
        cols[2:],
        f"E3 and E6 at the pre-shift checkpoint (step {ch.steps.pre:,}) and, "
        f"for scale, the post-shift model; {ch.cfg.analysis.headline_matrices:,} fresh matrices, the same "
        "for every row. " + PAPER_COLUMNS,
    )
    fig = loss_figure(table, "E3 and E6: interventions at the pre-shift checkpoint", ch.copy_level)
    return styled, {"fig_e3_e6": closed(fig), "post_step": f"{ch.steps.post:,}"}


# --- the scorecard ---------------------------------------------------------------------------


def e2_rows(e2: pd.DataFrame, levels: dict, na: str | None) -> list[dict]:
    """E2's rows, each over its kind's E[X²] (ratio rule; the reading says whether below COPIES),
    read at pre or, where the table has them, over the plateau's checkpoints around it."""
    rows = []
    for r in e2.to_dict("records"):
        ours_lvl, paper_lvl = levels[r["matrices"]]
        paper = paper_e2(r["matrices"], r["token"])
        for q, i in (("L'_mask", 0), ("L_obs", 1)):
            said = (
                ("outputs the token's value", "does not output the token's value")
                if q == "L'_mask"
                else ("copies the observed entries", "does not copy the observed entries")
            )
            at_pre, se, p = r[q] / ours_lvl, r[f"{q}_se"] / ours_lvl, paper[i] / paper_lvl
            low, high = (
                r.get(f"{q}_low", float("nan")) / ours_lvl,
                r.get(f"{q}_high", float("nan")) / ours_lvl,
            )
            several = not pd.isna(r.get(f"{q}_spread", float("nan")))
            if not several:  # pre alone: its value, its standard error over matrices
                ours, how = at_pre, f"{at_pre / p:.2g}× the paper's ± {se / p:.2g}"
            else:
                # the mean over the plateau's checkpoints around pre; the verdict reads their lowest to
                # highest
                ours = r[f"{q}_mean"] / ours_lvl
                how = (
                    f"{ours / p:.2g}× the paper's, the mean of the checkpoints around pre (pre alone "
                    f"{at_pre / p:.2g}× ± {se / p:.2g}); {e2_swing(r['spread_steps'], low / p, high / p)}"
                )
            row = _row(
                "E2",
                f"{r['matrices']}, {r['token']}: {q} / E[X²]",
                ours,
                f"{said[0] if ours < COPIES else said[1]} (below {COPIES:g}·E[X²] or not); {how}",
                paper=p,
                kind="ratio",
                se=se,
                span=(low, high) if several else None,
                na=na,
            )
            # the paper's number itself, by the ratio rule: a cut-off at COPIES sits 14-70x above both sides
            rows.append(
                {
                    **row,
                    "cause": e2_cause(row_verdict(row), r["spread_steps"], low / p, high / p)
                    if several
                    else "",
                }
            )
    return rows


def e3_rows(e3: pd.DataFrame, na: str | None) -> tuple[list[dict], list[str]]:
    """(rows, verdicts): E3's ablated / unablated L_mask and L_obs at pre, by each reading; the
    verdicts of its L_mask rows."""
    rows = []
    verdicts = []
    for mode in ("uniform", "batch_mean"):
        for q in ("L_mask", "L_obs"):
            ours, se = ratio_and_se(e3, q, {"ablated": "all heads", "reading": mode}, UNABLATED)
            paper = PAPER[("E3", f"pre ablated {q}")] / PAPER[("E3", f"pre {q}")]
            rows.append(
                _row(
                    "E3",
                    f"pre, every head ablated, {READING_NAMES[mode]}: ablated / unablated {q}",
                    ours,
                    f"{ours:.3g} ± {se:.2g} (paper {paper:.3g}: no effect)",
                    paper=paper,
                    kind="ratio",
                    se=se,
                    na=na,
                )
            )
            if q == "L_mask":
                verdicts.append(row_verdict(rows[-1]))
    return rows, verdicts


def readings(ch, e2: pd.DataFrame, e3: pd.DataFrame, e6: pd.DataFrame) -> tuple[dict, list[dict]]:
    """(glue, rows): scale-free rows: E2 each over its kind's E[X²] (ratio rule; the reading says
    whether below COPIES), E3 ablated / unablated L_mask and L_obs, E6 pre with post's QKV (L_mask
    / E[X²]; L_obs over pre's). glue: e3_match, e6_text, e2_ratio_text."""
    levels = copy_levels(ch.cfg.data.rank)
    na = pre_na(ch.steps.pre, not task_departures(ch.cfg))
    rows = e2_rows(e2, levels, na)
    glue_e2 = e2_ratio_text(rows)
    ablated, verdicts = e3_rows(e3, na)
    rows += ablated
    level, paper_level = levels["low-rank"]
    sw = {q: value_and_se(e6, q, model="pre with post's QKV") for q in ("L_mask", "L_obs")}
    rows.append(
        _row(
            "E6",
            "pre with post's QKV: L_mask / E[X²]",
            sw["L_mask"][0] / level,
            "does not complete" if sw["L_mask"][0] / level > DROP_FRACTION else "completes in part",
            paper=PAPER[("E6", "post-QKV into pre L_mask")] / paper_level,
            se=sw["L_mask"][1] / level,
            na=na,
        )
    )
    glue = {"e6_text": e6_text(e6, level, rows[-1]["paper"], row_verdict(rows[-1]))}
    base = value_and_se(e3, "L_obs", **UNABLATED)  # the same matrices (same size and seed)
    rows.append(
        _row(
            "E6",
            "pre with post's QKV / pre: L_obs",
            sw["L_obs"][0] / base[0],
            "how much the switch disturbs copying",
            paper=PAPER[("E6", "post-QKV into pre L_obs")] / PAPER[("E3", "pre L_obs")],
            kind="ratio",
            se=ratio_se(*sw["L_obs"], *base),
            na=na,
        )
    )
    glue["e3_match"] = matching_reading_text(
        verdicts, "the paper's ratio of ablated to unablated L_mask (ratio rule)"
    )
    glue["e2_ratio_text"] = glue_e2
    return glue, rows


# --- What we found -----------------------------------------------------------------------------


def scorecard_table(ch, rows: list[dict]):
    """Records `rows`; returns them styled with verdicts and the interval each verdict reads."""
    return recorded_table(
        ch.run_dir,
        rows,
        CHAPTER,
        columns=("id", "quantity", "paper", "ours", "interval", "verdict", "reading"),
        caption="The numbers this chapter adds to the scorecard; interval: the stretch of ours "
        "each verdict sets against the band of the paper's value (ours ± two standard "
        "errors, or for E2 read over the plateau's checkpoints, their lowest to highest "
        "reading, each ± two standard errors).",
    )


def closing_glue(ch, base: dict, e2: pd.DataFrame, e3: pd.DataFrame, e6: pd.DataFrame, *, verdicts) -> dict:
    """The run's numbers and sentences of "What we found" that `readings` does not give;
    `verdicts`: those of the recorded rows."""
    level = ch.copy_level
    paper_e2_values = [v[0] for v in PAPER_E2.values()]
    return {
        "copy_text": copy_text(base, level),
        "e2_text": e2_text(e2, level),
        "e2_range_paper": f"{min(paper_e2_values):.1e} to {max(paper_e2_values):.1e}",
        "pre_L_obs": base["L_obs"],
        "pre_L_mask": base["L_mask"],
        "pre_mask_value": base["mask_value"],
        "pre_l_obs_text": pre_l_obs_text(
            float(window_mean(ch.metrics, ch.steps.pre, DROP_WINDOW)["L_obs"]) / level,
            base["L_obs"] / level,
            PAPER[("E3", "pre L_obs")] / copy_levels(ch.cfg.data.rank)["low-rank"][1],
            step=ch.steps.pre,
            window=DROP_WINDOW,
        ),
        "abs_x": base["abs_x"],
        "copy_level": level,
        "e2_val_max": float(e2.loc[e2.token != "MASK", "L'_mask"].max()),
        "pre_step2": f"{ch.steps.pre:,}",
        "when": ch.relative_to_drop(ch.steps.pre),
        "e3_text": e3_text(e3),
        "verdicts": verdict_counts(verdicts),
        "n_rows": len(list(verdicts)),
    }


# What this chapter declares to the machinery (mclib.book.spec; collected by mclib.chapters.registry).
SPEC = ChapterSpec(CHAPTER, rejudged=rejudged, speaks_for=SPEAKS_FOR)
