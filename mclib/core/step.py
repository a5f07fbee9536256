"""One training step and the run it steps (docs/protocol.md, §1.4).

One step is `train_step`, read top to bottom: batch, forward (the HF model the checkpoints
hold, `MatrixBert`, or E19's `MatrixGPT`), loss, backward, `torch.nn.utils.clip_grad_norm_`,
`torch.optim.Adam` at `lr_at`, log. Several runs each own their model and Adam (`_Run`); the
step goes over them one after another. On a CUDA device (docs/performance.md): fused,
capturable Adam reading its lr from a device tensor, no host sync inside the step (losses stay
on the device until the loop's flush every `log_every` steps; the data are sampled on the host
by CPU generators, so a run's matrices are the same on any device and a run resumes on another
device type, and copied into fixed input buffers without waiting). `train.step` says how the
step runs (`step_variant`: eagerly, the model through torch.compile, or the whole device step as
one CUDA graph, `mclib.core.graphstep`); `train.step: auto` on CUDA is measured by
`mclib.core.variants.choose`, which the code that builds a run asks (`chosen`). The run
(`_Run`) has a method for each step of its life that is its own: set up and resume, evaluate,
flush, save; the loop that calls them in turn, and the run's end, are `mclib.core.train`.
"""
from __future__ import annotations

import copy
import json
import logging
import math
from typing import Callable, NamedTuple

import torch
from torch.profiler import record_function

from .checkpoints import prune_checkpoints, resume_run, save_checkpoint
from .config import Profile
from .data import Batch, sample_batch
from .ending import stop_rule
from .metrics import LOSS_NAMES, run_losses, squared_errors
from .model import build_model, eval_mode, predict
from .precision import autocast, emulated_tf32
from .runs import write_atomic, write_profile

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 1_000_003  # eval matrices come from their own generator


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
    """One step of every run in `runs`, read top to bottom: lr, batch, then on the device
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
        r.step += 1
        set_lr(r.opt, lr_at(r.step, r.opt.param_groups[0]["base_lr"], r.t.warmup))  # lr: the warm-up's, where Adam reads it
        batch = r.batch()                      # batch: the run's own CPU generator, the same matrices on any device
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


def lr_at(step: int, base_lr: float, warmup: int) -> float:
    """Constant lr after a linear warm-up of `warmup` steps (step counts from 1)."""
    return base_lr * min(1.0, step / warmup) if warmup else base_lr



STEP_RAN = "step.json"  # in a run's folder: the step variant that ran and why it fell back (`_Run.save`)


class Way(NamedTuple):
    """How a `train.step` variant runs the step: `compile`, the model through torch.compile (None:
    not; "default", "reduce-overhead": its CUDA graphs around the model; "autotune": Inductor's
    max-autotune for the GEMMs); `graph`, the whole device step (forward, loss, backward, clip,
    Adam) as one CUDA graph (`mclib.core.graphstep.StepGraph`), around the compiled model where it
    is compiled; `matmul_attention`, attention as plain matmuls and a softmax (HF's "eager"
    attention, TF32 on a GPU in tf32) in place of sdpa's fp32 efficient-attention kernels;
    `ahead`, batches made ahead on the device (`mclib.core.graphstep.BatchesAhead`: no
    `pin_memory()` a step). None changes the model's parameters or their names."""
    compile: str | None = None
    graph: bool = False
    matmul_attention: bool = False
    ahead: bool = False


WAYS = {  # train.step's variants (mclib.core.config.STEPS less auto), each checked against eager on a lease
    "eager": Way(),
    "compile": Way("default"),
    "reduce-overhead": Way("reduce-overhead"),
    "cuda-graph": Way(graph=True),
    "matmul-attention": Way(matmul_attention=True),
    "compile-matmul-attention": Way("default", matmul_attention=True),
    "ahead": Way(ahead=True),
    "cuda-graph-ahead": Way(graph=True, ahead=True),
    "compile-graph": Way("default", graph=True),
    "compile-graph-matmul-attention": Way("default", graph=True, matmul_attention=True),
    "autotune-graph": Way("autotune", graph=True),
}
CUDA_ONLY_STEPS = tuple(n for n, w in WAYS.items() if w.graph or w.compile == "reduce-overhead")  # CUDA graphs
COMPILED_STEPS = tuple(n for n, w in WAYS.items() if w.compile)  # torch.compile: first_s holds a compile


def step_variant(profile: Profile, device: torch.device, emulated: bool = False, chosen: str | None = None) -> str:
    """How a run's step runs on `device` (`train.step`, mclib.core.config.STEPS, `WAYS`): "eager";
    "compile" (the model through torch.compile, default mode); "reduce-overhead" (torch.compile
    with its CUDA graphs around the model); "cuda-graph" (the whole device step as one CUDA graph,
    `mclib.core.graphstep`); and their combinations with matmul attention, batches made ahead, the
    whole-step graph around a compiled model (`Way`). "auto": on the CPU "compile" where
    `train.compile` says so, else "eager" (the CPU profiles' way, unchanged); on CUDA "compile"
    where `train.compile` says so, else `chosen`: the faster of eager and cuda-graph, cuda-graph
    only where it trained within the check's tolerance of eager over 20 steps in this process
    (`mclib.core.variants.choose`, measured once per process and setting, said in one line, by the
    code that builds the run), eager where none was given. A variant this device cannot run (CUDA
    graphs off CUDA; a compile under emulated TF32, `emulated`) is said in one line, and the step
    runs eagerly."""
    t = profile.train
    wanted = t.step
    if wanted == "auto":
        if t.compile or device.type != "cuda":
            wanted = "compile" if t.compile else "eager"
        else:
            wanted = chosen or "eager"
    if wanted in CUDA_ONLY_STEPS and device.type != "cuda":
        log.warning(f"mclib: train.step = {wanted!r} needs CUDA (this run is on {device.type}): the step runs eagerly")
        return "eager"
    if wanted in COMPILED_STEPS and emulated:
        return "eager"  # said once, in check_precision's line: compiled code would bypass the emulation
    return wanted


def compile_model(model, variant: str, device: torch.device):
    """The model a run's forward calls: `model` itself, or through torch.compile where the
    variant's `Way` compiles (default mode; "reduce-overhead"; "autotune": Inductor's
    `max_autotune_gemm`, its GEMMs chosen by timing candidates, no CUDA graphs of its own, the
    whole-step graph being the variant's). On CUDA with Inductor's mix-order reduction off where
    this torch has the switch: with it, Inductor (torch 2.10 and 2.11, the GPU image's) can return
    a gradient of the wrong shape (pytorch/pytorch#178080: "invalid gradient at index k", what the
    compiled step hit on the H100 lease of 2026-11-26); it is a GPU (Triton) switch, so CPU code
    is unchanged. The compiled module wraps `model`: the parameters and their names are `model`'s."""
    how = WAYS[variant].compile if variant in WAYS else None
    if how is None:
        return model
    if device.type == "cuda":
        import torch._inductor.config as inductor
        if hasattr(inductor, "triton") and hasattr(inductor.triton, "mix_order_reduction"):
            inductor.triton.mix_order_reduction = False
    if how == "autotune":
        return torch.compile(model, options={"max_autotune_gemm": True})
    return torch.compile(model, mode="reduce-overhead" if how == "reduce-overhead" else None)


def use_matmul_attention(model) -> None:
    """Attention as plain matmuls and a softmax (HF's "eager" attention implementation) in
    `model`, a `MatrixBert` running sdpa; a model on mclib's own attention (an attention bias:
    already matmuls) or E19's GPT is left as it is. Parameters and their names do not change."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) == "bert" and config._attn_implementation == "sdpa":
        model.set_attn_implementation("eager")


class _Run:
    """One run in the loop, from set up to end: its model and Adam (`train_step` steps them),
    its folder, generators, step and metric rows. Each step of its life has one place, in the
    order the loop (`mclib.core.train`) takes them: set up and resume (`__init__`), step
    (`train_step`), evaluate, flush (with the stop rule's verdict), save; the loop records its
    end (`mclib.core.ending.record_end`) from `finished` and `reason`."""

    def __init__(self, job, device: torch.device, capture_ready: bool | None = None, chosen: str | None = None):
        """Set up the run of `job` (a `mclib.core.train.Job`) in its folder: its profile recorded,
        then its model, Adam, generators and rows fresh, or as its newest intact checkpoint left
        them (`mclib.core.checkpoints.resume_run`); chosen: what `train.step: auto` runs as on CUDA
        (`step_variant`). A run that has already ended (its rule, a stop or its cap, at the
        checkpoint it resumes from) is `finished` at once, with its `reason`."""
        p = job.profile.replace(**{"train.device": device.type})  # recorded as it runs (with_device)
        self.job, self.profile, self.t, self.dir, self.device = job, p, p.train, job.run_dir, device
        self.capture_ready = device.type == "cuda" if capture_ready is None else capture_ready
        self.chosen = chosen
        write_profile(self.dir, p)
        # CPU generators on every device: the same matrices on a GPU as on a laptop, and a
        # run resumes on another device type (a CUDA generator's state is another format)
        self.gens = {"data": torch.Generator().manual_seed(p.seed),
                     "eval": torch.Generator().manual_seed(p.seed + EVAL_SEED_OFFSET)}
        # the newest intact checkpoint; a damaged newer one is set aside, named in one line on stderr
        resumed = resume_run(self.dir, p.model.attention, device)
        self.state = None
        if resumed:
            self.step, self.model, self.state, self.rows = resumed
            for k, g in self.gens.items():
                g.set_state(self.state["gens"][k])
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
        self.written = len(self.rows)  # metric rows already in metrics.csv (`save_checkpoint`)
        self.pending: list[torch.Tensor] = []  # per-step losses kept on the device until the next flush
        self.evals: dict[int, dict[str, float]] = {}
        self.why_end = stop_rule(p, job.stop)  # why it ends on the rows so far (`mclib.core.ending.stop_rule`)
        # why it has ended (None: the cap, or it trains on), set again at every flush; a run that
        # had ended before end.json existed, or under another until or cap, is `finished` here
        # and the loop records its end
        self.reason = self.why_end(self.rows)
        self.step_said = None  # the STEP_RAN record last written (`save`)

    @property
    def finished(self) -> bool:
        """Whether the run has ended: its rule or stop, a cut (`reason`), or its last step."""
        return self.reason is not None or self.step >= self.t.steps

    @classmethod
    def in_memory(cls, profile: Profile, device: torch.device, capture_ready: bool | None = None,
                  chosen: str | None = None) -> "_Run":
        """A fresh run with no folder, for timing the step (`step_function`): the model, the
        data stream and the step, nothing saved. capture_ready: as `make_optimizer` (default: on CUDA)."""
        run = cls.__new__(cls)
        run.profile, run.t, run.step, run.state, run.device = profile, profile.train, 0, None, device
        run.capture_ready = device.type == "cuda" if capture_ready is None else capture_ready
        run.chosen, run.pending = chosen, []
        run.model = build_model(profile.model, profile.data.n, profile.seed).to(device)
        run.gens = {"data": torch.Generator().manual_seed(profile.seed)}
        run._optimise()
        return run

    def _optimise(self) -> None:
        """The run's Adam over its trainable parameters (with the saved state, on a resume),
        and how its step runs (`step_variant`, its `Way`): the model's attention, the model its
        forward calls (compiled where the way compiles), the graph that replays the device part
        of the step (`mclib.core.graphstep.StepGraph`) where it has one, and where its batches come
        from (`ahead`: made ahead on the device, `mclib.core.graphstep.BatchesAhead`). On a
        capture-ready run (CUDA) the batch comes into fixed buffers (`inputs`, made at the first
        batch)."""
        from .graphstep import BatchesAhead, StepGraph

        self.model.train()
        self.opt = make_optimizer(self.model, self.t, self.device,
                                  self.state["optimizer"] if self.state is not None else None,
                                  capture_ready=self.capture_ready)
        self.variant = step_variant(self.profile, self.device, self.emulates_tf32(), self.chosen)
        self.fell_back: str | None = None  # why a compiled model fell back to eager (`forward`), once it has
        way = WAYS[self.variant]
        if way.matmul_attention:
            use_matmul_attention(self.model)
        self.compiled = compile_model(self.model, self.variant, self.device)
        self.graph = StepGraph(self, device_step) if way.graph else None
        self.ahead = BatchesAhead(self.device) if way.ahead else None
        self.inputs = None
        self.ran_from = self.step + 1  # the first step that ran this way (STEP_RAN)

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
            self.fall_back(e, self.variant, "torch.compile")
            self.compiled = self.model
            return predict(self.model, batch)

    def fall_back(self, error: Exception, variant: str, what: str) -> None:
        """`what` (torch.compile, a CUDA graph's capture) of the step `variant` failed with `error`
        at this step: said in one line, and the step runs eagerly from here on (`STEP_RAN` says
        so at the next save)."""
        self.fell_back = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:120]}"
        self.ran_from = self.step
        log.warning(f"mclib: train.step {variant}: {what} failed ({self.fell_back}); the step runs eagerly")

    @torch.no_grad()
    def evaluate(self) -> torch.Tensor:
        """`[4]` losses of the (uncompiled) model on a fresh eval batch, in eval mode."""
        batch = self.eval_batch()
        with emulated_tf32(self.device, self.t.precision), eval_mode(self.model):  # as a GPU in TF32 evaluates
            pred = predict(self.model, batch)
        return run_losses(pred[None], batch.x[None], batch.mask[None])[0]

    def batch(self) -> Batch:
        """The next training batch of the run's generator, on the device: on a capture-ready
        run (CUDA) copied into its fixed input buffers (`mclib.core.graphstep.StaticBatch`), which
        the step reads at the same addresses every time."""
        d = self.profile.data
        with record_function("mclib::data"):  # named for benchmarks/step_profile.py
            draw = lambda: sample_batch(self.t.batch, d.n, d.rank, d.p_mask, self.gens["data"], dist=d.dist)
            batch = self.ahead.next(draw, self.gens["data"]) if self.ahead is not None else draw()
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
        """Move pending losses into rows; why the run ends here ("converged", "stopped": `why_end`), or None."""
        values = torch.stack(self.pending).cpu().tolist()  # the one host sync per flush
        first = self.step - len(values) + 1
        for i, v in enumerate(values):
            s = first + i
            row = {"step": s, **dict(zip(LOSS_NAMES, v)), "wall": self.wall if s == self.step else math.nan}
            row.update({f"eval_{k}": self.evals.get(s, {}).get(k, math.nan) for k in LOSS_NAMES})
            self.rows.append(row)
        self.pending.clear()
        self.evals.clear()
        return self.why_end(self.rows)

    def save(self, final: bool) -> None:
        """Save the run at this step: what ran (STEP_RAN, where it changed), the metric rows not
        yet in metrics.csv, then the checkpoint (`mclib.core.checkpoints.save_checkpoint`), with
        Adam's state every `train.state_every` steps and at the end (`final`); then
        `checkpoints.keep` (`prune_checkpoints`).

        STEP_RAN says the step variant the profile asked for, the one it resolved to here, the one
        that ran (eager after a failed capture or compile) and why, from which step on: written
        at the run's first save and at the first save after a fallback changed it."""
        said = {"planned": self.t.step, "variant": self.variant, "ran": "eager" if self.fell_back else self.variant,
                "fell_back": self.fell_back, "from_step": self.ran_from}
        if said != self.step_said:
            write_atomic(self.dir / STEP_RAN, json.dumps(said, indent=1))
            self.step_said = said
        if self.ahead is not None:  # the generator as the next step draws: the batches made ahead are not kept
            self.ahead.rewind(self.gens["data"])
        state = final or not self.t.state_every or self.step % self.t.state_every == 0
        self.written = save_checkpoint(self.dir, self.step, self.model, self.opt if state else None, self.gens,
                                       rows=self.rows, written=self.written, wall=self.wall, device=self.device)
        prune_checkpoints(self.dir, self.profile, self.rows, self.job.newest_only)


def steps_of(runs: list["_Run"]) -> Callable[[], torch.Tensor]:
    """A function that runs one `train_step` of in-memory `runs` and drops the logged rows the
    loop would have written (nothing is saved); it returns the `[run, 4]` losses."""
    def step() -> torch.Tensor:
        out = train_step(runs)
        for r in runs:
            r.pending.clear()
        return out
    return step
