"""The plateau through the authors' 2025 follow-up (docs/protocol.md §5): chapter 07's last
section, its tables, figures and scorecard rows (recorded under chapter 07). The measures are
`mclib.analyses.plateau`; the intervention is `model.attn_bias` (sweeps/attention-bias.yaml).

Each claim (protocol §5.3) is one row of kind "finding" (`scorecard.finding`: shown and counted
apart from the 2024 paper's claims), judged with the error over seeds; its source is SOURCE,
its figures cited as "its figure N" (the follow-up code README's numbers):

  F1 repetition      masked spread ratio, plateau − after, per seed: mean below 0 by > 2 s.e.
  F2 collapse        last hidden state's cosine, plateau − after: mean above 0 by > 2 s.e.
  F3 attention lead  steps by which the largest layer's attention share leaves its plateau band
                     before the drop (`progress.plateau_leads`; no lead counts 0): mean above 0 by > 2 s.e.
  F4 intervention    mean drop step with a row/column bias over the unbiased one's below 1
                     (F4a), the control's above 1 (F4b), beyond 2 s.e. and a 10 % margin; a run
                     without a drop counts at its last step, a lower bound
  F5 LLMs            not testable here

"Plateau": the mean over checkpoints in [drop/2, drop); "after": the last checkpoint, at least
AFTER_MIN steps past the drop. F4's sweep and rows: followup_intervention.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown

from ..analyses import plateau, progress
from ..book.chapter import seed_runs
from ..book.plots_base import closed
from ..book.scorecard import claim, recorded_table
from ..book.scorecard_tables import plural
from ..core.metrics import find_drop
from ..core.packaged import data_file
from ..core.runs import load_metrics
from ..core.sweep import load_sweep
from ..core.sweep_figure import setting_colours
from ..lease import slices
from .followup_intervention import ATTENTION_BIAS_SWEEP, SOURCE, intervention_rows, sweep_base, sweep_drops
from .followup_intervention import BIASED as BIASED  # re-exported: the settings F4 compares
from .followup_intervention import CONTROL as CONTROL
from .followup_intervention import UNBIASED as UNBIASED

CHAPTER = "07_beyond"
ATTENTION_BIAS = data_file("attention_bias.csv")  # the sweep's rows
ATTENTION_BIAS_MEASURES = data_file("attention_bias_measures.csv")  # its runs' measures
SWEEP_COMMAND = (
    "taskset -c 1 nice -n 10 python -m mclib sweep sweeps/attention-bias.yaml --runs runs/sweep "
    "--results docs/data/attention_bias.csv --figure docs/figures/attention_bias.png"
)
AFTER_MIN = 500  # the "after" checkpoint lies at least this many steps past the drop


# --- the measures over training ------------------------------------------------------------------


def curves(ch, run_dirs: dict | None = None) -> pd.DataFrame:
    """`plateau.plateau_table` of every seed's run (`run_dirs` {seed: folder}; None: `analysis.seeds`),
    one row per (seed, checkpoint), with drop_step (NaN: none) and setting = the profile's name;
    `attrs["skipped"]`: {seed: [steps without a model]}."""
    if run_dirs is None:
        run_dirs = seed_runs(ch.cfg, ch.run_dir)
    frames, skipped = [], {}
    for seed, run_dir in run_dirs.items():
        t = plateau.plateau_table(
            run_dir, ch.cfg.data, n_matrices=ch.cfg.analysis.eval_matrices, seed=ch.cfg.analysis.seed
        )
        skipped[seed] = t.attrs["skipped"]
        drop = find_drop(load_metrics(run_dir), rank=ch.cfg.data.rank)
        frames.append(
            t.assign(setting=ch.cfg.name, seed=seed, drop_step=drop if drop is not None else math.nan)
        )
    table = pd.concat(frames, ignore_index=True)
    table.attrs["skipped"] = skipped
    return table


def last_layer(table: pd.DataFrame, prefix: str) -> str:
    """The column of the last layer among `prefix` + _L{l}; ValueError when there is none."""
    cols = [c for c in table.columns if c.startswith(prefix + "_L")]
    if not cols:
        raise ValueError(f"the table has no {prefix}_L* column")
    return max(cols, key=lambda c: int(c.rsplit("L", 1)[1]))


def phases(table: pd.DataFrame, measure: str) -> pd.DataFrame:
    """Per seed: `plateau` (mean of `measure` over [drop/2, drop)), `after` (the last checkpoint's,
    NaN unless AFTER_MIN past the drop) and `change`; NaN throughout without a drop."""
    rows = []
    for seed, t in table.groupby("seed"):
        drop = float(t["drop_step"].iloc[0])
        if not np.isfinite(drop):
            rows.append({"seed": seed, "plateau": math.nan, "after": math.nan, "change": math.nan})
            continue
        on = t[(t["step"] >= drop / 2) & (t["step"] < drop)][measure]
        last = t.sort_values("step").iloc[-1]
        after = float(last[measure]) if last["step"] >= drop + AFTER_MIN else math.nan
        p = float(on.mean()) if len(on) else math.nan
        rows.append({"seed": seed, "plateau": p, "after": after, "change": p - after})
    return pd.DataFrame(rows)


def _mean_se(values) -> tuple[float | None, float | None, int]:
    v = np.asarray([x for x in values if np.isfinite(x)], dtype=float)
    if not len(v):
        return None, None, 0
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else None, len(v)


def _paired_row(id: str, quantity: str, table: pd.DataFrame, *, measure: str, sense: str, what: str) -> dict:
    ph = phases(table, measure)
    mean, se, k = _mean_se(ph["change"])
    reading = (
        f"plateau − after = {mean:+.3g}"
        + (f" ± {se:.2g}" if se is not None else "")
        + f" (mean ± s.e. over {plural(k, 'seed')}; {measure}); the follow-up: {what}"
        if mean is not None
        else f"no seed with both a plateau and an after value; the follow-up: {what}"
    )
    return claim(
        id,
        f"{quantity} ({SOURCE})",
        mean,
        reading,
        kind="finding",
        reference=0.0,
        sense=sense,
        se=se,
        na=None
        if k >= 2
        else f"{k} seed{'s' if k != 1 else ''} with a plateau and an after value: no error over seeds",
    )


def repetition_row(table: pd.DataFrame) -> dict:
    """F1: the masked outputs' spread ratio is lower on the plateau than after the drop."""
    return _paired_row(
        "F1",
        "repetition analogue: masked spread ratio, plateau − after",
        table,
        measure="spread_ratio",
        sense="below",
        what="outputs repeat on the plateau (its figure 2), a bias its token-level measure sees "
        "beyond what the loss rewards; here a spread this low is what the loss asks of a "
        "model that cannot yet compute",
    )


def collapse_row(table: pd.DataFrame) -> dict:
    """F2: the last hidden state's collapse is higher on the plateau than after the drop."""
    return _paired_row(
        "F2",
        "representation collapse: cosine of masked entries' last hidden states, plateau − after",
        table,
        measure=last_layer(table, "collapse"),
        sense="above",
        what="hidden states nearly parallel on the plateau (its figures 2, 41-42)",
    )


def attention_lead_row(table: pd.DataFrame, seed: int = 0) -> dict:
    """F3: attention progress leads the drop, on the share of the layer largest at the end."""
    last = table[table["seed"] == table["seed"].min()].sort_values("step").iloc[-1]
    shares = [c for c in table.columns if c.startswith("share_L")]
    measure = max(shares, key=lambda c: last[c])
    leads = []
    for s, t in table.groupby("seed"):
        drop = float(t["drop_step"].iloc[0])
        if not np.isfinite(drop):
            continue
        r = progress.plateau_leads(t[["step", measure]], drop, seed=seed).iloc[0]
        leads.append(float(r["lead"]) if np.isfinite(r["lead"]) else 0.0)
    mean, se, k = _mean_se(leads)
    reading = (
        f"{measure} leaves its plateau band {mean:,.0f}"
        + (f" ± {se:,.0f}" if se is not None else "")
        + f" steps before the drop (mean ± s.e. over {plural(k, 'seed')}, a seed without a lead counting 0)"
        if mean is not None
        else "no seed dropped"
    )
    return claim(
        "F3",
        f"attention progress (row+column share) leads the drop, steps ({SOURCE})",
        mean,
        reading + "; the follow-up: hidden progress in attention before the drop (its figure 2)",
        kind="finding",
        reference=0.0,
        sense="above",
        se=se,
        na=None if k >= 2 else f"{plural(k, 'seed')} with a drop: no error over seeds",
    )


# What each follow-up row is judged by besides its numbers (the finding rule's reference and
# sense, as the functions above build them), for a row recorded without it (`rule_of`).
RULES = {
    "F1": (0.0, "below"),
    "F2": (0.0, "above"),
    "F3": (0.0, "above"),
    "F4a": (1.0, "below"),
    "F4b": (1.0, "above"),
    "F5": (0.0, "above"),
}


def rule_of(row: dict) -> dict:
    """The reference and sense of a follow-up row (`RULES`); {} for another row."""
    found = RULES.get(row["id"])
    return {} if found is None else {"reference": found[0], "sense": found[1]}


def _mean_and_se(values: pd.Series) -> tuple[float, float]:
    v = values.dropna().astype(float)
    return (
        float(v.mean()) if len(v) else math.nan,
        float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan,
    )


def strength_table(sweep: pd.DataFrame, measures: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per sweep setting: bias, target, seeds, dropped, drop step ± s.e. (no drop: the last
    step), plateau and final L_mask ± s.e. and, with `measures`, the last hidden state's collapse
    on the plateau and at the end."""
    drops = sweep_drops(sweep).set_index("setting")
    rows = []
    for setting, t in sweep.groupby("setting", sort=False):
        first = t.iloc[0]
        row = {
            "setting": setting,
            "attn_bias": float(first.get("attn_bias", 0.0)),
            "target": first.get("attn_bias_target", "row_col"),
            "seeds": len(t),
            "dropped": int(drops.loc[setting, "dropped"]),
            "drop_step": drops.loc[setting, "drop_mean"],
            "drop_se": drops.loc[setting, "drop_se"],
        }
        for col in ("plateau_L_mask", "final_L_mask"):
            row[col], row[col + "_se"] = _mean_and_se(t[col])
        if measures is not None and (measures["setting"] == setting).any():
            m = measures[measures["setting"] == setting]
            ph = phases(m.assign(drop_step=m["drop_step"].astype(float)), last_layer(m, "collapse"))
            ends = m.sort_values("step").groupby("seed").tail(1)[last_layer(m, "collapse")]
            row["collapse_plateau"], row["collapse_plateau_se"] = _mean_and_se(ph["plateau"])
            row["collapse_end"], row["collapse_end_se"] = _mean_and_se(ends)
        rows.append(row)
    return pd.DataFrame(rows)


def measures_figure(measures: pd.DataFrame):
    """Three panels over training, one line per setting (mean over seeds, ± s.e. shaded where two
    or more): collapse, masked spread ratio, largest attention share; dashed: mean drop step."""
    collapse = last_layer(measures, "collapse")
    shares = [c for c in measures.columns if c.startswith("share_L")]
    data = measures.assign(share_max=measures[shares].max(axis=1))
    panels = (
        (collapse, f"collapse ({collapse}: cosine of masked entries)"),
        ("spread_ratio", "masked spread ratio (repetition analogue)"),
        ("share_max", "row+column attention share (largest layer)"),
    )
    colours = setting_colours(list(dict.fromkeys(data["setting"])))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), constrained_layout=True)
    for ax, (col, title) in zip(axes, panels):
        for setting, t in data.groupby("setting", sort=False):
            g = t.groupby("step")[col]
            mean, se = g.mean(), g.std(ddof=1) / np.sqrt(g.count())
            ax.plot(mean.index, mean.values, color=colours[setting], label=setting)
            ok = g.count() >= 2
            ax.fill_between(
                mean.index[ok], (mean - se)[ok], (mean + se)[ok], color=colours[setting], alpha=0.2
            )
            drop = t.groupby("seed")["drop_step"].first().astype(float).mean()
            if np.isfinite(drop):
                ax.axvline(drop, color=colours[setting], ls="--", lw=0.8)
        ax.set(title=title, xlabel="step")
    if "share_chance" in measures:
        axes[-1].axhline(
            float(measures["share_chance"].iloc[0]), color="grey", lw=0.5, ls=":"
        )  # uniform attention
    axes[0].legend(fontsize=8)
    return closed(fig)


def uniform_share_text(n: int) -> str:
    """Uniform attention's share on n×n matrices (`plateau.share_chance`), as a phrase."""
    return (
        f"{plateau.share_chance(n):.3g} for uniform attention on this profile's {n}×{n} matrices, 2(n − 1)/n²"
    )


def paper_setting(profile_name: str, ledger: Path | None = None) -> str:
    """A sentence on whether GPU slices (results/paper-slices.yaml) executed this chapter at the
    paper's setting, naming them, or which slices are planned to."""
    ledger_path = Path(ledger) if ledger is not None else slices.LEDGER
    plan = slices.read_ledger(ledger_path)
    if profile_name == plan["name"]:
        return f"This chapter was executed at the paper's own setting (profile {profile_name})."
    ran = []
    for name, folder in slices.done(ledger_path.parent, plan["name"]).items():
        record = slices.record(folder)
        if CHAPTER in slices.chapters_executed(record):
            ran.append(
                f"slice {name} ({record.get('device', '?')}, {record.get('date', '?')}, revision "
                f"{str(record.get('git', '?'))[:7]}; {folder.name})"
            )
    if ran:
        return (
            "At the paper's own setting these measures were executed by "
            + "; ".join(ran)
            + ': see the part "The paper\'s own setting".'
        )
    will = [s.name for s in plan["slices"] if CHAPTER in s.chapters]
    if will:
        planned = (
            f"slice {', '.join(will)} of {ledger_path.name} executes them, after its other chapters, when "
            "its "
            f"lease has time left"
        )
    else:
        planned = "the slices planned in {} execute other chapters ({})".format(
            ledger_path.name,
            "; ".join(f"slice {s.name}: {', '.join(s.chapters) or 'no chapters'}" for s in plan["slices"]),
        )
    return (
        f"At the paper's own setting (7×7, rank 2, hidden 768) no GPU slice has executed these measures yet: "
        f"{planned}. Everything in this section comes from the profile {profile_name}."
    )


def sweep_shown(sweep: pd.DataFrame | None, measures: pd.DataFrame | None = None):
    """`strength_table` styled, or a Markdown line on how to produce the sweep."""
    if sweep is None or not len(sweep):
        return Markdown(f"No attention-bias rows yet: `{SWEEP_COMMAND}` produces them.")
    table = strength_table(sweep, measures)
    return (
        table.style.hide(axis="index")
        .format(
            {
                **{c: "{:.3g}" for c in table.select_dtypes("float").columns},
                "drop_step": "{:,.0f}",
                "drop_se": "{:,.0f}",
            },
            na_rep="—",
        )
        .set_caption(
            "sweeps/attention-bias.yaml, per setting: the bias strength b (the logits of the target "
            "keys get +b: their weight × e^b) and its target, seeds run and dropped, the drop step (mean "
            "and s.e. over seeds; a run without a drop counts at its last step, a lower bound), L_mask on "
            "the plateau and over each run's last 10 % of steps (which end 2 000 steps after the drop), "
            "and, where the runs were measured (scripts/plateau_measures.py), the last hidden state's "
            "collapse on the plateau and at the end. The `cpu` profile (5×5, rank 1) otherwise."
        )
    )


def strength_figure(sweep: pd.DataFrame | None, measures: pd.DataFrame | None = None):
    """Drop step, final L_mask and (with measures) end collapse against bias strength, mean ± s.e.,
    one marker per target; empty panels that say so without rows."""
    table = strength_table(sweep, measures) if sweep is not None and len(sweep) else None

    cols = [("drop_step", "drop step (no drop: the last step)"), ("final_L_mask", "final L_mask")]
    if table is not None and "collapse_end" in table:
        cols.append(("collapse_end", "collapse at the end"))
    fig, axes = plt.subplots(1, len(cols), figsize=(5 * len(cols), 4), constrained_layout=True)
    if table is None:
        for ax, (_, title) in zip(axes, cols):
            ax.set(title=f"{title}: no sweep rows yet", xlabel="bias strength b (factor e^b)")
        return closed(fig)
    for ax, (col, title) in zip(np.atleast_1d(axes), cols):
        for target, marker in (("row_col", "o"), ("other", "s")):
            t = table[(table["target"] == target) | (table["attn_bias"] == 0)].sort_values("attn_bias")
            se = t[col.replace("_step", "") + "_se"] if col == "drop_step" else t[col + "_se"]
            ax.errorbar(
                t["attn_bias"], t[col], yerr=se, marker=marker, capsize=3, label=f"toward {target} keys"
            )
        ax.set(title=title, xlabel="bias strength b (factor e^b)")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    return closed(fig)


def llm_row() -> dict:
    return claim(
        "F5",
        f"repetition and collapse early in LLM pre-training ({SOURCE})",
        None,
        "the follow-up: Pythia and OLMo checkpoints (its figures 8, 23-25)",
        kind="finding",
        reference=0.0,
        sense="above",
        na="not testable here: this project trains no language model and reads no LLM checkpoint",
    )


def claims_table(ch, rows: list[dict]):
    """Records the rows under chapter 07 and shows them with readings and verdicts."""
    return recorded_table(
        ch.run_dir,
        rows,
        CHAPTER,
        columns=("id", "quantity", "ours", "se", "verdict", "reading"),
        caption="The follow-up's claims on this task (Gopalani & Hu 2025; docs/protocol.md §5), "
        "each a finding beyond the 2024 paper, judged by the finding rule with the error over "
        "seeds and counted apart from the paper's claims.",
    )


def read_sweep(path: str | Path) -> pd.DataFrame | None:
    """The sweep's committed table, or None when it does not exist yet."""
    path = Path(path)
    return pd.read_csv(path) if path.is_file() else None


def readings(ch, table: pd.DataFrame, sweep: pd.DataFrame | None) -> tuple[dict, list[dict]]:
    """(glue, rows): followup_skipped and followup_sweep_rows, and rows F1-F5 (rules: the module
    docstring)."""
    skipped = {s: steps for s, steps in table.attrs.get("skipped", {}).items() if steps}
    planned = load_sweep(ATTENTION_BIAS_SWEEP)
    glue = {
        "followup_skipped": (
            "; ".join(
                f"seed {s}: step{'s' if len(v) > 1 else ''} {', '.join(map(str, v))}"
                for s, v in skipped.items()
            )
            or "none"
        ),
        "followup_sweep_rows": f"{0 if sweep is None else len(sweep)} of the {len(planned)} runs it plans "
        f"({len({r.setting for r in planned})} settings, seeds "
        f"{', '.join(map(str, sorted({r.seed for r in planned})))})",
    }
    other = None if ch.cfg.name == sweep_base() else ch.cfg.name
    rows = [
        repetition_row(table),
        collapse_row(table),
        attention_lead_row(table, ch.cfg.analysis.seed),
        *intervention_rows(sweep, other),
        llm_row(),
    ]
    return glue, rows
