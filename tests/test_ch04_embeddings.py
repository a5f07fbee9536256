"""Chapter 04 (mclib/chapters/ch04_embeddings.py): the closing sentences read right with a
drop or without, the paper's picture or not; every verdict can come out either way; the
chapter's own numbers on a trained smoke run."""

from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from book_pages import recorded_verdict as _verdict
from book_pages import sentences_turn, speaks_for

from mclib.book import scorecard
from mclib.chapters import ch04_embeddings as chapter
from mclib.core.data import sample_matrices

STEPS = [100, 200, 300, 400]
TRACKS = pd.DataFrame({"component": [1, 2], "x": [0.1, 0.9], "abs_x": [0.95, 0.1], "sign_x": [0.1, 0.97]})


def _progress(columns):
    return pd.DataFrame(
        {
            "step": STEPS,
            "column_silhouette": columns,
            "row_silhouette": [0.0] * 4,
            "middle_row_norm": [1.0, 1.0, 0.9, 0.9],
            "token_alignment": [0.5, 0.95, 0.99, 1.0],
        }
    )


def _summary(init):
    return pd.DataFrame({"step": [0, 100, 400], "alignment_centred": [init, 0.5, 1.0]})


def test_embeddings_as_in_the_paper(tmp_path):
    glue, rows = chapter.embedding_readings(
        _progress([0.0, 0.05, 0.6, 0.7]), _summary(0.1), TRACKS, 0.97, drop=250, post_step=400
    )
    assert glue["tracks_claim"].endswith("as in the paper") and glue["symmetry_text"] == "symmetric about 0"
    assert glue["align_text"].startswith("reached 0.9 at step 200") and glue["align_claim"] == (
        "and at the last checkpoint before the drop at step 250 it is above 0.9, as in the paper"
    )
    assert "0.05 at step 200, the last checkpoint before the drop" in glue["cluster_text"]
    assert glue["cluster_claim"] == "the columns cluster only after the drop, as in the paper"
    assert [r["id"] for r in rows] == ["E12"] * 3 + ["E13"] + ["E14"] * 3 and all(
        r["paper"] is None for r in rows
    )
    assert rows[3]["ours"] == 0.95 and rows[6]["reading"].startswith(
        "a dip"
    )  # step 200: the last before the drop
    verdicts = [_verdict(tmp_path, r) for r in rows]
    assert verdicts == ["same direction"] * 7  # every claim holds on these numbers


def test_embeddings_without_a_drop_or_against_the_paper(tmp_path):
    glue, rows = chapter.embedding_readings(
        _progress([0.0] * 4), _summary(0.1), TRACKS.assign(abs_x=[0.3, 0.1]), 0.2, drop=None, post_step=400
    )
    assert [_verdict(tmp_path, r) for r in rows] == [
        "differs",
        "differs",
        "same direction",
        "n/a",
        "n/a",
        "differs",
        "same direction",
    ]  # no drop: E13 and E14's timing untestable
    assert glue["align_claim"] == "with no drop to compare against"
    assert (
        glue["cluster_claim"]
        == (
            "whether the columns cluster only after a drop cannot be tested (no drop in this "
            "run); no column clusters (silhouette above 0.25) by the end of the run, unlike "
            "the paper"
        )
        and "went from" in glue["cluster_text"]
    )
    assert glue["tracks_claim"] == (
        "no component tracks |x| and the other the sign, unlike the paper for |x|, as in "
        "the paper for the sign"
    )
    glue, _ = chapter.embedding_readings(
        _progress([0.5] * 4), _summary(0.95), TRACKS, 0.9, drop=250, post_step=400
    )
    assert glue["align_claim"].startswith("but the embeddings start that close")
    assert glue["cluster_claim"] == (
        "the columns already cluster before the drop, unlike the paper; the columns "
        "cluster by the end of the run, as in the paper"
    )
    glue, rows = chapter.embedding_readings(
        _progress([0.5] * 4), _summary(0.1), TRACKS, 0.9, drop=250, post_step=400
    )
    v = {r["quantity"]: _verdict(tmp_path, r) for r in rows}
    assert v["column silhouette of the position embeddings, last checkpoint before the drop"] == "differs"
    assert _verdict(tmp_path, {**rows[3], "ours": 0.5}) == "differs"  # not aligned before the drop


def test_e13_needs_a_final_layout_far_enough_after_the_checkpoint_it_tests(tmp_path):
    # the tested checkpoint at step 200, the final layout at
    # 400: judged (same direction above); at 300 (1.5x): n/a
    progress = _progress([0.0, 0.05, 0.6, 0.7])
    glue, rows = chapter.embedding_readings(progress, _summary(0.1), TRACKS, 0.97, drop=250, post_step=300)
    assert _verdict(tmp_path, rows[3]) == "n/a" and rows[3]["na"] == chapter.e13_na(200, 300)
    assert "only 100 steps after the checkpoint it tests (step 200)" in rows[3]["na"]
    assert glue["align_claim"].startswith("but it is not tested against the drop here")
    assert chapter.e13_na(13_000, 16_591) and chapter.e13_na(14_000, 50_000) is None


def test_e14_reading_states_its_own_verdict(tmp_path):
    """A contradiction found on 2026-11-25: the pre-drop row "same direction" while its reading
    said "unlike the paper" about the end of the run, which is another row."""
    _, rows = chapter.embedding_readings(
        _progress([0.0, 0.05, 0.1, 0.1]), _summary(0.1), TRACKS, 0.97, drop=250, post_step=400
    )
    pre, post = rows[4], rows[5]
    assert _verdict(tmp_path, pre) == "same direction" and "as in the paper" in pre["reading"]
    assert _verdict(tmp_path, post) == "differs" and "unlike the paper" in post["reading"]
    assert "unlike" not in pre["reading"] and "as in the paper" not in post["reading"]
    for r in rows:  # what the scorecard stores: each reading agrees with its verdict, or `record` refuses it
        scorecard.record(tmp_path, **r, chapter="test")


def test_the_sentences_that_compare_with_the_paper_turn_with_their_rows(flip_verdicts):
    readings = lambda: chapter.embedding_readings(
        _progress([0.0, 0.05, 0.6, 0.7]), _summary(0.1), TRACKS, 0.97, drop=250, post_step=400
    )
    q = lambda r: [r["quantity"] for r in readings()[1]][r]
    sentences_turn(
        readings,
        flip_verdicts,
        {"tracks_claim": [q(1), q(2)], "align_claim": [q(3)], "cluster_claim": [q(4), q(5)]},
    )
    _, rows = readings()  # flipped: each reading says what its (turned) verdict says
    for r in rows[3:6]:
        speaks_for(r["reading"], r)


@pytest.mark.parametrize("rank", [1, 2])
def test_the_values_read_are_those_the_task_produces(ch, rank):
    """Every value the run's task produces inside the paper's window −1.50 … 1.50 is read,
    and no value it never produces (on rank 1, |x| <= 1: the rows beyond never train)."""
    cfg = ch.cfg.replace(**{"data.rank": rank})
    lo, hi = chapter.value_range(SimpleNamespace(cfg=cfg))
    x = sample_matrices(4096, cfg.data.n, rank, torch.Generator().manual_seed(0), cfg.data.dist)
    produced = x[(x >= -1.5) & (x <= 1.5)]
    assert lo <= produced.min() and produced.max() <= hi
    assert produced.min() < lo + 0.05 and produced.max() > hi - 0.05


def test_the_chapter_on_a_smoke_run(ch, tmp_path):
    glue = chapter.opening_glue(ch)
    lo, hi = chapter.value_range(ch)
    assert glue["token_range"].startswith(f"{lo:.2f}, {lo + 0.01:.2f}, …, {hi:.2f}")
    assert glue["drop_note"].startswith(
        "This run's loss did not drop" if ch.drop is None else "This run's loss dropped"
    )
    assert list(chapter.labels(ch))[-1] == ch.steps.post and "post-shift" in chapter.labels(ch)[ch.steps.post]
    tokens = chapter.tokens(ch)
    assert len(tokens.coords) == len(tokens.norms) and 0 < tokens.plane_share <= 1
    coords, summary = chapter.token_projections(ch)
    assert summary["step"].iloc[0] == 0 and summary["vs the drop"].iloc[0] == "initialisation"
    progress = chapter.embedding_progress(ch)
    found, rows = chapter.readings(ch, tokens, summary, progress)
    assert found["post_step"] == f"{ch.steps.post:,}"
    run, ch.run_dir = ch.run_dir, tmp_path  # record into a scratch folder, not the shared smoke run
    html = chapter.scorecard_table(ch, rows).to_html()
    ch.run_dir = run  # the figures read the run's checkpoints
    assert html.count("<tr>") == len(rows) + 1 and "E14" in html
    assert {r["chapter"] for r in scorecard.load(tmp_path)} == {"04_embeddings"}
    for fig in (
        chapter.tokens_figure(ch, tokens),
        chapter.token_progress_figure(ch, coords),
        chapter.position_norms_figure(ch),
        chapter.progress_figure(ch, progress, summary),
    ):
        assert fig.axes  # drawn, and closed in pyplot
        assert fig.number not in __import__("matplotlib.pyplot").pyplot.get_fignums()
