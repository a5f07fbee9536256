import json

import pytest
import torch

from mclib.core.config import ModelConfig
from mclib.core.data import MASK_ID, sample_batch
from mclib.core.metrics import losses
from mclib.core.model import build_model, load_model

SMALL = ModelConfig(layers=2, heads=2, hidden=16, intermediate=32)


def test_token_types_contribute_nothing_and_stay_frozen(tmp_path):
    m = build_model(SMALL, 7, seed=0)
    tt = m.bert.embeddings.token_type_embeddings.weight
    assert tt.shape[0] == 1 and not tt.any() and not tt.requires_grad
    m.save_pretrained(tmp_path)
    assert not load_model(tmp_path).bert.embeddings.token_type_embeddings.weight.requires_grad


def test_mask_embedding_is_zero_and_never_trained():
    m = build_model(SMALL, 7, seed=0)
    we = m.bert.embeddings.word_embeddings
    assert we.padding_idx == MASK_ID and not we.weight[MASK_ID].any()
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        b = sample_batch(16, 7, 2, 0.3, g)
        loss = losses(m(b.tokens).view_as(b.x), b.x, b.mask)["L"]
        opt.zero_grad(); loss.backward(); opt.step()
    assert not we.weight[MASK_ID].any()


def test_readout_keeps_pytorch_default_init_and_bert_gets_002():
    m = build_model(ModelConfig(layers=1, heads=2, hidden=256, intermediate=64), 7, seed=0)
    bound = 256 ** -0.5  # nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), bias too
    w = m.readout.weight
    assert w.abs().max() <= bound and abs(w.std().item() - bound / 3 ** 0.5) < 0.01
    assert m.readout.bias.item() != 0
    q = m.bert.encoder.layer[0].attention.self.query
    assert abs(q.weight.std().item() - 0.02) < 0.002 and not q.bias.any()


def test_all_ones_attention_mask_is_the_default():
    # Passing an explicit all-ones mask must change nothing: masked tokens are attended to.
    m = build_model(SMALL, 7, seed=0).eval()
    b = sample_batch(4, 7, 2, 0.3, torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = m(b.tokens)
        c = m(b.tokens, attention_mask=torch.ones_like(b.tokens))
    assert torch.allclose(a, c, atol=1e-6)


def test_no_pooler_and_output_shape():
    m = build_model(SMALL, 7, seed=0)
    assert m.bert.pooler is None
    assert m(torch.zeros(3, 49, dtype=torch.long)).shape == (3, 49)


def test_checkpoint_round_trip_through_from_pretrained(tmp_path):
    m = build_model(ModelConfig(layers=2, heads=2, hidden=16, intermediate=32), 7, seed=0)
    m.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").is_file() and (tmp_path / "model.safetensors").is_file()
    r = load_model(tmp_path)
    for (k, a), (_, b) in zip(m.state_dict().items(), r.state_dict().items()):
        assert torch.equal(a, b), k
    assert r.bert.encoder.layer[0].attention.self.scaling == m.bert.encoder.layer[0].attention.self.scaling
    toks = torch.randint(1, 2002, (2, 49))
    with torch.no_grad():
        # the weights are equal to the bit (above); the outputs of two model objects can
        # differ in the last bit on some CPUs (seen on an AVX2-only EPYC: 3e-8), where
        # the fused attention kernel's path depends on memory layout
        torch.testing.assert_close(m.eval()(toks), r(toks), rtol=0, atol=1e-6)


def test_same_seed_same_init():
    a, b = build_model(SMALL, 7, seed=3), build_model(SMALL, 7, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("key, on", [("attn_logit_scale", 4.0), ("position_init_std", 0.2), ("qk_norm", True)])
def test_a_checkpoint_from_before_the_levers_left_loads_while_they_are_off(tmp_path, key, on):
    """config.json of a checkpoint saved at c6ddcac or before holds attn_logit_scale,
    position_init_std and qk_norm: at their "off" values it loads as the same model; with
    the lever on it is refused in one line naming it (it would load as another model)."""
    m = build_model(SMALL, 7, seed=0)
    m.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(
        {**config, "attn_logit_scale": 1.0, "position_init_std": None, "qk_norm": False}))
    toks = torch.randint(1, 2002, (2, 49))
    with torch.no_grad():
        torch.testing.assert_close(load_model(tmp_path)(toks), m.eval()(toks), rtol=0, atol=1e-6)
    (tmp_path / "config.json").write_text(json.dumps({**config, key: on}))
    with pytest.raises(ValueError, match=rf"config.json has {key} = {on!r}, a lever removed after revision c6ddcac") as e:
        load_model(tmp_path)
    assert "\n" not in str(e.value)
