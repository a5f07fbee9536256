"""Model size (E20): the appendix's width and depth claims, tested on a sweep's results
table (one row per run: `mclib.core.sweep`'s columns), and the large models' final losses.

The appendix (paper Figs. 13-14, NeurIPS version, on 7×7 rank 2 with the 4-layer model) says:
- width: hidden 64 is too small for accurate completion, 128 sub-optimal: wider is better;
- depth: 6 layers drop earlier than 4; 8 or 12 add little.
At laptop scale (sweeps/width-depth.yaml: n×n rank 1, widths 32/64/128 at 4 layers, depths
2/4/6/8 at width 64) each becomes a ratio of two settings' seed means, with its standard
error by the delta method (`ratio_of_means`).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..core.data import copy_level


def converged(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows whose run ended by its convergence rule (the table's `ended`). A run cut by
    the wall clock ("wall cap") or the step cap ("cap") stopped before its final level, so
    its final L_mask is not a final level and is left out where final levels are compared.
    A table without the column (rows written before 2026-11-25) counts every row."""
    if "ended" not in runs:
        return runs
    return runs[runs["ended"] == "converged"]


def by_setting(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (n, rank, hidden, layers): seeds run, drop step (mean, sd; NaN where a
    seed did not drop, counted in `dropped`), drop in matrices and minutes, final L_mask
    over E[X²] (mean, sd) of the runs that converged (`converged`, counted in
    `converged`), how far the runs went, and (where the table says) the rule that ended them."""
    t = table.copy()
    done = t.index.isin(converged(t).index)
    t["final_over_level"] = (t["final_L_mask"] / t["rank"].map(copy_level)).where(done)
    t["converged"] = done
    t["drop_matrices"] = t["drop_step"] * t["batch"]
    g = t.groupby(["n", "rank", "hidden", "layers"], sort=True)
    out = g.agg(seeds=("seed", "count"), dropped=("drop_step", "count"),
                drop_step=("drop_step", "mean"), drop_step_sd=("drop_step", "std"),
                drop_matrices=("drop_matrices", "mean"), drop_minutes=("drop_minutes", "mean"),
                converged=("converged", "sum"),
                final_over_level=("final_over_level", "mean"), final_sd=("final_over_level", "std"),
                steps_run=("steps_run", "max"))
    if "end_rule" in t:  # the rule(s) that ended the setting's runs: finals under unlike rules are not compared
        out["end_rule"] = g["end_rule"].agg(lambda r: " + ".join(sorted(set(r.dropna()))) or None)
    return out.reset_index()


def ratio_of_means(a: pd.Series, b: pd.Series) -> tuple[float, float]:
    """mean(a) / mean(b) and its standard error (delta method, independent seeds). The
    ratio is NaN when either side has no value; the error is NaN when either side has a
    single value (one seed says nothing of the spread between seeds, and an error of 0
    would claim it did)."""
    a, b = a.dropna().astype(float), b.dropna().astype(float)
    if a.empty or b.empty or b.mean() == 0:
        return math.nan, math.nan
    r = a.mean() / b.mean()
    if len(a) < 2 or len(b) < 2:
        return float(r), math.nan
    rel = lambda x: (x.std(ddof=1) / math.sqrt(len(x)) / x.mean()) ** 2
    return float(r), float(abs(r) * math.sqrt(rel(a) + rel(b)))


def _runs(table: pd.DataFrame, n: int, hidden: int, layers: int) -> pd.DataFrame:
    return table[(table["n"] == n) & (table["hidden"] == hidden) & (table["layers"] == layers)]


def mixed_rules(*runs: pd.DataFrame) -> bool:
    """Whether these rows' runs ended by different rules (`end_rule`; rows without the
    column count as one rule): their final losses are then read at unlike points."""
    rules = set().union(*(set(r["end_rule"].dropna()) if "end_rule" in r else set() for r in runs))
    return len(rules) > 1


def width_ratio(table: pd.DataFrame, n: int, wide: int = 128, narrow: int = 32, layers: int = 4):
    """Final L_mask at `wide` over at `narrow` (4 layers), over the runs that converged
    (`converged`): below 1 means wider is better. Returns the ratio and its error, and the
    runs it reads at each width. NaN where the two settings' runs ended by different rules
    (`mixed_rules`)."""
    a, b = _runs(table, n, wide, layers), _runs(table, n, narrow, layers)
    if mixed_rules(a, b):
        return (math.nan, math.nan), len(a), len(b)
    a, b = converged(a), converged(b)
    return ratio_of_means(a["final_L_mask"], b["final_L_mask"]), len(a), len(b)


def _left_out(table: pd.DataFrame, n: int, widths: tuple[int, ...], layers: int = 4) -> str | None:
    """Which runs the width comparison leaves out because they did not converge, or None."""
    parts = []
    for w in widths:
        runs = _runs(table, n, w, layers)
        cut = runs.drop(converged(runs).index)   # empty where the table has no `ended` column
        if len(cut):
            how = ", ".join(f"seed {int(s)} ({e if isinstance(e, str) else 'unknown'})"
                            for s, e in zip(cut["seed"], cut["ended"]))
            parts.append(f"hidden {w}: {how}")
    return ("left out, cut before they converged: " + "; ".join(parts)) if parts else None


def depth_ratio(table: pd.DataFrame, n: int, deep: int, shallow: int, hidden: int = 64):
    """Drop step at `deep` layers over at `shallow` (width 64), over the seeds that dropped;
    a setting none of whose seeds dropped gives NaN (and its count of seeds)."""
    a, b = _runs(table, n, hidden, deep), _runs(table, n, hidden, shallow)
    return ratio_of_means(a["drop_step"], b["drop_step"]), len(a), len(b)


def claims(table: pd.DataFrame) -> list[dict]:
    """The appendix's three claims per task size in the table: {n, claim, ours, se, seeds,
    note, compares}; ours NaN where a setting is missing or never dropped (the note says).
    `compares`: the two settings, each (n, hidden, layers)."""
    out = []
    for n in (int(n) for n in sorted(table["n"].unique())):
        (r, se), ka, kb = width_ratio(table, n)
        wide, narrow = _runs(table, n, 128, 4), _runs(table, n, 32, 4)
        mixed = mixed_rules(wide, narrow)
        none_converged = not mixed and len(wide) and len(narrow) and not (ka and kb)
        out.append({"n": int(n), "claim": "wider is better: final L_mask at hidden 128 / at hidden 32",
                    "ours": r, "se": se, "seeds": f"{ka} / {kb}", "sense": "below", "reference": 1.0,
                    "note": ("the two widths' runs ended by different convergence rules (the table's end_rule): "
                             "their final L_mask are not compared" if mixed else
                             "no run of one of the widths converged before its cap" if none_converged else None),
                    "left_out": None if mixed else _left_out(table, n, (128, 32)),
                    "compares": ((n, 128, 4), (n, 32, 4))})
        (r, se), ka, kb = depth_ratio(table, n, 6, 4)
        out.append({"n": int(n), "claim": "6 layers drop earlier than 4: drop step at 6 layers / at 4",
                    "ours": r, "se": se, "seeds": f"{ka} / {kb}", "sense": "below", "reference": 1.0,
                    "compares": ((n, 64, 6), (n, 64, 4))})
        (r, se), ka, kb = depth_ratio(table, n, 8, 6)
        out.append({"n": int(n), "claim": "more layers add little: drop step at 8 layers / at 6",
                    "ours": r, "se": se, "seeds": f"{ka} / {kb}", "sense": "about", "reference": 1.0,
                    "compares": ((n, 64, 8), (n, 64, 6))})
    return out


def large_model_finals(table: pd.DataFrame) -> pd.DataFrame:
    """E20's 12-layer runs: per setting, the task, the steps run and the final total MSE L
    (mean over the last 10 % of steps, from the sweep's final L_obs and L_mask pooled by
    p_mask), against the paper's "of the order of 1e-3"."""
    t = table.copy()
    t["final_L"] = (1 - t["p_mask"]) * t["final_L_obs"] + t["p_mask"] * t["final_L_mask"]
    return t[["setting", "seed", "n", "rank", "layers", "heads", "hidden", "lr", "steps_run", "drop_step",
              "final_L"]].reset_index(drop=True)


def order_of_magnitude(values: pd.Series) -> float:
    """The mean of log10 of the values: -3 for "of the order of 1e-3"."""
    v = values.dropna().astype(float)
    return float(np.log10(v).mean()) if len(v) else math.nan
