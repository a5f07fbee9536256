"""E15, component re-initialisation: one training run per component group
(`interventions.GROUPS`), started from the main run's post checkpoint with that group
re-initialised and trained, everything else frozen (`reinit_component`; docs/protocol.md, E15).

Each run is an ordinary run folder, `run_dir/freeze/GROUP/` (`mclib.core.runs.freeze_dir`),
that resumes and returns at once when complete; its `source.json` names the checkpoint it
started from, and a folder started from another one is refused. A run stops at the first of:
its rows are known (`rows_known`), it converged after its drop (the main run's rule), it
reached the main run's drop step without dropping, or the cap `analysis.freeze_steps`.

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

from ..core.checkpoints import load_checkpoint, saved_steps
from ..core.config import Profile
from ..core.data import copy_level
from ..core.ending import is_complete
from ..core.jobs import run_profile_jobs
from ..core.metrics import DROP_WINDOW, PLATEAU_BAND, converged, end_slope, final_level, find_drop, rows_curve
from ..core.paper import PAPER_E15_ORDER
from ..core.placement import checkpoint_steps
from ..core.precision import with_device
from ..core.runs import FREEZE_SOURCE, freeze_dir, load_metrics
from ..core.train import train
from .interventions import GROUPS, component_groups, reinit_component
from .margins import MARGINS
from .sharpness import ABRUPT, SETTLE, shape

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
    """The main run's final L_mask and its standard error (`final_level`) where the E15 runs
    start: what an E15 run's final level is divided by."""

    final: float
    se: float


def yardstick(cfg: Profile, run_dir: str | Path, source_step: int | None = None) -> Yardstick:
    """The main run's `Yardstick` up to `source_step` (default: its post checkpoint)."""
    step = checkpoint_steps(run_dir, cfg).post if source_step is None else source_step
    m = load_metrics(run_dir)
    return Yardstick(*final_level(m[m["step"] <= step], cfg.train.patience))


def recovery(metrics: pd.DataFrame, window: int, main: Yardstick) -> tuple[float, float]:
    """(ratio, se): an E15 run's final L_mask over the main run's, errors in quadrature; NaN
    where either level is missing."""
    final, se = final_level(metrics, window)
    if not (main.final > 0 and math.isfinite(final) and final > 0):
        return float("nan"), float("nan")
    ratio = final / main.final
    return ratio, ratio * math.hypot(se / final, main.se / main.final)


def plateau_over_fall(metrics: pd.DataFrame, rank: int) -> float | None:
    """Plateau steps over fall steps: None without a drop, 0 if never on the copying level."""
    if find_drop(metrics, rank=rank) is None:
        return None
    s = shape(metrics, rank)
    return 0.0 if s is None else s.plateau / max(1, s.fall)


def known_text() -> str:
    """`rows_known`'s test in words, for the book (the run's ending and chapter 05's caption)."""
    return (
        f"final L_mask under {SETTLE * (1 - KNOWN_MARGIN):g}x the main run's at two standard errors, "
        f"plateau over fall under {ABRUPT * (1 - KNOWN_MARGIN):g}"
    )


def rows_known(metrics: pd.DataFrame, cfg: Profile, main: Yardstick) -> bool:
    """Whether more training can no longer change an E15 run's rows: dropped at least
    `train.patience` steps ago, recovered below SETTLE·(1 − KNOWN_MARGIN) at two standard
    errors, plateau over fall below ABRUPT·(1 − KNOWN_MARGIN). More training only lowers
    the final level, which moves the fall's end later, so neither verdict can then change."""
    drop = find_drop(metrics, rank=cfg.data.rank)
    window = cfg.train.patience
    if drop is None or int(metrics["step"].iloc[-1]) < drop + window:
        return False
    ratio, se = recovery(metrics, window, main)
    if not (math.isfinite(ratio) and ratio + 2 * se < SETTLE * (1 - KNOWN_MARGIN)):
        return False
    return plateau_over_fall(metrics, cfg.data.rank) < ABRUPT * (1 - KNOWN_MARGIN)


def freeze_stop(cfg: Profile, main: int | None, known: Yardstick | None = None):
    """The `stop` of an E15 run: true once its rows are known against the `known` yardstick,
    or once it has trained `main` steps without dropping (each None: not that rule). None
    when neither rule applies."""
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
    """The main profile (same data stream, model, optimiser, seed) trained until converged,
    at most `freeze_steps(cfg)` steps, with the main profile's checkpoints within the cap,
    and the cap; named after `group`."""
    if group not in GROUPS:
        raise ValueError(f"group {group!r} is not one of {', '.join(GROUPS)}")
    steps = freeze_steps(cfg)
    ck = cfg.checkpoints
    return cfg.replace(
        **{
            "name": f"{cfg.name}-freeze-{group}",
            "train.steps": steps,
            "train.until": "converged",
            "checkpoints.place": "fixed",
            "checkpoints.pre": min(ck.pre, steps),
            "checkpoints.transition": [s for s in ck.transition if s <= steps],
            "checkpoints.post": steps,
        }
    )


def _check_source(folder: Path, source: dict) -> None:
    path = folder / FREEZE_SOURCE
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved != source:
            raise ValueError(f"{folder} was started from {saved}, not {source}; delete the folder to redo it")
    elif saved_steps(folder):
        raise ValueError(f"{folder} has checkpoints but no {FREEZE_SOURCE}; delete the folder to redo it")


def _source(
    cfg: Profile, run_dir: str | Path, group: str, source_step: int | None = None, seed: int | None = None
) -> dict:
    step = checkpoint_steps(run_dir, cfg).post if source_step is None else source_step
    return {"step": step, "group": group, "seed": cfg.seed if seed is None else seed}


def freeze_run(
    cfg: Profile,
    run_dir: str | Path,
    group: str,
    source_step: int | None = None,
    seed: int | None = None,
    *,
    progress: bool = False,
    deadline: float | None = None,
) -> Path:
    """Train (or resume, or find complete) the E15 run of one group; returns its folder.
    source_step: the main run's checkpoint to start from (default: post). seed: of the
    re-initialisation (default: the profile's). deadline: a `time.time()` where the run is
    cut, resumable."""
    run_dir = Path(run_dir)
    folder, source = freeze_dir(run_dir, group), _source(cfg, run_dir, group, source_step, seed)
    _check_source(folder, source)
    # re-initialised on the CPU, whatever the run's device: the same fresh weights everywhere
    model = reinit_component(load_checkpoint(run_dir, source["step"], device="cpu"), group, source["seed"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FREEZE_SOURCE).write_text(json.dumps(source))
    return train(
        freeze_profile(cfg, group),
        folder,
        progress=progress,
        stop=freeze_stop(cfg, main_drop(cfg, run_dir), yardstick(cfg, run_dir, source["step"])),
        init_model=model,
        newest_only=True,  # the book reads its metrics and end
        deadline=deadline,
    )


# The order E15's runs are handed to the workers: the paper's latest drop first, so the
# longest run does not start last. Only the schedule depends on it.
LONGEST_FIRST = tuple(g for tier in reversed(PAPER_E15_ORDER) for g in tier)


def pending_groups(cfg: Profile, run_dir: str | Path, groups=LONGEST_FIRST) -> list[str]:
    """The groups whose E15 run is not complete, in the order of `groups` (each folder's
    source is checked, also for a complete run, which is then skipped)."""
    for g in groups:
        _check_source(freeze_dir(run_dir, g), _source(cfg, run_dir, g))
    stop = freeze_stop(cfg, main_drop(cfg, run_dir), yardstick(cfg, run_dir))
    return [g for g in groups if not is_complete(freeze_profile(cfg, g), freeze_dir(run_dir, g), stop)]


def freeze_runs(
    cfg: Profile, run_dir: str | Path, groups=tuple(GROUPS), cluster: str | None = None
) -> dict[str, Path]:
    """`freeze_run` for every incomplete group, side by side on a Dask cluster (cluster: its
    address, default the local one or $MCLIB_CLUSTER); returns {group: folder}."""

    pending = pending_groups(cfg, run_dir, sorted(groups, key=LONGEST_FIRST.index))

    cfg = with_device(cfg)  # resolved once, here: every worker trains where this process chose
    run_profile_jobs(cfg, freeze_run, [(cfg, run_dir, g) for g in pending], cluster)
    return {g: freeze_dir(run_dir, g) for g in groups}


FREEZE_ENDINGS = ("known", "converged", "main drop", "cap", "unfinished")


@dataclass
class FreezeEnd:
    """How one E15 run ended (`freeze_end`). ended: "known" (`rows_known`), "converged"
    (after its drop), "main drop" (no drop in the main run's steps to its drop), "cap", or
    "unfinished". slope, slope_se: L_mask's relative change per 1 000 steps at the end (`end_slope`).
    """

    group: str
    ended: str
    steps: int  # steps it trained
    drop: int | None  # its own drop
    main_drop: int | None  # the main run's drop step
    cap: int  # analysis.freeze_steps
    slope: float = float("nan")
    slope_se: float = float("nan")

    @property
    def text(self) -> str:
        """One phrase for the book, e.g. "dropped at step 310 and converged at step 2,900"."""
        still = (
            f" while L_mask still changed by {self.slope:+.1%} ± {self.slope_se:.1%} per 1,000 steps"
            if math.isfinite(self.slope)
            else ""
        )
        if self.ended == "known":
            return (
                f"dropped at step {self.drop:,} and stopped at step {self.steps:,}, once its rows were known "
                f"({known_text()})"
            )
        if self.ended == "converged":
            return f"dropped at step {self.drop:,} and converged at step {self.steps:,}"
        if self.ended == "main drop":
            return f"reached the main run's drop step {self.main_drop:,} without dropping"
        if self.ended == "cap" and self.drop is not None:
            return f"dropped at step {self.drop:,}, then reached the cap of {self.cap:,} steps{still}"
        if self.ended == "cap":
            main = (
                f"the main run dropped at step {self.main_drop:,}"
                if self.main_drop is not None
                else "the main run did not drop"
            )
            return f"reached the cap of {self.cap:,} steps without dropping ({main})"
        return f"unfinished after {self.steps:,} steps"


def freeze_end(
    group: str, metrics: pd.DataFrame, cfg: Profile, main: int | None, known: Yardstick | None = None
) -> FreezeEnd:
    """How an E15 run with these `metrics` ended, given the main run's drop step `main` and
    `Yardstick` `known` (each None: that rule did not apply)."""
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
    """{group: FreezeEnd} of the E15 runs of `run_dir`, read from their folders (trains nothing)."""
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


def freeze_summary(
    runs: dict[str, Path], cfg: Profile, window: int = DROP_WINDOW, read=load_metrics
) -> pd.DataFrame:
    """One row per group: drop (<NA> if none), steps, plateau and fall (`sharpness.shape`,
    steps; plateau 0 if never on the copying level), first_L_mask over `window` steps and
    starts_on_plateau (within PLATEAU_BAND of E[X²]), final_L_mask (± se) and final_L_obs
    over the last `train.patience` steps. read: the metrics reader (gzipped lease runs pass theirs)."""
    plateau, tail = copy_level(cfg.data.rank), cfg.train.patience
    rows = []
    for group, folder in runs.items():
        m = read(folder)
        drop = find_drop(m, rank=cfg.data.rank, window=window)
        s = shape(m, cfg.data.rank) if drop is not None else None
        final, final_se = final_level(m, tail)
        first = float(m.head(window)["L_mask"].mean())
        rows.append(
            {
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
            }
        )
    table = pd.DataFrame(rows)
    for c in ("drop", "plateau", "fall"):  # a missing value is <NA>, not a float NaN
        table[c] = pd.array([r[c] for r in rows], dtype="Int64")
    return table


def _drop(d) -> int | None:
    return None if d is None or pd.isna(d) else int(d)


def drop_text(drop: int | None, steps: int) -> str:
    """ "drop at step 1,234" or "no drop by step N" (drop None or NA)."""
    drop = _drop(drop)
    return f"drop at step {drop:,}" if drop is not None else f"no drop by step {steps:,}"


def paper_pattern(table: pd.DataFrame, order=PAPER_E15_ORDER) -> dict[str, bool]:
    """The two ends of the paper's order of drops (`order`: tiers, earliest first), checked
    strictly on `freeze_summary`'s table, no drop counting as latest: first_tier_first (every
    first-tier run drops before every later one), last_tier_last (every last-tier run drops
    after every earlier one, or they alone never drop)."""
    inf = float("inf")
    key = {g: inf if _drop(d) is None else _drop(d) for g, d in zip(table["group"], table["drop"])}
    first, last = order[0], order[-1]
    fast = [key.get(g, inf) for g in first]
    later = [key.get(g, inf) for tier in order[1:] for g in tier]
    earlier = [v for g, v in key.items() if g not in last]
    return {
        "first_tier_first": max(fast) < inf and max(fast) < min(later),
        "last_tier_last": all(g in key for g in last) and all(key[g] > v for g in last for v in earlier),
    }
