"""Render the sweep results table (docs/data/cpu_sweep.csv) as markdown and a figure.

    python scripts/sweep_report.py [--results docs/data/cpu_sweep.csv] [--fig docs/figures/cpu_sweep.png]

Prints the markdown table that docs/cpu-profile.md embeds (between its SWEEP TABLE
markers, which this script rewrites), so the doc never holds a hand-typed number.
"""
import argparse
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd


def table(df: pd.DataFrame) -> str:
    cols = ["sweep", "setting", "seed", "drop_step", "drop_minutes", "steps_run", "ms_per_step", "threads",
            "plateau_L_mask", "final_L_obs", "final_L_mask"]
    out = df[cols].copy()
    out["drop_step"] = [("none by %d" % s) if pd.isna(d) else int(d) for d, s in zip(df.drop_step, df.steps_run)]
    out["drop_minutes"] = out["drop_minutes"].map(lambda v: "" if pd.isna(v) else f"{v:.1f}")
    return out.to_markdown(index=False, floatfmt=".4g")


def figure(df: pd.DataFrame, path: Path) -> None:
    lr = df.overrides.map(lambda s: json.loads(s).get("train.lr", 1e-3))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    dropped = df.drop_step.notna()
    ax.scatter(lr[dropped], df.drop_step[dropped], label="drop", color="C0")
    ax.scatter(lr[~dropped], df.steps_run[~dropped], marker="^", color="C3", label="no drop by this step")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="step", title="Drop step against learning rate (4 L, 8 H)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default="docs/data/cpu_sweep.csv")
    ap.add_argument("--fig", default="docs/figures/cpu_sweep.png")
    ap.add_argument("--doc", default="docs/cpu-profile.md")
    args = ap.parse_args()
    df = pd.read_csv(args.results)
    md = table(df)
    figure(df, Path(args.fig))
    doc = Path(args.doc)
    if doc.exists():
        text = doc.read_text()
        new = re.sub(r"(<!-- SWEEP TABLE -->).*?(<!-- /SWEEP TABLE -->)", lambda m: f"{m[1]}\n{md}\n{m[2]}", text, flags=re.S)
        doc.write_text(new)
    print(md)


if __name__ == "__main__":
    main()
