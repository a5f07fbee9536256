"""A run folder: the one place that knows its layout, its name, and how it is written.

    NAME-seedS/profile.yaml          the profile the run was started with
    NAME-seedS/metrics.csv           one row per step (pandas.read_csv reads it)
    NAME-seedS/checkpoints/step_004000/{config.json, model.safetensors, train_state.pt}
    NAME-seedS/checkpoints/damaged-step_004000/  a checkpoint with a file that cannot be read, set
                                     aside (renamed, never deleted) when the run resumed (`set_aside`;
                                     -2, -3, ... after it when the name is taken)
    NAME-seedS/end.json              why and where the run ended (`run_end`), once it has
    NAME-seedS/.lock                 held by the one process that trains the folder
    NAME-seedS/loss_curve.png        the curve `python -m mclib train` draws when it ends
    NAME-seedS/sweep.json            the sweep that trains the folder, and its wall time then (mclib.core.sweep)
    NAME-seedS/scorecard.json        the book's scorecard rows (mclib.book.scorecard)
    NAME-seedS/.scorecard.lock       held while one process reads and writes scorecard.json (mclib.book.scorecard)
    NAME-seedS/checkpoint_step_004000.zip   a checkpoint zipped as a download of the book (mclib.book.chapter)
    NAME-seedS/checkpoint_series.zip the analysis checkpoints (`checkpoint_steps`: pre, transition, post) as one
                                     download of the book: NAME-seedS/step_004000/{config.json,
                                     model.safetensors, README.md}, README.md its model card (mclib.book.chapter)
    NAME-seedS/export/TRACKER/       the run exported to a tracker, `tensorboard` or `wandb` (mclib.book.export)
    NAME-seedS/freeze/GROUP/         E15's run of one component group (mclib.analyses.freezing): a run
                                     folder as above, plus source.json, the checkpoint it started from
    .tmp-NAME, .old-NAME             beside a file or folder while `write_atomic` replaces it

Every name above is defined here (the constants and functions below) and nowhere else;
the modules that write the later files take their names from here.

A checkpoint's `config.json` + `model.safetensors` are the model (HF's folder, what the
analyses read); `train_state.pt` holds what resuming needs besides (Adam's state, the
data generators, the step, the wall time). With `checkpoints.keep: analysis` only the
newest checkpoint keeps its `train_state.pt`, and older ones are thinned as the run
trains (`prune_checkpoints`).

Every file and checkpoint is written to a temporary name and renamed into place, so
whatever exists is complete. A checkpoint damaged afterwards (a truncated copy, a full
disk, a bad sector) is not read: `saved_steps` leaves out one whose files fail
`checkpoint_damage`, a run whose newest checkpoint fails it is not complete (`is_complete`),
and the trainer, resuming (`resume_checkpoint`), sets a damaged newest checkpoint aside and
resumes from the newest intact one, saying so in one line. `mclib.core.train` writes runs; everything else reads them
through this module.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pickle
import shutil
import sys
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
import yaml
from safetensors import SafetensorError, safe_open
from transformers.utils import CONFIG_NAME

from .config import RUNNING, Checkpoints, ConfigError, Profile, parse_yaml, profile_from_saved
from .data import copy_level
from .metrics import DROP_COLUMN, SLOPE_BLOCKS, converged, end_slope, find_drop
from .model import MatrixBert, load_model

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
MODEL_CARD = "README.md"  # a checkpoint's model card, in the series' folders
EXPORT = "export"


def checkpoint_zip_path(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint at `step` lies zipped (`mclib.book.chapter.checkpoint_zip` writes it)."""
    return Path(run_dir) / f"checkpoint_{checkpoint_dir(run_dir, step).name}.zip"


def checkpoint_series_path(run_dir: str | Path) -> Path:
    """Where the run's analysis checkpoints lie zipped as one download
    (`mclib.book.chapter.checkpoint_series_zip` writes it)."""
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


# --- reading ---------------------------------------------------------------------------------

def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step:06d}"


def _steps_with(run_dir: Path, name: str) -> list[int]:
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.glob("step_*") if (p / name).is_file())


def saved_steps(run_dir: Path) -> list[int]:
    """The steps whose model is saved and readable (what the analyses can read); a
    checkpoint whose model fails `checkpoint_damage` is left out (`damaged_steps`)."""
    return [s for s in _steps_with(run_dir, MODEL_FILE) if checkpoint_damage(checkpoint_dir(run_dir, s)) is None]


def resumable_steps(run_dir: Path) -> list[int]:
    """The steps a run can resume from: the model and `train_state.pt` (with
    `checkpoints.keep: analysis`, only the newest). Their files are not checked here:
    `resume_checkpoint` sets a damaged one aside."""
    return _steps_with(run_dir, STATE_FILE)


def _first_line(e: BaseException, limit: int = 160) -> str:
    text = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {text[:limit]}" if text else type(e).__name__


def checkpoint_damage(folder: Path, state: bool = False) -> tuple[str, str] | None:
    """Why the checkpoint in `folder` cannot be read, as (file name, what is wrong with it),
    or None when it can. Cheap, no model is built: config.json must be a JSON object, and
    model.safetensors' header must parse and cover the file exactly (safetensors checks it
    against the file's size, so a truncated file fails); with state=True, train_state.pt
    must be a whole zip archive (what torch.save writes; a truncated one has no central
    directory). A file whose bytes are damaged but whose structure holds is not caught here:
    `resume_checkpoint` loads the train state in full."""
    folder = Path(folder)
    config = folder / CONFIG_FILE
    if not config.is_file():
        return CONFIG_FILE, "is missing"
    try:
        if not isinstance(json.loads(config.read_text()), dict):
            return CONFIG_FILE, "is not a JSON object"
    except (ValueError, UnicodeDecodeError) as e:
        return CONFIG_FILE, f"is not valid JSON ({_first_line(e)})"
    if not (folder / MODEL_FILE).is_file():
        return MODEL_FILE, "is missing"
    try:
        with safe_open(folder / MODEL_FILE, "pt") as f:
            f.keys()
    except (SafetensorError, OSError) as e:
        return MODEL_FILE, f"cannot be read ({_first_line(e)})"
    if state:
        try:
            with zipfile.ZipFile(folder / STATE_FILE) as z:
                z.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            return STATE_FILE, f"cannot be read ({_first_line(e)})"
    return None


def damaged_steps(run_dir: Path) -> dict[int, str]:
    """The saved checkpoints whose model cannot be read (`checkpoint_damage`), each with one
    phrase saying which file and why: {60: "model.safetensors cannot be read (...)"}. The
    analyses skip them (`saved_steps`); the book says so (`CheckpointSteps.skipped`)."""
    out = {}
    for s in _steps_with(run_dir, MODEL_FILE):
        damage = checkpoint_damage(checkpoint_dir(run_dir, s))
        if damage is not None:
            out[s] = f"{damage[0]} {damage[1]}"
    return out


def run_device(run_dir: str | Path) -> torch.device:
    """Where the analyses of a run compute: the device it trained on (its profile.yaml;
    "auto" in a folder written before devices were recorded means CUDA if there is one),
    or the CPU where that device is absent (a GPU run read on a laptop)."""
    device = run_profile(run_dir).train.device
    cuda = torch.cuda.is_available()
    return torch.device("cuda" if device in ("cuda", "auto") and cuda else "cpu")


def saved_checkpoint(run_dir: Path, step: int) -> Path:
    """The folder of the checkpoint saved at `step`; a step without weights is a one-line error naming the saved ones."""
    path = checkpoint_dir(run_dir, step)
    if not (path / MODEL_FILE).is_file():
        raise FileNotFoundError(f"no checkpoint at step {step} in {run_dir} (saved: {saved_steps(run_dir)})")
    return path


def load_checkpoint(run_dir: Path, step: int, attention: str = "sdpa",
                    device: str | torch.device | None = None) -> MatrixBert:
    """The model saved at `step` of a run, in eval mode, on `device` (default: the run's
    own device, `run_device`)."""
    path = saved_checkpoint(run_dir, step)
    return load_model(path, attention).to(device if device is not None else run_device(run_dir))


EMBEDDING_TENSORS = {"word": "bert.embeddings.word_embeddings.weight",          # [vocab, hidden]
                     "position": "bert.embeddings.position_embeddings.weight"}  # [n², hidden]


def checkpoint_embeddings(run_dir: Path, step: int) -> dict:
    """The token and position tables saved at `step` (`EMBEDDING_TENSORS`, CPU float tensors) and
    the model's n (`matrix_n` of its config.json), read from the weights file without building
    the model: two tensors of the file, not all of it (chapter 04 reads every saved checkpoint)."""
    path = saved_checkpoint(run_dir, step)
    with safe_open(str(path / MODEL_FILE), framework="pt") as f:
        tables = {key: f.get_tensor(name) for key, name in EMBEDDING_TENSORS.items()}
    config = json.loads((path / CONFIG_NAME).read_text())
    if "matrix_n" not in config:
        raise ValueError(f"{path / CONFIG_NAME}: no matrix_n: not a model built by mclib.core.model")
    return {**tables, "n": config["matrix_n"]}


def train_wall(run_dir: Path) -> float:
    """Training time (s) at the run's newest resumable checkpoint whose files pass
    `checkpoint_damage` (where the run resumes); 0 for a run not started."""
    done = [s for s in resumable_steps(run_dir) if checkpoint_damage(checkpoint_dir(run_dir, s), state=True) is None]
    return float(load_train_state(run_dir, done[-1])["wall"]) if done else 0.0


def load_train_state(run_dir: Path, step: int) -> dict:
    """What a checkpoint holds beside the model: step, optimiser state, wall time, generators."""
    return torch.load(checkpoint_dir(run_dir, step) / STATE_FILE, map_location="cpu", weights_only=False)


def set_aside_dirs(run_dir: Path) -> list[Path]:
    """The checkpoints set aside as unreadable when the run resumed (`set_aside`), oldest step first."""
    root = Path(run_dir) / CHECKPOINTS
    return sorted(root.glob(f"{DAMAGED}step_*")) if root.is_dir() else []


def set_aside(run_dir: Path, step: int) -> Path:
    """Rename the checkpoint at `step` to checkpoints/damaged-step_NNNNNN (then -2, -3, ...
    if a damaged copy of that step is set aside already) and return its new path: out of the
    way of `saved_steps` and of a new checkpoint at the same step, and never deleted."""
    folder = checkpoint_dir(run_dir, step)
    aside = folder.with_name(DAMAGED + folder.name)
    k = 1
    while aside.exists():
        k += 1
        aside = folder.with_name(f"{DAMAGED}{folder.name}-{k}")
    os.replace(folder, aside)
    return aside


# what torch.load raises on a damaged file (not on code that cannot read a sound one: that is a bug to see)
_STATE_ERRORS = (RuntimeError, pickle.UnpicklingError, EOFError, OSError, zipfile.BadZipFile)


def resume_checkpoint(run_dir: Path, attention: str = "sdpa",
                      device: str | torch.device = "cpu") -> tuple[int, MatrixBert, dict] | None:
    """The newest checkpoint a run resumes from, as (step, model, train state), or None
    (nothing to resume: the run starts at step 0). A checkpoint with a file that cannot be
    read (`checkpoint_damage`, or a train_state.pt that torch.load cannot load or that lacks
    what resuming needs) is set aside (`set_aside`) and the next older one tried; each one
    set aside is named on stderr in one line, with why and where the run resumes."""
    run_dir = Path(run_dir)
    aside: list[str] = []
    found = None
    for step in reversed(_steps_with(run_dir, STATE_FILE)):
        folder = checkpoint_dir(run_dir, step)
        damage = checkpoint_damage(folder, state=True)
        if damage is None:
            try:
                state = load_train_state(run_dir, step)
                if not {"step", "optimizer", "gens", "wall"} <= set(state):
                    damage = STATE_FILE, "lacks what resuming needs (step, optimizer, gens, wall)"
            except _STATE_ERRORS as e:
                damage = STATE_FILE, f"cannot be loaded ({_first_line(e)})"
        if damage is None:
            found = step, load_checkpoint(run_dir, step, attention, device), state
            break
        moved = set_aside(run_dir, step)
        aside.append(f"{folder / damage[0]} {damage[1]}; set aside as {moved.relative_to(run_dir)}")
    where = f"resuming from step {found[0]}" if found else "starting from step 0"
    for line in aside:
        print(f"mclib: {line}, {where}", file=sys.stderr)
    return found


def load_metrics(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(Path(run_dir) / METRICS)


def run_profile(run_dir: str | Path) -> Profile:
    """The profile a run folder was started with (its profile.yaml; one written before a
    lever was removed loads while it holds that lever off: `mclib.core.config.REMOVED`,
    `REMOVED_RUNNING`)."""
    return profile_from_saved(parse_yaml((Path(run_dir) / PROFILE).read_text()))


def rows_curve(rows: list[dict]) -> pd.DataFrame:
    """Metric rows (as `train` keeps them between flushes) as a curve: step, L, L_mask;
    what a `stop` reads the drop and the convergence rule from."""
    return pd.DataFrame({k: [r[k] for r in rows] for k in ("step", "L", "L_mask")})


def drop_column(profile: Profile) -> str:
    """The loss column a run's drop is read in (`mclib.core.metrics.DROP_COLUMN`)."""
    return DROP_COLUMN[profile.model.kind]


def convergence_stop(profile: Profile) -> Callable[[list[dict]], bool] | None:
    """The profile's own end rule as a `stop` for `train` (None with `train.until: steps`):
    true once `mclib.core.metrics.converged` finds the run converged (the fitted slope of
    L_mask over its `train.patience` steps, against `train.min_improvement` per 1 000
    steps); `train.steps` stays the cap."""
    t, rank = profile.train, profile.data.rank
    if t.until != "converged":
        return None
    column = drop_column(profile)
    return lambda rows: bool(rows) and converged(rows_curve(rows), rank, t.patience, t.min_improvement,
                                                 column=column) is not None


def is_complete(profile: Profile, run_dir: str | Path, stop: Callable[[list[dict]], bool] | None = None) -> bool:
    """Whether `train(profile, run_dir, stop=stop)` would return at once: the newest
    checkpoint is at the profile's last step, or the profile's convergence rule
    (`convergence_stop`) or `stop` was already true there. Cheap (no model is loaded), so
    a finished run costs no process to find finished."""
    done = resumable_steps(run_dir)
    if not done or checkpoint_damage(checkpoint_dir(run_dir, done[-1]), state=True) is not None:
        return False  # nothing saved, or a damaged newest checkpoint that training sets aside
    if done[-1] >= profile.train.steps:
        return True
    stops = [f for f in (convergence_stop(profile), stop) if f is not None]
    if not stops:
        return False
    rows = [r for r in load_metrics(run_dir).to_dict("records") if r["step"] <= done[-1]]
    return bool(rows) and any(f(rows) for f in stops)


# --- how a run ended, and the checkpoints the analyses read ------------------------------------

ENDINGS = ("converged", "cap", "steps", "stopped", "cut", "unfinished")


@dataclass
class RunEnd:
    """Why and where a run ended (`run_end`).

    ended: "converged"  the profile's rule fired (`train.until: converged`)
           "cap"        it reached `train.steps` without the rule firing (until: converged)
           "steps"      it trained its `train.steps` (until: steps)
           "stopped"    a caller's `stop` ended it (e.g. `analysis.after_drop` for the other seeds)
           "cut"        a wall-clock deadline or a signal ended it before any of these (`train(deadline=)`,
                        SIGTERM/SIGINT): it saved a resumable checkpoint there, and trains on if resumed
           "unfinished" none of these (still training, or cut)
    step: the newest checkpoint; drop: `find_drop`'s step (None: no drop).
    slope, slope_se: with until: converged, how fast L_mask still moved over the rule's
    window (the last `train.patience` steps): relative change per 1 000 steps and its
    standard error (`mclib.core.metrics.end_slope`, the fit the rule reads); None with
    until: steps or a run too short to fit.
    """
    ended: str
    step: int
    drop: int | None
    steps: int            # train.steps of the profile it trained with (the cap with until: converged)
    until: str
    patience: int | None = None
    slope: float | None = None
    slope_se: float | None = None

    @classmethod
    def from_json(cls, record: dict) -> "RunEnd":
        """A RunEnd from end.json; keys of older records (e.g. `improvement`, the window-mean
        rule's measure before 2026-11-25) are left out, so their slope reads None."""
        return cls(**{k: v for k, v in record.items() if k in cls.__dataclass_fields__})

    @property
    def text(self) -> str:
        """One phrase for the book, e.g. "L_mask stopped improving at step 26,400 (cap
        40,000): it changed by -1.2% ± 0.8% per 1,000 steps over its last 2,000" or
        "reached the cap of 20,000 steps while L_mask still changed by -11.9% ± 3.5% per
        1,000 steps over its last 2,000"."""
        rate = (f"{self.slope:+.1%} ± {self.slope_se:.1%} per 1,000 steps over its last {self.patience:,}"
                if self.slope is not None and self.patience and math.isfinite(self.slope) else "")
        return {"converged": f"L_mask stopped improving at step {self.step:,} (cap {self.steps:,})"
                             + (f": it changed by {rate}" if rate else ""),
                "cap": f"reached the cap of {self.steps:,} steps" + (f" while L_mask still changed by {rate}" if rate else ""),
                "steps": f"trained its {self.steps:,} steps",
                "stopped": f"stopped early at step {self.step:,}",
                "cut": f"was cut at step {self.step:,} of {self.steps:,} by its wall-clock deadline",
                "unfinished": f"unfinished at step {self.step:,} of {self.steps:,}"}[self.ended]


def end_of_run(profile: Profile, rows: list[dict], step: int, stopped: bool = False, cut: bool = False) -> RunEnd:
    """The `RunEnd` of a run of `profile` whose newest checkpoint is `step`, with metric
    rows `rows` up to it (stopped: a caller's `stop` was true there; cut: a deadline or a
    signal ended it there)."""
    t = profile.train
    rule = convergence_stop(profile)
    curve = rows_curve(rows)
    drop = find_drop(curve, rank=profile.data.rank, column=drop_column(profile)) if rows else None
    if rule is not None and rule(rows):
        ended = "converged"
    elif step >= t.steps:
        ended = "cap" if t.until == "converged" else "steps"
    else:
        ended = "stopped" if stopped else "cut" if cut else "unfinished"
    slope = slope_se = None
    if t.until == "converged" and len(curve) >= SLOPE_BLOCKS:
        slope, slope_se = end_slope(curve, t.patience)
    return RunEnd(ended, step, drop, t.steps, t.until, t.patience if t.until == "converged" else None, slope, slope_se)


def write_end(run_dir: Path, end: RunEnd) -> None:
    write_atomic(Path(run_dir) / END, lambda f: f.write_text(json.dumps(asdict(end))))


def ended_at(run_dir: str | Path, step: int) -> bool:
    """Whether the run's end.json records an end at `step`."""
    path = Path(run_dir) / END
    return path.is_file() and json.loads(path.read_text()).get("step") == step


def run_end(run_dir: str | Path) -> RunEnd:
    """Why and where the run in `run_dir` ended: its `end.json` (written by the trainer
    when the run ended) if that names the newest checkpoint, else derived from the run's
    profile and metrics (a caller's `stop` cannot be derived: such a run reads as
    "unfinished" until the trainer writes its record)."""
    run_dir = Path(run_dir)
    done = saved_steps(run_dir)
    if not done:
        raise FileNotFoundError(f"no checkpoint in {run_dir}: the run has not started")
    if ended_at(run_dir, done[-1]):
        return RunEnd.from_json(json.loads((run_dir / END).read_text()))
    rows = [r for r in load_metrics(run_dir).to_dict("records") if r["step"] <= done[-1]]
    return end_of_run(run_profile(run_dir), rows, done[-1])


@dataclass
class CheckpointSteps(Checkpoints):
    """The analysis checkpoints of one run, as `checkpoint_steps` chose them: pre,
    transition and post (with `all_steps()`, as `Checkpoints`), plus how.

    place: "drop" (placed from the measured drop) or "fixed" (the profile's steps)
    note: one sentence saying which, and why ("the run did not drop: ...")
    drop: `find_drop`'s step (None: no drop); left_plateau, near_final: the steps that
    bound the transition window (None with place "fixed"); skipped: the saved checkpoints
    left out because a file of theirs cannot be read, each with which and why; set_aside:
    the run folder's checkpoints that training set aside as unreadable when it resumed."""
    note: str = ""
    drop: int | None = None
    left_plateau: int | None = None
    near_final: int | None = None
    saved: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)  # saved checkpoints that cannot be read (`damaged_steps`)
    set_aside: list[str] = field(default_factory=list)  # checkpoints/damaged-step_N folders (`set_aside_dirs`)


PRE_FRACTION = 0.3        # pre: at most this fraction of the drop step (the paper: 4 000 of ~15 000)
# "On the plateau" for a smoothed curve, step by step (a trailing mean: PLACE_WINDOW steps here,
# the drop's window in mclib.analyses.sharpness): L_mask within 10 % of the copying level E[X²];
# where the plateau begins and ends. Its partner for a single reading, 20 %, is
# mclib.core.metrics.PLATEAU_BAND.
PLATEAU_TOLERANCE = 0.1
FINAL_FACTOR = 2.0        # transition ends where smoothed L_mask is within 2x its final level
MAX_TRANSITION = 4        # transition checkpoints at most (the paper has 4)
PLACE_WINDOW = 200        # steps of the trailing mean used to place them


def place_checkpoints(metrics: pd.DataFrame, saved: list[int], rank: int, fixed: Checkpoints,
                      place: str = "drop", *, window: int = PLACE_WINDOW) -> CheckpointSteps:
    """Choose the analysis checkpoints among the `saved` steps of a run from its metrics.

    place "drop" (the run has a drop d = `find_drop`):
      pre         the latest saved step at or before PRE_FRACTION·d (0.3 d; the paper's pre
                  is step 4 000 of a ~15 000-step plateau) at which the model is on the
                  copying plateau (trailing `window`-step mean of L_mask within 10 % of
                  E[X²] = rank/9); if none qualifies, the latest such step before the model
                  leaves the plateau, else the first saved step
      transition  up to MAX_TRANSITION (4) saved steps spread evenly (by index) from the
                  last saved step at or before the model leaves the plateau (the last step
                  before d whose trailing mean is >= 90 % of E[X²]) to the first saved step
                  at which the trailing mean is within 2x the final level (its value at the
                  run's last step); pre and post excluded; never empty (the saved step
                  nearest d when the window holds none)
      post        the last saved step: the end of training (converged, or the cap)
    place "fixed", or a run without a drop: `fixed`'s steps (the profile's `checkpoints`),
    those past the last saved step left out and post at most the last saved step; `note`
    says which and why.
    """
    saved = sorted(saved)
    if not saved:
        raise ValueError("the run has no saved checkpoint")
    last = saved[-1]
    drop = find_drop(metrics, rank=rank)

    def fixed_steps(note: str) -> CheckpointSteps:
        post = min(fixed.post, last)
        return CheckpointSteps(place="fixed", pre=min(fixed.pre, last),
                               transition=[s for s in fixed.transition if s < post], post=post,
                               note=note, drop=drop, saved=saved)

    if place == "fixed":
        return fixed_steps("the profile's fixed steps (checkpoints.place: fixed)")
    if drop is None:
        return fixed_steps("the run did not drop, so the profile's fixed steps stand in")
    plateau = copy_level(rank)
    smooth = metrics.set_index("step")["L_mask"].rolling(window, min_periods=1).mean()
    at = lambda s: float(smooth.loc[:s].iloc[-1])   # the trailing mean at step s
    before = smooth.loc[:drop]
    high = before[before >= (1 - PLATEAU_TOLERANCE) * plateau]
    left = int(high.index[-1]) if len(high) else int(before.index[0])
    on_plateau = [s for s in saved if s <= left and abs(at(s) / plateau - 1) <= PLATEAU_TOLERANCE]
    early = [s for s in on_plateau if s <= PRE_FRACTION * drop]
    pre = early[-1] if early else on_plateau[-1] if on_plateau else saved[0]
    final = at(last)
    after = smooth.loc[drop:]
    near = after[after <= FINAL_FACTOR * final]
    near_final = int(near.index[0]) if len(near) else last
    start = max([s for s in saved if s <= left], default=saved[0])
    end = min([s for s in saved if s >= near_final], default=last)
    window_steps = [s for s in saved if start <= s <= end and s not in (pre, last)]
    if len(window_steps) > MAX_TRANSITION:
        idx = np.linspace(0, len(window_steps) - 1, MAX_TRANSITION).round().astype(int)
        window_steps = [window_steps[i] for i in sorted(set(idx))]
    if not window_steps:
        inner = [s for s in saved if s not in (pre, last)] or saved
        window_steps = [min(inner, key=lambda s: abs(s - drop))]
    return CheckpointSteps(place="drop", pre=pre, transition=window_steps, post=last,
                           note=f"placed from the run's drop at step {drop:,}", drop=drop, left_plateau=left,
                           near_final=near_final, saved=saved)


def checkpoint_steps(run_dir: str | Path, profile: Profile | None = None) -> CheckpointSteps:
    """The pre-shift, transition and post-shift checkpoints of the run in `run_dir`, placed
    by `place_checkpoints` from its measured drop (profile `checkpoints.place: drop`) or
    the profile's fixed steps (`place: fixed`, or a run without a drop); profile: default
    the run's own profile.yaml. Read after training: the steps are among the saved ones."""
    run_dir = Path(run_dir)
    profile = profile or run_profile(run_dir)
    done = saved_steps(run_dir)
    if not done:
        raise FileNotFoundError(f"no checkpoint in {run_dir}: the run has not started")
    metrics = load_metrics(run_dir)
    metrics = metrics[metrics["step"] <= done[-1]]
    skipped = damaged_steps(run_dir)
    fixed = profile.checkpoints
    if skipped:  # a fixed step that cannot be read: the transition goes without it, pre and post take the saved step before
        before = lambda s: s if s not in skipped else max([d for d in done if d < s], default=done[0])
        fixed = dataclasses.replace(fixed, pre=before(fixed.pre), post=before(fixed.post),
                                    transition=[t for t in fixed.transition if t not in skipped])
    steps = place_checkpoints(metrics, done, profile.data.rank, fixed, profile.checkpoints.place)
    steps.skipped = skipped
    steps.set_aside = [f"{CHECKPOINTS}/{d.name}" for d in set_aside_dirs(run_dir)]
    return steps


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
    if (run_dir / PROFILE).is_file():
        check_same_profile(run_dir, profile)
    write_atomic(run_dir / PROFILE,
                 lambda f: f.write_text(yaml.safe_dump(profile.to_dict(), sort_keys=False)))


def save_checkpoint(run_dir: Path, step: int, model, opt, gens, *, rows: list[dict] | None, wall: float,
                    device: torch.device | str = "cpu") -> None:
    """The model at `step` (HF's folder), with `train_state.pt` (Adam's state `opt`, the
    generators, the wall time) unless `opt` is None: a weights-only checkpoint, which the
    analyses read and resuming skips (`train.state_every`). `rows`: every metric row so far,
    written whole first; None when the caller appends them itself (`append_metrics`)."""
    # metrics first: on resume rows past the checkpoint are dropped, so a kill between
    # the two writes loses nothing.
    if rows is not None:
        write_atomic(run_dir / METRICS, lambda p: pd.DataFrame(rows).to_csv(p, index=False))

    def write(tmp: Path):
        model.save_pretrained(tmp)
        if opt is not None:
            torch.save({"step": step, "optimizer": opt.state_dict(), "wall": wall,
                        "gens": {k: g.get_state() for k, g in gens.items()}, "device": str(device)}, tmp / STATE_FILE)

    final = checkpoint_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(final, write)


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


def check_same_profile(run_dir: Path, profile: Profile) -> None:
    """A run folder may only be resumed with the profile it was started with (steps may grow)."""
    saved = run_profile(run_dir).to_dict()
    mine = profile.to_dict()
    for d in (saved, mine):
        for key in RUNNING + ("steps",):
            d["train"].pop(key, None)  # how it runs (config.RUNNING) and how long, not what it is
        d["checkpoints"].pop("place", None)
        d["checkpoints"].pop("keep", None)
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
    with open(run_dir / LOCK, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"run folder {str(run_dir)!r} is being trained by another process") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- which checkpoints stay on disk (checkpoints.keep) ----------------------------------------
# "all": every saved checkpoint stays whole (the laptop profiles: the analyses over training
#   read every one, and a few MB each cost nothing).
# "analysis": what the analyses read and what resuming needs, nothing more (the paper profile,
#   whose checkpoints are 115 MB of weights and 229 MB of Adam state each):
#   - only the newest checkpoint keeps its train_state.pt (resuming needs nothing older);
#   - the book's run keeps the weights on a ladder (`ladder`) anchored at step 0, at its newest
#     step and, once it has dropped, at its drop: every save near an anchor, sparser further
#     away, so that pre (<= 0.3 x the drop), the transition around the drop and post are all
#     still there for `place_checkpoints`, and the analyses over training see ~12-22 steps
#     (at the paper's save_every of 1 000 and cap of 50 000); until the run drops, the
#     profile's fixed `checkpoints` steps (the fallback of a run without a drop) stay too;
#   - runs of which the book reads only the metrics and the end (the other seeds, E15's
#     runs: `newest_only`) keep their newest checkpoint alone.
LADDER_DENSE = 3  # every save within 3 save intervals of an anchor stays


def ladder(saved: list[int], anchors: list[int], every: int, dense: int = LADDER_DENSE) -> set[int]:
    """The steps of `saved` that stay: those within `dense`·every steps of an anchor, and
    further away, at a distance in [2^(j-1), 2^j)·dense·every, those that are multiples
    of 2^j·every. A step's distance to the newest step only grows, so a step that left
    the ladder is never wanted back."""
    near = dense * every
    keep = set()
    for s in saved:
        dist = min(abs(s - a) for a in anchors)
        j = 0 if dist < near else int(math.floor(math.log2(dist / near))) + 1
        if dist < near or s % (every * 2 ** j) == 0:
            keep.add(s)
    return keep


def prune_checkpoints(run_dir: Path, profile: Profile, rows: list[dict], newest_only: bool = False) -> list[int]:
    """Apply `checkpoints.keep` to a run after it saved a checkpoint (see above); `rows`:
    its metric rows so far. Returns the steps removed. The newest checkpoint (the one
    resuming reads) is never touched."""
    if profile.checkpoints.keep == "all":
        return []
    run_dir = Path(run_dir)
    saved = saved_steps(run_dir)
    if not saved:
        return []
    newest = saved[-1]
    resume = (resumable_steps(run_dir) or [newest])[-1]  # weights-only saves may follow it (train.state_every)
    if newest_only:
        keep = {newest, resume}
    else:
        drop = find_drop(rows_curve(rows), rank=profile.data.rank, column=drop_column(profile)) if rows else None
        keep = ladder(saved, [0, newest] + ([drop] if drop is not None else []), profile.train.save_every) | {newest}
        if drop is None:  # the profile's fixed steps stand in for a run without a drop (`place_checkpoints`)
            keep |= set(profile.checkpoints.all_steps())
        keep.add(resume)
    removed = [s for s in saved if s not in keep]
    for s in removed:
        shutil.rmtree(checkpoint_dir(run_dir, s))
    for s in resumable_steps(run_dir):
        if s != resume:
            (checkpoint_dir(run_dir, s) / STATE_FILE).unlink()
    return removed


def checkpoint_bytes(profile: Profile) -> tuple[int, int]:
    """(weights, train_state) bytes of one checkpoint of `profile`: fp32 parameters, and
    Adam's two moments of every trainable one."""
    from .model import build_model

    with torch.device("meta"):
        model = build_model(profile.model, profile.data.n, profile.seed)
    params = sum(p.numel() for p in model.parameters())
    return 4 * params, 2 * 4 * params


def estimate_run_bytes(profile: Profile, newest_only: bool = False) -> int:
    """Bytes a run of `profile` holds on disk at its cap, by its checkpoint policy (the
    largest case: no early stop, and with keep: analysis a drop half-way)."""
    weights, state = checkpoint_bytes(profile)
    t = profile.train
    saves = sorted(set(profile.checkpoints.all_steps()) | set(range(t.save_every, t.steps + 1, t.save_every)) | {t.steps})
    metrics = t.steps * 200  # metrics.csv: ~200 bytes a row
    if profile.checkpoints.keep == "all":
        return len(saves) * (weights + state) + metrics
    if newest_only:
        return weights + state + metrics
    kept = ladder(saves, [0, t.steps, t.steps // 2], t.save_every) | set(profile.checkpoints.all_steps())
    # while training, the newest save is written before the one before it is thinned
    return (len(kept) + 1) * weights + 2 * state + metrics


class DiskSpaceError(ConfigError):
    """A run would fill its disk (one line: the need and the free space)."""


def check_disk(runs: list[tuple[Profile, Path, bool]]) -> None:
    """Refuse to start runs that would not fit: `runs` as (profile, folder, newest_only);
    the need counts each run's `estimate_run_bytes` less what its folder holds already."""
    by_disk: dict[int, list[tuple[Path, int]]] = {}
    for profile, run_dir, newest_only in runs:
        run_dir = Path(run_dir)
        have = sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file()) if run_dir.is_dir() else 0
        need = max(0, estimate_run_bytes(profile, newest_only) - have)
        probe = run_dir if run_dir.exists() else next(p for p in run_dir.parents if p.exists())
        by_disk.setdefault(os.stat(probe).st_dev, []).append((probe, need))
    for entries in by_disk.values():
        need = sum(n for _, n in entries)
        free = shutil.disk_usage(entries[0][0]).free
        if need > free:
            names = ", ".join(str(p) for p, _ in entries)
            raise DiskSpaceError(f"the run(s) in {names} need about {need / 1e9:.1f} GB for their checkpoints "
                                 f"(checkpoints.keep, train.save_every, train.steps) but the disk has "
                                 f"{free / 1e9:.1f} GB free")
