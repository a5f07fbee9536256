"""How far rounding alone moves one run (mclib.analyses.rounding), and verdicts judged against it:
the number and ratio rules never say matches or differs on a difference inside the rounding
spread (mclib.book.scorecard_rules); the final-level rows carry it (chapter 01); every seed-1
run at the paper's setting, side by side (mclib.lease.same_seed)."""

import pandas as pd
import pytest

from mclib.analyses import rounding
from mclib.book import scorecard_rules as rules
from mclib.chapters import ch01_train


def test_a_difference_inside_the_rounding_spread_is_too_close_to_tell_whatever_the_other_errors():
    assert rules.number(15_000, 14_678) == "matches"  # within 10 %, no error known
    assert rules.number(15_000, 14_678, rounding=1_450) == rules.CLOSE  # the paper within the rounding spread
    assert rules.number(15_000, 13_228) == "differs"  # 11.8 % off
    assert (
        rules.number(15_000, 13_228, rounding=1_450) == rules.CLOSE
    )  # 1,772 apart: the widened interval reaches out
    assert rules.number(15_000, 9_000, rounding=1_450) == "differs"  # far beyond it: still differs
    assert rules.number(0.06, 0.0948) == "differs"
    assert rules.number(0.06, 0.0948, rounding=0.047) == rules.CLOSE
    assert rules.ratio(17.5, 10.8) == "differs"
    assert (
        rules.ratio(17.5, 10.8, rounding=10.8 * 0.65) == rules.CLOSE
    )  # a level 1.65x apart: ln 1.65 > ln(17.5/10.8)
    assert rules.ratio(17.5, 5.0, rounding=5.0 * 0.5) == "differs"
    assert rules.judge("number", paper=15_000, ours=14_678, rounding=1_450) == rules.CLOSE
    assert rules.row_verdict({"paper": 15_000, "ours": 14_678, "rounding": 1_450}) == rules.CLOSE


@pytest.fixture
def study_table(tmp_path):
    t = pd.DataFrame(
        {
            "drop": [10_933, 10_785, 11_075],
            "ended_at": [28_800, 22_000, 27_100],
            "final_L_mask": [0.0053, 0.0080, 0.0060],
            "checkpoint_L_mask_fp32": [0.005, 0.008, 0.006],
            "float_path": [
                "AVX512 (x86_64, AMD EPYC)",
                "AVX2 (x86_64, AMD EPYC)",
                "AVX512 (x86_64, AMD EPYC)",
            ],
        },
        index=pd.Index(["base", "avx2", "attention-eager"], name="change"),
    )
    path = tmp_path / "rounding.csv"
    t.to_csv(path)
    return path


def test_the_study_gives_each_quantity_its_spread_and_the_chapter_says_it(study_table, tmp_path):
    got = rounding.study(study_table)
    assert (got["drop"].lo, got["drop"].hi, got["drop"].range, got["drop"].n) == (10_785, 11_075, 290, 3)
    assert got["final_L_mask"].factor == pytest.approx(0.0080 / 0.0053)
    assert (
        "AVX2" in got["drop"].where
        and "AVX512" in got["drop"].where
        and "base, avx2, attention-eager" in got["drop"].where
    )
    said = rounding.finding(got)
    assert (
        "between step 10,785 and 11,075, 290 steps apart" in said and "between step 22,000 and 28,800" in said
    )
    assert (
        "where the rule ended it, lay between 0.0053 and 0.008, a factor 1.51 apart" in said
        and "too close to tell" in said
    )
    flat = rounding.early_flat(study_table)  # avx2 ended first (22,000) at the highest final level (0.008)
    assert flat.startswith("the run under avx2 ended first, at step 22,000, on a flat at L_mask 0.008")
    assert flat in rounding.finding(got, flat)
    assert rounding.early_flat(tmp_path / "none.csv") == ""
    assert rounding.study(tmp_path / "none.csv") == {}
    assert "not measured" in rounding.finding({})
    assert rounding.spread({"a": 1.0, "b": float("nan")}, "x") is None  # one reading: no spread


@pytest.mark.parametrize(
    "at_cap, said",
    [
        # 0.008 at 22 000; flat by the rule's 5 % per 1 000 steps to 30 000: above 0.008 * 0.95^8 = 0.0053
        (0.0040, "it fell to 0.004: the rule took a pause longer than its two windows for the end"),
        (0.0060, "it stayed at 0.006: a level of its own"),
    ],
)
def test_the_run_the_rule_ended_first_trained_on_to_the_cap_reads_as_a_pause_or_a_level(
    study_table, tmp_path, at_cap, said
):
    t = pd.read_csv(study_table, index_col=0)
    t["cap_step"] = [30_000, 30_000, 30_000]
    t["cap_final_L_mask"] = [0.0053, at_cap, 0.0060]
    path = tmp_path / "capped.csv"
    t.to_csv(path)
    flat = rounding.early_flat(path)
    assert flat.startswith("the run under avx2 ended first") and flat.endswith(
        f"; trained on to the cap (30,000 steps) {said}"
    )
    spreads = rounding.study(path)
    assert f"trained on to the cap, its final training L_mask lay between {min(at_cap, 0.0053):.3g}" in (
        rounding.finding(spreads, flat)
    )
    t.loc["avx2", ["cap_step", "cap_final_L_mask"]] = float("nan")  # not trained on: nothing said
    t.to_csv(path)
    assert rounding.early_flat(path) == rounding.early_flat(study_table)
    assert "trained on to the cap, its" not in rounding.finding(rounding.study(path))


def test_the_rows_that_read_a_final_level_carry_the_rounding_spread_and_say_so(study_table):
    final = rounding.study(study_table)["final_L_mask"]
    rows = [
        {"quantity": ch01_train.FINAL_L, "ours": 0.0948, "reading": "r"},
        {"quantity": ch01_train.FINAL_RATIO, "ours": 10.8, "reading": "r"},
        {"quantity": "drop step", "ours": 14_678, "reading": "r"},
    ]
    out = ch01_train.with_rounding(rows, {"final_L_mask": final})
    assert out[0]["rounding"] == pytest.approx(0.0948 * (final.factor - 1))
    assert out[1]["rounding"] == pytest.approx(10.8 * (final.factor - 1))
    assert "rounding alone moved the final training L_mask" in out[0]["reading"]
    assert "rounding" not in out[2]  # the drop step: the setting's own runs
    assert ch01_train.with_rounding(rows, {}) == rows


def test_every_seed_1_run_at_the_paper_setting_is_labelled_with_device_step_and_revision():
    from mclib.lease import same_seed

    runs = same_seed.runs()
    if len(runs) < 2:
        pytest.skip("results/ holds fewer than two runs of seed 1")
    assert all(label.count(", ") >= 3 and "revision " in label for label in runs)
    t = same_seed.table()
    assert len(t) == len(runs) and t["drop step"].notna().all()
    s = same_seed.drop_spread()
    assert s.lo == t["drop step"].min() and s.hi == t["drop step"].max()


def test_the_study_script_reads_no_run_as_no_table_and_names_a_bad_change(tmp_path, capsys):
    from sources import load_script

    from mclib.core.repo import REPO

    script = load_script(REPO / "scripts" / "rounding_study.py")
    assert script.main(["table", "--runs", str(tmp_path), "--out", str(tmp_path / "t.csv")]) == 1
    assert "no run has ended" in capsys.readouterr().out and not (tmp_path / "t.csv").exists()
    assert script.main(["rule", "--runs", str(tmp_path), "--out", str(tmp_path / "r.csv")]) == 1
    assert "no run has ended" in capsys.readouterr().out and not (tmp_path / "r.csv").exists()
    assert script.main(["to-cap", "--runs", str(tmp_path)]) == 0  # nothing ended: nothing to train on
    assert "has not ended yet" in capsys.readouterr().out and not (tmp_path / "to-cap").exists()
    with pytest.raises(SystemExit):
        script.main(["train", "--only", "avx3"])
    assert "unknown change 'avx3'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["train", "--seeds", "2,x"])
    assert "--seeds '2,x'" in capsys.readouterr().err


def test_the_study_trains_every_change_with_foreach_adam_but_fused_adam(tmp_path, monkeypatch):
    """The default profile took fused Adam on 2026-11-29; the study's runs were trained with the
    foreach Adam, so a fresh clone must train every change but fused-adam with foreach to train
    what docs/data/rounding.csv records."""
    import yaml
    from sources import load_script

    from mclib.core.repo import REPO

    script = load_script(REPO / "scripts" / "rounding_study.py")
    handed = []
    monkeypatch.setattr(script, "_run_jobs", lambda todo, jobs: handed.extend(todo) or 0)
    assert script.train(tmp_path, 1, ["base", "avx2", "fused-adam"], (1, 2)) == 0
    read = [
        (change, yaml.safe_load((folder / "study-params.yaml").read_text())) for change, *_, folder in handed
    ]
    adam = {(change, p["seed"]): p["train"]["adam"] for change, p in read}
    assert adam == {
        ("base", 1): "foreach",
        ("avx2", 1): "foreach",
        ("fused-adam", 1): "fused",
        ("base", 2): "foreach",
        ("avx2", 2): "foreach",
        ("fused-adam", 2): "fused",
    }
