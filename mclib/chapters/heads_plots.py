"""Figures of the copying and heads chapters (02, 03): predictions against the truth, the masked
value, loss bars, attention maps, head labels, progress lines and probes."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.patches import Rectangle

from ..book.plots_base import _without_grid

LABEL_COLORS = {
    "row": "tab:blue",
    "column": "tab:orange",
    "identity": "tab:green",
    "mask-aware": "tab:purple",
    "other": "lightgrey",
}


def prediction_scatter(
    x, pred, mask, title: str = "Output against the true value", max_points: int = 3000, *, seed: int = 0
) -> plt.Figure:
    """X̂ against X at observed (left) and masked (right) entries; x, pred, mask `[batch, n, n]`.
    A copying model sits on the diagonal on the left and on the line X̂ = 0 on the right."""
    x, pred, mask = (np.asarray(a).reshape(-1) for a in (x, pred, mask))
    rng = np.random.default_rng(seed)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.8), sharex=True, sharey=True)
    for ax, where, name in [(axes[0], ~mask, "observed entries (Ω)"), (axes[1], mask, "masked entries (Ωᶜ)")]:
        idx = np.flatnonzero(where)
        idx = rng.choice(idx, min(max_points, len(idx)), replace=False) if len(idx) else idx
        ax.scatter(
            x[idx], pred[idx], s=4, alpha=0.35, color="tab:blue" if name.startswith("obs") else "tab:red"
        )
        lim = max(1.0, float(np.abs(x).max()) if len(x) else 1.0)
        ax.plot([-lim, lim], [-lim, lim], color="black", lw=1, ls="--", label="X̂ = X (completes or copies)")
        ax.axhline(0, color="grey", lw=1, ls=":", label="X̂ = 0 (ignores the mask)")
        ax.set(title=name, xlabel="true value X", ylabel="model output X̂" if ax is axes[0] else None)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def mask_value_curve(
    metrics: pd.DataFrame,
    reference: float,
    drop: int | None = None,
    mark: dict[str, int] | None = None,
    smooth: int = 20,
    *,
    title: str = "The mask value during training",
) -> plt.Figure:
    """Mean |X̂| at masked entries against step (smoothed); `reference` is the mean |X|
    there (what a model that completes outputs on average), `mark` names steps to mark."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(
        metrics["step"],
        metrics["mask_value"].rolling(smooth, min_periods=1).mean(),
        label="mask value (mean |X̂|, masked)",
    )
    ax.axhline(reference, color="grey", ls=":", label=f"mean |X| at masked entries = {reference:.2f}")
    if drop is not None:
        ax.axvline(drop, color="black", ls="--", lw=1, label=f"drop at step {drop}")
    for i, (name, step) in enumerate((mark or {}).items()):
        ax.axvline(step, color=f"C{i + 2}", lw=4, alpha=0.3, label=f"{name} (step {step})")
    ax.set(
        xlabel="training step", ylabel=f"mask value (mean over {smooth} steps)", title=title, ylim=(0, None)
    )
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def loss_bars(
    labels: list[str],
    values: dict[str, list[float]],
    paper: dict[str, list[float | None]] | None = None,
    title: str = "",
    xlabel: str | None = None,
    *,
    errors: dict[str, list[float]] | None = None,
    level: float | list[float] | None = None,
    paper_level: float | list[float] | None = None,
    reference: tuple[float, str] | None = None,
) -> plt.Figure:
    """Horizontal bars, one group per label (top to bottom), one bar per quantity (`values`:
    quantity -> a value per label), log scale, ± 2 `errors` where given; the paper's values
    (`paper`: quantity -> a value or None per label) as black diamonds. With `level` (our E[X²],
    one or one per label) ours are divided by it and the paper's by `paper_level` (default
    `level`), so 1, dotted, is copying on either task; without it, `reference` = (value, name)
    draws a dotted line."""
    n = len(labels)
    per_label = lambda x: np.broadcast_to(np.asarray(np.nan if x is None else x, dtype=float), (n,))
    ours_lvl = per_label(level) if level is not None else np.ones(n)
    paper_lvl = (
        per_label(paper_level if paper_level is not None else level) if level is not None else np.ones(n)
    )

    k = len(values)
    height = 0.8 / k
    fig, ax = plt.subplots(figsize=(8, 0.3 * n * k + 1.8))
    y = np.arange(n)
    drew_paper = False
    for i, (name, vals) in enumerate(values.items()):
        pos = y + (i - (k - 1) / 2) * height
        vals = np.asarray(vals, dtype=float) / ours_lvl
        shown = np.where(vals > 0, vals, np.nan)
        err = (errors or {}).get(name)
        xerr = None
        if err is not None:
            err = 2 * np.asarray(err, dtype=float) / ours_lvl
            xerr = np.vstack(
                [np.minimum(err, shown * (1 - 1e-3)), err]
            )  # a log axis has no 0: stop short of it
        ax.barh(
            pos,
            shown,
            height=height * 0.9,
            color=f"C{i}",
            xerr=xerr,
            error_kw={"ecolor": "black", "elinewidth": 1, "capsize": 2},
            label=f"{name} (ours{', ± 2 s.e.' if err is not None else ', no error computed'})",
        )
        for p, v, lv in zip(pos, (paper or {}).get(name, [None] * n), paper_lvl):
            if v is not None and v > 0:
                ax.plot([v / lv], [p], "D", color="black", ms=5, label=None if drew_paper else "the paper")
                drew_paper = True
    if level is not None:
        ax.axvline(1, color="grey", ls=":", label="1 = E[X²], copying (each on its own task)")
    elif reference is not None:
        ax.axvline(reference[0], color="grey", ls=":", label=reference[1])
    ax.set_yticks(y, labels)
    ax.set_ylim(n - 0.5, -0.5)
    if xlabel is None:
        xlabel = "MSE / E[X²] (log scale)" if level is not None else "MSE (log scale)"
    ax.set(xscale="log", xlabel=xlabel, title=title)
    handles, names = ax.get_legend_handles_labels()
    first = sorted(
        range(len(names)), key=lambda j: "(ours" not in names[j]
    )  # our bars, then the paper, the line
    ax.legend(
        [handles[j] for j in first],
        [names[j] for j in first],
        fontsize=8,
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0 + 0.6 / fig.get_figheight()),
        ncol=2,
        frameon=False,
    )
    fig.tight_layout()
    return fig


@_without_grid
def attention_grid(
    maps,
    row_labels: list[str] | None = None,
    col_labels: list[str] | None = None,
    title: str = "",
    n: int = 7,
    *,
    query_bands: list[tuple[int, int]] | None = None,
    key_marks: list[int] | None = None,
    titles: list[list[str]] | None = None,
    panel: float = 1.7,
    query_marks: list[int] | None = None,
) -> plt.Figure:
    """A grid of attention maps `maps [rows, cols, query, key]` on one colour scale, from 0 to the
    largest probability but at least 3/n² (a uniform head shows dark), matrix rows (n positions)
    separated by thin lines. query_bands: [(first, last)] query positions outlined; key_marks and
    query_marks: positions marked with a triangle above or on the left; titles: one per panel
    ([rows][cols]), else col_labels over the top row."""
    maps = np.asarray(maps, dtype=float)
    if maps.ndim != 4:
        raise ValueError(f"maps has shape {maps.shape}, expected [rows, cols, query, key]")
    rows, cols, q, _ = maps.shape
    fig, axes = plt.subplots(rows, cols, figsize=(panel * cols + 1.4, panel * rows + 0.8), squeeze=False)
    vmax = max(float(maps.max()), 3 / q)  # one scale for every panel: maps compare by colour
    for r in range(rows):
        for c in range(cols):
            ax = axes[r, c]
            image = ax.imshow(maps[r, c], cmap="viridis", vmin=0, vmax=vmax, interpolation="nearest")
            for b in range(n, q, n):
                ax.axhline(b - 0.5, color="white", lw=0.3, alpha=0.6)
                ax.axvline(b - 0.5, color="white", lw=0.3, alpha=0.6)
            for first, last in query_bands or []:
                ax.add_patch(
                    Rectangle((-0.5, first - 0.5), q, last - first + 1, fill=False, ec="red", lw=1.2)
                )
            for k in key_marks or []:
                ax.plot([k], [-1.5], "v", color="red", ms=3.5, clip_on=False)
            for k in query_marks or []:
                ax.plot([-1.5], [k], ">", color="red", ms=2.5, clip_on=False)
            ax.set(xlim=(-0.5, q - 0.5), ylim=(q - 0.5, -0.5))
            ax.set_xticks([])
            ax.set_yticks([])
            pad = 9 if key_marks else 4  # room for the key marks
            if titles:
                ax.set_title(titles[r][c], fontsize=8, pad=pad)
            elif r == 0 and col_labels:
                ax.set_title(col_labels[c], fontsize=9, pad=pad)
            if c == 0 and row_labels:
                ax.set_ylabel(row_labels[r], fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, pad=0.02, label="attention probability")
    return fig


@_without_grid
def head_label_heatmap(labels: pd.Series, title: str = "Head labels") -> plt.Figure:
    """Layer × head grid coloured by label (`labels` indexed by 0-indexed (layer, head));
    shown 1-indexed, as in the paper."""
    names = list(LABEL_COLORS)
    layers = sorted({l for l, _ in labels.index})
    heads = sorted({h for _, h in labels.index})
    grid = np.full((len(layers), len(heads)), np.nan)
    for (l, h), lab in labels.items():
        grid[layers.index(l), heads.index(h)] = names.index(lab)
    fig, ax = plt.subplots(figsize=(0.75 * len(heads) + 2.6, 0.6 * len(layers) + 1.4))
    ax.imshow(grid, cmap=ListedColormap([LABEL_COLORS[k] for k in names]), vmin=-0.5, vmax=len(names) - 0.5)
    for (l, h), lab in labels.items():
        ax.text(heads.index(h), layers.index(l), lab[:3], ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(heads)), [h + 1 for h in heads])
    ax.set_yticks(range(len(layers)), [l + 1 for l in layers])
    ax.set(xlabel="head", ylabel="layer", title=title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=LABEL_COLORS[k]) for k in names]
    ax.legend(handles, names, fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    fig.tight_layout()
    return fig


def progress_lines(
    progress: pd.DataFrame,
    drop: int | None = None,
    mark: dict[str, int] | None = None,
    title: str = "Attention structure during training",
) -> plt.Figure:
    """Row, column and self excess of every head against step (thin grey lines) and the
    largest over heads (bold); `progress` as from heads.attention_progress."""
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6), sharey=True)
    for ax, (col, name) in zip(
        axes, [("row_excess", "row"), ("column_excess", "column"), ("self_excess", "self")]
    ):
        for _, g in progress.groupby(["layer", "head"]):
            ax.plot(g["step"], g[col], color="grey", lw=0.6, alpha=0.5)
        top = progress.groupby("step")[col].max()
        ax.plot(
            top.index,
            top.values,
            color="tab:blue",
            lw=2,
            marker="." if len(top) < 30 else None,
            label="largest over heads",
        )
        ax.axhline(0, color="black", lw=0.8, ls=":")
        if drop is not None:
            ax.axvline(drop, color="black", ls="--", lw=1, label=f"drop at step {drop}")
        for i, (label, step) in enumerate((mark or {}).items()):
            ax.axvline(step, color=f"C{i + 2}", lw=3, alpha=0.3, label=label)
        ax.set(title=f"{name} excess", xlabel="training step")
    axes[0].set_ylabel("excess over a uniform head\n(0 uniform, 1 pure)")
    handles, names = axes[0].get_legend_handles_labels()
    handles.insert(0, plt.Line2D([], [], color="grey", lw=0.6))
    names.insert(0, "one head")
    fig.legend(handles, names, fontsize=8, loc="lower center", ncol=len(names), frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def probe_lines(probes: pd.DataFrame, title: str = "Linear probes per layer") -> plt.Figure:
    """Test MSE (relative to predicting 0) and mean |cosine| against layer, one panel per
    target, one line per kind of position; `probes` as from probes.probe_layers."""
    targets = list(dict.fromkeys(probes["target"]))
    fig, axes = plt.subplots(2, len(targets), figsize=(3.6 * len(targets), 6), sharex=True, squeeze=False)
    styles = {"all": "-", "masked": "--", "observed": ":"}
    for c, target in enumerate(targets):
        d = probes[probes["target"] == target]
        for where, g in d.groupby("positions", sort=False):
            g = g.sort_values("layer")
            axes[0, c].plot(
                g["layer"], g["mse"] / g["mse_zero"], styles.get(where, "-"), marker="o", ms=4, label=where
            )
            axes[1, c].plot(g["layer"], g["abs_cos"], styles.get(where, "-"), marker="o", ms=4, label=where)
        axes[0, c].set(
            title=f"target: {target}",
            ylabel="test MSE / MSE of predicting 0" if c == 0 else None,
            ylim=(0, None),
        )
        axes[1, c].set(
            xlabel="layer (0 = embeddings)", ylabel="mean |cosine|" if c == 0 else None, ylim=(0, 1.05)
        )
        if d["abs_cos"].isna().all():
            axes[1, c].text(
                0.5,
                0.5,
                "scalar target:\nno cosine",
                ha="center",
                va="center",
                transform=axes[1, c].transAxes,
                color="grey",
            )
        axes[1, c].set_xticks(sorted(d["layer"].unique()))
    axes[0, 0].legend(title="positions", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
