"""An estimate, not a measurement: the whole paper book's training on one GPU, its steps times a
step measured on a lease, in fp32 (an H100's) and in TF32 (the device's committed step table).

    python benchmarks/paper_book_time.py [--ledger results/paper-slices.yaml] [--device "NVIDIA H200"]

The steps (`book_steps`), from params/paper.yaml and the paper's numbers (mclib.core.paper):
seed 1 trains `train.steps`; each other seed of `analysis.seeds` stops `analysis.after_drop`
steps after its drop, taken at the paper's drop step (E1, ~15 000); E15's runs (one a group of
mclib.analyses.interventions.GROUPS) train at most `analysis.freeze_steps` each, so their part
is an upper bound (a run ends once it has dropped and converged, or at the main run's drop step
without a drop). The steps (`steps`), each measured on a lease:
  TF32  the committed step table's fastest passing variant of --device (default the ledger's
        `device`), else the ledger's `step_ms` (mclib.lease.slices.planning_step says which);
  fp32  eager fp32 in the step table of 2026-11-26 (docs/data/lease_step_h100_2026-11-26.csv,
        its row "reference-tf32": that benchmark did not set the precision, so its "tf32"
        rows ran fp32, TF32 off; docs/performance.md).
Not counted: the chapters (slice A's five took 151 s on the lease of 2026-11-26), the process's
start and its writes (1.05x the steps' own time in slice A).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

FP32_TABLE = ROOT / "docs" / "data" / "lease_step_h100_2026-11-26.csv"
FP32_ROW = "reference-tf32"  # the model of record, eager; it ran fp32 (see the docstring)


def book_steps(profile) -> dict[str, int]:
    """Training steps of the whole book of `profile` by part: {"seed 1": 50000, ...}; E15's part
    is its cap (the upper bound)."""
    from mclib.analyses.interventions import GROUPS
    from mclib.core.paper import PAPER

    t, a = profile.train, profile.analysis
    first, *others = a.seeds
    parts = {f"seed {first}": t.steps}
    for seed in others:
        parts[f"seed {seed}"] = (
            t.steps if a.after_drop is None else min(t.steps, PAPER[("E1", "drop step")] + a.after_drop)
        )
    parts[f"E15, {len(GROUPS)} runs (at most)"] = len(GROUPS) * a.freeze_steps
    return parts


def steps(
    ledger: dict, table: Path = FP32_TABLE, device: str | None = None, committed: Path | None = None
) -> dict[str, tuple[float, str]]:
    """{precision: (ms a step, where it was read)} for "fp32" (an H100's, module docstring) and
    "tf32": the step `slice status` plans with (`mclib.lease.slices.planning_step`: the committed
    step table's fastest passing variant of `device`, else the ledger's step_ms, saying why)."""
    from mclib.lease import slices, steptable

    t = pd.read_csv(table)
    fp32 = t[(t["variant"] == FP32_ROW) & (t["ran"].astype(str) == "True")]
    shown = table.relative_to(ROOT).as_posix() if table.is_relative_to(ROOT) else str(table)
    out = (
        {"fp32": (float(fp32["ms_step"].iloc[0]), f"{shown}, row {FP32_ROW} (eager, ran fp32, H100)")}
        if len(fp32)
        else {}
    )
    committed = committed or slices.LEDGER.parent / steptable.COMMITTED
    out["tf32"] = slices.planning_step(ledger, committed, device)
    return out


def estimate(profile, ledger: dict, table: Path = FP32_TABLE, device: str | None = None) -> pd.DataFrame:
    """One row a part of the book (and its total, and the total without E15): steps, and minutes
    at each precision's measured step."""
    parts = book_steps(profile)
    e15 = next(k for k in parts if k.startswith("E15"))
    parts["total without E15"] = sum(v for k, v in parts.items() if k != e15)
    parts["total (E15 at its cap)"] = parts["total without E15"] + parts[e15]
    rows = [
        {
            "part": k,
            "steps": v,
            **{f"{p} min": v * ms / 60_000 for p, (ms, _) in steps(ledger, table, device).items()},
        }
        for k, v in parts.items()
    ]
    return pd.DataFrame(rows).set_index("part")


def main(argv=None) -> int:
    from mclib.core.paper import profile as paper_profile
    from mclib.lease import slices

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--ledger", default=str(slices.LEDGER), help="the slice plan (its step_ms: the TF32 step)"
    )
    ap.add_argument(
        "--device", help="the GPU whose committed step table gives the TF32 step (default the ledger's)"
    )
    args = ap.parse_args(argv)
    ledger = slices.read_ledger(Path(args.ledger))
    device = args.device or ledger.get("device")
    print(
        "An estimate, not a measurement: training steps x a step measured on a lease (chapters not counted)."
    )
    for p, (ms, where) in steps(ledger, device=device).items():
        print(f"  {p}: {ms:.1f} ms a step ({where})")
    print(estimate(paper_profile(), ledger, device=device).to_markdown(floatfmt=",.0f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
