"""Chapter 09 (E20): the width/depth claims and the large models' rows, on tables made to
order, each able to come out "differs" or "n/a"; and the chapter on the committed data."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
from book_pages import sentences_turn

from mclib.analyses.sizes import by_setting, claims, drops_by_task, ratio_of_means
from mclib.chapters import ch09_appendix as chapter
from mclib.core.config import load_profile, profile_path
from mclib.core.data import copy_level


def _table(final_by_width: dict, drop_by_depth: dict, n: int = 5, seeds=(1, 2, 3)) -> pd.DataFrame:
    rows = []
    for hidden, final in final_by_width.items():
        for s in seeds:
            rows.append(
                {
                    "n": n,
                    "rank": 1,
                    "hidden": hidden,
                    "layers": 4,
                    "seed": s,
                    "batch": 64,
                    "drop_step": None
                    if drop_by_depth.get(4, 10_000) is None
                    else drop_by_depth.get(4, 10_000) + 100 * s,
                    "drop_minutes": 10.0,
                    "final_L_mask": final * (1 + 0.01 * s),
                    "steps_run": 20_000,
                }
            )
    for layers, drop in drop_by_depth.items():
        if layers == 4:
            continue
        for s in seeds:
            rows.append(
                {
                    "n": n,
                    "rank": 1,
                    "hidden": 64,
                    "layers": layers,
                    "seed": s,
                    "batch": 64,
                    "drop_step": None if drop is None else drop + 100 * s,
                    "drop_minutes": 10.0,
                    "final_L_mask": 0.01,
                    "steps_run": 20_000,
                }
            )
    return pd.DataFrame(rows)


def _ch(tmp_path):
    return SimpleNamespace(cfg=load_profile(profile_path("cpu")), run_dir=tmp_path)


def _verdicts(tmp_path, wd, large=None):
    ch = _ch(tmp_path)
    _, rows = chapter.readings(ch, wd, large)
    return {
        r["quantity"].split(":")[0]: r["verdict"]
        for r in chapter.scorecard_table(ch, rows).data.to_dict("records")
    }


def test_the_appendix_picture_agrees(tmp_path):
    wd = _table({32: 0.05, 64: 0.02, 128: 0.01}, {2: 14_000, 4: 10_000, 6: 7_000, 8: 7_100})
    v = _verdicts(tmp_path, wd)
    assert v["wider is better"] == "same direction"
    assert v["6 layers drop earlier than 4"] == "same direction"
    assert v["more layers add little"] == "matches"
    assert v["deeper ends lower"] == "same direction"  # 6 layers end at 0.01, 4 layers at ~0.02
    assert v["12-layer models on 7×7 r2 … 15×15 r4"] == "n/a"


def test_each_claim_can_differ(tmp_path):
    wd = _table(
        {32: 0.01, 64: 0.03, 128: 0.05}, {4: 10_000, 6: 13_000, 8: 26_000}
    )  # narrower better, deeper later
    v = _verdicts(tmp_path, wd)
    assert v["wider is better"] == v["6 layers drop earlier than 4"] == "differs"
    assert v["more layers add little"] == "differs"
    never = _table({32: 0.05, 64: 0.02, 128: 0.01}, {4: 10_000, 6: None})  # 6 layers never drop
    assert _verdicts(tmp_path, never)["6 layers drop earlier than 4"] == "differs"
    shallow_lower = _table(
        {32: 0.05, 64: 0.005, 128: 0.01}, {4: 10_000, 6: 7_000}
    )  # 4 layers end at ~0.005, 6 at 0.01
    assert _verdicts(tmp_path, shallow_lower)["deeper ends lower"] == "differs"


def test_a_setting_not_run_yet_is_na(tmp_path):
    wd = _table({64: 0.02}, {4: 10_000})
    v = _verdicts(tmp_path, wd)
    assert v["wider is better"] == v["6 layers drop earlier than 4"] == v["more layers add little"] == "n/a"
    assert v["deeper ends lower"] == "n/a"


def test_finals_under_different_end_rules_are_not_compared(tmp_path):
    wd = _table({32: 0.05, 64: 0.02, 128: 0.01}, {4: 10_000, 6: 7_000})
    wd["end_rule"] = "slope 2000 0.05"
    assert _verdicts(tmp_path, wd)["wider is better"] == "same direction"
    wd.loc[wd["hidden"] == 32, "end_rule"] = "window-means 1000 0.05"  # the narrow runs ended earlier
    _, rows = chapter.readings(_ch(tmp_path), wd, None)
    width = next(r for r in rows if r["quantity"].startswith("wider is better"))
    assert width["ours"] is None and "ended by different convergence rules" in width["na"]
    assert _verdicts(tmp_path, wd)["wider is better"] == "n/a"
    assert by_setting(wd).set_index(["hidden", "layers"]).loc[(32, 4), "end_rule"] == "window-means 1000 0.05"
    labels = lambda fig: [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "ended by: window-means 1000 0.05" in labels(chapter.width_depth_figure(wd))  # the figure says so
    wd["end_rule"] = "slope 2000 0.05"
    assert not any(
        t.startswith("ended by") for t in labels(chapter.width_depth_figure(wd))
    )  # one rule: no key


def test_a_run_cut_before_it_converged_has_no_final_level(tmp_path):
    """A wide run stopped by the wall clock mid-fall has a high L_mask that is not its final
    level: the width comparison leaves it out, says so, and the by-setting table too."""
    wd = _table({32: 0.05, 64: 0.02, 128: 0.01}, {4: 10_000, 6: 7_000})
    wd["ended"] = "converged"
    cut = (wd["hidden"] == 128) & (wd["seed"] == 1)
    wd.loc[cut, ["ended", "final_L_mask"]] = ["wall cap", 0.5]  # cut just after its drop
    _, rows = chapter.readings(_ch(tmp_path), wd, None)
    width = next(r for r in rows if r["quantity"].startswith("wider is better"))
    assert width["ours"] < 1 and "hidden 128: seed 1 (wall cap)" in width["reading"]
    assert _verdicts(tmp_path, wd)["wider is better"] == "same direction"
    wide = by_setting(wd).set_index(["hidden", "layers"]).loc[(128, 4)]
    assert wide["converged"] == 2 and wide["final_over_level"] == pytest.approx(0.01 * 1.025 / copy_level(1))
    wd.loc[wd["hidden"] == 128, "ended"] = "wall cap"  # none converged: n/a, said
    width = next(r for r in chapter.readings(_ch(tmp_path), wd, None)[1] if r["quantity"].startswith("wider"))
    assert width["ours"] is None and "hidden 128: none of 3 runs converged, 3 dropped" in width["na"]
    wd.loc[wd["hidden"] == 128, "drop_step"] = float("nan")  # never left the plateau
    width = next(r for r in chapter.readings(_ch(tmp_path), wd, None)[1] if r["quantity"].startswith("wider"))
    assert "hidden 128: none of 3 runs converged, none dropped (by steps" in width["na"]


def test_the_depth_claim_on_final_levels_names_the_depths_it_leaves_out(tmp_path):
    """ "Deeper ends lower" reads final levels as the width claim does: runs cut before they
    converged are left out and named by their depth; no converged run at a depth is n/a."""
    wd = _table({64: 0.02}, {4: 10_000, 6: 7_000})
    wd["ended"] = "converged"
    wd.loc[(wd["layers"] == 4) & (wd["seed"] == 2), "ended"] = "cap"
    depth = lambda: next(
        r
        for r in chapter.readings(_ch(tmp_path), wd, None)[1]
        if r["quantity"].startswith("deeper ends lower")
    )
    assert (
        depth()["ours"] == pytest.approx(0.01 / (0.02 * (1.01 + 1.03) / 2))
        and "4 layers: seed 2 (cap)" in depth()["reading"]
    )
    wd.loc[wd["layers"] == 6, ["ended", "drop_step"]] = ["cap", float("nan")]
    assert (
        depth()["ours"] is None
        and "6 layers: none of 3 runs converged, none dropped (by steps" in depth()["na"]
    )


def test_a_sweep_row_says_how_its_run_ended():
    from mclib.core.ending import RunEnd
    from mclib.core.sweep_run import how_it_ended

    end = lambda ended: RunEnd(ended=ended, step=12_000, drop=9_000, steps=30_000, until="converged")
    assert how_it_ended(end("converged"), 9_000, 12_000, None) == "converged"
    assert how_it_ended(end("stopped"), 9_000, 12_000, None) == "wall cap"  # the sweep's only other stop
    assert how_it_ended(end("stopped"), 9_000, 12_000, 1_000) == "after drop"
    assert how_it_ended(end("stopped"), 9_000, 9_500, 1_000) == "wall cap"  # stopped before drop + after_drop


def test_the_large_models_order_of_magnitude(tmp_path):
    wd = _table({32: 0.05, 64: 0.02, 128: 0.01}, {4: 10_000, 6: 7_000})
    ok = pd.DataFrame({"final_L": [1e-3, 2e-3, 8e-4, 3e-3]})
    bad = pd.DataFrame({"final_L": [1e-3, 2e-1, 3e-1, 5e-2]})
    assert _verdicts(tmp_path, wd, ok)["12-layer models on 7×7 r2 … 15×15 r4"] == "same direction"
    assert _verdicts(tmp_path, wd, bad)["12-layer models on 7×7 r2 … 15×15 r4"] == "differs"


def test_ratio_of_means_and_its_error():
    r, se = ratio_of_means(pd.Series([2.0, 2.2, 1.8]), pd.Series([1.0, 1.0, 1.0]))
    assert r == pytest.approx(2.0) and se == pytest.approx(2.0 * (0.2 / 3**0.5) / 2.0)
    assert math.isnan(ratio_of_means(pd.Series([None], dtype=float), pd.Series([1.0]))[0])
    r, se = ratio_of_means(pd.Series([2.0]), pd.Series([1.0, 1.2]))  # one seed: no spread to read
    assert r == pytest.approx(2.0 / 1.1) and math.isnan(se)


def test_a_ratio_read_from_one_seed_is_not_judged(tmp_path):
    wd = _table({32: 0.05, 64: 0.02, 128: 0.01}, {4: 10_000, 6: 7_000})
    one = wd[(wd["hidden"] != 128) | (wd["seed"] == 1)]
    width = "wider is better"
    assert _verdicts(tmp_path, wd, None)[width] == "same direction"
    assert _verdicts(tmp_path, one, None)[width] == "n/a"


def test_by_setting_counts_the_seeds_that_dropped():
    t = by_setting(_table({64: 0.02}, {4: 10_000, 6: None}))
    six = t[t["layers"] == 6].iloc[0]
    assert (six["seeds"], six["dropped"]) == (3, 0) and math.isnan(six["drop_step"])


def test_the_committed_width_depth_data_reads(tmp_path):
    wd = chapter.width_depth()
    if wd is None:
        pytest.skip("no committed width/depth data")
    assert {"n", "hidden", "layers", "drop_step", "final_L_mask"} <= set(wd.columns)
    assert claims(wd)  # one set of claims per task size
    chapter.width_depth_figure(wd)


def test_the_findings_sentence_turns_with_each_row(tmp_path, flip_verdicts):
    wd = _table({32: 0.05, 64: 0.02, 128: 0.01}, {2: 14_000, 4: 10_000, 6: 7_000, 8: 7_100})
    large = pd.DataFrame({"final_L": [1e-3, 2e-3, 8e-4, 3e-3]})
    ch = _ch(tmp_path)
    _, rows = chapter.readings(ch, wd, large)
    sentences_turn(
        lambda: chapter.readings(ch, wd, large), flip_verdicts, {"findings": [r["quantity"] for r in rows]}
    )


def test_a_claim_the_sweep_never_runs_says_so_and_one_it_will_says_not_yet(tmp_path):
    """At 7×7 the sweep file trains no 8-layer model: that claim is "not in the sweep", for
    good; a planned setting without rows is "not measured yet"."""
    wd = _table({32: 0.05, 64: 0.02, 128: 0.01}, {4: 10_000, 6: 7_000}, n=7)
    _, rows = chapter.readings(_ch(tmp_path), wd, None)
    why = {r["quantity"].split(":")[0]: r["na"] for r in rows}
    assert "(7×7" in [r["quantity"] for r in rows][2]
    assert (
        why["more layers add little"].startswith("not in the sweep")
        and "8 layers" in why["more layers add little"]
    )
    _, rows = chapter.readings(_ch(tmp_path), wd, None, plan=chapter.planned() | {(7, 64, 8)})
    assert {r["quantity"].split(":")[0]: r["na"] for r in rows}["more layers add little"].startswith(
        "not measured yet"
    )
    assert chapter.planned() >= {(5, 64, 8), (7, 64, 6), (7, 32, 4), (7, 128, 4)}


def _depth(tmp_path, wd):
    _, rows = chapter.readings(_ch(tmp_path), wd, None)
    row = next(r for r in rows if r["quantity"].startswith("6 layers drop earlier"))
    return _verdicts(tmp_path, wd)["6 layers drop earlier than 4"], row


def test_a_run_that_never_dropped_bounds_the_depth_ratio_and_the_bound_decides_one_way_only(tmp_path):
    """A run still on its plateau at its last step is censored there, not left out. Only the
    4-layer runs not dropping by 20 000 steps: the ratio is at most ~0.36, which shows the
    claim. Only the 6-layer runs not dropping: at least ~1.96, which refutes it. The same
    bounds the other way round (cut early) decide nothing: n/a, said. Neither dropping: n/a."""
    shown = _table({64: 0.02}, {4: None, 6: 7_000})
    v, row = _depth(tmp_path, shown)
    assert v == "same direction" and row["ours"] == pytest.approx(7_200 / 20_000, rel=1e-6)
    assert "at most 0.36" in row["reading"] and "4 layers: seeds 1, 2, 3 (by steps 20,000" in row["reading"]
    assert "at most 0.36 ± " in chapter.readings(_ch(tmp_path), shown, None)[0]["findings"]
    finished_out_of_order = shown.iloc[::-1].reset_index(drop=True)  # the sweep appends rows as runs end
    assert "4 layers: seeds 1, 2, 3 (" in _depth(tmp_path, finished_out_of_order)[1]["reading"]
    refuted = _table({64: 0.02}, {4: 10_000, 6: None})
    v, row = _depth(tmp_path, refuted)
    assert v == "differs" and "at least" in row["reading"]
    early = refuted.copy()
    early.loc[early["layers"] == 6, "steps_run"] = 5_000  # cut at 5 000 steps: a lower bound of ~0.49
    v, row = _depth(tmp_path, early)
    assert v == "n/a" and row["na"].startswith("undecided: the ratio is at least 0.49")
    late = shown.copy()
    late.loc[late["layers"] == 4, "steps_run"] = 6_000  # an upper bound of 1.2 shows nothing
    v, row = _depth(tmp_path, late)
    assert v == "n/a" and row["na"].startswith("undecided: the ratio is at most 1.20")
    neither = _table({64: 0.02}, {4: None, 6: None})
    v, row = _depth(tmp_path, neither)
    assert v == "n/a" and "runs of both settings did not drop" in row["na"]
    about = _table({64: 0.02}, {4: 10_000, 6: None, 8: 7_000})
    rows = chapter.readings(_ch(tmp_path), about, None)[1]
    assert "a bound (at most" in next(r for r in rows if r["quantity"].startswith("more layers"))["na"]


def test_the_figure_draws_each_task_size_and_a_setting_that_never_dropped(tmp_path):
    wd = pd.concat(
        [
            _table({32: 0.05, 64: 0.02, 128: 0.01}, {2: 14_000, 4: 10_000, 6: 7_000}),
            _table({32: 0.05, 64: 0.02, 128: 0.01}, {2: 14_000, 4: None, 6: 7_000}, n=7),
        ],
        ignore_index=True,
    )
    _, depth_final, depth_drop = chapter.width_depth_figure(wd).axes
    labels = [t.get_text() for t in depth_drop.get_legend().get_texts()]
    assert sorted(labels) == ["5×5, rank 1", "7×7, rank 1", "7×7: no drop by"]
    triangle = depth_drop.collections[-1].get_offsets()
    assert triangle.tolist() == [[4, 20_000]]  # at the 4-layer runs' last step
    five = depth_final.lines[0]  # 5×5's final levels against depth, hidden 64
    assert five.get_xdata().tolist() == [2, 4, 6]
    level = copy_level(1)
    assert five.get_ydata().tolist() == pytest.approx([0.01 / level, 0.02 * 1.02 / level, 0.01 / level])


def test_the_page_says_per_task_size_how_many_runs_dropped():
    wd = pd.concat(
        [_table({64: 0.02}, {4: 10_000, 6: 7_000}), _table({64: 0.02}, {4: None, 6: None}, n=7)],
        ignore_index=True,
    )
    wd.loc[(wd["n"] == 7) & (wd["seed"] == 2), "steps_run"] = 30_000
    assert drops_by_task(wd) == (
        "5×5 rank 1: 6 of 6 runs dropped; 7×7 rank 1: 0 of 6 runs dropped "
        "(the longest ran 30,000 steps, 1,920,000 matrices)"
    )
    wd.loc[(wd["n"] == 7) & (wd["layers"] == 6) & (wd["seed"] == 1), "drop_step"] = 25_000
    assert "7×7 rank 1: 1 of 6 runs dropped" in drops_by_task(wd) and "longest" not in drops_by_task(wd)


def test_the_curves_figure_draws_the_kept_curves_and_counts_the_rest():
    """A panel per task size; a run with no kept curve has no line and the title says so;
    one setting (hidden, layers) has one colour in both panels."""
    wd = pd.concat(
        [_table({64: 0.02}, {4: 10_000, 6: 7_000}), _table({64: 0.02}, {4: 10_000, 6: 7_000}, n=7)],
        ignore_index=True,
    )
    wd["setting"] = [f"n{n}-h{h}-L{L}" for n, h, L in zip(wd["n"], wd["hidden"], wd["layers"])]
    curve = lambda setting, seed: pd.DataFrame(
        {"setting": setting, "seed": seed, "step": [1, 10, 100], "L_mask": [0.5, 0.1, 0.01]}
    )
    kept = pd.concat(
        [
            curve(s, seed)
            for s, seed in zip(wd["setting"], wd["seed"])
            if not (s == "n5-h64-L6" and seed == 2)
        ],
        ignore_index=True,
    )
    five, seven = chapter.width_depth_curves_figure(wd, kept).axes
    assert five.get_title() == "5×5 rank 1: 5 of 6 runs (no curve kept for the others)"
    assert seven.get_title() == "7×7 rank 1: every run" and len(seven.lines) == 6
    assert five.lines[0].get_xdata().tolist() == [64, 640, 6_400]  # matrices: steps × batch
    colour = lambda ax: {
        t.get_text(): h.get_color()
        for h, t in zip(ax.get_legend().legend_handles, ax.get_legend().get_texts())
    }
    assert colour(five) == colour(seven) and len(set(colour(five).values())) == 2
    empty = chapter.width_depth_curves_figure(wd, None).axes
    assert [ax.get_title() for ax in empty] == [
        "5×5 rank 1: 0 of 6 runs (no curve kept for the others)",
        "7×7 rank 1: 0 of 6 runs (no curve kept for the others)",
    ]
