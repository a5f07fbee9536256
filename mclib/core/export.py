"""A run's metrics as TensorBoard or Weights & Biases files, offline.

    python -m mclib export runs/cpu-seed1 --to tensorboard   # RUN/export/tensorboard/events.out.tfevents.*
    python -m mclib export runs/cpu-seed1 --to wandb         # RUN/export/wandb/wandb/offline-run-*/
    export_run(run_dir, "tensorboard", dest)                 # the same from Python; returns what it wrote

Each metrics.csv column becomes a scalar at its row's step (empty cells left out), the loss curve
an image at the last step, profile.yaml the W&B config or a TensorBoard text. An export is written
atomically and replaces the last one. Needs the optional extra `track`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from .config import ConfigError
from .runs import METRICS, PROFILE, export_dir, load_metrics, run_profile, write_atomic

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # tracker -> the package it needs
EXTRA = "track"  # pyproject.toml's optional extra that installs them
IMAGE_TAG = "loss_curve"  # the figure's name in either tracker
PROFILE_TAG = "profile"  # the profile's text in TensorBoard
PROJECT = "mclib"  # the W&B project a run is synced into unless told otherwise


class ExportError(ConfigError):
    """An export that cannot be made (one line: what and why), raised before anything is written."""


def check_export(run_dir: str | Path, tracker: str) -> None:
    """Refuse in one line, before writing: an unknown tracker, a folder that is no run, a missing extra."""
    if tracker not in TRACKERS:
        raise ExportError(f"tracker {tracker!r} is not one of {', '.join(TRACKERS)}")
    if not (Path(run_dir) / METRICS).is_file() or not (Path(run_dir) / PROFILE).is_file():
        raise ExportError(f"{str(run_dir)!r} is not a run folder: it has no {METRICS} and {PROFILE}")
    if importlib.util.find_spec(TRACKERS[tracker]) is None:
        raise ExportError(
            f"exporting to {tracker} needs the optional extra {EXTRA!r}: "
            f"pip install -e '.[{EXTRA}]' (or pip install {' '.join(TRACKERS.values())})"
        )


def scalar_rows(metrics: pd.DataFrame) -> list[tuple[int, dict[str, float]]]:
    """(step, {column: value}) for every row of metrics.csv, its empty cells left out."""
    columns = [c for c in metrics.columns if c != "step"]
    return [
        (int(row["step"]), {c: float(row[c]) for c in columns if pd.notna(row[c])})
        for row in metrics.to_dict("records")
    ]


def _tensorboard(folder: Path, rows, image: np.ndarray | None, profile: dict, name: str) -> None:
    from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - optional extra `track`

    writer = SummaryWriter(log_dir=str(folder))
    writer.add_text(
        PROFILE_TAG,
        f"run {name}\n\n    " + yaml.safe_dump(profile, sort_keys=False).replace("\n", "\n    "),
        0,
    )
    for step, values in rows:
        for tag, value in values.items():
            writer.add_scalar(tag, value, step)
    if image is not None:
        writer.add_image(IMAGE_TAG, image, rows[-1][0], dataformats="HWC")
    writer.close()


def _wandb(folder: Path, rows, image: np.ndarray | None, profile: dict, name: str, *, project: str) -> None:
    import wandb  # noqa: PLC0415 - optional extra `track`

    folder.mkdir(parents=True)
    settings = wandb.Settings(
        x_disable_stats=True, console="off", disable_git=True, save_code=False, silent=True
    )
    run = wandb.init(
        project=project,
        name=name,
        dir=str(folder),
        mode="offline",
        config=profile,
        job_type="export",
        settings=settings,
    )
    try:
        for i, (step, values) in enumerate(rows):
            extra = (
                {IMAGE_TAG: wandb.Image(image, caption=f"{name}: loss curve")}
                if image is not None and i == len(rows) - 1
                else {}
            )
            run.log({**values, **extra}, step=step)
    finally:
        run.finish()


def export_run(
    run_dir: str | Path,
    tracker: str,
    dest: str | Path | None = None,
    project: str | None = None,
    *,
    image: np.ndarray | None = None,
) -> Path:
    """Export `run_dir` to `tracker` ("tensorboard" or "wandb") into `dest` (default RUN/export/TRACKER),
    replacing an earlier export; returns `dest`. project: the W&B project (default PROJECT). image: the
    loss curve, `[height, width, 3]` uint8 RGB, logged under IMAGE_TAG (the command line draws it with
    `mclib.book.plots_curves.loss_curve_image`); None logs no image."""
    check_export(run_dir, tracker)
    run_dir = Path(run_dir)
    dest = Path(dest) if dest is not None else export_dir(run_dir, tracker)
    rows = scalar_rows(load_metrics(run_dir))
    if not rows:
        raise ExportError(f"{run_dir / METRICS} has no rows: nothing to export")
    profile = run_profile(run_dir).to_dict()
    dest.parent.mkdir(parents=True, exist_ok=True)
    if tracker == "tensorboard":
        write_atomic(dest, lambda tmp: _tensorboard(tmp, rows, image, profile, run_dir.name))
    else:
        write_atomic(
            dest, lambda tmp: _wandb(tmp, rows, image, profile, run_dir.name, project=project or PROJECT)
        )
    return dest


def wandb_runs(dest: str | Path) -> list[Path]:
    """The offline W&B run folders under an export's folder (what `wandb sync` takes)."""
    return sorted((Path(dest) / "wandb").glob("offline-run-*"))


def viewing(dest: str | Path, tracker: str) -> str:
    """The command that shows (TensorBoard) or uploads (W&B) an export."""
    if tracker == "tensorboard":
        return f"tensorboard --logdir {dest}"
    return "wandb sync " + " ".join(str(p) for p in wandb_runs(dest))
