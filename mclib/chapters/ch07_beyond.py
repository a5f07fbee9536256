"""Chapter 07, beyond the paper (book/07_beyond.ipynb): the drop over seeds, and whether any
measure of the model's inside moves before the loss does. Its tables, figures, sentences and
scorecard rows in page order: the paper's claims it tests (E1 over seeds, E9's timing), its own
finding B1 (`lead_row`), shown and counted apart from the paper's claims, and the follow-up's
F1-F5 (`mclib.chapters.followup`).

The drop over seeds is recorded as a fraction of training (profiles differ in length) by the
number rule with the seeds' spread. Lead times come from `mclib.analyses.progress`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..analyses import progress
from ..analyses.heads import STRUCTURE_THRESHOLD
from ..book.chapter import seed_runs
from ..book.plots_base import closed
from ..book.plots_curves import progress_panels, seed_loss_curves
from ..book.runner_plan import Reads
from ..book.scorecard import claim, recorded_table
from ..book.scorecard_rules import CLOSE, CUT, agreement, is_own, row_verdict
from ..book.scorecard_tables import plural
from ..book.spec import ChapterSpec
from ..core.metrics import find_drop, window_mean
from ..core.runs import load_metrics
from .beyond_readings import ONE_SEED, _listing, seeds_row, seeds_text
from .followup import rule_of as followup_rule

CHAPTER = "07_beyond"
LEAD_SURE = 0.9  # B1 holds when the longest lead is found in more than this share of the bootstrap resamples


# --- the drop over seeds ------------------------------------------------------------------------


def runs_read(cfg) -> Reads:
    """The runs read beside the book's run: every seed of `analysis.seeds`."""
    return Reads(seeds=tuple(cfg.analysis.seeds))


@dataclass
class Seeds:
    """Every seed's training curve and drop, and late L_mask (`late`, `late_label`, `late_text`)."""

    curves: dict  # seed -> metrics
    drops: dict  # seed -> drop step (None: no drop)
    late: dict  # seed -> L_mask late in training (NaN: no drop to measure from)
    late_label: str
    late_text: str


def seeds(ch) -> Seeds:
    """The runs of `analysis.seeds`, training what is missing. Late L_mask: a 50-step mean where
    `analysis.after_drop` stops a seed that many steps after its drop, else the last 10 % of steps."""
    curves = {s: load_metrics(d) for s, d in seed_runs(ch.cfg, ch.run_dir).items()}
    drops = {s: find_drop(m, rank=ch.cfg.data.rank) for s, m in curves.items()}
    after = ch.cfg.analysis.after_drop
    if after is None:
        late = {s: float(m.tail(max(1, len(m) // 10))["L_mask"].mean()) for s, m in curves.items()}
        return Seeds(curves, drops, late, "final L_mask", "its L_mask over the last 10 % of steps")
    late = {
        s: float(window_mean(m, drops[s] + after)["L_mask"]) if drops[s] is not None else float("nan")
        for s, m in curves.items()
    }
    label = f"L_mask {after:,} steps after the drop"
    return Seeds(curves, drops, late, label, label)


def seeds_figure(ch, s: Seeds):
    return closed(
        seed_loss_curves(
            s.curves,
            s.drops,
            ch.cfg.data.rank,
            title=f"L_mask over {len(s.curves)} seeds: profile {ch.cfg.name}",
        )
    )


def _duration(wall: pd.Series) -> str:
    if wall.empty:
        return "—"
    return f"{wall.iloc[-1] / 60:.1f} min" if wall.iloc[-1] >= 60 else f"{wall.iloc[-1]:.1f} s"


def seeds_shown(ch, s: Seeds):
    steps = ch.cfg.train.steps
    table = pd.DataFrame(
        [
            {
                "seed": seed,
                "drop step": f"{s.drops[seed]:,}" if s.drops[seed] is not None else f"no drop by {steps:,}",
                "steps trained": f"{int(s.curves[seed]['step'].max()):,}",
                s.late_label: s.late[seed],
                "training time": _duration(s.curves[seed]["wall"].dropna()),
            }
            for seed in s.curves
        ]
    )
    return (
        table.style.hide(axis="index")
        .format({s.late_label: "{:.2e}"}, na_rep="—")
        .set_caption(
            f"Every seed's drop (mclib.core.metrics.find_drop), the steps it trained, {s.late_text}, "
            "and its training time (without checkpoint writing; runs trained side by side shared the "
            "cores)."
        )
    )


def seeds_glue(ch, s: Seeds) -> dict:
    n = len(s.curves)
    return {
        "seeds_text": seeds_text(s.drops, ch.cfg.train.steps),
        "n_seeds": n,
        "seed_list": _listing(s.curves),
        "seeds_counted": f"{'the one seed' if n == 1 else plural(n, 'seed')} of this profile "
        f"({'seed' if n == 1 else 'seeds'} {_listing(s.curves)})",
    }


def seeds_readings(ch, s: Seeds) -> tuple[dict, list[dict]]:
    """(glue, row) of the drop over seeds: `seeds_glue` and `seeds_row`."""
    return seeds_glue(ch, s), [seeds_row(s.drops, ch.cfg)]


def scorecard_table(ch, rows: list[dict]):
    own = [r["id"] for r in rows if is_own(r)]
    return recorded_table(
        ch.run_dir,
        rows,
        CHAPTER,
        columns=("id", "quantity", "paper", "ours", "spread", "verdict"),
        caption="The rows this section adds to the scorecard"
        + (
            f"; {', '.join(own)}, a finding of our own, is counted apart from the paper's claims"
            if own
            else ""
        )
        + ".",
    )


# --- can the drop be seen coming? -----------------------------------------------------------------


def progress_table(ch) -> pd.DataFrame:
    """Every measure at every saved checkpoint of the book's run (`progress.progress_table`)."""
    return progress.progress_table(
        ch.run_dir, ch.cfg.data, n_matrices=ch.cfg.analysis.eval_matrices, seed=ch.cfg.analysis.seed
    )


def lead_times(ch, table: pd.DataFrame) -> pd.DataFrame:
    """Per measure: its half-way crossing (`progress.lead_times`) and whether it leaves its plateau
    band for good before the drop (`progress.plateau_leads`, with range and p_lead)."""
    return progress.lead_times(table, ch.drop).merge(
        progress.plateau_leads(table, ch.drop, seed=ch.cfg.analysis.seed), on="measure"
    )


def progress_figure(ch, table: pd.DataFrame, leads: pd.DataFrame):
    return closed(
        progress_panels(
            progress.normalised(table),
            leads,
            ch.drop,
            title=f"Progress measures: profile {ch.cfg.name}, seed {ch.cfg.seed}",
        )
    )


def leads_shown(leads: pd.DataFrame):
    shown = leads.assign(
        moves=np.where(leads["direction"] == "above", "up", "down"),
        band=[
            f"{lo:.3g} – {hi:.3g}" if np.isfinite(lo) else "—"
            for lo, hi in zip(leads["band_low"], leads["band_high"])
        ],
        lead_range=[
            f"{lo:,.0f} – {hi:,.0f}" if np.isfinite(lo) else "—"
            for lo, hi in zip(leads["lead_lo"], leads["lead_hi"])
        ],
    )
    return (
        shown[
            [
                "measure",
                "moves",
                "first",
                "threshold",
                "extreme",
                "cross_step",
                "lead_time",
                "resolution",
                "band",
                "leaves_at",
                "lead",
                "lead_range",
                "p_lead",
            ]
        ]
        .style.hide(axis="index")
        .format(
            {
                "first": "{:.3g}",
                "threshold": "{:.3g}",
                "extreme": "{:.3g}",
                "cross_step": "{:,.0f}",
                "lead_time": "{:+,.0f}",
                "resolution": "{:,.0f}",
                "leaves_at": "{:,.0f}",
                "lead": "{:,.0f}",
                "p_lead": "{:.0%}",
            },
            na_rep="—",
        )
        .set_caption(
            "When each measure crosses its threshold (cross_step) and how long before the drop "
            "(lead_time = drop − cross_step; empty without a drop or a crossing); the crossing happened "
            "within the resolution (the gap to the previous checkpoint) before cross_step. Then the "
            "lead: the band the measure kept on the plateau (mean ± 3 SD after the start of training), "
            "the checkpoint where it leaves that band for good before the drop (leaves_at), lead = drop − "
            "leaves_at, its 5-95 % range over bootstrap resamples of the plateau, and the share of "
            "resamples with a lead (p_lead)."
        )
    )


def when(leads: pd.DataFrame, measure: str) -> str:
    """'token_alignment crosses at step S, N steps before the drop' (or after, at, never)."""
    r = leads.set_index("measure").loc[measure]
    if not np.isfinite(r["cross_step"]):
        return f"{measure} never crosses its threshold"
    lead = r["lead_time"]
    side = "before" if lead > 0 else ("after" if lead < 0 else "at")
    return f"{measure} crosses at step {r['cross_step']:,.0f}, " + (
        f"{abs(lead):,.0f} steps {side} the drop" if lead != 0 else "the step of the drop"
    )


def claims_text(leads: pd.DataFrame, drop: int | None) -> str:
    """The paper's two timing claims (E13 before the drop, E14 after it) read off the crossings."""
    if drop is None:
        return (
            "The paper makes two claims about timing that these measures would test (E13: the token "
            "embeddings reach their final arrangement before the loss drops; E14: positions cluster by "
            "column only after it); without a drop in this run they cannot be checked"
        )
    return (
        f"The paper makes two claims about timing that these measures test: the token embeddings reach "
        f"their final arrangement before the loss drops (E13), and positions cluster by column only after "
        f"it (E14). Here {when(leads, 'token_alignment')}, and {when(leads, 'column_silhouette')}"
    )


def structure_rows(ch, table: pd.DataFrame) -> list[dict]:
    """E9's timing: the step at which the most row- (column-) structured head first reaches
    STRUCTURE_THRESHOLD, over the drop step (paper: 1; number rule); its error is the checkpoint
    interval before the crossing over √12."""
    th = {m: (STRUCTURE_THRESHOLD, "above") for m in ("max_row_excess", "max_column_excess")}
    at = progress.lead_times(table, ch.drop, thresholds=th).set_index("measure")
    rows = []
    for m, kind in (("max_row_excess", "row"), ("max_column_excess", "column")):
        cross, res = at.loc[m, "cross_step"], at.loc[m, "resolution"]
        crossed = bool(np.isfinite(cross))
        reading = (
            (
                f"reached at step {cross:,.0f} (between checkpoints {cross - res:,.0f} and {cross:,.0f})"
                if crossed
                else "never reached"
            )
            + (f"; drop at step {ch.drop:,}" if ch.drop else "")
            + "; the paper: the heads form at the drop"
        )
        rows.append(
            claim(
                "E9",
                f"step the most {kind}-structured head reaches excess {STRUCTURE_THRESHOLD:g} / drop step",
                float(cross / ch.drop) if crossed and ch.drop else None,
                reading,
                paper=1.0,
                se=float(res / 12**0.5 / ch.drop) if crossed and ch.drop else None,
                na=None if ch.drop else "the run has no drop",
            )
        )
    return rows


def progress_glue(ch, table: pd.DataFrame, leads: pd.DataFrame) -> dict:
    gap = int(np.diff(np.concatenate([[0], table["step"]])).max())  # the coarsest checkpoint interval
    return {
        "lead_text": progress.plateau_lead_summary(leads, ch.drop, ch.cfg.train.steps, gap),
        "claims_text": claims_text(leads, ch.drop),
        "main_run": f"seed {ch.cfg.seed}, {len(table)} checkpoints at most {gap:,} steps apart",
    }


def lead_row(ch, leads: pd.DataFrame, steps=None) -> dict:
    """B1: some measure of the inside leaves its plateau band for good before the loss does
    (`progress.leaders`). ours: p_lead of the longest-leading measure (0 when none leads), above
    LEAD_SURE by the finding rule; the reading names the measure, chosen after the fact, and how
    many were looked at. n/a without a drop, or when `untestable` gives a reason from `steps`."""
    lead, ctrl_at = progress.leaders(leads)
    looked = int((leads["measure"] != "L_mask").sum())
    quantity = (
        f"a measure of the inside leaves its plateau band before the loss: p_lead of the longest lead "
        f"(cut-off {LEAD_SURE:.0%})"
    )
    if ch.drop is None:
        return claim(
            "B1",
            quantity,
            None,
            "",
            kind="finding",
            reference=LEAD_SURE,
            sense="above",
            margin=CUT,
            na="the run has no drop",
        )
    if lead.empty:
        return claim(
            "B1",
            quantity,
            0.0,
            f"none of the {looked} measures leaves its band before the loss does",
            kind="finding",
            reference=LEAD_SURE,
            sense="above",
            margin=CUT,
            na=untestable(leads, steps),
        )
    r = lead.iloc[0]
    return claim(
        "B1",
        quantity,
        float(r["p_lead"]),
        f"{r['measure']}, the longest of {len(lead)} leads among {looked} measures: {r['lead']:,.0f} steps "
        f"before the drop (bootstrap 5-95 %: {r['lead_lo']:,.0f} to {r['lead_hi']:,.0f})",
        kind="finding",
        reference=LEAD_SURE,
        sense="above",
        margin=CUT,
    )


def no_band_text(
    measures: int,
    start: float,
    end: float,
    *,
    checkpoints: int | None,
    gap: int | None,
    in_window: int | None = None,
) -> str:
    """Why no measure has a plateau band, from the run: the band's window (`progress.plateau_band`),
    the checkpoints it needs (MIN_BASELINE) and how the run's checkpoints fall."""
    had = "fewer" if in_window is None else f"{in_window:,}"
    ran = (
        ""
        if checkpoints is None or gap is None
        else f": the run's {plural(checkpoints, 'checkpoint')}, at most {gap:,} steps apart, put {had} there"
    )
    return (
        f"no measure has a plateau band, which is estimated from the checkpoints between steps {start:,.0f} "
        "and "
        f"{end:,.0f} (a quarter to a half of the way to the drop) and needs {progress.MIN_BASELINE} of "
        f"them{ran}; "
        f"none of the {measures} measures can be tested"
    )


def untestable(leads: pd.DataFrame, steps=None) -> str | None:
    """Why B1 has nothing to test (no measure but L_mask has a plateau band, so a 0 would read as a
    failed finding), or None; worded by `no_band_text` from `steps`."""
    inside = leads[leads["measure"] != "L_mask"]
    if (
        "band_low" in inside
        and len(inside)
        and not np.isfinite(inside["band_low"].to_numpy(dtype=float)).any()
    ):
        start, end = (
            float(inside[c].iloc[0]) if c in inside else float("nan") for c in ("window_start", "window_end")
        )
        s = None if steps is None else np.sort(np.asarray(steps, dtype=float))
        return no_band_text(
            len(inside),
            start,
            end,
            checkpoints=None if s is None else len(s),
            gap=None if s is None or len(s) < 2 else int(np.diff(np.concatenate([[0], s])).max()),
            in_window=None if s is None else int(((s >= start) & (s < end)).sum()),
        )
    return None


# The glued sentences that state a row's verdict, by the experiment they speak for
# (`mclib.lease.part.restate`).
SPEAKS_FOR = {"lead_finding": "B1"}


def rejudged(row: dict, recorded) -> tuple[dict, list[str]]:
    """(row, why): a row a GPU lease recorded, judged by today's rules: B1 n/a where its glued
    lead_text says no measure had a band; the drop over one seed n/a (`ONE_SEED`); F4a, F4b without
    the sweep's numbers where the sweep trains another profile."""
    if (row["id"], row.get("quantity")) == ("E1", "drop step, over seeds") and not row.get("na"):
        one = (recorded.glued(CHAPTER, "n_seeds") or "").strip("'\"") == "1"
        return ({**row, "na": ONE_SEED} if one else row), []
    if (
        row["id"] in ("F4a", "F4b")
        and "the attention-bias sweep trains the" in row.get("reading", "")
        and row.get("ours") is not None
    ):  # the CPU sweep's number, recorded in this setting's column
        text = row["reading"]
        kept = text[text.find("the follow-up:") :].split("; n/a:")[0]
        return {**row, "ours": None, "se": None, "reading": kept}, [
            f"the CPU sweep's {row['ours']:.3g} taken out of this column: the sweep trains another profile"
        ]
    if row["id"] != "B1" or row.get("verdict") == "n/a":
        return row, []
    lead_text = recorded.glued(CHAPTER, "lead_text") or ""
    m = re.search(r"(?:too short for a band|no plateau band \([^)]*\)) for ([^;.]+)", lead_text)
    no_band = [x.strip() for x in m.group(1).split(",") if x.strip() != "L_mask"] if m else []
    looked = re.search(r"none of the (\d+) measures", row.get("reading", ""))
    if looked and no_band and len(no_band) >= int(looked.group(1)):
        drop = re.search(r"the drop is at step ([\d,]+)", lead_text)
        run = re.search(
            r"(\d+) checkpoints at most ([\d,]+) steps apart", recorded.glued(CHAPTER, "main_run") or ""
        )
        d = float(drop.group(1).replace(",", "")) if drop else float("nan")
        start, end = progress.TRANSIENT * d, (progress.TRANSIENT + progress.BASELINE) * d
        return {
            **row,
            "na": no_band_text(
                len(no_band),
                start,
                end,
                checkpoints=int(run.group(1)) if run else None,
                gap=int(run.group(2).replace(",", "")) if run else None,
            ),
        }, []
    return row, []


def rule_of(row: dict) -> dict:
    """Rule fields for a row recorded without them: B1 above LEAD_SURE (margin CUT); F rows by
    `followup.rule_of`; {} for another row."""
    if row["id"] == "B1":
        return {"reference": LEAD_SURE, "sense": "above", "margin": CUT}
    return followup_rule(row)


def lead_finding_text(row: dict) -> str:
    """B1's sentence, worded by its row's verdict (`agreement`)."""
    if row.get("na"):
        return (
            "The scorecard keeps the lead as a finding of our own, B1, with nothing to test here "
            f"({row['na']})"
        )
    return (
        f"The scorecard keeps this as a finding of our own, B1 (a lead found in more than {LEAD_SURE:.0%} of "
        "the "
        f"bootstrap resamples), which {_verb(row_verdict(row))}, apart from the paper's claims"
    )


def _verb(verdict: str) -> str:
    """`agreement` as the verb of a "which ..." clause ("holds here", "is too close to tell")."""
    return ("is " if verdict == CLOSE else "") + agreement(verdict)


def structure_readings(ch, table: pd.DataFrame, leads: pd.DataFrame) -> tuple[dict, list[dict]]:
    """(glue, rows) of "can the drop be seen coming": `progress_glue` and B1's sentence,
    `structure_rows` and `lead_row`."""
    lead = lead_row(ch, leads, table["step"])
    return (
        {**progress_glue(ch, table, leads), "lead_finding": lead_finding_text(lead)},
        [*structure_rows(ch, table), lead],
    )


# What this chapter declares to the machinery (mclib.book.spec; collected by mclib.chapters.registry).
SPEC = ChapterSpec(CHAPTER, runs_read=runs_read, rejudged=rejudged, rule_of=rule_of, speaks_for=SPEAKS_FOR)
