"""Chapter 05_freezing's module (mclib/chapters/ch05_freezing.py): E15's closing sentences
and scorecard rows in every branch, how long a run may train, what ended each run, and
the glue the page uses."""

import dataclasses
import shutil
from types import SimpleNamespace

import pandas as pd
import pytest
from book_pages import glue_names, sentences_turn
from book_pages import recorded_verdict as _verdict

from mclib.analyses.freezing import FreezeEnd, freeze_run
from mclib.analyses.interventions import GROUPS
from mclib.book import scorecard
from mclib.book.chapter import open_chapter
from mclib.chapters import ch05_freezing as C
from mclib.core.runs import load_metrics


def _table(drops, steps=1000, plateaus=None, falls=None, finals=None):
    """A `freeze_summary` table: per group (GROUPS' order) its drop, plateau and fall (steps)
    and final L_mask (± 1e-4)."""
    n = len(GROUPS)
    plateaus = plateaus or [None if d is None else d - 50 for d in drops]
    falls = falls or [None if d is None else 100 for d in drops]
    finals = finals or [0.01] * n
    return pd.DataFrame(
        {
            "group": list(GROUPS),
            "drop": pd.array(drops, dtype="Int64"),
            "steps": steps,
            "plateau": pd.array(plateaus, dtype="Int64"),
            "fall": pd.array(falls, dtype="Int64"),
            "final_L_mask": finals,
            "final_L_mask_se": [1e-4] * n,
        }
    )


def _ends(ended="converged"):
    return {g: FreezeEnd(g, ended, 1000, 100, 700, 4000) for g in GROUPS}


MAIN = C.MainRun(drop=700, final=0.01, final_se=1e-4, cap=4000)


def test_freeze_sentences(tmp_path):
    # attention and positional sit on a plateau (450, 850 steps against falls of 100), mlp and token do not
    table = _table([500, 40, 900, 60], plateaus=[450, 0, 850, 10])
    glue, rows = C.freeze_readings(table, _ends(), MAIN)
    assert glue["found"].startswith("the runs dropped in the order mlp (step 40), token (step 60)")
    assert glue["verdict_text"] == (
        "the paper's order of the drops (mlp and token, then attention, then positional), "
        "each tier later than the one before by more than 10% of its step, as in the paper"
    )
    assert rows[-1]["quantity"] == "order of the drops: mlp and token, then attention, then positional"
    assert [r["ours"] for r in rows[:4]] == [4.5, 0.0, 8.5, 0.1]
    assert "paper: no plateau" in rows[1]["reading"] and "a plateau when above 1" in rows[1]["reading"]
    assert [_verdict(tmp_path, r) for r in rows] == ["same direction"] * 8 + ["same order"]
    assert (
        glue["recover_text"]
        == "The attention, mlp, positional and token runs ended within 2x of the main run's final L_mask."
    )
    assert "where it was stopped" not in rows[4]["reading"]  # the main run ended by its rule: no step to name
    stopped = dataclasses.replace(
        MAIN, stopped=16000
    )  # E15's slices: the main run stopped at their source step
    _, at = C.freeze_readings(table, _ends(), stopped)
    assert "against the main run's 0.01 ± 0.0001 at step 16,000, where it was stopped" in at[4]["reading"]
    assert [r["ours"] for r in at] == [r["ours"] for r in rows]
    # the token run sits on the copying level for 600 steps
    # before a fall of 100: a plateau, unlike the paper's
    _, rows = C.freeze_readings(_table([500, 40, 900, 660], plateaus=[450, 0, 850, 600]), _ends(), MAIN)
    assert _verdict(tmp_path, rows[3]) == "differs"
    # the positional run ends at 3x the main run's final L_mask: it has not recovered
    glue, rows = C.freeze_readings(
        _table([500, 40, 900, 60], plateaus=[450, 0, 850, 10], finals=[0.01, 0.01, 0.03, 0.01]), _ends(), MAIN
    )
    assert _verdict(tmp_path, rows[6]) == "differs" and rows[6]["ours"] == pytest.approx(3.0)
    assert glue["recover_text"].endswith("; the positional run did not.")
    glue, rows = C.freeze_readings(_table([500, 40, 300, 60]), _ends(), MAIN)  # positional before attention
    assert _verdict(tmp_path, rows[-1]) == "differs"
    assert glue["verdict_text"].endswith("unlike the paper: the positional run does not drop last")
    # ch05's old sentence said "as in the paper" on the strict order while the row's ordering rule, with its
    # 10 % margin, said "differs" (attention 520 is within 10 % of positional 560): now the row decides
    glue, rows = C.freeze_readings(_table([520, 40, 560, 60]), _ends(), MAIN)
    assert _verdict(tmp_path, rows[-1]) == "differs"
    assert glue["verdict_text"].endswith(
        "unlike the paper: the order holds, but not by 10% of the later step"
    )
    short = C.MainRun(drop=None, final=0.01, final_se=1e-4, cap=20)
    glue, rows = C.freeze_readings(_table([None] * 4, steps=20, finals=[0.11] * 4), _ends("cap"), short)
    assert glue["found"] == "none of the four runs dropped"
    assert glue["verdict_text"] == (
        "too short to check the paper's order of the drops (mlp and token, then "
        "attention, then positional): not tested here"
    )
    assert rows[0]["ours"] is None and rows[0]["reading"].startswith("no drop by step 20")
    # nothing dropped: no plateau to measure, nothing to order, and no final level to read: each run stopped
    # (here by its cap) before any drop, so its last level is the plateau's
    assert [_verdict(tmp_path, r) for r in rows] == ["n/a"] * 9
    assert "stopped before any drop" in rows[4]["na"] and "never read as final" in rows[4]["na"]
    assert glue["recover_text"] == (
        "The attention, mlp, positional and token runs stopped before dropping: their last "
        "level is not read as final."
    )
    glue, rows = C.freeze_readings(
        _table([None] * 4, steps=700), _ends("main drop"), MAIN
    )  # long enough, no drop
    assert _verdict(tmp_path, rows[-1]) == "differs"
    assert "the main run's drop step 700 without dropping: stopped before any drop" in rows[6]["na"]
    assert glue["verdict_text"].endswith("unlike the paper: no run dropped within the steps it could train")
    # one run stopped at the main run's drop step before
    # dropping (laptop E15 positional): n/a, the others read
    ends = {**_ends(), "positional": FreezeEnd("positional", "main drop", 700, None, 700, 4000)}
    glue, rows = C.freeze_readings(
        _table([500, 40, None, 60], plateaus=[450, 0, None, 10], finals=[0.01, 0.01, 0.03, 0.01]), ends, MAIN
    )
    assert [_verdict(tmp_path, r) for r in rows[4:8]] == [
        "same direction",
        "same direction",
        "n/a",
        "same direction",
    ]
    assert rows[6]["ours"] == pytest.approx(3.0)  # the value stays on the row; it is not judged
    assert glue["recover_text"] == (
        "The attention, mlp and token runs ended within 2x of the main run's final L_mask. "
        "The positional run stopped before dropping: its last level is not read as final."
    )
    glue, _ = C.freeze_readings(_table([60, 500, None, None]), _ends(), MAIN)
    assert glue["found"].endswith("; positional, token did not drop")
    assert glue["verdict_text"].endswith(
        "unlike the paper: the mlp and token runs do not drop before the others; "
        "the positional run does not drop last"
    )
    assert glue["main_text"] == "The main run, trained from scratch, dropped at step 700."


def test_the_order_sentence_turns_with_its_row(flip_verdicts):
    readings = lambda: C.freeze_readings(
        _table([500, 40, 900, 60], plateaus=[450, 0, 850, 10]), _ends(), MAIN
    )
    sentences_turn(
        readings,
        flip_verdicts,
        {"verdict_text": ["order of the drops: mlp and token, then attention, then positional"]},
    )


def test_ends_text_names_what_ended_each_run():
    ends = {
        "attention": FreezeEnd("attention", "main drop", 700, None, 700, 4000),
        "mlp": FreezeEnd("mlp", "converged", 2400, 40, 700, 4000),
        "positional": FreezeEnd("positional", "main drop", 700, None, 700, 4000),
    }
    assert C.ends_text(ends) == (
        "What ended each run, from its end record: the attention and positional runs reached "
        "the main run's drop step 700 without dropping; the mlp run dropped at step 40 and "
        "converged at step 2,400."
    )


def test_the_runs_ends_are_worded_from_their_records_not_from_one_rule():
    """2026-11-28: the chapter said every run "trained until it had dropped and then converged"
    where three stopped once their rows were known."""
    from book_pages import prose

    ends = {g: FreezeEnd(g, "known", 1200, 300, 700, 4000) for g in ("attention", "mlp", "token")}
    ends["positional"] = FreezeEnd("positional", "converged", 2400, 40, 700, 4000)
    text = C.ends_text(ends)
    assert (
        "the attention, mlp and token runs dropped at step "
        "300 and stopped at step 1,200, once their rows were" in text
    )
    assert text.count("converged") == 1 and "the positional run dropped at step 40 and converged" in text
    said = prose("05_freezing.ipynb")
    assert "until it had dropped and then converged" not in said and "{glue:text}`ends_text` So" in said


def _ch(smoke_profile, drop, cap):
    return SimpleNamespace(cfg=smoke_profile.replace(**{"analysis.freeze_steps": cap}), drop=drop)


def test_length_text_states_the_rule_and_the_cap(smoke_profile):
    text = C.length_text(_ch(smoke_profile, 700, 20))
    assert text.startswith(
        "until it has dropped and then either its rows are known (final L_mask under 1.8x "
        "the main run's at two standard errors, plateau over fall under 0.9: more training"
    )
    assert "or it has converged by the main run's rule" in text
    assert "or until the main run's drop step (700) without a drop; at most 20 steps" in text
    assert C.length_text(_ch(smoke_profile, None, 20)).endswith(
        "at most 20 steps (analysis.freeze_steps; the main run did not drop)"
    )


def test_the_page_s_glue_and_rows_come_from_the_module(smoke_run, smoke_profile, tmp_path):
    run = shutil.copytree(smoke_run, tmp_path / "runs" / "smoke-seed1")
    for g in GROUPS:  # E15's runs, one after the other (no cluster): 20 steps each at smoke size
        freeze_run(smoke_profile, run, g)
    ch = open_chapter("smoke", smoke_profile.seed, run, "cpu")
    runs = C.freeze_runs_of(ch)  # all complete: trains nothing
    glue, rows = C.readings(ch, runs)
    assert glue_names("05_freezing.ipynb") <= set(glue) | {"fig_freeze", "downloads"}
    assert (
        glue["ends_text"].startswith("What ended each run, from its end record: the attention")
        and "token run" in glue["ends_text"]
    )
    results = C.results_table(ch, runs)
    shown, cap = results.data.set_index("group"), ch.cfg.analysis.freeze_steps
    ended = f"reached the cap of {cap} steps without dropping (the main run did not drop)"
    assert list(shown.index) == list(GROUPS) and results.to_html().count(ended) == len(GROUPS)
    for g in GROUPS:  # each trained to the cap (20 steps, too few to drop) with its own losses on its row
        m = load_metrics(runs[g])
        assert m["step"].max() == cap and shown.loc[g, "result"] == ended
        assert shown.loc[g, "final_L_mask"] == pytest.approx(m["L_mask"].tail(ch.cfg.train.patience).mean())
    assert "the main run did not drop" in C.runs_table(ch, runs).to_html()
    assert len(rows) == 9 and "E15" in C.scorecard_table(ch, rows).to_html()
    assert {r["chapter"] for r in scorecard.load(run)} == {"05_freezing"}
    links = C.downloads(ch, runs)  # not in the book's layout: the files' places as text
    assert (
        links.startswith("Each run's files, to download: attention: metrics.csv: ")
        and "{download}" not in links
    )
    assert (run / "freeze" / "token" / "checkpoint_step_000020.zip").is_file()
    (tmp_path / "book" / "_executed").mkdir(
        parents=True
    )  # the book's layout: OUT/runs/ beside OUT/book/_executed
    assert (
        "{download}`final checkpoint (step 20, zip) "
        "<../../runs/smoke-seed1/freeze/mlp/checkpoint_step_000020.zip>`" in C.downloads(ch, runs)
    )
