"""Chapter 99, the scorecard (book/99_scorecard.ipynb): every row the chapters recorded
(the run's scorecard.json), shown as the findings, the rules, the profile's departures, the
whole table and a figure, with the counts the closing sentence glues. The paper's claims and
our own findings (`scorecard_rules.OWN`) are counted apart (`scorecard_tables.paper_rows`).
It comes last; its notebook declares that it reads scorecard.json, so it reruns when that changes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from matplotlib.colors import to_hex

from ..book import scorecard, scorecard_rules, scorecard_stage, scorecard_tables
from ..book.chapter import departures_table
from ..book.plots_base import closed
from ..book.runner import EXECUTED
from ..book.spec import ChapterSpec, Specs
from ..lease import part, reference
from .registry import specs as chapter_specs
from .scorecard_plots import VERDICT_COLORS, scorecard_plot

CHAPTER = "99_scorecard"

# glue name -> the verdict it counts among the paper's claims, in the order the closing sentence names them
COUNTED = {
    "n_match": "matches",
    "n_same": "same direction",
    "n_order": "same order",
    "n_differ": "differs",
    "n_close": scorecard_rules.CLOSE,
    "n_na": "n/a",
    "n_cannot": "cannot fail",
}
# a provisional row (`scorecard_stage.is_provisional`: it reads the end of a run cut short) is counted
# under n_provisional alone, never under its verdict's name above
# glue name -> the verdict it counts among our own findings
COUNTED_OWN = {
    "n_own_holds": "holds",
    "n_own_fails": "fails",
    "n_own_close": scorecard_rules.CLOSE,
    "n_own_na": "n/a",
}
# glue name -> what the closing sentence says its count does, for one claim and for several
SAID = {
    "n_match": ("matches the paper's number", "match the paper's number"),
    "n_same": ("points the way the paper says", "point the way the paper says"),
    "n_order": ("keeps the paper's order", "keep the paper's order"),
    "n_differ": ("differs", "differ"),
    "n_close": ("is too close to tell", "are too close to tell"),
    "n_na": ("has nothing to test here", "have nothing to test here"),
    "n_cannot": ("cannot fail by construction", "cannot fail by construction"),
    "n_provisional": ("is provisional", "are provisional"),
    "n_own_holds": ("holds", "hold"),
    "n_own_fails": ("does not", "do not"),
    "n_own_close": ("is too close to tell", "are too close to tell"),
    "n_own_na": ("has nothing to test here", "have nothing to test here"),
}


def counts_text(counts: dict[str, int], names) -> str:
    """'1 matches the paper's number, 2 differ and 1 is provisional': each count of `names` (glue
    names of `SAID`), its verb agreeing."""
    parts = [scorecard_tables.plural(counts[n], *SAID[n]) for n in names]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def landing_paper(theirs: list[dict]) -> str:
    """The landing box's line on the paper's own setting: its counts on GPU leases, or that it has
    not run for this book yet."""
    if not theirs:
        return "not run for this book yet: it needs a GPU (docs/gpu.md)."
    t = scorecard_tables.tally(theirs)
    return (
        f"on GPU leases, of the {scorecard_tables.plural(t['rows'], 'claim')}, "
        f"{scorecard_tables.counts_clause(t)}."
    )


def rows(ch) -> list[dict]:
    """The recorded rows (`scorecard.load`)."""
    return scorecard.load(ch.run_dir)


FINDINGS = (
    "per experiment (linked to its chapter), the claims that reproduced (matches, same direction, same "
    "order), those that differ, those too close to tell (our value ± two standard errors reaches both what "
    "agrees with the paper and what does not), those not tested (n/a, cannot fail) and those provisional, "
    "and "
    "why its claims differ, as the chapters found it (every row's own cause is in the scorecard below)"
)


# the findings table's longest one-word headers, each with a soft hyphen where it may break, so
# that the counts' columns leave the causes room beside them in a laptop's text column
HEADERS = {
    "experiment": "experi\u00adment",
    "reproduced": "repro\u00adduced",
    "provisional": "provi\u00adsional",
}


def findings_shown(ch, rows: list[dict], link: str = ""):
    """`scorecard_tables.findings`, styled; `link`: the path from the showing page to the chapters
    ("" here, "_executed/" on the landing page). The last column is kept wide enough to read as a
    sentence."""
    table = scorecard_tables.findings(rows, link)
    return (
        table.style.hide(axis="index")
        .relabel_index([HEADERS.get(c, c) for c in table.columns], axis="columns")
        .set_table_styles([{"selector": "td:last-child", "props": "min-width: 17em"}])
        .set_caption(f"Findings, profile {ch.cfg.name}: {FINDINGS}.")
    )


def rules_shown():
    return (
        scorecard_rules.rules_table()
        .style.hide(axis="index")
        .set_caption(
            "The rules, one per kind of claim (mclib.book.scorecard_rules; the text is each rule's "
            "docstring)."
        )
    )


def departures_shown(ch):
    return departures_table(
        ch.cfg,
        f"Our numbers come from profile {ch.cfg.name}, which departs from the paper's "
        "task and recipe in these keys: read every comparison below with them in mind.",
        ch.end,
    )


# a finding of our own holds or fails in the colours of a claim that matches or differs
COLOURS = {**VERDICT_COLORS, "holds": VERDICT_COLORS["matches"], "fails": VERDICT_COLORS["differs"]}


def _colour(verdict: str) -> str:
    """A verdict's colour; a provisional one in its verdict's colour, in italics."""
    base, _, mark = str(verdict).partition(", ")
    return f"color: {to_hex(COLOURS.get(base, 'grey'))}; font-weight: bold" + (
        "; font-style: italic" if mark == "provisional" else ""
    )


def _styled(rows: list[dict], columns, caption: str):
    table = pd.DataFrame(
        [{**r, "verdict": scorecard_stage.shown_verdict(r), "cause": r.get("cause", "")} for r in rows],
        columns=[*scorecard.FIELDS, "cause"],
    )
    return (
        table[list(columns)]
        .style.hide(axis="index")
        .format(
            {
                k: f
                for k, f in {"paper": "{:.3g}", "ours": "{:.3g}", "se": "{:.2g}", "spread": "{:.2g}"}.items()
                if k in columns
            },
            na_rep="—",
        )
        .map(_colour, subset=["verdict"])
        .set_caption(caption.format(n=len(table)))
    )


def scorecard_shown(rows: list[dict]):
    """Every row of the paper's claims (`scorecard_tables.paper_rows`), its verdict coloured as in the
    figure."""
    return _styled(
        scorecard_tables.paper_rows(rows), scorecard.SHOWN, "The scorecard: {n} claims of the paper."
    )


def own_shown(rows: list[dict]):
    """Our own findings beyond the paper (`scorecard_tables.own_rows`), apart from its claims: no paper
    column."""
    return _styled(
        scorecard_tables.own_rows(rows),
        [c for c in scorecard.SHOWN if c != "paper"],
        "Beyond the paper: {n} findings tested here (chapter 07: our own, and the 2025 follow-up's claims), "
        "each judged by the finding rule and "
        "never counted among the paper's claims.",
    )


def reference_shown(ch, rows: list[dict]):
    """Our verdicts beside the paper setting's (`mclib.lease.reference`: the newest results/paper-*)."""
    table = reference.beside(rows, reference.latest(), specs=chapter_specs())
    return (
        table.style.hide(axis="index")
        .format({"paper": "{:.3g}", "laptop edition": "{:.3g}", "paper setting": "{:.3g}"}, na_rep="—")
        .map(_colour, subset=["laptop verdict", "paper-setting verdict"])
        .set_caption(
            f"Profile {ch.cfg.name} beside the paper's own setting (params/paper.yaml, on a GPU): "
            "each row's value and verdict against the paper (a finding of our own: whether it holds). "
            "The paper setting's verdicts are its recorded values re-judged on the CPU by today's rules "
            "(mclib.lease.reference.rejudge); the last column keeps the lease's own where it changed; "
            "provisional: read at the end of a run cut short of the paper's 50,000 steps; precision's "
            "effect: beside a row that reads a final level of a run trained in another precision than "
            "the paper's fp32, that precision's measured effect (mclib.lease.precision), no value or "
            "verdict adjusted."
        )
    )


def reference_runs_shown():
    """The paper setting's runs (`reference.runs_table`), or None when results/ holds none."""
    folder = reference.latest()
    if folder is None:
        return None
    return (
        reference.runs_table(folder)
        .style.hide(axis="index")
        .format(
            {
                "drop step": "{:,.0f}",
                "final L_mask / E[X²]": "{:.4f}",
                "± se": "{:.1g}",
                "ms a step": "{:.1f}",
                "steps trained": "{:,}",
            },
            na_rep="—",
        )
        .set_caption(
            "Every run of the paper's own setting that results/ holds: how far it trained, why it "
            "stopped, its drop (none: not yet), its final L_mask over the copying level E[X²] (last "
            "tenth of its steps) and its wall-clock time a step on the GPU."
        )
    )


def reference_figure():
    """The paper setting's L_mask curves (`reference.loss_figure`), or None when results/ holds none."""
    folder = reference.latest()
    return None if folder is None else closed(reference.loss_figure(folder))


def reference_freeze_figure():
    """E15's runs at the paper's setting (`reference.freeze_figure`), or None when no E15 slice is done."""
    folder = reference.latest()
    figure = None if folder is None else reference.freeze_figure(folder)
    return None if figure is None else closed(figure)


def glued(ch, rows: list[dict]) -> dict:
    """The closing sentence's counts (paper's claims and our findings, per verdict and in all,
    apart), the task note and the figure."""
    paper, own = scorecard_tables.paper_rows(rows), scorecard_tables.own_rows(rows)
    firm = [r for r in paper if not scorecard_stage.is_provisional(r)]
    verdicts = pd.Series([r["verdict"] for r in firm], dtype=object).value_counts()
    own_verdicts = pd.Series([r["verdict"] for r in own], dtype=object).value_counts()
    folder = reference.latest()
    theirs = [] if folder is None else reference.rows(folder, laptop=rows, specs=chapter_specs())
    counts = {
        **{name: int(verdicts.get(v, 0)) for name, v in COUNTED.items()},
        "n_provisional": len(paper) - len(firm),
        **{name: int(own_verdicts.get(v, 0)) for name, v in COUNTED_OWN.items()},
    }
    return {
        **counts,
        "n_rows": len(paper),
        "counts_text": f"Of the {scorecard_tables.plural(len(paper), 'claim')}, "
        + counts_text(counts, [*COUNTED, "n_provisional"]),
        "own_counts_text": f"of the {scorecard_tables.plural(len(own), 'finding')}, "
        + counts_text(counts, COUNTED_OWN),
        "landing_paper": landing_paper(theirs),
        "departures_count": scorecard_tables.departures_count(ch.cfg),
        "landing_editions": " ".join(
            [scorecard_tables.setting_counts(rows, "the laptop edition")]
            + (
                [
                    scorecard_tables.setting_counts(theirs, "the paper's own setting")
                    + " "
                    + reference.rejudged_text(folder, laptop=rows, specs=chapter_specs())
                ]
                if theirs
                else []
            )
        ),
        "n_own": len(own),
        "task_note": scorecard_tables.task_note(ch.cfg),
        "fig_scorecard": closed(scorecard_plot(rows)),
        "reference_status": reference.status(reference.latest()),
        "departures_text": scorecard_tables.departures_text(ch.cfg),
        **scorecard_tables.headline(rows),
        "landing_table": findings_shown(ch, rows, link="_executed/"),
    }


def site_part(out, ledger=None, *, specs: Specs) -> list:
    """ "The paper's own setting", shown after the chapters (`part.stage` of the slices beside `ledger`)."""
    return part.stage(out, ledger, laptop_rows(out), specs=specs)


def laptop_rows(out) -> list[dict] | None:
    """The scorecard rows of the run that `out`'s book/_executed/manifest.json names; None without one."""
    manifest = Path(out) / EXECUTED / "manifest.json"
    run_dir = json.loads(manifest.read_text()).get("run_dir") if manifest.is_file() else None
    return scorecard.load(run_dir) if run_dir else None


# What this chapter declares to the machinery (mclib.book.spec; collected by mclib.chapters.registry).
SPEC = ChapterSpec(CHAPTER, site_part=site_part)
