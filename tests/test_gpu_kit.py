"""scripts/gpu_kit.sh end to end, on the CPU with the smoke profile (the GPU half is the
same script: only the profile and the precision differ): it builds the book, says
"complete", and collects the results folder the scorecard's paper-setting column reads;
without a GPU it refuses the paper profile in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _kit(tmp_path, **env):
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_kit.sh"), "0"], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "kit"),
                               "BOOK_DIR": str(tmp_path / "book"), **env})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_the_paper_book_needs_a_gpu(tmp_path):
    p = _kit(tmp_path)
    assert p.returncode == 4 and "gpu_kit: no CUDA device visible to torch; the paper book needs a GPU" in p.stderr


@pytest.mark.slow
def test_the_kit_builds_and_collects(tmp_path):
    p = _kit(tmp_path, PROFILE="smoke", PRECISION="fp32")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "gpu_kit: complete" in p.stdout
    (dest,) = (tmp_path / "kit" / "results").iterdir()
    assert dest.name.startswith("smoke-cpu-")
    run = dest / "runs" / "smoke-seed1"
    assert {"metrics.csv.gz", "end.json", "profile.yaml", "scorecard.json"} <= {f.name for f in run.iterdir()}
    assert json.loads((dest / "device.json").read_text())["device"] == "cpu"
    assert (dest / "book" / "manifest.json").is_file() and not list(dest.rglob("*.safetensors"))
