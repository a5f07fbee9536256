"""The book's part "The paper's own setting": the chapters GPU leases executed, as they ran.

    OUT/book/_executed/paper/index.md          the part's first page: the slices, done and missing
    OUT/book/_executed/paper/A_01_train.ipynb  slice A's executed 01_train, opened by where it ran

The scorecard chapter declares the part (`mclib.chapters.ch99_scorecard.site_part`); the book's
runner puts it after the chapters executed here (`mclib.book.runner_site.site_toc`). Each chapter
a done slice's lease executed (results/NAME-SLICE-DEVICE-DATE/book/*.ipynb) is copied as it ran,
figures and numbers untouched, made to sit beside the laptop chapters (`adapt`): a first note on
where its numbers come from (slice, device, date, revision, precision, how its runs ended, slices
missing); its title marked; its labels (targets, :name:, #anchors) prefixed by the slice, since
the laptop chapter holds the same ones; its chapter links pointed one folder up; its downloads
turned to text (the files stayed on the GPU machine). Its sentences get today's verdicts (`restate`).
"""

from __future__ import annotations

import logging
import re
import shutil
from ast import literal_eval
from pathlib import Path

import pandas as pd

from ..analyses.freezing import FreezeEnd
from ..book import scorecard_rules, scorecard_stage, scorecard_tables
from ..book.spec import Specs
from ..core.ending import RunEnd
from . import precision, reference, same_seed, slices

log = logging.getLogger(__name__)

PART = Path("book") / "_executed" / "paper"

_LABEL = re.compile(r"^\(([\w][\w\-.]*)\)=", re.M)
_NAME = re.compile(r"^(:name:[ \t]*)([\w][\w\-.]*)", re.M)  # a directive's label (glue:figure)
_CHAPTER_LINK = re.compile(r"\]\((\d\d_[\w]+)((?:#[^)]*)?)\)")  # [text](99_scorecard): a laptop chapter
_ANCHOR = re.compile(r"\]\(#([\w][\w\-.]*)\)")
_REF = re.compile(r"\{(ref|numref)\}`([^`<]*?)<?([\w][\w\-.]*)>?`")
_DOWNLOAD = re.compile(r"\{download\}`([^`<]+?)\s*<[^`>]+>`")


def missing_text(ledger: dict, have: dict) -> str:
    missing = [s.name for s in ledger["slices"] if s.name not in have]
    return (
        f"still missing: slice{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
        if missing
        else "every slice is done"
    )


def runs_text(record: dict) -> str:
    """How a done slice's runs ended, from its slice.json, "; "-joined: "seed 1: <its RunEnd's
    text>", then "E15 GROUP: <its FreezeEnd's text>" ("no checkpoint" where a run saved none)."""
    ends = [f"seed {seed}: {_end_text(end)}" for seed, end in (record.get("ends") or {}).items()]
    ends += [
        f"E15 {group}: {FreezeEnd(**end).text if end else 'no checkpoint'}"
        for group, end in (record.get("freeze_ends") or {}).items()
    ]
    return "; ".join(ends)


def rejudged_note(found: list[dict], chapter: str) -> str:
    """What today's rules change on the page of `chapter`, from the slice's recorded values
    re-judged on the CPU (`reference.rejudge`): each row whose verdict changed (before → after,
    and why) and how many of its rows are provisional, with the run's stage once; "" when
    nothing on the page changes."""
    mine = [r for r in found if r.get("chapter") == chapter]
    changed = [r for r in mine if r.get("was") is not None and r["was"] != r["verdict"]]
    late = [r for r in mine if scorecard_stage.is_provisional(r)]
    if not changed and not late:
        return ""
    out = [
        "Re-judged on the CPU by today's rules (`mclib.lease.reference.rejudge`), from the values this page "
        "recorded; the page below shows the verdicts as the lease gave them."
    ]
    if changed:  # rows of one experiment that change alike, and why, said once
        groups: dict = {}
        for r in changed:
            groups.setdefault((r["id"], r["was"], r["verdict"], r.get("na") or ""), []).append(r["quantity"])
        out.append(
            "Verdicts that change: "
            + "; ".join(
                f"{i} ({qs[0] if len(qs) == 1 else f'{len(qs)} rows'}): "
                f"{was} → {now}" + (f" ({na})" if na else "")
                for (i, was, now, na), qs in groups.items()
            )
            + "."
        )
    also = [
        r
        for r in mine
        if r.get("rejudged") and r.get("was") == r["verdict"] and "provisional:" not in r["rejudged"]
    ]
    if also:
        out.append("Also: " + "; ".join(f"{r['id']} {r['quantity']}: {r['rejudged']}" for r in also) + ".")
    if late:
        out.append(
            f"Provisional ({len(late)} rows: "
            + ", ".join(dict.fromkeys(r["id"] for r in late))
            + f"): each {late[0]['provisional']}; the paper read its model at step "
            f"{scorecard_stage.PAPER_POST:,}, so these rows are counted apart until a run of that length "
            "reads them."
        )
    return " ".join(out)


def provenance(record: dict, s: slices.Slice, missing: str, rejudged: str = "") -> str:
    ends = runs_text(record)
    notes = "".join(f" Merged with a note: {n}." for n in record.get("merge_notes", []))
    if record.get("lease_note"):  # what happened on the lease beyond the two commands, in the merger's words
        notes += f" On the lease: {record['lease_note']}"
    left = (
        f" Left out on the machine (over the return limit): {', '.join(record['left_out'])}."
        if record.get("left_out")
        else ""
    )
    return (
        f":::{{note}}\nThe paper's own setting, executed on a GPU lease: slice {s.name} ({s.what}), "
        f"on {record['device']} on {record['date']}, revision "
        f"`{record['git']}`, precision {record['precision']}. "
        f"{ends}. The paper book is {missing}.{notes}{left}"
        + (f"\n\n{rejudged}" if rejudged else "")
        + "\n:::"
    )


def _end_text(end: dict | None) -> str:
    if end is None:
        return "no checkpoint"
    return RunEnd.from_json(end).text


def adapt(nb, slice_name: str, note: str):
    """The executed notebook `nb` (nbformat) made to sit in this site: see the module docstring."""
    import nbformat  # noqa: PLC0415 - nbformat only when a page is written

    prefix = f"paper-{slice_name.lower()}-"

    def text(src: str) -> str:
        src = _LABEL.sub(lambda m: f"({prefix}{m.group(1)})=", src)
        src = _NAME.sub(lambda m: f"{m.group(1)}{prefix}{m.group(2)}", src)
        src = _ANCHOR.sub(lambda m: f"](#{prefix}{m.group(1)})", src)
        src = _CHAPTER_LINK.sub(
            lambda m: f"](../{m.group(1)}{m.group(2)})", src
        )  # the part sits one folder down
        src = _REF.sub(
            lambda m: (
                f"{{{m.group(1)}}}`{m.group(2)}<{prefix}{m.group(3)}>`"
                if m.group(2).strip()
                else f"{{{m.group(1)}}}`{prefix}{m.group(3)}`"
            ),
            src,
        )
        src = _FILES.sub(FILES_HERE, src)
        return _DOWNLOAD.sub(
            lambda m: f"{m.group(1).strip()} (not offered: it stayed on the GPU machine)", src
        )

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = text(cell.source)
        for out in cell.get("outputs", []):
            for mime, value in out.get("data", {}).items():
                if "text/" in mime and isinstance(
                    value, str
                ):  # text/markdown, papermill.record/text/markdown
                    out["data"][mime] = text(value)
    first = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), None)
    if first is not None:
        nb.cells[first].source = re.sub(
            r"^# (.+)$", r"# \1 (the paper's setting)", nb.cells[first].source, count=1, flags=re.M
        )
    cell = nbformat.v4.new_markdown_cell(
        note, id="paper-setting-provenance"
    )  # a fixed id: the site's key stays the same
    nb.cells.insert(0 if first is None else first + 1, cell)
    return nb


def stage(
    out: Path, ledger_path: Path | None = None, laptop: list[dict] | None = None, *, specs: Specs
) -> list[Path]:
    """Write the part into OUT (module docstring), from the slices done beside `ledger_path`
    (default results/paper-slices.yaml), its rows re-judged with the laptop edition's rows
    `laptop` at hand (`reference.rows`) by the rules the chapters' `specs` declare, which the
    scorecard chapter hands down; returns its files, the first page first."""
    import nbformat  # noqa: PLC0415 - nbformat only when a page is written

    ledger_path = Path(ledger_path or slices.LEDGER)
    folder = Path(out) / PART
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    ledger = slices.read_ledger(ledger_path)
    have = slices.done(ledger_path.parent, ledger["name"])
    missing = missing_text(ledger, have)
    pages, rows = [], []
    found = _rejudged(have, ledger["name"], laptop, specs=specs)
    for s in ledger["slices"]:
        if s.name not in have:
            rows.append(f"| {s.name} | {s.what} | not run yet | | |")
            continue
        record = slices.record(have[s.name])
        ran = []
        for nb_path in sorted((have[s.name] / "book").glob("*.ipynb")):
            note = provenance(
                record,
                s,
                missing,
                "\n\n".join(
                    filter(
                        None, (rejudged_note(found, nb_path.stem), precision.page_note(found, nb_path.stem))
                    )
                ),
            )
            nb = adapt(nbformat.read(nb_path, as_version=4), s.name, note)
            restate(nb, nb_path.stem, found, specs=specs)
            dest = folder / f"{s.name}_{nb_path.stem}.ipynb"
            nbformat.write(nb, dest)
            pages.append(dest)
            ran.append(f"[{nb_path.stem}]({dest.stem})")
        rows.append(
            f"| {s.name} | {s.what} | {record['device']}, {record['date']}, revision `{record['git']}`, "
            f"{record['precision']} | {', '.join(ran) or 'none'} | {runs_text(record)} |"
        )
    index = folder / "index.md"
    index.write_text(
        "# The paper's own setting\n\n"
        "The paper's model and task (7×7 rank 2, 4 layers × 8 heads, hidden 768, batch 256), trained and "
        "analysed on GPU leases of 15 minutes, one slice each (docs/gpu.md). The chapters below are the "
        "notebooks a lease executed, shown as they ran there; the scorecard sets their numbers beside the "
        f"laptop edition's. The paper book is {missing}.\n\n"
        "| slice | what it does | where and when it ran | "
        "chapters | how its runs ended |\n|---|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
        + precision.departure(ledger["precision"])
        + _runs_section(folder, have, ledger["name"], found, laptop, specs=specs)
    )
    return [index, *pages]


E1_FIGURE = "paper-runs-loss.png"
SEED1_FIGURE = "paper-seed1-runs.png"


def _runs_section(
    folder: Path, have: dict, name: str, found: list[dict], laptop: list[dict] | None = None, *, specs: Specs
) -> str:
    """The part's first page, after the slices: every run of the paper's setting the results
    hold (`reference.runs_table`: the slices' and the whole-book run before them, each with its
    path, date and precision), their L_mask curves (`reference.loss_figure`, written beside the
    page), E1's readings of the run's end beside those of a longer run of the same seed
    (`reference.end_rows_beside`), and the paper setting's counts re-judged by today's rules
    (`scorecard_tables.setting_counts`)."""
    first = next(iter(have.values()), None)
    if first is None or not reference._has_metrics(first / "runs" / f"{name}-seed1"):
        return ""
    try:
        table = reference.runs_table(first, name)
        figure = reference.loss_figure(first, name)
        ends = reference.end_rows_beside(first, name, laptop, specs=specs)
    except (
        FileNotFoundError,
        KeyError,
        ValueError,
    ) as e:  # a slice without what the table needs: said, not raised
        return f"\nThe runs could not be shown: {type(e).__name__}: {e}.\n"
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib only when a figure is drawn

    seed1 = same_seed.figure(first.parent, name)
    for fig, file in ((figure, E1_FIGURE), (seed1, SEED1_FIGURE)):
        fig.savefig(folder / file, dpi=110, metadata={"Software": None})
        plt.close(fig)
    drops = same_seed.drop_spread(first.parent, name)
    step = lambda x: "—" if _missing(x) else f"{int(x):,}"
    lines = [
        f"| {r['run']} | `{r['path']}` | {r['date'] or '—'} | "
        f"{r['precision'] or '—'} | {r['steps trained']:,} | "
        f"{r['ended']} | {step(r['drop step'])} | {r['final L_mask / E[X²]']:.4f} ± {r['± se']:.1g} |"
        for r in table.to_dict("records")
    ]
    counts = scorecard_tables.setting_counts(found, "the paper's own setting") if found else ""
    effect = " ".join(
        f"Final levels of the runs trained in {p} ({'; '.join(table.loc[table['precision'] == p, 'run'])}): "
        f"{text}."
        for p in table["precision"].dropna().unique()
        if (text := precision.effect_text(p))
    )
    return (
        "\n## Every run of the book's seed\n\n"
        "Each run of the paper's setting that results/ "
        "holds, the newest slices' and the whole-book run before "
        "them (the same seed and data stream: where two runs of a seed part, rounding parts them, as the "
        "second figure shows for every run of seed 1). The rows computed from "
        "a curve alone (final level, drop) name the run "
        "they read; the final level is the mean of L_mask over "
        f"the last tenth of that run's steps.{f' {effect}' if effect else ''}\n\n"
        "| run | path | date | precision | steps | ended | drop step | final L_mask / E[X²] |\n"
        "|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n\n"
        f"```{{figure}} {E1_FIGURE}\n:name: paper-runs-loss\n\nL_mask of every run above against the step "
        "(mean over 100 steps), each drop marked: the paper's "
        "Fig. 2 (NeurIPS version) runs to step 50,000.\n```\n\n"
        f"```{{figure}} {SEED1_FIGURE}\n:name: paper-seed1-runs\n\nSeed 1 on every lease that trained it "
        "(`mclib.lease.same_seed.figure`), the superseded runs included: the same seed and data stream, so "
        "what sets the curves apart is the float arithmetic of each device and step variant. "
        + (
            f"{drops.text(True)[0].upper()}{drops.text(True)[1:]}; the drop-step row is judged against that "
            "spread."
            if drops
            else "One run so far: no spread of its own."
        )
        + "\n```\n\n"
        + _end_rows_text(ends)
        + (f"{counts} {reference.rejudged_text(first, name, laptop, specs=specs)}\n" if counts else "")
    )


def _end_rows_text(ends) -> str:
    """E1's readings of the run's end, the book's run beside a longer run of the same seed
    (`reference.end_rows_beside`), as a table; "" without a longer run."""
    if ends.empty:
        return ""
    runs = [c for c in ends.columns if c not in ("quantity", "paper") and not c.endswith(": verdict")]
    num = lambda x: "—" if _missing(x) else f"{x:.3g}"
    lines = [
        f"| {r['quantity']} | {num(r['paper'])} | "
        + " | ".join(f"{num(r[c])} ({r[f'{c}: verdict']})" for c in runs)
        + " |"
        for r in ends.to_dict("records")
    ]
    return (
        "E1's readings of the run's end, the book's run "
        "beside the longer run of the same seed, computed from "
        "each run's metrics by the same E1 code and judged by the same rules: what the run's end says at "
        "each length.\n\n"
        f"| quantity | paper | {' | '.join(runs)} |\n|---|---|{'---|' * len(runs)}\n"
        + "\n".join(lines)
        + "\n\n"
    )


def _missing(x) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and x != x)


def _rejudged(have: dict, name: str, laptop: list[dict] | None = None, *, specs: Specs) -> list[dict]:
    """The done slices' rows re-judged by today's rules (`reference.rows`, the laptop edition's
    rows `laptop` at hand); [] when no slice holds the book's run (nothing recorded to re-judge)."""
    first = next(iter(have.values()), None)
    if first is None:
        return []
    try:
        return reference.rows(first, name, laptop, specs=specs)
    except (
        FileNotFoundError,
        KeyError,
        ValueError,
    ) as e:  # a slice without what a rule needs: no note, said once
        log.info(f"paper part: no re-judged rows ({type(e).__name__}: {e})")
        return []


# --- the lease's sentences, set right beside its words -------------------------------------

GLUED = "application/papermill.record/text/plain"
# Wording slips in sentences a lease's chapters wrote (their code words them right now):
# corrected on the lease's pages, word for word.
SLIPS = (
    (
        re.compile(r"\bThe run is was cut\b"),
        "Training was cut short of the profile's length: the run was cut",
    ),
    (re.compile(r"\ba such head\b"), "such a head"),
    (re.compile(r"(?<![\d.,])\b1 heads\b"), "1 head"),
    (re.compile(r"(?<![\d.,])\bover 1 seeds\b"), "over 1 seed"),
    (
        re.compile(
            r"\(the paper profile: nowhere, unless its run ended early\)"
        ),  # above a table listing its TF32
        "(the paper profile as it ships, in fp32 and run to its end, departs nowhere)",
    ),
    # a loss without a plateau band said to stay in it (mclib.analyses.progress.plateau_lead_summary)
    (
        re.compile(
            r"the loss itself stays in its band until the "
            r"drop(, the drop is at step [\d,]+; checkpoints at most "
            r"[\d,]+ steps apart\); no plateau band \([^)]*\) for [^'\"]*\bL_mask\b)"
        ),
        r"the loss itself has no band to leave\1",
    ),
)
# the downloads sentence of a lease's chapter 01 names folders on the GPU machine, which sent back no weights
_FILES = re.compile(
    r"This run's files, to download: .*?(?:upload each folder to a model hub\.|links it here\)\.)", re.S
)
FILES_HERE = (
    "This run's checkpoints stayed on the GPU machine that trained it (a lease sends back no weights); its "
    "metrics, executed chapters and step table are under "
    "results/, in the folder this part names for its slice."
)
_OVER_SEEDS = re.compile(
    r"Over \{glue:text\}`n_seeds` seeds of this profile \(seeds \{glue:text\}`seed_list`\)"
)


def rejudged_beside(rows: list[dict]) -> str:
    """What today's rules say of the rows a lease's sentence speaks for (`reference.rejudge`),
    to stand beside the lease's words: each changed verdict, was and now in the scorecard's
    words (`scorecard_rules.agreement`), rows that change alike said once; each other reason a row
    was re-judged; and the experiment's first row as it stands now. "" when nothing changed."""
    changed = [r for r in rows if r.get("was") is not None and r["was"] != r["verdict"]]
    other = [
        r for r in rows if r not in changed and r.get("rejudged") and "provisional:" not in r["rejudged"]
    ]
    if not changed and not other:
        return ""
    groups: dict = {}
    for r in changed:
        groups.setdefault((r["was"], r["verdict"], r.get("na") or ""), []).append(r["quantity"])
    said = [
        f"{qs[0] if len(qs) == 1 else scorecard_tables.plural(len(qs), 'row')} now "
        f"{scorecard_rules.agreement(now)}"
        + (f" ({na})" if na else "")
        + f", where the lease said {scorecard_rules.agreement(was)}"
        for (was, now, na), qs in groups.items()
    ]
    said += [f"{r['quantity']}: {r['rejudged']}" for r in other]
    first = rows[0]
    if first not in changed and first.get("paper") is not None and first.get("ours") is not None:
        said.append(
            f"its first row, {first['quantity']}: "
            f"{first['ours']:.3g} against the paper's {first['paper']:.3g}, "
            f"{scorecard_rules.agreement(first['verdict'])}"
        )
    return f"re-judged by today's rules, this sentence's verdict struck: {rows[0]['id']}, " + "; ".join(said)


def restate(nb, chapter: str, found: list[dict], *, specs: Specs) -> list[str]:
    """Set right, in place, the sentences of a lease's executed notebook `nb` (of `chapter`) that
    today's code words otherwise; its figures and numbers stay. A glued sentence that speaks for
    re-judged rows (`found`; the spec's `speaks_for`: glue name -> experiment id) keeps its words,
    today's verdict beside them in brackets (`rejudged_beside`); one the spec's `restated(name, text,
    rows)` words is worded again; wording slips (`SLIPS`, "Over 1 seeds") are corrected. Returns
    what was changed, one phrase each."""
    spec = specs.get(chapter)  # None: a page no chapter serves
    speaks = spec.speaks_for if spec is not None else {}
    rewords = spec.restated if spec is not None else None
    mine = [r for r in found if r.get("chapter") == chapter]
    glued = {}
    done = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            html = out.get("data", {}).get("text/html")
            if isinstance(html, str):  # a table's readings
                fixed = html
                for pattern, right in SLIPS:
                    fixed = pattern.sub(right, fixed)
                if fixed != html:
                    out["data"]["text/html"] = fixed
                    done.append("a table's wording")
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                glued[name] = out.get("data", {}).get(GLUED)
            value = out.get("data", {}).get(GLUED)
            if not name or not isinstance(value, str) or value[:1] not in "'\"":
                continue
            try:
                text = literal_eval(value)
            except (SyntaxError, ValueError):
                continue
            if not isinstance(text, str):
                continue
            new = text
            for pattern, right in SLIPS:
                new = pattern.sub(right, new)
            if rewords is not None:
                new = rewords(name, new, mine) or new
            rows = [r for r in mine if r["id"] == speaks.get(name)]
            beside = rejudged_beside(rows) if rows else ""
            if beside:
                new = f"{new} [{beside}]"
            if new != text:
                out["data"][GLUED] = repr(new)
                done.append(name)
    for cell in nb.cells:
        if cell.cell_type == "markdown" and _OVER_SEEDS.search(cell.source) and glued.get("n_seeds") == "1":
            cell.source = _OVER_SEEDS.sub(
                "Over the one seed of this profile (seed {glue:text}`seed_list`)", cell.source
            )
            done.append("n_seeds")
    done = list(dict.fromkeys(done))
    note = next((c for c in nb.cells if c.get("id") == "paper-setting-provenance"), None)
    if done and note is not None and note.source.endswith("\n:::"):
        note.source = (
            note.source[:-4] + "\n\nSet right on this page, the lease's figures and numbers untouched: the "
            "sentences whose rows today's rules re-judged keep the lease's words with today's verdict beside "
            "them in brackets, and wording slips since fixed in the chapters' code are corrected ("
            + ", ".join(done)
            + ").\n:::"
        )
    return done
