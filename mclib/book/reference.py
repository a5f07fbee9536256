"""The paper setting's reference results: the `paper` book run on a GPU, committed under
results/ (issue 24), and shown in the default book beside the laptop edition's scorecard.

    results/paper-<GPU>-<DATE>/
        device.json                       GPU, torch, CUDA, date, git revision of the run
        runs/paper-seed1/{metrics.csv, end.json, profile.yaml, scorecard.json}
        runs/paper-seed{2,3}/{metrics.csv, end.json}     runs/paper-seed1/freeze/GROUP/metrics.csv
        book/*.ipynb, book/manifest.json  the executed chapters and their timings

`collect` writes that folder from a built book (scripts/gpu_kit.sh calls it on the GPU
machine); `latest` finds the newest; `beside` sets its rows next to ours. The paper
setting's rows were judged against the paper on the paper's own task, by the same rules,
so nothing is rescaled.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd

from ..core.runs import END, FREEZE, METRICS, PROFILE, SCORECARD, freeze_dir, run_name
from . import scorecard

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
RUN_FILES = (METRICS, END, PROFILE, SCORECARD)


def device_record() -> dict:
    """What ran it: the GPU's name, torch and CUDA versions, the date, the git revision."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        rev = ""
    return {"device": gpu, "torch": torch.__version__, "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"),
            "git": rev}


def collect(out: str | Path, dest: str | Path, name: str = "paper", seeds=(1, 2, 3)) -> Path:
    """Copy the small files of a built book in `out` (its runs/ and book/_executed/) to
    `dest`: everything results/ holds, never a checkpoint."""
    out, dest = Path(out), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "device.json").write_text(json.dumps(device_record(), indent=1))
    for seed in seeds:
        src = out / "runs" / run_name(name, seed)
        if not src.is_dir():
            continue
        for f in RUN_FILES:
            if (src / f).is_file():
                (dest / "runs" / src.name).mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / f, dest / "runs" / src.name / f)
        for group in sorted((src / FREEZE).glob("*")) if (src / FREEZE).is_dir() else []:
            target = freeze_dir(dest / "runs" / src.name, group.name)
            target.mkdir(parents=True, exist_ok=True)
            for f in (METRICS, END):
                if (group / f).is_file():
                    shutil.copy2(group / f, target / f)
    executed = out / "book" / "_executed"
    if executed.is_dir():
        (dest / "book").mkdir(exist_ok=True)
        for f in sorted(executed.glob("*.ipynb")) + [executed / "manifest.json"]:
            if f.is_file():
                shutil.copy2(f, dest / "book" / f.name)
    return dest


def latest(name: str = "paper", root: Path = RESULTS) -> Path | None:
    """The newest results/NAME-* folder that holds a scorecard (by its device.json date), or None."""
    found = [d for d in root.glob(f"{name}-*") if (d / "runs" / run_name(name, 1) / SCORECARD).is_file()]
    if not found:
        return None
    return max(found, key=lambda d: (json.loads((d / "device.json").read_text()).get("date", ""), d.name))


def status(folder: Path | None) -> str:
    """One sentence: where the paper setting's results are, or that they do not exist yet."""
    if folder is None:
        return ("The paper's own setting (params/paper.yaml: 7×7 rank 2, hidden 768) has not been run for this "
                "book yet: it needs a GPU. `bash scripts/gpu_kit.sh` on a GPU machine runs it and collects "
                "its results into results/ (docs/gpu.md); this column then fills in.")
    dev = json.loads((folder / "device.json").read_text())
    return (f"The paper's own setting (params/paper.yaml) ran on {dev['device']} on {dev['date']} "
            f"(torch {dev['torch']}, revision {dev.get('git') or 'unknown'}); its files are in "
            f"{folder.relative_to(REPO).as_posix() if folder.is_relative_to(REPO) else folder}.")


def beside(ours: list[dict], folder: Path | None, name: str = "paper") -> pd.DataFrame:
    """One row per claim: the paper's value, the laptop edition's value and verdict, and
    the paper setting's value and verdict (empty where it has no such row, or no results)."""
    theirs = {} if folder is None else {
        (r["id"], r["quantity"]): r for r in scorecard.load(folder / "runs" / run_name(name, 1))}
    keys = list(dict.fromkeys([(r["id"], r["quantity"]) for r in ours] + list(theirs)))
    mine = {(r["id"], r["quantity"]): r for r in ours}
    rows = []
    for key in keys:
        a, b = mine.get(key, {}), theirs.get(key, {})
        rows.append({"id": key[0], "quantity": key[1], "paper": a.get("paper", b.get("paper")),
                     "laptop edition": a.get("ours"), "laptop verdict": a.get("verdict", "—"),
                     "paper setting": b.get("ours"),
                     "paper-setting verdict": b.get("verdict", "not run" if folder is None else "—")})
    return pd.DataFrame(rows)
