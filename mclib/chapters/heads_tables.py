"""What chapter 03 computes from the run before it shows or judges anything: the post model's
losses, every head's scores and maps (E9) and their progress over training, the ablation and
model tables (E3-E7), patching (E8), a structured mask (E10) and probes (E11). Re-exported by
`mclib.chapters.ch03_heads`; `mclib.chapters.heads_readings` turns them into rows and sentences.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ..analyses.evaluate import evaluate, patching_table, predict, sample_eval_batch
from ..analyses.heads import (
    LABELS,
    attention_progress,
    capture_probs,
    classify_heads,
    e10_kinds,
    e10_masks,
    head_groups,
    head_scores,
    pick_heads,
    structured_scores,
)
from ..analyses.interventions import permute_positions_hooks, switch_qkv_hooks
from ..analyses.loss_tables import ablation_table, all_heads, loss_row, model_table
from ..analyses.probes import probe_layers, probe_sets
from ..core.paper import PAPER

CHAPTER = "03_heads"  # the chapter these tables serve (mclib.chapters.ch03_heads)
PERMUTATIONS = 5  # E7: permutations of the position embeddings, reported by their mean
PROGRESS_MATRICES = 64  # the fixed batch of the maps over training (every saved checkpoint reads it)


def post_losses(ch) -> dict[str, float]:
    """The post model's L, L_obs, L_mask, mask_value and their `_se` on `analysis.headline_matrices`
    fresh matrices (thousands: the squared errors are heavy-tailed)."""
    A = ch.cfg.analysis
    batch = sample_eval_batch(ch.cfg.data, A.headline_matrices, A.seed)
    return loss_row(predict(ch.post, batch), batch)


# --- E9: what every head attends to, and how the structure arrives -----------------------------


@dataclass
class Heads:
    """Every head of the post model on the evaluation batch."""

    scores: pd.DataFrame  # `head_scores`: one row per (layer, head)
    labels: pd.Series  # `classify_heads`: (layer, head) -> label
    groups: dict  # `head_groups`: label -> [(layer, head)]
    maps: torch.Tensor  # [layer, head, query, key] batch-mean attention


def e9_heads(ch) -> Heads:
    """Scores, labels, groups and batch-mean maps of every head at the post-shift checkpoint."""
    A = ch.cfg.analysis
    batch = sample_eval_batch(ch.cfg.data, A.eval_matrices, A.seed)
    probs = capture_probs(ch.post, batch)
    scores = head_scores(probs, batch.mask, ch.cfg.data.n)
    labels = classify_heads(scores)
    maps = torch.stack([probs[l].float().mean(0) for l in sorted(probs)])
    return Heads(scores, labels, head_groups(labels), maps)


def progress_table(ch) -> pd.DataFrame:
    """`attention_progress`: every head's scores at every saved checkpoint, on one fixed batch."""
    A = ch.cfg.analysis
    return attention_progress(
        ch.run_dir, ch.cfg.data, n_matrices=min(PROGRESS_MATRICES, A.eval_matrices), seed=A.seed
    )


# --- E3, E4, E5: ablating heads after the drop ------------------------------------------------

# E4's heads: every head our scores leave unlabelled (the 'other' group, also in E5's table), in
# place of the paper's five that it could not interpret, however many they are (`e4_rows`)
E4_SET = "other heads"


def ablation_at_post(ch, heads: Heads) -> pd.DataFrame:
    """`ablation_table` of the post model: all heads and each label's group ('other' is `E4_SET`),
    both readings, with the paper's columns (E3, E4; one number for both readings)."""
    A = ch.cfg.analysis
    sets = {"all heads": all_heads(ch.post), **{f"{lab} heads": heads.groups[lab] for lab in LABELS}}
    # the headline's matrices: the unablated row (E3's post-shift losses) is the headline itself
    abl = ablation_table(ch.post, ch.cfg.data, A.headline_matrices, A.seed, sets)
    paper_of = {"none": ("E3", "post "), "all heads": ("E3", "post ablated "), E4_SET: ("E4", "ablated ")}
    for kind in ("L_obs", "L_mask"):
        abl[f"paper {kind}"] = [
            PAPER.get((paper_of[a][0], paper_of[a][1] + kind)) if a in paper_of else None for a in abl.ablated
        ]
    return abl


# --- E6, E7: the pre-shift attention weights, shuffled positions ---------------------------------

E6_MODEL = "post with pre's QKV (E6)"


def e6_e7_tables(ch) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(e67, perm): `model_table` of post, post with pre's QKV, post with its positions
    permuted (PERMUTATIONS seeds) and pre, on one batch; perm: the permuted rows."""
    A = ch.cfg.analysis
    perms = {
        f"positions permuted (E7), permutation {s}": (ch.post, permute_positions_hooks(ch.post, s))
        for s in range(A.seed, A.seed + PERMUTATIONS)
    }
    e67 = model_table(
        {"post": ch.post, E6_MODEL: (ch.post, switch_qkv_hooks(ch.post, ch.pre)), **perms, "pre": ch.pre},
        ch.cfg.data,
        A.headline_matrices,
        A.seed,
    )
    return e67, e67[e67.model.isin(list(perms))]


# --- E8: activation patching, X -> -X -----------------------------------------------------------


def e8_table(ch) -> pd.DataFrame:
    """`patching_table` of the post model, with the paper's columns (one number for both readings)."""
    A = ch.cfg.analysis
    e8 = patching_table(ch.post, ch.cfg.data, A.headline_matrices, A.seed)
    for col, key in (("masked_vs_X", "masked MSE to X"), ("masked_vs_negX", "masked MSE to -X")):
        e8[f"paper {col}"] = [None if p == "none" else PAPER[("E8", key)] for p in e8.patched]
    return e8


# --- E10: a structured mask -----------------------------------------------------------------------

PAPER_MASK = "rows"  # the `e10_masks` key of the paper's mask; the other is ours


@dataclass
class Structured:
    """The post model under one of E10's masks."""

    name: str  # `e10_masks` key
    mask: torch.Tensor  # [n, n] bool, True = masked
    scores: pd.DataFrame  # `structured_scores`
    picks: dict  # `e10_kinds` name -> (layer, head), distinct heads
    maps: torch.Tensor  # [layer, head, query, key] batch-mean attention of every head
    losses: dict  # L, L_obs, L_mask, mask_value under the mask

    @property
    def lone(self) -> float:
        """The best 'lone observed entry' head's mass on that entry."""
        return float(
            self.scores.set_index(["layer", "head"]).loc[self.picks["lone observed entry"], "lone_entry"]
        )

    @property
    def chance(self) -> dict:
        return self.scores.attrs["chance"]


def e10_heads(ch, mask: torch.Tensor | None = None, name: str = PAPER_MASK) -> Structured:
    """The post model under one structured mask (default: the paper's, `e10_masks(n)["rows"]`):
    scores, the best head of each kind, every head's map."""
    A, n = ch.cfg.analysis, ch.cfg.data.n
    mask = e10_masks(n)[PAPER_MASK] if mask is None else mask
    probs = capture_probs(ch.post, sample_eval_batch(ch.cfg.data, A.eval_matrices, A.seed, mask=mask))
    scores = structured_scores(probs, mask, n)
    picks = pick_heads(scores, e10_kinds(scores.attrs["axis"]))
    maps = torch.stack([probs[l].float().mean(0) for l in sorted(probs)])
    return Structured(
        name, mask, scores, picks, maps, evaluate(ch.post, ch.cfg.data, A.eval_matrices, A.seed, mask=mask)
    )


# --- E11: linear probes ----------------------------------------------------------------------------


def probe_table(ch) -> pd.DataFrame:
    """`probe_layers` of the post model: test MSE and |cos| per (layer, target, positions)."""
    A = ch.cfg.analysis
    fit, test = probe_sets(ch.post, ch.cfg.data, A.probe_fit, A.probe_test, seed=A.seed)
    return probe_layers(fit, test)
