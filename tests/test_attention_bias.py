"""model.attn_bias: a constant added to the attention logits toward the query's
own row and column (or, the control, toward the other keys), on both training paths."""

from __future__ import annotations

import pytest
import torch
from conftest import TWO_PATHS_REL

from mclib.core.attention import IMPL, bias_keys, position_masks
from mclib.core.config import ConfigError, load_profile, profile_path
from mclib.core.data import sample_batch
from mclib.core.hooks import run_with_cache
from mclib.core.model import build_model, load_model
from mclib.core.variants import step_function


def _batch(p, seed=3, batch=16):
    return sample_batch(batch, p.data.n, p.data.rank, p.data.p_mask, torch.Generator().manual_seed(seed))


def _probs(model, tokens):
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(model.config.num_hidden_layers)]
    with torch.no_grad():
        _, cache = run_with_cache(model.eval(), tokens, names)
    return {l: cache[name] for l, name in enumerate(names)}  # {layer: [batch, head, query, key]}


def test_key_sets_partition_the_keys_of_every_query():
    n = 5
    keys = position_masks(n)
    rc, other = bias_keys(n, "row_col"), bias_keys(n, "other")
    assert rc.sum(1).tolist() == [2 * (n - 1)] * n * n and other.sum(1).tolist() == [(n - 1) ** 2] * n * n
    assert not (rc & other).any() and not (rc & keys["self"]).any() and not (other & keys["self"]).any()
    assert (rc | other | keys["self"]).all()
    # position 7 of a 5x5 matrix is row 1, column 2: its
    # row keys are 5, 6, 8, 9, its column keys 2, 12, 17, 22
    assert rc[7].nonzero().flatten().tolist() == [2, 5, 6, 8, 9, 12, 17, 22]
    with pytest.raises(ValueError, match="'diagonal' is not one of row_col, other"):
        bias_keys(n, "diagonal")


@pytest.mark.parametrize("target", ["row_col", "other"])
def test_the_bias_multiplies_the_target_keys_weights_by_e_to_the_strength(smoke_profile, target):
    """Same weights with and without the bias (it is no parameter); every head of every layer
    gets softmax(s + b·[key in target]) = softmax(s)·e^(b·[...]) renormalised. Layer 0 sees the
    same input either way, so there the identity is exact; deeper layers see other inputs,
    so there only the direction is checked: more mass on the target keys."""
    p = smoke_profile
    b = 1.5
    plain = build_model(p.model, p.data.n, 1)
    biased = build_model(
        p.replace(**{"model.attn_bias": b, "model.attn_bias_target": target}).model, p.data.n, 1
    )
    assert biased.config._attn_implementation == IMPL
    for (k, v), (k2, v2) in zip(plain.state_dict().items(), biased.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    tokens = _batch(p).tokens
    p0, p1 = _probs(plain, tokens), _probs(biased, tokens)
    keys = bias_keys(p.data.n, target)
    want = p0[0] * torch.exp(b * keys.float())
    # softmax(s + b) against softmax(s)·e^b renormalised: elementwise ops and one 49-term sum on
    # probabilities below 0.06, a few float32 ulps apart (2e-8 here); a wrong strength moves them by %
    torch.testing.assert_close(p1[0], want / want.sum(-1, keepdim=True), rtol=1e-5, atol=1e-6)
    for layer in p0:
        on0 = (p0[layer] * keys).sum(-1).mean()
        on1 = (p1[layer] * keys).sum(-1).mean()
        assert on1 > on0 + 0.05, (layer, on0.item(), on1.item())


def test_strength_zero_is_bit_identical_to_no_bias(smoke_profile):
    p = smoke_profile.replace(**{"train.compile": False})
    zero = p.replace(**{"model.attn_bias": 0.0, "model.attn_bias_target": "other"})
    tokens = _batch(p).tokens
    a, z = build_model(p.model, p.data.n, 1).eval(), build_model(zero.model, p.data.n, 1).eval()
    assert a.config._attn_implementation == z.config._attn_implementation != IMPL
    with torch.no_grad():
        assert torch.equal(a(tokens).logits, z(tokens).logits)
    ref = step_function(p, torch.device("cpu"))
    off = step_function(zero, torch.device("cpu"))
    for _ in range(4):
        assert torch.equal(ref(), off())


@pytest.mark.parametrize("target", ["row_col", "other"])
def test_the_bias_changes_training(smoke_profile, target):
    p = smoke_profile.replace(
        **{"train.compile": False, "model.attn_bias": 2.0, "model.attn_bias_target": target}
    )
    biased = step_function(p, torch.device("cpu"))
    plain = step_function(smoke_profile.replace(**{"train.compile": False}), torch.device("cpu"))
    steps = [(biased()[0], plain()[0]) for _ in range(5)]
    assert not torch.allclose(*steps[-1])


@pytest.mark.slow  # seconds: left to the slow tier, so the fast tier stays quick
def test_the_compiled_step_applies_the_bias_too(smoke_profile):
    """The cpu profile trains with train.compile: true: the compiled model applies the bias as the
    eager one does."""
    p = smoke_profile.replace(**{"model.attn_bias": 2.0})
    ref = step_function(p.replace(**{"train.compile": False}), torch.device("cpu"))
    comp = step_function(p.replace(**{"train.compile": True}), torch.device("cpu"))
    for _ in range(3):
        # compiled against eager, three steps: two float paths (conftest; 1.2e-7 apart here), while a
        # compiled step without the bias gives losses 1.4e-4 to 2.6e-4 away
        torch.testing.assert_close(ref()[0], comp()[0], rtol=TWO_PATHS_REL, atol=0)


def test_a_saved_biased_model_loads_with_its_bias(tmp_path, smoke_profile):
    p = smoke_profile.replace(**{"model.attn_bias": 1.0, "model.attn_bias_target": "other"})
    model = build_model(p.model, p.data.n, 1).eval()
    model.save_pretrained(tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    tokens = _batch(p).tokens
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model(tokens).logits)
        assert not torch.allclose(
            build_model(smoke_profile.model, p.data.n, 1).eval()(tokens).logits, loaded(tokens).logits
        )


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_a_bad_strength_is_one_line_naming_the_key(value):
    with pytest.raises(ConfigError) as e:
        load_profile(profile_path("cpu"), **{"model.attn_bias": value})
    assert "\n" not in str(e.value) and "model.attn_bias = " in str(e.value)
    with pytest.raises(ConfigError, match=r"model.attn_bias = 1.0 is a BERT key"):
        load_profile(profile_path("gpt"), **{"model.attn_bias": 1.0})
