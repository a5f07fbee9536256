"""Chapter 05_freezing (book/05_freezing.ipynb): E15, one component re-initialised and
trained alone from the main run's final checkpoint, the rest frozen.

    ch = open_chapter(profile, seed, run_dir, device)
    runs = freeze_runs_of(ch)        # {group: folder}; trains what is missing
    runs_table(ch, runs); freeze_figure(ch, runs); results_table(ch, runs)
    glue, rows = readings(ch, runs)  # "What we found" and E15's scorecard rows
    scorecard_table(ch, rows); downloads(ch, runs)

The paper shows these runs only as curves (paper Fig. 8, NeurIPS version), so each of its
descriptions becomes a claim judged by a rule stated with it (`freeze_readings`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ..analyses.freezing import (
    DESCRIPTIONS,
    FreezeEnd,
    drop_text,
    freeze_ends,
    freeze_runs,
    freeze_steps,
    freeze_summary,
    known_text,
    paper_pattern,
    trainable_count,
)
from ..analyses.interventions import GROUPS
from ..analyses.sharpness import ABRUPT, BAND, SETTLE
from ..book.chapter import Chapter, MissingRuns, checkpoint_links, download_links, require_runs, shown_path
from ..book.plots_base import closed
from ..book.plots_curves import freeze_curves
from ..book.runner_plan import Reads
from ..book.scorecard import claim, recorded_table
from ..book.scorecard_rules import MARGINS, POSITIVE, agreement, row_verdict
from ..book.spec import ChapterSpec
from ..core.checkpoints import saved_steps
from ..core.config import Profile
from ..core.metrics import DROP_WINDOW, PLATEAU_BAND, final_level, find_drop
from ..core.paper import PAPER_E15, PAPER_E15_ORDER
from ..core.runs import METRICS, load_metrics

CHAPTER = "05_freezing"
LOSSES = ("first_L_mask", "final_L_mask", "final_L_mask_se", "final_L_obs")


@dataclass
class MainRun:
    """The yardstick of E15: the main run's drop (None: none), final L_mask ± its standard error
    (`final_level`), an E15 run's step cap, and the step where the main run was stopped early
    (None: it ended by its own rule)."""

    drop: int | None
    final: float
    final_se: float
    cap: int
    stopped: int | None = None


def main_run(ch: Chapter) -> MainRun:
    return main_run_from(ch.metrics[ch.metrics["step"] <= ch.end.step], ch.cfg, ch.drop)


def main_run_from(ran: pd.DataFrame, cfg: Profile, drop: int | None, stopped: int | None = None) -> MainRun:
    """`MainRun` from the main run's metrics up to its end (`ran`), as `freeze_rows` reads it too."""
    return MainRun(drop, *final_level(ran, cfg.train.patience), freeze_steps(cfg), stopped)


def runs_read(cfg: Profile) -> Reads:
    """The runs read beside the book's run: E15's, one per group (none with analysis.freeze: false)."""
    return Reads(e15=tuple(GROUPS) if cfg.analysis.freeze else ())


def freeze_runs_of(ch: Chapter) -> dict[str, Path]:
    """{group: folder} of the E15 runs, training what is missing (with analysis.train_in_book);
    raises `MissingRuns` when E15 is off or, without training, a run is missing."""
    if not ch.cfg.analysis.freeze:
        raise MissingRuns("E15 is off in this book (analysis.freeze: false): chapter 05 has no runs to read")
    if not ch.cfg.analysis.train_in_book:
        return require_runs(ch.cfg, ch.run_dir, freeze=True)
    return freeze_runs(ch.cfg, ch.run_dir)


def length_text(ch: Chapter) -> str:
    """How long an E15 run may train (plain text: it goes into a table's caption)."""
    t, cap = ch.cfg.train, freeze_steps(ch.cfg)
    rule = (
        f"until it has dropped and then either its rows are known ({known_text()}: more training cannot "
        f"undo them) or it has converged by the main run's rule (L_mask's fitted fall over {t.patience:,} "
        f"steps under {t.min_improvement:.0%} per 1,000 steps)"
    )
    if ch.drop is None:
        return f"{rule}, at most {cap:,} steps (analysis.freeze_steps; the main run did not drop)"
    return (
        f"{rule}, or until the main run's drop step ({ch.drop:,}) without a drop; at most {cap:,} steps "
        "(analysis.freeze_steps)"
    )


def runs_table(ch: Chapter, runs: dict[str, Path]):
    """One row per group: what it re-initialises and trains, its parameter count, its folder."""
    post = ch.post
    table = pd.DataFrame(
        {
            "group": list(DESCRIPTIONS),
            "re-initialised and trained": list(DESCRIPTIONS.values()),
            "parameters": [f"{trainable_count(post, g):,}" for g in DESCRIPTIONS],
            "run folder": [shown_path(runs[g]) for g in DESCRIPTIONS],
        }
    )
    t = ch.cfg.train
    return table.style.hide(axis="index").set_caption(
        f"One run per group: from the post-shift checkpoint (step {ch.steps.post:,}), {length_text(ch)}, "
        f"{t.batch} fresh matrices a step, Adam lr {t.lr:g}, on {ch.device.type}. Layer norms and the "
        "read-out belong to no group: they stay frozen in every run."
    )


def summary(ch: Chapter, runs: dict[str, Path]) -> pd.DataFrame:
    """`freeze_summary`: one row per group (drop, steps, losses, starts_on_plateau)."""
    return freeze_summary(runs, ch.cfg)


def drops_of(table: pd.DataFrame) -> dict[str, int | None]:
    """{group: drop step or None} from `freeze_summary`'s table."""
    return {g: (None if pd.isna(d) else int(d)) for g, d in zip(table["group"], table["drop"])}


def freeze_figure(ch: Chapter, runs: dict[str, Path]) -> plt.Figure:
    """The four runs' L_mask curves, each drop marked (closed: glue it)."""
    fig = freeze_curves(
        {g: load_metrics(f) for g, f in runs.items()},
        drops_of(summary(ch, runs)),
        ch.cfg.data.rank,
        title=f"Re-initialise one component, freeze the rest ({ch.cfg.name}, seed {ch.cfg.seed})",
    )
    return closed(fig)


def results_table(ch: Chapter, runs: dict[str, Path]):
    """One row per group: what ended the run (`freeze_ends`), the paper's description, the losses."""
    table, ends = summary(ch, runs), freeze_ends(ch.cfg, ch.run_dir, tuple(runs))
    shown = table.assign(
        result=[ends[g].text for g in table["group"]], paper=[PAPER_E15[g] for g in table["group"]]
    )
    return (
        shown[["group", "result", "paper", *LOSSES, "starts_on_plateau"]]
        .style.hide(axis="index")
        .format({c: "{:.2e}" for c in LOSSES})
        .set_caption(
            f"What ended each run; L_mask over its first {DROP_WINDOW} steps; L_mask (± its standard "
            f"error) and L_obs over its last {ch.cfg.train.patience:,} (the convergence rule's window); "
            f"starts_on_plateau: the first {DROP_WINDOW} steps' L_mask is within {PLATEAU_BAND:.0%} "
            "of E[X²]."
        )
    )


def _runs_named(groups) -> str:
    """ "the mlp run" or "the mlp and token runs" (for a sentence)."""
    groups = list(groups)
    return (
        f"the {groups[0]} run" if len(groups) == 1 else f"the {', '.join(groups[:-1])} and {groups[-1]} runs"
    )


def ends_text(ends: dict[str, FreezeEnd]) -> str:
    """A sentence on what ended each run, from the end records, runs that ended alike named together."""
    alike: dict[str, list[str]] = {}
    for g, e in ends.items():
        alike.setdefault(e.text, []).append(g)
    agree = lambda text, gs: (
        text if len(gs) == 1 else text.replace(" its ", " their ")
    )  # several runs: their rows
    return (
        "What ended each run, from its end record: "
        + "; ".join(f"{_runs_named(gs)} {agree(text, gs)}" for text, gs in alike.items())
        + "."
    )


def tiers_text(order) -> str:
    """ "mlp and token, then attention, then positional" for tiers of groups, earliest first."""
    return ", then ".join(" and ".join(tier) for tier in order)


def order_text(verdict: str, pattern: dict[str, bool], any_drop: bool) -> str:
    """The sentence on the order of the drops from the ordering row's `verdict`; `pattern`
    (`paper_pattern`) says which end of the paper's order fails."""
    paper = f"the paper's order of the drops ({tiers_text(PAPER_E15_ORDER)})"
    margin = f"{MARGINS['ordering']:.0%}"
    if verdict == "n/a":
        return f"too short to check {paper}: {agreement(verdict)}"
    if verdict in POSITIVE.values():
        return (
            f"{paper}, each tier later than the one before by more than {margin} of its step, "
            f"{agreement(verdict)}"
        )
    first, last = _runs_named(PAPER_E15_ORDER[0]), _runs_named(PAPER_E15_ORDER[-1])
    fails = ([] if pattern["first_tier_first"] else [f"{first} do not drop before the others"]) + (
        [] if pattern["last_tier_last"] else [f"{last} does not drop last"]
    )
    why = (
        "no run dropped within the steps it could train"
        if not any_drop
        else "; ".join(fails) or f"the order holds, but not by {margin} of the later step"
    )
    return f"not {paper} by the scorecard's ordering rule, {agreement(verdict)}: {why}"


def _plateau_reading(row, group: str) -> str:
    if pd.isna(row["drop"]):
        return f"{drop_text(None, int(row['steps']))} (paper: {PAPER_E15[group]})"
    fall = "" if pd.isna(row["fall"]) else f", fall {int(row['fall']):,} steps"
    return (
        f"{drop_text(row['drop'], int(row['steps']))}: plateau {int(row['plateau']):,} steps{fall} "
        f"(paper: {PAPER_E15[group]}); a plateau when above {ABRUPT:g}"
    )


def _plateau_row(g: str, r: pd.Series) -> dict:
    """E15's plateau-over-fall row of the run that re-initialised `g` (`r`: its summary row)."""
    fall = None if pd.isna(r["fall"]) else int(r["fall"])
    ratio = None if pd.isna(r["drop"]) else (int(r["plateau"]) / max(1, fall) if fall is not None else 0.0)
    return claim(
        "E15",
        f"plateau / fall, {g} re-initialised",
        ratio,
        _plateau_reading(r, g),
        kind="direction",
        reference=ABRUPT,
        sense="below" if g in PAPER_E15_ORDER[0] else "above",
        na=None if ratio is not None else "the run did not drop: no plateau length to measure",
    )


def _recovery_row(g: str, r: pd.Series, end: FreezeEnd, dropped: bool, main: MainRun) -> dict:
    """E15's recovery row of the run that re-initialised `g`: its final L_mask over the main run's."""
    quick = g in PAPER_E15_ORDER[0]
    ok = main.final > 0 and math.isfinite(r["final_L_mask"])
    recovery = r["final_L_mask"] / main.final if ok else None
    se = (
        recovery * math.hypot(r["final_L_mask_se"] / r["final_L_mask"], main.final_se / main.final)
        if ok
        else None
    )
    return claim(
        "E15",
        f"final L_mask / the main run's, {g} re-initialised",
        recovery,
        f"it {end.text}; final L_mask {r['final_L_mask']:.3g} ± {r['final_L_mask_se']:.2g} "
        f"against the main run's {main.final:.3g} ± {main.final_se:.2g}"
        + (
            f" at step {main.stopped:,}, where it was stopped so that the runs start from its weights there"
            if main.stopped is not None
            else ""
        )
        + f"; it recovers when "
        f"below {SETTLE:g} (the paper shows this run {'converging' if quick else 'dropping'} "
        "but gives no final level: the main run's is the yardstick)",
        kind="direction",
        reference=SETTLE,
        sense="below",
        se=se,
        na=None
        if dropped
        else f"the run {end.text}: stopped before any drop, so its last level is the "
        "plateau's, never read as final (the paper shows this run dropping)",
    )


def _order_row(drops: dict[str, int | None], order: list[str], main: MainRun) -> dict:
    """E15's ordering row: the drops against the paper's tiers, n/a until all four runs are in."""
    # No run dropped and none could train as long as the main run took to drop: the order is untested.
    too_short = not order and (main.drop is None or main.cap < main.drop)
    missing = [
        g for tier in PAPER_E15_ORDER for g in tier if g not in drops
    ]  # runs not in yet (a GPU slice each)
    return claim(
        "E15",
        f"order of the drops: {tiers_text(PAPER_E15_ORDER)}",
        None,
        ", ".join(f"{g} {'no drop' if drops[g] is None else f'{drops[g]:,}'}" for g in drops),
        kind="ordering",
        values=dict(drops),
        order=PAPER_E15_ORDER,
        na=(
            f"{_runs_named(missing)} not in yet: the order needs all four"
            if missing
            else f"no run dropped within the {main.cap:,} steps it could train"
            if too_short
            else None
        ),
    )


def _found_text(drops: dict[str, int | None], order: list[str]) -> str:
    """The sentence on the order the runs dropped in (or that none did)."""
    if not order:
        return "none of the four runs dropped"
    rest = [g for g in drops if g not in order]
    return (
        "the runs dropped in the order "
        + ", ".join(f"{g} (step {drops[g]:,})" for g in order)
        + ("" if not rest else "; " + ", ".join(rest) + " did not drop")
    )


def _recover_text(drops: dict[str, int | None], recovery_rows: list[dict]) -> str:
    """The sentence on which runs recovered, by the verdicts of their recovery rows."""
    verdicts = {g: row_verdict(row) for g, row in zip(drops, recovery_rows)}
    recovered = [g for g, v in verdicts.items() if v in POSITIVE.values()]
    not_read = [g for g, v in verdicts.items() if v == "n/a"]
    others = [g for g in drops if g not in recovered and g not in not_read]
    recover_text = (
        f"{_runs_named(recovered).capitalize()} ended within {SETTLE:g}x of the main run's final L_mask"
        + ("." if not others else f"; {_runs_named(others)} did not.")
        if recovered
        else f"No run ended within {SETTLE:g}x of the main run's final L_mask."
        if others
        else ""
    )
    if not_read:
        recover_text = (
            f"{recover_text} {_runs_named(not_read).capitalize()} stopped before dropping: "
            f"{'its' if len(not_read) == 1 else 'their'} last level is not read as final."
        ).strip()
    return recover_text


def freeze_readings(
    table: pd.DataFrame, ends: dict[str, FreezeEnd], main: MainRun
) -> tuple[dict, list[dict]]:
    """(glue, rows): the closing sentences (found, verdict_text, main_text, recover_text) and
    E15's `scorecard.claim` rows, from `freeze_summary`'s table, `freeze_ends` and `MainRun`.

    Rules: plateau over fall below ABRUPT for the paper's first tier (mlp, token), above for the
    rest; recovery when final L_mask over the main run's is below SETTLE (n/a for a run stopped
    before it dropped: its last level is the plateau's); the drops in the paper's order, by the
    ordering rule's margin."""
    rows_of = table.set_index("group")
    drops = drops_of(table)
    order = sorted((g for g, d in drops.items() if d is not None), key=drops.get)
    plateau_rows = [_plateau_row(g, rows_of.loc[g]) for g in drops]
    recovery_rows = [_recovery_row(g, rows_of.loc[g], ends[g], drops[g] is not None, main) for g in drops]
    rows = [*plateau_rows, *recovery_rows, _order_row(drops, order, main)]
    main_text = (
        f"The main run, trained from scratch, dropped at step {main.drop:,}."
        if main.drop is not None
        else "The main run, trained from scratch, did not drop."
    )
    return {
        "found": _found_text(drops, order),
        "verdict_text": order_text(row_verdict(rows[-1]), paper_pattern(table), bool(order)),
        "main_text": main_text,
        "recover_text": _recover_text(drops, recovery_rows),
    }, rows


def e15_rows(
    runs: dict, ends: dict[str, FreezeEnd], cfg: Profile, end, main: pd.DataFrame, *, read
) -> list[dict]:
    """E15's rows, by `freeze_readings`, from runs trained elsewhere (the paper setting's slices):
    `runs` {group: folder}, their `ends`, `read` a folder's metrics; the yardstick is the source run
    (`cfg`, its `end` or None, its metrics `main`). The order reads n/a until all four are in."""
    stopped = None
    if end is not None:
        main = main[main["step"] <= end.step]
        stopped = end.step if end.ended in ("stopped", "cut") else None
    yardstick = main_run_from(main, cfg, find_drop(main, rank=cfg.data.rank), stopped)
    _, found = freeze_readings(freeze_summary(runs, cfg, read=read), ends, yardstick)
    return found


def readings(ch: Chapter, runs: dict[str, Path]) -> tuple[dict, list[dict]]:
    """(glue, rows): `freeze_readings`' glue plus ends_text and rules_text, and E15's rows."""
    ends = freeze_ends(ch.cfg, ch.run_dir, tuple(runs))
    glue, rows = freeze_readings(summary(ch, runs), ends, main_run(ch))
    glue["ends_text"] = ends_text(ends)
    glue["rules_text"] = rules_text()
    return glue, rows


def rules_text() -> str:
    """The rules E15's rows are judged by, as a sentence (from the constants they use)."""
    return (
        f"a run has a plateau when it sat on the copying level (within {BAND:.0%} of E[X²]) longer than its "
        f"fall then took (plateau over fall above {ABRUPT:g}, the rule chapter 01 calls a drop sudden by); "
        f"it recovers when its final L_mask is within {SETTLE:g}x the main run's; and the drops come in the "
        "paper's order, each tier later than the one before"
    )


def scorecard_table(ch: Chapter, rows: list[dict]):
    """Records `rows` in the run's scorecard; returns them with their verdicts, styled."""
    return recorded_table(
        ch.run_dir, rows, CHAPTER, columns=("id", "quantity", "kind", "ours", "verdict", "reading")
    )


def downloads(ch: Chapter, runs: dict[str, Path]) -> str:
    """MyST {download} links to each E15 run's metrics.csv and zipped final checkpoint."""
    parts = []
    for g, folder in runs.items():
        last = saved_steps(folder)[-1]
        links = download_links(ch.run_dir, [(folder / METRICS, METRICS)]) + checkpoint_links(
            ch, folder, last, f"final checkpoint (step {last:,}, zip)"
        )
        parts.append(f"{g}: {' and '.join(links)}")
    return f"Each run's files, to download: {'; '.join(parts)}."


# What this chapter declares to the machinery (mclib.book.spec; collected by mclib.chapters.registry).
SPEC = ChapterSpec(CHAPTER, runs_read=runs_read, e15_rows=e15_rows)
