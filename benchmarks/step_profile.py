"""Where a training step's time goes, and what one core's matrix products reach at the
model's own shapes (the realistic ceiling).

    python benchmarks/step_profile.py [--profiles cpu,cpu-7x7] [--paths eager,compiled] [--threads 1]
        [--steps 30] [--top N] [--out docs/data/step_profile.csv]

For each profile and each path (eager: `mclib.core.step.train_step`, the HF model and torch's
Adam, in fp32; compiled: the same through torch.compile, train.compile; both through
`step_function`; rows of docs/data/step_profile.csv with paths ref and fast are from revision
d54ea56 or earlier, where "fast" was the stacked copy of the model removed in 9842a40 (2026-11-26) and
"ref" the eager step), torch.profiler records `--steps` steps after
a warm-up, and every operator's self time goes into one bucket:

    matmul       mm, addmm, bmm, baddbmm (forward and backward products)
    attention    the attention kernels (sdpa, softmax) and their backward
    elementwise  GELU, layer norm, adds, multiplies, copies, reductions (forward and backward)
    optimiser    Adam (the time inside the optimiser's step, its own ops included)
    data         sampling the batch (matrices, masks, tokens)
    overhead     the rest of the wall time: Python, dispatch, autograd bookkeeping

plus the count of scalar reads to Python (`aten::item`, `_local_scalar_dense`) per step: on the
CPU these are Adam reading its step counters, which live on the CPU on every device, so
none of them waits for a device (the losses stay on the device until a log flush).

The ceiling: one-thread GFLOP/s of `[rows, in] @ [in, out]` for every product a step
makes (forward `x Wᵀ`, backward `g W` and `gᵀ x`), weighted by its FLOPs. A step cannot
beat (matmul FLOPs / that rate). Prints a table; appends rows to --out.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from mclib.core.config import load_profile, profile_path  # noqa: E402
from mclib.core.flops import train_step_flops  # noqa: E402
from mclib.core.variants import step_function  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from train_step import cpu_model  # noqa: E402

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
ATTENTION = ("scaled_dot_product", "softmax")
SCALAR_READS = ("aten::item", "aten::_local_scalar_dense")
BUCKETS = ("matmul", "attention", "elementwise", "optimiser", "data", "overhead")


def bucket_of(name: str) -> str:
    if name in MATMUL:
        return "matmul"
    if any(a in name for a in ATTENTION):
        return "attention"
    return "elementwise"


def step_fns(profile, device: torch.device):
    """eager / compiled: functions running one training step each way
    (`mclib.core.variants.step_function`), whose data and optimiser run in `record_function`
    regions of their own (mclib::data, mclib::optimiser) so the profile can tell them apart."""
    fp32 = {"train.precision": "fp32"}
    return {
        "eager": step_function(profile.replace(**fp32, **{"train.compile": False}), device),
        "compiled": step_function(profile.replace(**fp32, **{"train.compile": True}), device),
    }


def profile_step(fn, steps: int, top: int = 0) -> dict:
    """The step's buckets (ms a step); with `top`, also prints the `top` operators by self
    CPU time, per step, from the same recording."""
    for _ in range(5):
        fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        wall = (time.perf_counter() - t0) / steps * 1000
    if top:
        print_top(prof, steps, top, wall)
    out = dict.fromkeys(BUCKETS, 0.0)
    reads = 0
    for ev in prof.events():
        if ev.name.startswith("mclib::"):
            continue  # a region's time is its ops' time, counted below
        reads += ev.name in SCALAR_READS
        region, parent = None, ev.cpu_parent
        while parent is not None and region is None:
            region = parent.name[7:] if parent.name.startswith("mclib::") else None
            parent = parent.cpu_parent
        out[region or bucket_of(ev.name)] += ev.self_cpu_time_total / 1000 / steps
    profiled = sum(out[b] for b in BUCKETS if b != "overhead")
    out["overhead"] = max(0.0, wall - profiled)
    out["ms_step_profiled"] = wall
    out["scalar_reads_per_step"] = reads / steps
    return out


def region_of(ev) -> str | None:
    """The mclib::REGION (data, optimiser) an operator ran inside, or None."""
    parent = ev.cpu_parent
    while parent is not None:
        if parent.name.startswith("mclib::"):
            return parent.name[7:]
        parent = parent.cpu_parent
    return None


def print_top(prof, steps: int, top: int, wall: float) -> None:
    """A markdown table of the `top` operators by self CPU time: ms a step, share of the
    profiled step's wall time, calls a step, and the bucket each falls in (its region's, or
    its name's)."""
    time_of, calls = {}, {}
    for ev in prof.events():
        if ev.name.startswith("mclib::"):
            continue
        key = (ev.name, region_of(ev) or bucket_of(ev.name))
        time_of[key] = time_of.get(key, 0.0) + ev.self_cpu_time_total
        calls[key] = calls.get(key, 0) + 1
    print(
        f"\nop (self CPU time; the profiled step {wall:.1f} ms) | ms a step | share | calls a step | bucket"
    )
    print("|---|---:|---:|---:|---|")
    for key in sorted(time_of, key=time_of.get, reverse=True)[:top]:
        ms = time_of[key] / 1000 / steps
        print(f"| `{key[0]}` | {ms:.2f} | {100 * ms / wall:.1f} % | {calls[key] / steps:.0f} | {key[1]} |")


def ceiling(profile, reps: int = 30) -> tuple[float, float]:
    """FLOP-weighted one-thread GFLOP/s over every product of a step, and the step's matmul GFLOP."""
    m, d, t = profile.model, profile.data, profile.train
    rows = t.batch * d.n * d.n
    shapes = [
        (m.hidden, 3 * m.hidden),
        (m.hidden, m.hidden),
        (m.hidden, m.intermediate),
        (m.intermediate, m.hidden),
    ]
    total_flop, total_time = 0.0, 0.0
    for fan_in, fan_out in shapes:
        x, w, g = torch.randn(rows, fan_in), torch.randn(fan_out, fan_in), torch.randn(rows, fan_out)
        for a, b in ((x, w.t()), (g, w), (g.t(), x)):  # forward, input gradient, weight gradient
            flop = 2 * a.shape[0] * a.shape[1] * b.shape[1]
            for _ in range(3):
                a @ b
            t0 = time.perf_counter()
            for _ in range(reps):
                a @ b
            sec = (time.perf_counter() - t0) / reps
            total_flop += flop * m.layers
            total_time += sec * m.layers
    return total_flop / total_time / 1e9, total_flop / 1e9


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", default="cpu,cpu-7x7")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--top", type=int, default=0, help="also print the N operators with the most self CPU time"
    )
    ap.add_argument("--paths", default="eager,compiled")
    ap.add_argument("--out", default=str(ROOT / "docs" / "data" / "step_profile.csv"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    stamp = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "threads": args.threads,
        "torch": torch.__version__,
    }
    print("machine: " + ", ".join(f"{k} {v}" for k, v in stamp.items()), flush=True)
    rows = []
    for name in args.profiles.split(","):
        p = load_profile(profile_path(name))
        rate, mm_gflop = ceiling(p)
        flops = train_step_flops(p.model, p.data.n, p.train.batch) / 1e9
        print(
            f"{name}: matmul ceiling at the model's shapes {rate:.1f} GFLOP/s; a step's products "
            f"{mm_gflop:.2f} GFLOP of {flops:.2f} -> at least {1000 * mm_gflop / rate:.1f} ms",
            flush=True,
        )
        for path, fn in step_fns(p, device).items():
            if path not in args.paths.split(","):
                continue
            print(f"{name}, {path}:", flush=True)
            r = profile_step(fn, args.steps, args.top)
            rows.append(
                {
                    "profile": name,
                    "path": path,
                    **{b: r[b] for b in BUCKETS},
                    "ms_step_profiled": r["ms_step_profiled"],
                    "scalar_reads_per_step": r["scalar_reads_per_step"],
                    "ceiling_gflops": rate,
                    "matmul_floor_ms": 1000 * mm_gflop / rate,
                    "gflop_step": flops,
                    **stamp,
                }
            )
    df = pd.DataFrame(rows)
    print()
    print(
        df[
            ["profile", "path", *BUCKETS, "ms_step_profiled", "scalar_reads_per_step", "matmul_floor_ms"]
        ].to_markdown(index=False, floatfmt=".1f")
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, mode="a", header=not out.exists(), index=False)
    print(f"appended {len(df)} rows to {out}")


if __name__ == "__main__":
    main()
