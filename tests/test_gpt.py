"""E19's GPT (mclib.core.gpt, mclib.chapters.ch08_gpt, mclib.analyses.sharpness)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from mclib.analyses.sharpness import shape
from mclib.chapters import ch08_gpt as chapter
from mclib.core.checkpoints import load_checkpoint, saved_steps
from mclib.core.config import ConfigError, load_profile, profile_path
from mclib.core.data import copy_level, sample_batch
from mclib.core.gpt import SEP_ID, MatrixGPT, prompt
from mclib.core.model import build_model, load_model
from mclib.core.train import train


@pytest.fixture(scope="module")
def gpt_profile():
    return load_profile(profile_path("gpt"))


def test_prompt_is_masked_matrix_separator_full_matrix(gpt_profile):
    b = sample_batch(3, 5, 1, 0.3, torch.Generator().manual_seed(0))
    p = prompt(b)
    assert p.shape == (3, 51) and (p[:, 25] == SEP_ID).all()
    assert torch.equal(p[:, :25], b.tokens) and (p[:, 26:] != 0).all()  # the full matrix has no MASK


def test_entry_k_is_predicted_from_what_comes_before_it_only(gpt_profile):
    """Teacher forcing without leakage: changing entries >= k of the full matrix (not the
    prompt) leaves the predictions of entries <= k unchanged; changing entry k - 1 moves
    the prediction of entry k."""
    model = build_model(gpt_profile.model, 5, seed=0).eval()
    b = sample_batch(4, 5, 1, 0.3, torch.Generator().manual_seed(1))
    k = 12
    x2 = b.x.clone().flatten(1)
    x2[:, k:] = -x2[:, k:] + 0.37
    changed = type(b)(x2.view_as(b.x), b.mask, b.tokens)
    with torch.no_grad():
        a, c = model(b).flatten(1), model(changed).flatten(1)
    assert torch.allclose(a[:, : k + 1], c[:, : k + 1], atol=1e-6)
    assert not torch.allclose(a[:, k + 1 :], c[:, k + 1 :], atol=1e-4)


def test_a_gpt_checkpoint_is_an_hf_folder(tmp_path, gpt_profile):
    p = gpt_profile.replace(
        **{
            "train.steps": 4,
            "train.save_every": 2,
            "train.eval_every": 2,
            "train.log_every": 2,
            "checkpoints.pre": 2,
            "checkpoints.transition": [],
            "checkpoints.post": 4,
        }
    )
    train(p, tmp_path, progress=False)
    assert saved_steps(tmp_path) == [2, 4]
    model = load_checkpoint(tmp_path, 4)
    assert isinstance(model, MatrixGPT) and isinstance(
        MatrixGPT.from_pretrained(tmp_path / "checkpoints" / "step_000004"), MatrixGPT
    )
    assert isinstance(load_model(tmp_path / "checkpoints" / "step_000004"), MatrixGPT)


@pytest.mark.parametrize(
    "key, value",
    [("model.attention", "eager"), ("model.attn_bias", 1.0), ("model.attn_bias_target", "other")],
)
def test_a_bert_key_in_a_gpt_profile_is_refused_by_name(gpt_profile, key, value):
    with pytest.raises(ConfigError, match=rf"^{key} = .* is a BERT key; model.kind: gpt has no such lever$"):
        gpt_profile.replace(**{key: value})


# --- the readings and their verdicts, on curves made to order -------------------------------


def _curve(
    plateau_until: int,
    fall: int,
    obs_end: float,
    mask_end: float,
    steps: int = 3000,
    rank: int = 1,
    seed: int = 0,
) -> pd.DataFrame:
    """L = E[X²] until `plateau_until`, then a linear fall over `fall` steps to p·mask_end +
    (1-p)·obs_end (p_mask 0.3), with a little noise; L_obs and L_mask likewise."""
    level, rng = copy_level(rank), np.random.default_rng(seed)
    t = np.arange(1, steps + 1)
    w = np.clip((t - plateau_until) / fall, 0, 1)
    obs = level * (1 - w) + obs_end * level * w
    mask = level * (1 - w) + mask_end * level * w
    noise = lambda: 1 + 0.02 * rng.standard_normal(steps)
    return pd.DataFrame(
        {
            "step": t,
            "L": (0.7 * obs + 0.3 * mask) * noise(),
            "L_obs": obs * noise(),
            "L_mask": mask * noise(),
            "mask_value": 0.0,
        }
    )


def _ch(tmp_path, bert=None):
    cfg = load_profile(profile_path("cpu"))
    return SimpleNamespace(
        cfg=cfg, run_dir=tmp_path, metrics=bert if bert is not None else _curve(8000, 1500, 0.01, 0.09, 12000)
    )


def _verdicts(tmp_path, curves):
    ch = _ch(tmp_path)
    _, rows = chapter.readings(ch, curves)
    table = chapter.scorecard_table(ch, rows)
    return list(table.data["verdict"]), chapter.closing(table)


def test_the_papers_picture_gives_three_same_directions(tmp_path):
    curves = {s: _curve(500, 150, 0.02, 0.95, seed=s) for s in (1, 2, 3)}
    assert shape(curves[1], 1, "L").ratio > 2
    verdicts, closing = _verdicts(tmp_path, curves)
    assert verdicts == ["same direction"] * 3
    assert closing.count("as in the paper") == 3 and "unlike" not in closing


def test_each_row_can_come_out_differs(tmp_path):
    smooth = {s: _curve(60, 1500, 0.02, 0.95, seed=s) for s in (1, 2)}  # no plateau: the fall is the run
    assert _verdicts(tmp_path, smooth)[0][0] == "differs"
    no_copy = {s: _curve(500, 150, 0.4, 0.95, seed=s) for s in (1, 2)}  # L_obs stays at 0.4 E[X²]
    v, closing = _verdicts(tmp_path, no_copy)
    assert v[1] == "differs" and "copies the observed entries after its drop: unlike the paper" in closing
    assert (
        "leaves the masked entries near the copying level: as in the paper" in closing
    )  # (no drop in L: row 1 differs too)
    completes = {s: _curve(500, 150, 0.02, 0.1, seed=s) for s in (1, 2)}  # the masked entries completed too
    assert _verdicts(tmp_path, completes)[0][2] == "differs"
    flat = {s: _curve(10**6, 10, 0.02, 0.95, seed=s) for s in (1, 2)}  # never drops: counts 0
    assert _verdicts(tmp_path, flat)[0][0] == "differs"


# --- the chapter on the smoke run (seconds) -------------------------------------------------


@pytest.fixture(scope="module")
def gpt_runs(ch):
    return chapter.gpt_runs(ch)


@pytest.mark.slow  # seconds: left to the slow tier, so the fast tier stays quick
def test_the_gpt_runs_on_the_books_task(ch, gpt_runs):
    p = chapter.gpt_profile(ch.cfg)
    assert p.name == "gpt-smoke" and p.data == ch.cfg.data and p.train.steps == ch.cfg.analysis.gpt_steps
    assert sorted(gpt_runs) == ch.cfg.analysis.seeds
    assert all(saved_steps(d)[-1] == p.train.steps for d in gpt_runs.values())
    assert chapter.gpt_runs(ch) == gpt_runs  # complete: nothing trains again


@pytest.mark.slow  # seconds: left to the slow tier, so the fast tier stays quick
def test_the_chapters_figures_and_tables(ch, gpt_runs):
    curves = chapter.gpt_curves(gpt_runs)
    fig = chapter.loss_figure(ch, curves)
    assert len(fig.axes) == 2 and fig.axes[1].get_xlabel() == "matrices seen"
    table = chapter.shapes_shown(ch, curves).data
    assert len(table) == len(curves) + 1 and table["run"].iloc[-1].startswith("BERT")
    att = chapter.attention_maps(ch, gpt_runs[1], saved_steps(gpt_runs[1])[-1])
    n2 = ch.cfg.data.n**2
    assert att.shape == (2, 2, 2 * n2 + 1, 2 * n2 + 1)
    assert np.allclose(att.sum(-1), 1, atol=1e-5) and np.allclose(np.triu(att[0, 0], 1), 0)  # causal rows


def test_the_other_seeds_of_a_gpt_profile_stop_after_its_drop_in_l(gpt_profile):
    from mclib.core.train import _seed_stop

    rows = _curve(500, 150, 0.02, 0.95, steps=1200).to_dict("records")  # drops in L, never in L_mask
    assert _seed_stop(gpt_profile, 100)(rows)
    assert not _seed_stop(load_profile(profile_path("cpu")), 100)(rows)  # BERT reads L_mask: no drop there
