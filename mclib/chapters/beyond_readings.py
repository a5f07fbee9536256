"""Chapter 07's drop over seeds, in words and as a scorecard row (`mclib.chapters.ch07_beyond`
re-exports them): `seeds_text`, the sentence on when the seeds dropped (every one, some, or
none, with mean ± SD and the earliest and latest), and `seeds_row`, E1 over seeds, the mean and
sample SD of the drop step over the seeds that dropped against the paper's one run; over one
seed that row is n/a (`ONE_SEED`): it is E1's own row, counted in chapter 01.
"""

from __future__ import annotations

import numpy as np

from ..book.scorecard_tables import plural
from .ch01_train import drop_step_claim


def _listing(seeds) -> str:
    return ", ".join(str(s) for s in seeds)


def seeds_text(drops: dict, steps: int) -> str:
    """The sentence on the drop over seeds: all dropped (mean ± SD, earliest, latest), some, or none."""
    dropped = [s for s in drops if drops[s] is not None]
    late = [s for s in drops if drops[s] is None]
    at = np.array([drops[s] for s in dropped], dtype=float)
    mean = float(at.mean()) if dropped else None
    std = float(at.std(ddof=1)) if len(dropped) > 1 else None
    if len(dropped) == len(drops) == 1:
        return f"the one seed dropped at step {mean:,.0f} ({mean / steps:.0%} of the {steps:,} steps)"
    if len(dropped) == len(drops):
        return (
            f"every seed dropped, at step {mean:,.0f} ± {std:,.0f} (mean ± standard deviation; "
            f"{mean / steps:.0%} of the {steps:,} steps), the earliest at step {at.min():,.0f} and "
            f"the latest at step {at.max():,.0f}"
        )
    if dropped:
        which = (
            f"seed {dropped[0]}, at step {mean:,.0f}"
            if len(dropped) == 1
            else f"seeds {_listing(dropped)}, on average at step {mean:,.0f} ± {std:,.0f}"
        )
        return (
            f"{len(dropped)} of {len(drops)} seeds dropped ({which}), while "
            f"seed{'s' if len(late) > 1 else ''} "
            f"{_listing(late)} had not dropped by step {steps:,}: a mean over the seeds that dropped leaves "
            "the late ones out, so it is too early"
        )
    return (
        f"no seed dropped within the {steps:,} steps of this profile, so there is no drop step to "
        "average and the spread of the drop over seeds is unknown"
    )


def seeds_row(drops: dict, profile) -> dict:
    """E1 over seeds: mean and sample SD of the drop step over the seeds that dropped, against the
    paper's one run (`ch01_train.drop_step_claim`)."""
    dropped = [d for d in drops.values() if d is not None]
    mean = float(np.mean(dropped)) if dropped else None
    std = float(np.std(dropped, ddof=1)) if len(dropped) > 1 else None
    reading = (
        (
            f"mean {mean:,.0f}" + (f" ± {std:,.0f}" if std is not None else "") + " steps; "
            f"{len(dropped)} of {plural(len(drops), 'seed')} dropped"
        )
        if dropped
        else f"no drop in {plural(len(drops), 'seed')}"
    )
    row = drop_step_claim("drop step, over seeds", mean, reading, profile, spread=std)
    return row if row.get("na") or len(drops) > 1 else {**row, "na": ONE_SEED}


# Over one seed, the drop over seeds is the book's run's drop step, E1's own row: counted there once.
ONE_SEED = (
    'one seed: its drop step is E1\'s "drop step" row (chapter 01), counted there, not twice; '
    "a spread needs two seeds"
)
