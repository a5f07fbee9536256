"""Classical matrix completion: the paper's convex baselines (E16, E17) and two stronger ones.

Every public function takes a batch X `[batch, n, n]` and a boolean mask `[batch, n, n]`
(True = masked, i.e. in Ωᶜ) and returns the completed batch `[batch, n, n]` like X (numpy or
torch with X's dtype and device), computed in float64. Masked values of X are never read (NaN is fine).

    method                   problem, per matrix                               observed entries
    nuclear_norm_complete    min ‖U‖_*  s.t. U = X on Ω              (E16)     exact (copied back)
    regularised_nuclear_norm min (1/|Ω|) Σ_Ω (U−X)² + λ‖U‖_*         (E17)     fitted, not copied
    soft_impute              the E17 problem by SVD soft-thresholding,
                             optionally truncated to a known rank              keep_observed=False
    als_complete             min Σ_Ω (X − ABᵀ)² + ridge(‖A‖²+‖B‖²), rank r     keep_observed=False

The CVXPY programs use Clarabel (interior point, solved to ~1e-8, so the answer is the
problem's); solver="SCS" is cvxpy's default, likely the authors'. Each program is compiled
once per process and n with cvxpy Parameters (DPP) and re-solved per matrix.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
from tqdm.auto import tqdm

SOLVER = "CLARABEL"


# ----------------------------------------------------------------------------- input checks


def _to_numpy(x, mask) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 X `[b, n, n]` with masked entries zeroed, and bool mask `[b, n, n]`."""
    xs = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    ms = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
    if xs.shape != ms.shape:
        raise ValueError(f"x has shape {xs.shape} but mask has shape {ms.shape}")
    if xs.ndim != 3 or xs.shape[1] != xs.shape[2]:
        raise ValueError(f"x must be a batch of square matrices [batch, n, n], got shape {xs.shape}")
    if xs.shape[0] == 0:
        raise ValueError("x is an empty batch")
    if ms.dtype != np.bool_:
        # A 0/1 float mask is ambiguous: the authors' code uses 1 = observed, ours True = masked.
        raise ValueError(f"mask must be boolean with True = masked, got dtype {ms.dtype}")
    n_obs = (~ms).sum(axis=(1, 2))
    if (n_obs == 0).any():
        raise ValueError(
            f"matrix {int(np.argmax(n_obs == 0))} has every entry masked: nothing to complete from"
        )
    xs = np.where(ms, 0.0, xs.astype(np.float64))  # masked values are never used
    if not np.isfinite(xs).all():
        raise ValueError("x has a NaN or infinite value at an observed entry")
    return xs, ms


def _like(out: np.ndarray, x):
    """Return `out` as the same kind of array as the input X."""
    if isinstance(x, torch.Tensor):
        return torch.from_numpy(out).to(
            device=x.device, dtype=x.dtype if x.is_floating_point() else torch.float32
        )
    return out


def _check_lam(lam: float) -> float:
    if not lam > 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    return float(lam)


def _check_rank(rank: int, n: int) -> int:
    if not 1 <= rank <= n:
        raise ValueError(f"rank {rank} must be between 1 and n = {n}")
    return int(rank)


# ----------------------------------------------------------------------------- nuclear norm


def nuclear_norm(x):
    """`[batch]` nuclear norms (sum of singular values) of a batch `[batch, n, m]`, numpy or torch."""
    if isinstance(x, torch.Tensor):
        return torch.linalg.matrix_norm(x, ord="nuc", dim=(-2, -1))
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"x must be a (batch of) matrices, got shape {x.shape}")
    return np.linalg.svd(x, compute_uv=False).sum(-1)


# ----------------------------------------------------------------------------- CVXPY programs


@functools.cache
def _constrained_program(n: int):
    """min ‖U‖_* s.t. W∘U = Y, W the 0/1 observed indicator, Y = W∘X (Parameters; W∘X itself
    would not be DPP). One program serves every mask."""
    import cvxpy as cp  # noqa: PLC0415 - importing mclib should not pay for cvxpy

    u = cp.Variable((n, n))
    w, y = cp.Parameter((n, n)), cp.Parameter((n, n))
    return cp.Problem(cp.Minimize(cp.normNuc(u)), [cp.multiply(w, u) == y]), u, w, y


@functools.cache
def _regularised_program(n: int):
    """min ‖W∘U − Y‖² + λ‖U‖_*, W = obs/√|Ω|, Y = W∘X: the E17 objective, 1/|Ω| folded into W
    to stay DPP; λ is a Parameter, so every λ reuses the compiled program."""
    import cvxpy as cp  # noqa: PLC0415 - importing mclib should not pay for cvxpy

    u = cp.Variable((n, n))
    w, y = cp.Parameter((n, n)), cp.Parameter((n, n))
    lam = cp.Parameter(nonneg=True)
    return cp.Problem(cp.Minimize(cp.sum_squares(cp.multiply(w, u) - y) + lam * cp.normNuc(u))), u, w, y, lam


def _solve(prob, u, solver: str) -> np.ndarray:
    prob.solve(solver=solver)
    if prob.status == "optimal_inaccurate":
        warnings.warn(f"{solver} returned an inaccurate solution", RuntimeWarning, stacklevel=3)
    elif prob.status != "optimal":
        raise RuntimeError(f"{solver} returned status {prob.status!r}")
    return u.value


def constrained_one(x: np.ndarray, mask: np.ndarray, solver: str = SOLVER) -> np.ndarray:
    """E16 for one matrix: x `[n, n]` float64 (masked entries 0), mask `[n, n]` bool → U `[n, n]`."""
    prob, u, w, y = _constrained_program(x.shape[0])
    obs = ~mask
    w.value, y.value = obs.astype(np.float64), np.where(obs, x, 0.0)
    return _solve(prob, u, solver)


def regularised_one(x: np.ndarray, mask: np.ndarray, lam: float, solver: str = SOLVER) -> np.ndarray:
    """E17 for one matrix: x `[n, n]` float64, mask `[n, n]` bool → U `[n, n]`."""
    prob, u, w, y, lam_p = _regularised_program(x.shape[0])
    obs = ~mask
    w.value = obs / np.sqrt(obs.sum())  # (1/|Ω|) Σ_Ω (U−X)² = ‖W∘U − W∘X‖²
    y.value, lam_p.value = w.value * x, lam
    return _solve(prob, u, solver)


# ----------------------------------------------------------------------------- batch driver


def _run_chunk(method: Callable, xs: np.ndarray, ms: np.ndarray, kwargs: dict) -> np.ndarray:
    # Module-level so that worker processes can unpickle it; `[c, n, n]` → `[c, n, n]`.
    return np.stack([method(xi, mi, **kwargs) for xi, mi in zip(xs, ms)])


def complete_batch(
    method: Callable,
    x,
    mask,
    workers: int = 1,
    progress: bool = True,
    *,
    chunk: int = 16,
    desc: str | None = None,
    **kwargs,
):
    """Run a per-matrix `method(x_i [n,n], mask_i [n,n], **kwargs) -> [n,n]` over a batch.

    x, mask `[batch, n, n]` (mask True = masked) → `[batch, n, n]` like x. `method` sees
    float64 numpy with masked entries zeroed. workers > 1: a pool of forked processes
    (cvxpy's work is largely Python), `chunk` matrices per task; `method` must then be
    module-level (it is pickled).
    """
    xs, ms = _to_numpy(x, mask)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    bar = tqdm(total=len(xs), desc=desc or getattr(method, "__name__", "complete"), disable=not progress)
    starts = range(0, len(xs), chunk)
    if workers == 1:
        parts = []
        for s in starts:
            parts.append(_run_chunk(method, xs[s : s + chunk], ms[s : s + chunk], kwargs))
            bar.update(len(parts[-1]))
    else:
        # fork: workers inherit the imported modules (and any compiled program) for free.

        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else None)
        with ProcessPoolExecutor(max_workers=min(workers, os.cpu_count() or 1), mp_context=ctx) as pool:
            futures = [
                pool.submit(_run_chunk, method, xs[s : s + chunk], ms[s : s + chunk], kwargs) for s in starts
            ]
            parts = []
            for f in futures:  # in order, so the output lines up with the input
                parts.append(f.result())
                bar.update(len(parts[-1]))
    bar.close()
    return _like(np.concatenate(parts), x)


# ----------------------------------------------------------------------------- E16, E17


def nuclear_norm_complete(x, mask, solver: str = SOLVER, workers: int = 1, progress: bool = False):
    """E16: per matrix, min ‖U‖_* subject to U = X on Ω (Candès & Recht).
    x, mask `[batch, n, n]` → U like x; observed entries copied back, so L_obs = 0 exactly."""
    xs, ms = _to_numpy(x, mask)
    u = complete_batch(
        constrained_one, xs, ms, workers=workers, progress=progress, desc="nuclear norm", solver=solver
    )
    return _like(np.where(ms, u, xs), x)


def regularised_nuclear_norm(
    x, mask, lam: float, solver: str = SOLVER, workers: int = 1, *, progress: bool = False
):
    """E17: per matrix, min (1/|Ω|) Σ_Ω (U − X)² + λ‖U‖_* (the authors' objective).
    x, mask `[batch, n, n]` → U like x. Observed entries are fitted, not kept (E17's L_obs)."""
    lam = _check_lam(lam)
    return complete_batch(
        regularised_one,
        x,
        mask,
        workers=workers,
        progress=progress,
        desc=f"regularised λ={lam:g}",
        lam=lam,
        solver=solver,
    )


# ----------------------------------------------------------------------------- vectorised methods


def soft_impute(
    x,
    mask,
    lam: float,
    rank: int | None = None,
    decay: float = 0.95,
    *,
    max_iter: int = 3000,
    tol: float = 1e-8,
    keep_observed: bool = False,
):
    """Soft-impute (Mazumder, Hastie & Tibshirani 2010), vectorised over the batch.

    Solves the E17 problem (same λ as `regularised_nuclear_norm`) by the proximal step
    U ← S_τ(P_Ω(X) + P_Ωᶜ(U)), τ = λ|Ω|/2 per matrix, S_τ soft-thresholding the singular
    values, with continuation (τ starts at σ₁(P_Ω X), shrinks by `decay` per step) and,
    when convex (rank=None), FISTA momentum. `rank` = r keeps only the r largest singular
    values (non-convex, no momentum; with tiny λ, hard-impute).

    x, mask `[batch, n, n]` → `[batch, n, n]` like x. Stops when τ is reached and every
    matrix's ‖ΔU‖²/‖U‖² is below `tol`; warns if `max_iter` comes first. keep_observed:
    copy X's observed entries into the output (default: fitted, as in E17).
    """
    lam = _check_lam(lam)
    xs, ms = _to_numpy(x, mask)
    if rank is not None:
        rank = _check_rank(rank, xs.shape[-1])
    if not 0 <= decay < 1:
        raise ValueError(f"decay must be in [0, 1), got {decay}")
    obs = ~ms
    tau = lam * obs.sum(axis=(1, 2))[:, None] / 2  # [b, 1]: threshold of ½‖P_Ω(X−U)‖² + τ‖U‖_*
    tau0 = np.linalg.svd(xs, compute_uv=False)[:, :1]  # [b, 1]: at τ ≥ σ₁(P_Ω X) the answer is 0
    u = prev = np.zeros_like(xs)  # [b, n, n]
    t = 1.0
    for k in range(max_iter):
        tau_k = np.maximum(tau, tau0 * decay**k)
        y = u
        if rank is None:  # FISTA extrapolation
            t, t_old = (1 + np.sqrt(1 + 4 * t * t)) / 2, t
            y = u + (t_old - 1) / t * (u - prev)
        uu, s, vt = np.linalg.svd(np.where(obs, xs, y))  # [b,n,n], [b,n], [b,n,n]
        s = np.maximum(s - tau_k, 0.0)
        if rank is not None:
            s[:, rank:] = 0.0
        prev, u = u, (uu * s[:, None, :]) @ vt
        change = ((u - prev) ** 2).sum(axis=(1, 2)) / np.maximum((u**2).sum(axis=(1, 2)), 1e-300)
        if (tau_k == tau).all() and change.max() < tol:
            break
    else:
        warnings.warn(
            f"soft_impute: not converged after {max_iter} iterations "
            f"(max relative change {change.max():.2e})",
            RuntimeWarning,
            stacklevel=2,
        )
    return _like(np.where(ms, u, xs) if keep_observed else u, x)


def als_complete(
    x,
    mask,
    rank: int,
    ridge: float = 1e-4,
    n_iter: int = 300,
    *,
    init: str = "spectral",
    seed: int = 0,
    ridge_start: float = 1.0,
    decay: float = 0.95,
    keep_observed: bool = False,
):
    """Alternating least squares with a known rank, vectorised over the batch (and rows).

    Per matrix, min over A, B `[n, r]` of Σ_Ω (X − ABᵀ)² + ridge(‖A‖² + ‖B‖²), solving
    exactly for every row of A (B fixed), then of B, `n_iter` times; the ridge is an E17
    penalty λ = 2·ridge/|Ω|. Non-convex, hence continuation (the ridge shrinks from
    `ridge_start` by `decay` per step down to `ridge`) and init "spectral" (B from the
    top-r SVD of the rescaled zero-filled X; deterministic) or "random" (seeded Gaussian).
    Matrices with a row or column of < r observed entries are ill-posed and dominate the
    pooled L_mask.

    x, mask `[batch, n, n]` → `[batch, n, n]` like x. keep_observed: copy X's observed
    entries into the output (default: fitted).
    """
    xs, ms = _to_numpy(x, mask)
    b, n, _ = xs.shape
    rank = _check_rank(rank, n)
    if not ridge > 0:
        raise ValueError(f"ridge must be > 0, got {ridge}")
    w = (~ms).astype(np.float64)  # [b, n, n] observed indicator
    if init == "spectral":
        frac = w.mean(axis=(1, 2))[:, None, None]  # observed fraction, rescales the zero-fill
        _, s, vt = np.linalg.svd(xs / frac)
        fac_b = vt[:, :rank].transpose(0, 2, 1) * np.sqrt(s[:, None, :rank])  # [b, n, r]
    elif init == "random":
        fac_b = np.random.default_rng(seed).standard_normal((b, n, rank)) / np.sqrt(rank)
    else:
        raise ValueError(f"init must be 'spectral' or 'random', got {init!r}")

    def rows(wm, xm, other, rg):
        # For each matrix and row i: argmin_a Σ_j w_ij (x_ij − a·o_j)² + rg‖a‖².
        gram = np.einsum("bij,bjk,bjl->bikl", wm, other, other) + rg * np.eye(rank)  # [b, n, r, r]
        rhs = np.einsum("bij,bjk->bik", wm * xm, other)  # [b, n, r]
        return np.linalg.solve(gram, rhs[..., None])[..., 0]  # [b, n, r]

    wt, xt = w.transpose(0, 2, 1), xs.transpose(0, 2, 1)
    for k in range(n_iter):
        rg = max(ridge, ridge_start * decay**k)
        fac_a = rows(w, xs, fac_b, rg)
        fac_b = rows(wt, xt, fac_a, rg)
    u = fac_a @ fac_b.transpose(0, 2, 1)
    return _like(np.where(ms, u, xs) if keep_observed else u, x)
