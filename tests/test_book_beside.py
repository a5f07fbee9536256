"""The training chapter beside the others: once only E15's runs still train, the chapters
that read neither them nor other chapters' records execute beside it
(`mclib.book.runner_beside.alongside`); scorecard.json written by two processes at once loses no
row (`scorecard.locked`)."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time

import pytest

from mclib.book import chapter, runner_beside, runner_plan, runner_site, scorecard
from mclib.book import runner as book
from mclib.chapters.registry import specs as chapter_specs
from tests.test_book import fake_chapters  # noqa: F401 - the fixture

SPECS = (
    chapter_specs()
)  # what the toc's chapters declare (mclib.book.spec), as the command line hands it down

CHAPTERS = "01_train,02_copying,05_freezing,99_scorecard"


@pytest.fixture
def events(monkeypatch, fake_chapters):  # noqa: F811
    """(events, apart): each chapter's start and end in order; `apart["fail"]` makes the training
    chapter fail, before ("early") or after ("late") it says that only E15 trains; it ends once
    the chapter `apart["release_after"]` has run."""
    seen, apart, released = [], {"fail": None, "release_after": "02_copying"}, threading.Event()

    def execute_apart(template, output, params, timeout, paths, ready):
        seen.append(("start", template.stem))
        if apart["fail"] == "early":
            return "RuntimeError: boom"
        ready.touch()  # what train_runs says once only E15's runs train
        assert released.wait(30)  # ... and E15 trains until the chapters beside it have run
        seen.append(("end", template.stem))
        if apart["fail"] == "late":
            return "RuntimeError: boom"
        output.write_text(template.read_text())
        return None

    def execute(template, output, params, timeout, progress, paths=None):
        seen.append(("run", template.stem))
        if template.stem == apart["release_after"]:
            released.set()
        output.write_text(template.read_text())

    monkeypatch.setattr(book, "_execute_apart", execute_apart)
    monkeypatch.setattr(book, "_execute", execute)
    return seen, apart


def _build(tmp_path):
    return book.build(
        "smoke",
        out_dir=tmp_path / "out",
        templates=book.select_chapters(CHAPTERS),
        progress=False,
        site=False,
        specs=SPECS,
    )


def test_chapters_execute_beside_the_training_chapter_and_those_that_read_its_work_wait(
    tmp_path, events, logged
):
    seen, _ = events
    m = _build(tmp_path)
    # 02 reads seed 1 alone: beside; 05 reads E15's runs and 99 the records: after the training chapter
    assert seen == [
        ("start", "01_train"),
        ("run", "02_copying"),
        ("end", "01_train"),
        ("run", "05_freezing"),
        ("run", "99_scorecard"),
    ]
    assert [r["status"] for r in m["notebooks"]] == ["executed"] * 4
    assert [r["name"] for r in m["notebooks"]] == CHAPTERS.split(",")
    out = logged.out()
    assert "01_train: only E15's runs train now" in out and "[3/4] 05_freezing: waits for 01_train" in out
    assert not (tmp_path / "out" / book.EXECUTED / runner_beside.READY_FILE).exists()


@pytest.mark.parametrize("when, ran", [("early", []), ("late", ["02_copying"])])
def test_a_training_chapter_failing_beside_the_others_stops_the_book_there(tmp_path, events, when, ran):
    seen, apart = events
    apart["fail"] = when
    with pytest.raises(book.BookError, match=r"notebook 01_train failed \(RuntimeError: boom\)"):
        _build(tmp_path)
    assert [name for what, name in seen if what == "run"] == ran  # 05 and 99 never ran
    m = json.loads((tmp_path / "out" / book.EXECUTED / "manifest.json").read_text())
    assert {r["name"]: r["status"] for r in m["notebooks"]}["01_train"] == "failed"


def test_only_the_training_chapter_that_trains_e15_here_goes_beside(tmp_path, smoke_profile):
    plan = lambda train: runner_plan.Plan(train, ["01_train"], "", None)
    templates = book.select_chapters(CHAPTERS)
    assert (
        runner_beside.alongside(templates, plan({"seed 1": "01_train", "E15 mlp": "01_train"}), smoke_profile)
        == "01_train"
    )
    assert runner_beside.alongside(templates, plan({"seed 1": "01_train"}), smoke_profile) is None
    assert runner_beside.alongside(templates[1:], plan({"E15 mlp": "05_freezing"}), smoke_profile) is None
    waits = {t.stem: book.waits_for_trainer(t, smoke_profile, specs=SPECS) for t in templates}
    assert waits == {"01_train": False, "02_copying": False, "05_freezing": True, "99_scorecard": True}


class _Future:
    def __init__(self, status: str, after: float = 0.0):
        self.status, self._at = status, time.time() + after

    def exception(self):
        time.sleep(max(0.0, self._at - time.time()))
        return RuntimeError("x") if self.status == "error" else None


@pytest.mark.parametrize(
    "statuses, idle, said",
    [
        (["finished", "finished"], ["error"], True),  # a failed idle task: its chapter does it again
        (["finished", "error"], [], False),  # a seed that failed: the training chapter fails
    ],
)
def test_the_training_chapter_says_when_only_e15_trains(tmp_path, monkeypatch, statuses, idle, said):
    path = tmp_path / "ready"
    monkeypatch.setenv(runner_beside.READY, str(path))
    seeds = [_Future(s, after=0.2) for s in statuses]
    chapter.say_when_ended(seeds + [_Future(s) for s in idle], seeds)
    assert not path.exists()  # not before the seeds have ended
    time.sleep(1.0)
    assert path.exists() == said


def _record_many(run_dir: str, who: str, n: int) -> None:
    for k in range(n):
        scorecard.record(run_dir, f"E{k % 5 + 1}", f"{who} {k}", 1.0, 1.0, chapter=who)


def test_two_processes_recording_at_once_lose_no_row(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_record_many, args=(str(tmp_path), who, 40)) for who in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    rows = scorecard.load(tmp_path)
    assert len(rows) == 80 and {r["chapter"] for r in rows} == {"a", "b"}


def test_a_site_of_some_chapters_lets_through_only_links_to_the_others(tmp_path):
    """`--chapters` into a fresh folder: jupyter-book gets a config that lets through the links
    to chapters not built and the scorecard's glued numbers, and nothing else; its paths absolute."""
    import shutil

    from mclib.core.config import parse_yaml
    from mclib.core.repo import REPO

    shutil.copy(REPO / "_config.yml", tmp_path / "_config.yml")
    config = parse_yaml(runner_site.partial_config(tmp_path).read_text())
    assert config["sphinx"]["config"]["suppress_warnings"] == ["myst.xref_missing", "mystnb.glue_ref"]
    assert config["sphinx"]["config"]["html_static_path"] == [str(tmp_path / "book" / "_static")]
    assert set(config["sphinx"]["local_extensions"].values()) == {str(tmp_path / "book" / "_ext")}
    assert config["exclude_patterns"] == parse_yaml((REPO / "_config.yml").read_text())["exclude_patterns"]


def test_a_chapter_after_one_that_waits_still_executes_beside_the_training_chapter(tmp_path, events):
    """06 comes after 05 in the toc but reads neither E15's runs nor the records: it executes
    beside the training chapter, and 05 and 99 after it has ended."""
    seen, apart = events
    apart["release_after"] = "06_baselines"
    m = book.build(
        "smoke",
        out_dir=tmp_path / "out",
        site=False,
        progress=False,
        specs=SPECS,
        templates=book.select_chapters("01_train,02_copying,05_freezing,06_baselines,99_scorecard"),
    )
    assert seen == [
        ("start", "01_train"),
        ("run", "02_copying"),
        ("run", "06_baselines"),
        ("end", "01_train"),
        ("run", "05_freezing"),
        ("run", "99_scorecard"),
    ]
    assert [r["name"] for r in m["notebooks"]] == [
        "01_train",
        "02_copying",
        "05_freezing",
        "06_baselines",
        "99_scorecard",
    ]
