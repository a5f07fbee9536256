import pytest
import torch
from conftest import TWO_PATHS_SMALL

from mclib.analyses.attention import ablation_hooks, paper_heads, patching_hooks, z_names
from mclib.core.checkpoints import load_checkpoint
from mclib.core.config import ModelConfig
from mclib.core.data import sample_batch
from mclib.core.hooks import hooks, run_with_cache
from mclib.core.model import build_model

SEQ = 49


def tiny(attention="eager", seed=0):
    cfg = ModelConfig(layers=2, heads=2, hidden=16, intermediate=32, attention=attention)
    return build_model(cfg, 7, seed=seed).eval()


def tokens(batch=8, seed=0):
    return sample_batch(batch, 7, 2, 0.3, torch.Generator().manual_seed(seed)).tokens


PATTERNS = [f"blocks.{l}.attn.hook_pattern" for l in range(2)]


def cached(m, t, names=None, fwd_hooks=(), **kw):
    """(output, cache) of one pass with the hooks on; names: every pattern and z."""
    with torch.no_grad(), hooks(m, fwd_hooks):
        return run_with_cache(m, t, PATTERNS + z_names(m) if names is None else names, **kw)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_capturing_the_pattern_matches_the_stock_model(impl):
    m, t = tiny(impl), tokens()
    seen = []
    with torch.no_grad():
        stock = m(t).logits
        with hooks(m, [(PATTERNS[0], lambda p, name: seen.append(m.config._attn_implementation))]):
            plain = m(t).logits
        captured, _ = cached(m, t)
    assert seen == ["mclib"]  # the pattern is served by mclib's attention function
    if impl == "eager":  # mclib's function is HF's eager attention op for op: the same to the bit
        assert torch.equal(plain, stock)
    else:  # against sdpa: two float paths (conftest)
        torch.testing.assert_close(plain, stock, **TWO_PATHS_SMALL)
    assert torch.equal(plain, captured)
    assert m.config._attn_implementation == impl


def test_a_padding_mask_reaches_the_hooked_attention():
    # Not used by the project (its mask is all ones), but a dropped mask would be silent.
    m, t = tiny("eager"), tokens()
    pad = torch.ones_like(t)
    pad[:, -10:] = 0
    with torch.no_grad():
        stock = m(t, attention_mask=pad).logits
        with hooks(m, [(PATTERNS[0], lambda p, name: seen.update(p=p))]):
            seen = {}
            hooked = m(t, attention_mask=pad).logits
    assert torch.allclose(hooked, stock, atol=1e-6) and not torch.allclose(hooked, m(t).logits, atol=1e-5)
    assert not seen["p"][..., -10:].any()


def test_captured_probs_are_softmax_rows_and_match_hf_eager():
    m, t = tiny("eager"), tokens()
    _, cache = cached(m, t)
    with torch.no_grad():
        reference = m.bert(input_ids=t, output_attentions=True).attentions  # eager returns probs
    for layer in range(2):
        p = cache[PATTERNS[layer]]
        assert p.shape == (8, 2, SEQ, SEQ) and cache[f"blocks.{layer}.attn.hook_z"].shape == (8, 2, SEQ, 8)
        assert torch.allclose(p.sum(-1), torch.ones(8, 2, SEQ), atol=1e-6)
        assert torch.allclose(p, reference[layer], atol=1e-6)


def test_uniform_ablation_gives_exactly_one_over_seq_len():
    m, t = tiny(), tokens()
    clean, clean_cache = cached(m, t)
    ablated, cache = cached(m, t, fwd_hooks=ablation_hooks(m, {(0, 1), (1, 0)}, mode="uniform"))
    assert torch.equal(cache[PATTERNS[0]][:, 1], torch.full((8, SEQ, SEQ), 1 / SEQ))
    assert torch.equal(cache[PATTERNS[1]][:, 0], torch.full((8, SEQ, SEQ), 1 / SEQ))
    assert torch.equal(cache[PATTERNS[0]][:, 0], clean_cache[PATTERNS[0]][:, 0])  # other heads untouched
    assert not torch.allclose(ablated, clean)


def test_batch_mean_ablation_gives_the_batch_mean_of_the_unablated_probs():
    m, t = tiny(), tokens()
    _, clean = cached(m, t)
    _, cache = cached(m, t, fwd_hooks=ablation_hooks(m, {(1, 1)}, mode="batch_mean"))
    expected = clean[PATTERNS[1]][:, 1].mean(0, keepdim=True).expand(8, SEQ, SEQ)
    assert torch.allclose(cache[PATTERNS[1]][:, 1], expected, atol=1e-7)
    assert torch.equal(cache[PATTERNS[1]][:, 0], clean[PATTERNS[1]][:, 0])


@pytest.mark.parametrize("layers", [None, [1]])
def test_patching_own_states_changes_nothing_and_other_states_do(layers):
    m, a, b = tiny(), tokens(seed=0), tokens(seed=1)
    clean_a, z_a = cached(m, a, z_names(m))
    _, z_b = cached(m, b, z_names(m))
    with torch.no_grad():
        with hooks(m, patching_hooks(m, z_a, layers)):
            self_patched = m(a).logits
        with hooks(m, patching_hooks(m, z_b, layers)):
            other_patched = m(a).logits
    assert torch.allclose(self_patched, clean_a, atol=1e-6)
    assert not torch.allclose(other_patched, clean_a, atol=1e-3)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_implementation_is_restored_after_an_exception(impl):
    m = tiny(impl)
    with pytest.raises(KeyError):
        with hooks(m, ablation_hooks(m, {(0, 0)})):
            assert m.config._attn_implementation == "mclib"
            raise KeyError("boom")
    assert m.config._attn_implementation == impl
    assert not any(hasattr(layer.attention.self, "mclib_hooks") for layer in m.bert.encoder.layer)
    # an error inside the forward pass (stored outputs of the wrong batch size)
    _, z = cached(m, tokens(batch=3), z_names(m))
    with pytest.raises(ValueError, match="this input gives"):
        with torch.no_grad(), hooks(m, patching_hooks(m, z)):
            m(tokens(batch=4))
    assert m.config._attn_implementation == impl
    assert not any(hasattr(layer.attention.self, "mclib_hooks") for layer in m.bert.encoder.layer)


def test_bad_input_is_a_one_line_value_error():
    m = tiny()
    for heads, mode, match in [
        ({(2, 0)}, "uniform", "layer 2 does not exist"),
        ({(0, 5)}, "uniform", "head 5 is out of range"),
        ({(0, 0)}, "zero", "'zero'"),
        ([3], "uniform", "3 is not a"),
    ]:
        with pytest.raises(ValueError, match=match):
            ablation_hooks(m, heads, mode=mode)
    z0 = {"blocks.0.attn.hook_z": torch.zeros(1, 2, SEQ, 8)}
    with pytest.raises(ValueError, match="layer 7 does not exist"):
        patching_hooks(m, z0, layers=[7])
    with pytest.raises(ValueError, match="no stored outputs for layer 1"):
        patching_hooks(m, z0)
    with pytest.raises(ValueError, match=r"have shape \(1, 3, 49, 8\), expected \[batch, 2 heads"):
        patching_hooks(m, {"blocks.0.attn.hook_z": torch.zeros(1, 3, SEQ, 8)}, layers=[0])
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        paper_heads([(0, 1)])


def test_paper_heads_are_one_indexed():
    assert paper_heads([(3, 3), (4, 2), (4, 8)]) == {(2, 2), (3, 1), (3, 7)}


def test_hooks_on_a_saved_checkpoint(smoke_run, smoke_profile):
    m = load_checkpoint(smoke_run, smoke_profile.checkpoints.post)  # loads with "sdpa"
    t = tokens()
    with torch.no_grad():
        stock = m(t).logits
    hooked, cache = cached(m, t)
    torch.testing.assert_close(hooked, stock, **TWO_PATHS_SMALL)  # mclib's eager attention vs sdpa (conftest)
    assert sorted(cache) == sorted(PATTERNS + z_names(m)) and len(PATTERNS) == smoke_profile.model.layers
    assert m.config._attn_implementation == "sdpa"
