"""Figures. Each function takes data (a DataFrame, an array) and returns a matplotlib Figure."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files and notebooks; no display needed
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
