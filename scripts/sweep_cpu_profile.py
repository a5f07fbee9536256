"""The default-profile search (issue 3): run a list of settings, each under a wall-time
cap, and append one row per run to a results table.

    python scripts/sweep_cpu_profile.py sweeps/round1.yaml [--jobs 2] [--results docs/data/cpu_sweep.csv]

A sweep file is YAML: `base` (a profile name), `cap_minutes`, `seeds`, and `settings`, a
list of {name, overrides} with dotted profile keys. `resume: true` continues runs of an
earlier sweep with the same setting names (their folders) instead of starting afresh;
the cap then counts from the restart. `cap_minutes`, `after_drop`, `resume` and `seeds`
may also be given per setting. A run stops at its cap, at its
profile's steps, or `after_drop` steps after the drop (mclib.metrics.find_drop).
With --jobs 2 two runs share the cores, one thread each: ms per step in the table is
then the one-thread figure; docs/cpu-profile.md gives the clean two-thread timings.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

from mclib.config import load_profile, profile_path
from mclib.metrics import find_drop, plateau_stats
from mclib.train import load_metrics, run_profile, stop_after_drop, train


def run_one(job: dict) -> dict:
    torch.set_num_threads(job["threads"])
    overrides = {**job["overrides"], "seed": job["seed"], "train.threads": job["threads"]}
    profile = load_profile(profile_path(job["base"]), **overrides)
    run_dir = Path(job["run_root"]) / f"{job['name']}-seed{job['seed']}"
    if run_dir.exists() and not job["resume"]:
        shutil.rmtree(run_dir)  # a sweep row is one fresh run, unless the sweep continues runs
    rank, cap = profile.data.rank, job["cap_minutes"] * 60
    start = time.perf_counter()

    past_drop = stop_after_drop(rank, job["after_drop"])

    def stop(rows):
        return time.perf_counter() - start > cap or past_drop(rows)

    train(profile, run_dir, progress=False, stop=stop)
    return summarise(run_dir, job)


def setting_columns(profile) -> dict:
    """The levers of a run, resolved (the base profile may change between rounds, so a
    row names its whole setting, not only its overrides)."""
    d, m, t = profile.data, profile.model, profile.train
    return {"n": d.n, "rank": d.rank, "p_mask": d.p_mask, "mix_rank": d.mix_rank if d.mix_fraction else None,
            "mix_fraction": d.mix_fraction,
            "layers": m.layers, "heads": m.heads, "hidden": m.hidden, "init_std": m.init_std,
            "position_init_std": m.position_init_std, "attn_logit_scale": m.attn_logit_scale,
            "qk_norm": m.qk_norm,
            "batch": t.batch, "optimizer": t.optimizer, "lr": t.lr, "embedding_lr": t.embedding_lr,
            "warmup": t.warmup, "beta2": t.beta2, "grad_clip": t.grad_clip}


def summarise(run_dir: Path, job: dict) -> dict:
    """One results row from a run folder (also for a run that was stopped by hand). The
    setting is the one the run saved, not the base profile as it is now."""
    profile = run_profile(run_dir)
    rank = profile.data.rank
    m = load_metrics(run_dir)
    drop = find_drop(m, rank)
    walls = m["wall"].dropna()
    ms_per_step = 1000 * walls.iloc[-1] / m["step"].iloc[-1]
    stats = plateau_stats(m, drop)
    row = {"setting": job["name"], "seed": job["seed"], "overrides": json.dumps(job["overrides"]),
           "drop_step": drop, "drop_minutes": None if drop is None else round(drop * ms_per_step / 60000, 2),
           "steps_run": int(m["step"].iloc[-1]), "ms_per_step": round(ms_per_step, 1),
           "threads": profile.train.threads, **{k: round(v, 5) for k, v in stats.items()},
           "cap_minutes": job["cap_minutes"], "date": time.strftime("%Y-%m-%d"),
           "matrices": int(m["step"].iloc[-1]) * profile.train.batch, **setting_columns(profile)}
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--results", default="docs/data/cpu_sweep.csv")
    ap.add_argument("--run-root", default="runs/sweep")
    ap.add_argument("--collect", action="store_true",
                    help="do not train: add rows for runs of this sweep that were stopped before finishing")
    args = ap.parse_args()
    spec = yaml.safe_load(Path(args.sweep).read_text())
    threads = max(1, (os.cpu_count() or 2) // args.jobs)
    # cap_minutes, after_drop, resume and seeds: per setting, else the sweep's
    jobs = [{"base": spec.get("base", "cpu"), "name": s["name"], "overrides": s.get("overrides", {}),
             "seed": seed, "cap_minutes": s.get("cap_minutes", spec["cap_minutes"]),
             "after_drop": s.get("after_drop", spec.get("after_drop", 300)),
             "threads": threads, "run_root": args.run_root, "resume": s.get("resume", spec.get("resume", False))}
            for s in spec["settings"] for seed in s.get("seeds", spec.get("seeds", [1]))]
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)

    def append(row):
        row["sweep"] = Path(args.sweep).name
        old = pd.read_csv(results) if results.exists() else pd.DataFrame()
        tmp = results.with_name(".tmp-" + results.name)
        pd.concat([old, pd.DataFrame([row])], ignore_index=True).to_csv(tmp, index=False)
        os.replace(tmp, results)

    if args.collect:
        old = pd.read_csv(results) if results.exists() else pd.DataFrame(columns=["sweep", "setting", "seed"])
        have = set(zip(old["sweep"], old["setting"], old["seed"]))
        for job in jobs:
            run_dir = Path(job["run_root"]) / f"{job['name']}-seed{job['seed']}"
            if (Path(args.sweep).name, job["name"], job["seed"]) not in have and (run_dir / "metrics.csv").exists():
                append({**summarise(run_dir, job), "note": "stopped by hand before its cap"})
        return
    # SIGTERM (kill, pkill) must end the workers too: leaving the `with` block by an
    # exception terminates the pool, whereas dying on the signal would orphan them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("sweep stopped by SIGTERM"))
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        for row in pool.imap_unordered(run_one, jobs):
            append(row)


if __name__ == "__main__":
    main()
