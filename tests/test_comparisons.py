import numpy as np
import pytest
import torch

from mclib import comparisons as C
from mclib.data import sample_matrices
from mclib.evaluate import sample_eval_batch
from mclib.train import load_checkpoint


@pytest.fixture(scope="module")
def post(smoke_run, smoke_profile):
    return load_checkpoint(smoke_run, smoke_profile.checkpoints.post)


def test_pooled_mean_and_standard_error():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(50, 7, 7)) ** 2
    full = np.ones_like(v, dtype=bool)
    mean, se = C.pooled(v, full)
    per = v.reshape(50, -1).mean(1)  # equal counts: the se of the per-matrix means
    assert mean == pytest.approx(v.mean()) and se == pytest.approx(per.std(ddof=1) / np.sqrt(50))
    where = rng.random(v.shape) < 0.3
    assert C.pooled(v, where)[0] == pytest.approx(v[where].mean())  # pooled, not a mean of means


def test_completion_row_of_the_truth():
    x = sample_matrices(8, 7, 2, torch.Generator().manual_seed(0)).double().numpy()
    mask = np.random.default_rng(0).random(x.shape) < 0.3
    row = C.completion_row(x, x, mask)
    assert row["L"] == row["L_mask"] == row["L_obs"] == row["median_L_mask"] == 0
    assert row["nuclear"] == pytest.approx(np.linalg.svd(x, compute_uv=False).sum(1).mean())


def test_copy_level_is_the_mean_square():
    g = torch.Generator().manual_seed(0)
    for dist in ("uniform", "gaussian", "laplace"):
        x = sample_matrices(20_000, 7, 2, g, dist)
        assert (x ** 2).mean().item() == pytest.approx(C.copy_level(dist, 2), rel=0.03), dist
    with pytest.raises(ValueError, match="'random'"):
        C.copy_level("random", 2)


def test_sweep_uses_the_same_matrices_and_nested_masks(post, smoke_profile):
    table = C.nuclear_sweep(post, smoke_profile, [0.2, 0.4], 6, seed=0)
    assert table[["p_mask", "method"]].values.tolist() == [[p, m] for p in (0.2, 0.4)
                                                           for m in ("BERT", "nuclear norm", "truth")]
    solver = table[table.method == "nuclear norm"]
    assert (solver["L_obs"] == 0).all() and (table[table.method == "truth"]["L"] == 0).all()
    d = smoke_profile.data
    lo = sample_eval_batch(d.__class__(d.n, d.rank, 0.2, d.dist), 6, 0)
    hi = sample_eval_batch(d.__class__(d.n, d.rank, 0.4, d.dist), 6, 0)
    assert torch.equal(lo.x, hi.x) and not (lo.mask & ~hi.mask).any()


def test_regularised_ood_and_classical_tables(post, smoke_profile):
    reg = C.regularised_table(smoke_profile, [5e-4, 5e-3], 6, seed=0, model=post)
    assert reg["method"].tolist() == ["λ = 0.0005", "λ = 0.005", "BERT"]
    assert reg["L_obs"].iloc[0] < reg["L_obs"].iloc[1]          # a larger λ fits the observed entries less
    ood = C.ood_table(post, smoke_profile, 6, seed=0, solver_matrices=4)
    assert ood[["dist", "method", "matrices"]].values.tolist() == [[d, m, k] for d in ("uniform", "gaussian", "laplace")
                                                                   for m, k in (("BERT", 6), ("nuclear norm", 4))]
    assert len(C.ood_table(post, smoke_profile, 6, seed=0, dists=["laplace"], solver_matrices=0)) == 1
    assert np.allclose(ood["L_mask_rel"], ood["L_mask"] / ood["copy_level"])
    assert (ood[ood.dist == "uniform"]["outside"] == 0).all()
    sweep = C.nuclear_sweep(post, smoke_profile, [smoke_profile.data.p_mask], 6, seed=0)
    table, per = C.classical_table(post, smoke_profile, 6, seed=0)  # the nuclear norm of the sweep, remembered
    assert table.set_index("method").loc["nuclear norm", "L"] == sweep.set_index("method").loc["nuclear norm", "L"]
    assert table["method"].tolist() == ["BERT", "nuclear norm", "soft-impute, rank 2", "ALS, rank 2"] == list(per)
    assert all(len(v) <= 6 for v in per.values())
