"""Chapter 03, heads (book/03_heads.ipynb): how the model completes the matrix after the drop.

The paper (§3.2) reads its post-shift checkpoint: heads with clear jobs (E9), ablations
(E3-E5), switched attention weights and shuffled positions (E6, E7), activation patching
(E8), a structured mask (E10) and linear probes (E11). Heads are labelled here by scores
the chapter measures (`mclib.analyses.heads`), not by the authors' head numbers. Top to
bottom, in the chapter's order:

    post_losses(ch), settings_table(ch, base)       the post model's losses; what the chapter looks at
    e9_heads(ch), e9_shown(ch, heads)                every head's map, scores, label and group
    progress_shown(ch, progress, heads)              how the structure arrives over training
    ablation_at_post(ch, groups), ablation_shown     E3-E5, both readings
    e6_e7_tables(ch), e6_e7_shown                    E6, E7
    e8_table(ch), e8_shown                           E8, both readings
    e10_heads(ch, mask), e10_shown                   E10, the paper's mask and its transpose (`e10_masks`)
    probe_table(ch), probes_shown                    E11
    readings(ch, results), scorecard_table(ch, rows) the chapter's scorecard rows (scale-free) and their sentences
    closing_glue(...)                                the other run-dependent sentences of "What we found"

The computations these call live in `mclib.analyses` (heads: scores, picks, E10's masks
and scores; evaluate: E8's patching; probes: E11; loss_tables: ablation and model tables).
`ch` is the chapter's `mclib.book.chapter.Chapter`. Each function returning glue gives
{glue name: value}; figures come closed (glued, not shown twice).
"""
from __future__ import annotations

import math

from dataclasses import dataclass

import pandas as pd
import torch

from ..analyses.evaluate import evaluate, patching_table, predict, sample_eval_batch
from ..analyses.heads import (LABELS, STRUCTURE_THRESHOLD, attention_progress, capture_probs, checkpoint_maps,
                              classify_heads, e10_kinds, e10_masks, head_groups, head_scores, line_index, masked_lines,
                              pick_heads, structured_scores)
from ..analyses.interventions import permute_positions_hooks, switch_qkv_hooks
from ..analyses.probes import best_probe_layers, probe_layers, probe_sets
from ..analyses.loss_tables import (UNABLATED, ablation_table, all_heads, head_name, loss_row, lookup, model_table,
                                    permutation_errors, ratio_and_se, ratio_se, value_and_se)
from ..core.metrics import COPIES, DROP_FRACTION, LOSS_NAMES, PLATEAU_BAND
from ..core.paper import PAPER, PAPER_HEADS
from ..book import plots
from ..book.loss_tables import (PAPER_COLUMNS, PAPER_LEVEL, READING_NAMES, READINGS, SHORT, loss_figure, loss_styler,
                          matching_reading_text)
from ..book.scorecard import copy_levels, task_departures
from ..book.scorecard import CUT, agreement, agreements, plural, recorded_table, row_verdict, stage, verdict_counts
from ..book.scorecard import claim as _row

CHAPTER = "03_heads"

MOSTLY = 0.5       # E10: a head that attends to an entry puts most of its attention there
PROBED = 0.5       # E11: a probe "recovers" its target when it explains at least half its variance
PERMUTATIONS = 5   # E7: permutations of the position embeddings, reported by their mean
PROGRESS_MATRICES = 64  # the fixed batch of the maps over training (every saved checkpoint reads it)


def post_losses(ch) -> dict[str, float]:
    """The headline: L, L_obs, L_mask, mask_value of the post-shift model and their standard
    errors (L_se, ...) on `analysis.headline_matrices` fresh matrices (4 096 by default:
    the squared errors are heavy-tailed, and a few hundred matrices can be 25 % off)."""
    A = ch.cfg.analysis
    batch = sample_eval_batch(ch.cfg.data, A.headline_matrices, A.seed)
    return loss_row(predict(ch.post, batch), batch)


def completes(base: dict, level: float) -> bool:
    """The model completes the matrix: L_mask below DROP_FRACTION·E[X²] (the drop's threshold)."""
    return base["L_mask"] < DROP_FRACTION * level


def settings_table(ch, base: dict):
    """The run, the two checkpoints and the sample, as a styled table."""
    A = ch.cfg.analysis
    return (pd.DataFrame({"setting": ["run", "post-shift checkpoint", "pre-shift checkpoint", "evaluation"], "value": [
        ch.where, f"step {ch.steps.post:,} of {ch.cfg.train.steps:,} ({ch.relative_to_drop(ch.steps.post)}); "
                  f"L_mask {base['L_mask']:.3g} ± {base['L_mask_se']:.2g} ({A.headline_matrices:,} matrices)",
        f"step {ch.steps.pre:,}", f"fresh matrices, seed {A.seed}: {A.headline_matrices:,} for every loss (the headline, "
                                  f"E3–E8), {A.eval_matrices} for the attention maps (E9, E10)"]})
        .style.hide(axis="index").set_caption("What this chapter looks at. Heads are numbered from 1 (the paper's "
                                                  "numbering)."))


# --- E9: what every head attends to ----------------------------------------------------------

@dataclass
class Heads:
    """Every head of the post model on the evaluation batch."""
    scores: pd.DataFrame     # `head_scores`: one row per (layer, head)
    labels: pd.Series        # `classify_heads`: (layer, head) -> label
    groups: dict             # `head_groups`: label -> [(layer, head)]
    maps: torch.Tensor       # [layer, head, query, key] batch-mean attention


def e9_heads(ch) -> Heads:
    """Scores, labels, groups and batch-mean maps of every head at the post-shift checkpoint."""
    A = ch.cfg.analysis
    batch = sample_eval_batch(ch.cfg.data, A.eval_matrices, A.seed)
    probs = capture_probs(ch.post, batch)
    scores = head_scores(probs, batch.mask, ch.cfg.data.n)
    labels = classify_heads(scores)
    maps = torch.stack([probs[l].float().mean(0) for l in sorted(probs)])
    return Heads(scores, labels, head_groups(labels), maps)


def e9_shown(ch, heads: Heads) -> tuple[object, dict]:
    """The label -> heads table (styled) and glue: fig_maps, fig_labels, n_side."""
    n, maps, labels = ch.cfg.data.n, heads.maps, heads.labels
    titles = [[f"{head_name((l, h))}: {labels[(l, h)]}" for h in range(maps.shape[1])] for l in range(maps.shape[0])]
    fig_maps = plots.attention_grid(maps, titles=titles, n=n,
                                    title=f"Batch-mean attention of every head, step {ch.steps.post:,}")
    fig_labels = plots.head_label_heatmap(labels, title=f"Head labels from the measured scores, step {ch.steps.post:,}")
    mapping = pd.DataFrame([{"label": lab, "heads": len(heads.groups[lab]),
                             "which": ", ".join(head_name(p) for p in heads.groups[lab]) or "—"} for lab in LABELS])
    table = mapping.style.hide(axis="index").set_caption("Our head groups: label → heads (layer, head from 1).")
    return table, {"fig_maps": plots.closed(fig_maps), "fig_labels": plots.closed(fig_labels), "n_side": str(n)}


# --- how the structure arrives -----------------------------------------------------------------


def progress_table(ch) -> pd.DataFrame:
    """`attention_progress`: every head's scores at every saved checkpoint, on one fixed batch."""
    A = ch.cfg.analysis
    return attention_progress(ch.run_dir, ch.cfg.data, n_matrices=min(PROGRESS_MATRICES, A.eval_matrices), seed=A.seed)


def progress_shown(ch, progress: pd.DataFrame, heads: Heads) -> dict:
    """glue: fig_progress (the excess scores over training) and fig_evolution (the most
    row-, column- and self-like heads at post, at each analysis checkpoint)."""
    A, n, st = ch.cfg.analysis, ch.cfg.data.n, ch.steps
    fig_progress = plots.progress_lines(progress, ch.drop, mark={"pre-shift": st.pre, "post-shift": st.post},
                                        title=f"Attention structure during training: profile {ch.cfg.name}")
    picks = pick_heads(heads.scores, {"row": ("row_excess", True), "column": ("column_excess", True),
                                      "self": ("self_excess", True)})
    steps = st.all_steps()
    small = sample_eval_batch(ch.cfg.data, min(PROGRESS_MATRICES, A.eval_matrices), A.seed)
    by_step = checkpoint_maps({s: ch.model(s) for s in steps}, small)
    evo = torch.stack([torch.stack([by_step[s][l, h] for s in steps]) for l, h in picks.values()])
    phase = lambda s: "pre" if s == st.pre else "post" if s == st.post else "transition"
    fig_evolution = plots.attention_grid(evo, row_labels=[f"{head_name(p)}\nmost {k}" for k, p in picks.items()],
                                         col_labels=[f"step {s:,} ({phase(s)})" for s in steps], n=n,
                                         title="Three heads across training")
    return {"fig_progress": plots.closed(fig_progress), "fig_evolution": plots.closed(fig_evolution)}


# --- E3, E4, E5: ablating heads after the drop ------------------------------------------------

# E4's heads: every head our scores leave unlabelled (the 'other' group, also in E5's table), in
# place of the paper's five that it could not interpret, however many they are (`e4_rows`)
E4_SET = "other heads"


def ablation_at_post(ch, heads: Heads) -> pd.DataFrame:
    """`ablation_table` of the post model: every head and each label's group (the 'other'
    group is E4's set, `E4_SET`), both readings; with the paper's columns (E3 for all heads,
    E4 for E4's set; the paper gives one number for both readings)."""
    A = ch.cfg.analysis
    sets = {"all heads": all_heads(ch.post), **{f"{lab} heads": heads.groups[lab] for lab in LABELS}}
    # the headline's matrices: the unablated row (E3's post-shift losses) is the headline itself
    abl = ablation_table(ch.post, ch.cfg.data, A.headline_matrices, A.seed, sets)
    paper_of = {"none": ("E3", "post "), "all heads": ("E3", "post ablated "), E4_SET: ("E4", "ablated ")}
    for kind in ("L_obs", "L_mask"):
        abl[f"paper {kind}"] = [PAPER.get((paper_of[a][0], paper_of[a][1] + kind)) if a in paper_of else None
                                for a in abl.ablated]
    return abl


def ablation_shown(ch, abl: pd.DataFrame) -> tuple[object, dict]:
    """The ablation table (styled) and glue: fig_ablation."""
    cols = ["ablated", "reading", "heads", "L_obs", "paper L_obs", "L_mask", "paper L_mask", "mask_value"]
    table = loss_styler(abl.replace({"reading": READINGS}), cols, cols[3:],
                        f"Ablations at step {ch.steps.post:,}, the same {ch.cfg.analysis.headline_matrices:,} matrices for "
                        "every row. Paper: E3 for 'all heads', E4 (its five 'uninterpretable' heads) for 'other heads', "
                        "every head our scores leave unlabelled; "
                        "empty groups are left out. " + PAPER_COLUMNS)
    short = {"—": "", "uniform": ", uniform", "batch_mean": ", batch mean"}
    fig = plots.loss_bars([("nothing ablated" if a == "none" else a + short[r]) for a, r in zip(abl.ablated, abl.reading)],
                          {"L_obs": abl["L_obs"], "L_mask": abl["L_mask"]},
                          errors={"L_obs": abl["L_obs_se"], "L_mask": abl["L_mask_se"]},
                          paper={"L_obs": list(abl["paper L_obs"]), "L_mask": list(abl["paper L_mask"])},
                          title=f"E3-E5: ablating heads at step {ch.steps.post:,}",
                          level=ch.copy_level, paper_level=PAPER_LEVEL)
    return table, {"fig_ablation": plots.closed(fig)}


# --- E6, E7: the pre-shift attention weights, shuffled positions ---------------------------------

E6_MODEL = "post with pre's QKV (E6)"


def e6_e7_tables(ch) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(e67, perm): `model_table` of post, post with pre's QKV, post with its positions
    permuted (PERMUTATIONS seeds) and pre, on one batch; perm: the permuted rows."""
    A = ch.cfg.analysis
    perms = {f"positions permuted (E7), permutation {s}": (ch.post, permute_positions_hooks(ch.post, s))
             for s in range(A.seed, A.seed + PERMUTATIONS)}
    e67 = model_table({"post": ch.post, E6_MODEL: (ch.post, switch_qkv_hooks(ch.post, ch.pre)), **perms, "pre": ch.pre},
                      ch.cfg.data, A.headline_matrices, A.seed)
    return e67, e67[e67.model.isin(list(perms))]


def e6_e7_shown(ch, e67: pd.DataFrame, perm: pd.DataFrame) -> tuple[object, dict]:
    """E6 and E7 in one table (the permutations by their mean; styled, with the paper's
    columns) and glue: fig_e6_e7, pre_step."""
    mean = f"positions permuted (E7), mean of {len(perm)}"
    shown = pd.concat([e67[~e67.model.isin(perm.model)],
                       pd.DataFrame([{"model": mean, **perm[list(LOSS_NAMES)].mean(), **permutation_errors(perm)}])])
    shown = shown.set_index("model").loc[["post", E6_MODEL, mean, "pre"]].reset_index()
    shown["paper L_obs"] = [PAPER[("E3", "post L_obs")], PAPER[("E6", "pre-QKV into post L_obs")],
                            PAPER[("E7", "L_obs")], PAPER[("E3", "pre L_obs")]]
    shown["paper L_mask"] = [PAPER[("E3", "post L_mask")], None, PAPER[("E7", "L_mask")], PAPER[("E3", "pre L_mask")]]
    cols = ["model", "L_obs", "paper L_obs", "L_mask", "paper L_mask", "mask_value"]
    table = loss_styler(shown, cols, cols[1:], f"E6 and E7 at step {ch.steps.post:,}; the permuted rows range over "
                        f"L_mask {perm.L_mask.min():.3g} to {perm.L_mask.max():.3g}. " + PAPER_COLUMNS)
    fig = loss_figure(shown, "E6 and E7: switched attention weights, permuted positions", ch.copy_level)
    return table, {"fig_e6_e7": plots.closed(fig), "pre_step": f"{ch.steps.pre:,}"}


# --- E8: activation patching, X -> -X -----------------------------------------------------------


def e8_table(ch) -> pd.DataFrame:
    """`patching_table` of the post model, with the paper's columns (one number for both readings)."""
    A = ch.cfg.analysis
    e8 = patching_table(ch.post, ch.cfg.data, A.headline_matrices, A.seed)
    for col, key in (("masked_vs_X", "masked MSE to X"), ("masked_vs_negX", "masked MSE to -X")):
        e8[f"paper {col}"] = [None if p == "none" else PAPER[("E8", key)] for p in e8.patched]
    return e8


def e8_shown(ch, e8: pd.DataFrame) -> tuple[object, dict]:
    """E8's table (styled) and glue: fig_e8."""
    cols = ["patched", "masked_vs_X", "paper masked_vs_X", "masked_vs_negX", "paper masked_vs_negX",
            "observed_vs_X", "observed_vs_negX"]
    table = loss_styler(e8, cols, cols[1:], f"E8 at step {ch.steps.post:,}: MSE of the patched output to X and to −X "
                        "at masked and observed entries; 'none' is the −X run with nothing patched. " + PAPER_COLUMNS,
                        fmt="{:.3g}")
    fig = plots.loss_bars(list(e8.patched),
                          {"masked: MSE to X": e8["masked_vs_X"], "masked: MSE to −X": e8["masked_vs_negX"]},
                          errors={"masked: MSE to X": e8["masked_vs_X_se"], "masked: MSE to −X": e8["masked_vs_negX_se"]},
                          paper={"masked: MSE to X": list(e8["paper masked_vs_X"]),
                                 "masked: MSE to −X": list(e8["paper masked_vs_negX"])},
                          title="E8: attention outputs of X patched into the run on −X",
                          xlabel="MSE at masked entries / E[X²] (log scale)", level=ch.copy_level, paper_level=PAPER_LEVEL)
    return table, {"fig_e8": plots.closed(fig)}


# --- E10: a structured mask -----------------------------------------------------------------------

PAPER_MASK = "rows"  # the `e10_masks` key of the paper's mask; the other is ours
# E10's glue names per `e10_masks` key, spelled out so that grep finds each: the best heads'
# figure, every head's figure, the sentence on the lone-entry head
E10_GLUE = {"rows": ("fig_e10_rows", "fig_e10_rows_all", "e10_rows_text"),
            "columns": ("fig_e10_columns", "fig_e10_columns_all", "e10_columns_text")}


E10_COLUMNS = ["lone_entry", "masked_lines", "self", "row_excess", "column_excess"]


@dataclass
class Structured:
    """The post model under one of E10's masks."""
    name: str                # `e10_masks` key
    mask: torch.Tensor       # [n, n] bool, True = masked
    scores: pd.DataFrame     # `structured_scores`
    picks: dict              # `e10_kinds` name -> (layer, head), distinct heads
    maps: torch.Tensor       # [layer, head, query, key] batch-mean attention of every head
    losses: dict             # L, L_obs, L_mask, mask_value under the mask

    @property
    def lone(self) -> float:
        """The best 'lone observed entry' head's mass on that entry."""
        return float(self.scores.set_index(["layer", "head"]).loc[self.picks["lone observed entry"], "lone_entry"])

    @property
    def chance(self) -> dict:
        return self.scores.attrs["chance"]


def e10_heads(ch, mask: torch.Tensor | None = None, name: str = PAPER_MASK) -> Structured:
    """The post model on the evaluation matrices under one structured mask (default: the
    paper's, `e10_masks(n)["rows"]`): scores, the best head of each kind, every head's map."""
    A, n = ch.cfg.analysis, ch.cfg.data.n
    mask = e10_masks(n)[PAPER_MASK] if mask is None else mask
    probs = capture_probs(ch.post, sample_eval_batch(ch.cfg.data, A.eval_matrices, A.seed, mask=mask))
    scores = structured_scores(probs, mask, n)
    picks = pick_heads(scores, e10_kinds(scores.attrs["axis"]))
    maps = torch.stack([probs[l].float().mean(0) for l in sorted(probs)])
    return Structured(name, mask, scores, picks, maps,
                      evaluate(ch.post, ch.cfg.data, A.eval_matrices, A.seed, mask=mask))


def lone_text(lone: float, chance: float, axis: str, verdict: str | None = None) -> str:
    """The E10 sentence: how much of its attention the best head puts on the lone observed
    entry of a masked line, against a uniform head and, for the paper's mask, whether that
    is the paper's "most of it" by `verdict`, the E10 row's (`agreement`). The paper has no
    transposed mask, so that one (verdict None) is described only."""
    head = (f"the head that attends most to the lone observed entry of a masked {axis} puts {lone:.3f} of its "
            f"attention there (a uniform head: {chance:.3f}): ")
    reading = ("most of it" if lone > MOSTLY else "more than chance but not most of it" if lone > chance else
               "no more than chance")
    if verdict is None:
        return head + reading + "; the paper reports no such mask"
    return f"{head}{reading}, {agreement(verdict)} (the paper: most of it)"


def e10_shown(ch, s: Structured, labels: pd.Series) -> tuple[object, dict]:
    """E10's table of the picked heads under one mask (styled; their label under random
    masks and under this one) and glue, NAME = s.name: fig_e10_NAME (the picked heads'
    maps), fig_e10_NAME_all (every head's map) and, for a mask other than the paper's
    (PAPER_MASK), e10_NAME_text (the lone-entry sentence; the paper's mask's comes from
    `readings`, with its row).
    The masked lines are outlined (rows) or marked on the left (columns), their lone
    observed entries marked above."""
    n = ch.cfg.data.n
    axis, lines = masked_lines(s.mask, n)
    flat, in_lines = s.mask.reshape(-1), torch.isin(line_index(axis, n), torch.tensor(lines))
    kept = torch.nonzero(in_lines & ~flat).flatten().tolist()
    marks = (dict(query_bands=[(r * n, r * n + n - 1) for r in lines]) if axis == "row" else
             dict(query_marks=torch.nonzero(in_lines).flatten().tolist()))
    here = classify_heads(s.scores)
    picked = torch.stack([torch.stack([s.maps[l, h] for l, h in s.picks.values()])])
    fig = plots.attention_grid(picked, col_labels=[f"{head_name(p)}: {k}" for k, p in s.picks.items()], n=n,
                               key_marks=kept, panel=2.6, **marks,
                               title=f"Masked {axis}s, step {ch.steps.post:,}: the best head of each kind")
    titles = [[f"{head_name((l, h))}: {here[(l, h)]}" for h in range(s.maps.shape[1])] for l in range(s.maps.shape[0])]
    fig_all = plots.attention_grid(s.maps, titles=titles, n=n, key_marks=kept, **marks,
                                   title=f"Masked {axis}s, step {ch.steps.post:,}: every head (label under this mask)")
    by_head = s.scores.set_index(["layer", "head"])
    table = pd.DataFrame([{"kind": k, "head": head_name(p), **by_head.loc[p, E10_COLUMNS],
                           "label (random masks)": labels[p], "label (this mask)": here[p]} for k, p in s.picks.items()])
    styled = (table.style.hide(axis="index").format("{:.3f}", subset=E10_COLUMNS)
              .set_caption(f"E10, masked {axis}s: head scores. A uniform head has lone_entry {s.chance['lone_entry']:.3f}, "
                           f"masked_lines {s.chance['masked_lines']:.3f}, self {1 / n**2:.3f}. Under this mask L_obs = "
                           f"{s.losses['L_obs']:.2e}, L_mask = {s.losses['L_mask']:.3f}."))
    fig_name, fig_all_name, text_name = E10_GLUE[s.name]
    glue = {fig_name: plots.closed(fig), fig_all_name: plots.closed(fig_all)}
    if s.name != PAPER_MASK:  # the paper's mask is compared with the paper: its sentence comes with its row
        glue[text_name] = lone_text(s.lone, s.chance["lone_entry"], axis)
    return styled, glue


# --- E11: linear probes ----------------------------------------------------------------------------

def probe_table(ch) -> pd.DataFrame:
    """`probe_layers` of the post model: test MSE and |cos| per (layer, target, positions)."""
    A = ch.cfg.analysis
    fit, test = probe_sets(ch.post, ch.cfg.data, A.probe_fit, A.probe_test, seed=A.seed)
    return probe_layers(fit, test)


def probes_shown(ch, probes: pd.DataFrame) -> tuple[object, dict]:
    """The best layer per target (styled) and glue: fig_probes, probe_fit, probe_test."""
    A = ch.cfg.analysis
    best = best_probe_layers(probes)
    table = (best[["layer", "mse", "mse_zero", "rel", "abs_cos"]].style.format("{:.3g}").format("{:d}", subset=["layer"])
             .set_caption("The best layer per target at the masked positions (lowest test MSE relative to predicting 0)."))
    fig = plots.probe_lines(probes, title=f"Linear probes per layer, step {ch.steps.post:,}")
    return table, {"fig_probes": plots.closed(fig), "probe_fit": f"{A.probe_fit:,}", "probe_test": f"{A.probe_test:,}"}


# --- the scorecard -----------------------------------------------------------------------------

def e10_kind_rows(s: Structured) -> list[dict]:
    """E10's other three kinds of head under the paper's mask (the lone-entry kind is in
    `readings`), each the picked head's score against a stated cut: copies, most of
    its attention on itself (above MOSTLY); ignores the masked lines, under half of a
    uniform head's mass on them; follows the other axis, its excess above
    STRUCTURE_THRESHOLD (E9's cut)."""
    axis = s.scores.attrs["axis"]
    at = s.scores.set_index(["layer", "head"])
    kinds = e10_kinds(axis)
    follows = next(k for k in kinds if k.startswith("follows"))
    cuts = {"copies (self)": ("self", MOSTLY, "above", "most of its attention on itself"),
            f"ignores masked {axis}s": ("masked_lines", s.chance["masked_lines"] / 2, "below",
                                        f"under half a uniform head's {s.chance['masked_lines']:.3f}"),
            follows: (kinds[follows][0], STRUCTURE_THRESHOLD, "above", "E9's structure cut")}
    rows = []
    for kind, (col, ref, sense, said) in cuts.items():
        head = s.picks[kind]
        rows.append(_row("E10", f"structured mask, the head that {kind.replace('(self)', 'itself')}: its {col}",
                         float(at.loc[head, col]), f"{head_name(head)}; {sense} {ref:.3g} counts ({said})",
                         kind="direction", reference=ref, sense=sense, margin=CUT))
    return rows


@dataclass(kw_only=True)
class Results:
    """What the chapter computed, as `readings` and `closing_glue` read it; built by keyword
    only (eight fields: a positional call would be read by their order)."""
    abl: pd.DataFrame                # `ablation_at_post`
    e67: pd.DataFrame                # `e6_e7_tables`: the models
    perm: pd.DataFrame               #   and the permuted rows
    e8: pd.DataFrame                 # `e8_table`
    heads: Heads                     # `e9_heads`: scores, labels, groups at post
    pre_scores: pd.DataFrame | None  # `scores_at` the pre-shift checkpoint (None: not saved)
    structured: Structured           # `e10_heads` under the paper's mask
    probes: pd.DataFrame             # `probe_table`


def readings(ch, r: Results) -> tuple[dict, list[dict]]:
    """The chapter's scorecard rows, each a scale-free quantity (a ratio of two losses on
    the same matrices, a loss over E[X²], a head score), and the sentences that state them
    (`Results` says where each input comes from), experiment by experiment in the functions
    below, each returning (glue, rows).
    glue: e3_match, e4_text, e5_text, e8_text, e9_text, e10_rows_text (the paper's mask; the
    transposed one's: `e10_shown`), e11_text, e11_layer."""
    levels = copy_levels(ch.cfg.data.rank)["low-rank"]  # (ours, the paper's) E[X²]
    layers = ch.cfg.model.layers
    glue, rows = {}, []
    for part_glue, part_rows in (e3_rows(r.abl, levels), e4_rows(r.abl), e5_rows(r.abl, r.heads.groups),
                                 e6_e7_rows(r.e67, r.perm, levels), e8_rows(r.e8, r.abl, levels),
                                 e9_rows(r.heads.scores, r.pre_scores), e10_rows(r.structured), e11_rows(r.probes, layers)):
        glue.update(part_glue)
        rows += part_rows
    return glue, pre_read(rows, ch.steps.pre, not task_departures(ch.cfg))


# The rows of this chapter that read the pre-shift checkpoint: E6's post model with its QKV, E9's
# structure before the drop. On the paper's task they compare with the paper only at its pre step.
PRE_READ = (("E6", "post with pre's QKV / post: L_obs"), ("E9", "largest excess of any head, pre-shift"))


def pre_read(rows: list[dict], pre: int, on_paper_task: bool) -> list[dict]:
    """`rows` with those that read the pre-shift checkpoint (`PRE_READ`) n/a where it is not
    the paper's pre step on the paper's task (`ch02_copying.pre_na`, the rule E2, E3 and E6's
    pre rows follow)."""
    from .ch02_copying import pre_na

    na = pre_na(pre, on_paper_task)
    return [{**r, "na": na} if na and (r["id"], r["quantity"]) in PRE_READ and not r.get("na") else r for r in rows]


def scorecard_table(ch, rows: list[dict]):
    """Records `rows` in the run's scorecard; returns them with their verdicts, styled."""
    return recorded_table(ch.run_dir, rows, CHAPTER)


def ratio_cause(changed: float, unchanged: float, paper: tuple[float, float], what: str) -> str:
    """Why a ratio of L_obs (the `what` model's over the unchanged post model's, each over its
    task's E[X²]) differs from the paper's (`paper`: the same two, the paper's): which of its two
    terms is further from the paper's, in one sentence made from the numbers."""
    a, b = changed / paper[0], unchanged / paper[1]
    where = (f"mostly in the {what} model" if abs(math.log(a)) > abs(math.log(b)) else
             "mostly in the unchanged model's copying, the ratio's denominator")
    return (f"over E[X²], the {what} L_obs is {a:.2g}× the paper's and the unchanged {b:.2g}×, so the ratio is "
            f"{a / b:.2g}× the paper's: the difference is {where}; not traced further")


def e3_rows(abl: pd.DataFrame, levels: tuple[float, float]) -> tuple[dict, list[dict]]:
    """E3: the post model's losses over E[X²], and with every head ablated under both readings."""
    level, paper_level = levels
    rows = []
    un = value_and_se(abl, "L_mask", **UNABLATED)
    rows.append(_row("E3", "post L_mask / E[X²]", un[0] / level, "completes" if un[0] / level < DROP_FRACTION else
                     "does not complete", paper=PAPER[("E3", "post L_mask")] / paper_level, se=un[1] / level))
    ob = value_and_se(abl, "L_obs", **UNABLATED)
    rows.append(_row("E3", "post L_obs / E[X²]", ob[0] / level, "how precisely the observed entries come back",
                     paper=PAPER[("E3", "post L_obs")] / paper_level, se=ob[1] / level,
                     cause="the observed entries come back less precisely than in the paper's model; not traced "
                           "further (the same procedure as the authors' code)"))
    verdicts = []
    for mode in ("uniform", "batch_mean"):
        a = value_and_se(abl, "L_mask", ablated="all heads", reading=mode)
        rows.append(_row("E3", f"post, every head ablated, {READING_NAMES[mode]}: L_mask / E[X²]", a[0] / level,
                         "back at the copying level" if abs(a[0] / level - 1) < PLATEAU_BAND else
                         ("well below the copying level" if a[0] < level else "above the copying level"),
                         paper=PAPER[("E3", "post ablated L_mask")] / paper_level, se=a[1] / level))
        verdicts.append(row_verdict(rows[-1]))
        ratio, se = ratio_and_se(abl, "L_obs", {"ablated": "all heads", "reading": mode}, UNABLATED)
        ablated = value_and_se(abl, "L_obs", ablated="all heads", reading=mode)[0]
        rows.append(_row("E3", f"post, every head ablated, {READING_NAMES[mode]}: ablated / unablated L_obs", ratio,
                         f"{ratio:.3g} ± {se:.2g}", paper=PAPER[("E3", "post ablated L_obs")] / PAPER[("E3", "post L_obs")],
                         kind="ratio", se=se, cause=ratio_cause(ablated / level, ob[0] / level, (
                             PAPER[("E3", "post ablated L_obs")] / paper_level, PAPER[("E3", "post L_obs")] / paper_level),
                             "ablated")))
    return {"e3_match": matching_reading_text(verdicts, "the paper's ablated L_mask / E[X²] (number rule)")}, rows


# E4's rows name their heads so (`e4_choice`), and a row recorded without these words was
# recorded under the choice before 2026-11-27 (`rejudged`: `E4_EARLIER`)
E4_CHOICE = "every head our scores leave unlabelled ('other')"
E4_EARLIER = ("recorded under the book's earlier choice of heads (our 'other' heads in the paper's layers, at most its "
              "five, the least structured first), a choice that passes almost whatever the model does; E4 now ablates "
              + E4_CHOICE)


def e4_na(n_heads: int) -> str | None:
    """Why E4 has nothing to test with `n_heads` heads in E4's set (`E4_SET`), or None: only
    when our scores leave no head unlabelled."""
    return None if n_heads else "our scores leave no head of this run unlabelled ('other'): nothing to ablate"


def e4_heads(n_heads: int, total: int | None) -> str:
    """How many heads E4 ablates: "4 of 32 heads" (or "4 heads" where the total is not known)."""
    return f"{n_heads} of {total} heads" if total else plural(n_heads, "head")


def e4_choice(n_heads: int, total: int | None, which: str) -> str:
    """E4's heads and why these, in one sentence made from the numbers: every head our scores
    leave unlabelled (`n_heads` of `total`, named in `which`), against the paper's count of
    the heads it could not interpret."""
    paper_count = len(PAPER_HEADS["uninterpretable"])
    than = "as many as" if n_heads == paper_count else "more than" if n_heads > paper_count else "fewer than"
    return (f"{E4_CHOICE}: {e4_heads(n_heads, total)}" + (f" ({which})" if which else "")
            + f", {than} the paper's {paper_count}; all of them, as the paper's {paper_count} are all the heads it could "
            "not interpret, and not a count of the least structured, which passes almost whatever the model does")


def e4_cause(n_heads: int, total: int | None) -> str:
    """Why E4 may differ, from the counts: how many heads our scores leave unlabelled against the
    paper's five it could not interpret, of its 32."""
    paper = len(PAPER_HEADS["uninterpretable"])
    of = "" if total is None else f" of {total}"
    more = ("more heads than the paper's, so heads that do part of the work may be among them" if n_heads > paper else
            "no more heads than the paper's")
    return f"{n_heads}{of} heads are unlabelled here against the paper's {paper} of 32: {more}; not traced further"


def e4_rows(abl: pd.DataFrame) -> tuple[dict, list[dict]]:
    """E4: every head our scores leave unlabelled ablated (`E4_SET`, whatever their count;
    `e4_choice`); the paper: no significant effect (its ratio 1.10 for its five heads), by the
    ratio rule. n/a where no head is unlabelled (`e4_na`)."""
    rows = []
    e4_abl, every = abl[abl["ablated"] == E4_SET], abl[abl["ablated"] == "all heads"]
    n_e4, which = (int(e4_abl["heads"].iloc[0]), e4_abl["which"].iloc[0]) if len(e4_abl) else (0, "")
    total = int(every["heads"].iloc[0]) if len(every) else None
    na, choice = e4_na(n_e4), e4_choice(n_e4, total, which)
    e4 = []
    for mode in ("uniform", "batch_mean"):
        for q in ("L_mask", "L_obs"):
            ratio, se = ratio_and_se(abl, q, {"ablated": E4_SET, "reading": mode}, UNABLATED) if n_e4 else (None, None)
            rows.append(_row("E4", f"'other' heads ablated, {READING_NAMES[mode]}: ablated / unablated {q}", ratio,
                             choice + ("" if ratio is None else f"; {ratio:.3g} ± {se:.2g}"),
                             paper=PAPER[("E4", f"ablated {q}")] / PAPER[("E4", q)], kind="ratio", se=se, na=na,
                             cause=e4_cause(n_e4, total)))
            if q == "L_mask" and not na:
                e4.append((mode, ratio, row_verdict(rows[-1])))
    paper_e4 = PAPER[("E4", "ablated L_mask")] / PAPER[("E4", "L_mask")]
    text = (f"E4 has nothing to test here ({na})" if not e4 else
            f"ablating {E4_CHOICE}, {e4_heads(n_e4, total)} ({which}), multiplies L_mask by "
            + " and ".join(f"{ratio:.3g} under the {SHORT[m]} reading" for m, ratio, _ in e4)
            + f", against the paper's {paper_e4:.2f} for its five heads (\"no significant effect\"): "
            + agreements({f"under the {SHORT[m]} reading": v for m, _, v in e4}) + " (ratio rule)")
    return {"e4_text": text}, rows


def e5_rows(abl: pd.DataFrame, groups: dict) -> tuple[dict, list[dict]]:
    """E5: every group hurts (the paper; its numbers are lost): ablated / unablated L_mask above 1."""
    rows, parts = [], []
    for lab in [l for l in LABELS if l != "other"]:
        said = []
        for mode in ("uniform", "batch_mean"):
            has = bool(groups.get(lab))
            ratio, se = (ratio_and_se(abl, "L_mask", {"ablated": f"{lab} heads", "reading": mode}, UNABLATED) if has
                         else (None, None))
            rows.append(_row("E5", f"{lab} heads ablated, {READING_NAMES[mode]}: ablated / unablated L_mask", ratio,
                             plural(len(groups.get(lab, [])), "head") + ("" if ratio is None else f"; {ratio:.3g} ± {se:.2g}"),
                             kind="direction", reference=1.0, sense="above", se=se,
                             na=None if has else f"no head of this run is labelled '{lab}'"))
            if has:
                said.append((mode, ratio))
        if said:
            parts.append(f"{lab} heads: " + ", ".join(f"{ratio:.3g}× ({m.replace('_', '-')})" for m, ratio in said))
    text = (
        "the two readings test different claims. The uniform reading replaces a head's whole pattern, its fixed "
        "positional part included, so it tests whether the group's attention pattern matters at all. The batch "
        "mean keeps what every input shares: a head that always attends along the query's row or column has about "
        "the same map on every input, so its batch mean is that map and ablating it changes little; this reading "
        "tests only the input-dependent part of the attention. L_mask, ablated over unablated: "
        + ("; ".join(parts) if parts else "every group of our labels is empty in this run"))
    return {"e5_text": text}, rows


def e6_e7_rows(e67: pd.DataFrame, perm: pd.DataFrame, levels: tuple[float, float]) -> tuple[dict, list[dict]]:
    """E6: the post model with the pre-shift QKV; E7: its positions permuted (the mean over permutations)."""
    level, paper_level = levels
    rows = []
    post = {"model": "post"}
    ratio, se = ratio_and_se(e67, "L_obs", {"model": E6_MODEL}, post)
    rows.append(_row("E6", "post with pre's QKV / post: L_obs", ratio, f"{ratio:.3g} ± {se:.2g}",
                     paper=PAPER[("E6", "pre-QKV into post L_obs")] / PAPER[("E3", "post L_obs")], kind="ratio", se=se))
    pm_, pm_se = perm["L_mask"].mean(), permutation_errors(perm)["L_mask_se"]
    rows.append(_row("E7", f"positions permuted (mean of {len(perm)}): L_mask / E[X²]", pm_ / level,
                     f"{'above' if pm_ > level else 'below'} the copying level; permutations range "
                     f"{perm.L_mask.min() / level:.3g} to {perm.L_mask.max() / level:.3g}",
                     paper=PAPER[("E7", "L_mask")] / paper_level, se=pm_se / level))
    po = value_and_se(e67, "L_obs", **post)
    po_obs, po_obs_se = perm["L_obs"].mean(), float(perm["L_obs_se"].mean())
    rows.append(_row("E7", "positions permuted / unpermuted: L_obs", po_obs / po[0],
                     "how much the permutation disturbs copying", paper=PAPER[("E7", "L_obs")] / PAPER[("E3", "post L_obs")],
                     kind="ratio", se=ratio_se(po_obs, po_obs_se, *po),
                     cause=ratio_cause(po_obs / level, po[0] / level, (PAPER[("E7", "L_obs")] / paper_level,
                                                                       PAPER[("E3", "post L_obs")] / paper_level),
                                       "permuted") + " (the authors' src/embed.py permutes the same rows, once)"))
    return {}, rows


# What the authors' code runs for E8: github.com/pulkitgopalani/tf-matcomp, src/patch.py (revision
# 5afce89) writes the clean run's states into the run on −X with `patch_mask[3, :, :, :] = 1`, the
# last of the 4 layers only, of the checkpoint at epoch 49999 (src/configs/patch.yaml): its 0.014 is
# the last-layer reading, the headline here; the text's every-layer reading is ours.
E8_SOURCE = "the authors' src/patch.py patches only the last layer (patch_mask[3] of 4), at step 49 999"
# Why the last-layer rows may differ: the paper's number may not be that reading. Its 0.014 lies within its own
# unpatched post L_mask (E3's 0.0128, E4's 0.01428), which is what patching every layer gives by construction.
E8_OPEN = (f"it lies within the paper's own unpatched L_mask ({PAPER[('E3', 'post L_mask')]:g}-{PAPER[('E4', 'L_mask')]:g}), "
           "which patching every layer gives by construction, while its released code patches the last layer only, "
           "as here")
E8_CAUSE = f"which reading the paper's {PAPER[('E8', 'masked MSE to X')]:g} is cannot be settled from the paper: {E8_OPEN}"


def e8_rows(e8: pd.DataFrame, abl: pd.DataFrame, levels: tuple[float, float]) -> tuple[dict, list[dict]]:
    """E8: the last layer patched, the reading the authors' code runs (`E8_SOURCE`), against
    the paper's numbers (which reading the paper's number is remains open: `E8_CAUSE`); every
    layer patched, the text's reading, ours alone: it cannot fail (it equals the unpatched
    L_mask of `abl`, by construction), so it carries no paper's value."""
    level, paper_level = levels
    un = value_and_se(abl, "L_mask", **UNABLATED)
    x_last, nx_last = (lookup(e8, c, patched="last layer") for c in ("masked_vs_X", "masked_vs_negX"))
    x_all = lookup(e8, "masked_vs_X", patched="all layers")
    rows = [_row("E8", "last layer patched: masked MSE to X / E[X²]", x_last / level,
                 ("the patched run outputs X" if x_last < COPIES * level else "the patched run does not output X")
                 + f" ({E8_SOURCE})", paper=PAPER[("E8", "masked MSE to X")] / paper_level, cause=E8_CAUSE),
            _row("E8", "last layer patched: masked MSE to −X / E[X²]", nx_last / level,
                 "4 means an output of X (E[(X − (−X))²] = 4 E[X²])",
                 paper=PAPER[("E8", "masked MSE to -X")] / paper_level, cause=E8_CAUSE),
            _row("E8", "every layer patched: masked MSE to X / E[X²]", x_all / level,
                 f"equals the unpatched L_mask / E[X²] ({un[0] / level:.4g}) by construction; the text's reading",
                 kind="by construction")]
    said = agreement(row_verdict(rows[0]))
    text = (
        f"The reading the authors' code runs: {E8_SOURCE} (github.com/pulkitgopalani/tf-matcomp, src/patch.py and "
        "src/configs/patch.yaml). Whether the paper's 0.014 comes from it is open: "
        f"{E8_OPEN}. With the last layer patched, our masked MSE to X is "
        f"{x_last:.3g} ({x_last / level:.3g} E[X²], against the paper's {PAPER[('E8', 'masked MSE to X')] / paper_level:.3g} "
        f"E[X²]), {said}, and to −X {nx_last:.3g} ({nx_last / level:.3g} E[X²], where 4 means an output of exactly X). "
        f"The paper's text patches every layer; that reading is ours alone: the masked MSE to X is then {x_all:.4g}, "
        f"and the unpatched L_mask on the same matrices is {un[0]:.4g}, the same number, as it has to be. At a masked "
        "position the input is the MASK token and the position, the same for X and −X; once every layer's attention "
        "output there comes from the run on X, the masked positions' states are those of the run on X, whatever the "
        "observed entries say, so that reading cannot fail")
    return {"e8_text": text}, rows


def e9_rows(scores: pd.DataFrame, pre_scores: pd.DataFrame | None) -> tuple[dict, list[dict]]:
    """E9: row, column and self heads after the drop, no structure before it."""
    rows = []
    top = scores[["row_excess", "column_excess", "self_excess"]].max()
    last = scores[scores["layer"] == scores["layer"].max()]["self_excess"].max()
    for q, v in (("largest row excess of any head, post", top["row_excess"]),
                 ("largest column excess of any head, post", top["column_excess"]),
                 ("largest self excess of a last-layer head, post", last)):
        rows.append(_row("E9", q, float(v), f"{'such a' if v >= STRUCTURE_THRESHOLD else 'no such'} head (above "
                         f"{STRUCTURE_THRESHOLD:g} counts: half-way from uniform to pure)", kind="direction",
                         reference=STRUCTURE_THRESHOLD, sense="above", margin=CUT))
    pre_top = (None if pre_scores is None else
               float(pre_scores[["row_excess", "column_excess", "self_excess"]].max().max()))
    rows.append(_row("E9", "largest excess of any head, pre-shift", pre_top,
                     "no structure before the drop" if pre_top is not None and pre_top < STRUCTURE_THRESHOLD else
                     "structure before the drop", kind="direction", reference=STRUCTURE_THRESHOLD, sense="below", margin=CUT,
                     na=None if pre_scores is not None else "no pre-shift checkpoint saved"))
    text = (f"the largest row excess of any head is {top['row_excess']:.2f}, column {top['column_excess']:.2f}, "
            f"self in the last layer {last:.2f}" + ("" if pre_top is None else
                                                    f"; before the drop the largest excess is {pre_top:.2f}"))
    return {"e9_text": text}, rows


def e10_rows(structured: Structured) -> tuple[dict, list[dict]]:
    """E10 under the paper's mask: the lone-entry head's mass (its sentence comes with its
    verdict), then the other three kinds (`e10_kind_rows`)."""
    lone, lone_chance = structured.lone, structured.chance["lone_entry"]
    row = _row("E10", "structured mask: the best head's mass on the lone observed entry", float(lone),
               f"a uniform head: {lone_chance:.3f}; above {MOSTLY:g} counts (most of its attention)",
               kind="direction", reference=MOSTLY, sense="above", margin=CUT)
    glue = {E10_GLUE[PAPER_MASK][2]: lone_text(lone, lone_chance, "row", row_verdict(row))}
    return glue, [row, *e10_kind_rows(structured)]


# The model the paper probed: the authors' src/configs/probe.yaml (github.com/pulkitgopalani/tf-matcomp)
# loads a 12-layer, 12-head model (hidden 768) at epoch 49999, not the 4-layer model of E1-E10.
PROBED_MODEL = "the paper probed its 12-layer, 12-head model at step 49 999 (the authors' src/configs/probe.yaml)"




# The glued sentences that state a row's verdict, by the experiment they speak for (`mclib.lease.part.restate`).
speaks_for = {"e3_match": "E3", "e4_text": "E4", "e8_text": "E8", "e10_rows_text": "E10", "e11_text": "E11"}


def restated(name: str, text: str, rows: list[dict]) -> str | None:
    """A lease's glued sentence `name` worded again from its re-judged `rows` where this
    chapter's wording has changed since (`mclib.lease.part.restate`): E11's claim (`e11_claim`,
    from the row probe's verdict and value), which once called the row "not linearly" present
    whatever share of it the probe explained. None: nothing to word again."""
    if name != "e11_text":
        return None
    row = next((r for r in rows if r["id"] == "E11" and r["quantity"].startswith("row probe")), None)
    head, sep, _ = text.partition(" A linear probe ")
    if row is None or row.get("ours") is None or not sep:
        return None
    return f"{head} {e11_claim(row['verdict'], float(row['ours']))}"


def rejudged(row: dict, recorded) -> tuple[dict, list[str]]:
    """This chapter's rows that a GPU lease recorded, judged by today's rules
    (`mclib.lease.reference.rejudge`): E4 n/a where the row was recorded under the earlier
    choice of heads (`E4_EARLIER`: its reading lacks `E4_CHOICE`), else by `e4_na` (the count
    read from the row's reading); E8's every-layer reading carries no
    paper's value (`E8_SOURCE`); E11 names the model the paper probed (`PROBED_MODEL`)."""
    import re

    new, why = dict(row), []
    if row["id"] == "E4":
        reading = row.get("reading", "")
        m = re.search(re.escape(E4_CHOICE) + r": (\d+) ", reading)
        na = (E4_EARLIER if E4_CHOICE not in reading else e4_na(int(m.group(1))) if m else
              "the row does not say how many heads it ablated")
        if na:
            new["na"] = na
    if row["id"] == "E8" and row["quantity"].startswith("every layer") and row.get("paper") is not None:
        new["paper"] = None
        why.append(f"the paper's value moved to the last-layer rows ({E8_SOURCE})")
    if row["id"] == "E11" and "12-layer, 12-head" not in row.get("reading", ""):
        new["reading"] = f"{row.get('reading', '')}; {PROBED_MODEL}"
    if (row["id"], row["quantity"]) in PRE_READ and row.get("chapter") == CHAPTER and not row.get("na"):
        glued = (recorded.glued(CHAPTER, "pre_step") or "").replace(",", "")
        pre = int(glued) if glued.isdigit() else None if recorded.steps is None else recorded.steps.pre
        new = pre_read([new], pre, True)[0] if pre is not None else {
            **new, "na": "no pre-shift checkpoint could be placed in the run"}
    return new, why


def rule_of(row: dict) -> dict:
    """What this chapter judges its row by today besides the numbers (`scorecard.RULE_FIELDS`),
    for a row recorded without it (`mclib.lease.reference.rejudge`), as `e5_rows`, `e9_rows`,
    `e10_rows` and `e11_rows` build them: E5 above 1 by the direction rule's margin; E9 above
    (after the drop) or below (before it) STRUCTURE_THRESHOLD; E10's lone-entry head above MOSTLY
    and its other kinds against the cut-off their reading names (one of them, half a uniform
    head's mass, depends on the mask); E11's probes against PROBED, or 1 for the value probe's
    depth. {} for a row not its own."""
    import re

    i, q = row["id"], row["quantity"]
    if i == "E5":
        return {"reference": 1.0, "sense": "above"}
    if i == "E9" and "excess" in q and "/ drop step" not in q:
        return {"reference": STRUCTURE_THRESHOLD, "sense": "below" if "pre-shift" in q else "above", "margin": CUT}
    if i == "E10" and q.startswith("structured mask: the best head's mass"):
        return {"reference": MOSTLY, "sense": "above", "margin": CUT}
    if i == "E10":
        said = re.search(r"\b(above|below) ([-+\d.e]+) counts", row.get("reading", ""))
        return {"reference": float(said.group(2)), "sense": said.group(1), "margin": CUT} if said else {}
    if i == "E11":
        if q.startswith("value probe"):
            return {"reference": 1.0, "sense": "below", "margin": CUT}
        return {"reference": PROBED, "sense": "above" if q.startswith("singular") else "below", "margin": CUT}
    return {}

def e11_rows(probes: pd.DataFrame, layers: int) -> tuple[dict, list[dict]]:
    """E11: the row probe at the layer of the chapter's table (`best_probe_layers`), the value
    probe with depth, and the first singular vector; each reading names the model probed on
    each side (`PROBED_MODEL`; ours: the book's run, `layers` layers)."""
    ours = f"{PROBED_MODEL}; ours: the book's {layers}-layer model"
    best_layers = best_probe_layers(probes)
    best = best_layers.loc["row"]
    row_probe = _row("E11", "row probe at masked positions: best layer's test MSE / MSE of predicting 0",
                     float(best.rel), f"layer {int(best.layer)} of {layers}; explains {1 - best.rel:.0%} of the "
                     f"variance (paper: recovered, best at layers 3–4 of 12; below {PROBED:g} counts; {ours})",
                     kind="direction", reference=PROBED, sense="below", margin=CUT)
    # (b) the value probe at the masked positions gets better with depth (the paper); here:
    # the last layer's relative test MSE over the first layer's (below 1: better deeper)
    value = (probes[(probes.positions == "masked") & (probes.target == "value")]
             .assign(rel=lambda d: d.mse / d.mse_zero).set_index("layer")["rel"])
    value_row = _row("E11", "value probe at masked positions: last layer's test MSE / first layer's",
                     float(value.iloc[-1] / value.loc[1]) if 1 in value.index else None,
                     "relative test MSE by layer (0 = the embeddings): "
                     + ", ".join(f"{l}: {v:.2f}" for l, v in value.items()) + f" (paper: better with depth; below 1 "
                     f"counts; {ours})", kind="direction", reference=1.0, sense="below", margin=CUT,
                     na=None if 1 in value.index else "the model has no layer to compare")
    # (c) the first singular vector, of which the paper found no clear linear trace
    u1 = best_layers.loc["singular"]
    singular_row = _row("E11", "singular-vector probe at masked positions: best layer's test MSE / MSE of predicting 0",
                        float(u1.rel), f"layer {int(u1.layer)} of {layers}; explains {1 - u1.rel:.0%} of the variance "
                        f"(paper: no clear answer, read here as not recovered: above {PROBED:g} counts; {ours})",
                        kind="direction", reference=PROBED, sense="above", margin=CUT)
    glue = {"e11_layer": int(best.layer),
            "e11_text": (f"The probe for the observed row does best at layer {int(best.layer)} of {layers} (0 = the "
                         f"embeddings), with a test MSE {best.rel:.2f} times that of predicting 0 (|cos| "
                         f"{best.abs_cos:.2f}): it explains {1 - best.rel:.0%} of the target's variance. "
                         + e11_claim(row_verdict(row_probe), float(best.rel)))}
    return glue, [row_probe, value_row, singular_row]


def e11_claim(verdict: str, rel: float) -> str:
    """Whether a linear probe recovers the observed row, by `verdict` (the E11 row's, `agreement`),
    and how much of the row it finds, from `rel` (the best layer's test MSE over that of
    predicting 0): "recovers" means explaining more than 1 − PROBED of the variance, so a probe
    short of that still finds the part it explains, linearly."""
    cut = f"more than {1 - PROBED:.0%} of its variance explained, the book's cut-off"
    if verdict == "differs":
        found = (f"it explains {1 - rel:.0%}, so the row is linearly present in the masked positions' hidden states, "
                 "but only in part" if 0 < 1 - rel else "it explains none of it: the row is not linearly present "
                 "in the masked positions' hidden states")
        return f"A linear probe does not recover the row here ({cut}), {agreement(verdict)}: {found}"
    if verdict == "same direction":
        return f"A linear probe recovers the row here ({1 - rel:.0%} of its variance; {cut}), {agreement(verdict)}"
    return f"Whether a linear probe recovers the row here ({1 - rel:.0%} of its variance; {cut}): {agreement(verdict)}"


# --- What we found -----------------------------------------------------------------------------

def phase_text(base: dict, level: float, at=None) -> str:
    """Whether the post model completes the matrix (`completes`), and what that means for
    the comparisons that follow: from the run's stage (`at`, `scorecard.Stage`: a cut run's
    comparisons are provisional), not from the loss alone."""
    if completes(base, level):
        return (f"the model completes the matrix: L_mask is {base['L_mask']:.3g}, against E[X²] = {level:.3f} for a "
                "copying model; " + (at.comparisons if at is not None else
                                     "the comparisons below read the run's end, as the paper reads its own"))
    return (f"the model does not complete the matrix yet: L_mask is {base['L_mask']:.3g}, near E[X²] = {level:.3f}. "
            "Every comparison below therefore sets a model without the drop against the paper's model after it, "
            "and differences are expected")


def progress_text(progress: pd.DataFrame, drop: int | None) -> str:
    """The largest excess of any head at the first and the last saved checkpoint."""
    top = progress.groupby("step")[["row_excess", "column_excess", "self_excess"]].max().max(axis=1)
    return (f"the largest excess of any head goes from {top.iloc[0]:.2f} at step {top.index[0]:,} to "
            f"{top.iloc[-1]:.2f} at step {top.index[-1]:,}" + ("" if drop is None else f", against a drop at step {drop:,}"))


def closing_glue(ch, r: Results, base: dict, progress: pd.DataFrame, verdicts) -> dict:
    """The run-dependent sentences of "What we found" that `readings` does not give;
    verdicts: those of the chapter's recorded scorecard rows."""
    abl, e67, perm, labels, groups = r.abl, r.e67, r.perm, r.heads.labels, r.heads.groups
    L = lambda a, mode="—": lookup(abl, "L_mask", ablated=a, reading=mode)
    sw = e67.set_index("model").loc[E6_MODEL]
    return {
        "post_step": f"{ch.steps.post:,}",
        "phase_text": phase_text(base, ch.copy_level, stage(ch.end, ch.metrics, ch.cfg.data.rank)),
        "head_counts": ", ".join(f"{len(groups[lab])} {lab}" for lab in LABELS) + f" (of {len(labels)} heads)",
        "progress_text": progress_text(progress, ch.drop),
        "e3_text": (f"L_mask goes from {L('none'):.3g} to {L('all heads', 'uniform'):.3g} (uniform) and "
                    f"{L('all heads', 'batch_mean'):.3g} (batch mean); the paper, on its own task: "
                    f"{PAPER[('E3', 'post L_mask')]} to {PAPER[('E3', 'post ablated L_mask')]}"),
        "e6_text": (f"L_obs {sw.L_obs:.2g} and L_mask {sw.L_mask:.3g} (the paper, on its own task: L_obs "
                    f"{PAPER[('E6', 'pre-QKV into post L_obs')]})"),
        "e7_text": (f"L_obs {perm.L_obs.mean():.2g} and L_mask {perm.L_mask.mean():.3g} (the paper, on its own task: "
                    f"{PAPER[('E7', 'L_obs')]} and {PAPER[('E7', 'L_mask')]})"),
        "verdicts": verdict_counts(verdicts), "n_rows": len(list(verdicts)),
    }
