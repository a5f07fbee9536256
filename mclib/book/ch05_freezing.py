"""Chapter 05_freezing (book/05_freezing.ipynb): E15, one component re-initialised and
trained alone from the main run's final checkpoint, the rest frozen.

    ch = open_chapter(profile, seed, run_dir, device)
    runs = freeze_runs_of(ch)        # {group: folder}; trains what is missing
    runs_table(ch, runs)             # what each run trains
    freeze_figure(ch, runs)          # the four L_mask curves
    results_table(ch, runs)          # each run's drop, or what ended it without one
    glue, rows = readings(ch, runs)  # "What we found" and E15's scorecard rows
    scorecard_table(ch, rows)        # the rows, recorded, with their verdicts
    downloads(ch, runs)              # each run's metrics.csv and final checkpoint as {download} links

The paper shows these runs only as curves (paper Fig. 8, NeurIPS version), so its
description becomes claims: each run's drop step over the main run's (below E15_QUICK
for "no plateau"), and the order of the drops (`mclib.core.paper.PAPER_E15_ORDER`).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ..analyses.freezing import (DESCRIPTIONS, FreezeEnd, drop_text, freeze_ends, freeze_runs, freeze_steps,
                                 freeze_summary, paper_pattern, trainable_count)
from ..core.metrics import DROP_WINDOW, PLATEAU_BAND
from ..core.paper import PAPER_E15, PAPER_E15_ORDER
from ..core.runs import METRICS, load_metrics, saved_steps
from .chapter import Chapter, checkpoint_links, download_links, shown_path
from .plots import freeze_curves
from .scorecard import MARGINS, POSITIVE, agreement, claim, recorded_table, row_verdict

CHAPTER = "05_freezing"
E15_QUICK = 0.1   # a re-initialised run dropping within a tenth of the main run's drop step has "no plateau"
LOSSES = ("first_L_mask", "final_L_mask", "final_L_obs")


def freeze_runs_of(ch: Chapter) -> dict[str, Path]:
    """{group: folder} of the E15 runs (the training chapter trains them; a chapter run
    alone trains what is missing, resumes a cut run, returns at once if all are complete)."""
    return freeze_runs(ch.cfg, ch.run_dir)


def length_text(ch: Chapter) -> str:
    """How long an E15 run may train, e.g. "until it drops or reaches the main run's drop
    step (10,985), at most 4,000 steps (analysis.freeze_steps; ...)" (plain text: it goes
    into a table's caption)."""
    cap = ch.cfg.analysis.freeze_steps
    if ch.drop is None:
        return f"until it drops, at most {cap:,} steps (analysis.freeze_steps; the main run did not drop)"
    limit = freeze_steps(ch.cfg, ch.drop)
    binds = "the cap binds" if limit < ch.drop else "the main run's drop step binds"
    return (f"until it drops or reaches the main run's drop step ({ch.drop:,}), at most {cap:,} steps "
            f"(analysis.freeze_steps; {binds}: {limit:,} steps)")


def runs_table(ch: Chapter, runs: dict[str, Path]):
    """One row per group: what it re-initialises and trains, its parameter count, its folder."""
    post = ch.post
    table = pd.DataFrame({"group": list(DESCRIPTIONS), "re-initialised and trained": list(DESCRIPTIONS.values()),
                          "parameters": [f"{trainable_count(post, g):,}" for g in DESCRIPTIONS],
                          "run folder": [shown_path(runs[g]) for g in DESCRIPTIONS]})
    t = ch.cfg.train
    return table.style.hide(axis="index").set_caption(
        f"One run per group: from the post-shift checkpoint (step {ch.steps.post:,}), {length_text(ch)}, "
        f"{t.batch} fresh matrices a step, Adam lr {t.lr:g}, on {ch.device.type}. Layer norms and the read-out "
        "belong to no group: they stay frozen in every run.")


def summary(ch: Chapter, runs: dict[str, Path]) -> pd.DataFrame:
    """`freeze_summary`: one row per group (drop, steps, losses, starts_on_plateau)."""
    return freeze_summary(runs, ch.cfg)


def drops_of(table: pd.DataFrame) -> dict[str, int | None]:
    """{group: drop step or None} from `freeze_summary`'s table."""
    return {g: (None if pd.isna(d) else int(d)) for g, d in zip(table["group"], table["drop"])}


def freeze_figure(ch: Chapter, runs: dict[str, Path]) -> plt.Figure:
    """The four runs' L_mask curves, each drop marked (closed: glue it)."""
    fig = freeze_curves({g: load_metrics(f) for g, f in runs.items()}, drops_of(summary(ch, runs)), ch.cfg.data.rank,
                        title=f"Re-initialise one component, freeze the rest ({ch.cfg.name}, seed {ch.cfg.seed})")
    plt.close(fig)
    return fig


def results_table(ch: Chapter, runs: dict[str, Path]):
    """One row per group: what ended the run (`freeze_ends`), the paper's description, the losses."""
    table, ends = summary(ch, runs), freeze_ends(ch.cfg, ch.run_dir, tuple(runs))
    shown = table.assign(result=[ends[g].text for g in table["group"]], paper=[PAPER_E15[g] for g in table["group"]])
    return (shown[["group", "result", "paper", *LOSSES, "starts_on_plateau"]].style.hide(axis="index")
            .format({c: "{:.2e}" for c in LOSSES})
            .set_caption(f"What ended each run; L_mask over its first {DROP_WINDOW} steps and L_mask, L_obs over its "
                         f"last {DROP_WINDOW}; starts_on_plateau: the first {DROP_WINDOW} steps' L_mask is within "
                         f"{PLATEAU_BAND:.0%} of E[X²]."))


def _runs_named(groups) -> str:
    """"the mlp run" or "the mlp and token runs" (for a sentence)."""
    groups = list(groups)
    return f"the {groups[0]} run" if len(groups) == 1 else f"the {', '.join(groups[:-1])} and {groups[-1]} runs"


def ends_text(ends: dict[str, FreezeEnd]) -> str:
    """Per group, what ended its run, runs that ended alike named together: "the mlp run
    dropped at step 40; the attention and positional runs reached ..."."""
    alike: dict[str, list[str]] = {}
    for g, e in ends.items():
        alike.setdefault(e.text, []).append(g)
    return "; ".join(f"{_runs_named(gs)} {text}" for text, gs in alike.items())


def tiers_text(order) -> str:
    """"mlp and token, then attention, then positional" for tiers of groups, earliest first."""
    return ", then ".join(" and ".join(tier) for tier in order)


def order_text(verdict: str, pattern: dict[str, bool], any_drop: bool) -> str:
    """The closing sentence on the order of the drops, from `verdict` (the E15 ordering
    row's: `agreement`); pattern (`paper_pattern`, the strict order without the rule's
    margin) says which end of the paper's order fails when it differs."""
    paper = f"the paper's order of the drops ({tiers_text(PAPER_E15_ORDER)})"
    margin = f"{MARGINS['ordering']:.0%}"
    if verdict == "n/a":
        return f"too short to check {paper}: {agreement(verdict)}"
    if verdict in POSITIVE.values():
        return f"{paper}, each tier later than the one before by more than {margin} of its step, {agreement(verdict)}"
    first, last = _runs_named(PAPER_E15_ORDER[0]), _runs_named(PAPER_E15_ORDER[-1])
    fails = ([] if pattern["first_tier_first"] else [f"{first} do not drop before the others"]) + \
        ([] if pattern["last_tier_last"] else [f"{last} does not drop last"])
    why = ("no run dropped within the steps it could train" if not any_drop else
           "; ".join(fails) or f"the order holds, but not by {margin} of the later step")
    return f"not {paper} by the scorecard's ordering rule, {agreement(verdict)}: {why}"


def freeze_readings(table: pd.DataFrame, main_drop: int | None, limit: int) -> tuple[dict, list[dict]]:
    """The closing sentences and E15's scorecard rows.

    table: `freeze_summary` (drop and steps trained per group); main_drop: the main run's
    drop step (None: none); limit: the most steps a run could train (`freeze_steps`).
    glue: found, verdict_text (`order_text`, from the ordering row's verdict), main_text;
    rows: keyword arguments for `scorecard.record`."""
    drops = drops_of(table)
    trained = dict(zip(table["group"], (int(s) for s in table["steps"])))
    order = sorted((g for g, d in drops.items() if d is not None), key=drops.get)
    # The paper's picture as claims: the first tier of PAPER_E15_ORDER (mlp, token) has no plateau (each
    # drops within E15_QUICK of the main run's drop step), the later tiers sit on one and then drop, in order.
    rows = []
    for g, d in drops.items():
        quick = g in PAPER_E15_ORDER[0]
        rows.append(claim("E15", f"steps to the drop / main run's drop step, {g} re-initialised",
                          None if d is None or not main_drop else d / main_drop,
                          f"{drop_text(d, trained[g])} (paper: {PAPER_E15.get(g, 'not reported')}); "
                          f"{'below' if quick else 'above'} {E15_QUICK:g} counts",
                          kind="direction", reference=E15_QUICK, sense="below" if quick else "above",
                          na=None if main_drop else "the main run has no drop to measure against"))
    # No run dropped and none could train as long as the main run took to drop: the order is untested.
    too_short = not order and (main_drop is None or limit < main_drop)
    rows.append(claim("E15", f"order of the drops: {tiers_text(PAPER_E15_ORDER)}", None,
                      ", ".join(f"{g} {'no drop' if drops[g] is None else f'{drops[g]:,}'}" for g in drops),
                      kind="ordering", values=dict(drops), order=PAPER_E15_ORDER,
                      na=f"no run dropped within the {limit:,} steps it could train" if too_short else None))
    if not order:
        found = "none of the four runs dropped"
    else:
        rest = [g for g in drops if g not in order]
        found = ("the runs dropped in the order " + ", ".join(f"{g} (step {drops[g]:,})" for g in order)
                 + ("" if not rest else "; " + ", ".join(rest) + " did not drop"))
    verdict_text = order_text(row_verdict(rows[-1]), paper_pattern(table), bool(order))
    main_text = (f"The main run, trained from scratch, dropped at step {main_drop:,}." if main_drop is not None
                 else "The main run, trained from scratch, did not drop.")
    return {"found": found, "verdict_text": verdict_text, "main_text": main_text}, rows


def readings(ch: Chapter, runs: dict[str, Path]) -> tuple[dict, list[dict]]:
    """(glue, rows): the closing paragraph's glue (found, verdict_text, main_text, ends_text)
    and E15's rows (`scorecard.claim`s, recorded by `scorecard_table`)."""
    glue, rows = freeze_readings(summary(ch, runs), ch.drop, freeze_steps(ch.cfg, ch.drop))
    glue["ends_text"] = ends_text(freeze_ends(ch.cfg, ch.run_dir, tuple(runs)))
    return glue, rows


def scorecard_table(ch: Chapter, rows: list[dict]):
    """Records `rows` in the run's scorecard; returns them with their verdicts, styled."""
    return recorded_table(ch.run_dir, rows, CHAPTER, columns=("id", "quantity", "kind", "ours", "verdict", "reading"))


def downloads(ch: Chapter, runs: dict[str, Path]) -> str:
    """MyST: each E15 run's metrics.csv and final checkpoint (zipped) as {download} links
    (`download_links`), one group after the other."""
    parts = []
    for g, folder in runs.items():
        last = saved_steps(folder)[-1]
        links = (download_links(ch.run_dir, [(folder / METRICS, METRICS)])
                 + checkpoint_links(ch, folder, last, f"final checkpoint (step {last:,}, zip)"))
        parts.append(f"{g}: {' and '.join(links)}")
    return f"Each run's files, to download: {'; '.join(parts)}."
