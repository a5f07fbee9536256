"""The opening call of every chapter (mclib/book/chapter.py)."""

import shutil
from pathlib import Path

import pytest
import torch

from mclib.book.chapter import Chapter, departures_table, open_chapter, shown_path
from mclib.chapters.registry import specs as chapter_specs
from mclib.core.config import ConfigError, load_profile, profile_path
from mclib.core.metrics import find_drop
from mclib.core.runs import load_metrics

SPECS = (
    chapter_specs()
)  # what the toc's chapters declare (mclib.book.spec), as the command line hands it down


def test_open_chapter_reads_the_run_and_loads_each_checkpoint_once(smoke_run, smoke_profile):
    ch = open_chapter("smoke", smoke_profile.seed, smoke_run, "cpu")
    assert isinstance(ch, Chapter) and ch.device == torch.device("cpu")
    assert ch.cfg.data == smoke_profile.data and ch.cfg.model == smoke_profile.model
    assert ch.drop == find_drop(load_metrics(smoke_run), rank=smoke_profile.data.rank)
    assert ch.metrics.equals(load_metrics(smoke_run))
    assert ch.post is ch.post and ch.model(ch.steps.post) is ch.post  # one load per chapter
    assert ch.pre is not ch.post and not ch.post.training
    assert ch.copy_level == pytest.approx(smoke_profile.data.rank / 9)
    assert ch.steps.post == max(ch.steps.all_steps())


def test_the_run_s_own_profile_wins_over_the_named_one_except_analysis_and_device(
    smoke_run, smoke_profile, tmp_path
):
    # a run trained with 60 steps, opened under a profile that now asks for more: the chapter
    # sees the run as trained, with the book's current analysis sizes
    run = shutil.copytree(smoke_run, tmp_path / "run")
    named = smoke_profile.replace(**{"train.steps": 999, "analysis.eval_matrices": 17})
    (tmp_path / "named.yaml").write_text(__import__("yaml").safe_dump(named.to_dict()))
    ch = open_chapter(str(tmp_path / "named.yaml"), smoke_profile.seed, run, "cpu")
    assert ch.cfg.train.steps == smoke_profile.train.steps
    assert ch.cfg.analysis.eval_matrices == 17


def test_a_run_of_another_recipe_or_no_run_is_refused_in_one_line(smoke_run, tmp_path):
    with pytest.raises(ConfigError, match=r"started with a different profile \(name differs\)"):
        open_chapter("cpu", 1, smoke_run, "cpu")
    with pytest.raises(FileNotFoundError, match="holds no run"):
        open_chapter("smoke", 1, tmp_path / "nothing", "cpu")


def test_relative_to_drop_names_the_side(smoke_run, smoke_profile):
    ch = open_chapter("smoke", smoke_profile.seed, smoke_run, "cpu")
    ch.drop = 40
    assert ch.relative_to_drop(20) == "before the drop at step 40"
    assert ch.relative_to_drop(60) == "after the drop at step 40"
    ch.drop = None
    assert ch.relative_to_drop(60) == "this run has no drop"


def test_departures_table_lists_the_keys_with_plain_numbers():
    cfg = load_profile(profile_path("cpu"))
    html = departures_table(cfg, "caption").to_html()
    for text in ("data.n", "data.rank", "train.lr", ">0.001<", ">0.0001<", ">768<", ">64<"):
        assert text in html, text
    assert "000000" not in html  # no float padding such as 64.000000


def test_shown_path_is_never_absolute(tmp_path):
    assert not shown_path(tmp_path / "runs" / "cpu-seed1").startswith("/")
    assert shown_path(tmp_path / "runs" / "cpu-seed1") == "runs/cpu-seed1"


# --- one protocol for every chapter module (mclib.book.chapter's docstring) ----------------------

CHAPTER_MODULES = sorted(
    p.stem for p in (Path(__file__).parents[1] / "mclib" / "chapters").glob("ch[0-9][0-9]_*.py")
)
TWO_SECTIONS = {
    "ch07_beyond": ("seeds_readings", "structure_readings")
}  # two scorecard tables, one per section


@pytest.mark.parametrize("name", CHAPTER_MODULES)
def test_every_chapter_module_has_the_same_entry_points(name):
    import importlib
    import inspect

    mod = importlib.import_module(f"mclib.chapters.{name}")
    book = Path(__file__).parents[1] / "book"
    assert mod.CHAPTER == name[2:] and (book / f"{mod.CHAPTER}.ipynb").is_file()
    notebook = (book / f"{mod.CHAPTER}.ipynb").read_text()
    # every public function of the module that takes the chapter takes it first, its own and those it
    # takes from a part of it in mclib/chapters (heads_tables: the notebook calls them through it)
    for fname, f in vars(mod).items():
        if inspect.isfunction(f) and f.__module__.startswith("mclib.chapters.") and not fname.startswith("_"):
            params = list(inspect.signature(f).parameters)
            assert "ch" not in params or params[0] == "ch", f"{name}.{fname}{tuple(params)}: ch comes first"
    if name == "ch99_scorecard":
        return  # the scorecard reads the other chapters' rows; it records none
    assert list(inspect.signature(mod.scorecard_table).parameters) == ["ch", "rows"]
    assert "chapter.scorecard_table(ch, rows)" in notebook
    for reader in TWO_SECTIONS.get(name, ("readings",)):
        f = getattr(mod, reader)
        assert list(inspect.signature(f).parameters)[0] == "ch"
        assert f.__annotations__["return"] == "tuple[dict, list[dict]]"
        assert f"chapter.{reader}(ch" in notebook


def test_every_glue_name_the_prose_uses_is_a_literal_that_grep_finds():
    """A glue name that a chapter's prose uses is written whole, as a string literal, in
    mclib/book, mclib/chapters or in a code cell of its notebook: none is built at run time (an f-string
    such as f"fig_e10_{name}"), so that grep finds where each comes from."""
    import ast
    import json

    from book_pages import BOOK, glue_names
    from sources import literal_strings

    import mclib.book
    import mclib.chapters

    literals = {
        s
        for room in (mclib.book, mclib.chapters)
        for p in Path(room.__file__).parent.glob("*.py")
        for s in literal_strings(p)
    }
    missing = {}
    for nb in sorted(BOOK.glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        code = "\n".join(l for l in code.splitlines() if not l.lstrip().startswith(("%", "!")))
        own = {
            n.value
            for n in ast.walk(ast.parse(code))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        missing[nb.name] = sorted(glue_names(nb.name) - literals - own)
    assert len(missing) > 5 and not any(missing.values()), {k: v for k, v in missing.items() if v}


def test_idle_tasks_are_the_solvers_then_the_gpt_runs_and_skip_what_is_there(
    smoke_profile, tmp_path, monkeypatch
):
    """What the book's idle workers may do while its run trains (chapter.idle_tasks): chapter
    06's solvers unless a cache is there to read (committed, or the book's own for this
    library's source), then chapter 08's GPT runs that are not complete."""
    from mclib.book.chapter import idle_tasks
    from mclib.chapters import ch06_baselines
    from mclib.core.repo import mclib_sha

    monkeypatch.setattr(ch06_baselines, "RESULTS", tmp_path / "results")  # no committed cache
    run_dir = tmp_path / "runs" / "smoke-seed1"
    names = [name for _, _, name in idle_tasks(smoke_profile, run_dir, specs=SPECS)]
    assert names == ["solvers-smoke", "train-gpt-smoke-seed1", "train-gpt-smoke-seed2"]
    fn, (cfg, path), _ = idle_tasks(smoke_profile, run_dir, specs=SPECS)[0]
    assert path == tmp_path / "runs" / f"solvers-smoke-{mclib_sha()[:12]}.csv.gz"
    path.parent.mkdir()
    (tmp_path / "runs" / "solvers-smoke-000000000000.csv.gz").write_text("")  # solved by other code: not read
    assert [n for _, _, n in idle_tasks(smoke_profile, run_dir, specs=SPECS)][0] == "solvers-smoke"
    path.write_text("")
    assert [n for _, _, n in idle_tasks(smoke_profile, run_dir, specs=SPECS)] == names[1:]
    path.unlink()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "solvers-smoke.csv.gz").write_text("")
    assert [n for _, _, n in idle_tasks(smoke_profile, run_dir, specs=SPECS)] == names[1:]


@pytest.mark.slow
def _train_once_flagged(profile, run_dir, after_drop, flag: Path, seed: int, wait_s: float = 120.0):
    """A seed job for the test below (run on a worker of the local cluster): the run of `seed`
    starts training only once `flag` exists, so it is still training whatever the CPU's speed
    when the idle tasks are handed out; a worker that never gets them fails it after wait_s."""
    import time as clock

    from mclib.core.train import train_seed

    give_up = clock.monotonic() + wait_s
    while profile.seed == seed and not flag.exists():
        if clock.monotonic() > give_up:
            raise TimeoutError(f"no idle task ran within {wait_s:g} s while the run of seed {seed} waited")
        clock.sleep(0.05)
    return train_seed(profile, run_dir, after_drop)


def _touch_then_unlink(flag: Path, absent: Path) -> None:
    """The last idle task: it marks that it ran, then fails (FileNotFoundError naming `absent`)."""
    flag.touch()
    absent.unlink()


def test_a_worker_the_seeds_leave_idle_works_while_the_books_run_trains(
    smoke_profile, tmp_path, monkeypatch, logged
):
    """train_runs: seed 2 ends long before seed 1, and the freed worker takes the idle tasks
    before seed 1 ends (which tasks are left once it has ended: test_jobs.py). Seed 1 starts
    training only once the last idle task has run (`_train_once_flagged`), so the test does not
    hang on how fast a CPU trains: on 2 AMD EPYC cores (2026-11-27) seed 1's 400 steps once ended
    before the failing task's turn came, and nothing was printed."""
    from mclib.book import chapter
    from mclib.core import train as train_module
    from mclib.core.runs import seed_run_dirs

    cfg = smoke_profile.replace(**{"train.steps": 40, "checkpoints.post": 40, "analysis.freeze": False})
    short = cfg.replace(
        **{"train.steps": 20, "checkpoints.pre": 10, "checkpoints.transition": [], "checkpoints.post": 20}
    )
    dirs = seed_run_dirs(cfg, tmp_path / "runs" / "smoke-seed1")
    flag = tmp_path / "failing-ran"
    monkeypatch.setattr(train_module, "train_seed", _train_once_flagged)
    monkeypatch.setattr(
        train_module,
        "seed_jobs",
        lambda profile, run_dir: [
            (cfg, dirs[1], None, flag, cfg.seed),
            (short.replace(seed=2), dirs[2], None, flag, cfg.seed),
        ],
    )
    marks = [tmp_path / f"mark{i}" for i in range(2)]
    failing = (_touch_then_unlink, (flag, tmp_path / "absent"), "failing")  # FileNotFoundError on the worker
    monkeypatch.setattr(
        chapter,
        "idle_tasks",
        lambda cfg, run_dir, specs: [(Path.touch, (m,), m.name) for m in marks] + [failing],
    )
    chapter.train_runs(
        cfg, dirs[1], specs=SPECS
    )  # an idle task that failed does not fail the book's training
    end = (dirs[1] / "end.json").stat().st_mtime
    assert all(m.stat().st_mtime < end for m in marks)  # done while the book's run trained
    said = logged.err()  # a warning: a chapter's kernel shows it
    assert said.startswith("failing-") and "failed on an idle worker (" in said and "absent" in said
    assert said.count("\n") == 1 and "mark" not in said  # one line, and only for the one that failed
