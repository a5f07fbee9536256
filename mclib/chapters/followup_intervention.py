"""The follow-up's intervention (chapter 07's last section, `mclib.chapters.followup`): the
attention-bias sweep (sweeps/attention-bias.yaml, `model.attn_bias`) read per setting, and its
scorecard rows F4a (a bias toward the row and column shortens the plateau) and F4b (the control,
toward the other keys, lengthens it): the mean drop step over the unbiased one's, a run without
a drop counted at its last step (a lower bound), judged with the error over seeds. followup.py
re-exports what it uses; the rules of every follow-up row are in its docstring.
"""

from __future__ import annotations

import math

import pandas as pd

from ..book.scorecard import claim
from ..core.repo import REPO
from ..core.sweep import load_sweep

ATTENTION_BIAS_SWEEP = REPO / "sweeps" / "attention-bias.yaml"
SOURCE = "Gopalani & Hu 2025, arXiv 2506.13688"
BIASED, CONTROL, UNBIASED = "rowcol-2.303", "other-2.303", "bias0"  # the sweep's settings F4 compares


def sweep_drops(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per setting: seeds, dropped, mean drop step (no drop: the last step, a lower bound) ± s.e."""
    rows = []
    for setting, t in sweep.groupby("setting"):
        steps = t["drop_step"].where(t["drop_step"].notna(), t["steps_run"]).astype(float)
        rows.append(
            {
                "setting": setting,
                "seeds": len(t),
                "dropped": int(t["drop_step"].notna().sum()),
                "drop_mean": float(steps.mean()),
                "drop_se": float(steps.std(ddof=1) / math.sqrt(len(t))) if len(t) > 1 else math.nan,
                "final_L_mask": float(t["final_L_mask"].mean()),
            }
        )
    return pd.DataFrame(rows)


def _ratio_row(id: str, quantity: str, drops: pd.DataFrame, *, setting: str, sense: str, what: str) -> dict:
    d = drops.set_index("setting")
    missing = [s for s in (setting, UNBIASED) if s not in d.index or d.loc[s, "seeds"] < 2]
    if missing:
        return claim(
            id,
            f"{quantity} ({SOURCE})",
            None,
            f"the follow-up: {what}",
            kind="finding",
            reference=1.0,
            sense=sense,
            na=f"the sweep has fewer than 2 finished seeds of {', '.join(missing)} "
            "(docs/data/attention_bias.csv)",
        )
    a, b = d.loc[setting], d.loc[UNBIASED]
    ratio = a["drop_mean"] / b["drop_mean"]
    se = ratio * math.sqrt((a["drop_se"] / a["drop_mean"]) ** 2 + (b["drop_se"] / b["drop_mean"]) ** 2)
    censored = int(a["seeds"] - a["dropped"]) + int(b["seeds"] - b["dropped"])
    reading = (
        f"mean drop {a['drop_mean']:,.0f} ({setting}, {int(a['dropped'])}/{int(a['seeds'])} dropped) over "
        f"{b['drop_mean']:,.0f} ({UNBIASED}, {int(b['dropped'])}/{int(b['seeds'])}) = {ratio:.2f} ± {se:.2f}"
        + (
            f"; {censored} run{'s' if censored > 1 else ''} without a drop counted at the last step "
            "(a lower bound)"
            if censored
            else ""
        )
        + f"; the follow-up: {what}"
    )
    return claim(
        id,
        f"{quantity} ({SOURCE})",
        float(ratio),
        reading,
        kind="finding",
        reference=1.0,
        sense=sense,
        se=float(se),
    )


def intervention_rows(sweep: pd.DataFrame | None, other_profile: str | None = None) -> list[dict]:
    """F4a and F4b. `other_profile`: the book's profile when the sweep trains another; the rows
    then say so and are not judged here."""
    drops = (
        sweep_drops(sweep) if sweep is not None and len(sweep) else pd.DataFrame(columns=["setting", "seeds"])
    )
    rows = [
        _ratio_row(
            "F4a",
            f"drop step, bias toward row and column ({BIASED}) / none",
            drops,
            setting=BIASED,
            sense="below",
            what="a bias toward the optimal keys (c above 1) shortens the plateau (its figures 3-4)",
        ),
        _ratio_row(
            "F4b",
            f"drop step, bias toward the other keys ({CONTROL}) / none",
            drops,
            setting=CONTROL,
            sense="above",
            what="a bias away from them (c below 1) lengthens it (its figures 3-4)",
        ),
    ]
    if (
        other_profile is not None
    ):  # the sweep's numbers are another profile's: none of them in this book's column
        for r in rows:
            r.update(
                ours=None,
                se=None,
                reading=r["reading"][r["reading"].find("the follow-up:") :],
                na=f"the attention-bias sweep trains the {sweep_base()} profile, not this book's "
                f"{other_profile}; its rows are judged in the {sweep_base()} book",
            )
    return rows


def sweep_base() -> str:
    """The profile the attention-bias sweep trains (its file's `base`)."""
    return load_sweep(ATTENTION_BIAS_SWEEP)[0].profile.name
