"""The benchmark scripts run, write the table they document, and refuse bad options.

Nothing here checks a speed (docs/performance.md holds the measurements); it checks that
the commands the docs give still work on the smoke profile, so the scripts cannot rot.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.slow  # each test starts a Python process that imports torch and trains

ROOT = Path(__file__).resolve().parent.parent


def run(script, *args, check=True):
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        check=check,
        cwd=ROOT,
    )


def test_train_step_dry_run_runs_every_path_and_writes_nothing(tmp_path):
    out = tmp_path / "perf.csv"
    res = run("train_step.py", "--dry-run", "--profiles", "smoke", "--out", str(out))
    for k in "abcd":
        assert f"smoke ({k})" in res.stdout
    assert "finite losses: False" not in res.stdout
    assert not out.exists()


def test_train_step_writes_the_documented_columns(tmp_path):
    out = tmp_path / "perf.csv"
    # (a) always runs, as every ratio's reference; leaving out (b) and (d) skips the bf16 ceiling
    run(
        "train_step.py",
        "--quick",
        "--profiles",
        "smoke",
        "--paths",
        "c",
        "--rounds",
        "2",
        "--warmup",
        "1",
        "--out",
        str(out),
    )
    df = pd.read_csv(out)
    assert list(df["path"].str[:3]) == ["(a)", "(c)"]
    assert (df["ms_step"] > 0).all() and (df["gflops"] > 0).all()
    assert (df.set_index(df["path"].str[1]).at["a", "t_over_a"]) == 1.0
    assert df["t_over_b"].isna().all()  # no (b): no ratio to it
    assert math.isnan(df["peak_bf16_gflops"].iloc[0]) and df["peak_fp32_gflops"].iloc[0] > 0
    assert df["profile"].eq("smoke").all() and df["rounds"].eq(2).all()


def test_train_step_rejects_an_unknown_path():
    res = run("train_step.py", "--dry-run", "--paths", "abx", check=False)
    assert res.returncode == 2
    assert "'abx'" in res.stderr and "'x'" in res.stderr


def test_cores_writes_a_row_per_configuration(tmp_path):
    out = tmp_path / "cores.csv"
    run("cores.py", "--profile", "smoke", "--seconds", "0.2", "--out", str(out))
    df = pd.read_csv(out)
    cores = os.cpu_count() or 1
    assert len(df) == 2 * (cores + 1)  # per attention: 1..cores threads, then `cores` processes
    assert df["processes"].max() == cores
    assert set(df["attention"]) == {"sdpa", "eager"}
    assert (df["ms_per_step"] > 0).all() and (df["runs_per_hour"] > 0).all()
