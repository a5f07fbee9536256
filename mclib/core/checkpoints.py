"""A run's checkpoints: saved, read, found damaged and set aside, resumed from; which stay on disk.

A checkpoint is a folder of the run folder (`mclib.core.runs.checkpoint_dir`): HF's
config.json + model.safetensors (what the analyses read) and train_state.pt (Adam's state,
the generators, step and wall time: what resuming needs). It is written under a temporary
name and renamed into place. One damaged afterwards (a truncated copy, a full disk) is not
read: `saved_steps` leaves it out, and resuming (`resume_checkpoint`) sets it aside and
resumes from the newest intact one, saying so in one line. `prune_checkpoints` applies
`checkpoints.keep`; `check_disk` refuses runs whose checkpoints would not fit.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .config import ConfigError, Profile
from .console import no_hf_progress_bars
from .metrics import drop_column, find_drop, rows_curve
from .model import MatrixBert, build_model, load_model
from .runs import (
    CHECKPOINTS,
    CONFIG_FILE,
    DAMAGED,
    MODEL_FILE,
    STATE_FILE,
    append_metrics,
    checkpoint_dir,
    resume_metrics,
    run_profile,
    write_atomic,
)

log = logging.getLogger(__name__)


# --- reading ---------------------------------------------------------------------------------


def _steps_with(run_dir: Path, name: str) -> list[int]:
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.glob("step_*") if (p / name).is_file())


def saved_steps(run_dir: Path) -> list[int]:
    """The steps whose model is saved and passes `checkpoint_damage` (what the analyses can read)."""
    return [
        s for s in _steps_with(run_dir, MODEL_FILE) if checkpoint_damage(checkpoint_dir(run_dir, s)) is None
    ]


def resumable_steps(run_dir: Path) -> list[int]:
    """The steps that have a train_state.pt, unchecked (`resume_checkpoint` sets a damaged one aside)."""
    return _steps_with(run_dir, STATE_FILE)


def _first_line(e: BaseException, limit: int = 160) -> str:
    text = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {text[:limit]}" if text else type(e).__name__


def checkpoint_damage(folder: Path, state: bool = False) -> tuple[str, str] | None:
    """Why the checkpoint in `folder` cannot be read, as (file name, what is wrong), or None. Cheap
    structural checks, no model built: config.json a JSON object, model.safetensors' header
    parses and matches the file's size; with `state`, train_state.pt a whole zip archive."""
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
    """The saved checkpoints whose model fails `checkpoint_damage`, each with one phrase:
    {60: "model.safetensors cannot be read (...)"}."""
    out = {}
    for s in _steps_with(run_dir, MODEL_FILE):
        damage = checkpoint_damage(checkpoint_dir(run_dir, s))
        if damage is not None:
            out[s] = f"{damage[0]} {damage[1]}"
    return out


def run_device(run_dir: str | Path) -> torch.device:
    """Where a run's analyses compute: the device it trained on (its profile.yaml; "auto" means
    CUDA if present), or the CPU where that device is absent."""
    device = run_profile(run_dir).train.device
    cuda = torch.cuda.is_available()
    return torch.device("cuda" if device in ("cuda", "auto") and cuda else "cpu")


def saved_checkpoint(run_dir: Path, step: int) -> Path:
    """The folder of the checkpoint saved at `step`; a step without weights is a one-line error naming
    the saved ones."""
    path = checkpoint_dir(run_dir, step)
    if not (path / MODEL_FILE).is_file():
        raise FileNotFoundError(f"no checkpoint at step {step} in {run_dir} (saved: {saved_steps(run_dir)})")
    return path


def load_checkpoint(
    run_dir: Path, step: int, attention: str = "sdpa", device: str | torch.device | None = None
) -> MatrixBert:
    """The model saved at `step` of a run, in eval mode, on `device` (default: the run's
    own device, `run_device`)."""
    path = saved_checkpoint(run_dir, step)
    return load_model(path, attention).to(device if device is not None else run_device(run_dir))


EMBEDDING_TENSORS = {
    "word": "bert.embeddings.word_embeddings.weight",  # [vocab, hidden]
    "position": "bert.embeddings.position_embeddings.weight",
}  # [n², hidden]


def checkpoint_embeddings(run_dir: Path, step: int) -> dict:
    """The token and position tables saved at `step` (`EMBEDDING_TENSORS`, CPU tensors) and the
    model's n, read from the weights file without building the model."""
    path = saved_checkpoint(run_dir, step)
    with safe_open(str(path / MODEL_FILE), framework="pt") as f:
        tables = {key: f.get_tensor(name) for key, name in EMBEDDING_TENSORS.items()}
    config = json.loads((path / CONFIG_FILE).read_text())
    if "matrix_n" not in config:
        raise ValueError(f"{path / CONFIG_FILE}: no matrix_n: not a model built by mclib.core.model")
    return {**tables, "n": config["matrix_n"]}


def train_wall(run_dir: Path) -> float:
    """Training time (s) at the checkpoint the run would resume from; 0 for a run not started."""
    done = [
        s
        for s in resumable_steps(run_dir)
        if checkpoint_damage(checkpoint_dir(run_dir, s), state=True) is None
    ]
    return float(load_train_state(run_dir, done[-1])["wall"]) if done else 0.0


def load_train_state(run_dir: Path, step: int) -> dict:
    """What a checkpoint holds beside the model: step, optimiser state, wall time, generators."""
    return torch.load(checkpoint_dir(run_dir, step) / STATE_FILE, map_location="cpu", weights_only=True)


def set_aside_dirs(run_dir: Path) -> list[Path]:
    """The checkpoints set aside as unreadable when the run resumed (`set_aside`), oldest step first."""
    root = Path(run_dir) / CHECKPOINTS
    return sorted(root.glob(f"{DAMAGED}step_*")) if root.is_dir() else []


def set_aside(run_dir: Path, step: int) -> Path:
    """Rename the checkpoint at `step` to checkpoints/damaged-step_NNNNNN (-2, -3, ... where taken)
    and return its new path; never deleted."""
    folder = checkpoint_dir(run_dir, step)
    aside = folder.with_name(DAMAGED + folder.name)
    k = 1
    while aside.exists():
        k += 1
        aside = folder.with_name(f"{DAMAGED}{folder.name}-{k}")
    os.replace(folder, aside)
    return aside


# what torch.load raises on a damaged file (not on code that cannot read a sound one: that is a bug to see);
# weights_only=True refuses a pickle that names anything outside torch's allowlist (UnpicklingError)
_STATE_ERRORS = (RuntimeError, pickle.UnpicklingError, EOFError, OSError, zipfile.BadZipFile)


def resume_checkpoint(
    run_dir: Path, attention: str = "sdpa", device: str | torch.device = "cpu"
) -> tuple[int, MatrixBert, dict] | None:
    """The newest checkpoint a run resumes from, as (step, model, train state), or None (start at
    step 0). A checkpoint that fails `checkpoint_damage` or whose train state cannot be loaded or
    lacks a key is set aside and the next older tried, each named on stderr in one line."""
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
        log.warning(f"mclib: {line}, {where}")
    return found


def resume_run(
    run_dir: Path, attention: str = "sdpa", device: str | torch.device = "cpu"
) -> tuple[int, MatrixBert, dict, list[dict]] | None:
    """Where a run resumes, as (step, model, train state, metric rows up to it), or None; weights-only
    saves past that step are removed (the run trains those steps again)."""
    found = resume_checkpoint(run_dir, attention, device)
    if found is None:
        return None
    step, model, state = found
    rows = resume_metrics(run_dir, step)
    for later in [s for s in saved_steps(run_dir) if s > step]:
        shutil.rmtree(checkpoint_dir(run_dir, later))
    return step, model, state, rows


# --- writing ---------------------------------------------------------------------------------


def save_checkpoint(
    run_dir: Path,
    step: int,
    model,
    opt,
    gens,
    *,
    rows: list[dict] | None,
    written: int = 0,
    wall: float,
    device: torch.device | str = "cpu",
) -> int:
    """Save the model at `step` (HF's folder) and, unless `opt` is None (a weights-only save),
    train_state.pt; first append `rows[written:]` to metrics.csv (None: leave it). Returns the
    number of rows metrics.csv then holds."""
    # metrics first: on resume rows past the checkpoint are dropped, so a kill between
    # the two writes loses nothing.
    if rows is not None:
        written = append_metrics(run_dir, rows, written)

    def write(tmp: Path):
        with no_hf_progress_bars():
            model.save_pretrained(tmp)
        if opt is not None:
            torch.save(
                {
                    "step": step,
                    "optimizer": opt.state_dict(),
                    "wall": wall,
                    "gens": {k: g.get_state() for k, g in gens.items()},
                    "device": str(device),
                },
                tmp / STATE_FILE,
            )

    final = checkpoint_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(final, write)
    return written


# --- which checkpoints stay on disk (checkpoints.keep) ----------------------------------------
# "all": every checkpoint stays whole. "analysis" (large models): only the newest checkpoint keeps
# its train_state.pt; runs with `newest_only` keep their newest checkpoint alone; the book's run
# keeps weights on a `ladder` anchored at step 0, the profile's pre step, its newest step and its
# drop (dense near an anchor, sparser away), so pre, the transition and post stay for
# `place_checkpoints`; until it drops, the profile's fixed `checkpoints` steps stay too.
LADDER_DENSE = 3  # every save within 3 save intervals of an anchor stays


def plateau_anchors(profile: Profile) -> list[int]:
    """The ladder's fixed anchors: step 0 and the profile's `checkpoints.pre`."""
    return [0] + ([profile.checkpoints.pre] if profile.checkpoints.pre else [])


def ladder(saved: list[int], anchors: list[int], every: int, dense: int = LADDER_DENSE) -> set[int]:
    """The steps of `saved` that stay: those within `dense`·every of an anchor, and at a distance in
    [2^(j-1), 2^j)·dense·every those that are multiples of 2^j·every."""
    near = dense * every
    keep = set()
    for s in saved:
        dist = min(abs(s - a) for a in anchors)
        j = 0 if dist < near else int(math.floor(math.log2(dist / near))) + 1
        if dist < near or s % (every * 2**j) == 0:
            keep.add(s)
    return keep


def prune_checkpoints(
    run_dir: Path, profile: Profile, rows: list[dict], newest_only: bool = False
) -> list[int]:
    """Apply `checkpoints.keep` to a run after a save (`rows`: its metric rows so far); returns the
    steps removed. The checkpoint the run would resume from is never removed."""
    if profile.checkpoints.keep == "all":
        return []
    run_dir = Path(run_dir)
    saved = saved_steps(run_dir)
    if not saved:
        return []
    newest = saved[-1]
    resume = (resumable_steps(run_dir) or [newest])[
        -1
    ]  # weights-only saves may follow it (train.state_every)
    if newest_only:
        keep = {newest, resume}
    else:
        curve, column = rows_curve(rows), drop_column(profile)
        drop = find_drop(curve, rank=profile.data.rank, column=column) if rows else None
        keep = ladder(
            saved,
            plateau_anchors(profile) + [newest] + ([drop] if drop is not None else []),
            profile.train.save_every,
        ) | {newest}
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
    """(weights, train_state) bytes of one checkpoint of `profile`: fp32 parameters and Adam's two moments."""
    with torch.device("meta"):
        model = build_model(profile.model, profile.data.n, profile.seed)
    params = sum(p.numel() for p in model.parameters())
    return 4 * params, 2 * 4 * params


def estimate_run_bytes(profile: Profile, newest_only: bool = False) -> int:
    """Bytes a run of `profile` holds on disk at its cap under its checkpoint policy (the largest
    case: no early stop; with keep: analysis, a drop half-way)."""
    weights, state = checkpoint_bytes(profile)
    t = profile.train
    saves = sorted(
        set(profile.checkpoints.all_steps()) | set(range(t.save_every, t.steps + 1, t.save_every)) | {t.steps}
    )
    metrics = t.steps * 200  # metrics.csv: ~200 bytes a row
    if profile.checkpoints.keep == "all":
        return len(saves) * (weights + state) + metrics
    if newest_only:
        return weights + state + metrics
    kept = ladder(saves, plateau_anchors(profile) + [t.steps, t.steps // 2], t.save_every) | set(
        profile.checkpoints.all_steps()
    )
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
            raise DiskSpaceError(
                f"the run(s) in {names} need about {need / 1e9:.1f} GB for their checkpoints "
                f"(checkpoints.keep, train.save_every, train.steps) but the disk has "
                f"{free / 1e9:.1f} GB free"
            )
