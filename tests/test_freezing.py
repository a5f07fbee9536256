import shutil

import pytest
import torch

from mclib.analyses.freezing import (
    LONGEST_FIRST,
    drop_text,
    freeze_profile,
    freeze_run,
    freeze_runs,
    freeze_summary,
    pending_groups,
    trainable_count,
)
from mclib.analyses.interventions import GROUPS, component_groups
from mclib.core.checkpoints import load_checkpoint, saved_steps
from mclib.core.runs import freeze_dir, load_metrics

STEPS = 4


@pytest.fixture
def run(tmp_path, smoke_run):
    """A private copy of the smoke run: the freeze runs are written inside it."""
    return shutil.copytree(smoke_run, tmp_path / "run")


@pytest.fixture
def cfg(smoke_profile):
    return smoke_profile.replace(**{"analysis.freeze_steps": STEPS})


def test_profile_is_the_main_one_shortened(smoke_profile):
    p = freeze_profile(smoke_profile, "mlp")  # smoke: freeze_steps 20, checkpoints 20, [30, 40], 60
    assert p.train.steps == 20 and p.name == "smoke-freeze-mlp"
    assert (p.checkpoints.pre, p.checkpoints.transition, p.checkpoints.post) == (20, [], 20)
    assert (p.data, p.model, p.seed, p.train.lr) == (
        smoke_profile.data,
        smoke_profile.model,
        smoke_profile.seed,
        smoke_profile.train.lr,
    )
    with pytest.raises(ValueError, match="'layernorm'"):
        freeze_profile(smoke_profile, "layernorm")


@pytest.mark.slow
def test_four_runs_train_only_their_group_and_resume(run, cfg):
    runs = freeze_runs(cfg, run)
    assert list(runs) == list(GROUPS) and all(runs[g] == freeze_dir(run, g) for g in GROUPS)
    post = load_checkpoint(run, cfg.checkpoints.post)
    groups = component_groups(post)
    for group, folder in runs.items():
        assert saved_steps(folder) == [STEPS] and len(load_metrics(folder)) == STEPS
        trained = dict(load_checkpoint(folder, STEPS).named_parameters())
        for name, p in post.named_parameters():
            assert torch.equal(trained[name], p) == (groups[name] != group), (group, name)
    before = {g: (f / "metrics.csv").read_bytes() for g, f in runs.items()}
    assert freeze_runs(cfg, run) == runs  # complete: nothing trains
    assert {g: (f / "metrics.csv").read_bytes() for g, f in runs.items()} == before
    table = freeze_summary(runs, cfg)
    assert table["group"].tolist() == list(GROUPS) and table["drop"].isna().all()  # 4 steps: no drop
    assert (table["steps"] == STEPS).all()
    assert trainable_count(post, "positional") == post.bert.embeddings.position_embeddings.weight.numel()


def test_pending_runs_start_longest_plateau_first(run, cfg):
    """Every group once, the paper's longest plateau first; a complete run leaves the list."""
    assert sorted(LONGEST_FIRST) == sorted(GROUPS)
    assert pending_groups(cfg, run) == ["positional", "attention", "mlp", "token"]
    freeze_run(cfg, run, "attention")
    assert pending_groups(cfg, run) == ["positional", "mlp", "token"]
    assert pending_groups(cfg, run, ("token", "mlp")) == ["token", "mlp"]  # a caller's order is kept


def test_a_run_from_another_source_is_refused(run, cfg):
    freeze_run(cfg, run, "token")
    with pytest.raises(ValueError, match="delete the folder"):
        freeze_run(cfg, run, "token", source_step=cfg.checkpoints.pre)


def test_drop_text():
    assert drop_text(1234, 5000) == "drop at step 1,234"
    assert drop_text(None, 5000) == drop_text(float("nan"), 5000) == "no drop by step 5,000"


def test_paper_pattern():
    import pandas as pd

    from mclib.analyses.freezing import paper_pattern

    table = lambda drops: pd.DataFrame(
        {"group": list(GROUPS), "drop": drops}
    )  # attention, mlp, positional, token
    both = {"first_tier_first": True, "last_tier_last": True}
    assert paper_pattern(table([500, 60, 900, 80])) == both
    assert paper_pattern(table([500, 60, None, 80])) == both
    assert paper_pattern(table([None, 60, None, 80])) == {"first_tier_first": True, "last_tier_last": False}
    assert paper_pattern(table([50, 60, 40, None])) == {"first_tier_first": False, "last_tier_last": False}
    assert paper_pattern(table([None] * 4)) == {"first_tier_first": False, "last_tier_last": False}
    # the tiers come from the order it is given (default: the paper's), not from names written in the function
    reversed_order = [["positional"], ["attention"], ["mlp", "token"]]
    assert paper_pattern(table([500, 900, 60, 800]), reversed_order) == both
    assert paper_pattern(table([500, 900, 60, 800])) == {"first_tier_first": False, "last_tier_last": False}
