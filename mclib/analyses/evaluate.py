"""A model on fresh matrices: its losses, with hooks (`mclib.core.hooks`: E3-E7, or any
activation), with activation patching (E8); and the runs of one task side by side.

    evaluate(model, profile.data, 256, seed=0)                                # L, L_obs, L_mask, mask_value
    evaluate(model, profile.data, 512, seed=0, fill_value=0.44)               # + L'_mask (E2)
    evaluate(model, profile.data, 256, seed=0,
             hooks=ablation_hooks(model, heads, mode="uniform"))        # E3-E5
    activation_patching(model, profile.data, 256, seed=0, layers="last")      # E8
    compare_runs({"fp32": run_a, "bf16": run_b})                        # runs of one task side by side

The same seed gives the same batch, so calls that differ only in the intervention compare
on it. Eval mode (restored afterwards), no gradients, fp32; errors `pooled` over matrices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ..core.checkpoints import load_checkpoint, saved_steps
from ..core.config import DataConfig
from ..core.data import Batch, make_batch, random_mask, sample_matrices
from ..core.hooks import Hook, run_with_cache, run_with_hooks
from ..core.metrics import find_drop, losses, mse_to, plateau_stats, window_mean
from ..core.model import eval_mode
from ..core.precision import autocast, emulated_tf32
from ..core.runs import load_metrics, run_profile
from .attention import patching_hooks, z_names
from .interventions import l_prime_mask


def pooled(values: np.ndarray, where: np.ndarray) -> tuple[float, float]:
    """Pooled mean of `values` over `where` (`[batch, n, n]`), and its standard error with
    matrices as the units: R = Σ s_i / Σ c_i, se² = Σ (s_i − R c_i)² / (b (b−1) c̄²)."""
    return pooled_sums(
        (values * where).reshape(len(values), -1).sum(1), where.reshape(len(values), -1).sum(1).astype(float)
    )


def pooled_sums(s: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    """`pooled` from the per-matrix sums s_i `[batch]` and counts c_i `[batch]`."""
    c = np.asarray(c, dtype=float)
    if c.sum() == 0:
        return float("nan"), float("nan")
    r = s.sum() / c.sum()
    b = len(s)
    se = np.sqrt(((s - r * c) ** 2).sum() / (b * (b - 1))) / c.mean() if b > 1 else float("nan")
    return float(r), float(se)


def sample_eval_batch(
    data: DataConfig,
    n_matrices: int,
    seed: int,
    dist: str | None = None,
    mask: torch.Tensor | None = None,
    *,
    fill_value: float | None = None,
) -> Batch:
    """Fresh matrices of `data` (a DataConfig) from `torch.Generator().manual_seed(seed)`.
    dist: None = data.dist. mask: None = random with data.p_mask; `[n, n]` bool = that mask
    for every matrix (E10); `[n_matrices, n, n]` = one per matrix. fill_value: see make_batch."""
    if not isinstance(data, DataConfig):
        raise TypeError(f"data must be a DataConfig (a profile's .data), not {type(data).__name__}")
    gen = torch.Generator().manual_seed(seed)
    x = sample_matrices(n_matrices, data.n, data.rank, gen, dist or data.dist)  # [batch, n, n]
    if mask is None:
        mask = random_mask(n_matrices, data.n, data.p_mask, gen)
    elif mask.shape not in ((data.n, data.n), (n_matrices, data.n, data.n)):
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}, expected [{data.n}, {data.n}] or [batch, {data.n}, "
            f"{data.n}]"
        )
    return make_batch(x, mask.bool(), fill_value)


def predict(model, batch: Batch, hooks: Sequence[Hook] = ()) -> torch.Tensor:
    """`[batch, n, n]` predictions (fp32, eval mode, no grad). hooks: (name, fn) pairs on
    the model's hook points for this pass (`mclib.core.hooks`)."""
    device = next(model.parameters()).device
    with eval_mode(model):
        pred = run_with_hooks(model, batch.tokens.to(device), hooks)
    return pred.float().cpu().view_as(batch.x)


def evaluate(
    model,
    data: DataConfig,
    n_matrices: int,
    seed: int,
    dist: str | None = None,
    *,
    mask: torch.Tensor | None = None,
    fill_value: float | None = None,
    hooks: Sequence[Hook] = (),
) -> dict[str, float]:
    """L, L_obs, L_mask, mask_value on fresh matrices (and L'_mask when fill_value is given).
    Arguments as in `sample_eval_batch` and `predict`."""
    batch = sample_eval_batch(data, n_matrices, seed, dist, mask, fill_value=fill_value)
    pred = predict(model, batch, hooks)
    out = {k: v.item() for k, v in losses(pred, batch.x, batch.mask).items()}
    if fill_value is not None:
        out["L'_mask"] = l_prime_mask(pred, batch, fill_value)
    return out


def activation_patching(
    model,
    data: DataConfig,
    n_matrices: int,
    seed: int,
    layers: Sequence[int] | str = "all",
    *,
    errors: bool = False,
) -> dict[str, float]:
    """E8: run X, keep every layer's z, run −X (same mask) with the z of `layers` written in:
    "all" (the paper's text), "last" (the authors' code) or layer numbers ([]: plain −X).
    Returns MSE of the output to X and to −X at masked and observed entries (+ "_se" with `errors`)."""
    n_layers = model.config.num_hidden_layers
    if isinstance(layers, str):
        if layers not in ("all", "last"):
            raise ValueError(f"layers {layers!r} is not 'all', 'last' or a list of layer numbers")
        layers = list(range(n_layers)) if layers == "all" else [n_layers - 1]
    clean = sample_eval_batch(data, n_matrices, seed)
    corrupt = make_batch(-clean.x, clean.mask)  # −X is on the same 0.01 grid; same mask

    device = next(model.parameters()).device
    with eval_mode(model):
        _, cache = run_with_cache(
            model, clean.tokens.to(device), names=z_names(model)
        )  # [batch, head, query, d_head]
        f = run_with_hooks(model, corrupt.tokens.to(device), patching_hooks(model, cache, layers))
    f = f.float().cpu().view_as(clean.x)
    mask = clean.mask
    out = {
        "masked_vs_X": mse_to(f, clean.x, mask),
        "masked_vs_negX": mse_to(f, corrupt.x, mask),
        "observed_vs_X": mse_to(f, clean.x, ~mask),
        "observed_vs_negX": mse_to(f, corrupt.x, ~mask),
    }
    if errors:
        for key, target, where in (
            ("masked_vs_X", clean.x, mask),
            ("masked_vs_negX", corrupt.x, mask),
            ("observed_vs_X", clean.x, ~mask),
            ("observed_vs_negX", corrupt.x, ~mask),
        ):
            out[f"{key}_se"] = pooled(((f - target.float()) ** 2).numpy(), where.numpy().astype(bool))[1]
    return out


def compare_runs(
    runs: dict,
    after: Sequence[int] = (500, 1000),
    n_matrices: int = 4096,
    seed: int = 0,
    precisions: Sequence[str] = ("fp32",),
) -> pd.DataFrame:
    """Runs of one task side by side (`runs`: label -> run folder), one row each: steps
    trained, the drop (`find_drop`, NaN if none), plateau and final training L_mask
    (`plateau_stats`), training L_mask k steps after the drop for k in `after` (NaN where the
    run stopped sooner), and the last checkpoint's L_mask on the same `n_matrices` fresh
    matrices in each of `precisions` ("fp32", "bf16" autocast, "tf32" emulated off a GPU),
    which tells a worse model from a less precise forward pass."""
    rows = {}
    for label, folder in runs.items():
        profile = run_profile(folder)
        m = load_metrics(folder)
        last = int(m["step"].max())
        drop = find_drop(m, profile.data.rank)
        stats = plateau_stats(m, drop)
        row = {
            "steps": last,
            "drop": math.nan if drop is None else drop,
            "plateau_L_mask": stats["plateau_L_mask"],
        }
        for k in after:
            ok = drop is not None and drop + k <= last
            row[f"L_mask_drop+{k}"] = float(window_mean(m, drop + k)["L_mask"]) if ok else math.nan
        row["final_L_mask"] = stats["final_L_mask"]
        step = saved_steps(folder)[-1]
        model = load_checkpoint(folder, step, profile.model.attention)
        row["checkpoint_step"] = step
        batch = sample_eval_batch(profile.data, n_matrices, seed)
        for precision in precisions:
            device = next(model.parameters()).device
            with autocast(device, precision), emulated_tf32(device, precision):  # the forward pass only
                pred = predict(model, batch)
            row[f"checkpoint_L_mask_{precision}"] = losses(pred, batch.x, batch.mask)["L_mask"].item()
        rows[label] = row
    return pd.DataFrame.from_dict(rows, orient="index")


PATCH_READINGS = {"none": [], "last layer": "last", "all layers": "all"}


def patching_table(model, data, n_matrices: int, seed: int) -> pd.DataFrame:
    """E8 under both readings, and the plain −X run (no layer patched) as the reference.
    One row per reading: MSE of the output to X and to −X at masked and observed entries,
    and their standard errors over matrices (`_se`)."""
    return pd.DataFrame(
        [
            {
                "patched": reading,
                **activation_patching(model, data, n_matrices, seed, layers=layers, errors=True),
            }
            for reading, layers in PATCH_READINGS.items()
        ]
    )
