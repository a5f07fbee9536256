"""mclib.analyses.precision: the arms of a precision study side by side, and a verdict that
comes out either way."""

import math

import pandas as pd
import pytest

from mclib.analyses.precision import arm_spread, verdict


def table(fp32: list[float], other: list[float]) -> tuple[pd.DataFrame, pd.Series]:
    runs = [f"fp32 s{i}" for i in range(len(fp32))] + [f"tf32 s{i}" for i in range(len(other))]
    t = pd.DataFrame({"final_L_mask": fp32 + other, "drop": [8000.0] * len(runs)}, index=runs)
    return t, pd.Series({r: r.split()[0] for r in runs})


def test_a_mean_inside_the_reference_seeds_range_is_inside():
    t, arm = table([0.010, 0.012, 0.014], [0.011, 0.013, 0.012])
    s = arm_spread(t, arm, "fp32", "tf32", ("final_L_mask", "drop"))
    row = s.loc["final_L_mask"]
    assert row["fp32_mean"] == pytest.approx(0.012) and row["fp32_se"] == pytest.approx(0.002 / math.sqrt(3))
    assert row["ratio"] == pytest.approx(1.0) and row["ratio_se"] > 0
    assert row["inside"] and verdict(s) == "inside"


def test_a_mean_outside_the_range_is_outside_and_decides_the_verdict():
    t, arm = table([0.010, 0.012, 0.014], [0.030, 0.032, 0.028])  # bf16's 3x, say
    s = arm_spread(t, arm, "fp32", "tf32", ("final_L_mask", "drop"))
    assert s.loc["final_L_mask", "ratio"] == pytest.approx(2.5) and not s.loc["final_L_mask", "inside"]
    assert s.loc["drop", "inside"] and verdict(s) == "outside"


def test_one_reference_run_has_no_spread_and_a_missing_column_is_named():
    t, arm = table([0.010], [0.011])
    s = arm_spread(t, arm, "fp32", "tf32", ("final_L_mask",))
    assert s.loc["final_L_mask", "inside"] is None and verdict(s) == "untested"
    with pytest.raises(ValueError, match="'L_mask_drop\\+500'"):
        arm_spread(t, arm, "fp32", "tf32", ("L_mask_drop+500",))
