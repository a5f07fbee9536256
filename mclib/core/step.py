"""One training step and the run it steps (docs/protocol.md, §1.4).

`train_step` steps every run of a group in turn: lr, batch, then `device_step` (forward,
loss, backward, clip, Adam), log. Each run (`TrainingRun`) owns its model and Adam and has one method
per stage of its life: set up and resume, evaluate, flush, save; the loop around them is
`mclib.core.train`. `train.step` picks how the device part runs (`step_variant`, `WAYS`).
Batches are drawn by CPU generators on every device, so a run's data do not depend on the device.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.profiler import record_function

from .checkpoints import prune_checkpoints, resume_run, save_checkpoint
from .config import Profile
from .data import Batch, sample_batch
from .ending import DivergedError, stop_rule
from .graphstep import BatchesAhead, StaticBatch, StepGraph
from .metrics import LOSS_NAMES, run_losses, squared_errors
from .model import LEGACY, MODEL_TYPE, build_model, eval_mode, predict
from .precision import autocast, emulated_tf32
from .runs import write_atomic, write_profile

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 1_000_003  # eval matrices come from their own generator


def make_optimizer(
    model, t, device: torch.device, state: dict | None = None, capture_ready: bool | None = None
) -> torch.optim.Optimizer:
    """Adam (`betas=(0.9, t.beta2)`) over the trainable parameters, one param group carrying its
    `base_lr` (the profile's, which `set_lr` scales), with a saved `state` loaded if given.

    capture_ready (default: on CUDA): capturable Adam whose lr is an fp32 device tensor
    (`set_lr` writes it), so a CUDA graph's replay of the step trains as the eager step does;
    the lr it reads is the fp32 nearest the profile's. Otherwise the lr is a float. Its kernels
    are `t.adam`'s: "fused" (one kernel), "foreach" (the for-loop Adam's arithmetic to the bit, in
    fewer calls) or "auto": fused where capture-ready or on CUDA, else foreach.
    A loaded state keeps this Adam's own flags and lr, its step counts moved to this device."""
    capture_ready = device.type == "cuda" if capture_ready is None else capture_ready
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    kind = t.adam if t.adam != "auto" else ("fused" if capture_ready or device.type == "cuda" else "foreach")
    own = {
        "lr": torch.tensor(t.lr, dtype=torch.float32, device=device) if capture_ready else t.lr,
        "fused": True if kind == "fused" else None,
        "foreach": True if kind == "foreach" else None,
        "capturable": capture_ready,
    }
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
    if (
        capture_ready
    ):  # torch warns that capturable slows an uncaptured step; the fused kernel is the same either way
        opt._warned_capturable_if_run_uncaptured = True
    return opt


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Set the lr of Adam's next step: into the device tensor of a capture-ready Adam (no host
    sync), else the group's float."""
    for group in opt.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def one_group(names: list[str], state: dict) -> dict:
    """A saved Adam `state` of the trainable parameters `names` (in model order) as one param
    group. A two-group state (token and position embeddings in a second group, as older runs
    saved it) has its per-parameter states put back in `names`' order, unchanged."""
    groups = state["param_groups"]
    if len(groups) == 1:
        return state
    is_embedding = lambda n: ".embeddings." in n and n.endswith("embeddings.weight")  # the old grouping
    old_order = [n for n in names if not is_embedding(n)] + [n for n in names if is_embedding(n)]
    ids = [i for g in groups for i in g["params"]]
    if len(ids) != len(names) or len(groups) != 2:
        raise ValueError(
            f"a saved Adam state of {len(groups)} param groups and {len(ids)} parameters does not "
            f"fit this model's {len(names)} trainable parameters"
        )
    id_of = dict(zip(old_order, ids))
    return {
        "state": {i: state["state"][id_of[n]] for i, n in enumerate(names) if id_of[n] in state["state"]},
        "param_groups": [{**groups[0], "params": list(range(len(names)))}],
    }


# --- one training step ---------------------------------------------------------------------


def train_step(runs: list[TrainingRun]) -> torch.Tensor:
    """One step of every run in `runs`: lr and batch on the host, then the device part
    (`device_step`, or its CUDA graph's replay); the losses are logged on the device.
    Returns the `[run, 4]` losses (L, L_obs, L_mask, mask value), left on the device."""
    out = []
    for r in runs:
        r.step += 1
        set_lr(
            r.opt, lr_at(r.step, r.opt.param_groups[0]["base_lr"], r.t.warmup)
        )  # lr: the warm-up's, where Adam reads it
        batch = r.batch()  # batch: the run's own CPU generator, the same matrices on any device
        if r.graph is not None:  # the device part below, captured once and replayed (train.step)
            ls = r.graph.replay(batch)
        else:
            ls = device_step(r, batch)
        r.pending.append(ls)  # log: kept on the device until the run's next flush
        out.append(ls)
    return torch.stack(out)


def device_step(r: TrainingRun, batch: Batch) -> torch.Tensor:
    """Forward, loss, backward, clip, Adam on `batch`; returns the `[4]` losses, a new tensor.
    Only L is differentiated (the other three are read under `no_grad`). No host sync and no
    host value that changes between steps, so a CUDA graph can capture it (`mclib.core.graphstep`)."""
    r.opt.zero_grad(set_to_none=True)  # the backward below writes the gradients afresh
    with emulated_tf32(r.device, r.t.precision):  # TF32 off a GPU: both passes' products rounded, or nothing
        with autocast(r.device, r.t.precision):  # bf16 products with fp32 master weights, or nothing
            pred = r.forward(batch)  # forward: [batch, n, n]
        sq = squared_errors(pred[None], batch.x[None])  # loss: [1, batch·n·n] squared errors
        sq.mean(1).sum().backward()  # backward: the gradient of L (their mean) alone
    if r.t.grad_clip:  # clip: the global gradient norm, at most grad_clip
        torch.nn.utils.clip_grad_norm_(r.model.parameters(), r.t.grad_clip, foreach=True)
    with record_function("mclib::optimiser"):  # step: Adam (named for benchmarks/step_profile.py)
        r.opt.step()
    with torch.no_grad():  # log: L, L_obs, L_mask, mask value of this forward pass
        return run_losses(pred[None], batch.x[None], batch.mask[None], sq=sq)[0]


def lr_at(step: int, base_lr: float, warmup: int) -> float:
    """Constant lr after a linear warm-up of `warmup` steps (step counts from 1)."""
    return base_lr * min(1.0, step / warmup) if warmup else base_lr


STEP_RAN = (
    "step.json"  # in a run's folder: the step variant that ran and why it fell back (`TrainingRun.save`)
)


class Way(NamedTuple):
    """How a `train.step` variant runs the step. compile: torch.compile of the model (None,
    "default", "reduce-overhead", "autotune": Inductor's max-autotune GEMMs); graph: the whole
    device step as one CUDA graph (`mclib.core.graphstep.StepGraph`); matmul_attention: HF's
    "eager" attention instead of sdpa; ahead: batches made ahead on the device
    (`mclib.core.graphstep.BatchesAhead`). None changes the parameters or their names."""

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
CUDA_ONLY_STEPS = tuple(
    n for n, w in WAYS.items() if w.graph or w.compile == "reduce-overhead"
)  # CUDA graphs
COMPILED_STEPS = tuple(n for n, w in WAYS.items() if w.compile)  # torch.compile: first_s holds a compile


def step_variant(
    profile: Profile, device: torch.device, emulated: bool = False, chosen: str | None = None
) -> str:
    """The `WAYS` variant a run's step runs as on `device`. "auto": "compile" where `train.compile`
    says so, else "eager" on the CPU and `chosen` (`mclib.core.variants.choose`; default eager)
    on CUDA. A variant this device cannot run (CUDA graphs off CUDA; a compile under emulated
    TF32, `emulated`) falls back to "eager", said in one line."""
    t = profile.train
    wanted = t.step
    if wanted == "auto":
        if t.compile or device.type != "cuda":
            wanted = "compile" if t.compile else "eager"
        else:
            wanted = chosen or "eager"
    if wanted in CUDA_ONLY_STEPS and device.type != "cuda":
        log.warning(
            f"mclib: train.step = {wanted!r} needs CUDA (this run is on {device.type}): the step runs eagerly"
        )
        return "eager"
    if wanted in COMPILED_STEPS and emulated:
        return "eager"  # said once, in check_precision's line: compiled code would bypass the emulation
    return wanted


def compile_model(model, variant: str, device: torch.device):
    """The model a run's forward calls: `model`, or `torch.compile(model)` where the variant's
    `Way` compiles. On CUDA, Inductor's mix-order reduction is turned off where torch has the
    switch: with it, torch 2.10-2.11 can return a gradient of the wrong shape
    (pytorch/pytorch#178080). The parameters and their names stay `model`'s."""
    how = WAYS[variant].compile if variant in WAYS else None
    if how is None:
        return model
    if device.type == "cuda":
        import torch._inductor.config as inductor  # noqa: PLC0415 - inductor loads on CUDA only

        if hasattr(inductor, "triton") and hasattr(inductor.triton, "mix_order_reduction"):
            inductor.triton.mix_order_reduction = False
    if how == "autotune":
        return torch.compile(model, options={"max_autotune_gemm": True})
    return torch.compile(model, mode="reduce-overhead" if how == "reduce-overhead" else None)


def use_matmul_attention(model) -> None:
    """Switch a `MatrixBert` running sdpa to HF's "eager" attention (plain matmuls and softmax);
    any other model is left as it is. Parameters and their names do not change."""
    config = getattr(model, "config", None)
    if (
        getattr(config, "model_type", None) in (MODEL_TYPE, LEGACY["model_type"])
        and config._attn_implementation == "sdpa"
    ):
        model.set_attn_implementation("eager")


class TrainingRun:
    """One run in the loop: its model and Adam, folder, generators, step and metric rows. The loop
    (`mclib.core.train`) calls, in order: set up and resume (`__init__`), step (`train_step`),
    `evaluate`, `flush` (with the stop rule's verdict), `save`; it records the end from
    `finished` and `reason`. `in_memory` builds one with no folder, for timing and checking steps."""

    def __init__(
        self, job, device: torch.device, capture_ready: bool | None = None, chosen: str | None = None
    ):
        """Set up the run of `job` (a `mclib.core.train.Job`): its profile recorded, then its model,
        Adam, generators and rows fresh or as its newest intact checkpoint left them
        (`mclib.core.checkpoints.resume_run`). chosen: what `train.step: auto` runs as on CUDA.
        A run that has already ended is `finished` at once, with its `reason`."""
        p = job.profile.replace(**{"train.device": device.type})  # recorded as it runs (with_device)
        self._set_up(job, p, device, capture_ready, chosen)
        write_profile(self.dir, p)
        # the newest intact checkpoint; a damaged newer one is set aside, named in one line on stderr
        resumed = resume_run(self.dir, p.model.attention, device)
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
            self.model = (
                copy.deepcopy(job.init_model)
                if job.init_model is not None
                else build_model(p.model, p.data.n, p.seed)
            ).to(device)
        self._make_optimizer()
        self._prepare_step()
        self.written = len(self.rows)  # metric rows already in metrics.csv (`save_checkpoint`)
        # why it has ended (None: the cap, or it trains on), set again at every flush; a run whose
        # rows already meet its rule is `finished` here and the loop records its end
        self.reason = self.why_end(self.rows)

    @classmethod
    def in_memory(
        cls,
        profile: Profile,
        device: torch.device,
        capture_ready: bool | None = None,
        chosen: str | None = None,
    ) -> TrainingRun:
        """A fresh run with no folder: model, data stream, step, evaluation and `flush` as in the
        loop; `save` refuses (there is nowhere to save). capture_ready: as `make_optimizer`
        (default: on CUDA)."""
        run = cls.__new__(cls)
        run._set_up(None, profile, device, capture_ready, chosen)
        run.model = build_model(profile.model, profile.data.n, profile.seed).to(device)
        run._make_optimizer()
        run._prepare_step()
        run.written, run.reason = 0, None
        return run

    def _set_up(
        self, job, p: Profile, device: torch.device, capture_ready: bool | None, chosen: str | None
    ) -> None:
        """What every run starts with: its profile, device, generators, an empty row log and its stop rule."""
        self.job, self.profile, self.t, self.device = job, p, p.train, device
        self.dir = job.run_dir if job is not None else None
        self.capture_ready = device.type == "cuda" if capture_ready is None else capture_ready
        self.chosen = chosen
        # CPU generators on every device: the same matrices on a GPU as on a laptop, and a
        # run resumes on another device type (a CUDA generator's state is another format)
        self.gens = {
            "data": torch.Generator().manual_seed(p.seed),
            "eval": torch.Generator().manual_seed(p.seed + EVAL_SEED_OFFSET),
        }
        self.step, self.wall, self.rows, self.state = 0, 0.0, [], None
        self.save_at = (
            set(p.checkpoints.all_steps())
            | set(range(self.t.save_every, self.t.steps + 1, self.t.save_every))
            | {self.t.steps}
        )
        self.pending: list[torch.Tensor] = []  # per-step losses kept on the device until the next flush
        self.evals: dict[int, dict[str, float]] = {}
        self.why_end = stop_rule(p, job.stop if job is not None else None)  # `mclib.core.ending.stop_rule`
        self.step_said = None  # the STEP_RAN record last written (`save`)

    @property
    def finished(self) -> bool:
        """Whether the run has ended: its rule or stop, a cut (`reason`), or its last step."""
        return self.reason is not None or self.step >= self.t.steps

    def _make_optimizer(self) -> None:
        """The run's Adam, with the saved state on a resume."""
        self.model.train()
        self.opt = make_optimizer(
            self.model,
            self.t,
            self.device,
            self.state["optimizer"] if self.state is not None else None,
            capture_ready=self.capture_ready,
        )

    def _prepare_step(self) -> None:
        """Choose the step variant and build its `Way`: the attention, the (compiled) model the
        forward calls, the `StepGraph` where it has one, and `BatchesAhead` where batches are made
        ahead; on CUDA the batch goes into fixed buffers (`inputs`)."""
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
        """Whether TF32 is emulated (tf32 off CUDA); such a run steps eagerly."""
        return self.t.precision == "tf32" and self.device.type != "cuda"

    def forward(self, batch: Batch) -> torch.Tensor:
        """`predict` through the compiled model; a compile that fails here is said in one line and
        the run goes on eagerly."""
        try:
            if (
                self.variant == "reduce-overhead"
            ):  # a new step: the last one's graph outputs are free to reuse
                torch.compiler.cudagraph_mark_step_begin()
            return predict(self.compiled, batch)
        except Exception as e:
            if self.compiled is self.model:
                raise
            self.fall_back(e, self.variant, "torch.compile")
            self.compiled = self.model
            return predict(self.model, batch)

    def fall_back(self, error: Exception, variant: str, what: str) -> None:
        """`what` (torch.compile, a CUDA graph's capture) of the step `variant` failed with `error`:
        said in one line; the step runs eagerly from here on (`STEP_RAN` says so at the next save)."""
        self.fell_back = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:120]}"
        self.ran_from = self.step
        log.warning(f"mclib: train.step {variant}: {what} failed ({self.fell_back}); the step runs eagerly")

    @torch.no_grad()
    def evaluate(self) -> torch.Tensor:
        """`[4]` losses of the (uncompiled) model on a fresh eval batch, in eval mode."""
        batch = self.eval_batch()
        with (
            emulated_tf32(self.device, self.t.precision),
            eval_mode(self.model),
        ):  # as a GPU in TF32 evaluates
            pred = predict(self.model, batch)
        return run_losses(pred[None], batch.x[None], batch.mask[None])[0]

    def batch(self) -> Batch:
        """The next training batch of the run's generator, on the device; on a capture-ready run
        copied into its fixed input buffers (`mclib.core.graphstep.StaticBatch`)."""
        d = self.profile.data
        with record_function("mclib::data"):  # named for benchmarks/step_profile.py
            draw = lambda: sample_batch(self.t.batch, d.n, d.rank, d.p_mask, self.gens["data"], dist=d.dist)
            batch = self.ahead.next(draw, self.gens["data"]) if self.ahead is not None else draw()
            if not self.capture_ready:
                return batch.to(self.device, non_blocking=True)
            if self.inputs is None:
                self.inputs = StaticBatch(batch, self.device)
            return self.inputs.fill(batch)

    def eval_batch(self) -> Batch:
        d = self.profile.data
        return sample_batch(self.t.eval_batch, d.n, d.rank, d.p_mask, self.gens["eval"], dist=d.dist).to(
            self.device, non_blocking=True
        )

    def flush(self) -> str | None:
        """Move pending losses into rows; why the run ends here ("converged", "stopped": `why_end`), or
        None."""
        values = torch.stack(self.pending).cpu().tolist()  # the one host sync per flush
        first = self.step - len(values) + 1
        bad = next((i for i, v in enumerate(values) if not math.isfinite(v[0])), None)  # v[0]: L
        if bad is not None:
            where = self.dir if self.dir is not None else "an in-memory run"
            raise DivergedError(
                f"{where}: the training loss is {values[bad][0]} at step {first + bad}; the run stops "
                f"there, nothing after its last checkpoint is saved"
            )
        for i, v in enumerate(values):
            s = first + i
            row = {"step": s, **dict(zip(LOSS_NAMES, v)), "wall": self.wall if s == self.step else math.nan}
            row.update({f"eval_{k}": self.evals.get(s, {}).get(k, math.nan) for k in LOSS_NAMES})
            self.rows.append(row)
        self.pending.clear()
        self.evals.clear()
        return self.why_end(self.rows)

    def save(self, final: bool) -> None:
        """Save the run at this step: `STEP_RAN` where it changed (the variant asked for, resolved,
        run, why it fell back, from which step), the metric rows not yet in metrics.csv, then the
        checkpoint (Adam's state every `train.state_every` steps and when `final`); then prune
        (`checkpoints.keep`)."""
        if self.dir is None:
            raise RuntimeError("an in-memory run (TrainingRun.in_memory) has no folder to save to")
        said = {
            "planned": self.t.step,
            "variant": self.variant,
            "ran": "eager" if self.fell_back else self.variant,
            "fell_back": self.fell_back,
            "from_step": self.ran_from,
        }
        if said != self.step_said:
            write_atomic(self.dir / STEP_RAN, json.dumps(said, indent=1))
            self.step_said = said
        if (
            self.ahead is not None
        ):  # the generator as the next step draws: the batches made ahead are not kept
            self.ahead.rewind(self.gens["data"])
        state = final or not self.t.state_every or self.step % self.t.state_every == 0
        self.written = save_checkpoint(
            self.dir,
            self.step,
            self.model,
            self.opt if state else None,
            self.gens,
            rows=self.rows,
            written=self.written,
            wall=self.wall,
            device=self.device,
        )
        prune_checkpoints(self.dir, self.profile, self.rows, self.job.newest_only)


def steps_of(runs: list[TrainingRun]) -> Callable[[], torch.Tensor]:
    """A function that runs one `train_step` of in-memory `runs` and discards the logged rows;
    it returns the `[run, 4]` losses."""

    def step() -> torch.Tensor:
        out = train_step(runs)
        for r in runs:
            r.pending.clear()
        return out

    return step
