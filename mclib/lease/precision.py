"""The slices' precision (TF32, results/paper-slices.yaml; at fp32 no slice fits a lease) as the
book shows it: a departure from the paper's fp32, with the TF32 study as evidence
(docs/performance.md, "Does TF32 change the science?"; docs/data/tf32_study.csv, read by
`mclib.analyses.precision.study_effect`): `departure` (the paper part's first page),
`departure_text` (the scorecard's paragraph), `effect_text` (one line) and `annotate` (that line
beside every row that reads a final level). No value or verdict is changed: the effect is text.
"""

from __future__ import annotations

from pathlib import Path

from ..analyses.precision import FINAL, read_study, study_effect
from ..book.scorecard_stage import reads_late
from ..core.flops import train_step_flops
from ..core.packaged import data_file
from ..core.paper import profile as paper_profile
from ..core.repo import REPO

STUDY = data_file("tf32_study.csv")  # docs/data/ in a checkout
SECTION = 'docs/performance.md, "Does TF32 change the science?"'
FIELD = "precision_effect"  # the row's key for the text (`annotate`)
H100_FP32_TFLOPS = 67.0  # the H100 SXM's dense fp32 peak without tensor cores, NVIDIA's datasheet

# the study's measures as its table in docs/performance.md names them
MEASURE_NAMES = {
    "drop": "drop step",
    "plateau_L_mask": "L_mask on the plateau",
    "L_mask_drop+500": "L_mask 500 steps after the drop",
    "L_mask_drop+1000": "L_mask 1 000 steps after",
    "L_mask_drop+2000": "L_mask 2 000 steps after",
    "L_mask_drop+4000": "L_mask 4 000 steps after",
    "final_L_mask": "final L_mask (training, last 10 % of steps)",
    FINAL: "final checkpoint's L_mask, 4 096 fresh matrices, fp32",
    "checkpoint_L_mask_tf32": "the same checkpoint evaluated with TF32 products",
}


def _shown(path: Path) -> str:
    path = Path(path)
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def _paper_precision() -> str:
    return paper_profile().train.precision


def effect_text(precision: str | None, study: Path = STUDY) -> str | None:
    """The line beside a row that reads a final level of a run trained in `precision`: for TF32,
    the study's effect on the final checkpoint (`study_effect`, with the table's path); for another
    departure, where its study is; None for the paper's own precision or none given."""
    if precision is None or precision == _paper_precision():
        return None
    if precision == "tf32":
        try:
            return f"{study_effect(study).text()} ({_shown(study)})"
        except (FileNotFoundError, KeyError, ValueError) as e:
            return f"trained in TF32; the TF32 study's table could not be read ({type(e).__name__}: {e})"
    return f"trained in {precision}, a departure from the paper's {_paper_precision()} (docs/performance.md)"


def annotate(rows: list[dict], precision: str | None, study: Path = STUDY) -> list[dict]:
    """`rows` with `FIELD` set to `effect_text` on every row that reads a final level
    (`scorecard_stage.reads_late`: E1's final L_mask, the post-shift rows) and has a verdict to give
    (not n/a, not cannot fail), None on the others. Values and verdicts stay as they are."""
    text = effect_text(precision, study)
    return [
        {
            **r,
            FIELD: text
            if text and reads_late(r) and r.get("verdict") not in ("n/a", "cannot fail")
            else None,
        }
        for r in rows
    ]


def _why_text() -> str:
    p = paper_profile()
    flop = train_step_flops(p.model, p.data.n, p.train.batch)
    return (
        f"at fp32 no slice fits a lease: a step of the paper's model is {flop / 1e12:.2f} TFLOP "
        f"(`mclib.core.flops`), so on an H100 without its tensor cores (about {H100_FP32_TFLOPS:.0f} TFLOP/s "
        "in fp32) none takes less than "
        f"~{flop / (H100_FP32_TFLOPS * 1e12) * 1e3:.0f} ms, and a run cannot be "
        "carried from one lease to the next (docs/gpu.md)"
    )


def departure_text(precision: str | None, study: Path = STUDY) -> str:
    """One paragraph: the slices' precision as a departure from the paper's, why, and what the
    study measured; "" for the paper's own precision."""
    paper = _paper_precision()
    if precision is None or precision == paper:
        return ""
    if precision != "tf32":
        return (
            f"The slices trained in {precision}, a departure from the paper's {paper} (docs/performance.md)."
        )
    try:
        _, arms = read_study(study)
        curve = [m for m in arms.index if m not in (FINAL, "checkpoint_L_mask_tf32")]
        kept = all(str(arms.loc[m, "inside"]) == "True" for m in curve)
        found = (
            "the plateau, the drop and every reading of the curve after it lie inside fp32's seed range"
            if kept
            else "some readings of the curve lie outside fp32's seed range: "
            + ", ".join(MEASURE_NAMES.get(m, m) for m in curve if str(arms.loc[m, "inside"]) != "True")
        )
        effect = study_effect(study)
        final = (
            f"the final checkpoint scores {effect.ratio:.2f} ± {effect.se:.2f}× fp32's L_mask on fresh "
            f"matrices ({'inside' if effect.inside else 'outside'} fp32's seed range"
            + (", a better model)" if effect.ratio < 1 else ")")
        )
        study_said = (
            f"The TF32 study ({SECTION}; its table {_shown(study)}) trained the laptop task in fp32 and in "
            f"TF32 emulated on the CPU, {effect.n} seeds each{', paired' if effect.paired else ''}: "
            f"{found}; {final}."
        )
    except (FileNotFoundError, KeyError, ValueError) as e:
        study_said = f"The TF32 study's table ({_shown(study)}) could not be read ({type(e).__name__}: {e})."
    return (
        f"The slices train in TF32 (results/paper-slices.yaml, since 2026-11-27), a departure from "
        f"the paper's {paper}, because {_why_text()}. "
        f"{study_said} Every row of the paper's setting that reads "
        "a final level carries that effect beside it; no value or verdict is adjusted. A GPU of one's own "
        f"trains in the paper's {paper} (params/paper.yaml)."
    )


def study_table(study: Path = STUDY) -> str:
    """The study's arms as a markdown table (one row a measure: fp32's mean and seed range,
    TF32's mean, their ratio, whether TF32's mean lies inside fp32's range); "" without the file."""
    try:
        _, arms = read_study(study)
    except (FileNotFoundError, KeyError, ValueError):
        return ""
    fmt = lambda m, v: f"{v:,.0f}" if m == "drop" else f"{v:.4f}"
    lines = [
        f"| {MEASURE_NAMES.get(m, m)} | "
        f"{fmt(m, r['fp32_mean'])} ({fmt(m, r['fp32_min'])}-{fmt(m, r['fp32_max'])}) "
        f"| {fmt(m, r['tf32_mean'])} | {r['ratio']:.2f} ± {r['ratio_se']:.2f} | "
        f"{'yes' if str(r['inside']) == 'True' else 'no'} |"
        for m, r in arms.iterrows()
    ]
    return (
        "| measure | fp32: mean (seed range) | TF32: mean | TF32 / fp32 | TF32 inside fp32's range? |\n"
        "|---|---|---|---|---|\n" + "\n".join(lines)
    )


def departure(precision: str | None, study: Path = STUDY) -> str:
    """Markdown for the paper part's first page: `departure_text` and the study's table
    (`study_table`); "" for the paper's own precision."""
    text = departure_text(precision, study)
    if not text:
        return ""
    table = study_table(study) if precision == "tf32" else ""
    caption = (
        f"\n\nThe TF32 study's table ({_shown(study)}; {SECTION}), the laptop task on the CPU:\n\n{table}"
        if table
        else ""
    )
    return f"\n## Precision: a departure\n\n{text}{caption}\n"


def page_note(rows: list[dict], chapter: str) -> str:
    """One sentence for a page the lease executed: which of its rows read a final level of a
    run trained in another precision than the paper's, and that precision's measured effect
    (`annotate`'s text); "" where none does."""
    mine = [r for r in rows if r.get("chapter") == chapter and r.get(FIELD)]
    if not mine:
        return ""
    ids = ", ".join(dict.fromkeys(r["id"] for r in mine))
    return (
        f"Rows on this page that read a final level ({len(mine)} "
        f"row{'s' * (len(mine) > 1)}: {ids}) come from a run trained in another "
        f"precision than the paper's; beside each in the scorecard: {mine[0][FIELD]}. No value or verdict is "
        "adjusted."
    )
