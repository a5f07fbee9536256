"""Figures. Each function takes data (a DataFrame, an array) and returns a matplotlib Figure.

A chapter hands every figure it glues through `closed`, which signs it under its bottom
edge with the function that drew it ("drawn by mclib.chapters.ch02_copying.e2_shown"), so a
reader of the book finds under each figure the call that draws it again; `drawer` reads
the name back (tests/test_drawers.py checks that every one names a real function).
"""
from __future__ import annotations

import functools
import sys

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from ..core.data import copy_level
from ..core.metrics import DROP_WINDOW

# The book's one plot theme, set here, once, when the figures' module is imported (every
# chapter imports it); a figure without a grid (a heatmap) is drawn under `_without_grid`.
THEME = {"style": "whitegrid", "context": "notebook"}
sns.set_theme(**THEME)


def _without_grid(draw):
    """`draw`, run inside seaborn's "white" axes style (the theme without its grid, for maps
    and heatmaps), so that the book's theme is left as it was afterwards."""
    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        with sns.axes_style("white"):
            return draw(*args, **kwargs)
    return drawn


def loss_curve(metrics: pd.DataFrame, drop: int | None = None, rank: int = 2,
               title: str = "Training loss", smooth: int = 20) -> plt.Figure:
    """L, L_obs and L_mask against step (log scale), smoothed over `smooth` steps;
    the copying plateau E[X²] and the drop (if any) are marked."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for col, label in [("L", "L (all entries)"), ("L_obs", "L_obs (observed)"), ("L_mask", "L_mask (masked)")]:
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
    for steps, color, label in [([pre], "tab:green", "pre-shift"), (transition, "tab:orange", "transition"),
                                ([post], "tab:purple", "post-shift")]:
        for i, s in enumerate(steps):
            ax.axvline(s, color=color, lw=4, alpha=0.25, label=f"{label} checkpoint" if i == 0 else None)
    ax.legend(fontsize=8, loc="lower left")
    return fig


VERDICT_COLORS = {"matches": "tab:green", "same direction": "tab:olive", "same order": "tab:cyan", "differs": "tab:red",
                  "too close to tell": "tab:orange", "n/a": "grey", "cannot fail": "silver"}


def scorecard_plot(rows: list[dict], label_width: int = 58) -> plt.Figure:
    """Our value / the paper's for every scorecard row that compares a number or a ratio
    (kinds "number" and "ratio"; both are the same scale-free quantity on both sides),
    coloured by verdict (log scale, centred on 1), with ± 2·√(se² + spread²) of ours (the
    rules' own error) as a bar where the row has one. Rows without two positive numbers
    get a hollow marker at 1, labelled.

    Readable at any number of rows: the labels (wrapped at `label_width` characters) get
    a fixed width of the figure and the data the rest, each row a fixed height, and the
    verdicts' legend sits under the title; a row's label and its point share a light band
    per experiment."""
    import textwrap

    import numpy as np

    rows = [r for r in rows if r.get("kind", "number") in ("number", "ratio")] or [
        {"id": "—", "quantity": "no number or ratio rows", "paper": None, "ours": None, "verdict": "n/a"}]
    labels = [textwrap.fill(f"{r['id']}: {r['quantity']}", label_width) for r in rows]
    lines = [l.count("\n") + 1 for l in labels]

    row_in, top_in, bottom_in = 0.2, 1.0, 0.7                 # inches: per label line, title + legend, x axis
    slots = np.cumsum([0] + [max(n, 1.4) for n in lines])     # each row as tall as its label
    height = top_in + bottom_in + row_in * slots[-1]
    width, left_in = 11.0, 5.2                                # the labels' column; the data get ~5.5 in
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((left_in / width, bottom_in / height, 1 - (left_in + 0.3) / width,
                       row_in * slots[-1] / height))
    centres = (slots[:-1] + slots[1:]) / 2
    ratios = []
    for i, (r, y) in enumerate(zip(rows, centres)):
        ok = bool(r["paper"] and r["ours"] and r["paper"] > 0 and r["ours"] > 0)
        ratio = r["ours"] / r["paper"] if ok else 1.0
        ratios.append(ratio)
        color = VERDICT_COLORS.get(r["verdict"], "grey")
        err = 2 * float(np.hypot(r.get("se") or 0.0, r.get("spread") or 0.0)) / r["paper"] if ok else 0.0
        if err > 0:
            lo = min(err, ratio * (1 - 1e-3))                 # a log axis has no 0
            ax.errorbar([ratio], [y], xerr=[[lo], [err]], fmt="none", ecolor=color, elinewidth=1.2, capsize=3)
            ratios += [ratio - lo, ratio + err]
        ax.plot([ratio], [y], "o", ms=7, color=color, mfc=color if ok else "none")
        if not ok:
            ax.annotate("no number", (ratio, y), xytext=(8, 0), textcoords="offset points", va="center", fontsize=8)
        if i and r["id"] != rows[i - 1]["id"]:
            ax.axhline(slots[i], color="grey", lw=0.6)      # a line between experiments
    span = max([abs(np.log10(x)) for x in ratios if x > 0] + [0.5]) + 0.3  # symmetric: above and below read alike
    ax.axvline(1, color="grey", ls=":")
    ax.set_yticks(centres, labels, fontsize=8)
    ax.set_ylim(slots[-1], 0)
    ax.grid(axis="y", visible=False)
    ax.set(xscale="log", xlim=(10 ** -span, 10 ** span),
           xlabel="our value / the paper's, the same scale-free quantity (log scale; 1 = equal)")
    fig.suptitle("Our numbers against the paper's", y=1 - 0.25 / height)
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=v) for v, c in VERDICT_COLORS.items()]
    fig.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.5 / height),
               ncol=len(handles), frameon=False)
    return fig


# --- the copying and heads chapters (02, 03) --------------------------------------------------

LABEL_COLORS = {"row": "tab:blue", "column": "tab:orange", "identity": "tab:green",
                "mask-aware": "tab:purple", "other": "lightgrey"}


def prediction_scatter(x, pred, mask, title: str = "Output against the true value", max_points: int = 3000,
                       *, seed: int = 0) -> plt.Figure:
    """X̂ against X at observed (left) and masked (right) entries; x, pred, mask `[batch, n, n]`.
    A copying model sits on the diagonal on the left and on the line X̂ = 0 on the right."""
    import numpy as np

    x, pred, mask = (np.asarray(a).reshape(-1) for a in (x, pred, mask))
    rng = np.random.default_rng(seed)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.8), sharex=True, sharey=True)
    for ax, where, name in [(axes[0], ~mask, "observed entries (Ω)"), (axes[1], mask, "masked entries (Ωᶜ)")]:
        idx = np.flatnonzero(where)
        idx = rng.choice(idx, min(max_points, len(idx)), replace=False) if len(idx) else idx
        ax.scatter(x[idx], pred[idx], s=4, alpha=0.35, color="tab:blue" if name.startswith("obs") else "tab:red")
        lim = max(1.0, float(np.abs(x).max()) if len(x) else 1.0)
        ax.plot([-lim, lim], [-lim, lim], color="black", lw=1, ls="--", label="X̂ = X (completes or copies)")
        ax.axhline(0, color="grey", lw=1, ls=":", label="X̂ = 0 (ignores the mask)")
        ax.set(title=name, xlabel="true value X", ylabel="model output X̂" if ax is axes[0] else None)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def mask_value_curve(metrics: pd.DataFrame, reference: float, drop: int | None = None,
                     mark: dict[str, int] | None = None, smooth: int = 20,
                     *, title: str = "The mask value during training") -> plt.Figure:
    """Mean |X̂| at masked entries against step (smoothed); `reference` is the mean |X|
    there (what a model that completes outputs on average), `mark` names steps to mark."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(metrics["step"], metrics["mask_value"].rolling(smooth, min_periods=1).mean(), label="mask value (mean |X̂|, masked)")
    ax.axhline(reference, color="grey", ls=":", label=f"mean |X| at masked entries = {reference:.2f}")
    if drop is not None:
        ax.axvline(drop, color="black", ls="--", lw=1, label=f"drop at step {drop}")
    for i, (name, step) in enumerate((mark or {}).items()):
        ax.axvline(step, color=f"C{i + 2}", lw=4, alpha=0.3, label=f"{name} (step {step})")
    ax.set(xlabel="training step", ylabel=f"mask value (mean over {smooth} steps)", title=title, ylim=(0, None))
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def loss_bars(labels: list[str], values: dict[str, list[float]], paper: dict[str, list[float | None]] | None = None,
              title: str = "", xlabel: str | None = None, *, errors: dict[str, list[float]] | None = None,
              level: float | list[float] | None = None, paper_level: float | list[float] | None = None,
              reference: tuple[float, str] | None = None) -> plt.Figure:
    """Horizontal bars, one group per label (top to bottom) and one bar per quantity
    (`values`: quantity -> a value per label), log scale, each with ± 2 standard errors
    (`errors`: quantity -> an error per label; a quantity without errors gets none, and
    the legend says so); the paper's values, where given (`paper`: quantity -> a value or
    None per label), as black diamonds on the bars.

    One scale for both: with `level` (our copying level E[X²], one number or one per
    label) every value and error of ours is divided by it and every value of the paper's
    by `paper_level` (the paper's E[X²] on its own task; default: `level`), so each sits
    over its own copying level and 1, the dotted line, is copying on either task.
    Without `level` the values are drawn as they are, and `reference` = (value, name)
    draws a dotted vertical line (e.g. E[X²])."""
    import numpy as np

    n = len(labels)
    per_label = lambda x: np.broadcast_to(np.asarray(np.nan if x is None else x, dtype=float), (n,))
    ours_lvl = per_label(level) if level is not None else np.ones(n)
    paper_lvl = per_label(paper_level if paper_level is not None else level) if level is not None else np.ones(n)

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
            xerr = np.vstack([np.minimum(err, shown * (1 - 1e-3)), err])  # a log axis has no 0: stop short of it
        ax.barh(pos, shown, height=height * 0.9, color=f"C{i}", xerr=xerr,
                error_kw={"ecolor": "black", "elinewidth": 1, "capsize": 2},
                label=f"{name} (ours{', ± 2 s.e.' if err is not None else ', no error computed'})")
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
    first = sorted(range(len(names)), key=lambda j: "(ours" not in names[j])  # our bars, then the paper, the line
    ax.legend([handles[j] for j in first], [names[j] for j in first], fontsize=8, loc="lower center",
              bbox_to_anchor=(0.5, 1.0 + 0.6 / fig.get_figheight()), ncol=2, frameon=False)
    fig.tight_layout()
    return fig


@_without_grid
def attention_grid(maps, row_labels: list[str] | None = None, col_labels: list[str] | None = None,
                   title: str = "", n: int = 7, *, query_bands: list[tuple[int, int]] | None = None,
                   key_marks: list[int] | None = None, titles: list[list[str]] | None = None,
                   panel: float = 1.7, query_marks: list[int] | None = None) -> plt.Figure:
    """A grid of attention maps `maps [rows, cols, n², n²]` (queries down, keys across),
    all panels on one colour scale, from 0 to the largest probability of any panel but at
    least 3/n² (so a uniform head, 1/n² everywhere, shows as a flat dark map), with a
    colour bar. Thin lines separate the
    matrix rows (blocks of n positions). query_bands: [(first, last)] query positions
    to outline (e.g. masked rows); key_marks: key positions marked with a triangle above;
    query_marks: query positions marked with a triangle on the left (e.g. masked columns);
    titles: a title per panel ([rows][cols]), else col_labels over the top row."""
    import numpy as np
    from matplotlib.patches import Rectangle

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
                ax.add_patch(Rectangle((-0.5, first - 0.5), q, last - first + 1, fill=False, ec="red", lw=1.2))
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
    import numpy as np
    from matplotlib.colors import ListedColormap

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


def progress_lines(progress: pd.DataFrame, drop: int | None = None, mark: dict[str, int] | None = None,
                   title: str = "Attention structure during training") -> plt.Figure:
    """Row, column and self excess of every head against step (thin grey lines) and the
    largest over heads (bold); `progress` as from heads.attention_progress."""
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6), sharey=True)
    for ax, (col, name) in zip(axes, [("row_excess", "row"), ("column_excess", "column"), ("self_excess", "self")]):
        for _, g in progress.groupby(["layer", "head"]):
            ax.plot(g["step"], g[col], color="grey", lw=0.6, alpha=0.5)
        top = progress.groupby("step")[col].max()
        ax.plot(top.index, top.values, color="tab:blue", lw=2, marker="." if len(top) < 30 else None,
                label="largest over heads")
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
            axes[0, c].plot(g["layer"], g["mse"] / g["mse_zero"], styles.get(where, "-"), marker="o", ms=4, label=where)
            axes[1, c].plot(g["layer"], g["abs_cos"], styles.get(where, "-"), marker="o", ms=4, label=where)
        axes[0, c].set(title=f"target: {target}", ylabel="test MSE / MSE of predicting 0" if c == 0 else None,
                       ylim=(0, None))
        axes[1, c].set(xlabel="layer (0 = embeddings)", ylabel="mean |cosine|" if c == 0 else None, ylim=(0, 1.05))
        if d["abs_cos"].isna().all():
            axes[1, c].text(0.5, 0.5, "scalar target:\nno cosine", ha="center", va="center",
                            transform=axes[1, c].transAxes, color="grey")
        axes[1, c].set_xticks(sorted(d["layer"].unique()))
    axes[0, 0].legend(title="positions", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# --- embeddings (E12-E14) -------------------------------------------------------------

def _value_scatter(ax, x, y, values, cmap="coolwarm"):
    return ax.scatter(x, y, c=values, cmap=cmap, s=12, vmin=min(values), vmax=max(values))


def token_embedding_plot(norms: pd.DataFrame, coords: pd.DataFrame,
                         title: str = "Token embeddings of the values −1.50 … 1.50") -> plt.Figure:
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


def token_progress_plot(coords: pd.DataFrame, labels: dict | None = None,
                        title: str = "Token embeddings on the final PCA plane") -> plt.Figure:
    """E13: one column per checkpoint (coords: step, centred, value, pc1, pc2), the
    uncentred projection on top, the centred one below; labels: step -> column title."""
    steps = list(dict.fromkeys(coords["step"]))
    fig, axes = plt.subplots(2, len(steps), figsize=(2.6 * len(steps) + 1, 5.6), squeeze=False,
                             layout="constrained")
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
                ax.annotate(str(int(r["row"])), (r["x"], r["y"]), fontsize=6, ha="center", va="center", color="white")
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
    ax.axvspan(mid * n - 0.5, (mid + 1) * n - 0.5, color="grey", alpha=0.15, label=f"middle row (positions {mid * n}–{mid * n + n - 1})")
    ax.set(xlabel="position (row-major; colour = row)", ylabel="‖position embedding‖₂", title=title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def embedding_progress_plot(progress: pd.DataFrame, drop: int | None = None, initial_alignment: float | None = None,
                            title: str = "Embeddings across training") -> plt.Figure:
    """E13/E14 over every checkpoint (progress: `mclib.analyses.embeddings.embedding_progress`):
    column and row silhouette of the position embeddings, and the centred alignment of
    the token embeddings with their final layout (dotted: its value at initialisation,
    if given); the drop (if any) marked."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot(progress["step"], progress["column_silhouette"], "o-", ms=3, label="grouped by column")
    a.plot(progress["step"], progress["row_silhouette"], "s-", ms=3, label="grouped by row")
    a.axhline(0, color="grey", lw=0.8)
    a.set(xlabel="training step", ylabel="silhouette (cosine)", title="Position embeddings: clusters")
    b.plot(progress["step"], progress["token_alignment"], "o-", ms=3, color="tab:purple")
    b.set(xlabel="training step", ylabel="alignment with the final layout",
          title="Token embeddings: final arrangement", ylim=(min(-0.05, progress["token_alignment"].min() - 0.05), 1.05))
    if initial_alignment is not None:
        b.axhline(initial_alignment, color="grey", ls=":", label=f"at initialisation ({initial_alignment:.2f})")
    for ax in (a, b):
        if drop is not None:
            ax.axvline(drop, color="black", ls="--", lw=1, label=f"drop at step {drop}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# --- component re-initialisation (E15) -----------------------------------------------------

def freeze_curves(curves: dict, drops: dict, rank: int = 2, smooth: int = 20,
                  title: str = "Re-initialise one component, freeze the rest") -> plt.Figure:
    """E15: L_mask against step for each re-initialised group (curves: group -> metrics),
    smoothed over `smooth` steps; each run's drop (drops: group -> step or None) marked
    in its colour, the copying level dotted."""
    fig, ax = plt.subplots(figsize=(7, 4))
    colours = dict(zip(curves, sns.color_palette("tab10", len(curves))))
    for group, m in curves.items():
        drop = drops.get(group)
        label = f"{group} ({'drop at step ' + str(drop) if drop is not None else 'no drop'})"
        ax.plot(m["step"], m["L_mask"].rolling(smooth, min_periods=1).mean(), color=colours[group], label=label)
        if drop is not None:
            ax.axvline(drop, color=colours[group], ls="--", lw=1)
    level = copy_level(rank)
    ax.axhline(level, color="grey", ls=":", label=f"E[X²] = {level:.3f} (copying)")
    ax.set(yscale="log", xlabel="training step of the re-initialised run",
           ylabel=f"L_mask (mean over {smooth} steps)", title=title)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


# --- baselines (E16-E18) ----------------------------------------------------------------

METHOD_COLOURS = {"BERT": "tab:blue", "nuclear norm": "tab:orange", "truth": "grey"}


def _method_colour(method: str, i: int):
    return METHOD_COLOURS.get(method, sns.color_palette("tab10", 10)[(i + 2) % 10])


def nuclear_comparison_plot(table: pd.DataFrame, train_p: float,
                            title: str = "BERT against nuclear-norm minimisation") -> plt.Figure:
    """E16 (table: `mclib.analyses.comparisons.nuclear_sweep`): L over all entries and the mean
    nuclear norm against p_mask, BERT and the solver (± 2 s.e.); the true matrices'
    nuclear norm dotted; the training p_mask marked."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (method, d) in enumerate(table.groupby("method", sort=False)):
        colour = _method_colour(method, i)
        if method != "truth":
            a.errorbar(d["p_mask"], d["L"], yerr=2 * d["L_se"], fmt="o-", ms=4, capsize=2, color=colour, label=method)
        b.errorbar(d["p_mask"], d["nuclear"], yerr=2 * d["nuclear_se"], fmt="o-" if method != "truth" else ":",
                   ms=4, capsize=2, color=colour, label="true X" if method == "truth" else method)
    a.set(yscale="log", xlabel="p_mask (fraction of entries masked)", ylabel="MSE over all entries (L)",
          title="Error")
    b.set(xlabel="p_mask (fraction of entries masked)", ylabel="mean ‖·‖_* of the output", title="Nuclear norm")
    for ax in (a, b):
        ax.axvline(train_p, color="black", ls="--", lw=1, label=f"training p_mask {train_p:g}")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def ood_plot(table: pd.DataFrame, title: str = "Other factor distributions (E18)") -> plt.Figure:
    """E18 (table: `mclib.analyses.comparisons.ood_table`): L_mask / E[X²] per distribution and
    method (± 2 s.e.): 1 is the error of outputting 0 at every masked entry."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    dists = list(dict.fromkeys(table["dist"]))
    methods = list(dict.fromkeys(table["method"]))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        d = table[table["method"] == method].set_index("dist").loc[dists]
        xs = [k + (i - (len(methods) - 1) / 2) * width for k in range(len(dists))]
        ax.bar(xs, d["L_mask_rel"], width, yerr=2 * d["L_mask_se"] / d["copy_level"], capsize=3,
               color=_method_colour(method, i), label=method)
    ax.set_xticks(range(len(dists)), [f"{d}\nE[X²] = {table[table.dist == d]['copy_level'].iloc[0]:.3f}" for d in dists])
    ax.set(yscale="log", ylabel="L_mask / E[X²]  (1 = outputting 0)", xlabel="factor distribution", title=title)
    ax.axhline(1, color="grey", ls=":")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def per_matrix_plot(per_matrix: dict, title: str = "Error per matrix at the training p_mask") -> plt.Figure:
    """Empirical CDF of each method's per-matrix L_mask (per_matrix: method -> array), log x;
    each method's pooled L_mask is not shown here: few bad matrices dominate it."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 3.8))
    for i, (method, v) in enumerate(per_matrix.items()):
        v = np.sort(np.maximum(np.asarray(v, dtype=float), 1e-8))
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", color=_method_colour(method, i), label=method)
    ax.set(xscale="log", xlabel="L_mask of one matrix (floored at 1e-8)", ylabel="fraction of matrices at or below",
           title=title)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


# --- beyond the paper (07): the drop over seeds, progress measures -------------------------

def seed_loss_curves(curves: dict, drops: dict, rank: int = 2, smooth: int = DROP_WINDOW,
                     title: str = "L_mask over seeds", *, label: str = "seed {}") -> plt.Figure:
    """L_mask against step (log scale, mean over `smooth` steps), one line per run
    (`curves`: key -> metrics; a key is a seed, or with label="{}" any name), each run's
    drop (if any) a dashed line in its colour; the copying plateau E[X²] dotted."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (key, m) in enumerate(curves.items()):
        drop = drops.get(key)
        ax.plot(m["step"], m["L_mask"].rolling(smooth, min_periods=1).mean(), color=f"C{i}",
                label=label.format(key) + ": " + (f"drop at step {drop:,}" if drop is not None else "no drop"))
        if drop is not None:
            ax.axvline(drop, color=f"C{i}", ls="--", lw=1)
    ax.axhline(copy_level(rank), color="grey", ls=":", label=f"E[X²] = {copy_level(rank):.3f} (copying)")
    ax.set(yscale="log", xlabel="training step", ylabel=f"L_mask (mean over {smooth} steps)", title=title)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def gpt_loss_curves(curves: dict, bert, rank: int, gpt_batch: int, bert_batch: int, *, drops: dict,
                    bert_drop: int | None = None, smooth: int = DROP_WINDOW) -> plt.Figure:
    """E19: each GPT run's L (seed 1's L_obs and L_mask too) beside the BERT run's L and
    L_mask, against training steps (left) and matrices seen (right; the two models' batches
    may differ); log scale, mean over `smooth` steps, each drop a dashed line, E[X²] dotted."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, per in zip(axes, ("step", "matrix")):
        scale_g, scale_b = (1, 1) if per == "step" else (gpt_batch, bert_batch)
        for i, (seed, m) in enumerate(curves.items()):
            x = m["step"] * scale_g
            ax.plot(x, m["L"].rolling(smooth, min_periods=1).mean(), color=f"C{i}", lw=1.2,
                    label=f"GPT seed {seed}: L" + (f", drop at step {drops[seed]:,}" if drops.get(seed) else ", no drop"))
            if i == 0:
                for col, ls in (("L_obs", "-."), ("L_mask", ":")):
                    ax.plot(x, m[col].rolling(smooth, min_periods=1).mean(), color="C0", ls=ls, lw=1,
                            label=f"GPT seed {seed}: {col}")
            if drops.get(seed):
                ax.axvline(drops[seed] * scale_g, color=f"C{i}", ls="--", lw=0.8)
        xb = bert["step"] * scale_b
        for col, colour in (("L", "dimgrey"), ("L_mask", "black")):
            ax.plot(xb, bert[col].rolling(smooth, min_periods=1).mean(), color=colour, lw=1.2, label=f"BERT: {col}")
        if bert_drop is not None:
            ax.axvline(bert_drop * scale_b, color="black", ls="--", lw=0.8)
        ax.axhline(copy_level(rank), color="grey", ls=":", lw=1)
        ax.set(xscale="log", yscale="log", xlabel="training step" if per == "step" else "matrices seen",
               title=f"against {'steps' if per == 'step' else 'matrices seen'}")
    axes[0].set_ylabel(f"MSE (mean over {smooth} steps)")
    axes[1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def progress_panels(norm: pd.DataFrame, leads: pd.DataFrame | None = None, drop: int | None = None,
                    ncols: int = 4, title: str = "Progress measures during training") -> plt.Figure:
    """One panel per measure: its progress against step (`norm` as from
    progress.normalised: 0 at the first checkpoint, 1 at its extreme), the default
    threshold 0.5 dotted, the crossing (`leads` as from progress.lead_times) a dot, the
    drop a dashed line. Each panel's title gives the raw first and extreme values."""
    import numpy as np

    names = list(dict.fromkeys(norm["measure"]))
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.0 * ncols, 2.4 * nrows + 0.6), sharex=True, sharey=True,
                             squeeze=False)
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
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("training step")
    for ax in axes[:, 0]:
        ax.set_ylabel("progress\n(0 first, 1 extreme)")
    handles = [plt.Line2D([], [], color="grey", ls=":", label="threshold (half-way)"),
               plt.Line2D([], [], color="tab:red", marker="o", ls="", label="first crossing")]
    if drop is not None:
        handles.append(plt.Line2D([], [], color="black", ls="--", label=f"drop at step {drop:,}"))
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=len(handles), frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


DRAWER_GID = "mclib-drawer"  # the gid of the text that names a figure's drawer (`sign`)


def closed(fig: plt.Figure) -> plt.Figure:
    """`fig`, closed in pyplot: a chapter glues it (glue still renders a closed figure) and
    the notebook does not show it a second time at the end of the cell. Signed (`sign`)
    with the module-level function that called this one: the chapter function that drew it."""
    frame = sys._getframe(1)
    while frame.f_code.co_name.startswith("<"):  # a comprehension or lambda: the function around it
        frame = frame.f_back
    sign(fig, f"{frame.f_globals['__name__']}.{frame.f_code.co_qualname.split('.<locals>.')[0]}")
    plt.close(fig)
    return fig


def sign(fig: plt.Figure, drawer_name: str) -> plt.Figure:
    """Write "drawn by DRAWER_NAME" in small grey type just under the figure's bottom edge
    (the book's PNGs are cropped to what is drawn, so it shows below the plot, over nothing);
    a figure already signed keeps its first name."""
    if drawer(fig) is None:
        fig.text(0.995, 0.0, f"drawn by {drawer_name}", ha="right", va="top", fontsize=7, color="grey",
                 gid=DRAWER_GID)
    return fig


def drawer(fig: plt.Figure) -> str | None:
    """The qualified name of the function that drew `fig` (`sign`), or None if unsigned."""
    for text in fig.texts:
        if text.get_gid() == DRAWER_GID:
            return text.get_text().removeprefix("drawn by ")
    return None
