"""Token and position embeddings (E12–E14), and their progress across checkpoints.

Token embeddings: the rows of the values -1.50 … 1.50 (ids 851 … 1151). E12: ℓ2 norm
against value, PCA(2); E13: earlier checkpoints projected onto the final one's PCA(2).
Position embeddings: the first n² rows. E14: t-SNE, ℓ2 norms, and the silhouette of the
rows grouped by column (and, as a control, by row) as a number per checkpoint.

`embedding_progress(run_dir)` gathers the scores of every saved checkpoint;
`token_projections(run_dir, steps)` gives E13's coordinates at chosen checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sklearn.decomposition import PCA
from sklearn.manifold import TSNE
from sklearn.metrics import silhouette_score

from ..core.checkpoints import checkpoint_embeddings, saved_steps
from ..core.data import tokenize
from ..core.model import matrix_n

VALUE_LO, VALUE_HI = -1.5, 1.5
# t-SNE's perplexity is the effective number of neighbours; sklearn's default 30 (the
# authors') is most of the 49 points. 7 = one column's worth of neighbours.
TSNE_PERPLEXITY = 7.0
# Cosine: the silhouette should measure how positions are arranged in direction,
# not the slow drift of their norms (E14's dip in the middle row).
SILHOUETTE_METRIC = "cosine"


# ---- token embeddings (E12, E13) -------------------------------------------------


def value_range(rank: int) -> tuple[float, float]:
    """(lo, hi) = ±min(rank, 1.5): the token values the task can produce (|x| ≤ rank)."""
    return max(VALUE_LO, -float(rank)), min(VALUE_HI, float(rank))


def token_values(lo: float = VALUE_LO, hi: float = VALUE_HI) -> np.ndarray:
    """The values lo, lo + 0.01, …, hi (301 of them by default)."""
    k_lo, k_hi = round(lo * 100), round(hi * 100)
    if k_lo > k_hi:
        raise ValueError(f"lo = {lo:g} is above hi = {hi:g}")
    return np.arange(k_lo, k_hi + 1) / 100


def token_ids(lo: float = VALUE_LO, hi: float = VALUE_HI) -> torch.Tensor:
    """Token ids of `token_values` (851 … 1151 by default)."""
    return tokenize(torch.tensor(token_values(lo, hi)))


def _table(model, which: str) -> torch.Tensor:
    """The "word" or "position" embedding table of a model, or of a checkpoint's tables
    (`mclib.core.checkpoints.checkpoint_embeddings`, read without building the model)."""
    if isinstance(model, dict):
        return model[which]
    return getattr(model.bert.embeddings, f"{which}_embeddings").weight.detach().cpu()


def token_rows(model, lo: float = VALUE_LO, hi: float = VALUE_HI) -> np.ndarray:
    """`[values, hidden]` word-embedding rows of the values lo … hi (model or `checkpoint_embeddings`)."""
    return _table(model, "word")[token_ids(lo, hi)].double().numpy()


def token_norms(model, lo: float = VALUE_LO, hi: float = VALUE_HI) -> pd.DataFrame:
    """E12a: value, id, ℓ2 norm of its embedding row."""
    return pd.DataFrame(
        {
            "value": token_values(lo, hi),
            "id": token_ids(lo, hi).numpy(),
            "norm": np.linalg.norm(token_rows(model, lo, hi), axis=1),
        }
    )


def norm_symmetry(values: np.ndarray, norms: np.ndarray) -> float:
    """Pearson correlation of norm(x) with norm(-x) over x > 0 (1 = symmetric about 0)."""
    index = {round(v * 100): i for i, v in enumerate(values)}
    pairs = [(index[k], index[-k]) for k in index if k > 0 and -k in index]
    if len(pairs) < 2:
        raise ValueError("values hold fewer than 2 pairs (x, -x)")
    a, b = np.array(pairs).T
    return float(np.corrcoef(norms[a], norms[b])[0, 1])


def fit_pca(rows: np.ndarray) -> PCA:
    """PCA(2) of `[values, hidden]` rows, full (deterministic) SVD solver."""
    return PCA(n_components=2, svd_solver="full").fit(rows)


def project(rows: np.ndarray, pca: PCA, centred: bool = False) -> np.ndarray:
    """`[values, hidden]` -> `[values, 2]` on the PCA's components; centred=False is the
    authors' E13 (no mean removed), True removes the rows' own mean first."""
    if rows.shape[1] != pca.components_.shape[1]:
        raise ValueError(
            f"rows have hidden size {rows.shape[1]}, the PCA was fitted on {pca.components_.shape[1]}"
        )
    if centred:
        rows = rows - rows.mean(0)
    return rows @ pca.components_.T


def alignment(proj: np.ndarray, final_proj: np.ndarray) -> float:
    """Mean over the two components of cos(coordinates, final coordinates): scale-free;
    with centred projections, the Pearson correlation along each final axis."""
    if proj.shape != final_proj.shape:
        raise ValueError(f"projection shapes differ: {proj.shape} vs {final_proj.shape}")
    num = (proj * final_proj).sum(0)
    den = np.linalg.norm(proj, axis=0) * np.linalg.norm(final_proj, axis=0)
    return float(np.mean(num / np.where(den > 0, den, np.nan)))


def captured_variance(rows: np.ndarray, pca: PCA) -> float:
    """Fraction of the rows' (centred) variance that lies in the PCA's plane."""
    centred = rows - rows.mean(0)
    total = (centred**2).sum()
    return float(((centred @ pca.components_.T) ** 2).sum() / total) if total > 0 else float("nan")


def component_tracks(proj: np.ndarray, values: np.ndarray) -> pd.DataFrame:
    """|Pearson r| of each coordinate with x, |x| and sign(x): E12's "one component
    tracks |x|, the other the sign" as numbers."""
    feats = {"x": values, "abs_x": np.abs(values), "sign_x": np.sign(values)}
    return pd.DataFrame(
        [
            {"component": k + 1, **{f: abs(np.corrcoef(proj[:, k], v)[0, 1]) for f, v in feats.items()}}
            for k in range(proj.shape[1])
        ]
    )


# ---- position embeddings (E14) ---------------------------------------------------


def position_rows(model, n: int | None = None) -> np.ndarray:
    """`[n², hidden]`: the first n² rows of the position table (the positions used); model: a
    model or `checkpoint_embeddings`."""
    n = n or (model["n"] if isinstance(model, dict) else matrix_n(model))
    table = _table(model, "position")
    if table.shape[0] < n * n:
        raise ValueError(f"n = {n} needs {n * n} positions, the table has {table.shape[0]}")
    return table[: n * n].double().numpy()


def position_frame(n: int) -> pd.DataFrame:
    pos = np.arange(n * n)
    return pd.DataFrame({"position": pos, "row": pos // n, "column": pos % n})


def position_norms(rows: np.ndarray, n: int) -> pd.DataFrame:
    """E14: position, row, column, ℓ2 norm."""
    _check_positions(rows, n)
    return position_frame(n).assign(norm=np.linalg.norm(rows, axis=1))


def position_tsne(
    rows: np.ndarray, n: int, seed: int = 0, perplexity: float = TSNE_PERPLEXITY
) -> pd.DataFrame:
    """E14: 2-D t-SNE of the n² position rows: position, row, column, x, y (colour by column)."""
    _check_positions(rows, n)
    xy = TSNE(n_components=2, perplexity=perplexity, random_state=seed, init="pca").fit_transform(rows)
    return position_frame(n).assign(x=xy[:, 0], y=xy[:, 1])


def position_silhouette(
    rows: np.ndarray, n: int, by: str = "column", metric: str = SILHOUETTE_METRIC
) -> float:
    """Silhouette of the n² position rows grouped by column (or row): near 1 for tight
    separate groups, near 0 when the grouping says nothing about where the rows are."""
    _check_positions(rows, n)
    if by not in ("column", "row"):
        raise ValueError(f"by {by!r} is not 'column' or 'row'")
    labels = position_frame(n)[by].to_numpy()
    return float(silhouette_score(rows, labels, metric=metric))


def _check_positions(rows: np.ndarray, n: int) -> None:
    if rows.ndim != 2 or rows.shape[0] != n * n:
        raise ValueError(f"n = {n} does not match the {rows.shape[0]} position rows (expected {n * n})")


# ---- progress over a run ---------------------------------------------------------


def embedding_progress(
    run_dir: str | Path,
    final_step: int | None = None,
    centred: bool = True,
    metric: str = SILHOUETTE_METRIC,
    *,
    lo: float = VALUE_LO,
    hi: float = VALUE_HI,
) -> pd.DataFrame:
    """One row per saved checkpoint: step, column_silhouette, row_silhouette, position_norm,
    middle_row_norm (over position_norm: E14's dip), token_norm_symmetry, token_alignment
    (with the PCA of `final_step`, default the last; centred, since uncentred cosines are
    dominated by the common mean), token_captured. lo, hi: the token values read."""
    steps = saved_steps(Path(run_dir))
    if not steps:
        raise ValueError(f"run_dir {str(run_dir)!r} has no saved checkpoint")
    final_step = steps[-1] if final_step is None else final_step
    if final_step not in steps:
        raise ValueError(f"final_step {final_step} is not a saved step ({steps})")
    values = token_values(lo, hi)
    final_rows = token_rows(checkpoint_embeddings(run_dir, final_step), lo, hi)
    pca = fit_pca(final_rows)
    final_proj = project(final_rows, pca, centred)
    out = []
    for step in steps:
        model = checkpoint_embeddings(run_dir, step)  # the two tables, not the model
        n = model["n"]
        pos = position_rows(model, n)
        norms = np.linalg.norm(pos, axis=1)
        tok = token_rows(model, lo, hi)
        out.append(
            {
                "step": step,
                "column_silhouette": position_silhouette(pos, n, "column", metric),
                "row_silhouette": position_silhouette(pos, n, "row", metric),
                "position_norm": norms.mean(),
                "middle_row_norm": norms[(n // 2) * n : (n // 2 + 1) * n].mean() / norms.mean(),
                "token_norm_symmetry": norm_symmetry(values, np.linalg.norm(tok, axis=1)),
                "token_alignment": alignment(project(tok, pca, centred), final_proj),
                "token_captured": captured_variance(tok, pca),
            }
        )
    return pd.DataFrame(out)


def token_projections(
    run_dir: str | Path,
    steps,
    final_step: int | None = None,
    initial=None,
    *,
    lo: float = VALUE_LO,
    hi: float = VALUE_HI,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """E13 at `steps`: token rows lo … hi projected, uncentred and centred, onto the PCA(2)
    plane of `final_step`'s (default the last). Returns (coords: step, centred, value, pc1,
    pc2; summary: step, alignment_uncentred, alignment_centred, captured). initial: a model
    shown as step 0 (the run's initialisation: the control)."""
    saved = saved_steps(Path(run_dir))
    final_step = saved[-1] if final_step is None and saved else final_step
    missing = [s for s in [*steps, final_step] if s not in saved]
    if missing:
        raise ValueError(f"steps {missing} are not saved checkpoints ({saved})")
    values = token_values(lo, hi)
    final = token_rows(checkpoint_embeddings(run_dir, final_step), lo, hi)
    pca = fit_pca(final)
    finals = {c: project(final, pca, c) for c in (False, True)}
    coords, summary = [], []
    models = ([(0, initial)] if initial is not None else []) + [(s, None) for s in steps]
    for step, model in models:
        rows = token_rows(model if model is not None else checkpoint_embeddings(run_dir, step), lo, hi)
        out = {"step": step}
        for centred in (False, True):
            proj = project(rows, pca, centred)
            coords.append(
                pd.DataFrame(
                    {"step": step, "centred": centred, "value": values, "pc1": proj[:, 0], "pc2": proj[:, 1]}
                )
            )
            out[f"alignment_{'centred' if centred else 'uncentred'}"] = alignment(proj, finals[centred])
        out["captured"] = captured_variance(rows, pca)
        summary.append(out)
    return pd.concat(coords, ignore_index=True), pd.DataFrame(summary)
