"""Model size (E20): the appendix's width and depth claims (paper Figs. 13-14: wider is
better; 6 layers drop earlier than 4; more add little; deeper ends lower), each a ratio of
two settings' seed means with a delta-method error (`ratio_of_means`), on a sweep's results
table (`mclib.core.sweep`); and the large models' final losses.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..core.data import copy_level


def converged(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows whose run ended by its convergence rule (`ended`); a run cut by a cap has no
    final level. A table without the `ended` column counts every row."""
    if "ended" not in runs:
        return runs
    return runs[runs["ended"] == "converged"]


def by_setting(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (n, rank, hidden, layers): seeds, dropped, drop step (mean, sd), drop in
    matrices and minutes, final L_mask over E[X²] (mean, sd) of the `converged` runs,
    steps_run, and end_rule where the table has it."""
    t = table.copy()
    done = t.index.isin(converged(t).index)
    t["final_over_level"] = (t["final_L_mask"] / t["rank"].map(copy_level)).where(done)
    t["converged"] = done
    t["drop_matrices"] = t["drop_step"] * t["batch"]
    g = t.groupby(["n", "rank", "hidden", "layers"], sort=True)
    out = g.agg(
        seeds=("seed", "count"),
        dropped=("drop_step", "count"),
        drop_step=("drop_step", "mean"),
        drop_step_sd=("drop_step", "std"),
        drop_matrices=("drop_matrices", "mean"),
        drop_minutes=("drop_minutes", "mean"),
        converged=("converged", "sum"),
        final_over_level=("final_over_level", "mean"),
        final_sd=("final_over_level", "std"),
        steps_run=("steps_run", "max"),
    )
    if (
        "end_rule" in t
    ):  # the rule(s) that ended the setting's runs: finals under unlike rules are not compared
        out["end_rule"] = g["end_rule"].agg(lambda r: " + ".join(sorted(set(r.dropna()))) or None)
    return out.reset_index()


def drops_by_task(table: pd.DataFrame) -> str:
    """'5×5 rank 1: 18 of 18 runs dropped; 7×7 rank 1: 0 of 4 (the longest ran 30,000
    steps, 1,920,000 matrices)': per task size, how many runs dropped within their caps."""
    parts = []
    for (n, rank), runs in table.groupby(["n", "rank"], sort=True):
        k = int(runs["drop_step"].notna().sum())
        longest = runs.loc[runs["steps_run"].idxmax()]
        tail = (
            ""
            if k
            else (
                f" (the longest ran {int(longest['steps_run']):,} steps, "
                f"{int(longest['steps_run'] * longest['batch']):,} matrices)"
            )
        )
        parts.append(f"{n}×{n} rank {rank}: {k} of {len(runs)} runs dropped{tail}")
    return "; ".join(parts)


def ratio_of_means(a: pd.Series, b: pd.Series) -> tuple[float, float]:
    """mean(a) / mean(b) and its standard error (delta method, independent seeds); the ratio
    is NaN when a side is empty, the error when a side has one value (no spread to read)."""
    a, b = a.dropna().astype(float), b.dropna().astype(float)
    if a.empty or b.empty or b.mean() == 0:
        return math.nan, math.nan
    r = a.mean() / b.mean()
    if len(a) < 2 or len(b) < 2:
        return float(r), math.nan
    rel = lambda x: (x.std(ddof=1) / math.sqrt(len(x)) / x.mean()) ** 2
    return float(r), float(abs(r) * math.sqrt(rel(a) + rel(b)))


def _runs(table: pd.DataFrame, n: int, hidden: int, layers: int) -> pd.DataFrame:
    """One setting's rows, by seed (the table holds them in the order they finished)."""
    return table[(table["n"] == n) & (table["hidden"] == hidden) & (table["layers"] == layers)].sort_values(
        "seed"
    )


def mixed_rules(*runs: pd.DataFrame) -> bool:
    """Whether these rows' runs ended by different rules (`end_rule`; rows without the
    column count as one rule): their final losses are then read at unlike points."""
    rules = set().union(*(set(r["end_rule"].dropna()) if "end_rule" in r else set() for r in runs))
    return len(rules) > 1


Setting = tuple[int, int]  # (hidden, layers) of one model in the sweep


def _name(setting: Setting, other: Setting) -> str:
    """'hidden 128' where two settings differ in width, '6 layers' where they differ in depth."""
    return f"hidden {setting[0]}" if setting[0] != other[0] else f"{setting[1]} layers"


def final_ratio(table: pd.DataFrame, n: int, a: Setting, b: Setting):
    """((ratio, se), runs at a, runs at b): final L_mask at setting `a` over at `b`, converged
    runs only; NaN where the settings' runs ended by different rules (`mixed_rules`)."""
    runs_a, runs_b = _runs(table, n, *a), _runs(table, n, *b)
    if mixed_rules(runs_a, runs_b):
        return (math.nan, math.nan), len(runs_a), len(runs_b)
    runs_a, runs_b = converged(runs_a), converged(runs_b)
    return ratio_of_means(runs_a["final_L_mask"], runs_b["final_L_mask"]), len(runs_a), len(runs_b)


def _left_out(table: pd.DataFrame, n: int, a: Setting, b: Setting) -> str | None:
    """Which runs the comparison of final levels leaves out because they did not converge, or None."""
    parts = []
    for s, other in ((a, b), (b, a)):
        runs = _runs(table, n, *s)
        cut = runs.drop(converged(runs).index)  # empty where the table has no `ended` column
        if len(cut):
            how = ", ".join(
                f"seed {int(k)} ({e if isinstance(e, str) else 'unknown'})"
                for k, e in zip(cut["seed"], cut["ended"])
            )
            parts.append(f"{_name(s, other)}: {how}")
    return ("left out, cut before they converged: " + "; ".join(parts)) if parts else None


def _by_steps(runs: pd.DataFrame) -> str:
    """'by steps 30,000, 28,150': how far these runs got."""
    return f"by step{'s' if len(runs) > 1 else ''} {', '.join(f'{int(k):,}' for k in runs['steps_run'])}"


def _unconverged(table: pd.DataFrame, n: int, a: Setting, b: Setting) -> str:
    """'hidden 128: none of 2 runs converged, none dropped (by steps 30,000, 30,000)': the
    settings where no run converged, and whether their runs dropped."""
    parts = []
    for s, other in ((a, b), (b, a)):
        runs = _runs(table, n, *s)
        if len(runs) and converged(runs).empty:
            dropped = int(runs["drop_step"].notna().sum())
            parts.append(
                f"{_name(s, other)}: none of {len(runs)} run{'s' if len(runs) > 1 else ''} converged, "
                + (f"{dropped} dropped" if dropped else "none dropped")
                + f" ({_by_steps(runs)})"
            )
    return "; ".join(parts)


def _final_claim(table: pd.DataFrame, n: int, a: Setting, b: Setting, *, claim: str) -> dict:
    """One claim on final levels (`final_ratio`): setting `a` ends lower than `b`. Its note
    says why there is no ratio where the runs ended by unlike rules or none converged."""
    (r, se), ka, kb = final_ratio(table, n, a, b)
    runs_a, runs_b = _runs(table, n, *a), _runs(table, n, *b)
    mixed = mixed_rules(runs_a, runs_b)
    none_converged = not mixed and len(runs_a) and len(runs_b) and not (ka and kb)
    return {
        "n": int(n),
        "claim": claim,
        "ours": r,
        "se": se,
        "seeds": f"{ka} / {kb}",
        "sense": "below",
        "reference": 1.0,
        "note": (
            "the two settings' runs ended by different convergence rules (the table's end_rule): "
            "their final L_mask are not compared"
            if mixed
            else f"no final level to compare: {_unconverged(table, n, a, b)}"
            if none_converged
            else None
        ),
        "left_out": None if mixed else _left_out(table, n, a, b),
        "compares": ((n, *a), (n, *b)),
    }


def depth_ratio(table: pd.DataFrame, n: int, deep: int, shallow: int, hidden: int = 64):
    """((ratio, se), runs deep, runs shallow, bound): drop step at `deep` layers over at
    `shallow`. A run that never dropped counts at its last step (censored, not left out),
    so bound is "exact", "at most" (shallow runs cut), "at least" (deep runs cut) or
    "none" (both cut, or a setting empty: ratio NaN)."""
    a, b = _runs(table, n, hidden, deep), _runs(table, n, hidden, shallow)
    cut_a, cut_b = a["drop_step"].isna().any(), b["drop_step"].isna().any()
    if a.empty or b.empty or (cut_a and cut_b):
        return (math.nan, math.nan), len(a), len(b), "none"
    bound = "at least" if cut_a else "at most" if cut_b else "exact"
    at = lambda runs: runs["drop_step"].fillna(
        runs["steps_run"]
    )  # a run that never dropped: at its last step
    return ratio_of_means(at(a), at(b)), len(a), len(b), bound


def _undropped(table: pd.DataFrame, n: int, layers: tuple[int, ...], hidden: int = 64) -> str:
    """'6 layers: seeds 1, 3 (by steps 30,000, 28,150)': the runs that did not drop."""
    parts = []
    for L in layers:
        runs = _runs(table, n, hidden, L)
        cut = runs[runs["drop_step"].isna()]
        if len(cut):
            parts.append(
                f"{L} layers: seed{'s' if len(cut) > 1 else ''} {', '.join(str(int(s)) for s in cut['seed'])}"
                f" ({_by_steps(cut)})"
            )
    return "; ".join(parts)


def _depth_claim(table: pd.DataFrame, n: int, deep: int, shallow: int, *, claim: str, sense: str) -> dict:
    """One depth claim's row (`depth_ratio`). A bound decides one way only (for "below": "at
    most" can show it, "at least" refute it); "about" claims need the ratio itself."""
    (r, se), ka, kb, bound = depth_ratio(table, n, deep, shallow)
    row = {
        "n": int(n),
        "claim": claim,
        "ours": r,
        "se": se,
        "seeds": f"{ka} / {kb}",
        "sense": sense,
        "reference": 1.0,
        "compares": ((n, 64, deep), (n, 64, shallow)),
        "bound": bound,
        "note": None,
    }
    undropped = _undropped(table, n, (deep, shallow))
    if bound == "none" and ka and kb:
        row["note"] = f"runs of both settings did not drop ({undropped}): no bound either way"
    elif bound in ("at most", "at least"):
        row["left_out"] = (
            f"{bound} {r:.2f}: runs that did not drop are counted at their last step ({undropped})"
        )
        if sense == "about":
            row["note"] = f"a bound ({bound} {r:.2f}), not the ratio a claim of 'about 1' needs"
        else:
            row["undecided_unless"] = "same direction" if bound == "at most" else "differs"
    return row


def claims(table: pd.DataFrame) -> list[dict]:
    """The appendix's four claims per task size: {n, claim, ours, se, seeds, note, compares:
    two (n, hidden, layers)}; ours NaN (the note says why) where a setting is missing,
    never dropped or never converged; drop-step claims may carry a `bound`."""
    out = []
    for n in (int(n) for n in sorted(table["n"].unique())):
        out.append(
            _final_claim(
                table,
                n,
                (128, 4),
                (32, 4),
                claim="wider is better: final L_mask at hidden 128 / at hidden 32",
            )
        )
        out.append(
            _depth_claim(
                table,
                n,
                6,
                4,
                claim="6 layers drop earlier than 4: drop step at 6 layers / at 4",
                sense="below",
            )
        )
        out.append(
            _depth_claim(
                table, n, 8, 6, claim="more layers add little: drop step at 8 layers / at 6", sense="about"
            )
        )
        out.append(
            _final_claim(
                table, n, (64, 6), (64, 4), claim="deeper ends lower: final L_mask at 6 layers / at 4"
            )
        )
    return out


def large_model_finals(table: pd.DataFrame) -> pd.DataFrame:
    """E20's 12-layer runs: per setting, the task, the steps run and the final total MSE L
    (mean over the last 10 % of steps, from the sweep's final L_obs and L_mask pooled by
    p_mask), against the paper's "of the order of 1e-3"."""
    t = table.copy()
    t["final_L"] = (1 - t["p_mask"]) * t["final_L_obs"] + t["p_mask"] * t["final_L_mask"]
    return t[
        [
            "setting",
            "seed",
            "n",
            "rank",
            "layers",
            "heads",
            "hidden",
            "lr",
            "steps_run",
            "drop_step",
            "final_L",
        ]
    ].reset_index(drop=True)


def order_of_magnitude(values: pd.Series) -> float:
    """The mean of log10 of the values: -3 for "of the order of 1e-3"."""
    v = values.dropna().astype(float)
    return float(np.log10(v).mean()) if len(v) else math.nan
