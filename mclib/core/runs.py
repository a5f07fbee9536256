"""A run folder: the one place that knows its layout, its name, and how it is written.

    NAME-seedS/profile.yaml          the profile the run was started with
    NAME-seedS/metrics.csv           one row per step (pandas.read_csv reads it)
    NAME-seedS/checkpoints/step_004000/{config.json, model.safetensors, train_state.pt}
    NAME-seedS/.lock                 held by the one process that trains the folder

Every file and checkpoint is written to a temporary name and renamed into place, so
whatever exists is complete. `mclib.core.train` writes runs; everything else reads them
through this module.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
import yaml

from .config import ConfigError, Profile, profile_from_dict
from .model import MatrixBert, load_model


def run_name(name: str, seed: int) -> str:
    """The folder name of a run: profile (or sweep setting) name and seed."""
    return f"{name}-seed{seed}"


def default_run_dir(profile: Profile, root: str | Path = "runs") -> Path:
    return Path(root) / run_name(profile.name, profile.seed)


def seed_run_dirs(profile: Profile, run_dir: str | Path) -> dict[int, Path]:
    """The book's run (`profile.seed`, in run_dir) first, then every other seed of
    `analysis.seeds`, each in a sibling folder NAME-seedS."""
    run_dir = Path(run_dir)
    seeds = dict.fromkeys([profile.seed, *profile.analysis.seeds])
    return {s: run_dir if s == profile.seed else run_dir.parent / run_name(profile.name, s) for s in seeds}


# --- reading ---------------------------------------------------------------------------------

def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def saved_steps(run_dir: Path) -> list[int]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.glob("step_*") if (p / "train_state.pt").is_file())


def load_checkpoint(run_dir: Path, step: int, attention: str = "sdpa") -> MatrixBert:
    """The model saved at `step` of a run, in eval mode."""
    path = checkpoint_dir(run_dir, step)
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint at step {step} in {run_dir} (saved: {saved_steps(run_dir)})")
    return load_model(path, attention)


def load_train_state(run_dir: Path, step: int) -> dict:
    """What a checkpoint holds beside the model: step, optimiser state, wall time, generators."""
    return torch.load(checkpoint_dir(run_dir, step) / "train_state.pt", map_location="cpu", weights_only=False)


def load_metrics(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(Path(run_dir) / "metrics.csv")


def run_profile(run_dir: str | Path) -> Profile:
    """The profile a run folder was started with (its profile.yaml)."""
    return profile_from_dict(yaml.safe_load((Path(run_dir) / "profile.yaml").read_text()))


def is_complete(profile: Profile, run_dir: str | Path, stop: Callable[[list[dict]], bool] | None = None) -> bool:
    """Whether `train(profile, run_dir, stop=stop)` would return at once: the newest
    checkpoint is at the profile's last step, or `stop` was already true there. Cheap (no
    model is loaded), so a finished run costs no process to find finished."""
    done = saved_steps(run_dir)
    if not done:
        return False
    if done[-1] >= profile.train.steps:
        return True
    rows = [r for r in load_metrics(run_dir).to_dict("records") if r["step"] <= done[-1]]
    return stop is not None and bool(rows) and stop(rows)


# --- writing ---------------------------------------------------------------------------------

def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Write a file or folder through `write(tmp)`, then rename it into place."""
    tmp = path.with_name(f".tmp-{path.name}")
    if tmp.is_dir():
        shutil.rmtree(tmp)
    write(tmp)
    if path.is_dir():  # a folder cannot be renamed over a full one: set the old aside only now the new is complete
        old = path.with_name(f".old-{path.name}")
        if old.is_dir():
            shutil.rmtree(old)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)


def write_profile(run_dir: Path, profile: Profile) -> None:
    """Record the profile a run trains with; a folder started with another recipe refuses it."""
    if (run_dir / "profile.yaml").is_file():
        check_same_profile(run_dir, profile)
    write_atomic(run_dir / "profile.yaml",
                 lambda f: f.write_text(yaml.safe_dump(profile.to_dict(), sort_keys=False)))


def save_checkpoint(run_dir: Path, step: int, model, opt, gens, rows: list[dict], wall: float) -> None:
    # metrics first: on resume rows past the checkpoint are dropped, so a kill between
    # the two writes loses nothing.
    write_atomic(run_dir / "metrics.csv", lambda p: pd.DataFrame(rows).to_csv(p, index=False))

    def write(tmp: Path):
        model.save_pretrained(tmp)
        torch.save({"step": step, "optimizer": opt.state_dict(), "wall": wall,
                    "gens": {k: g.get_state() for k, g in gens.items()}}, tmp / "train_state.pt")

    final = checkpoint_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(final, write)


def check_same_profile(run_dir: Path, profile: Profile) -> None:
    """A run folder may only be resumed with the profile it was started with (steps may grow)."""
    saved = run_profile(run_dir).to_dict()
    mine = profile.to_dict()
    for d in (saved, mine):
        for key in ("steps", "device", "threads", "compile", "fast"):  # where, how and how long it runs, not what it is
            d["train"].pop(key)
        d["checkpoints"].pop("post")
        d["checkpoints"].pop("transition")
        d.pop("notes")
        d.pop("analysis")  # what the book does with a run does not change the run
    for section in mine:
        if mine[section] != saved[section]:
            diff = section if not isinstance(mine[section], dict) else next(
                f"{section}.{k}" for k in mine[section] if mine[section][k] != saved[section].get(k))
            raise ConfigError(f"run folder {str(run_dir)!r} was started with a different profile "
                              f"({diff} differs); use another --out")


@contextlib.contextmanager
def only_trainer(run_dir: Path):
    """An exclusive lock on run_dir/.lock for as long as this process trains the folder
    (the OS drops it when the process dies, so a killed run never leaves it stale)."""
    try:
        import fcntl
    except ImportError:  # Windows has no fcntl: no guard there
        yield
        return
    with open(run_dir / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"run folder {str(run_dir)!r} is being trained by another process") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
