"""The training step as one CUDA graph (`train.step: cuda-graph` and its kin, `mclib.core.step.WAYS`).

A graph records one step's kernels once and replays them with one call a step, on the same
addresses and without the Python around them. The captured part
(`mclib.core.step.device_step`) therefore reads its batch from fixed buffers (`StaticBatch`,
filled each step from the host's CPU generator), reads its lr and Adam's step counts from
device tensors (a capture-ready Adam), has the profile's fixed shapes, and finds Adam's state
already created (`warm_up`). `StepGraph` warms up on a side stream, restores the parameters
and Adam's state bit for bit, captures, then replays, cloning the losses out. A failed capture
leaves the run as it was, says why in one line (the step's own error), and the run steps
eagerly. Whether a variant trains as eager does is checked in `mclib.core.variants`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from .data import Batch

WARM_UP_STEPS = 3  # eager steps before the capture (cuBLAS handles, Adam's state, the allocator's blocks)


class StaticBatch:
    """A run's training inputs at fixed addresses: `batch`, device buffers shaped as the
    profile's batch, filled each step (`fill`) from a batch sampled on the host."""

    def __init__(self, like: Batch, device: torch.device):
        self.device = device
        self.batch = Batch(
            *(torch.empty(t.shape, dtype=t.dtype, device=device) for t in (like.x, like.mask, like.tokens))
        )

    def fill(self, batch: Batch) -> Batch:
        """Copy `batch` (on the host) into the buffers and return them. To CUDA through pinned
        memory without waiting (torch keeps a pinned block until its copy has run); the copy is
        queued on the stream before the step that reads it and after the step that read the last."""
        cuda = self.device.type == "cuda"
        for dst, src in zip(
            (self.batch.x, self.batch.mask, self.batch.tokens), (batch.x, batch.mask, batch.tokens)
        ):
            if dst.shape != src.shape or dst.dtype != src.dtype:
                raise ValueError(
                    f"a batch of shape {tuple(src.shape)} ({src.dtype}) does not fit the run's input "
                    f"buffers {tuple(dst.shape)} ({dst.dtype}): a captured step has static shapes"
                )
            pin = (
                cuda and src.device.type == "cpu" and not src.is_pinned()
            )  # a batch made ahead is on the device
            dst.copy_(src.pin_memory() if pin else src, non_blocking=cuda)
        return self.batch


class BatchesAhead:
    """A run's batches made `AHEAD` at a time (the `ahead` variants): drawn in order from the run's
    generator on the host, stacked and copied to the device in one go; each step takes the next.
    The generator's state before each batch is kept, so `rewind` (at a save) puts it back to the
    first batch not taken: a resumed run draws the same batches."""

    AHEAD = 32  # batches a draw makes (the paper's batch: ~5 MB on the device)

    def __init__(self, device: torch.device):
        self.device, self.queue = device, []  # [(generator state before it, the batch on the device)]

    def next(self, draw: Callable[[], Batch], gen: torch.Generator) -> Batch:
        """The next batch, drawing AHEAD more with `draw` (which reads `gen`) when none is left."""
        if not self.queue:
            states, drawn = [], []
            for _ in range(self.AHEAD):
                states.append(gen.get_state())
                drawn.append(draw())
            stacks = [torch.stack([getattr(b, f) for b in drawn]) for f in ("x", "mask", "tokens")]
            if self.device.type == "cuda":
                stacks = [t.pin_memory().to(self.device, non_blocking=True) for t in stacks]
            self.queue = [(s, Batch(stacks[0][i], stacks[1][i], stacks[2][i])) for i, s in enumerate(states)]
        return self.queue.pop(0)[1]

    def rewind(self, gen: torch.Generator) -> None:
        """`gen` put back to the first batch not yet taken, and the batches made ahead dropped."""
        if self.queue:
            gen.set_state(self.queue[0][0])
            self.queue = []


def _trained(run) -> list[torch.Tensor]:
    return [p for group in run.opt.param_groups for p in group["params"]]


def snapshot(run) -> list[tuple[torch.Tensor, torch.Tensor, dict | None]]:
    """(parameter, its value, its Adam state or None) of every parameter Adam trains, copied."""
    out = []
    for p in _trained(run):
        state = run.opt.state.get(p)
        out.append(
            (
                p,
                p.detach().clone(),
                {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)} if state else None,
            )
        )
    return out


@torch.no_grad()
def restore(run, saved: list[tuple[torch.Tensor, torch.Tensor, dict | None]]) -> None:
    """Put the parameters and Adam's state back to `saved` in place (their addresses stay); a
    state that did not exist then is zeroed, which is where Adam's first step starts anyway."""
    for p, value, state in saved:
        p.copy_(value)
        for k, v in run.opt.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                v.zero_() if state is None else v.copy_(state[k])


def warm_up(run, step: Callable, batch: Batch, steps: int = WARM_UP_STEPS) -> None:
    """`steps` steps of `step(run, batch)` (on a CUDA side stream), then parameters and Adam's state
    restored bit for bit and the gradients dropped: Adam's state then exists at its final
    addresses and the run trains on as if nothing had happened."""
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
    """The device part of a run's step (`step(run, batch)`) captured as a CUDA graph at the first
    `replay` and replayed from then on. It holds its run weakly, so the graph's memory pool goes
    with the run."""

    def __init__(self, run, step: Callable[..., torch.Tensor]):
        self._run, self.step = weakref.ref(run), step
        self.graph = None  # torch.cuda.CUDAGraph, once captured
        self.losses: torch.Tensor | None = None  # the graph's `[4]` output, rewritten by every replay

    @property
    def run(self):
        run = self._run()
        if run is None:
            raise RuntimeError("the run of this step graph is gone")
        return run

    def release(self) -> None:
        """Free the graph and its memory pool now (a run that will not step again)."""
        if self.graph is not None and hasattr(self.graph, "reset"):
            self.graph.reset()
        self.graph, self.losses = None, None

    def replay(self, batch: Batch) -> torch.Tensor:
        """The step on `batch` (the run's filled input buffers): the graph replayed, its losses cloned
        out. A failed capture is said in one line (and `run.fell_back`), and this and every later
        step run eagerly."""
        run = self.run
        if self.graph is None:
            try:
                self._capture(batch)
            except Exception as e:
                run.fall_back(e, run.variant if "graph" in run.variant else "cuda-graph", "capture")
                run.graph = None
                self.release()
                return self.step(run, batch)
        self.graph.replay()
        return self.losses.clone()

    def _capture(self, batch: Batch) -> None:
        """Warm up, then capture one step. Where the step itself fails in the capture, its error is
        raised as the cause, capture_end's "previous error during capture" after it."""
        run = self.run
        if run.device.type != "cuda":
            raise RuntimeError(f"a CUDA graph needs CUDA, this run is on {run.device.type}")
        if run.inputs is None or batch is not run.inputs.batch:
            raise RuntimeError(
                "the step must read the run's fixed input buffers (a capture-ready run's batch)"
            )
        warm_up(run, self.step, batch)
        graph = torch.cuda.CUDAGraph()
        cause: list[BaseException] = []
        try:
            # thread_local: only this thread's calls that are unsafe during a capture end it (not a
            # progress bar's or a Dask worker's other threads)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                try:
                    losses = self.step(run, batch)
                except Exception as e:
                    cause.append(e)
                    raise
        except Exception as e:
            if cause and e is not cause[0]:
                raise cause[0] from e
            raise
        self.graph, self.losses = graph, losses
