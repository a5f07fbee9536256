"""mclib.core.hooks: every named hook point is the tensor its docstring says, with the shape
it says; hooks and caches leave nothing attached, also after an error; a misspelled name
is a one-line error; and E3-E8's interventions, written as hooks, give on a trained
checkpoint the L_mask of the code they replaced (weight surgery, or a forward pass by hand)."""

import copy
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import TWO_PATHS, TWO_PATHS_REL, TWO_PATHS_SMALL
from test_hand_forward import hand_forward  # the forward pass written out from the weights

from mclib.analyses.attention import ablation_hooks, patching_hooks, z_names
from mclib.analyses.evaluate import activation_patching, evaluate, predict, sample_eval_batch
from mclib.analyses.interventions import permute_positions_hooks, position_permutation, switch_qkv_hooks
from mclib.analyses.loss_tables import model_table
from mclib.core.checkpoints import load_checkpoint
from mclib.core.config import DataConfig, ModelConfig
from mclib.core.data import make_batch, sample_batch
from mclib.core.hooks import check_names, hook_names, hooks, run_with_cache, run_with_hooks
from mclib.core.metrics import losses
from mclib.core.model import build_model
from mclib.core.train import train

B, SEQ, HEADS, D, D_HEAD, D_MLP = 8, 49, 2, 16, 8, 32
DATA = DataConfig(n=7, rank=2, p_mask=0.3)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: on shared cores one thread is 10-50x faster than two that contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(attention="sdpa", seed=0, layers=2):
    cfg = ModelConfig(
        layers=layers, heads=HEADS, hidden=D, intermediate=D_MLP, init_std=0.5, attention=attention
    )
    return build_model(cfg, 7, seed=seed).eval()


def tokens(batch=B, seed=0):
    return sample_batch(batch, 7, 2, 0.3, torch.Generator().manual_seed(seed)).tokens


def nothing_attached(m) -> bool:
    return all(not mod._forward_hooks and not mod._forward_pre_hooks for mod in m.modules()) and not any(
        hasattr(layer.attention.self, "mclib_hooks") for layer in m.bert.encoder.layer
    )


SHAPES = {
    "hook_embed": (B, SEQ, D),
    "hook_pos_embed": (1, SEQ, D),
    "hook_resid_pre": (B, SEQ, D),
    "attn.hook_q": (B, SEQ, HEADS, D_HEAD),
    "attn.hook_k": (B, SEQ, HEADS, D_HEAD),
    "attn.hook_v": (B, SEQ, HEADS, D_HEAD),
    "attn.hook_pattern": (B, HEADS, SEQ, SEQ),
    "attn.hook_z": (B, HEADS, SEQ, D_HEAD),
    "hook_attn_out": (B, SEQ, D),
    "hook_resid_mid": (B, SEQ, D),
    "hook_normalized_resid_mid": (B, SEQ, D),
    "mlp.hook_pre": (B, SEQ, D_MLP),
    "mlp.hook_post": (B, SEQ, D_MLP),
    "hook_mlp_out": (B, SEQ, D),
    "hook_resid_post": (B, SEQ, D),
    "hook_normalized_resid_post": (B, SEQ, D),
    "hook_readout": (B, SEQ),
}


def test_every_name_has_its_documented_shape_and_the_cache_holds_them_all():
    m, t = tiny(), tokens()
    with torch.no_grad():
        out, cache = run_with_cache(m, t)
    names = hook_names(m)
    assert list(cache) == names and len(names) == 3 + 14 * 2  # the order of the forward pass
    for name in names:
        assert cache[name].shape == SHAPES[re.sub(r"^blocks\.\d+\.", "", name)], name
    assert torch.equal(cache["hook_readout"], out)


def test_every_name_is_the_tensor_its_docstring_says():
    m, t = tiny("eager"), tokens()
    with torch.no_grad():
        _, c = run_with_cache(m, t)
        hidden = m.hidden_states(t)  # HF's own: embeddings' LayerNorm, then every block's output
        emb = m.bert.embeddings
        torch.testing.assert_close(c["hook_embed"], emb.word_embeddings(t), rtol=0, atol=0)
        torch.testing.assert_close(
            c["hook_pos_embed"], emb.position_embeddings.weight[None, :SEQ], rtol=0, atol=0
        )
        for l, layer in enumerate(m.bert.encoder.layer):
            g = lambda k: c[f"blocks.{l}.{k}"]
            attn = layer.attention
            torch.testing.assert_close(g("hook_resid_pre"), hidden[l], rtol=0, atol=0)
            q, k, v = (g(f"attn.hook_{x}").transpose(1, 2) for x in "qkv")  # [batch, head, pos, d_head]
            torch.testing.assert_close(g("attn.hook_q").flatten(2), attn.self.query(g("hook_resid_pre")))
            pattern = torch.softmax(q @ k.transpose(-1, -2) * attn.self.scaling, -1)
            torch.testing.assert_close(g("attn.hook_pattern"), pattern)
            torch.testing.assert_close(g("attn.hook_z"), g("attn.hook_pattern") @ v)
            z = g("attn.hook_z").transpose(1, 2).flatten(2)  # [batch, pos, head * d_head]
            torch.testing.assert_close(g("hook_attn_out"), attn.output.dense(z))
            # post-LayerNorm: resid_mid is the sum before the
            # block's first LayerNorm, normalized_resid_mid after it
            torch.testing.assert_close(g("hook_resid_mid"), g("hook_resid_pre") + g("hook_attn_out"))
            torch.testing.assert_close(
                g("hook_normalized_resid_mid"), attn.output.LayerNorm(g("hook_resid_mid"))
            )
            torch.testing.assert_close(
                g("mlp.hook_pre"), layer.intermediate.dense(g("hook_normalized_resid_mid"))
            )
            torch.testing.assert_close(g("mlp.hook_post"), F.gelu(g("mlp.hook_pre")))
            torch.testing.assert_close(g("hook_mlp_out"), layer.output.dense(g("mlp.hook_post")))
            torch.testing.assert_close(
                g("hook_resid_post"), g("hook_normalized_resid_mid") + g("hook_mlp_out")
            )
            torch.testing.assert_close(
                g("hook_normalized_resid_post"), layer.output.LayerNorm(g("hook_resid_post"))
            )
            torch.testing.assert_close(g("hook_normalized_resid_post"), hidden[l + 1], rtol=0, atol=0)
        torch.testing.assert_close(c["hook_readout"], m.readout(hidden[-1]).squeeze(-1), rtol=0, atol=0)


def test_a_cache_of_some_names_holds_those_only():
    m, t = tiny(), tokens()
    names = ["blocks.1.hook_mlp_out", "blocks.0.attn.hook_pattern"]
    with torch.no_grad():
        out, cache = run_with_cache(m, t, names)
        # a pattern runs mclib's eager attention, not sdpa: two float paths (conftest.TWO_PATHS)
        torch.testing.assert_close(out, m(t).logits, **TWO_PATHS)
    assert sorted(cache) == sorted(names) and nothing_attached(m)
    assert m.config._attn_implementation == "sdpa"


@pytest.mark.parametrize(
    "name",
    [
        "hook_embed",
        "blocks.0.hook_resid_pre",
        "blocks.0.attn.hook_q",
        "blocks.1.attn.hook_pattern",
        "blocks.1.attn.hook_z",
        "blocks.0.hook_resid_mid",
        "blocks.1.mlp.hook_post",
        "hook_readout",
    ],
)
def test_a_hook_that_returns_what_it_sees_changes_nothing_and_a_changed_tensor_does(name):
    m, t = tiny(), tokens()
    with torch.no_grad():
        clean = m(t).logits
        same = run_with_hooks(m, t, [(name, lambda x, n: x.clone())])
        kept = run_with_hooks(m, t, [(name, lambda x, n: None)])
        changed = run_with_hooks(
            m, t, [(name, lambda x, n: x.roll(1, 1))]
        )  # not 2x: a LayerNorm undoes a scale
    if ".attn.hook_pattern" in name or ".attn.hook_z" in name:  # mclib's eager attention against sdpa
        torch.testing.assert_close(same, clean, **TWO_PATHS)
        torch.testing.assert_close(kept, clean, **TWO_PATHS)
    else:  # the same sdpa forward, to the bit
        assert torch.equal(same, clean) and torch.equal(kept, clean)
    assert not torch.allclose(changed, clean, atol=1e-3)
    assert nothing_attached(m)


def test_zeroing_an_mlp_is_zeroing_its_output_projection():
    m, t = tiny(), tokens()
    surgery = copy.deepcopy(m)
    with torch.no_grad():
        surgery.bert.encoder.layer[1].output.dense.weight.zero_()
        surgery.bert.encoder.layer[1].output.dense.bias.zero_()
        hooked = run_with_hooks(m, t, [("blocks.1.hook_mlp_out", lambda x, n: torch.zeros_like(x))])
        assert torch.equal(hooked, surgery(t).logits) and not torch.allclose(hooked, m(t).logits, atol=1e-3)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_nothing_stays_attached_after_an_error(impl):
    m, t = tiny(impl), tokens()
    with torch.no_grad():
        clean = m(t).logits
    every = [(name, lambda x, n: 2 * x) for name in hook_names(m)]
    with pytest.raises(KeyError, match="boom"):
        with hooks(m, every):
            assert m.config._attn_implementation == "mclib" and not nothing_attached(m)
            raise KeyError("boom")
    assert nothing_attached(m) and m.config._attn_implementation == impl

    def fails(x, name):
        raise RuntimeError(f"inside {name}")

    for name in ("blocks.1.hook_mlp_out", "blocks.1.attn.hook_z"):  # an error inside the forward pass
        with pytest.raises(RuntimeError, match=f"inside {re.escape(name)}"), torch.no_grad():
            with hooks(m, [("blocks.0.attn.hook_pattern", lambda x, n: None), (name, fails)]):
                m(t)
        with pytest.raises(RuntimeError, match="inside"), torch.no_grad(), hooks(m, [(name, fails)]):
            run_with_cache(m, t)
    assert nothing_attached(m) and m.config._attn_implementation == impl
    with torch.no_grad():
        assert torch.equal(m(t).logits, clean)


def test_hooks_nest_and_the_cache_sees_the_hooked_values():
    m, t = tiny(), tokens()
    with torch.no_grad(), hooks(m, ablation_hooks(m, {(0, 1)}, "uniform")):
        _, inner = run_with_cache(m, t, ["blocks.0.attn.hook_pattern"])
        assert m.config._attn_implementation == "mclib"  # the inner block closed, the outer is still on
        ablated = m(t).logits
    assert torch.equal(inner["blocks.0.attn.hook_pattern"][:, 1], torch.full((B, SEQ, SEQ), 1 / SEQ))
    assert torch.equal(ablated, predict_tokens(m, t, ablation_hooks(m, {(0, 1)}, "uniform")))
    assert nothing_attached(m) and m.config._attn_implementation == "sdpa"


def predict_tokens(m, t, fwd_hooks):
    with torch.no_grad():
        return run_with_hooks(m, t, fwd_hooks)


def test_a_misspelled_name_is_a_one_line_error_with_the_nearest_name():
    m, t = tiny(), tokens()
    for bad, near in [
        ("blocks.1.hook_mlp_outt", "blocks.1.hook_mlp_out"),
        ("blocks.0.attn.hook_patern", "blocks.0.attn.hook_pattern"),
    ]:
        with pytest.raises(ValueError) as err:
            with hooks(m, [("hook_embed", lambda x, n: None), (bad, lambda x, n: None)]):
                pass
        assert str(err.value) == f"no hook point {bad!r} on this model (did you mean {near!r}?)"
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            run_with_cache(m, t, [bad])
    with pytest.raises(
        ValueError, match=r"^no hook point 'blocks\.7\.hook_mlp_out' on this model \(did you mean"
    ):
        check_names(m, ["blocks.7.hook_mlp_out"])  # a layer the model does not have
    with pytest.raises(
        ValueError, match=r"^no hook point 'zzz' on this model \(see mclib\.core\.hooks\.hook_names\)$"
    ):
        check_names(m, ["zzz"])
    assert nothing_attached(m)  # nothing was attached before the check


def test_a_replacement_of_another_shape_is_a_one_line_error():
    m, t = tiny(), tokens()
    with (
        pytest.raises(
            ValueError,
            match=r"^the hook on blocks\.0\.hook_mlp_out returned shape \(8, 49\), "
            r"expected \(8, 49, 16\)$",
        ),
        torch.no_grad(),
    ):
        run_with_hooks(m, t, [("blocks.0.hook_mlp_out", lambda x, n: x[..., 0])])
    assert nothing_attached(m)


def test_only_matrix_bert_has_hook_points():
    gpt = build_model(ModelConfig(kind="gpt", layers=1, heads=2, hidden=16, intermediate=32), 7, seed=0)
    with pytest.raises(ValueError, match="hook points exist on MatrixBert only, not on MatrixGPT"):
        hook_names(gpt)


# --- E3-E8 as hooks, against the code they replaced, on the smoke run's trained checkpoint ----------


def _surgery_switch(target, source):
    """E6 as it was: a copy of target with source's query, key and value modules."""
    model = copy.deepcopy(target)
    for mine, theirs in zip(model.bert.encoder.layer, source.bert.encoder.layer):
        for name in ("query", "key", "value"):
            getattr(mine.attention.self, name).load_state_dict(
                getattr(theirs.attention.self, name).state_dict()
            )
    return model


def _surgery_permute(model, seed):
    """E7 as it was: a copy whose first n² position embeddings are reordered."""
    model = copy.deepcopy(model)
    table = model.bert.embeddings.position_embeddings.weight
    with torch.no_grad():
        table[:SEQ] = table[position_permutation(SEQ, seed)].clone()
    return model


def _both_ways(pre, post, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Every intervention of E3-E8 on `batch`: name -> (predictions through the hooks,
    predictions of the code they replaced: weight surgery, or the hand-written forward)."""
    heads = {(0, 1), (1, 0)}

    def replaced(mode):  # ablation as its definition says, in the hand-written forward
        def probs_of(layer, probs):
            out = probs.clone()
            for l, h in heads:
                if l == layer:
                    out[:, h] = 1 / SEQ if mode == "uniform" else probs[:, h].mean(0)
            return out

        return probs_of

    out = {}
    for mode in ("uniform", "batch_mean"):  # E3-E5, both readings
        out[mode] = (
            predict(post, batch, ablation_hooks(post, heads, mode)),
            hand_forward(post, batch.tokens, probs_of=replaced(mode)).float(),
        )
    # E6 both ways, E7 for three seeds, against the weight-surgery copies the old code made
    cases = {
        "pre-QKV into post": (post, switch_qkv_hooks(post, pre), _surgery_switch(post, pre)),
        "post-QKV into pre": (pre, switch_qkv_hooks(pre, post), _surgery_switch(pre, post)),
        **{
            f"permuted {s}": (post, permute_positions_hooks(post, s), _surgery_permute(post, s))
            for s in range(3)
        },
    }
    for name, (model, fwd_hooks, surgery) in cases.items():
        out[name] = (predict(model, batch, fwd_hooks), predict(surgery, batch))
    # E8 both readings: X's z patched into the run on -X, against the hand forward with X's z written in
    minus = make_batch(-batch.x, batch.mask)
    clean_z = {}
    hand_forward(post, batch.tokens, keep_z=clean_z)
    with torch.no_grad():
        _, cache = run_with_cache(post, batch.tokens, z_names(post))
    for reading, layers in (("last", [1]), ("all", [0, 1])):
        out[f"patched {reading}"] = (
            predict(post, minus, patching_hooks(post, cache, layers)),
            hand_forward(post, minus.tokens, z_of=lambda l, z: clean_z[l] if l in layers else z).float(),
        )
    return out


def _l_mask(pred, batch):
    return losses(pred, batch.x, batch.mask)["L_mask"].item()


def test_each_intervention_gives_the_l_mask_of_the_old_code(smoke_run, smoke_profile):
    data = smoke_profile.data
    pre = load_checkpoint(smoke_run, smoke_profile.checkpoints.pre)
    post = load_checkpoint(smoke_run, smoke_profile.checkpoints.post)
    batch = sample_eval_batch(data, 32, seed=0)
    both = _both_ways(pre, post, batch)
    new = {name: _l_mask(a, batch) for name, (a, _) in both.items()}
    old = {name: _l_mask(b, batch) for name, (_, b) in both.items()}
    # hooks against weight surgery on sdpa or the float64 hand forward: two float paths (conftest)
    assert new == pytest.approx(old, rel=TWO_PATHS_REL)
    for name, (a, b) in both.items():
        torch.testing.assert_close(a, b, **TWO_PATHS_SMALL, msg=name)
    # the tables the chapters read compute the same: E6/E7 through model_table, E8 through activation_patching
    table = model_table(
        {
            name: (m, h)
            for name, (m, h) in {
                "pre-QKV into post": (post, switch_qkv_hooks(post, pre)),
                "permuted 1": (post, permute_positions_hooks(post, 1)),
            }.items()
        },
        data,
        32,
        0,
    ).set_index("model")
    assert table["L_mask"].to_dict() == pytest.approx({k: new[k] for k in table.index}, rel=1e-6)
    for reading in ("last", "all"):
        assert activation_patching(post, data, 32, 0, layers=reading)["masked_vs_X"] == pytest.approx(
            new[f"patched {reading}"], rel=1e-6
        )


def test_each_intervention_acts_where_heads_matter():
    # the trained smoke model barely uses its heads (60 steps): here the same comparison on a
    # model whose every intervention moves the predictions far beyond the tolerance
    pre, post = tiny(seed=1), tiny(seed=0)
    batch = sample_eval_batch(DATA, 16, seed=0)
    plain = predict(post, batch)
    for name, (a, b) in _both_ways(pre, post, batch).items():
        torch.testing.assert_close(a, b, **TWO_PATHS, msg=name)  # two float paths (conftest)
        if (
            name != "patched all"
        ):  # every layer patched: masked entries read the clean run (test_hand_forward)
            assert (a - plain).abs().max() > 1e-2, name


# --- the README's example ------------------------------------------------------------------------


def readme_example() -> str:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    return re.search(r"<!-- hooks-example -->\n```python\n(.*?)```", text, re.S).group(1)


def test_the_readme_example_zeroes_layer_2_s_mlp(smoke_profile, tmp_path, monkeypatch):
    # the example needs a third layer: the smoke model with three, trained a few steps
    profile = smoke_profile.replace(
        **{
            "model.layers": 3,
            "train.steps": 10,
            "train.save_every": 10,
            "train.log_every": 5,
            "train.eval_every": 5,
            "checkpoints.pre": 5,
            "checkpoints.transition": [5],
            "checkpoints.post": 10,
        }
    )
    train(profile, tmp_path / "runs" / "cpu-seed1", progress=False)
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(readme_example(), scope)
    model = scope["model"]
    surgery = copy.deepcopy(model)
    with torch.no_grad():
        surgery.bert.encoder.layer[2].output.dense.weight.zero_()
        surgery.bert.encoder.layer[2].output.dense.bias.zero_()
    assert scope["ablated"] == pytest.approx(evaluate(surgery, profile.data, 256, seed=0)["L_mask"], rel=1e-6)
    assert scope["clean"] == pytest.approx(evaluate(model, profile.data, 256, seed=0)["L_mask"], rel=0)
    assert scope["ablated"] != pytest.approx(scope["clean"], rel=1e-4)
    assert nothing_attached(model)
