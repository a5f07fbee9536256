"""Linear probes on hidden states (E11).

A probe is a least-squares map W, no intercept, from one layer's hidden state at a
position to a target there, fitted on one set of matrices and scored on fresh ones.
Targets at position (i, j) of X:

- "row":      row i of the input, X[i, :] with its masked entries set to 0 (n-vector);
- "value":    X[i, j], scalar;
- "singular": u₁, X's first left singular vector (n-vector, the same at every position);
              svd_sign="canonical" makes its largest-|.| entry positive (a function of X),
              "raw" keeps torch's sign (the authors'; not reproducible across LAPACK builds).

Scores: test MSE, mse_zero (MSE of predicting 0) and abs_cos (mean |cos(prediction,
target)|, zero targets left out; NaN for the scalar target). Layers as `model.hidden_states`:
0 the embedding output, l the output of layer l.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ..core.config import DataConfig
from ..core.data import sample_batch
from ..core.model import eval_mode, matrix_n

TARGETS = ("row", "value", "singular")
POSITIONS = ("all", "masked", "observed")
TEST_SEED_OFFSET = 7_919  # the test matrices come from their own generator


@dataclass
class ProbeSet:
    hidden: tuple[torch.Tensor, ...]  # per layer [batch, n*n, hidden]
    x: torch.Tensor  # [batch, n, n] rounded values
    mask: torch.Tensor  # [batch, n, n] bool, True = masked

    def __post_init__(self):
        batch, n = self.x.shape[0], self.x.shape[-1]
        if self.x.ndim != 3 or self.x.shape[1] != n:
            raise ValueError(f"x has shape {tuple(self.x.shape)}, expected [batch, n, n]")
        if self.mask.shape != self.x.shape:
            raise ValueError(f"mask has shape {tuple(self.mask.shape)}, x has {tuple(self.x.shape)}")
        for layer, h in enumerate(self.hidden):
            if h.ndim != 3 or h.shape[0] != batch:
                raise ValueError(
                    f"layer {layer} hidden has shape {tuple(h.shape)}, expected [{batch}, {n * n}, hidden]"
                )
            if h.shape[1] != n * n:
                raise ValueError(
                    f"n = {n} does not match layer {layer}'s sequence length {h.shape[1]} (expected {n * n})"
                )


def probe_target(
    x: torch.Tensor, mask: torch.Tensor, target: str, svd_sign: str = "canonical"
) -> torch.Tensor:
    """`[batch, n, n]` -> `[batch, n*n, dim]` target of every position (see module doc)."""
    batch, n = x.shape[0], x.shape[-1]
    rows = torch.arange(n * n) // n  # [seq] row of each position
    if target == "row":
        observed = x.masked_fill(mask, 0.0)  # [batch, n, n]
        return observed[:, rows, :]  # [batch, seq, n]
    if target == "value":
        return x.reshape(batch, n * n, 1)  # [batch, seq, 1]
    if target == "singular":
        u = torch.linalg.svd(x.double())[0][..., 0]  # [batch, n]
        if svd_sign == "canonical":
            top = u.abs().argmax(-1, keepdim=True)
            u = u * torch.sign(u.gather(-1, top))
        elif svd_sign != "raw":
            raise ValueError(f"svd_sign {svd_sign!r} is not 'canonical' or 'raw'")
        return u.float()[:, None, :].expand(batch, n * n, n)  # [batch, seq, n]
    raise ValueError(f"target {target!r} is not one of {TARGETS}")


def fit_probe(h: torch.Tensor, y: torch.Tensor, method: str | None = None) -> torch.Tensor:
    """Least squares, no intercept: `h [N, hidden]`, `y [N, dim]` -> `W [hidden, dim]`, float64
    on h's device, safe for rank-deficient h. method: "gelsd" (CPU only; the CPU default) or
    "pinv" (elsewhere); both give the same W to float64 rounding."""
    if h.shape[0] != y.shape[0]:
        raise ValueError(f"h has {h.shape[0]} rows, y has {y.shape[0]}")
    method = method or ("gelsd" if h.device.type == "cpu" else "pinv")
    h, y = h.double(), y.double().to(h.device)
    if method == "gelsd":
        return torch.linalg.lstsq(h, y, driver="gelsd").solution
    if method == "pinv":
        return torch.linalg.pinv(h) @ y
    raise ValueError(f"method {method!r} is not 'gelsd' or 'pinv'")


def probe_metrics(h: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> dict[str, float]:
    """MSE, MSE of predicting 0, and mean |cosine| (NaN if dim = 1) of `h @ w` against y."""
    pred, y = h.double() @ w, y.double().to(h.device)  # [N, dim]
    cos = float("nan")
    if y.shape[1] > 1:
        keep = y.norm(dim=1) > 0  # a zero target has no direction
        cos = torch.nn.functional.cosine_similarity(pred[keep], y[keep], dim=1).abs().mean().item()
    return {"mse": ((pred - y) ** 2).mean().item(), "mse_zero": (y**2).mean().item(), "abs_cos": cos}


def _where(mask: torch.Tensor, positions: str) -> torch.Tensor:
    """`[batch, n, n]` -> `[batch*n*n]` bool selecting the positions."""
    flat = mask.reshape(-1)
    if positions == "all":
        return torch.ones_like(flat)
    if positions == "masked":
        return flat
    if positions == "observed":
        return ~flat
    raise ValueError(f"positions {positions!r} is not one of {POSITIONS}")


def probe_layers(
    fit: ProbeSet,
    test: ProbeSet,
    targets=TARGETS,
    positions=POSITIONS,
    fit_on: str = "all",
    *,
    svd_sign: str = "canonical",
) -> pd.DataFrame:
    """Fit one probe per (layer, target) on `fit` at the `fit_on` positions ("all", the
    authors'; "masked"; "observed"), score it on `test` at each of `positions`. Tidy frame:
    layer, target, positions, mse, mse_zero, abs_cos, n_fit, n_test."""
    if len(fit.hidden) != len(test.hidden):
        raise ValueError(f"fit has {len(fit.hidden)} layers, test has {len(test.hidden)}")
    if fit.x.shape[-1] != test.x.shape[-1]:
        raise ValueError(f"fit n = {fit.x.shape[-1]} differs from test n = {test.x.shape[-1]}")
    keep_fit = _where(fit.mask, fit_on)
    rows = []
    for target in targets:
        y_fit = probe_target(fit.x, fit.mask, target, svd_sign).flatten(0, 1)[keep_fit]  # [N, dim]
        y_test = probe_target(test.x, test.mask, target, svd_sign).flatten(0, 1)  # [M, dim]
        for layer, (h_fit, h_test) in enumerate(zip(fit.hidden, test.hidden)):
            w = fit_probe(h_fit.flatten(0, 1)[keep_fit.to(h_fit.device)], y_fit.to(h_fit.device))
            h_test, y_on = h_test.flatten(0, 1), y_test.to(h_test.device)
            for where in positions:
                keep = _where(test.mask, where).to(h_test.device)
                rows.append(
                    {
                        "layer": layer,
                        "target": target,
                        "positions": where,
                        **probe_metrics(h_test[keep], y_on[keep], w),
                        "n_fit": int(keep_fit.sum()),
                        "n_test": int(keep.sum()),
                    }
                )
    return pd.DataFrame(rows)


def collect_hidden(model, tokens: torch.Tensor, chunk: int = 256) -> tuple[torch.Tensor, ...]:
    """`model.hidden_states` of `tokens [batch, seq]` in chunks: per layer `[batch, seq, hidden]`
    float32 on the model's device (4·batch·seq·hidden bytes a layer)."""
    with eval_mode(model):
        parts = [model.hidden_states(tokens[i : i + chunk]) for i in range(0, len(tokens), chunk)]
    return tuple(torch.cat([p[layer] for p in parts]).float() for layer in range(len(parts[0])))


def probe_sets(
    model, data: DataConfig, n_fit: int = 2048, n_test: int = 256, seed: int = 0, *, chunk: int = 256
) -> tuple[ProbeSet, ProbeSet]:
    """(fit, test): fresh matrices from two seeded generators, with the model's hidden states."""
    model_n = matrix_n(model)
    if model_n != data.n:
        raise ValueError(f"data n = {data.n} does not match the model's n = {model_n}")
    device = next(model.parameters()).device
    sets = []
    for size, s in ((n_fit, seed), (n_test, seed + TEST_SEED_OFFSET)):
        gen = torch.Generator().manual_seed(s)
        b = sample_batch(size, data.n, data.rank, data.p_mask, gen, dist=data.dist)
        sets.append(ProbeSet(collect_hidden(model, b.tokens.to(device), chunk), b.x, b.mask))
    return sets[0], sets[1]


def best_probe_layers(probes: pd.DataFrame) -> pd.DataFrame:
    """Per target, the layer with the lowest mse / mse_zero (rel) at masked positions (ties: shallower)."""
    masked = probes[probes.positions == "masked"].assign(rel=lambda d: d.mse / d.mse_zero)
    return masked.sort_values(["rel", "layer"], kind="stable").groupby("target").head(1).set_index("target")
