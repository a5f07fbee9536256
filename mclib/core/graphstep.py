"""The training step as one CUDA graph (`train.step: cuda-graph`), and the check that any way
of running the step trains as the eager step does.

A CUDA graph records the kernels of one step once (`torch.cuda.graph`) and then launches all
of them with one call a step (`CUDAGraph.replay`), where the eager step launches some 260-300
kernels from Python (docs/performance.md). A replay runs exactly the recorded kernels on exactly
the recorded addresses, and none of the Python around them. So the part of the step that is
captured (`mclib.core.train.device_step`: forward, loss, backward, clip, Adam) is written so that

- its inputs are buffers at fixed addresses (`StaticBatch`): each step's batch is still sampled
  on the host by the run's CPU generator, the same matrices on any device, and copied in through
  pinned memory without waiting;
- no host value in it changes between steps: the warm-up's lr is a device tensor that the host
  writes before the replay and Adam reads (`make_optimizer(capture_ready=True)`: fused and
  capturable; Adam's step counts live on the device too), and nothing reads a device value back;
- its shapes are the profile's, the same every step;
- Adam's state exists before the capture (`warm_up`): a first step that created it would record
  the allocation inside the graph, and the parameters' and the state's addresses never change
  after it (Adam updates them in place).

`StepGraph` warms the step up on a side stream (PyTorch's recipe for whole-network capture),
puts the parameters and Adam's state back as they were, bit for bit, captures one step and from
then on replays it; the losses are cloned out of the graph's output after each replay (the next
replay overwrites it). A capture that fails leaves the run as it was, says why in one line, and
the run steps eagerly. On a CUDA device the replayed step is the eager step's arithmetic, so the
two agree to the bit (`check_variant`; benchmarks/lease_step.py checks it on every lease).

`check_variant` and `time_variant` run a variant from the seed's initial weights on the seed's
batches against eager; `choose` is `train.step: auto` on CUDA.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .config import Profile
from .data import Batch

WARM_UP_STEPS = 3       # eager steps before the capture (cuBLAS handles, Adam's state, the allocator's blocks)
CHECK_STEPS = 20        # steps a variant is compared with eager over, from the same weights and batches
LOSS_RTOL = 1e-3        # a compiled variant passes with every logged loss within this of eager's, relatively,
UPDATE_RTOL = 5e-2      # and its 20 steps' parameter update within this of eager's (relative L2 norm): float
#   sums in another order change the gradients in their last bits, and Adam's first steps (g/√v ~ ±1) turn a
#   tiny gradient's other sign into a whole lr's difference, so updates differ more than losses do


class StaticBatch:
    """A run's training inputs at fixed addresses: `batch`, device buffers shaped as the
    profile's batch, filled each step (`fill`) from a batch sampled on the host."""

    def __init__(self, like: Batch, device: torch.device):
        self.device = device
        self.batch = Batch(*(torch.empty(t.shape, dtype=t.dtype, device=device) for t in (like.x, like.mask, like.tokens)))

    def fill(self, batch: Batch) -> Batch:
        """Copy `batch` (on the host) into the buffers and return them. To CUDA through pinned
        memory without waiting (torch keeps a pinned block until its copy has run); the copy is
        queued on the stream before the step that reads it and after the step that read the last."""
        cuda = self.device.type == "cuda"
        for dst, src in zip((self.batch.x, self.batch.mask, self.batch.tokens), (batch.x, batch.mask, batch.tokens)):
            if dst.shape != src.shape or dst.dtype != src.dtype:
                raise ValueError(f"a batch of shape {tuple(src.shape)} ({src.dtype}) does not fit the run's input "
                                 f"buffers {tuple(dst.shape)} ({dst.dtype}): a captured step has static shapes")
            dst.copy_(src.pin_memory() if cuda and not src.is_pinned() else src, non_blocking=cuda)
        return self.batch


def _trained(run) -> list[torch.Tensor]:
    return [p for group in run.opt.param_groups for p in group["params"]]


def snapshot(run) -> list[tuple[torch.Tensor, torch.Tensor, dict | None]]:
    """(parameter, its value, its Adam state or None) of every parameter Adam trains, copied."""
    out = []
    for p in _trained(run):
        state = run.opt.state.get(p)
        out.append((p, p.detach().clone(),
                    {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)} if state else None))
    return out


@torch.no_grad()
def restore(run, saved: list[tuple[torch.Tensor, torch.Tensor, dict | None]]) -> None:
    """Put the parameters and Adam's state back to `saved` in place (their addresses stay). A
    state that did not exist then is zeroed: step 0 and zero moments are what Adam's first step
    starts from when it creates them, so the next step is the same bits either way."""
    for p, value, state in saved:
        p.copy_(value)
        for k, v in run.opt.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                v.zero_() if state is None else v.copy_(state[k])


def warm_up(run, step: Callable, batch: Batch, steps: int = WARM_UP_STEPS) -> None:
    """`steps` steps of `step(run, batch)` (on CUDA on a side stream, as a capture wants), then
    the parameters and Adam's state put back as they were, bit for bit, the gradients dropped:
    afterwards Adam's state exists (materialised, at its final addresses) and the run trains on
    exactly as if the warm-up had not happened. The batch and the lr are not drawn or changed."""
    saved = snapshot(run)
    try:
        if run.device.type == "cuda":
            main = torch.cuda.current_stream(run.device)
            side = torch.cuda.Stream(run.device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for _ in range(steps):
                    step(run, batch)
            main.wait_stream(side)
        else:
            for _ in range(steps):
                step(run, batch)
    finally:
        restore(run, saved)
        run.opt.zero_grad(set_to_none=True)


class StepGraph:
    """The device part of a run's step (`step(run, batch)`, mclib.core.train.device_step)
    captured as one CUDA graph at the first `replay` and replayed from then on."""

    def __init__(self, run, step: Callable[..., torch.Tensor]):
        self.run, self.step = run, step
        self.graph = None                   # torch.cuda.CUDAGraph, once captured
        self.losses: torch.Tensor | None = None  # the graph's `[4]` output, rewritten by every replay

    def replay(self, batch: Batch) -> torch.Tensor:
        """The step on `batch` (the run's input buffers, already filled): the graph replayed, its
        losses cloned out. A capture that fails says why in one line (and in `run.fell_back`),
        leaves the run as it was, and this and every later step run eagerly."""
        run = self.run
        if self.graph is None:
            try:
                self._capture(batch)
            except Exception as e:
                run.fell_back = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
                run.graph = None
                print(f"mclib: train.step cuda-graph: capture failed ({run.fell_back}); the step runs eagerly",
                      file=sys.stderr)
                return self.step(run, batch)
        self.graph.replay()
        return self.losses.clone()

    def _capture(self, batch: Batch) -> None:
        run = self.run
        if run.device.type != "cuda":
            raise RuntimeError(f"a CUDA graph needs CUDA, this run is on {run.device.type}")
        if run.inputs is None or batch is not run.inputs.batch:
            raise RuntimeError("the step must read the run's fixed input buffers (a capture-ready run's batch)")
        warm_up(run, self.step, batch)
        graph = torch.cuda.CUDAGraph()
        # thread_local: only this thread's calls that are unsafe during a capture end it (not a
        # progress bar's or a Dask worker's other threads)
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            losses = self.step(run, batch)
        self.graph, self.losses = graph, losses


# --- a variant checked against eager, and timed -------------------------------------------

@dataclass
class Trace:
    """What `trace` records of one variant: its `[steps, 4]` losses and its parameters after them."""
    variant: str
    losses: torch.Tensor
    params: dict[str, torch.Tensor]
    fell_back: str | None
    run: object


def variant_run(profile: Profile, device: torch.device, variant: str):
    """A fresh in-memory run (`mclib.core.train._Run.in_memory`) of `profile`'s seed with its
    step run as `variant` (a train.step other than auto): the seed's initial weights and batches."""
    from .train import _Run

    return _Run.in_memory(profile.replace(**{"train.step": variant, "train.compile": False}), device)


def trace(profile: Profile, device: torch.device, variant: str, steps: int = CHECK_STEPS) -> Trace:
    """`steps` training steps of a fresh run of `variant`: their losses and the parameters after."""
    from .train import train_step

    run = variant_run(profile, device, variant)
    losses = torch.cat([train_step([run]) for _ in range(steps)])
    run.pending.clear()
    params = {n: p.detach().clone() for n, p in run.model.named_parameters() if p.requires_grad}
    return Trace(variant, losses, params, run.fell_back, run)


def initial_params(profile: Profile, device: torch.device) -> dict[str, torch.Tensor]:
    """The seed's initial trainable parameters (what every variant starts from)."""
    from .model import build_model

    model = build_model(profile.model, profile.data.n, profile.seed).to(device)
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@dataclass
class Check:
    passed: bool
    text: str            # one line: "bitwise equal to eager over 20 steps", "fell back: ...", ...
    loss_rel: float      # largest relative difference of a logged loss from eager's
    update_rel: float    # relative L2 difference of the parameter update from eager's


def compare(ref: Trace, got: Trace, start: dict[str, torch.Tensor], exact: bool) -> Check:
    """`got` against eager's `ref` over the same steps: bit for bit (`exact`, the CUDA graph: the
    same kernels), or within LOSS_RTOL and UPDATE_RTOL (compiled: other kernels). A variant whose
    compile fell back to eager is reported as such and does not pass: it was not the variant."""
    steps = len(ref.losses)
    loss_rel = ((got.losses - ref.losses).abs() / ref.losses.abs().clamp_min(1e-30)).max().item()
    num = sum(((got.params[n] - ref.params[n]).double() ** 2).sum() for n in ref.params)
    den = sum(((ref.params[n] - start[n]).double() ** 2).sum() for n in ref.params)
    update_rel = (num / den).sqrt().item() if den > 0 else float("inf")
    if got.fell_back:
        return Check(False, f"fell back: {got.fell_back}", loss_rel, update_rel)
    if not torch.isfinite(got.losses).all():
        return Check(False, f"non-finite losses within {steps} steps", loss_rel, update_rel)
    if exact:
        same = torch.equal(got.losses, ref.losses) and all(torch.equal(got.params[n], ref.params[n]) for n in ref.params)
        text = (f"bitwise equal to eager over {steps} steps" if same else
                f"NOT bitwise equal to eager over {steps} steps (losses {loss_rel:.1e}, update {update_rel:.1e} relative)")
        return Check(same, text, loss_rel, update_rel)
    ok = loss_rel <= LOSS_RTOL and update_rel <= UPDATE_RTOL
    return Check(ok, f"{'within' if ok else 'OUTSIDE'} tolerance of eager over {steps} steps: losses {loss_rel:.1e} "
                     f"(<= {LOSS_RTOL:g}), update {update_rel:.1e} (<= {UPDATE_RTOL:g}) relative", loss_rel, update_rel)


def time_steps(step: Callable[[], object], n: int, device: torch.device) -> tuple[float, float]:
    """(ms a step, host ms a step) over `n` calls of `step`: on CUDA the device's time between two
    events and the host's time to enqueue the calls (perf_counter, no sync inside); on the CPU
    both are the wall time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        host = time.perf_counter() - t0
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / n, 1000 * host / n
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    wall = 1000 * (time.perf_counter() - t0) / n
    return wall, wall


def time_run(run, n: int) -> tuple[float, float]:
    """`time_steps` of `n` more training steps of `run` (after 3 untimed ones)."""
    from .train import train_step

    def step():
        train_step([run])
        run.pending.clear()
    for _ in range(3):
        step()
    return time_steps(step, n, run.device)


_CHOSEN: dict[tuple, str] = {}


def choose(profile: Profile, device: torch.device, steps: int = CHECK_STEPS) -> str:
    """`train.step: auto` on CUDA: "cuda-graph" where it matches eager to the bit over `steps`
    steps and is faster, else "eager"; measured once per process and setting (model, task, batch,
    precision, clip, warm-up), said in one line. Nothing else is tried here: the compiled variants
    take a minute to compile and are chosen on a lease from benchmarks/lease_step.py's table
    (mclib.book.slices.pick_step) or named in the profile."""
    t = profile.train
    key = (str(device), repr(profile.model), repr(profile.data), t.batch, t.precision, t.grad_clip, t.warmup > 0)
    if key not in _CHOSEN:
        try:
            start = initial_params(profile, device)
            ref, graph = trace(profile, device, "eager", steps), trace(profile, device, "cuda-graph", steps)
            check = compare(ref, graph, start, exact=True)
            eager_ms, _ = time_run(ref.run, steps)
            if check.passed:
                graph_ms, _ = time_run(graph.run, steps)
                chosen = "cuda-graph" if graph_ms < eager_ms else "eager"
                line = (f"{chosen}: cuda-graph {graph_ms:.1f} ms a step, eager {eager_ms:.1f}; "
                        f"cuda-graph {check.text}")
            else:
                chosen, line = "eager", f"eager ({eager_ms:.1f} ms a step): cuda-graph {check.text}"
            del ref, graph
            torch.cuda.empty_cache()
        except Exception as e:
            chosen, line = "eager", f"eager: the measurement failed ({type(e).__name__}: {str(e)[:120]})"
        print(f"mclib: train.step auto: {line}", file=sys.stderr)
        _CHOSEN[key] = chosen
    return _CHOSEN[key]
