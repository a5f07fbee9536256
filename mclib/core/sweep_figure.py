"""The curves table and the figure of a sweep's results (`mclib.core.sweep`): beside a results
table, STEM_curves.csv keeps each run's thinned loss curve (`keep_curves`), so the curves
outlive the run folders; `draw_figure` draws from the two.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .metrics import DROP_WINDOW
from .runs import METRICS, load_metrics, run_name, write_atomic

CURVE_POINTS = 200  # points kept per run, spaced evenly in log(step): enough for a log-x plot


def curves_path(results: Path) -> Path:
    """Where the curves of a results table are kept: beside it, STEM_curves.csv."""
    return results.with_name(f"{results.stem}_curves.csv")


def thinned_curve(m, points: int = CURVE_POINTS):
    """A run's L_mask curve as `find_drop` reads it (trailing DROP_WINDOW-step mean) at `points`
    steps spaced evenly in log(step), the last included: columns step, L_mask."""
    smooth = m["L_mask"].rolling(DROP_WINDOW, min_periods=1).mean()
    at = np.unique(np.geomspace(1, len(m), num=min(points, len(m))).round().astype(int) - 1)
    return m.iloc[at][["step"]].assign(L_mask=smooth.iloc[at].round(6).to_numpy()).reset_index(drop=True)


def keep_curves(results: Path, sweep: str, runs: Path) -> int:
    """Write the curves table atomically: each row of `sweep` whose run folder is here and ended at
    the row's `steps_run` gets its curve afresh, other rows keep their old curve, if any.
    Returns the number of rows with a curve."""
    if not results.is_file():
        return 0
    rows = pd.read_csv(results)
    rows = rows[rows["sweep"] == sweep] if "sweep" in rows.columns else rows.assign(sweep=sweep)
    path = curves_path(results)
    columns = ["sweep", "setting", "seed", "step", "L_mask"]
    old = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=columns)
    kept = {k: c for k, c in old.groupby(["sweep", "setting", "seed"])}
    table = [c for (w, _, _), c in kept.items() if w != sweep]  # other sweeps' curves, as they were
    for row in rows.itertuples():
        folder = runs / run_name(row.setting, int(row.seed))
        m = load_metrics(folder) if (folder / METRICS).is_file() else None
        here = m is not None and int(m["step"].iloc[-1]) == int(row.steps_run)
        curve = (
            thinned_curve(m).assign(sweep=sweep, setting=row.setting, seed=int(row.seed))
            if here
            else kept.get((sweep, row.setting, int(row.seed)))
        )
        if curve is not None:
            table.append(curve[columns])
    whole = pd.concat(table, ignore_index=True) if table else pd.DataFrame(columns=columns)
    write_atomic(path, lambda tmp: whole.to_csv(tmp, index=False))
    return sum(1 for c in table if (c["sweep"] == sweep).all())


def setting_colours(settings: list[str]) -> dict[str, tuple]:
    """A colour per setting: tab10, or tab20 above 10 settings."""
    import matplotlib  # noqa: PLC0415 - matplotlib loads when a figure is drawn

    cmap = matplotlib.colormaps["tab10" if len(settings) <= 10 else "tab20"]
    return {s: cmap(i % cmap.N) for i, s in enumerate(settings)}


def draw_figure(results: Path, sweep: str, path: Path) -> Path | None:
    """The runs of `sweep`: L_mask against matrices seen, a line per kept curve (a colour per
    setting), and each run's drop (dot) or how far it got without one (hollow triangle)."""
    import matplotlib  # noqa: PLC0415 - matplotlib loads when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after the backend is chosen

    if not results.is_file():
        return None
    df = pd.read_csv(results)
    df = df[df["sweep"] == sweep] if "sweep" in df.columns else df
    if df.empty:
        return None
    kept = pd.read_csv(curves_path(results)) if curves_path(results).is_file() else None
    curves = (
        {} if kept is None else {k: c for k, c in kept[kept["sweep"] == sweep].groupby(["setting", "seed"])}
    )
    settings = list(dict.fromkeys(df["setting"]))
    colours = setting_colours(settings)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    drawn = 0
    for row in df.itertuples():
        curve = curves.get((row.setting, int(row.seed)))
        if curve is not None:
            drawn += 1
            left.plot(
                curve["step"] * row.batch, curve["L_mask"], color=colours[row.setting], lw=0.8, alpha=0.8
            )
        if pd.notna(row.drop_step):
            right.scatter(
                [settings.index(row.setting)], [row.drop_step * row.batch], color=colours[row.setting], s=40
            )
        else:
            right.scatter(
                [settings.index(row.setting)],
                [row.matrices],
                color=colours[row.setting],
                marker="^",
                facecolors="none",
                s=40,
            )
    for s in settings:
        left.plot([], [], color=colours[s], label=s)
    which = (
        "every run" if drawn == len(df) else f"{drawn} of {len(df)} runs (the others' curves were not kept)"
    )
    left.set(xlabel="matrices seen", ylabel=f"L_mask (training batch, {DROP_WINDOW}-step mean)")
    left.set_title(f"{sweep}: {which}", fontsize=10)
    if drawn:
        left.set(xscale="log", yscale="log")
        left.legend(fontsize=7)
    else:
        left.text(0.5, 0.5, f"no curve kept in {curves_path(results)}", ha="center", transform=left.transAxes)
    right.set_xticks(range(len(settings)), settings, rotation=30, ha="right", fontsize=7)
    right.set(yscale="log", ylabel="matrices seen", title="drop (dot) or none by (triangle)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
