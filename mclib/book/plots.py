"""Figures. Each function takes data (a DataFrame, an array) and returns a matplotlib Figure.

A chapter hands every figure it glues through `closed`, which signs it under its bottom
edge with the function that drew it ("drawn by mclib.chapters.ch02_copying.e2_shown"), so a
reader of the book finds under each figure the call that draws it again; `drawer` reads
the name back (tests/test_drawers.py checks that every one names a real function).

The figures, by family, are in modules beside this one; the chapters take them from here:

    plots_base        the book's one plot theme; `closed`, `sign`, `drawer`
    plots_curves      losses and progress against step (chapters 01, 05, 07, 08)
    plots_heads       the copying and heads chapters (02, 03)
    plots_embeddings  the embeddings (04)
    plots_baselines   the baselines (06)
    plots_scorecard   the scorecard (99)
"""
from __future__ import annotations

# The chapters (mclib/book/ch*.py, followup.py) import these from here
from .plots_base import closed  # noqa: F401
from .plots_baselines import nuclear_comparison_plot, ood_plot, per_matrix_plot  # noqa: F401
from .plots_curves import (freeze_curves, gpt_loss_curves, loss_curve, mark_checkpoints,  # noqa: F401
                           progress_panels, seed_loss_curves)
from .plots_embeddings import (embedding_progress_plot, position_norm_plot, position_tsne_plot,  # noqa: F401
                               token_embedding_plot, token_progress_plot)
from .plots_heads import (attention_grid, head_label_heatmap, loss_bars, mask_value_curve,  # noqa: F401
                          prediction_scatter, probe_lines, progress_lines)
from .plots_scorecard import VERDICT_COLORS, scorecard_plot  # noqa: F401
