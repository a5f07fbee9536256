"""The GPU step's levers, on the CPU (mclib.core.graphstep, mclib.core.step.device_step): the
backward through L alone, the step capture-ready (static shapes, no host read inside it, the lr a
tensor Adam reads, Adam's state there before a capture, addresses fixed across steps and after a
resume), the warm-up that leaves a run as it was, and `train.step`'s variants and their check.
What needs CUDA (the capture and its agreement with eager over 20 steps) is the last test,
skipped here and run by benchmarks/lease_step.py on every lease."""

from __future__ import annotations

import pytest
import torch

from mclib.core import graphstep
from mclib.core.config import ConfigError, load_profile, profile_path
from mclib.core.data import sample_batch
from mclib.core.metrics import run_losses
from mclib.core.model import build_model
from mclib.core.step import TrainingRun, device_step, set_lr, step_variant, train_step
from mclib.core.train import Job, train
from mclib.core.variants import Trace, compare, initial_params, trace

CPU = torch.device("cpu")


def _profile(**over):
    """The default profile (params/cpu.yaml), eager (its compile is a CPU choice, tested elsewhere)."""
    return load_profile(profile_path("cpu")).replace(
        **{"train.compile": False, "train.step": "eager", **over}
    )


def _batch(p, seed=99):
    d = p.data
    return sample_batch(
        p.train.batch, d.n, d.rank, d.p_mask, torch.Generator().manual_seed(seed), dist=d.dist
    )


def test_the_backward_through_L_alone_gives_the_same_gradients_and_losses():
    """Before 2026-11-27 the step differentiated L through the stack of all four losses, so the
    backward also ran (zero-gradient) kernels through L_obs, L_mask and the mask value; now those
    are read under no_grad. The parameters' gradients and the logged losses are the same bits."""
    p = _profile(**{"train.grad_clip": 0.0})
    batch = _batch(p)
    before = build_model(p.model, p.data.n, p.seed).train()
    pred = before(batch.tokens).logits.view_as(batch.x)
    old = run_losses(pred[None], batch.x[None], batch.mask[None])[0]
    old[0].backward()
    run = TrainingRun.in_memory(p, CPU)
    new = device_step(run, batch)
    assert not new.requires_grad and torch.equal(new, old.detach())
    grads = dict(before.named_parameters())
    for name, q in run.model.named_parameters():
        if q.requires_grad:
            assert torch.equal(q.grad, grads[name].grad), name


def test_a_capture_ready_adam_reads_its_lr_from_a_tensor_written_in_place():
    """make_optimizer(capture_ready=True), as on CUDA: fused, capturable, the lr an fp32 tensor;
    set_lr writes it in place (a replay reads the same address) and Adam's update follows it."""
    p = _profile(**{"train.warmup": 10})
    run = TrainingRun.in_memory(p, CPU, capture_ready=True)
    group = run.opt.param_groups[0]
    assert group["fused"] and group["capturable"] and isinstance(group["lr"], torch.Tensor)
    lr = group["lr"]
    address = lr.data_ptr()
    train_step([run])
    assert group["lr"] is lr and lr.data_ptr() == address
    assert (
        lr.item() == torch.tensor(p.train.lr / 10, dtype=torch.float32).item()
    )  # lr_at(1) of a 10-step warm-up
    set_lr(run.opt, 0.0)
    before = [q.detach().clone() for q in run.opt.param_groups[0]["params"]]
    device_step(run, run.inputs.batch)
    assert all(
        torch.equal(a, b) for a, b in zip(before, run.opt.param_groups[0]["params"])
    )  # lr 0: no update


def test_the_device_step_reads_nothing_back_to_the_host_outside_adam():
    """Forward (the HF model), loss, backward and clip launch no host read of a device value
    (item, a tensor's truth value): each would wait for a GPU and break a capture. Adam is left
    out here: on the CPU torch's fused kernel reads its lr on the host; on CUDA it reads device memory."""
    from torch.profiler import ProfilerActivity, profile

    p = _profile(**{"train.grad_clip": 1.0})
    run = TrainingRun.in_memory(p, CPU, capture_ready=True)
    train_step([run])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        device_step(run, run.inputs.batch)
    reads = []
    for ev in prof.events():
        if ev.name in ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero"):
            parent, in_adam = ev.cpu_parent, False
            while parent is not None:
                in_adam |= parent.name == "mclib::optimiser"
                parent = parent.cpu_parent
            if not in_adam:
                reads.append(ev.name)
    assert reads == []


def _addresses(run) -> dict[str, int]:
    out = {f"param {n}": q.data_ptr() for n, q in run.model.named_parameters()}
    out.update({f"buffer {n}": b.data_ptr() for n, b in run.model.named_buffers()})
    for i, q in enumerate(run.opt.param_groups[0]["params"]):
        out.update({f"adam {i} {k}": v.data_ptr() for k, v in run.opt.state[q].items()})
    out["lr"] = run.opt.param_groups[0]["lr"].data_ptr()
    out.update(
        {
            f"input {i}": t.data_ptr()
            for i, t in enumerate((run.inputs.batch.x, run.inputs.batch.mask, run.inputs.batch.tokens))
        }
    )
    return out


def test_static_shapes_and_fixed_addresses_across_steps():
    """After the first step (or a warm-up) every parameter, buffer, Adam state tensor, the lr and
    the input buffers keep their address, and the batch its shape, step after step."""
    p = _profile()
    run = TrainingRun.in_memory(p, CPU, capture_ready=True)
    train_step([run])
    first, shapes = _addresses(run), [tuple(t.shape) for t in (run.inputs.batch.x, run.inputs.batch.tokens)]
    for _ in range(4):
        out = train_step([run])
        assert out.shape == (1, 4)
        assert [tuple(t.shape) for t in (run.inputs.batch.x, run.inputs.batch.tokens)] == shapes
    assert _addresses(run) == first


def test_a_resumed_run_has_adams_state_before_its_first_step_and_fixed_addresses(tmp_path, smoke_profile):
    """A run resumed from a checkpoint: Adam's state is loaded (and its step counts moved beside
    the parameters, as fused Adam keeps them) before any step, so a capture could come first;
    its addresses then stay fixed."""
    p = smoke_profile.replace(**{"train.compile": False, "train.step": "eager"})
    train(p, tmp_path, progress=False, stop=lambda rows: rows[-1]["step"] >= 20)
    run = TrainingRun(Job(p, tmp_path), CPU, capture_ready=True)
    assert run.step == 20
    trained = run.opt.param_groups[0]["params"]
    assert all(
        run.opt.state[q]["step"].dtype == torch.float32 and run.opt.state[q]["step"].item() == 20
        for q in trained
    )
    train_step([run])
    first = _addresses(run)
    for _ in range(3):
        train_step([run])
    assert _addresses(run) == first


@pytest.mark.parametrize("steps_before", [0, 2])
def test_the_warm_up_materialises_adams_state_and_leaves_the_run_as_it_was(steps_before):
    """graphstep.warm_up (what precedes a capture): afterwards Adam's state exists, and the run
    trains on to the same bits as a run never warmed up, from a fresh state or a used one."""
    p = _profile(**{"train.warmup": 5})
    warmed, plain = (TrainingRun.in_memory(p, CPU, capture_ready=True) for _ in range(2))
    for _ in range(steps_before):
        train_step([warmed]), train_step([plain])
    graphstep.warm_up(warmed, device_step, _batch(p, seed=7))
    assert all(warmed.opt.state[q] for q in warmed.opt.param_groups[0]["params"])
    assert all(q.grad is None for q in warmed.opt.param_groups[0]["params"])
    a = torch.cat([train_step([warmed]) for _ in range(3)])
    b = torch.cat([train_step([plain]) for _ in range(3)])
    assert torch.equal(a, b)
    assert all(torch.equal(x, y) for x, y in zip(warmed.model.parameters(), plain.model.parameters()))


@pytest.mark.parametrize("variant", ["cuda-graph", "reduce-overhead"])
def test_a_cuda_only_step_on_the_cpu_runs_eagerly_said_in_one_line(variant, logged):
    run = TrainingRun.in_memory(_profile(**{"train.step": variant}), CPU)
    err = logged.err()
    assert err == f"mclib: train.step = {variant!r} needs CUDA (this run is on cpu): the step runs eagerly\n"
    assert run.variant == "eager" and run.graph is None and run.compiled is run.model


def test_a_capture_that_fails_falls_back_to_eager_in_one_line_and_trains_as_eager(logged):
    """A StepGraph whose capture fails (here: no CUDA) says why in one line, records it, and the
    run steps eagerly from where it was: the same bits as a run that never tried."""
    p = _profile()
    tried, plain = (TrainingRun.in_memory(p, CPU, capture_ready=True) for _ in range(2))
    tried.graph = graphstep.StepGraph(tried, device_step)
    a = torch.cat([train_step([tried]) for _ in range(3)])
    b = torch.cat([train_step([plain]) for _ in range(3)])
    err = logged.err()
    assert (
        err.count("\n") == 1
        and "train.step cuda-graph: capture failed (RuntimeError: a CUDA graph needs CUDA" in err
    )
    assert tried.graph is None and tried.fell_back.startswith("RuntimeError")
    assert torch.equal(a, b)


def test_auto_on_the_cpu_is_the_profiles_compile_and_measures_nothing(monkeypatch):
    import mclib.core.variants

    monkeypatch.setattr(mclib.core.variants, "choose", lambda *a: pytest.fail("auto measured on the CPU"))
    p = _profile(**{"train.step": "auto"})
    assert mclib.core.variants.auto_step(p, CPU) is None
    assert step_variant(p, CPU) == "eager"
    assert step_variant(p.replace(**{"train.compile": True}), CPU) == "compile"
    assert step_variant(p.replace(**{"train.compile": True}), CPU, emulated=True) == "eager"  # TF32 emulated


def test_a_step_variant_that_does_not_exist_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        _profile(**{"train.step": "graph"})
    assert str(e.value) == (
        "train.step = 'graph' is not one of auto, eager, compile, reduce-overhead, cuda-graph, "
        "matmul-attention, compile-matmul-attention, ahead, cuda-graph-ahead, compile-graph, "
        "compile-graph-matmul-attention, autotune-graph"
    )


def _trace(losses, params, fell_back=None):
    return Trace("v", torch.tensor(losses), {"w": torch.tensor(params)}, fell_back, None)


def test_every_variant_is_held_to_one_tolerance_and_bitwise_equality_is_information():
    """The whole-step graph is checked as a compile is: a variant not bitwise equal to eager passes
    within LOSS_RTOL and UPDATE_RTOL (bitwise False, shown); one whose update drifts past
    UPDATE_RTOL, or whose loss drifts past LOSS_RTOL, fails whatever it is; a fallback never passes."""
    from mclib.core.variants import LOSS_RTOL, UPDATE_RTOL

    start = {"w": torch.tensor([0.0, 0.0])}
    ref = _trace([[1.0, 2.0]], [1.0, 1.0])
    same = compare(ref, _trace([[1.0, 2.0]], [1.0, 1.0]), start)
    assert same.passed and same.bitwise and same.text.endswith("; bitwise equal")
    near = compare(
        ref, _trace([[1.0, 2.0 + 1e-6]], [1.0, 1.0 + 1e-3]), start
    )  # the graph's drift on the H200
    assert near.passed and not near.bitwise and near.text.startswith("within tolerance of eager over 1 steps")
    drift = 1.5 * UPDATE_RTOL * 2**0.5  # eager's update has the L2 norm √2: 1.5 × UPDATE_RTOL of it
    far = compare(ref, _trace([[1.0, 2.0]], [1.0, 1.0 + drift]), start)
    assert not far.passed and far.update_rel > UPDATE_RTOL and "OUTSIDE" in far.text
    lossy = compare(ref, _trace([[1.0, 2.0 * (1 + 2 * LOSS_RTOL)]], [1.0, 1.0]), start)
    assert not lossy.passed and lossy.loss_rel > LOSS_RTOL
    fell = compare(ref, _trace([[1.0, 2.0]], [1.0, 1.0], fell_back="BackendCompilerFailed: x"), start)
    assert (
        not fell.passed and fell.text == "fell back: BackendCompilerFailed: x"
    )  # never reported as compiled


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="a CUDA graph needs CUDA (benchmarks/lease_step.py checks it on a lease)",
)
def test_the_cuda_graph_trains_within_the_tolerance_of_eager_over_20_steps():
    p = load_profile(profile_path("cpu")).replace(
        **{"train.device": "cuda", "train.compile": False, "train.warmup": 5}
    )
    device = torch.device("cuda")
    start = initial_params(p, device)
    ref, graph = trace(p, device, "eager"), trace(p, device, "cuda-graph")
    check = compare(ref, graph, start)
    assert graph.fell_back is None and check.passed, check.text


@pytest.mark.slow  # ~11 s on a busy 2-core machine
def test_the_hf_model_compiles_as_one_graph_forward_and_backward():
    """MatrixBert (the HF BertModel and its read-out) traced by torch.compile without a graph
    break: Dynamo's explain finds one graph and no break, and fullgraph=True (which raises on
    any break) runs forward and backward (AOTAutograd's joint graph, backend aot_eager: the
    tracing Inductor would get, without its C++ compile) to the eager gradients."""
    from mclib.core.config import ModelConfig

    torch._dynamo.reset()
    model = build_model(ModelConfig(layers=2, heads=2, hidden=16, intermediate=32), 3, seed=1).train()
    tokens = torch.randint(0, 5, (4, 9), generator=torch.Generator().manual_seed(0))
    explained = torch._dynamo.explain(model)(tokens)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    model(tokens).logits.square().mean().backward()
    eager = {n: q.grad.clone() for n, q in model.named_parameters() if q.requires_grad}
    model.zero_grad(set_to_none=True)
    torch.compile(model, fullgraph=True, backend="aot_eager")(tokens).logits.square().mean().backward()
    for n, q in model.named_parameters():
        if q.requires_grad:
            # two float paths (aot_eager's decomposed ops against the eager kernels): TWO_PATHS_REL's scale
            torch.testing.assert_close(q.grad, eager[n], rtol=1e-4, atol=1e-6, msg=n)
    torch._dynamo.reset()


# --- the step's variants (mclib.core.step.WAYS) ---------------------------------------------


def test_every_step_variant_is_a_train_step_the_profile_accepts():
    from mclib.core.config import STEPS
    from mclib.core.step import WAYS

    assert set(WAYS) == set(STEPS) - {"auto"}


def test_matmul_attention_runs_hf_eager_attention_and_trains_within_the_tolerance_of_eager():
    """`train.step: matmul-attention` on the CPU: the model's attention is HF's "eager" (matmuls
    and a softmax), the profile's sdpa elsewhere; the check's code path passes it against eager."""
    p = _profile(**{"train.batch": 8})
    start = initial_params(p, CPU)
    ref, got = trace(p, CPU, "eager", 5), trace(p, CPU, "matmul-attention", 5)
    assert ref.run.model.config._attn_implementation == "sdpa"
    assert got.run.model.config._attn_implementation == "eager" and got.fell_back is None
    check = compare(ref, got, start)
    assert check.passed, check.text


def test_batches_made_ahead_are_the_step_by_step_batches_and_a_save_rewinds_the_generator():
    """`train.step: ahead` draws BatchesAhead.AHEAD batches at a time from the run's generator: the
    same batches in the same order (the step trains to the same bits as eager), and `rewind` (at a
    save) puts the generator where the step-by-step path leaves it, so a resume draws the same."""
    p = _profile(**{"train.batch": 4})
    plain, ahead = (
        TrainingRun.in_memory(p, CPU),
        TrainingRun.in_memory(p.replace(**{"train.step": "ahead"}), CPU),
    )
    assert ahead.ahead is not None and plain.ahead is None
    a = torch.cat([train_step([plain]) for _ in range(5)])
    b = torch.cat([train_step([ahead]) for _ in range(5)])
    assert torch.equal(a, b)
    assert len(ahead.ahead.queue) == graphstep.BatchesAhead.AHEAD - 5
    assert not torch.equal(ahead.gens["data"].get_state(), plain.gens["data"].get_state())  # drawn ahead
    ahead.ahead.rewind(ahead.gens["data"])
    assert (
        torch.equal(ahead.gens["data"].get_state(), plain.gens["data"].get_state())
        and ahead.ahead.queue == []
    )
    assert torch.equal(train_step([plain]), train_step([ahead]))


def test_a_run_with_batches_ahead_resumes_to_the_same_rows_as_one_never_stopped(tmp_path, smoke_profile):
    from mclib.core.metrics import LOSS_NAMES
    from mclib.core.runs import load_metrics

    p = smoke_profile.replace(**{"train.compile": False, "train.step": "ahead"})
    whole, part = tmp_path / "whole", tmp_path / "part"
    train(p, whole, progress=False)
    train(
        p, part, progress=False, stop=lambda rows: rows[-1]["step"] >= 20
    )  # saved at 20, 12 batches ahead drawn
    train(p, part, progress=False)
    cols = list(LOSS_NAMES)
    assert load_metrics(whole)[cols].equals(load_metrics(part)[cols])


def _stock_bert_loads(model, path) -> None:
    """`model` (a MatrixBert) saved and loaded into a stock transformers BertModel: every key of
    the encoder found; only the read-out is left over and only the pooler (not built) is missing."""
    from transformers import BertModel

    model.save_pretrained(path)
    _, info = BertModel.from_pretrained(path, output_loading_info=True)
    assert all(k.startswith("pooler.") for k in info["missing_keys"]), info["missing_keys"]
    assert all(k.startswith("readout.") for k in info["unexpected_keys"]), info["unexpected_keys"]
    assert not info["mismatched_keys"]


TRAINABLE_CPU = [
    "eager",
    "matmul-attention",
    "ahead",
    "cuda-graph",
    "cuda-graph-ahead",
    "compile-graph",
    "compile-graph-matmul-attention",
    "autotune-graph",
    "reduce-overhead",
]  # CUDA-only ones run eagerly here


@pytest.mark.parametrize(
    "variant",
    TRAINABLE_CPU
    + [pytest.param(v, marks=pytest.mark.slow) for v in ("compile", "compile-matmul-attention")],
)
def test_a_model_trained_by_each_trainable_variant_keeps_bert_models_parameter_names(
    variant, tmp_path, capsys
):
    """No variant a slice may train with renames or reshapes a parameter: the trained model has
    the state-dict keys of a fresh one, and its checkpoint loads into a stock BertModel."""
    from mclib.core.step import WAYS
    from mclib.lease.stepbench import TRAINABLE

    assert set(TRAINABLE) == set(WAYS) and variant in TRAINABLE
    p = _profile(**{"train.batch": 2, "train.step": variant})
    run = TrainingRun.in_memory(p, CPU)
    for _ in range(2):
        train_step([run])
    fresh = build_model(p.model, p.data.n, p.seed)
    assert list(run.model.state_dict()) == list(fresh.state_dict())
    assert all(run.model.state_dict()[k].shape == v.shape for k, v in fresh.state_dict().items())
    _stock_bert_loads(run.model, tmp_path / variant)
    torch._dynamo.reset()


def test_an_in_memory_run_steps_and_flushes_like_a_folder_run_and_refuses_to_save(tmp_path):
    """`TrainingRun.in_memory` is a whole run without a folder: its losses are the folder run's,
    step for step, its rows flush as the loop's do, and `save` says there is nowhere to save."""
    p = _profile()
    mem, disk = TrainingRun.in_memory(p, CPU), TrainingRun(Job(p, tmp_path), CPU)
    for _ in range(3):
        for r in (mem, disk):
            train_step([r])
    assert torch.equal(torch.stack(mem.pending), torch.stack(disk.pending))
    assert mem.flush() is None and disk.flush() is None and [r["step"] for r in mem.rows] == [1, 2, 3]
    assert [r["L_mask"] for r in mem.rows] == [r["L_mask"] for r in disk.rows] and not mem.finished
    with pytest.raises(RuntimeError, match="no folder"):
        mem.save(final=True)
