"""The training loop's lean writes and its cut: a deadline or a signal saves a
resumable checkpoint and ends the run "cut"; Adam's state only every `train.state_every`
steps; metrics.csv appended, never rewritten while a run trains. Each resume still ends
bit-identical (on the CPU) to a run never interrupted."""

import os
import signal
import time

import pandas as pd
import pytest

from mclib.core import runs as runs_module
from mclib.core.checkpoints import resumable_steps, saved_steps
from mclib.core.config import ConfigError
from mclib.core.ending import is_complete, run_end
from mclib.core.runs import METRICS, STATE_FILE, checkpoint_dir, load_metrics, resume_metrics
from mclib.core.train import train

LOSS_COLS = ["step", "L", "L_obs", "L_mask", "mask_value", "eval_L", "eval_L_mask"]


def _same(a, b):
    pd.testing.assert_frame_equal(load_metrics(a)[LOSS_COLS], load_metrics(b)[LOSS_COLS], check_exact=True)
    import torch

    from mclib.core.checkpoints import load_checkpoint

    x, y = load_checkpoint(a, 30).state_dict(), load_checkpoint(b, 30).state_dict()
    assert all(torch.equal(x[k], y[k]) for k in x)


def test_a_deadline_saves_and_ends_the_run_cut_and_a_second_call_finishes_it(tmp_path, short, whole):
    run = tmp_path / "run"
    train(short, run, progress=False, deadline=time.time())  # already past: one step, then the cut
    assert resumable_steps(run) == [1] and len(load_metrics(run)) == 1
    end = run_end(run)
    assert end.ended == "cut" and end.step == 1 and "cut at step 1 of 30" in end.text
    assert not is_complete(short, run)
    train(short, run, progress=False)
    assert run_end(run).ended == "steps"
    _same(whole, run)


def test_a_signal_saves_and_ends_the_run_cut(tmp_path, short, whole):
    run = tmp_path / "run"
    sent = []

    def signal_at_12(rows):  # a stop that never stops, but sends SIGTERM once, as `kill` would
        if rows[-1]["step"] >= 12 and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return False

    before = signal.getsignal(signal.SIGTERM)
    train(short, run, progress=False, stop=signal_at_12)
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is gone again
    assert run_end(run).ended == "cut" and resumable_steps(run)[-1] == 16  # the next step's flush
    train(short, run, progress=False)
    _same(whole, run)


def test_state_every_keeps_adam_only_every_so_many_steps_and_a_kill_resumes_from_it(tmp_path, short, whole):
    lean = short.replace(**{"train.state_every": 20})
    run = tmp_path / "run"
    train(lean, run, progress=False)
    assert saved_steps(run) == [10, 20, 30]
    # 20: a multiple of state_every; 30: the run's end (keep: all prunes no state)
    assert [s for s in saved_steps(run) if (checkpoint_dir(run, s) / STATE_FILE).is_file()] == [20, 30]
    # a hard kill after the weights-only save at 10 but before 20: only weights at 10
    cut = tmp_path / "cut"

    class Killed(Exception):
        pass

    def kill_at_15(rows):
        if rows[-1]["step"] >= 15:
            raise Killed
        return False

    with pytest.raises(Killed):
        train(lean, cut, progress=False, stop=kill_at_15)
    assert saved_steps(cut) == [10] and resumable_steps(cut) == []
    train(lean, cut, progress=False)  # nothing to resume from: trains from step 0, the weights at 10 replaced
    _same(whole, cut)


def test_a_profile_refuses_a_state_every_that_is_not_a_multiple_of_save_every(short):
    with pytest.raises(ConfigError, match=r"train.state_every = 15 is not 0 or a positive multiple"):
        short.replace(**{"train.state_every": 15})


def test_metrics_are_appended_not_rewritten(tmp_path, short, monkeypatch, whole):
    writes = []
    real = runs_module.write_atomic
    monkeypatch.setattr(
        runs_module, "write_atomic", lambda path, write: (writes.append(path.name), real(path, write))[1]
    )
    train(short, tmp_path / "run", progress=False)
    assert writes.count(METRICS) == 1  # the first checkpoint's; the later two append
    _same(whole, tmp_path / "run")


def test_a_partial_last_line_past_the_checkpoint_is_dropped_on_resume(tmp_path, short, whole):
    run = tmp_path / "run"
    train(short, run, progress=False, stop=lambda rows: rows[-1]["step"] >= 20)
    with (run / METRICS).open("a") as f:
        f.write("21,0.5,0.4,0.3,0.2,1.0,nan,nan,nan\n22,0.5,0.")  # a kill mid-append
    rows = resume_metrics(run, 20)
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert load_metrics(run)["step"].max() == 20  # the file ends at the checkpoint again
    train(short, run, progress=False)
    _same(whole, run)
