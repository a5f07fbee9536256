"""How to spend the cores on small models: one run with every thread, or runs side by side?

    python benchmarks/cores.py [--profile cpu] [--seconds 20] [--out docs/data/cores.csv]

The book trains several runs of the same profile (seeds; the four re-initialisation
runs of E15). For a model as small as the cpu profile's, a matmul is too small to keep
two threads busy, so two runs with one thread each may finish a pair of runs sooner
than one two-thread run after another. This measures it, for the profile's model at
its batch, with `mclib.core.step.train_step` (the function the training loop calls), for each
attention implementation:

  - one process, each thread count from 1 to the number of cores, for each attention
    implementation ("sdpa", PyTorch's fused kernel; "eager", BERT's matmul-softmax-matmul);
  - `cores` processes at once, one thread each, eager and sdpa.

Each configuration trains for --seconds after 20 warm-up steps; ms/step is the mean over
that time. "runs/hour" is how many runs of the profile's length that configuration
completes per hour with all its processes: the number to compare. Run it on idle cores.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from train_step import cpu_model  # noqa: E402  (benchmarks/train_step.py, next to this file)

from mclib.core.config import load_profile, profile_path  # noqa: E402
from mclib.core.variants import step_function  # noqa: E402


def ms_per_step(profile_name: str, attention: str, threads: int, seconds: float, seed: int = 0) -> float:
    """Mean ms per training step of the profile's model, in this process."""
    torch.set_num_threads(threads)
    profile = load_profile(
        profile_path(profile_name),
        **{"model.attention": attention, "train.compile": False, "train.precision": "fp32"},
    )
    step = step_function(profile.replace(seed=seed), torch.device("cpu"))

    for _ in range(20):
        step()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    return 1000 * (time.perf_counter() - t0) / n


def _child(args) -> float:
    return ms_per_step(*args)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", default="docs/data/cores.csv")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    steps = load_profile(profile_path(args.profile)).train.steps
    rows = []
    for attention in ("sdpa", "eager"):
        for threads in range(1, cores + 1):
            ms = ms_per_step(args.profile, attention, threads, args.seconds)
            rows.append({"attention": attention, "processes": 1, "threads_each": threads, "ms_per_step": ms})
        with mp.get_context("spawn").Pool(cores) as pool:
            each = pool.map(_child, [(args.profile, attention, 1, args.seconds, s) for s in range(cores)])
        rows.append(
            {
                "attention": attention,
                "processes": cores,
                "threads_each": 1,
                "ms_per_step": sum(each) / len(each),
            }
        )
    df = pd.DataFrame(rows)
    df["runs_per_hour"] = df.processes * 3.6e6 / (df.ms_per_step * steps)
    df.insert(0, "profile", args.profile)
    print(df.to_markdown(index=False, floatfmt=".3g"))
    df["date"] = datetime.date.today().isoformat()
    df["machine"] = f"{cpu_model()}, {cores} cores"
    df["torch"] = torch.__version__
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, mode="a", header=not out.exists(), index=False)


if __name__ == "__main__":
    main()
