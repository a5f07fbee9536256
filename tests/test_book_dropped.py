"""The book on a run that drops (params/smoke-drop.yaml: 3x3 rank 1, a few minutes a seed):
the code each chapter runs only for a run that dropped executes, and the pages say what
the run did. The smoke profile never reaches its drop, so without this module that code
would never run in CI. Slow tier: ~10 minutes on 2 cores."""

from pathlib import Path

import pytest
from book_pages import manifest, page_text

from mclib.__main__ import main
from mclib.analyses.evaluate import evaluate
from mclib.analyses.freezing import freeze_ends
from mclib.analyses.interventions import GROUPS
from mclib.book import runner as book
from mclib.book import scorecard
from mclib.core.checkpoints import load_checkpoint
from mclib.core.config import load_profile, profile_path
from mclib.core.data import copy_level
from mclib.core.ending import run_end
from mclib.core.metrics import copies, find_drop
from mclib.core.placement import checkpoint_steps
from mclib.core.runs import load_metrics, run_profile

pytestmark = pytest.mark.slow
PROFILE = "smoke-drop"


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book-dropped")
    assert main(["book", "--profile", PROFILE, "--out", str(out), "--quiet"]) == 0
    return out


@pytest.fixture(scope="module")
def run(out) -> Path:
    return out / "runs" / f"{PROFILE}-seed1"


@pytest.fixture(scope="module")
def drop(run) -> int | None:
    return find_drop(load_metrics(run), rank=run_profile(run).data.rank)


def test_every_chapter_ran(out):
    m = manifest(out)
    assert [r["name"] for r in m["notebooks"]] == [t.stem for t in book.chapters()]
    assert {r["status"] for r in m["notebooks"]} == {"executed"} and m["site"]["status"] == "ok"


def test_the_run_drops_and_its_checkpoints_sit_around_the_drop(run, drop):
    assert drop is not None, "the smoke-drop run did not drop: the dropped-run code was not exercised"
    steps = checkpoint_steps(run)
    assert steps.place == "drop" and steps.drop == drop
    assert steps.pre < drop <= steps.post and steps.transition
    assert min(steps.transition) > steps.pre and max(steps.transition) <= steps.post
    end = run_end(run)
    assert end.drop == drop and end.ended in ("converged", "cap")


def test_the_pre_checkpoint_copies_and_the_post_one_completes(run):
    cfg = run_profile(run)
    steps, level = checkpoint_steps(run), copy_level(cfg.data.rank)
    pre = evaluate(load_checkpoint(run, steps.pre), cfg.data, 512, seed=0)
    post = evaluate(load_checkpoint(run, steps.post), cfg.data, 512, seed=0)
    assert copies(pre["L_obs"], pre["L_mask"], level)
    assert not copies(post["L_obs"], post["L_mask"], level) and post["L_mask"] < 0.6 * level


def test_the_pages_report_the_drop_from_the_run(out, run, drop):
    assert f"{drop:,}" in page_text(out, "01_train")
    rows = scorecard.load(run)
    e1 = [r for r in rows if r["id"] == "E1"]
    assert e1 and any(r["ours"] is not None and r["verdict"] != "n/a" for r in e1), e1


def test_e15_runs_end_once_their_rows_are_known_by_convergence_the_main_run_s_drop_or_the_cap(run):
    cfg = load_profile(profile_path(PROFILE))
    ends = freeze_ends(cfg, run)
    assert set(ends) == set(GROUPS)
    for end in ends.values():
        assert end.ended in ("known", "converged", "main drop", "cap"), end
        assert end.main_drop is not None
        if end.ended in ("known", "converged"):  # it trained on past its drop, at least the rule's window
            assert end.drop is not None and end.steps >= end.drop + cfg.train.patience
        if end.ended == "cap":
            assert end.steps == cfg.analysis.freeze_steps


def test_each_chapter_takes_its_dropped_run_branch(out, drop):
    """The sentences each chapter builds only for a run that dropped, read off the pages."""
    assert f"before the drop at step {drop:,}" in page_text(out, "02_copying")  # the pre checkpoint's place
    heads = page_text(out, "03_heads")
    assert "the model completes the matrix" in heads and f"against a drop at step {drop:,}" in heads
    assert f"the main run dropped at step {drop:,}" in page_text(out, "05_freezing").replace(
        "The main run", "the main run"
    )
    seeds = load_profile(profile_path(PROFILE)).analysis.seeds
    assert all(
        find_drop(load_metrics(out / "runs" / f"{PROFILE}-seed{s}"), rank=1) is not None for s in seeds
    )
