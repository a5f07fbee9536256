import math

import pytest
import torch

from mclib.analyses.heads import (
    LABELS,
    attention_entropy,
    chance_levels,
    classify_heads,
    head_groups,
    head_scores,
    mean_attention,
    position_masks,
)
from mclib.core.config import ModelConfig
from mclib.core.data import sample_batch
from mclib.core.model import build_model

N = 7


def _normalise(weights: torch.Tensor) -> torch.Tensor:
    return weights / weights.sum(-1, keepdim=True)


def synthetic_probs(mask: torch.Tensor) -> torch.Tensor:
    """`[batch, 5, 49, 49]`: pure row, pure column, identity, uniform, observed-only heads."""
    batch = mask.shape[0]
    keys = position_masks(N)
    row = _normalise(keys["row"].double()).expand(batch, -1, -1)
    col = _normalise(keys["column"].double()).expand(batch, -1, -1)
    ident = keys["self"].double().expand(batch, -1, -1)
    uniform = torch.full((batch, N * N, N * N), 1 / N**2, dtype=torch.double)
    obs = _normalise((~mask.reshape(batch, 1, N * N)).double().expand(-1, N * N, -1))
    return torch.stack([row, col, ident, uniform, obs], dim=1)


@pytest.fixture
def mask(gen):
    m = torch.rand(16, N, N, generator=gen) < 0.3
    m[:, 0, 0] = False  # no fully masked matrix: the observed-only head needs a key
    return m


def test_pure_heads_are_scored_and_classified(mask):
    scores = head_scores(synthetic_probs(mask), mask, N)
    chance = chance_levels(N)
    assert list(scores["head"]) == [0, 1, 2, 3, 4] and (scores["layer"] == 0).all()
    row, col, ident, uniform, obs = (scores.iloc[i] for i in range(5))
    assert (
        row["row"] == pytest.approx(1)
        and row["column"] == pytest.approx(0)
        and row["self"] == pytest.approx(0)
    )
    assert col["column"] == pytest.approx(1) and col["row"] == pytest.approx(0)
    assert ident["self"] == pytest.approx(1) and ident["row"] == pytest.approx(0)
    assert ident["row_excess"] == pytest.approx(-chance["row"] / (1 - chance["row"]))  # below chance
    assert ident["self_excess"] == pytest.approx(1)
    # uniform: exactly the chance levels, zero excess, mask preference 0, entropy log(n²)
    for k in ("row", "column", "self"):
        assert uniform[k] == pytest.approx(chance[k]) and uniform[f"{k}_excess"] == pytest.approx(
            0, abs=1e-12
        )
    assert uniform["masked"] == pytest.approx(mask.float().mean().item())
    assert uniform["mask_preference"] == pytest.approx(0, abs=1e-12)
    assert uniform["entropy"] == pytest.approx(math.log(N**2))
    assert obs["masked"] == pytest.approx(0) and obs["mask_preference"] == pytest.approx(-1)
    assert (scores["observed"] + scores["masked"]).to_numpy() == pytest.approx(1)
    labels = classify_heads(scores)
    assert list(labels) == ["row", "column", "identity", "other", "mask-aware"]


def test_chance_levels_formula():
    assert chance_levels(7) == {"row": 6 / 49, "column": 6 / 49, "self": 1 / 49}


def test_layers_from_a_list_and_groups(mask):
    p = synthetic_probs(mask)
    scores = head_scores([p, p.flip(1)], mask, N)  # layer 1 has the heads in reverse order
    assert list(scores["layer"]) == [0] * 5 + [1] * 5
    groups = head_groups(classify_heads(scores))
    assert set(groups) == set(LABELS)
    assert groups["row"] == [(0, 0), (1, 4)] and groups["identity"] == [(0, 2), (1, 2)]
    assert groups["mask-aware"] == [(0, 4), (1, 0)] and groups["other"] == [(0, 3), (1, 1)]
    # a stacked [layer, batch, head, q, k] tensor and a {layer: probs} dict give the same numbers
    stacked = head_scores(torch.stack([p, p.flip(1)]), mask, N)
    assert stacked.equals(scores)
    assert list(head_scores({3: p}, mask, N)["layer"].unique()) == [3]


def test_a_fixed_mask_broadcasts(mask):
    p = synthetic_probs(mask[:1].expand(16, -1, -1))
    a = head_scores(p, mask[0], N)
    b = head_scores(p, mask[:1].expand(16, -1, -1), N)
    assert a.equals(b)


def test_threshold_moves_the_labels(mask):
    p = synthetic_probs(mask)
    mix = 0.4 * p[:, :1] + 0.6 * p[:, 3:4]  # 40% row head + 60% uniform: excess ≈ 0.4
    scores = head_scores(mix, mask, N)
    assert scores["row_excess"].item() == pytest.approx(0.4, abs=1e-9)
    assert classify_heads(scores).item() == "other"
    assert classify_heads(scores, threshold=0.3).item() == "row"


def test_mean_attention_and_entropy_shapes(mask):
    p = synthetic_probs(mask)
    assert mean_attention(p).shape == (5, N * N, N * N)
    ent = attention_entropy(p)
    assert (
        ent.shape == (5,)
        and ent[2].item() == pytest.approx(0)
        and ent[0].item() == pytest.approx(math.log(6))
    )


def test_bad_inputs_name_the_value(mask):
    p = synthetic_probs(mask)
    with pytest.raises(ValueError, match="n = 6"):
        head_scores(p, mask, 6)
    with pytest.raises(ValueError, match="layer 1"):
        head_scores([p, p[:, :3]], mask, N)
    with pytest.raises(ValueError, match="mask batch 8"):
        head_scores(p, mask[:8], N)
    with pytest.raises(ValueError, match="logits"):
        head_scores(p * 3, mask, N)
    with pytest.raises(ValueError, match="3 dims"):
        mean_attention(p[0])
    with pytest.raises(ValueError, match="'bogus'"):
        head_groups(classify_heads(head_scores(p, mask, N)).replace("row", "bogus"))


def test_runs_on_a_real_models_attention(gen):
    model = build_model(
        ModelConfig(layers=2, heads=2, hidden=16, intermediate=32, attention="eager"), N, seed=0
    )
    b = sample_batch(8, N, 2, 0.3, gen)
    with torch.no_grad():
        attn = model.bert(input_ids=b.tokens, output_attentions=True).attentions
    scores = head_scores(attn, b.mask, N)
    assert len(scores) == 4 and scores[["row", "column", "self", "masked"]].stack().between(0, 1).all()
    # an untrained model is close to uniform
    assert scores["row"].to_numpy() == pytest.approx(6 / 49, abs=0.02)


def test_attention_progress_has_a_row_per_checkpoint_layer_and_head(smoke_run, smoke_profile):
    from mclib.analyses.heads import attention_progress
    from mclib.core.checkpoints import saved_steps

    df = attention_progress(smoke_run, smoke_profile.data, n_matrices=8)
    m = smoke_profile.model
    assert len(df) == len(saved_steps(smoke_run)) * m.layers * m.heads
    assert df[["row", "column", "self"]].notna().all().all()
