"""The paper setting's reference results (mclib.book.reference): collected without a
checkpoint, found when committed, set beside our rows, and said absent when absent."""
from __future__ import annotations

import json

from mclib.book import reference
from mclib.core.runs import SCORECARD


def _fake_book(out, seed_rows):
    run = out / "runs" / "paper-seed1"
    (run / "checkpoints" / "step_001000").mkdir(parents=True)
    (run / "checkpoints" / "step_001000" / "model.safetensors").write_bytes(b"x" * 1000)
    for f in ("metrics.csv", "end.json", "profile.yaml"):
        (run / f).write_text(f)
    (run / SCORECARD).write_text(json.dumps(seed_rows))
    (run / "freeze" / "mlp").mkdir(parents=True)
    (run / "freeze" / "mlp" / "metrics.csv").write_text("step\n1\n")
    (out / "runs" / "paper-seed2").mkdir()
    (out / "runs" / "paper-seed2" / "metrics.csv").write_text("step\n1\n")
    (out / "book" / "_executed").mkdir(parents=True)
    (out / "book" / "_executed" / "01_train.ipynb").write_text("{}")
    (out / "book" / "_executed" / "manifest.json").write_text("{}")


ROW = {"id": "E1", "quantity": "drop step", "paper": 15000.0, "ours": 14000.0, "verdict": "matches"}


def test_collect_copies_the_small_files_and_never_a_checkpoint(tmp_path):
    _fake_book(tmp_path / "out", [ROW])
    dest = reference.collect(tmp_path / "out", tmp_path / "results" / "paper-GPU-2026-01-01")
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert files == ["book/01_train.ipynb", "book/manifest.json", "device.json", "runs/paper-seed1/end.json",
                     "runs/paper-seed1/freeze/mlp/metrics.csv", "runs/paper-seed1/metrics.csv",
                     "runs/paper-seed1/profile.yaml", f"runs/paper-seed1/{SCORECARD}",
                     "runs/paper-seed2/metrics.csv"]
    assert {"device", "torch", "date"} <= set(json.loads((dest / "device.json").read_text()))


def test_latest_and_beside(tmp_path):
    assert reference.latest(root=tmp_path) is None
    none = reference.beside([ROW], None)
    assert none.loc[0, "paper-setting verdict"] == "not run" and none.loc[0, "laptop verdict"] == "matches"
    assert "has not been run" in reference.status(None)
    _fake_book(tmp_path / "out", [{**ROW, "ours": 30000.0, "verdict": "differs"},
                                  {"id": "E20", "quantity": "final MSE", "paper": 1e-3, "ours": 2e-3,
                                   "verdict": "differs"}])
    for date, name in (("2026-01-01", "paper-A-2026-01-01"), ("2026-02-01", "paper-B-2026-02-01")):
        dest = reference.collect(tmp_path / "out", tmp_path / name)
        (dest / "device.json").write_text(json.dumps({"device": name[6], "date": date, "torch": "2.x", "git": "abc"}))
    folder = reference.latest(root=tmp_path)
    assert folder.name == "paper-B-2026-02-01"
    table = reference.beside([ROW], folder)
    assert list(table["id"]) == ["E1", "E20"]                             # their extra row is listed too
    assert table.loc[0, "paper-setting verdict"] == "differs" and table.loc[0, "paper setting"] == 30000.0
    assert table.loc[1, "laptop verdict"] == "—"
    assert "ran on B on 2026-02-01" in reference.status(folder)
