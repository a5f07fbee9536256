import math

import pandas as pd
import pytest
import torch

from mclib.book import experiments as ex
from mclib.core.data import structured_mask
from mclib.analyses.evaluate import activation_patching, evaluate, predict, sample_eval_batch
from mclib.analyses.heads import head_scores, position_masks
from mclib.core.runs import load_checkpoint

N = 7


@pytest.fixture
def post(smoke_run, smoke_profile):
    return load_checkpoint(smoke_run, smoke_profile.checkpoints.post)


def test_head_name_is_one_indexed_and_all_heads_covers_the_model(post):
    assert ex.head_name((0, 0)) == "L1 H1" and ex.head_name((3, 7)) == "L4 H8"
    c = post.config
    assert len(ex.all_heads(post)) == c.num_hidden_layers * c.num_attention_heads


def test_copy_check_rows_and_l_prime_mask(post, smoke_profile):
    table = ex.copy_check(post, smoke_profile.data, 16, seed=3)
    assert list(zip(table.matrices, table.token)) == [(m, t) for m in ("low-rank", "random") for t in ("MASK", "0.44", "-0.24")]
    batch = sample_eval_batch(smoke_profile.data, 16, 3)
    pred = predict(post, batch)
    row = table.iloc[0]  # low-rank, MASK: the plain evaluation, and L'_mask = mean X̂² at masked entries
    assert row["L_mask"] == pytest.approx(evaluate(post, smoke_profile.data, 16, 3)["L_mask"])
    assert row["L'_mask"] == pytest.approx((pred[batch.mask] ** 2).mean().item(), rel=1e-5)
    filled = sample_eval_batch(smoke_profile.data, 16, 3, fill_value=0.44)
    assert table.iloc[1]["L'_mask"] == pytest.approx(((predict(post, filled)[filled.mask] - 0.44) ** 2).mean().item(), rel=1e-5)


def test_ablation_table_compares_on_one_batch(post, smoke_profile):
    heads = ex.all_heads(post)
    table = ex.ablation_table(post, smoke_profile.data, 16, 0, {"all": heads, "empty": [], "one": [heads[0]]})
    assert list(zip(table.ablated, table.reading)) == [("none", "—"), ("all", "uniform"), ("all", "batch_mean"),
                                                       ("one", "uniform"), ("one", "batch_mean")]
    assert table.iloc[0]["L"] == pytest.approx(evaluate(post, smoke_profile.data, 16, 0)["L"])
    hooked = evaluate(post, smoke_profile.data, 16, 0, hooks=lambda h: h.ablate(heads, mode="batch_mean"))
    assert ex.lookup(table, "L_mask", ablated="all", reading="batch_mean") == pytest.approx(hooked["L_mask"])
    assert ex.lookup(table, "heads", ablated="one", reading="uniform") == 1
    assert math.isnan(ex.lookup(table, "L", ablated="empty"))
    with pytest.raises(ValueError, match="2 rows match"):
        ex.lookup(table, "L", ablated="all")


def test_model_table_and_patching_table(post, smoke_run, smoke_profile):
    pre = load_checkpoint(smoke_run, smoke_profile.checkpoints.pre)
    table = ex.model_table({"post": post, "pre": pre}, smoke_profile.data, 16, 0).set_index("model")
    assert list(table.index) == ["post", "pre"]
    batch = sample_eval_batch(smoke_profile.data, 16, 0)
    for name, model in (("post", post), ("pre", pre)):  # each row: that model's losses on the one batch, by hand
        with torch.no_grad():
            err = (model.eval()(batch.tokens).view(16, N, N) - batch.x) ** 2
        assert table.at[name, "L_mask"] == pytest.approx(err[batch.mask].mean().item(), rel=1e-5)
        assert table.at[name, "L_obs"] == pytest.approx(err[~batch.mask].mean().item(), rel=1e-5)
        assert table.at[name, "L"] == pytest.approx(err.mean().item(), rel=1e-5)
    assert table.at["post", "L"] != table.at["pre", "L"]
    patch = ex.patching_table(post, smoke_profile.data, 8, 0)
    assert list(patch.patched) == ["none", "last layer", "all layers"]
    assert patch.iloc[0]["masked_vs_X"] == pytest.approx(activation_patching(post, smoke_profile.data, 8, 0, layers=[])["masked_vs_X"])


def test_checkpoint_maps_are_batch_mean_probabilities(smoke_run, smoke_profile):
    batch = sample_eval_batch(smoke_profile.data, 4, 0)
    steps = smoke_profile.checkpoints.all_steps()[:2]
    maps = ex.checkpoint_maps(smoke_run, steps, batch)
    m = smoke_profile.model
    assert list(maps) == steps and maps[steps[0]].shape == (m.layers, m.heads, N * N, N * N)
    assert torch.allclose(maps[steps[0]].sum(-1), torch.ones(m.layers, m.heads, N * N), atol=1e-4)


def test_pick_heads_takes_distinct_heads():
    scores = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0], "a": [3.0, 2.0, 1.0], "b": [3.0, 0.0, 2.0]})
    picks = ex.pick_heads(scores, {"top a": ("a", True), "top b": ("b", True), "low a": ("a", False), "more": ("a", True)})
    assert picks == {"top a": (0, 0), "top b": (1, 0), "low a": (0, 1)}  # "more": every head is taken


def test_structured_scores_on_synthetic_heads():
    mask = structured_mask(N)
    batch = 3
    flat = mask.reshape(-1)
    row = torch.arange(N * N) // N
    lone = ((row[:, None] == row[None]) & ~flat[None]).double()           # own row's observed keys
    lone = torch.where(lone.sum(-1, keepdim=True) > 0, lone, torch.ones_like(lone))
    lone = lone / lone.sum(-1, keepdim=True)
    uniform = torch.full((N * N, N * N), 1 / N**2, dtype=torch.double)
    ident = position_masks(N)["self"].double()
    probs = torch.stack([lone, uniform, ident])[None].expand(batch, -1, -1, -1)  # [batch, 3 heads, q, k]
    scores = ex.structured_scores(probs, mask, N)
    chance = scores.attrs["chance"]
    assert list(scores.columns[:len(head_scores(probs, mask, N).columns)]) == list(head_scores(probs, mask, N).columns)
    assert scores.loc[0, "lone_entry"] == pytest.approx(1.0)               # the lone entry of masked rows
    assert scores.loc[1, "lone_entry"] == pytest.approx(chance["lone_entry"]) == pytest.approx(1 / N**2)
    assert scores.loc[1, "masked_rows"] == pytest.approx(chance["masked_rows"]) == pytest.approx(2 / N)
    assert scores.loc[2, "lone_entry"] == 0 and scores.loc[2, "masked_rows"] == pytest.approx(1.0)  # self, in a masked row
    with pytest.raises(ValueError, match="one \\[7, 7\\] mask"):
        ex.structured_scores(probs, mask.expand(batch, N, N), N)


def test_compare_runs_reads_the_drop_and_evaluates_the_last_checkpoints(smoke_run, smoke_profile, tmp_path):
    import shutil

    from mclib.analyses.evaluate import compare_runs
    from mclib.core.runs import load_metrics

    # a copy of the smoke run whose L_mask drops from the plateau (0.22, rank 2) to 0.01 after step 30:
    # the 50-step trailing mean falls below half the plateau at step 56
    dropped = tmp_path / "dropped"
    shutil.copytree(smoke_run, dropped)
    m = load_metrics(dropped)
    m["L_mask"] = [0.22 if s <= 30 else 0.01 for s in m["step"]]
    m.to_csv(dropped / "metrics.csv", index=False)

    table = compare_runs({"a": smoke_run, "b": dropped}, after=(2, 10), n_matrices=64, seed=3,
                         precisions=("fp32", "bf16"))
    assert list(table.index) == ["a", "b"]
    assert table.at["b", "steps"] == 60 and table.at["b", "drop"] == 56
    assert math.isnan(table.at["a", "drop"]) and math.isnan(table.at["a", "L_mask_drop+2"])
    assert table.at["b", "L_mask_drop+2"] == pytest.approx((22 * 0.22 + 28 * 0.01) / 50)  # steps 9-58
    assert math.isnan(table.at["b", "L_mask_drop+10"])  # past the run's end
    # the last checkpoints on the same fresh matrices, in fp32: equal weights, equal losses
    expected = evaluate(load_checkpoint(smoke_run, 60), smoke_profile.data, 64, seed=3)["L_mask"]
    assert table.at["a", "checkpoint_L_mask_fp32"] == table.at["b", "checkpoint_L_mask_fp32"] == expected
    # bf16 autocast: the same model, a less precise forward pass: close, not equal
    assert table.at["a", "checkpoint_L_mask_bf16"] == pytest.approx(expected, rel=0.05)
    assert table.at["a", "checkpoint_L_mask_bf16"] != expected
