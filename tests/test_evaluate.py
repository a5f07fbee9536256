"""mclib.analyses.evaluate: comparing training runs."""

import math

import pytest

from mclib.analyses.evaluate import evaluate
from mclib.core.checkpoints import load_checkpoint


def test_compare_runs_reads_the_drop_and_evaluates_the_last_checkpoints(smoke_run, smoke_profile, tmp_path):
    import shutil

    from mclib.analyses.evaluate import compare_runs
    from mclib.core.runs import load_metrics

    # a copy of the smoke run whose L_mask drops from the plateau (0.22, rank 2) to 0.01 after step 30:
    # the 50-step trailing mean falls below half the plateau at step 56
    dropped = tmp_path / "dropped"
    shutil.copytree(smoke_run, dropped)
    m = load_metrics(dropped)
    m["L_mask"] = [0.22 if s <= 30 else 0.01 for s in m["step"]]
    m.to_csv(dropped / "metrics.csv", index=False)

    table = compare_runs(
        {"a": smoke_run, "b": dropped}, after=(2, 10), n_matrices=64, seed=3, precisions=("fp32", "bf16")
    )
    assert list(table.index) == ["a", "b"]
    assert table.at["b", "steps"] == 60 and table.at["b", "drop"] == 56
    assert math.isnan(table.at["a", "drop"]) and math.isnan(table.at["a", "L_mask_drop+2"])
    assert table.at["b", "L_mask_drop+2"] == pytest.approx((22 * 0.22 + 28 * 0.01) / 50)  # steps 9-58
    assert math.isnan(table.at["b", "L_mask_drop+10"])  # past the run's end
    # the last checkpoints on the same fresh matrices, in fp32: equal weights, equal losses
    expected = evaluate(load_checkpoint(smoke_run, 60), smoke_profile.data, 64, seed=3)["L_mask"]
    assert table.at["a", "checkpoint_L_mask_fp32"] == table.at["b", "checkpoint_L_mask_fp32"] == expected
    # bf16 autocast: the same model, a less precise forward pass: close, not equal
    assert table.at["a", "checkpoint_L_mask_bf16"] == pytest.approx(expected, rel=0.05)
    assert table.at["a", "checkpoint_L_mask_bf16"] != expected
