"""A model's losses under interventions, one batch per table (`sample_eval_batch(data, n,
seed)`), with standard errors over matrices (`L_se`, `L_obs_se`, `L_mask_se`), and the
lookups and ratios chapters 02 and 03 read from such tables. Heads are 0-indexed (layer,
head) pairs; `head_name` prints the paper's 1-indexed "L2 H5".

    ablation_table(model, data, 256, 0, {"all heads": all_heads(model)})   # E3-E5, both readings
    # E6, E7
    model_table({"post": post, "pre-QKV into post": (post, switch_qkv_hooks(post, pre))}, data, 256, 0)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from ..core.config import DataConfig
from ..core.metrics import losses
from .attention import ABLATION_MODES, ablation_hooks
from .evaluate import pooled, predict, sample_eval_batch

UNABLATED = {"ablated": "none", "reading": "—"}  # the row of `ablation_table` with nothing ablated


def head_name(pair: tuple[int, int]) -> str:
    """(layer, head), 0-indexed -> 'L1 H1', 1-indexed as in the paper."""
    return f"L{pair[0] + 1} H{pair[1] + 1}"


def all_heads(model) -> list[tuple[int, int]]:
    """Every (layer, head) of the model, 0-indexed."""
    c = model.config
    return [(l, h) for l in range(c.num_hidden_layers) for h in range(c.num_attention_heads)]


def loss_row(pred: torch.Tensor, batch) -> dict[str, float]:
    """L, L_obs, L_mask, mask_value, and their standard errors L_se, L_obs_se, L_mask_se
    over matrices (`pooled`: the matrices are the units)."""
    row = {k: v.item() for k, v in losses(pred, batch.x, batch.mask).items()}
    sq = ((pred.float() - batch.x.float()) ** 2).cpu().numpy()
    mask = batch.mask.cpu().numpy().astype(bool)
    for name, where in (("L", np.ones_like(mask)), ("L_obs", ~mask), ("L_mask", mask)):
        row[f"{name}_se"] = pooled(sq, where)[1]
    return row


def ablation_table(
    model,
    data: DataConfig,
    n_matrices: int,
    seed: int,
    head_sets: Mapping[str, Iterable[tuple[int, int]]],
    *,
    modes: Sequence[str] = ABLATION_MODES,
    mask: torch.Tensor | None = None,
) -> pd.DataFrame:
    """L, L_obs, L_mask, mask_value with nothing ablated, then with each set of heads
    ablated under each reading, all on one batch. Empty sets are left out.

    Columns: ablated (the set's name, "none" first), reading ("—" or a READINGS key),
    heads (how many), which (their names, 'L1 H1, ...'), then the losses and their standard
    errors (`loss_row`).
    """
    batch = sample_eval_batch(data, n_matrices, seed, mask=mask)
    rows = [
        {"ablated": "none", "reading": "—", "heads": 0, "which": "", **loss_row(predict(model, batch), batch)}
    ]
    for name, heads in head_sets.items():
        heads = sorted(set(heads))
        if not heads:
            continue
        for mode in modes:
            pred = predict(model, batch, hooks=ablation_hooks(model, heads, mode))
            rows.append(
                {
                    "ablated": name,
                    "reading": mode,
                    "heads": len(heads),
                    "which": ", ".join(head_name(p) for p in heads),
                    **loss_row(pred, batch),
                }
            )
    return pd.DataFrame(rows)


def model_table(models: Mapping[str, object], data: DataConfig, n_matrices: int, seed: int) -> pd.DataFrame:
    """L, L_obs, L_mask, mask_value (and errors) of each model on the same batch; one row each ("model", ...).
    A value is a model, or a pair (model, hooks) run with those hooks (E6's `switch_qkv_hooks`,
    E7's `permute_positions_hooks`)."""
    batch = sample_eval_batch(data, n_matrices, seed)
    pairs = {name: m if isinstance(m, tuple) else (m, ()) for name, m in models.items()}
    return pd.DataFrame(
        [{"model": name, **loss_row(predict(m, batch, hooks), batch)} for name, (m, hooks) in pairs.items()]
    )


def lookup(table: pd.DataFrame, column: str, **where) -> float:
    """The one value of `column` in the row matching every `where` (NaN if there is none)."""
    sel = table
    for key, value in where.items():
        sel = sel[sel[key] == value]
    if len(sel) > 1:
        raise ValueError(f"{len(sel)} rows match {where}")
    return float(sel[column].iloc[0]) if len(sel) else float("nan")


def value_and_se(table: pd.DataFrame, column: str, **where) -> tuple[float, float]:
    """(`column`, `column`_se) of the one row matching `where`."""
    return lookup(table, column, **where), lookup(table, f"{column}_se", **where)


def ratio_se(a: float, a_se: float, b: float, b_se: float) -> float:
    """Standard error of a / b, the errors taken as independent (an overstatement on the same matrices)."""
    return float(abs(a / b) * np.hypot(a_se / a, b_se / b)) if a and b else float("nan")


def ratio_and_se(table: pd.DataFrame, column: str, num: dict, den: dict) -> tuple[float, float]:
    """(num / den, its standard error) of `column` between two rows of one table (same matrices)."""
    (a, a_se), (b, b_se) = value_and_se(table, column, **num), value_and_se(table, column, **den)
    return a / b, ratio_se(a, a_se, b, b_se)


def permutation_errors(perm: pd.DataFrame) -> dict[str, float]:
    """The standard errors of the mean over permutations (`perm`: one row per permutation,
    the same matrices): the matrices' error, common to every row (their mean `_se`), and
    the permutations' spread over √k, added in quadrature."""
    k = len(perm)
    spread = lambda q: perm[q].std(ddof=1) / np.sqrt(k) if k > 1 else 0.0
    return {f"{q}_se": float(np.hypot(perm[f"{q}_se"].mean(), spread(q))) for q in ("L", "L_obs", "L_mask")}
