"""Losses and progress against step: the book's run (chapter 01), E15's re-initialised runs
(05), the drop over seeds and the progress measures (07), GPT beside BERT (08).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..core.data import copy_level
from ..core.metrics import DROP_WINDOW, drop_column, find_drop
from ..core.runs import load_metrics, run_profile
from . import plots_base  # noqa: F401 - importing it sets the book's plot theme


def loss_curve(
    metrics: pd.DataFrame,
    drop: int | None = None,
    rank: int = 2,
    title: str = "Training loss",
    smooth: int = 20,
) -> plt.Figure:
    """L, L_obs and L_mask against step (log scale), smoothed over `smooth` steps;
    the copying plateau E[X²] and the drop (if any) are marked."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for col, label in [
        ("L", "L (all entries)"),
        ("L_obs", "L_obs (observed)"),
        ("L_mask", "L_mask (masked)"),
    ]:
        ax.plot(metrics["step"], metrics[col].rolling(smooth, min_periods=1).mean(), label=label)
    ax.axhline(copy_level(rank), color="grey", ls=":", label=f"E[X²] = {copy_level(rank):.3f} (copying)")
    if drop is not None:
        ax.axvline(drop, color="black", ls="--", lw=1, label=f"drop at step {drop}")
    ax.set(yscale="log", xlabel="training step", ylabel=f"MSE (mean over {smooth} steps)", title=title)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def mark_checkpoints(fig: plt.Figure, pre: int, transition: list[int], post: int) -> plt.Figure:
    """Mark the analysis checkpoints (pre-shift, transition, post-shift) on a loss curve."""
    ax = fig.axes[0]
    for steps, color, label in [
        ([pre], "tab:green", "pre-shift"),
        (transition, "tab:orange", "transition"),
        ([post], "tab:purple", "post-shift"),
    ]:
        for i, s in enumerate(steps):
            ax.axvline(s, color=color, lw=4, alpha=0.25, label=f"{label} checkpoint" if i == 0 else None)
    ax.legend(fontsize=8, loc="lower left")
    return fig


# --- component re-initialisation (E15) -----------------------------------------------------


def freeze_curves(
    curves: dict,
    drops: dict,
    rank: int = 2,
    smooth: int = 20,
    title: str = "Re-initialise one component, freeze the rest",
) -> plt.Figure:
    """E15: L_mask against step per re-initialised group (curves: group -> metrics), smoothed over
    `smooth` steps; each run's drop (drops: group -> step or None) dashed, E[X²] dotted."""
    fig, ax = plt.subplots(figsize=(7, 4))
    colours = dict(zip(curves, sns.color_palette("tab10", len(curves))))
    for group, m in curves.items():
        drop = drops.get(group)
        label = f"{group} ({'drop at step ' + str(drop) if drop is not None else 'no drop'})"
        ax.plot(
            m["step"], m["L_mask"].rolling(smooth, min_periods=1).mean(), color=colours[group], label=label
        )
        if drop is not None:
            ax.axvline(drop, color=colours[group], ls="--", lw=1)
    level = copy_level(rank)
    ax.axhline(level, color="grey", ls=":", label=f"E[X²] = {level:.3f} (copying)")
    ax.set(
        yscale="log",
        xlabel="training step of the re-initialised run",
        ylabel=f"L_mask (mean over {smooth} steps)",
        title=title,
    )
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


# --- beyond the paper (07): the drop over seeds, progress measures -------------------------


def seed_loss_curves(
    curves: dict,
    drops: dict,
    rank: int = 2,
    smooth: int = DROP_WINDOW,
    title: str = "L_mask over seeds",
    *,
    label: str = "seed {}",
) -> plt.Figure:
    """L_mask against step (log, mean over `smooth` steps), one line per run (`curves`: key ->
    metrics, named by `label`), each drop dashed in its colour, E[X²] dotted."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (key, m) in enumerate(curves.items()):
        drop = drops.get(key)
        ax.plot(
            m["step"],
            m["L_mask"].rolling(smooth, min_periods=1).mean(),
            color=f"C{i}",
            label=label.format(key) + ": " + (f"drop at step {drop:,}" if drop is not None else "no drop"),
        )
        if drop is not None:
            ax.axvline(drop, color=f"C{i}", ls="--", lw=1)
    ax.axhline(copy_level(rank), color="grey", ls=":", label=f"E[X²] = {copy_level(rank):.3f} (copying)")
    ax.set(yscale="log", xlabel="training step", ylabel=f"L_mask (mean over {smooth} steps)", title=title)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def gpt_loss_curves(
    curves: dict,
    bert,
    rank: int,
    gpt_batch: int,
    bert_batch: int,
    *,
    drops: dict,
    bert_drop: int | None = None,
    smooth: int = DROP_WINDOW,
) -> plt.Figure:
    """E19: each GPT run's L (seed 1's L_obs and L_mask too) beside the BERT run's L and
    L_mask, against training steps (left) and matrices seen (right; the two models' batches
    may differ); log scale, mean over `smooth` steps, each drop a dashed line, E[X²] dotted."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, per in zip(axes, ("step", "matrix")):
        scale_g, scale_b = (1, 1) if per == "step" else (gpt_batch, bert_batch)
        for i, (seed, m) in enumerate(curves.items()):
            x = m["step"] * scale_g
            ax.plot(
                x,
                m["L"].rolling(smooth, min_periods=1).mean(),
                color=f"C{i}",
                lw=1.2,
                label=f"GPT seed {seed}: L"
                + (f", drop at step {drops[seed]:,}" if drops.get(seed) else ", no drop"),
            )
            if i == 0:
                for col, ls in (("L_obs", "-."), ("L_mask", ":")):
                    ax.plot(
                        x,
                        m[col].rolling(smooth, min_periods=1).mean(),
                        color="C0",
                        ls=ls,
                        lw=1,
                        label=f"GPT seed {seed}: {col}",
                    )
            if drops.get(seed):
                ax.axvline(drops[seed] * scale_g, color=f"C{i}", ls="--", lw=0.8)
        xb = bert["step"] * scale_b
        for col, colour in (("L", "dimgrey"), ("L_mask", "black")):
            ax.plot(
                xb,
                bert[col].rolling(smooth, min_periods=1).mean(),
                color=colour,
                lw=1.2,
                label=f"BERT: {col}",
            )
        if bert_drop is not None:
            ax.axvline(bert_drop * scale_b, color="black", ls="--", lw=0.8)
        ax.axhline(copy_level(rank), color="grey", ls=":", lw=1)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="training step" if per == "step" else "matrices seen",
            title=f"against {'steps' if per == 'step' else 'matrices seen'}",
        )
    axes[0].set_ylabel(f"MSE (mean over {smooth} steps)")
    axes[1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def progress_panels(
    norm: pd.DataFrame,
    leads: pd.DataFrame | None = None,
    drop: int | None = None,
    ncols: int = 4,
    title: str = "Progress measures during training",
) -> plt.Figure:
    """One panel per measure of `norm` (progress.normalised: 0 first, 1 extreme) against step, the
    threshold 0.5 dotted, its crossing (`leads`: progress.lead_times) a dot, the drop dashed."""

    names = list(dict.fromkeys(norm["measure"]))
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(3.0 * ncols, 2.4 * nrows + 0.6), sharex=True, sharey=True, squeeze=False
    )
    cross = {} if leads is None else dict(zip(leads["measure"], leads["cross_step"]))
    for ax, name in zip(axes.flat, names):
        d = norm[norm["measure"] == name]
        ax.plot(d["step"], d["progress"], marker="." if len(d) < 60 else None, color="tab:blue")
        ax.axhline(0.5, color="grey", ls=":", lw=1)
        if drop is not None:
            ax.axvline(drop, color="black", ls="--", lw=1)
        c = cross.get(name, np.nan)
        if np.isfinite(c):
            ax.plot([c], d.loc[d["step"] == c, "progress"].to_numpy()[:1], "o", color="tab:red", ms=6)
        v = d["value"].dropna().to_numpy()
        span = f"{v[0]:.3g} → {v[np.argmax(np.abs(v - v[0]))]:.3g}" if len(v) else "no value"
        ax.set_title(f"{name}\n({span})", fontsize=9)
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("training step")
    for ax in axes[:, 0]:
        ax.set_ylabel("progress\n(0 first, 1 extreme)")
    handles = [
        plt.Line2D([], [], color="grey", ls=":", label="threshold (half-way)"),
        plt.Line2D([], [], color="tab:red", marker="o", ls="", label="first crossing"),
    ]
    if drop is not None:
        handles.append(plt.Line2D([], [], color="black", ls="--", label=f"drop at step {drop:,}"))
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=len(handles), frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def run_loss_curve(metrics: pd.DataFrame, profile) -> tuple[plt.Figure, int | None]:
    """A run's loss curve with its drop marked, titled by profile and seed, and the drop step
    (None without one): what `python -m mclib train` saves and an export logs."""
    drop = find_drop(metrics, rank=profile.data.rank, column=drop_column(profile))
    return loss_curve(metrics, drop, profile.data.rank, title=f"{profile.name}, seed {profile.seed}"), drop


def loss_curve_image(run_dir: str | Path) -> np.ndarray:
    """The run's loss curve as `python -m mclib train` draws it, `[height, width, 3]` uint8 RGB."""
    run_dir = Path(run_dir)
    fig, _ = run_loss_curve(load_metrics(run_dir), run_profile(run_dir))
    fig.set_dpi(100)
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return image
