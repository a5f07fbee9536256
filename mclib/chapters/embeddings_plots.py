"""Figures of the embeddings (chapter 04, E12-E14): the token embeddings' norms and principal
components, the position embeddings' t-SNE and norms, and how both progress."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from ..book import plots_base  # noqa: F401 - importing it sets the book's plot theme


def _value_scatter(ax, x, y, values, cmap="coolwarm"):
    return ax.scatter(x, y, c=values, cmap=cmap, s=12, vmin=min(values), vmax=max(values))


def token_embedding_plot(
    norms: pd.DataFrame, coords: pd.DataFrame, title: str = "Token embeddings of the values −1.50 … 1.50"
) -> plt.Figure:
    """E12: ℓ2 norm against value (norms: value, norm) and the PCA(2) scatter coloured by
    value (coords: value, pc1, pc2)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(norms["value"], norms["norm"], color="tab:blue")
    a.set(xlabel="value x", ylabel="‖embedding(x)‖₂", title="ℓ2 norm against value")
    sc = _value_scatter(b, coords["pc1"], coords["pc2"], coords["value"])
    fig.colorbar(sc, ax=b, label="value x")
    b.set(xlabel="PC 1", ylabel="PC 2", title="PCA(2), coloured by value")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def token_progress_plot(
    coords: pd.DataFrame, labels: dict | None = None, title: str = "Token embeddings on the final PCA plane"
) -> plt.Figure:
    """E13: one column per checkpoint (coords: step, centred, value, pc1, pc2), the
    uncentred projection on top, the centred one below; labels: step -> column title."""
    steps = list(dict.fromkeys(coords["step"]))
    fig, axes = plt.subplots(
        2, len(steps), figsize=(2.6 * len(steps) + 1, 5.6), squeeze=False, layout="constrained"
    )
    for j, step in enumerate(steps):
        for i, centred in enumerate((False, True)):
            d = coords[(coords["step"] == step) & (coords["centred"] == centred)]
            ax = axes[i, j]
            sc = _value_scatter(ax, d["pc1"], d["pc2"], d["value"])
            ax.set_title((labels or {}).get(step, f"step {step}") if i == 0 else "", fontsize=9)
            ax.set_xlabel("PC 1", fontsize=8)
            if j == 0:
                ax.set_ylabel(("uncentred (the authors)" if i == 0 else "centred") + "\nPC 2", fontsize=8)
            ax.tick_params(labelsize=6)
    fig.colorbar(sc, ax=axes, label="value x", shrink=0.8)
    fig.suptitle(title)
    return fig


def position_tsne_plot(frames: dict, title: str = "t-SNE of the position embeddings") -> plt.Figure:
    """E14: one panel per checkpoint (frames: label -> DataFrame with x, y, column, row),
    points coloured by column, the marker's label is the row."""
    fig, axes = plt.subplots(1, len(frames), figsize=(2.9 * len(frames) + 0.5, 3.3), squeeze=False)
    colours = sns.color_palette("tab10", 10)
    for ax, (label, d) in zip(axes[0], frames.items()):
        for c, g in d.groupby("column"):
            ax.scatter(g["x"], g["y"], color=colours[c % 10], s=28, label=f"column {c}")
            for _, r in g.iterrows():
                ax.annotate(
                    str(int(r["row"])), (r["x"], r["y"]), fontsize=6, ha="center", va="center", color="white"
                )
        ax.set(title=label, xlabel="t-SNE 1", ylabel="t-SNE 2", xticks=[], yticks=[])
    handles, names = axes[0, -1].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, loc="center right")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    return fig


def position_norm_plot(norms: pd.DataFrame, title: str = "ℓ2 norm of each position embedding") -> plt.Figure:
    """E14: bars per position (norms: position, row, norm), coloured by row; the middle row shaded."""
    fig, ax = plt.subplots(figsize=(8, 3.2))
    n = int(norms["row"].max()) + 1
    colours = sns.color_palette("viridis", n)
    ax.bar(norms["position"], norms["norm"], color=[colours[r] for r in norms["row"]])
    mid = n // 2
    ax.axvspan(
        mid * n - 0.5,
        (mid + 1) * n - 0.5,
        color="grey",
        alpha=0.15,
        label=f"middle row (positions {mid * n}–{mid * n + n - 1})",
    )
    ax.set(xlabel="position (row-major; colour = row)", ylabel="‖position embedding‖₂", title=title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def embedding_progress_plot(
    progress: pd.DataFrame,
    drop: int | None = None,
    initial_alignment: float | None = None,
    title: str = "Embeddings across training",
) -> plt.Figure:
    """E13/E14 per checkpoint (`mclib.analyses.embeddings.embedding_progress`): the position
    embeddings' column and row silhouettes, the token embeddings' alignment with their final
    layout (dotted: `initial_alignment`), the drop dashed."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot(progress["step"], progress["column_silhouette"], "o-", ms=3, label="grouped by column")
    a.plot(progress["step"], progress["row_silhouette"], "s-", ms=3, label="grouped by row")
    a.axhline(0, color="grey", lw=0.8)
    a.set(xlabel="training step", ylabel="silhouette (cosine)", title="Position embeddings: clusters")
    b.plot(progress["step"], progress["token_alignment"], "o-", ms=3, color="tab:purple")
    b.set(
        xlabel="training step",
        ylabel="alignment with the final layout",
        title="Token embeddings: final arrangement",
        ylim=(min(-0.05, progress["token_alignment"].min() - 0.05), 1.05),
    )
    if initial_alignment is not None:
        b.axhline(
            initial_alignment, color="grey", ls=":", label=f"at initialisation ({initial_alignment:.2f})"
        )
    for ax in (a, b):
        if drop is not None:
            ax.axvline(drop, color="black", ls="--", lw=1, label=f"drop at step {drop}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
