import copy
import json
import multiprocessing as mp
import os
import shutil
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from mclib.chapters.registry import specs as chapter_specs
from mclib.core import paper, precision, variants
from mclib.core import train as train_module
from mclib.core.checkpoints import load_checkpoint, save_checkpoint, saved_steps
from mclib.core.config import ConfigError
from mclib.core.data import copy_level, sample_batch
from mclib.core.ending import is_complete, stop_after_drop
from mclib.core.metrics import find_drop, window_mean
from mclib.core.model import build_model
from mclib.core.runs import checkpoint_dir, freeze_dir, load_metrics, seed_run_dirs
from mclib.core.step import STEP_RAN, TrainingRun, make_optimizer, train_step
from mclib.core.train import Job, only_trainer, parallel_runs, train, train_group, train_seeds
from mclib.core.variants import step_function

SPECS = (
    chapter_specs()
)  # what the toc's chapters declare (mclib.book.spec), as the command line hands it down


def test_smoke_run_learns_to_copy(smoke_run, smoke_profile):
    m = load_metrics(smoke_run)
    assert list(m["step"]) == list(range(1, smoke_profile.train.steps + 1))
    assert m["L_obs"].tail(10).mean() < 0.2 * m["L_obs"].head(5).mean()
    assert m["eval_L"].notna().sum() == smoke_profile.train.steps // smoke_profile.train.eval_every
    assert set(smoke_profile.checkpoints.all_steps()) <= set(saved_steps(smoke_run))
    assert (smoke_run / "profile.yaml").is_file()


def _state(run_dir, step):
    model = load_checkpoint(run_dir, step)
    return {k: v.clone() for k, v in model.state_dict().items()}


LOSS_COLS = ["step", "L", "L_obs", "L_mask", "mask_value", "eval_L", "eval_L_mask"]


def _whole_and_resumed(profile, tmp_path) -> tuple[Path, Path]:
    """One run straight through; one stopped after its first checkpoint (step 20) and
    resumed to the end. Their metrics must be the same to the bit."""
    whole = train(profile, tmp_path / "whole", progress=False)
    part = tmp_path / "part"
    train(profile, part, progress=False, stop=lambda rows: rows[-1]["step"] >= 20)
    assert saved_steps(part) == [20]
    train(profile, part, progress=False)
    pd.testing.assert_frame_equal(
        load_metrics(whole)[LOSS_COLS], load_metrics(part)[LOSS_COLS], check_exact=True
    )
    return whole, part


@pytest.mark.slow
def test_resume_is_bit_identical(tmp_path, smoke_profile):
    whole, part = _whole_and_resumed(smoke_profile, tmp_path)
    a, b = _state(whole, 60), _state(part, 60)
    assert all(torch.equal(a[k], b[k]) for k in a)


def _train_in_child(profile, run_dir, threads):
    # the same thread count as the parent: a different one changes the float reduction
    # order of the matmuls, and bit-identity is only promised for the same setting
    torch.set_num_threads(threads)
    train(profile, run_dir, progress=False)


@pytest.mark.slow
def test_resume_after_a_hard_kill(tmp_path, smoke_profile):
    """SIGKILL mid-run at an arbitrary moment, then rerun: same result as uninterrupted."""
    profile = smoke_profile.replace(**{"train.steps": 400, "train.save_every": 40, "checkpoints.post": 400})
    whole = train(profile, tmp_path / "whole", progress=False)
    run = tmp_path / "killed"
    child = mp.get_context("spawn").Process(
        target=_train_in_child, args=(profile, run, torch.get_num_threads())
    )
    child.start()
    deadline = time.time() + 120
    while len(saved_steps(run)) < 2 and time.time() < deadline and child.is_alive():
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert 0 < len(saved_steps(run)) and saved_steps(run)[-1] < 400, "kill came too late to test resume"
    train(profile, run, progress=False)
    pd.testing.assert_frame_equal(
        load_metrics(whole)[LOSS_COLS], load_metrics(run)[LOSS_COLS], check_exact=True
    )
    a, b = _state(whole, 400), _state(run, 400)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_finished_run_is_not_retrained(smoke_run, smoke_profile):
    before = (checkpoint_dir(smoke_run, 60) / "model.safetensors").stat().st_mtime_ns
    train(smoke_profile, smoke_run, progress=False)
    assert (checkpoint_dir(smoke_run, 60) / "model.safetensors").stat().st_mtime_ns == before


def test_resume_with_another_profile_is_refused(smoke_run, smoke_profile):
    with pytest.raises(ConfigError, match="model.hidden differs"):
        train(smoke_profile.replace(**{"model.hidden": 32}), smoke_run, progress=False)


def test_bf16_autocast_runs(tmp_path, smoke_profile):
    p = smoke_profile.replace(
        **{
            "train.precision": "bf16",
            "train.steps": 20,
            "checkpoints.transition": [20],
            "checkpoints.post": 20,
        }
    )
    m = load_metrics(train(p, tmp_path, progress=False))
    assert m["L"].notna().all() and m["L"].iloc[-1] < m["L"].iloc[0]


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="torch.compile needs a C compiler"
)
def test_compiled_step_trains_like_the_eager_step(tmp_path, smoke_profile):
    """train.compile (meant for a GPU) computes the same losses as the plain step, and the
    checkpoints it writes load into the uncompiled model (no `_orig_mod.` in the names)."""
    short = {"train.steps": 20, "checkpoints.transition": [20], "checkpoints.post": 20}
    eager = load_metrics(train(smoke_profile.replace(**short), tmp_path / "eager", progress=False))
    torch._dynamo.reset()
    compiled_run = train(
        smoke_profile.replace(**short, **{"train.compile": True}), tmp_path / "compiled", progress=False
    )
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # the step did run through the compiler
    compiled = load_metrics(compiled_run)
    # fused kernels reorder float sums: close, not bit-identical
    pd.testing.assert_frame_equal(eager[LOSS_COLS], compiled[LOSS_COLS], check_exact=False, rtol=1e-3)
    a, b = _state(tmp_path / "eager", 20), _state(compiled_run, 20)
    assert a.keys() == b.keys()


def test_autocast_names_an_unknown_precision():
    with pytest.raises(ValueError, match="precision 'fp16' is not one of"):
        precision.autocast(torch.device("cpu"), "fp16")


@pytest.mark.slow
def test_paper_profile_runs_a_step_on_cpu(tmp_path):
    p = paper.profile().replace(
        **{
            "train.steps": 2,
            "train.batch": 4,
            "train.eval_every": 1,
            "train.eval_batch": 4,
            "checkpoints.pre": 1,
            "checkpoints.transition": [2],
            "checkpoints.post": 2,
        }
    )
    m = load_metrics(train(p, tmp_path, progress=False))
    assert len(m) == 2 and m["L"].notna().all()


def test_train_step_clips_each_runs_gradient_norm(smoke_profile):
    """train.grad_clip: the gradient Adam sees has global norm grad_clip, run by run (two runs
    stepped together must not share one norm)."""
    p = smoke_profile.replace(**{"train.grad_clip": 0.01, "train.compile": False})
    runs = [TrainingRun.in_memory(p.replace(seed=s), torch.device("cpu")) for s in (1, 2)]
    seen = []
    for r in runs:
        step = r.opt.step

        def spy(step=step, r=r):
            seen.append(
                torch.cat([q.grad.flatten() for q in r.model.parameters() if q.grad is not None])
                .norm()
                .item()
            )
            step()

        r.opt.step = spy
    train_step(runs)
    assert seen == pytest.approx([0.01] * len(runs), rel=1e-4)
    assert [r.step for r in runs] == [1] * len(runs) and all(len(r.pending) == 1 for r in runs)


def test_find_drop_definition():
    steps = list(range(1, 301))
    l_mask = [0.222] * 150 + [0.02] * 150
    df = pd.DataFrame({"step": steps, "L_mask": l_mask})
    # trailing mean over 50 steps with k low steps: (0.222 (50 - k) + 0.02 k) / 50 < (2/9) / 2
    # first holds at k = 28, i.e. step 178
    assert find_drop(df, rank=2, window=50) == 150 + 28
    assert find_drop(df.head(150), rank=2) is None


@pytest.mark.slow
def test_optimiser_levers(tmp_path, smoke_profile):
    """beta2 reaches Adam (one param group, every trainable parameter at train.lr); the
    levers (and grad_clip: test_train_step_clips_each_runs_gradient_norm) resume
    bit-identically like everything else."""
    p = smoke_profile.replace(**{"train.beta2": 0.98, "train.grad_clip": 0.01, "train.warmup": 30})
    model = build_model(p.model, 7, seed=0)
    opt = make_optimizer(model, p.train, torch.device("cpu"))
    (group,) = opt.param_groups
    assert group["lr"] == p.train.lr and group["betas"] == (0.9, 0.98)
    assert [id(q) for q in group["params"]] == [id(q) for q in model.parameters() if q.requires_grad]

    _whole_and_resumed(p, tmp_path)


def _step_alike(p, steps: int, *pairs) -> None:
    """`steps` steps of each (model, optimiser) of `pairs` on the same batches (seed 0), MSE loss."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        b = sample_batch(8, 7, p.data.rank, p.data.p_mask, gen)
        for m, o in pairs:
            o.zero_grad()
            ((m(b.tokens).logits.view_as(b.x) - b.x) ** 2).mean().backward()
            o.step()


def test_the_cpu_adam_is_foreach_and_steps_as_the_for_loop_adam_to_the_bit(smoke_profile):
    """On the CPU `make_optimizer` builds torch's foreach Adam (fewer calls a step than the
    for-loop Adam; not the CPU's fused kernel, which rounds otherwise), fresh and resumed from
    a saved state; its steps give the for-loop Adam's weights and moments bit for bit."""
    p = smoke_profile.replace(**{"train.lr": 1e-3})
    cpu = torch.device("cpu")
    model = build_model(p.model, 7, seed=0)
    twin = copy.deepcopy(model)
    opt = make_optimizer(model, p.train, cpu)
    loop = torch.optim.Adam(
        [q for q in twin.parameters() if q.requires_grad],
        lr=p.train.lr,
        betas=(0.9, p.train.beta2),
        foreach=False,
        fused=False,
    )
    (group,) = opt.param_groups
    assert group["foreach"] is True and not group["fused"] and not group["capturable"]
    _step_alike(p, 4, (model, opt), (twin, loop))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))
    for q, r in zip(group["params"], loop.param_groups[0]["params"]):
        assert all(torch.equal(opt.state[q][k], loop.state[r][k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    resumed = make_optimizer(model, p.train, cpu, copy.deepcopy(loop.state_dict()))  # a for-loop Adam's state
    assert resumed.param_groups[0]["foreach"] is True and not resumed.param_groups[0]["fused"]


def test_train_adam_picks_adams_kernels_and_auto_keeps_each_devices_own(smoke_profile):
    """`train.adam`: "auto" is foreach on the CPU and fused where capture-ready (as on CUDA);
    "fused" and "foreach" are taken as named, fresh and resumed. The fused kernel rounds
    otherwise than the for-loop Adam: its weights part from foreach's within a few steps."""
    cpu = torch.device("cpu")
    p = smoke_profile.replace(**{"train.lr": 1e-3})
    flags = lambda o: (bool(o.param_groups[0]["foreach"]), bool(o.param_groups[0]["fused"]))
    model = build_model(p.model, 7, seed=0)
    assert p.train.adam == "auto" and flags(make_optimizer(model, p.train, cpu)) == (True, False)
    assert flags(make_optimizer(model, p.train, cpu, capture_ready=True)) == (False, True)
    fused_t = p.replace(**{"train.adam": "fused"}).train
    foreach_t = p.replace(**{"train.adam": "foreach"}).train
    assert flags(make_optimizer(model, fused_t, cpu)) == (False, True)
    twin = copy.deepcopy(model)
    fused, foreach = make_optimizer(model, fused_t, cpu), make_optimizer(twin, foreach_t, cpu)
    assert flags(foreach) == (True, False)
    _step_alike(p, 20, (model, fused), (twin, foreach))
    pairs = list(zip(model.state_dict().values(), twin.state_dict().values()))
    assert not all(torch.equal(a, b) for a, b in pairs)  # other rounding ...
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in pairs)  # ... the same Adam
    resumed = make_optimizer(model, fused_t, cpu, copy.deepcopy(foreach.state_dict()))
    assert flags(resumed) == (False, True)


def test_an_adam_state_saved_in_two_groups_resumes_in_one(smoke_profile):
    """Runs saved at c6ddcac or before kept the token and position embeddings in a second
    Adam group (train.embedding_lr, removed): `make_optimizer` loads such a state with
    every parameter's moments and step where they were, and steps as the old optimiser would."""
    p = smoke_profile.replace(**{"train.lr": 1e-3})
    model = build_model(p.model, 7, seed=0)
    named = [(n, q) for n, q in model.named_parameters() if q.requires_grad]
    emb = lambda n: n.endswith("embeddings.weight") and ".embeddings." in n
    old = torch.optim.Adam(
        [{"params": [q for n, q in named if not emb(n)]}, {"params": [q for n, q in named if emb(n)]}],
        lr=p.train.lr,
        betas=(0.9, p.train.beta2),
    )
    b = sample_batch(8, 7, p.data.rank, p.data.p_mask, torch.Generator().manual_seed(0))

    def step(opt):
        opt.zero_grad()
        ((model(b.tokens).logits.view_as(b.x) - b.x) ** 2).mean().backward()
        opt.step()

    for _ in range(3):
        step(old)
    assert len(old.state_dict()["param_groups"]) == 2 and any(emb(n) for n, _ in named)
    new = make_optimizer(model, p.train, torch.device("cpu"), copy.deepcopy(old.state_dict()))
    assert len(new.param_groups) == 1
    for _, q in named:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(new.state[q][key], old.state[q][key])
    before = copy.deepcopy(model.state_dict())
    step(old)
    after_old = copy.deepcopy(model.state_dict())
    model.load_state_dict(before)  # the same weights, stepped by the loaded optimiser
    step(new)
    assert not torch.equal(after_old["readout.weight"], before["readout.weight"])
    assert all(torch.equal(a, model.state_dict()[k]) for k, a in after_old.items())


def test_stop_after_drop_counts_from_the_drop():
    plateau = copy_level(1)
    rows = [{"step": s, "L_mask": plateau if s <= 100 else 0.0} for s in range(1, 301)]
    drop = find_drop(pd.DataFrame(rows), rank=1)
    assert 100 < drop <= 150
    stop = stop_after_drop(rank=1, after=100)
    assert not stop(rows[: drop + 99]) and stop(rows[: drop + 100])
    assert not stop(rows[:100])  # no drop yet: never stops


def test_a_run_stopped_early_is_not_continued(tmp_path, smoke_profile, smoke_run):
    assert is_complete(smoke_profile, smoke_run) and not is_complete(smoke_profile, tmp_path)
    stop = lambda rows: rows[-1]["step"] >= 20
    train(smoke_profile, tmp_path, progress=False, stop=stop)
    assert is_complete(smoke_profile, tmp_path, stop) and not is_complete(smoke_profile, tmp_path)
    before = load_metrics(tmp_path)
    train(smoke_profile, tmp_path, progress=False, stop=stop)  # the same stop: complete as it is
    assert saved_steps(tmp_path) == [20]
    pd.testing.assert_frame_equal(before, load_metrics(tmp_path))


def test_one_trainer_per_folder(tmp_path, smoke_profile):
    with only_trainer(tmp_path):  # as if another process were training this folder
        with pytest.raises(RuntimeError, match="being trained by another process"):
            train(smoke_profile, tmp_path, progress=False)
    train(
        smoke_profile.replace(**{"train.steps": 20, "checkpoints.transition": [20], "checkpoints.post": 20}),
        tmp_path,
        progress=False,
    )  # released: now it trains


def test_train_leaves_the_callers_thread_count(tmp_path, smoke_profile):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert smoke_profile.train.threads == 1
        train(
            smoke_profile.replace(
                **{"train.steps": 20, "checkpoints.transition": [20], "checkpoints.post": 20}
            ),
            tmp_path,
            progress=False,
        )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_parallel_runs(smoke_profile):
    assert (
        parallel_runs(smoke_profile.replace(**{"train.threads": 0})) == 1
    )  # torch's default: the whole machine
    cores = len(os.sched_getaffinity(0))
    assert parallel_runs(smoke_profile) == cores  # one thread each
    assert parallel_runs(smoke_profile.replace(**{"train.threads": 2 * cores})) == 1


@pytest.mark.slow
def test_seeds_side_by_side_equal_seeds_one_after_another(tmp_path, smoke_profile):
    """The seeds trained on the local Dask cluster (two worker processes) give the numbers of
    each run trained alone in this process, to the bit; the book's seed comes first and
    lives in run_dir, the others in sibling folders."""
    from mclib.core.train import seed_jobs, train_seed

    profile = smoke_profile.replace(**{"analysis.seeds": [3, 1], "seed": 1})
    apart = train_seeds(profile, tmp_path / "a" / "smoke-seed1")
    for job in seed_jobs(profile, tmp_path / "b" / "smoke-seed1"):
        train_seed(*job)
    together = seed_run_dirs(profile, tmp_path / "b" / "smoke-seed1")
    assert list(apart) == [1, 3] and apart[3] == tmp_path / "a" / "smoke-seed3"
    assert apart == seed_run_dirs(profile, tmp_path / "a" / "smoke-seed1")
    for s in (1, 3):
        pd.testing.assert_frame_equal(
            load_metrics(apart[s])[LOSS_COLS], load_metrics(together[s])[LOSS_COLS], check_exact=True
        )
    assert not load_metrics(apart[1])[LOSS_COLS].equals(load_metrics(apart[3])[LOSS_COLS])  # seeds differ


def test_window_mean():
    m = pd.DataFrame({"step": range(1, 101), "L": [float(s) for s in range(1, 101)]})
    assert window_mean(m, 100, window=10)["L"] == pytest.approx(95.5)
    assert pd.isna(window_mean(m, 500, window=10)["L"])


@pytest.mark.slow
def test_book_runs_train_once_side_by_side(tmp_path, smoke_profile, monkeypatch):
    """mclib.book.chapter.train_runs: the seeds and E15's runs, all complete after one call; a
    second call trains nothing (and starts no cluster)."""
    from mclib.analyses.freezing import pending_groups
    from mclib.analyses.interventions import GROUPS
    from mclib.book.chapter import train_runs
    from mclib.core.runs import freeze_dir

    cfg = smoke_profile.replace(**{"analysis.freeze_steps": 4})
    dirs = train_runs(cfg, tmp_path / "smoke-seed1", specs=SPECS)
    assert list(dirs) == [1, 2] and all(is_complete(cfg, d) for d in dirs.values())
    assert pending_groups(cfg, dirs[1]) == []
    files = sorted((tmp_path).rglob("metrics.csv"))
    assert len(files) == 2 + len(GROUPS) and freeze_dir(dirs[1], "mlp") / "metrics.csv" in files
    before = [f.read_bytes() for f in files]

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started with every run complete")

    monkeypatch.setattr("mclib.core.jobs.cluster", no_cluster)
    train_runs(cfg, tmp_path / "smoke-seed1", specs=SPECS)
    assert [f.read_bytes() for f in files] == before


@pytest.mark.slow
def test_a_failing_run_side_by_side_raises_here(tmp_path, smoke_profile):
    """A seed folder started with another profile: the worker's one-line error reaches the caller."""
    profile = smoke_profile.replace(**{"analysis.seeds": [1, 2]})
    other = smoke_profile.replace(
        **{
            "seed": 2,
            "model.hidden": 32,
            "train.steps": 20,
            "checkpoints.transition": [20],
            "checkpoints.post": 20,
        }
    )
    train(other, tmp_path / "smoke-seed2", progress=False)
    with pytest.raises(ConfigError, match="model.hidden differs"):
        train_seeds(profile, tmp_path / "smoke-seed1")


# --- kills and crashes at several moments ------------------------------------------------


class Killed(Exception):
    """Stands for the process dying: raised from inside `train`."""


def _kill_at(step: int):
    def stop(rows):  # called at every log flush, before that step's checkpoint is written
        if rows[-1]["step"] >= step:
            raise Killed(step)
        return False

    return stop


def _same_run(a: Path, b: Path, step: int = 30) -> None:
    pd.testing.assert_frame_equal(load_metrics(a)[LOSS_COLS], load_metrics(b)[LOSS_COLS], check_exact=True)
    x, y = _state(a, step), _state(b, step)
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize(
    "kill, saved",
    [
        pytest.param(5, [], marks=pytest.mark.slow),
        (10, []),
        pytest.param(15, [10], marks=pytest.mark.slow),
        (25, [10, 20]),
    ],
)
def test_resume_after_a_kill_at_several_steps(tmp_path, short, whole, kill, saved):
    # at step 10 the kill comes before that step's checkpoint: the run restarts from nothing
    with pytest.raises(Killed):
        train(short, tmp_path, progress=False, stop=_kill_at(kill))
    assert saved_steps(tmp_path) == saved
    train(short, tmp_path, progress=False)
    _same_run(whole, tmp_path)


def _fail_on(name: str, real):
    def fail(*args, **kwargs):
        if any(Path(a).name == name for a in args if isinstance(a, (str, Path))):
            raise Killed(name)
        return real(*args, **kwargs)

    return fail


@pytest.mark.parametrize("where", ["save_pretrained", "rename"])
def test_a_crash_inside_the_checkpoint_write_loses_nothing(tmp_path, short, whole, monkeypatch, where):
    """The step-20 checkpoint dies half-written (in save_pretrained) or complete in its
    temporary folder (at the rename): metrics.csv already holds rows 11-20, past the
    newest checkpoint (10); the resumed run drops them, redoes them, ends as if never stopped."""
    from mclib.core.model import MatrixBert

    if where == "save_pretrained":
        monkeypatch.setattr(
            MatrixBert, "save_pretrained", _fail_on(".tmp-step_000020", MatrixBert.save_pretrained)
        )
    else:
        monkeypatch.setattr(os, "replace", _fail_on("step_000020", os.replace))
    with pytest.raises(Killed):
        train(short, tmp_path, progress=False)
    monkeypatch.undo()
    assert saved_steps(tmp_path) == [10]
    assert load_metrics(tmp_path)["step"].max() == 20  # rows written after the last complete checkpoint
    train(short, tmp_path, progress=False)
    assert saved_steps(tmp_path) == [10, 20, 30]
    _same_run(whole, tmp_path)


def test_saving_a_step_again_keeps_the_old_checkpoint_until_the_new_one_is_complete(
    tmp_path, short, whole, monkeypatch
):
    # A step whose checkpoint exists written again (a folder left by an earlier trainer):
    # a crash while the new one is written must leave the old one whole, not a missing step.
    from mclib.core.model import MatrixBert

    run = shutil.copytree(whole, tmp_path / "run")
    before = _state(run, 30)
    model = load_checkpoint(run, 30).train()
    opt = make_optimizer(model, short.train, torch.device("cpu"))
    gens = {"data": torch.Generator().manual_seed(0), "eval": torch.Generator().manual_seed(1)}
    rows = load_metrics(run).to_dict("records")
    monkeypatch.setattr(
        MatrixBert, "save_pretrained", _fail_on(".tmp-step_000030", MatrixBert.save_pretrained)
    )
    with pytest.raises(Killed):
        save_checkpoint(run, 30, model, opt, gens, rows=rows, wall=0.0)
    monkeypatch.undo()
    assert saved_steps(run) == [10, 20, 30]
    after = _state(run, 30)
    assert all(torch.equal(before[k], after[k]) for k in before)
    save_checkpoint(run, 30, model, opt, gens, rows=rows, wall=0.0)  # and without a crash it is replaced
    assert saved_steps(run) == [10, 20, 30] and sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_000010",
        "step_000020",
        "step_000030",
    ]  # no temporary folder left behind


def test_a_crash_between_setting_the_old_checkpoint_aside_and_the_rename(tmp_path, short, whole, monkeypatch):
    # the one moment a step saved again has no folder: the run resumes from the step before
    run = shutil.copytree(whole, tmp_path / "run")
    model = load_checkpoint(run, 30).train()
    opt = make_optimizer(model, short.train, torch.device("cpu"))
    gens = {"data": torch.Generator().manual_seed(0), "eval": torch.Generator().manual_seed(1)}
    monkeypatch.setattr(os, "replace", _fail_on(".tmp-step_000030", os.replace))
    with pytest.raises(Killed):
        save_checkpoint(run, 30, model, opt, gens, rows=load_metrics(run).to_dict("records"), wall=0.0)
    monkeypatch.undo()
    assert saved_steps(run) == [10, 20]
    train(short, run, progress=False)
    _same_run(whole, run)


def test_an_e15_run_killed_and_resumed_keeps_its_frozen_parameters(
    tmp_path, smoke_run, smoke_profile, monkeypatch
):
    """E15: the resumed run re-freezes what the re-initialisation froze (from_pretrained
    makes every weight trainable again), and ends exactly as the uninterrupted run."""
    from mclib.analyses import freezing
    from mclib.analyses.interventions import component_groups

    cfg = smoke_profile.replace(**{"analysis.freeze_steps": 8, "train.save_every": 4, "train.log_every": 2})
    runs = {k: shutil.copytree(smoke_run, tmp_path / k) for k in ("whole", "killed")}
    freezing.freeze_run(cfg, runs["whole"], "mlp")
    monkeypatch.setattr(freezing, "train", lambda *a, **k: train(*a, **{**k, "stop": _kill_at(6)}))
    with pytest.raises(Killed):
        freezing.freeze_run(cfg, runs["killed"], "mlp")
    monkeypatch.undo()
    folder = freeze_dir(runs["killed"], "mlp")
    assert saved_steps(folder) == [4]
    freezing.freeze_run(cfg, runs["killed"], "mlp")
    _same_run(freeze_dir(runs["whole"], "mlp"), folder, step=8)
    post = dict(load_checkpoint(smoke_run, smoke_profile.checkpoints.post).named_parameters())
    trained = load_checkpoint(folder, 8)
    groups = component_groups(trained)
    for name, p in trained.named_parameters():
        assert torch.equal(p, post[name]) == (groups[name] != "mlp"), name


def test_the_step_function_sets_the_profiles_precision_as_training_does(smoke_profile, monkeypatch):
    """benchmarks/lease_step.py times `step_function`: on the lease of 2026-11-26 its "tf32" rows
    ran fp32, TF32 off (55 ms a step against the run's ~20), because only the training loop set TF32."""
    seen = []
    monkeypatch.setattr(
        variants, "set_precision", lambda device, precision: seen.append((device.type, precision))
    )
    variants.step_function(smoke_profile.replace(**{"train.precision": "fp32"}), torch.device("cpu"))
    assert seen == [("cpu", "fp32")]


# --- several runs in one train_group call (until 9842a40, 2026-11-26, they trained stacked) --


@pytest.mark.slow  # seconds: left to the slow tier, so the fast tier stays quick
def test_runs_trained_together_match_runs_trained_alone(tmp_path, smoke_profile):
    """Each run of a `train_group` call owns its model, Adam and generators: its numbers do
    not depend on the runs beside it or their order, to the bit on the CPU."""
    p = smoke_profile
    jobs = lambda root, seeds: [Job(p.replace(seed=s), root / f"seed{s}") for s in seeds]
    train_group(jobs(tmp_path / "together", [1, 2, 3]))
    train_group(jobs(tmp_path / "pair", [3, 1]))
    for s in (1, 2, 3):
        alone = load_metrics(train(p.replace(seed=s), tmp_path / f"alone{s}", progress=False))[LOSS_COLS]
        pd.testing.assert_frame_equal(
            alone, load_metrics(tmp_path / "together" / f"seed{s}")[LOSS_COLS], check_exact=True
        )
        if s != 2:
            pd.testing.assert_frame_equal(
                alone, load_metrics(tmp_path / "pair" / f"seed{s}")[LOSS_COLS], check_exact=True
            )
    assert not load_metrics(tmp_path / "together" / "seed1")[LOSS_COLS].equals(
        load_metrics(tmp_path / "together" / "seed2")[LOSS_COLS]
    )  # the seeds did train differently


def test_runs_at_different_steps_in_one_group_with_one_stopping_early(tmp_path, smoke_profile):
    """Runs resumed from different checkpoints train in one group (each its own step and
    warm-up), and a run whose `stop` fires ends while the others go on."""
    p = smoke_profile.replace(**{"train.warmup": 10})
    a, b = tmp_path / "a", tmp_path / "b"
    train(
        p.replace(**{"train.steps": 20, "checkpoints.post": 20, "checkpoints.transition": [20]}),
        a,
        progress=False,
    )
    stop_b = lambda rows: rows[-1]["step"] >= 30
    train_group([Job(p, a), Job(p.replace(seed=2), b, stop=stop_b)])
    assert load_metrics(a)["step"].iloc[-1] == 60 and load_metrics(b)["step"].iloc[-1] == 30
    whole = load_metrics(train(p, tmp_path / "whole", progress=False))
    pd.testing.assert_frame_equal(whole[LOSS_COLS], load_metrics(a)[LOSS_COLS], check_exact=True)


def test_frozen_groups_stay_frozen_in_a_group(tmp_path, smoke_profile):
    """E15's runs: each re-initialises one group and freezes the rest; trained together,
    every frozen parameter of every run is unchanged bit for bit."""
    from mclib.analyses.interventions import reinit_component
    from mclib.core.model import load_model

    p = smoke_profile.replace(**{"train.steps": 20, "checkpoints.post": 20, "checkpoints.transition": [20]})
    source = load_checkpoint(train(p, tmp_path / "main", progress=False), 20)
    jobs = [
        Job(p.replace(name=f"freeze-{g}"), tmp_path / g, init_model=reinit_component(source, g, seed=1))
        for g in ("attention", "positional")
    ]
    train_group(jobs)
    for job in jobs:
        trained = load_model(checkpoint_dir(job.run_dir, 20))
        start = dict(job.init_model.named_parameters())
        moved = {n for n, q in trained.named_parameters() if not torch.equal(q, start[n])}
        assert moved and all(start[n].requires_grad for n in moved), job.run_dir.name


def test_the_step_function_is_a_plain_adam_step_of_the_hf_model(smoke_profile):
    """`step_function` (what the benchmarks time) computes, step after step, what a few plain
    lines compute: the seed's model and matrices, the loss, backward, torch's Adam at the
    warm-up's lr."""
    from mclib.core.metrics import losses

    p = smoke_profile.replace(**{"train.compile": False, "train.warmup": 3})
    d, t = p.data, p.train
    step = step_function(p, torch.device("cpu"))
    model = build_model(p.model, d.n, p.seed).train()
    opt = torch.optim.Adam([q for q in model.parameters() if q.requires_grad], lr=t.lr, betas=(0.9, t.beta2))
    gen = torch.Generator().manual_seed(p.seed)
    for k in range(1, 6):
        b = sample_batch(t.batch, d.n, d.rank, d.p_mask, gen, dist=d.dist)
        opt.zero_grad()
        expected = losses(model(b.tokens).logits.view_as(b.x), b.x, b.mask)
        expected["L"].backward()
        opt.param_groups[0]["lr"] = t.lr * min(1.0, k / t.warmup)
        opt.step()
        got = step()[0]
        assert torch.equal(got, torch.stack(list(expected.values())).detach()), k


def test_a_compile_that_fails_falls_back_to_the_eager_step_with_a_notice(
    tmp_path, smoke_profile, monkeypatch, logged
):
    def broken_compile(fn, *args, **kwargs):
        def run(*a, **k):
            raise RuntimeError("no C++ compiler found\nsecond line")

        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    p = smoke_profile.replace(
        **{"train.compile": True, "train.steps": 20, "checkpoints.post": 20, "checkpoints.transition": [20]}
    )
    eager = load_metrics(train(p.replace(**{"train.compile": False}), tmp_path / "eager", progress=False))
    fell_back = load_metrics(train(p, tmp_path / "compiled", progress=False))
    err = logged.err().strip().splitlines()
    assert len(err) == 1 and "torch.compile failed" in err[0] and "no C++ compiler" in err[0]
    assert eager[LOSS_COLS].equals(fell_back[LOSS_COLS])
    ran = json.loads((tmp_path / "compiled" / STEP_RAN).read_text())  # what ran, from the first step
    assert ran == {
        "planned": p.train.step,
        "variant": "compile",
        "ran": "eager",
        "fell_back": "RuntimeError: no C++ compiler found",
        "from_step": 1,
    }
    assert json.loads((tmp_path / "eager" / STEP_RAN).read_text())["fell_back"] is None


STACKED_RUN = Path(__file__).parent / "data" / "stacked-run-d54ea56"


def test_a_run_saved_by_the_stacked_path_resumes(tmp_path, smoke_profile):
    """tests/data/stacked-run-d54ea56: 20 steps trained at revision d54ea56 on the stacked path
    (`train.fast: true`, mclib/core/stacked.py, removed in 9842a40), a tiny model. Its
    profile.yaml still says train.fast; its Adam state was saved in torch Adam's layout. It
    resumes to step 40 and continues like a run trained here from the start, to fp32
    tolerance (the stacked forward summed in another order), with Adam's step counters at 40."""
    p = smoke_profile.replace(
        **{
            "model.hidden": 4,
            "model.heads": 1,
            "model.layers": 1,
            "model.intermediate": 8,
            "train.warmup": 30,
            "train.steps": 40,
            "checkpoints.post": 40,
        }
    )
    run = shutil.copytree(STACKED_RUN, tmp_path / "old")
    assert "fast: true" in (run / "profile.yaml").read_text() and saved_steps(run) == [20]
    before = load_metrics(run)
    resumed = load_metrics(train(p, run, progress=False))
    whole = load_metrics(train(p, tmp_path / "whole", progress=False))
    assert before[LOSS_COLS].equals(resumed[LOSS_COLS].head(20))  # the old rows are kept as they were
    pd.testing.assert_frame_equal(whole[LOSS_COLS], resumed[LOSS_COLS], check_exact=False, rtol=1e-4)
    state = torch.load(checkpoint_dir(run, 40) / "train_state.pt", weights_only=True)
    assert {s["step"].item() for s in state["optimizer"]["state"].values()} == {40.0}


def test_a_group_of_runs_with_different_process_settings_is_refused_before_anything_is_written(
    tmp_path, smoke_profile
):
    """One process sets the device, the TF32 switch and the thread count once for all its runs;
    runs that differ in those cannot share a `train_group` call. Architectures may differ."""
    wide = smoke_profile.replace(**{"model.hidden": 32, "seed": 2})
    assert train_module.process_key(wide) == train_module.process_key(smoke_profile)
    other = smoke_profile.replace(**{"train.precision": "bf16"})
    with pytest.raises(ValueError, match="equal process_key"):
        train_group([Job(smoke_profile, tmp_path / "a"), Job(other, tmp_path / "b")])
    assert not any(tmp_path.iterdir())
