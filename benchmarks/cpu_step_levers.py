"""The default profile's CPU step with and without each lever, side by side in one process.

    python benchmarks/cpu_step_levers.py [--profile cpu] [--rounds 9] [--steps 20]
        [--levers loop,base,fused,eager]

Every lever is one fresh in-memory run of the profile (`mclib.core.variants.step_function`'s
runs: the same seed, the profile's `train.compile`, one thread), changed in one place:

    base      the step as the training loop runs it now (`make_optimizer`'s Adam: on the CPU
              foreach since 2026-11-27)
    loop      Adam's for-loop implementation (foreach=False, fused=False): the CPU step of
              revisions up to 0cc20c3
    foreach   Adam's foreach implementation (foreach=True)
    fused     Adam's fused CPU kernel (fused=True)
    eager     the matmul form of attention (model.attention: eager), compiled like sdpa
    A+B       two levers at once (e.g. eager+foreach)

After a warm-up (the compile), the levers take turns: each round times `--steps` steps of
every lever, in an order rotated from round to round, so that a shared machine's noise hits
them alike. Printed: each lever's median ms a step over the rounds, and the median over
rounds of its time / the first lever's time within the round (the ratio to quote). Nothing written.
The arithmetic is checked separately: 1 000 steps trained each way, every logged loss
compared (docs/performance.md, "The CPU step's levers").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mclib.core.config import load_profile, profile_path  # noqa: E402
from mclib.core.step import TrainingRun, steps_of  # noqa: E402

ADAM = {
    "loop": {"foreach": False, "fused": False},
    "foreach": {"foreach": True, "fused": None},
    "fused": {"foreach": None, "fused": True},
}


def lever_step(profile, lever: str):
    """A function running one training step of a fresh run of `profile` with `lever`."""
    device = torch.device("cpu")
    parts = lever.split("+")
    p = profile.replace(**{"model.attention": "eager"}) if "eager" in parts else profile
    run = TrainingRun.in_memory(p, device)
    adam = [a for a in parts if a in ADAM]
    if adam:  # the same parameters and lr, another implementation of Adam
        run.opt = torch.optim.Adam(
            [q for q in run.model.parameters() if q.requires_grad],
            lr=p.train.lr,
            betas=(0.9, p.train.beta2),
            **ADAM[adam[0]],
        )
        for group in run.opt.param_groups:
            group["base_lr"] = p.train.lr
    return steps_of([run])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--levers", default="loop,base,fused,eager")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args(argv)
    profile = load_profile(profile_path(args.profile))
    torch.set_num_threads(profile.train.threads or 1)
    levers = args.levers.split(",")
    fns = {name: lever_step(profile, name) for name in levers}
    for fn in fns.values():
        for _ in range(args.warmup):
            fn()
    times = {name: [] for name in levers}
    for r in range(args.rounds):
        order = levers[r % len(levers) :] + levers[: r % len(levers)]
        for name in order:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                fns[name]()
            times[name].append((time.perf_counter() - t0) / args.steps * 1000)
    base = levers[0]
    print(
        f"{args.profile}, {torch.get_num_threads()} thread(s), {args.rounds} rounds of {args.steps} steps, "
        f"torch {torch.__version__}; ratio: the median over rounds of lever / {base} within a round"
    )
    print("| lever | ms a step, median (min-max) | ratio to " + base + " (min-max) |")
    print("|---|---:|---:|")
    for name in levers:
        ratios = [a / b for a, b in zip(times[name], times[base])]
        print(
            f"| {name} | {statistics.median(times[name]):.1f} "
            f"({min(times[name]):.1f}-{max(times[name]):.1f}) | "
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |"
        )


if __name__ == "__main__":
    main()
