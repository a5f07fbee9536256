"""Figures. Each function takes data (a DataFrame, an array) and returns a matplotlib Figure."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from .data import copy_baseline_mse


def loss_curve(metrics: pd.DataFrame, drop: int | None = None, rank: int = 2,
               title: str = "Training loss", smooth: int = 20) -> plt.Figure:
    """L, L_obs and L_mask against step (log scale), smoothed over `smooth` steps;
    the copying plateau E[X²] and the drop (if any) are marked."""
    sns.set_theme(style="whitegrid", context="notebook")
    fig, ax = plt.subplots(figsize=(7, 4))
    for col, label in [("L", "L (all entries)"), ("L_obs", "L_obs (observed)"), ("L_mask", "L_mask (masked)")]:
        ax.plot(metrics["step"], metrics[col].rolling(smooth, min_periods=1).mean(), label=label)
    ax.axhline(copy_baseline_mse(rank), color="grey", ls=":", label=f"E[X²] = {copy_baseline_mse(rank):.3f} (copying)")
    if drop is not None:
        ax.axvline(drop, color="black", ls="--", lw=1, label=f"drop at step {drop}")
    ax.set(yscale="log", xlabel="training step", ylabel=f"MSE (mean over {smooth} steps)", title=title)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def mark_checkpoints(fig: plt.Figure, pre: int, transition: list[int], post: int) -> plt.Figure:
    """Mark the analysis checkpoints (pre-shift, transition, post-shift) on a loss curve."""
    ax = fig.axes[0]
    for steps, color, label in [([pre], "tab:green", "pre-shift"), (transition, "tab:orange", "transition"),
                                ([post], "tab:purple", "post-shift")]:
        for i, s in enumerate(steps):
            ax.axvline(s, color=color, lw=4, alpha=0.25, label=f"{label} checkpoint" if i == 0 else None)
    ax.legend(fontsize=8, loc="lower left")
    return fig


VERDICT_COLORS = {"matches": "tab:green", "same direction": "tab:orange", "differs": "tab:red", "n/a": "grey"}


def scorecard_plot(rows: list[dict]) -> plt.Figure:
    """Our value / the paper's, one line per scorecard row, coloured by verdict (log scale,
    centred on 1). Rows without two positive numbers get a hollow marker at 1, labelled."""
    import numpy as np

    sns.set_theme(style="whitegrid", context="notebook")
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.8))
    ratios = []
    for i, r in enumerate(rows):
        ok = bool(r["paper"] and r["ours"] and r["paper"] > 0 and r["ours"] > 0)
        ratio = r["ours"] / r["paper"] if ok else 1.0
        ratios.append(ratio)
        color = VERDICT_COLORS.get(r["verdict"], "grey")
        ax.plot([ratio], [i], "o", ms=8, color=color, mfc=color if ok else "none")
        if not ok:
            ax.annotate("no number", (ratio, i), xytext=(8, 0), textcoords="offset points", va="center", fontsize=8)
    span = max([abs(np.log10(x)) for x in ratios] + [0.5]) + 0.5  # symmetric: above and below read alike
    ax.axvline(1, color="grey", ls=":")
    ax.set_yticks(range(len(rows)), [f"{r['id']}: {r['quantity']}" for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set(xscale="log", xlim=(10 ** -span, 10 ** span), xlabel="our value / the paper's (log scale; 1 = equal)",
           title="Our numbers against the paper's")
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=v) for v, c in VERDICT_COLORS.items()]
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=len(handles), frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
