"""Figures of the baselines (chapter 06, E16-E18): BERT against nuclear-norm minimisation, other
factor distributions, and the error per matrix."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..book import plots_base  # noqa: F401 - importing it sets the book's plot theme

METHOD_COLOURS = {"BERT": "tab:blue", "nuclear norm": "tab:orange", "truth": "grey"}


def _method_colour(method: str, i: int):
    return METHOD_COLOURS.get(method, sns.color_palette("tab10", 10)[(i + 2) % 10])


def nuclear_comparison_plot(
    table: pd.DataFrame, train_p: float, title: str = "BERT against nuclear-norm minimisation"
) -> plt.Figure:
    """E16 (`mclib.analyses.comparisons.nuclear_sweep`): L and the mean nuclear norm against
    p_mask for BERT and the solver (± 2 s.e.), the true matrices' norm dotted, `train_p` marked."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (method, d) in enumerate(table.groupby("method", sort=False)):
        colour = _method_colour(method, i)
        if method != "truth":
            a.errorbar(
                d["p_mask"], d["L"], yerr=2 * d["L_se"], fmt="o-", ms=4, capsize=2, color=colour, label=method
            )
        b.errorbar(
            d["p_mask"],
            d["nuclear"],
            yerr=2 * d["nuclear_se"],
            fmt="o-" if method != "truth" else ":",
            ms=4,
            capsize=2,
            color=colour,
            label="true X" if method == "truth" else method,
        )
    a.set(
        yscale="log",
        xlabel="p_mask (fraction of entries masked)",
        ylabel="MSE over all entries (L)",
        title="Error",
    )
    b.set(
        xlabel="p_mask (fraction of entries masked)", ylabel="mean ‖·‖_* of the output", title="Nuclear norm"
    )
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
        ax.bar(
            xs,
            d["L_mask_rel"],
            width,
            yerr=2 * d["L_mask_se"] / d["copy_level"],
            capsize=3,
            color=_method_colour(method, i),
            label=method,
        )
    ax.set_xticks(
        range(len(dists)), [f"{d}\nE[X²] = {table[table.dist == d]['copy_level'].iloc[0]:.3f}" for d in dists]
    )
    ax.set(
        yscale="log", ylabel="L_mask / E[X²]  (1 = outputting 0)", xlabel="factor distribution", title=title
    )
    ax.axhline(1, color="grey", ls=":")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def per_matrix_plot(per_matrix: dict, title: str = "Error per matrix at the training p_mask") -> plt.Figure:
    """Empirical CDF of each method's per-matrix L_mask (per_matrix: method -> array), log x;
    each method's pooled L_mask is not shown here: few bad matrices dominate it."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for i, (method, v) in enumerate(per_matrix.items()):
        v = np.sort(np.maximum(np.asarray(v, dtype=float), 1e-8))
        ax.step(
            v, np.arange(1, len(v) + 1) / len(v), where="post", color=_method_colour(method, i), label=method
        )
    ax.set(
        xscale="log",
        xlabel="L_mask of one matrix (floored at 1e-8)",
        ylabel="fraction of matrices at or below",
        title=title,
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig
