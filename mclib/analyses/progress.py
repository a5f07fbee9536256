"""Progress measures over training: can the drop be seen coming?

The paper leaves open whether the sudden drop of the loss can be predicted. This module
puts every scalar measure of a run on the same footing, one value per saved checkpoint
(`progress_table`), and asks of each one when it moved (it crosses a threshold half-way
along its largest move, `lead_times`) and whether it leads the drop (it leaves the band it
kept on the plateau for good before the drop does, `plateau_leads`; see the comment there).

Measures (columns of `progress_table`):

    max_row_excess, max_column_excess   the most row- / column-structured head
                                        (heads.head_scores; 0 uniform, 1 pure)
    attention_entropy                   mean over heads of the attention entropy (nats;
                                        log(n²) for uniform heads)
    column_silhouette                   position embeddings grouped by column (E14)
    token_alignment                     token embeddings vs the final checkpoint's PCA
                                        plane (E13; 1 at the final checkpoint by
                                        construction: it knows the end of the run)
    grad_attention, grad_mlp, grad_positional, grad_token, grad_other
                                        ℓ2 norm of the training loss's gradient per
                                        component group (interventions.component_groups)
    L_mask                              the control: the training L_mask, mean over the
                                        `find_drop` window ending at the checkpoint

The threshold rule (`default_thresholds`), the same for every measure: a measure has
crossed once it has made half of its largest move away from its first value, i.e. it
is past first + ½(extreme − first), where the extreme is the value farthest from the
first one. For a measure that moves one way this is half-way between its first and last
values; for one that peaks and comes back (gradient norms often peak at the drop) it is
half-way up the peak, where "half-way to the last value" would be crossed at once or
never. What is fair about it, and what is not:

- one rule for all, with no knob tuned per measure, and the loss itself (L_mask) goes
  through the same rule: its crossing sits at the drop (half of its move is about
  `find_drop`'s threshold, half the copying plateau), so it calibrates the rest. A
  measure leads only if it crosses earlier than L_mask does.
- it uses hindsight: the extreme (and token_alignment's reference) is known only once
  the run is over. A lead time says a measure moves first, not that a threshold fixed
  in advance would have raised an alarm.
- half-way is a midpoint: a measure that drifts steadily over the whole run crosses in
  the middle of training whatever the loss does; a lead means something only when the
  measure is flat before it moves (look at the curves, not only at the number).
- a crossing must hold for `persist` consecutive checkpoints (default 2; fewer if the
  run ends first), so one noisy checkpoint does not make a lead. The step reported is
  the first of them: persistence filters, it does not delay.

Resolution: measures exist only at saved checkpoints (every `train.save_every` steps),
so a crossing at checkpoint s happened somewhere in (previous checkpoint, s]. The lead
time drop − s is a lower bound; the true one is less than `resolution` (the gap to the
previous checkpoint) larger. `find_drop` itself is per step, but its trailing mean puts
it up to half its window after the unsmoothed fall.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from .interventions import component_groups
from ..core.config import DataConfig
from ..core.metrics import DROP_FRACTION, DROP_WINDOW, losses

GROUP_ORDER = ("attention", "mlp", "positional", "token", "other")
DIRECTIONS = ("above", "below")
PERSIST = 2          # checkpoints a crossing must hold for


# ---- the measures -------------------------------------------------------------------

def gradient_norms(run_dir: str | Path, data: DataConfig, n_matrices: int = 64, seed: int = 0) -> pd.DataFrame:
    """ℓ2 norm of the gradient of the training loss (pooled MSE over all entries, L of
    mclib.core.metrics.losses) per component group, at every saved checkpoint, on one fixed
    batch (`sample_eval_batch(data, n_matrices, seed)`; data: a Profile or DataConfig).

    Tidy: columns step, group, grad_norm; the groups are GROUP_ORDER (every parameter
    that receives a gradient belongs to exactly one; the frozen token-type row none)
    plus "total" (the norm over all of them).
    """
    from .evaluate import sample_eval_batch
    from ..core.checkpoints import load_checkpoint, saved_steps

    steps = saved_steps(Path(run_dir))
    if not steps:
        raise ValueError(f"run_dir {str(run_dir)!r} has no saved checkpoint")
    batch = sample_eval_batch(data, n_matrices, seed)
    rows = []
    for step in steps:
        model = load_checkpoint(run_dir, step)  # on the run's device; eval mode: dropout off (the profiles use 0 anyway)
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


def loss_at_checkpoints(metrics: pd.DataFrame, steps, column: str = "L_mask",
                        window: int = DROP_WINDOW) -> pd.Series:
    """`column` averaged over the `window` steps ending at each of `steps` (the same
    trailing mean as `find_drop`), indexed by step."""
    smooth = metrics.set_index("step")[column].rolling(window, min_periods=1).mean()
    return smooth.reindex(list(steps)).rename(column)


def progress_table(run_dir: str | Path, data: DataConfig, n_matrices: int = 64, seed: int = 0) -> pd.DataFrame:
    """One row per saved checkpoint: step and the measures listed in the module
    docstring (head scores and gradients on one fixed batch of `n_matrices`)."""
    from .embeddings import embedding_progress
    from .heads import attention_progress
    from ..core.runs import load_metrics

    heads = attention_progress(run_dir, data, n_matrices, seed)
    table = heads.groupby("step").agg(max_row_excess=("row_excess", "max"),
                                      max_column_excess=("column_excess", "max"),
                                      attention_entropy=("entropy", "mean"))
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
    """measure -> (value, direction): `frac` of the way from the measure's first value
    to its extreme, "above" if the extreme is above the first value, else "below". The
    default is the drop's own fraction, so that L_mask, falling from about E[X²] to about
    0, crosses where `find_drop` puts the drop (the calibration of the module docstring).
    A measure that never moves gets (NaN, "above"): it never crosses."""
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
        frames.append(pd.DataFrame({"step": table["step"].to_numpy(), "measure": m,
                                    "value": table[m].to_numpy(), "progress": np.asarray(prog, dtype=float)}))
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
        if past[i: i + persist].all():
            return float(np.asarray(steps)[i])
    return math.nan


def lead_times(table: pd.DataFrame, drop_step: int | float | None,
               thresholds: dict[str, tuple[float, str]] | None = None,
               persist: int = PERSIST) -> pd.DataFrame:
    """One row per measure: when it crosses its threshold, and how long before the drop.

    table: one row per checkpoint, a `step` column and one column per measure
    (`progress_table`). drop_step: `find_drop`'s step, None / NaN if there is no drop.
    thresholds: measure -> (value, "above" | "below"); measures not named get
    `default_thresholds` (half of the largest move from the first value).
    Columns: measure, threshold, direction, first, extreme, cross_step (NaN if never),
    resolution (the gap from the previous checkpoint to cross_step: the crossing happened
    within it), lead_time = drop_step − cross_step (NaN if never crossed or no drop;
    > 0 means the measure moved first; a lower bound, the true lead is less than
    `resolution` larger).
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
        rows.append({"measure": m, "threshold": value, "direction": direction, "first": first,
                     "extreme": extreme, "cross_step": cross, "resolution": res,
                     "lead_time": math.nan if no_drop or not np.isfinite(cross) else float(drop_step) - cross})
    return pd.DataFrame(rows, columns=["measure", "threshold", "direction", "first", "extreme", "cross_step",
                                       "resolution", "lead_time"])


# ---- leads: leaving the plateau's own band, and staying out -------------------------------
#
# The half-way crossing above says when a measure moved, in hindsight. It is not a lead:
# gradient norms move most in the first few thousand steps, and one noisy checkpoint can
# sit past any threshold. A lead (`plateau_leads`) asks instead whether a measure leaves
# the range it kept on the plateau, before the drop, for good:
#
#   1. the start of training is left out: the first TRANSIENT of the steps before the
#      drop (weights and gradients settle there, whatever happens later);
#   2. the band is the measure's mean ± K standard deviations over the next BASELINE of
#      those steps (its noise on the plateau), widened to at least FLOOR of the measure's
#      whole range (a measure that is constant on the plateau would otherwise "leave" by
#      rounding);
#   3. a lead is the first checkpoint after that window, before the drop, where the measure
#      is outside the band and stays outside for SUSTAIN consecutive checkpoints (through
#      the drop and after, if that is where they are): one spike is not a lead;
#   4. its uncertainty: the band is re-estimated from BOOTSTRAP resamples of the baseline
#      checkpoints; the lead's 5-95 % range over resamples, and the share of resamples
#      in which there is a lead at all (p_lead).
#
# A lead found this way is at most (1 − TRANSIENT − BASELINE) of the plateau long: a
# measure that leaves inside the baseline window widens its own band instead. And it is
# bounded by the checkpoints, as the crossing is (`resolution`).

TRANSIENT = 0.25   # share of the steps before the drop left out as the start of training
BASELINE = 0.25    # share of the steps before the drop over which the band is estimated
K = 3.0            # the band's half-width in standard deviations of the baseline
FLOOR = 0.05       # ... and at least this share of the measure's range over the run
SUSTAIN = 3        # checkpoints a departure must last
BOOTSTRAP = 200    # resamples of the baseline for the lead's uncertainty
MIN_BASELINE = 3   # fewer baseline checkpoints: no band, no lead


def plateau_band(steps, values, drop_step: float, k: float = K, transient: float = TRANSIENT,
                 *, baseline: float = BASELINE, floor: float = FLOOR) -> tuple[float, float, float, float]:
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


def departure_step(steps, values, low: float, high: float, *, after: float, before: float,
                   sustain: int = SUSTAIN) -> float:
    """The first checkpoint in [after, before) where `values` is outside [low, high] and stays
    outside for `sustain` consecutive checkpoints (those after `before` count for staying
    out, and fewer are asked for if the run ends first); NaN if none."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return math.nan
    steps, values = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    out = (values < low) | (values > high)  # NaN is inside: it says nothing
    for i in np.flatnonzero((steps >= after) & (steps < before)):
        if out[i: i + sustain].all():
            return float(steps[i])
    return math.nan


def plateau_leads(table: pd.DataFrame, drop_step: int | float | None, *, k: float = K, transient: float = TRANSIENT,
                  baseline: float = BASELINE, floor: float = FLOOR, sustain: int = SUSTAIN,
                  n_boot: int = BOOTSTRAP, seed: int = 0) -> pd.DataFrame:
    """One row per measure of a progress table: its plateau band (band_low, band_high, from
    the baseline window [window_start, window_end)), the first sustained departure from it
    before the drop (leaves_at, NaN if none), lead = drop − leaves_at, and its uncertainty
    from `n_boot` bootstrap resamples of the baseline checkpoints: lead_lo, lead_hi (5 and
    95 % of the resamples' leads, a resample without a lead counting as 0) and p_lead (the
    share of resamples with a lead). Every lead is NaN without a drop. See the comment above
    for the rule."""
    columns = ["measure", "band_low", "band_high", "window_start", "window_end", "leaves_at", "lead", "lead_lo",
               "lead_hi", "p_lead"]
    table = table.sort_values("step").reset_index(drop=True)
    if drop_step is None or not np.isfinite(drop_step):
        return pd.DataFrame([{"measure": m, **{c: math.nan for c in columns[1:]}} for m in measures(table)],
                            columns=columns)
    steps = table["step"].to_numpy(dtype=float)
    rng = np.random.default_rng(seed)
    rows = []
    for m in measures(table):
        values = table[m].to_numpy(dtype=float)
        low, high, start, end = plateau_band(steps, values, drop_step, k, transient, baseline=baseline, floor=floor)
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
                d = departure_step(steps, values, b.mean() - half, b.mean() + half, after=end, before=drop_step, sustain=sustain)
                boot.append(float(drop_step) - d if np.isfinite(d) else 0.0)
        boot = np.asarray(boot)
        rows.append({"measure": m, "band_low": low, "band_high": high, "window_start": start, "window_end": end,
                     "leaves_at": leaves, "lead": float(drop_step) - leaves if np.isfinite(leaves) else math.nan,
                     "lead_lo": float(np.percentile(boot, 5)) if len(boot) else math.nan,
                     "lead_hi": float(np.percentile(boot, 95)) if len(boot) else math.nan,
                     "p_lead": float((boot > 0).mean()) if len(boot) else math.nan})
    return pd.DataFrame(rows, columns=columns)


def leaders(leads: pd.DataFrame, control: str = "L_mask") -> tuple[pd.DataFrame, float]:
    """The measures that lead (`plateau_leads`' rows with a lead that leave their band before
    the `control` leaves its own), longest lead first, and the step the control leaves its
    band (inf if it stays in until the drop)."""
    ctrl = leads.loc[leads["measure"] == control, "leaves_at"]
    ctrl_at = float(ctrl.iloc[0]) if len(ctrl) and np.isfinite(ctrl.iloc[0]) else math.inf
    lead = leads[(leads["measure"] != control) & (leads["lead"] > 0) & (leads["leaves_at"] < ctrl_at)]
    return lead.sort_values("lead", ascending=False), ctrl_at


def plateau_lead_summary(leads: pd.DataFrame, drop_step: int | None, steps: int, resolution: int,
                         control: str = "L_mask") -> str:
    """One sentence for the book: which measures leave their plateau band, for good, before
    the loss does (`plateau_leads`), by how much and how sure (the bootstrap's range and
    p_lead). Reads correctly with and without a drop."""
    if drop_step is None or (isinstance(drop_step, float) and not np.isfinite(drop_step)):
        return (f"There is no drop within the {steps:,} steps of this run, so there is nothing to lead: "
                "the lead times are undefined, and the curves only show how far each measure moved")
    lead, ctrl_at = leaders(leads, control)
    gone = leads[~np.isfinite(leads["band_low"])]
    no_band = gone["measure"].tolist()
    ctrl_text = ("the loss itself has no band to leave" if control in no_band else
                 f"the loss itself leaves its band at step {ctrl_at:,.0f}" if np.isfinite(ctrl_at)
                 else "the loss itself stays in its band until the drop")
    short = (f"; no plateau band (fewer than {MIN_BASELINE} checkpoints between steps "
             f"{gone['window_start'].iloc[0]:,.0f} and {gone['window_end'].iloc[0]:,.0f}) for {', '.join(no_band)}"
             if no_band else "")
    if lead.empty:
        return (f"No measure leaves its plateau band for good before the loss does ({ctrl_text}, the drop is at "
                f"step {drop_step:,}; checkpoints at most {resolution:,} steps apart){short}")
    parts = [f"{r.measure} by {r.lead:,.0f} steps (bootstrap 5-95 %: {r.lead_lo:,.0f} to {r.lead_hi:,.0f}; a lead in "
             f"{r.p_lead:.0%} of the resamples)" for r in lead.itertuples()]
    return (f"{len(lead)} measure{'s' if len(lead) > 1 else ''} leave{'' if len(lead) > 1 else 's'} "
            f"{'their' if len(lead) > 1 else 'its'} plateau "
            f"band for good before the loss does ({ctrl_text}, the drop is at step {drop_step:,}; checkpoints at "
            f"most {resolution:,} steps apart): " + "; ".join(parts) + short)
