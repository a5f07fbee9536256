"""Ablation (E3-E5) and activation patching (E8) checked against a forward pass written
out by hand from the weights in plain torch ops (no HF module, no mclib attention):
the interventions must give exactly what their definitions say, not only "something else"."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TWO_PATHS, TWO_PATHS_REL

from mclib.analyses.attention import ablation_hooks
from mclib.analyses.evaluate import activation_patching, predict, sample_eval_batch
from mclib.core.config import DataConfig, ModelConfig
from mclib.core.data import make_batch
from mclib.core.model import build_model

DATA = DataConfig(n=7, rank=2, p_mask=0.3)
SEQ = 49
HEADS = 2


@pytest.fixture(scope="module")
def model():
    # trained weights are not needed: a random init gives non-uniform attention, and
    # larger weights than BERT's 0.02 make each head's pattern differ from input to input
    m = build_model(ModelConfig(layers=2, heads=HEADS, hidden=16, intermediate=32, init_std=0.5), 7, seed=0)
    return m.eval()


def hand_forward(m, tokens, probs_of=None, z_of=None, keep_z=None):
    """MatrixBert's forward from its weights. probs_of(layer, probs) and z_of(layer, z) may
    replace a layer's attention probabilities `[batch, head, q, k]` or per-head outputs
    `[batch, head, q, d]`; keep_z (a dict) receives every layer's z."""
    w = {k: v.double() for k, v in m.state_dict().items()}
    ln = lambda x, p: F.layer_norm(x, x.shape[-1:], w[p + ".weight"], w[p + ".bias"], eps=1e-12)
    lin = lambda x, p: x @ w[p + ".weight"].T + w[p + ".bias"]
    e = "bert.embeddings."
    h = (
        w[e + "word_embeddings.weight"][tokens]
        + w[e + "position_embeddings.weight"][:SEQ]
        + w[e + "token_type_embeddings.weight"][0]
    )
    h = ln(h, e + "LayerNorm")
    b = tokens.shape[0]
    for layer in range(m.config.num_hidden_layers):
        p = f"bert.encoder.layer.{layer}."
        heads = lambda x: x.view(b, SEQ, HEADS, -1).transpose(1, 2)  # [batch, head, seq, d]
        q, k, v = (heads(lin(h, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)
        if probs_of is not None:
            probs = probs_of(layer, probs)
        z = probs @ v
        if keep_z is not None:
            keep_z[layer] = z
        if z_of is not None:
            z = z_of(layer, z)
        a = ln(
            lin(z.transpose(1, 2).reshape(b, SEQ, -1), p + "attention.output.dense") + h,
            p + "attention.output.LayerNorm",
        )
        h = ln(lin(F.gelu(lin(a, p + "intermediate.dense")), p + "output.dense") + a, p + "output.LayerNorm")
    return lin(h, "readout").squeeze(-1).view(b, 7, 7)


@pytest.fixture(scope="module")
def batch():
    return sample_eval_batch(DATA, 16, seed=0)


def test_the_hand_forward_is_the_model(model, batch):
    # the reference itself: equal to the model with nothing switched on, up to float32 against
    # float64 (two float paths, conftest)
    torch.testing.assert_close(hand_forward(model, batch.tokens).float(), predict(model, batch), **TWO_PATHS)


ABLATED = {(0, 1), (1, 0)}


def _replace(mode):
    def probs_of(layer, probs):
        out = probs.clone()
        for l, head in ABLATED:
            if l == layer:
                out[:, head] = 1 / SEQ if mode == "uniform" else probs[:, head].mean(0)
        return out

    return probs_of


@pytest.mark.parametrize("mode", ["uniform", "batch_mean"])
def test_ablation_is_the_hand_forward_with_those_heads_replaced(model, batch, mode):
    ablated = predict(model, batch, hooks=ablation_hooks(model, ABLATED, mode))
    expected = hand_forward(model, batch.tokens, probs_of=_replace(mode)).float()
    torch.testing.assert_close(ablated, expected, **TWO_PATHS)  # float32 hooks vs float64 by hand (conftest)
    # and the replacement matters here: the plain forward is far from it
    assert (ablated - predict(model, batch)).abs().max() > 1e-2


def test_uniform_ablation_of_a_head_averages_its_values(model, batch):
    # 1/seq everywhere: every query of the head reads the mean of the head's value vectors
    with_uniform = {}
    hand_forward(model, batch.tokens, probs_of=_replace("uniform"), keep_z=with_uniform)
    z = with_uniform[0][:, 1]  # layer 0, head 1: [batch, q, d]
    assert torch.allclose(z, z[:, :1].expand_as(z), atol=1e-12)
    w = {k: v.double() for k, v in model.state_dict().items()}
    e = "bert.embeddings."
    h0 = F.layer_norm(
        w[e + "word_embeddings.weight"][batch.tokens]
        + w[e + "position_embeddings.weight"][:SEQ]
        + w[e + "token_type_embeddings.weight"][0],
        (16,),
        w[e + "LayerNorm.weight"],
        w[e + "LayerNorm.bias"],
        eps=1e-12,
    )
    v = (
        h0 @ w["bert.encoder.layer.0.attention.self.value.weight"].T
        + w["bert.encoder.layer.0.attention.self.value.bias"]
    )
    assert torch.allclose(z[:, 0], v[..., 8:].mean(1), atol=1e-12)  # head 1 = dims 8..15


@pytest.mark.parametrize("layers, patched", [("last", [1]), ("all", [0, 1]), ([0], [0])])
def test_patching_is_the_hand_forward_on_minus_x_with_the_clean_z(model, layers, patched):
    clean = sample_eval_batch(DATA, 16, seed=3)
    minus = make_batch(-clean.x, clean.mask)
    clean_z = {}
    hand_forward(model, clean.tokens, keep_z=clean_z)
    f = hand_forward(model, minus.tokens, z_of=lambda l, z: clean_z[l] if l in patched else z).float()
    m = clean.mask

    def mse(target, where):
        return ((f - target)[where] ** 2).mean().item()

    out = activation_patching(model, DATA, 16, seed=3, layers=layers)
    assert out == pytest.approx(
        {
            "masked_vs_X": mse(clean.x, m),
            "masked_vs_negX": mse(-clean.x, m),
            "observed_vs_X": mse(clean.x, ~m),
            "observed_vs_negX": mse(-clean.x, ~m),
        },
        rel=TWO_PATHS_REL,
    )  # float32 hooks vs float64 by hand (conftest)


def test_patching_every_layer_gives_the_clean_output_at_masked_entries(model):
    # A masked entry reads the same MASK token in X and in −X, and with every layer's z
    # patched its residual stream never sees −X: its output is the clean run's. Observed
    # entries keep their −X tokens, so there the output is not the clean one.
    clean = sample_eval_batch(DATA, 16, seed=3)
    plain = predict(model, clean)
    m = clean.mask
    out = activation_patching(model, DATA, 16, seed=3, layers="all")
    # patched (mclib's eager attention) against plain (sdpa): two float paths (conftest)
    assert out["masked_vs_X"] == pytest.approx(((plain - clean.x)[m] ** 2).mean().item(), rel=TWO_PATHS_REL)
    assert out["observed_vs_X"] != pytest.approx(((plain - clean.x)[~m] ** 2).mean().item(), rel=1e-3)
