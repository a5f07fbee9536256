"""A run folder: the one place that knows its layout, its name, and how it is written.

    NAME-seedS/profile.yaml          the profile the run was started with
    NAME-seedS/metrics.csv           one row per step (pandas.read_csv reads it)
    NAME-seedS/checkpoints/step_004000/{config.json, model.safetensors, train_state.pt}
    NAME-seedS/checkpoints/damaged-step_004000/  an unreadable checkpoint set aside on resume, never
                                     deleted (`checkpoints.set_aside`; -2, -3, ... where taken)
    NAME-seedS/end.json              why and where the run ended (`ending.run_end`)
    NAME-seedS/.lock                 held by the one process that trains the folder
    NAME-seedS/loss_curve.png        drawn by `python -m mclib train` when it ends
    NAME-seedS/sweep.json            the sweep that trains the folder, and its wall time then
                                     (mclib.core.sweep)
    NAME-seedS/scorecard.json        the book's scorecard rows (mclib.book.scorecard)
    NAME-seedS/.scorecard.lock       held while one process reads and writes scorecard.json
    NAME-seedS/checkpoint_step_004000.zip   a checkpoint zipped as a download of the book (mclib.book.chapter)
    NAME-seedS/checkpoint_series.zip the analysis checkpoints as one download: NAME-seedS/step_004000/
                                     {config.json, model.safetensors, README.md (its model card)}
    NAME-seedS/export/TRACKER/       the run exported to `tensorboard` or `wandb` (mclib.core.export)
    NAME-seedS/freeze/GROUP/         E15's run of one component group (mclib.analyses.freezing): a run
                                     folder as above, plus source.json, the checkpoint it started from
    .tmp-NAME, .old-NAME             beside a file or folder while `write_atomic` replaces it

Every name above is defined here and nowhere else. This module writes and reads the
profile and the metrics, and writes any file atomically (`write_atomic`, from `mclib.core.atomic`:
flushed to the disk, then renamed into place); checkpoints are `mclib.core.checkpoints`, the end
`mclib.core.ending`, the analysis checkpoints `mclib.core.placement`. Only `mclib.core.train`
writes runs.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml
from transformers.utils import CONFIG_NAME

from .atomic import write_atomic  # a run folder's files are written whole (mclib.core.atomic)
from .config import ConfigError, Profile, parse_yaml, profile_from_saved
from .recipe import RUNNING

PROFILE = "profile.yaml"
METRICS = "metrics.csv"
CHECKPOINTS = "checkpoints"
MODEL_FILE, STATE_FILE = "model.safetensors", "train_state.pt"  # in a checkpoint, beside HF's config.json
CONFIG_FILE = CONFIG_NAME  # "config.json", HF's, written by save_pretrained
DAMAGED = "damaged-"  # checkpoints/damaged-step_004000: a checkpoint set aside as unreadable (`set_aside`)
END = "end.json"
LOCK = ".lock"
LOSS_CURVE = "loss_curve.png"
SWEEP_MARKER = "sweep.json"
SCORECARD = "scorecard.json"
SCORECARD_LOCK = ".scorecard.lock"
FREEZE = "freeze"
FREEZE_SOURCE = "source.json"
CHECKPOINT_SERIES = "checkpoint_series.zip"
MODEL_CARD = "README.md"  # a checkpoint's model card, in the series' folders (`mclib.core.card`)
EXPORT = "export"


def checkpoint_zip_path(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint at `step` lies zipped (`mclib.book.chapter.checkpoint_zip` writes it)."""
    return Path(run_dir) / f"checkpoint_{checkpoint_dir(run_dir, step).name}.zip"


def checkpoint_series_path(run_dir: str | Path) -> Path:
    """Where the run's analysis checkpoints lie zipped (`mclib.book.chapter.checkpoint_series_zip`)."""
    return Path(run_dir) / CHECKPOINT_SERIES


def export_dir(run_dir: str | Path, tracker: str) -> Path:
    """Where `python -m mclib export RUN_DIR --to TRACKER` writes by default."""
    return Path(run_dir) / EXPORT / tracker


def freeze_dir(run_dir: str | Path, group: str) -> Path:
    """The run folder of E15's run of `group` inside the main run's folder."""
    return Path(run_dir) / FREEZE / group


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


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step:06d}"


# --- the profile ---------------------------------------------------------------------------


def write_profile(run_dir: Path, profile: Profile) -> None:
    """Record the profile a run trains with; a folder started with another recipe refuses it."""
    if (run_dir / PROFILE).is_file():
        check_same_profile(run_dir, profile)
    write_atomic(run_dir / PROFILE, yaml.safe_dump(profile.to_dict(), sort_keys=False))


def check_same_profile(run_dir: Path, profile: Profile) -> None:
    """A run folder may only be resumed with the profile it was started with (steps may grow)."""
    saved = run_profile(run_dir).to_dict()
    mine = profile.to_dict()
    for d in (saved, mine):
        for key in RUNNING + ("steps",):
            d["train"].pop(key, None)  # how it runs (recipe.RUNNING) and how long, not what it is
        d["checkpoints"].pop("place", None)
        d["checkpoints"].pop("keep", None)
        d["checkpoints"].pop("post")
        d["checkpoints"].pop("transition")
        d.pop("notes")
        d.pop("analysis")  # what the book does with a run does not change the run
    for section in mine:
        if mine[section] != saved[section]:
            diff = (
                section
                if not isinstance(mine[section], dict)
                else next(
                    f"{section}.{k}" for k in mine[section] if mine[section][k] != saved[section].get(k)
                )
            )
            raise ConfigError(
                f"run folder {str(run_dir)!r} was started with a different profile "
                f"({diff} differs); use another --out"
            )


def run_profile(run_dir: str | Path) -> Profile:
    """The profile a run folder was started with (profile.yaml; old levers read as
    `config.profile_from_saved` does)."""
    return profile_from_saved(parse_yaml((Path(run_dir) / PROFILE).read_text()))


# --- the metrics ---------------------------------------------------------------------------


def load_metrics(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(Path(run_dir) / METRICS)


def append_metrics(run_dir: Path, rows: list[dict], start: int) -> int:
    """metrics.csv holds rows[:start]: append rows[start:] (the training loop's write at each
    checkpoint, so the file is never rewritten whole while a run trains); a missing file is
    written whole, atomically. Returns len(rows), the next call's `start`. A kill mid-append
    can leave a partial last line past the newest checkpoint: `resume_metrics` drops it."""
    path = Path(run_dir) / METRICS
    if start == 0 or not path.is_file():
        write_atomic(path, lambda p: pd.DataFrame(rows).to_csv(p, index=False))
    elif rows[start:]:
        header = path.open().readline().strip().split(",")
        frame = pd.DataFrame(rows[start:])
        if list(frame.columns) != header:
            raise ValueError(f"{path}: metric columns {list(frame.columns)} differ from the file's {header}")
        with path.open("a") as f:
            f.write(frame.to_csv(index=False, header=False))
    return len(rows)


def resume_metrics(run_dir: Path, step: int) -> list[dict]:
    """The metric rows of a run resumed at `step`: those up to it. Rows past it (appended
    before a kill that came ahead of their checkpoint, a partial last line among them) are
    dropped from the file too, so that appends continue a file that ends at `step`."""
    path = Path(run_dir) / METRICS
    frame = pd.read_csv(path, on_bad_lines="skip")
    frame = frame[pd.to_numeric(frame["step"], errors="coerce") <= step]
    rows = frame.to_dict("records")
    if len(frame) != sum(1 for _ in path.open()) - 1:
        write_atomic(path, lambda p: frame.to_csv(p, index=False))
    return rows
