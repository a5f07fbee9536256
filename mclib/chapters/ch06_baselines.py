"""Chapter 06, BERT against classical matrix completion (book/06_baselines.ipynb): its tables,
figures, sentences and scorecard rows in page order. Numbers come from
`mclib.analyses.comparisons`, sentences and rows from `baselines_readings`. The solvers run on
the paper's task whatever the profile; BERT meets them only on the profile's task, matrix by
matrix; nothing is rescaled across tasks.

The solvers never read the model, so their results are cached, keyed by the sha256 of the exact
matrices and masks: `build_solver_cache` (`python -m mclib solvers`) writes `solver_cache(NAME)`;
`solver_results` reads it (the committed paper file first) and solves only the rest; without a
committed file the book builds `book_solver_cache` on an idle worker while its run trains.
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..analyses import comparisons as C
from ..analyses.comparisons import E17_LOSSES, e17_beside_paper
from ..book.plots_base import closed
from ..book.scorecard import recorded_table
from ..book.scorecard_rules import band_text
from ..book.scorecard_tables import task_departures
from ..book.spec import ChapterSpec
from ..core import paper
from ..core.config import DataConfig, Profile
from ..core.paper import PAPER_E17, PAPER_E17_MATRICES
from ..core.repo import RESULTS, git_revision, mclib_sha
from .baselines_plots import nuclear_comparison_plot, ood_plot, per_matrix_plot
from .baselines_readings import SOLVER_RTOL, baseline_readings, pm

CHAPTER = "06_baselines"


# --- how a task and a table with errors are written -----------------------------------------


def describe_task(data: DataConfig) -> str:
    """'7×7 matrices of rank 2, p_mask 0.3, uniform factors, entries rounded to 2 decimals'
    for a DataConfig or a Profile."""
    d = data
    return (
        f"{d.n}×{d.n} matrices of rank {d.rank}, p_mask {d.p_mask:g}, {d.dist} factors, "
        "entries rounded to 2 decimals"
    )


def with_errors(table: pd.DataFrame, quantities, keep=()) -> pd.DataFrame:
    """A display copy of `table`: the `keep` columns, then each quantity q as "value ± s.e." (`pm`)."""
    out = table[list(keep)].copy()
    for q in quantities:
        out[q] = [pm(v, e) for v, e in zip(table[q], table[f"{q}_se"])]
    return out


# --- the opening: which task each half runs on ------------------------------------------------


def task_glue(ch) -> dict:
    """The glued names of the opening paragraph: task_paper, task_profile, task_same."""
    task = paper.task()
    return {
        "task_paper": describe_task(task),
        "task_profile": describe_task(ch.cfg.data),
        "task_same": "Here the two tasks are the same."
        if task == ch.cfg.data
        else (
            "Here the two tasks differ, so the numbers of the two halves are not comparable with each other."
        ),
    }


def experiments_table(ch):
    """What each section runs: experiment, task, matrices, setting (a styled table)."""
    a, d, task = ch.cfg.analysis, ch.cfg.data, paper.task()
    paper_task, profile_task = (
        f"the paper's ({task.n}×{task.n}, rank {task.rank})",
        f"the profile's ({d.n}×{d.n}, rank {d.rank})",
    )
    p_masks = f"p_mask {', '.join(f'{p:g}' for p in a.nuclear_p_masks)}"
    table = pd.DataFrame(
        {
            "experiment": [
                "E17 regularised nuclear norm",
                "E16 nuclear norm, solver alone",
                "classical methods, alone",
                "E16 nuclear norm vs BERT",
                "classical methods vs BERT",
                "E18 other distributions",
            ],
            "task": [paper_task] * 3 + [profile_task] * 3,
            "matrices": [
                a.regularised_matrices,
                f"{a.solver_matrices} per p_mask",
                a.solver_matrices,
                f"{a.nuclear_matrices} per p_mask",
                a.nuclear_matrices,
                f"{a.ood_matrices} per distribution",
            ],
            "setting": [
                f"λ {', '.join(f'{l:g}' for l in PAPER_E17)}",
                p_masks,
                f"p_mask {task.p_mask:g}",
                p_masks,
                f"p_mask {d.p_mask:g} (training)",
                "uniform, Gaussian, Laplace factors",
            ],
        }
    )
    return table.style.hide(axis="index").set_caption(
        f"BERT = the post-shift checkpoint (step {ch.steps.post:,}) of {ch.cfg.name}, seed {ch.cfg.seed}; "
        "within a "
        f"task every method sees the same matrices (evaluation seed {a.seed}). Convex programs: CVXPY with "
        "Clarabel."
    )


# --- where the solvers' results come from ----------------------------------------------------------


def solver_cache(name: str) -> Path:
    """results/solvers-NAME.csv.gz: the solvers' results of this chapter at profile NAME."""
    return RESULTS / f"solvers-{name}.csv.gz"


def _build_hint(name: str) -> str:
    return f"`python -m mclib solvers --profile {name}` builds it on a machine with cvxpy"


def book_solver_cache(cfg: Profile, run_dir: str | Path) -> Path:
    """OUT/runs/solvers-NAME-SHA.csv.gz beside `run_dir`: the results the book builds for itself;
    SHA (12 digits of `mclib_sha`) keeps a file solved by other code from being read."""
    return Path(run_dir).parent / f"solvers-{cfg.name}-{mclib_sha()[:12]}.csv.gz"


def book_solver_task(cfg: Profile, run_dir: str | Path) -> tuple[Callable, tuple, str] | None:
    """(fn, args, name) solving this chapter on an idle worker (`idle_tasks`), or None when a cache
    exists (`solver_cache` or `book_solver_cache`)."""
    own = book_solver_cache(cfg, run_dir)
    if solver_cache(cfg.name).is_file() or own.is_file():
        return None
    return _build_on_a_worker, (cfg, own), f"solvers-{cfg.name}"


def idle_work(cfg: Profile, run_dir: str | Path) -> list[tuple[Callable, tuple, str]]:
    """Work for a worker the book's seeds leave idle: `book_solver_task`, where no cache exists."""
    task = book_solver_task(cfg, run_dir)
    return [task] if task else []


def solver_results(ch) -> C.Solves:
    """The solvers' results this chapter reads (`open_solves`): the committed `solver_cache`,
    else `book_solver_cache`; the paper file first; the rest solved here."""
    committed, own = solver_cache(ch.cfg.name), book_solver_cache(ch.cfg, ch.run_dir)
    path = own if own.is_file() and not committed.is_file() else committed
    return C.open_solves(path, hint=_build_hint(ch.cfg.name), reuse=solver_cache("paper"))


def _solves(ch, solves: C.Solves | None) -> C.Solves:
    return solver_results(ch) if solves is None else solves


# --- the solvers alone, on the paper's task -------------------------------------------------------


def e17_table(ch, solves: C.Solves | None = None) -> pd.DataFrame:
    """E17: the regularised nuclear norm at the paper's λs on the paper's task, and BERT on the
    same matrices where the profile trains that task. `solves` (every table): default `solver_results`."""
    model = None if task_departures(ch.cfg) else ch.post
    return C.regularised_table(
        paper.task(),
        list(PAPER_E17),
        ch.cfg.analysis.regularised_matrices,
        ch.cfg.analysis.seed,
        model=model,
        solves=_solves(ch, solves),
    )


def e17_shown(ch, reg: pd.DataFrame):
    """`e17_beside_paper` styled: one row per λ, "ours ± s.e." beside the paper's, and the gap in s.e."""
    t = e17_beside_paper(reg)
    out = pd.DataFrame({"λ": [f"{lam:g}" for lam in dict.fromkeys(t["lam"])]})
    for q in E17_LOSSES:
        part = t[t["quantity"] == q]
        out[f"{q}, ours"] = [pm(v, e) for v, e in zip(part["ours"], part["se"])]
        out[f"{q}, paper"] = [
            f"{v:.5g}" if v >= 1e-3 else np.format_float_scientific(v, trim="-") for v in part["paper"]
        ]
        out[f"{q}, ours − paper (s.e.)"] = [f"{z:+.1f}" for z in part["z"]]
    n = ch.cfg.analysis.regularised_matrices
    return out.style.hide(axis="index").set_caption(
        f"E17 on the paper's task ({describe_task(paper.task())}), {n} matrices: ours ± one standard "
        f"error beside the paper's means over its {PAPER_E17_MATRICES} matrices."
    )


def solver_sweep(ch, solves: C.Solves | None = None) -> pd.DataFrame:
    """E16's solver alone on the paper's task, across the book's p_masks (`nuclear_sweep`, no model)."""
    a = ch.cfg.analysis
    return C.nuclear_sweep(
        None, paper.task(), a.nuclear_p_masks, a.solver_matrices, a.seed, solves=_solves(ch, solves)
    )


def solver_sweep_figure(sweep: pd.DataFrame):
    return closed(
        nuclear_comparison_plot(
            sweep, paper.task().p_mask, title="Nuclear-norm minimisation on the paper's task"
        )
    )


def sweep_shown(sweep: pd.DataFrame, caption: str):
    """`nuclear_sweep` styled, one row per p_mask: L and mean nuclear norm ± s.e. of each method, the
    true X's nuclear norm, and (with BERT) BERT − solver, paired."""
    methods = [m for m in dict.fromkeys(sweep["method"]) if m != "truth"]
    out = pd.DataFrame({"p_mask": sorted(set(sweep["p_mask"]))}).set_index("p_mask")
    by = sweep.set_index(["method", "p_mask"])
    for m in methods:
        out[f"L, {m}"] = [pm(by.loc[(m, p), "L"], by.loc[(m, p), "L_se"]) for p in out.index]
    if "BERT" in methods:
        out["L, BERT − solver (paired)"] = [
            pm(by.loc[("BERT", p), "d_L"], by.loc[("BERT", p), "d_L_se"]) for p in out.index
        ]
    for m in methods:
        out[f"‖·‖_*, {m}"] = [pm(by.loc[(m, p), "nuclear"], by.loc[(m, p), "nuclear_se"]) for p in out.index]
    out["‖·‖_*, true X"] = [
        pm(by.loc[("truth", p), "nuclear"], by.loc[("truth", p), "nuclear_se"]) for p in out.index
    ]
    out.index = [f"{p:g}" for p in out.index]
    return out.rename_axis("p_mask").reset_index().style.hide(axis="index").set_caption(caption)


def solver_sweep_shown(ch, sweep: pd.DataFrame):
    return sweep_shown(
        sweep,
        f"The solver on the paper's task, {ch.cfg.analysis.solver_matrices} matrices per "
        "p_mask: L over all entries and the mean nuclear norm of the output, ± one standard error.",
    )


def solvers_table(ch, solves: C.Solves | None = None) -> pd.DataFrame:
    """The nuclear norm, soft-impute and ALS alone on the paper's task (`classical_table`, no model)."""
    return C.classical_table(
        None, paper.task(), ch.cfg.analysis.solver_matrices, ch.cfg.analysis.seed, solves=_solves(ch, solves)
    )[0]


def solvers_shown(ch, solvers: pd.DataFrame):
    return (
        with_errors(solvers, ["L", "L_obs", "L_mask", "median_L_mask", "nuclear"], keep=["method"])
        .style.hide(axis="index")
        .set_caption(
            f"The paper's task at p_mask {paper.task().p_mask:g}, {ch.cfg.analysis.solver_matrices} "
            "matrices, ± "
            "one standard error. median_L_mask: the median over matrices of each matrix's own L_mask."
        )
    )


# --- BERT beside the solvers, on the profile's task ---------------------------------------------


def bert_sweep(ch, solves: C.Solves | None = None) -> pd.DataFrame:
    """E16: BERT (the post checkpoint) and the solver on the same matrices, across the p_masks."""
    a = ch.cfg.analysis
    return C.nuclear_sweep(
        ch.post, ch.cfg.data, a.nuclear_p_masks, a.nuclear_matrices, a.seed, solves=_solves(ch, solves)
    )


def bert_sweep_figure(ch, sweep: pd.DataFrame):
    return closed(
        nuclear_comparison_plot(
            sweep, ch.cfg.data.p_mask, title=f"BERT against nuclear-norm minimisation ({ch.cfg.name})"
        )
    )


def bert_sweep_shown(ch, sweep: pd.DataFrame):
    return sweep_shown(
        sweep,
        f"E16 on the profile's task, {ch.cfg.analysis.nuclear_matrices} matrices per p_mask: "
        "L over all entries and the mean nuclear norm of the output, ± one standard error; "
        "BERT − solver is paired (the same matrices).",
    )


def classical_tables(ch, solves: C.Solves | None = None) -> tuple[pd.DataFrame, dict]:
    """BERT and the classical methods on the same matrices at the training p_mask: the table and
    each method's per-matrix L_mask."""
    return C.classical_table(
        ch.post,
        ch.cfg.data,
        ch.cfg.analysis.nuclear_matrices,
        ch.cfg.analysis.seed,
        solves=_solves(ch, solves),
    )


def classical_figure(ch, per: dict):
    return closed(
        per_matrix_plot(
            per,
            title=f"Error per matrix, p_mask {ch.cfg.data.p_mask:g}: BERT ({ch.cfg.name}) "
            "and classical methods",
        )
    )


def classical_shown(ch, classical: pd.DataFrame):
    shown = with_errors(
        classical,
        ["L", "L_obs", "L_mask", "median_L_mask", "nuclear", "BERT_d_L_mask", "BERT_better"],
        keep=["method"],
    )
    return (
        shown.rename(columns={"BERT_d_L_mask": "BERT − method, L_mask", "BERT_better": "BERT better on"})
        .style.hide(axis="index")
        .set_caption(
            f"{ch.cfg.analysis.nuclear_matrices} matrices of the profile's task at p_mask "
            f"{ch.cfg.data.p_mask:g}, ± "
            "one standard error. BERT − method: paired difference of L_mask; BERT better on: the share of "
            "matrices where BERT's own L_mask is lower."
        )
    )


def ood_table(ch, solves: C.Solves | None = None) -> pd.DataFrame:
    """E18: BERT on Gaussian and Laplace factors beside uniform ones; the solver on as many
    matrices as E16 uses per p_mask."""
    a = ch.cfg.analysis
    return C.ood_table(
        ch.post,
        ch.cfg.data,
        a.ood_matrices,
        a.seed,
        solver_matrices=a.nuclear_matrices,
        solves=_solves(ch, solves),
    )


def ood_figure(ch, ood: pd.DataFrame):
    return closed(ood_plot(ood, title=f"Factor distributions: BERT ({ch.cfg.name}) and the nuclear norm"))


def ood_shown(ch, ood: pd.DataFrame):
    shown = with_errors(ood, ["L", "L_obs", "L_mask"], keep=["dist", "method", "matrices"])
    shown["E[X²]"], shown["L_mask / E[X²]"], shown["outside"] = (
        ood["copy_level"],
        ood["L_mask_rel"],
        ood["outside"],
    )
    return (
        shown.style.hide(axis="index")
        .format({"E[X²]": "{:.3f}", "L_mask / E[X²]": "{:.3f}", "outside": "{:.1%}"})
        .set_caption(
            f"E18 on {ch.cfg.analysis.ood_matrices} matrices per distribution, ± one standard error."
        )
    )


def readings(ch, sweep, reg, ood, classical, *, solver_sweep, solvers) -> tuple[dict, list[dict]]:
    """`baseline_readings` of this chapter's tables: the closing paragraph's glue (solver_rule
    included) and the scorecard rows."""
    glue, rows = baseline_readings(
        sweep,
        reg,
        ood,
        classical,
        ch.cfg.data.p_mask,
        rank=ch.cfg.data.rank,
        n_regularised=ch.cfg.analysis.regularised_matrices,
        solver_sweep=solver_sweep,
        solvers=solvers,
        task=paper.task(),
    )
    return {**glue, "solver_rule": band_text("number", SOLVER_RTOL)}, rows


def scorecard_table(ch, rows: list[dict]):
    """Records and shows the rows (E17 against the paper's numbers; E16, E18 by their rules)."""
    return recorded_table(ch.run_dir, rows, CHAPTER)


# --- the solvers' results, built beforehand -----------------------------------------------------

TABLES = (
    e17_table,
    solver_sweep,
    solvers_table,
    bert_sweep,
    classical_tables,
    ood_table,
)  # every table that solves


@dataclass
class _NoModel:
    """This chapter as its solvers see it: the profile, and no model."""

    cfg: Profile
    post: None = None


def build_solver_cache(
    cfg: Profile, path: Path | None = None, *, say: Callable = print
) -> tuple[Path, C.Solves]:
    """Solves every matrix this chapter solves at profile `cfg` (its TABLES, without a model) and
    saves the results atomically at `path` (default `solver_cache(cfg.name)`), saying a line per
    block and a closing count. Away from the paper profile, draws held by the committed paper file
    are read from it, not solved or written. Returns (path, solves)."""
    path = solver_cache(cfg.name) if path is None else Path(path)
    paper_file = solver_cache("paper")
    reuse = (
        C.read_solves(paper_file, say=say)
        if cfg.name != "paper" and paper_file.is_file() and paper_file.resolve() != path.resolve()
        else None
    )
    revision = git_revision()  # of the code that solves
    solves = C.Solves(say=say, log=True, reuse=reuse)
    start = time.perf_counter()
    for table in TABLES:
        table(_NoModel(cfg), solves)
    seconds = time.perf_counter() - start
    versions = ", ".join(f"{m} {importlib.metadata.version(m)}" for m in ("cvxpy", "clarabel", "numpy"))

    def counts(blocks: dict) -> tuple[int, int]:  # matrices, cvxpy solves
        return (
            sum(b.rows for b in blocks.values()),
            sum(b.rows for (_, how, _), b in blocks.items() if how.startswith(C.NEEDS_CVXPY)),
        )

    (rows, convex), (read_rows, read_convex) = counts(solves.blocks), counts(solves.reused)
    shown = paper_file.relative_to(RESULTS.parent)  # results/solvers-paper.csv.gz, wherever the clone is
    read = (
        f"; {len(solves.reused)} blocks, {read_rows} matrices ({read_convex} cvxpy solves) read from {shown} "
        "(the same matrices, masks and settings), not held here"
        if solves.reused
        else ""
    )
    note = (
        f"chapter 06's solver results at profile {cfg.name}: {len(solves.blocks)} blocks, {rows} matrices "
        f"({convex} cvxpy solves){read}; built {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in "
        f"{seconds:.0f} s on one process, revision {revision}, {versions}"
    )
    solves.save(path, note)
    say(
        f"{path}: {len(solves.blocks)} blocks, {rows:,} matrices ({convex:,} cvxpy solves), "
        f"{path.stat().st_size / 2**20:.2f} MiB, solved in {seconds:.0f} s"
        + (
            f"; {len(solves.reused)} blocks ({read_convex:,} cvxpy solves) read from {shown}, not solved"
            if solves.reused
            else ""
        )
    )
    return path, solves


def _build_on_a_worker(cfg: Profile, path: Path) -> Path:
    """`build_solver_cache`, silent (a worker's output reaches no page)."""
    return build_solver_cache(cfg, path, say=lambda *_: None)[0]


# What this chapter declares to the machinery (mclib.book.spec; collected by mclib.chapters.registry).
SPEC = ChapterSpec(CHAPTER, idle_work=idle_work)
