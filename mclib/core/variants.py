"""A step variant checked against eager, and timed: `trace` and `compare` (benchmarks/lease_step.py
on every lease), `time_run`, and `choose`, what `train.step: auto` runs on CUDA.
`step_function` is one step of fresh runs, for the benchmarks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .config import Profile
from .model import build_model
from .precision import set_precision
from .step import TrainingRun, steps_of, train_step

log = logging.getLogger(__name__)


def auto_step(profile: Profile, device: torch.device) -> str | None:
    """What `train.step: auto` runs as on CUDA without `train.compile` (`choose`), or None where
    auto needs no measurement."""
    t = profile.train
    if t.step == "auto" and not t.compile and device.type == "cuda":
        return choose(profile, device)
    return None


def step_function(profile: Profile, device: torch.device, runs: int = 1) -> Callable[[], torch.Tensor]:
    """A function running one `train_step` of `runs` fresh in-memory runs of `profile` (seeds
    profile.seed, +1, ...), as the loop does; it returns the `[run, 4]` losses."""
    set_precision(device, profile.train.precision)  # as `_train` does: TF32 is a process-wide switch
    seeds = [profile.replace(seed=profile.seed + r) for r in range(runs)]
    return steps_of([TrainingRun.in_memory(p, device, chosen=auto_step(p, device)) for p in seeds])


CHECK_STEPS = 20  # steps a variant is compared with eager over, from the same weights and batches
LOSS_RTOL = 1e-3  # every variant passes with every logged loss within this of eager's, relatively,
UPDATE_RTOL = 5e-2  # and its parameter update within this of eager's (relative L2 norm): Adam's first
#   steps (g/√v ~ ±1) turn a last-bit gradient difference into a whole lr's, so updates differ more
#   than losses.
#   One bar for every variant, the CUDA graph too: a captured matmul may pick another cuBLAS algorithm
REPEATS = 3  # timed windows a variant's ms a step is the median of (`time_run`)
BUSY_STEPS = 3  # steps queued, untimed, before each window's start event: it starts from a busy device


@dataclass
class Trace:
    """What `trace` records of one variant: its `[steps, 4]` losses and its parameters after them."""

    variant: str
    losses: torch.Tensor
    params: dict[str, torch.Tensor]
    fell_back: str | None
    run: object


def variant_run(profile: Profile, device: torch.device, variant: str):
    """A fresh in-memory run of `profile`'s seed whose step runs as `variant` (not auto)."""
    return TrainingRun.in_memory(profile.replace(**{"train.step": variant, "train.compile": False}), device)


def trace(profile: Profile, device: torch.device, variant: str, steps: int = CHECK_STEPS) -> Trace:
    """`steps` training steps of a fresh run of `variant`: their losses and the parameters after."""
    run = variant_run(profile, device, variant)
    losses = torch.cat([train_step([run]) for _ in range(steps)])
    run.pending.clear()
    params = {n: p.detach().clone() for n, p in run.model.named_parameters() if p.requires_grad}
    return Trace(variant, losses, params, run.fell_back, run)


def initial_params(profile: Profile, device: torch.device) -> dict[str, torch.Tensor]:
    """The seed's initial trainable parameters (what every variant starts from)."""
    model = build_model(profile.model, profile.data.n, profile.seed).to(device)
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@dataclass
class Check:
    passed: bool
    text: str  # one line: "within tolerance of eager over 20 steps: ...", "fell back: ...", ...
    loss_rel: float  # largest relative difference of a logged loss from eager's
    update_rel: float  # relative L2 difference of the parameter update from eager's
    bitwise: bool = False  # losses and parameters the same bits as eager's: information, not the bar


def compare(ref: Trace, got: Trace, start: dict[str, torch.Tensor]) -> Check:
    """`got` against eager's `ref` from the same start: passes with every logged loss within
    LOSS_RTOL and the parameter update within UPDATE_RTOL (relative). Bitwise equality is
    reported, not required; a variant that fell back to eager fails."""
    steps = len(ref.losses)
    loss_rel = ((got.losses - ref.losses).abs() / ref.losses.abs().clamp_min(1e-30)).max().item()
    num = sum(((got.params[n] - ref.params[n]).double() ** 2).sum() for n in ref.params)
    den = sum(((ref.params[n] - start[n]).double() ** 2).sum() for n in ref.params)
    update_rel = (num / den).sqrt().item() if den > 0 else float("inf")
    same = torch.equal(got.losses, ref.losses) and all(
        torch.equal(got.params[n], ref.params[n]) for n in ref.params
    )
    if got.fell_back:
        return Check(False, f"fell back: {got.fell_back}", loss_rel, update_rel, same)
    if not torch.isfinite(got.losses).all():
        return Check(False, f"non-finite losses within {steps} steps", loss_rel, update_rel, same)
    ok = loss_rel <= LOSS_RTOL and update_rel <= UPDATE_RTOL
    return Check(
        ok,
        f"{'within' if ok else 'OUTSIDE'} tolerance of eager over {steps} steps: losses {loss_rel:.1e} "
        f"(<= {LOSS_RTOL:g}), update {update_rel:.1e} (<= {UPDATE_RTOL:g}) relative"
        + ("; bitwise equal" if same else ""),
        loss_rel,
        update_rel,
        same,
    )


@dataclass
class Timing:
    """A variant's time a step: the median of REPEATS windows (`ms`), their least and most, and
    the host's own time to enqueue one step (`host_ms`)."""

    ms: float
    ms_min: float
    ms_max: float
    host_ms: float
    repeats: int


def time_steps(step: Callable[[], object], n: int, device: torch.device, repeats: int = REPEATS) -> Timing:
    """The time a call of `step` takes: the median of `repeats` windows of `n` calls. On CUDA a
    window is device time between two events, started behind BUSY_STEPS untimed calls (a busy
    device); `host_ms` is the host's time to enqueue one call from an idle device. On the CPU,
    wall time."""
    cuda = device.type == "cuda"
    windows = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize(device)
            for _ in range(BUSY_STEPS):
                step()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                step()
            end.record()
            end.synchronize()
            windows.append(start.elapsed_time(end) / n)
        else:
            t0 = time.perf_counter()
            for _ in range(n):
                step()
            windows.append(1000 * (time.perf_counter() - t0) / n)
    host = 0.0
    if cuda:
        for _ in range(n):
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            step()
            host += time.perf_counter() - t0
        torch.cuda.synchronize(device)
    windows.sort()
    median = windows[len(windows) // 2] if len(windows) % 2 else sum(windows[len(windows) // 2 - 1 :][:2]) / 2
    return Timing(median, windows[0], windows[-1], 1000 * host / n if cuda else median, len(windows))


def time_run(run, n: int, repeats: int = REPEATS) -> Timing:
    """`time_steps` of `repeats` × `n` more training steps of `run`, after 3 untimed ones."""
    step = steps_of([run])
    for _ in range(3):
        step()
    return time_steps(step, n, run.device, repeats)


def release(*runs) -> None:
    """Free the CUDA graphs (and memory pools) of in-memory `runs` now, for the next variant measured."""
    for run in runs:
        graph = getattr(run, "graph", None)
        if graph is not None:
            graph.release()


def device_error(device: torch.device) -> str | None:
    """Why the device cannot run a kernel any more (a sticky CUDA error stays with the process:
    every later call fails), or None where it can."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
        torch.ones(1, device=device).add_(1).item()
    except Exception as e:
        return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
    return None


_CHOSEN: dict[tuple, str] = {}


def choose(profile: Profile, device: torch.device, steps: int = CHECK_STEPS) -> str:
    """`train.step: auto` on CUDA: "cuda-graph" where it passes `compare` against eager over `steps`
    steps and is faster, else "eager"; measured once per process and setting and said in one line.
    Compiled variants are not tried here (they take a minute to compile): a lease picks them
    (mclib.lease.slices.pick_step) or the profile names them."""
    t = profile.train
    key = (
        str(device),
        repr(profile.model),
        repr(profile.data),
        t.batch,
        t.precision,
        t.grad_clip,
        t.warmup > 0,
    )
    if key not in _CHOSEN:
        try:
            start = initial_params(profile, device)
            ref, graph = trace(profile, device, "eager", steps), trace(profile, device, "cuda-graph", steps)
            check = compare(ref, graph, start)
            eager_ms = time_run(ref.run, steps, repeats=1).ms
            if check.passed:
                graph_ms = time_run(graph.run, steps, repeats=1).ms
                chosen = "cuda-graph" if graph_ms < eager_ms else "eager"
                line = (
                    f"{chosen}: cuda-graph {graph_ms:.1f} ms a step, eager {eager_ms:.1f}; "
                    f"cuda-graph {check.text}"
                )
            else:
                chosen, line = "eager", f"eager ({eager_ms:.1f} ms a step): cuda-graph {check.text}"
            release(ref.run, graph.run)
            del ref, graph
            torch.cuda.empty_cache()
        except Exception as e:
            chosen, line = "eager", f"eager: the measurement failed ({type(e).__name__}: {str(e)[:120]})"
        log.warning(f"mclib: train.step auto: {line}")
        _CHOSEN[key] = chosen
    return _CHOSEN[key]
