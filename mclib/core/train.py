"""Online training (docs/protocol.md, §1.4) that survives interruption.

A run lives in one folder (`mclib.core.runs`: its layout, atomic writes, the lock).
Running `train` again on the same folder resumes
from the newest checkpoint; on the CPU the result is bit-identical to a run that was
never interrupted (the data generator, Adam's state and the step are all restored).

Metrics are those of the training batch itself, from the forward pass that computes
the gradient (before the update). The authors instead re-ran the model on the same
batch after the update; our numbers are therefore one update "older" and cost no
extra forward pass. `eval_*` columns are fresh matrices every `eval_every` steps.

Several runs (seeds, E15's runs, sweeps) train side by side on a Dask cluster
(`mclib.core.jobs`: worker processes on this machine, one thread each when the profile pins
`train.threads: 1`, or a cluster's workers); a run's numbers do not depend on which
process trains it.

One step is `train_step`, in this file, read top to bottom: batch, forward (the HF model
the checkpoints hold, `MatrixBert`, or E19's `MatrixGPT`), loss, backward,
`torch.nn.utils.clip_grad_norm_`, `torch.optim.Adam` at `lr_at`, log. The loop around it
(`_train`) evaluates, flushes the logged losses, checkpoints and ends runs (stop rules, a
deadline, a signal). Several runs of one `train_group` call each own their model and Adam;
the step goes over them one after another. (Until revision d54ea56, 2026-11-26, a second copy of
the architecture, `mclib/core/stacked.py`, trained R runs stacked into one model: `train.fast`.)
On a CUDA device (docs/performance.md): fused, capturable Adam reading its lr from a device
tensor, no host sync inside the step (losses stay on the device until the flush every
`log_every` steps; the data are sampled on the host by CPU generators, so a run's matrices
are the same on any device and a run resumes on another device type, and copied into fixed
input buffers without waiting); `train.precision` chooses fp32 (TF32 off), TF32 matmuls or bf16
autocast (`set_precision`); `train.step` how the step runs (`step_variant`: eagerly, the
model through torch.compile, or the whole device step as one CUDA graph,
`mclib.core.graphstep`); `train.compile: true` compiles the model where `train.step` is auto.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
from torch.profiler import record_function
from tqdm.auto import tqdm

from .config import PRECISIONS, ConfigError, Profile
from .data import Batch, sample_batch
from .metrics import LOSS_NAMES, find_drop, run_losses, squared_errors
from .model import MatrixBert, build_model, eval_mode
from .runs import (append_metrics, check_disk, checkpoint_dir, convergence_stop, drop_column, end_of_run, ended_at,
                   is_complete, only_trainer, prune_checkpoints, resume_checkpoint, resume_metrics, run_end,
                   save_checkpoint, saved_steps, seed_run_dirs, write_atomic, write_end, write_profile)

EVAL_SEED_OFFSET = 1_000_003  # eval matrices come from their own generator


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device = 'cuda' but no CUDA device is available")
    return torch.device(name)


def with_device(profile: Profile) -> Profile:
    """`profile` with `train.device: auto` resolved here (cuda if this process sees one,
    else cpu): resolved once, by the process that starts or submits runs, so a worker
    trains on the device the submitter chose, and the run's profile.yaml records it."""
    if profile.train.device != "auto":
        return profile
    return profile.replace(**{"train.device": resolve_device("auto").type})


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX); without, torch
    emulates bf16 (it runs, slower than fp32)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def check_precision(device: torch.device, precision: str) -> None:
    """A precision the device does not have runs emulated, said in one line on stderr: tf32
    off CUDA (`mclib.core.tf32`: the GPU's TF32 products, for studies of what TF32 changes),
    bf16 on a CPU without bf16 units. A precision that does not exist is a `ConfigError`."""
    if precision not in PRECISIONS:
        raise ConfigError(f"train.precision = {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "tf32" and device.type != "cuda":
        print(f"mclib: train.precision = 'tf32' on {device.type}: TF32 products emulated (mclib.core.tf32), "
              "eagerly and slower than fp32", file=sys.stderr)
    if precision == "bf16" and device.type == "cpu" and not cpu_has_bf16():
        print("mclib: train.precision = 'bf16' on a CPU without bf16 units (no avx512_bf16 or amx_bf16): "
              "torch emulates it, slower than fp32", file=sys.stderr)


def set_precision(device: torch.device, precision: str) -> None:
    """What `train.precision` means for the matmuls of this process: on CUDA, "tf32" runs
    fp32 matmuls on the TF32 tensor cores (fp32 storage and accumulation, 10-bit-mantissa
    products) and "fp32" and "bf16" do not (bf16's own products are bf16 through
    `autocast`; its fp32 remainder stays fp32). With TF32 off, cuBLAS's matmuls are IEEE
    fp32, but on compute capability 8.0 or newer the `sdpa` attention's memory-efficient kernel
    multiplies with CUTLASS's 3xTF32 products (near fp32, not IEEE) whatever `allow_tf32` says.
    Nothing to set on the CPU, which has no TF32."""
    check_precision(device, precision)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"


def autocast(device: torch.device, precision: str):
    """bf16 autocast (fp32 master weights) or nothing (fp32, tf32: `set_precision`).
    Without autocast's cache of bf16 weight copies: a copy cached while a CUDA graph captures
    would be one the replays never refresh (`mclib.core.graphstep`), and each weight is cast
    once a forward anyway, so the cache saves nothing here (the products are the same bits)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {PRECISIONS}")
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


def emulated_tf32(device: torch.device, precision: str):
    """Around a forward and its backward: tf32 off CUDA rounds the inputs of the GPU's
    TF32 products (`mclib.core.tf32.EmulateTF32`); anything else, nothing."""
    if precision == "tf32" and device.type != "cuda":
        from .tf32 import EmulateTF32
        return EmulateTF32()
    return contextlib.nullcontext()


def make_optimizer(model, t, device: torch.device, state: dict | None = None,
                   capture_ready: bool | None = None) -> torch.optim.Optimizer:
    """Adam (the paper) over the trainable parameters, one param group, with a saved `state`
    loaded; the group carries its `base_lr` (from the profile, not the state), which the
    warm-up scales (`set_lr`).

    capture_ready (default: on CUDA): `Adam(fused=True, capturable=True)` with the lr an fp32
    tensor on the device, which `set_lr` writes before each step: Adam's kernels then read the
    lr and the step counts from device memory, so a CUDA graph's replay of the step
    (`mclib.core.graphstep`) trains as the eager step does; the eager step on CUDA runs the same
    Adam, so the two are the same arithmetic. The lr Adam reads is then the fp32 nearest the
    profile's (1e-4 -> 0.99999997e-4), where the fused Adam of revisions up to 2026-11-26 read the
    float64 one: GPU runs since differ from slice A's in the last bits. Elsewhere the lr is a
    Python float: on CUDA the fused kernel; on the CPU torch's foreach Adam (`foreach=True`, since
    2026-11-27), the for-loop Adam's arithmetic op for op over lists of tensors, so every logged
    loss of the default profile's 1 000 steps is the same bit for bit and the step is cheaper
    (docs/performance.md, "The CPU step's levers"); the CPU's fused kernel rounds otherwise and
    is not used. The saved state's flags and lr are another run's or device's (a CPU checkpoint
    resumed on a GPU): this Adam keeps its own, and its step counts move where it keeps them."""
    capture_ready = device.type == "cuda" if capture_ready is None else capture_ready
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if capture_ready:
        own = {"lr": torch.tensor(t.lr, dtype=torch.float32, device=device), "fused": True, "foreach": None,
               "capturable": True}
    elif device.type == "cuda":
        own = {"lr": t.lr, "fused": True, "foreach": None, "capturable": False}
    else:  # the CPU: foreach, the for-loop's arithmetic to the bit in fewer calls
        own = {"lr": t.lr, "fused": None, "foreach": True, "capturable": False}
    opt = torch.optim.Adam([p for _, p in named], betas=(0.9, t.beta2), **own)
    if state is not None:
        opt.load_state_dict(one_group([n for n, _ in named], state))
        for group in opt.param_groups:
            group.update(own)
        if capture_ready:
            for per_param in opt.state.values():
                per_param["step"] = per_param["step"].to(device=device, dtype=torch.float32)
    for group in opt.param_groups:
        group["base_lr"] = t.lr
    if capture_ready:  # torch warns that capturable slows an uncaptured step; the fused kernel is the same either way
        opt._warned_capturable_if_run_uncaptured = True
    return opt


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """The lr of Adam's next step: written into the device tensor that a capture-ready Adam
    reads (`make_optimizer`; a kernel, no host sync, outside any graph), else the group's float."""
    for group in opt.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def one_group(names: list[str], state: dict) -> dict:
    """A saved Adam `state` of the parameters `names` (trainable, in the model's order) as one
    param group. Runs saved at revision c6ddcac or earlier (2026-11-26) kept the token and
    position embeddings in a second group after the others, for `train.embedding_lr` (removed):
    their per-parameter states are put back in `names`' order, unchanged."""
    groups = state["param_groups"]
    if len(groups) == 1:
        return state
    is_embedding = lambda n: ".embeddings." in n and n.endswith("embeddings.weight")  # the old grouping
    old_order = [n for n in names if not is_embedding(n)] + [n for n in names if is_embedding(n)]
    ids = [i for g in groups for i in g["params"]]
    if len(ids) != len(names) or len(groups) != 2:
        raise ValueError(f"a saved Adam state of {len(groups)} param groups and {len(ids)} parameters does not "
                         f"fit this model's {len(names)} trainable parameters")
    id_of = dict(zip(old_order, ids))
    return {"state": {i: state["state"][id_of[n]] for i, n in enumerate(names) if id_of[n] in state["state"]},
            "param_groups": [{**groups[0], "params": list(range(len(names)))}]}


# --- one training step ---------------------------------------------------------------------

def train_step(runs: list["_Run"]) -> torch.Tensor:
    """One step of every run in `runs`, read top to bottom: batch, lr, then on the device
    (`device_step`) forward, loss, backward, clip, Adam; log. Returns the `[run, 4]` losses of
    this forward pass (L, L_obs, L_mask, mask value), left on the device: nothing inside a step
    waits for a GPU.

    Each run owns its model (the HF `MatrixBert` its checkpoints hold, or E19's `MatrixGPT`)
    and its `torch.optim.Adam` (`make_optimizer`), so a run's numbers do not depend on the
    runs stepped beside it. Everything that changes from step to step on the host is done
    here, before the device part: the batch (into the run's fixed input buffers on CUDA) and
    the lr (into the tensor Adam reads), so that a run with `train.step: cuda-graph` replays the
    device part captured once (`mclib.core.graphstep.StepGraph`) and trains exactly as this
    eager step does.
    """
    out = []
    for r in runs:
        batch = r.batch()                      # batch: the run's own CPU generator, the same matrices on any device
        r.step += 1
        set_lr(r.opt, lr_at(r.step, r.opt.param_groups[0]["base_lr"], r.t.warmup))  # lr: the warm-up's, where Adam reads it
        if r.graph is not None:                # the device part below, captured once and replayed (train.step)
            ls = r.graph.replay(batch)
        else:
            ls = device_step(r, batch)
        r.pending.append(ls)                   # log: kept on the device until the run's next flush
        out.append(ls)
    return torch.stack(out)


def device_step(r: "_Run", batch: Batch) -> torch.Tensor:
    """The device part of `train_step`, in order: forward, loss, backward, clip, Adam; returns
    the `[4]` losses (L, L_obs, L_mask, mask value), a new tensor. Only L, the mean over all
    entries, is differentiated: the other three are read under `no_grad`, so the backward runs
    no kernels for them (their gradient was zero; the parameters' gradients are the same bits,
    tests/test_graphstep.py). Nothing here reads a device value on the host or depends on a
    host value that changes between steps (the lr is set before, `set_lr`), and every shape is
    the profile's: what a CUDA graph can capture (`mclib.core.graphstep`)."""
    r.opt.zero_grad(set_to_none=True)          # the backward below writes the gradients afresh
    with emulated_tf32(r.device, r.t.precision):  # TF32 off a GPU: both passes' products rounded, or nothing
        with autocast(r.device, r.t.precision):  # bf16 products with fp32 master weights, or nothing
            pred = r.forward(batch)            # forward: [batch, n, n]
        sq = squared_errors(pred[None], batch.x[None])  # loss: [1, batch·n·n] squared errors
        sq.mean(1).sum().backward()            # backward: the gradient of L (their mean) alone
    if r.t.grad_clip:                          # clip: the global gradient norm, at most grad_clip
        torch.nn.utils.clip_grad_norm_(r.model.parameters(), r.t.grad_clip, foreach=True)
    with record_function("mclib::optimiser"):  # step: Adam (named for benchmarks/step_profile.py)
        r.opt.step()
    with torch.no_grad():                      # log: L, L_obs, L_mask, mask value of this forward pass
        return run_losses(pred[None], batch.x[None], batch.mask[None], sq=sq)[0]


def predict(model, batch: Batch) -> torch.Tensor:
    """`[batch, n, n]`: the model's values for `batch` (BERT reads the masked tokens; E19's
    teacher-forced GPT, `mclib.core.gpt`, the whole batch)."""
    if getattr(model, "teacher_forced", False):
        return model(batch)
    return model(batch.tokens).view_as(batch.x)


def lr_at(step: int, base_lr: float, warmup: int) -> float:
    """Constant lr after a linear warm-up of `warmup` steps (step counts from 1)."""
    return base_lr * min(1.0, step / warmup) if warmup else base_lr


STEP_RAN = "step.json"  # in a run's folder: the step variant that ran and why it fell back (`_Run.record_step`)
CUDA_ONLY_STEPS = ("reduce-overhead", "cuda-graph")  # train.step variants made of CUDA graphs


def step_variant(profile: Profile, device: torch.device, emulated: bool = False) -> str:
    """How a run's step runs on `device` (`train.step`, mclib.core.config.STEPS): "eager";
    "compile" (the model through torch.compile, default mode); "reduce-overhead" (torch.compile
    with its CUDA graphs around the model); "cuda-graph" (the whole device step as one CUDA graph,
    `mclib.core.graphstep`). "auto": on the CPU "compile" where `train.compile` says so, else
    "eager" (the CPU profiles' way, unchanged); on CUDA "compile" where `train.compile` says so,
    else the faster of eager and cuda-graph, cuda-graph only where it matched eager to the bit
    over 20 steps in this process (`choose`, measured once per process and
    setting, said in one line). A variant this device cannot run (CUDA graphs off CUDA; a
    compile under emulated TF32, `emulated`) is said in one line, and the step runs eagerly."""
    t = profile.train
    wanted = t.step
    if wanted == "auto":
        if t.compile or device.type != "cuda":
            wanted = "compile" if t.compile else "eager"
        else:
            wanted = choose(profile, device)
    if wanted in CUDA_ONLY_STEPS and device.type != "cuda":
        print(f"mclib: train.step = {wanted!r} needs CUDA (this run is on {device.type}): the step runs eagerly",
              file=sys.stderr)
        return "eager"
    if wanted in ("compile", "reduce-overhead") and emulated:
        return "eager"  # said once, in check_precision's line: compiled code would bypass the emulation
    return wanted


def compile_model(model, variant: str, device: torch.device):
    """The model a run's forward calls: `model` itself, or through torch.compile for "compile"
    (default mode) and "reduce-overhead". On CUDA with Inductor's mix-order reduction off where
    this torch has the switch: with it, Inductor (torch 2.10 and 2.11, the GPU image's) can return
    a gradient of the wrong shape (pytorch/pytorch#178080: "invalid gradient at index k", what the
    compiled step hit on the H100 lease of 2026-11-26); it is a GPU (Triton) switch, so CPU code
    is unchanged."""
    if variant not in ("compile", "reduce-overhead"):
        return model
    if device.type == "cuda":
        import torch._inductor.config as inductor
        if hasattr(inductor, "triton") and hasattr(inductor.triton, "mix_order_reduction"):
            inductor.triton.mix_order_reduction = False
    return torch.compile(model, mode="reduce-overhead" if variant == "reduce-overhead" else None)


def train(profile: Profile, run_dir: str | Path, progress: bool = True,
          stop: Callable[[list[dict]], bool] | None = None,
          init_model: MatrixBert | None = None, *, newest_only: bool = False, deadline: float | None = None) -> Path:
    """Train (or resume) `profile` in `run_dir`; returns run_dir.

    One trainer at a time per folder: a second process that tries to train the same
    folder gets a one-line error instead of interleaving its checkpoints with the first's.

    stop: called with the metric rows at every log flush; returning True ends the run
    early with a checkpoint (used by the profile sweep to stop soon after the drop).
    With `train.until: converged` the profile's own rule (`mclib.core.runs.convergence_stop`)
    is checked the same way, `train.steps` being the cap. When a run ends, `end.json`
    records why (`mclib.core.runs.run_end`: converged, cap, steps or stopped).
    init_model: start from this model instead of a fresh one (E15: a model with one
    component re-initialised and the rest frozen); its frozen parameters stay frozen,
    also after a resume.
    newest_only: with `checkpoints.keep: analysis`, keep only the newest checkpoint (a run
    of which the book reads the metrics and the end: other seeds, E15's runs).
    A run whose checkpoints would not fit on its disk (`mclib.core.runs.check_disk`) is
    refused before it starts, with a one-line error.
    deadline: a `time.time()` at which the run saves a resumable checkpoint and ends "cut"
    (end.json; SIGTERM and SIGINT do the same); training it again continues from there.
    """
    return train_group([Job(profile, Path(run_dir), stop, init_model, newest_only)], progress=progress,
                       deadline=deadline)[0]


@dataclass
class Job:
    """One run of a `train_group` call: what `train` takes."""
    profile: Profile
    run_dir: Path
    stop: Callable[[list[dict]], bool] | None = None
    init_model: MatrixBert | None = None
    newest_only: bool = False


def process_key(profile: Profile) -> tuple:
    """Runs of one `train_group` call share this key: what a process sets once for all of
    them (the device, the precision's TF32 switch, torch's thread count). Everything else
    (architecture, seeds, lrs, warm-up, step counts, frozen groups, compile) may differ."""
    t = profile.train
    return str(resolve_device(t.device)), t.precision, t.threads


def train_group(jobs: list[Job], progress: bool = False, deadline: float | None = None) -> list[Path]:
    """Train (or resume) several runs in one process, stepped one after another (`train_step`):
    each run its own model and Adam, so its numbers do not depend on which runs it trained
    beside (tests/test_train.py). Returns the folders."""
    if not jobs:
        return []
    if len({process_key(j.profile) for j in jobs}) > 1:
        raise ValueError("runs trained in one process need equal process_key(profile) (device, precision, threads): "
                         + ", ".join(f"{j.run_dir}" for j in jobs))
    threads = torch.get_num_threads()
    try:
        with contextlib.ExitStack() as locks:
            for j in jobs:
                j.run_dir.mkdir(parents=True, exist_ok=True)
                locks.enter_context(only_trainer(j.run_dir))
            _train(jobs, progress, deadline)
        return [j.run_dir for j in jobs]
    finally:
        torch.set_num_threads(threads)  # train.threads holds for the run, not for the caller after it


class _Run:
    """One run in the loop: its model and Adam (`train_step` steps them), its folder,
    generators, step and metric rows."""

    def __init__(self, job: Job, device: torch.device, capture_ready: bool | None = None):
        p = job.profile.replace(**{"train.device": device.type})  # recorded as it runs (with_device)
        self.job, self.profile, self.t, self.dir, self.device = job, p, p.train, job.run_dir, device
        self.capture_ready = device.type == "cuda" if capture_ready is None else capture_ready
        write_profile(self.dir, p)
        # CPU generators on every device: the same matrices on a GPU as on a laptop, and a
        # run resumes on another device type (a CUDA generator's state is another format)
        self.gens = {"data": torch.Generator().manual_seed(p.seed),
                     "eval": torch.Generator().manual_seed(p.seed + EVAL_SEED_OFFSET)}
        # the newest intact checkpoint; a damaged newer one is set aside, named in one line on stderr
        resumed = resume_checkpoint(self.dir, p.model.attention, device)
        self.state = None
        if resumed:
            self.step, self.model, self.state = resumed
            for k, g in self.gens.items():
                g.set_state(self.state["gens"][k])
            self.rows = resume_metrics(self.dir, self.step)
            for later in [s for s in saved_steps(self.dir) if s > self.step]:  # weights-only saves past the resume
                shutil.rmtree(checkpoint_dir(self.dir, later))                  # point: trained again from here
            self.wall = self.state["wall"]
            if job.init_model is not None:  # from_pretrained made every weight trainable again
                frozen = {n for n, q in job.init_model.named_parameters() if not q.requires_grad}
                for n, q in self.model.named_parameters():
                    q.requires_grad_(n not in frozen)
        else:
            self.step, self.wall, self.rows = 0, 0.0, []
            self.model = (copy.deepcopy(job.init_model) if job.init_model is not None
                          else build_model(p.model, p.data.n, p.seed)).to(device)
        self._optimise()
        self.save_at = (set(p.checkpoints.all_steps()) | set(range(self.t.save_every, self.t.steps + 1, self.t.save_every))
                        | {self.t.steps})
        self.written = len(self.rows)  # metric rows already in metrics.csv (`append_metrics`)
        self.pending: list[torch.Tensor] = []  # per-step losses kept on the device until the next flush
        self.evals: dict[int, dict[str, float]] = {}
        self.rule = convergence_stop(p)
        reason = self.stop_reason()
        self.finished = self.step >= self.t.steps or reason is not None
        self.step_said = None  # (variant, fell_back) last written to STEP_RAN
        if self.finished and self.step:
            self.record_end(reason)  # a run that ended before end.json existed, or under another until/cap

    def stop_reason(self) -> str | None:
        """"converged" (the profile's rule), "stopped" (the job's `stop`) or None, on the rows so far."""
        if not self.rows:
            return None
        if self.rule is not None and self.rule(self.rows):
            return "converged"
        if self.job.stop is not None and self.job.stop(self.rows):
            return "stopped"
        return None

    def record_end(self, reason: str | None) -> None:
        """Write end.json for the run that ended at this step (`mclib.core.runs.run_end`),
        unless it already says the same. reason: "stopped", "cut" or that of the rule."""
        rows = [r for r in self.rows if r["step"] <= self.step]
        end = end_of_run(self.profile, rows, self.step, stopped=reason == "stopped", cut=reason == "cut")
        if not ended_at(self.dir, self.step) or run_end(self.dir) != end:
            write_end(self.dir, end)

    def record_step(self) -> None:
        """STEP_RAN in the run's folder: the step variant the profile asked for, the one it
        resolved to here, the one that ran (eager after a failed capture or compile) and why,
        from this step on. Written when it first steps and whenever a fallback changes it."""
        said = {"planned": self.t.step, "variant": self.variant, "ran": "eager" if self.fell_back else self.variant,
                "fell_back": self.fell_back, "from_step": self.step}
        write_atomic(self.dir / STEP_RAN, lambda f: f.write_text(json.dumps(said, indent=1)))
        self.step_said = (self.variant, self.fell_back)

    @classmethod
    def in_memory(cls, profile: Profile, device: torch.device, capture_ready: bool | None = None) -> "_Run":
        """A fresh run with no folder, for timing the step (`step_function`): the model, the
        data stream and the step, nothing saved. capture_ready: as `make_optimizer` (default: on CUDA)."""
        run = cls.__new__(cls)
        run.profile, run.t, run.step, run.state, run.device = profile, profile.train, 0, None, device
        run.capture_ready = device.type == "cuda" if capture_ready is None else capture_ready
        run.pending = []
        run.model = build_model(profile.model, profile.data.n, profile.seed).to(device)
        run.gens = {"data": torch.Generator().manual_seed(profile.seed)}
        run._optimise()
        return run

    def _optimise(self) -> None:
        """The run's Adam over its trainable parameters (with the saved state, on a resume),
        and how its step runs (`step_variant`): the model its forward calls (compiled for
        compile and reduce-overhead) and, for cuda-graph, the graph that replays the device part
        of the step (`mclib.core.graphstep.StepGraph`). On a capture-ready run (CUDA) the batch
        comes into fixed buffers (`inputs`, made at the first batch)."""
        from .graphstep import StepGraph

        self.model.train()
        self.opt = make_optimizer(self.model, self.t, self.device,
                                  self.state["optimizer"] if self.state is not None else None,
                                  capture_ready=self.capture_ready)
        self.variant = step_variant(self.profile, self.device, self.emulates_tf32())
        self.fell_back: str | None = None  # why a compiled model fell back to eager (`forward`), once it has
        self.compiled = compile_model(self.model, self.variant, self.device)
        self.graph = StepGraph(self, device_step) if self.variant == "cuda-graph" else None
        self.inputs = None

    def emulates_tf32(self) -> bool:
        """TF32 emulated (tf32 off CUDA): compiled code would bypass the emulation, so the
        model runs eagerly, said once in `check_precision`'s line."""
        return self.t.precision == "tf32" and self.device.type != "cuda"

    def forward(self, batch: Batch) -> torch.Tensor:
        """`predict` through the compiled model; a compile that cannot run here (no C++
        compiler, an unsupported backend) is said in one line and the run goes on eagerly."""
        try:
            if self.variant == "reduce-overhead":  # a new step: the last one's graph outputs are free to reuse
                torch.compiler.cudagraph_mark_step_begin()
            return predict(self.compiled, batch)
        except Exception as e:
            if self.compiled is self.model:
                raise
            self.fell_back = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
            print(f"mclib: train.step {self.variant}: torch.compile failed ({self.fell_back}); "
                  "the step runs eagerly", file=sys.stderr)
            self.compiled = self.model
            return predict(self.model, batch)

    @torch.no_grad()
    def evaluate(self) -> torch.Tensor:
        """`[4]` losses of the (uncompiled) model on a fresh eval batch, in eval mode."""
        batch = self.eval_batch()
        with eval_mode(self.model), emulated_tf32(self.device, self.t.precision):  # as a GPU in TF32 evaluates
            pred = predict(self.model, batch)
        return run_losses(pred[None], batch.x[None], batch.mask[None])[0]

    def batch(self) -> Batch:
        """The next training batch of the run's generator, on the device: on a capture-ready
        run (CUDA) copied into its fixed input buffers (`mclib.core.graphstep.StaticBatch`), which
        the step reads at the same addresses every time."""
        d = self.profile.data
        with record_function("mclib::data"):  # named for benchmarks/step_profile.py
            batch = sample_batch(self.t.batch, d.n, d.rank, d.p_mask, self.gens["data"], dist=d.dist)
            if not self.capture_ready:
                return batch.to(self.device, non_blocking=True)
            if self.inputs is None:
                from .graphstep import StaticBatch
                self.inputs = StaticBatch(batch, self.device)
            return self.inputs.fill(batch)

    def eval_batch(self) -> Batch:
        d = self.profile.data
        return sample_batch(self.t.eval_batch, d.n, d.rank, d.p_mask, self.gens["eval"], dist=d.dist).to(
            self.device, non_blocking=True)

    def flush(self) -> str | None:
        """Move pending losses into rows; why the run ends here ("converged", "stopped"), or None."""
        values = torch.stack(self.pending).cpu().tolist()  # the one host sync per flush
        first = self.step - len(values) + 1
        for i, v in enumerate(values):
            s = first + i
            row = {"step": s, **dict(zip(LOSS_NAMES, v)), "wall": self.wall if s == self.step else math.nan}
            row.update({f"eval_{k}": self.evals.get(s, {}).get(k, math.nan) for k in LOSS_NAMES})
            self.rows.append(row)
        self.pending.clear()
        self.evals.clear()
        return self.stop_reason()



def step_function(profile: Profile, device: torch.device, runs: int = 1) -> Callable[[], torch.Tensor]:
    """A function that runs one `train_step` of `runs` fresh runs of `profile` (seeds
    profile.seed, +1, ..., in memory, nothing saved), as the training loop does (the
    profile's precision and `train.compile`); it returns the `[run, 4]` losses.
    benchmarks/train_step.py times it."""
    set_precision(device, profile.train.precision)  # as `_train` does: TF32 is a process-wide switch
    return steps_of([_Run.in_memory(profile.replace(seed=profile.seed + r), device) for r in range(runs)])


def steps_of(runs: list["_Run"]) -> Callable[[], torch.Tensor]:
    """A function that runs one `train_step` of in-memory `runs` and drops the logged rows the
    loop would have written (nothing is saved); it returns the `[run, 4]` losses."""
    def step() -> torch.Tensor:
        out = train_step(runs)
        for r in runs:
            r.pending.clear()
        return out
    return step


class _CutSignals:
    """While training, SIGTERM and SIGINT ask the loop to save and end (the run ends "cut",
    `mclib.core.runs.RunEnd`) instead of dying between checkpoints; a second signal
    raises KeyboardInterrupt at once. Only the main thread can take signals: elsewhere (a
    Dask worker's thread) nothing is installed."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(f"mclib: {signal.Signals(signum).name}: saving at the next step, then ending (again: stop now)",
              file=sys.stderr)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _train(jobs: list[Job], progress: bool, deadline: float | None = None) -> None:
    """The loop: a `train_step` of every run, then per run, in this order: evaluate
    (every eval_every), flush the logged losses (every log_every), checkpoint (every
    save_every; Adam's state every state_every), end (rule, stop, cap, or cut). A cut comes
    from `deadline` (a `time.time()`) or a signal (`_CutSignals`): every run then flushes,
    saves a resumable checkpoint and ends "cut" at the step it reached."""
    t = jobs[0].profile.train
    device = resolve_device(t.device)
    set_precision(device, t.precision)
    if t.threads:
        torch.set_num_threads(t.threads)
    runs = [r for r in (_Run(j, device) for j in jobs) if not r.finished]
    if not runs:
        return
    check_disk([(r.profile, r.dir, r.job.newest_only) for r in runs])
    lead = runs[0]
    bar = tqdm(total=lead.t.steps, initial=lead.step, desc=f"train {lead.profile.name}", disable=not progress,
               unit="step", dynamic_ncols=True)
    tick = time.perf_counter()
    with _CutSignals() as signals:
        while runs:
            train_step(runs)
            for r in runs:
                if r.step_said != (r.variant, r.fell_back):  # what ran, where a fallback changed it
                    r.record_step()
                if r.step % r.t.eval_every == 0:  # evaluate: fresh matrices of the run's eval generator
                    r.evals[r.step] = dict(zip(LOSS_NAMES, r.evaluate().cpu().tolist()))
            cut = signals.requested or (deadline is not None and time.time() >= deadline)
            flushing = [i for i, r in enumerate(runs) if cut or r.step % r.t.log_every == 0 or r.step in r.save_at]
            if device.type == "cuda" and flushing:
                # the steps queued since the last flush finish here: their time is the steps' own (`wall`),
                # not the flush's; without this sync, `wall` counted the host's queueing alone
                torch.cuda.synchronize(device)
            now = time.perf_counter()
            for r in runs:
                r.wall += now - tick
            tick = now
            ended = []
            for i in flushing:
                r = runs[i]
                # why the run ends here: its rule or stop, else the cut (a deadline, a signal), else none
                reason = r.flush() or ("cut" if cut and r.step < r.t.steps else None)
                final = reason is not None or r.step >= r.t.steps
                if r is lead:
                    bar.update(r.step - bar.n)
                    bar.set_postfix(L_obs=f"{r.rows[-1]['L_obs']:.2e}", L_mask=f"{r.rows[-1]['L_mask']:.3f}")
                if r.step in r.save_at or final:
                    state = final or not r.t.state_every or r.step % r.t.state_every == 0
                    r.written = append_metrics(r.dir, r.rows, r.written)  # metrics first: see save_checkpoint
                    save_checkpoint(r.dir, r.step, r.model, r.opt if state else None, r.gens, rows=None,
                                    wall=r.wall, device=device)
                    prune_checkpoints(r.dir, r.profile, r.rows, r.job.newest_only)
                if final:
                    r.record_end(reason)
                    ended.append(i)
            if ended:
                runs = [r for i, r in enumerate(runs) if i not in ended]
            tick = time.perf_counter()  # checkpoint I/O is not training time
    bar.close()


def stop_at_step(step: int) -> Callable[[list[dict]], bool]:
    """A `stop` for `train`: true once the run has reached `step` (it is asked at every log
    flush, so a multiple of `train.log_every` ends the run exactly there)."""
    def stop(rows: list[dict]) -> bool:
        return rows[-1]["step"] >= step
    return stop


def stop_after_drop(rank: int, after: int, column: str = "L_mask") -> Callable[[list[dict]], bool]:
    """A `stop` for `train`: true once the run is `after` steps past its drop
    (`mclib.core.metrics.find_drop` in `column`); a run that never drops trains to its last step."""
    def stop(rows: list[dict]) -> bool:
        curve = pd.DataFrame({"step": [r["step"] for r in rows], column: [r[column] for r in rows]})
        drop = find_drop(curve, rank=rank, column=column)
        return drop is not None and rows[-1]["step"] >= drop + after
    return stop


# --- several runs side by side --------------------------------------------------------------
# On a Dask cluster (mclib.core.jobs): the local one by default, a running scheduler or a batch
# system when $MCLIB_CLUSTER (the CLI's --cluster) names one.

def parallel_runs(profile: Profile) -> int:
    """How many runs of `profile` train at once on the local cluster (`mclib.core.jobs.local_workers`):
    on the CPU with `train.threads` pinned, as many as the cores hold at that many threads
    each; on a GPU, or with torch's default threads (0), one run at a time."""
    from .jobs import local_workers, needs_gpu

    return local_workers(profile.train.threads, needs_gpu(profile))


def _seed_stop(profile: Profile, after_drop: int | None):
    if after_drop is None:
        return None
    return stop_after_drop(profile.data.rank, after_drop, drop_column(profile))


def train_seed(profile: Profile, run_dir: Path, after_drop: int | None) -> Path:
    """One job of `seed_jobs`: train (or resume) the run, stopping `after_drop` steps past its
    drop; such a run (another seed: the book reads its metrics) keeps only its newest checkpoint
    under `checkpoints.keep: analysis`."""
    return train(profile, run_dir, progress=False, stop=_seed_stop(profile, after_drop),
                 newest_only=after_drop is not None)


def seed_jobs(profile: Profile, run_dir: str | Path) -> list[tuple[Profile, Path, int | None]]:
    """The runs of `seed_run_dirs` that are not complete, as `train_seed` arguments
    (profile, folder, after_drop), the book's run first. The book's run trains to the
    profile's last step; the others stop `analysis.after_drop` steps after their drop
    (None: they too train to the last step), since what the book reads from them is the drop."""
    after = profile.analysis.after_drop
    profile = with_device(profile)
    jobs = [(profile.replace(seed=s), d, None if s == profile.seed else after)
            for s, d in seed_run_dirs(profile, run_dir).items()]
    return [job for job in jobs if not is_complete(job[0], job[1], _seed_stop(job[0], job[2]))]


def train_seeds(profile: Profile, run_dir: str | Path, cluster: str | None = None) -> dict[int, Path]:
    """Train (resume, or find complete) every run of `seed_run_dirs`, side by side on a
    Dask cluster (`mclib.core.jobs.run_profile_jobs`; cluster: its address, default the local
    one or $MCLIB_CLUSTER); returns {seed: folder}. Nothing starts when all are complete."""
    from .jobs import run_profile_jobs

    run_profile_jobs(profile, train_seed, seed_jobs(profile, run_dir), cluster)
    return seed_run_dirs(profile, run_dir)


# --- a variant checked against eager, and timed -------------------------------------------
# (benchmarks/lease_step.py on every lease; `choose`: `train.step: auto` on CUDA). Here beside
# the step, not in graphstep.py: a check trains the variant (`_Run`, `train_step`), and the
# capture graphstep.py holds is part of what the step trains with.

CHECK_STEPS = 20        # steps a variant is compared with eager over, from the same weights and batches
LOSS_RTOL = 1e-3        # a compiled variant passes with every logged loss within this of eager's, relatively,
UPDATE_RTOL = 5e-2      # and its 20 steps' parameter update within this of eager's (relative L2 norm): float
#   sums in another order change the gradients in their last bits, and Adam's first steps (g/√v ~ ±1) turn a
#   tiny gradient's other sign into a whole lr's difference, so updates differ more than losses do


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
    return _Run.in_memory(profile.replace(**{"train.step": variant, "train.compile": False}), device)


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
    events over `n` calls queued back to back, then the host's own time to enqueue one step, each
    of `n` more calls timed from an idle device (perf_counter): queued back to back, a step that
    keeps the device busy fills CUDA's launch queue, the host then waits for room, and its time
    would read as the device's. On the CPU both are the wall time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            step()
        end.record()
        end.synchronize()
        host = 0.0
        for _ in range(n):
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            step()
            host += time.perf_counter() - t0
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / n, 1000 * host / n
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    wall = 1000 * (time.perf_counter() - t0) / n
    return wall, wall


def time_run(run, n: int) -> tuple[float, float]:
    """`time_steps` of `n` more training steps of `run` (after 3 untimed ones)."""
    step = steps_of([run])
    for _ in range(3):
        step()
    return time_steps(step, n, run.device)


def release(*runs) -> None:
    """Free the captured graphs (and their memory pools) of in-memory `runs` now, not when the
    collector finds them: the next variant measured gets the device's memory back."""
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
    """`train.step: auto` on CUDA: "cuda-graph" where it matches eager to the bit over `steps`
    steps and is faster, else "eager"; measured once per process and setting (model, task, batch,
    precision, clip, warm-up), said in one line. Nothing else is tried here: the compiled variants
    take a minute to compile and are chosen on a lease from benchmarks/lease_step.py's table
    (mclib.lease.slices.pick_step) or named in the profile."""
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
            release(ref.run, graph.run)
            del ref, graph
            torch.cuda.empty_cache()
        except Exception as e:
            chosen, line = "eager", f"eager: the measurement failed ({type(e).__name__}: {str(e)[:120]})"
        print(f"mclib: train.step auto: {line}", file=sys.stderr)
        _CHOSEN[key] = chosen
    return _CHOSEN[key]
