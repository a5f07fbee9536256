"""Tables the copying and heads chapters share: one call per experiment (E2-E10).

Every function evaluates on fresh matrices from `sample_eval_batch(data, n, seed)`, so
rows that differ only in the intervention compare the model on the same batch.
Heads are 0-indexed (layer, head) pairs in code; `head_name` prints the paper's
1-indexed "L2 H5".

    copy_check(model, profile.data, 512, seed=0)                         # E2
    ablation_table(model, profile.data, 256, 0, {"all": all_heads(model)})  # E3-E5, both readings
    model_table({"post": post, "pre-QKV into post": switch_qkv(post, pre)}, profile.data, 256, 0)  # E6, E7
    patching_table(model, profile.data, 256, 0)                          # E8, both readings
    checkpoint_maps(run_dir, steps, batch)                          # E9 evolution
    structured_scores(probs, mask, n)                               # E10
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from ..analyses.attention import ABLATION_MODES
from ..analyses.evaluate import activation_patching, predict, sample_eval_batch
from ..analyses.heads import _as_layers, capture_probs, head_scores, mean_attention
from ..analyses.interventions import l_prime_mask
from ..core.config import DataConfig
from ..core.metrics import LOSS_NAMES, losses

READINGS = {"uniform": "uniform 1/n² (the text)", "batch_mean": "batch mean (the code)"}
E2_FILLS = (None, 0.44, -0.24)            # MASK, then the two values of Table 1
E2_MATRICES = {"low-rank": None, "random": "random"}  # label -> dist (None: the profile's, of its rank)


def head_name(pair: tuple[int, int]) -> str:
    """(layer, head), 0-indexed -> 'L1 H1', 1-indexed as in the paper."""
    return f"L{pair[0] + 1} H{pair[1] + 1}"


def all_heads(model) -> list[tuple[int, int]]:
    c = model.config
    return [(l, h) for l in range(c.num_hidden_layers) for h in range(c.num_attention_heads)]


def fill_label(value: float | None) -> str:
    return "MASK" if value is None else f"{value:g}"


def _loss_row(pred: torch.Tensor, batch) -> dict[str, float]:
    """L, L_obs, L_mask, mask_value, and the standard errors L_se, L_obs_se, L_mask_se over
    matrices (`mclib.analyses.comparisons.pooled`: the matrices are the units)."""
    from ..analyses.comparisons import pooled

    row = {k: v.item() for k, v in losses(pred, batch.x, batch.mask).items()}
    sq = ((pred.float() - batch.x.float()) ** 2).cpu().numpy()
    mask = batch.mask.cpu().numpy().astype(bool)
    for name, where in (("L", np.ones_like(mask)), ("L_obs", ~mask), ("L_mask", mask)):
        row[f"{name}_se"] = pooled(sq, where)[1]
    return row


def ratio_se(a: float, a_se: float, b: float, b_se: float) -> float:
    """The standard error of a / b from the two errors, taken as independent (on the same
    matrices the two are positively correlated, so this overstates the error: the rules
    that use it err towards "matches" by at most that)."""
    return float(abs(a / b) * np.hypot(a_se / a, b_se / b)) if a and b else float("nan")


# --- E2 --------------------------------------------------------------------------------------

def copy_check(model, data: DataConfig, n_matrices: int, seed: int, fills: Sequence[float | None] = E2_FILLS,
               matrices: Mapping[str, str | None] = E2_MATRICES) -> pd.DataFrame:
    """E2: every masked token replaced by the token of m (None: MASK, m = 0).

    One row per (matrices, m): L'_mask (mean (X̂ − m)² over the masked entries), L_obs,
    L_mask and mask_value. The same matrices and masks for every m of one kind.
    """
    from ..analyses.comparisons import pooled
    from ..core.data import round2

    rows = []
    for label, dist in matrices.items():
        for value in fills:
            batch = sample_eval_batch(data, n_matrices, seed, dist=dist, fill_value=value)
            pred = predict(model, batch)
            m = 0.0 if value is None else float(round2(torch.tensor(float(value))))
            sq = ((pred.float() - m) ** 2).cpu().numpy()
            rows.append({"matrices": label, "token": fill_label(value),
                         "L'_mask": l_prime_mask(pred, batch, value),
                         "L'_mask_se": pooled(sq, batch.mask.cpu().numpy().astype(bool))[1], **_loss_row(pred, batch)})
    return pd.DataFrame(rows)


# --- E3-E5: ablation ---------------------------------------------------------------------------

def ablation_table(model, data: DataConfig, n_matrices: int, seed: int,
                   head_sets: Mapping[str, Iterable[tuple[int, int]]],
                   modes: Sequence[str] = ABLATION_MODES, mask: torch.Tensor | None = None) -> pd.DataFrame:
    """L, L_obs, L_mask, mask_value with nothing ablated, then with each set of heads
    ablated under each reading, all on one batch. Empty sets are left out.

    Columns: ablated (the set's name, "none" first), reading ("—" or a READINGS key),
    heads (how many), then LOSS_NAMES.
    """
    batch = sample_eval_batch(data, n_matrices, seed, mask=mask)
    rows = [{"ablated": "none", "reading": "—", "heads": 0, **_loss_row(predict(model, batch), batch)}]
    for name, heads in head_sets.items():
        heads = sorted(set(heads))
        if not heads:
            continue
        for mode in modes:
            pred = predict(model, batch, hooks=lambda h, heads=heads, mode=mode: h.ablate(heads, mode=mode))
            rows.append({"ablated": name, "reading": mode, "heads": len(heads), **_loss_row(pred, batch)})
    return pd.DataFrame(rows)


def lookup(table: pd.DataFrame, column: str, **where) -> float:
    """The one value of `column` in the row matching every `where` (NaN if there is none)."""
    sel = table
    for key, value in where.items():
        sel = sel[sel[key] == value]
    if len(sel) > 1:
        raise ValueError(f"{len(sel)} rows match {where}")
    return float(sel[column].iloc[0]) if len(sel) else float("nan")


# --- E6, E7: changed models ------------------------------------------------------------------

def model_table(models: Mapping[str, object], data: DataConfig, n_matrices: int, seed: int) -> pd.DataFrame:
    """L, L_obs, L_mask, mask_value of each model on the same batch; one row each ("model", ...)."""
    batch = sample_eval_batch(data, n_matrices, seed)
    return pd.DataFrame([{"model": name, **_loss_row(predict(m, batch), batch)} for name, m in models.items()])


# --- E8: activation patching ------------------------------------------------------------------

PATCH_READINGS = {"none": [], "last layer": "last", "all layers": "all"}


def patching_table(model, data: DataConfig, n_matrices: int, seed: int) -> pd.DataFrame:
    """E8 under both readings, and the plain −X run (no layer patched) as the reference.
    One row per reading: MSE of the output to X and to −X at masked and observed entries."""
    rows = []
    for reading, layers in PATCH_READINGS.items():
        rows.append({"patched": reading, **activation_patching(model, data, n_matrices, seed, layers=layers)})
    return pd.DataFrame(rows)


# --- E9: maps over training -----------------------------------------------------------------

def checkpoint_maps(run_dir, steps: Iterable[int], batch) -> dict[int, torch.Tensor]:
    """step -> `[layer, head, n², n²]` batch-mean attention of every head on `batch`."""
    from ..core.runs import load_checkpoint

    out = {}
    for step in steps:
        probs = capture_probs(load_checkpoint(run_dir, step), batch)
        out[step] = torch.stack([mean_attention(probs[l]) for l in sorted(probs)])
    return out


def pick_heads(scores: pd.DataFrame, criteria: Mapping[str, tuple[str, bool]]) -> dict[str, tuple[int, int]]:
    """One distinct head per criterion, in order: name -> (layer, head) of the head with the
    largest (True) or smallest (False) value of the column among heads not yet picked.
    Criteria are skipped once every head is picked."""
    picked: dict[str, tuple[int, int]] = {}
    for name, (column, largest) in criteria.items():
        taken = set(picked.values())
        left = scores[[(int(l), int(h)) not in taken for l, h in zip(scores["layer"], scores["head"])]]
        if left.empty:
            break
        best = left.loc[left[column].idxmax() if largest else left[column].idxmin()]
        picked[name] = (int(best["layer"]), int(best["head"]))
    return picked


# --- E10: a structured mask -----------------------------------------------------------------

def structured_scores(probs, mask: torch.Tensor, n: int) -> pd.DataFrame:
    """E10: `head_scores` under one fixed `[n, n]` mask, plus, over the masked queries of
    the rows the mask (almost) fills:
        lone_entry   mass on the observed entries of the query's own row (E10's mask
                     leaves one), the "attend to the only observed entry" heads;
        masked_rows  mass on the keys of those rows, low for heads that ignore them.
    """
    if mask.ndim != 2:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected one [{n}, {n}] mask")
    scores = head_scores(probs, mask, n)
    rows = [r for r in range(n) if mask[r].float().mean() > 0.5]
    if not rows:
        raise ValueError("the mask fills no row to more than half")
    flat = mask.reshape(-1)
    row_of = torch.arange(n * n) // n
    queries = torch.tensor([p for p in range(n * n) if row_of[p] in rows and flat[p]])
    in_rows = torch.isin(row_of, torch.tensor(rows))
    same_row_obs = (row_of[queries][:, None] == row_of[None]) & ~flat[None]  # [q, k]
    lone, masked_rows = [], []
    for p in _as_layers(probs).values():  # the order of head_scores' rows
        p = p.double().mean(0)[:, queries]                                   # [head, q, k]
        lone.append((p * same_row_obs).sum(-1).mean(-1))
        masked_rows.append(p[..., in_rows].sum(-1).mean(-1))
    scores["lone_entry"] = torch.cat(lone).numpy()
    scores["masked_rows"] = torch.cat(masked_rows).numpy()
    # a uniform head's values, to read the two columns against
    scores.attrs["chance"] = {"lone_entry": same_row_obs.double().sum(-1).mean().item() / n**2,
                              "masked_rows": in_rows.double().mean().item()}
    return scores
