"""How chapters 02 and 03 show the loss tables of `mclib.analyses.loss_tables`: the two ablation
readings' names, the bars beside the paper's, the styled table, and which reading matches.
"""

from __future__ import annotations

import pandas as pd

from ..book.scorecard_rules import CLOSE
from ..core.data import copy_level
from ..core.paper import task as paper_task
from . import heads_plots

# The two readings of an ablation (docs/protocol.md §3), as tables, scorecard rows and sentences name them
READINGS = {"uniform": "uniform 1/n² (the text)", "batch_mean": "batch mean (the code)"}
READING_NAMES = {"uniform": "uniform (the paper's text)", "batch_mean": "batch mean (the released code)"}
SHORT = {"uniform": "uniform", "batch_mean": "batch-mean"}
PAPER_LEVEL = copy_level(
    paper_task().rank
)  # the paper's E[X²] (2/9): its losses' copying level, as ours is ch.copy_level


def loss_figure(table: pd.DataFrame, title: str, level: float):
    """L_obs and L_mask per row of `table` beside the paper's, each over its own task's E[X²]
    (ours `level`, the paper's `PAPER_LEVEL`)."""
    return heads_plots.loss_bars(
        list(table.model),
        {"L_obs": table["L_obs"], "L_mask": table["L_mask"]},
        errors={"L_obs": table["L_obs_se"], "L_mask": table["L_mask_se"]},
        paper={"L_obs": list(table["paper L_obs"]), "L_mask": list(table["paper L_mask"])},
        title=title,
        level=level,
        paper_level=PAPER_LEVEL,
    )


def matching_reading_text(verdicts: list[str], what: str) -> str:
    """Which ablation reading gives the paper's number, from the (uniform, batch mean) verdicts, e.g.
    "the uniform reading (the paper's text) matches X; the batch-mean reading (the released code)
    does not match it"; a row too close to tell says so."""
    names = {
        "uniform": "the uniform reading (the paper's text)",
        "batch_mean": "the batch-mean reading (the released code)",
    }
    said = {
        m: "match" if v == "matches" else "close" if v == CLOSE else "no"
        for m, v in zip(("uniform", "batch_mean"), verdicts)
    }
    if said["uniform"] == said["batch_mean"]:
        return {
            "match": f"both readings match {what}",
            "no": f"neither reading matches {what}",
            "close": f"both readings are too close to {what} to tell",
        }[said["uniform"]]
    first, other = sorted(said, key=lambda m: ("match", "close", "no").index(said[m]))
    full = {"match": f"matches {what}", "close": f"is too close to {what} to tell"}[said[first]]
    rest = {"close": "is too close to it to tell", "no": "does not match it"}[said[other]]
    return f"{names[first]} {full}; {names[other]} {rest}"


def loss_styler(
    table: pd.DataFrame, columns: list[str], numbers: list[str], caption: str, fmt: str = "{:.2e}"
):
    """`table[columns]` as the chapters show a loss table: no index, `numbers` in `fmt`, missing as —."""
    return (
        table[columns]
        .style.hide(axis="index")
        .format({c: fmt for c in numbers}, na_rep="—")
        .set_caption(caption)
    )


PAPER_COLUMNS = (
    "Paper columns: the paper's numbers on its own task, for orientation; the scorecard compares "
    "scale-free quantities."
)
