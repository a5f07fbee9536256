"""What every figure shares: the book's one plot theme, set here, once, when this module is
imported (each module of figures imports it); `_without_grid` for a map or a heatmap; and how a
chapter hands a figure over (`closed`), signed with the function that drew it (`sign`, read back
by `drawer`).

Each function of figures takes data (a DataFrame, an array) and returns a matplotlib Figure. A
chapter hands every figure it glues through `closed`, whose signature under the figure's bottom
edge ("drawn by mclib.chapters.ch02_copying.e2_shown") shows a reader of the book the call that
draws it again (tests/test_drawers.py checks that every one names a real function). The figures,
by family, are in modules beside this one; a chapter imports each from its own module:

    plots_base        this one: the book's one plot theme; `closed`, `sign`, `drawer`
    plots_curves      losses and progress against step (chapters 01, 05, 07, 08)
    plots_heads       the copying and heads chapters (02, 03)
    plots_embeddings  the embeddings (04)
    plots_baselines   the baselines (06)
    plots_scorecard   the scorecard (99)
"""
from __future__ import annotations

import functools
import sys

import matplotlib.pyplot as plt
import seaborn as sns

# The book's one plot theme, set here, once, when this module is imported (every module
# of figures imports it); a figure without a grid (a heatmap) is drawn under `_without_grid`.
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
