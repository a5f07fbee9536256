"""The paper book in slices (mclib.lease.slices), rehearsed on the CPU with the
smoke profile: the two commands of a lease, with only what the GPU image and the kit hold
importable, then the merge on the CPU side."""

import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from mclib.chapters.registry import specs as chapter_specs
from mclib.core.checkpoints import saved_steps
from mclib.core.ending import run_end
from mclib.lease import slices, slices_pack, slices_run

SPECS = (
    chapter_specs()
)  # what the toc's chapters declare (mclib.book.spec), as the command line hands it down

ROOT = Path(__file__).resolve().parent.parent

# Packages the GPU side must never import: the site builder, the solver, the cluster
# (scripts/wheelhouse.py --kit leaves them out; the image does not have them).
# (Sphinx is left importable: scipy asks whether "sphinx" is in sys.modules, which a blocked
# entry would answer yes; jupyter_book, which would bring it, is blocked.)
NOT_ON_THE_GPU = ("jupyter_book", "cvxpy", "clarabel", "dask", "distributed", "debugpy", "jedi")

# None in sys.modules: `import x` fails as if x were not installed, and find_spec("x") says
# "not installed" (what guarded imports, IPython's of jedi among them, ask)
BLOCKER = f"import sys\nfor _name in {NOT_ON_THE_GPU!r}:\n    sys.modules[_name] = None\n"


def _ledger(tmp_path, train_s=20, profile="smoke", chapters=("01_train", "02_copying"), **extra):
    plan = {
        "profile": str(profile),
        "precision": "fp32",
        "step_ms": 5.0,
        "step_ms_source": "a test",
        "lease_s": 900,
        "start_s": 120,
        "slices": [
            {
                "name": "A",
                "what": "the smoke run under a deadline",
                "seeds": [1],
                "train_s": train_s,
                "chapters": list(chapters),
                "chapters_s": 200,
                **extra,
            }
        ],
    }
    path = tmp_path / "results" / "paper-slices.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(plan))
    return path


def test_a_slice_that_cannot_fit_is_refused_in_one_line(tmp_path):
    ledger = _ledger(tmp_path, train_s=600)
    with pytest.raises(slices.SliceError) as e:
        slices_run.start(tmp_path / "work", budget_s=700, ledger_path=ledger)
    assert str(e.value) == (
        "no slice fits this lease: slice A needs at least 830 s (training 600 s at 5 ms a step, "
        "chapters 200 s, packing 30 s) but 700 s are left"
    )
    assert not (tmp_path / "work").exists()  # refused before anything is written


def test_a_lease_short_of_time_shortens_the_deadline_down_to_its_floor(tmp_path):
    ledger = slices.read_ledger(_ledger(tmp_path, train_s=350, min_train_s=290))
    s = ledger["slices"][0]  # chapters 200 s, packing 30 s
    assert slices.train_seconds(s, 700) == 350  # time enough: the whole deadline
    assert slices.train_seconds(s, 560) == 330  # short: the chapters keep their time
    slices.check_fits(ledger, s, 520)  # 290 + 200 + 30: still fits
    with pytest.raises(slices.SliceError, match="needs at least 520 s"):
        slices.check_fits(ledger, s, 519)


def _plan(tmp_path) -> Path:
    """A ledger of the shape of results/paper-slices.yaml: A (its run must reach 30 000 steps), seeds 2 and 3
    together or one a lease, at 20 ms a step by default."""
    plan = {
        "profile": "smoke",
        "precision": "fp32",
        "step_ms": 20.0,
        "lease_s": 900,
        "start_s": 120,
        "slices": [
            {
                "name": "A",
                "what": "the book's run",
                "seeds": [1],
                "train_s": 500,
                "min_train_s": 380,
                "min_steps": 30000,
                "chapters_s": 160,
                "valid_from": "2026-11-27",
            },
            {
                "name": "BC",
                "what": "seeds 2 and 3",
                "seeds": [2, 3],
                "joins": ["B", "C"],
                "expected_steps": 34000,
            },
            {"name": "B", "what": "seed 2", "seeds": [2], "expected_steps": 17000},
            {"name": "C", "what": "seed 3", "seeds": [3], "expected_steps": 17000},
        ],
    }
    path = tmp_path / "results" / "paper-slices.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(plan))
    return path


def _done(path: Path, name: str, date: str) -> None:
    folder = path.parent / f"smoke-{name}-GPU-{date}"
    folder.mkdir()
    (folder / slices.STATE).write_text(
        json.dumps({"slice": name, "date": date, "device": "GPU", "git": "abc", "precision": "fp32"})
    )


def test_the_plan_follows_the_step_measured_in_the_lease(tmp_path):
    path = _plan(tmp_path)
    ledger = slices.read_ledger(path)
    said = []
    pick = lambda ms: slices.next_slice(ledger, path.parent, 635, ms, say=said.append).name
    assert pick(9.0) == "A" and not said  # 445 s (635 less chapters and packing): 49 444 steps
    assert pick(14.0) == "A"  # 31 785: still past 30 000
    assert pick(16.0) == "BC" and said == [
        "slice A passed over: its deadline of 445 s reaches about 27,812 steps "
        "at 16 ms a step, short of the 30,000 it needs"
    ]
    said.clear()
    assert pick(19.5) == "B" and said[1].startswith(
        "slice BC passed over: needs at least 693 s (training 663 s"
    )
    assert (
        slices.next_slice(ledger, path.parent, 300, 19.5) is None
    )  # nothing fits: `start` says why, in one line


def test_a_joint_slice_and_its_members_count_each_other_done_and_an_earlier_path_is_kept_not_done(tmp_path):
    path = _plan(tmp_path)
    ledger = slices.read_ledger(path)
    by = {s.name: s for s in ledger["slices"]}
    _done(path, "A", "2026-11-26")  # before valid_from: the record of an earlier path
    _done(path, "B", "2026-11-28")
    have = slices.done(path.parent, "smoke")
    assert set(have) == {"A", "B"}  # shown: the book reads what is there
    assert [n for n in by if slices.is_done(ledger, by[n], have)] == ["B"]
    _done(path, "C", "2026-11-29")
    have = slices.done(path.parent, "smoke")
    assert slices.is_done(ledger, by["BC"], have)  # both members done: the joint slice is too
    _done(path, "A", "2026-11-30")
    assert slices.next_slice(ledger, path.parent) is None
    assert slices.done(path.parent, "smoke")["A"].name == "smoke-A-GPU-2026-11-30"  # the newer one is shown


def test_a_result_of_another_precision_or_a_slice_not_open_is_merged_with_a_note(tmp_path, logged):
    path = _plan(tmp_path)
    _done(path, "B", "2026-11-28")
    out = tmp_path / "back"
    (out / "runs").mkdir(parents=True)
    (out / slices.STATE).write_text(
        json.dumps(
            {
                "slice": "B",
                "profile": "smoke",
                "device": "GPU",
                "date": "2026-11-29",
                "git": "abc",
                "precision": "tf32",
            }
        )
    )
    tgz = tmp_path / "results.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(out / slices.STATE, arcname=slices.STATE)
    dest = slices_pack.merge(tgz, path.parent, path)
    notes = json.loads((dest / slices.STATE).read_text())["merge_notes"]
    assert "trained in tf32, the ledger's precision is fp32" in notes
    assert any(n.startswith("slice B was not open in the ledger") for n in notes)
    assert "slice merge: note: trained in tf32" in logged.out()


def test_a_joint_slice_done_counts_its_members_done(tmp_path):
    path = _plan(tmp_path)
    ledger = slices.read_ledger(path)
    _done(path, "BC", "2026-11-28")
    have = slices.done(path.parent, "smoke")
    assert [s.name for s in ledger["slices"] if slices.is_done(ledger, s, have)] == ["BC", "B", "C"]
    said = slices.status(path)
    assert (
        "in a lease with 635 s left" in said and "A: to do" in said
    )  # no step table: the full one is measured
    assert "at the ledger's 20 ms a step (no device named: --device)" in said


# --- the committed step table, keyed by device: the plan follows the measured step ------------

H200_TABLE = (
    ROOT / "tests" / "data" / "lease_step_h200_2026-11-28.csv"
)  # the lease of 2026-11-28, as it came back
H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"


def _h100_table(path: Path, ms: float = 30.0) -> Path:
    """A full table of an H100, of the H200 table's shape (its eager and compile rows, another
    device and time)."""
    t = pd.read_csv(H200_TABLE)
    t = t[t["variant"].isin(["eager", "compile"])].assign(device=H100, date="2026-11-29")
    t.loc[t["variant"] == "compile", "ms_step"] = ms
    t.to_csv(path, index=False)
    return path


def test_the_committed_step_table_holds_several_devices_side_by_side(tmp_path):
    from mclib.lease import steptable

    committed = tmp_path / "results" / steptable.COMMITTED
    committed.parent.mkdir()
    said = steptable.adopt(H200_TABLE, committed)
    assert said.endswith(f"written as {committed}") and ": committed" not in said
    said = steptable.adopt(_h100_table(tmp_path / "h100.csv"), committed)
    assert said.endswith(f"written as {committed} (the rows of {H200} kept)")
    t = pd.read_csv(committed)
    assert t.groupby("device").size().to_dict() == {H100: 2, H200: 5}
    assert not list(committed.parent.glob(".tmp-*"))  # written whole, then renamed
    h200, _ = steptable.chosen(committed, H200, "tf32")
    h100, _ = steptable.chosen(committed, H100, "tf32")
    assert (h200["variant"], round(h200["ms_step"], 1), h200["date"]) == (
        "reduce-overhead",
        13.3,
        "2026-11-28",
    )
    assert (h100["variant"], h100["ms_step"], h100["date"]) == ("eager", 19.226983642578126, "2026-11-29")
    # each device's rows answer for that device alone: the H100's step files changed, the H200's did not
    t.loc[t["device"] == H100, "step_hash"] = "0123456789ab"
    t.to_csv(committed, index=False)
    here = steptable.step_hash()
    assert steptable.same_files(committed, H200) == (here == "3105954dd6dc")
    assert not steptable.same_files(committed, H100)
    assert (
        steptable.stands(
            committed,
            {"step_hash": "0123456789ab", "torch": "2.11.0+cu130", "device": H100, "precision": "tf32"},
        )[0]
        == "eager"
    )


def test_re_adopting_one_device_s_table_leaves_the_other_s_rows_intact(tmp_path):
    from mclib.lease import steptable

    committed = tmp_path / steptable.COMMITTED
    steptable.adopt(H200_TABLE, committed)
    steptable.adopt(_h100_table(tmp_path / "h100.csv", ms=30.0), committed)
    before = pd.read_csv(committed)
    steptable.adopt(_h100_table(tmp_path / "h100.csv", ms=9.0), committed)  # the H100 measured again
    after = pd.read_csv(committed)
    pd.testing.assert_frame_equal(
        after[after["device"] == H200].reset_index(drop=True),
        before[before["device"] == H200].reset_index(drop=True),
    )
    assert list(after.loc[after["device"] == H100, "ms_step"].round(1)) == [19.2, 9.0]  # replaced, not added
    assert steptable.chosen(committed, H100, "tf32")[0]["variant"] == "compile"


def test_stands_for_a_device_with_no_rows_says_so_in_one_line(tmp_path):
    from mclib.lease import steptable

    committed = tmp_path / steptable.COMMITTED
    steptable.adopt(H200_TABLE, committed)
    key = {"step_hash": steptable.step_hash(), "torch": "2.11.0+cu130", "device": H100, "precision": "tf32"}
    assert steptable.stands(committed, key) == (None, f"lease_step.csv has no rows of {H100}")
    assert steptable.stands(committed, {**key, "device": H200, "precision": "fp32"}) == (
        None,
        f"lease_step.csv has no table of {H200} at fp32",
    )
    assert not steptable.same_files(committed, H100)
    assert steptable.chosen(committed, H100, "tf32") == (
        None,
        f"lease_step.csv has no rows of {H100} at tf32",
    )


def _real_plan(tmp_path, done_a: bool) -> Path:
    """results/paper-slices.yaml as committed, the H200's step table of 2026-11-28 beside it, and
    (done_a) slice A done on that lease (as results/paper-A-NVIDIA-H200-2026-11-28 will hold it)."""
    from mclib.lease import steptable

    results = tmp_path / "results"
    results.mkdir()
    (results / "paper-slices.yaml").write_text(slices.LEDGER.read_text())
    steptable.adopt(H200_TABLE, results / steptable.COMMITTED)
    if done_a:
        folder = results / "paper-A-NVIDIA-H200-2026-11-28"
        folder.mkdir()
        (folder / slices.STATE).write_text(
            json.dumps(
                {"slice": "A", "date": "2026-11-28", "device": H200, "git": "50947b2", "precision": "tf32"}
            )
        )
    return results / "paper-slices.yaml"


def test_slice_status_plans_with_the_h200_s_measured_step_and_bc_comes_after_a(tmp_path):
    """At the H200's 13.3 ms (reduce-overhead, 2026-11-28) seeds 2 and 3 (34 000 steps, ~483 s)
    fit the 655 s a lease has after the kit and the chosen variant's check; at the ledger's 19.5
    they did not, and B came first."""
    from mclib.lease import steptable

    path = _real_plan(tmp_path, done_a=True)
    said = slices.status(path).splitlines()
    nxt = next(line for line in said if line.startswith("next"))
    if steptable.same_files(path.parent / steptable.COMMITTED, H200):  # these step files: the check alone
        assert "in a lease with 655 s left" in nxt
    assert nxt.startswith(f"next, on {H200},") and nxt.endswith(
        f"at 13.3 ms a step (reduce-overhead, the fastest that passed its check in lease_step.csv's table of "
        f"{H200} of 2026-11-28): BC"
    )
    assert said[0] == f"A: done on {H200}, 2026-11-28, revision 50947b2, tf32"
    assert "needs about 483 s of a lease at 13.3 ms a step" in said[1]
    # no done A: A comes first where the committed table stands for these step files (655 s left: its 465 s
    # deadline reaches ~34 900 steps at 13.3 ms); where the files changed, the full table leaves 575 s, A's
    # deadline falls short of its 30 000 steps, and it is passed over for BC, in one line
    (tmp_path / "a").mkdir()
    path = _real_plan(tmp_path / "a", done_a=False)
    said = slices.status(path).splitlines()
    nxt = next(line for line in said if line.startswith("next"))
    if steptable.same_files(path.parent / steptable.COMMITTED, H200):
        assert nxt.endswith("of 2026-11-28): A")
    else:
        assert nxt.endswith("of 2026-11-28): BC") and "in a lease with 575 s left" in nxt
        assert any(
            line.strip().startswith("(slice A passed over: ") and "short of the 30,000 it needs" in line
            for line in said
        )
    assert said[0].startswith("A: to do") and "a result of an earlier path" not in said[0]


def test_slice_status_falls_back_to_the_ledger_s_step_where_the_table_has_no_row_of_the_device(tmp_path):
    path = _real_plan(tmp_path, done_a=True)
    nxt = slices.status(path, device=H100).splitlines()[-3]
    assert nxt.startswith(f"next, on {H100},") and nxt.endswith(
        f"at the ledger's 19.5 ms a step (lease_step.csv has no rows of {H100} at tf32): B"
    )


def test_the_step_a_slice_plans_with_is_the_picked_variant_s_measured_time(tmp_path):
    rows = [
        {"variant": "eager", "passed": True, "ms_step": 19.5, "check": "the reference"},
        {"variant": "cuda-graph", "passed": True, "ms_step": 8.9, "check": "bitwise equal"},
        {"variant": "bf16", "passed": False, "ms_step": 6.0, "precision": "bf16", "check": "for the record"},
    ]
    base = {"status": "ran", "precision": "tf32", "device": "NVIDIA H100 80GB HBM3"}
    table = tmp_path / slices.STEP_TABLE
    pd.DataFrame([{**base, "time": time.time(), **r} for r in rows]).to_csv(table, index=False)
    assert slices.pick_step(table, "tf32", base["device"]).ms == 8.9
    assert slices.pick_step(table, "fp32", base["device"]).ms is None  # nothing measured at fp32
    # a table from an earlier lease: eager, and none of its times either (the ledger's step_ms plans)
    pd.DataFrame([{**base, "time": time.time() - 2 * slices.STEP_TABLE_S, **r} for r in rows]).to_csv(
        table, index=False
    )
    assert slices.pick_step(table, "tf32", base["device"])[::2] == ("eager", None)
    assert slices.pick_step(tmp_path / "no", "tf32").ms is None


def test_a_slice_sized_by_steps_uses_the_ledger_step_time(tmp_path):
    ledger = slices.read_ledger(_ledger(tmp_path, train_s=None, expected_steps=10_000))
    assert slices.needed_s(ledger, ledger["slices"][0]) == 10_000 * 5.0 / 1000 + 200 + 30


SLICE_A = ("01_train", "02_copying", "03_heads", "04_embeddings", "07_beyond")  # results/paper-slices.yaml


def _paper_shapes(tmp_path) -> Path:
    """The paper's model and task (mclib.core.paper.shapes_profile) at batch 8, long enough
    that the slice's deadline cuts it after a few checkpoints."""
    from mclib.core.paper import shapes_profile

    p = shapes_profile(steps=2000, batch=8).replace(
        **{
            "train.save_every": 10,
            "train.state_every": 20,
            "train.log_every": 5,
            "train.eval_every": 10,
            "checkpoints.pre": 10,
            "checkpoints.transition": [20],
            "checkpoints.post": 2000,
        }
    )
    path = tmp_path / "paper-shapes.yaml"
    path.write_text(yaml.safe_dump(p.to_dict(), sort_keys=False))
    return path


@pytest.mark.slow
def test_a_lease_rehearsed_two_commands_then_the_merge(tmp_path):
    """Slice A at the paper's shapes, a handful of steps, through scripts/lease.sh's two commands."""
    shapes = _paper_shapes(tmp_path)
    ledger = _ledger(tmp_path, train_s=25, profile=shapes, chapters=SLICE_A)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "PYTHONUNBUFFERED": "1"}
    work, out = tmp_path / "work", tmp_path / "OUT"

    def mclib(*args):
        p = subprocess.run(
            [sys.executable, "-m", "mclib", "slice", *args, "--ledger", str(ledger)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        return p.stdout

    def lease(action):  # the two commands docs/gpu.md gives, as a lease issues them
        p = subprocess.run(
            ["bash", str(ROOT / "scripts" / "lease.sh"), action],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
            env={
                **env,
                "PYTHON": sys.executable,
                "OUT": str(out),
                "WORK": str(work),
                "LEDGER": str(ledger),
                "BENCH_S": "60",  # the paper's shapes on a CPU: eager alone ~45 s
                "BENCH_ARGS": f"--profile {shapes} --batch 8 --steps 2 --check-steps 2 "
                "--variants eager,cuda-graph",
                "HOLD_S": "1",
                "LEFT_S": "1200",
                "COMMAND_S": "1200",
            },
        )  # a CPU's chapters: slower
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        return p.stdout + p.stderr

    started = lease("start")
    assert "lease: kit ready" in started and "slice A" in started and "training started" in started
    assert (out / "lease_step.csv").exists(), started[
        -3000:
    ]  # the step's table comes back (else lease.sh says why)
    assert (
        (out / "lease_step.csv").read_text().splitlines()[1].startswith("eager,ran,True,")
    )  # the reference ran
    assert (
        "training variant: eager" in started
    )  # the slice trains with what passed its check (on the CPU: eager)
    for table in out.glob("lease_step*"):  # (a lease returns them beside results.tgz; checked, set aside)
        table.unlink()
    finished = lease("finish")
    assert "packed" in finished
    # what comes back fits the device tool: one file, under 16 MiB, no folder
    back = list(out.iterdir())
    assert [p.name for p in back] == [slices.RESULTS_TGZ] and back[0].stat().st_size < 16 * 2**20
    # the run was cut by its deadline; the chapters executed without training, post = the cut
    run = work / "runs" / "paper-shapes-seed1"
    end = run_end(run)
    assert end.ended == "cut" and 0 < end.step < 2000 and saved_steps(run)[-1] == end.step
    manifest = json.loads((work / "book" / "_executed" / "manifest.json").read_text())
    assert [r["name"] for r in manifest["notebooks"] if r["status"] == "executed"] == list(SLICE_A), (
        finished,
        manifest,
    )
    assert manifest["site"] == {"status": "skipped"}
    with tarfile.open(back[0]) as tar:
        names = tar.getnames()
    assert (
        "slice.json" in names
        and "book/04_embeddings.ipynb" in names
        and "runs/paper-shapes-seed1/metrics.csv.gz" in names
    )
    assert not [n for n in names if n.endswith((".safetensors", ".pt"))]  # never a checkpoint
    # the CPU side: merged under results/, and the ledger then has no next slice
    merged = mclib("merge", str(back[0]))
    assert "merged into" in merged
    assert "next: none" in mclib("status")
    record = json.loads(next((tmp_path / "results").glob("paper-shapes-A-*/slice.json")).read_text())
    assert (
        record["chapters"] == list(SLICE_A)
        and record["chapter_error"] is None
        and not record["chapters_not_run"]
    )
    assert record["ends"]["1"]["ended"] == "cut"
    assert not [
        n
        for n in record["merge_notes"]  # the slice the ledger expected,
        if "was not open" in n or "profile" in n or "precision" in n
    ]  # its profile and precision
    # the CPU side builds the site (the smoke book here) with the slice's chapters as they ran, in their part
    from mclib.book import runner

    site = tmp_path / "site"
    runner.build("smoke", out_dir=site, progress=False, ledger=ledger, specs=SPECS)
    html = site / "_build" / "html" / "book" / "_executed" / "paper"
    assert {f"A_{name}.html" for name in SLICE_A} <= {p.name for p in html.iterdir()}
    page = (html / "A_03_heads.html").read_text()
    assert "executed on a GPU lease: slice A" in page and "the paper" in page


def test_a_file_that_is_not_a_slices_results_is_refused_in_one_line(tmp_path):
    tgz = tmp_path / "other.tgz"
    (tmp_path / "x.txt").write_text("x")
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(tmp_path / "x.txt", arcname="x.txt")
    with pytest.raises(slices.SliceError, match="no slice.json at its top"):
        slices_pack.merge(tgz, root=tmp_path)


def test_finish_issued_again_executes_only_the_chapters_not_yet_done(tmp_path, monkeypatch, slice_trained):
    """A lease whose chapter failed: the fix travels with the next call, and `finish --chapters-s`
    executes the chapters not in `chapters_done`, within the new seconds, then packs again."""
    from mclib.book import runner

    work = slice_trained(
        deadline=0,
        started=0.0,
        budget_s=1.0,
        chapters=["01_train", "02_copying", "03_heads"],
        chapters_done=["01_train"],
    )
    built = []
    monkeypatch.setattr(
        runner, "build", lambda profile, templates, **kw: built.append((templates, kw["timeout"]))
    )
    monkeypatch.setattr(runner, "select_chapters", lambda name: name)
    monkeypatch.setattr(slices_run, "collect", lambda out_dir, folder, **kw: folder.mkdir(parents=True))

    # the first budget is spent: nothing runs without new seconds
    path = slices_run.finish(work, tmp_path / "out", specs=SPECS)
    assert built == []
    with tarfile.open(path) as tar:
        record = json.loads(tar.extractfile(slices.STATE).read())
    assert record["chapters_not_run"] == ["02_copying", "03_heads"] and record["chapters_done"] == [
        "01_train"
    ]

    slices_run.finish(work, tmp_path / "out", chapters_s=300, specs=SPECS)
    assert [name for name, _ in built] == ["02_copying", "03_heads"]
    assert all(t <= 300 - slices.COLLECT_S for _, t in built)
    assert json.loads((work / slices.STATE).read_text())["chapters_done"] == [
        "01_train",
        "02_copying",
        "03_heads",
    ]
    slices_run.finish(work, tmp_path / "out", chapters_s=300, specs=SPECS)
    assert len(built) == 2  # nothing left to execute


# --- E15's slices: seed 1 again to a fixed step, then one group's run -------------------------

# scripts/lease.sh: a 900 s lease less a 3-minute start, the return, the kit and the chosen variant's check
# (where the committed step table stands; a lease that measures the full table has MEASURE_S - CHECK_S = 80 s
# less)
LEASE_AFTER_KIT_AND_TIMING_S = 900 - 180 - slices.RETURN_S - slices.CHECK_S


def test_every_planned_slice_fits_a_lease_at_a_step_a_gpu_has_given_or_the_target():
    """At 19.5 ms a step (TF32, eager, H100, 2026-11-26) every single slice fits and the joint ones are
    alternatives; at the 10 ms target, A and the joint slices fit too. At fp32's 54.9 ms (eager, H100,
    2026-11-26) none may, which is why the ledger trains in TF32 (results/paper-slices.yaml)."""
    ledger = slices.read_ledger()
    fits = lambda ms: {
        s.name
        for s in ledger["slices"]
        if slices.why_not(ledger, s, LEASE_AFTER_KIT_AND_TIMING_S, ms) is None
    }
    assert {"B", "C", "D", "E15-positional", "E15-attention", "E15-mlp", "E15-token"} <= fits(19.5)
    assert {"A", "BC", "E15"} <= fits(8.0) and "A" in fits(10.0)
    for s in ledger["slices"]:
        assert s.name in fits(19.5) or (s.joins and set(s.joins) <= fits(19.5)) or s.min_steps, s.name
    e15 = [s for s in ledger["slices"] if s.freeze]
    assert sorted(g for s in e15 if not s.joins for g in s.freeze) == [
        "attention",
        "mlp",
        "positional",
        "token",
    ]
    assert [sorted(s.freeze) for s in e15 if s.joins] == [
        ["attention", "mlp", "positional", "token"]
    ]  # the four at once
    assert len({s.source_steps for s in e15}) == 1  # every E15 run starts from the same step of seed 1


def test_an_e15_slice_with_a_bad_group_or_no_source_step_is_refused_in_one_line(tmp_path):
    with pytest.raises(
        slices.SliceError, match="slice A: freeze group 'mlps' is not one of attention, mlp, "
    ):
        slices.read_ledger(_ledger(tmp_path / "a", freeze=["mlps"], source_steps=40))
    with pytest.raises(slices.SliceError, match="slice A: E15's runs .freeze. need source_steps"):
        slices.read_ledger(_ledger(tmp_path / "b", freeze=["mlp"]))
    ledger = _ledger(
        tmp_path / "c", chapters=(), freeze=["mlp"], source_steps=45
    )  # smoke logs every 10 steps
    with pytest.raises(slices.SliceError, match="source_steps 45 must be a multiple of train.log_every .10."):
        slices_run.start(tmp_path / "work", budget_s=700, ledger_path=ledger)
    assert not (tmp_path / "work").exists()  # refused before anything is written


def test_an_e15_slice_trains_seed_1_to_its_source_step_then_its_groups_from_there(tmp_path):
    """In-process (the detached trainer's function): the smoke run stops at step 40 of its 60,
    then two groups train from that checkpoint, capped at the slice's 20 steps; what a lease
    packs holds both runs' small files and how each ended."""
    from mclib.core.runs import FREEZE_SOURCE, freeze_dir, load_metrics
    from mclib.lease.slices_pack import collect

    ledger = slices.read_ledger(
        _ledger(tmp_path, chapters=(), freeze=["mlp", "token"], source_steps=40, freeze_steps=20)
    )
    s = ledger["slices"][0]
    profile = slices.slice_profile(ledger, s)
    assert profile.analysis.freeze_steps == 20 and not profile.analysis.freeze
    ppath = tmp_path / "slice.yaml"
    ppath.write_text(yaml.safe_dump(profile.to_dict(), sort_keys=False))
    work = tmp_path / "work"
    slices_run.train_slice(ppath, work, time.time() + 600, s.source_steps, tuple(s.freeze))
    run = work / "runs" / "smoke-seed1"
    end = run_end(run)
    assert (end.ended, end.step) == ("stopped", 40) and load_metrics(run)["step"].max() == 40
    for g in ("mlp", "token"):
        folder = freeze_dir(run, g)
        assert json.loads((folder / FREEZE_SOURCE).read_text())["step"] == 40
        assert load_metrics(folder)["step"].max() == 20  # the smoke run does not drop: the cap ends it
    ends = slices_pack._freeze_ends(work, profile, ["mlp", "token", "attention"])
    assert ends["mlp"]["ended"] == "cap" and ends["mlp"]["steps"] == 20 and ends["attention"] is None
    packed = collect(work, tmp_path / "packed", name=profile.name, seeds=[1])
    got = {p.relative_to(packed).as_posix() for p in packed.rglob("*") if p.is_file()}
    assert {
        "runs/smoke-seed1/freeze/mlp/metrics.csv.gz",
        "runs/smoke-seed1/freeze/mlp/end.json",
        "runs/smoke-seed1/freeze/mlp/source.json",
        "runs/smoke-seed1/freeze/mlp/profile.yaml",
    } <= got
    assert not [n for n in got if n.endswith((".safetensors", ".pt"))]


def test_an_e15_slice_whose_seed_1_was_cut_before_its_source_step_starts_no_e15_run(tmp_path, logged):
    ledger = slices.read_ledger(
        _ledger(tmp_path, chapters=(), freeze=["mlp"], source_steps=40, freeze_steps=20)
    )
    s = ledger["slices"][0]
    ppath = tmp_path / "slice.yaml"
    ppath.write_text(yaml.safe_dump(slices.slice_profile(ledger, s).to_dict(), sort_keys=False))
    slices_run.train_slice(
        ppath, tmp_path / "work", 0.0, s.source_steps, tuple(s.freeze)
    )  # the deadline has passed
    assert "E15's runs not started" in logged.out()
    assert not (tmp_path / "work" / "runs" / "smoke-seed1" / "freeze").exists()


# --- the slice's own record: how the trainer ended, its progress, its deadline and achieved step ----


def test_the_trainer_logs_a_line_every_train_log_every_steps(tmp_path, logged, monkeypatch):
    """The detached trainer (in-process here) prints the step, L_mask and the ms a step since the
    last line, every TRAIN_LOG_EVERY steps (20 here; 1 000 on a lease): a cut leaves a trace."""
    monkeypatch.setattr(slices, "TRAIN_LOG_EVERY", 20)
    ledger = slices.read_ledger(_ledger(tmp_path, chapters=()))
    ppath = tmp_path / "slice.yaml"
    ppath.write_text(
        yaml.safe_dump(slices.slice_profile(ledger, ledger["slices"][0]).to_dict(), sort_keys=False)
    )
    slices_run.train_slice(ppath, tmp_path / "work", time.time() + 600)
    lines = [line for line in logged.out().splitlines() if line.startswith("smoke-seed1 step")]
    assert [line.split(":")[0] for line in lines] == [
        "smoke-seed1 step 20",
        "smoke-seed1 step 40",
        "smoke-seed1 step 60",
    ]
    assert all(
        re.fullmatch(r"smoke-seed1 step \d+: L_mask [0-9.e+-]+, \d+\.\d ms a step", line) for line in lines
    )


def test_the_logging_stop_still_stops_where_the_run_s_own_stop_does(logged):
    calls = []
    stop = slices_run._logging(
        lambda rows: calls.append(rows[-1]["step"]) or rows[-1]["step"] >= 3000, "r", 1000
    )
    rows = []
    for step, wall in ((500, 5.0), (1000, 10.0), (1500, float("nan")), (2050, 22.6), (3000, 40.0)):
        rows.append({"step": step, "L_mask": 0.5, "wall": wall})
        stopped = stop(rows)
    assert stopped and calls == [500, 1000, 1500, 2050, 3000]
    assert logged.out().splitlines() == [
        "r step 1,000: L_mask 0.5, 10.0 ms a step",
        "r step 2,050: L_mask 0.5, 12.0 ms a step",
        "r step 3,000: L_mask 0.5, 18.3 ms a step",
    ]


def test_slice_json_records_the_deadline_the_steps_reached_and_the_achieved_step(
    tmp_path, monkeypatch, slice_trained
):
    """A trainer that ended by itself beside a run cut at its deadline: training_stop cannot be read
    against ended "cut"; the deadline (s) and each run's steps and median ms a step are kept."""
    work = slice_trained(deadline=1000.0, started=650.0, budget_s=1.0, chapters=[])
    run = work / "runs" / "smoke-seed1"
    run.mkdir(parents=True)
    nan = float("nan")
    walls = [0.1, nan, 0.2, 0.32, 0.46, 0.56]  # 10 steps a flush: 10, 12, 14 and 10 ms a step (median 11)
    pd.DataFrame({"step": [10, 15, 20, 30, 40, 50], "L_mask": 0.5, "wall": walls}).to_csv(
        run / "metrics.csv", index=False
    )
    monkeypatch.setattr(slices_run, "collect", lambda out_dir, folder, **kw: folder.mkdir(parents=True))
    with tarfile.open(slices_run.finish(work, tmp_path / "out", specs=SPECS)) as tar:
        record = json.loads(tar.extractfile(slices.STATE).read())
    assert record["training_stop"] == "the trainer ended by itself (at its deadline or its run's end)"
    assert "cut" not in record["training_stop"]
    assert record["train_deadline_s"] == 350.0
    assert record["achieved"] == {"1": {"steps": 50, "ms_step": 11.0}}


def test_the_full_length_slice_a50_runs_only_where_the_measured_step_reaches_50_000_steps():
    """A50 is slice A to the paper's whole length: planned after the seeds and before D and E15,
    passed over at the H200's 13.3 ms of 2026-11-28, taken at the 9 ms target in a lease whose
    step table was committed (~655 s after the kit)."""
    ledger = slices.read_ledger()
    names = [s.name for s in ledger["slices"]]
    assert names.index("C") < names.index("A50") < names.index("D") < names.index("E15")
    a50 = next(s for s in ledger["slices"] if s.name == "A50")
    assert slices.steps_needed(a50) == 50_000
    assert slices.why_not(ledger, a50, 655, 9.0) is None
    why = slices.why_not(ledger, a50, 655, 13.3)
    assert why is not None and "short of the 50,000 it needs" in why
    assert slices.why_not(ledger, a50, 575, 9.0) is not None  # the full table's lease: ~43 000 steps only
