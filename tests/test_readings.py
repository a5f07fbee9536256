"""The closing sentences of chapters 01-03 and 05 read right in every branch (drop or not,
the paper's result or not), and the scorecard rows carry the paper's numbers."""
import pandas as pd
import pytest


from mclib.book import scorecard
from mclib.analyses.interventions import GROUPS
from mclib.book.readings import freeze_readings
from mclib.core.runs import load_checkpoint

def _verdict(tmp_path, row):
    return scorecard.record(tmp_path, **row, chapter="test")["verdict"]


def _table(drops):
    return pd.DataFrame({"group": list(GROUPS), "drop": pd.array(drops, dtype="Int64")})


def test_freeze_sentences(tmp_path):
    glue, rows = freeze_readings(_table([500, 40, 900, 60]), 1000, main_drop=700)
    assert glue["found"].startswith("the runs dropped in the order mlp (step 40), token (step 60)")
    assert glue["verdict_text"].endswith("the positional run takes longest, as in the paper")
    assert [r["ours"] for r in rows[:4]] == [500 / 700, 40 / 700, 900 / 700, 60 / 700]
    assert "paper: no plateau" in rows[1]["reading"]
    assert [_verdict(tmp_path, r) for r in rows] == ["same direction"] * 4 + ["same order"]
    _, rows = freeze_readings(_table([500, 40, 300, 60]), 1000, main_drop=700)  # positional before attention
    assert _verdict(tmp_path, rows[-1]) == "differs"
    _, rows = freeze_readings(_table([500, 600, 900, 60]), 1000, main_drop=700)  # the mlp run sits on a plateau, drops after attention
    assert _verdict(tmp_path, rows[1]) == "differs" and _verdict(tmp_path, rows[-1]) == "differs"
    glue, rows = freeze_readings(_table([None] * 4), 20, main_drop=None)
    assert glue["found"] == "none of the four runs dropped within its 20 steps"
    assert glue["verdict_text"] == "too short to check the paper's ordering"
    assert rows[0]["ours"] is None and rows[0]["reading"].startswith("no drop by step 20")
    assert [_verdict(tmp_path, r) for r in rows] == ["n/a"] * 4 + ["differs"]
    glue, _ = freeze_readings(_table([60, 500, None, None]), 1000, main_drop=700)
    assert "positional, token did not drop within 1,000 steps" in glue["found"]
    assert glue["verdict_text"].startswith("which is not the paper's picture")


# --- 01-03: training, copying and heads rows ---------------------------------------------

@pytest.fixture(scope="module")
def model_tables(smoke_run, smoke_profile):
    from mclib.book import experiments as ex
    from mclib.analyses.heads import capture_probs, classify_heads, head_groups, head_scores
    from mclib.analyses.evaluate import sample_eval_batch
    from mclib.analyses.interventions import permute_positions, switch_qkv
    from mclib.analyses.probes import probe_layers, probe_sets

    ck = smoke_profile.checkpoints
    post, pre = load_checkpoint(smoke_run, ck.post), load_checkpoint(smoke_run, ck.pre)
    e2 = ex.copy_check(pre, smoke_profile.data, 8, 0)
    e3 = ex.ablation_table(pre, smoke_profile.data, 8, 0, {"all heads": ex.all_heads(pre)})
    e6 = ex.model_table({"pre with post's QKV": switch_qkv(pre, post)}, smoke_profile.data, 8, 0)
    batch = sample_eval_batch(smoke_profile.data, 8, 0)
    scores = head_scores(capture_probs(post, batch), batch.mask, batch.n)
    labels = classify_heads(scores)
    groups = head_groups(labels)
    from mclib.analyses.heads import LABELS
    abl = ex.ablation_table(post, smoke_profile.data, 8, 0, {"all heads": ex.all_heads(post),
                                                        **{f"{l} heads": groups[l] for l in LABELS}})
    e67 = ex.model_table({"post": post, "post with pre's QKV (E6)": switch_qkv(post, pre),
                          **{f"positions permuted (E7), permutation {s}": permute_positions(post, s) for s in (0, 1)}},
                         smoke_profile.data, 8, 0)
    perm = e67[e67.model.str.startswith("positions permuted")]
    e8 = ex.patching_table(post, smoke_profile.data, 8, 0)
    fit, test = probe_sets(post, smoke_profile.data, 16, 8, seed=0)
    return dict(e2=e2, e3=e3, e6=e6, abl=abl, e67=e67, perm=perm, e8=e8, groups=groups, scores=scores,
                probes=probe_layers(fit, test))


def test_loss_tables_carry_standard_errors(model_tables):
    for t in ("e2", "e3", "abl", "e67"):
        assert (model_tables[t]["L_mask_se"] > 0).all()
    assert (model_tables["e2"]["L'_mask_se"] >= 0).all()


def test_copying_rows_are_scale_free_and_can_fail(tmp_path, model_tables, smoke_profile):
    from mclib.book.readings import copying_readings, copy_levels
    t = model_tables
    glue, rows = copying_readings(t["e2"], t["e3"], t["e6"], smoke_profile.data.rank)
    assert glue["e3_match"].startswith(("both readings", "neither reading", "the uniform reading (the paper's text)",
                                        "the batch-mean reading (the released code)"))
    from mclib.book.readings import _which_match
    assert _which_match(["matches", "differs"], "X") == ("the uniform reading (the paper's text) matches X; "
                                                          "the batch-mean reading (the released code) does not")
    e2 = [r for r in rows if r["id"] == "E2"]
    random = [r for r in e2 if r["quantity"].startswith("random")]
    level = copy_levels(smoke_profile.data.rank)["random"]
    assert level == (1 / 3, 1 / 3) and len(random) == 6  # random rows: E[X²] = 1/3 on both tasks, not rescaled
    assert all(r["kind"] == "direction" for r in e2)
    assert _verdict(tmp_path, {**e2[0], "ours": 0.5, "se": 0.01}) == "differs"  # L'_mask half of E[X²]: not copying
    assert _verdict(tmp_path, {**e2[0], "ours": 0.001, "se": 0.0001}) == "same direction"
    e3 = [r for r in rows if r["id"] == "E3"]
    assert len(e3) == 4 and all(r["kind"] == "ratio" and r["paper"] > 0 for r in e3)
    assert _verdict(tmp_path, {**e3[0], "ours": 2.0, "se": 0.05}) == "differs"   # ablation doubles L_mask
    assert _verdict(tmp_path, {**e3[0], "ours": 1.02, "se": 0.01}) == "matches"


def test_heads_rows(tmp_path, model_tables, smoke_profile):
    from mclib.book.readings import heads_readings
    t = model_tables
    glue, rows = heads_readings(t["abl"], t["e67"], t["perm"], t["e8"], t["groups"], t["scores"], t["scores"],
                                0.3, 0.05, t["probes"], smoke_profile.data.rank, smoke_profile.model.layers)
    ids = {r["id"] for r in rows}
    assert {"E3", "E4", "E5", "E6", "E7", "E8", "E9", "E10", "E11"} <= ids
    assert not any("scale" in r for r in rows)
    by_q = {r["quantity"]: r for r in rows}
    every = by_q["every layer patched: masked MSE to X / E[X²]"]
    assert _verdict(tmp_path, every) == "cannot fail"
    # E8 with every layer patched equals the unpatched L_mask, by construction
    assert every["ours"] == pytest.approx(by_q["post L_mask / E[X²]"]["ours"], rel=1e-4)
    e4 = [r for r in rows if r["id"] == "E4"]
    if t["groups"]["other"]:
        assert _verdict(tmp_path, {**e4[0], "ours": 4.4, "se": 0.1}) == "differs"
        assert _verdict(tmp_path, {**e4[0], "ours": 1.1, "se": 0.01}) == "matches"
    else:
        assert all(_verdict(tmp_path, r) == "n/a" for r in e4)
    g2 = dict(t["groups"], other=[])
    _, rows2 = heads_readings(t["abl"], t["e67"], t["perm"], t["e8"], g2, t["scores"], None, 0.3, 0.05, t["probes"],
                              smoke_profile.data.rank, smoke_profile.model.layers)
    assert all(_verdict(tmp_path, r) == "n/a" for r in rows2 if r["id"] == "E4")  # an empty group: n/a, not differs
    e11 = by_q["row probe at masked positions: best layer's test MSE / MSE of predicting 0"]
    assert f"layer {glue['e11_layer']} of" in e11["reading"] and f"best at layer {glue['e11_layer']} of" in glue["e11_text"]
    assert _verdict(tmp_path, {**e11, "ours": 0.9}) == "differs" and "does not hold" in heads_readings(
        t["abl"], t["e67"], t["perm"], t["e8"], t["groups"], t["scores"], None, 0.3, 0.05,
        t["probes"].assign(mse=t["probes"].mse_zero * 0.9), 1, 2)[0]["e11_text"]
    assert _verdict(tmp_path, {**by_q["structured mask: the best head's mass on the lone observed entry"],
                               "ours": 0.2}) == "differs"
    assert "batch mean keeps what every input shares" in glue["e5_text"]


def test_training_rows(tmp_path):
    from mclib.book.readings import training_rows
    pre = {"L_mask": 0.111, "L_obs": 1e-4, "L_mask_se": 0.002, "L_obs_se": 1e-5}
    rows = training_rows(2000, 14000, pre, 0.004, 0.0002, 0.3, 1, 50000)
    v = {r["quantity"]: _verdict(tmp_path, r) for r in rows}
    assert v["pre-shift L_mask / E[X²]"] == "matches" and v["pre-shift L_obs / E[X²]"] == "same direction"
    assert v["drop step / training steps"] == "differs"          # 0.14 against the paper's 0.3
    rows = training_rows(4200, 14000, pre, 0.004, 0.0002, 0.3, 1, 50000)
    assert _verdict(tmp_path, rows[-1]) == "matches"
    assert _verdict(tmp_path, training_rows(None, 14000, pre, 0.004, 0.0002, 0.3, 1, 50000)[-1]) == "differs"
    seeds = training_rows(4000, 14000, pre, 0.004, 0.0002, 0.3, 1, 50000, seeds={"mean": 0.4, "std": 0.05})
    assert _verdict(tmp_path, seeds[-1]) == "matches"  # 0.1 <= 2 x 0.05 + 0.03
