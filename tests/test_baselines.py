import numpy as np
import pytest
import torch

from mclib.analyses import baselines as B
from mclib.core.data import random_mask, sample_matrices
from mclib.core.metrics import losses

# Five masked entries in distinct rows and columns of a 7×7 matrix.
HOLES = ([0, 1, 2, 4, 6], [3, 5, 0, 6, 2])


def exact_rank2(seed: int):
    """An exactly rank-2 (unrounded) 7×7 matrix `[1, 7, 7]` and its 5-hole mask."""
    rng = np.random.default_rng(seed)
    u, v = rng.uniform(-1, 1, (2, 7, 2))
    mask = np.zeros((1, 7, 7), bool)
    mask[0, HOLES[0], HOLES[1]] = True
    return (u @ v.T)[None], mask


# Tolerances on the max error over the masked entries, from measurement (seeds 0-4,
# worst seen in brackets): interior-point accuracy for the constrained program
# (3e-8); the bias of λ = 1e-5, of order λ|Ω|/2 (2e-4); the ridge 1e-4 of ALS (1e-4);
# hard-impute's stopping tolerance (3e-7).
METHODS = {
    "constrained": (lambda x, m: B.nuclear_norm_complete(x, m), 1e-6),
    "regularised": (lambda x, m: B.regularised_nuclear_norm(x, m, 1e-5), 1e-3),
    "soft_impute": (lambda x, m: B.soft_impute(x, m, 1e-5), 1e-3),
    "soft_impute_rank2": (lambda x, m: B.soft_impute(x, m, 1e-8, rank=2), 1e-5),
    "als": (lambda x, m: B.als_complete(x, m, 2), 1e-3),
    "als_tiny_ridge": (lambda x, m: B.als_complete(x, m, 2, ridge=1e-8), 1e-5),
}


@pytest.mark.parametrize("name", METHODS)
def test_recovers_an_exactly_rank2_matrix(name):
    method, tol = METHODS[name]
    x, mask = exact_rank2(0)
    out = method(x, mask)
    assert isinstance(out, np.ndarray) and out.shape == x.shape
    assert np.abs(out - x)[mask].max() < tol


def test_knowing_the_rank_helps_where_the_nuclear_norm_does_not():
    # Seed 2: the minimum-nuclear-norm completion is not the rank-2 matrix.
    x, mask = exact_rank2(2)
    assert np.abs(B.nuclear_norm_complete(x, mask) - x)[mask].max() > 0.1
    assert np.abs(B.als_complete(x, mask, 2, ridge=1e-8) - x)[mask].max() < 1e-5
    assert np.abs(B.soft_impute(x, mask, 1e-8, rank=2) - x)[mask].max() < 1e-5


def test_constrained_keeps_observed_entries(gen):
    x = sample_matrices(4, 7, 2, gen).double().numpy()
    mask = random_mask(4, 7, 0.3, gen).numpy()
    raw = B.constrained_one(np.where(mask[0], 0.0, x[0]), mask[0])  # the solver's own answer
    assert np.abs(raw - x[0])[~mask[0]].max() < 1e-7
    out = B.nuclear_norm_complete(x, mask)
    assert np.array_equal(out[~mask], x[~mask])  # copied back: exact


@pytest.mark.parametrize(
    "method",
    [lambda x, m, **k: B.soft_impute(x, m, 1e-3, **k), lambda x, m, **k: B.als_complete(x, m, 2, **k)],
)
def test_keep_observed_option(gen, method):
    # Rounded matrices are not exactly rank 2, so a fitted answer differs on Ω.
    x = sample_matrices(8, 7, 2, gen).double().numpy()
    mask = random_mask(8, 7, 0.3, gen).numpy()
    fitted, kept = method(x, mask), method(x, mask, keep_observed=True)
    assert np.abs(fitted - x)[~mask].max() > 1e-6  # default: fitted, not copied
    assert np.array_equal(kept[~mask], x[~mask])
    assert np.array_equal(kept[mask], fitted[mask])  # masked estimates unchanged


def test_torch_in_torch_out_and_masked_values_ignored(gen):
    x = sample_matrices(3, 7, 2, gen)
    mask = random_mask(3, 7, 0.3, gen)
    holey = torch.where(mask, torch.full_like(x, float("nan")), x)  # as detokenize gives
    for out in (
        B.nuclear_norm_complete(holey, mask),
        B.soft_impute(holey, mask, 1e-3),
        B.als_complete(holey, mask, 2),
    ):
        assert isinstance(out, torch.Tensor) and out.dtype == x.dtype and out.shape == x.shape
        assert torch.isfinite(out).all()
    assert torch.equal(B.soft_impute(holey, mask, 1e-3), B.soft_impute(x, mask, 1e-3))


def test_e17_small_check(gen):
    # Paper (256 matrices): L_obs 1.015e-5 at λ = 5e-4 and 7.86e-4 at 5e-3. L_obs is nearly
    # deterministic (256-matrix SE ~1%), so 16 matrices suffice for a loose bracket; the
    # lower bounds fail if observed entries were copied back instead of fitted.
    x = sample_matrices(16, 7, 2, gen)
    mask = random_mask(16, 7, 0.3, gen)
    l_small = losses(B.regularised_nuclear_norm(x, mask, 5e-4), x, mask)["L_obs"].item()
    l_big = losses(B.regularised_nuclear_norm(x, mask, 5e-3), x, mask)["L_obs"].item()
    assert 1e-6 < l_small < 1e-4
    assert 3e-4 < l_big < 2e-3


def test_soft_impute_solves_the_e17_problem(gen):
    # Same objective as the CVXPY program: compare objective values (the minimiser itself
    # is nearly flat in some masked directions, so entries may differ by ~1e-2).
    x = sample_matrices(8, 7, 2, gen).double().numpy()
    mask = random_mask(8, 7, 0.3, gen).numpy()
    obs = ~mask

    def objective(u):
        return ((u - x) ** 2 * obs).sum((1, 2)) / obs.sum((1, 2)) + 5e-4 * B.nuclear_norm(u)

    cvx, soft = (
        objective(B.regularised_nuclear_norm(x, mask, 5e-4)),
        objective(B.soft_impute(x, mask, 5e-4, tol=1e-10)),
    )
    assert np.abs(soft - cvx).max() < 1e-6 * cvx.max()


def test_programs_are_dpp_and_compiled_once():
    prob = B._regularised_program(7)[0]
    assert prob.is_dpp() and B._constrained_program(7)[0].is_dpp()
    assert B._regularised_program(7)[0] is prob


def test_nuclear_norm():
    x = np.stack([np.diag([3.0, -2.0, 0.0]), np.ones((3, 3))])
    assert np.allclose(B.nuclear_norm(x), [5.0, 3.0])
    assert torch.allclose(B.nuclear_norm(torch.from_numpy(x)), torch.tensor([5.0, 3.0], dtype=torch.float64))


def test_complete_batch_in_order_and_in_parallel(gen):
    x = sample_matrices(6, 7, 2, gen)
    mask = random_mask(6, 7, 0.3, gen)
    out = B.complete_batch(lambda xi, mi: xi + 1.0, x, mask, progress=False, chunk=4)
    assert torch.allclose(out, torch.where(mask, 0.0, x) + 1.0)  # masked entries arrive as 0
    seq = B.complete_batch(B.constrained_one, x, mask, progress=False)
    par = B.complete_batch(B.constrained_one, x, mask, workers=2, progress=False, chunk=3)
    assert torch.allclose(seq, par, atol=1e-6)


def _xm(shape=(2, 7, 7), mask_shape=None, dtype=bool):
    return np.zeros(shape), np.zeros(mask_shape or shape, dtype)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: B.nuclear_norm_complete(*_xm(mask_shape=(2, 7, 6))), "mask has shape"),
        (lambda: B.nuclear_norm_complete(*_xm((2, 7, 6))), "square"),
        (lambda: B.nuclear_norm_complete(*_xm((7, 7))), "square"),
        (lambda: B.nuclear_norm_complete(*_xm(dtype=float)), "boolean"),
        (
            lambda: B.nuclear_norm_complete(np.zeros((2, 7, 7)), np.ones((2, 7, 7), bool)),
            "every entry masked",
        ),
        (lambda: B.nuclear_norm_complete(np.full((2, 7, 7), np.nan), np.zeros((2, 7, 7), bool)), "NaN"),
        (lambda: B.regularised_nuclear_norm(*_xm(), lam=0.0), "lam must be > 0"),
        (lambda: B.soft_impute(*_xm(), lam=-1.0), "lam must be > 0"),
        (lambda: B.soft_impute(*_xm(), lam=1e-3, rank=8), "rank 8"),
        (lambda: B.als_complete(*_xm(), rank=0), "rank 0"),
        (lambda: B.als_complete(*_xm(), rank=2, ridge=0.0), "ridge"),
        (lambda: B.als_complete(*_xm(), rank=2, init="svd"), "init"),
        (lambda: B.complete_batch(B.constrained_one, *_xm(), workers=0), "workers"),
    ],
)
def test_bad_inputs_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _svt(x: np.ndarray, tau: float) -> np.ndarray:
    """Singular-value thresholding: the prox of tau·‖·‖_*, i.e. argmin ½‖U − X‖² + tau‖U‖_*."""
    u, s, vt = np.linalg.svd(x)
    return (u * np.maximum(s - tau, 0.0)) @ vt


@pytest.mark.parametrize("method", ["cvxpy", "soft_impute"])
def test_regularised_with_every_entry_observed_is_singular_value_thresholding(method):
    # With Ω = every entry, (1/n²)‖U − X‖² + λ‖U‖_* is n²/2 × (½‖U − X‖² + (λn²/2)‖U‖_*),
    # so the minimiser is X's SVD with every singular value lowered by λn²/2 (and cut at 0).
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (2, 7, 7))
    mask = np.zeros(x.shape, bool)
    s = np.linalg.svd(x[0], compute_uv=False)
    tau = (s[2] + s[3]) / 2  # keeps 3 singular values of the first matrix
    lam = 2 * tau / 49
    out = (
        B.regularised_nuclear_norm(x, mask, lam)
        if method == "cvxpy"
        else B.soft_impute(x, mask, lam, tol=1e-12)
    )
    expected = np.stack([_svt(xi, tau) for xi in x])
    assert np.linalg.matrix_rank(expected[0], tol=1e-9) == 3
    assert np.abs(out - expected).max() < 1e-6
