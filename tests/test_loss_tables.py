"""The loss tables chapters 02 and 03 share (mclib/chapters/loss_tables_shown.py)."""

import math

import pytest
import torch

from mclib.analyses import loss_tables as lt
from mclib.analyses.attention import ablation_hooks
from mclib.analyses.evaluate import evaluate, sample_eval_batch
from mclib.chapters import loss_tables_shown as shown
from mclib.core.checkpoints import load_checkpoint

N = 7


@pytest.fixture
def post(smoke_run, smoke_profile):
    return load_checkpoint(smoke_run, smoke_profile.checkpoints.post)


def test_head_name_is_one_indexed_and_all_heads_covers_the_model(post):
    assert lt.head_name((0, 0)) == "L1 H1" and lt.head_name((3, 7)) == "L4 H8"
    c = post.config
    assert len(lt.all_heads(post)) == c.num_hidden_layers * c.num_attention_heads


def test_ablation_table_compares_on_one_batch(post, smoke_profile):
    heads = lt.all_heads(post)
    table = lt.ablation_table(post, smoke_profile.data, 16, 0, {"all": heads, "empty": [], "one": [heads[0]]})
    assert list(zip(table.ablated, table.reading)) == [
        ("none", "—"),
        ("all", "uniform"),
        ("all", "batch_mean"),
        ("one", "uniform"),
        ("one", "batch_mean"),
    ]
    assert table.iloc[0]["L"] == pytest.approx(evaluate(post, smoke_profile.data, 16, 0)["L"])
    hooked = evaluate(post, smoke_profile.data, 16, 0, hooks=ablation_hooks(post, heads, mode="batch_mean"))
    assert lt.lookup(table, "L_mask", ablated="all", reading="batch_mean") == pytest.approx(hooked["L_mask"])
    assert lt.lookup(table, "heads", ablated="one", reading="uniform") == 1
    assert math.isnan(lt.lookup(table, "L", ablated="empty"))
    with pytest.raises(ValueError, match="2 rows match"):
        lt.lookup(table, "L", ablated="all")
    assert (table["L_mask_se"] > 0).all()


def test_model_table_is_each_model_on_one_batch(post, smoke_run, smoke_profile):
    pre = load_checkpoint(smoke_run, smoke_profile.checkpoints.pre)
    table = lt.model_table({"post": post, "pre": pre}, smoke_profile.data, 16, 0).set_index("model")
    assert list(table.index) == ["post", "pre"]
    batch = sample_eval_batch(smoke_profile.data, 16, 0)
    for name, model in (
        ("post", post),
        ("pre", pre),
    ):  # each row: that model's losses on the one batch, by hand
        with torch.no_grad():
            err = (model.eval()(batch.tokens).logits.view(16, N, N) - batch.x) ** 2
        assert table.at[name, "L_mask"] == pytest.approx(err[batch.mask].mean().item(), rel=1e-5)
        assert table.at[name, "L_obs"] == pytest.approx(err[~batch.mask].mean().item(), rel=1e-5)
        assert table.at[name, "L"] == pytest.approx(err.mean().item(), rel=1e-5)
    assert table.at["post", "L"] != table.at["pre", "L"]


def test_ratio_and_its_error():
    import pandas as pd

    t = pd.DataFrame({"model": ["a", "b"], "L": [2.0, 1.0], "L_se": [0.2, 0.1]})
    r, se = lt.ratio_and_se(t, "L", {"model": "a"}, {"model": "b"})
    assert r == 2.0 and se == pytest.approx(2.0 * math.hypot(0.1, 0.1))
    assert math.isnan(lt.ratio_se(0.0, 0.1, 1.0, 0.1))


def test_matching_reading_text_names_the_reading_that_matches():
    assert shown.matching_reading_text(["matches", "differs"], "X") == (
        "the uniform reading (the paper's text) matches X; the "
        "batch-mean reading (the released code) does not match it"
    )
    assert shown.matching_reading_text(["differs", "matches"], "X").startswith("the batch-mean reading")
    assert shown.matching_reading_text(["matches", "matches"], "X") == "both readings match X"
    assert shown.matching_reading_text(["differs", "n/a"], "X") == "neither reading matches X"
    close = "too close to tell"  # scorecard_rules.CLOSE
    assert shown.matching_reading_text(["matches", close], "X").endswith(
        "the released code) is too close to it to tell"
    )
    assert shown.matching_reading_text(["differs", close], "X") == (
        "the batch-mean reading (the released code) is too "
        "close to X to tell; the uniform reading (the paper's text) "
        "does not match it"
    )
    # 2026-11-28: the sentence ended "... does not" after "is too close to X to tell": no verb to refer to
    assert not any(
        shown.matching_reading_text(v, "X").endswith("does not")
        for v in (["matches", "differs"], ["differs", close], [close, "differs"])
    )
    assert shown.matching_reading_text([close, close], "X") == "both readings are too close to X to tell"
