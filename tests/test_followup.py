"""Chapter 07's second part (mclib/chapters/followup.py): every row of the follow-up's claims
comes out each way on tables made to order, and a claim with nothing to test reads n/a."""

import numpy as np
import pandas as pd
import pytest

from mclib.book import scorecard
from mclib.chapters import followup as part

DROP = {1: 6000, 2: 5000, 3: 7000}


def _table(plateau: dict, after: dict, lead: bool = False, seeds=(1, 2, 3), noise=0.005) -> pd.DataFrame:
    """Checkpoints every 250 steps up to drop + 1 000; each measure sits at its plateau value
    before the drop and at its after value from the drop on. With `lead`, the share measures
    reach their after value at 80 % of the drop instead (a lead of 20 % of the plateau)."""
    rng = np.random.default_rng(0)
    rows = []
    for s in seeds:
        drop = DROP[s]
        for step in range(250, drop + 1001, 250):
            row = {"step": step, "seed": s, "drop_step": float(drop)}
            for m in plateau:
                moved = step >= (0.8 * drop if lead and m.startswith("share") else drop)
                row[m] = (after[m] if moved else plateau[m]) + noise * rng.standard_normal()
            rows.append(row)
    return pd.DataFrame(rows)


LOW = {"collapse_L0": 0.2, "collapse_L2": 0.3, "spread_ratio": 0.1, "share_L0": 0.32, "share_L1": 0.3}
HIGH = {"collapse_L0": 0.2, "collapse_L2": 0.9, "spread_ratio": 0.9, "share_L0": 0.32, "share_L1": 0.7}


def _verdict(tmp_path, row):
    return scorecard.record(tmp_path, **row, chapter="t")["verdict"]


def test_collapse_row_each_way(tmp_path):
    collapsed = {**LOW, "collapse_L2": 0.9}
    spread_out = {**LOW, "collapse_L2": 0.3}
    row = part.collapse_row(_table(collapsed, spread_out))
    assert "collapse_L2" in row["reading"] and part.SOURCE in row["quantity"]
    assert row["ours"] == pytest.approx(0.6, abs=0.01) and _verdict(tmp_path, row) == "holds"
    assert _verdict(tmp_path, part.collapse_row(_table(spread_out, collapsed))) == "fails"


def test_repetition_row_each_way(tmp_path):
    repeats = {**LOW, "spread_ratio": 0.1}
    spreads = {**LOW, "spread_ratio": 0.9}
    assert _verdict(tmp_path, part.repetition_row(_table(repeats, spreads))) == "holds"
    assert _verdict(tmp_path, part.repetition_row(_table(spreads, repeats))) == "fails"


def test_attention_lead_row_each_way(tmp_path):
    row = part.attention_lead_row(_table(LOW, HIGH, lead=True))
    assert row["reading"].startswith("share_L1 leaves its plateau band") and row["ours"] > 0
    assert _verdict(tmp_path, row) == "holds"
    at_drop = part.attention_lead_row(_table(LOW, HIGH, lead=False))
    assert at_drop["ours"] == 0 and _verdict(tmp_path, at_drop) == "fails"


def test_a_row_with_one_seed_is_not_judged(tmp_path):
    row = part.collapse_row(_table(HIGH, LOW, seeds=(1,)))
    assert _verdict(tmp_path, row) == "n/a" and "no error over seeds" in row["na"]


def test_one_seed_is_one_seed_and_no_reading_holds_a_bare_angle_bracket():
    """2026-11-28: "mean ± s.e. over 1 seeds", and "(c < 1)" unescaped in the page's HTML."""
    lead = part.attention_lead_row(_table(LOW, HIGH, lead=True, seeds=(1,)))
    assert (
        "over 1 seed," in lead["reading"]
        and "1 seeds" not in lead["reading"]
        and lead["na"].startswith("1 seed ")
    )
    assert "over 3 seeds," in part.attention_lead_row(_table(LOW, HIGH, lead=True))["reading"]
    assert "over 1 seed;" in part.collapse_row(_table(HIGH, LOW, seeds=(1,)))["reading"]
    rows = part.intervention_rows(None)
    assert not any("<" in r["reading"] or ">" in r["reading"] for r in rows)


def _sweep(drops: dict) -> pd.DataFrame:
    """{setting: [drop or None per seed]} -> rows as mclib.core.sweep writes them (cap 16 000)."""
    return pd.DataFrame(
        [
            {
                "setting": s,
                "seed": i + 1,
                "drop_step": d,
                "steps_run": 16000 if d is None else d + 2000,
                "final_L_mask": 0.01,
            }
            for s, ds in drops.items()
            for i, d in enumerate(ds)
        ]
    )


def test_intervention_rows_each_way(tmp_path):
    base = [9000, 9500, 10000]
    shorter = _sweep({"bias0": base, part.BIASED: [3000, 3500, 4000], part.CONTROL: [None, None, 15000]})
    a, b = part.intervention_rows(shorter)
    assert _verdict(tmp_path, a) == "holds" and _verdict(tmp_path, b) == "holds"
    assert "2 runs without a drop counted at the last step" in b["reading"]
    longer = _sweep({"bias0": base, part.BIASED: [12000, 13000, 14000], part.CONTROL: [5000, 5500, 6000]})
    a, b = part.intervention_rows(longer)
    assert _verdict(tmp_path, a) == "fails" and _verdict(tmp_path, b) == "fails"


def test_intervention_rows_without_the_sweep_rows_are_n_a(tmp_path):
    for sweep in (None, _sweep({"bias0": [9000, 9500], part.BIASED: [3000]})):
        a, b = part.intervention_rows(sweep)
        assert _verdict(tmp_path, a) == _verdict(tmp_path, b) == "n/a"
        assert part.BIASED in a["na"] and "attention_bias.csv" in a["na"]


def test_llm_row_is_not_testable_here(tmp_path):
    row = part.llm_row()
    assert _verdict(tmp_path, row) == "n/a" and row["na"].startswith("not testable here")


def test_readings_give_five_claims_and_name_the_skipped_checkpoints():
    from types import SimpleNamespace

    ch = SimpleNamespace(cfg=SimpleNamespace(name="cpu", analysis=SimpleNamespace(seed=0)))
    table = _table(HIGH, LOW)
    table.attrs["skipped"] = {1: [], 2: [1500, 2000]}
    glue, rows = part.readings(ch, table, None)
    assert [r["id"] for r in rows] == ["F1", "F2", "F3", "F4a", "F4b", "F5"]
    assert glue == {
        "followup_skipped": "seed 2: steps 1500, 2000",
        "followup_sweep_rows": "0 of the 15 runs it plans (5 settings, seeds 1, 2, 3)",
    }


def test_strength_table_reads_the_sweep_and_the_measures():
    sweep = _sweep({"bias0": [9000, 10000, None], part.BIASED: [3000, 4000, 5000]})
    sweep["plateau_L_mask"], sweep["attn_bias"] = 0.11, [0.0] * 3 + [2.303] * 3
    sweep["attn_bias_target"] = "row_col"
    measures = pd.concat(
        [_table(HIGH, LOW).assign(setting="bias0"), _table(LOW, LOW).assign(setting=part.BIASED)]
    )
    t = part.strength_table(sweep, measures).set_index("setting")
    assert t.loc["bias0", "dropped"] == 2 and t.loc["bias0", "drop_step"] == pytest.approx(
        (9000 + 10000 + 16000) / 3
    )
    assert t.loc[part.BIASED, "drop_step"] == pytest.approx(4000) and t.loc[
        part.BIASED, "drop_se"
    ] == pytest.approx(1000 / np.sqrt(3))
    assert t.loc["bias0", "collapse_plateau"] == pytest.approx(0.9, abs=0.01)
    assert t.loc["bias0", "collapse_end"] == pytest.approx(0.3, abs=0.02)
    assert t.loc[part.BIASED, "collapse_plateau"] == pytest.approx(0.3, abs=0.01)
    assert "collapse_end" not in part.strength_table(sweep).columns  # no measures: no collapse columns


def test_the_figures_draw_every_setting_and_strength():
    measures = pd.concat(
        [_table(HIGH, LOW).assign(setting="bias0"), _table(LOW, LOW).assign(setting=part.BIASED)]
    )
    measures["share_chance"] = 0.32
    fig = part.measures_figure(measures)
    assert len(fig.axes) == 3 and all(len(ax.get_legend_handles_labels()[1]) in (0, 2) for ax in fig.axes)
    assert fig.axes[0].get_legend_handles_labels()[1] == ["bias0", part.BIASED]
    sweep = _sweep({"bias0": [9000, 10000], part.BIASED: [3000, 4000], part.CONTROL: [12000, None]})
    sweep["plateau_L_mask"] = 0.11
    sweep["attn_bias"] = [0.0, 0.0, 2.303, 2.303, 2.303, 2.303]
    sweep["attn_bias_target"] = ["row_col"] * 4 + ["other"] * 2
    fig = part.strength_figure(sweep, measures)
    assert len(fig.axes) == 3 and fig.axes[0].get_legend_handles_labels()[1] == [
        "toward row_col keys",
        "toward other keys",
    ]


def test_on_a_run_without_a_drop_every_claim_reads_n_a(ch, smoke_run, tmp_path):
    """The smoke run (no drop): the measures are read at every checkpoint, and no claim that
    needs a drop is judged."""
    from mclib.core.checkpoints import saved_steps

    table = part.curves(ch, {ch.cfg.seed: smoke_run})
    assert table["step"].tolist() == saved_steps(smoke_run) and table["drop_step"].isna().all()
    glue, rows = part.readings(ch, table, None)
    assert glue["followup_skipped"] == "none"
    assert part.measures_figure(table).axes[0].get_legend_handles_labels()[1] == [ch.cfg.name]
    assert {_verdict(tmp_path, r) for r in rows} == {"n/a"}


def test_without_sweep_rows_the_part_says_how_to_make_them():
    shown = part.sweep_shown(None).data  # a Markdown sentence, displayed as it is
    assert shown.startswith("No attention-bias rows yet") and "sweeps/attention-bias.yaml" in shown
    fig = part.strength_figure(None)
    assert all("no sweep rows yet" in ax.get_title() for ax in fig.axes)
    sweep = _sweep({"bias0": [9000, 10000]})
    sweep["plateau_L_mask"] = 0.11
    assert "bias0" in part.sweep_shown(sweep).to_html()


def test_the_sweep_is_judged_only_in_the_book_of_the_profile_it_trains(tmp_path):
    from types import SimpleNamespace

    assert part.sweep_base() == "cpu"
    sweep = _sweep(
        {"bias0": [9000, 9500, 10000], part.BIASED: [3000, 3500, 4000], part.CONTROL: [None, None, None]}
    )
    for name, want in (("cpu", "holds"), ("paper", "n/a")):
        ch = SimpleNamespace(cfg=SimpleNamespace(name=name, analysis=SimpleNamespace(seed=0)))
        _, rows = part.readings(ch, _table(HIGH, LOW), sweep)
        f4a = next(r for r in rows if r["id"] == "F4a")
        assert _verdict(tmp_path, f4a) == want
        assert name == "cpu" or "trains the cpu profile, not this book's paper" in f4a["na"]


def test_the_section_says_where_the_paper_setting_stands(tmp_path):
    """followup.paper_setting: no slice executed chapter 07 yet (the sentence names the planned
    slices' chapters); a slice that did is named with its device, date and revision; a chapter
    executed at the ledger's own profile says so."""
    import json

    import yaml

    ledger = tmp_path / "results" / "paper-slices.yaml"
    ledger.parent.mkdir()
    ledger.write_text(
        yaml.safe_dump(
            {
                "profile": "smoke",
                "precision": "fp32",
                "step_ms": 5.0,
                "lease_s": 900,
                "start_s": 120,
                "slices": [
                    {
                        "name": "A",
                        "what": "w",
                        "seeds": [1],
                        "train_s": 10,
                        "chapters": ["01_train", "03_heads"],
                    },
                    {"name": "B", "what": "w", "seeds": [2], "chapters": []},
                ],
            }
        )
    )
    none_yet = part.paper_setting("cpu", ledger)
    assert "no GPU slice has executed these measures yet" in none_yet
    assert "slice A: 01_train, 03_heads; slice B: no chapters" in none_yet and "profile cpu" in none_yet
    done = tmp_path / "results" / "smoke-A-H100-2026-12-01"
    done.mkdir()
    record = {
        "slice": "A",
        "device": "NVIDIA H100",
        "date": "2026-12-01",
        "git": "abcdef0123",
        "chapters": ["01_train", part.CHAPTER],
        "chapters_not_run": [],
    }
    (done / "slice.json").write_text(json.dumps(record))
    ran = part.paper_setting("cpu", ledger)
    assert "slice A (NVIDIA H100, 2026-12-01, revision abcdef0" in ran and "no GPU slice" not in ran
    (done / "slice.json").write_text(json.dumps({**record, "chapters_not_run": [part.CHAPTER]}))
    assert "no GPU slice has executed" in part.paper_setting("cpu", ledger)  # planned, but it found no time
    assert "executed at the paper's own setting" in part.paper_setting("smoke", ledger)
    plan = yaml.safe_load(ledger.read_text())
    plan["slices"][0]["chapters"].append(part.CHAPTER)
    ledger.write_text(yaml.safe_dump(plan))
    (done / "slice.json").unlink()
    assert "slice A of paper-slices.yaml executes them, after its other chapters" in part.paper_setting(
        "cpu", ledger
    )


def test_the_sweep_s_numbers_stay_out_of_another_profile_s_book(tmp_path):
    """The sweep trains one profile; in a book of another (the paper's) F4's rows carry no number
    of it, only why they have nothing to test (the paper column once showed the CPU sweep's)."""
    sweep = _sweep({"bias0": [9000, 9500, 10000], part.BIASED: [3000, 3500, 4000], part.CONTROL: [15000] * 3})
    own = part.intervention_rows(sweep)
    other = part.intervention_rows(sweep, other_profile="paper")
    assert all(r["ours"] is not None for r in own)
    for r in other:
        assert r["ours"] is None and r["se"] is None and _verdict(tmp_path, r) == "n/a"
        assert r["reading"].startswith("the follow-up:") and " = " not in r["reading"] and "paper" in r["na"]
