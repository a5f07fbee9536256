"""E15, component re-initialisation: one training run per component group.

For each group of `mclib.analyses.interventions.GROUPS` ("attention", "mlp", "positional",
"token") the post checkpoint of the main run (`mclib.core.placement.checkpoint_steps`: its last
step) is copied, that group is re-initialised with BERT's own init and trained, every
other parameter loaded from the post checkpoint and frozen (`reinit_component`). Each run
is an ordinary run folder:

    run_dir/freeze/GROUP/{profile.yaml, metrics.csv, checkpoints/, source.json, end.json}
    (`mclib.core.runs.freeze_dir`; source.json: `runs.FREEZE_SOURCE`)

so it resumes after an interruption and returns at once when complete, like the main
run. `source.json` names the checkpoint the run started from; a folder started from
another checkpoint (e.g. the main run was trained further since) is refused rather
than silently continued.

How long an E15 run trains: until what chapter 05 reads of it is known, and no longer.
Its rows read the drop step, the plateau over the fall (`mclib.analyses.sharpness.shape`)
and the final L_mask over the main run's (recovered below `SETTLE`). A run that has
dropped stops at the first of:
- its rows are known (`rows_known`): at least `train.patience` steps past its drop, its
  final L_mask over the main run's lies below SETTLE·(1 − KNOWN_MARGIN) at two standard
  errors, and its plateau over its fall below ABRUPT·(1 − KNOWN_MARGIN). More training only
  lowers the final level, which moves the fall's end later, so neither verdict can change
  after this (the scorecard's interval and margin for a direction, `KNOWN_MARGIN`);
- it has converged by the main run's own rule (`mclib.core.metrics.converged`: the fitted
  slope of L_mask over `train.patience` steps against `train.min_improvement` per 1 000
  steps): the run that does not recover is seen to level off, not assumed to.
A run that has not dropped by the main run's drop step stops there (it has sat on the
plateau as long as the main run did). `analysis.freeze_steps` caps every run
(`freeze_steps`). `freeze_ends` says, per group, which of these ended the run.

    runs = freeze_runs(cfg, run_dir)          # {group: folder}, trains what is missing
    table = freeze_summary(runs, cfg)          # steps to the drop, losses
    ends = freeze_ends(cfg, run_dir)           # {group: FreezeEnd}: known / converged / main drop / cap
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..core.config import Profile
from ..core.data import copy_level
from ..core.paper import PAPER_E15_ORDER
from .interventions import GROUPS, component_groups, reinit_component
from .margins import MARGINS
from .sharpness import ABRUPT, SETTLE, shape
from ..core.checkpoints import load_checkpoint, saved_steps
from ..core.ending import is_complete
from ..core.metrics import DROP_WINDOW, PLATEAU_BAND, converged, end_slope, final_level, find_drop, rows_curve
from ..core.placement import checkpoint_steps
from ..core.runs import FREEZE_SOURCE, freeze_dir, load_metrics
from ..core.train import train

# What each group holds (the patterns are mclib.analyses.interventions.GROUPS; layer norms and the
# read-out belong to no group and stay frozen). What the paper saw: mclib.core.paper.PAPER_E15.
DESCRIPTIONS = {
    "attention": "query, key, value and output projection of every layer",
    "mlp": "both feed-forward projections of every layer",
    "positional": "the position-embedding table",
    "token": "the token-embedding table",
}


def main_drop(cfg: Profile, run_dir: str | Path) -> int | None:
    """The main run's drop step (`find_drop` on its metrics.csv; None: no drop)."""
    return find_drop(load_metrics(run_dir), rank=cfg.data.rank)


def freeze_steps(cfg: Profile) -> int:
    """How many steps an E15 run may train at most: the cap `analysis.freeze_steps`."""
    return cfg.analysis.freeze_steps


# The margin by which a row's interval must clear its cut-off before its run may stop: the
# scorecard's margin for a direction, the one number both read (mclib.analyses.margins).
KNOWN_MARGIN = MARGINS["direction"]


@dataclass
class Yardstick:
    """The main run's final L_mask and its standard error (`final_level` over the
    convergence rule's window), read where the E15 runs start from: what an E15 run's final
    level is divided by."""
    final: float
    se: float


def yardstick(cfg: Profile, run_dir: str | Path, source_step: int | None = None) -> Yardstick:
    """The main run's `Yardstick` up to `source_step` (default: its post checkpoint, where
    the E15 runs start)."""
    step = checkpoint_steps(run_dir, cfg).post if source_step is None else source_step
    m = load_metrics(run_dir)
    return Yardstick(*final_level(m[m["step"] <= step], cfg.train.patience))


def recovery(metrics: pd.DataFrame, window: int, main: Yardstick) -> tuple[float, float]:
    """An E15 run's final L_mask over the main run's, with its standard error (both runs'
    errors in quadrature): the ratio chapter 05's recovery row reads. NaN where either
    level is missing."""
    final, se = final_level(metrics, window)
    if not (main.final > 0 and math.isfinite(final) and final > 0):
        return float("nan"), float("nan")
    ratio = final / main.final
    return ratio, ratio * math.hypot(se / final, main.se / main.final)


def plateau_over_fall(metrics: pd.DataFrame, rank: int) -> float | None:
    """The plateau over the fall that chapter 05's row reads: None without a drop, 0 for a
    run that never sat on the copying level before its drop."""
    if find_drop(metrics, rank=rank) is None:
        return None
    s = shape(metrics, rank)
    return 0.0 if s is None else s.plateau / max(1, s.fall)


def known_text() -> str:
    """`rows_known`'s test in words, for the book (the run's ending and chapter 05's caption)."""
    return (f"final L_mask under {SETTLE * (1 - KNOWN_MARGIN):g}x the main run's at two standard errors, "
            f"plateau over fall under {ABRUPT * (1 - KNOWN_MARGIN):g}")


def rows_known(metrics: pd.DataFrame, cfg: Profile, main: Yardstick) -> bool:
    """Whether an E15 run's rows can no longer change with more training (the module's
    doc): dropped at least `train.patience` steps ago, recovered below SETTLE·(1 −
    KNOWN_MARGIN) at two standard errors, plateau over fall below ABRUPT·(1 − KNOWN_MARGIN)."""
    drop = find_drop(metrics, rank=cfg.data.rank)
    window = cfg.train.patience
    if drop is None or int(metrics["step"].iloc[-1]) < drop + window:
        return False
    ratio, se = recovery(metrics, window, main)
    if not (math.isfinite(ratio) and ratio + 2 * se < SETTLE * (1 - KNOWN_MARGIN)):
        return False
    return plateau_over_fall(metrics, cfg.data.rank) < ABRUPT * (1 - KNOWN_MARGIN)


def freeze_stop(cfg: Profile, main: int | None, known: Yardstick | None = None):
    """The `stop` of an E15 run: true once its rows are known (`rows_known`, against the
    main run's `known` yardstick; None: not this rule), or once it has trained `main` steps
    (the main run's drop step; None: not this rule) without dropping. None when neither
    rule applies (the cap and the convergence rule alone end it)."""
    if main is None and known is None:
        return None
    rank = cfg.data.rank

    def stop(rows: list[dict]) -> bool:
        curve = rows_curve(rows)  # asked at every flush: the rows made a curve once
        if main is not None and rows[-1]["step"] >= main and find_drop(curve, rank=rank) is None:
            return True
        return known is not None and rows_known(curve, cfg, known)
    return stop


def freeze_profile(cfg: Profile, group: str) -> Profile:
    """The main profile, trained until it converges by the main profile's rule
    (`train.until: converged`, its `patience` and `min_improvement`), at most
    `freeze_steps(cfg)` steps. Same data, model, optimiser and seed (so the data stream is
    the main run's); its fixed checkpoints are those of the main profile that fall within
    the cap, and the cap. The name says which group is trained.
    """
    if group not in GROUPS:
        raise ValueError(f"group {group!r} is not one of {', '.join(GROUPS)}")
    steps = freeze_steps(cfg)
    ck = cfg.checkpoints
    return cfg.replace(**{
        "name": f"{cfg.name}-freeze-{group}",
        "train.steps": steps,
        "train.until": "converged",
        "checkpoints.place": "fixed",
        "checkpoints.pre": min(ck.pre, steps),
        "checkpoints.transition": [s for s in ck.transition if s <= steps],
        "checkpoints.post": steps,
    })


def _check_source(folder: Path, source: dict) -> None:
    path = folder / FREEZE_SOURCE
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved != source:
            raise ValueError(f"{folder} was started from {saved}, not {source}; delete the folder to redo it")
    elif saved_steps(folder):
        raise ValueError(f"{folder} has checkpoints but no {FREEZE_SOURCE}; delete the folder to redo it")


def _source(cfg: Profile, run_dir: str | Path, group: str, source_step: int | None = None,
            seed: int | None = None) -> dict:
    step = checkpoint_steps(run_dir, cfg).post if source_step is None else source_step
    return {"step": step, "group": group, "seed": cfg.seed if seed is None else seed}


def freeze_run(cfg: Profile, run_dir: str | Path, group: str, source_step: int | None = None,
               seed: int | None = None, *, progress: bool = False, deadline: float | None = None) -> Path:
    """Train (or resume, or find complete) the E15 run of one group; returns its folder.

    source_step: the main run's checkpoint to start from (default: its post checkpoint,
    `mclib.core.placement.checkpoint_steps`). seed: of the re-initialisation (default: the
    profile's seed). The run ends once converged after its drop, at the main run's drop
    step without a drop, once its rows are known, or at the cap `freeze_steps` (the module's doc); deadline (a
    `time.time()`, a GPU lease's slice): it is cut there, resumable (`train`).
    """
    run_dir = Path(run_dir)
    folder, source = freeze_dir(run_dir, group), _source(cfg, run_dir, group, source_step, seed)
    _check_source(folder, source)
    # re-initialised on the CPU, whatever the run's device: the same fresh weights everywhere
    model = reinit_component(load_checkpoint(run_dir, source["step"], device="cpu"), group, source["seed"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FREEZE_SOURCE).write_text(json.dumps(source))
    return train(freeze_profile(cfg, group), folder, progress=progress,
                 stop=freeze_stop(cfg, main_drop(cfg, run_dir), yardstick(cfg, run_dir, source["step"])),
                 init_model=model, newest_only=True,  # the book reads its metrics and end
                 deadline=deadline)


# The order E15's runs are handed to the workers: the paper's latest drop first
# (mclib.core.paper.PAPER_E15_ORDER reversed), so that the longest run does not start last
# and the runs end close together. Only the schedule depends on it, not a run's numbers.
LONGEST_FIRST = tuple(g for tier in reversed(PAPER_E15_ORDER) for g in tier)


def pending_groups(cfg: Profile, run_dir: str | Path, groups=LONGEST_FIRST) -> list[str]:
    """The groups whose E15 run is not complete, in the order of `groups` (each folder's
    source is checked, also for a complete run, which is then skipped)."""
    for g in groups:
        _check_source(freeze_dir(run_dir, g), _source(cfg, run_dir, g))
    stop = freeze_stop(cfg, main_drop(cfg, run_dir), yardstick(cfg, run_dir))
    return [g for g in groups if not is_complete(freeze_profile(cfg, g), freeze_dir(run_dir, g), stop)]


def freeze_runs(cfg: Profile, run_dir: str | Path, groups=tuple(GROUPS), cluster: str | None = None) -> dict[str, Path]:
    """`freeze_run` for every group that is not complete, side by side on a Dask cluster
    (`mclib.core.jobs.run_profile_jobs`; cluster: its address, default the local one or
    $MCLIB_CLUSTER): {group: folder}, in the order of `groups`. Nothing starts when all
    are complete."""
    from ..core.jobs import run_profile_jobs

    pending = pending_groups(cfg, run_dir, sorted(groups, key=LONGEST_FIRST.index))
    from ..core.precision import with_device

    cfg = with_device(cfg)  # resolved once, here: every worker trains where this process chose
    run_profile_jobs(cfg, freeze_run, [(cfg, run_dir, g) for g in pending], cluster)
    return {g: freeze_dir(run_dir, g) for g in groups}


FREEZE_ENDINGS = ("known", "converged", "main drop", "cap", "unfinished")


@dataclass
class FreezeEnd:
    """How one E15 run ended (`freeze_end`).

    ended: "known"       it dropped (at `drop`) and its rows were known at `steps` (`rows_known`)
           "converged"   it dropped (at `drop`) and then converged by the main run's rule (at `steps`)
           "main drop"   it trained as many steps as the main run took to drop
                         (`main_drop`) without dropping
           "cap"         it reached `analysis.freeze_steps` before either
           "unfinished"  none of these yet (not trained, or cut)
    slope, slope_se: how fast L_mask still moved over the rule's window at the end
    (relative change per 1 000 steps and its standard error, `end_slope`).
    """
    group: str
    ended: str
    steps: int              # steps it trained
    drop: int | None        # its own drop
    main_drop: int | None   # the main run's drop step
    cap: int                # analysis.freeze_steps
    slope: float = float("nan")
    slope_se: float = float("nan")

    @property
    def text(self) -> str:
        """One phrase for the book: "dropped at step 310 and converged at step 2,900",
        "reached the main run's drop step 10,985 without dropping", "dropped at step 310,
        then reached the cap of 4,000 steps while L_mask still changed by -9.1% ± 2.0%
        per 1,000 steps"."""
        still = (f" while L_mask still changed by {self.slope:+.1%} ± {self.slope_se:.1%} per 1,000 steps"
                 if math.isfinite(self.slope) else "")
        if self.ended == "known":
            return (f"dropped at step {self.drop:,} and stopped at step {self.steps:,}, once its rows were known "
                    f"({known_text()})")
        if self.ended == "converged":
            return f"dropped at step {self.drop:,} and converged at step {self.steps:,}"
        if self.ended == "main drop":
            return f"reached the main run's drop step {self.main_drop:,} without dropping"
        if self.ended == "cap" and self.drop is not None:
            return f"dropped at step {self.drop:,}, then reached the cap of {self.cap:,} steps{still}"
        if self.ended == "cap":
            main = (f"the main run dropped at step {self.main_drop:,}" if self.main_drop is not None
                    else "the main run did not drop")
            return f"reached the cap of {self.cap:,} steps without dropping ({main})"
        return f"unfinished after {self.steps:,} steps"


def freeze_end(group: str, metrics: pd.DataFrame, cfg: Profile, main: int | None,
               known: Yardstick | None = None) -> FreezeEnd:
    """How an E15 run of `cfg` with these `metrics` (one row per step trained) ended, given
    the main run's drop step `main` (None: none) and its `Yardstick` (None: the rows-known
    rule did not apply): the rule of the module docstring read back from the curve."""
    t, rank, cap = cfg.train, cfg.data.rank, freeze_steps(cfg)
    steps = int(metrics["step"].max()) if len(metrics) else 0
    drop = find_drop(metrics, rank=rank) if len(metrics) else None
    done = converged(metrics, rank, t.patience, t.min_improvement) if drop is not None else None
    if done is not None:
        ended = "converged"
    elif drop is not None and known is not None and rows_known(metrics, cfg, known):
        ended = "known"
    elif drop is None and main is not None and steps >= main:
        ended = "main drop"
    elif steps >= cap:
        ended = "cap"
    else:
        ended = "unfinished"
    slope, se = end_slope(metrics, t.patience) if len(metrics) else (float("nan"), float("nan"))
    return FreezeEnd(group, ended, steps, drop, main, cap, slope, se)


def freeze_ends(cfg: Profile, run_dir: str | Path, groups=tuple(GROUPS)) -> dict[str, FreezeEnd]:
    """{group: FreezeEnd} for the E15 runs of the main run in `run_dir`, read from their
    folders (trains nothing): which of "converged", "reached the main run's drop step
    without dropping", "its rows were known" or "reached the cap" ended each run (`FreezeEnd.text`)."""
    main, out, known_at = main_drop(cfg, run_dir), {}, {}
    for g in groups:
        folder = freeze_dir(run_dir, g)
        source = folder / FREEZE_SOURCE  # the step it started from: where its yardstick is read
        step = json.loads(source.read_text())["step"] if source.is_file() else None
        if step not in known_at:  # the runs share their source step: the main run's metrics read once
            known_at[step] = yardstick(cfg, run_dir, step)
        known = known_at[step]
        steps = saved_steps(folder)
        m = load_metrics(folder) if steps else pd.DataFrame({"step": [], "L_mask": []})
        m = m[m["step"] <= (steps[-1] if steps else 0)]
        out[g] = freeze_end(g, m, cfg, main, known)
    return out


def trainable_count(model, group: str) -> int:
    """Number of parameters in `group` (what an E15 run trains)."""
    groups = component_groups(model)
    return sum(p.numel() for name, p in model.named_parameters() if groups[name] == group)


def freeze_summary(runs: dict[str, Path], cfg: Profile, window: int = DROP_WINDOW, read=load_metrics) -> pd.DataFrame:
    """One row per group: the drop (`find_drop`, <NA> if none), the steps trained, the
    plateau and the fall around the drop (`mclib.analyses.sharpness.shape`, in steps; <NA>
    without a drop; plateau 0 when the run never sat on the copying level), L_mask over
    its first `window` steps and whether that is on the copying plateau (within
    PLATEAU_BAND of E[X²]), and where it ended: L_mask and L_obs over the last
    `train.patience` steps (the convergence rule's window), L_mask with its standard error
    (`final_level`). read: how a folder's metrics are read (default `load_metrics`; runs merged
    from GPU leases hold them gzipped, and their reader is passed here)."""
    plateau, tail = copy_level(cfg.data.rank), cfg.train.patience
    rows = []
    for group, folder in runs.items():
        m = read(folder)
        drop = find_drop(m, rank=cfg.data.rank, window=window)
        s = shape(m, cfg.data.rank) if drop is not None else None
        final, final_se = final_level(m, tail)
        first = float(m.head(window)["L_mask"].mean())
        rows.append({
            "group": group,
            "steps": int(m["step"].max()),
            "drop": drop,
            "plateau": None if drop is None else (0 if s is None else s.plateau),
            "fall": None if drop is None else (None if s is None else s.fall),
            "first_L_mask": first,
            "final_L_mask": final,
            "final_L_mask_se": final_se,
            "final_L_obs": final_level(m, tail, "L_obs")[0],
            "starts_on_plateau": bool(abs(first / plateau - 1) < PLATEAU_BAND),
        })
    table = pd.DataFrame(rows)
    for c in ("drop", "plateau", "fall"):  # a missing value is <NA>, not a float NaN
        table[c] = pd.array([r[c] for r in rows], dtype="Int64")
    return table


def _drop(d) -> int | None:
    return None if d is None or pd.isna(d) else int(d)


def drop_text(drop: int | None, steps: int) -> str:
    """"drop at step 1,234" or "no drop by step N" (drop None or NA)."""
    drop = _drop(drop)
    return f"drop at step {drop:,}" if drop is not None else f"no drop by step {steps:,}"


def paper_pattern(table: pd.DataFrame, order=PAPER_E15_ORDER) -> dict[str, bool]:
    """The two ends of the paper's order of the drops (`order`: tiers of groups, earliest
    first, `mclib.core.paper.PAPER_E15_ORDER`), checked strictly, without the scorecard's
    margin, on `freeze_summary`'s table (a run with no drop counts as dropping after
    every run that did):
    first_tier_first  every run of the first tier (mlp, token) drops, before every run of a later tier
    last_tier_last    every run of the last tier (positional) drops after every run of an
                      earlier tier (or they alone never drop)
    """
    inf = float("inf")
    key = {g: inf if _drop(d) is None else _drop(d) for g, d in zip(table["group"], table["drop"])}
    first, last = order[0], order[-1]
    fast = [key.get(g, inf) for g in first]
    later = [key.get(g, inf) for tier in order[1:] for g in tier]
    earlier = [v for g, v in key.items() if g not in last]
    return {"first_tier_first": max(fast) < inf and max(fast) < min(later),
            "last_tier_last": all(g in key for g in last) and all(key[g] > v for g in last for v in earlier)}
