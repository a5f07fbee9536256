"""Render the sweep results table (docs/data/cpu_sweep.csv) as markdown and a figure.

    python scripts/sweep_report.py [--results docs/data/cpu_sweep.csv] [--fig docs/figures/cpu_sweep.png]

Prints the markdown table that docs/cpu-profile.md embeds (between its SWEEP TABLE
markers, which this script rewrites), so the doc never holds a hand-typed number.
"""

import argparse
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

COLLAPSED_L_OBS = 0.05  # a run whose final L_obs is this high has lost even copying


def outcome(df: pd.DataFrame) -> pd.Series:
    """drop / plateau (still copying, no drop) / collapsed (lost copying: L_obs back near E[X²])."""
    return pd.Series(
        [
            "drop" if pd.notna(d) else "collapsed" if o > COLLAPSED_L_OBS else "plateau"
            for d, o in zip(df.drop_step, df.final_L_obs)
        ],
        index=df.index,
    )


def task(df: pd.DataFrame) -> pd.Series:
    """The task a row trained on, e.g. "7x7 r2" (the paper's; p_mask 0.3 unless stated)."""
    return pd.Series(
        [
            f"{n:.0f}x{n:.0f} r{r:.0f}" + ("" if p == 0.3 else f" p{p:g}")
            for n, r, p in zip(df.n, df["rank"], df.p_mask)
        ],
        index=df.index,
    )


def table(df: pd.DataFrame) -> str:
    cols = [
        "sweep",
        "task",
        "setting",
        "seed",
        "outcome",
        "drop_step",
        "drop_minutes",
        "steps_run",
        "matrices",
        "ms_per_step",
        "threads",
        "plateau_L_mask",
        "final_L_obs",
        "final_L_mask",
    ]
    out = df.assign(outcome=outcome(df), task=task(df))[cols].copy()
    out["drop_step"] = [
        (f"none by {int(s)}") if pd.isna(d) else int(d) for d, s in zip(df.drop_step, df.steps_run)
    ]
    out["drop_minutes"] = out["drop_minutes"].map(lambda v: "" if pd.isna(v) else f"{v:.1f}")
    return out.to_markdown(index=False, floatfmt=".4g")


def figure(df: pd.DataFrame, path: Path) -> None:
    """Matrices trained on (steps x batch) against the peak lr, one marker per run: the
    drop, or how far a run got without one. The paper's run dropped after ~15 000 x 256
    = 3.8M matrices at lr 1e-4 (hidden 768)."""
    kind, tasks = outcome(df), task(df)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    markers = {"drop": "o", "plateau": "^", "collapsed": "x"}
    words = {"drop": "drop (at that many matrices)", "plateau": "no drop by then", "collapsed": "collapsed"}
    colours = {t: f"C{i}" for i, t in enumerate(sorted(tasks.unique(), key=lambda t: t != "7x7 r2"))}
    for t, colour in colours.items():
        for k, marker in markers.items():
            sel = (kind == k) & (tasks == t)
            if sel.any():
                y = df.drop_step[sel] * df.batch[sel] if k == "drop" else df.matrices[sel]
                label = f"{t}{' (paper)' if t == '7x7 r2' else ''}: {words[k]}"
                ax.scatter(
                    df.lr[sel], y, marker=marker, color=colour, label=label, s=60 if k == "drop" else 30
                )
    ax.axhline(15_000 * 256, color="grey", ls=":", lw=1)
    ax.text(
        df.lr.min(),
        15_000 * 256 * 1.12,
        "the paper's drop (7x7 r2): 3.8M matrices (hidden 768, lr 1e-4)",
        fontsize=7,
        color="grey",
    )
    mup = 1e-4 * 768 / 64  # Adam's lr for hidden matrices scales as 1/width (muP)
    ax.axvline(mup, color="grey", ls="--", lw=1)
    ax.text(mup * 1.05, 7e4, "the paper's lr,\nmuP-scaled to hidden 64", fontsize=7, color="grey")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="peak learning rate (Adam; Muon runs at their Adam lr)",
        ylabel="matrices trained on",
        title="The CPU-profile search: how far each run got",
        ylim=(3e4, 8e6),
    )
    ax.legend(fontsize=7, loc="lower right")
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
        new = re.sub(
            r"(<!-- SWEEP TABLE -->).*?(<!-- /SWEEP TABLE -->)",
            lambda m: f"{m[1]}\n{md}\n{m[2]}",
            text,
            flags=re.S,
        )
        doc.write_text(new)
    print(md)


if __name__ == "__main__":
    main()
