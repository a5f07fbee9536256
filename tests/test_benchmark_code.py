"""The benchmarks' own code on the CPU, in-process and fast: every precision a path of
benchmarks/train_step.py times has a matmul ceiling (the TF32 paths once crashed on a
lookup before timing anything, on the GPU only, where no test ran them)."""

import importlib.util
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def load(script):
    spec = importlib.util.spec_from_file_location(script.replace(".", "_"), ROOT / "benchmarks" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_precision_of_every_path_has_a_ceiling():
    bench = load("train_step.py")
    precisions = sorted({p for _, p, _ in bench.PATHS.values()})
    assert "tf32" in precisions
    peaks = bench.matmul_ceilings(32, 1, torch.device("cpu"), precisions)
    for key, (label, precision, _) in bench.PATHS.items():
        assert peaks[precision] > 0, f"path ({key}) {label}: no ceiling for {precision}"


def test_an_unmeasured_precision_is_nan_and_the_tf32_switch_is_restored():
    bench = load("train_step.py")
    before = torch.backends.cuda.matmul.allow_tf32
    peaks = bench.matmul_ceilings(16, 1, torch.device("cpu"), ("tf32",))
    assert peaks["tf32"] > 0 and math.isnan(peaks["fp32"]) and math.isnan(peaks["bf16"])
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_every_script_and_benchmark_compiles():
    """A benchmark is run by hand on a lease, where a syntax error costs the lease's first
    minute (benchmarks/lease_step.py once shipped one that only the slow rehearsal caught)."""
    import py_compile

    files = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))
    assert len(files) > 5
    for f in files:
        py_compile.compile(str(f), cfile=str(ROOT / ".pytest_cache" / "compiled.pyc"), doraise=True)


@pytest.mark.slow  # seconds: left to the slow tier, so the fast tier stays quick
def test_the_chapter_estimate_counts_every_encoder_pass_in_another_process(tmp_path):
    """benchmarks/slice_chapters.py's sitecustomize: one line per BertModel pass, with its tokens,
    whether the pass comes from MatrixBert.forward or from hidden_states; nothing without the variable."""
    import json
    import os
    import subprocess
    import sys

    bench = load("slice_chapters.py")
    (tmp_path / "sitecustomize.py").write_text(bench.HOOK)
    code = (
        "import torch\nfrom mclib.core.config import ModelConfig\nfrom mclib.core.model import build_model\n"
        "m = build_model(ModelConfig(layers=1, heads=2, hidden=8, intermediate=16), 3, seed=0)\n"
        "t = torch.ones(5, 9, dtype=torch.long)\nm(t); m.hidden_states(t[:2])\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    log = tmp_path / "passes.jsonl"
    subprocess.run(
        [sys.executable, "-c", code], env={**env, "MCLIB_FORWARD_LOG": str(log)}, check=True, cwd=ROOT
    )
    records = [json.loads(line) for line in log.read_text().splitlines()]
    passes = [r for r in records if "tokens" in r]
    assert [p["tokens"] for p in passes] == [45, 18] and {p["seq"] for p in passes} == {9}
    assert len({p["model"] for p in passes}) == 1 and all(p["seconds"] > 0 and p["cpu_s"] > 0 for p in passes)
    exits = [r["process_cpu_s"] for r in records if "process_cpu_s" in r]  # the process's CPU time, at exit
    assert len(exits) == 1 and exits[0] > sum(p["cpu_s"] for p in passes)
    log.unlink()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=ROOT)
    assert not log.exists()
