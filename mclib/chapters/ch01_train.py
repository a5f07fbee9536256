"""Chapter 01_train (book/01_train.ipynb): the run every chapter reads, its loss curve, why
training ended, where the analysis checkpoints sit, the shape of the drop, E1's scorecard
rows, and the run's files as downloads.

    ch = open_chapter(profile, seed, run_dir, device, train=True, specs=specs())
    settings_table(ch); departures(ch); loss_figure(ch); checkpoint_table(ch); checkpoint_text(ch)
    glue, rows = readings(ch); scorecard_table(ch, rows); downloads(ch)

Every sentence is built from the run (drop or none, converged or capped), never typed.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from ..analyses import rounding, sharpness
from ..analyses.loss_tables import ratio_se
from ..analyses.sharpness import ABRUPT, SETTLE, Shape
from ..book.chapter import (
    Chapter,
    checkpoint_links,
    checkpoint_series_links,
    departures_table,
    download_links,
    shown_path,
)
from ..book.plots_base import closed
from ..book.plots_curves import loss_curve, mark_checkpoints
from ..book.scorecard import claim, recorded_table
from ..book.scorecard_rules import CUT, POSITIVE, agreements, copy_levels, row_verdict
from ..book.scorecard_stage import PAPER_PRE
from ..book.scorecard_tables import plural, task_departures
from ..book.spec import ChapterSpec
from ..core.metrics import COPIES, DROP_WINDOW, LOSS_NAMES, PLATEAU_BAND, last_tenth, window_mean
from ..core.paper import PAPER
from ..core.paper import profile as paper_profile
from ..core.placement import place_checkpoints
from ..core.recipe import deviations
from ..core.runs import METRICS
from ..core.train import parallel_runs
from .copying_rejudged import pre_na
from .train_sentences import checkpoint_text, drop_shape, end_sentence, shape_text, slope_sentence

CHAPTER = "01_train"


# --- the run -----------------------------------------------------------------------------------


def training_phrase(ch: Chapter) -> str:
    """How long the profile trains, e.g. "up to 14,000 steps (until L_mask stops improving)"."""
    t = ch.cfg.train
    return (
        f"up to {t.steps:,} steps (until L_mask stops improving)"
        if t.until == "converged"
        else f"{t.steps:,} steps"
    )


def settings_table(ch: Chapter):
    """The run every chapter reads, one setting a row (a pandas Styler)."""
    m, t, d = ch.cfg.model, ch.cfg.train, ch.cfg.data
    settings = pd.DataFrame(
        {
            "setting": ["profile", "seed", "device", "task", "model", "training", "ended", "run folder"],
            "value": [
                ch.cfg.name,
                ch.cfg.seed,
                ch.device.type,
                f"{d.n}x{d.n} matrices of rank {d.rank}, each entry masked with probability {d.p_mask}",
                f"{m.layers} layers, {m.heads} heads, hidden {m.hidden}, intermediate {m.intermediate}",
                f"{training_phrase(ch)} x {t.batch} matrices, Adam lr {t.lr:g}, {t.precision}; "
                f"{plural(t.threads, 'thread') if t.threads else 'all threads'} a run, "
                f"{plural(parallel_runs(ch.cfg), 'run')} side by side",
                ch.end.text,
                shown_path(ch.run_dir),
            ],
        }
    )
    return settings.style.hide(axis="index").set_caption("The run every chapter of this book reads.")


def departures(ch: Chapter):
    return departures_table(
        ch.cfg,
        f"Where profile {ch.cfg.name} departs from the paper's task and recipe (the "
        "paper profile as it ships, in fp32 and run to its end, departs nowhere). Every number of this book "
        "comes from this setting.",
        ch.end,
    )


def loss_figure(ch: Chapter) -> plt.Figure:
    """The loss curve with the drop and the analysis checkpoints marked (closed: glue it)."""
    fig = loss_curve(
        ch.metrics,
        ch.drop,
        ch.cfg.data.rank,
        title=f"Training loss: profile {ch.cfg.name}, seed {ch.cfg.seed}",
    )
    mark_checkpoints(fig, ch.steps.pre, ch.steps.transition, ch.steps.post)
    return closed(fig)


# --- the checkpoints ---------------------------------------------------------------------------


def losses_at(metrics: pd.DataFrame, step: int, window: int = DROP_WINDOW) -> pd.Series:
    """L, L_obs, L_mask, mask_value: means over the `window` steps ending at `step`."""
    return window_mean(metrics, step, window)[list(LOSS_NAMES)]


def window_se(
    metrics: pd.DataFrame, step: int, window: int = DROP_WINDOW, columns=("L", "L_obs", "L_mask")
) -> dict:
    """{"L_se": ..., ...}: standard errors of the `window`-step means ending at `step`, each step's
    batch loss one draw."""
    w = metrics[(metrics["step"] > step - window) & (metrics["step"] <= step)]
    return {
        f"{c}_se": float(w[c].std(ddof=1) / np.sqrt(len(w))) if len(w) > 1 else float("nan") for c in columns
    }


def checkpoint_table(ch: Chapter):
    """One row per analysis checkpoint: phase, step, the losses there, side of the drop."""
    s = ch.steps
    phases = [("pre-shift", s.pre)] + [("transition", t) for t in s.transition] + [("post-shift", s.post)]
    side = lambda step: "no drop" if ch.drop is None else ("before" if step < ch.drop else "after")
    table = pd.DataFrame(
        [{"checkpoint": p, "step": t, **losses_at(ch.metrics, t), "vs the drop": side(t)} for p, t in phases]
    )
    return (
        table.style.hide(axis="index")
        .format({c: "{:.2e}" for c in LOSS_NAMES})
        .set_caption(
            f"Losses at the checkpoints (mean over the {DROP_WINDOW} steps ending there); "
            "mask_value is the mean |X̂| at the masked entries."
        )
    )


# --- what we found -----------------------------------------------------------------------------

PLATEAU_ROWS = {"for L_mask": "pre-shift L_mask / E[X²]", "for L_obs": "pre-shift L_obs / E[X²]"}


def drop_story(drop: int | None, plateau: dict[str, str], end_step: int) -> tuple[str, str]:
    """(what L_mask did, what that means): the paper's picture only with a drop after a copying
    plateau. `plateau`: {`PLATEAU_ROWS` name: verdict} of E1's pre-shift rows."""
    said = agreements(plateau)
    on_plateau = all(v in POSITIVE.values() for v in plateau.values())
    if drop is not None:
        return (
            f"dropped at step {drop:,} of the {end_step:,} it trained",
            f"a plateau where the model copies, then a sudden drop, {said}"
            if on_plateau
            else f"a drop, but the pre-shift checkpoint is not on the paper's copying plateau ({said})",
        )
    return (
        f"did not drop within the {end_step:,} steps it trained",
        f"a copying plateau ({said}) but no drop yet (the run is too short, or the model too small)"
        if on_plateau
        else f"neither the paper's copying plateau ({said}) nor a drop (this profile is too short to "
        "show either)",
    )


def findings(ch: Chapter) -> dict:
    """The glue of "What we found": name -> str or float (plain floats: myst-nb formats them)."""
    level = ch.copy_level
    pre = losses_at(ch.metrics, e1_pre_step(ch))
    end = last_tenth(ch.metrics)  # "final": the mean over the last tenth of the steps
    final_L, final_L_mask = float(end["L"].mean()), float(end["L_mask"].mean())
    rows = {r["quantity"]: r for r in e1_rows(ch)}
    drop_text, story = drop_story(
        ch.drop, {k: row_verdict(rows[q]) for k, q in PLATEAU_ROWS.items()}, ch.end.step
    )
    sharp = sharpness.shape(ch.metrics, ch.cfg.data.rank)  # the plateau and the fall as E1's row reads them
    shape = None if sharp is None else drop_shape(ch.metrics, sharp.drop, sharp.left, sharp.settled)
    return {
        "run_name": f"profile {ch.cfg.name}, seed {ch.cfg.seed}",
        "drop_text": drop_text,
        "story": story,
        "end_text": f"{end_sentence(ch)} {slope_sentence(ch)}".strip(),
        "checkpoints_text": checkpoint_text(ch),
        "shape_text": shape_text(shape),
        "pre_step": e1_pre_step(ch),
        "pre_L_obs": float(pre["L_obs"]),
        "pre_L_mask": float(pre["L_mask"]),
        "pre_ratio": float(pre["L_mask"] / level),
        "copy_level": level,
        "final_L": final_L,
        "final_L_mask": final_L_mask,
        "pre_L_obs_rel": float(pre["L_obs"] / level),
        "drop_factor": float(pre["L_mask"] / final_L_mask),
        "rounding_text": rounding.finding(rounding.study(), rounding.early_flat()),
    }


# The drop step is compared with the paper's only where the task, the model and the
# optimiser are the paper's: each of them moves it. The cap on steps does not, and TF32 or
# bf16 only round the products (the row's reading names the precision).
DROP_STEP_KEEPS = ("train.steps", "train.precision")


def drop_step_claim(quantity: str, ours, reading: str, profile, spread=None) -> dict:
    """E1's drop step against the paper's (number rule; `spread`: over seeds), n/a naming the
    departures where `profile` departs in anything but `DROP_STEP_KEEPS`."""
    moved = [d["key"] for d in deviations(profile, paper_profile()) if d["key"] not in DROP_STEP_KEEPS]
    na = (
        (
            "the drop step depends on the task, model and optimiser, and this profile departs from the "
            "paper's in "
            f"{', '.join(moved)}; the scorecard's paper-setting column compares it"
        )
        if moved
        else None
    )
    return claim(
        "E1",
        quantity,
        ours,
        f"{reading} (precision {profile.train.precision})",
        paper=PAPER[("E1", "drop step")],
        spread=spread,
        na=na,
    )


PRE_L_OBS = "pre-shift L_obs / E[X²]"
PLATEAU_FALL = "plateau steps / fall steps (a plateau, then a sudden drop)"
# What E1's direction rows are judged by besides their numbers (`scorecard.RULE_FIELDS`): declared
# once, for `training_rows` and for judging a recorded row again (`rule_of`).
RULES = {
    PRE_L_OBS: {"reference": COPIES, "sense": "below", "margin": CUT},
    PLATEAU_FALL: {"reference": ABRUPT, "sense": "above", "margin": CUT},
}


def rule_of(row: dict) -> dict:
    """This chapter's rule fields for a row recorded without them (`RULES`); {} if not its own."""
    return dict(RULES.get(row["quantity"], {})) if row["id"] == "E1" else {}


def e1_pre_step(ch: Chapter) -> int:
    """The step E1's pre-shift rows read: PAPER_PRE on the paper's task (from the training curve,
    as chapter 02 reads its model); the placed pre step on another task, or where the run did not
    reach PAPER_PRE or dropped by then."""
    if (
        task_departures(ch.cfg)
        or ch.metrics.empty
        or int(ch.metrics["step"].iloc[-1]) < PAPER_PRE
        or (ch.drop is not None and ch.drop <= PAPER_PRE)
    ):
        return ch.steps.pre
    return PAPER_PRE


def seed_spread(laptop: list[dict] | None) -> tuple[float, str] | None:
    """(sd / mean, its wording) of the drop step over the laptop edition's seeds, from chapter 07's
    row; None without that row or its spread."""
    row = next((r for r in laptop or [] if (r["id"], r["quantity"]) == ("E1", "drop step, over seeds")), None)
    if row is None or not row.get("ours") or row.get("spread") is None:
        return None
    rel = row["spread"] / row["ours"]
    return rel, (
        f"the laptop edition's relative seed spread of the drop step ({row['spread']:,.0f} steps, one "
        "standard "
        f"deviation, over a mean of {row['ours']:,.0f}: {rel:.1%})"
    )


def rejudged(row: dict, recorded) -> tuple[dict, list[str]]:
    """(row, why): an E1 row a GPU lease recorded, judged by today's rules: pre-shift rows read away
    from PAPER_PRE moved there from `recorded.curve()` (n/a by `pre_na` without it); a one-seed
    drop step judged with `seed_spread` and the rounding spread, or n/a without either."""
    new, why = dict(row), []
    if row["id"] != "E1":
        return row, []
    if row["quantity"] == "drop step" and row.get("spread") is None and not row.get("na") and row.get("ours"):
        spread, rounded = seed_spread(recorded.laptop), recorded.rounding.get("drop step")
        if spread is not None:
            new["spread"] = spread[0] * row["ours"]
            new["reading"] = (
                f"{row.get('reading', '')}; ± {new['spread']:,.0f} steps: {spread[1]}, for this setting's "
                "one seed"
            )
            why.append(f"judged with {spread[1]}")
        if rounded is not None:
            new["rounding"] = rounded.range
            new["reading"] = f"{new.get('reading', '')}; {rounded.text(True)}"
            why.append(
                f"judged against its rounding spread ({rounded.range:,.0f} steps)"
                + ("" if spread else ", the laptop edition's seed spread not known here")
            )
        elif spread is None:
            new["na"] = (
                "the drop step of one seed has no spread of its own, and neither the laptop edition's seeds, "
                "whose relative spread would stand in for it, nor a rounding spread are known here"
            )
    if row.get("chapter") == CHAPTER and row["quantity"].startswith("pre-shift"):
        glued = (recorded.glued(CHAPTER, "pre_step") or "").replace(",", "").strip("'\"")
        pre = int(glued) if glued.isdigit() else None if recorded.steps is None else recorded.steps.pre
        if pre is not None and pre != PAPER_PRE:
            today = next((r for r in recorded.curve() if r["quantity"] == row["quantity"]), None)
            if today is None:
                new["na"] = pre_na(pre, True)
            else:
                new.update({k: today.get(k) for k in ("ours", "se", "reading")})
                why.append(
                    f"moved from step {pre:,} to the paper's pre step {PAPER_PRE:,}: {row['ours']:.4g} "
                    "there, "
                    f"{today['ours']:.4g} here (the training curve's values at that step)"
                )
    return new, why


def training_rows(
    drop,
    pre: dict,
    final: tuple[float, float],
    profile,
    shape: Shape | None = None,
    *,
    final_mask: tuple[float, float] | None = None,
) -> list[dict]:
    """E1's rows: pre-shift L_mask / E[X²] (number), L_obs / E[X²] (below COPIES), final L over
    p_mask·E[X²] (`final`: mean, s.e. over the last tenth), the drop step (`drop_step_claim`), pre
    over final L_mask (with `final_mask`), and plateau / fall steps above ABRUPT (no drop: 0).
    `pre`: window means and their `_se`."""
    p_mask, rank = profile.data.p_mask, profile.data.rank
    ours_lvl, paper_lvl = copy_levels(rank)["low-rank"]
    final_L, final_L_se = final
    return with_rounding(
        [
            claim(
                "E1",
                "pre-shift L_mask / E[X²]",
                pre["L_mask"] / ours_lvl,
                "on the copying plateau"
                if abs(pre["L_mask"] / ours_lvl - 1) < PLATEAU_BAND
                else "off the copying plateau",
                paper=PAPER[("E3", "pre L_mask")] / paper_lvl,
                se=pre.get("L_mask_se", 0) / ours_lvl,
            ),
            claim(
                "E1",
                PRE_L_OBS,
                pre["L_obs"] / ours_lvl,
                f"{'copies' if pre['L_obs'] / ours_lvl < COPIES else 'does not copy'} the observed entries "
                "(below "
                f"{COPIES:g} counts)",
                paper=PAPER[("E3", "pre L_obs")] / paper_lvl,
                kind="direction",
                **RULES[PRE_L_OBS],
                se=pre.get("L_obs_se", 0) / ours_lvl,
            ),
            claim(
                "E1",
                FINAL_L,
                final_L / (p_mask * ours_lvl),
                "the paper's final L over its copying model's L (paper: 50 000 steps)",
                paper=PAPER[("E1", "final L (W)")] / (0.3 * paper_lvl),
                se=final_L_se / (p_mask * ours_lvl),
            ),
            drop_step_claim(
                "drop step", drop, f"drop at step {drop:,}" if drop else "no drop in the run", profile
            ),
            *final_ratio_rows(pre, final_mask),
            claim(
                "E1",
                PLATEAU_FALL,
                0.0 if shape is None else shape.ratio,
                (
                    "no drop, or no plateau before it"
                    if shape is None
                    else f"on the plateau from step {shape.start:,} to {shape.left:,}, fallen to "
                    f"within {SETTLE:g}x the final "
                    f"level by step {shape.settled:,}"
                )
                + f"; sudden: > {ABRUPT:g} (the book's cut-off, as for E19)",
                kind="direction",
                **RULES[PLATEAU_FALL],
            ),
        ],
        rounding.study(),
    )


FINAL_L = "final L / (p_mask · E[X²]), last 10 % of steps"
FINAL_RATIO = "pre-shift L_mask / final L_mask (how far the drop goes; final: last 10 % of steps)"


def final_ratio_rows(pre: dict, final_mask: tuple[float, float] | None) -> list[dict]:
    """E1's pre over final L_mask row (how far the drop goes), [] without `final_mask` (mean, s.e.)."""
    if final_mask is None:
        return []
    return [
        claim(
            "E1",
            FINAL_RATIO,
            pre["L_mask"] / final_mask[0],
            f"final L_mask {final_mask[0]:.3g} ± {final_mask[1]:.2g}",
            paper=PAPER[("E3", "pre L_mask")] / PAPER[("E3", "post L_mask")],
            kind="ratio",
            se=ratio_se(pre["L_mask"], pre.get("L_mask_se", 0), final_mask[0], final_mask[1]),
        )
    ]


def with_rounding(rows: list[dict], spreads: dict) -> list[dict]:
    """`rows` with the final-level rows carrying how far rounding alone moved one run's final L_mask
    (`spreads`, from `rounding.study`) as `rounding`, and saying so in their reading."""
    final = spreads.get("final_L_mask")
    if final is None:
        return rows
    return [
        {
            **r,
            "rounding": final.around(r["ours"], relative=True),
            "reading": f"{r['reading']}; {final.text(False)}",
        }
        if r["quantity"] in (FINAL_L, FINAL_RATIO) and r.get("ours")
        else r
        for r in rows
    ]


def e1_rows(ch: Chapter) -> list[dict]:
    """E1's rows (`scorecard.claim`s, not yet recorded), losses over E[X²] so both tasks compare."""
    end = last_tenth(ch.metrics)  # "final": the mean over the last tenth of the steps
    final_se = float(end["L"].std(ddof=1) / len(end) ** 0.5) if len(end) > 1 else float("nan")
    at = e1_pre_step(ch)
    pre = {**losses_at(ch.metrics, at).to_dict(), **window_se(ch.metrics, at)}
    mask_se = float(end["L_mask"].std(ddof=1) / len(end) ** 0.5) if len(end) > 1 else float("nan")
    return training_rows(
        ch.drop,
        pre,
        (float(end["L"].mean()), final_se),
        ch.cfg,
        sharpness.shape(ch.metrics, ch.cfg.data.rank),
        final_mask=(float(end["L_mask"].mean()), mask_se),
    )


def curve_rows(cfg, run, metrics: pd.DataFrame, end) -> list[dict]:
    """`e1_rows` from a run's training curve alone (the paper setting's lease runs): the pre step
    placed among the saves every `save_every` steps up to `end` (`RunEnd`)."""
    every = cfg.train.save_every
    saved = sorted({*range(every, end.step + 1, every), end.step})
    ran = metrics[metrics["step"] <= end.step]
    steps = place_checkpoints(ran, saved, cfg.data.rank, cfg.checkpoints, cfg.checkpoints.place)
    ch = Chapter(
        cfg=cfg, run_dir=run, device=torch.device("cpu"), metrics=ran, drop=steps.drop, steps=steps, end=end
    )
    return e1_rows(ch)


def readings(ch: Chapter) -> tuple[dict, list[dict]]:
    """(glue, rows): `findings` and `paper_glue`, and E1's rows (`e1_rows`)."""
    rows = e1_rows(ch)
    return {**findings(ch), **paper_glue(rows)}, rows


def scorecard_table(ch: Chapter, rows: list[dict]):
    """Records `rows` in the run's scorecard; returns them with their verdicts, styled."""
    return recorded_table(
        ch.run_dir,
        rows,
        CHAPTER,
        columns=("id", "quantity", "kind", "paper", "ours", "se", "verdict"),
        caption="The numbers this chapter adds to the scorecard (each a quantity that means the "
        "same on both tasks).",
    )


def paper_glue(rows: list[dict]) -> dict:
    """The paper's numbers the closing paragraph quotes, and ours beside them, from E1's rows."""
    by = {r["quantity"]: r for r in rows}
    obs, final = by["pre-shift L_obs / E[X²]"], by[FINAL_L]
    return {
        "paper_pre_L_obs_rel": obs["paper"],
        "final_L_rel": final["ours"],
        "paper_final_L_rel": final["paper"],
    }


# --- the run's files as downloads ----------------------------------------------------------------


def downloads(ch: Chapter) -> str:
    """MyST {download} links: metrics.csv, the zipped final checkpoint (with what resuming needs)
    and the analysis checkpoints (`checkpoint_series_links`)."""
    links = (
        download_links(ch.run_dir, [(ch.run_dir / METRICS, f"{METRICS} (one row per step)")])
        + checkpoint_links(
            ch, ch.run_dir, ch.steps.post, f"the final checkpoint (step {ch.steps.post:,}, zip)"
        )
        + checkpoint_series_links(ch)
    )
    return f"This run's files, to download: {', '.join(links[:-1])} and {links[-1]}."


# What this chapter declares to the machinery (mclib.book.spec; collected by mclib.chapters.registry).
# The training chapter (`open_chapter(..., train=True)`, trains_runs): it trains the runs that the
# chapters a build executes read (`mclib.book.chapter.train_runs`), and the runner executes it again
# while one of those runs is not complete (`mclib.book.runner.plan`).
SPEC = ChapterSpec(CHAPTER, trains_runs=True, curve_rows=curve_rows, rejudged=rejudged, rule_of=rule_of)
