"""Progress measures over training: can the drop be seen coming?

`progress_table` gives every scalar measure of a run one value per saved checkpoint;
`lead_times` says when each moved (crossed half-way along its largest move) and
`plateau_leads` whether it left its plateau band for good before the drop (the comment there).

Measures (columns of `progress_table`):

    max_row_excess, max_column_excess   the most row- / column-structured head
                                        (heads.head_scores; 0 uniform, 1 pure)
    attention_entropy                   mean attention entropy over heads (nats; log(n²) uniform)
    column_silhouette                   position embeddings grouped by column (E14)
    token_alignment                     token embeddings vs the final checkpoint's PCA plane
                                        (E13; 1 at the final checkpoint by construction)
    grad_attention, grad_mlp, grad_positional, grad_token, grad_other
                                        ℓ2 norm of the training loss's gradient per
                                        component group (interventions.component_groups)
    L_mask                              the control: training L_mask, `find_drop`'s trailing mean

One threshold rule for every measure (`default_thresholds`): half-way from the first value
to the farthest one, known only in hindsight. L_mask crosses it at the drop, so a measure
leads only if it crosses earlier. Lead times are lower bounds, short by < `resolution`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.checkpoints import load_checkpoint, saved_steps
from ..core.config import DataConfig
from ..core.metrics import DROP_FRACTION, DROP_WINDOW, losses
from ..core.runs import load_metrics
from .embeddings import embedding_progress
from .evaluate import sample_eval_batch
from .heads import attention_progress
from .interventions import component_groups

GROUP_ORDER = ("attention", "mlp", "positional", "token", "other")
DIRECTIONS = ("above", "below")
PERSIST = 2  # checkpoints a crossing must hold for


# ---- the measures -------------------------------------------------------------------


def gradient_norms(
    run_dir: str | Path, data: DataConfig, n_matrices: int = 64, seed: int = 0
) -> pd.DataFrame:
    """ℓ2 norm of the gradient of the training loss L per component group, at every saved
    checkpoint, on one fixed batch (`sample_eval_batch(data, n_matrices, seed)`).
    Tidy: columns step, group (GROUP_ORDER, then "total"), grad_norm."""

    steps = saved_steps(Path(run_dir))
    if not steps:
        raise ValueError(f"run_dir {str(run_dir)!r} has no saved checkpoint")
    batch = sample_eval_batch(data, n_matrices, seed)
    rows = []
    for step in steps:
        model = load_checkpoint(
            run_dir, step
        )  # on the run's device; eval mode: dropout off (the profiles use 0 anyway)
        groups = component_groups(model)
        model.zero_grad(set_to_none=True)
        on = batch.to(next(model.parameters()).device)
        pred = model(on.tokens).logits.view_as(on.x)
        losses(pred, on.x, on.mask)["L"].backward()
        sq = dict.fromkeys(GROUP_ORDER, 0.0)
        for name, p in model.named_parameters():
            if p.grad is not None:
                sq[groups[name]] += float(p.grad.double().pow(2).sum())
        rows += [{"step": step, "group": g, "grad_norm": math.sqrt(sq[g])} for g in GROUP_ORDER]
        rows.append({"step": step, "group": "total", "grad_norm": math.sqrt(sum(sq.values()))})
    return pd.DataFrame(rows, columns=["step", "group", "grad_norm"])


def loss_at_checkpoints(
    metrics: pd.DataFrame, steps, column: str = "L_mask", window: int = DROP_WINDOW
) -> pd.Series:
    """`column` averaged over the `window` steps ending at each of `steps` (the same
    trailing mean as `find_drop`), indexed by step."""
    smooth = metrics.set_index("step")[column].rolling(window, min_periods=1).mean()
    return smooth.reindex(list(steps)).rename(column)


def progress_table(
    run_dir: str | Path, data: DataConfig, n_matrices: int = 64, seed: int = 0
) -> pd.DataFrame:
    """One row per saved checkpoint: step and the module docstring's measures."""

    heads = attention_progress(run_dir, data, n_matrices, seed)
    table = heads.groupby("step").agg(
        max_row_excess=("row_excess", "max"),
        max_column_excess=("column_excess", "max"),
        attention_entropy=("entropy", "mean"),
    )
    emb = embedding_progress(run_dir).set_index("step")[["column_silhouette", "token_alignment"]]
    grads = gradient_norms(run_dir, data, n_matrices, seed)
    grads = grads[grads["group"] != "total"].pivot(index="step", columns="group", values="grad_norm")
    grads = grads[list(GROUP_ORDER)].add_prefix("grad_")
    table = table.join(emb).join(grads)
    table["L_mask"] = loss_at_checkpoints(load_metrics(run_dir), table.index)
    table.columns.name = None
    return table.reset_index()


def measures(table: pd.DataFrame) -> list[str]:
    """The measure columns of a progress table: every numeric column but step."""
    return [c for c in table.columns if c != "step" and pd.api.types.is_numeric_dtype(table[c])]


# ---- thresholds and lead times --------------------------------------------------------


def excursion(values) -> tuple[float, float]:
    """(first, extreme) of a series: its first finite value and the finite value
    farthest from it (the first such, on ties); NaNs if there is no finite value."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return math.nan, math.nan
    return float(v[0]), float(v[np.argmax(np.abs(v - v[0]))])


def default_thresholds(table: pd.DataFrame, frac: float = DROP_FRACTION) -> dict[str, tuple[float, str]]:
    """measure -> (value, direction): `frac` of the way from the first value to the extreme,
    "above" if the extreme is above the first value, else "below"; (NaN, "above") for a
    measure that never moves. The default is `find_drop`'s fraction, so L_mask crosses at the drop."""
    out = {}
    for m in measures(table):
        first, extreme = excursion(table.sort_values("step")[m])
        if not np.isfinite(extreme) or extreme == first:
            out[m] = (math.nan, "above")
        else:
            out[m] = (first + frac * (extreme - first), "above" if extreme > first else "below")
    return out


def normalised(table: pd.DataFrame) -> pd.DataFrame:
    """Tidy (step, measure, value, progress): progress = (value − first) / (extreme − first),
    0 at the first checkpoint, 1 at the extreme, so the default threshold is 0.5 for
    every measure (NaN for a measure that never moves)."""
    table = table.sort_values("step")
    frames = []
    for m in measures(table):
        first, extreme = excursion(table[m])
        span = extreme - first
        prog = (table[m] - first) / span + 0.0 if np.isfinite(span) and span != 0 else np.nan  # + 0.0: no -0
        frames.append(
            pd.DataFrame(
                {
                    "step": table["step"].to_numpy(),
                    "measure": m,
                    "value": table[m].to_numpy(),
                    "progress": np.asarray(prog, dtype=float),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def crossing_step(steps, values, threshold: float, direction: str, persist: int = PERSIST) -> float:
    """The first step at which `values` is past `threshold` (>= for "above", <= for
    "below") and stays past it for `persist` consecutive checkpoints (or up to the end
    of the run, if fewer are left); NaN if never (or if the threshold is NaN)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r} is not one of {DIRECTIONS}")
    if persist < 1:
        raise ValueError(f"persist = {persist} must be at least 1")
    if threshold is None or not np.isfinite(threshold):
        return math.nan
    v = np.asarray(values, dtype=float)
    past = (v >= threshold) if direction == "above" else (v <= threshold)  # NaN compares False
    for i in range(len(v)):
        if past[i : i + persist].all():
            return float(np.asarray(steps)[i])
    return math.nan


def lead_times(
    table: pd.DataFrame,
    drop_step: int | float | None,
    thresholds: dict[str, tuple[float, str]] | None = None,
    persist: int = PERSIST,
) -> pd.DataFrame:
    """One row per measure of `table` (`progress_table`): when it crosses its threshold, and
    how long before the drop (`drop_step`, None / NaN: no drop). thresholds: measure ->
    (value, "above" | "below"), others `default_thresholds`. Columns: measure, threshold,
    direction, first, extreme, cross_step (NaN if never), resolution (gap from the previous
    checkpoint), lead_time = drop_step − cross_step (> 0: the measure moved first).
    """
    if "step" not in table:
        raise ValueError("table has no 'step' column: pass the output of progress_table")
    table = table.sort_values("step").reset_index(drop=True)
    th = {**default_thresholds(table), **(thresholds or {})}
    unknown = [m for m in th if m not in table]
    if unknown:
        raise ValueError(f"thresholds name {unknown[0]!r}, which is not a column of the table")
    steps = table["step"].to_numpy()
    previous = np.concatenate([[0], steps[:-1]])  # training starts at step 0
    no_drop = drop_step is None or not np.isfinite(drop_step)
    rows = []
    for m, (value, direction) in th.items():
        first, extreme = excursion(table[m])
        cross = crossing_step(steps, table[m], value, direction, persist)
        res = float(cross - previous[steps == cross][0]) if np.isfinite(cross) else math.nan
        rows.append(
            {
                "measure": m,
                "threshold": value,
                "direction": direction,
                "first": first,
                "extreme": extreme,
                "cross_step": cross,
                "resolution": res,
                "lead_time": math.nan if no_drop or not np.isfinite(cross) else float(drop_step) - cross,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "measure",
            "threshold",
            "direction",
            "first",
            "extreme",
            "cross_step",
            "resolution",
            "lead_time",
        ],
    )


# ---- leads: leaving the plateau's own band, and staying out -------------------------------
#
# A lead (`plateau_leads`): a measure leaves the band it kept on the plateau, before the
# drop, for good. Of the steps before the drop, the first TRANSIENT are left out (training
# settles there); the band is mean ± K SD over the next BASELINE (at least FLOOR of the
# measure's range, so a constant measure cannot leave by rounding); the lead is the first
# later checkpoint before the drop outside the band for SUSTAIN checkpoints; BOOTSTRAP
# resamples of the baseline give its 5-95 % range and p_lead. A lead is thus at most
# (1 − TRANSIENT − BASELINE) of the plateau long.

TRANSIENT = 0.25  # share of the steps before the drop left out as the start of training
BASELINE = 0.25  # share of the steps before the drop over which the band is estimated
K = 3.0  # the band's half-width in standard deviations of the baseline
FLOOR = 0.05  # ... and at least this share of the measure's range over the run
SUSTAIN = 3  # checkpoints a departure must last
BOOTSTRAP = 200  # resamples of the baseline for the lead's uncertainty
MIN_BASELINE = 3  # fewer baseline checkpoints: no band, no lead


def plateau_band(
    steps,
    values,
    drop_step: float,
    k: float = K,
    transient: float = TRANSIENT,
    *,
    baseline: float = BASELINE,
    floor: float = FLOOR,
) -> tuple[float, float, float, float]:
    """(low, high, window_start, window_end): the measure's band on the plateau, mean ± k·SD
    over the checkpoints in [transient·drop, (transient + baseline)·drop), half-width at
    least floor × (the measure's range). NaNs when fewer than MIN_BASELINE checkpoints fall
    in the window."""
    steps, values = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    start, end = transient * drop_step, (transient + baseline) * drop_step
    base = values[(steps >= start) & (steps < end) & np.isfinite(values)]
    if len(base) < MIN_BASELINE:
        return math.nan, math.nan, start, end
    finite = values[np.isfinite(values)]
    half = max(k * float(base.std(ddof=1)), floor * float(finite.max() - finite.min()))
    return float(base.mean() - half), float(base.mean() + half), start, end


def departure_step(
    steps, values, low: float, high: float, *, after: float, before: float, sustain: int = SUSTAIN
) -> float:
    """The first checkpoint in [after, before) where `values` is outside [low, high] and stays
    outside for `sustain` consecutive checkpoints (those after `before` count for staying
    out, and fewer are asked for if the run ends first); NaN if none."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return math.nan
    steps, values = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    out = (values < low) | (values > high)  # NaN is inside: it says nothing
    for i in np.flatnonzero((steps >= after) & (steps < before)):
        if out[i : i + sustain].all():
            return float(steps[i])
    return math.nan


def plateau_leads(
    table: pd.DataFrame,
    drop_step: int | float | None,
    *,
    k: float = K,
    transient: float = TRANSIENT,
    baseline: float = BASELINE,
    floor: float = FLOOR,
    sustain: int = SUSTAIN,
    n_boot: int = BOOTSTRAP,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per measure of a progress table (the rule: the comment above): band_low,
    band_high, window_start, window_end, leaves_at (NaN if none), lead = drop − leaves_at,
    lead_lo, lead_hi (5 and 95 % over `n_boot` resamples, no lead counting 0), p_lead.
    Every lead is NaN without a drop."""
    columns = [
        "measure",
        "band_low",
        "band_high",
        "window_start",
        "window_end",
        "leaves_at",
        "lead",
        "lead_lo",
        "lead_hi",
        "p_lead",
    ]
    table = table.sort_values("step").reset_index(drop=True)
    if drop_step is None or not np.isfinite(drop_step):
        return pd.DataFrame(
            [{"measure": m, **{c: math.nan for c in columns[1:]}} for m in measures(table)], columns=columns
        )
    steps = table["step"].to_numpy(dtype=float)
    rng = np.random.default_rng(seed)
    rows = []
    for m in measures(table):
        values = table[m].to_numpy(dtype=float)
        low, high, start, end = plateau_band(
            steps, values, drop_step, k, transient, baseline=baseline, floor=floor
        )
        leaves = departure_step(steps, values, low, high, after=end, before=drop_step, sustain=sustain)
        boot = []
        in_window = (steps >= start) & (steps < end) & np.isfinite(values)
        if np.isfinite(low):
            finite = values[np.isfinite(values)]
            span = floor * float(finite.max() - finite.min())
            base = values[in_window]
            for _ in range(n_boot):
                b = rng.choice(base, size=len(base), replace=True)
                half = max(k * float(b.std(ddof=1)), span)
                d = departure_step(
                    steps,
                    values,
                    b.mean() - half,
                    b.mean() + half,
                    after=end,
                    before=drop_step,
                    sustain=sustain,
                )
                boot.append(float(drop_step) - d if np.isfinite(d) else 0.0)
        boot = np.asarray(boot)
        rows.append(
            {
                "measure": m,
                "band_low": low,
                "band_high": high,
                "window_start": start,
                "window_end": end,
                "leaves_at": leaves,
                "lead": float(drop_step) - leaves if np.isfinite(leaves) else math.nan,
                "lead_lo": float(np.percentile(boot, 5)) if len(boot) else math.nan,
                "lead_hi": float(np.percentile(boot, 95)) if len(boot) else math.nan,
                "p_lead": float((boot > 0).mean()) if len(boot) else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=columns)


def leaders(leads: pd.DataFrame, control: str = "L_mask") -> tuple[pd.DataFrame, float]:
    """The measures that lead (`plateau_leads`' rows with a lead that leave their band before
    the `control` leaves its own), longest lead first, and the step the control leaves its
    band (inf if it stays in until the drop)."""
    ctrl = leads.loc[leads["measure"] == control, "leaves_at"]
    ctrl_at = float(ctrl.iloc[0]) if len(ctrl) and np.isfinite(ctrl.iloc[0]) else math.inf
    lead = leads[(leads["measure"] != control) & (leads["lead"] > 0) & (leads["leaves_at"] < ctrl_at)]
    return lead.sort_values("lead", ascending=False), ctrl_at


def plateau_lead_summary(
    leads: pd.DataFrame, drop_step: int | None, steps: int, resolution: int, control: str = "L_mask"
) -> str:
    """One sentence for the book: which measures leave their plateau band for good before the
    loss does (`plateau_leads`), by how much and how sure; also without a drop."""
    if drop_step is None or (isinstance(drop_step, float) and not np.isfinite(drop_step)):
        return (
            f"There is no drop within the {steps:,} steps of this run, so there is nothing to lead: "
            "the lead times are undefined, and the curves only show how far each measure moved"
        )
    lead, ctrl_at = leaders(leads, control)
    gone = leads[~np.isfinite(leads["band_low"])]
    no_band = gone["measure"].tolist()
    ctrl_text = (
        "the loss itself has no band to leave"
        if control in no_band
        else f"the loss itself leaves its band at step {ctrl_at:,.0f}"
        if np.isfinite(ctrl_at)
        else "the loss itself stays in its band until the drop"
    )
    short = (
        f"; no plateau band (fewer than {MIN_BASELINE} checkpoints between steps "
        f"{gone['window_start'].iloc[0]:,.0f} and {gone['window_end'].iloc[0]:,.0f}) for {', '.join(no_band)}"
        if no_band
        else ""
    )
    if lead.empty:
        return (
            f"No measure leaves its plateau band for good before the loss does ({ctrl_text}, the drop is at "
            f"step {drop_step:,}; checkpoints at most {resolution:,} steps apart){short}"
        )
    parts = [
        f"{r.measure} by {r.lead:,.0f} steps (bootstrap 5-95 %: {r.lead_lo:,.0f} to {r.lead_hi:,.0f}; a "
        "lead in "
        f"{r.p_lead:.0%} of the resamples)"
        for r in lead.itertuples()
    ]
    return (
        f"{len(lead)} measure{'s' if len(lead) > 1 else ''} leave{'' if len(lead) > 1 else 's'} "
        f"{'their' if len(lead) > 1 else 'its'} plateau "
        f"band for good before the loss does ({ctrl_text}, the drop is at step {drop_step:,}; checkpoints at "
        f"most {resolution:,} steps apart): " + "; ".join(parts) + short
    )
