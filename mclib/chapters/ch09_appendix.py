"""Chapter 09_appendix (book/09_appendix.ipynb): E20, model size. The appendix's width and depth
claims tested at laptop scale on committed sweep data (`width_depth`, docs/data/width_depth.csv),
and the paper's 12-layer models on larger matrices (`large_models`, results/sizes-gpu.csv),
shown when a GPU has run them. Each has `*_shown` and figures; `readings(ch, wd, large)` gives
E20's rows and glue["findings"], the sentence that speaks for them; `scorecard_table` records them.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ..analyses.sizes import by_setting, claims, drops_by_task, large_model_finals, order_of_magnitude
from ..book.chapter import Chapter
from ..book.plots_base import closed
from ..book.scorecard import claim, recorded_table
from ..book.scorecard_rules import CUT, agreement, row_verdict
from ..book.spec import ChapterSpec
from ..core.metrics import DROP_WINDOW
from ..core.packaged import data_file
from ..core.repo import REPO
from ..core.sweep import load_sweep
from ..core.sweep_figure import curves_path, setting_colours

CHAPTER = "09_appendix"
WIDTH_DEPTH = data_file("width_depth.csv")  # docs/data/ in a checkout
WIDTH_DEPTH_SWEEP = REPO / "sweeps" / "width-depth.yaml"
SIZES_GPU = REPO / "results" / "sizes-gpu.csv"
WIDTH_DEPTH_COMMAND = (
    "taskset -c 1 python -m mclib sweep sweeps/width-depth.yaml "
    "--results docs/data/width_depth.csv --figure docs/figures/width_depth.png"
)
SIZES_GPU_COMMAND = (
    "python -m mclib sweep sweeps/sizes-gpu.yaml --results results/sizes-gpu.csv   # on a GPU machine"
)
ORDER = -2.0  # "of the order of 1e-3": the mean log10 of the final total MSE below -2 (under 1e-2)


def width_depth(path: Path = WIDTH_DEPTH) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.is_file() else None


def width_depth_curves(path: Path = curves_path(WIDTH_DEPTH)) -> pd.DataFrame | None:
    """The sweep's kept loss curves (`mclib.core.sweep_figure.keep_curves`), or None."""
    return pd.read_csv(path) if path.is_file() else None


def planned(path: Path = WIDTH_DEPTH_SWEEP) -> set[tuple[int, int, int]]:
    """(n, hidden, layers) of every setting the width/depth sweep file trains."""
    return {(r.profile.data.n, r.profile.model.hidden, r.profile.model.layers) for r in load_sweep(path)}


def width_depth_shown(wd: pd.DataFrame | None):
    if wd is None:
        return f"No width/depth data yet: `{WIDTH_DEPTH_COMMAND}` produces it."
    table = by_setting(wd)
    # one format call: a second call with a dict would put the other columns back to pandas' default
    whole = {c: "{:,.0f}" for c in ("drop_step", "drop_step_sd", "drop_matrices", "steps_run")}
    return (
        table.style.hide(axis="index")
        .format({**{c: "{:.3g}" for c in table.select_dtypes("float").columns}, **whole}, na_rep="—")
        .set_caption(
            "sweeps/width-depth.yaml, per setting: seeds run and dropped, the drop step (mean and "
            "standard deviation over the seeds that dropped), in matrices and in minutes (the drop step at "
            "the run's mean pace, its training time over its steps), the runs that "
            "converged and their final L_mask over E[X²] (mean, sd; a run cut by the wall clock or the "
            "step cap has no final level and is left out of it), the longest run, and the convergence rule "
            "that "
            "ended the runs (end_rule). On n×n matrices of rank 1 (not the paper's "
            "7×7 rank 2), the `cpu` recipe otherwise; one thread a run."
        )
    )


def width_depth_figure(wd: pd.DataFrame | None):
    """Final L_mask / E[X²] against width and depth, and drop step against depth, per task size;
    error bars: SD over seeds; a marker per convergence rule (finals under unlike rules never compare)."""
    fig = plt.figure(figsize=(12, 3.8))
    width = fig.add_subplot(1, 3, 1)
    depth_final = fig.add_subplot(1, 3, 2, sharey=width)  # the same quantity as the width panel, on one scale
    depth_drop = fig.add_subplot(1, 3, 3)
    if wd is not None:
        t = by_setting(wd)
        rules = t["end_rule"].fillna("unknown") if "end_rule" in t else pd.Series("unknown", index=t.index)
        marker = {r: m for r, m in zip(sorted(rules.unique()), "osD^v")}

        def finals(ax, rows, x, colour, label):  # one line per task size, a marker per convergence rule
            ax.errorbar(
                rows[x],
                rows["final_over_level"],
                yerr=rows["final_sd"].fillna(0),
                marker="none",
                capsize=3,
                color=colour,
                label=label,
            )
            for rule, at in rows.groupby(rules[rows.index]):
                ax.plot(at[x], at["final_over_level"], ls="none", marker=marker[rule], color=colour)

        for i, n in enumerate(sorted(t["n"].unique())):
            label = f"{n}×{n}, rank 1"
            finals(
                width, t[(t["n"] == n) & (t["layers"] == 4)].sort_values("hidden"), "hidden", f"C{i}", label
            )
            d = t[(t["n"] == n) & (t["hidden"] == 64)].sort_values("layers")
            finals(depth_final, d, "layers", f"C{i}", label)
            depth_drop.errorbar(
                d["layers"],
                d["drop_step"],
                yerr=d["drop_step_sd"].fillna(0),
                marker="o",
                capsize=3,
                color=f"C{i}",
                label=label,
            )
            none = d[d["dropped"] == 0]  # no seed dropped: its drop comes after its longest run, drawn there
            depth_drop.scatter(
                none["layers"],
                none["steps_run"],
                marker="^",
                s=50,
                facecolors="none",
                edgecolors=f"C{i}",
                label=f"{n}×{n}: no drop by" if len(none) else None,
            )
        if len(marker) > 1:
            for rule, m in marker.items():
                width.plot([], [], ls="none", marker=m, color="grey", label=f"ended by: {rule}")
        width.legend(fontsize=8)  # the middle panel's colours and markers are the left one's
        depth_drop.legend(fontsize=8)
    width.set(
        xscale="log",
        yscale="log",
        xlabel="hidden size (4 layers)",
        ylabel="final L_mask / E[X²] (converged runs)",
        title="width: final level",
    )
    width.set_xticks([32, 64, 128], ["32", "64", "128"], minor=False)
    width.xaxis.set_minor_locator(plt.NullLocator())  # the log axis would label 3×10¹ … between the widths
    depth_final.set(xlabel="layers (hidden 64)", title="depth: final level")
    depth_drop.set(
        xlabel="layers (hidden 64)", ylabel="drop step (seeds that dropped)", title="depth: drop step"
    )
    fig.tight_layout()
    return closed(fig)


def width_depth_curves_figure(wd: pd.DataFrame | None, curves: pd.DataFrame | None):
    """Every kept run's L_mask (`find_drop`'s trailing mean) against matrices seen, a panel per task
    size, a colour per (hidden, layers); each title counts the runs drawn."""
    sizes = sorted(wd["n"].unique()) if wd is not None else []
    fig, axes = plt.subplots(1, max(len(sizes), 1), figsize=(10, 3.8), sharey=True, squeeze=False)
    if wd is None:
        axes[0, 0].text(0.5, 0.5, "no width/depth data yet", ha="center", transform=axes[0, 0].transAxes)
        return closed(fig)
    lever = {(h, L): f"hidden {h}, {L} layers" for h, L in sorted(set(zip(wd["hidden"], wd["layers"])))}
    colours = setting_colours(list(lever.values()))
    kept = {} if curves is None else {k: c for k, c in curves.groupby(["setting", "seed"])}
    for ax, n in zip(axes[0], sizes):
        runs = wd[wd["n"] == n].sort_values(["hidden", "layers", "seed"])
        drawn = 0
        for row in runs.itertuples():
            curve = kept.get((row.setting, int(row.seed)))
            if curve is not None:
                drawn += 1
                label = lever[(row.hidden, row.layers)]
                ax.plot(
                    curve["step"] * row.batch,
                    curve["L_mask"],
                    color=colours[label],
                    lw=0.8,
                    alpha=0.8,
                    label=None if label in ax.get_legend_handles_labels()[1] else label,
                )
        which = (
            "every run"
            if drawn == len(runs)
            else f"{drawn} of {len(runs)} runs (no curve kept for the others)"
        )
        ax.set_title(f"{n}×{n} rank 1: {which}", fontsize=10)
        if drawn:
            ax.set(xscale="log", yscale="log")
            ax.legend(fontsize=7)
        ax.set(xlabel="matrices seen")
    axes[0, 0].set(ylabel=f"training L_mask ({DROP_WINDOW}-step mean)")
    fig.tight_layout()
    return closed(fig)


def large_models(ch: Chapter) -> pd.DataFrame | None:
    """E20's 12-layer runs: committed results/sizes-gpu.csv, else the book's own
    runs/sweep/sizes-gpu.csv (a sweep run here), else None."""
    for path in (SIZES_GPU, ch.run_dir.parent / "sweep" / "sizes-gpu.csv"):
        if path.is_file():
            return large_model_finals(pd.read_csv(path))
    return None


def large_shown(large: pd.DataFrame | None):
    if large is None:
        return (
            f"Not run yet: it needs a GPU (up to ~47 GiB a run at 15×15). `{SIZES_GPU_COMMAND}` trains the "
            "four settings of sweeps/sizes-gpu.yaml (12 layers × 12 heads, hidden 768, Adam 5e-5) and writes "
            "the table this page then shows."
        )
    return (
        large.style.hide(axis="index")
        .format({"final_L": "{:.2e}", "lr": "{:g}"}, na_rep="—")
        .set_caption(
            "The 12-layer, 12-head models on larger matrices: final total MSE L (the last 10 % of "
            "steps) per run."
        )
    )


def _claim_row(c: dict, plan: set[tuple[int, int, int]]) -> dict:
    """E20's row of one appendix claim `c` (`sizes.claims`): a ratio near 1, or a direction below 1;
    n/a (`na`) until both settings have rows, or where a bound cannot decide its verdict."""
    task = f"{c['n']}×{c['n']} rank 1"
    quantity = f"{c['claim']} ({task}; laptop scale)"
    seeds = c["seeds"]
    missing = seeds.startswith("0 ") or seeds.endswith(" 0")
    unplanned = [
        f"hidden {h}, {layers} layers" for n, h, layers in c["compares"] if (n, h, layers) not in plan
    ]
    ours = None if math.isnan(c["ours"]) else c["ours"]
    why = c.get("note") or (
        f"not in the sweep: {WIDTH_DEPTH_SWEEP.relative_to(REPO)} trains no {task} model "
        f"at {' or '.join(unplanned)}"
        if missing and unplanned
        else "not measured yet: the sweep has no rows for one of the two settings"
        if missing
        else "one seed read at one of the two settings: a ratio without an error, not judged"
        if ours is not None and math.isnan(c["se"])
        else None
    )
    reading = (
        f"seeds {seeds}"
        + (f"; {c['left_out']}" if c.get("left_out") else "")
        + "; the paper tests this claim on 7×7 rank 2"
    )
    if c["sense"] == "about":
        return claim("E20", quantity, ours, reading, paper=1.0, kind="ratio", se=c["se"], na=why)
    row = claim(
        "E20",
        quantity,
        ours,
        reading,
        kind="direction",
        reference=1.0,
        sense="below",
        se=c["se"],
        margin=CUT,
        na=why,
    )
    decides = c.get("undecided_unless")  # a bound decides one verdict only (sizes._depth_claim)
    if decides and not why and row_verdict(row) != decides:
        row["na"] = f"undecided: the ratio is {c['bound']} {ours:.2f}, and such a bound can only " + (
            "show the claim" if decides == "same direction" else "refute it"
        )
    return row


def readings(
    ch: Chapter,
    wd: pd.DataFrame | None,
    large: pd.DataFrame | None,
    plan: set[tuple[int, int, int]] | None = None,
) -> tuple[dict, list[dict]]:
    """E20's rows: per task size, the four appendix claims as ratios (three below 1, one near 1), n/a
    until their settings have rows ("not in the sweep" where `plan`, default `planned()`, has none);
    and the large models' order of magnitude (n/a until a GPU ran them)."""
    rows, bounds = [], {}
    plan = planned() if plan is None else plan
    for c in claims(wd) if wd is not None else []:
        row = _claim_row(c, plan)
        if c.get("bound") in ("at most", "at least"):
            bounds[row["quantity"]] = c["bound"]
        rows.append(row)
    if wd is None:
        rows.append(
            claim(
                "E20",
                "width and depth at laptop scale",
                None,
                "",
                kind="direction",
                reference=1.0,
                sense="below",
                na=f"not run yet: {WIDTH_DEPTH_COMMAND}",
            )
        )
    magnitude = order_of_magnitude(large["final_L"]) if large is not None else math.nan
    rows.append(
        claim(
            "E20",
            "12-layer models on 7×7 r2 … 15×15 r4: mean log10 of the final total MSE "
            "(the paper: of the order of 1e-3, i.e. about -3)",
            None if math.isnan(magnitude) else magnitude,
            f"below {ORDER:g} (under 1e-2; the book's cut-off for 'of the order of 1e-3')",
            kind="direction",
            reference=ORDER,
            sense="below",
            margin=CUT,
            na=None if large is not None else "not run: it needs a GPU, sweeps/sizes-gpu.yaml",
        )
    )
    found = {
        "wd_runs": str(0 if wd is None else len(wd)),
        "large_runs": str(0 if large is None else len(large)),
        "wd_drops": "no width/depth runs yet" if wd is None else drops_by_task(wd),
        "findings": findings(rows, bounds),
    }
    return found, rows


def findings(rows: list[dict], bounds: dict[str, str] | None = None) -> str:
    """One clause per row, "CLAIM (TASK): RATIO ± SE, as in the paper / unlike the paper / not tested
    here", from its verdict; a bound (`bounds`: quantity -> "at most" / "at least") says so."""
    bounds = bounds or {}

    def clause(r):
        bound = f"{bounds[r['quantity']]} " if r["quantity"] in bounds else ""
        number = (
            ""
            if r["ours"] is None
            else bound
            + f"{r['ours']:.2f}"
            + ("" if r.get("se") is None or math.isnan(r["se"]) else f" ± {r['se']:.2f}")
            + ", "
        )
        why = f" ({r['na']})" if r.get("na") else ""
        return f"{r['quantity']}: {number}{agreement(row_verdict(r))}{why}"

    return "; ".join(clause(r) for r in rows) + "."


def scorecard_table(ch: Chapter, rows: list[dict]):
    """The rows, recorded (`recorded_table`), with their verdicts."""
    return recorded_table(ch.run_dir, rows, CHAPTER)


# What this chapter declares to the machinery (mclib.book.spec; collected by mclib.chapters.registry).
SPEC = ChapterSpec(CHAPTER)
