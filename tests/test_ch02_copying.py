"""Chapter 02, copying (mclib/chapters/ch02_copying.py): E2's table, the scorecard rows and the
closing sentences, each rule tested both ways."""

import pandas as pd
import pytest
from book_pages import glue_names, sentences_turn
from book_pages import recorded_verdict as _verdict

from mclib.analyses.evaluate import evaluate, predict, sample_eval_batch
from mclib.book.scorecard_rules import copy_levels
from mclib.chapters import ch02_copying as chapter
from mclib.core.paper import PAPER_E2

LEVEL = 2 / 9  # E[X²] at rank 2


@pytest.fixture(scope="module")
def tables(ch):
    e3, e6 = chapter.e3_e6_tables(ch)
    return {"e2": chapter.e2_table(ch), "e3": e3, "e6": e6}


def test_copy_check_rows_and_l_prime_mask(ch, smoke_profile):
    post = ch.post
    table = chapter.copy_check(post, smoke_profile.data, 16, seed=3)
    assert list(zip(table.matrices, table.token)) == [
        (m, t) for m in ("low-rank", "random") for t in ("MASK", "0.44", "-0.24")
    ]
    batch = sample_eval_batch(smoke_profile.data, 16, 3)
    pred = predict(post, batch)
    row = table.iloc[0]  # low-rank, MASK: the plain evaluation, and L'_mask = mean X̂² at masked entries
    assert row["L_mask"] == pytest.approx(evaluate(post, smoke_profile.data, 16, 3)["L_mask"])
    assert row["L'_mask"] == pytest.approx((pred[batch.mask] ** 2).mean().item(), rel=1e-5)
    filled = sample_eval_batch(smoke_profile.data, 16, 3, fill_value=0.44)
    assert table.iloc[1]["L'_mask"] == pytest.approx(
        ((predict(post, filled)[filled.mask] - 0.44) ** 2).mean().item(), rel=1e-5
    )
    assert (table["L'_mask_se"] >= 0).all() and (table["L_mask_se"] > 0).all()


def test_e2_table_sets_the_paper_s_numbers_beside_ours(tables):
    e2 = tables["e2"].set_index(["matrices", "token"])
    assert e2.loc[("random", "0.44"), "paper L'_mask"] == PAPER_E2[("random", 0.44)][0]
    assert e2.loc[("low-rank", "MASK"), "paper L_obs"] == PAPER_E2[("low-rank", None)][1]


def test_scorecard_rows_are_scale_free_and_can_fail(tmp_path, tables, ch):
    glue, rows = chapter.readings(ch, tables["e2"], tables["e3"], tables["e6"])
    assert glue["e3_match"].startswith(
        (
            "both readings",
            "neither reading",
            "the uniform reading (the paper's text)",
            "the batch-mean reading (the released code)",
        )
    )
    e2 = [r for r in rows if r["id"] == "E2"]
    random = [r for r in e2 if r["quantity"].startswith("random")]
    assert copy_levels(ch.cfg.data.rank)["random"] == (1 / 3, 1 / 3) and len(random) == 6  # not rescaled
    # E2 against the paper's number itself (ratio rule): a cut-off 14-70x above both sides could not fail
    assert all(r["kind"] == "ratio" for r in e2)
    judged = {**e2[0], "na": None}
    assert (
        _verdict(tmp_path, {**judged, "ours": 5 * judged["paper"], "se": 0.01 * judged["paper"]}) == "differs"
    )
    assert (
        _verdict(tmp_path, {**judged, "ours": 1.1 * judged["paper"], "se": 0.01 * judged["paper"]})
        == "matches"
    )
    # the smoke profile trains the paper's task and reads
    # another pre step than the paper's 4 000: n/a, saying why
    assert all(_verdict(tmp_path, r) == "n/a" for r in rows if r["id"] in ("E2", "E3", "E6"))
    assert chapter.pre_na(ch.steps.pre, True) in e2[0]["na"] and "nothing to compare" in glue["e2_ratio_text"]
    e3 = [r for r in rows if r["id"] == "E3"]
    assert len(e3) == 4 and all(r["kind"] == "ratio" and r["paper"] > 0 for r in e3)
    assert (
        _verdict(tmp_path, {**e3[0], "na": None, "ours": 2.0, "se": 0.05}) == "differs"
    )  # ablation doubles L_mask
    assert _verdict(tmp_path, {**e3[0], "na": None, "ours": 1.02, "se": 0.01}) == "matches"
    e6 = {r["quantity"]: r for r in rows if r["id"] == "E6"}
    assert e6["pre with post's QKV: L_mask / E[X²]"]["paper"] == pytest.approx(0.2246 / LEVEL)


def test_the_pre_rows_read_the_papers_pre_step_on_its_task():
    assert (
        chapter.pre_na(4_000, True) is None and chapter.pre_na(2_000, False) is None
    )  # another task: the analogue
    assert (
        chapter.pre_na(2_000, True)
        == "read at step 2,000, not at the paper's pre step 4,000, where no checkpoint was read"
    )


def test_e2_ratio_text_turns_with_its_rows():
    row = lambda ours: {"id": "E2", "quantity": "q", "kind": "ratio", "paper": 1.0, "ours": ours, "se": 0.01}
    assert "unlike the paper" in chapter.e2_ratio_text([row(3.0), row(5.0)])
    assert "as in the paper" in chapter.e2_ratio_text([row(1.0), row(1.05)])
    assert "from 1 to 5 times" in chapter.e2_ratio_text([row(1.0), row(5.0)])


def test_e2_ratio_text_counts_each_verdict_from_its_rows():
    """2026-11-27: the page said "0 of the 12 rows unlike the paper" while all 12 differed."""
    from mclib.book import scorecard_rules

    row = lambda ours, se=0.0: {"ours": ours, "paper": 1.0, "kind": "ratio", "se": se}
    differ = [row(1.8 + 0.4 * i) for i in range(12)]
    assert chapter.e2_ratio_text(differ).endswith(": all 12 rows unlike the paper")
    assert chapter.e2_ratio_text([row(1.0)] * 12).endswith(": all 12 rows as in the paper")
    mixed = [row(1.0)] * 3 + [row(3.0)] * 8 + [row(1.3, 0.1)]
    assert [scorecard_rules.row_verdict(r) for r in mixed[-1:]] == [scorecard_rules.CLOSE]
    assert chapter.e2_ratio_text(mixed).endswith(
        "of the 12 rows, 3 as in the paper, 8 unlike the paper and 1 too close to tell"
    )
    assert "1.25" in chapter.e2_ratio_text(differ)


def test_e2_reads_the_plateau_s_checkpoints_around_pre():
    """E2's spread: up to two readable saved steps each side of pre, on the plateau, within a
    tenth of the drop step; pre alone without a drop."""
    from mclib.core.placement import CheckpointSteps

    steps = lambda **k: CheckpointSteps(
        **{
            "place": "drop",
            "pre": 3000,
            "transition": [10000],
            "post": 20000,
            "drop": 11000,
            "left_plateau": 9800,
            "saved": list(range(500, 20001, 500)),
            **k,
        }
    )
    assert chapter.neighbour_steps(steps()) == [2000, 2500, 3000, 3500, 4000]
    assert chapter.neighbour_steps(steps(drop=5000)) == [2500, 3000, 3500]  # within 500 steps of pre
    assert chapter.neighbour_steps(steps(skipped={2500: "unreadable"})) == [2000, 3000, 3500, 4000]
    assert chapter.neighbour_steps(steps(pre=9500)) == [8500, 9000, 9500]  # nothing past the plateau
    assert chapter.neighbour_steps(steps(drop=None)) == [3000]
    assert chapter.neighbour_steps(steps(saved=[3000, 8000])) == [3000]  # too far to say anything


def test_e2_over_the_plateau_reads_its_checkpoints_own_range(tmp_path):
    """The verdict sets the checkpoints' lowest to highest reading (each ± 2 s.e.) against the
    band: too close to tell only where some checkpoint reaches the band. 2026-11-28: low-rank 0.44
    L'_mask (checkpoints 2.3-11× the paper's) and random -0.24 L_obs (1.3-6.8×) read too close to
    tell under a log-normal guess from the checkpoints' spread, though no checkpoint came near."""
    row = lambda mean, low, high: {
        "id": "E2",
        "quantity": "q",
        "kind": "ratio",
        "paper": 1.0,
        "ours": mean,
        "se": 0.02,
        "span": (low, high),
    }
    assert _verdict(tmp_path, row(5.5, 2.3, 11.0)) == "differs"
    assert _verdict(tmp_path, row(3.4, 1.3, 6.8)) == "differs"
    assert _verdict(tmp_path, row(3.0, 0.9, 9.5)) == "too close to tell"  # a checkpoint inside the band
    assert _verdict(tmp_path, row(1.0, 0.9, 1.1)) == "matches"
    text = chapter.e2_ratio_text([row(5.5, 2.3, 11.0), row(3.0, 0.9, 9.5)])
    assert "lowest to the highest reading of the plateau's checkpoints" in text
    assert text.endswith("1 unlike the paper and 1 too close to tell")
    assert "two standard errors" in chapter.e2_ratio_text([{**row(4.0, 4.0, 4.0), "span": None}])
    assert chapter.e2_cause("differs", "2,000-5,000", 2.3, 11.0).startswith(
        "every checkpoint on the plateau lies beyond"
    )
    assert "swings" in chapter.e2_cause("too close to tell", "2,000-5,000", 0.9, 9.5)


def test_e2_rows_carry_the_checkpoints_range_and_the_table_shows_it(tmp_path, tables, ch, monkeypatch):
    monkeypatch.setattr(
        chapter, "pre_na", lambda step, on_paper_task: None
    )  # as if read at the paper's pre step
    e2 = tables["e2"].copy()
    level = copy_levels(ch.cfg.data.rank)["low-rank"][0]
    paper = chapter.paper_e2("low-rank", "0.44")[0] / copy_levels(ch.cfg.data.rank)["low-rank"][1]
    at = (e2.matrices == "low-rank") & (e2.token == "0.44")
    e2.loc[at, ["L'_mask_mean", "L'_mask_spread", "L'_mask_low", "L'_mask_high", "L'_mask_se"]] = [
        5.5 * paper * level,
        4.4 * paper * level,
        2.3 * paper * level,
        11 * paper * level,
        0.0,
    ]
    e2["spread_steps"] = "2,000-6,000"
    rows = chapter.readings(ch, e2, tables["e3"], tables["e6"])[1]
    r = next(r for r in rows if r["quantity"] == "low-rank, 0.44: L'_mask / E[X²]")
    assert r.get("spread") is None and r["span"] == pytest.approx((2.3 * paper, 11 * paper))
    assert _verdict(tmp_path, r) == "differs" and r["cause"].startswith("every checkpoint on the plateau")
    monkeypatch.setattr(ch, "run_dir", tmp_path)
    html = chapter.scorecard_table(ch, [r]).to_html()
    assert "interval" in html and f"{2.3 * paper:.3g} – {11 * paper:.3g}" in html and "s.e." not in html
    shown = chapter.e2_shown(ch, e2)[0].to_html()  # E2's own table: the range, not a standard deviation
    assert (
        "_mask range" in shown and "lowest and highest reading" in shown and "standard deviation" not in shown
    )


def test_copy_text_follows_the_copies_rule_both_ways():
    assert chapter.copy_text({"L_obs": 0.001, "L_mask": LEVEL}, LEVEL).startswith("copies:")
    assert "L_obs is not small" in chapter.copy_text({"L_obs": 0.05, "L_mask": LEVEL}, LEVEL)
    assert "L_mask is far from E[X²]" in chapter.copy_text({"L_obs": 0.001, "L_mask": 0.5 * LEVEL}, LEVEL)


def test_e2_e3_e6_sentences_turn_with_the_numbers():
    e2 = pd.DataFrame({"matrices": ["low-rank"] * 2, "token": ["MASK", "0.44"], "L'_mask": [1e-4, 3e-4]})
    assert chapter.e2_text(e2, LEVEL).startswith("outputs the value")
    assert chapter.e2_text(e2.assign(**{"L'_mask": [1e-4, 0.1]}), LEVEL).startswith("does not simply output")

    e3 = pd.DataFrame(
        {
            "ablated": ["none", "all heads", "all heads"],
            "reading": ["—", "uniform", "batch_mean"],
            "L_mask": [0.2, 0.201, 0.199],
        }
    )
    assert "attention plays no part" in chapter.e3_text(e3)
    assert "already matters" in chapter.e3_text(e3.assign(L_mask=[0.2, 0.3, 0.2]))
    # 2026-11-28: "by at most 0.0%" where the change was real but small
    tiny = chapter.e3_text(e3.assign(L_mask=[0.2, 0.20001, 0.19999]))
    assert tiny.startswith("changes L_mask by less than 0.05% (") and "0.0%" not in tiny
    assert chapter.e3_text(e3).startswith("changes L_mask by at most 0.5% (")

    e6 = pd.DataFrame({"model": ["pre with post's QKV"], "L_mask": [0.9 * LEVEL], "L_obs": [1e-3]})
    assert chapter.e6_text(e6, LEVEL, 1.0, "matches").startswith("does not let it complete")
    assert chapter.e6_text(e6.assign(L_mask=[0.1 * LEVEL]), LEVEL, 1.0, "differs").startswith(
        "lets it complete the matrix in part"
    )
    # whether it is the paper's number is the row's verdict, not the sentence's own test
    assert "0.9 E[X²], as in the paper (1 E[X²]" in chapter.e6_text(e6, LEVEL, 1.0, "matches")
    assert "0.9 E[X²], unlike the paper (1 E[X²]" in chapter.e6_text(e6, LEVEL, 1.0, "differs")


def test_the_sentences_that_compare_with_the_paper_turn_with_their_rows(
    tables, ch, flip_verdicts, monkeypatch
):
    monkeypatch.setattr(
        chapter, "pre_na", lambda step, on_paper_task: None
    )  # as if read at the paper's pre step
    rows = lambda: chapter.readings(ch, tables["e2"], tables["e3"], tables["e6"])
    e3_match = rows()[0]["e3_match"]
    sentences_turn(rows, flip_verdicts, {"e6_text": ["pre with post's QKV: L_mask / E[X²]"]})
    assert rows()[0]["e3_match"] != e3_match  # both readings' rows turned: the one that matches changes


def test_every_glue_name_the_chapter_s_prose_uses_is_produced(ch, tables, tmp_path):
    used = glue_names("02_copying.ipynb")
    base, glued = chapter.pre_losses_and_figures(ch)
    glued |= chapter.e2_shown(ch, tables["e2"])[1] | chapter.e3_e6_shown(ch, tables["e3"], tables["e6"])[1]
    found, rows = chapter.readings(ch, tables["e2"], tables["e3"], tables["e6"])
    glued |= found | chapter.closing_glue(
        ch, base, tables["e2"], tables["e3"], tables["e6"], verdicts=["matches", "differs"]
    )
    assert used and used <= set(glued), used - set(glued)
    assert glued["n_rows"] == 2 and glued["verdicts"] == "1 matches, 1 differs"


def test_e3_reads_the_headline_sample(ch, tables):
    """One estimate per quantity: E3's unablated pre-shift row is the headline losses."""
    base, _ = chapter.pre_losses_and_figures(ch)
    none = tables["e3"][tables["e3"]["ablated"] == "none"].iloc[0]
    assert none["L_mask"] == pytest.approx(base["L_mask"]) and none["L_obs"] == pytest.approx(base["L_obs"])


def test_the_pre_shift_l_obs_says_which_reading_the_paper_s_number_is():
    """2026-11-28: E1 read 0.00247·E[X²] from the training curve and chapter 02 0.0068·E[X²] on
    fresh matrices at the same step, with no word on which the paper's number is."""
    text = chapter.pre_l_obs_text(0.00247, 0.0068, 0.00153, step=4000, window=50)
    assert text.startswith(
        "The paper's pre-shift L_obs, 0.0015·E[X²] (its E3, at step 4,000), is one checkpoint's "
        "reading on fresh matrices, the kind this chapter makes (0.0068·E[X²] at step 4,000)"
    )
    assert "training curve instead, 0.0025·E[X²] at the same step, 2.8× below this chapter's" in text
    assert "mean over the 50 training batches ending there" in text and "both lie below 0.1·E[X²]" in text
    assert "2.8× above" in chapter.pre_l_obs_text(0.0068, 0.00247, 0.00153, step=4000, window=50)
    assert "only the curve's lies below" in chapter.pre_l_obs_text(0.01, 0.3, 0.00153, step=4000, window=50)


def test_an_e2_row_read_at_one_checkpoint_says_so_and_is_judged_over_the_laptops_spread():
    from mclib.book.scorecard_rules import CLOSE, row_verdict
    from mclib.chapters.ch02_copying import one_checkpoint

    q = "low-rank, MASK: L'_mask / E[X²]"
    row = {
        "id": "E2",
        "quantity": q,
        "kind": "ratio",
        "ours": 0.00315,
        "paper": 0.00135,
        "se": 0.0001,
        "reading": "2.3× the paper's",
    }
    assert row_verdict(row) == "differs"  # one checkpoint, its error alone
    alone, why = one_checkpoint(row, 4000, None)
    assert "read at one checkpoint (step 4,000)" in alone["reading"] and "span" not in alone and why
    laptop = [
        {"id": "E2", "quantity": q, "ours": 0.5, "span": (0.2, 2.0)}
    ]  # its checkpoints 0.4-4x their mean
    wide, _ = one_checkpoint(row, 4000, laptop)
    assert wide["span"] == pytest.approx((0.00126, 0.0126)) and row_verdict(wide) == CLOSE
    narrow, _ = one_checkpoint(
        row, 4000, [{**laptop[0], "span": (0.45, 0.55)}]
    )  # a flat plateau: still differs
    assert row_verdict(narrow) == "differs"
