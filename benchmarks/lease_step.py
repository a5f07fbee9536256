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
`mclib.core.step.train_step`, the loop's own step (`train.step`, `mclib.core.step.WAYS`); the rows
(mclib.lease.stepbench.SPECS, in the order they run):

  eager                  the model of record, eagerly, at --precision (default: the ledger's, else
                         the profile's): the reference of every check; run twice, to show it repeats
  matmul-attention       attention as plain matmuls and a softmax (TF32 in tf32) for sdpa's fp32 kernels
  ahead                  batches made ahead on the device: no pin_memory() a step on the host path
  cuda-graph             the whole device step (loss and Adam included) as one CUDA graph
  cuda-graph-ahead       the same, its batches made ahead
  compile                torch.compile, default mode, Inductor's mix-order reduction off
                         (pytorch/pytorch#178080)
  compile-graph          the compiled model inside the whole-step CUDA graph
  reduce-overhead        torch.compile(mode="reduce-overhead"): its CUDA graphs around the model alone
  compile-matmul-attention, compile-graph-matmul-attention: those two with matmul attention
  bf16, bf16-graph       bf16 autocast, eagerly and in the whole-step graph: for the record (another
                         precision, never trained on), the row naming what bf16 did to the laptop's
                         final level (docs/performance.md)
  autotune-graph         compile-graph with Inductor's max-autotune for the GEMMs: slow to compile, run
                         only where the committed table says it could win, else where the budget allows

One check for every variant (mclib.core.variants.compare): over 20 steps from the same weights and
batches in this process, every logged loss within LOSS_RTOL of eager's and the parameter update
within UPDATE_RTOL (relative); whether it is also bitwise equal is a column (`bitwise`), not the
bar. A compile or capture that fell back to eager is reported "fell back: <cause>" and fails its
check. Times (mclib.core.variants.time_run): REPEATS windows of --steps steps queued back to back,
each started behind a few untimed steps (a busy device), timed by CUDA events: `ms_step` their
median, `ms_min`, `ms_max`; the host's own time to enqueue one step from an idle device
(`host_ms_step`); `first_s` one fresh run's first --check-steps steps, its compile included, for
every variant alike. Cheap variants run first; one that does not fit the budget left is skipped,
and the table says so and why.

Beside the table: OUT_kernels.csv/.md, the top kernels of 5 steps of eager and of each variant
that, passing, was the fastest so far (so the last is the one a slice trains with), by device
time, kernels alone (no operator or annotation row counted twice); each profiled row's
`kernel_ms_step` is the sum of all its kernels, and `idle_ms_step` = ms_step less it: the time the
device waited for the host. OUT_host.csv/.md: where the host's time of a step of the fastest
passing variant goes (torch.profiler, CPU side, top operators by self time).

No variant can lose the rows before it: the table is written whole (a temporary file, renamed)
after every row. A variant still running at its cap (three times its estimate, at least 30 s,
never past the budget + GRACE_S) is cut: its row says so, the variants after it say why they did
not run, the table is written and the process ends (exit EXIT_STOPPED). A variant whose error
leaves the device unusable (a sticky CUDA error: `device_error`) ends the measurement the same
way; cleanup that then raises is logged, not raised. Every failure's traceback goes to
OUT_errors.log beside the table. `--resume` measures only the variants the table at --out has no
row for (or "not run"): scripts/lease.sh issues it once after a cut, in a fresh process.
mclib.lease.slices.pick_step reads the table: the slice trains with the fastest variant that passed.

On the CPU this is a rehearsal (tests/test_lease_step.py): the CUDA-only variants are skipped
("needs CUDA"), tf32 runs as fp32, the times are wall-clock and the profiles are by CPU time.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from mclib.core.config import load_profile, profile_path  # noqa: E402
from mclib.core.precision import resolve_device, set_precision  # noqa: E402
from mclib.core.repo import git_revision  # noqa: E402
from mclib.core.step import CUDA_ONLY_STEPS, steps_of  # noqa: E402
from mclib.core.variants import (  # noqa: E402
    BUSY_STEPS,
    CHECK_STEPS,
    REPEATS,
    compare,
    device_error,
    initial_params,
    release,
    time_run,
    trace,
)
from mclib.lease import steptable  # noqa: E402
from mclib.lease.stepbench import (  # noqa: E402
    SPECS,
    VARIANTS,
    Cap,
    Table,
    bf16_effect,
    host_table,
    kernel_table,
    write_frame,
)

LEDGER = ROOT / "results" / "paper-slices.yaml"
COMPILE_S = 60.0  # what a compile of the paper's step is assumed to take until one here has been timed
SLOW_COMPILE_S = (
    90.0  # a slow compile (max-autotune) likewise, until the committed table or this one timed it
)
GRACE_S = 10.0  # a variant still running this long past the budget's end is cut
MIN_CAP_S = 30.0  # a variant's cap: three times its estimate, at least this
EXIT_STOPPED = 3  # a variant hung or left the device unusable: the rows before it kept, the rest say why


def ledger_defaults(path: Path) -> dict:
    """The ledger's profile and precision (what the lease's slice will train), if there is a ledger."""
    if not path.is_file():
        return {}
    raw = yaml.safe_load(path.read_text()) or {}
    return {k: raw[k] for k in ("profile", "precision") if k in raw}


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"


def _arguments(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--budget-s", type=float, default=110.0, help="seconds for everything (default 110; at most 120)"
    )
    ap.add_argument(
        "--ledger", default=str(LEDGER), help="the slice ledger whose profile and precision are the default"
    )
    ap.add_argument("--profile", help="default: the ledger's, else paper")
    ap.add_argument(
        "--precision", help="the book's GPU precision to time (default: the ledger's, else the profile's)"
    )
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"a subset of {','.join(VARIANTS)}, run in this order"
    )
    ap.add_argument(
        "--steps", type=int, default=20, help=f"steps in each of the {REPEATS} timed windows (default 20)"
    )
    ap.add_argument("--check-steps", type=int, default=CHECK_STEPS, help="steps each check compares (20)")
    ap.add_argument("--batch", type=int, help="override train.batch (the rehearsal's CPU run)")
    ap.add_argument("--out", help="CSV of the table; the profiles and the errors' log go beside it")
    ap.add_argument(
        "--committed", help=f"the committed table (default: {steptable.COMMITTED} beside the ledger)"
    )
    ap.add_argument(
        "--full", action="store_true", help="every variant, even where the committed table stands"
    )
    ap.add_argument(
        "--resume", action="store_true", help="only the variants the table at --out has no row for"
    )
    args = ap.parse_args(argv)
    args.wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.wanted if v not in VARIANTS]
    if unknown or "eager" not in args.wanted:
        ap.error(
            f"--variants: {', '.join(unknown) or 'eager (the reference) is missing'} "
            f"(known: {', '.join(VARIANTS)})"
        )
    args.committed = (
        Path(args.committed) if args.committed else Path(args.ledger).parent / steptable.COMMITTED
    )
    return args


class Measure:
    """One measurement: the table, its cap, the reference (eager's trace), the budget, and what
    the variants so far taught (the step's time, a compile's time, the fastest that passed)."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.t_end = args, time.time() + min(args.budget_s, 120.0)
        ledger = ledger_defaults(Path(args.ledger))
        base = load_profile(profile_path(args.profile or ledger.get("profile", "paper")))
        self.device = resolve_device("auto")
        precision, note = args.precision or ledger.get("precision") or base.train.precision, ""
        if precision == "tf32" and self.device.type != "cuda":
            precision, note = "fp32", "tf32 is CUDA's: the rehearsal runs fp32"
        over = {"train.precision": precision, "train.device": self.device.type, "train.compile": False}
        if args.batch:
            over["train.batch"] = args.batch
        self.base, self.precision = base.replace(**over), precision
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        key, mode, self.wanted = steptable.key(name, precision), "full", list(args.wanted)
        if not args.full:
            chosen, line = steptable.stands(args.committed, key)
            print(f"lease_step: {line}" + ("" if chosen else ": the full table"), flush=True)
            if chosen is not None:
                mode, self.wanted = "check", ["eager"] + ([chosen] if chosen != "eager" else [])
        self.out = Path(args.out) if args.out else None
        kept: list[dict] = []
        if args.resume and self.out is not None and self.out.is_file():
            kept = [
                r
                for r in pd.read_csv(self.out).to_dict("records")
                if not str(r["status"]).startswith("not run")
            ]
            print(
                f"lease_step: resumed: {', '.join(r['variant'] for r in kept)} kept from {self.out.name}",
                flush=True,
            )
        self.done = {r["variant"] for r in kept}
        stamp = {
            "precision": precision,
            "batch": self.base.train.batch,
            "steps": args.steps,
            "check_steps": args.check_steps,
            **key,
            "mode": mode,
            "date": datetime.date.today().isoformat(),
            "git": git_revision(),
            "time": time.time(),
        }
        self.table = Table(self.out, stamp, note, kept)
        self.cap = Cap(self.table, EXIT_STOPPED)
        self.compile_s, self.profile_s = COMPILE_S, 0.0
        self.best: tuple[str, float] | None = (
            None  # the fastest trainable variant that passed: (name, ms a step)
        )
        self.kernels: list[pd.DataFrame] = []
        self.committed = pd.read_csv(args.committed) if args.committed.is_file() else None

    def left(self) -> float:
        return self.t_end - time.time()

    def eager(self, later: list[str]) -> None:
        """The reference: eager's trace (`first_s`: this one run), a second run to show it repeats,
        its time and its profiles."""
        a, device = self.args, self.device
        set_precision(device, self.precision)
        self.start = initial_params(self.base, device)
        self.cap.arm("eager", max(self.left() + GRACE_S, MIN_CAP_S), later)
        t0 = time.time()
        self.ref = trace(self.base, device, "eager", a.check_steps)
        first_s = time.time() - t0
        again = trace(self.base, device, "eager", a.check_steps)
        repeat = compare(self.ref, again, self.start)
        timing = time_run(again.run, a.steps)
        self.step_s = timing.ms / 1000
        said = (
            f"bitwise equal to eager over {a.check_steps} steps"
            if repeat.bitwise
            else f"NOT bitwise equal to itself (losses {repeat.loss_rel:.1e}, "
            f"update {repeat.update_rel:.1e} relative)"
        )
        if "eager" not in self.done:
            self.table.add(
                "eager",
                "ran",
                passed=True,
                bitwise=repeat.bitwise,
                check=f"the reference; run twice, {said}",
                first_s=first_s,
                loss_rel=repeat.loss_rel,
                update_rel=repeat.update_rel,
                **self._times(timing),
            )
        self.best = ("eager", timing.ms)
        self.cap.arm(
            "the profiles", max(self.left() + GRACE_S, MIN_CAP_S), later
        )  # their own row if they hang
        self.profile("eager", again.run, timing.ms)
        self.cap.disarm()

    @staticmethod
    def _times(timing) -> dict:
        return {
            "ms_step": timing.ms,
            "ms_min": timing.ms_min,
            "ms_max": timing.ms_max,
            "repeats": timing.repeats,
            "host_ms_step": timing.host_ms,
        }

    def profile(self, variant: str, run, ms: float) -> None:
        """`variant`'s kernels (beside the table; its row's kernel sum and the device's idle time)
        and where its host time goes (OUT_host: the fastest passing variant's, replaced by a faster)."""
        t0 = time.time()
        try:
            step = steps_of([run])
            kernels, total = kernel_table(step, self.device, variant)
            self.kernels.append(kernels)
            self.table.update(
                variant,
                kernel_ms_step=total,
                idle_ms_step=ms - total if self.device.type == "cuda" else float("nan"),
            )
            host = host_table(step, self.device, variant)
            if self.out is not None:
                write_frame(pd.concat(self.kernels, ignore_index=True), self.out, "kernels")
                write_frame(host, self.out, "host")
        except Exception as e:
            self.table.log_error(f"the profiles of {variant}", traceback.format_exc())
            print(f"lease_step: no profile of {variant} ({_first_line(e)})", file=sys.stderr, flush=True)
        self.profile_s = max(self.profile_s, time.time() - t0)

    def need(self, variant: str) -> tuple[float, str | None]:
        """(seconds `variant` is estimated to need, why it does not run at all or None)."""
        spec, a = SPECS[variant], self.args
        steps = a.check_steps + 3 + REPEATS * (a.steps + BUSY_STEPS) + a.steps
        compile_s, why = (self.compile_s if spec.compiled else 0.0), None
        if spec.slow:
            compile_s = SLOW_COMPILE_S
            prior = self._committed_row(variant)
            if prior is not None:
                if pd.notna(prior.get("first_s")):
                    compile_s = float(prior["first_s"])
                if self.best is not None and not prior["ms_step"] < self.best[1]:
                    why = (
                        f"not run: the committed table's {prior['ms_step']:.2f} ms a step cannot beat "
                        f"{self.best[0]}'s {self.best[1]:.2f}"
                    )
        return steps * self.step_s * 2 + 5 + compile_s + self.profile_s, why

    def _committed_row(self, variant: str) -> dict | None:
        t = self.committed
        if t is None or "variant" not in t.columns or "ms_step" not in t.columns:
            return None
        rows = t[(t["variant"] == variant) & (t["passed"].astype(str) == "True") & t["ms_step"].notna()]
        return rows.iloc[0].to_dict() if len(rows) else None

    def variant(self, variant: str, rest: list[str]) -> bool:
        """Check, time and (where it is the fastest that passed so far) profile `variant`; its row
        says how it went. True where the device is unusable after it (the measurement ends)."""
        spec, device = SPECS[variant], self.device
        if spec.step in CUDA_ONLY_STEPS and device.type != "cuda":
            self.table.add(variant, "skipped: needs CUDA")
            return False
        need, why = self.need(variant)
        if why is None and need > self.left():
            why = f"skipped: needs about {need:.0f} s, {self.left():.0f} s of the budget left"
        if why is not None:
            self.table.add(variant, why)
            return False
        profile = self.base.replace(**{"train.precision": spec.precision}) if spec.record else self.base
        self.cap.arm(variant, min(max(3 * need, MIN_CAP_S), self.left() + GRACE_S), rest)
        got = None
        try:
            set_precision(device, profile.train.precision)
            t0 = time.time()
            got = trace(profile, device, spec.step, self.args.check_steps)
            took = time.time() - t0
            check = compare(self.ref, got, self.start)
            timing = time_run(got.run, self.args.steps)
            if spec.compiled and not spec.slow:
                self.compile_s = max(took, 10.0)
            self._row(variant, spec, got, check, timing, took)
            if check.passed and not spec.record and timing.ms < self.best[1]:
                self.best = (variant, timing.ms)
                self.profile(variant, got.run, timing.ms)
        except Exception as e:
            self.table.log_error(variant, traceback.format_exc())
            self.table.add(variant, f"failed: {_first_line(e)}")
        finally:
            self.cap.disarm()
            self._clean(variant, got)
        broken = device_error(device)
        if broken:
            self.table.not_run(rest, f"the device is unusable after {variant}'s error ({broken})")
            return True
        return False

    def _row(self, variant, spec, got, check, timing, took) -> None:
        values = {
            "bitwise": check.bitwise,
            "first_s": took,
            "loss_rel": check.loss_rel,
            "update_rel": check.update_rel,
            **self._times(timing),
        }
        if spec.record:
            text = (
                f"for the record (another precision, never trained on here): losses {check.loss_rel:.1e}, "
                f"update {check.update_rel:.1e} relative to eager in {self.precision}; {bf16_effect()}"
            )
            self.table.add(
                variant,
                "ran" if not got.fell_back else f"fell back: {got.fell_back}",
                passed=False,
                check=text,
                precision=spec.precision,
                **values,
            )
        else:
            self.table.add(
                variant,
                "ran" if not got.fell_back else f"fell back: {got.fell_back}",
                passed=check.passed,
                check=check.text,
                **values,
            )

    def _clean(self, variant: str, got) -> None:
        device = self.device
        for what, clean in (
            ("the graph", lambda: release(got.run) if got is not None else None),
            ("the precision", lambda: set_precision(device, self.precision)),
            ("the compile cache", lambda: torch._dynamo.reset() if SPECS[variant].compiled else None),
            ("the memory", lambda: torch.cuda.empty_cache() if device.type == "cuda" else None),
        ):
            try:
                clean()
            except Exception:
                self.table.log_error(f"{variant}: cleaning up {what}", traceback.format_exc())


def main(argv=None) -> int:
    m = Measure(_arguments(argv))
    later = [v for v in m.wanted if v != "eager" and v not in m.done]
    m.eager(later)
    stopped = False
    for i, variant in enumerate(later):
        if m.variant(variant, later[i + 1 :]):
            stopped = True
            break
    frame = pd.DataFrame(m.table.rows)
    print(
        frame[
            [
                "variant",
                "status",
                "passed",
                "bitwise",
                "ms_step",
                "ms_min",
                "ms_max",
                "kernel_ms_step",
                "host_ms_step",
                "first_s",
                "check",
            ]
        ].to_string(index=False)
    )
    if m.kernels:
        what = "device time, kernels alone" if m.device.type == "cuda" else "self CPU time"
        print(f"\ntop kernels of 5 steps ({what}), by variant profiled:")
        for k in m.kernels:
            print(k.head(8).to_string(index=False))
    return EXIT_STOPPED if stopped else 0


if __name__ == "__main__":
    from mclib.core.console import console_logging

    with (
        console_logging()
    ):  # mclib.lease.stepbench's lines: a variant's result on stdout, a failure on stderr
        sys.exit(main())
