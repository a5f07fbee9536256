"""The first thing a GPU lease runs after the kit: the training step of the paper's model, each
way it can run, checked against eager and timed, within a fixed budget (at most 120 s).

    python benchmarks/lease_step.py --budget-s 110 --out $OUT/lease_step.csv [--precision tf32]
                                    [--profile paper] [--variants eager,cuda-graph,...] [--batch B]

Every variant trains a fresh run of the profile's seed (its initial weights, its batches) through
`mclib.core.train.train_step`, the loop's own step (`train.step`, `mclib.core.train.step_variant`):

  eager            the model of record, eagerly, at --precision (default: the ledger's, else the
                   profile's): the reference of every check; run twice, to show it repeats itself
  cuda-graph       the whole device step as one CUDA graph (mclib.core.graphstep): checked bit for bit
  bf16             eager under bf16 autocast, for the record (another precision: never trained on here)
  compile          torch.compile, default mode, Inductor's mix-order reduction off (pytorch/pytorch#178080)
  reduce-overhead  torch.compile(mode="reduce-overhead")

Checks (mclib.core.train.compare): over 20 steps from the same weights and batches in this
process, cuda-graph bitwise (losses and parameters), the compiled ones within LOSS_RTOL on every
logged loss and UPDATE_RTOL on the parameter update; a compile that fell back to eager is reported
"fell back: <cause>" and fails its check. Times: CUDA events over --steps steps (ms_step), and the
host's time to enqueue them without waiting (host_ms_step). Cheap variants run first; one that does
not fit the budget left is skipped, and the table says so and why. Beside the table (--out), the
top kernels of 5 eager steps by self device time (torch.profiler): OUT_kernels.csv and .md.
mclib.lease.slices.pick_step reads the table: the slice trains with the fastest variant that passed.

On the CPU this is a rehearsal (tests/test_lease_step.py): the CUDA-only variants are skipped
("needs CUDA"), tf32 runs as fp32, the times are wall-clock and the kernel table is by CPU time.
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
import yaml  # noqa: E402

from mclib.core.config import load_profile, profile_path  # noqa: E402
from mclib.core.train import (CHECK_STEPS, CUDA_ONLY_STEPS, compare, initial_params, resolve_device,  # noqa: E402
                              set_precision, time_run, trace)

LEDGER = ROOT / "results" / "paper-slices.yaml"
VARIANTS = ("eager", "cuda-graph", "bf16", "compile", "reduce-overhead")  # the order they run in: cheap first
COMPILED = ("compile", "reduce-overhead")
COMPILE_S = 60.0   # what a compile of the paper's step is assumed to take until one here has been timed
TOP_KERNELS = 30


def ledger_defaults(path: Path) -> dict:
    """The ledger's profile and precision (what the lease's slice will train), if there is a ledger."""
    if not path.is_file():
        return {}
    raw = yaml.safe_load(path.read_text()) or {}
    return {k: raw[k] for k in ("profile", "precision") if k in raw}


def kernel_table(run, device: torch.device, steps: int = 5) -> pd.DataFrame:
    """The top operators and kernels of `steps` eager steps of `run`, by self device time on CUDA
    (self CPU time on the CPU), per step."""
    from torch.profiler import ProfilerActivity, profile

    from mclib.core.train import train_step

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            train_step([run])
            run.pending.clear()
        if cuda:
            torch.cuda.synchronize(device)
    rows = []
    for e in prof.key_averages():
        device_us = getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) if cuda else 0.0
        rows.append({"name": e.key, "calls_per_step": e.count / steps,
                     "self_device_ms_step": device_us / 1000 / steps,
                     "self_cpu_ms_step": e.self_cpu_time_total / 1000 / steps})
    df = pd.DataFrame(rows)
    key = "self_device_ms_step" if cuda else "self_cpu_ms_step"
    df = df[df[key] > 0].sort_values(key, ascending=False)
    df["share"] = df[key] / df[key].sum()
    return df.head(TOP_KERNELS).reset_index(drop=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=110.0, help="seconds for everything (default 110; at most 120)")
    ap.add_argument("--ledger", default=str(LEDGER), help="the slice ledger whose profile and precision are the default")
    ap.add_argument("--profile", help="default: the ledger's, else paper")
    ap.add_argument("--precision", help="the book's GPU precision to time (default: the ledger's, else the profile's)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"a subset of {','.join(VARIANTS)}, run in this order")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per variant (default 30)")
    ap.add_argument("--check-steps", type=int, default=CHECK_STEPS, help="steps each check compares (20)")
    ap.add_argument("--batch", type=int, help="override train.batch (the rehearsal's CPU run)")
    ap.add_argument("--out", help="CSV of the table; the kernel table goes beside it")
    args = ap.parse_args(argv)
    t_end = time.time() + min(args.budget_s, 120.0)
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in wanted if v not in VARIANTS]
    if unknown or "eager" not in wanted:
        ap.error(f"--variants: {', '.join(unknown) or 'eager (the reference) is missing'} (known: {', '.join(VARIANTS)})")
    ledger = ledger_defaults(Path(args.ledger))
    base = load_profile(profile_path(args.profile or ledger.get("profile", "paper")))
    device = resolve_device("auto")
    precision = args.precision or ledger.get("precision") or base.train.precision
    note = ""
    if precision == "tf32" and device.type != "cuda":
        precision, note = "fp32", "tf32 is CUDA's: the rehearsal runs fp32"
    over = {"train.precision": precision, "train.device": device.type, "train.compile": False}
    if args.batch:
        over["train.batch"] = args.batch
    base = base.replace(**over)
    stamp = {"precision": precision, "batch": base.train.batch, "steps": args.steps, "check_steps": args.check_steps,
             "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
             "torch": torch.__version__, "time": time.time()}
    rows: list[dict] = []

    def row(variant: str, status: str, **values) -> None:
        rows.append({"variant": variant, "status": status, "passed": False, "check": "", "ms_step": float("nan"),
                     "host_ms_step": float("nan"), "first_s": float("nan"), **stamp, **values,
                     "note": values.get("note", note)})
        r = rows[-1]
        print(f"{variant}: {status}" + (f", {r['ms_step']:.2f} ms a step (host {r['host_ms_step']:.2f})"
                                         if status == "ran" else "") + (f"; {r['check']}" if r["check"] else ""),
              flush=True)

    set_precision(device, precision)
    start = initial_params(base, device)
    t0 = time.time()
    ref = trace(base, device, "eager", args.check_steps)
    again = trace(base, device, "eager", args.check_steps)
    first_s = time.time() - t0
    repeat = compare(ref, again, start, exact=True)
    ms, host = time_run(again.run, args.steps)
    kernels = kernel_table(again.run, device)
    row("eager", "ran", passed=True, check=f"the reference; run twice, {repeat.text}", ms_step=ms, host_ms_step=host,
        first_s=first_s, loss_rel=repeat.loss_rel, update_rel=repeat.update_rel)
    del again
    step_s = ms / 1000
    compile_s = COMPILE_S
    for variant in [v for v in wanted if v != "eager"]:
        if variant in CUDA_ONLY_STEPS and device.type != "cuda":
            row(variant, "skipped: needs CUDA")
            continue
        need = (args.check_steps + args.steps + 3) * step_s * 2 + 5 + (compile_s if variant in COMPILED else 0)
        left = t_end - time.time()
        if need > left:
            row(variant, f"skipped: needs about {need:.0f} s, {left:.0f} s of the budget left")
            continue
        profile = base.replace(**{"train.precision": "bf16"}) if variant == "bf16" else base
        step = "eager" if variant == "bf16" else variant
        try:
            set_precision(device, profile.train.precision)
            t0 = time.time()
            got = trace(profile, device, step, args.check_steps)
            took = time.time() - t0
            check = compare(ref, got, start, exact=variant == "cuda-graph")
            ms, host = time_run(got.run, args.steps)
            if variant in COMPILED:
                compile_s = max(took, 10.0)
            if variant == "bf16":
                text = (f"for the record (another precision, never trained on here): losses {check.loss_rel:.1e}, "
                        f"update {check.update_rel:.1e} relative to eager in {precision}")
                row(variant, "ran", passed=False, check=text, ms_step=ms, host_ms_step=host, first_s=took,
                    loss_rel=check.loss_rel, update_rel=check.update_rel, precision="bf16")
            else:
                row(variant, "ran" if not got.fell_back else f"fell back: {got.fell_back}", passed=check.passed,
                    check=check.text, ms_step=ms, host_ms_step=host, first_s=took, loss_rel=check.loss_rel,
                    update_rel=check.update_rel)
            del got
        except Exception as e:
            row(variant, f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}")
        finally:
            set_precision(device, precision)
            if variant in COMPILED:
                torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    table = pd.DataFrame(rows)
    print(table[["variant", "status", "passed", "ms_step", "host_ms_step", "first_s", "check"]].to_string(index=False))
    print(f"\ntop kernels of 5 eager steps ({'self device time' if device.type == 'cuda' else 'self CPU time'}):")
    print(kernels.head(12).to_string(index=False))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out, index=False)
        kernels.to_csv(out.with_name(out.stem + "_kernels.csv"), index=False)
        out.with_name(out.stem + "_kernels.md").write_text(kernels.to_markdown(index=False, floatfmt=".3f") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
