import pytest
import torch

from mclib.core.data import (
    MASK_ID,
    VOCAB_SIZE,
    copy_level,
    detokenize,
    make_batch,
    random_mask,
    sample_batch,
    sample_matrices,
    structured_mask,
    tokenize,
)


def test_token_ids_match_the_protocol():
    values = torch.tensor([0.0, 0.44, -0.24, -1.50, 1.50, -10.0, 10.0])
    assert tokenize(values).tolist() == [1001, 1045, 977, 851, 1151, 1, 2001]
    assert VOCAB_SIZE == 2002 and MASK_ID == 0


def test_round_trip_over_the_whole_vocabulary():
    ids = torch.arange(1, VOCAB_SIZE)
    assert torch.equal(tokenize(detokenize(ids)), ids)
    assert torch.isnan(detokenize(torch.tensor([MASK_ID]))).all()


@pytest.mark.parametrize("bad", [10.01, -10.5, 100.0])
def test_out_of_range_value_is_named(bad):
    with pytest.raises(ValueError, match=f"{bad:g}"):
        tokenize(torch.tensor([0.0, bad]))


def test_sampled_matrices_are_rounded_low_rank(gen):
    x = sample_matrices(64, 7, 2, gen)
    assert x.shape == (64, 7, 7)
    assert torch.equal(x, torch.round(x * 100) / 100)
    # rounding perturbs by <= 0.005 per entry: the 3rd singular value stays tiny
    s = torch.linalg.svdvals(x.double())
    assert (s[:, 2] < 0.05).all() and (s[:, 1] > 0.05).float().mean() > 0.9
    assert x.abs().max() <= 2  # |sum of 2 products of Unif[-1,1]| <= 2


def test_second_moment_matches_copy_baseline(gen):
    x = sample_matrices(4000, 7, 2, gen)
    assert abs((x**2).mean().item() - copy_level(2)) < 0.01


def test_full_rank_random_matrices(gen):
    x = sample_matrices(32, 7, 2, gen, dist="random")
    assert (torch.linalg.svdvals(x)[:, -1] > 1e-3).float().mean() > 0.9


@pytest.mark.parametrize("dist", ["gaussian", "laplace"])
def test_other_factor_distributions_are_low_rank(gen, dist):
    x = sample_matrices(16, 7, 2, gen, dist=dist)
    assert (torch.linalg.svdvals(x.double())[:, 2] < 0.05).all()


def test_mask_rate_and_seeding():
    m = random_mask(2000, 7, 0.3, torch.Generator().manual_seed(1))
    assert abs(m.float().mean().item() - 0.3) < 0.01
    assert torch.equal(m, random_mask(2000, 7, 0.3, torch.Generator().manual_seed(1)))


def test_batch_puts_mask_token_or_fill_value():
    b = sample_batch(8, 7, 2, 0.3, torch.Generator().manual_seed(0))
    assert b.tokens.shape == (8, 49)
    flat = b.mask.flatten(1)
    assert (b.tokens[flat] == MASK_ID).all()
    assert torch.equal(b.tokens[~flat], tokenize(b.x).flatten(1)[~flat])
    filled = make_batch(b.x, b.mask, fill_value=0.44)
    assert (filled.tokens[flat] == 1045).all()


def test_structured_mask_of_e10():
    m = structured_mask()
    assert m.sum() == 12 and m[3].sum() == 6 and not m[3, 1] and not m[6, 5] and not m[0].any()
    assert torch.equal(m, structured_mask(7, rows=(3, 6), keep=((3, 1), (6, 5))))


def test_structured_mask_on_a_smaller_grid_keeps_the_shape():
    m = structured_mask(5)  # middle and last rows, kept at the second and second-to-last columns
    assert m.sum() == 8 and m[2].sum() == 4 and m[4].sum() == 4 and not m[2, 1] and not m[4, 3]
    with pytest.raises(ValueError, match="row 6 is out of range for n = 5"):
        structured_mask(5, rows=(3, 6))


@pytest.mark.parametrize("kwargs,match", [(dict(rank=8), "rank 8"), (dict(dist="cauchy"), "cauchy")])
def test_bad_sampling_arguments(gen, kwargs, match):
    args = dict(batch=2, n=7, rank=2, gen=gen) | kwargs
    with pytest.raises(ValueError, match=match):
        sample_matrices(**args)


def test_bad_p_mask(gen):
    with pytest.raises(ValueError, match="1.2"):
        random_mask(2, 7, 1.2, gen)


def test_an_autocast_around_the_caller_does_not_change_the_data():
    """In bf16 the product U Vᵀ rounds before round2, and half the tokens would move bins."""
    plain = sample_batch(256, 5, 1, 0.3, torch.Generator().manual_seed(4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = sample_batch(256, 5, 1, 0.3, torch.Generator().manual_seed(4))
    assert cast.x.dtype == torch.float32
    assert torch.equal(plain.x, cast.x) and torch.equal(plain.tokens, cast.tokens)
