"""Devices and precision: what a run records, what it refuses, what resumes
where, and that a training step never waits for the device. What needs a GPU to check
(TF32 switched on and off, one worker per GPU actually training, a CUDA->CPU resume) is
run by scripts/gpu_kit.sh on a lent GPU; here the CPU-side halves are tested."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import yaml

from mclib.core import paper
from mclib.core.checkpoints import load_train_state
from mclib.core.config import ConfigError
from mclib.core.data import sample_batch
from mclib.core.jobs import gpu_workers, local_workers
from mclib.core.precision import check_precision, set_precision, with_device
from mclib.core.recipe import deviations
from mclib.core.runs import checkpoint_dir, load_metrics, run_profile
from mclib.core.step import TrainingRun, train_step
from mclib.core.train import train

COLS = ["step", "L", "L_obs", "L_mask", "mask_value", "eval_L", "eval_L_mask"]


def test_auto_device_is_resolved_once_and_recorded(tmp_path, smoke_profile):
    auto = smoke_profile.replace(**{"train.device": "auto"})
    assert with_device(auto).train.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert with_device(smoke_profile).train.device == "cpu"  # an explicit device stays
    train(auto, tmp_path, progress=False, stop=lambda rows: rows[-1]["step"] >= 20)
    recorded = run_profile(tmp_path).train.device
    assert recorded == with_device(auto).train.device and recorded != "auto"


def test_a_precision_that_does_not_exist_is_refused_in_one_line_and_tf32_off_a_gpu_is_emulated(logged):
    with pytest.raises(ConfigError, match="train.precision = 'fp16' is not one of") as e:
        set_precision(torch.device("cpu"), "fp16")
    assert "\n" not in str(e.value)
    check_precision(torch.device("cpu"), "fp32")  # fine, and silent
    assert logged.err() == ""
    check_precision(torch.device("cpu"), "tf32")  # mclib.core.tf32, said in one line
    err = logged.err()
    assert "TF32 products emulated" in err and err.count("\n") == 1


def test_bf16_on_a_cpu_without_bf16_units_is_said(monkeypatch, logged):
    monkeypatch.setattr("mclib.core.precision.cpu_has_bf16", lambda: False)
    check_precision(torch.device("cpu"), "bf16")
    assert "torch emulates it" in logged.err()
    monkeypatch.setattr("mclib.core.precision.cpu_has_bf16", lambda: True)
    check_precision(torch.device("cpu"), "bf16")
    assert logged.err() == ""


def test_cuda_asked_for_where_there_is_none_names_the_key(tmp_path, smoke_profile):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match=r"^train.device = 'cuda' but no CUDA device is available$"):
        train(smoke_profile.replace(**{"train.device": "cuda"}), tmp_path, progress=False)


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_a_precision_other_than_the_papers_is_a_departure(precision):
    p = paper.profile()
    assert not [d for d in deviations(p, paper.profile()) if d["key"] == "train.precision"]
    changed = deviations(p.replace(**{"train.precision": precision}), paper.profile())
    assert {"key": "train.precision", "profile": precision, "paper": "fp32"} in changed


def test_the_laptop_profiles_pin_the_cpu():
    from mclib.core.config import load_profile, profile_path

    for name in ("cpu", "cpu-7x7", "smoke", "smoke-drop"):
        assert load_profile(profile_path(name)).train.device == "cpu", name
    assert paper.profile().train.device == "auto"


def test_generators_are_cpu_generators_so_the_state_is_device_free(tmp_path, smoke_profile):
    train(smoke_profile, tmp_path, progress=False, stop=lambda rows: rows[-1]["step"] >= 20)
    state = load_train_state(tmp_path, 20)
    for g in state["gens"].values():
        cpu = torch.Generator()
        cpu.set_state(g)  # a CUDA generator's state would not load here (another size)
    assert state["device"] == "cpu"


def test_a_run_started_on_another_device_type_resumes_here_identically(tmp_path, smoke_profile):
    """A run that trained its first 20 steps on a GPU (its profile.yaml and train_state say
    cuda) resumes on the CPU: its generators are CPU generators on every device, and the
    model and Adam's state are loaded onto the device that resumes. Here the first part ran
    on the CPU too and was relabelled, so the resumed run must equal an uninterrupted one
    to the bit; on a real GPU the first part's floats differ, not the data stream."""
    whole = train(smoke_profile, tmp_path / "whole", progress=False)
    part = tmp_path / "part"
    train(smoke_profile, part, progress=False, stop=lambda rows: rows[-1]["step"] >= 20)
    raw = yaml.safe_load((part / "profile.yaml").read_text())
    raw["train"]["device"] = "cuda"
    (part / "profile.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    state_file = checkpoint_dir(part, 20) / "train_state.pt"
    state = torch.load(state_file, weights_only=True)
    torch.save({**state, "device": "cuda:0"}, state_file)
    train(smoke_profile, part, progress=False)
    pd.testing.assert_frame_equal(load_metrics(whole)[COLS], load_metrics(part)[COLS], check_exact=True)
    assert run_profile(part).train.device == "cpu"  # it records where it went on


def test_a_training_step_reads_nothing_back_to_the_host(monkeypatch, smoke_profile):
    """`train_step` of two runs, each with the capture-ready Adam make_optimizer builds on CUDA
    (fused, capturable, the lr a tensor) and its gradient clipped, with their data copied in: no
    tensor is read to the host inside a step (on CUDA each read would wait for the device).
    Sampling runs on the host by design (CPU generators), so it happens before the reads are forbidden."""
    p = smoke_profile.replace(**{"train.compile": False, "train.grad_clip": 0.5, "train.warmup": 5})
    runs = [TrainingRun.in_memory(p.replace(seed=s), torch.device("cpu"), capture_ready=True) for s in (1, 2)]
    train_step(runs)  # Adam's state is created here
    # Adam's step counters: reading them is allowed (torch's fused Adam keeps them as tensors
    # beside the parameters and reads none of them on the host)
    counters = {id(st["step"]) for r in runs for st in r.opt.state.values()}
    assert counters
    for r in runs:
        d = p.data
        b = sample_batch(p.train.batch, d.n, d.rank, d.p_mask, r.gens["data"])
        r.batch = lambda b=b: b.to(torch.device("cpu"), non_blocking=True)

    def forbid(name, real):
        def read(self, *a, **k):
            if id(self) not in counters:
                pytest.fail(f"host read: Tensor.{name} of a {tuple(self.shape)} tensor")
            return real(self, *a, **k)

        return read

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, forbid(name, getattr(torch.Tensor, name)))
    out = train_step(runs)
    monkeypatch.undo()
    assert out.shape == (len(runs), 4) and torch.isfinite(out).all()


def test_one_worker_per_gpu_each_seeing_only_its_own():
    specs = gpu_workers(3, {"OMP_NUM_THREADS": "1"})
    envs = [s["options"]["env"] for s in specs.values()]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "2"]
    assert all(e["OMP_NUM_THREADS"] == "1" for e in envs)
    assert all(
        s["options"]["resources"] == {"GPU": 1} and s["options"]["nthreads"] == 1 for s in specs.values()
    )
    assert len(gpu_workers(0, {})) == 1  # a GPU run on a machine whose GPUs are not counted: one worker


def test_local_gpu_cluster_size_follows_the_gpu_count(monkeypatch):
    monkeypatch.setattr("mclib.core.jobs.gpu_count", lambda: 4)
    assert local_workers(1, gpu=True) == 4
    monkeypatch.setattr("mclib.core.jobs.gpu_count", lambda: 0)
    assert local_workers(1, gpu=True) == 1
