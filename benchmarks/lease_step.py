"""The first minute of a GPU lease: ms per training step of the paper's model, the
training loop's own step, timed with CUDA events, within a fixed budget.

    python benchmarks/lease_step.py [--budget-s 60] [--profile paper] [--out FILE.csv]

Variants, in this order (each through `mclib.core.train.step_function`, exactly the step
the loop runs: the HF model, torch's fused Adam on CUDA; SDPA attention, the profile's own):
  tf32          TF32 matmuls
  bf16          bf16 autocast, fp32 master weights (for the record: not the book's)
  tf32-compile  the first through torch.compile (its compile time is printed apart)
Tables of leases before issue 38 (revision d54ea56 and earlier) have the variants stacked-tf32,
reference-tf32, stacked-bf16 and stacked-tf32-compile: "stacked" was a second copy of the model,
removed; "reference" is the step timed here.
A variant starts only while the budget has room for its warm-up; the table says which ran.
On the CPU (a rehearsal: tests/test_slices.py) the events are wall-clock and tf32 is fp32.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from mclib.core.config import load_profile, profile_path  # noqa: E402
from mclib.core.train import resolve_device, step_function  # noqa: E402

VARIANTS = {  # name: (train.precision, train.compile)
    "tf32": ("tf32", False),
    "bf16": ("bf16", False),
    "tf32-compile": ("tf32", True),
}


class Clock:
    """Elapsed ms of a block: CUDA events on a GPU (no host sync inside the block), else perf_counter."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn, n: int) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / n
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return 1000 * (time.perf_counter() - t0) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=60.0, help="seconds for everything (default 60)")
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per variant (default 30)")
    ap.add_argument("--batch", type=int, help="override train.batch (the rehearsal's CPU run)")
    ap.add_argument("--out", help="CSV to write the table to")
    args = ap.parse_args(argv)
    t_end = time.time() + args.budget_s
    base = load_profile(profile_path(args.profile))
    device = resolve_device("auto")
    clock = Clock(device)
    rows = []
    for name, (precision, compile_) in VARIANTS.items():
        if precision == "tf32" and device.type != "cuda":
            precision = "fp32"  # TF32 is CUDA's; the rehearsal times the same code in fp32
        left = t_end - time.time()
        slowest = max((r["ms_step"] for r in rows if r["ran"]), default=0.0)
        # room for warm-up and timing at the slowest rate so far; compiling the paper's step takes tens of seconds
        if rows and left < 3 * slowest * (args.steps + 3) / 1000 + (45 if compile_ else 0):
            rows.append({"variant": name, "ran": False, "note": f"skipped: {left:.0f} s of the budget left"})
            continue
        over = {"train.precision": precision, "train.compile": compile_,
                "train.device": device.type}
        if args.batch:
            over["train.batch"] = args.batch
        profile = base.replace(**over)
        step = step_function(profile, device)
        t0 = time.time()
        for _ in range(3):  # warm-up (and the compile)
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        warm = time.time() - t0
        ms = clock(step, args.steps)
        rows.append({"variant": name, "ran": True, "ms_step": ms, "warmup_s": warm, "batch": profile.train.batch,
                     "precision": precision, "steps": args.steps,
                     "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                     "torch": torch.__version__, "note": ""})
        print(f"{name}: {ms:.2f} ms a step ({args.steps} steps; warm-up {warm:.1f} s)", flush=True)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
