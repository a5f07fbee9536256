"""E15, component re-initialisation: one training run per component group.

For each group of `mclib.analyses.interventions.GROUPS` ("attention", "mlp", "positional",
"token") the post checkpoint of the main run (`mclib.core.runs.checkpoint_steps`: its last
step) is copied, that group is re-initialised with BERT's own init and trained, every
other parameter loaded from the post checkpoint and frozen (`reinit_component`). Each run
is an ordinary run folder:

    run_dir/freeze/GROUP/{profile.yaml, metrics.csv, checkpoints/, source.json, end.json}
    (`mclib.core.runs.freeze_dir`; source.json: `runs.FREEZE_SOURCE`)

so it resumes after an interruption and returns at once when complete, like the main
run. `source.json` names the checkpoint the run started from; a folder started from
another checkpoint (e.g. the main run was trained further since) is refused rather
than silently continued.

How long an E15 run trains (`freeze_steps`): until it drops (`find_drop`; it stops at
the first log flush at or after its drop) or until it has trained as many steps as the
main run took to drop (the main run's drop step), whichever comes first;
`analysis.freeze_steps` is a cap on top (the main run without a drop: the cap alone).
`freeze_ends` says, per group, which of these ended the run.

    runs = freeze_runs(cfg, run_dir)          # {group: folder}, trains what is missing
    table = freeze_summary(runs, cfg)          # steps to the drop, losses
    ends = freeze_ends(cfg, run_dir)           # {group: FreezeEnd}: dropped / main drop / cap
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..core.config import Profile
from ..core.data import copy_level
from ..core.paper import PAPER_E15_ORDER
from .interventions import GROUPS, component_groups, reinit_component
from ..core.metrics import DROP_WINDOW, PLATEAU_BAND, find_drop
from ..core.train import stop_after_drop, train
from ..core.runs import (FREEZE_SOURCE, checkpoint_steps, freeze_dir, is_complete, load_checkpoint, load_metrics,
                         saved_steps)

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


def freeze_steps(cfg: Profile, drop: int | None) -> int:
    """How many steps an E15 run may train at most: the main run's drop step `drop`,
    capped at `analysis.freeze_steps` (the cap alone when the main run did not drop).
    The run stops earlier, at its own drop (`freeze_stop`)."""
    cap = cfg.analysis.freeze_steps
    return cap if drop is None else min(drop, cap)


def freeze_stop(cfg: Profile):
    """The `stop` of an E15 run: true at the first log flush at or after its drop."""
    return stop_after_drop(cfg.data.rank, 0)


def freeze_profile(cfg: Profile, group: str, drop: int | None = None) -> Profile:
    """The main profile, trained for at most `freeze_steps(cfg, drop)` steps.

    drop: the main run's drop step (`main_drop`; None: the cap `analysis.freeze_steps`).
    Same data, model, optimiser and seed (so the data stream is the main run's); it trains
    a fixed number of steps (`train.until: steps`: its end is its own drop, `freeze_stop`,
    not the main run's convergence rule); its fixed checkpoints are those of the main
    profile that fall within the shorter run, and its last step. The name says which group
    is trained.
    """
    if group not in GROUPS:
        raise ValueError(f"group {group!r} is not one of {', '.join(GROUPS)}")
    steps = freeze_steps(cfg, drop)
    ck = cfg.checkpoints
    return cfg.replace(**{
        "name": f"{cfg.name}-freeze-{group}",
        "train.steps": steps,
        "train.until": "steps",
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
               seed: int | None = None, progress: bool = False) -> Path:
    """Train (or resume, or find complete) the E15 run of one group; returns its folder.

    source_step: the main run's checkpoint to start from (default: its post checkpoint,
    `mclib.core.runs.checkpoint_steps`). seed: of the re-initialisation (default: the
    profile's seed). The run ends at its own drop or after `freeze_steps` steps.
    """
    run_dir = Path(run_dir)
    folder, source = freeze_dir(run_dir, group), _source(cfg, run_dir, group, source_step, seed)
    _check_source(folder, source)
    # re-initialised on the CPU, whatever the run's device: the same fresh weights everywhere
    model = reinit_component(load_checkpoint(run_dir, source["step"], device="cpu"), group, source["seed"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FREEZE_SOURCE).write_text(json.dumps(source))
    return train(freeze_profile(cfg, group, main_drop(cfg, run_dir)), folder, progress=progress,
                 stop=freeze_stop(cfg), init_model=model, newest_only=True)  # the book reads its metrics and end


# The order E15's runs are handed to the workers: the paper's latest drop first
# (mclib.core.paper.PAPER_E15_ORDER reversed), so that the longest run does not start last
# and the runs end close together. Only the schedule depends on it, not a run's numbers.
LONGEST_FIRST = tuple(g for tier in reversed(PAPER_E15_ORDER) for g in tier)


def pending_groups(cfg: Profile, run_dir: str | Path, groups=LONGEST_FIRST) -> list[str]:
    """The groups whose E15 run is not complete, in the order of `groups` (each folder's
    source is checked, also for a complete run, which is then skipped)."""
    for g in groups:
        _check_source(freeze_dir(run_dir, g), _source(cfg, run_dir, g))
    drop = main_drop(cfg, run_dir)
    return [g for g in groups
            if not is_complete(freeze_profile(cfg, g, drop), freeze_dir(run_dir, g), freeze_stop(cfg))]


def freeze_runs(cfg: Profile, run_dir: str | Path, groups=tuple(GROUPS), cluster: str | None = None) -> dict[str, Path]:
    """`freeze_run` for every group that is not complete, side by side on a Dask cluster
    (`mclib.core.jobs.run_profile_jobs`; cluster: its address, default the local one or
    $MCLIB_CLUSTER): {group: folder}, in the order of `groups`. Nothing starts when all
    are complete."""
    from ..core.jobs import run_profile_jobs

    pending = pending_groups(cfg, run_dir, sorted(groups, key=LONGEST_FIRST.index))
    from ..core.train import with_device

    cfg = with_device(cfg)  # resolved once, here: every worker trains where this process chose
    run_profile_jobs(cfg, freeze_run, [(cfg, run_dir, g) for g in pending], cluster)
    return {g: freeze_dir(run_dir, g) for g in groups}


FREEZE_ENDINGS = ("dropped", "main drop", "cap", "unfinished")


@dataclass
class FreezeEnd:
    """How one E15 run ended (`freeze_end`).

    ended: "dropped"     it dropped (`find_drop`) at step `drop` and stopped there
           "main drop"   it trained as many steps as the main run took to drop
                         (`main_drop`) without dropping
           "cap"         it reached `analysis.freeze_steps` (below the main run's drop
                         step, or the main run did not drop) without dropping
           "unfinished"  none of these yet (not trained, or cut)
    """
    group: str
    ended: str
    steps: int              # steps it trained
    drop: int | None        # its own drop
    main_drop: int | None   # the main run's drop step
    cap: int                # analysis.freeze_steps

    @property
    def text(self) -> str:
        """One phrase for the book: "dropped at step 310", "reached the main run's drop
        step 10,985 without dropping", "reached the cap of 4,000 steps without dropping
        (the main run dropped at step 10,985)"."""
        if self.ended == "dropped":
            return f"dropped at step {self.drop:,}"
        if self.ended == "main drop":
            return f"reached the main run's drop step {self.main_drop:,} without dropping"
        if self.ended == "cap":
            main = (f"the main run dropped at step {self.main_drop:,}" if self.main_drop is not None
                    else "the main run did not drop")
            return f"reached the cap of {self.cap:,} steps without dropping ({main})"
        return f"unfinished after {self.steps:,} steps"


def freeze_end(group: str, metrics: pd.DataFrame, rank: int, main: int | None, cap: int) -> FreezeEnd:
    """How an E15 run with these `metrics` (one row per step trained) ended, given the
    main run's drop step `main` (None: none) and the cap `analysis.freeze_steps`: the
    rule of the module docstring read back from the curve."""
    steps = int(metrics["step"].max()) if len(metrics) else 0
    drop = find_drop(metrics, rank=rank) if len(metrics) else None
    limit = cap if main is None else min(main, cap)
    if drop is not None:
        ended = "dropped"
    elif steps >= limit:
        ended = "main drop" if main is not None and main <= cap else "cap"
    else:
        ended = "unfinished"
    return FreezeEnd(group, ended, steps, drop, main, cap)


def freeze_ends(cfg: Profile, run_dir: str | Path, groups=tuple(GROUPS)) -> dict[str, FreezeEnd]:
    """{group: FreezeEnd} for the E15 runs of the main run in `run_dir`, read from their
    folders (trains nothing): which of "dropped at step S", "reached the main run's drop
    step S without dropping" or "reached the cap" ended each run (`FreezeEnd.text`)."""
    main = main_drop(cfg, run_dir)
    out = {}
    for g in groups:
        folder = freeze_dir(run_dir, g)
        steps = saved_steps(folder)
        m = load_metrics(folder) if steps else pd.DataFrame({"step": [], "L_mask": []})
        m = m[m["step"] <= (steps[-1] if steps else 0)]
        out[g] = freeze_end(g, m, cfg.data.rank, main, cfg.analysis.freeze_steps)
    return out


def trainable_count(model, group: str) -> int:
    """Number of parameters in `group` (what an E15 run trains)."""
    groups = component_groups(model)
    return sum(p.numel() for name, p in model.named_parameters() if groups[name] == group)


def freeze_summary(runs: dict[str, Path], cfg: Profile, window: int = DROP_WINDOW) -> pd.DataFrame:
    """One row per group: the drop (`find_drop`, None if none), the steps trained, the
    mean L_mask over the first and the last `window` steps, L_obs over the last, and
    whether the run starts on the copying plateau (first-window L_mask within PLATEAU_BAND of E[X²])."""
    plateau = copy_level(cfg.data.rank)
    rows = []
    for group, folder in runs.items():
        m = load_metrics(folder)
        drop = find_drop(m, rank=cfg.data.rank, window=window)
        head, tail = m.head(window), m.tail(window)
        rows.append({
            "group": group,
            "steps": int(m["step"].max()),
            "drop": drop,
            "first_L_mask": float(head["L_mask"].mean()),
            "final_L_mask": float(tail["L_mask"].mean()),
            "final_L_obs": float(tail["L_obs"].mean()),
            "starts_on_plateau": bool(abs(head["L_mask"].mean() / plateau - 1) < PLATEAU_BAND),
        })
    table = pd.DataFrame(rows)
    table["drop"] = pd.array([r["drop"] for r in rows], dtype="Int64")  # a missing drop is <NA>, not a float NaN
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
