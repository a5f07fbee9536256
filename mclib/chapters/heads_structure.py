"""Part of chapter 03_heads: the rows and sentences of its structured mask (E10) and linear probes
(E11), the two readings of how the model holds the matrix's structure rather than what ablating
it costs. `lone_text` words the lone-entry head, `e10_kind_rows` judges E10's other head kinds
against their cuts (MOSTLY, half a uniform head's mass, STRUCTURE_THRESHOLD), `e11_rows` reads
the probes (cut PROBED; the paper's probed model `PROBED_MODEL`) and `e11_claim` words the row
probe's verdict; `ch03_heads.readings` joins them with `heads_readings`' E3-E9.
"""

from __future__ import annotations

import pandas as pd

from ..analyses.heads import STRUCTURE_THRESHOLD, e10_kinds
from ..analyses.loss_tables import head_name
from ..analyses.probes import best_probe_layers
from ..book.scorecard import claim as _row
from ..book.scorecard_rules import CUT, agreement, row_verdict
from .heads_tables import Structured

PROBED = 0.5  # E11: a probe "recovers" its target when it explains at least half its variance
MOSTLY = 0.5  # E10: a head that attends to an entry puts most of its attention there


# --- E10: a structured mask ----------------------------------------------------------------------


def lone_text(lone: float, chance: float, axis: str, verdict: str | None = None) -> str:
    """The E10 sentence: the best head's attention on the lone observed entry of a masked line,
    against a uniform head's and, for the paper's mask, worded by the row's `verdict` (None: the
    transposed mask, which the paper lacks, described only)."""
    head = (
        f"the head that attends most to the lone observed entry of a masked {axis} puts {lone:.3f} of its "
        f"attention there (a uniform head: {chance:.3f}): "
    )
    reading = (
        "most of it"
        if lone > MOSTLY
        else "more than chance but not most of it"
        if lone > chance
        else "no more than chance"
    )
    if verdict is None:
        return head + reading + "; the paper reports no such mask"
    return f"{head}{reading}, {agreement(verdict)} (the paper: most of it)"


def e10_kind_rows(s: Structured) -> list[dict]:
    """E10's other three head kinds under the paper's mask, each the picked head's score against
    a cut: self above MOSTLY; mass on masked lines below half a uniform head's; excess on the
    other axis above STRUCTURE_THRESHOLD."""
    axis = s.scores.attrs["axis"]
    at = s.scores.set_index(["layer", "head"])
    kinds = e10_kinds(axis)
    follows = next(k for k in kinds if k.startswith("follows"))
    cuts = {
        "copies (self)": ("self", MOSTLY, "above", "most of its attention on itself"),
        f"ignores masked {axis}s": (
            "masked_lines",
            s.chance["masked_lines"] / 2,
            "below",
            f"under half a uniform head's {s.chance['masked_lines']:.3f}",
        ),
        follows: (kinds[follows][0], STRUCTURE_THRESHOLD, "above", "E9's structure cut"),
    }
    rows = []
    for kind, (col, ref, sense, said) in cuts.items():
        head = s.picks[kind]
        rows.append(
            _row(
                "E10",
                f"structured mask, the head that {kind.replace('(self)', 'itself')}: its {col}",
                float(at.loc[head, col]),
                f"{head_name(head)}; {sense} {ref:.3g} counts ({said})",
                kind="direction",
                reference=ref,
                sense=sense,
                margin=CUT,
            )
        )
    return rows


# --- E11: linear probes ----------------------------------------------------------------------

# The model the paper probed: the authors' src/configs/probe.yaml (github.com/pulkitgopalani/tf-matcomp)
# loads a 12-layer, 12-head model (hidden 768) at epoch 49999, not the 4-layer model of E1-E10.
PROBED_MODEL = (
    "the paper probed its 12-layer, 12-head model at step 49 999 (the authors' src/configs/probe.yaml)"
)


def e11_rows(probes: pd.DataFrame, layers: int) -> tuple[dict, list[dict]]:
    """E11: the row probe at `best_probe_layers`' layer, the value probe with depth, the first
    singular vector; each reading names both models probed (`PROBED_MODEL`; ours: `layers` layers)."""
    ours = f"{PROBED_MODEL}; ours: the book's {layers}-layer model"
    best_layers = best_probe_layers(probes)
    best = best_layers.loc["row"]
    row_probe = _row(
        "E11",
        "row probe at masked positions: best layer's test MSE / MSE of predicting 0",
        float(best.rel),
        f"layer {int(best.layer)} of {layers}; explains {1 - best.rel:.0%} of the "
        f"variance (paper: recovered, best at layers 3–4 of 12; below {PROBED:g} counts; {ours})",
        kind="direction",
        reference=PROBED,
        sense="below",
        margin=CUT,
    )
    # (b) the value probe at the masked positions gets better with depth (the paper); here:
    # the last layer's relative test MSE over the first layer's (below 1: better deeper)
    value = (
        probes[(probes.positions == "masked") & (probes.target == "value")]
        .assign(rel=lambda d: d.mse / d.mse_zero)
        .set_index("layer")["rel"]
    )
    value_row = _row(
        "E11",
        "value probe at masked positions: last layer's test MSE / first layer's",
        float(value.iloc[-1] / value.loc[1]) if 1 in value.index else None,
        "relative test MSE by layer (0 = the embeddings): "
        + ", ".join(f"{l}: {v:.2f}" for l, v in value.items())
        + f" (paper: better with depth; below 1 "
        f"counts; {ours})",
        kind="direction",
        reference=1.0,
        sense="below",
        margin=CUT,
        na=None if 1 in value.index else "the model has no layer to compare",
    )
    # (c) the first singular vector, of which the paper found no clear linear trace
    u1 = best_layers.loc["singular"]
    singular_row = _row(
        "E11",
        "singular-vector probe at masked positions: best layer's test MSE / MSE of predicting 0",
        float(u1.rel),
        f"layer {int(u1.layer)} of {layers}; explains {1 - u1.rel:.0%} of the variance "
        f"(paper: no clear answer, read here as not recovered: above {PROBED:g} counts; {ours})",
        kind="direction",
        reference=PROBED,
        sense="above",
        margin=CUT,
    )
    glue = {
        "e11_layer": int(best.layer),
        "e11_text": (
            f"The probe for the observed row does best at layer {int(best.layer)} of {layers} (0 = the "
            f"embeddings), with a test MSE {best.rel:.2f} times that of predicting 0 (|cos| "
            f"{best.abs_cos:.2f}): it explains {1 - best.rel:.0%} of the target's variance. "
            + e11_claim(row_verdict(row_probe), float(best.rel))
        ),
    }
    return glue, [row_probe, value_row, singular_row]


def e11_claim(verdict: str, rel: float) -> str:
    """Whether a linear probe recovers the observed row, by the E11 row's `verdict`, and how much it
    finds from `rel` (test MSE over predicting 0): "recovers" means explaining more than
    1 − PROBED of the variance."""
    cut = f"more than {1 - PROBED:.0%} of its variance explained, the book's cut-off"
    if verdict == "differs":
        found = (
            f"it explains {1 - rel:.0%}, so the row is linearly present in the masked positions' hidden "
            "states, "
            "but only in part"
            if 0 < 1 - rel
            else "it explains none of it: the row is not linearly present "
            "in the masked positions' hidden states"
        )
        return f"A linear probe does not recover the row here ({cut}), {agreement(verdict)}: {found}"
    if verdict == "same direction":
        return (
            f"A linear probe recovers the row here ({1 - rel:.0%} of its variance; {cut}), "
            f"{agreement(verdict)}"
        )
    return (
        f"Whether a linear probe recovers the row here ({1 - rel:.0%} of its variance; {cut}): "
        f"{agreement(verdict)}"
    )
