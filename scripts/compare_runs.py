"""Runs of one task side by side: drop, plateau, L_mask after the drop and at the end.

    python scripts/compare_runs.py fp32=runs/sweep/cpu-fp32-seed2 bf16=runs/sweep/cpu-bf16-seed2 \
        [--after 500,1000] [--matrices 4096] [--eval-precisions fp32,bf16]
        [--fig docs/figures/bf16_vs_fp32.png]

Prints a markdown table with a row per run (`mclib.analyses.evaluate.compare_runs`) and, for every
run after the first, its ratio to the first; --fig also saves their L_mask curves.
docs/performance.md ("Does bf16 change the science?") is this command's output.
"""

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mclib.analyses.evaluate import compare_runs  # noqa: E402
from mclib.book.plots_curves import seed_loss_curves  # noqa: E402
from mclib.core.config import PRECISIONS  # noqa: E402
from mclib.core.metrics import find_drop  # noqa: E402
from mclib.core.runs import METRICS, load_metrics, run_profile  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="LABEL=RUN_DIR; the first is the reference")
    ap.add_argument("--after", default="500,1000", help="steps after the drop at which L_mask is read")
    ap.add_argument(
        "--matrices", type=int, default=4096, help="fresh matrices for the last checkpoints' L_mask"
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of those matrices")
    ap.add_argument(
        "--eval-precisions",
        default="fp32",
        help="evaluate the last checkpoints in each of these (fp32, bf16: autocast)",
    )
    ap.add_argument("--fig", help="save the L_mask curves here")
    args = ap.parse_args(argv)
    runs = {}
    for arg in args.runs:
        label, sep, folder = arg.partition("=")
        if not sep or not (Path(folder) / METRICS).is_file():
            ap.error(f"{arg!r} is not LABEL=RUN_DIR with a {METRICS} in RUN_DIR")
        runs[label] = Path(folder)

    precisions = args.eval_precisions.split(",")
    if set(precisions) - set(PRECISIONS):
        ap.error(f"--eval-precisions {args.eval_precisions!r}: each must be one of {PRECISIONS}")
    table = compare_runs(runs, [int(k) for k in args.after.split(",")], args.matrices, args.seed, precisions)
    ratios = (table / table.iloc[0]).iloc[1:].drop(columns=["steps", "checkpoint_step"])
    ratios.index = [f"{label} / {table.index[0]}" for label in ratios.index]
    # step counts as integers, losses to 4 significant digits
    shown = table.T.map(
        lambda v: f"{v:,.0f}" if v == v and v >= 100 and float(v).is_integer() else f"{v:.4g}"
    )
    print(shown.to_markdown())
    print()
    print(ratios.T.to_markdown(floatfmt=".3f"))

    if args.fig:
        curves = {label: load_metrics(folder) for label, folder in runs.items()}
        rank = run_profile(runs[table.index[0]]).data.rank
        fig = seed_loss_curves(
            curves,
            {k: find_drop(m, rank) for k, m in curves.items()},
            rank,
            title="L_mask: " + " vs ".join(runs),
            label="{}",
        )
        Path(args.fig).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.fig, dpi=120)
        print(f"\nfigure: {args.fig}")


if __name__ == "__main__":
    main()
