"""Chapter 06, BERT against classical matrix completion (book/06_baselines.ipynb): its
tables, figures, closing sentences and scorecard rows, in the order the page shows them.

The numbers (errors included) come from `mclib.analyses.comparisons`; this module words
them. The solvers alone run on the paper's task, whatever the profile; BERT is compared
with them only on its own (the profile's) task, matrix by matrix. No number is rescaled
across tasks.

Where the paper states a result in words only (E16, E18), the sentence says whether the
claim holds from the numbers and their errors: a difference "within error" is within two
standard errors of zero (`within_error`), and "similar" is the scorecard's ratio rule.

The solvers never read the model, so their results can be computed beforehand:
`build_solver_cache` (`python -m mclib solvers --profile NAME`, on the CPU machine) runs
this chapter's table functions without a model and saves every solver's per-matrix
results at `solver_cache(NAME)`, results/solvers-NAME.csv.gz, keyed by the sha256 of the
exact matrices and masks. The chapter reads that file (`solver_results`) and solves only
what it does not hold, saying so in one line: on a GPU lease, which has no cvxpy and whose
CPU time is the lease's, it then solves nothing. At every profile it first reads the
committed results/solvers-paper.csv.gz for the draws that file holds exactly (the paper
task's at the cpu profile, which shares the paper's sample sizes and seed), and a build at
another profile neither solves nor writes those. The cpu profile's own file is committed too
(results/solvers-cpu.csv.gz, 2026-11-27), so its chapter solves nothing. Where no file is
committed for the profile, the book builds one for itself beside its run (`book_solver_cache`)
on a worker that the other seeds leave idle while the book's run trains
(`mclib.book.chapter.idle_tasks`), and the chapter reads that.
"""
from __future__ import annotations

import importlib.metadata
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from ..analyses import comparisons as C
from ..analyses.comparisons import E17_LOSSES, e17_beside_paper
from ..core import paper
from ..core.config import DataConfig, Profile
from ..core.paper import PAPER, PAPER_E17, PAPER_E17_MATRICES
from ..analyses.loss_tables import ratio_se
from ..core.repo import RESULTS
from ..book.plots import closed, nuclear_comparison_plot, ood_plot, per_matrix_plot
from ..book.scorecard import CLOSE, MARGINS, agreement, claim, recorded_table, row_verdict, task_departures

CHAPTER = "06_baselines"
# A solver's number on the paper's task "matches" the paper's when the paper's value lies
# within ours ± (2 standard errors + SOLVER_RTOL of the paper's value). 10 %: about the
# sampling error of the paper's own 256-matrix L_mask (our per-matrix spread gives 8-9 %),
# which the paper does not report; two significant figures of a number, give or take one.
SOLVER_RTOL = 0.10
SE_TARGET = 0.05  # sample sizes aim at a standard error under 5 % of the value


# --- how a number is written ----------------------------------------------------------------

def within_error(diff: float, se: float, k: float = 2.0) -> bool:
    """True when a difference is within k (2) standard errors of zero: the data cannot tell
    the two apart."""
    return bool(abs(diff) <= k * se)


def pm(value: float, se: float) -> str:
    """"value ± se" with the error to 2 significant figures and the value to the same
    decimal place, e.g. 0.0350 ± 0.0015 or (1.0153 ± 0.0039)e-05 for small values."""
    if not np.isfinite(value):
        return "—"
    if not (np.isfinite(se) and se > 0):
        return f"{value:.4g}"
    e = int(np.floor(np.log10(max(abs(value), se))))  # the larger sets the notation
    shift = e if not -3 <= e < 3 else 0  # scientific notation outside 0.001-999
    v, s = value / 10 ** shift, se / 10 ** shift
    places = max(0, 1 - int(np.floor(np.log10(s))))
    text = f"{v:.{places}f} ± {s:.{places}f}"
    return f"({text})e{shift:+03d}" if shift else text


def describe_task(data: DataConfig) -> str:
    """'7×7 matrices of rank 2, p_mask 0.3, uniform factors, entries rounded to 2 decimals'
    for a DataConfig or a Profile (mclib.core.data rounds every X to the 0.01 grid)."""
    d = data
    return f"{d.n}×{d.n} matrices of rank {d.rank}, p_mask {d.p_mask:g}, {d.dist} factors, entries rounded to 2 decimals"


def with_errors(table: pd.DataFrame, quantities, keep=()) -> pd.DataFrame:
    """A copy of `table` for display: the `keep` columns as they are, then every quantity q
    as the text "value ± s.e." (`pm`) from the columns q and q_se."""
    out = table[list(keep)].copy()
    for q in quantities:
        out[q] = [pm(v, e) for v, e in zip(table[q], table[f"{q}_se"])]
    return out




# --- the opening: which task each half runs on ------------------------------------------------

def task_glue(ch) -> dict:
    """The glued names of the opening paragraph: task_paper, task_profile, task_same."""
    task = paper.task()
    return {"task_paper": describe_task(task), "task_profile": describe_task(ch.cfg.data),
            "task_same": "Here the two tasks are the same." if task == ch.cfg.data else
            "Here the two tasks differ, so the numbers of the two halves are not comparable with each other."}


def experiments_table(ch):
    """What each section runs: experiment, task, matrices, setting (a styled table)."""
    a, d, task = ch.cfg.analysis, ch.cfg.data, paper.task()
    paper_task, profile_task = f"the paper's ({task.n}×{task.n}, rank {task.rank})", f"the profile's ({d.n}×{d.n}, rank {d.rank})"
    p_masks = f"p_mask {', '.join(f'{p:g}' for p in a.nuclear_p_masks)}"
    table = pd.DataFrame({
        "experiment": ["E17 regularised nuclear norm", "E16 nuclear norm, solver alone", "classical methods, alone",
                       "E16 nuclear norm vs BERT", "classical methods vs BERT", "E18 other distributions"],
        "task": [paper_task] * 3 + [profile_task] * 3,
        "matrices": [a.regularised_matrices, f"{a.solver_matrices} per p_mask", a.solver_matrices,
                     f"{a.nuclear_matrices} per p_mask", a.nuclear_matrices, f"{a.ood_matrices} per distribution"],
        "setting": [f"λ {', '.join(f'{l:g}' for l in PAPER_E17)}", p_masks, f"p_mask {task.p_mask:g}", p_masks,
                    f"p_mask {d.p_mask:g} (training)", "uniform, Gaussian, Laplace factors"]})
    return table.style.hide(axis="index").set_caption(
        f"BERT = the post-shift checkpoint (step {ch.steps.post:,}) of {ch.cfg.name}, seed {ch.cfg.seed}; within a "
        f"task every method sees the same matrices (evaluation seed {a.seed}). Convex programs: CVXPY with Clarabel.")


# --- where the solvers' results come from ----------------------------------------------------------

def solver_cache(name: str) -> Path:
    """results/solvers-NAME.csv.gz: the solvers' results of this chapter at profile NAME."""
    return RESULTS / f"solvers-{name}.csv.gz"


def _build_hint(name: str) -> str:
    return f"`python -m mclib solvers --profile {name}` builds it on a machine with cvxpy"


def book_solver_cache(cfg: Profile, run_dir: str | Path) -> Path:
    """OUT/runs/solvers-NAME-SHA.csv.gz, beside the book's run `run_dir`: the solvers' results
    this book built for itself while its run trained (`book_solver_task`). SHA is the first 12
    digits of the library's source hash (`mclib.core.repo.mclib_sha`), so that a file
    solved by other code is never read."""
    from ..core.repo import mclib_sha

    return Path(run_dir).parent / f"solvers-{cfg.name}-{mclib_sha()[:12]}.csv.gz"


def book_solver_task(cfg: Profile, run_dir: str | Path) -> tuple[Callable, tuple, str] | None:
    """The solving of this chapter as a task for a worker that the book's seeds leave idle
    (`mclib.book.chapter.idle_tasks`): (fn, args, name), or None where a cache is there to
    read (the committed `solver_cache`, or `book_solver_cache`)."""
    own = book_solver_cache(cfg, run_dir)
    if solver_cache(cfg.name).is_file() or own.is_file():
        return None
    return _build_on_a_worker, (cfg, own), f"solvers-{cfg.name}"


def idle_work(cfg: Profile, run_dir: str | Path) -> list[tuple[Callable, tuple, str]]:
    """This chapter's declared work for a worker the book's seeds leave idle
    (`mclib.book.chapter.idle_tasks`): its solving (`book_solver_task`), where no cache is there."""
    task = book_solver_task(cfg, run_dir)
    return [task] if task else []


def solver_results(ch) -> C.Solves:
    """The solvers' results this chapter reads: `solver_cache(profile)`, committed, else the
    book's own `book_solver_cache`, read once, where it was built; at every profile the
    committed `solver_cache("paper")` is read first for the draws it holds exactly (the paper
    task's at the profiles that share its sample sizes and seed, such as cpu); what neither
    holds (or all, without either) is solved here. Each said in one line
    (`mclib.analyses.comparisons.open_solves`)."""
    committed, own = solver_cache(ch.cfg.name), book_solver_cache(ch.cfg, ch.run_dir)
    path = own if own.is_file() and not committed.is_file() else committed
    return C.open_solves(path, hint=_build_hint(ch.cfg.name), reuse=solver_cache("paper"))


def _solves(ch, solves: C.Solves | None) -> C.Solves:
    return solver_results(ch) if solves is None else solves


# --- the solvers alone, on the paper's task -------------------------------------------------------

def e17_table(ch, solves: C.Solves | None = None) -> pd.DataFrame:
    """E17: the regularised nuclear norm at the paper's λs on the paper's task
    (`regularised_table`), and BERT on the same matrices where the profile trains that task.
    solves (every table here): where the solvers' results come from (default `solver_results`)."""
    model = None if task_departures(ch.cfg) else ch.post
    return C.regularised_table(paper.task(), list(PAPER_E17), ch.cfg.analysis.regularised_matrices, ch.cfg.analysis.seed,
                               model=model, solves=_solves(ch, solves))


def e17_shown(ch, reg: pd.DataFrame):
    """`e17_beside_paper` for display: one row per λ, each loss as "ours ± s.e." beside the
    paper's, and how many of our standard errors apart (a styled table)."""
    t = e17_beside_paper(reg)
    out = pd.DataFrame({"λ": [f"{lam:g}" for lam in dict.fromkeys(t["lam"])]})
    for q in E17_LOSSES:
        part = t[t["quantity"] == q]
        out[f"{q}, ours"] = [pm(v, e) for v, e in zip(part["ours"], part["se"])]
        out[f"{q}, paper"] = [f"{v:.5g}" if v >= 1e-3 else np.format_float_scientific(v, trim="-") for v in part["paper"]]
        out[f"{q}, ours − paper (s.e.)"] = [f"{z:+.1f}" for z in part["z"]]
    n = ch.cfg.analysis.regularised_matrices
    return out.style.hide(axis="index").set_caption(
        f"E17 on the paper's task ({describe_task(paper.task())}), {n} matrices: ours ± one standard "
        f"error beside the paper's means over its {PAPER_E17_MATRICES} matrices.")



def solver_sweep(ch, solves: C.Solves | None = None) -> pd.DataFrame:
    """E16's solver alone on the paper's task, across the book's p_masks (`nuclear_sweep`, no model)."""
    a = ch.cfg.analysis
    return C.nuclear_sweep(None, paper.task(), a.nuclear_p_masks, a.solver_matrices, a.seed, solves=_solves(ch, solves))


def solver_sweep_figure(sweep: pd.DataFrame):
    return closed(nuclear_comparison_plot(sweep, paper.task().p_mask, title="Nuclear-norm minimisation on the paper's task"))


def sweep_shown(sweep: pd.DataFrame, caption: str):
    """`nuclear_sweep` as one row per p_mask for display: L and the mean nuclear norm of each
    method ± s.e., the true X's nuclear norm, and (with BERT) BERT − solver, paired."""
    methods = [m for m in dict.fromkeys(sweep["method"]) if m != "truth"]
    out = pd.DataFrame({"p_mask": sorted(set(sweep["p_mask"]))}).set_index("p_mask")
    by = sweep.set_index(["method", "p_mask"])
    for m in methods:
        out[f"L, {m}"] = [pm(by.loc[(m, p), "L"], by.loc[(m, p), "L_se"]) for p in out.index]
    if "BERT" in methods:
        out["L, BERT − solver (paired)"] = [pm(by.loc[("BERT", p), "d_L"], by.loc[("BERT", p), "d_L_se"])
                                            for p in out.index]
    for m in methods:
        out[f"‖·‖_*, {m}"] = [pm(by.loc[(m, p), "nuclear"], by.loc[(m, p), "nuclear_se"]) for p in out.index]
    out["‖·‖_*, true X"] = [pm(by.loc[("truth", p), "nuclear"], by.loc[("truth", p), "nuclear_se"]) for p in out.index]
    out.index = [f"{p:g}" for p in out.index]
    return out.rename_axis("p_mask").reset_index().style.hide(axis="index").set_caption(caption)



def solver_sweep_shown(ch, sweep: pd.DataFrame):
    return sweep_shown(sweep, f"The solver on the paper's task, {ch.cfg.analysis.solver_matrices} matrices per "
                              "p_mask: L over all entries and the mean nuclear norm of the output, ± one standard error.")


def solvers_table(ch, solves: C.Solves | None = None) -> pd.DataFrame:
    """The nuclear norm, soft-impute and ALS alone on the paper's task (`classical_table`, no model)."""
    return C.classical_table(None, paper.task(), ch.cfg.analysis.solver_matrices, ch.cfg.analysis.seed,
                             solves=_solves(ch, solves))[0]


def solvers_shown(ch, solvers: pd.DataFrame):
    return (with_errors(solvers, ["L", "L_obs", "L_mask", "median_L_mask", "nuclear"], keep=["method"])
            .style.hide(axis="index").set_caption(
                f"The paper's task at p_mask {paper.task().p_mask:g}, {ch.cfg.analysis.solver_matrices} matrices, ± "
                "one standard error. median_L_mask: the median over matrices of each matrix's own L_mask."))


# --- BERT beside the solvers, on the profile's task ---------------------------------------------

def bert_sweep(ch, solves: C.Solves | None = None) -> pd.DataFrame:
    """E16: BERT (the post checkpoint) and the solver on the same matrices, across the p_masks."""
    a = ch.cfg.analysis
    return C.nuclear_sweep(ch.post, ch.cfg.data, a.nuclear_p_masks, a.nuclear_matrices, a.seed,
                           solves=_solves(ch, solves))


def bert_sweep_figure(ch, sweep: pd.DataFrame):
    return closed(nuclear_comparison_plot(sweep, ch.cfg.data.p_mask,
                                          title=f"BERT against nuclear-norm minimisation ({ch.cfg.name})"))


def bert_sweep_shown(ch, sweep: pd.DataFrame):
    return sweep_shown(sweep, f"E16 on the profile's task, {ch.cfg.analysis.nuclear_matrices} matrices per p_mask: "
                              "L over all entries and the mean nuclear norm of the output, ± one standard error; "
                              "BERT − solver is paired (the same matrices).")


def classical_tables(ch, solves: C.Solves | None = None) -> tuple[pd.DataFrame, dict]:
    """BERT and the classical methods on the same matrices at the training p_mask: the table
    and each method's per-matrix L_mask (`classical_table`)."""
    return C.classical_table(ch.post, ch.cfg.data, ch.cfg.analysis.nuclear_matrices, ch.cfg.analysis.seed,
                             solves=_solves(ch, solves))


def classical_figure(ch, per: dict):
    return closed(per_matrix_plot(per, title=f"Error per matrix, p_mask {ch.cfg.data.p_mask:g}: BERT ({ch.cfg.name}) "
                                             "and classical methods"))


def classical_shown(ch, classical: pd.DataFrame):
    shown = with_errors(classical, ["L", "L_obs", "L_mask", "median_L_mask", "nuclear", "BERT_d_L_mask", "BERT_better"],
                        keep=["method"])
    return (shown.rename(columns={"BERT_d_L_mask": "BERT − method, L_mask", "BERT_better": "BERT better on"})
            .style.hide(axis="index").set_caption(
                f"{ch.cfg.analysis.nuclear_matrices} matrices of the profile's task at p_mask {ch.cfg.data.p_mask:g}, ± "
                "one standard error. BERT − method: paired difference of L_mask; BERT better on: the share of "
                "matrices where BERT's own L_mask is lower."))


def ood_table(ch, solves: C.Solves | None = None) -> pd.DataFrame:
    """E18: BERT on Gaussian and Laplace factors beside uniform ones; the solver on a subset
    (as many matrices as E16 uses per p_mask)."""
    a = ch.cfg.analysis
    return C.ood_table(ch.post, ch.cfg.data, a.ood_matrices, a.seed, solver_matrices=a.nuclear_matrices,
                       solves=_solves(ch, solves))


def ood_figure(ch, ood: pd.DataFrame):
    return closed(ood_plot(ood, title=f"Factor distributions: BERT ({ch.cfg.name}) and the nuclear norm"))


def ood_shown(ch, ood: pd.DataFrame):
    shown = with_errors(ood, ["L", "L_obs", "L_mask"], keep=["dist", "method", "matrices"])
    shown["E[X²]"], shown["L_mask / E[X²]"], shown["outside"] = ood["copy_level"], ood["L_mask_rel"], ood["outside"]
    return (shown.style.hide(axis="index").format({"E[X²]": "{:.3f}", "L_mask / E[X²]": "{:.3f}", "outside": "{:.1%}"})
            .set_caption(f"E18 on {ch.cfg.analysis.ood_matrices} matrices per distribution, ± one standard error."))


# --- the closing paragraph and the scorecard rows ----------------------------------------------

def _e16_same_matrices(sweep: pd.DataFrame, classical: pd.DataFrame, p_train: float) -> tuple[str, list[dict]]:
    """E16 on the profile's task: BERT and the solver on the same matrices (paired errors)."""
    at = classical.set_index("method")
    bert, nuc = at.loc["BERT"], at.loc["nuclear norm"]
    d, d_se = nuc.BERT_d_L, nuc.BERT_d_L_se
    rows = [claim("E16", f"BERT L / solver L at p_mask {p_train:g} (profile's task, same matrices)",
                  float(bert.L / nuc.L), "", kind="direction", reference=1.0, sense="below", se=float(d_se / nuc.L)),
            claim("E16", f"BERT ‖X̂‖_* / solver ‖U‖_* at p_mask {p_train:g} (profile's task, same matrices)",
                  float(bert.nuclear / nuc.nuclear), "", kind="direction", reference=1.0, sense="above",
                  se=float(bert.nuclear / nuc.nuclear * np.hypot(bert.nuclear_se / bert.nuclear,
                                                                  nuc.nuclear_se / nuc.nuclear)))]
    # the paper's other half of E16: at mask rates well above the training one, BERT is worse than the solver
    b_hi = sweep[sweep["method"] == "BERT"].set_index("p_mask").sort_index().iloc[-1]
    s_hi = sweep[sweep["method"] == "nuclear norm"].set_index("p_mask").loc[b_hi.name]
    hi = claim("E16", f"BERT L / solver L at p_mask {b_hi.name:g}, the highest (profile's task, same matrices)",
               float(b_hi.L / s_hi.L), "", kind="direction", reference=1.0, sense="above",
               se=float(b_hi.d_L_se / s_hi.L))
    hi["reading"] = (f"BERT − solver {pm(b_hi.d_L, b_hi.d_L_se)} (paired s.e.): "
                     + ("BERT and the solver within two standard errors of each other" if within_error(b_hi.d_L, b_hi.d_L_se)
                        else f"BERT {'worse' if b_hi.d_L > 0 else 'better'} by more than two standard errors")
                     + " at a mask rate BERT was not trained on; L ratio " + _beyond_said(hi, "higher")
                     + " (paper: worse above the training p_mask)")
    # what the numbers say, then whether that is the paper's claim by the row's direction rule (its margin included)
    lower = agreement(row_verdict(rows[0]))
    margin = f"{MARGINS['direction']:.0%}"
    diff = ("within two standard errors of zero, so these matrices cannot tell the two apart" if within_error(d, d_se)
            else f"BERT {'lower' if d < 0 else 'higher'} by more than two standard errors")
    diff_said = f"{diff}; by the direction rule (BERT's L more than {margin} below the solver's), {lower}"
    share, share_se = nuc.BERT_better, nuc.BERT_better_se
    most = "lower" if share - 2 * share_se > 0.5 else "higher" if share + 2 * share_se < 0.5 else None
    pooled_says = None if within_error(d, d_se) else "lower" if d < 0 else "higher"
    if most == pooled_says:
        per_matrix = "the same story as the pooled means"
    else:
        per_matrix = (f"{'on most matrices BERT is ' + most if most else 'neither is better on most matrices'}, "
                      "another story than the pooled means tell, which the matrices with the largest errors dominate")
    true_nuc = float(sweep.loc[sweep["method"] == "truth", "nuclear"].iloc[0])  # the same X at every p_mask
    b = sweep[sweep["method"] == "BERT"].set_index("p_mask")
    groups = {"below": [], "above": [], "within error of": []}
    for p, r in b.iterrows():
        key = "within error of" if within_error(r.d_L, r.d_L_se) else "below" if r.d_L < 0 else "above"
        groups[key].append(f"{p:g}")
    across = "; ".join(f"{k} it at p_mask {', '.join(v)}" for k, v in groups.items() if v)
    nuclear_said = _beyond_said(rows[1], "larger")
    text = (f"At the training p_mask {p_train:g}, on the same matrices, BERT's L is {pm(bert.L, bert.L_se)} and the "
            f"solver's {pm(nuc.L, nuc.L_se)}; the paired difference BERT − solver is {pm(d, d_se)}: {diff_said}. "
            f"Matrix by matrix, the median matrix's L_mask is {pm(bert.median_L_mask, bert.median_L_mask_se)} for "
            f"BERT and {pm(nuc.median_L_mask, nuc.median_L_mask_se)} for the solver, and BERT's own L_mask is the "
            f"lower on {nuc.BERT_better:.0%} ± {nuc.BERT_better_se:.0%} of the matrices: {per_matrix}. "
            f"Across mask rates (paired differences, two standard errors) BERT is "
            f"{across}. The mean nuclear norm of BERT's outputs is {pm(bert.nuclear, bert.nuclear_se)} against the "
            f"solver's {pm(nuc.nuclear, nuc.nuclear_se)} (true X: {true_nuc:.3f}): {nuclear_said}")
    rows[0]["reading"] = (f"BERT − solver {pm(d, d_se)} (paired s.e.): {diff}, {lower}; BERT's per-matrix L_mask "
                          f"lower on {nuc.BERT_better:.0%} of the matrices")
    rows[1]["reading"] = (f"BERT's over the solver's: {nuclear_said} (paper: larger); {pm(bert.nuclear, bert.nuclear_se)} vs "
                          f"{pm(nuc.nuclear, nuc.nuclear_se)}")
    return text, rows + [hi]


def _beyond_said(row: dict, more: str) -> str:
    """A direction row of E16 (a ratio against 1, `sense` above or below) in words made from
    the row alone: its ratio ± two standard errors, where that lies against the band the
    direction rule asks for (more than `margin` beyond 1), and the row's verdict's words,
    e.g. "1.05 ± 0.02: larger, short of the more than 10 % larger the direction rule asks,
    unlike the paper"."""
    verdict = row_verdict(row)
    r, se = row["ours"], row.get("se") or 0.0
    m = MARGINS["direction"] if row.get("margin") is None else row["margin"]
    less = {"larger": "smaller", "higher": "lower", "lower": "higher"}[more]
    side = more if r - 2 * se > 1 else less if r + 2 * se < 1 else "within two standard errors of 1"
    ask = f"more than {m:.0%} {more}"
    where = {"same direction": f"beyond the {ask} the direction rule asks",
             "differs": f"short of the {ask} the direction rule asks",
             CLOSE: f"two standard errors reach both sides of the {ask} the direction rule asks"}.get(
                 verdict, "judged by the direction rule")
    return f"{r:.3g} ± {2 * se:.2g} (two s.e.): {side}, {where}, {agreement(verdict)}"


def _e16_solver(solver_sweep: pd.DataFrame, task) -> str:
    """E16's solver curve on the paper's task (no model): L ± s.e. across p_mask."""
    s = solver_sweep[solver_sweep["method"] == "nuclear norm"].set_index("p_mask").sort_index()
    lo, hi = s.iloc[0], s.iloc[-1]
    noisy = [f"{p:g}" for p, r in s.iterrows() if r.L_se > SE_TARGET * r.L]
    text = (f"On the paper's task the solver's L rises from {pm(lo.L, lo.L_se)} at p_mask {s.index[0]:g} to "
            f"{pm(hi.L, hi.L_se)} at {s.index[-1]:g}")
    if task.p_mask in s.index:
        at = s.loc[task.p_mask]
        text += f"; at the paper's p_mask {task.p_mask:g} it is {pm(at.L, at.L_se)} (L_mask {pm(at.L_mask, at.L_mask_se)})"
    if not noisy:
        return text + f". The standard error is under {SE_TARGET:.0%} of the value at every p_mask"
    text += f". The standard error is above {SE_TARGET:.0%} of the value at p_mask {', '.join(noisy)}"
    first = s.loc[[p for p in s.index if f"{p:g}" in noisy][0]]
    if first.median_L_mask < first.L_mask / 3:  # heavy-tailed per-matrix errors: a few matrices make the mean
        text += (f"; at {noisy[0]} the median matrix's L_mask is {pm(first.median_L_mask, first.median_L_mask_se)} "
                 f"against the pooled {pm(first.L_mask, first.L_mask_se)}: a few badly completed matrices make "
                 "most of the mean")
    return text


def _z_range(z: pd.Series) -> str:
    """'1.2 to 1.4 standard errors below' (or above, or 'between −0.5 and +0.8 standard errors from')."""
    if (z < 0).all() or (z > 0).all():
        a = z.abs()
        return f"{a.min():.1f} to {a.max():.1f} standard errors {'below' if (z < 0).all() else 'above'}"
    return f"between {z.min():+.1f} and {z.max():+.1f} standard errors from"


def _e17(reg: pd.DataFrame, n_regularised: int) -> tuple[str, list[dict]]:
    """E17 on the paper's task against the paper's table: verdict rows (rule: SOLVER_RTOL)."""
    beside = e17_beside_paper(reg)
    rows, ok = [], {q: [] for q in E17_LOSSES}
    for r in beside.to_dict("records"):
        rows.append({**claim("E17", f"λ = {r['lam']:g}: {r['quantity']} (paper's task)", float(r["ours"]),
                            f"{pm(r['ours'], r['se'])} (s.e. over {n_regularised} matrices of the paper's task); "
                            f"{abs(r['z']):.1f} s.e. {'below' if r['z'] < 0 else 'above'} the paper's value "
                            f"({r['rel_dev']:+.1%} of it)",
                            paper=r["paper"]),
                     "se": float(r["se"]), "margin": SOLVER_RTOL})
        ok[r["quantity"]].append(row_verdict(rows[-1]))
    obs, mask = (beside[beside["quantity"] == q] for q in ("L_obs", "L_mask"))
    own_se = mask["se"] * (n_regularised / PAPER_E17_MATRICES) ** 0.5 / mask["ours"]  # the paper's sample's error
    within = lambda q: (f"{ok[q].count('matches')} of {len(ok[q])} within the rule"
                        + (f", {ok[q].count(CLOSE)} too close to tell" if CLOSE in ok[q] else ""))
    text = (f"L_obs {'matches' if set(ok['L_obs']) == {'matches'} else 'does not match'} the paper's at every λ "
            f"({within('L_obs')}; deviations {obs.rel_dev.min():+.1%} to "
            f"{obs.rel_dev.max():+.1%}): it measures how far the regulariser pulls U off the observed entries, "
            f"which λ sets. L_mask, the error on the entries that matter, is {pm(mask.ours.iloc[0], mask.se.iloc[0])} "
            f"at the smallest λ and {pm(mask.ours.iloc[-1], mask.se.iloc[-1])} at the largest, against the paper's "
            f"{mask.paper.iloc[0]:.4f} and {mask.paper.iloc[-1]:.4f}: ours lie {_z_range(mask.z)} the paper's "
            f"({mask.rel_dev.min():+.0%} to {mask.rel_dev.max():+.0%}), {within('L_mask')}. The paper's own means, over "
            f"{PAPER_E17_MATRICES} matrices, carry a sampling error of about {own_se.mean():.0%} (our per-matrix spread "
            f"at their sample size), and every λ sees the same matrices, so the five L_mask move together")
    # the claim E17 is there for: BERT completes better than the best regularised solver (the
    # paper: 0.013-0.014 against 0.0405), on the same matrices, so only where BERT trained on them
    quantity = "BERT L_mask / the best λ's L_mask (paper's task, same matrices)"
    paper_ratio = PAPER[("E3", "post L_mask")] / min(v[1] for v in PAPER_E17.values())
    if (reg["method"] == "BERT").any():
        bert = reg.set_index("method").loc["BERT"]
        lam = reg[reg["method"] != "BERT"]
        best = lam.loc[lam["L_mask"].idxmin()]
        r = float(bert.L_mask / best.L_mask)
        row = claim("E17", quantity, r, "", paper=paper_ratio, kind="direction", reference=1.0, sense="below",
                    se=ratio_se(bert.L_mask, bert.L_mask_se, best.L_mask, best.L_mask_se))
        row["reading"] = (f"BERT {pm(bert.L_mask, bert.L_mask_se)} against {best['method']}'s "
                          f"{pm(best.L_mask, best.L_mask_se)}: {agreement(row_verdict(row))}")
        text += (f"; BERT's L_mask on the same matrices is {pm(bert.L_mask, bert.L_mask_se)}, "
                 + ("below every λ" if bert.L_mask < lam.L_mask.min() else
                    "above every λ" if bert.L_mask > lam.L_mask.max() else "within the range of the λ"))
    else:
        row = claim("E17", quantity, None, "", paper=paper_ratio, kind="direction", reference=1.0, sense="below",
                    na="BERT was trained on another task, so it cannot be run on the paper's matrices; the paper "
                       "setting's column tests it")
    return text, rows + [row]


def _solvers(solvers: pd.DataFrame, task) -> str:
    """The classical methods on the paper's task (no model)."""
    at = solvers.set_index("method")
    return (f"On the paper's task at p_mask {task.p_mask:g} the pooled L_mask is "
            + ", ".join(f"{pm(r.L_mask, r.L_mask_se)} for {m}" for m, r in at.iterrows())
            + "; the median matrix's L_mask is "
            + ", ".join(f"{pm(r.median_L_mask, r.median_L_mask_se)} for {m}" for m, r in at.iterrows()))


def e18_cause(other, uniform) -> str:
    """Why E18's ratio for one distribution (`other`, a row of `ood_table` for BERT; `uniform`,
    uniform factors' row) may differ from "similar": the paper states no number, and whether its
    "similar" held for the raw MSE or for the MSE over E[X²] changes the answer when the
    distribution's E[X²] is not uniform's. One sentence, from the numbers."""
    ex2 = lambda r: r.L_mask / r.L_mask_rel
    raw = other.L_mask / uniform.L_mask
    return (f"the paper gives no number, and the verdict hangs on dividing by E[X²]: the raw L_mask is {raw:.2g}× "
            f"uniform's ({other.L_mask:.3g} against {uniform.L_mask:.3g}), {'lower' if raw < 1 else 'higher'} before "
            f"dividing, and E[X²] {ex2(other) / ex2(uniform):.2g}× uniform's")


def baseline_readings(sweep: pd.DataFrame, reg: pd.DataFrame, ood: pd.DataFrame, classical: pd.DataFrame,
                      p_train: float, *, rank: int, n_regularised: int, solver_sweep: pd.DataFrame,
                      solvers: pd.DataFrame, task) -> tuple[dict, list[dict]]:
    """The tables above (`mclib.analyses.comparisons`). On the profile's task, with BERT on the same
    matrices: sweep (nuclear_sweep), ood (ood_table), classical (classical_table). On the
    paper's task `task` (`mclib.core.paper.task()`), solvers alone, whatever the profile:
    reg (regularised_table, E17), solver_sweep (nuclear_sweep without a model),
    solvers (classical_table without a model). No number is rescaled across tasks.

    E17's rows compare a number with the paper's on the same task: the verdict is
    "matches" when |ours − paper| ≤ 2·s.e. + SOLVER_RTOL·|paper| (`scorecard.number` with
    se = our standard error over matrices), else "differs"."""
    e16, rows = _e16_same_matrices(sweep, classical, p_train)
    e17, e17_rows = _e17(reg, n_regularised)
    rows += e17_rows
    bert_ood = ood[ood["method"] == "BERT"].set_index("dist")
    uni = bert_ood.loc["uniform"]
    e18 = []
    for dist in [d for d in bert_ood.index if d != "uniform"]:
        o = bert_ood.loc[dist]
        rel = o.L_mask_rel / uni.L_mask_rel  # L_mask / E[X²] of this distribution over uniform's: scale-free
        rel_se = rel * np.hypot(o.L_mask_se / o.L_mask, uni.L_mask_se / uni.L_mask)
        # the paper: "close to" uniform's, i.e. a ratio of 1 (the scorecard's ratio rule)
        row = claim("E18", f"BERT (L_mask / E[X²]), {dist} over uniform factors", float(rel), "", paper=1.0,
                    kind="ratio", se=float(rel_se), cause=e18_cause(o, uni))
        v = row_verdict(row)
        said = f"{'similar' if v == 'matches' else 'not similar'}, {agreement(v)}"
        row["reading"] = f"{said}; L_mask / E[X²] {o.L_mask_rel:.3f} vs {uni.L_mask_rel:.3f}"
        rows.append(row)
        e18.append(f"{dist} factors: L_mask / E[X²] {pm(o.L_mask_rel, o.L_mask_rel * o.L_mask_se / o.L_mask)} against "
                   f"uniform's {pm(uni.L_mask_rel, uni.L_mask_rel * uni.L_mask_se / uni.L_mask)}, a ratio of "
                   f"{pm(rel, rel_se)}: {said} (the ratio rule: within a factor {1 + MARGINS['ratio']:g} of 1, "
                   "widened by two standard errors)")

    at = classical.set_index("method")
    bert = at.loc["BERT"]
    als, soft = f"ALS, rank {rank}", f"soft-impute, rank {rank}"
    best = at["L_mask"].idxmin()
    a = at.loc[als]
    classical_text = (f"on the profile's task, pooled over all masked entries, BERT's L_mask "
                      f"({pm(bert.L_mask, bert.L_mask_se)}) ranks {int((at['L_mask'] < bert.L_mask).sum()) + 1} of "
                      f"{len(at)}" + ("" if best == "BERT" else f", behind {best} ({pm(at.loc[best, 'L_mask'], at.loc[best, 'L_mask_se'])})")
                      + f"; BERT − ALS on the same matrices is {pm(a.BERT_d_L_mask, a.BERT_d_L_mask_se)}"
                      + (" (within error)" if within_error(a.BERT_d_L_mask, a.BERT_d_L_mask_se) else "")
                      + f". Matrix by matrix, the median matrix's L_mask is {pm(bert.median_L_mask, bert.median_L_mask_se)} "
                      f"for BERT, {pm(a.median_L_mask, a.median_L_mask_se)} for ALS and "
                      f"{pm(at.loc[soft, 'median_L_mask'], at.loc[soft, 'median_L_mask_se'])} for soft-impute (rounding "
                      f"to 0.01 alone costs about 1e-5), and BERT is better than ALS on {a.BERT_better:.0%} ± "
                      f"{a.BERT_better_se:.0%} of the matrices")
    glue = {"e16": e16, "e16_solver": _e16_solver(solver_sweep, task), "e17": e17, "e18": "; ".join(e18),
            "classical": classical_text, "solvers": _solvers(solvers, task)}
    return glue, rows


def readings(ch, sweep, reg, ood, classical, *, solver_sweep, solvers) -> tuple[dict, list[dict]]:
    """`baseline_readings` of this chapter's tables: every name the closing paragraph glues
    (with the solver rule's margin, solver_rule) and the scorecard rows."""
    glue, rows = baseline_readings(sweep, reg, ood, classical, ch.cfg.data.p_mask, rank=ch.cfg.data.rank,
                                   n_regularised=ch.cfg.analysis.regularised_matrices, solver_sweep=solver_sweep, solvers=solvers,
                                   task=paper.task())
    return {**glue, "solver_rule": f"{SOLVER_RTOL:.0%}"}, rows


def scorecard_table(ch, rows: list[dict]):
    """Record this chapter's rows and show them. E17 has the paper's numbers, compared on the
    paper's task as they are; E16 and E18 are claims without numbers, judged by their rules."""
    return recorded_table(ch.run_dir, rows, CHAPTER)


# --- the solvers' results, built beforehand -----------------------------------------------------

TABLES = (e17_table, solver_sweep, solvers_table, bert_sweep, classical_tables, ood_table)  # every table that solves


@dataclass
class _NoModel:
    """This chapter as its solvers see it: the profile, and no model (they never read one)."""
    cfg: Profile
    post: None = None


def build_solver_cache(cfg: Profile, path: Path | None = None, *, say: Callable = print) -> tuple[Path, C.Solves]:
    """Solve every matrix this chapter solves at profile `cfg`, in this process, one line said
    per block as it is solved, and save the solvers' results at `path` (default
    `solver_cache(cfg.name)`), atomically; the last line says how many and how long. It runs
    the chapter's own TABLES without a model, so the file holds exactly the matrices, masks
    and solver settings the chapter draws. At a profile other than paper, a draw that the
    committed `solver_cache("paper")` holds exactly is read from it, not solved and not
    written here (the chapter reads it there too, `solver_results`); the note and the last
    line count what was solved and name what was read. At the paper profile: 34 blocks,
    28 672 cvxpy solves and soft-impute and ALS on 3 072 matrices, 0.86 MiB; 404 s in one
    process on the 2 shared cores of the CPU machine, niced (2026-11-26: 8-16 ms a cvxpy
    solve)."""
    from ..core.repo import git_revision

    path = solver_cache(cfg.name) if path is None else Path(path)
    paper_file = solver_cache("paper")
    reuse = (C.read_solves(paper_file, say=say) if cfg.name != "paper" and paper_file.is_file()
             and paper_file.resolve() != path.resolve() else None)
    revision = git_revision()  # of the code that solves
    solves = C.Solves(say=say, log=True, reuse=reuse)
    start = time.perf_counter()
    for table in TABLES:
        table(_NoModel(cfg), solves)
    seconds = time.perf_counter() - start
    versions = ", ".join(f"{m} {importlib.metadata.version(m)}" for m in ("cvxpy", "clarabel", "numpy"))

    def counts(blocks: dict) -> tuple[int, int]:  # matrices, cvxpy solves
        return (sum(b.rows for b in blocks.values()),
                sum(b.rows for (_, how, _), b in blocks.items() if how.startswith(C.NEEDS_CVXPY)))

    (rows, convex), (read_rows, read_convex) = counts(solves.blocks), counts(solves.reused)
    shown = paper_file.relative_to(RESULTS.parent)  # results/solvers-paper.csv.gz, wherever the clone is
    read = (f"; {len(solves.reused)} blocks, {read_rows} matrices ({read_convex} cvxpy solves) read from {shown} "
            "(the same matrices, masks and settings), not held here" if solves.reused else "")
    note = (f"chapter 06's solver results at profile {cfg.name}: {len(solves.blocks)} blocks, {rows} matrices "
            f"({convex} cvxpy solves){read}; built {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in "
            f"{seconds:.0f} s on one process, revision {revision}, {versions}")
    solves.save(path, note)
    say(f"{path}: {len(solves.blocks)} blocks, {rows:,} matrices ({convex:,} cvxpy solves), "
        f"{path.stat().st_size / 2**20:.2f} MiB, solved in {seconds:.0f} s"
        + (f"; {len(solves.reused)} blocks ({read_convex:,} cvxpy solves) read from {shown}, not solved"
           if solves.reused else ""))
    return path, solves


def _build_on_a_worker(cfg: Profile, path: Path) -> Path:
    """`build_solver_cache` without its lines (a worker's output reaches no page; the chapter
    says where its results come from, and the file's note how they were built)."""
    return build_solver_cache(cfg, path, say=lambda *_: None)[0]
