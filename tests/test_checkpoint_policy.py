"""checkpoints.keep: what stays on disk as a run trains, that the analyses and a
resume still find what they need, and that a run which would fill its disk is refused."""

from __future__ import annotations

import pandas as pd
import pytest

from mclib.core import paper
from mclib.core.checkpoints import (
    DiskSpaceError,
    checkpoint_bytes,
    estimate_run_bytes,
    ladder,
    plateau_anchors,
    resumable_steps,
    saved_steps,
)
from mclib.core.placement import checkpoint_steps
from mclib.core.runs import load_metrics
from mclib.core.train import train

COLS = ["step", "L", "L_obs", "L_mask", "mask_value", "eval_L", "eval_L_mask"]


def test_ladder_is_dense_near_its_anchors_and_sparse_between():
    saves = list(range(1000, 50_001, 1000))
    kept = sorted(ladder(saves, [0, 25_000, 15_000], 1000, dense=3))
    assert {1000, 2000, 13_000, 14_000, 15_000, 16_000, 17_000, 23_000, 24_000, 25_000} <= set(kept)
    assert 6000 not in kept and 7000 not in kept  # mid-plateau, far from every anchor
    assert 40_000 in kept and 41_000 not in kept  # far past the newest: only multiples of a wide spacing
    # a step that left the ladder never comes back as the newest step moves on
    for now in range(10_000, 50_001, 1000):
        before = ladder([s for s in saves if s <= now], [0, now], 1000, 3)
        after = ladder([s for s in saves if s <= now + 1000], [0, now + 1000], 1000, 3)
        assert after & before == (after - {now + 1000}) & before and not (after - before - {now + 1000})


def test_the_paper_run_keeps_a_pre_checkpoint_for_any_drop():
    """Whatever the drop step d, a kept step lies on the plateau side at or before 0.3 d
    (what `place_checkpoints` wants for pre), once the drop is an anchor."""
    saves = list(range(1000, 50_001, 1000))
    for d in range(5000, 45_001, 2500):
        now = min(50_000, d + 10_000)
        kept = ladder([s for s in saves if s <= now], [0, now, d], 1000, 3)
        assert [s for s in kept if 0.1 * d <= s <= 0.3 * d], d


def test_the_paper_run_keeps_the_plateaus_saves_around_pre_for_e2_whenever_it_drops():
    """Chapter 02 reads E2 at pre and the saves beside it on the plateau (`neighbour_steps`: within
    0.1 x the drop): the paper profile's pre step is a fixed anchor of the ladder, so they are
    kept however far the run goes before and after its drop."""
    from mclib.chapters.ch02_copying import E2_WINDOW
    from mclib.core.checkpoints import plateau_anchors

    p = paper.profile()
    assert plateau_anchors(p) == [0, p.checkpoints.pre]
    saves = list(range(1000, 50_001, 1000))
    for d in (13_228, 14_678, 20_000):
        for now in (d - 1000, d + 15_000, 50_000):
            kept = ladder(
                [s for s in saves if s <= now], plateau_anchors(p) + [now] + ([d] if now > d else []), 1000
            )
            near = [s for s in kept if abs(s - p.checkpoints.pre) <= E2_WINDOW * d]
            assert len(near) >= 3, (d, now, near)


@pytest.fixture(scope="module")
def thin(smoke_profile):
    return smoke_profile.replace(**{"checkpoints.keep": "analysis", "train.save_every": 5, "train.steps": 60})


def test_keep_analysis_thins_as_it_trains_and_resumes_identically(tmp_path, smoke_profile, thin):
    whole = train(smoke_profile.replace(**{"train.save_every": 5}), tmp_path / "all", progress=False)
    assert saved_steps(whole) == resumable_steps(whole) == list(range(5, 61, 5))  # keep: all
    part = tmp_path / "thin"
    train(thin, part, progress=False, stop=lambda rows: rows[-1]["step"] >= 35)
    assert resumable_steps(part) == [35]  # Adam's state only in the newest
    mid = saved_steps(part)
    train(thin, part, progress=False)
    pd.testing.assert_frame_equal(load_metrics(whole)[COLS], load_metrics(part)[COLS], check_exact=True)
    kept = saved_steps(part)
    assert resumable_steps(part) == [60] and kept[-1] == 60
    fixed = set(thin.checkpoints.all_steps())  # no drop: the fixed steps stand in, so they stay
    assert kept == sorted(ladder(list(range(5, 61, 5)), plateau_anchors(thin) + [60], 5, 3) | fixed)
    assert len(kept) < 12 and not set(kept) - set(mid) - {40, 45, 50, 55, 60}
    steps = checkpoint_steps(part)  # the analyses still find pre / transition / post
    assert set(steps.all_steps()) <= set(kept)


def test_newest_only_keeps_one_checkpoint(tmp_path, thin):
    train(thin, tmp_path, progress=False, newest_only=True)
    assert saved_steps(tmp_path) == resumable_steps(tmp_path) == [60]


def test_keep_all_is_untouched(tmp_path, smoke_profile):
    train(
        smoke_profile, tmp_path, progress=False, newest_only=True
    )  # newest_only means nothing under keep: all
    assert len(saved_steps(tmp_path)) > 1


def test_the_paper_book_fits_in_about_6_gb():
    p = paper.profile()
    weights, state = checkpoint_bytes(p)
    assert 110e6 < weights < 130e6 and state == 2 * weights  # 4 layers x 768: ~29.9 M parameters
    main = estimate_run_bytes(p)
    others = estimate_run_bytes(p, newest_only=True)
    total = main + 2 * others + 4 * others  # seeds 2 and 3, E15's four runs
    assert total < 7e9, total / 1e9  # 6.2 GB: the plateau's saves around pre (E2) too
    everything = estimate_run_bytes(p.replace(**{"checkpoints.keep": "all"}))
    assert everything > 17e9  # what keep: all would cost one run


def test_a_run_that_would_fill_the_disk_is_refused_before_it_starts(tmp_path, smoke_profile, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    with pytest.raises(DiskSpaceError, match=r"need about .* GB .* but the disk has 0\.0 GB free") as e:
        train(smoke_profile, tmp_path / "run", progress=False)
    assert "\n" not in str(e.value)
    assert not saved_steps(tmp_path / "run")


def test_a_large_checkpoint_is_not_copied_into_the_site_unless_asked(ch, monkeypatch):
    from mclib.book import chapter

    step = ch.steps.post
    small = chapter.checkpoint_links(ch, ch.run_dir, step, "final")
    assert "not copied" not in small[0]  # a smoke checkpoint: a download
    monkeypatch.setattr(chapter, "CHECKPOINT_DOWNLOAD_MB", 0.001)  # as if it were a GPU run's
    large = chapter.checkpoint_links(ch, ch.run_dir, step, "final")
    assert (
        len(large) == 1
        and "MB, not copied into the site" in large[0]
        and "analysis.download_checkpoint" in large[0]
    )
    opted = ch.cfg.replace(**{"analysis.download_checkpoint": True})
    monkeypatch.setattr(ch, "cfg", opted)
    assert "not copied" not in chapter.checkpoint_links(ch, ch.run_dir, step, "final")[0]
