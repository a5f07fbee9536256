"""Every run of seed 1 at the paper's setting, whatever lease, device or step variant trained it
(`table`, `figure`): the same seed and data stream, so only rounding and length set them apart.
Their drop steps' spread (`drop_spread`) is the rounding spread the drop-step row is judged against.

    results/paper-*/runs/paper-seed1/   a slice's (slice.json) or a whole book's run (device.json)
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..analyses.rounding import Spread, spread
from ..core.metrics import find_drop
from ..core.repo import RESULTS
from ..core.runs import END, PROFILE, run_name, run_profile
from .slices import METRICS_GZ, STATE, read_metrics


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def runs(root: Path = RESULTS, name: str = "paper") -> dict[str, Path]:
    """label -> run folder of seed 1, oldest first: "DATE, DEVICE, STEP, revision REV (slice S)"."""
    found = []
    for folder in sorted(Path(root).glob(f"{name}-*")):
        run = folder / "runs" / run_name(name, 1)
        if not (run / METRICS_GZ).is_file():
            continue
        device, record = _read(folder / "device.json"), _read(folder / STATE)
        step = _read(run / "step.json").get("ran") or record.get("train_step")
        step = f"{step} step" if step else "step variant not recorded"
        what = f"slice {record['slice']}" if record.get("slice") else "a whole book"
        found.append(
            (
                device.get("date", ""),
                folder.name,
                f"{device.get('date', '?')}, {device.get('device', '?')}, {step}, revision "
                f"{record.get('git') or device.get('git', '?')} ({what})",
                run,
            )
        )
    return {label: run for _, _, label, run in sorted(found)}


def table(root: Path = RESULTS, name: str = "paper") -> pd.DataFrame:
    """One row per seed-1 run: where it ran, how far, its drop, how it ended, its precision."""
    rows = []
    for label, run in runs(root, name).items():
        m, cfg, end = (
            read_metrics(run),
            run_profile(run) if (run / PROFILE).is_file() else None,
            _read(run / END),
        )
        rank = cfg.data.rank if cfg else 2
        rows.append(
            {
                "run": label,
                "steps trained": int(m["step"].iloc[-1]),
                "drop step": find_drop(m, rank=rank),
                "ended": end.get("ended", "cut (device time ran out)"),
                "precision": cfg.train.precision if cfg else None,
            }
        )
    t = pd.DataFrame(rows)
    if len(t):
        t["drop step"] = pd.array(t["drop step"].tolist(), dtype="Int64")
    return t


def drop_spread(root: Path = RESULTS, name: str = "paper") -> Spread | None:
    """The spread of the drop step over every seed-1 run that dropped (None under two)."""
    t = table(root, name)
    if t.empty:
        return None
    drops = {
        r["run"]: (None if pd.isna(r["drop step"]) else int(r["drop step"])) for r in t.to_dict("records")
    }
    return spread(
        drops,
        "seed 1's drop step at the paper's setting",
        "; ".join(f"{d:,} on {', '.join(k.split(', ')[1::-1])}" for k, d in drops.items() if d is not None),
    )


def figure(root: Path = RESULTS, name: str = "paper"):
    """L_mask of every seed-1 run on one axis, each labelled with its date, device, step variant
    and revision, its drop marked (`plots_curves.seed_loss_curves`)."""
    from ..book.plots_curves import seed_loss_curves  # noqa: PLC0415 - matplotlib only when a figure is drawn

    found = runs(root, name)
    curves = {label: read_metrics(run) for label, run in found.items()}
    rank = run_profile(next(iter(found.values()))).data.rank
    drops = {label: find_drop(m, rank=rank) for label, m in curves.items()}
    fig = seed_loss_curves(
        curves,
        drops,
        rank=rank,
        label="{}",
        smooth=100,
        title="Seed 1 at the paper's setting, every lease that trained it",
    )
    fig.set_size_inches(8, 5.5)
    fig.axes[0].legend(
        fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14)
    )  # long labels: below the axes
    fig.tight_layout()
    return fig
