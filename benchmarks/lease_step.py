"""The first thing a GPU lease runs after the kit: the training step of the paper's model, each
way it can run, checked against eager and timed, within a fixed budget (at most 120 s).

    python benchmarks/lease_step.py --budget-s 110 --out $OUT/lease_step.csv [--precision tf32]
                                    [--profile paper] [--variants eager,cuda-graph,...] [--batch B]
                                    [--full] [--resume]

Where the committed table (results/lease_step.csv, beside the ledger) measured this very step
(the same step files, torch, device and precision: mclib.lease.steptable), only eager and the
variant that table chose are checked and timed (~30 s, more where it compiles); `--full` measures
every variant regardless. The rows say which (`mode`: full or check) and carry that key.

Every variant trains a fresh run of the profile's seed (its initial weights, its batches) through
`mclib.core.step.train_step`, the loop's own step (`train.step`, `mclib.core.step.step_variant`):

  eager            the model of record, eagerly, at --precision (default: the ledger's, else the
                   profile's): the reference of every check; run twice, to show it repeats itself
  cuda-graph       the whole device step as one CUDA graph (mclib.core.graphstep): checked bit for bit
  bf16             eager under bf16 autocast, for the record (another precision: never trained on here)
  compile          torch.compile, default mode, Inductor's mix-order reduction off (pytorch/pytorch#178080)
  reduce-overhead  torch.compile(mode="reduce-overhead")

Checks (mclib.core.variants.compare): over 20 steps from the same weights and batches in this
process, cuda-graph bitwise (losses and parameters), the compiled ones within LOSS_RTOL on every
logged loss and UPDATE_RTOL on the parameter update; a compile that fell back to eager is reported
"fell back: <cause>" and fails its check. Times: CUDA events over --steps steps queued back to back
(ms_step), and the host's own time to enqueue one step, each from an idle device (host_ms_step:
back to back, a GPU-bound step fills the launch queue and the host's time reads as the device's).
Cheap variants run first; one that does not fit the budget left is skipped, and the table says so
and why.

No variant can lose the rows before it: the table is written whole (a temporary file, renamed)
after every row. A variant still running at its cap (three times its estimate, at least 30 s,
never past the budget + GRACE_S) is cut: its row says so, the variants after it say why they did
not run, the table is written and the process ends (exit EXIT_STOPPED). A variant whose error
leaves the device unusable (a sticky CUDA error: `device_error`) ends the measurement the same
way; cleanup that then raises is logged, not raised. Every failure's traceback goes to
OUT_errors.log beside the table. `--resume` measures only the variants the table at --out has no
row for (or "not run"): scripts/lease.sh issues it once after a cut, in a fresh process. Beside the table (--out), the
top kernels of 5 eager steps by self device time (torch.profiler): OUT_kernels.csv and .md.
mclib.lease.slices.pick_step reads the table: the slice trains with the fastest variant that passed.

On the CPU this is a rehearsal (tests/test_lease_step.py): the CUDA-only variants are skipped
("needs CUDA"), tf32 runs as fp32, the times are wall-clock and the kernel table is by CPU time.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from mclib.core.config import load_profile, profile_path  # noqa: E402
from mclib.core.repo import git_revision  # noqa: E402
from mclib.core.precision import resolve_device, set_precision  # noqa: E402
from mclib.core.step import CUDA_ONLY_STEPS  # noqa: E402
from mclib.core.variants import CHECK_STEPS, compare, device_error, initial_params, release, time_run, trace  # noqa: E402
from mclib.lease import steptable  # noqa: E402

LEDGER = ROOT / "results" / "paper-slices.yaml"
VARIANTS = ("eager", "cuda-graph", "bf16", "compile", "reduce-overhead")  # the order they run in: cheap first
COMPILED = ("compile", "reduce-overhead")
COMPILE_S = 60.0   # what a compile of the paper's step is assumed to take until one here has been timed
TOP_KERNELS = 30
GRACE_S = 10.0     # a variant still running this long past the budget's end is cut
MIN_CAP_S = 30.0   # a variant's cap: three times its estimate, at least this
EXIT_STOPPED = 3   # a variant hung or left the device unusable: the rows before it kept, the rest say why


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

    from mclib.core.step import train_step

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


class Table:
    """The rows measured so far, written whole to `out` (a temporary file, renamed) after every
    row; the failures' tracebacks appended to OUT_errors.log. Shared with `Cap`'s thread."""

    def __init__(self, out: Path | None, stamp: dict, note: str, kept: list[dict] = ()):
        self.out, self.stamp, self.note, self.rows = out, stamp, note, list(kept)
        self.lock = threading.RLock()

    def add(self, variant: str, status: str, **values) -> None:
        with self.lock:
            self.rows.append({"variant": variant, "status": status, "passed": False, "check": "",
                              "ms_step": float("nan"), "host_ms_step": float("nan"), "first_s": float("nan"),
                              **self.stamp, **values, "note": values.get("note", self.note)})
            r = self.rows[-1]
            print(f"{variant}: {status}" + (f", {r['ms_step']:.2f} ms a step (host {r['host_ms_step']:.2f})"
                                             if status == "ran" else "") + (f"; {r['check']}" if r["check"] else ""),
                  flush=True)
            self.write()

    def not_run(self, variants, why: str) -> None:
        for v in variants:
            self.add(v, f"not run: {why}")

    def write(self) -> None:
        if self.out is None:
            return
        with self.lock:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.out.with_name(f".tmp-{self.out.name}")
            pd.DataFrame(self.rows).to_csv(tmp, index=False)
            os.replace(tmp, self.out)

    def log_error(self, what: str, text: str) -> None:
        """`text` (a traceback) under a heading, appended to OUT_errors.log (stderr without --out)."""
        block = f"--- {what} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n{text.rstrip()}\n"
        if self.out is None:
            print(block, file=sys.stderr, flush=True)
            return
        with self.lock, open(self.out.with_name(self.out.stem + "_errors.log"), "a") as f:
            f.write(block)


class Cap:
    """A variant's wall-clock cap, kept by a thread of its own: a variant still running at its
    cap gets its row ("failed: still running at its cap"), the variants after it theirs ("not
    run: VARIANT hung"), the table is written and the process ends with EXIT_STOPPED. The
    thread runs even while the main one waits in a kernel or a compile."""

    def __init__(self, table: Table):
        self.table, self.armed = table, None
        self.cond = threading.Condition()
        threading.Thread(target=self._watch, daemon=True, name="lease_step cap").start()

    def arm(self, variant: str, cap_s: float, rest: list[str]) -> None:
        with self.cond:
            self.armed = (variant, time.time() + cap_s, cap_s, list(rest))
            self.cond.notify()

    def disarm(self) -> None:
        with self.cond:
            self.armed = None

    def _watch(self) -> None:
        with self.cond:
            while True:
                if self.armed is None:
                    self.cond.wait()
                    continue
                variant, until, cap_s, rest = self.armed
                if time.time() < until:
                    self.cond.wait(timeout=min(1.0, until - time.time()))
                    continue
                self.table.add(variant, f"failed: still running at its cap of {cap_s:.0f} s (hung, or far slower "
                                        "than its estimate)")
                self.table.not_run(rest, f"{variant} hung")
                self.table.log_error(variant, "".join(traceback.format_stack(sys._current_frames()[
                    threading.main_thread().ident])))
                print(f"lease_step: {variant} cut at its cap of {cap_s:.0f} s; the rows before it are in "
                      f"{self.table.out}", file=sys.stderr, flush=True)
                os._exit(EXIT_STOPPED)


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"


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
    ap.add_argument("--out", help="CSV of the table; the kernel table and the errors' log go beside it")
    ap.add_argument("--committed", help=f"the committed table (default: {steptable.COMMITTED} beside the ledger)")
    ap.add_argument("--full", action="store_true", help="every variant, even where the committed table stands")
    ap.add_argument("--resume", action="store_true", help="only the variants the table at --out has no row for")
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
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    key = steptable.key(name, precision)
    mode = "full"
    if not args.full:
        committed = Path(args.committed) if args.committed else Path(args.ledger).parent / steptable.COMMITTED
        chosen, line = steptable.stands(committed, key)
        print(f"lease_step: {line}" + ("" if chosen else ": the full table"), flush=True)
        if chosen is not None:
            mode, wanted = "check", ["eager"] + ([chosen] if chosen != "eager" else [])
    out = Path(args.out) if args.out else None
    kept: list[dict] = []
    if args.resume and out is not None and out.is_file():
        kept = [r for r in pd.read_csv(out).to_dict("records") if not str(r["status"]).startswith("not run")]
        print(f"lease_step: resumed: {', '.join(r['variant'] for r in kept)} kept from {out.name}", flush=True)
    done = {r["variant"] for r in kept}
    stamp = {"precision": precision, "batch": base.train.batch, "steps": args.steps, "check_steps": args.check_steps,
             **key, "mode": mode, "date": datetime.date.today().isoformat(), "git": git_revision(),
             "time": time.time()}
    table = Table(out, stamp, note, kept)
    cap = Cap(table)

    set_precision(device, precision)
    start = initial_params(base, device)
    later = [v for v in wanted if v != "eager" and v not in done]
    cap.arm("eager", max(t_end + GRACE_S - time.time(), MIN_CAP_S), later)
    t0 = time.time()
    ref = trace(base, device, "eager", args.check_steps)
    again = trace(base, device, "eager", args.check_steps)
    first_s = time.time() - t0
    repeat = compare(ref, again, start, exact=True)
    ms, host = time_run(again.run, args.steps)
    if "eager" not in done:
        table.add("eager", "ran", passed=True, check=f"the reference; run twice, {repeat.text}", ms_step=ms,
                  host_ms_step=host, first_s=first_s, loss_rel=repeat.loss_rel, update_rel=repeat.update_rel)
    cap.arm("kernels", max(t_end + GRACE_S - time.time(), MIN_CAP_S), later)  # the kernel table's own row if it hangs
    kernels = None
    try:
        kernels = kernel_table(again.run, device)
        if out is not None:
            kernels.to_csv(out.with_name(out.stem + "_kernels.csv"), index=False)
            out.with_name(out.stem + "_kernels.md").write_text(kernels.to_markdown(index=False, floatfmt=".3f") + "\n")
    except Exception as e:
        table.log_error("the kernel table", traceback.format_exc())
        print(f"lease_step: no kernel table ({_first_line(e)})", file=sys.stderr, flush=True)
    cap.disarm()
    del again
    step_s = ms / 1000
    compile_s = COMPILE_S
    stopped = False
    for i, variant in enumerate(later):
        if variant in CUDA_ONLY_STEPS and device.type != "cuda":
            table.add(variant, "skipped: needs CUDA")
            continue
        need = (args.check_steps + args.steps + 3) * step_s * 2 + 5 + (compile_s if variant in COMPILED else 0)
        left = t_end - time.time()
        if need > left:
            table.add(variant, f"skipped: needs about {need:.0f} s, {left:.0f} s of the budget left")
            continue
        profile = base.replace(**{"train.precision": "bf16"}) if variant == "bf16" else base
        step = "eager" if variant == "bf16" else variant
        cap.arm(variant, min(max(3 * need, MIN_CAP_S), t_end + GRACE_S - time.time()), later[i + 1:])
        got = None
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
                table.add(variant, "ran", passed=False, check=text, ms_step=ms, host_ms_step=host, first_s=took,
                          loss_rel=check.loss_rel, update_rel=check.update_rel, precision="bf16")
            else:
                table.add(variant, "ran" if not got.fell_back else f"fell back: {got.fell_back}", passed=check.passed,
                          check=check.text, ms_step=ms, host_ms_step=host, first_s=took, loss_rel=check.loss_rel,
                          update_rel=check.update_rel)
        except Exception as e:
            table.log_error(variant, traceback.format_exc())
            table.add(variant, f"failed: {_first_line(e)}")
        finally:
            cap.disarm()
            for what, clean in (("the graph", lambda: release(got.run) if got is not None else None),
                                ("the precision", lambda: set_precision(device, precision)),
                                ("the compile cache", lambda: torch._dynamo.reset() if variant in COMPILED else None),
                                ("the memory", lambda: torch.cuda.empty_cache() if device.type == "cuda" else None)):
                try:
                    clean()
                except Exception:
                    table.log_error(f"{variant}: cleaning up {what}", traceback.format_exc())
            got = None
        broken = device_error(device)
        if broken:
            table.not_run(later[i + 1:], f"the device is unusable after {variant}'s error ({broken})")
            stopped = True
            break
    frame = pd.DataFrame(table.rows)
    print(frame[["variant", "status", "passed", "ms_step", "host_ms_step", "first_s", "check"]].to_string(index=False))
    if kernels is not None:
        print(f"\ntop kernels of 5 eager steps ({'self device time' if device.type == 'cuda' else 'self CPU time'}):")
        print(kernels.head(12).to_string(index=False))
    return EXIT_STOPPED if stopped else 0


if __name__ == "__main__":
    sys.exit(main())
