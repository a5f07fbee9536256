"""The scorecard's figure (chapter 99): each row of the paper's claims, ours over the paper's,
coloured by its verdict."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np

from ..book import plots_base  # noqa: F401 - importing it sets the book's plot theme
from ..book.scorecard_rules import interval

VERDICT_COLORS = {
    "matches": "tab:green",
    "same direction": "tab:olive",
    "same order": "tab:cyan",
    "differs": "tab:red",
    "too close to tell": "tab:orange",
    "n/a": "grey",
    "cannot fail": "silver",
}


def scorecard_plot(rows: list[dict], label_width: int = 58) -> plt.Figure:
    """Our value / the paper's for every "number" and "ratio" row, coloured by verdict (log scale,
    centred on 1), with the interval its rule reads (`scorecard_rules.interval`) as a bar; a row
    without two positive numbers gets a hollow marker at 1. Each row is as tall as its label
    (wrapped at `label_width` characters), so any number of rows stays readable."""
    rows = [r for r in rows if r.get("kind", "number") in ("number", "ratio")] or [
        {"id": "—", "quantity": "no number or ratio rows", "paper": None, "ours": None, "verdict": "n/a"}
    ]
    labels = [textwrap.fill(f"{r['id']}: {r['quantity']}", label_width) for r in rows]
    lines = [l.count("\n") + 1 for l in labels]

    row_in, top_in, bottom_in = 0.2, 1.0, 0.7  # inches: per label line, title + legend, x axis
    slots = np.cumsum([0] + [max(n, 1.4) for n in lines])  # each row as tall as its label
    height = top_in + bottom_in + row_in * slots[-1]
    width, left_in = 11.0, 5.2  # the labels' column; the data get ~5.5 in
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes(
        (left_in / width, bottom_in / height, 1 - (left_in + 0.3) / width, row_in * slots[-1] / height)
    )
    centres = (slots[:-1] + slots[1:]) / 2
    ratios = []
    for i, (r, y) in enumerate(zip(rows, centres)):
        ok = bool(r["paper"] and r["ours"] and r["paper"] > 0 and r["ours"] > 0)
        ratio = r["ours"] / r["paper"] if ok else 1.0
        ratios.append(ratio)
        color = VERDICT_COLORS.get(r["verdict"], "grey")
        reach = interval(r) if ok else None  # the interval the row's rule reads
        if reach is not None and reach[1] > reach[0]:
            lo = min(ratio - reach[0] / r["paper"], ratio * (1 - 1e-3))  # a log axis has no 0
            err = max(reach[1] / r["paper"] - ratio, 0.0)
            ax.errorbar(
                [ratio],
                [y],
                xerr=[[max(lo, 0.0)], [err]],
                fmt="none",
                ecolor=color,
                elinewidth=1.2,
                capsize=3,
            )
            ratios += [ratio - lo, ratio + err]
        ax.plot([ratio], [y], "o", ms=7, color=color, mfc=color if ok else "none")
        if not ok:
            ax.annotate(
                "no number", (ratio, y), xytext=(8, 0), textcoords="offset points", va="center", fontsize=8
            )
        if i and r["id"] != rows[i - 1]["id"]:
            ax.axhline(slots[i], color="grey", lw=0.6)  # a line between experiments
    span = (
        max([abs(np.log10(x)) for x in ratios if x > 0] + [0.5]) + 0.3
    )  # symmetric: above and below read alike
    ax.axvline(1, color="grey", ls=":")
    ax.set_yticks(centres, labels, fontsize=8)
    ax.set_ylim(slots[-1], 0)
    ax.grid(axis="y", visible=False)
    ax.set(
        xscale="log",
        xlim=(10**-span, 10**span),
        xlabel="our value / the paper's, the same scale-free quantity (log scale; 1 = equal)",
    )
    fig.suptitle("Our numbers against the paper's", y=1 - 0.25 / height)
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=v) for v, c in VERDICT_COLORS.items()]
    fig.legend(
        handles=handles,
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.5 / height),
        ncol=len(handles),
        frameon=False,
    )
    return fig
