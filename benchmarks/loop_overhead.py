"""What the training loop's writes cost beside its steps, at the paper's shapes, on this machine.

    python benchmarks/loop_overhead.py [--steps 200] [--batch 1] [--save-every 20]
        [--out docs/data/loop_overhead.csv]

Trains the paper's model and task (mclib.core.paper.shapes_profile, at a small batch so
that a CPU takes seconds) twice in fresh folders: once with Adam's state in every
checkpoint (state_every 0, the loop before b7485eb, 2026-11-26) and once with the paper profile's
ratio of state_every to save_every (5). For each it measures the whole `train` call and the
steps' own time (the `wall` column: steps and evaluation, no flush and no writes), and from
their difference the cost of one checkpoint. The paper's schedule on a GPU is then
projected: per 1 000 steps of `step_ms` (default 18.7, the H100's at TF32, 2026-11-24), one
weights checkpoint and a fifth of a train state; the printed ratio is (steps + writes) /
steps. A projection from this machine's disk, stated as one: the GPU machine's disk
and PCIe copies differ.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from mclib.core.paper import profile as paper_profile  # noqa: E402
from mclib.core.paper import shapes_profile  # noqa: E402
from mclib.core.runs import load_metrics  # noqa: E402
from mclib.core.train import train  # noqa: E402


def one(steps: int, batch: int, save_every: int, state_ratio: int) -> dict:
    p = shapes_profile(steps=steps, batch=batch).replace(
        **{
            "train.save_every": save_every,
            "train.state_every": save_every * state_ratio,
            "train.log_every": 10,
            "train.eval_every": 100,
            "checkpoints.pre": save_every,
            "checkpoints.transition": [2 * save_every],
            "checkpoints.post": steps,
            "checkpoints.keep": "analysis",
            "analysis.seeds": [1],
        }
    )
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        t0 = time.perf_counter()
        train(p, Path(tmp) / "run", progress=False)
        total = time.perf_counter() - t0
        wall = float(load_metrics(Path(tmp) / "run")["wall"].dropna().iloc[-1])
    saves = steps // save_every
    states = sum(
        1
        for s in range(save_every, steps + 1, save_every)
        if state_ratio == 0 or s % (save_every * state_ratio) == 0 or s == steps
    )
    return {
        "state_every": save_every * state_ratio,
        "steps": steps,
        "batch": batch,
        "total_s": total,
        "wall_s": wall,
        "outside_s": total - wall,
        "saves": saves,
        "states": states,
        "ratio_here": total / wall,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--step-ms", type=float, default=18.7, help="the GPU's ms a step the projection uses")
    ap.add_argument("--out", help="CSV the rows are appended to")
    args = ap.parse_args(argv)
    paper = paper_profile().train
    ratio = paper.state_every // paper.save_every
    rows = [
        one(args.steps, args.batch, args.save_every, 0),
        one(args.steps, args.batch, args.save_every, ratio),
    ]
    old, new = rows
    # per checkpoint: weights alone (the lean runs' weights-only saves) and weights + state (the old ones)
    per_full = old["outside_s"] / old["saves"]
    per_weights = max(
        0.0, (new["outside_s"] - new["states"] * per_full) / max(1, new["saves"] - new["states"])
    )
    per_1000 = {
        "every checkpoint with its state (before)": (1000 / paper.save_every) * per_full,
        f"state every {paper.state_every} (now)": (1000 / paper.save_every)
        * (per_weights + per_full / ratio),
    }
    gpu_s = args.step_ms  # 1 000 steps of step_ms ms = step_ms seconds
    for r in rows:
        r.update(
            {
                "date": datetime.datetime.now().isoformat(timespec="seconds"),
                "cpu": platform.processor() or platform.machine(),
                "per_full_checkpoint_s": per_full,
                "per_weights_checkpoint_s": per_weights,
                "step_ms_projected": args.step_ms,
            }
        )
    table = pd.DataFrame(rows)
    print(
        table[
            [
                "state_every",
                "steps",
                "batch",
                "total_s",
                "wall_s",
                "outside_s",
                "saves",
                "states",
                "ratio_here",
            ]
        ].to_markdown(index=False, floatfmt=".3g")
    )
    print(
        f"one checkpoint with its state: {per_full:.2f} s; weights alone: {per_weights:.2f} s "
        "(this machine's disk)"
    )
    for label, s in per_1000.items():
        print(
            f"projected at the paper's schedule, {args.step_ms} ms a step: {label}: "
            f"{s:.2f} s of writes per 1 000 "
            f"steps of {gpu_s:.1f} s -> whole / steps = {(gpu_s + s) / gpu_s:.3f}"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, mode="a", header=not Path(args.out).exists(), index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
