"""The paper setting's slices train in TF32, a departure shown with its evidence
(mclib.lease.precision): the TF32 study's committed table read back (mclib.analyses.precision.
study_effect), its measured effect as text beside every row that reads a final level, no value
or verdict adjusted; the ledger's step read from the source it names."""

from __future__ import annotations

import pandas as pd
import pytest

from mclib.analyses.precision import FINAL, arm_spread, read_study, study_effect
from mclib.book import scorecard_stage
from mclib.chapters.registry import specs as chapter_specs
from mclib.core.repo import REPO
from mclib.lease import precision, slices

SPECS = (
    chapter_specs()
)  # what the toc's chapters declare (mclib.book.spec), as the command line hands it down

STUDY = REPO / "docs" / "data" / "tf32_study.csv"


def test_the_committed_study_reads_back_as_the_sentence_the_book_quotes():
    effect = study_effect(STUDY)
    assert effect.text() == "TF32 on the laptop task: final checkpoint 0.63 ± 0.15× fp32's, paired, 3 seeds"
    assert effect.inside is False and effect.paired and effect.n == 3
    runs, _ = read_study(STUDY)  # the ratio is the arms' means of the runs' own column
    by_arm = runs[FINAL].groupby(runs["arm"]).mean()
    assert effect.ratio == pytest.approx(by_arm["tf32"] / by_arm["fp32"])


def _study(tmp_path, seeds_fp32, seeds_tf32):
    labels = [f"fp32 s{s}" for s in seeds_fp32] + [f"tf32 s{s}" for s in seeds_tf32]
    arm = pd.Series([label.split()[0] for label in labels], index=labels)
    table = pd.DataFrame(
        {
            FINAL: [0.010, 0.012, 0.014][: len(seeds_fp32)] + [0.007, 0.008, 0.009][: len(seeds_tf32)],
            "drop": 9000.0,
        },
        index=labels,
    )
    spread = arm_spread(table, arm, "fp32", "tf32", ("drop", FINAL))
    path = tmp_path / "study.csv"
    pd.concat([table.assign(arm=arm), spread], keys=["runs", "arms"]).to_csv(path)  # as scripts/tf32_study.py
    return path


def test_a_study_is_paired_only_where_every_seed_has_its_twin(tmp_path):
    paired = study_effect(_study(tmp_path, [1, 2, 3], [1, 2, 3]))
    assert paired.paired and paired.ratio == pytest.approx(0.008 / 0.012) and paired.inside is False
    unpaired = study_effect(_study(tmp_path, [1, 2], [4, 5]))
    assert not unpaired.paired and unpaired.n == 2 and ", paired" not in unpaired.text()
    with pytest.raises(ValueError, match="no measure 'plateau_L_mask'"):
        study_effect(_study(tmp_path, [1, 2], [1, 2]), "plateau_L_mask")


ROWS = [
    {
        "id": "E1",
        "quantity": "final L / (p_mask · E[X²]), last 10 % of steps",
        "ours": 0.2,
        "verdict": "differs",
    },
    {"id": "E1", "quantity": "drop step", "ours": 13228, "verdict": "differs"},
    {
        "id": "E3",
        "quantity": "post L_mask / E[X²]",
        "ours": 0.17,
        "verdict": "differs",
        "chapter": "02_copying",
    },
    {"id": "E4", "quantity": "anything", "ours": None, "verdict": "n/a", "chapter": "02_copying"},
]


def test_tf32_s_effect_sits_beside_the_rows_that_read_a_final_level_and_changes_nothing():
    rows = precision.annotate(ROWS, "tf32")
    text = precision.effect_text("tf32")
    assert text == f"{study_effect(STUDY).text()} (docs/data/tf32_study.csv)"
    assert [r[precision.FIELD] for r in rows] == [text, None, text, None]  # final level, drop, post, n/a
    assert all(scorecard_stage.reads_late(r) for r, o in zip(rows, ROWS) if r[precision.FIELD])
    assert [
        {k: v for k, v in r.items() if k != precision.FIELD} for r in rows
    ] == ROWS  # no value or verdict moved
    assert all(
        r[precision.FIELD] is None for r in precision.annotate(ROWS, "fp32")
    )  # the paper's own: nothing
    assert precision.page_note(rows, "02_copying").startswith(
        "Rows on this page that read a final level (1 row: E3)"
    )
    assert precision.page_note(rows, "01_train") == ""  # no chapter recorded: not this page's


def test_the_departure_is_said_with_the_study_s_table_and_not_for_the_paper_s_fp32(tmp_path):
    assert precision.departure("fp32") == "" and precision.departure_text(None) == ""
    page = precision.departure("tf32")
    assert page.startswith("\n## Precision: a departure\n") and "a departure from the paper's fp32" in page
    assert "0.63 ± 0.15× fp32's L_mask on fresh matrices (outside fp32's seed range, a better model)" in page
    assert "every reading of the curve after it lie inside fp32's seed range" in page
    assert (
        "| final checkpoint's L_mask, 4 096 fresh matrices, fp32 "
        "| 0.0124 (0.0082-0.0170) | 0.0078 | 0.63 ± 0.15 | no |" in page
    )
    assert "none takes less than ~32 ms" in page  # 2.15 TFLOP at 67 TFLOP/s
    gone = precision.departure("tf32", tmp_path / "missing.csv")
    assert "could not be read (FileNotFoundError" in gone and "| measure |" not in gone


def test_the_ledger_trains_in_tf32_at_the_step_its_source_gives():
    """results/paper-slices.yaml: TF32, a departure from params/paper.yaml's fp32, planned at the
    step its step_ms_source holds (the median of slice A's `wall` column over 50-step intervals)."""
    from mclib.core.paper import profile as paper_profile

    ledger = slices.read_ledger()
    assert ledger["precision"] == "tf32" and paper_profile().train.precision == "fp32"
    from mclib.book.runner_progress import median_step_ms

    source = REPO / ledger["step_ms_source"].split(",")[0]
    assert ledger["step_ms"] == pytest.approx(median_step_ms(pd.read_csv(source)), abs=0.05)


@pytest.mark.slow  # ~3.5 s: the committed results re-judged, the part staged
def test_the_committed_tf32_results_carry_the_effect_in_the_scorecard_and_the_paper_part(tmp_path):
    """results/ as committed (slice A, 2026-11-26, TF32): the scorecard's paper-setting column
    carries the effect beside each row that reads a final level, with the paper setting's values and
    verdicts as without it; the scorecard's sentence and the part's first page name the departure."""
    from mclib.lease import part, reference

    folder = reference.latest()
    if folder is None or reference.book_precision(folder) != "tf32":
        pytest.skip("results/ holds no TF32 run of the paper's own setting")
    found = reference.rows(folder, specs=SPECS)
    bare = reference.rejudge(reference.recorded_rows(folder, specs=SPECS), folder, specs=SPECS)
    assert [{k: v for k, v in r.items() if k != precision.FIELD} for r in found] == bare
    late = [r for r in found if scorecard_stage.reads_late(r) and r["verdict"] not in ("n/a", "cannot fail")]
    assert late and all(r[precision.FIELD] == precision.effect_text("tf32") for r in late)
    assert any(r["quantity"].startswith("final L") and r[precision.FIELD] for r in found if r["id"] == "E1")
    table = reference.beside([], folder, specs=SPECS)
    assert (table["precision's effect"] != "—").sum() == len(late)
    assert precision.departure_text("tf32") in reference.status(folder)
    index = part.stage(tmp_path, slices.LEDGER, specs=SPECS)[0].read_text()
    assert (
        precision.departure("tf32") in index and "Final levels of the runs trained in tf32 (seed 1" in index
    )


def test_the_paper_book_s_time_is_its_steps_times_each_measured_step():
    """benchmarks/paper_book_time.py, the estimate README and docs/gpu.md quote: seed 1's 50 000
    steps, seeds 2 and 3 to the paper's drop + 2 000, E15's four runs at their cap; times the
    ledger's TF32 step and the fp32 step of the 2026-11-26 table."""
    from sources import load_script

    from mclib.core.paper import profile as paper_profile

    bench = load_script(REPO / "benchmarks" / "paper_book_time.py")
    assert bench.book_steps(paper_profile()) == {
        "seed 1": 50_000,
        "seed 2": 17_000,
        "seed 3": 17_000,
        "E15, 4 runs (at most)": 200_000,
    }
    ledger = slices.read_ledger()
    table = bench.estimate(paper_profile(), ledger)  # no device named: the ledger's step
    assert (
        table.loc["total (E15 at its cap)", "steps"] == 284_000
        and table.loc["total without E15", "steps"] == 84_000
    )
    ms = bench.steps(ledger)
    assert ms["tf32"][0] == ledger["step_ms"] and ms["fp32"][0] == pytest.approx(54.87, abs=0.01)
    assert table.loc["total (E15 at its cap)", "tf32 min"] == pytest.approx(
        284_000 * ledger["step_ms"] / 60_000
    )
    # a device with a committed step table: its fastest
    # passing variant (the H200's reduce-overhead, 2026-11-28)
    h200 = bench.steps(
        ledger, device="NVIDIA H200", committed=REPO / "tests" / "data" / "lease_step_h200_2026-11-28.csv"
    )
    assert h200["tf32"][0] == pytest.approx(13.34, abs=0.01) and "reduce-overhead" in h200["tf32"][1]
