import copy
import re

import pytest
import torch

from mclib.analyses.attention import ablation_hooks
from mclib.analyses.evaluate import activation_patching, evaluate, predict, sample_eval_batch
from mclib.analyses.interventions import (
    GROUPS,
    OTHER,
    component_groups,
    l_prime_mask,
    permute_positions_hooks,
    position_permutation,
    reinit_component,
    replace_masked_tokens,
    switch_qkv_hooks,
)
from mclib.core.checkpoints import load_checkpoint
from mclib.core.config import ModelConfig
from mclib.core.data import MASK_ID, make_batch, sample_batch, sample_matrices, tokenize
from mclib.core.hooks import run_with_hooks
from mclib.core.metrics import losses
from mclib.core.model import build_model
from mclib.core.train import train

SMALL = ModelConfig(layers=2, heads=2, hidden=16, intermediate=32)
QKV_NAME = re.compile(r".*\.attention\.self\.(query|key|value)\.(weight|bias)")


def tiny(seed=0):
    return build_model(SMALL, 7, seed=seed).eval()


def tokens(batch=8, seed=0):
    return sample_batch(batch, 7, 2, 0.3, torch.Generator().manual_seed(seed)).tokens


@pytest.fixture
def post(smoke_run, smoke_profile):
    return load_checkpoint(smoke_run, smoke_profile.checkpoints.post)


# --- E2 ----------------------------------------------------------------------------------


def test_replace_masked_tokens_and_l_prime_mask():
    b = sample_batch(16, 7, 2, 0.3, torch.Generator().manual_seed(0))
    r = replace_masked_tokens(b, 0.44)
    m = b.mask.flatten(1)
    assert (r.tokens[m] == tokenize(torch.tensor(0.44))).all() and torch.equal(r.tokens[~m], b.tokens[~m])
    assert torch.equal(replace_masked_tokens(b, None).tokens, b.tokens) and (b.tokens[m] == MASK_ID).all()
    zeros = torch.zeros_like(b.x)
    assert l_prime_mask(zeros, r, 0.44) == pytest.approx(0.44**2)
    assert l_prime_mask(zeros, b, None) == 0.0


# --- E6 ----------------------------------------------------------------------------------


def surgery_switch_qkv(target, source):
    """E6 by weight surgery (the code before the hooks): a copy of `target` with every
    layer's query, key and value weights and biases loaded from `source`."""
    model = copy.deepcopy(target)
    state = {k: v for k, v in source.state_dict().items() if QKV_NAME.fullmatch(k)}
    assert len(state) == 2 * 3 * 2  # layers × {q, k, v} × {weight, bias}
    model.load_state_dict(state, strict=False)
    return model


def test_switched_model_computes_with_the_source_qkv_modules():
    # the expected model is built by weight surgery; the hooks leave the target untouched
    target, source, t = tiny(0), tiny(1), tokens()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with torch.no_grad():
        out = run_with_hooks(target, t, switch_qkv_hooks(target, source))
        assert torch.equal(out, surgery_switch_qkv(target, source)(t).logits)
        assert not torch.allclose(out, target(t).logits, atol=1e-3) and not torch.allclose(
            out, source(t).logits, atol=1e-3
        )
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
    with pytest.raises(ValueError, match="models differ in num_hidden_layers"):
        switch_qkv_hooks(
            target, build_model(ModelConfig(layers=3, heads=2, hidden=16, intermediate=32), 7, 0)
        )


# --- E7 ----------------------------------------------------------------------------------


def test_permute_positions_is_a_seeded_reordering_of_the_first_n2_rows():
    m = tiny()
    perm = position_permutation(49, seed=3)
    assert torch.equal(perm.sort().values, torch.arange(49)) and not torch.equal(perm, torch.arange(49))
    assert torch.equal(perm, position_permutation(49, seed=3))
    assert not torch.equal(perm, position_permutation(49, seed=4))
    original = m.bert.embeddings.position_embeddings.weight.clone()
    surgery = copy.deepcopy(m)  # E7 by weight surgery (the code before the hooks): the table's rows reordered
    with torch.no_grad():
        surgery.bert.embeddings.position_embeddings.weight[:49] = original[perm]
    t = tokens()
    with torch.no_grad():
        permuted = run_with_hooks(m, t, permute_positions_hooks(m, seed=3))
        assert torch.equal(permuted, surgery(t).logits)
        # reading position p from row perm[p] of the original table is the same model
        assert torch.allclose(permuted, m(t, position_ids=perm.expand(8, -1)).logits, atol=1e-6)
        assert not torch.allclose(permuted, m(t).logits, atol=1e-3)
    assert torch.equal(m.bert.embeddings.position_embeddings.weight, original)  # source untouched


# --- E15 ---------------------------------------------------------------------------------


def test_groups_partition_the_trainable_parameters():
    m = tiny()
    groups = component_groups(m)
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable <= set(groups) and set(groups.values()) == {*GROUPS, OTHER}
    for name in groups:  # no name matches two patterns
        assert sum(bool(re.fullmatch(p, name)) for p in GROUPS.values()) <= 1, name
    by_group = {g: sorted(n for n in groups if groups[n] == g) for g in (*GROUPS, OTHER)}
    assert len(by_group["attention"]) == 2 * 8 and len(by_group["mlp"]) == 2 * 4
    assert by_group["positional"] == ["bert.embeddings.position_embeddings.weight"]
    assert by_group["token"] == ["bert.embeddings.word_embeddings.weight"]
    assert all("LayerNorm" in n or n.startswith("readout") or "token_type" in n for n in by_group[OTHER])
    assert (
        "readout.weight" in by_group[OTHER]
        and "bert.encoder.layer.0.attention.output.LayerNorm.weight" in by_group[OTHER]
    )


@pytest.mark.parametrize("group", list(GROUPS))
def test_reinit_changes_exactly_one_group_and_freezes_the_rest(post, group):
    for p in post.parameters():  # what from_pretrained leaves on loaded weights; must not block the init
        p._is_hf_initialized = True
    source = {k: v.clone() for k, v in post.named_parameters()}
    model = reinit_component(post, group, seed=0)
    groups = component_groups(model)
    std = post.config.initializer_range
    for name, p in model.named_parameters():
        if groups[name] == group:
            assert p.requires_grad and not torch.equal(p, source[name]), name
            if name.endswith("bias"):
                assert not p.any(), name
            elif p.numel() >= 256:
                assert abs(p.std().item() - std) < 0.3 * std, name
        else:
            assert not p.requires_grad and torch.equal(p, source[name]), name
    assert not model.bert.embeddings.word_embeddings.weight[MASK_ID].any()
    assert all(torch.equal(p, source[n]) for n, p in post.named_parameters())  # source untouched
    again, other_seed = reinit_component(post, group, seed=0), reinit_component(post, group, seed=1)
    name = next(n for n in groups if groups[n] == group and n.endswith("weight"))
    assert torch.equal(dict(again.named_parameters())[name], dict(model.named_parameters())[name])
    assert not torch.equal(dict(other_seed.named_parameters())[name], dict(model.named_parameters())[name])


def test_reinit_rejects_an_unknown_group():
    with pytest.raises(ValueError, match="'layernorm'"):
        reinit_component(tiny(), "layernorm", seed=0)


def test_reinit_model_trains_with_the_training_loop(tmp_path, post, smoke_profile):
    model = reinit_component(post, "mlp", seed=0)
    start = {k: v.clone() for k, v in model.named_parameters()}
    profile = smoke_profile.replace(
        **{
            "train.steps": 3,
            "train.save_every": 3,
            "train.log_every": 1,
            "checkpoints.pre": 1,
            "checkpoints.transition": [2],
            "checkpoints.post": 3,
        }
    )
    run = train(profile, tmp_path / "e15", progress=False, init_model=model)
    trained = load_checkpoint(run, 3)
    groups = component_groups(trained)
    for name, p in trained.named_parameters():
        assert torch.equal(p, start[name]) == (groups[name] != "mlp"), name


# --- evaluate / E8 -----------------------------------------------------------------------


def test_evaluate_is_deterministic_and_restores_the_mode(post, smoke_profile):
    post.train()
    a = evaluate(post, smoke_profile.data, 64, seed=5)
    assert post.training
    assert a == evaluate(post, smoke_profile.data, 64, seed=5)
    assert a != evaluate(post, smoke_profile.data, 64, seed=6)
    assert set(a) == {"L", "L_obs", "L_mask", "mask_value"}
    e2 = evaluate(post, smoke_profile.data, 64, seed=5, fill_value=0.44, dist="random")
    assert set(e2) == {"L", "L_obs", "L_mask", "mask_value", "L'_mask"}
    fixed = torch.zeros(7, 7, dtype=torch.bool)
    fixed[3] = True
    # one fixed mask for every matrix: L_mask is the error on row 3, the tokens built here by hand
    x = sample_matrices(8, 7, 2, torch.Generator().manual_seed(5))  # the matrices of seed 5
    t = tokenize(x)
    t[:, 3] = MASK_ID
    with torch.no_grad():
        by_hand = ((post.eval()(t.flatten(1)).logits.view(8, 7, 7)[:, 3] - x[:, 3]) ** 2).mean().item()
    # the same forward, the mean taken in another order: float32 rounding (1.8e-7 relative here)
    assert evaluate(post, smoke_profile.data, 8, seed=5, mask=fixed)["L_mask"] == pytest.approx(
        by_hand, rel=1e-5
    )
    with pytest.raises(ValueError, match="mask has shape"):
        evaluate(post, smoke_profile.data, 8, seed=5, mask=torch.zeros(6, 6, dtype=torch.bool))


def test_evaluate_with_hooks_ablates_on_the_same_batch(post, smoke_profile):
    all_heads = {(l, h) for l in range(2) for h in range(2)}
    plain = evaluate(post, smoke_profile.data, 64, seed=0)
    ablated = evaluate(post, smoke_profile.data, 64, seed=0, hooks=ablation_hooks(post, all_heads, "uniform"))
    nothing = evaluate(post, smoke_profile.data, 64, seed=0, hooks=[])
    assert ablated != plain and nothing == pytest.approx(plain, rel=1e-5)
    assert post.config._attn_implementation == "sdpa"


def test_patching_no_layer_is_the_plain_minus_x_run(post, smoke_profile):
    none = activation_patching(post, smoke_profile.data, 32, seed=0, layers=[])
    clean = sample_eval_batch(smoke_profile.data, 32, seed=0)
    minus = make_batch(-clean.x, clean.mask)
    plain = losses(predict(post, minus), minus.x, minus.mask)
    assert none["masked_vs_negX"] == pytest.approx(plain["L_mask"].item(), rel=1e-5)
    assert none["observed_vs_negX"] == pytest.approx(plain["L_obs"].item(), rel=1e-5)
    last, every = (
        activation_patching(post, smoke_profile.data, 32, seed=0, layers=k) for k in ("last", "all")
    )
    assert last != none and every != last
    with pytest.raises(ValueError, match="'first'"):
        activation_patching(post, smoke_profile.data, 32, seed=0, layers="first")
