"""What every figure shares: the book's one plot theme (set on import), `_without_grid` for
maps and heatmaps, and `closed`, through which a chapter hands over each figure it glues, signed
under its bottom edge with the function that drew it (`sign`, read back by `drawer`). Each figure
function of the plots_* modules takes data (a DataFrame, an array) and returns a matplotlib Figure.
"""

from __future__ import annotations

import functools
import sys

import matplotlib.pyplot as plt
import seaborn as sns

# The book's one plot theme, set once on import (every module of figures imports this one).
THEME = {"style": "whitegrid", "context": "notebook"}
sns.set_theme(**THEME)


def _without_grid(draw):
    """`draw`, run under seaborn's "white" style (the theme without its grid), the theme kept."""

    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        with sns.axes_style("white"):
            return draw(*args, **kwargs)

    return drawn


DRAWER_GID = "mclib-drawer"  # the gid of the text that names a figure's drawer (`sign`)


def closed(fig: plt.Figure) -> plt.Figure:
    """`fig`, closed in pyplot (glue still renders it; the notebook does not show it twice) and
    signed (`sign`) with the module-level function that called this one."""
    frame = sys._getframe(1)
    while frame.f_code.co_name.startswith("<"):  # a comprehension or lambda: the function around it
        frame = frame.f_back
    sign(fig, f"{frame.f_globals['__name__']}.{frame.f_code.co_qualname.split('.<locals>.')[0]}")
    plt.close(fig)
    return fig


def sign(fig: plt.Figure, drawer_name: str) -> plt.Figure:
    """Write "drawn by DRAWER_NAME" in small grey type just under the figure's bottom edge (the
    book's PNGs are cropped to what is drawn); a figure already signed keeps its first name."""
    if drawer(fig) is None:
        fig.text(
            0.995,
            0.0,
            f"drawn by {drawer_name}",
            ha="right",
            va="top",
            fontsize=7,
            color="grey",
            gid=DRAWER_GID,
        )
    return fig


def drawer(fig: plt.Figure) -> str | None:
    """The qualified name of the function that drew `fig` (`sign`), or None if unsigned."""
    for text in fig.texts:
        if text.get_gid() == DRAWER_GID:
            return text.get_text().removeprefix("drawn by ")
    return None
