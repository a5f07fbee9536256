"""The paper setting's results under results/ (written on the GPU machine by
`mclib.lease.slices_pack.collect`), shown in the default book beside the laptop edition's scorecard.

    results/paper-<GPU>-<DATE>/
        device.json                       GPU, torch, CUDA, date, git revision of the run
        runs/paper-seed1/{metrics.csv.gz, end.json, profile.yaml, scorecard.json}
        runs/paper-seed{2,3}/{metrics.csv.gz, end.json}   runs/paper-seed1/freeze/GROUP/metrics.csv.gz
        book/*.ipynb, book/manifest.json  the executed chapters and their timings

`latest` finds the newest folder; `rows` gives its scorecard rows re-judged by today's rules
(`rejudge`), `beside` sets them next to the laptop edition's, `runs_table` and `loss_figure` show
its runs. A slice's folder (its slice.json) is read together with every slice done beside it,
E15's rows and curves included (`freeze_rows`, `freeze_figure`). Rows are judged against the
paper on the paper's own task, so nothing is rescaled.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pandas as pd

from ..analyses.freezing import GROUPS, FreezeEnd
from ..book import scorecard, scorecard_rules, scorecard_stage, scorecard_tables
from ..book.spec import Specs
from ..core.data import copy_level
from ..core.ending import RunEnd
from ..core.metrics import converged, find_drop, last_tenth
from ..core.placement import place_checkpoints
from ..core.repo import REPO, RESULTS
from ..core.runs import END, FREEZE, METRICS, PROFILE, freeze_dir, run_name, run_profile
from . import slices
from .precision import FIELD as PRECISION_EFFECT
from .precision import annotate, departure_text
from .rejudging import REJUDGED, Recorded, judge_rows
from .same_seed import drop_spread
from .slices import METRICS_GZ, read_metrics


def _has_metrics(run: Path) -> bool:
    return (run / METRICS_GZ).is_file() or (run / METRICS).is_file()


def latest(name: str = "paper", root: Path = RESULTS) -> Path | None:
    """The newest results/NAME-* folder whose book's run (seed 1) trained at least a
    step (by its device.json date), or None."""
    found = [d for d in root.glob(f"{name}-*") if _has_metrics(d / "runs" / run_name(name, 1))]
    if not found:
        return None
    return max(found, key=lambda d: (json.loads((d / "device.json").read_text()).get("date", ""), d.name))


def _slice_folders(folder: Path, name: str) -> list[Path]:
    """`folder`, or, for a slice of the paper book (its slice.json), every slice done beside
    it (`mclib.lease.slices.done`): slice A holds seed 1, B seed 2, C seed 3."""
    if not (folder / "slice.json").is_file():
        return [folder]
    return list(slices.done(folder.parent, name).values()) or [folder]


def _slice_record(folder: Path) -> dict:
    """A slice's slice.json (`slices.record`); {} for a folder that is not a slice."""
    return slices.record(folder) if (folder / slices.STATE).is_file() else {}


def _slice_name(folder: Path) -> str | None:
    return _slice_record(folder).get("slice")


def run_folders(folder: Path, name: str = "paper") -> dict[str, Path]:
    """label -> run folder for every run the results hold (a slice: every slice done beside it),
    each seed followed by its E15 runs. A seed trained again in a later slice is labelled with it,
    "seed 1 (slice D)"; the plain "seed 1" is the first slice's, the book's run."""
    runs = {}
    found = [
        (r, _slice_name(f)) for f in _slice_folders(folder, name) for r in (f / "runs").glob(f"{name}-seed*")
    ]
    for run, slice_name in sorted(
        found, key=lambda p: int(p[0].name.rsplit("seed", 1)[1])
    ):  # stable: slice order kept
        label = f"seed {run.name.rsplit('seed', 1)[1]}"
        if label in runs:
            label = f"{label} (slice {slice_name})"
        if _has_metrics(run):
            runs[label] = run
        for group in sorted((run / FREEZE).glob("*")) if (run / FREEZE).is_dir() else []:
            if _has_metrics(group):
                runs[f"{run.name.rsplit('-', 1)[1]}, E15 {group.name}"] = group
    runs.update(earlier_runs(folder, name))
    return runs


def earlier_runs(folder: Path, name: str = "paper") -> dict[str, Path]:
    """{"seed 1, DATE run on DEVICE": run folder} of each whole-book run (a results folder without
    slice.json) beside the slice `folder`; {} where `folder` is not a slice."""
    if _slice_name(folder) is None:
        return {}
    found = {}
    for f in sorted(folder.parent.glob(f"{name}-*")):
        run = f / "runs" / run_name(name, 1)
        if (f / "slice.json").is_file() or not (f / "device.json").is_file() or not _has_metrics(run):
            continue
        dev = json.loads((f / "device.json").read_text())
        found[f"seed 1, {dev.get('date', f.name)} run on {dev.get('device', 'an unnamed device')}"] = run
    return found


def _end(run: Path) -> RunEnd | None:
    return RunEnd.from_json(json.loads((run / END).read_text())) if (run / END).is_file() else None


def runs_table(folder: Path, name: str = "paper") -> pd.DataFrame:
    """One row per run (`run_folders`): steps trained, how it ended (end.json; none: the GPU time
    ran out first), where today's convergence rule (`mclib.core.metrics.converged`) ends its curve,
    its drop (`find_drop`), final L_mask / E[X²] (mean over the last tenth of its steps, ± its
    standard error), ms a step (from the `wall` column) and precision."""
    rows = []
    for label, run in run_folders(folder, name).items():
        cfg, m, end = run_profile(run) if (run / PROFILE).is_file() else None, read_metrics(run), _end(run)
        rank = cfg.data.rank if cfg else 2
        tail = last_tenth(m)["L_mask"] / copy_level(rank)
        wall = m.dropna(subset=["wall"]).iloc[-1] if m["wall"].notna().any() else None
        where = run.parents[1] if run.parent.name == "runs" else run.parents[3]  # a seed's folder, or E15's
        dev = json.loads((where / "device.json").read_text()) if (where / "device.json").is_file() else {}
        rows.append(
            {
                "run": label,
                "path": _shown(run),
                "date": dev.get("date"),
                "steps trained": int(m["step"].iloc[-1]),
                "ended": end.ended if end else "cut (device time ran out)",
                "today's rule ends it at": (
                    converged(m, rank, cfg.train.patience, cfg.train.min_improvement) if cfg else None
                ),  # also under until: steps (the paper's 50 000)
                "drop step": find_drop(m, rank=rank),
                "final L_mask / E[X²]": float(tail.mean()),
                "± se": float(tail.std(ddof=1) / len(tail) ** 0.5) if len(tail) > 1 else float("nan"),
                "ms a step": 1000 * float(wall["wall"]) / float(wall["step"]) if wall is not None else None,
                "precision": cfg.train.precision if cfg else None,
            }
        )
    table = pd.DataFrame(rows)
    for c in ("today's rule ends it at", "drop step"):  # steps: integers, <NA> where there is none
        table[c] = pd.array([r[c] for r in rows], dtype="Int64")
    return table


def loss_figure(folder: Path, name: str = "paper"):
    """L_mask of every seed the results hold, against step, each drop marked
    (`plots_curves.seed_loss_curves`)."""
    from ..book.plots_curves import seed_loss_curves  # noqa: PLC0415 - matplotlib only when a figure is drawn

    runs = {
        label: run
        for label, run in run_folders(folder, name).items()
        if "E15" not in label and "(slice" not in label
    }  # each seed once: a seed trained again is the same run
    read = {label: read_metrics(run) for label, run in runs.items()}  # each run's metrics read once
    curves = {
        label if _end(runs[label]) else f"{label} (cut at step {int(m['step'].iloc[-1]):,})": m
        for label, m in read.items()
    }
    rank = run_profile(next(iter(runs.values()))).data.rank
    drops = {label: find_drop(m, rank=rank) for label, m in curves.items()}
    return seed_loss_curves(
        curves,
        drops,
        rank=rank,
        label="{}",
        smooth=100,
        title=f"The paper's own setting on {json.loads((folder / 'device.json').read_text())['device']}",
    )


def training_rows(folder: Path, name: str = "paper", *, specs: Specs) -> list[dict]:
    """The rows the book's run (seed 1) gives from its training curve alone: each chapter's
    declared `curve_rows` (of `specs`), each with its verdict. A run without end.json ends where
    its curve does."""
    run = folder / "runs" / run_name(name, 1)
    cfg, m = run_profile(run), read_metrics(run)
    last = int(m["step"].iloc[-1])
    end = _end(run) or RunEnd(
        ended="unfinished",
        step=last,
        drop=find_drop(m, rank=cfg.data.rank),
        steps=cfg.train.steps,
        until=cfg.train.until,
    )
    return [
        {**r, "verdict": scorecard_rules.row_verdict(r)}
        for s in specs.values()
        if s.curve_rows is not None
        for r in s.curve_rows(cfg, run, m, end)
    ]


def e15_runs(folder: Path, name: str = "paper") -> tuple[dict, dict, Path | None]:
    """E15's runs merged from the E15 slices done beside `folder`: ({group: run folder},
    {group: `FreezeEnd`, from slice.json's `freeze_ends`}, the seed 1 folder the first of
    them started from), groups in `GROUPS` order; ({}, {}, None) when none is done."""
    runs, ends, source = {}, {}, None
    for f in _slice_folders(folder, name):
        run = f / "runs" / run_name(name, 1)
        for group, end in (_slice_record(f).get("freeze_ends") or {}).items():
            if end and group not in runs and _has_metrics(freeze_dir(run, group)):
                runs[group], ends[group] = freeze_dir(run, group), FreezeEnd(**end)
                source = source or run
    order = [g for g in GROUPS if g in runs]
    return {g: runs[g] for g in order}, {g: ends[g] for g in order}, source


def freeze_figure(folder: Path, name: str = "paper"):
    """E15's runs at the paper's setting (`e15_runs`), their L_mask curves with each drop
    marked (`plots_curves.freeze_curves`, as chapter 05 draws them); None when no E15 slice is done."""
    from ..book.plots_curves import freeze_curves  # noqa: PLC0415 - matplotlib only when a figure is drawn

    runs, _, source = e15_runs(folder, name)
    if not runs:
        return None
    rank = run_profile(source).data.rank
    curves = {g: read_metrics(run) for g, run in runs.items()}
    return freeze_curves(
        curves,
        {g: find_drop(m, rank=rank) for g, m in curves.items()},
        rank,
        title="E15 at the paper's own setting: one component re-initialised, the rest frozen",
    )


def freeze_rows(folder: Path, name: str = "paper", *, specs: Specs) -> list[dict]:
    """E15's rows from the E15 slices done beside `folder` (`e15_runs`), by each chapter's declared
    `e15_rows` (of `specs`), each with its verdict. The yardstick is the seed 1 the runs started
    from, its final level read where its slice stopped it. [] when no E15 slice is done."""
    runs, ends, source = e15_runs(folder, name)
    if not runs:
        return []
    cfg, end, main = run_profile(source), _end(source), read_metrics(source)
    return [
        {**r, "verdict": scorecard_rules.row_verdict(r)}
        for s in specs.values()
        if s.e15_rows is not None
        for r in s.e15_rows(runs, ends, cfg, end, main, read=read_metrics)
    ]


def recorded_rows(folder: Path, name: str = "paper", *, specs: Specs) -> list[dict]:
    """The results' scorecard rows as the GPU left them: as recorded by its chapters (for a
    slice, by the chapters of every slice done beside it, the first slice's row where two
    recorded the same), or, where no chapter completed, E1's rows from the training curve
    (`training_rows`); then E15's rows from E15's slices (`freeze_rows`)."""
    recorded: dict = {}
    folders = _slice_folders(folder, name)
    for f in folders:
        for r in scorecard.load(f / "runs" / run_name(name, 1)):
            recorded.setdefault((r["id"], r["quantity"]), r)
    return (
        list(recorded.values()) or training_rows(_book_folder(folder, name), name, specs=specs)
    ) + freeze_rows(folder, name, specs=specs)


def rows(folder: Path, name: str = "paper", laptop: list[dict] | None = None, *, specs: Specs) -> list[dict]:
    """`recorded_rows` re-judged by today's rules (`rejudge`; `laptop`: the laptop edition's rows, whose
    seeds lend the one paper seed a spread), with each final level's precision effect (`annotate`)."""
    return annotate(
        rejudge(recorded_rows(folder, name, specs=specs), folder, name, laptop, specs=specs),
        book_precision(folder, name),
    )


def book_precision(folder: Path, name: str = "paper") -> str | None:
    """The precision the book's run (seed 1) trained in, from its profile.yaml; None without one."""
    run = _book_folder(folder, name) / "runs" / run_name(name, 1)
    return run_profile(run).train.precision if (run / PROFILE).is_file() else None


def _book_folder(folder: Path, name: str = "paper") -> Path:
    """The folder (of the slices done beside `folder`) that holds the book's run, seed 1."""
    return next(
        (f for f in _slice_folders(folder, name) if _has_metrics(f / "runs" / run_name(name, 1))), folder
    )


def book_stage(folder: Path, name: str = "paper") -> scorecard_stage.Stage | None:
    """The `scorecard_stage.Stage` of the book's run (seed 1) the results hold: how far it trained,
    L_mask where it ended, how fast it still fell. None without its end.json."""
    run = _book_folder(folder, name) / "runs" / run_name(name, 1)
    end = _end(run)
    if end is None or not _has_metrics(run):
        return None
    return scorecard_stage.stage(end, read_metrics(run), run_profile(run).data.rank)


def _book_steps(folder: Path, name: str = "paper"):
    """The book run's analysis checkpoints (`CheckpointSteps`), placed among the saves it made
    as its chapters placed them: which step each recorded row read."""
    run = _book_folder(folder, name) / "runs" / run_name(name, 1)
    cfg, m = run_profile(run), read_metrics(run)
    end = _end(run) or RunEnd(
        ended="unfinished",
        step=int(m["step"].iloc[-1]),
        drop=find_drop(m, rank=cfg.data.rank),
        steps=cfg.train.steps,
        until=cfg.train.until,
    )
    every = cfg.train.save_every
    saved = sorted({*range(every, end.step + 1, every), end.step})
    return place_checkpoints(
        m[m["step"] <= end.step], saved, cfg.data.rank, cfg.checkpoints, cfg.checkpoints.place
    )


def _glued(folder: Path, chapter: str, name: str, book: str = "paper") -> str | None:
    """The text a chapter the GPU executed glued under `name` (its notebook's outputs), or None."""
    import nbformat  # noqa: PLC0415 - nbformat only when a notebook is read

    for f in _slice_folders(folder, book):
        path = f / "book" / f"{chapter}.ipynb"
        if not path.is_file():
            continue
        for cell in nbformat.read(path, as_version=4).cells:
            for out in cell.get("outputs", []):
                if out.get("metadata", {}).get("scrapbook", {}).get("name") == name:
                    text = out.get("data", {}).get("application/papermill.record/text/plain")
                    return text.strip("'\"") if isinstance(text, str) else None
    return None


def rejudge(
    found: list[dict], folder: Path, name: str = "paper", laptop: list[dict] | None = None, *, specs: Specs
) -> list[dict]:
    """The rows a lease recorded (`found`), judged again by the rules the chapters apply today, from
    the recorded values (no model is read). Each chapter's rules are its spec's (of `specs`)
    `rejudged(row, recorded) -> (row, reasons)` (`Recorded`); what a rule needs besides the numbers
    (`scorecard.RULE_FIELDS`) is the row's own, else its chapter's `rule_of(row)`, and a row that
    lacks it gets n/a with the reason. A row reading the end of a run cut short is provisional
    (`scorecard_stage.provisional`). A changed row keeps the lease's verdict in `was`, why in `rejudged`."""
    at = book_stage(folder, name)
    try:
        steps = _book_steps(folder, name)
    except (FileNotFoundError, KeyError, ValueError):
        steps = None
    drops = drop_spread(folder.parent, name) if _slice_name(folder) is not None else None
    recorded = Recorded(
        at,
        steps,
        functools.cache(lambda chapter, key: _glued(folder, chapter, key, name)),
        laptop,
        functools.cache(lambda: training_rows(_book_folder(folder, name), name, specs=specs)),
        {"drop step": drops} if drops else {},
    )
    return judge_rows(found, recorded, at, specs=specs)


def chapters_run(folder: Path) -> list[str]:
    """The chapters that completed on the GPU: a slice's own record (`slices.chapters_executed`:
    its manifest names only the last `finish`'s chapters), else the results' book/manifest.json."""
    if (folder / slices.STATE).is_file():
        return slices.chapters_executed(slices.record(folder))
    manifest = folder / "book" / "manifest.json"
    if not manifest.is_file():
        return []
    return [nb["name"] for nb in json.loads(manifest.read_text()).get("notebooks", []) if nb.get("complete")]


def all_chapters_run(folder: Path, name: str = "paper") -> list[str]:
    """`chapters_run` of every slice done beside `folder` (or of `folder` alone), in order."""
    return list(dict.fromkeys(c for f in _slice_folders(folder, name) for c in chapters_run(f)))


def _shown(folder: Path) -> str:
    return folder.relative_to(REPO).as_posix() if folder.is_relative_to(REPO) else str(folder)


def status(folder: Path | None, name: str = "paper") -> str:
    """One sentence: where the paper setting's results are, or that they do not exist yet.
    For slices: where and when each ran, and which chapters it executed."""
    if folder is None:
        return (
            "The paper's own setting (params/paper.yaml: 7×7 rank 2, hidden 768) has not been run for this "
            "book yet: it needs a GPU. its slices run on GPU leases (`bash scripts/lease.sh`, "
            "docs/gpu.md) and are merged into results/; this column then fills in."
        )
    done = all_chapters_run(folder, name)
    table = runs_table(folder, name)
    ran = "; ".join(
        f"{r['run']}: {r['steps trained']:,} steps, {r['ended']}" for r in table.to_dict("records")
    )
    precision = ", ".join(sorted({str(p) for p in table["precision"].dropna()})) or "unknown"
    chapters = (
        f"The chapters that completed there: {', '.join(done)}."
        if done
        else "No chapter completed there (the GPU time ran out while the training chapter was still "
        "training), so the paper setting's column holds only E1's rows, computed from seed 1's "
        'training curve by the training chapter\'s rules; every other row reads "not run".'
    )
    folders = _slice_folders(folder, name)

    def where(f: Path) -> str:
        dev = json.loads((f / "device.json").read_text())
        return (
            f"on {dev['device']} on {dev['date']} (torch {dev['torch']}, "
            f"revision {dev.get('git') or 'unknown'}"
        )

    if _slice_name(folder) is None:
        return (
            "The paper's own setting (params/paper.yaml) ran "
            f"{where(folder)}, precision {precision}); its files "
            f"are in {_shown(folder)}. What trained: {ran}. {chapters}"
        )
    each = "; ".join(
        f"slice {_slice_name(f)} {where(f)}): {', '.join(chapters_run(f)) or 'no chapter'}" for f in folders
    )
    return (
        "The paper's own setting (params/paper.yaml) ran in "
        f"{len(folders)} slice{'s' * (len(folders) > 1)} on "
        f"GPU leases, precision {precision}: {each}. Their files are in "
        f"{', '.join(_shown(f) for f in folders)}. What trained: {ran}. {chapters}"
        + (f" {departure}" if (departure := departure_text(book_precision(folder, name))) else "")
    )


def beside(ours: list[dict], folder: Path | None, name: str = "paper", *, specs: Specs) -> pd.DataFrame:
    """One row per claim: the paper's value, the laptop edition's value and verdict, the paper
    setting's value and verdict re-judged (`rows`; empty where absent), the lease's verdict where it
    changed, and beside a final-level row its precision's effect (`precision.effect_text`)."""
    theirs = (
        {} if folder is None else {(r["id"], r["quantity"]): r for r in rows(folder, name, ours, specs=specs)}
    )
    absent = "not run" if folder is None or not all_chapters_run(folder, name) else "—"
    keys = list(dict.fromkeys([(r["id"], r["quantity"]) for r in ours] + list(theirs)))
    mine = {(r["id"], r["quantity"]): r for r in ours}
    table = []
    for key in keys:
        a, b = mine.get(key, {}), theirs.get(key, {})
        table.append(
            {
                "id": key[0],
                "quantity": key[1],
                "paper": a.get("paper", b.get("paper")),
                "laptop edition": a.get("ours"),
                "laptop verdict": scorecard_stage.shown_verdict(a) if a else "—",
                "paper setting": b.get("ours"),
                "paper-setting verdict": scorecard_stage.shown_verdict(b) if b else absent,
                "as the lease judged it": b.get("was", "—") if b else "—",
                "precision's effect": b.get(PRECISION_EFFECT) or "—",
            }
        )
    return pd.DataFrame(table)


def rejudged_text(
    folder: Path, name: str = "paper", laptop: list[dict] | None = None, *, specs: Specs
) -> str:
    """One sentence: that the paper setting's verdicts are the lease's recorded values judged
    again on the CPU by today's rules (`rejudge`), how many changed, and the run's stage
    (`book_stage`) behind its provisional rows, split by what they say so far
    (`scorecard_tables.provisional_text`)."""
    found = rows(folder, name, laptop, specs=specs)
    changed = [r for r in found if r.get("was") is not None and r["was"] != r["verdict"]]
    late = sum(scorecard_stage.is_provisional(r) for r in scorecard_tables.paper_rows(found))
    at = book_stage(folder, name)
    return (
        f"Its verdicts are the values the GPU lease recorded, {REJUDGED} (`mclib.lease.reference.rejudge`): "
        f"{len(changed)} changed from the lease's, and {scorecard_tables.provisional_text(found)}"
        + (f", as the book's run {at.note}" if at is not None and at.cut and late else "")
        + "."
    )


def end_rows_beside(
    folder: Path, name: str = "paper", laptop: list[dict] | None = None, *, specs: Specs
) -> pd.DataFrame:
    """E1's rows that read the run's end (`scorecard_stage.reads_late`): the book's run beside each
    earlier, longer run of seed 1 (`earlier_runs`), computed from its metrics by the same E1 code
    and rules (`training_rows`; provisional where it too was cut). One row per quantity: the paper's
    value, then each run's value and verdict; empty without an earlier run."""
    earlier = earlier_runs(folder, name)
    if not earlier:
        return pd.DataFrame()
    mine = [
        r
        for r in rows(folder, name, laptop, specs=specs)
        if r["id"] == "E1" and scorecard_stage.reads_late(r)
    ]
    run = _book_folder(folder, name) / "runs" / run_name(name, 1)
    label = f"seed 1 (slice {_slice_name(folder)}, to step {int(read_metrics(run)['step'].iloc[-1]):,})"
    table = {
        r["quantity"]: {
            "quantity": r["quantity"],
            "paper": r.get("paper"),
            label: r.get("ours"),
            f"{label}: verdict": scorecard_stage.shown_verdict(r),
        }
        for r in mine
    }
    for what, path in earlier.items():
        where = path.parents[1]
        theirs = scorecard_stage.provisional(training_rows(where, name, specs=specs), book_stage(where, name))
        long = f"{what}, to step {int(read_metrics(path)['step'].iloc[-1]):,}"
        for r in theirs:
            if r["quantity"] in table:
                table[r["quantity"]].update(
                    {long: r.get("ours"), f"{long}: verdict": scorecard_stage.shown_verdict(r)}
                )
    return pd.DataFrame(list(table.values()))
