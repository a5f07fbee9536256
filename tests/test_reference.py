"""The paper setting's reference results (mclib.lease.reference): collected without a
checkpoint, found when committed, set beside our rows, and said absent when absent."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mclib.chapters.registry import specs as chapter_specs
from mclib.core.runs import SCORECARD
from mclib.lease import reference, slices_pack

SPECS = (
    chapter_specs()
)  # what the toc's chapters declare (mclib.book.spec), as the command line hands it down


def _fake_book(out, seed_rows):
    run = out / "runs" / "paper-seed1"
    _paper_run(run, level_after=0.05)
    (run / "checkpoints" / "step_001000").mkdir(parents=True)
    (run / "checkpoints" / "step_001000" / "model.safetensors").write_bytes(b"x" * 1000)
    (run / SCORECARD).write_text(json.dumps(seed_rows))
    (run / "freeze" / "mlp").mkdir(parents=True)
    (run / "freeze" / "mlp" / "metrics.csv").write_text((run / "metrics.csv").read_text())
    _paper_run(out / "runs" / "paper-seed2", level_after=1.0, steps=1000, drop_at=None, ended=None)
    (out / "book" / "_executed").mkdir(parents=True)
    (out / "book" / "_executed" / "01_train.ipynb").write_text("{}")
    (out / "book" / "_executed" / "manifest.json").write_text(
        json.dumps({"notebooks": [{"name": "01_train", "complete": True}]})
    )


ROW = {"id": "E1", "quantity": "drop step", "paper": 15000.0, "ours": 14000.0, "verdict": "matches"}


def test_collect_copies_the_small_files_and_never_a_checkpoint(tmp_path):
    _fake_book(tmp_path / "out", [ROW])
    dest = slices_pack.collect(tmp_path / "out", tmp_path / "results" / "paper-GPU-2026-01-01")
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert files == [
        "book/01_train.ipynb",
        "book/manifest.json",
        "device.json",
        "runs/paper-seed1/end.json",
        "runs/paper-seed1/freeze/mlp/metrics.csv.gz",
        "runs/paper-seed1/metrics.csv.gz",
        "runs/paper-seed1/profile.yaml",
        f"runs/paper-seed1/{SCORECARD}",
        "runs/paper-seed2/metrics.csv.gz",
        "runs/paper-seed2/profile.yaml",
    ]
    assert {"device", "torch", "date"} <= set(json.loads((dest / "device.json").read_text()))


def test_latest_and_beside(tmp_path):
    assert reference.latest(root=tmp_path) is None
    none = reference.beside([ROW], None, specs=SPECS)
    assert none.loc[0, "paper-setting verdict"] == "not run" and none.loc[0, "laptop verdict"] == "matches"
    assert "has not been run" in reference.status(None)
    _fake_book(
        tmp_path / "out",
        [
            {**ROW, "ours": 30000.0, "verdict": "differs"},
            {"id": "E20", "quantity": "final MSE", "paper": 1e-3, "ours": 2e-3, "verdict": "differs"},
        ],
    )
    for date, name in (("2026-01-01", "paper-A-2026-01-01"), ("2026-02-01", "paper-B-2026-02-01")):
        dest = slices_pack.collect(tmp_path / "out", tmp_path / name)
        (dest / "device.json").write_text(
            json.dumps({"device": name[6], "date": date, "torch": "2.x", "git": "abc"})
        )
    folder = reference.latest(root=tmp_path)
    assert folder.name == "paper-B-2026-02-01"
    table = reference.beside([ROW], folder, specs=SPECS)
    assert list(table["id"]) == ["E1", "E20"]  # their extra row is listed too
    # one seed's drop step has no spread: n/a until the laptop's seeds lend it theirs (chapter 07's row)
    assert table.loc[0, "paper-setting verdict"] == "n/a" and table.loc[0, "paper setting"] == 30000.0
    assert table.loc[1, "laptop verdict"] == "—"
    seeds = {
        "id": "E1",
        "quantity": "drop step, over seeds",
        "paper": 15000.0,
        "ours": 10000.0,
        "spread": 1000.0,
        "verdict": "n/a",
    }
    table = reference.beside([ROW, seeds], folder, specs=SPECS)
    assert table.loc[0, "paper-setting verdict"] == "differs"  # 30 000 ± 2·3 000 (10 %) against 15 000 ± 10 %
    assert "ran on B on 2026-02-01" in reference.status(folder)


# --- a paper run cut short: rows from its training curve alone ---------------------------------


def _paper_run(
    run, level_after: float, steps: int = 6000, drop_at: int | None = 3000, ended: str | None = "converged"
):
    """A paper-shaped run folder: its profile.yaml, a curve on the copying plateau that
    falls to `level_after` x E[X²] at `drop_at` (None: never), and end.json (None: cut)."""
    import numpy as np
    import pandas as pd
    import yaml

    from mclib.core.config import load_profile, profile_path
    from mclib.core.data import copy_level

    cfg = load_profile(profile_path("paper")).replace(**{"train.save_every": 500, "train.precision": "tf32"})
    run.mkdir(parents=True)
    (run / "profile.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    level = copy_level(cfg.data.rank)
    step = np.arange(1, steps + 1)
    after = step >= drop_at if drop_at else np.zeros(steps, bool)
    noise = 1 + 0.01 * np.random.default_rng(0).standard_normal(steps)
    L_mask = np.where(after, level_after * level, level) * noise
    L_obs = np.where(after, 1e-4, 8e-4) * noise
    pd.DataFrame(
        {
            "step": step,
            "L": 0.3 * L_mask + 0.7 * L_obs,
            "L_obs": L_obs,
            "L_mask": L_mask,
            "mask_value": 0.0,
            "wall": 0.02 * step,
        }
    ).to_csv(run / "metrics.csv", index=False)
    if ended:
        (run / "end.json").write_text(
            json.dumps({"ended": ended, "step": steps, "drop": drop_at, "steps": 50000, "until": "converged"})
        )


def test_a_cut_paper_run_is_scored_from_its_curve(tmp_path, monkeypatch):
    monkeypatch.setattr(
        "mclib.analyses.rounding.study", lambda *a, **k: {}
    )  # the rules apart from the rounding spread
    _paper_run(tmp_path / "out" / "runs" / "paper-seed1", level_after=0.05, steps=8000)
    _paper_run(
        tmp_path / "out" / "runs" / "paper-seed2", level_after=1.0, steps=2000, drop_at=None, ended=None
    )
    dest = slices_pack.collect(tmp_path / "out", tmp_path / "results" / "paper-GPU-2026-01-01")
    assert (dest / "runs" / "paper-seed1" / "metrics.csv.gz").is_file()
    assert not (dest / "runs" / "paper-seed1" / "metrics.csv").exists()
    assert reference.read_metrics(dest / "runs" / "paper-seed1").equals(
        reference.read_metrics(tmp_path / "out" / "runs" / "paper-seed1")
    )  # gzipped whole
    folder = reference.latest(root=tmp_path / "results")
    assert folder == dest

    table = reference.runs_table(folder).set_index("run")
    assert table.loc["seed 1", "drop step"] == reference.find_drop(
        reference.read_metrics(dest / "runs/paper-seed1")
    )
    assert 3000 <= table.loc["seed 1", "drop step"] <= 3100
    assert table.loc["seed 1", "final L_mask / E[X²]"] == pytest.approx(0.05, rel=0.05)
    assert table.loc["seed 1", "ms a step"] == pytest.approx(20.0)
    assert table.loc["seed 2", "ended"].startswith("cut") and table.loc["seed 2", "steps trained"] == 2000
    # flat after its drop at 3 000: today's rule finds seed 1 flat once its 2 000-step window lies after
    # the drop, and ends it where the next 2 000 steps confirm that
    assert 7000 <= table.loc["seed 1", "today's rule ends it at"] <= 7200
    assert pd.isna(table.loc["seed 2", "today's rule ends it at"])  # no drop: never converged

    by = {r["quantity"]: r for r in reference.rows(folder, specs=SPECS)}
    assert by["pre-shift L_mask / E[X²]"]["verdict"] == "matches"  # on the plateau, as the paper's
    final = by["final L / (p_mask · E[X²]), last 10 % of steps"]
    assert final["ours"] == pytest.approx(
        0.3 * 0.05 * 0.2222 / (0.3 * 0.2222) + 0.7e-4 / (0.3 * 0.2222), rel=0.05
    )
    assert final["verdict"] == "differs"  # 0.05 against the paper's 0.06 ± tiny se

    laptop = {
        "id": "E3",
        "quantity": "post-shift L_mask / E[X²]",
        "paper": 0.06,
        "ours": 0.05,
        "verdict": "matches",
    }
    table = reference.beside([laptop], folder, specs=SPECS).set_index("quantity")
    assert table.loc[list(by), "paper-setting verdict"].tolist() == [r["verdict"] for r in by.values()]
    # one seed's drop step, with no seed spread to judge it by
    # (no laptop row of the drop over seeds): n/a, said why
    assert (
        by["drop step"]["ours"] == table.loc["drop step", "paper setting"]
        and by["drop step"]["verdict"] == "n/a"
    )
    assert "laptop edition's seeds" in by["drop step"]["na"]
    assert table.loc[laptop["quantity"], "paper-setting verdict"] == "not run"  # no chapter completed there
    status = reference.status(folder)
    assert "No chapter completed" in status and "seed 2: 2,000 steps, cut" in status and "tf32" in status
    assert len(reference.loss_figure(folder).axes[0].get_lines()) == 2 + 1 + 1  # 2 seeds, 1 drop, E[X²]


def test_the_committed_paper_run_reads_as_its_end_record():
    """results/ as committed: the drop the book reads from the curve is the one the trainer
    wrote when the run ended."""
    folder = reference.latest()
    if folder is None:
        pytest.skip("results/ holds no run of the paper's own setting")
    run = folder / "runs" / "paper-seed1"
    end = json.loads((run / "end.json").read_text()) if (run / "end.json").is_file() else None
    table = reference.runs_table(folder).set_index("run")
    if end:
        assert (
            table.loc["seed 1", "drop step"] == end["drop"]
            and table.loc["seed 1", "steps trained"] == end["step"]
        )
    assert {r["id"] for r in reference.rows(folder, specs=SPECS)} >= {"E1"}


def test_the_slices_of_the_paper_book_read_as_one_set_of_runs(tmp_path):
    # slice A holds the book's run, B seed 2: the runs table and the figure read both
    root = tmp_path / "results"
    for name, seed, date in (("A", 1, "2026-12-01"), ("B", 2, "2026-12-02")):
        out = tmp_path / f"out-{name}"
        _paper_run(out / "runs" / f"paper-seed{seed}", level_after=0.05)
        dest = slices_pack.collect(out, root / f"paper-{name}-GPU-{date}", seeds=[seed])
        (dest / "slice.json").write_text(
            json.dumps(
                {
                    "slice": name,
                    "profile": "paper",
                    "device": "GPU",
                    "date": date,
                    "git": "abc",
                    "precision": "tf32",
                }
            )
        )
    folder = reference.latest(root=root)
    assert folder.name == "paper-A-GPU-2026-12-01"  # the one holding the book's run
    assert list(reference.runs_table(folder)["run"]) == ["seed 1", "seed 2"]
    (root / "paper-B-GPU-2026-12-02" / "slice.json").unlink()  # not a slice: read alone
    assert list(reference.runs_table(folder)["run"]) == ["seed 1"]


def test_slices_that_retrain_seed_1_add_their_rows_and_e15_runs_and_keep_the_book_run_first(tmp_path):
    """Slice D (chapter 06) and E15's slices each train seed 1 again: the runs table names
    each such run by its slice, the figure shows seed 1 once, the scorecard's paper-setting
    rows come from every slice's chapters, and E15's rows from its slices' runs (the order
    of the drops only once all four groups are in)."""
    from mclib.core.runs import freeze_dir

    root = tmp_path / "results"
    e1 = {**ROW, "verdict": "matches"}
    e16 = {"id": "E16", "quantity": "BERT / nuclear norm", "paper": 1.0, "ours": 1.1, "verdict": "matches"}
    plan = (
        ("A", "2026-12-01", [e1], None),
        ("D", "2026-12-02", [e16], None),
        ("E15-mlp", "2026-12-03", [], ("mlp", 200)),
        ("E15-token", "2026-12-04", [], ("token", None)),
    )
    for name, date, recorded, e15 in plan:
        out = tmp_path / f"out-{name}"
        run = out / "runs" / "paper-seed1"
        _paper_run(
            run, level_after=0.05, ended="stopped" if e15 else "converged"
        )  # E15's: at its source_steps
        if recorded:
            (run / SCORECARD).write_text(json.dumps(recorded))
        record = {
            "slice": name,
            "profile": "paper",
            "device": "GPU",
            "date": date,
            "git": "abc",
            "precision": "tf32",
            "chapters_done": ["01_train"] if name == "A" else ["06_baselines"] if name == "D" else [],
        }
        if e15:
            group, drop = e15
            _paper_run(freeze_dir(run, group), level_after=0.05, steps=4000, drop_at=drop, ended=None)
            record["freeze_ends"] = {
                group: {
                    "group": group,
                    "ended": "converged" if drop else "main drop",
                    "steps": 4000,
                    "drop": drop,
                    "main_drop": 3000,
                    "cap": 14000,
                }
            }
        dest = slices_pack.collect(out, root / f"paper-{name}-GPU-{date}", seeds=[1])
        (dest / "slice.json").write_text(json.dumps(record))
        (dest / "device.json").write_text(
            json.dumps({"device": "GPU", "date": date, "torch": "2.x", "git": "abc"})
        )
    folder = reference.latest(root=root)
    assert list(reference.runs_table(folder)["run"]) == [
        "seed 1",
        "seed 1 (slice D)",
        "seed 1 (slice E15-mlp)",
        "seed1, E15 mlp",
        "seed 1 (slice E15-token)",
        "seed1, E15 token",
    ]
    assert len(reference.loss_figure(folder).axes[0].get_lines()) == 1 + 1 + 1  # seed 1 once, its drop, E[X²]
    assert (
        len(reference.freeze_figure(folder).axes[0].get_lines()) == 2 + 1 + 1
    )  # two runs, mlp's drop, E[X²]
    assert reference.freeze_figure(tmp_path / "no-results") is None
    got = reference.rows(folder, specs=SPECS)
    assert [r["id"] for r in got][:2] == ["E1", "E16"] and all(r["id"] == "E15" for r in got[2:])
    e15_rows = {r["quantity"]: r for r in got[2:]}
    order = "order of the drops: mlp and token, then attention, then positional"
    assert set(e15_rows) == {
        "plateau / fall, mlp re-initialised",
        "plateau / fall, token re-initialised",
        "final L_mask / the main run's, mlp re-initialised",
        "final L_mask / the main run's, token re-initialised",
        order,
    }
    assert e15_rows[order]["verdict"] == "n/a"  # two groups of four: the order waits for the others
    assert e15_rows[order]["na"] == "the attention and positional runs not in yet: the order needs all four"
    assert e15_rows["plateau / fall, token re-initialised"]["verdict"] == "n/a"  # it did not drop
    recovery = e15_rows["final L_mask / the main run's, mlp re-initialised"]
    assert recovery["ours"] == pytest.approx(1.0, rel=0.05)
    assert "against the main run's" in recovery["reading"]  # its level where the slice stopped it, named
    assert (
        "at step 6,000, where it was stopped so that the runs start from its weights there"
        in recovery["reading"]
    )
    status = reference.status(folder)
    assert "ran in 4 slices on GPU leases" in status and "slice D on GPU on 2026-12-02" in status
    assert "slice E15-mlp on GPU on 2026-12-03 (torch" in status
    table = reference.beside([e1], folder, specs=SPECS).set_index("quantity")
    assert table.loc["BERT / nuclear norm", "paper-setting verdict"] == "matches"


def test_a_slices_chapters_are_those_its_record_says_it_executed(tmp_path):
    """A lease whose `finish` ran twice leaves a manifest of the last call's chapters only:
    the slice's own record (`chapters_done`) is what says which chapters ran."""
    folder = tmp_path / "paper-A-GPU-2026-11-26"
    (folder / "book").mkdir(parents=True)
    (folder / "book" / "manifest.json").write_text(
        json.dumps({"notebooks": [{"name": "03_heads", "complete": True}]})
    )
    record = {
        "chapters": ["01_train", "03_heads", "04_embeddings"],
        "chapters_done": ["01_train", "03_heads"],
        "chapters_not_run": ["04_embeddings"],
    }
    (folder / "slice.json").write_text(json.dumps(record))
    assert reference.chapters_run(folder) == ["01_train", "03_heads"]
    del record["chapters_done"]  # an older record: the planned chapters less those not run
    (folder / "slice.json").write_text(json.dumps(record))
    assert reference.chapters_run(folder) == ["01_train", "03_heads"]
    (folder / "slice.json").unlink()  # not a slice (the first run's folder): its manifest
    assert reference.chapters_run(folder) == ["03_heads"]


def test_every_recorded_row_is_judged_again_by_today_s_rule(tmp_path):
    """A recorded row gets today's verdict even where its kind and paper value stand: the rule's
    reference, sense and margin are the row's own where recorded, else what the chapter that
    declares the row gives (its `rule_of`); without either, n/a with the reason."""
    e5 = {
        "id": "E5",
        "quantity": "identity heads ablated, uniform (the paper's text): ablated / unablated L_mask",
        "kind": "direction",
        "paper": None,
        "ours": 1.12,
        "se": 0.032,
        "verdict": "differs",
        "chapter": "03_heads",
    }
    clear = {
        **e5,
        "quantity": "row heads ablated, uniform (the paper's text): ablated / unablated L_mask",
        "ours": 5.2,
        "se": 0.12,
        "verdict": "same direction",
    }
    own = {
        **e5,
        "id": "E99",
        "quantity": "q",
        "reference": 1.0,
        "sense": "below",
        "verdict": "same direction",
    }
    lost = {**e5, "id": "E99", "quantity": "r", "verdict": "differs"}
    na = {
        **e5,
        "id": "F1",
        "kind": "finding",
        "quantity": "s",
        "verdict": "n/a",
        "reading": "x; n/a: one seed",
    }
    out = {r["quantity"]: r for r in reference.rejudge([e5, clear, own, lost, na], tmp_path, specs=SPECS)}
    # 1.12 ± 2·0.032 against "above 1.1" (1 + the direction rule's 10 %): reaches both sides
    now = out[e5["quantity"]]
    assert (
        now["verdict"] == "too close to tell"
        and now["was"] == "differs"
        and (now["reference"], now["sense"]) == (1.0, "above")
    )
    assert now["rejudged"].startswith("differs → too close to tell (today's direction rule")
    assert out[clear["quantity"]]["verdict"] == "same direction" and "was" not in out[clear["quantity"]]
    assert out["q"]["verdict"] == "differs"  # its own recorded rule, today: 1.12 is not below 1
    assert out["r"]["verdict"] == "n/a" and "recorded no reference or sense" in out["r"]["na"]
    assert (
        out["s"]["verdict"] == "n/a"
        and out["s"]["na"] == "one seed"
        and out["s"]["reading"] == "x; n/a: one seed"
    )
