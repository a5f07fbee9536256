"""The stacked training path (mclib.core.stacked) against HF's MatrixBert, and runs trained together."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from mclib.core.data import sample_batch
from mclib.analyses.interventions import reinit_component
from mclib.core.model import build_model, load_model
from mclib.core.stacked import Stack, forward
from mclib.core.metrics import losses, run_losses
from mclib.core.config import ModelConfig, load_profile, profile_path
from mclib.core.train import Job, fast_path_refusal, step_function, train, train_group
from mclib.core.runs import checkpoint_dir, load_checkpoint, load_metrics

LOSS_COLS = ["L", "L_obs", "L_mask", "mask_value", "eval_L", "eval_L_mask"]


def _batch(p, seed, batch=16):
    return sample_batch(batch, p.data.n, p.data.rank, p.data.p_mask, torch.Generator().manual_seed(seed))


# Every field of ModelConfig with a value away from the smoke profile's. The stacked forward
# (mclib.core.stacked) writes the architecture a second time, so it must equal MatrixBert's
# under each lever; a field added to ModelConfig fails the next test until it is listed here.
LEVERS = {"layers": 3, "heads": 4, "hidden": 24, "intermediate": 48, "init_std": 0.1, "attention": "eager",
          "attn_bias": 1.5, "attn_bias_target": "other"}
WITH = {"attn_bias_target": {"model.attn_bias": 1.5}}  # a lever that acts only with another one set
NOT_STACKED = {"kind"}  # model.kind: gpt trains on the reference path (fast_path_refusal)


def test_every_model_lever_is_checked_on_the_stacked_path(smoke_profile):
    assert {f.name for f in dataclasses.fields(ModelConfig)} == set(LEVERS) | NOT_STACKED
    gpt = load_profile(profile_path("gpt")).replace(**{"train.fast": True})
    assert "reference path" in fast_path_refusal(gpt)


@pytest.mark.parametrize("lever", [None, *LEVERS])
def test_forward_equals_matrixbert_for_every_run_of_a_stack(smoke_profile, lever):
    p = smoke_profile if lever is None else smoke_profile.replace(**{f"model.{lever}": LEVERS[lever],
                                                                     **WITH.get(lever, {})})
    models = [build_model(p.model, p.data.n, seed) for seed in (1, 2, 3)]
    with torch.no_grad():  # layer norms away from their init (gain 1, bias 0), so that one read from the wrong run shows
        for m in models:
            for name, q in m.named_parameters():
                if "LayerNorm." in name or "_norm." in name:
                    q.add_(0.3 * torch.randn_like(q))
    batches = [_batch(p, seed) for seed in (11, 12, 13)]
    with torch.no_grad():
        out = forward(Stack(models), torch.stack([b.tokens for b in batches]))
        for r, (m, b) in enumerate(zip(models, batches)):
            torch.testing.assert_close(out[r], m.eval()(b.tokens), rtol=0, atol=1e-5)


def test_a_stack_is_a_module_whose_parameters_torch_sees(smoke_profile):
    """`.parameters()`, `.to()` and `state_dict()` are nn.Module's own; the forward reads the moved weights."""
    models = [build_model(smoke_profile.model, 7, seed) for seed in (1, 2)]
    stack = Stack(models)
    assert sum(q.numel() for q in stack.parameters()) == sum(q.numel() for q in stack.params.values()) > 0
    assert set(stack.state_dict()) == {n.replace(".", "/") for n in stack.params}
    stack.to(torch.float64)
    assert all(q.dtype == torch.float64 for q in stack.params.values())
    assert all(a is b for a, b in zip(stack.parameters(), stack.params.values()))
    tokens = torch.stack([_batch(smoke_profile, s).tokens for s in (1, 2)])
    assert forward(stack, tokens).dtype == torch.float64
    two = stack.select([1])
    assert two.runs == 1 and len(list(two.parameters())) == len(list(stack.parameters()))


def test_gradients_equal_matrixbert(smoke_profile):
    p = smoke_profile
    model = build_model(p.model, p.data.n, 5)
    b = _batch(p, 3)
    losses(model(b.tokens).view_as(b.x), b.x, b.mask)["L"].backward()
    stack = Stack([model])
    run_losses(forward(stack, b.tokens[None]), b.x[None], b.mask[None])[:, 0].sum().backward()
    hf = dict(model.named_parameters())
    torch.testing.assert_close(stack.params["readout.weight"].grad[0], hf["readout.weight"].grad, rtol=1e-4, atol=1e-7)
    qkv = stack.params["bert.encoder.layer.0.attention.self.qkv.weight"].grad[0]
    h = p.model.hidden
    torch.testing.assert_close(qkv[h:2 * h], hf["bert.encoder.layer.0.attention.self.key.weight"].grad,
                               rtol=1e-4, atol=1e-7)
    word = stack.params["bert.embeddings.word_embeddings.weight"].grad[0]
    torch.testing.assert_close(word[1:], hf["bert.embeddings.word_embeddings.weight"].grad[1:], rtol=1e-4, atol=1e-7)


def test_copy_into_gives_back_every_weight_bit_for_bit(smoke_profile):
    p = smoke_profile
    models = [build_model(p.model, p.data.n, s) for s in (1, 2)]
    stack = Stack(models)
    target = build_model(p.model, p.data.n, 9)
    stack.copy_into(1, target)
    for (name, a), b in zip(models[1].state_dict().items(), target.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_stack_refuses_models_of_different_architectures(smoke_profile):
    p = smoke_profile
    wide = build_model(p.replace(**{"model.hidden": 32}).model, p.data.n, 1)
    with pytest.raises(ValueError, match="different architectures"):
        Stack([build_model(p.model, p.data.n, 1), wide])


def test_fast_and_reference_paths_train_alike(tmp_path, smoke_profile):
    p = smoke_profile.replace(**{"train.steps": 30, "checkpoints.post": 30, "checkpoints.transition": [20, 30]})
    fast = load_metrics(train(p, tmp_path / "fast", progress=False))
    ref = load_metrics(train(p.replace(**{"train.fast": False}), tmp_path / "ref", progress=False))
    pd.testing.assert_frame_equal(fast[LOSS_COLS], ref[LOSS_COLS], check_exact=False, rtol=1e-4)


def test_checkpoints_resume_on_the_other_path(tmp_path, smoke_profile):
    """A fast-path checkpoint (weights + Adam state) resumes on the reference path and the
    other way round; both continue like a run that never switched (to fp32 tolerance)."""
    p = smoke_profile.replace(**{"train.steps": 40, "checkpoints.post": 40})
    whole = load_metrics(train(p, tmp_path / "whole", progress=False))
    for first, then in ((True, False), (False, True)):
        run = tmp_path / f"switch-{first}"
        train(p.replace(**{"train.steps": 20, "checkpoints.post": 20, "checkpoints.transition": [20],
                           "train.fast": first}), run, progress=False)
        switched = load_metrics(train(p.replace(**{"train.fast": then}), run, progress=False))
        pd.testing.assert_frame_equal(whole[LOSS_COLS], switched[LOSS_COLS], check_exact=False, rtol=1e-4)
        state = torch.load(checkpoint_dir(run, 40) / "train_state.pt", weights_only=False)
        assert {s["step"].item() for s in state["optimizer"]["state"].values()} == {40.0}


def test_runs_trained_together_match_runs_trained_alone(tmp_path, smoke_profile):
    """Grouping changes only the float summation order of some reductions over the batch
    (bias and layer-norm gradients): equal to ~1e-7 after 60 steps, not bit for bit.
    The same grouping twice is bit-identical."""
    p = smoke_profile
    jobs = lambda root, seeds: [Job(p.replace(seed=s), root / f"seed{s}") for s in seeds]
    train_group(jobs(tmp_path / "together", [1, 2, 3]))
    train_group(jobs(tmp_path / "again", [1, 2, 3]))
    train_group(jobs(tmp_path / "pair", [3, 1]))
    for s in (1, 2, 3):
        alone = load_metrics(train(p.replace(seed=s), tmp_path / f"alone{s}", progress=False))[LOSS_COLS]
        together = load_metrics(tmp_path / "together" / f"seed{s}")[LOSS_COLS]
        pd.testing.assert_frame_equal(alone, together, check_exact=False, rtol=1e-5, atol=1e-7)
        assert together.equals(load_metrics(tmp_path / "again" / f"seed{s}")[LOSS_COLS])
        if s != 2:
            pd.testing.assert_frame_equal(alone, load_metrics(tmp_path / "pair" / f"seed{s}")[LOSS_COLS],
                                          check_exact=False, rtol=1e-5, atol=1e-7)
    assert not load_metrics(tmp_path / "together" / "seed1")[LOSS_COLS].equals(
        load_metrics(tmp_path / "together" / "seed2")[LOSS_COLS])  # the seeds did train differently


def test_a_stack_of_runs_at_different_steps_with_one_stopping_early(tmp_path, smoke_profile):
    """Runs resumed from different checkpoints train as one stack (each its own step and
    warm-up), and a run whose `stop` fires leaves the stack while the others go on."""
    p = smoke_profile.replace(**{"train.warmup": 10})
    a, b = tmp_path / "a", tmp_path / "b"
    train(p.replace(**{"train.steps": 20, "checkpoints.post": 20, "checkpoints.transition": [20]}), a, progress=False)
    stop_b = lambda rows: rows[-1]["step"] >= 30
    train_group([Job(p, a), Job(p.replace(seed=2), b, stop=stop_b)])
    assert load_metrics(a)["step"].iloc[-1] == 60 and load_metrics(b)["step"].iloc[-1] == 30
    whole = load_metrics(train(p, tmp_path / "whole", progress=False))
    pd.testing.assert_frame_equal(whole[LOSS_COLS], load_metrics(a)[LOSS_COLS], check_exact=False,
                                  rtol=1e-5, atol=1e-7)


def test_frozen_groups_stay_frozen_in_a_stack(tmp_path, smoke_profile):
    """E15's runs: each re-initialises one group and freezes the rest; stacked together,
    every frozen parameter of every run is unchanged bit for bit."""
    p = smoke_profile.replace(**{"train.steps": 20, "checkpoints.post": 20, "checkpoints.transition": [20]})
    source = load_checkpoint(train(p, tmp_path / "main", progress=False), 20)
    jobs = [Job(p.replace(name=f"freeze-{g}"), tmp_path / g, init_model=reinit_component(source, g, seed=1))
            for g in ("attention", "positional")]
    train_group(jobs)
    for job in jobs:
        trained = load_model(checkpoint_dir(job.run_dir, 20))
        start = dict(job.init_model.named_parameters())
        moved = {n for n, q in trained.named_parameters() if not torch.equal(q, start[n])}
        assert moved and all(start[n].requires_grad for n in moved), job.run_dir.name


def test_step_function_gives_the_same_losses_on_both_paths(smoke_profile):
    """`step_function` (what the benchmarks time): the reference and the stacked step of the
    same seed see the same matrices and compute the same losses, step after step."""
    p = smoke_profile.replace(**{"train.compile": False})
    ref = step_function(p.replace(**{"train.fast": False}), torch.device("cpu"))
    fast = step_function(p.replace(**{"train.fast": True}), torch.device("cpu"))
    steps = [(ref()[0], fast()[0]) for _ in range(5)]
    for a, f in steps:
        torch.testing.assert_close(a, f, rtol=1e-4, atol=1e-7)
    assert steps[-1][0][0] < steps[0][0][0]  # and they train


def test_a_compile_that_fails_falls_back_to_the_eager_step_with_a_notice(tmp_path, smoke_profile, monkeypatch,
                                                                         capsys):
    def broken_compile(fn, *args, **kwargs):
        def run(*a, **k):
            raise RuntimeError("no C++ compiler found\nsecond line")
        return run
    monkeypatch.setattr(torch, "compile", broken_compile)
    p = smoke_profile.replace(**{"train.compile": True, "train.steps": 20, "checkpoints.post": 20,
                                 "checkpoints.transition": [20]})
    eager = load_metrics(train(p.replace(**{"train.compile": False}), tmp_path / "eager", progress=False))
    fell_back = load_metrics(train(p, tmp_path / "compiled", progress=False))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torch.compile failed" in err[0] and "no C++ compiler" in err[0]
    assert eager[LOSS_COLS].equals(fell_back[LOSS_COLS])
