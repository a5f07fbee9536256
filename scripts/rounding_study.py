"""How far rounding alone moves seed 1 of the default profile: its drop, the step where its
convergence rule ends it, and its final level. Not run by the book; its table is
docs/data/rounding.csv, which chapter 01 and the scorecard read.

    python scripts/rounding_study.py train [--jobs 2] [--runs runs/rounding]   # resumable
    python scripts/rounding_study.py table [--runs runs/rounding] [--out docs/data/rounding.csv]
    python scripts/rounding_study.py train --only base --seeds 2,3   # seeds 2 and 3 of the base
    python scripts/rounding_study.py rule [--out docs/data/convergence-rule.csv]
    python scripts/rounding_study.py to-cap [--only avx2,attention-eager]   # resumable

`rule` tabulates where the convergence rule ends every finished run of the study (seeds 1 to 3
of the base, and seed 1 under each change) with its second window and without it.

Each change below leaves the model, the data stream, the seed and every setting of the
profile as they are and alters only how the floats are added and multiplied:

- base: the default profile as the book trained it until 2026-11-29 (one thread, compiled, sdpa
  attention, foreach Adam);
- avx2: the same, on this machine's AVX2 float path instead of AVX-512 (ATen's kernels,
  Inductor's generated code, MKL and oneDNN held to AVX2 through their environment
  variables): the float path of the project's AMD Zen 3 machines;
- threads-2: two threads a run (the matrix products split in other places);
- attention-eager: the attention as plain matmuls and a softmax (`model.attention: eager`)
  in place of PyTorch's fused scaled-dot-product kernel;
- uncompiled: every reduction (LayerNorm, softmax, the loss) in ATen's order instead of
  Inductor's fused kernels (`train.compile: false`);
- tf32: the matrix products' inputs rounded to TF32's 10 mantissa bits, as a GPU's tensor
  cores do (`train.precision: tf32`, emulated; compiled code bypasses the emulation, so
  uncompiled);
- fused-adam: Adam's update as one fused kernel (`train.adam: fused`) in place of the foreach
  Adam, which does the for-loop Adam's arithmetic to the bit; a lever of the CPU step (3-5 % of it),
  trained for seeds 1 to 3 (`train --only fused-adam --seeds 1,2,3`) and, its drops within the
  spread, the book's since 2026-11-29.

Every change but fused-adam trains with foreach Adam (`STUDY`), as the study did before the default
profile took fused Adam, so that a fresh clone trains what the table records.

Each run goes to its end by the profile's own rule. `to-cap` trains a copy of each run that the
rule ended before the cap on to the cap (RUNS/to-cap/), which tells a pause from a level of its
own. `table` reads every finished run (`mclib.analyses.evaluate.compare_runs`: drop, end, final
training L_mask, the last checkpoint's L_mask on 16 384 fresh matrices; the final training L_mask
at the cap, `cap_final_L_mask`, where the run or its copy reached it) and records which float
path each ran on.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from train_step import cpu_model  # noqa: E402 - benchmarks/train_step.py

from mclib.analyses.evaluate import compare_runs  # noqa: E402
from mclib.core.atomic import write_atomic  # noqa: E402
from mclib.core.config import load_profile, profile_path  # noqa: E402
from mclib.core.ending import is_complete, run_end  # noqa: E402
from mclib.core.metrics import converged, final_level, find_drop, plateau_stats  # noqa: E402
from mclib.core.runs import END, load_metrics, run_profile  # noqa: E402

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# change -> (profile overrides, environment)
CHANGES = {
    "base": ({}, {}),
    "avx2": ({}, AVX2),
    "threads-2": ({"train.threads": 2}, {}),
    "attention-eager": ({"model.attention": "eager"}, {}),
    "uncompiled": ({"train.compile": False}, {}),
    "tf32": ({"train.compile": False, "train.precision": "tf32"}, {}),
    "fused-adam": ({"train.adam": "fused"}, {}),
}
# under every change's overrides: the study's runs train with foreach Adam (the default profile's
# until 2026-11-29; params/cpu.yaml has fused Adam since), fused-adam overriding it
STUDY = {"train.adam": "foreach"}
SEED = 1
FRESH = 16_384
OUT = ROOT / "docs" / "data" / "rounding.csv"
RULE_OUT = ROOT / "docs" / "data" / "convergence-rule.csv"
TO_CAP = "to-cap"  # RUNS/to-cap/NAME: run NAME, which its rule ended before the cap, trained on to it


def _folder(runs: Path, change: str, seed: int = SEED) -> Path:
    return runs / f"rounding-{change}-seed{seed}"


def _float_path(env: dict) -> str:
    isa = env.get("ATEN_CPU_CAPABILITY", torch.backends.cpu.get_cpu_capability()).upper()
    return f"{isa} ({platform.machine()}, {cpu_model()})"


def _job(change: str, folder: Path, profile) -> tuple:
    """(change, command, environment, folder): one `python -m mclib train` of PROFILE into FOLDER
    under CHANGE's environment, its parameters written to FOLDER/study-params.yaml."""
    overrides, env = CHANGES[change]
    params = folder / "study-params.yaml"
    params.write_text(yaml.safe_dump(profile.to_dict(), sort_keys=False))
    threads = str(profile.train.threads or 1)
    run_env = {**os.environ, **env, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    if env:  # Inductor's cache does not key on the float path: kernels compiled on the AVX-512
        # path and read back on the AVX2 one gave NaN from the first step (2026-11-29)
        run_env["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor-cache")
    (folder / "study.json").write_text(
        json.dumps(
            {"change": change, "overrides": overrides, "env": env, "float_path": _float_path(env)}, indent=1
        )
    )
    cmd = [sys.executable, "-m", "mclib", "train", "--profile", str(params), "--out", str(folder), "--quiet"]
    return change, cmd, run_env, folder


def _run_jobs(todo: list, jobs: int) -> int:
    """Each job of `todo` (`_job`), at most `jobs` at once, its output appended to its folder's
    study-train.log; 1 if any ended with an error."""
    running: list = []
    failed = 0
    while todo or running:
        while todo and len(running) < jobs:
            change, cmd, env, folder = todo.pop(0)
            log = open(folder / "study-train.log", "a")
            print(f"rounding: {change} trains in {folder}", flush=True)
            running.append(
                (change, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
            )
        time.sleep(5)
        for change, p in list(running):
            if p.poll() is not None:
                running.remove((change, p))
                print(f"rounding: {change} ended with exit {p.returncode}", flush=True)
                failed += p.returncode != 0
    return 1 if failed else 0


def train(runs: Path, jobs: int, only: list[str], seeds: tuple[int, ...] = (SEED,)) -> int:
    base = load_profile(profile_path("cpu"))
    todo = []
    for change, seed in [(c, s) for s in seeds for c in only]:
        folder = _folder(runs, change, seed)
        if _complete(folder):
            print(f"rounding: {change} has ended ({folder})")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        overrides = {**STUDY, **CHANGES[change][0]}
        todo.append(
            _job(change, folder, base.replace(**{**overrides, "seed": seed, "name": f"rounding-{change}"}))
        )
    return _run_jobs(todo, jobs)


def _cap_folder(folder: Path) -> Path:
    return folder.parent / TO_CAP / folder.name


def to_cap(runs: Path, jobs: int, only: list[str], seeds: tuple[int, ...] = (SEED,)) -> int:
    """Every run of the study that its rule ended before the cap, copied to runs/to-cap/ and
    trained on there to the cap (`until: steps`): whether the level it ended on was a pause."""
    todo = []
    for change, seed in [(c, s) for s in seeds for c in only]:
        folder = _folder(runs, change, seed)
        if not _ended(folder):
            continue
        if _reached_cap(folder):
            print(f"rounding: {folder.name} trained to the cap already")
            continue
        cap = _cap_folder(folder)
        if _reached_cap(cap):
            print(f"rounding: {cap} has reached the cap")
            continue
        if not cap.is_dir():
            shutil.copytree(folder, cap.with_name(cap.name + ".partial"), dirs_exist_ok=True)
            cap.with_name(cap.name + ".partial").rename(cap)  # a copy cut short is never taken for a run
        profile = run_profile(folder).replace(**{"train.until": "steps"})
        todo.append(_job(change, cap, profile))
    return _run_jobs(todo, jobs)


def _complete(folder: Path) -> bool:
    """Whether the run in FOLDER has ended and saved what its end needs."""
    return (folder / END).is_file() and is_complete(run_profile(folder), folder)


def _ended(folder: Path) -> bool:
    """`_complete`, saying so when not."""
    if _complete(folder):
        return True
    print(f"rounding: {folder.name} has not ended yet ({folder}): left out")
    return False


def _nothing_ended() -> int:
    print("rounding: no run has ended")
    return 1


def _write(t: pd.DataFrame, out: Path | None) -> int:
    """T written atomically to OUT as CSV (nothing when OUT is None)."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, t.to_csv())
        print(f"written: {out}")
    return 0


def _reached_cap(folder: Path) -> bool:
    """Whether the run in FOLDER ended at its last step: the cap of `until: converged`, or `until: steps`."""
    return (folder / END).is_file() and run_end(folder).ended in ("cap", "steps")


def _capped(folder: Path) -> Path | None:
    """The folder whose run reached the cap: FOLDER's own run, else its copy trained on (`to_cap`);
    None where neither has."""
    for candidate in (folder, _cap_folder(folder)):
        if _reached_cap(candidate):
            return candidate
    return None


def _at_cap(folder: Path) -> tuple[float, float]:
    """(the cap's step, the final training L_mask there, `plateau_stats`) of the run in FOLDER or
    its copy (`_capped`); NaNs where neither reached the cap."""
    capped = _capped(folder)
    if capped is None:
        return math.nan, math.nan
    m = load_metrics(capped)
    return int(m["step"].max()), plateau_stats(m, find_drop(m, run_profile(capped).data.rank))["final_L_mask"]


def table(runs: Path, out: Path | None) -> int:
    folders, meta = {}, {}
    for change in CHANGES:
        folder = _folder(runs, change)
        if not _ended(folder):
            continue
        folders[change] = folder
        study = json.loads((folder / "study.json").read_text())
        end = run_end(folder)
        meta[change] = {
            "ended_at": end.step,
            "ended_by": end.ended,
            "float_path": study["float_path"],
            "overrides": json.dumps(study["overrides"]) if study["overrides"] else "",
            "env": " ".join(f"{k}={v}" for k, v in study["env"].items()),
        }
    if not folders:
        return _nothing_ended()
    t = compare_runs(folders, (500, 1000, 2000, 4000), FRESH, 0).join(
        pd.DataFrame.from_dict(meta, orient="index")
    )
    t.index.name = "change"
    for change, folder in folders.items():
        t.loc[change, ["cap_step", "cap_final_L_mask"]] = _at_cap(folder)
    show = ["drop", "ended_at", "ended_by", "final_L_mask", "cap_final_L_mask", "checkpoint_L_mask_fp32"]
    print(t[show].to_markdown(floatfmt=".4g"))
    for col in ("drop", "ended_at", "final_L_mask", "cap_final_L_mask", "checkpoint_L_mask_fp32"):
        v = t[col].astype(float).dropna()
        print(f"{col}: {v.min():.5g} to {v.max():.5g} over {len(v)} changes (range {v.max() - v.min():.4g})")
    return _write(t, out)


def rule(runs: Path, out: Path | None) -> int:
    """Where the convergence rule ends each finished run of the study, with its second window
    (`converged`, the rule) and without it (`confirm=False`): the step, what
    ended the run there, and L_mask's mean over the 2 000 steps before it; the same mean at the cap,
    where the run or its copy (`to_cap`) reached it. Every run trained under the rule with the
    second window, which never ends a run sooner, so its metrics reach both ends."""
    rows = []
    for folder in sorted(runs.glob("rounding-*-seed*")):
        if not _ended(folder):
            continue
        profile, m = run_profile(folder), load_metrics(folder)
        t, change = profile.train, json.loads((folder / "study.json").read_text())["change"]
        row = {"change": change, "seed": profile.seed, "drop": find_drop(m, profile.data.rank)}
        for name, confirm in (("before", False), ("after", True)):
            stop = converged(m, profile.data.rank, t.patience, t.min_improvement, confirm=confirm)
            end = stop if stop is not None else int(m["step"].max())
            row[f"end_{name}"] = end
            row[f"ended_by_{name}"] = "converged" if stop is not None else "cap"
            row[f"L_mask_last_{t.patience}_{name}"] = final_level(m[m["step"] <= end], t.patience)[0]
        capped = _capped(folder)
        row[f"L_mask_last_{t.patience}_cap"] = (
            math.nan if capped is None else final_level(load_metrics(capped), t.patience)[0]
        )
        rows.append(row)
    if not rows:
        return _nothing_ended()
    t = pd.DataFrame(rows).sort_values(["seed", "change"]).set_index(["change", "seed"])
    print(t.to_markdown(floatfmt=".4g"))
    return _write(t, out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("train", "to-cap", "table", "rule"))
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "rounding")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (each one thread, threads-2 two)")
    ap.add_argument(
        "--only", default=",".join(CHANGES), help="a comma-separated subset of: " + ", ".join(CHANGES)
    )
    ap.add_argument(
        "--seeds", default=str(SEED), help="train: comma-separated seeds (rule reads base at 1, 2, 3)"
    )
    ap.add_argument("--out", type=Path, help=f"table: default {OUT}; rule: default {RULE_OUT}")
    args = ap.parse_args(argv)
    only = [c for c in args.only.split(",") if c]
    bad = [c for c in only if c not in CHANGES]
    if bad:
        ap.error(f"unknown change {bad[0]!r} (known: {', '.join(CHANGES)})")
    try:
        seeds = tuple(int(x) for x in args.seeds.split(",") if x)
    except ValueError:
        ap.error(f"--seeds {args.seeds!r}: comma-separated whole numbers")
    if args.what == "train":
        return train(args.runs, args.jobs, only, seeds)
    if args.what == "to-cap":
        return to_cap(args.runs, args.jobs, only, seeds)
    if args.what == "rule":
        return rule(args.runs, args.out or RULE_OUT)
    return table(args.runs, args.out or OUT)


if __name__ == "__main__":
    sys.exit(main())
