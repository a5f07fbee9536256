"""The end of training (train.until: converged), where the analysis checkpoints go
(checkpoints.place: drop) and how long E15's runs train."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from mclib.analyses import freezing
from mclib.core import ending as ending_module
from mclib.core.checkpoints import saved_steps
from mclib.core.config import Checkpoints, ConfigError, profile_from_dict
from mclib.core.data import copy_level
from mclib.core.ending import is_complete, run_end
from mclib.core.metrics import converged, find_drop
from mclib.core.placement import checkpoint_steps, place_checkpoints
from mclib.core.runs import END, checkpoint_dir, load_metrics
from mclib.core.train import train

PLATEAU = copy_level(1)


def curve(
    n: int, drop_at: int | None, final: float = 0.01, tau: float = 300.0, noise: float = 0.0, seed: int = 0
) -> pd.DataFrame:
    """A synthetic metrics.csv of rank 1: L_mask on the copying plateau, then (from
    drop_at) an exponential fall to `final` with time constant `tau`."""
    steps = np.arange(1, n + 1)
    values = np.full(n, PLATEAU)
    if drop_at is not None:
        after = steps > drop_at
        values[after] = final + (PLATEAU - final) * np.exp(-(steps[after] - drop_at) / tau)
    values = values * (1 + noise * np.random.default_rng(seed).standard_normal(n))
    return pd.DataFrame({"step": steps, "L_mask": values})


# --- the convergence rule -----------------------------------------------------------------


def _fit_at(m: pd.DataFrame, step: int, patience: int) -> tuple[float, float]:
    """The rule's fit over the window ending at `step`, computed independently (numpy.polyfit)."""
    w = m[(m.step > step - patience) & (m.step <= step)]
    blocks = w.groupby(np.arange(len(w)) // (patience // 10))
    x, y = blocks["step"].mean().to_numpy() / 1000, np.log(blocks["L_mask"].mean().to_numpy())
    (b, _), cov = np.polyfit(x, y, 1, cov=True)
    return float(np.expm1(b)), float(np.exp(b) * np.sqrt(cov[0, 0]))


def test_converged_after_the_fall_flattens():
    m = curve(8000, drop_at=2000, tau=300, noise=0.2)
    drop = find_drop(m, rank=1)
    flat = converged(m, rank=1, patience=500, min_improvement=0.05, confirm=False)
    assert flat is not None and flat >= drop + 500 and flat % 50 == 0  # a block end, its window after drop
    # there the fitted fall is under 5 % per 1 000 steps even at its pessimistic end; one block earlier not
    rate, se = _fit_at(m, flat, 500)
    assert rate - 2 * se > -0.05
    rate, se = _fit_at(m, flat - 50, 500)
    assert not rate - 2 * se > -0.05
    # the rule: the next window confirms it (its mean within 1 - 0.95^0.5 of the flat window's)
    step = converged(m, rank=1, patience=500, min_improvement=0.05)
    assert step == flat + 500
    w = lambda end: m[(m.step > end - 500) & (m.step <= end)].L_mask.mean()
    assert 1 - w(step) / w(flat) < 1 - 0.95**0.5
    # the rule reads only the past: the same step on a longer curve, none on a curve that ends before it
    longer = curve(12000, drop_at=2000, tau=300, noise=0.2)
    assert converged(longer, rank=1, patience=500, min_improvement=0.05) == step
    assert converged(m[m.step < step], rank=1, patience=500, min_improvement=0.05) is None


def test_a_shoulder_inside_the_fall_does_not_end_the_run():
    """2026-11-28: under the matmul attention the default profile's seed 1 paused at L_mask ~0.028 for
    ~2 000 steps after its drop and the rule of the time ended it there (the other rounding changes
    fell on to 0.005-0.009). A synthetic fall with such a pause: the first test fires on the pause,
    the second window sees the fall go on; the run ends where the fall itself flattens."""
    step = np.arange(1, 16001)
    fall = lambda s, start, a, b, tau: b + (a - b) * np.exp(-(s - start) / tau)
    values = np.where(step <= 3000, PLATEAU, fall(step, 3000, PLATEAU, 0.03, 150))
    values = np.where(step <= 6000, values, fall(step, 6000, 0.03, 0.005, 600))  # the pause: 3 500 to 6 000
    m = pd.DataFrame({"step": step, "L_mask": values})
    old = converged(m, rank=1, patience=2000, min_improvement=0.05, confirm=False)
    new = converged(m, rank=1, patience=2000, min_improvement=0.05)
    assert old is not None and old <= 6000  # the rule before 2026-11-29 ended the run on the pause
    assert new is not None and new > 6000 + 2000 and m.L_mask[m.step == new].item() < 0.006


def test_not_converged_while_still_improving():
    m = curve(8000, drop_at=2000, tau=5000)  # still falling ~20 % every 1 000 steps at the end
    assert find_drop(m, rank=1) is not None
    assert converged(m, rank=1, patience=500, min_improvement=0.05) is None
    assert converged(m, rank=1, patience=500, min_improvement=0.3) is not None  # a looser rule does fire


def test_noise_cannot_fire_the_rule():
    # falling 10 % per 1 000 steps, with per-batch noise as large as the cpu run's after its drop (log std
    # ~0.5) and its rare spikes: a window mean can flatten by chance, the fit's pessimistic end does not
    step = np.arange(1, 20001)
    for seed in range(10):
        rng = np.random.default_rng(seed)
        noise = np.exp(0.5 * rng.standard_normal(len(step)) + 2.0 * (rng.random(len(step)) < 0.002))
        values = np.where(step < 2000, PLATEAU, 0.03 * 0.9 ** ((step - 2000) / 1000)) * noise
        m = pd.DataFrame({"step": step, "L_mask": values})
        assert converged(m, rank=1, patience=2000, min_improvement=0.05) is None, seed
    # the same noise on a curve that has flattened: the rule fires
    flat = pd.DataFrame({"step": step, "L_mask": np.where(step < 2000, PLATEAU, 0.01) * noise})
    assert converged(flat, rank=1, patience=2000, min_improvement=0.05) is not None


def test_a_plateau_is_never_converged():
    m = curve(8000, drop_at=None, noise=0.1)  # perfectly flat on average, but no drop
    assert find_drop(m, rank=1) is None
    assert converged(m, rank=1, patience=500, min_improvement=0.05) is None


def test_the_window_lies_after_the_drop():
    # flat right after a fast drop: flat at the first block end at least `patience` steps after the drop,
    # confirmed `patience` steps later
    m = curve(5000, drop_at=1000, tau=5)
    drop = find_drop(m, rank=1)
    first = -(-(drop + 1000) // 100) * 100
    assert converged(m, rank=1, patience=1000, min_improvement=0.05, confirm=False) == first
    assert converged(m, rank=1, patience=1000, min_improvement=0.05) == first + 1000
    assert converged(m[m.step < drop + 1000], rank=1, patience=1000, min_improvement=0.05) is None


# --- where the analysis checkpoints go ------------------------------------------------------

FIXED = Checkpoints(place="drop", pre=400, transition=[1000, 2000], post=3000)


def test_checkpoints_placed_from_the_drop():
    m = curve(9000, drop_at=4000, tau=400, noise=0.05)
    drop = find_drop(m, rank=1)
    saved = list(range(250, 9001, 250))
    ck = place_checkpoints(m, saved, rank=1, fixed=FIXED)
    assert ck.place == "drop" and ck.drop == drop and "drop" in ck.note
    assert ck.pre in saved and ck.pre <= 0.3 * drop and ck.pre > 0.3 * drop - 250  # the latest such step
    assert ck.post == 9000  # the end of training
    assert 1 <= len(ck.transition) <= 4 and set(ck.transition) <= set(saved)
    assert ck.pre < min(ck.transition) and max(ck.transition) < ck.post
    # around the drop: from where L_mask leaves the plateau to where it is within 2x its final level
    assert min(ck.transition) <= drop <= max(ck.transition)
    assert ck.left_plateau <= drop <= ck.near_final
    smooth = m.set_index("step")["L_mask"].rolling(200, min_periods=1).mean()
    assert smooth.loc[ck.near_final] <= 2 * smooth.loc[9000] < smooth.loc[ck.near_final - 1]
    assert min(ck.transition) <= ck.left_plateau and max(ck.transition) >= ck.near_final
    assert ck.all_steps() == sorted({ck.pre, *ck.transition, ck.post})


def test_pre_stays_on_the_plateau():
    # the model is still learning to copy early on (L_mask far above the plateau): pre skips that
    m = curve(9000, drop_at=4000, tau=400)
    m.loc[m.step <= 1300, "L_mask"] = 3 * PLATEAU
    ck = place_checkpoints(m, list(range(250, 9001, 250)), rank=1, fixed=FIXED)
    assert ck.pre > 1300 + 200 and abs(m.set_index("step")["L_mask"].loc[ck.pre] / PLATEAU - 1) < 0.1


def test_without_a_drop_the_fixed_steps_stand_in():
    m = curve(2500, drop_at=None)
    ck = place_checkpoints(m, list(range(250, 2501, 250)), rank=1, fixed=FIXED)
    assert ck.place == "fixed" and ck.drop is None and "did not drop" in ck.note
    # the fixed steps, cut to what the run saved: post at most its last step
    assert (ck.pre, ck.transition, ck.post) == (400, [1000, 2000], 2500)
    fixed = place_checkpoints(
        curve(9000, drop_at=4000), list(range(250, 9001, 250)), rank=1, fixed=FIXED, place="fixed"
    )
    assert (fixed.place, fixed.pre, fixed.transition, fixed.post) == ("fixed", 400, [1000, 2000], 3000)


def test_checkpoint_steps_reads_a_run_folder(smoke_run, smoke_profile):
    ck = checkpoint_steps(smoke_run)  # smoke: fixed steps, no drop
    assert ck.place == "fixed" and (ck.pre, ck.transition, ck.post) == (20, [30, 40], 60)
    assert set(ck.all_steps()) <= set(saved_steps(smoke_run))


# --- the profile keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"train": {"until": "forever"}}, "train.until = 'forever' is not one of steps, converged"),
        ({"train": {"patience": 0}}, "train.patience = 0 must be positive"),
        ({"train": {"min_improvement": 1.5}}, "train.min_improvement = 1.5 is outside [0, 1)"),
        ({"checkpoints": {"place": "late"}}, "checkpoints.place = 'late' is not one of fixed, drop"),
    ],
)
def test_bad_end_keys_are_one_line_errors(raw, message):
    with pytest.raises(ConfigError) as e:
        profile_from_dict(raw)
    assert str(e.value) == message


def test_a_run_resumes_under_the_rule(tmp_path, smoke_run, smoke_profile):
    """A folder trained under until: steps may resume under until: converged (how long a
    run trains is not what it is), and finds itself complete when its cap is reached."""
    run = tmp_path / "run"
    shutil.copytree(smoke_run, run)
    p = smoke_profile.replace(**{"train.until": "converged", "checkpoints.place": "drop"})
    assert is_complete(p, run)
    train(p, run, progress=False)
    assert run_end(run).ended == "cap"  # no drop: the cap (60) ended it


# --- a real tiny run that ends by the rule ------------------------------------------------------

RULE_STEP = (
    37  # where the stand-in rule fires: not a log flush (every 5 steps), so the flush after it ends the run
)


@pytest.fixture
def fake_rule(monkeypatch):
    """The smoke model neither drops nor flattens in seconds (its per-step noise keeps the
    fitted slope's error wide), so the rule is stood in for: it fires at step RULE_STEP.
    What is tested is the trainer around it: where it stops, what it records, how it
    resumes. The rule itself is tested on curves above."""
    fake = lambda metrics, *a, **kw: (
        RULE_STEP if len(metrics) and metrics["step"].max() >= RULE_STEP else None
    )
    monkeypatch.setattr(ending_module, "converged", fake)


@pytest.fixture
def until(smoke_profile):
    return smoke_profile.replace(
        **{
            "train.until": "converged",
            "train.steps": 200,
            "train.patience": 10,
            "train.min_improvement": 0.3,
            "train.save_every": 10,
            "train.log_every": 5,
            "train.eval_every": 5,
        }
    )


def test_a_tiny_run_ends_by_the_rule_and_records_it(tmp_path, fake_rule, until):
    run = train(until, tmp_path / "run", progress=False)
    m = load_metrics(run)
    rule = ending_module.converged(m)
    end = saved_steps(run)[-1]
    assert rule == RULE_STEP and end < 200  # the rule ended it before the cap
    assert end == -(-rule // 5) * 5 and m["step"].max() == end  # at the first log flush at or after it
    assert json.loads((run / END).read_text())["ended"] == "converged"
    assert run_end(run).ended == "converged" and run_end(run).step == end
    assert is_complete(until, run)
    before = (checkpoint_dir(run, end) / "model.safetensors").stat().st_mtime_ns
    train(until, run, progress=False)  # resuming a converged run returns at once
    assert (checkpoint_dir(run, end) / "model.safetensors").stat().st_mtime_ns == before
    assert saved_steps(run)[-1] == end and load_metrics(run)["step"].max() == end
    # derived without end.json: the same answer
    (run / END).unlink()
    assert run_end(run).ended == "converged"


def test_a_run_that_ended_without_its_record_gets_it_from_the_loop_and_trains_no_step(
    tmp_path, fake_rule, until
):
    """The loop's end step serves a run found ended at set up (its end.json lost, or written by an
    older revision) as it serves one that ends in a pass: the same record, and nothing trained."""
    run = train(until, tmp_path / "run", progress=False)
    recorded = (run / END).read_text()
    end = saved_steps(run)[-1]
    before = (checkpoint_dir(run, end) / "model.safetensors").stat().st_mtime_ns
    (run / END).unlink()
    train(until, run, progress=False)
    assert (run / END).read_text() == recorded
    assert (
        saved_steps(run)[-1] == end
        and (checkpoint_dir(run, end) / "model.safetensors").stat().st_mtime_ns == before
    )


def test_a_killed_run_resumes_to_the_same_end(tmp_path, fake_rule, until):
    whole = train(until, tmp_path / "whole", progress=False)
    end = saved_steps(whole)[-1]

    class Killed(Exception):
        pass

    assert end > 10  # a checkpoint (every 10 steps) before the end to resume from

    def kill(rows):  # the last log flush before the end (flushes every 5 steps)
        if rows[-1]["step"] >= end - 5:
            raise Killed
        return False

    with pytest.raises(Killed):
        train(until, tmp_path / "killed", progress=False, stop=kill)
    assert saved_steps(tmp_path / "killed")[-1] < end and not (tmp_path / "killed" / END).exists()
    train(until, tmp_path / "killed", progress=False)
    assert saved_steps(tmp_path / "killed")[-1] == end and run_end(tmp_path / "killed").ended == "converged"
    cols = ["step", "L", "L_obs", "L_mask"]
    pd.testing.assert_frame_equal(
        load_metrics(whole)[cols], load_metrics(tmp_path / "killed")[cols], check_exact=True
    )


def test_the_cap_and_a_callers_stop_are_recorded(tmp_path, smoke_profile):
    p = smoke_profile.replace(
        **{
            "train.until": "converged",
            "train.steps": 20,
            "checkpoints.transition": [20],
            "checkpoints.post": 20,
        }
    )
    assert run_end(train(p, tmp_path / "cap", progress=False)).ended == "cap"  # no drop: the cap
    assert (
        run_end(train(p.replace(**{"train.until": "steps"}), tmp_path / "steps", progress=False)).ended
        == "steps"
    )
    stopped = train(p, tmp_path / "stopped", progress=False, stop=lambda rows: rows[-1]["step"] >= 10)
    assert run_end(stopped).ended == "stopped" and run_end(stopped).step == 10


# --- E15: until the run converges after its drop, or reaches the main run's drop step ------------


def test_an_e15_run_trains_until_converged_within_the_cap(smoke_profile):
    cfg = smoke_profile.replace(**{"analysis.freeze_steps": 20})
    assert freezing.freeze_steps(cfg) == 20
    p = freezing.freeze_profile(cfg, "mlp")
    assert p.train.steps == 20 and p.train.until == "converged" and p.checkpoints.place == "fixed"
    assert (p.train.patience, p.train.min_improvement) == (cfg.train.patience, cfg.train.min_improvement)
    assert freezing.freeze_stop(cfg, None) is None  # the main run did not drop: the cap alone


@pytest.mark.parametrize(
    "drop_at, n, main, cap, ended, text",
    [
        (300, 4000, 5000, 8000, "converged", "dropped at step "),
        (300, 700, 5000, 700, "cap", "dropped at step "),
        (None, 5000, 5000, 8000, "main drop", "reached the main run's drop step 5,000 without dropping"),
        (
            None,
            3000,
            5000,
            3000,
            "cap",
            "reached the cap of 3,000 steps without dropping (the main run dropped at step 5,000)",
        ),
        (
            None,
            3000,
            None,
            3000,
            "cap",
            "reached the cap of 3,000 steps without dropping (the main run did not drop)",
        ),
        (None, 1000, 5000, 8000, "unfinished", "unfinished after 1,000 steps"),
    ],
)
def test_freeze_end_on_synthetic_curves(smoke_profile, drop_at, n, main, cap, ended, text):
    cfg = smoke_profile.replace(
        **{"analysis.freeze_steps": cap, "train.patience": 500, "train.min_improvement": 0.05, "data.rank": 1}
    )
    m = curve(n, drop_at=drop_at, tau=20)
    e = freezing.freeze_end("attention", m, cfg, main)
    assert e.ended == ended and e.text.startswith(text)
    if ended == "converged":
        done = converged(m, rank=1, patience=500, min_improvement=0.05)
        assert (
            e.drop == find_drop(m, rank=1)
            and e.text == f"dropped at step {e.drop:,} and converged at step {n:,}"
        )
        assert e.drop + 500 <= done <= n
    if (
        drop_at is not None and ended == "cap"
    ):  # dropped, but the cap came before the window after the drop was full
        assert (
            e.text.endswith(" per 1,000 steps")
            and "then reached the cap of 700 steps while L_mask still changed" in e.text
        )


def test_an_e15_run_stops_at_the_main_drop_step(tmp_path, smoke_run, smoke_profile, monkeypatch):
    """The smoke run does not drop: pretend its drop was at step 6; the E15 runs then
    train 6 steps (cap 20) and read back as "reached the main run's drop step 6"."""
    run = shutil.copytree(smoke_run, tmp_path / "run")
    cfg = smoke_profile.replace(**{"analysis.freeze_steps": 20, "train.log_every": 2, "train.save_every": 4})
    monkeypatch.setattr(freezing, "main_drop", lambda cfg, run_dir: 6)
    folder = freezing.freeze_run(cfg, run, "token")
    assert saved_steps(folder)[-1] == 6 and load_metrics(folder)["step"].max() == 6
    assert freezing.pending_groups(cfg, run, ("token",)) == []
    ends = freezing.freeze_ends(cfg, run, ("token", "mlp"))
    assert ends["token"].ended == "main drop" and ends["token"].text.endswith("drop step 6 without dropping")
    assert ends["mlp"].ended == "unfinished"


def test_an_e15_run_goes_on_past_its_drop(tmp_path, smoke_run, smoke_profile, monkeypatch):
    """With find_drop calling step 5 the drop, the run no longer stops there: it trains on
    until the rule fires (it cannot in 20 smoke steps), so the cap ends it."""
    run = shutil.copytree(smoke_run, tmp_path / "run")
    cfg = smoke_profile.replace(**{"analysis.freeze_steps": 20, "train.log_every": 2, "train.save_every": 4})
    monkeypatch.setattr(
        freezing, "find_drop", lambda m, rank=2, **kw: 5 if len(m) and m["step"].max() >= 5 else None
    )
    out = freezing.freeze_run(cfg, run, "mlp")
    assert saved_steps(out)[-1] == 20
    assert json.loads((out / END).read_text())["ended"] == "cap"
    assert freezing.freeze_ends(cfg, run, ("mlp",))["mlp"].text.startswith(
        "dropped at step 5, then reached the cap of 20"
    )


def test_end_slope_reads_the_fitted_rate_and_its_error():
    import numpy as np
    import pandas as pd

    from mclib.core.metrics import end_slope

    step = np.arange(1, 4001)
    falling = pd.DataFrame({"step": step, "L_mask": 0.05 * 0.9 ** (step / 1000)})  # 10 % per 1 000 steps
    rate, se = end_slope(falling, 2000)
    assert rate == pytest.approx(-0.1, abs=1e-3) and se < 1e-3
    noisy = falling.assign(L_mask=0.01 * np.exp(0.3 * np.random.default_rng(0).standard_normal(len(step))))
    rate, se = end_slope(noisy, 2000)  # flat, with noise: a wide error
    assert abs(rate) < 3 * se and se > 0.001
    assert np.isnan(end_slope(falling.head(5), 2000)[0])


# --- a loss that is not finite ---------------------------------------------------------------


def test_a_run_whose_loss_is_not_finite_stops_with_one_line_and_keeps_its_sound_checkpoints(
    tmp_path, smoke_profile, capsys
):
    """2026-11-29: a run resumed with a compiled kernel that did not match its float path logged NaN
    for 8 000 steps and saved NaN checkpoints. Now the first non-finite loss stops it: one line
    naming the step, nothing saved after the last sound checkpoint, and a rerun stops there again."""
    import yaml

    from mclib.__main__ import main

    # Adam at lr 1e30 moves every weight by ~1e30 from its first step: the loss soon stops being finite
    profile = tmp_path / "diverges.yaml"
    doc = smoke_profile.to_dict()
    profile.write_text(yaml.safe_dump(doc, sort_keys=False))
    run = tmp_path / "run"
    assert main(["train", "--profile", str(profile), "--out", str(run), "--quiet"]) == 0  # a sound run
    shutil.rmtree(run)
    doc["train"]["lr"] = 1e30
    profile.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["train", "--profile", str(profile), "--out", str(run), "--quiet"]) == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("mclib: error: ") and "the training loss is " in said[0]
    assert said[0].split("the training loss is ")[1].split()[0] in ("nan", "inf", "-inf")
    step = int(said[0].split("at step ")[1].split(";")[0])
    assert all(s < step for s in saved_steps(run))  # nothing saved at or after the step that diverged
    assert main(["train", "--profile", str(profile), "--out", str(run), "--quiet"]) == 1
    assert f"at step {step};" in capsys.readouterr().err
