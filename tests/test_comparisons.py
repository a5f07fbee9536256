import numpy as np
import pytest
import torch

from mclib.analyses import comparisons as C
from mclib.analyses import per_matrix as P
from mclib.analyses.evaluate import pooled, sample_eval_batch
from mclib.core import paper
from mclib.core.checkpoints import load_checkpoint
from mclib.core.data import copy_level, sample_matrices


@pytest.fixture(scope="module")
def post(smoke_run, smoke_profile):
    return load_checkpoint(smoke_run, smoke_profile.checkpoints.post)


def test_pooled_mean_and_standard_error():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(50, 7, 7)) ** 2
    full = np.ones_like(v, dtype=bool)
    mean, se = pooled(v, full)
    per = v.reshape(50, -1).mean(1)  # equal counts: the se of the per-matrix means
    assert mean == pytest.approx(v.mean()) and se == pytest.approx(per.std(ddof=1) / np.sqrt(50))
    where = rng.random(v.shape) < 0.3
    assert pooled(v, where)[0] == pytest.approx(v[where].mean())  # pooled, not a mean of means


def test_completion_row_of_the_truth():
    x = sample_matrices(8, 7, 2, torch.Generator().manual_seed(0)).double().numpy()
    mask = np.random.default_rng(0).random(x.shape) < 0.3
    row = P.completion_row(x, x, mask)
    assert row["L"] == row["L_mask"] == row["L_obs"] == row["median_L_mask"] == 0
    assert row["nuclear"] == pytest.approx(np.linalg.svd(x, compute_uv=False).sum(1).mean())


def test_copy_level_is_the_mean_square():
    g = torch.Generator().manual_seed(0)
    for dist in ("uniform", "gaussian", "laplace"):
        x = sample_matrices(20_000, 7, 2, g, dist)
        assert (x**2).mean().item() == pytest.approx(copy_level(2, dist), rel=0.03), dist
    with pytest.raises(ValueError, match="'random'"):
        copy_level(2, "random")


def test_sweep_uses_the_same_matrices_and_nested_masks(post, smoke_profile):
    table = C.nuclear_sweep(post, smoke_profile.data, [0.2, 0.4], 6, seed=0)
    assert table[["p_mask", "method"]].values.tolist() == [
        [p, m] for p in (0.2, 0.4) for m in ("BERT", "nuclear norm", "truth")
    ]
    solver = table[table.method == "nuclear norm"]
    assert (solver["L_obs"] == 0).all() and (table[table.method == "truth"]["L"] == 0).all()
    d = smoke_profile.data
    lo = sample_eval_batch(d.__class__(d.n, d.rank, 0.2, d.dist), 6, 0)
    hi = sample_eval_batch(d.__class__(d.n, d.rank, 0.4, d.dist), 6, 0)
    assert torch.equal(lo.x, hi.x) and not (lo.mask & ~hi.mask).any()


def test_regularised_ood_and_classical_tables(post, smoke_profile):
    reg = C.regularised_table(smoke_profile.data, [5e-4, 5e-3], 6, seed=0, model=post)
    assert reg["method"].tolist() == ["λ = 0.0005", "λ = 0.005", "BERT"]
    assert reg["L_obs"].iloc[0] < reg["L_obs"].iloc[1]  # a larger λ fits the observed entries less
    ood = C.ood_table(post, smoke_profile.data, 6, seed=0, solver_matrices=4)
    assert ood[["dist", "method", "matrices"]].values.tolist() == [
        [d, m, k] for d in ("uniform", "gaussian", "laplace") for m, k in (("BERT", 6), ("nuclear norm", 4))
    ]
    assert len(C.ood_table(post, smoke_profile.data, 6, seed=0, dists=["laplace"], solver_matrices=0)) == 1
    assert np.allclose(ood["L_mask_rel"], ood["L_mask"] / ood["copy_level"])
    assert (ood[ood.dist == "uniform"]["outside"] == 0).all()
    sweep = C.nuclear_sweep(post, smoke_profile.data, [smoke_profile.data.p_mask], 6, seed=0)
    table, per = C.classical_table(
        post, smoke_profile.data, 6, seed=0
    )  # the nuclear norm of the sweep, remembered
    assert (
        table.set_index("method").loc["nuclear norm", "L"]
        == sweep.set_index("method").loc["nuclear norm", "L"]
    )
    assert (
        table["method"].tolist()
        == ["BERT", "nuclear norm", "soft-impute, rank 2", "ALS, rank 2"]
        == list(per)
    )
    assert all(len(v) <= 6 for v in per.values())


def test_paper_task_is_the_paper_profile_s_data():
    task = paper.task()
    assert (task.n, task.rank, task.p_mask, task.dist) == (7, 2, 0.3, "uniform")
    task.n = 5  # a fresh copy each call: a caller cannot change the next one's task
    assert paper.task().n == 7


def test_median_se_is_the_normal_theory_error():
    # the median of b normal draws has s.e. √(π/2)/√b; the order-statistic estimate should agree
    se = [P.median_se(np.random.default_rng(s).normal(size=400)) for s in range(40)]
    assert np.mean(se) == pytest.approx(np.sqrt(np.pi / 2) / 20, rel=0.1)
    assert np.isnan(P.median_se(np.array([1.0])))


def test_paired_difference_and_its_error():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4, 4))
    mask = rng.random(x.shape) < 0.5
    hard = rng.exponential(size=(200, 1, 1))  # some matrices are hard for both methods
    a = x + hard * rng.normal(size=x.shape)
    b = x + 1.1 * hard * rng.normal(size=x.shape)
    row = P.paired(a, b, x, mask)
    ra, rb = P.completion_row(a, x, mask), P.completion_row(b, x, mask)
    assert row["d_L_mask"] == pytest.approx(ra["L_mask"] - rb["L_mask"])
    assert row["d_L"] == pytest.approx(ra["L"] - rb["L"])
    assert row["d_L_mask_se"] < 0.7 * np.hypot(
        ra["L_mask_se"], rb["L_mask_se"]
    )  # pairing removes the shared part
    per_a, per_b = P.per_matrix_l_mask(a, x, mask), P.per_matrix_l_mask(b, x, mask)
    assert row["a_better"] == pytest.approx(np.mean(per_a < per_b))
    assert row["a_better_se"] == pytest.approx(np.sqrt(row["a_better"] * (1 - row["a_better"]) / len(per_a)))
    same = P.paired(a, a, x, mask)
    assert same["d_L"] == 0 and same["d_L_se"] == 0 and same["a_better"] == 0


def test_solvers_alone_on_the_paper_s_task(post):
    task = paper.task()
    sweep = C.nuclear_sweep(None, task, [0.2, 0.3], 4, seed=0)
    assert sweep["method"].tolist() == ["nuclear norm", "truth"] * 2
    table, per = C.classical_table(None, task, 4, seed=0)
    assert table["method"].tolist() == ["nuclear norm", "soft-impute, rank 2", "ALS, rank 2"] == list(per)
    assert not any(c.startswith("BERT") for c in table.columns)
    # the nuclear norm at the paper's p_mask is the sweep's (same matrices, remembered)
    assert (
        table.set_index("method").loc["nuclear norm", "L"]
        == sweep.set_index(["p_mask", "method"]).loc[(0.3, "nuclear norm"), "L"]
    )
    with_bert, per = C.classical_table(post, task, 4, seed=0)
    rows = with_bert.set_index("method")
    assert np.isnan(rows.loc["BERT", "BERT_d_L"])
    als = rows.loc["ALS, rank 2"]
    assert als.BERT_d_L_mask == pytest.approx(rows.loc["BERT", "L_mask"] - als.L_mask)
    assert als.BERT_better == pytest.approx(np.mean(per["BERT"] < per["ALS, rank 2"]))


def test_bert_rows_of_the_sweep_carry_the_paired_difference(post, smoke_profile):
    table = C.nuclear_sweep(post, smoke_profile.data, [0.3], 6, seed=0).set_index("method")
    assert table.loc["BERT", "d_L"] == pytest.approx(table.loc["BERT", "L"] - table.loc["nuclear norm", "L"])
    assert np.isnan(table.loc["nuclear norm", "d_L"])


def test_e17_reproduces_the_paper_s_l_obs_on_its_task():
    # L_obs is set mostly by λ, so 64 matrices pin it to ~2 %; the paper's values (256
    # matrices) agree to 2 significant figures. A wrong λ scaling (e.g. without the 1/|Ω|) fails.
    from mclib.core.paper import PAPER_E17

    reg = C.regularised_table(paper.task(), list(PAPER_E17), 64, seed=0)
    t = C.e17_beside_paper(reg)
    assert t["quantity"].tolist() == ["L_obs", "L_mask", "L"] * 5
    obs = t[t["quantity"] == "L_obs"]
    assert (obs["rel_dev"].abs() < 0.05).all(), obs
    assert (obs["se"] / obs["ours"] < 0.03).all()
    assert np.allclose(t["z"], (t["ours"] - t["paper"]) / t["se"])
