"""A damaged run folder does not stop the work: a checkpoint file that
cannot be read is set aside (renamed, never deleted), training resumes from the newest
intact checkpoint and says so in one line, and the book skips it and says which."""

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from mclib.core.checkpoints import checkpoint_damage, damaged_steps, load_checkpoint, saved_steps
from mclib.core.ending import is_complete
from mclib.core.placement import checkpoint_steps
from mclib.core.runs import CONFIG_FILE, DAMAGED, MODEL_FILE, STATE_FILE, checkpoint_dir, load_metrics
from mclib.core.train import train

LOSS_COLS = ["step", "L", "L_obs", "L_mask", "mask_value", "eval_L", "eval_L_mask"]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00garbage" * (path.stat().st_size // 8))


def _broken_json(path: Path) -> None:
    path.write_text(path.read_text()[:40])


DAMAGES = {  # file, how it is damaged, the words the one line gives for it
    "truncated weights": (MODEL_FILE, _truncate, "cannot be read (SafetensorError: "),
    "garbage weights": (MODEL_FILE, _garbage, "cannot be read (SafetensorError: "),
    "broken config": (CONFIG_FILE, _broken_json, "is not valid JSON (JSONDecodeError: "),
    "missing config": (CONFIG_FILE, Path.unlink, "is missing"),
    "truncated train state": (STATE_FILE, _truncate, "cannot be read (BadZipFile: "),
    "garbage train state": (STATE_FILE, _garbage, "cannot be read (BadZipFile: "),
}


def _state(run_dir: Path, step: int) -> dict:
    return load_checkpoint(run_dir, step, device="cpu").state_dict()


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(
    tmp_path, short, whole, logged, damage
):
    name, damage_file, words = DAMAGES[damage]
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    damage_file(checkpoint_dir(run, 30) / name)
    kept = {f.name: f.read_bytes() for f in checkpoint_dir(run, 30).iterdir()}
    assert not is_complete(short, run) and is_complete(short, whole)  # the book trains it again
    logged.err()
    train(short, run, progress=False)
    err = logged.err().strip().splitlines()
    assert err == [f"mclib: {checkpoint_dir(run, 30) / name} {words}" + err[0].split(words, 1)[1]]
    assert err[0].endswith(f"; set aside as checkpoints/{DAMAGED}step_000030, resuming from step 20")
    # nothing deleted: the damaged checkpoint lies beside the others, byte for byte
    aside = run / "checkpoints" / f"{DAMAGED}step_000030"
    assert {f.name: f.read_bytes() for f in aside.iterdir()} == kept
    # the run trained steps 21-30 again and ends as the uninterrupted run, to the bit (CPU)
    assert saved_steps(run) == [10, 20, 30] and damaged_steps(run) == {}
    pd.testing.assert_frame_equal(
        load_metrics(whole)[LOSS_COLS], load_metrics(run)[LOSS_COLS], check_exact=True
    )
    a, b = _state(whole, 30), _state(run, 30)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_wall_time_a_sweep_resumes_from_is_the_intact_checkpoint_s(tmp_path, whole):
    from mclib.core.checkpoints import load_train_state, train_wall

    run = tmp_path / "run"
    shutil.copytree(whole, run)
    _truncate(checkpoint_dir(run, 30) / STATE_FILE)
    assert train_wall(run) == load_train_state(whole, 20)["wall"] < train_wall(whole)


def test_a_train_state_that_torch_cannot_load_is_set_aside(tmp_path, short, whole, logged):
    """A train_state.pt whose zip holds but whose pickle does not: only a full load finds it."""
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    torch.save({"not": "a train state"}, checkpoint_dir(run, 30) / STATE_FILE)
    logged.err()
    train(short, run, progress=False)
    err = logged.err().strip().splitlines()
    assert len(err) == 1 and f"{STATE_FILE} lacks what resuming needs" in err[0]
    assert (
        err[0].endswith("resuming from step 20") and (run / "checkpoints" / f"{DAMAGED}step_000030").is_dir()
    )
    pd.testing.assert_frame_equal(
        load_metrics(whole)[LOSS_COLS], load_metrics(run)[LOSS_COLS], check_exact=True
    )


UNPICKLED = []


class _Runs:
    """An object whose unpickling runs code (here: appends to UNPICKLED)."""

    def __reduce__(self):
        return UNPICKLED.append, ("ran",)


def test_a_train_state_holding_code_is_set_aside_unrun(tmp_path, short, whole, logged):
    """train_state.pt is read with torch.load(weights_only=True): a pickle naming a callable
    outside torch's allowlist is refused (the file set aside), never called."""
    from mclib.core.checkpoints import load_train_state

    run = tmp_path / "run"
    shutil.copytree(whole, run)
    torch.save({**load_train_state(whole, 30), "extra": _Runs()}, checkpoint_dir(run, 30) / STATE_FILE)
    logged.err()
    train(short, run, progress=False)
    err = logged.err().strip().splitlines()
    assert len(err) == 1 and f"{STATE_FILE} cannot be loaded (UnpicklingError: " in err[0], err
    assert (
        err[0].endswith("resuming from step 20") and (run / "checkpoints" / f"{DAMAGED}step_000030").is_dir()
    )
    assert UNPICKLED == []


def test_every_damaged_checkpoint_newer_than_the_newest_intact_one_is_set_aside(
    tmp_path, short, whole, logged
):
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    _truncate(checkpoint_dir(run, 30) / MODEL_FILE)
    _broken_json(checkpoint_dir(run, 20) / CONFIG_FILE)
    # a damaged copy of step 30 set aside before: the new one gets the next name
    shutil.copytree(checkpoint_dir(run, 30), run / "checkpoints" / f"{DAMAGED}step_000030")
    logged.err()
    train(short, run, progress=False)
    err = logged.err().strip().splitlines()
    assert len(err) == 2 and all(line.endswith("resuming from step 10") for line in err)
    assert "step_000030/model.safetensors" in err[0] and f"{DAMAGED}step_000030-2," in err[0]
    assert "step_000020/config.json" in err[1] and f"{DAMAGED}step_000020," in err[1]
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == [
        f"{DAMAGED}step_000020",
        f"{DAMAGED}step_000030",
        f"{DAMAGED}step_000030-2",
        "step_000010",
        "step_000020",
        "step_000030",
    ]
    pd.testing.assert_frame_equal(
        load_metrics(whole)[LOSS_COLS], load_metrics(run)[LOSS_COLS], check_exact=True
    )


def test_with_no_intact_checkpoint_the_run_starts_over_and_deletes_nothing(tmp_path, short, whole, logged):
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    for step in (10, 20, 30):
        _truncate(checkpoint_dir(run, step) / STATE_FILE)
    logged.err()
    train(short, run, progress=False)
    err = logged.err().strip().splitlines()
    assert len(err) == 3 and all(line.endswith("starting from step 0") for line in err)
    assert len(list((run / "checkpoints").glob(f"{DAMAGED}*"))) == 3
    pd.testing.assert_frame_equal(
        load_metrics(whole)[LOSS_COLS], load_metrics(run)[LOSS_COLS], check_exact=True
    )


def test_the_cli_resumes_a_damaged_run_without_a_traceback(tmp_path, capsys):
    """The issue's case: truncate the newest model.safetensors and train again."""
    from mclib.__main__ import main

    out = tmp_path / "run"
    assert main(["train", "--profile", "smoke", "--out", str(out), "--quiet"]) == 0
    newest = saved_steps(out)[-1]
    _truncate(checkpoint_dir(out, newest) / MODEL_FILE)
    capsys.readouterr()
    assert main(["train", "--profile", "smoke", "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"mclib: {checkpoint_dir(out, newest) / MODEL_FILE} cannot be read"
    )
    assert "Traceback" not in err[0] and saved_steps(out)[-1] == newest


# --- the book reads around a damaged checkpoint ------------------------------------------------


def test_checkpoint_damage_names_the_file_and_why(whole, tmp_path):
    folder = tmp_path / "step"
    shutil.copytree(checkpoint_dir(whole, 30), folder)
    assert checkpoint_damage(folder, state=True) is None
    for name, damage_file, words in DAMAGES.values():
        shutil.rmtree(folder)
        shutil.copytree(checkpoint_dir(whole, 30), folder)
        damage_file(folder / name)
        found = checkpoint_damage(folder, state=True)
        assert found is not None and found[0] == name and found[1].startswith(words.split(" (")[0])
        # without state=True (what the analyses read) a damaged train state does not count
        assert (checkpoint_damage(folder) is None) == (name == STATE_FILE)


def test_the_book_skips_a_damaged_checkpoint_and_says_which(tmp_path, smoke_run, smoke_profile):
    from mclib.book.chapter import open_chapter
    from mclib.chapters import ch01_train

    run = tmp_path / "run"
    shutil.copytree(smoke_run, run)
    _truncate(checkpoint_dir(run, 40) / MODEL_FILE)  # a transition checkpoint (smoke: 20, [30, 40], 60)
    _broken_json(checkpoint_dir(run, 60) / CONFIG_FILE)  # the newest
    assert saved_steps(run) == [20, 30] and set(damaged_steps(run)) == {40, 60}
    steps = checkpoint_steps(run)
    # post: the saved step before the damaged 60; the transition keeps its readable steps before post
    assert (steps.pre, steps.transition, steps.post) == (20, [], 30)
    assert set(steps.skipped) == {40, 60} and steps.skipped[40].startswith(f"{MODEL_FILE} cannot be read")
    ch = open_chapter("smoke", smoke_profile.seed, run, "cpu")
    assert ch.steps.skipped == steps.skipped and ch.post is not None  # loads step 30, not the damaged 60
    text = ch01_train.checkpoint_text(ch)
    assert (
        "The book skipped the saved checkpoints at step 40 "
        "(model.safetensors cannot be read (SafetensorError: " in text
    ) and "; step 60 (config.json is not valid JSON (" in text
    # nothing was renamed or removed by reading
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_000020",
        "step_000030",
        "step_000040",
        "step_000060",
    ]


def test_the_book_names_the_checkpoints_training_set_aside(tmp_path, whole, short, capsys):
    from mclib.book.chapter import Chapter
    from mclib.chapters import ch01_train

    run = tmp_path / "run"
    shutil.copytree(whole, run)
    _truncate(checkpoint_dir(run, 30) / STATE_FILE)
    train(short, run, progress=False)  # sets step 30 aside, trains it again
    steps = checkpoint_steps(run)
    assert steps.skipped == {} and steps.set_aside == [f"checkpoints/{DAMAGED}step_000030"]
    ch = Chapter(
        cfg=short,
        run_dir=run,
        device=torch.device("cpu"),
        metrics=load_metrics(run),
        drop=None,
        steps=steps,
        end=None,
    )
    assert ch01_train.checkpoint_text(ch).endswith(
        " Training set aside 1 checkpoint it could not read "
        f"(`checkpoints/{DAMAGED}step_000030`, kept in the run "
        "folder) and resumed from the newest intact one."
    )


def test_an_intact_run_skips_nothing(ch):
    from mclib.chapters import ch01_train

    assert ch.steps.skipped == {} and ch.steps.set_aside == []
    assert "skipped" not in ch01_train.checkpoint_text(ch) and "set aside" not in ch01_train.checkpoint_text(
        ch
    )
