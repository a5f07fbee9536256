"""How far rounding alone moves one run: one seed, data stream and model trained under changes
that alter only float arithmetic (float path, threads, attention kernel, TF32, Adam's kernel). A verdict must
not turn on a difference smaller than this spread (`mclib.book.scorecard_rules`: `rounding`).

    study()               the default profile's seed 1 under each change (docs/data/rounding.csv):
                          a Spread per quantity
    spread(values, ...)   the Spread of any set of readings of one quantity
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..core.config import load_profile
from ..core.packaged import data_file, profile_file

TABLE = data_file("rounding.csv")  # docs/data/ in a checkout
# the study's columns -> what they read
QUANTITIES = {
    "drop": "the drop step",
    "ended_at": "the step the convergence rule ends the run",
    "L_mask_drop+2000": "the training L_mask 2,000 steps after the drop",
    "final_L_mask": "the final training L_mask (last tenth of the steps)",
    "cap_final_L_mask": "the final training L_mask at the cap (the runs the rule ended sooner, trained on)",
    "checkpoint_L_mask_fp32": "the last checkpoint's L_mask on fresh matrices",
}


@dataclass(frozen=True)
class Spread:
    """One quantity read under several changes that alter only rounding: its lowest and highest
    reading, how many readings, and what they were (in words)."""

    quantity: str
    lo: float
    hi: float
    n: int
    where: str

    @property
    def range(self) -> float:
        return self.hi - self.lo

    @property
    def factor(self) -> float:
        """hi / lo: how far apart the readings are as a factor (a level's spread)."""
        return self.hi / self.lo if self.lo > 0 else math.inf

    def around(self, ours: float, relative: bool) -> float:
        """The spread in `ours`' units: the range, or, `relative`, ours × (factor − 1)."""
        return ours * (self.factor - 1) if relative else self.range

    def text(self, steps: bool) -> str:
        if steps:
            return (
                f"rounding alone moved {self.quantity} between {self.lo:,.0f} and {self.hi:,.0f} "
                f"({self.range:,.0f} steps; {self.n} runs: {self.where})"
            )
        return (
            f"rounding alone moved {self.quantity} between {self.lo:.3g} and {self.hi:.3g} "
            f"({self.factor:.2f}x; {self.n} runs: {self.where})"
        )


def spread(values: dict[str, float], quantity: str, what: str = "") -> Spread | None:
    """The Spread of `values` (label -> reading; missing ones left out); None under two readings."""
    got = {
        k: float(v)
        for k, v in values.items()
        if v is not None and not (isinstance(v, float) and math.isnan(v))
    }
    if len(got) < 2:
        return None
    return Spread(quantity, min(got.values()), max(got.values()), len(got), what or ", ".join(got))


def study(path: Path = TABLE) -> dict[str, Spread]:
    """{column: Spread} of the default profile's seed 1 under the study's changes (QUANTITIES);
    {} where the table is not there or holds fewer than two runs."""

    if not Path(path).is_file():
        return {}
    t = pd.read_csv(path, index_col=0)
    paths = sorted(set(t["float_path"].astype(str).str.split(" ").str[0])) if "float_path" in t else []
    where = f"seed 1 of the default profile under {', '.join(map(str, t.index))}" + (
        f"; float paths {', '.join(paths)}" if paths else ""
    )
    out = {}
    for column, quantity in QUANTITIES.items():
        if column in t:
            s = spread(t[column].to_dict(), quantity, where)
            if s is not None:
                out[column] = s
    return out


def early_flat(path: Path = TABLE) -> str:
    """Where the convergence rule ended one change's run first and at the highest final level of all
    (a flat the other runs fell through), one clause saying so, and, where the study trained that run
    on to the cap (`cap_final_L_mask`), whether it fell from there (the flat was a pause the rule took
    for the end) or stayed (a level of its own); "" otherwise or without the table."""

    if not Path(path).is_file():
        return ""
    t = pd.read_csv(path, index_col=0)
    if len(t) < 2 or not {"ended_at", "final_L_mask"} <= set(t.columns):
        return ""
    first = t["ended_at"].idxmin()
    if t["final_L_mask"].idxmax() != first or (t["ended_at"] == t.loc[first, "ended_at"]).sum() > 1:
        return ""
    others, row = t.drop(index=first), t.loc[first]
    said = (
        f"the run under {first} ended first, at step {row['ended_at']:,.0f}, on a flat at L_mask "
        f"{row['final_L_mask']:.3g} that the others fell through (they ended at "
        f"{others['final_L_mask'].min():.3g} to {others['final_L_mask'].max():.3g})"
    )
    cap, at_cap = row.get("cap_step", math.nan), row.get("cap_final_L_mask", math.nan)
    if pd.isna(cap) or pd.isna(at_cap) or cap <= row["ended_at"]:
        return said
    # flat by the rule's own measure (the default profile's, which the study trains): a fall under
    # min_improvement per 1 000 steps, compounded over the steps trained on
    min_improvement = load_profile(profile_file("cpu")).train.min_improvement
    flat_floor = row["final_L_mask"] * (1 - min_improvement) ** ((cap - row["ended_at"]) / 1000)
    if at_cap < flat_floor:
        return said + (
            f"; trained on to the cap ({cap:,.0f} steps) it fell to {at_cap:.3g}: the rule took a pause "
            "longer than its two windows for the end"
        )
    return said + f"; trained on to the cap ({cap:,.0f} steps) it stayed at {at_cap:.3g}: a level of its own"


def finding(spreads: dict[str, Spread], flat: str = "") -> str:
    """The training chapter's sentences on how far rounding alone moved the default profile's seed 1
    (`study`), or one sentence saying it is not measured."""
    drop, end, final = (spreads.get(k) for k in ("drop", "ended_at", "final_L_mask"))
    if drop is None:
        return (
            "How far rounding alone moves a run is not measured in this checkout (scripts/rounding_study.py "
            "writes docs/data/rounding.csv)."
        )
    said = [
        f"Rounding alone moves this story: seed 1 of the default profile, trained {drop.n} times with only "
        "the "
        f"float arithmetic changed between them ({drop.where.split(' under ', 1)[-1]}), dropped between "
        f"step {drop.lo:,.0f} and "
        f"{drop.hi:,.0f}, {drop.range:,.0f} steps apart"
    ]
    if end is not None:
        said.append(f"its convergence rule ended it between step {end.lo:,.0f} and {end.hi:,.0f}")
    after = spreads.get("L_mask_drop+2000")
    if after is not None:
        said.append(
            f"2,000 steps after its drop its training L_mask lay between {after.lo:.3g} and {after.hi:.3g}, "
            f"a factor {after.factor:.2f} apart"
        )
    if final is not None:
        said.append(
            f"its final training L_mask, where the rule ended it, lay between {final.lo:.3g} and "
            f"{final.hi:.3g}, a factor {final.factor:.2f} apart"
        )
    cap = spreads.get("cap_final_L_mask")
    if cap is not None and final is not None and cap.n == final.n:
        said.append(
            f"trained on to the cap, its final training L_mask lay between {cap.lo:.3g} and {cap.hi:.3g}, a "
            f"factor {cap.factor:.2f} apart"
        )
    if flat:
        said.append(flat)
    return (
        "; ".join(said)
        + ". A one-bit change of the initial weights is known to vary a trained network as much "
        "as a new seed does (Summers & Dinneen, ICML 2021); how far rounding moves an abrupt drop is, as "
        "far as we "
        "know, not reported elsewhere. The scorecard judges the drop step and every final level against this "
        "spread: where the paper's value lies within it of ours, the row reads too close to tell."
    )
