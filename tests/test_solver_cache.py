"""Chapter 06's solver results computed beforehand: `python -m mclib solvers`
saves them (mclib.chapters.ch06_baselines.build_solver_cache), the chapter reads them where its
draws match exactly (at every profile the committed paper file first), solves what they do
not hold with a one-line notice, refuses a damaged file in one line, and with them needs no
cvxpy (a GPU lease has none)."""

import copy
import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mclib.__main__ import main
from mclib.analyses import comparisons as C
from mclib.analyses import solver_cache
from mclib.chapters import ch06_baselines as chapter
from mclib.core.config import load_profile, profile_path

ROOT = Path(__file__).resolve().parent.parent
PAPER_CACHE = ROOT / "results" / "solvers-paper.csv.gz"


@pytest.fixture(scope="module")
def cache(tmp_path_factory, smoke_profile):
    """The smoke profile's solver cache, built by the command line into a folder of its own."""
    folder = tmp_path_factory.mktemp("results")
    assert main(["solvers", "--profile", "smoke", "--out", str(folder / "solvers-smoke.csv.gz")]) == 0
    return folder / "solvers-smoke.csv.gz"


def _tables(ch, solves):
    """Every table of chapter 06 that solves, as (name, DataFrame)."""
    classical, per = chapter.classical_tables(ch, solves)
    return {
        "e17": chapter.e17_table(ch, solves),
        "solver_sweep": chapter.solver_sweep(ch, solves),
        "solvers": chapter.solvers_table(ch, solves),
        "bert_sweep": chapter.bert_sweep(ch, solves),
        "classical": classical,
        "ood": chapter.ood_table(ch, solves),
        **{f"per {k}": pd.DataFrame({"L_mask": v}) for k, v in per.items()},
    }


def test_the_cache_gives_exactly_what_the_solvers_give(ch, cache, monkeypatch, capsys):
    monkeypatch.setattr(chapter, "RESULTS", cache.parent)
    monkeypatch.setattr(solver_cache, "_OPEN", {})  # as in a fresh process
    capsys.readouterr()
    read = chapter.solver_results(ch)
    assert capsys.readouterr().out.startswith(
        f"Solver results read from {cache} (chapter 06's solver results at "
        "profile smoke: 13 blocks, 104 matrices (88 cvxpy solves); built "
    )
    cached, fresh = _tables(ch, None), _tables(ch, C.Solves())  # None: the chapter's own, from the file
    assert read.solved == [] and "does not hold" not in capsys.readouterr().out
    # equal to the solver's own precision: cvxpy with Clarabel solving one matrix twice in a process
    # differed by up to 3e-8 relative in a matrix's sse_mask at λ = 5e-4 (flat E17 objective), 8e-11 for
    # the nuclear norm; soft-impute and ALS repeat to the bit
    for name in fresh:
        pd.testing.assert_frame_equal(cached[name], fresh[name], rtol=1e-6, atol=1e-15, obj=name)
    for name in ("per soft-impute, rank 2", "per ALS, rank 2"):
        pd.testing.assert_frame_equal(cached[name], fresh[name], check_exact=True, obj=name)
    assert cached["e17"]["L_mask"].notna().all() and (cached["solver_sweep"]["L"] > 0).any()
    # what was read is what was written, to the last bit
    pd.testing.assert_frame_equal(C.read_solves(cache).frame(), read.frame(), check_exact=True)


def _count_lines(text: str, what: str) -> int:
    return sum(what in line for line in text.splitlines())


def test_another_seed_is_solved_with_a_one_line_notice(ch, cache, capsys):
    other = copy.copy(ch)
    other.cfg = ch.cfg.replace(**{"analysis.seed": 1})
    solves = C.read_solves(cache)
    capsys.readouterr()
    got = chapter.solver_sweep(other, solves)
    out = capsys.readouterr().out
    assert _count_lines(out, "does not hold") == 1 and out.count("\n") == 1
    assert (
        f"{cache} does not hold what this chapter draws (it "
        "has no nuclear norm results for 7×7 rank 2, p_mask "
        "0.2, uniform factors, seed 1, 8 matrices; the "
        "nearest it has: 7×7 rank 2, p_mask 0.2, uniform factors, "
        "seed 0, 8 matrices): solving here"
    ) in out
    assert len(solves.solved) == 3  # one block per p_mask, solved here
    pd.testing.assert_frame_equal(got, chapter.solver_sweep(other, C.Solves()), rtol=1e-6, atol=1e-15)


def test_other_matrices_under_the_same_description_do_not_match(ch, cache, monkeypatch, capsys):
    draw = C.sample_eval_batch

    def shifted(data, n, seed, dist=None):  # the same task, seed and size: other matrices (a changed sampler)
        b = draw(data, n, seed, dist)
        b.x[0, 0, 0] += 0.01
        return b

    monkeypatch.setattr(C, "sample_eval_batch", shifted)
    solves = C.read_solves(cache)
    capsys.readouterr()
    chapter.e17_table(ch, solves)
    out = capsys.readouterr().out
    assert _count_lines(out, "does not hold") == 1
    assert (
        "its regularised, λ = 0.0005 matrices for 7×7 rank "
        "2, p_mask 0.3, uniform factors, seed 0, 8 matrices "
        "are other matrices (sha256 " in out
    )
    assert len(solves.solved) == 5


def test_another_solver_setting_does_not_match(ch, cache, monkeypatch, capsys):
    monkeypatch.setattr(C, "SOFT_IMPUTE_LAM", 1e-3)
    solves = C.read_solves(cache)
    capsys.readouterr()
    chapter.classical_tables(ch, solves)
    out = capsys.readouterr().out
    assert (
        "it solved soft-impute, rank 2 on 7×7 rank 2, p_mask 0.3, uniform factors, seed 0, 8 matrices with "
        "soft_impute(rank=2, decay=0.95, max_iter=3000, tol=1e-08, keep_observed=False, lam=0.0005), this "
        "chapter asks soft_impute(rank=2, decay=0.95, max_iter=3000, tol=1e-08, keep_observed=False, "
        "lam=0.001)): solving here"
    ) in out
    assert [k[0] for k in solves.solved] == ["soft-impute, rank 2"]


def test_another_task_is_solved(ch, cache, capsys):
    other = copy.copy(ch)
    other.cfg = ch.cfg.replace(**{"data.p_mask": 0.35})
    solves = C.read_solves(cache)
    capsys.readouterr()
    chapter.classical_tables(other, solves)
    assert "it has no nuclear norm results for 7×7 rank 2, p_mask 0.35" in capsys.readouterr().out
    assert len(solves.solved) == 3


def test_no_cache_file_is_said_and_everything_solved(ch, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(chapter, "RESULTS", tmp_path)
    monkeypatch.setattr(solver_cache, "_OPEN", {})
    capsys.readouterr()
    solves = chapter.solver_results(ch)
    assert capsys.readouterr().out == (
        f"No solver cache at {tmp_path / 'solvers-smoke.csv.gz'}: the solvers run here "
        "(`python -m mclib solvers --profile smoke` builds it on a machine with cvxpy)\n"
    )
    chapter.solvers_table(ch)
    assert len(solves.solved) == 3 and chapter.solver_results(ch) is solves  # said once, solved once


def test_the_books_own_cache_is_read_where_none_is_committed(ch, cache, tmp_path, monkeypatch, capsys):
    """Where nothing is committed under results/, the chapter reads the file the book's idle
    worker built beside its run (`book_solver_cache`); a committed file wins over it."""
    own = tmp_path / "runs" / "solvers-smoke-own.csv.gz"
    own.parent.mkdir()
    own.write_bytes(cache.read_bytes())
    monkeypatch.setattr(chapter, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(chapter, "book_solver_cache", lambda cfg, run_dir: own)
    monkeypatch.setattr(solver_cache, "_OPEN", {})
    capsys.readouterr()
    read = chapter.solver_results(ch)
    assert capsys.readouterr().out.startswith(
        f"Solver results read from {own} (chapter 06's solver results at "
    )
    pd.testing.assert_frame_equal(read.frame(), C.read_solves(cache).frame(), check_exact=True)
    committed = tmp_path / "results" / "solvers-smoke.csv.gz"
    committed.parent.mkdir()
    committed.write_bytes(cache.read_bytes())
    chapter.solver_results(ch)
    assert capsys.readouterr().out.startswith(f"Solver results read from {committed} (")


def test_the_idle_workers_build_says_nothing_and_holds_every_block(cache, smoke_profile, tmp_path, capsys):
    """The task `book_solver_task` hands an idle worker: the command line's blocks, saved, and no
    line printed (a worker's output reaches no page)."""
    capsys.readouterr()
    fn, args, _ = chapter.book_solver_task(smoke_profile, tmp_path / "runs" / "smoke-seed1")
    (tmp_path / "runs").mkdir()
    assert fn(*args) == args[1] and capsys.readouterr().out == ""
    assert C.read_solves(args[1]).blocks.keys() == C.read_solves(cache).blocks.keys()


def test_a_solve_without_cvxpy_says_what_to_do_in_one_line(ch, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "cvxpy", None)
    solves = C.Solves(
        hint="there is no solver cache at X; `python -m mclib solvers --profile smoke` builds it"
    )
    with pytest.raises(ModuleNotFoundError) as e:
        chapter.solver_sweep(ch, solves)
    assert str(e.value) == (
        "nuclear norm on 7×7 rank 2, p_mask 0.2, uniform factors, seed 0, 8 matrices needs cvxpy, "
        "which is not installed here; there is no solver cache at X; `python -m mclib solvers "
        "--profile smoke` builds it"
    )


def _as_paper_file(results: Path, cache: Path, other_matrices: str = "") -> Path:
    """results/solvers-paper.csv.gz holding `cache`'s blocks, the block of method
    `other_matrices` under another sha256 (built for other matrices than the chapter draws)."""
    lines = gzip.decompress(cache.read_bytes()).decode().split("\n")
    blocks = C.read_solves(cache, say=lambda *_: None).blocks
    if other_matrices:
        dig = next(k[2] for k in blocks if k[0] == other_matrices)
        lines = [
            line.replace(dig, "0" * 64) if line.startswith(f'"{other_matrices}"') else line for line in lines
        ]
    results.mkdir(exist_ok=True)
    path = results / "solvers-paper.csv.gz"
    path.write_bytes(gzip.compress("\n".join(lines).encode()))
    return path


def test_the_committed_paper_file_is_read_where_its_key_matches_and_other_matrices_are_solved(
    ch, cache, tmp_path, monkeypatch, capsys
):
    """At every profile the chapter reads results/solvers-paper.csv.gz first: a block whose key
    (method, setting, sha256 of the matrices and masks) is the chapter's is read, one whose
    matrices differ is solved again, said in one line."""
    paper_file = _as_paper_file(tmp_path / "results", cache, other_matrices="regularised, λ = 0.0005")
    monkeypatch.setattr(chapter, "RESULTS", tmp_path / "results")  # no smoke file there
    monkeypatch.setattr(solver_cache, "_OPEN", {})
    capsys.readouterr()
    solves = chapter.solver_results(ch)
    assert capsys.readouterr().out.splitlines() == [
        "No solver cache at "
        f"{tmp_path / 'results' / 'solvers-smoke.csv.gz'}: what {paper_file} does not hold is "
        "solved here (`python -m mclib solvers --profile smoke` builds it on a machine with cvxpy)",
        f"Solver results read first from {paper_file} where it "
        "holds the same matrices, masks and solver settings "
        "(chapter 06's solver results at profile smoke: 13 blocks, 104 matrices (88 cvxpy solves); built "
        + C.read_solves(cache).note.split("; built ", 1)[1]
        + "): 13 blocks, 104 matrices",
    ]
    reg = chapter.e17_table(ch)
    chapter.classical_tables(ch), chapter.solver_sweep(ch), chapter.ood_table(ch)
    out = capsys.readouterr().out
    assert _count_lines(out, "does not hold") == 1 and out.count("\n") == 1
    assert (
        f"{paper_file} does not hold what this chapter draws "
        "(its regularised, λ = 0.0005 matrices for 7×7 rank 2, "
        "p_mask 0.3, uniform factors, seed 0, 8 matrices are other matrices (sha256 000000000000… there, "
    ) in out
    assert [k[0] for k in solves.solved] == ["regularised, λ = 0.0005"] and solves.blocks.keys() == set(
        solves.solved
    )
    assert len(solves.reused) == 12 and all(
        solves.reused[k] is b for k, b in solves.reuse.blocks.items() if k in solves.reused
    )
    pd.testing.assert_frame_equal(reg, chapter.e17_table(ch, C.read_solves(cache)), rtol=1e-6, atol=1e-15)


def test_the_build_solves_and_counts_only_what_the_committed_paper_file_does_not_hold(
    ch, smoke_profile, cache, tmp_path, monkeypatch, capsys
):
    """`python -m mclib solvers` at a profile other than paper: what results/solvers-paper.csv.gz
    holds exactly is read, not solved and not written; the note counts what was solved and names
    what was read; the chapter then solves nothing. The paper profile's own build reads nothing."""
    _as_paper_file(tmp_path / "results", cache, other_matrices="ALS, rank 2")
    monkeypatch.setattr(chapter, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(solver_cache, "_OPEN", {})
    path, solves = chapter.build_solver_cache(smoke_profile, tmp_path / "results" / "solvers-smoke.csv.gz")
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"{path}: 1 blocks, 8 matrices (0 cvxpy solves), ") and last.endswith(
        "; 12 blocks (88 cvxpy solves) read from results/solvers-paper.csv.gz, not solved"
    )
    saved = C.read_solves(path)
    assert [k[0] for k in saved.blocks] == ["ALS, rank 2"] and saved.note.startswith(
        "chapter 06's solver results at profile smoke: 1 "
        "blocks, 8 matrices (0 cvxpy solves); 12 blocks, 96 matrices "
        "(88 cvxpy solves) read from "
        "results/solvers-paper.csv.gz (the same matrices, masks and settings), not held "
        "here; built "
    )
    capsys.readouterr()
    read = chapter.solver_results(ch)
    assert capsys.readouterr().out.startswith(f"Solver results read from {path} (")
    _tables(ch, None)
    assert read.solved == [] and len(read.reused) == 12 and "does not hold" not in capsys.readouterr().out
    monkeypatch.setattr(chapter, "TABLES", (chapter.solvers_table,))  # 3 blocks are enough to tell
    _, own = chapter.build_solver_cache(
        smoke_profile.replace(name="paper"), tmp_path / "again.csv.gz", say=print
    )
    assert own.reused == {} and len(own.blocks) == 3


class _Asked(C.Solves):
    """Records the key and draw of every block a table asks for, and solves nothing."""

    def get(self, method, how, x, mask, about):
        self.blocks.setdefault(self.key(method, how, x, mask), C.Block(dict(about), {}))
        return {s: np.ones(len(x)) for s in solver_cache.STATS}


@pytest.mark.slow  # 3 s (draws and hashes 31 744 matrices)
def test_the_committed_files_hold_every_draw_of_the_cpu_profile():
    """The default profile's chapter 06 solves nothing: results/solvers-cpu.csv.gz holds the
    draws of its own task and results/solvers-paper.csv.gz those of the paper's task, whose
    sample sizes and seed the cpu profile shares (hashed here as the chapter hashes them). If it
    fails, rebuild with `python -m mclib solvers --profile cpu`."""
    cpu = load_profile(profile_path("cpu"))
    asked = _Asked()
    for table in chapter.TABLES:
        table(chapter._NoModel(cpu), asked)
    own, paper_file = (C.read_solves(chapter.solver_cache(n), say=lambda *_: None) for n in ("cpu", "paper"))
    paper_task = {k for k, b in asked.blocks.items() if (b.about["n"], b.about["rank"]) == (7, 2)}
    assert len(asked.blocks) == 34 and len(paper_task) == 18 and paper_task <= paper_file.blocks.keys()
    assert asked.blocks.keys() - paper_task == own.blocks.keys()  # nothing of the paper's task is held twice
    assert own.note.startswith(
        "chapter 06's solver results at profile cpu: 16 blocks, 8192 matrices (7168 cvxpy "
        "solves); 18 blocks, 23552 matrices (21504 cvxpy solves) read from "
        "results/solvers-paper.csv.gz"
    )


def _damaged(path: Path, good: Path, how: str) -> Path:
    data = gzip.decompress(good.read_bytes()).decode()
    if how == "not gzip":
        path.write_bytes(b"method,setting\n")
    elif how == "truncated":
        path.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    elif how == "no note":
        path.write_bytes(gzip.compress(data.split("\n", 1)[1].encode()))
    elif how == "no column":
        path.write_bytes(gzip.compress(data.replace(",nuclear\n", ",nuclearx\n", 1).encode()))
    elif how == "not a number":
        lines = data.split("\n")
        lines[3] = lines[3].rsplit(",", 1)[0] + ",oops"
        path.write_bytes(gzip.compress("\n".join(lines).encode()))
    elif how == "rows out of order":
        lines = data.split("\n")
        lines[2], lines[3] = lines[3], lines[2]
        path.write_bytes(gzip.compress("\n".join(lines).encode()))
    return path


@pytest.mark.parametrize(
    "how, says",
    [
        ("not gzip", "unreadable (BadGzipFile: Not a gzipped file"),
        ("truncated", "unreadable"),
        ("no note", "its first line is not the '# ...' note"),
        ("no column", "no column nuclear"),
        ("not a number", "column nuclear has a value that is not a finite number"),
        ("rows out of order", "is damaged"),
    ],
)
def test_a_damaged_cache_is_refused_in_one_line_naming_the_file(ch, cache, tmp_path, monkeypatch, how, says):
    bad = _damaged(tmp_path / "solvers-smoke.csv.gz", cache, how)
    with pytest.raises(C.SolverCacheError) as e:
        C.read_solves(bad)
    message = str(e.value)
    assert message.startswith(f"solver cache {bad}: ") and says in message and "\n" not in message
    monkeypatch.setattr(chapter, "RESULTS", tmp_path)  # the chapter refuses it too, before any table
    with pytest.raises(C.SolverCacheError, match="solver cache"):
        chapter.e17_table(ch)


def test_the_cache_is_written_atomically(cache, tmp_path, monkeypatch):
    target = tmp_path / "solvers-smoke.csv.gz"
    target.write_bytes(cache.read_bytes())
    solves = C.read_solves(cache)

    def fails(*a, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_csv", fails)
    with pytest.raises(OSError, match="disk full"):
        solves.save(target, "a note")
    assert target.read_bytes() == cache.read_bytes()


WITHOUT_CVXPY = """
import sys
for name in ("cvxpy", "clarabel"):
    sys.modules[name] = None
from pathlib import Path
import numpy as np
from mclib.analyses import comparisons as C
from mclib.analyses import solver_cache
from mclib.chapters import ch06_baselines as chapter
from mclib.book.chapter import open_chapter
from mclib.core.config import load_profile, profile_path

# the paper profile: every table of the chapter that solves, as the build runs them (no model)
told = []
solves = C.read_solves(chapter.solver_cache("paper"), say=told.append)
for table in chapter.TABLES:
    table(chapter._NoModel(load_profile(profile_path("paper"))), solves)
    assert told == [], told[0]
assert solves.solved == [] and np.isfinite(solves.frame()[list(solver_cache.STATS)].to_numpy()).all()
print("paper, cvxpy solves read:", sum(b.rows for (_, how, _), b in solves.blocks.items()
                                       if how.startswith(C.NEEDS_CVXPY)))
# the smoke profile's whole chapter, BERT included, as its notebook calls it
chapter.RESULTS = Path(sys.argv[2])
ch = open_chapter("smoke", 1, sys.argv[1], "cpu")
reg, solver_sweep, solvers = chapter.e17_table(ch), chapter.solver_sweep(ch), chapter.solvers_table(ch)
sweep, (classical, per), ood = chapter.bert_sweep(ch), chapter.classical_tables(ch), chapter.ood_table(ch)
chapter.readings(ch, sweep, reg, ood, classical, solver_sweep=solver_sweep, solvers=solvers)
print("smoke, solved here:", len(chapter.solver_results(ch).solved))
"""


@pytest.mark.slow  # seconds: left to the slow tier, so the fast tier stays quick
def test_with_the_cache_the_chapter_needs_no_cvxpy(smoke_run, cache):
    """With cvxpy unimportable (a GPU lease): chapter 06 at the smoke profile with its cache, and
    every solver of the chapter at the paper profile with the committed results/solvers-paper.csv.gz.
    If the paper part fails, the chapter draws other matrices than the file was built for (a
    changed sampler, sample size, seed or solver setting): rebuild it with `python -m mclib
    solvers --profile paper` (docs/gpu.md). Without a cache a solve stops in one line:
    test_a_solve_without_cvxpy_says_what_to_do_in_one_line."""
    assert PAPER_CACHE.is_file()
    p = subprocess.run(
        [sys.executable, "-c", WITHOUT_CVXPY, str(smoke_run), str(cache.parent)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert lines[0] == "paper, cvxpy solves read: 28672"  # 5 λ x 2048 + 11 p_masks x (1024 + 512) + 3 x 512
    assert lines[-1] == "smoke, solved here: 0" and f"Solver results read from {cache}" in p.stdout
