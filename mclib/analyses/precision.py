"""Does a training precision change the science? Two arms of one profile (a reference
precision and another), several seeds each, compared measure by measure: `arm_spread` on
`evaluate.compare_runs`' rows, and `verdict` (the other arm's means inside the reference's
seed range: docs/performance.md). `read_study` and `study_effect` read back a committed
study (docs/data/tf32_study.csv, scripts/tf32_study.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

MEASURES = (
    "drop",
    "plateau_L_mask",
    "L_mask_drop+500",
    "L_mask_drop+1000",
    "L_mask_drop+2000",
    "L_mask_drop+4000",
    "final_L_mask",
)


def arm_spread(
    table: pd.DataFrame, arm: pd.Series, reference: str, other: str, measures: tuple[str, ...] = MEASURES
) -> pd.DataFrame:
    """One row per measure of `table` (`compare_runs`' rows; `arm` names each run's arm): each
    arm's n, mean, se, min, max (NaNs left out); ratio other / reference of the means with
    ratio_se (relative errors in quadrature); `inside`: the other arm's mean lies within the
    reference's seed range (None with fewer than two reference runs)."""
    unknown = set(measures) - set(table.columns)
    if unknown:
        raise ValueError(f"arm_spread: the table has no column {sorted(unknown)[0]!r}")
    rows = []
    for name in measures:
        row = {"measure": name}
        stats = {}
        for label in (reference, other):
            v = table.loc[arm == label, name].dropna().astype(float)
            n = len(v)
            sd = float(v.std(ddof=1)) if n > 1 else math.nan
            stats[label] = (float(v.mean()) if n else math.nan, sd / math.sqrt(n) if n > 1 else math.nan)
            row.update(
                {
                    f"{label}_n": n,
                    f"{label}_mean": stats[label][0],
                    f"{label}_se": stats[label][1],
                    f"{label}_min": float(v.min()) if n else math.nan,
                    f"{label}_max": float(v.max()) if n else math.nan,
                }
            )
        (m_ref, se_ref), (m_oth, se_oth) = stats[reference], stats[other]
        ratio = m_oth / m_ref if m_ref else math.nan
        row["ratio"] = ratio
        row["ratio_se"] = (
            abs(ratio) * math.hypot(se_ref / m_ref, se_oth / m_oth) if m_ref and m_oth else math.nan
        )
        enough = row[f"{reference}_n"] > 1 and row[f"{other}_n"] > 0
        row["inside"] = bool(row[f"{reference}_min"] <= m_oth <= row[f"{reference}_max"]) if enough else None
        rows.append(row)
    return pd.DataFrame(rows).set_index("measure")


def verdict(spread: pd.DataFrame) -> str:
    """ "inside" when every measure's mean of the other arm lies inside the reference's seed
    range, "outside" when any does not, "untested" when no measure could be judged."""
    judged = [v for v in spread["inside"] if v is not None]
    if not judged:
        return "untested"
    return "inside" if all(judged) else "outside"


# --- the study as committed: docs/data/tf32_study.csv ----------------------------------------

# The measure the paper's final numbers are: the last checkpoint's L_mask on fresh matrices,
# evaluated in fp32 (scripts/tf32_study.py's `checkpoint_L_mask_fp32`).
FINAL = "checkpoint_L_mask_fp32"


@dataclass(frozen=True)
class Effect:
    """One measure of a committed precision study: ratio ± se of the arms' seed means, n runs
    an arm, paired (the same seeds in both arms) and inside (`arm_spread`)."""

    measure: str
    reference: str
    other: str
    ratio: float
    se: float
    n: int
    paired: bool
    inside: bool | None

    def text(self, task: str = "the laptop task") -> str:
        """ "TF32 on the laptop task: final checkpoint 0.63 ± 0.15× fp32's, paired, 3 seeds"."""
        what = "final checkpoint" if self.measure == FINAL else self.measure
        return (
            f"{self.other.upper()} on {task}: {what} {self.ratio:.2f} ± {self.se:.2f}× {self.reference}'s, "
            f"{'paired, ' if self.paired else ''}{self.n} seeds"
        )


def read_study(path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, arms) of a study table as scripts/tf32_study.py writes it, indexed by run or measure."""
    t = pd.read_csv(path, index_col=[0, 1])
    return t.loc["runs"].dropna(axis=1, how="all"), t.loc["arms"].dropna(axis=1, how="all")


def study_effect(path, measure: str = FINAL, reference: str = "fp32", other: str = "tf32") -> Effect:
    """`Effect` of `measure` in the study table at `path` (`read_study`). Paired where every
    seed of one arm ("tf32 s2") has its twin in the other ("fp32 s2")."""
    runs, arms = read_study(path)
    if measure not in arms.index:
        raise ValueError(f"{path}: no measure {measure!r} among the arms' rows ({', '.join(arms.index)})")
    row = arms.loc[measure]
    seeds = {
        label: {r.split(" ", 1)[1] for r in runs.index if r.startswith(f"{label} ")}
        for label in (reference, other)
    }
    inside = row.get("inside")
    return Effect(
        measure,
        reference,
        other,
        float(row["ratio"]),
        float(row["ratio_se"]),
        int(min(row[f"{reference}_n"], row[f"{other}_n"])),
        bool(seeds[reference]) and seeds[reference] == seeds[other],
        None if pd.isna(inside) else str(inside) == "True",
    )
