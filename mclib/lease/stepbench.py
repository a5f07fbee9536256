"""The parts of the lease's step measurement (benchmarks/lease_step.py) that are not its loop:
the variants it measures (`SPECS`, in the order they run), the table it writes row by row
(`Table`), the cap that cuts a variant that hangs (`Cap`), and the profiles written beside the
table (`kernel_table`: the device's kernels of a few steps; `host_table`: where the host's time of
a step goes). Each variant's step is `mclib.core.step.WAYS`'; its check and timing are
`mclib.core.variants`'.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from ..core.atomic import write_atomic
from ..core.repo import REPO
from ..core.step import COMPILED_STEPS

log = logging.getLogger(__name__)

TOP_ROWS = 30  # rows of each profile written per variant
PROFILE_STEPS = 5  # steps each profile covers (its times are per step)


class Spec(NamedTuple):
    """A row of the table: the train.step it runs (`mclib.core.step.WAYS`), at the lease's
    precision or at `precision` (bf16: for the record, never trained on); `slow`: slow to compile,
    run only where the committed table says it could win, else where the budget left allows."""

    step: str
    precision: str | None = None
    slow: bool = False

    @property
    def record(self) -> bool:
        """For the record only: another precision, never trained on (`passed` is always False)."""
        return self.precision is not None

    @property
    def compiled(self) -> bool:
        return self.step in COMPILED_STEPS


SPECS = {  # the order they run in: no compile first, then the compiles; the rows for the record after the
    # variants a slice may train with, and the one slowest to compile last
    "eager": Spec("eager"),
    "matmul-attention": Spec("matmul-attention"),
    "ahead": Spec("ahead"),
    "cuda-graph": Spec("cuda-graph"),
    "cuda-graph-ahead": Spec("cuda-graph-ahead"),
    "compile": Spec("compile"),
    "compile-graph": Spec("compile-graph"),
    "reduce-overhead": Spec("reduce-overhead"),
    "compile-matmul-attention": Spec("compile-matmul-attention"),
    "compile-graph-matmul-attention": Spec("compile-graph-matmul-attention"),
    "bf16": Spec("eager", "bf16"),
    "bf16-graph": Spec("cuda-graph", "bf16"),
    "autotune-graph": Spec("autotune-graph", slow=True),
}
VARIANTS = tuple(SPECS)
TRAINABLE = tuple(
    v for v, s in SPECS.items() if not s.record
)  # what a slice may train with (slices.TRAINED_STEPS)


def bf16_effect(doc: Path = REPO / "docs" / "performance.md") -> str:
    """What bf16 did to the laptop's final level, as docs/performance.md's headline table says it
    ("Does bf16 change the science?"), for the bf16 rows: read there, not restated here."""
    where = 'docs/performance.md, "Does bf16 change the science?"'
    try:
        for line in Path(doc).read_text().splitlines():
            if line.startswith("| Does bf16 change the science?"):
                m = re.search(r"final L_mask \*\*([0-9.]+)×\*\*", line)
                if m:
                    return f"bf16 training on the laptop ended at {m.group(1)}× fp32's final L_mask ({where})"
    except OSError:
        pass
    return f"for bf16's effect on the final level see {where}"


def _profiled(step, steps: int, cuda: bool, device: torch.device, activities):
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    return prof.key_averages()


def kernel_table(
    step, device: torch.device, variant: str, steps: int = PROFILE_STEPS
) -> tuple[pd.DataFrame, float]:
    """(the top TOP_ROWS kernels of `steps` calls of `step`, the sum of ALL kernels' time a step):
    on CUDA the device's kernels (and copies) alone, by their device time a step: no operator
    or annotation span, whose time is its kernels' counted again; `share` is of that sum. On the
    CPU there are no kernels: the operators by self CPU time (self times do not overlap)."""
    cuda = device.type == "cuda"
    events = _profiled(
        step, steps, cuda, device, [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    )
    host_names = {e.key for e in events if e.device_type == DeviceType.CPU}
    rows = []
    for e in events:
        if cuda:  # a kernel: device work whose name no host event has (annotation spans appear on both sides)
            if e.device_type != DeviceType.CUDA or e.key in host_names:
                continue
            ms = e.self_device_time_total / 1000 / steps
        else:
            ms = e.self_cpu_time_total / 1000 / steps
        rows.append(
            {
                "variant": variant,
                "kind": "kernel" if cuda else "cpu op",
                "name": e.key,
                "calls_per_step": e.count / steps,
                "ms_step": ms,
            }
        )
    df = pd.DataFrame(rows, columns=["variant", "kind", "name", "calls_per_step", "ms_step"])
    df = df[df["ms_step"] > 0].sort_values("ms_step", ascending=False)
    total = float(df["ms_step"].sum())
    df["share"] = df["ms_step"] / total if total > 0 else 0.0
    return df.head(TOP_ROWS).reset_index(drop=True), total


def host_table(step, device: torch.device, variant: str, steps: int = PROFILE_STEPS) -> pd.DataFrame:
    """Where the host's time of a step of `step` goes: the top TOP_ROWS operators and annotation
    spans (`mclib::data`: the batch; `mclib::optimiser`: Adam) by self CPU time a step, with their
    total CPU time (children included), from `steps` calls profiled on the host alone."""
    events = _profiled(step, steps, device.type == "cuda", device, [ProfilerActivity.CPU])
    rows = [
        {
            "variant": variant,
            "name": e.key,
            "calls_per_step": e.count / steps,
            "self_cpu_ms_step": e.self_cpu_time_total / 1000 / steps,
            "cpu_ms_step": e.cpu_time_total / 1000 / steps,
        }
        for e in events
    ]
    df = pd.DataFrame(rows, columns=["variant", "name", "calls_per_step", "self_cpu_ms_step", "cpu_ms_step"])
    df = df[df["self_cpu_ms_step"] > 0].sort_values("self_cpu_ms_step", ascending=False)
    total = float(df["self_cpu_ms_step"].sum())
    df["share"] = df["self_cpu_ms_step"] / total if total > 0 else 0.0
    return df.head(TOP_ROWS).reset_index(drop=True)


def write_frame(df: pd.DataFrame, out: Path, suffix: str) -> None:
    """`df` as OUT_SUFFIX.csv and .md beside the table `out`."""
    df.to_csv(out.with_name(f"{out.stem}_{suffix}.csv"), index=False)
    out.with_name(f"{out.stem}_{suffix}.md").write_text(df.to_markdown(index=False, floatfmt=".3f") + "\n")


class Table:
    """The rows measured so far, written whole to `out` (a temporary file, renamed) after every
    row; the failures' tracebacks appended to OUT_errors.log. Shared with `Cap`'s thread."""

    def __init__(self, out: Path | None, stamp: dict, note: str, kept: list[dict] = ()):
        self.out, self.stamp, self.note, self.rows = out, stamp, note, list(kept)
        self.lock = threading.RLock()

    def add(self, variant: str, status: str, **values) -> None:
        nan = float("nan")
        with self.lock:
            self.rows.append(
                {
                    "variant": variant,
                    "status": status,
                    "passed": False,
                    "bitwise": False,
                    "check": "",
                    "ms_step": nan,
                    "ms_min": nan,
                    "ms_max": nan,
                    "repeats": 0,
                    "host_ms_step": nan,
                    "kernel_ms_step": nan,
                    "idle_ms_step": nan,
                    "first_s": nan,
                    **self.stamp,
                    **values,
                    "note": values.get("note", self.note),
                }
            )
            r = self.rows[-1]
            log.info(
                f"{variant}: {status}"
                + (
                    f", {r['ms_step']:.2f} ms a step ({r['ms_min']:.2f}-{r['ms_max']:.2f}, "
                    f"host {r['host_ms_step']:.2f})"
                    if status == "ran"
                    else ""
                )
                + (f"; {r['check']}" if r["check"] else "")
            )
            self.write()

    def update(self, variant: str, **values) -> None:
        """Values added to `variant`'s row (its kernel sum, once profiled), the table written again."""
        with self.lock:
            for r in self.rows:
                if r["variant"] == variant:
                    r.update(values)
            self.write()

    def not_run(self, variants, why: str) -> None:
        for v in variants:
            self.add(v, f"not run: {why}")

    def write(self) -> None:
        if self.out is None:
            return
        with self.lock:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.out, pd.DataFrame(self.rows).to_csv(index=False))

    def log_error(self, what: str, text: str) -> None:
        """`text` (a traceback) under a heading, appended to OUT_errors.log (stderr without --out)."""
        block = f"--- {what} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n{text.rstrip()}\n"
        if self.out is None:
            log.error(block)
            return
        with self.lock, open(self.out.with_name(self.out.stem + "_errors.log"), "a") as f:
            f.write(block)


class Cap:
    """A variant's wall-clock cap, kept by a thread of its own: a variant still running at its
    cap gets its row ("failed: still running at its cap"), the variants after it theirs ("not
    run: VARIANT hung"), the table is written and the process ends with `exit_code`. The
    thread runs even while the main one waits in a kernel or a compile."""

    def __init__(self, table: Table, exit_code: int):
        self.table, self.armed, self.exit_code = table, None, exit_code
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
                self.table.add(
                    variant,
                    f"failed: still running at its cap of {cap_s:.0f} s (hung, or far slower "
                    "than its estimate)",
                )
                self.table.not_run(rest, f"{variant} hung")
                self.table.log_error(
                    variant,
                    "".join(traceback.format_stack(sys._current_frames()[threading.main_thread().ident])),
                )
                log.warning(
                    f"lease_step: {variant} cut at its cap of {cap_s:.0f} s; the rows before it are in "
                    f"{self.table.out}"
                )
                os._exit(self.exit_code)
