"""The copying levels the scorecard rows of chapters 01-03 divide by.

Every model row compares a scale-free quantity: a loss over its own task's copying level
E[X²], or a ratio of two losses on the same matrices. No loss is rescaled across tasks.
(The chapters' sentences and rows themselves live in mclib/book/chNN_*.py.)
"""
from __future__ import annotations

RANDOM_LEVEL = 1 / 3  # E[X²] of E2's "random" matrices (iid Unif[-1, 1] entries), whatever the rank


def copy_levels(rank: int) -> dict[str, tuple[float, float]]:
    """kind of matrix -> (our E[X²], the paper's): low-rank matrices have E[X²] = rank/9, E2's
    random matrices 1/3 on both tasks (their rows are not rescaled)."""
    from ..core import paper
    from ..core.data import copy_level

    return {"low-rank": (copy_level(rank), copy_level(paper.task().rank)),
            "random": (RANDOM_LEVEL, RANDOM_LEVEL)}
