"""Scores for attention heads (E9), their classification, and the groups of E5.

Input: attention probabilities `[batch, head, query, key]` per layer over the n² positions
read row by row (position p is row p // n, column p % n). Every score is a mass: the
probability a head puts on a set of keys, averaged over queries and batch; a uniform head's
masses are `chance_levels(n)`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd
import torch

from ..core.attention import position_masks  # the one definition of row / column / self keys
from ..core.checkpoints import load_checkpoint, saved_steps
from ..core.config import DataConfig
from ..core.data import structured_mask
from ..core.hooks import run_with_cache
from .evaluate import sample_eval_batch

LABELS = ("row", "column", "identity", "mask-aware", "other")

# A structural score counts when excess = (mass - chance) / (1 - chance) >= 0.5; row,
# column and self keys are disjoint, so at 0.5 no two can both pass and the label does
# not depend on the order of the tests.
STRUCTURE_THRESHOLD = 0.5
# mask_preference runs from -1 (only observed keys) through 0 (chance) to +1 (only masked
# keys); half-way to either end makes a head mask-aware.
MASK_THRESHOLD = 0.5


def chance_levels(n: int) -> dict[str, float]:
    """Masses of a uniform head on an n×n matrix (row, column exclude the query itself)."""
    return {"row": (n - 1) / n**2, "column": (n - 1) / n**2, "self": 1 / n**2}


def mean_attention(probs: torch.Tensor) -> torch.Tensor:
    """`[batch, head, q, k]` -> `[head, q, k]`: the batch-mean map of every head (E9)."""
    if probs.ndim != 4:
        raise ValueError(
            f"probs has {probs.ndim} dims {tuple(probs.shape)}, expected [batch, head, query, key]"
        )
    return probs.float().mean(0)


def attention_entropy(probs: torch.Tensor) -> torch.Tensor:
    """`[batch, head, q, k]` -> `[head]`: mean entropy (nats) of each query's attention
    (log(n²) uniform, 0 on one key)."""
    if probs.ndim != 4:
        raise ValueError(
            f"probs has {probs.ndim} dims {tuple(probs.shape)}, expected [batch, head, query, key]"
        )
    p = probs.double()
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean((0, 2)).float()


def _as_layers(probs) -> dict[int, torch.Tensor]:
    """One tensor `[batch, head, q, k]` (layer 0), a stack `[layer, batch, head, q, k]`,
    a sequence of per-layer tensors, or a {layer: tensor} mapping -> {layer: tensor}."""
    if isinstance(probs, torch.Tensor):
        if probs.ndim == 4:
            return {0: probs}
        if probs.ndim == 5:
            return dict(enumerate(probs))
        raise ValueError(
            f"probs has {probs.ndim} dims {tuple(probs.shape)}, expected [batch, head, query, key]"
        )
    if isinstance(probs, Mapping):
        return dict(probs)
    if isinstance(probs, Sequence):
        return dict(enumerate(probs))
    raise ValueError(f"probs of type {type(probs).__name__} is not a tensor, sequence or mapping of tensors")


def _check(layers: dict[int, torch.Tensor], mask: torch.Tensor, n: int) -> torch.Tensor:
    """Validate shapes; returns the mask as `[batch, n*n]` bool."""
    if not layers:
        raise ValueError("probs holds no layer")
    first_layer, first = next(iter(layers.items()))
    for layer, p in layers.items():
        if p.ndim != 4:
            raise ValueError(
                f"layer {layer} probs has shape {tuple(p.shape)}, expected [batch, head, query, key]"
            )
        if p.shape != first.shape:
            raise ValueError(
                f"layer {layer} probs has shape {tuple(p.shape)}, "
                f"layer {first_layer} has {tuple(first.shape)}"
            )
    batch, _, q, k = first.shape
    if q != k or q != n * n:
        raise ValueError(f"n = {n} does not match the attention's {q} queries × {k} keys (expected {n * n})")
    if mask.ndim == 2:
        mask = mask.expand(batch, *mask.shape)  # one fixed mask for the batch (E10)
    if mask.ndim != 3 or mask.shape[1:] != (n, n):
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected [batch, {n}, {n}] or [{n}, {n}]")
    if mask.shape[0] != batch:
        raise ValueError(f"mask batch {mask.shape[0]} does not match the probs batch {batch}")
    row_sum = first[:1].sum(-1)
    if not torch.allclose(row_sum, torch.ones_like(row_sum), atol=1e-3):
        raise ValueError(
            f"layer {first_layer} rows sum to {row_sum.flatten()[0].item():.4g}, not 1: "
            "pass softmax probabilities, not logits"
        )
    return mask.reshape(batch, n * n).bool()


def key_mass(probs: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`[batch, head, q, k]`, `[q, k]` bool key sets -> `[batch, head]` mass on the keys."""
    return (probs * keys.to(probs.device, probs.dtype)).sum(-1).mean(-1)


def _mask_preference(masked: float, share: float) -> float:
    # -1 only observed keys, 0 chance (the keys' masked share), +1 only masked keys.
    if not 0 < share < 1:
        return math.nan
    return (masked - share) / (1 - share) if masked >= share else (masked - share) / share


def head_scores(probs, mask: torch.Tensor, n: int) -> pd.DataFrame:
    """One row per (layer, head) of `probs` (see `_as_layers`; `[batch, head, n², n²]` each)
    under `mask` (`[batch, n, n]` or `[n, n]`, True = masked). Columns: layer, head, row,
    column, self, observed, masked (masses), masked_share (chance of `masked`), row_excess,
    column_excess, self_excess (0 uniform, 1 pure), mask_preference, entropy (nats).
    """
    layers = _as_layers(probs)
    mask = _check(layers, mask, n)
    keysets = position_masks(n)
    chance = chance_levels(n)
    share = mask.double().mean().item()
    rows = []
    for layer, p in layers.items():
        p = p.double()  # [batch, head, q, k]
        m = mask.to(p.device, p.dtype)  # [batch, k]
        mass = {name: key_mass(p, keys).mean(0) for name, keys in keysets.items()}  # [head]
        mass["masked"] = torch.einsum("bhqk,bk->bhq", p, m).mean((0, 2))  # [head]
        entropy = attention_entropy(p)
        for h in range(p.shape[1]):
            r = {"layer": layer, "head": h, **{k: v[h].item() for k, v in mass.items()}}
            r["observed"] = 1 - r["masked"]
            r["masked_share"] = share
            for name in ("row", "column", "self"):
                r[f"{name}_excess"] = (r[name] - chance[name]) / (1 - chance[name])
            r["mask_preference"] = _mask_preference(r["masked"], share)
            r["entropy"] = entropy[h].item()
            rows.append(r)
    cols = [
        "layer",
        "head",
        "row",
        "column",
        "self",
        "observed",
        "masked",
        "masked_share",
        "row_excess",
        "column_excess",
        "self_excess",
        "mask_preference",
        "entropy",
    ]
    return pd.DataFrame(rows)[cols]


def classify_heads(
    scores: pd.DataFrame, threshold: float = STRUCTURE_THRESHOLD, mask_threshold: float = MASK_THRESHOLD
) -> pd.Series:
    """A label per head, a Series indexed by (layer, head): the largest of row / column /
    self excess if it reaches `threshold` ('row', 'column', 'identity'), else 'mask-aware'
    if |mask_preference| >= mask_threshold, else 'other'."""
    for col in ("layer", "head", "row_excess", "column_excess", "self_excess", "mask_preference"):
        if col not in scores:
            raise ValueError(f"scores has no column {col!r}: pass the output of head_scores")
    excess = scores[["row_excess", "column_excess", "self_excess"]].to_numpy()
    names = ("row", "column", "identity")
    labels = []
    for ex, pref in zip(excess, scores["mask_preference"]):
        best = int(ex.argmax())
        if ex[best] >= threshold:
            labels.append(names[best])
        elif abs(pref) >= mask_threshold:  # NaN (no masked keys) compares False
            labels.append("mask-aware")
        else:
            labels.append("other")
    index = pd.MultiIndex.from_frame(scores[["layer", "head"]])
    return pd.Series(labels, index=index, name="label")


def head_groups(labels: pd.Series) -> dict[str, list[tuple[int, int]]]:
    """label -> sorted [(layer, head), ...] for every label in LABELS: this run's E5 head groups."""
    if labels.index.nlevels != 2:
        raise ValueError(f"labels index has {labels.index.nlevels} levels, expected (layer, head)")
    unknown = set(labels) - set(LABELS)
    if unknown:
        raise ValueError(f"label {sorted(unknown)[0]!r} is not one of {LABELS}")
    return {
        name: sorted((int(l), int(h)) for (l, h), lab in labels.items() if lab == name) for name in LABELS
    }


def capture_probs(model, batch) -> dict[int, torch.Tensor]:
    """Every layer's attention probabilities on `batch`: {layer: [batch, head, query, key]}."""
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(model.config.num_hidden_layers)]
    with torch.no_grad():
        _, cache = run_with_cache(model, batch.tokens.to(next(model.parameters()).device), names)
    return {layer: cache[name].cpu() for layer, name in enumerate(names)}


def attention_progress(run_dir, data: DataConfig, n_matrices: int = 64, seed: int = 0) -> pd.DataFrame:
    """`head_scores` plus `step` at every saved checkpoint of a run, on one fixed batch."""
    batch = sample_eval_batch(data, n_matrices, seed)
    frames = []
    for step in saved_steps(run_dir):
        scores = head_scores(capture_probs(load_checkpoint(run_dir, step), batch), batch.mask, batch.n)
        frames.append(scores.assign(step=step))
    return pd.concat(frames, ignore_index=True)


# --- picking heads, maps over training (chapter 03) ---------------------------------------------


def pick_heads(scores: pd.DataFrame, criteria: Mapping[str, tuple[str, bool]]) -> dict[str, tuple[int, int]]:
    """name -> (layer, head): per criterion (column, largest?), in order, the best head not yet picked."""
    picked: dict[str, tuple[int, int]] = {}
    for name, (column, largest) in criteria.items():
        taken = set(picked.values())
        left = scores[[(int(l), int(h)) not in taken for l, h in zip(scores["layer"], scores["head"])]]
        if left.empty:
            break
        best = left.loc[left[column].idxmax() if largest else left[column].idxmin()]
        picked[name] = (int(best["layer"]), int(best["head"]))
    return picked


def checkpoint_maps(models: Mapping[int, object], batch) -> dict[int, torch.Tensor]:
    """step -> `[layer, head, n², n²]` batch-mean attention on `batch` (`models`: step -> model)."""
    out = {}
    for step, model in models.items():
        probs = capture_probs(model, batch)
        out[step] = torch.stack([mean_attention(probs[l]) for l in sorted(probs)])
    return out


def scores_at(progress: pd.DataFrame, step: int) -> pd.DataFrame | None:
    """The head scores at `step`, from `attention_progress` (None if that step is not saved)."""
    at = progress[progress["step"] == step]
    return at if len(at) else None


# --- E10: heads under a structured mask ------------------------------------------------------------


def e10_masks(n: int) -> dict[str, torch.Tensor]:
    """E10's `[n, n]` masks: "rows", the paper's `structured_mask`, and "columns", its transpose."""
    rows = structured_mask(n)
    return {"rows": rows, "columns": rows.T.contiguous()}


def masked_lines(mask: torch.Tensor, n: int) -> tuple[str, list[int]]:
    """The lines a structured mask (almost) fills: ("row", [rows]) if it fills any row to
    more than half, else ("column", [columns])."""
    if mask.ndim != 2:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected one [{n}, {n}] mask")
    for axis, filled in (("row", mask.float().mean(1)), ("column", mask.float().mean(0))):
        lines = [i for i in range(n) if filled[i] > 0.5]
        if lines:
            return axis, lines
    raise ValueError("the mask fills no row or column to more than half")


def line_index(axis: str, n: int) -> torch.Tensor:
    """`[n²]`: the row (axis "row") or the column (axis "column") of each grid position."""
    position = torch.arange(n * n)
    return position // n if axis == "row" else position % n


def e10_kinds(axis: str) -> dict[str, tuple[str, bool]]:
    """The paper's four E10 head kinds for a mask along `axis`: name -> (score, largest?)."""
    other = "column" if axis == "row" else "row"
    return {
        "lone observed entry": ("lone_entry", True),
        "copies (self)": ("self", True),
        f"ignores masked {axis}s": ("masked_lines", False),
        f"follows {other}s": (f"{other}_excess", True),
    }


def structured_scores(probs, mask: torch.Tensor, n: int) -> pd.DataFrame:
    """E10: `head_scores` under one fixed `[n, n]` mask, plus, over the masked queries of the
    lines it almost fills: lone_entry (mass on the observed entries of the query's line) and
    masked_lines (mass on those lines' keys). attrs: "chance" of the two, "axis".
    """
    axis, lines = masked_lines(mask, n)
    scores = head_scores(probs, mask, n)
    flat = mask.reshape(-1)
    line_of = line_index(axis, n)
    queries = torch.tensor([p for p in range(n * n) if line_of[p] in lines and flat[p]])
    in_lines = torch.isin(line_of, torch.tensor(lines))
    same_line_obs = (line_of[queries][:, None] == line_of[None]) & ~flat[None]  # [q, k]
    lone, masked = [], []
    for p in _as_layers(probs).values():  # the order of head_scores' rows
        p = p.double().mean(0)[:, queries]  # [head, q, k]
        lone.append((p * same_line_obs).sum(-1).mean(-1))
        masked.append(p[..., in_lines].sum(-1).mean(-1))
    scores["lone_entry"] = torch.cat(lone).numpy()
    scores["masked_lines"] = torch.cat(masked).numpy()
    scores.attrs["chance"] = {
        "lone_entry": same_line_obs.double().sum(-1).mean().item() / n**2,
        "masked_lines": in_lines.double().mean().item(),
    }
    scores.attrs["axis"] = axis
    return scores
