import pytest
import torch

from mclib.analyses.attention import AttentionHooks, paper_heads
from mclib.core.config import ModelConfig
from mclib.core.data import sample_batch
from mclib.core.model import build_model
from mclib.core.runs import load_checkpoint

SEQ = 49


def tiny(attention="eager", seed=0):
    cfg = ModelConfig(layers=2, heads=2, hidden=16, intermediate=32, attention=attention)
    return build_model(cfg, 7, seed=seed).eval()


def tokens(batch=8, seed=0):
    return sample_batch(batch, 7, 2, 0.3, torch.Generator().manual_seed(seed)).tokens


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hooks_with_nothing_on_match_the_stock_model(impl):
    m, t = tiny(impl), tokens()
    with torch.no_grad():
        stock = m(t)
        with AttentionHooks(m) as hooks:
            assert m.config._attn_implementation == "mclib"
            plain = m(t)
            hooks.capture()
            captured = m(t)
    assert torch.allclose(plain, stock, atol=1e-6) and torch.equal(plain, captured)
    assert m.config._attn_implementation == impl


def test_a_padding_mask_reaches_the_hooked_attention():
    # Not used by the project (its mask is all ones), but a dropped mask would be silent.
    m, t = tiny("eager"), tokens()
    pad = torch.ones_like(t)
    pad[:, -10:] = 0
    with torch.no_grad():
        stock = m(t, attention_mask=pad)
        with AttentionHooks(m) as hooks:
            hooks.capture()
            hooked = m(t, attention_mask=pad)
    assert torch.allclose(hooked, stock, atol=1e-6) and not torch.allclose(hooked, m(t), atol=1e-5)
    assert not hooks.probs[0][..., -10:].any()


def test_captured_probs_are_softmax_rows_and_match_hf_eager():
    m, t = tiny("eager"), tokens()
    with torch.no_grad(), AttentionHooks(m) as hooks:
        hooks.capture()
        m(t)
    with torch.no_grad():
        reference = m.bert(input_ids=t, output_attentions=True).attentions  # eager returns probs
    for layer in range(2):
        p = hooks.probs[layer]
        assert p.shape == (8, 2, SEQ, SEQ) and hooks.z[layer].shape == (8, 2, SEQ, 8)
        assert torch.allclose(p.sum(-1), torch.ones(8, 2, SEQ), atol=1e-6)
        assert torch.allclose(p, reference[layer], atol=1e-6)


def test_uniform_ablation_gives_exactly_one_over_seq_len():
    m, t = tiny(), tokens()
    with torch.no_grad(), AttentionHooks(m) as hooks:
        hooks.capture()
        clean = m(t)
        clean_probs = dict(hooks.probs)
        hooks.capture().ablate({(0, 1), (1, 0)}, mode="uniform")
        ablated = m(t)
    assert torch.equal(hooks.probs[0][:, 1], torch.full((8, SEQ, SEQ), 1 / SEQ))
    assert torch.equal(hooks.probs[1][:, 0], torch.full((8, SEQ, SEQ), 1 / SEQ))
    assert torch.equal(hooks.probs[0][:, 0], clean_probs[0][:, 0])  # other heads untouched
    assert not torch.allclose(ablated, clean)


def test_batch_mean_ablation_gives_the_batch_mean_of_the_unablated_probs():
    m, t = tiny(), tokens()
    with torch.no_grad(), AttentionHooks(m) as hooks:
        hooks.capture()
        m(t)
        clean_probs = dict(hooks.probs)
        hooks.capture().ablate({(1, 1)}, mode="batch_mean")
        m(t)
    expected = clean_probs[1][:, 1].mean(0, keepdim=True).expand(8, SEQ, SEQ)
    assert torch.allclose(hooks.probs[1][:, 1], expected, atol=1e-7)
    assert torch.equal(hooks.probs[1][:, 0], clean_probs[1][:, 0])


@pytest.mark.parametrize("layers", [None, [1]])
def test_patching_own_states_changes_nothing_and_other_states_do(layers):
    m, a, b = tiny(), tokens(seed=0), tokens(seed=1)
    with torch.no_grad(), AttentionHooks(m) as hooks:
        hooks.capture()
        clean_a = m(a)
        z_a = hooks.z
        m(b)
        z_b = hooks.z
        hooks.reset().patch(z_a, layers)
        self_patched = m(a)
        hooks.patch(z_b, layers)
        other_patched = m(a)
    assert torch.allclose(self_patched, clean_a, atol=1e-6)
    assert not torch.allclose(other_patched, clean_a, atol=1e-3)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_implementation_is_restored_after_an_exception(impl):
    m = tiny(impl)
    with pytest.raises(KeyError):
        with AttentionHooks(m):
            raise KeyError("boom")
    assert m.config._attn_implementation == impl
    assert not any(hasattr(layer.attention.self, "mclib_hooks") for layer in m.bert.encoder.layer)
    # an error inside the forward pass (stored outputs of the wrong batch size)
    with pytest.raises(ValueError, match="this input gives"):
        with torch.no_grad(), AttentionHooks(m) as hooks:
            hooks.capture()
            m(tokens(batch=3))
            hooks.patch(hooks.z)
            m(tokens(batch=4))
    assert m.config._attn_implementation == impl
    with AttentionHooks(m):  # and the model can be hooked again
        pass


def test_bad_input_is_a_one_line_value_error():
    m = tiny()
    with AttentionHooks(m) as hooks:
        for heads, mode, match in [({(2, 0)}, "uniform", "layer 2 does not exist"),
                                   ({(0, 5)}, "uniform", "head 5 is out of range"),
                                   ({(0, 0)}, "zero", "'zero'"),
                                   ([3], "uniform", "3 is not a")]:
            with pytest.raises(ValueError, match=match):
                hooks.ablate(heads, mode=mode)
        with pytest.raises(ValueError, match="layer 7 does not exist"):
            hooks.patch({0: torch.zeros(1, 2, SEQ, 8)}, layers=[7])
        with pytest.raises(ValueError, match="no stored outputs for layer 1"):
            hooks.patch({0: torch.zeros(1, 2, SEQ, 8)})
        with pytest.raises(ValueError, match="already inside"):
            with AttentionHooks(m):
                pass
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        paper_heads([(0, 1)])


def test_paper_heads_are_one_indexed():
    assert paper_heads([(3, 3), (4, 2), (4, 8)]) == {(2, 2), (3, 1), (3, 7)}


def test_hooks_on_a_saved_checkpoint(smoke_run, smoke_profile):
    m = load_checkpoint(smoke_run, smoke_profile.checkpoints.post)  # loads with "sdpa"
    t = tokens()
    with torch.no_grad():
        stock = m(t)
        with AttentionHooks(m) as hooks:
            hooks.capture()
            hooked = m(t)
    assert torch.allclose(hooked, stock, atol=1e-5)
    assert len(hooks.probs) == smoke_profile.model.layers
    assert m.config._attn_implementation == "sdpa"
