import json
import logging
from pathlib import Path

import pytest
import torch

from mclib.core.attention import IMPL
from mclib.core.config import ModelConfig
from mclib.core.data import MASK_ID, sample_batch
from mclib.core.metrics import losses, run_losses
from mclib.core.model import (
    LEGACY,
    MODEL_TYPE,
    MatrixBert,
    MatrixBertConfig,
    MatrixCompletionOutput,
    build_model,
    config_text,
    load_model,
)

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
        loss = losses(m(b.tokens).logits.view_as(b.x), b.x, b.mask)["L"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert not we.weight[MASK_ID].any()


def test_readout_keeps_pytorch_default_init_and_bert_gets_002():
    m = build_model(ModelConfig(layers=1, heads=2, hidden=256, intermediate=64), 7, seed=0)
    bound = 256**-0.5  # nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), bias too
    w = m.readout.weight
    assert w.abs().max() <= bound and abs(w.std().item() - bound / 3**0.5) < 0.01
    assert m.readout.bias.item() != 0
    q = m.bert.encoder.layer[0].attention.self.query
    assert abs(q.weight.std().item() - 0.02) < 0.002 and not q.bias.any()


def test_all_ones_attention_mask_is_the_default():
    # Passing an explicit all-ones mask must change nothing: masked tokens are attended to.
    m = build_model(SMALL, 7, seed=0).eval()
    b = sample_batch(4, 7, 2, 0.3, torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = m(b.tokens).logits
        c = m(b.tokens, attention_mask=torch.ones_like(b.tokens)).logits
    assert torch.allclose(a, c, atol=1e-6)


def test_no_pooler_and_output_shape():
    m = build_model(SMALL, 7, seed=0)
    assert m.bert.pooler is None
    assert m(torch.zeros(3, 49, dtype=torch.long)).logits.shape == (3, 49)


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
        torch.testing.assert_close(m.eval()(toks).logits, r(toks).logits, rtol=0, atol=1e-6)


def test_same_seed_same_init():
    a, b = build_model(SMALL, 7, seed=3), build_model(SMALL, 7, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize(
    "key, on", [("attn_logit_scale", 4.0), ("position_init_std", 0.2), ("qk_norm", True)]
)
def test_a_checkpoint_from_before_the_levers_left_loads_while_they_are_off(tmp_path, key, on):
    """config.json of a checkpoint saved at c6ddcac or before holds attn_logit_scale,
    position_init_std and qk_norm: at their "off" values it loads as the same model; with
    the lever on it is refused in one line naming it (it would load as another model)."""
    m = build_model(SMALL, 7, seed=0)
    m.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({**config, "attn_logit_scale": 1.0, "position_init_std": None, "qk_norm": False})
    )
    toks = torch.randint(1, 2002, (2, 49))
    with torch.no_grad():
        torch.testing.assert_close(
            load_model(tmp_path)(toks).logits, m.eval()(toks).logits, rtol=0, atol=1e-6
        )
    (tmp_path / "config.json").write_text(json.dumps({**config, key: on}))
    with pytest.raises(
        ValueError, match=rf"config.json has {key} = {on!r}, a lever removed after revision c6ddcac"
    ) as e:
        load_model(tmp_path)
    assert "\n" not in str(e.value)


# --- a HuggingFace model of its own (model_type matrix-bert) ---------------------------------

LEGACY_FIXTURE = Path(__file__).parent / "data" / "checkpoint-e98d07d"


def test_automodel_loads_a_saved_checkpoint_whole_with_its_readout(tmp_path):
    """config.json says matrix-bert, and transformers' AutoModel (no remote code) builds a
    MatrixBert from it, read-out included, in eval mode, with the same weights and outputs."""
    from transformers import AutoConfig, AutoModel

    m = build_model(SMALL, 7, seed=0).eval()
    m.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (
        saved["model_type"] == MODEL_TYPE
        and saved["architectures"] == ["MatrixBert"]
        and saved["matrix_n"] == 7
    )
    assert isinstance(AutoConfig.from_pretrained(tmp_path), MatrixBertConfig)
    auto = AutoModel.from_pretrained(tmp_path, trust_remote_code=False)
    assert type(auto) is MatrixBert and not auto.training
    assert not auto.bert.embeddings.token_type_embeddings.weight.requires_grad
    assert list(auto.state_dict()) == list(m.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(auto.state_dict().values(), m.state_dict().values()))
    toks = torch.randint(1, 2002, (2, 49))
    with torch.no_grad():
        torch.testing.assert_close(auto(toks).logits, m(toks).logits, rtol=0, atol=1e-6)


def test_automodel_rebuilds_the_attention_bias_on_mclib_s_attention(tmp_path):
    from transformers import AutoModel

    m = build_model(
        ModelConfig(layers=1, heads=2, hidden=16, intermediate=32, attn_bias=2.0), 3, seed=0
    ).eval()
    m.save_pretrained(tmp_path)
    auto = AutoModel.from_pretrained(tmp_path)
    assert (
        auto.config._attn_implementation == IMPL
        and auto.bert.encoder.layer[0].attention.self.attn_bias == 2.0
    )
    toks = torch.randint(1, 2002, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(auto(toks).logits, m(toks).logits, rtol=0, atol=1e-6)


def test_forward_returns_a_model_output_whose_loss_is_the_training_step_s_L():
    """logits [batch, n*n]; with labels, loss is L as the training step differentiates it
    (squared_errors' mean): the same bits as run_losses' L of the same predictions; as a tuple
    where return_dict=False. A label tensor of another size is refused in one line."""
    m = build_model(SMALL, 7, seed=0)
    b = sample_batch(8, 7, 2, 0.3, torch.Generator().manual_seed(1))
    out = m(b.tokens, labels=b.x)
    assert isinstance(out, MatrixCompletionOutput) and out.logits.shape == (8, 49)
    assert m(b.tokens).loss is None
    with torch.no_grad():
        L = run_losses(out.logits.detach()[None], b.x[None], b.mask[None])[0, 0]
    assert out.loss.requires_grad and torch.equal(out.loss.detach(), L)
    assert torch.equal(m(b.tokens, labels=b.x.flatten(1)).loss, out.loss)
    loss, logits = m(b.tokens, labels=b.x, return_dict=False)
    assert torch.equal(loss, out.loss) and torch.equal(logits, out.logits)
    hidden = m(b.tokens, output_hidden_states=True).hidden_states
    assert len(hidden) == SMALL.layers + 1 and all(
        torch.equal(h, g) for h, g in zip(hidden, m.hidden_states(b.tokens))
    )
    with pytest.raises(ValueError, match=r"labels of shape \(8, 5, 5\) do not fit the predictions \(8, 49\)"):
        m(b.tokens, labels=torch.zeros(8, 5, 5))


def test_a_checkpoint_saved_before_the_matrix_bert_type_loads_whole_with_one_line(caplog):
    """tests/data/checkpoint-e98d07d: a MatrixBert (1 layer, 1 head, hidden 3, n = 3, seed 5)
    saved by revision e98d07d, whose config.json says model_type bert, and the predictions
    that revision's model gave on four matrices (expected.json, on 2 AMD EPYC cores). It loads
    through load_model and MatrixBert.from_pretrained as a MatrixBert with its read-out: every
    weight of the file to the bit, the predictions to 1e-6 (another CPU's kernels may round
    the last bit otherwise; on the machine that wrote them they were equal to the bit); the
    first such load in a process says so in one line."""
    from safetensors.torch import load_file

    import mclib.core.model as M

    saved = json.loads((LEGACY_FIXTURE / "config.json").read_text())
    assert {k: saved[k] for k in LEGACY} == LEGACY and "matrix_n" in saved  # the old format, as committed
    expected = json.loads((LEGACY_FIXTURE / "expected.json").read_text())
    tokens, want = torch.tensor(expected["tokens"]), torch.tensor(expected["predictions"])
    M._said_legacy.clear()
    with caplog.at_level(logging.WARNING, logger="mclib.core.model"):
        model = load_model(LEGACY_FIXTURE)
    [record] = [r for r in caplog.records if r.name == "mclib.core.model"]
    assert "model_type 'bert', the format saved before 2026-11-29" in record.getMessage()
    assert "\n" not in record.getMessage() and str(LEGACY_FIXTURE) in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mclib.core.model"):
        direct = MatrixBert.from_pretrained(LEGACY_FIXTURE)
    assert not [r for r in caplog.records if r.name == "mclib.core.model"]  # once per process
    weights = load_file(LEGACY_FIXTURE / "model.safetensors")
    for m in (model, direct):
        assert type(m) is MatrixBert and isinstance(m.config, MatrixBertConfig) and not m.training
        assert not m.bert.embeddings.token_type_embeddings.weight.requires_grad
        state = m.state_dict()
        assert set(weights) == set(state) and "readout.weight" in weights
        assert all(torch.equal(state[k], v) for k, v in weights.items())
        with torch.no_grad():
            torch.testing.assert_close(m(tokens).logits, want, rtol=0, atol=1e-6)


def test_an_old_checkpoint_saved_again_is_matrix_bert_and_automodel_loads_it(tmp_path):
    from transformers import AutoModel

    load_model(LEGACY_FIXTURE).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == MODEL_TYPE
    assert json.loads(config_text(LEGACY_FIXTURE))["model_type"] == MODEL_TYPE  # what the series zip writes
    expected = json.loads((LEGACY_FIXTURE / "expected.json").read_text())
    with torch.no_grad():
        got = AutoModel.from_pretrained(tmp_path)(torch.tensor(expected["tokens"])).logits
    torch.testing.assert_close(got, torch.tensor(expected["predictions"]), rtol=0, atol=1e-6)


def test_a_folder_of_another_bert_is_refused_in_one_line(tmp_path):
    from transformers import BertConfig

    BertConfig(num_hidden_layers=1, architectures=["BertForMaskedLM"]).save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match=r"model_type 'bert', architectures \['BertForMaskedLM'\]: not a MatrixBert"
    ) as e:
        load_model(tmp_path)
    assert "\n" not in str(e.value)


def test_matmul_attention_switches_a_matrix_bert_to_eager():
    from mclib.core.step import use_matmul_attention

    for m in (build_model(SMALL, 7, seed=0), load_model(LEGACY_FIXTURE)):
        assert m.config._attn_implementation == "sdpa"
        use_matmul_attention(m)
        assert m.config._attn_implementation == "eager"


def test_a_card_header_without_a_measured_l_mask_has_no_result_and_a_folder_without_weights_is_refused(
    tmp_path,
):
    import hashlib

    from mclib.core.card import card_data, weight_hashes
    from mclib.core.config import load_profile, profile_path

    p = load_profile(profile_path("smoke"))
    data = card_data(p, 40, LEGACY_FIXTURE)
    assert data.eval_results is None and data.mclib["step"] == 40 and data.mclib["profile"] == "smoke"
    sha = hashlib.sha256((LEGACY_FIXTURE / "model.safetensors").read_bytes()).hexdigest()
    assert data.mclib["weights_sha256"] == {"model.safetensors": sha}
    [result] = card_data(p, 40, LEGACY_FIXTURE, l_mask=0.25, matrices=32).eval_results
    assert result.metric_value == 0.25 and "32 fresh 7x7 rank-2 matrices" in result.dataset_name
    with pytest.raises(FileNotFoundError, match="no weight file") as e:
        weight_hashes(tmp_path)
    assert "\n" not in str(e.value)
