"""The lease's step measurement (benchmarks/lease_step.py) rehearsed on the CPU with a tiny batch,
and how a slice picks its training variant from the table (mclib.lease.slices.pick_step)."""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pandas as pd

from mclib.lease import slices

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("lease_step", ROOT / "benchmarks" / "lease_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_measurement_rehearsed_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "lease_step.csv"
    _bench().main(["--budget-s", "60", "--profile", "smoke", "--batch", "4", "--steps", "3", "--check-steps", "3",
                   "--variants", "eager,cuda-graph,bf16,reduce-overhead", "--ledger", str(tmp_path / "no-ledger.yaml"),
                   "--out", str(out)])
    t = pd.read_csv(out).set_index("variant")
    assert list(t.index) == ["eager", "cuda-graph", "bf16", "reduce-overhead"]
    eager = t.loc["eager"]
    assert eager["status"] == "ran" and bool(eager["passed"]) and eager["ms_step"] > 0
    assert eager["check"] == "the reference; run twice, bitwise equal to eager over 3 steps"
    for v in ("cuda-graph", "reduce-overhead"):
        assert t.loc[v, "status"] == "skipped: needs CUDA" and not bool(t.loc[v, "passed"])
    bf16 = t.loc["bf16"]
    assert bf16["status"] == "ran" and not bool(bf16["passed"]) and bf16["check"].startswith("for the record")
    assert bf16["precision"] == "bf16" and eager["precision"] == "fp32"
    kernels = pd.read_csv(tmp_path / "lease_step_kernels.csv")
    assert len(kernels) > 5 and (kernels["self_cpu_ms_step"] > 0).all()
    assert (tmp_path / "lease_step_kernels.md").read_text().startswith("| name")
    assert slices.pick_step(out, "fp32", "cpu") == ("eager", "training variant: eager, "
                                                    f"{eager['ms_step']:.1f} ms a step at fp32, {eager['check']}",
                                                    eager["ms_step"])


def test_a_variant_that_does_not_fit_the_budget_is_skipped_and_says_why(tmp_path):
    out = tmp_path / "t.csv"
    _bench().main(["--budget-s", "0.01", "--profile", "smoke", "--batch", "2", "--steps", "1", "--check-steps", "1",
                   "--variants", "eager,bf16", "--ledger", str(tmp_path / "none.yaml"), "--out", str(out)])
    t = pd.read_csv(out).set_index("variant")
    assert t.loc["eager", "status"] == "ran"  # the reference always runs
    assert t.loc["bf16", "status"].startswith("skipped: needs about")


def _table(path: Path, rows: list[dict], age_s: float = 0.0, device: str = "NVIDIA H100 80GB HBM3") -> Path:
    base = {"status": "ran", "precision": "tf32", "check": "", "time": time.time() - age_s, "device": device}
    pd.DataFrame([{**base, **r} for r in rows]).to_csv(path, index=False)
    return path


H100 = "NVIDIA H100 80GB HBM3"


def test_the_slice_trains_with_the_fastest_variant_that_passed(tmp_path):
    table = _table(tmp_path / "t.csv", [
        {"variant": "eager", "passed": True, "ms_step": 19.5, "check": "the reference"},
        {"variant": "cuda-graph", "passed": True, "ms_step": 8.9, "check": "bitwise equal to eager over 20 steps"},
        {"variant": "bf16", "passed": False, "ms_step": 6.0, "precision": "bf16"},  # for the record, never picked
        {"variant": "compile", "passed": False, "ms_step": 5.0, "status": "fell back: BackendCompilerFailed",
         "check": "fell back: BackendCompilerFailed"},  # faster, but it was eager in disguise
        {"variant": "reduce-overhead", "passed": True, "ms_step": 9.5}])
    assert slices.pick_step(table, "tf32", H100) == (
        "cuda-graph", "training variant: cuda-graph, 8.9 ms a step (eager 19.5) at tf32, bitwise equal to eager over 20 steps",
        8.9)


def test_without_a_passed_variant_or_a_fresh_table_the_slice_trains_eagerly_and_says_why(tmp_path):
    assert slices.pick_step(tmp_path / "none.csv", "tf32", H100) == (
        "eager", f"training variant: eager (no step table at {tmp_path / 'none.csv'})", None)
    failed = _table(tmp_path / "f.csv", [{"variant": "cuda-graph", "passed": False, "ms_step": 8.9}])
    assert slices.pick_step(failed, "tf32", H100)[1] == ("training variant: eager (no variant at tf32 passed its "
                                                         "check in f.csv)")
    other = _table(tmp_path / "p.csv", [{"variant": "cuda-graph", "passed": True, "ms_step": 8.9}])
    assert slices.pick_step(other, "fp32", H100)[0] == "eager"  # measured at another precision
    old = _table(tmp_path / "o.csv", [{"variant": "cuda-graph", "passed": True, "ms_step": 8.9}], age_s=7200)
    assert slices.pick_step(old, "tf32", H100) == ("eager", "training variant: eager (o.csv is from an earlier lease)", None)
    h200 = _table(tmp_path / "h.csv", [{"variant": "cuda-graph", "passed": True, "ms_step": 8.9}], device="NVIDIA H200")
    assert "was measured on NVIDIA H200" in slices.pick_step(h200, "tf32", H100)[1]
