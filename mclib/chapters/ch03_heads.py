"""Chapter 03, heads (book/03_heads.ipynb): how the model completes the matrix after the drop.

The paper (§3.2) reads its post-shift checkpoint: head jobs (E9), ablations (E3-E5), switched
attention weights and shuffled positions (E6, E7), patching (E8), a structured mask (E10) and
linear probes (E11). Heads are labelled by measured scores, not by the authors' head numbers.
In page order, each computation (`heads_tables`, re-exported here) then its `*_shown`:
post_losses + settings_table; e9_heads + e9_shown; progress_table + progress_shown;
ablation_at_post + ablation_shown; e6_e7_tables + e6_e7_shown; e8_table + e8_shown;
e10_heads + e10_shown (both `e10_masks`); probe_table + probes_shown; then readings (rows and
sentences, with `heads_readings` for E3-E9 and `heads_structure` for E10-E11), scorecard_table
and closing_glue.

`ch` is the chapter's `Chapter`; glue is {name: value}; figures come closed (glued, not shown twice).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ..analyses.evaluate import sample_eval_batch
from ..analyses.heads import LABELS, checkpoint_maps, classify_heads, line_index, masked_lines, pick_heads
from ..analyses.heads import e10_masks as e10_masks
from ..analyses.loss_tables import head_name, lookup, permutation_errors
from ..analyses.probes import best_probe_layers
from ..book.plots_base import closed
from ..book.scorecard import claim as _row
from ..book.scorecard import recorded_table
from ..book.scorecard_rules import CUT, copy_levels, row_verdict
from ..book.scorecard_stage import stage
from ..book.scorecard_tables import task_departures, verdict_counts
from ..book.spec import ChapterSpec
from ..core.metrics import DROP_FRACTION, LOSS_NAMES
from ..core.paper import PAPER
from .heads_plots import attention_grid, head_label_heatmap, loss_bars, probe_lines, progress_lines
from .heads_readings import e3_rows, e4_rows, e5_rows, e6_e7_rows, e8_rows, e9_rows
from .heads_rejudged import pre_read, rejudged, restated, rule_of
from .heads_structure import MOSTLY, e11_rows

# E10's sentence and kind rows, read through this module by `readings` and by the tests
from .heads_structure import e10_kind_rows as e10_kind_rows
from .heads_structure import lone_text as lone_text
from .heads_tables import CHAPTER, E6_MODEL, PAPER_MASK, PROGRESS_MATRICES, Heads, Structured

# what the notebook calls through this module, computed there (`x as x`: re-exported; e10_masks
# too, from mclib.analyses.heads)
from .heads_tables import ablation_at_post as ablation_at_post
from .heads_tables import e6_e7_tables as e6_e7_tables
from .heads_tables import e8_table as e8_table
from .heads_tables import e9_heads as e9_heads
from .heads_tables import e10_heads as e10_heads
from .heads_tables import post_losses as post_losses
from .heads_tables import probe_table as probe_table
from .heads_tables import progress_table as progress_table
from .loss_tables_shown import PAPER_COLUMNS, PAPER_LEVEL, READINGS, loss_figure, loss_styler


def completes(base: dict, level: float) -> bool:
    """The model completes the matrix: L_mask below DROP_FRACTION·E[X²] (the drop's threshold)."""
    return base["L_mask"] < DROP_FRACTION * level


def settings_table(ch, base: dict):
    """The run, the two checkpoints and the sample, as a styled table."""
    A = ch.cfg.analysis
    return (
        pd.DataFrame(
            {
                "setting": ["run", "post-shift checkpoint", "pre-shift checkpoint", "evaluation"],
                "value": [
                    ch.where,
                    f"step {ch.steps.post:,} of {ch.cfg.train.steps:,} "
                    f"({ch.relative_to_drop(ch.steps.post)}); "
                    f"L_mask {base['L_mask']:.3g} ± {base['L_mask_se']:.2g} ({A.headline_matrices:,} "
                    "matrices)",
                    f"step {ch.steps.pre:,}",
                    f"fresh matrices, seed {A.seed}: {A.headline_matrices:,} for every loss (the headline, "
                    f"E3–E8), {A.eval_matrices} for the attention maps (E9, E10)",
                ],
            }
        )
        .style.hide(axis="index")
        .set_caption("What this chapter looks at. Heads are numbered from 1 (the paper's numbering).")
    )


# --- E9: what every head attends to ----------------------------------------------------------


def e9_shown(ch, heads: Heads) -> tuple[object, dict]:
    """The label -> heads table (styled) and glue: fig_maps, fig_labels, n_side."""
    n, maps, labels = ch.cfg.data.n, heads.maps, heads.labels
    titles = [
        [f"{head_name((l, h))}: {labels[(l, h)]}" for h in range(maps.shape[1])] for l in range(maps.shape[0])
    ]
    fig_maps = attention_grid(
        maps, titles=titles, n=n, title=f"Batch-mean attention of every head, step {ch.steps.post:,}"
    )
    fig_labels = head_label_heatmap(
        labels, title=f"Head labels from the measured scores, step {ch.steps.post:,}"
    )
    mapping = pd.DataFrame(
        [
            {
                "label": lab,
                "heads": len(heads.groups[lab]),
                "which": ", ".join(head_name(p) for p in heads.groups[lab]) or "—",
            }
            for lab in LABELS
        ]
    )
    table = mapping.style.hide(axis="index").set_caption(
        "Our head groups: label → heads (layer, head from 1)."
    )
    return table, {"fig_maps": closed(fig_maps), "fig_labels": closed(fig_labels), "n_side": str(n)}


# --- how the structure arrives -----------------------------------------------------------------


def progress_shown(ch, progress: pd.DataFrame, heads: Heads) -> dict:
    """glue: fig_progress (the excess scores over training) and fig_evolution (the most
    row-, column- and self-like heads at post, at each analysis checkpoint)."""
    A, n, st = ch.cfg.analysis, ch.cfg.data.n, ch.steps
    fig_progress = progress_lines(
        progress,
        ch.drop,
        mark={"pre-shift": st.pre, "post-shift": st.post},
        title=f"Attention structure during training: profile {ch.cfg.name}",
    )
    picks = pick_heads(
        heads.scores,
        {"row": ("row_excess", True), "column": ("column_excess", True), "self": ("self_excess", True)},
    )
    steps = st.all_steps()
    small = sample_eval_batch(ch.cfg.data, min(PROGRESS_MATRICES, A.eval_matrices), A.seed)
    by_step = checkpoint_maps({s: ch.model(s) for s in steps}, small)
    evo = torch.stack([torch.stack([by_step[s][l, h] for s in steps]) for l, h in picks.values()])
    phase = lambda s: "pre" if s == st.pre else "post" if s == st.post else "transition"
    fig_evolution = attention_grid(
        evo,
        row_labels=[f"{head_name(p)}\nmost {k}" for k, p in picks.items()],
        col_labels=[f"step {s:,} ({phase(s)})" for s in steps],
        n=n,
        title="Three heads across training",
    )
    return {"fig_progress": closed(fig_progress), "fig_evolution": closed(fig_evolution)}


# --- E3, E4, E5: ablating heads after the drop ------------------------------------------------


def ablation_shown(ch, abl: pd.DataFrame) -> tuple[object, dict]:
    """The ablation table (styled) and glue: fig_ablation."""
    cols = ["ablated", "reading", "heads", "L_obs", "paper L_obs", "L_mask", "paper L_mask", "mask_value"]
    table = loss_styler(
        abl.replace({"reading": READINGS}),
        cols,
        cols[3:],
        f"Ablations at step {ch.steps.post:,}, the same {ch.cfg.analysis.headline_matrices:,} matrices for "
        "every row. Paper: E3 for 'all heads', E4 (its five 'uninterpretable' heads) for 'other heads', "
        "every head our scores leave unlabelled; "
        "empty groups are left out. " + PAPER_COLUMNS,
    )
    short = {"—": "", "uniform": ", uniform", "batch_mean": ", batch mean"}
    fig = loss_bars(
        [("nothing ablated" if a == "none" else a + short[r]) for a, r in zip(abl.ablated, abl.reading)],
        {"L_obs": abl["L_obs"], "L_mask": abl["L_mask"]},
        errors={"L_obs": abl["L_obs_se"], "L_mask": abl["L_mask_se"]},
        paper={"L_obs": list(abl["paper L_obs"]), "L_mask": list(abl["paper L_mask"])},
        title=f"E3-E5: ablating heads at step {ch.steps.post:,}",
        level=ch.copy_level,
        paper_level=PAPER_LEVEL,
    )
    return table, {"fig_ablation": closed(fig)}


# --- E6, E7: the pre-shift attention weights, shuffled positions ---------------------------------


def e6_e7_shown(ch, e67: pd.DataFrame, perm: pd.DataFrame) -> tuple[object, dict]:
    """E6 and E7 in one table (permutations by their mean, with the paper's columns), and glue:
    fig_e6_e7, pre_step."""
    mean = f"positions permuted (E7), mean of {len(perm)}"
    shown = pd.concat(
        [
            e67[~e67.model.isin(perm.model)],
            pd.DataFrame([{"model": mean, **perm[list(LOSS_NAMES)].mean(), **permutation_errors(perm)}]),
        ]
    )
    shown = shown.set_index("model").loc[["post", E6_MODEL, mean, "pre"]].reset_index()
    shown["paper L_obs"] = [
        PAPER[("E3", "post L_obs")],
        PAPER[("E6", "pre-QKV into post L_obs")],
        PAPER[("E7", "L_obs")],
        PAPER[("E3", "pre L_obs")],
    ]
    shown["paper L_mask"] = [
        PAPER[("E3", "post L_mask")],
        None,
        PAPER[("E7", "L_mask")],
        PAPER[("E3", "pre L_mask")],
    ]
    cols = ["model", "L_obs", "paper L_obs", "L_mask", "paper L_mask", "mask_value"]
    table = loss_styler(
        shown,
        cols,
        cols[1:],
        f"E6 and E7 at step {ch.steps.post:,}; the permuted rows range over "
        f"L_mask {perm.L_mask.min():.3g} to {perm.L_mask.max():.3g}. " + PAPER_COLUMNS,
    )
    fig = loss_figure(shown, "E6 and E7: switched attention weights, permuted positions", ch.copy_level)
    return table, {"fig_e6_e7": closed(fig), "pre_step": f"{ch.steps.pre:,}"}


# --- E8: activation patching, X -> -X -----------------------------------------------------------


def e8_shown(ch, e8: pd.DataFrame) -> tuple[object, dict]:
    """E8's table (styled) and glue: fig_e8."""
    cols = [
        "patched",
        "masked_vs_X",
        "paper masked_vs_X",
        "masked_vs_negX",
        "paper masked_vs_negX",
        "observed_vs_X",
        "observed_vs_negX",
    ]
    table = loss_styler(
        e8,
        cols,
        cols[1:],
        f"E8 at step {ch.steps.post:,}: MSE of the patched output to X and to −X "
        "at masked and observed entries; 'none' is the −X run with nothing patched. " + PAPER_COLUMNS,
        fmt="{:.3g}",
    )
    fig = loss_bars(
        list(e8.patched),
        {"masked: MSE to X": e8["masked_vs_X"], "masked: MSE to −X": e8["masked_vs_negX"]},
        errors={"masked: MSE to X": e8["masked_vs_X_se"], "masked: MSE to −X": e8["masked_vs_negX_se"]},
        paper={
            "masked: MSE to X": list(e8["paper masked_vs_X"]),
            "masked: MSE to −X": list(e8["paper masked_vs_negX"]),
        },
        title="E8: attention outputs of X patched into the run on −X",
        xlabel="MSE at masked entries / E[X²] (log scale)",
        level=ch.copy_level,
        paper_level=PAPER_LEVEL,
    )
    return table, {"fig_e8": closed(fig)}


# --- E10: a structured mask -----------------------------------------------------------------------

# E10's glue names per `e10_masks` key, spelled out so that grep finds each: the best heads'
# figure, every head's figure, the sentence on the lone-entry head
E10_GLUE = {
    "rows": ("fig_e10_rows", "fig_e10_rows_all", "e10_rows_text"),
    "columns": ("fig_e10_columns", "fig_e10_columns_all", "e10_columns_text"),
}


E10_COLUMNS = ["lone_entry", "masked_lines", "self", "row_excess", "column_excess"]


def e10_shown(ch, s: Structured, labels: pd.Series) -> tuple[object, dict]:
    """E10 under one mask: the picked heads' table (styled) and glue, NAME = s.name: fig_e10_NAME,
    fig_e10_NAME_all and, for a mask other than PAPER_MASK, e10_NAME_text (the paper mask's comes
    from `readings`)."""
    n = ch.cfg.data.n
    axis, lines = masked_lines(s.mask, n)
    flat, in_lines = s.mask.reshape(-1), torch.isin(line_index(axis, n), torch.tensor(lines))
    kept = torch.nonzero(in_lines & ~flat).flatten().tolist()
    marks = (
        dict(query_bands=[(r * n, r * n + n - 1) for r in lines])
        if axis == "row"
        else dict(query_marks=torch.nonzero(in_lines).flatten().tolist())
    )
    here = classify_heads(s.scores)
    picked = torch.stack([torch.stack([s.maps[l, h] for l, h in s.picks.values()])])
    fig = attention_grid(
        picked,
        col_labels=[f"{head_name(p)}: {k}" for k, p in s.picks.items()],
        n=n,
        key_marks=kept,
        panel=2.6,
        **marks,
        title=f"Masked {axis}s, step {ch.steps.post:,}: the best head of each kind",
    )
    titles = [
        [f"{head_name((l, h))}: {here[(l, h)]}" for h in range(s.maps.shape[1])]
        for l in range(s.maps.shape[0])
    ]
    fig_all = attention_grid(
        s.maps,
        titles=titles,
        n=n,
        key_marks=kept,
        **marks,
        title=f"Masked {axis}s, step {ch.steps.post:,}: every head (label under this mask)",
    )
    by_head = s.scores.set_index(["layer", "head"])
    table = pd.DataFrame(
        [
            {
                "kind": k,
                "head": head_name(p),
                **by_head.loc[p, E10_COLUMNS],
                "label (random masks)": labels[p],
                "label (this mask)": here[p],
            }
            for k, p in s.picks.items()
        ]
    )
    styled = (
        table.style.hide(axis="index")
        .format("{:.3f}", subset=E10_COLUMNS)
        .set_caption(
            f"E10, masked {axis}s: head scores. A uniform head has lone_entry {s.chance['lone_entry']:.3f}, "
            f"masked_lines {s.chance['masked_lines']:.3f}, self {1 / n**2:.3f}. Under this mask L_obs = "
            f"{s.losses['L_obs']:.2e}, L_mask = {s.losses['L_mask']:.3f}."
        )
    )
    fig_name, fig_all_name, text_name = E10_GLUE[s.name]
    glue = {fig_name: closed(fig), fig_all_name: closed(fig_all)}
    if s.name != PAPER_MASK:  # the paper's mask is compared with the paper: its sentence comes with its row
        glue[text_name] = lone_text(s.lone, s.chance["lone_entry"], axis)
    return styled, glue


# --- E11: linear probes ----------------------------------------------------------------------------


def probes_shown(ch, probes: pd.DataFrame) -> tuple[object, dict]:
    """The best layer per target (styled) and glue: fig_probes, probe_fit, probe_test."""
    A = ch.cfg.analysis
    best = best_probe_layers(probes)
    table = (
        best[["layer", "mse", "mse_zero", "rel", "abs_cos"]]
        .style.format("{:.3g}")
        .format("{:d}", subset=["layer"])
        .set_caption(
            "The best layer per target at the masked positions (lowest test MSE relative to predicting 0)."
        )
    )
    fig = probe_lines(probes, title=f"Linear probes per layer, step {ch.steps.post:,}")
    return table, {
        "fig_probes": closed(fig),
        "probe_fit": f"{A.probe_fit:,}",
        "probe_test": f"{A.probe_test:,}",
    }


# --- the scorecard -----------------------------------------------------------------------------


@dataclass(kw_only=True)
class Results:
    """What the chapter computed, as `readings` and `closing_glue` read it (keyword-only)."""

    abl: pd.DataFrame  # `ablation_at_post`
    e67: pd.DataFrame  # `e6_e7_tables`: the models
    perm: pd.DataFrame  #   and the permuted rows
    e8: pd.DataFrame  # `e8_table`
    heads: Heads  # `e9_heads`: scores, labels, groups at post
    pre_scores: pd.DataFrame | None  # `scores_at` the pre-shift checkpoint (None: not saved)
    structured: Structured  # `e10_heads` under the paper's mask
    probes: pd.DataFrame  # `probe_table`


def readings(ch, r: Results) -> tuple[dict, list[dict]]:
    """(glue, rows): the scorecard rows, each scale-free (a ratio of losses on the same matrices,
    a loss over E[X²], a head score), and their sentences: e3_match, e4_text, e5_text, e8_text,
    e9_text, e10_rows_text, e11_text, e11_layer."""
    levels = copy_levels(ch.cfg.data.rank)["low-rank"]  # (ours, the paper's) E[X²]
    layers = ch.cfg.model.layers
    glue, rows = {}, []
    for part_glue, part_rows in (
        e3_rows(r.abl, levels),
        e4_rows(r.abl),
        e5_rows(r.abl, r.heads.groups),
        e6_e7_rows(r.e67, r.perm, levels),
        e8_rows(r.e8, r.abl, levels),
        e9_rows(r.heads.scores, r.pre_scores),
        e10_rows(r.structured),
        e11_rows(r.probes, layers),
    ):
        glue.update(part_glue)
        rows += part_rows
    return glue, pre_read(rows, ch.steps.pre, not task_departures(ch.cfg))


def scorecard_table(ch, rows: list[dict]):
    """Records `rows` in the run's scorecard; returns them with their verdicts, styled."""
    return recorded_table(ch.run_dir, rows, CHAPTER)


def e10_rows(structured: Structured) -> tuple[dict, list[dict]]:
    """(glue, rows) of E10 under the paper's mask: the lone-entry head's mass with its sentence,
    then `e10_kind_rows`."""
    lone, lone_chance = structured.lone, structured.chance["lone_entry"]
    row = _row(
        "E10",
        "structured mask: the best head's mass on the lone observed entry",
        float(lone),
        f"a uniform head: {lone_chance:.3f}; above {MOSTLY:g} counts (most of its attention)",
        kind="direction",
        reference=MOSTLY,
        sense="above",
        margin=CUT,
    )
    glue = {E10_GLUE[PAPER_MASK][2]: lone_text(lone, lone_chance, "row", row_verdict(row))}
    return glue, [row, *e10_kind_rows(structured)]


# --- what a GPU lease re-judges by (mclib.lease.reference, mclib.lease.part) --------------------

# The glued sentences that state a row's verdict, by the experiment they speak for
# (`mclib.lease.part.restate`).
SPEAKS_FOR = {"e3_match": "E3", "e4_text": "E4", "e8_text": "E8", "e10_rows_text": "E10", "e11_text": "E11"}


# --- What we found -----------------------------------------------------------------------------


def phase_text(base: dict, level: float, at=None) -> str:
    """Whether the post model completes the matrix (`completes`), and what that means for the
    comparisons below, worded by the run's stage `at` (a cut run's are provisional)."""
    if completes(base, level):
        return (
            f"the model completes the matrix: L_mask is {base['L_mask']:.3g}, against E[X²] = {level:.3f} "
            "for a "
            "copying model; "
            + (
                at.comparisons
                if at is not None
                else "the comparisons below read the run's end, as the paper reads its own"
            )
        )
    return (
        f"the model does not complete the matrix yet: L_mask is {base['L_mask']:.3g}, near E[X²] = "
        f"{level:.3f}. "
        "Every comparison below therefore sets a model without the drop against the paper's model after it, "
        "and differences are expected"
    )


def progress_text(progress: pd.DataFrame, drop: int | None) -> str:
    """The largest excess of any head at the first and the last saved checkpoint."""
    top = progress.groupby("step")[["row_excess", "column_excess", "self_excess"]].max().max(axis=1)
    return (
        f"the largest excess of any head goes from {top.iloc[0]:.2f} at step {top.index[0]:,} to "
        f"{top.iloc[-1]:.2f} at step {top.index[-1]:,}"
        + ("" if drop is None else f", against a drop at step {drop:,}")
    )


def closing_glue(ch, r: Results, base: dict, progress: pd.DataFrame, verdicts) -> dict:
    """The sentences of "What we found" that `readings` does not give; `verdicts`: those of the
    recorded rows."""
    abl, e67, perm, labels, groups = r.abl, r.e67, r.perm, r.heads.labels, r.heads.groups
    L = lambda a, mode="—": lookup(abl, "L_mask", ablated=a, reading=mode)
    sw = e67.set_index("model").loc[E6_MODEL]
    return {
        "post_step": f"{ch.steps.post:,}",
        "phase_text": phase_text(base, ch.copy_level, stage(ch.end, ch.metrics, ch.cfg.data.rank)),
        "head_counts": ", ".join(f"{len(groups[lab])} {lab}" for lab in LABELS)
        + f" (of {len(labels)} heads)",
        "progress_text": progress_text(progress, ch.drop),
        "e3_text": (
            f"L_mask goes from {L('none'):.3g} to {L('all heads', 'uniform'):.3g} (uniform) and "
            f"{L('all heads', 'batch_mean'):.3g} (batch mean); the paper, on its own task: "
            f"{PAPER[('E3', 'post L_mask')]} to {PAPER[('E3', 'post ablated L_mask')]}"
        ),
        "e6_text": (
            f"L_obs {sw.L_obs:.2g} and L_mask {sw.L_mask:.3g} (the paper, on its own task: L_obs "
            f"{PAPER[('E6', 'pre-QKV into post L_obs')]})"
        ),
        "e7_text": (
            f"L_obs {perm.L_obs.mean():.2g} and L_mask {perm.L_mask.mean():.3g} (the paper, on its own task: "
            f"{PAPER[('E7', 'L_obs')]} and {PAPER[('E7', 'L_mask')]})"
        ),
        "verdicts": verdict_counts(verdicts),
        "n_rows": len(list(verdicts)),
    }


# What this chapter declares to the machinery (mclib.book.spec; collected by mclib.chapters.registry).
SPEC = ChapterSpec(CHAPTER, rejudged=rejudged, rule_of=rule_of, speaks_for=SPEAKS_FOR, restated=restated)
