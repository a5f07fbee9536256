"""Chapter 04, the embeddings (book/04_embeddings.ipynb): its figures, tables, closing sentences
and scorecard rows, in page order: the value tokens' embeddings (E12), whether their final
arrangement is in place before the drop (E13), the position embeddings (E14).

The paper shows these as figures without numbers, so each becomes a claim on a side of a
cut-off (STRONG, CLUSTERED, ALIGNED, DIP), judged by the direction rule with no added margin
(`scorecard_rules.CUT`); the rows and their sentences: embeddings_readings.py. Sentences read
right with or without a drop.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..analyses import embeddings as E
from ..book.plots_base import closed
from ..book.scorecard import recorded_table
from ..book.scorecard_rules import CUT
from ..book.spec import ChapterSpec
from ..core.checkpoints import checkpoint_embeddings
from ..core.model import build_model
from .embeddings_plots import (
    embedding_progress_plot,
    position_norm_plot,
    position_tsne_plot,
    token_embedding_plot,
    token_progress_plot,
)
from .embeddings_readings import ALIGNED, CLUSTERED, DIP, STRONG, e13_na, embedding_readings

CHAPTER = "04_embeddings"


# --- the opening: which rows, which checkpoints -------------------------------------------------


def rejudged(row: dict, recorded) -> tuple[dict, list[str]]:
    """(row, why): a row a GPU lease recorded, judged by today's rules: E13 n/a by `e13_na`."""
    if row["id"] != "E13":
        return row, []
    at, steps = recorded.at, recorded.steps
    final = at.step if at is not None else None
    tested = (
        None
        if steps is None or steps.drop is None
        else max((s for s in steps.saved if s < steps.drop), default=None)
    )
    na = (
        "the run's end or its last checkpoint before the drop is unknown"
        if final is None or tested is None
        else e13_na(tested, final)
    )
    return ({**row, "na": na} if na else row), []


def rule_of(row: dict) -> dict:
    """Rule fields for a row recorded without them (margin CUT): E12 above STRONG, E13 above ALIGNED,
    E14's silhouette below CLUSTERED before the drop and above after, its middle-row norm below DIP;
    {} for a row not its own."""
    i, q = row["id"], row["quantity"]
    found = {"E12": (STRONG, "above"), "E13": (ALIGNED, "above")}.get(i)
    if i == "E14":
        found = (
            (DIP, "below")
            if q.startswith("middle-row")
            else (CLUSTERED, "below" if "before the drop" in q else "above")
        )
    return {} if found is None else {"reference": found[0], "sense": found[1], "margin": CUT}


def value_range(ch) -> tuple[float, float]:
    """The token values this task produces: |x| <= rank (the rows beyond stay at their initialisation)."""
    return E.value_range(ch.cfg.data.rank)


def labels(ch) -> dict[int, str]:
    """{step: "pre-shift, step S"} for the analysed checkpoints, in order."""
    s = ch.steps
    phases = {s.pre: "pre-shift", **{t: "transition" for t in s.transition}, s.post: "post-shift"}
    return {step: f"{p}, step {step:,}" for step, p in phases.items()}


def opening_glue(ch) -> dict:
    """token_range (the values read, as the paper's "−1.50 … 1.50") and drop_note."""
    lo, hi = value_range(ch)
    ids = E.token_ids(lo, hi)
    token_range = (
        f"{lo:.2f}, {lo + 0.01:.2f}, …, {hi:.2f} ({len(E.token_values(lo, hi))} values, token ids "
        f"{int(ids[0])} … {int(ids[-1])})"
    )
    drop_note = (
        f"This run's loss dropped at step {ch.drop:,}."
        if ch.drop is not None
        else f"This run's loss did not drop within its {ch.cfg.train.steps:,} steps, so nothing here can be "
        "before or after a drop; the chapter still shows how the embeddings change."
    )
    return {"token_range": token_range, "drop_note": drop_note}


# --- E12: token embeddings at the post checkpoint --------------------------------------------------


@dataclass
class Tokens:
    """E12 at post: norms, principal-plane coordinates, how each component tracks x, |x| and
    sign(x), and the norms' symmetry about 0."""

    norms: pd.DataFrame
    coords: pd.DataFrame
    tracks: pd.DataFrame
    symmetry: float
    plane_share: float  # the share of the rows' variance in the plane


def tables(ch, step: int) -> dict:
    """The embedding tables saved at `step`, read without building the model (`checkpoint_embeddings`)."""
    return checkpoint_embeddings(ch.run_dir, step)


def tokens(ch) -> Tokens:
    lo, hi = value_range(ch)
    post = tables(ch, ch.steps.post)
    norms = E.token_norms(post, lo, hi)
    values, rows = norms["value"].to_numpy(), E.token_rows(post, lo, hi)
    pca = E.fit_pca(rows)
    proj = E.project(rows, pca, centred=True)
    return Tokens(
        norms=norms,
        coords=pd.DataFrame({"value": values, "pc1": proj[:, 0], "pc2": proj[:, 1]}),
        tracks=E.component_tracks(proj, values),
        symmetry=E.norm_symmetry(values, norms["norm"].to_numpy()),
        plane_share=float(pca.explained_variance_ratio_.sum()),
    )


def tokens_figure(ch, t: Tokens):
    return closed(
        token_embedding_plot(
            t.norms, t.coords, title=f"Token embeddings at the post-shift checkpoint (step {ch.steps.post:,})"
        )
    )


def tracks_shown(t: Tokens):
    return (
        t.tracks.style.hide(axis="index")
        .format("{:.2f}", subset=["x", "abs_x", "sign_x"])
        .set_caption(
            f"|Pearson r| of each principal component with x, |x| and sign(x); the plane holds "
            f"{t.plane_share:.0%} of the rows' variance."
        )
    )


# --- E13: is the final arrangement there before the drop? ---------------------------------------


def token_projections(ch) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every analysed checkpoint and the initialisation on post's PCA plane: (coordinates, summary
    with a "vs the drop" column)."""
    lo, hi = value_range(ch)
    steps = [*[s for s in labels(ch) if s != ch.steps.post], ch.steps.post]
    init = build_model(
        ch.cfg.model, ch.cfg.data.n, ch.cfg.seed
    )  # the run's initialisation: train() builds it the same way
    coords, summary = E.token_projections(
        ch.run_dir, steps, final_step=ch.steps.post, initial=init, lo=lo, hi=hi
    )
    summary.insert(1, "vs the drop", [_side(ch, s) if s else "initialisation" for s in summary["step"]])
    return coords, summary


def _side(ch, step: int) -> str:
    return (
        "no drop in this run"
        if ch.drop is None
        else ("before the drop" if step < ch.drop else "after the drop")
    )


def token_progress_figure(ch, coords: pd.DataFrame):
    return closed(
        token_progress_plot(
            coords,
            {0: "initialisation", **labels(ch)},
            title="Token embeddings on the final checkpoint's PCA plane",
        )
    )


def projections_shown(summary: pd.DataFrame):
    return (
        summary.style.hide(axis="index")
        .format(precision=2)
        .set_caption(
            "Alignment with the final projection (uncentred and centred) and the share of each checkpoint's "
            "variance in the final plane."
        )
    )


def embedding_progress(ch) -> pd.DataFrame:
    """`embedding_progress` at every saved checkpoint: token alignment, position silhouettes,
    middle-row norm."""
    lo, hi = value_range(ch)
    return E.embedding_progress(ch.run_dir, final_step=ch.steps.post, lo=lo, hi=hi)


# --- E14: position embeddings ---------------------------------------------------------------------


def tsne_figure(ch):
    """One t-SNE of the n² position embeddings per analysed checkpoint, coloured by column."""
    n = ch.cfg.data.n
    frames = {
        label: E.position_tsne(E.position_rows(tables(ch, s), n), n, seed=ch.cfg.analysis.seed)
        for s, label in labels(ch).items()
    }
    return closed(position_tsne_plot(frames, title="t-SNE of the position embeddings, coloured by column"))


def position_norms_figure(ch):
    norms = E.position_norms(E.position_rows(tables(ch, ch.steps.post), ch.cfg.data.n), ch.cfg.data.n)
    return closed(
        position_norm_plot(norms, title=f"ℓ2 norm of each position embedding, step {ch.steps.post:,}")
    )


def progress_figure(ch, progress: pd.DataFrame, summary: pd.DataFrame):
    init_align = float(summary.set_index("step").loc[0, "alignment_centred"])
    return closed(
        embedding_progress_plot(progress, ch.drop, init_align, title="Embeddings at every saved checkpoint")
    )


def readings(ch, t: Tokens, summary: pd.DataFrame, progress: pd.DataFrame) -> tuple[dict, list[dict]]:
    """`embedding_readings` of this chapter's numbers."""
    return embedding_readings(progress, summary, t.tracks, t.symmetry, ch.drop, post_step=ch.steps.post)


def scorecard_table(ch, rows: list[dict]):
    """Records this chapter's rows and shows them."""
    return recorded_table(ch.run_dir, rows, CHAPTER, columns=("id", "quantity", "ours", "verdict", "reading"))


# What this chapter declares to the machinery (mclib.book.spec; collected by mclib.chapters.registry).
SPEC = ChapterSpec(CHAPTER, rejudged=rejudged, rule_of=rule_of)
