"""Does TF32 change the science? The table and the verdict of docs/performance.md, from the
runs of sweeps/tf32.yaml (the default profile in fp32 and in emulated TF32, three seeds each).

    python scripts/sweep_cpu_profile.py sweeps/tf32.yaml --jobs 1 --results docs/data/tf32.csv
    python scripts/tf32_study.py [--runs runs/sweep] [--out docs/data/tf32_study.csv]
                                 [--fig docs/figures/tf32_vs_fp32.png]

Prints each run's row (`mclib.analyses.evaluate.compare_runs`: drop, plateau, L_mask 500 /
1 000 / 2 000 / 4 000 steps after the drop, final; the last checkpoint on 4 096 fresh matrices
evaluated in fp32 and in TF32), then the two arms side by side (`mclib.analyses.precision`:
seed means with their errors, fp32's seed range, the ratio) and the verdict. A run that is
not there yet is named and left out.
"""

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from mclib.analyses.evaluate import compare_runs  # noqa: E402
from mclib.analyses.precision import arm_spread, verdict  # noqa: E402
from mclib.book.plots_curves import seed_loss_curves  # noqa: E402
from mclib.core.ending import is_complete  # noqa: E402
from mclib.core.metrics import find_drop  # noqa: E402
from mclib.core.runs import METRICS, load_metrics, run_profile  # noqa: E402

ARMS = {"fp32": "tf32study-fp32", "tf32": "tf32study-tf32"}
SEEDS = (1, 2, 3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs/sweep", help="where sweeps/tf32.yaml trained its runs")
    ap.add_argument("--out", help="write the arms' table here (CSV)")
    ap.add_argument("--fig", help="save the six L_mask curves here")
    args = ap.parse_args(argv)
    folders, arm = {}, {}
    for label, setting in ARMS.items():
        for seed in SEEDS:
            folder = Path(args.runs) / f"{setting}-seed{seed}"
            if not (folder / METRICS).is_file() or not is_complete(run_profile(folder), folder):
                print(f"tf32_study: {folder} is not trained to its last step yet: left out")
                continue
            folders[f"{label} s{seed}"], arm[f"{label} s{seed}"] = folder, label
    if not folders:
        print("tf32_study: no finished run")
        return 1
    table = compare_runs(folders, (500, 1000, 2000, 4000), 4096, 0, ("fp32", "tf32"))
    print(
        table.T.map(
            lambda v: f"{v:,.0f}" if v == v and v >= 100 and float(v).is_integer() else f"{v:.4g}"
        ).to_markdown()
    )
    measures = (
        "drop",
        "plateau_L_mask",
        "L_mask_drop+500",
        "L_mask_drop+1000",
        "L_mask_drop+2000",
        "L_mask_drop+4000",
        "final_L_mask",
        "checkpoint_L_mask_fp32",
        "checkpoint_L_mask_tf32",
    )
    spread = arm_spread(table, pd.Series(arm), "fp32", "tf32", measures)
    print()
    print(
        spread[
            [
                "fp32_mean",
                "fp32_se",
                "fp32_min",
                "fp32_max",
                "tf32_mean",
                "tf32_se",
                "ratio",
                "ratio_se",
                "inside",
            ]
        ].to_markdown(floatfmt=".4g")
    )
    said = {
        "inside": "TF32 is inside fp32's seed spread on every measure",
        "outside": "TF32 is outside fp32's seed spread on "
        + ", ".join(spread.index[spread["inside"] == False]),  # noqa: E712
        "untested": "not judged: fewer than two fp32 runs give no spread",
    }[verdict(spread)]
    print(
        f"\nverdict: {said} ({sum(a == 'fp32' for a in arm.values())} fp32 and "
        f"{sum(a == 'tf32' for a in arm.values())} TF32 runs)"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pd.concat([table.assign(arm=pd.Series(arm)), spread], keys=["runs", "arms"]).to_csv(args.out)
    if args.fig:
        curves = {label: load_metrics(folder) for label, folder in folders.items()}
        rank = run_profile(next(iter(folders.values()))).data.rank
        fig = seed_loss_curves(
            curves,
            {k: find_drop(m, rank) for k, m in curves.items()},
            rank,
            title=f"L_mask: fp32 and emulated TF32 ({', '.join(folders)})",
            label="{}",
        )
        Path(args.fig).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.fig, dpi=120)
        print(f"figure: {args.fig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
