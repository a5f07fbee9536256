"""mclib's checkpoints in nnsight (mclib/analyses/interp.py, docs/interpretability.md): the
attention pattern and an MLP output read by name, a head zeroed or made uniform there, and
the same predictions and L_mask as mclib's own hooks on the same matrices; a folder of
another architecture refused in one line; TransformerLens 4's bridge as the docs say."""

import json

import pytest
import torch
from conftest import TWO_PATHS, TWO_PATHS_REL, TWO_PATHS_SMALL

from mclib.analyses import interp
from mclib.analyses.attention import ablation_hooks
from mclib.analyses.evaluate import predict, sample_eval_batch
from mclib.core.hooks import hooks, run_with_cache
from mclib.core.metrics import losses
from mclib.core.runs import checkpoint_dir, run_profile

pytest.importorskip("nnsight", reason="the extra 'interp' (in the test extra) is not installed")
pytestmark = pytest.mark.filterwarnings("ignore:Module .* has a submodule named 'output'")


@pytest.fixture(scope="module")
def loaded(smoke_run):
    step = run_profile(smoke_run).checkpoints.post
    model = interp.load_for_interp(checkpoint_dir(smoke_run, step))
    batch = sample_eval_batch(run_profile(smoke_run).data, 64, seed=0)
    return model, interp.nnsight_model(model), batch


def test_pattern_and_mlp_output_by_name_are_the_model_s(loaded):
    model, net, batch = loaded
    with torch.no_grad(), net.trace(batch.tokens):
        p0 = net.bert.encoder.layer[0].attention.self.output[1].save()  # [batch, head, query, key]
        p1 = net.bert.encoder.layer[1].attention.self.output[1].save()
        mlp = net.bert.encoder.layer[1].E_output.dense.output.save()  # [batch, seq, hidden]
    probs = [p0, p1]
    with torch.no_grad():  # mclib's own capture
        _, cache = run_with_cache(model, batch.tokens, [f"blocks.{l}.attn.hook_pattern" for l in range(2)])
    seen = {}
    handle = model.bert.encoder.layer[1].output.dense.register_forward_hook(
        lambda m, i, o: seen.update(mlp=o)
    )
    with torch.no_grad():
        model(batch.tokens)
    handle.remove()
    for layer in range(2):
        assert probs[layer].shape == (64, 2, 49, 49)  # [batch, head, query, key]
        torch.testing.assert_close(
            probs[layer], cache[f"blocks.{layer}.attn.hook_pattern"], rtol=1e-6, atol=1e-7
        )
    assert mlp.shape == (64, 49, 16)
    torch.testing.assert_close(mlp, seen["mlp"], rtol=0, atol=0)


def _mclib_zeroed(model, batch, layer, head):
    """mclib's own way: a hook on the layer's z that zeroes the head's."""

    def zero(z, name):
        z = z.clone()
        z[:, head] = 0.0
        return z

    with hooks(model, [(f"blocks.{layer}.attn.hook_z", zero)]), torch.no_grad():
        return model(batch.tokens).logits.view_as(batch.x)


@pytest.fixture(scope="module")
def sensitive(tmp_path_factory, smoke_run):
    """A checkpoint whose heads matter: the smoke architecture at init std 0.3 (trained 60
    steps, the smoke run's heads barely move its output), saved as training saves one."""
    from mclib.core.model import build_model

    cfg = run_profile(smoke_run).replace(**{"model.init_std": 0.3})
    folder = tmp_path_factory.mktemp("sensitive") / "step_000000"
    build_model(cfg.model, cfg.data.n, seed=0).save_pretrained(folder)
    model = interp.load_for_interp(folder)
    return model, interp.nnsight_model(model), sample_eval_batch(cfg.data, 64, seed=0)


@pytest.mark.parametrize("which", ["loaded", "sensitive"])
@pytest.mark.parametrize("layer, head", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_a_head_ablated_in_nnsight_gives_mclib_s_l_mask(which, layer, head, request):
    model, net, batch = request.getfixturevalue(which)
    clean = predict(model, batch)
    ours = {
        "zero": _mclib_zeroed(model, batch, layer, head),
        "uniform": predict(model, batch, hooks=ablation_hooks(model, {(layer, head)}, mode="uniform")),
    }
    for mode, mine in ours.items():
        theirs = interp.nnsight_ablated(net, batch, layer, head, mode)
        # the same predictions up to float32: "uniform" is a mean of the values there, 1/49 · pattern @ v
        # here (two float paths, conftest; at init std 0.02 the smaller tolerance)
        torch.testing.assert_close(theirs, mine, **(TWO_PATHS_SMALL if which == "loaded" else TWO_PATHS))
        l_mask = losses(mine, batch.x, batch.mask)["L_mask"].item()
        assert interp.nnsight_ablated_l_mask(net, batch, layer, head, mode) == pytest.approx(
            l_mask, rel=TWO_PATHS_REL, abs=0
        )
        moved = (mine - clean).abs().max().item()
        assert moved > 1e-5 if which == "loaded" else moved > 0.1, (
            mode,
            moved,
        )  # the ablation does something
    if which == "sensitive":  # there the ablation moves L_mask far beyond the tolerance
        base = losses(clean, batch.x, batch.mask)["L_mask"].item()
        assert abs(interp.nnsight_ablated_l_mask(net, batch, layer, head, "uniform") / base - 1) > 1e-3


def test_another_architecture_is_refused_in_one_line(tmp_path, smoke_run):
    from transformers import BertConfig, GPT2Config

    gpt, mlm = tmp_path / "gpt", tmp_path / "mlm"
    GPT2Config(n_layer=1, n_head=2, n_embd=16).save_pretrained(gpt)
    BertConfig(num_hidden_layers=1, architectures=["BertForMaskedLM"]).save_pretrained(mlm)
    with pytest.raises(interp.InterpError) as e:
        interp.load_for_interp(gpt)
    assert "\n" not in str(e.value) and "model_type 'gpt2' (MatrixBert: 'matrix-bert')" in str(e.value)
    with pytest.raises(interp.InterpError) as e:
        interp.load_for_interp(mlm)
    assert "architectures ['BertForMaskedLM'] (MatrixBert: ['MatrixBert'])" in str(e.value)
    assert "no matrix_n" in str(e.value) and "model_type" not in str(e.value)
    with pytest.raises(interp.InterpError, match="has no config.json"):
        interp.load_for_interp(tmp_path)
    assert (
        interp.architecture_differences(
            json.loads((checkpoint_dir(smoke_run, 60) / "config.json").read_text())
        )
        == []
    )


def test_transformer_lens_bridge_loads_the_encoder_but_not_the_readout(smoke_run, loaded, tmp_path):
    """What docs/interpretability.md says of TransformerLens 4 (not an extra: run where it is installed),
    on the checkpoint with its config.json as saved before 2026-11-29 (model_type bert)."""
    import shutil

    bridge_module = pytest.importorskip("transformer_lens.model_bridge")
    model, _, batch = loaded
    folder = tmp_path / "as-bert"
    shutil.copytree(checkpoint_dir(smoke_run, 60), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    bridge = bridge_module.TransformerBridge.boot_transformers(str(folder), device="cpu")
    assert type(bridge.original_model).__name__ == "BertForMaskedLM"
    assert not [
        k for k in bridge.original_model.state_dict() if "readout" in k
    ]  # mclib's read-out is dropped
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(batch.tokens)
        hidden = model.bert(input_ids=batch.tokens).last_hidden_state
    assert logits.shape[-1] == model.config.vocab_size  # a fresh MLM head's logits
    torch.testing.assert_close(cache["blocks.1.hook_resid_post"], hidden)  # the encoder is exact
    pred = model.readout(cache["blocks.1.hook_resid_post"]).squeeze(-1)  # mclib's read-out on it
    torch.testing.assert_close(pred, predict(model, batch).view_as(pred))


def test_without_nnsight_one_line_names_the_extra(loaded, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "nnsight", None)  # as if it were not installed
    with pytest.raises(interp.InterpError) as e:
        interp.nnsight_model(loaded[0])
    assert (
        str(e.value)
        == "nnsight is not installed: it is the optional extra 'interp' (pip install -e '.[interp]')"
    )
