"""The lease's step measurement (benchmarks/lease_step.py) rehearsed on the CPU with a tiny batch,
and how a slice picks its training variant from the table (mclib.lease.slices.pick_step)."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
from sources import PLENTY_S, lease_step_args, load_script

from mclib.lease import slices

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    return load_script(ROOT / "benchmarks" / "lease_step.py")


def test_the_measurement_rehearsed_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "lease_step.csv"
    variants = [
        "eager",
        "matmul-attention",
        "ahead",
        "cuda-graph",
        "compile-graph",
        "bf16",
        "bf16-graph",
        "reduce-overhead",
    ]
    _bench().main(
        lease_step_args(PLENTY_S, ",".join(variants), tmp_path / "no-ledger.yaml", out, batch=4, steps=3)
    )
    t = pd.read_csv(out).set_index("variant")
    assert list(t.index) == variants
    eager = t.loc["eager"]
    assert eager["status"] == "ran" and bool(eager["passed"]) and bool(eager["bitwise"])
    assert eager["check"] == "the reference; run twice, bitwise equal to eager over 3 steps"
    for v in (
        "eager",
        "matmul-attention",
        "ahead",
    ):  # three timed windows, their median between their extremes
        assert (
            t.loc[v, "repeats"] == 3 and 0 < t.loc[v, "ms_min"] <= t.loc[v, "ms_step"] <= t.loc[v, "ms_max"]
        )
    assert bool(t.loc["ahead", "passed"]) and bool(
        t.loc["ahead", "bitwise"]
    )  # the same batches, the same bits
    assert bool(t.loc["matmul-attention", "passed"]) and t.loc["matmul-attention", "check"].startswith(
        "within tolerance"
    )
    for v in ("cuda-graph", "compile-graph", "bf16-graph", "reduce-overhead"):
        assert t.loc[v, "status"] == "skipped: needs CUDA" and not bool(t.loc[v, "passed"])
    bf16 = t.loc["bf16"]
    assert bf16["status"] == "ran" and not bool(bf16["passed"]) and bf16["check"].startswith("for the record")
    assert "3.15× fp32's final L_mask (docs/performance.md" in bf16["check"]
    assert bf16["precision"] == "bf16" and eager["precision"] == "fp32"
    kernels = pd.read_csv(tmp_path / "lease_step_kernels.csv")
    profiled = list(dict.fromkeys(kernels["variant"]))
    assert profiled[0] == "eager" and (kernels["ms_step"] > 0).all() and set(kernels["kind"]) == {"cpu op"}
    for v in profiled:  # each profiled row carries the sum of its profile's rows
        assert t.loc[v, "kernel_ms_step"] >= kernels[kernels["variant"] == v]["ms_step"].sum() * 0.999
    assert (tmp_path / "lease_step_kernels.md").read_text().startswith("| variant")
    host = pd.read_csv(tmp_path / "lease_step_host.csv")
    fastest = t[t["passed"].astype(bool) & t["precision"].eq("fp32")]["ms_step"].idxmin()
    assert set(host["variant"]) == {profiled[-1]} and len(host) > 5 and "mclib::data" in set(host["name"])
    assert profiled[-1] == fastest  # the host profile and the last kernel profile are the fastest that passed
    picked = slices.pick_step(out, "fp32", "cpu")
    assert picked.variant in (
        "eager",
        fastest,
    )  # slices.TRAINED_STEPS lists the variants a slice may train with
    assert slices.pick_step(out, "bf16", "cpu").variant == "eager"  # a record row is never trained on


def test_a_variant_that_does_not_fit_the_budget_is_skipped_and_says_why(tmp_path):
    out = tmp_path / "t.csv"
    _bench().main(lease_step_args(0.01, "eager,bf16", tmp_path / "none.yaml", out, steps=1))
    t = pd.read_csv(out).set_index("variant")
    assert t.loc["eager", "status"] == "ran"  # the reference always runs
    assert t.loc["bf16", "status"].startswith("skipped: needs about")


def _table(path: Path, rows: list[dict], age_s: float = 0.0, device: str = "NVIDIA H100 80GB HBM3") -> Path:
    base = {"status": "ran", "precision": "tf32", "check": "", "time": time.time() - age_s, "device": device}
    pd.DataFrame([{**base, **r} for r in rows]).to_csv(path, index=False)
    return path


H100 = "NVIDIA H100 80GB HBM3"


def test_the_slice_trains_with_the_fastest_variant_that_passed(tmp_path):
    table = _table(
        tmp_path / "t.csv",
        [
            {"variant": "eager", "passed": True, "ms_step": 19.5, "check": "the reference"},
            {
                "variant": "cuda-graph",
                "passed": True,
                "ms_step": 8.9,
                "check": "bitwise equal to eager over 20 steps",
            },
            {
                "variant": "bf16",
                "passed": False,
                "ms_step": 6.0,
                "precision": "bf16",
            },  # for the record, never picked
            {
                "variant": "compile",
                "passed": False,
                "ms_step": 5.0,
                "status": "fell back: BackendCompilerFailed",
                "check": "fell back: BackendCompilerFailed",
            },  # faster, but it was eager in disguise
            {"variant": "reduce-overhead", "passed": True, "ms_step": 9.5},
        ],
    )
    assert slices.pick_step(table, "tf32", H100) == (
        "cuda-graph",
        "training variant: cuda-graph, 8.9 ms a step (eager "
        "19.5) at tf32, bitwise equal to eager over 20 steps",
        8.9,
    )


def test_without_a_passed_variant_or_a_fresh_table_the_slice_trains_eagerly_and_says_why(tmp_path):
    assert slices.pick_step(tmp_path / "none.csv", "tf32", H100) == (
        "eager",
        f"training variant: eager (no step table at {tmp_path / 'none.csv'})",
        None,
    )
    failed = _table(tmp_path / "f.csv", [{"variant": "cuda-graph", "passed": False, "ms_step": 8.9}])
    assert slices.pick_step(failed, "tf32", H100)[1] == (
        "training variant: eager (no variant at tf32 passed its check in f.csv)"
    )
    other = _table(tmp_path / "p.csv", [{"variant": "cuda-graph", "passed": True, "ms_step": 8.9}])
    assert slices.pick_step(other, "fp32", H100)[0] == "eager"  # measured at another precision
    old = _table(tmp_path / "o.csv", [{"variant": "cuda-graph", "passed": True, "ms_step": 8.9}], age_s=7200)
    assert slices.pick_step(old, "tf32", H100) == (
        "eager",
        "training variant: eager (o.csv is from an earlier lease)",
        None,
    )
    h200 = _table(
        tmp_path / "h.csv", [{"variant": "cuda-graph", "passed": True, "ms_step": 8.9}], device="NVIDIA H200"
    )
    assert "was measured on NVIDIA H200" in slices.pick_step(h200, "tf32", H100)[1]


# --- the committed table: a lease measures the full table only when the step changed ------------


def _committed(path: Path, key: dict, rows: list[dict]) -> Path:
    pd.DataFrame(
        [
            {
                "status": "ran",
                "check": "",
                "time": time.time() - 86400,
                "mode": "full",
                "date": "2026-11-27",
                **key,
                **r,
            }
            for r in rows
        ]
    ).to_csv(path, index=False)
    return path


def test_where_the_committed_table_measured_this_step_only_eager_and_its_choice_are_checked(tmp_path, capsys):
    from mclib.lease import steptable

    key = steptable.key("cpu", "fp32")
    committed = _committed(
        tmp_path / "lease_step.csv",
        key,
        [
            {"variant": "eager", "passed": True, "ms_step": 10.0, "precision": "fp32"},
            {"variant": "compile", "passed": False, "ms_step": 5.0, "precision": "fp32"},
        ],
    )  # failed: eager is the choice
    out = tmp_path / "now.csv"
    args = lease_step_args(
        60, "eager,bf16,compile", tmp_path / "none.yaml", out, extra=("--committed", str(committed))
    )
    assert _bench().main(args) == 0
    t = pd.read_csv(out)
    assert list(t["variant"]) == ["eager"] and list(t["mode"]) == ["check"]
    assert "lease_step.csv of 2026-11-27 stands" in capsys.readouterr().out
    assert steptable.adopt(out, tmp_path / "adopted.csv") is None  # a check is not a table to commit
    # the step's files changed since: the full table
    _committed(
        committed,
        {**key, "step_hash": "0123456789ab"},
        [{"variant": "eager", "passed": True, "ms_step": 10.0, "precision": "fp32"}],
    )
    assert steptable.stands(committed, key) == (
        None,
        f"lease_step.csv measured another step: step_hash 0123456789ab -> {key['step_hash']}",
    )
    assert _bench().main(args) == 0
    t = pd.read_csv(out)
    assert list(t["variant"]) == ["eager", "bf16", "compile"] and set(t["mode"]) == {"full"}
    assert steptable.adopt(out, tmp_path / "adopted.csv").endswith(f"written as {tmp_path / 'adopted.csv'}")


def test_a_compiled_variant_trains_only_where_its_compile_pays_within_the_lease(tmp_path):
    table = _table(
        tmp_path / "t.csv",
        [
            {"variant": "eager", "passed": True, "ms_step": 19.5, "first_s": 2.0},
            {"variant": "cuda-graph", "passed": True, "ms_step": 8.0, "first_s": 3.0},
            {"variant": "compile", "passed": True, "ms_step": 5.0, "first_s": 100.0},
        ],
    )
    short = slices.pick_step(table, "tf32", H100, horizon_s=200)  # compile: 20 000 steps; the graph: 25 000
    assert short.variant == "cuda-graph" and short.why.endswith(
        "; compile (5.0 ms) passed over: its 100 s compile does not pay within 200 s"
    )
    assert (
        slices.pick_step(table, "tf32", H100, horizon_s=1000).variant == "compile"
    )  # 180 000 against 125 000


def test_a_variant_slow_to_compile_runs_only_where_the_committed_table_says_it_could_win_or_time_allows(
    tmp_path, monkeypatch
):
    """autotune-graph (max-autotune): where the committed table timed it no faster than the
    fastest variant that passed here, it is not run; where nothing says how long its compile takes,
    it is estimated at SLOW_COMPILE_S and skipped when that does not fit the budget left."""
    from mclib.lease import steptable

    bench = _bench()
    monkeypatch.setattr(bench, "CUDA_ONLY_STEPS", ())  # as on a GPU: the gate, not the device, decides
    args = lease_step_args(60, "eager,autotune-graph", tmp_path / "none.yaml", tmp_path / "t.csv")
    key = {**steptable.key("cpu", "fp32"), "step_hash": "0123456789ab"}  # another step: the full table runs
    committed = _committed(
        tmp_path / "c.csv",
        key,
        [
            {"variant": "eager", "passed": True, "ms_step": 1.0, "precision": "fp32"},
            {
                "variant": "autotune-graph",
                "passed": True,
                "ms_step": 1e6,
                "first_s": 5.0,
                "precision": "fp32",
            },
        ],
    )
    assert bench.main(args + ["--committed", str(committed)]) == 0
    row = pd.read_csv(tmp_path / "t.csv").set_index("variant").loc["autotune-graph"]
    assert row["status"].startswith("not run: the committed table's 1000000.00 ms a step cannot beat eager's")
    assert bench.main(args + ["--committed", str(tmp_path / "none.csv")]) == 0
    row = pd.read_csv(tmp_path / "t.csv").set_index("variant").loc["autotune-graph"]
    assert (
        row["status"].startswith("skipped: needs about ")
        and float(row["status"].split()[3]) > bench.SLOW_COMPILE_S
    )
