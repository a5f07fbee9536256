"""The book pipeline on the smoke profile: every chapter executes, the site builds with
warnings as errors and works offline, a re-run reuses everything, a failing chapter
stops the command with a non-zero exit that names it. About a minute on 2 cores."""

import html
import os
import re
import sys
import time
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
import yaml
from book_pages import glue_names
from book_pages import manifest as _manifest
from book_pages import page as _page

from mclib.__main__ import main
from mclib.book import runner as book
from mclib.book import (
    runner_execute,
    runner_plan,
    runner_progress,
    runner_site,
    scorecard,
    scorecard_rules,
    scorecard_tables,
)
from mclib.chapters.registry import specs as chapter_specs
from mclib.core import paper
from mclib.core.config import load_profile, profile_path
from mclib.lease import slices

SPECS = (
    chapter_specs()
)  # what the toc's chapters declare (mclib.book.spec), as the command line hands it down


PAPER_URL = "https://arxiv.org/abs/2410.22244"
CODE_URL = "https://github.com/pulkitgopalani/tf-matcomp"


def _scorecard_rows_on_page(html: str, caption: str = "The scorecard:") -> int:
    """Rows of the table whose caption starts with `caption` (the paper's claims by default)."""
    at = html.index(f"<caption>{caption}")
    start = html.rindex("<table", 0, at)  # the table whose caption it is (not the departures above it)
    table = html[start : html.index("</table>", at)]
    return len(re.findall(r"<tr>", table.split("<tbody>")[1]))


# --- cheap checks -------------------------------------------------------------------


def test_record_replaces_its_row(tmp_path):
    scorecard.record(tmp_path, "E10", "x", 1.0, 2.0, reading="")
    scorecard.record(tmp_path, "E2", "y", 1.0, float("nan"), reading="")
    scorecard.record(tmp_path, "E10", "x", 1.0, 1.05, reading="again")
    rows = scorecard.load(tmp_path)
    assert [(r["id"], r["ours"], r["verdict"]) for r in rows] == [
        ("E2", None, "differs"),
        ("E10", 1.05, "matches"),
    ]


def test_templates_follow_the_toc_and_have_no_outputs():
    toc = yaml.safe_load((book.REPO / "_toc.yml").read_text())
    assert [c["file"].split("/")[-1] for c in toc["chapters"]] == [t.stem for t in book.chapters()]
    for template in book.chapters():
        nb = nbformat.read(template, as_version=4)
        assert all(
            not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code"
        )
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1 and all(
            f"{k} =" in params[0].source for k in ("profile", "seed", "run_dir", "device")
        )


FIG = re.compile(r"Figs?\.\s+([\d,\sand–-]+?)[,;)]?\s*\(?(?:paper\s+)?(NeurIPS|workshop) version")


def _book_texts() -> dict[str, str]:
    """The prose a reader sees that cites the paper: the templates' markdown, the landing
    page, and the modules of the book and its chapters (captions and sentences)."""
    texts = {
        t.name: "".join(
            "".join(c.source) for c in nbformat.read(t, as_version=4).cells if c.cell_type == "markdown"
        )
        for t in book.chapters()
    }
    texts["index.md"] = (book.REPO / "book" / "index.md").read_text()
    texts |= {
        p.name: p.read_text()
        for room in ("book", "chapters")
        for p in (book.REPO / "mclib" / room).glob("*.py")
    }
    return texts


def test_every_figure_number_names_its_version_and_neurips_numbers_are_the_papers():
    cited = []
    for name, text in _book_texts().items():
        flat = " ".join(text.split())
        for m in re.finditer(r"\bFigs?\. \d", flat):  # every citation says which version it is from
            window = flat[m.start() : m.start() + 120]
            assert "NeurIPS version" in window or "workshop version" in window, (name, window)
        for numbers, version in FIG.findall(flat):
            if version == "NeurIPS":
                cited += [(name, int(n)) for n in re.findall(r"\d+", numbers)]
    assert cited and {n for _, n in cited} <= set(paper.FIGURES_NEURIPS), sorted(set(cited))


def test_every_chapter_links_the_paper_and_the_authors_code_at_its_top():
    for template in book.chapters():
        first = next(c for c in nbformat.read(template, as_version=4).cells if c.cell_type == "markdown")
        for url in (PAPER_URL, CODE_URL):
            assert f"]({url})" in first.source, (template.name, url)


def test_the_landing_page_names_the_books_own_source():
    index = (book.REPO / "book" / "index.md").read_text()
    url = (yaml.safe_load((book.REPO / "_config.yml").read_text()).get("repository") or {}).get("url")
    if url:  # a public repository: linked
        assert f"]({url})" in index
    else:  # not public yet: the page says where the source is, and invents no address
        assert "## The book's source" in index and "not public yet" in index
    assert f"]({PAPER_URL})" in index and f"]({CODE_URL})" in index


def test_paper_profile_on_cpu_warns(tmp_path, logged):
    book._warn_if_slow(paper.profile(), "cpu", tmp_path)
    assert "days" in logged.err()
    book._warn_if_slow(load_profile(profile_path("smoke")), "cpu", tmp_path)
    assert logged.err() == ""


# --- the whole book ----------------------------------------------------------------


@pytest.mark.slow
def test_every_chapter_executes(built):
    m = _manifest(built)
    assert [r["name"] for r in m["notebooks"]] == [t.stem for t in book.chapters()]
    assert {r["status"] for r in m["notebooks"]} == {"executed"} and m["site"]["status"] == "ok"
    for r in m["notebooks"]:
        assert r["device"] == "cpu" and r["parameters"]["seed"] == 1 and r["git"] and r["duration_s"] > 0
        nb = nbformat.read(r["output"], as_version=4)
        errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
        assert not errors, f"{r['name']}: {errors}"


@pytest.mark.slow
def test_every_name_a_chapter_s_prose_glues_is_glued_by_its_code(built):
    # myst-nb keeps each glued value as an output whose metadata names it ("scrapbook")
    for r in _manifest(built)["notebooks"]:
        nb = nbformat.read(r["output"], as_version=4)
        glued = {
            o.get("metadata", {}).get("scrapbook", {}).get("name")
            for c in nb.cells
            for o in c.get("outputs", [])
        }
        missing = glue_names(Path(r["output"]).name) - glued
        assert not missing, f"{r['name']}: {sorted(missing)}"


@pytest.mark.slow
def test_every_chapter_page_has_a_figure(built):
    for t in book.chapters():
        assert "<img" in _page(built, t.stem), t.stem


@pytest.mark.slow
def test_no_remote_scripts_or_math(built):
    for page in (built / "_build" / "html").rglob("*.html"):
        html = page.read_text()
        remote = re.findall(r"<(?:script|link)[^>]*(?:src|href)=\"(?:https?:)?//[^\"]*\"", html)
        assert not remote, (page.name, remote)
        assert "mathjax" not in html.lower() and "unpkg.com" not in html, page.name


@pytest.mark.slow
def test_scorecard_page_has_a_row_per_number(built):
    rows = scorecard.load(built / "runs" / "smoke-seed1")
    assert [r["quantity"] for r in rows if r["id"] == "E1"]
    for r in rows:  # the verdicts that need no tolerance: no paper number, nothing to test, or none of ours
        if (r["paper"] is None and r["kind"] in ("number", "ratio")) or "n/a: " in r["reading"]:
            assert r["verdict"] == "n/a", r
        elif r["kind"] == "by construction":
            assert r["verdict"] == "cannot fail", r
        elif r["ours"] is None:
            assert r["verdict"] == "differs", r
    page = _page(built, "99_scorecard")  # the paper's claims in one table, the findings beyond it in another
    assert _scorecard_rows_on_page(page) == len(scorecard_tables.paper_rows(rows))
    assert _scorecard_rows_on_page(page, "Beyond the paper:") == len(scorecard_tables.own_rows(rows)) > 0


@pytest.mark.slow
def test_no_absolute_machine_path_in_any_file_of_the_site(built):
    # every file: pages, scripts, the downloadable notebooks (papermill's parameters and
    # metadata), the run's files, and what the downloadable zips hold
    roots = [str(built.resolve()), str(book.REPO.resolve()), sys.prefix]
    files = [p for p in (built / "_build" / "html").rglob("*") if p.is_file()]
    notebooks = [p for p in files if p.suffix == ".ipynb"]
    paper = [p for p in notebooks if p.parent.name == "paper"]  # the part "The paper's own setting"
    assert len(notebooks) - len(paper) == len(book.chapters())
    done = slices.done(slices.LEDGER.parent, slices.read_ledger()["name"])
    assert len(paper) == sum(len(slices.chapters_executed(slices.record(f))) for f in done.values())
    for f in files:
        blobs = [("", f.read_bytes())]
        if f.suffix == ".zip":
            with zipfile.ZipFile(f) as z:
                blobs += [(n, z.read(n)) for n in z.namelist()]
        for member, blob in blobs:
            for root in roots:
                assert root.encode() not in blob, (f.relative_to(built).as_posix(), member, root)
    nb = nbformat.read(
        built / "_build" / "html" / "_sources" / "book" / "_executed" / "01_train.ipynb", as_version=4
    )
    assert nb.metadata.papermill.parameters.run_dir == "runs/smoke-seed1"  # relative to the output folder
    assert nb.metadata.papermill.input_path == "book/01_train.ipynb"  # relative to the repository


def test_machine_paths_are_written_relative(tmp_path):
    out, run = tmp_path / "out", tmp_path / "out" / "runs" / "cpu-seed1"
    paths = runner_execute.machine_paths(out, run)
    text = (
        f'run_dir = "{run}"\nprofile = "{book.REPO}/params/cpu.yaml"\nout: {out}, {out}/book/x.ipynb, '
        f"{out}2/y, {sys.prefix}/lib/site.py"
    )
    assert runner_execute.relative_paths(text, paths) == (
        'run_dir = "runs/cpu-seed1"\nprofile = "params/cpu.yaml"\n'
        f"out: ., book/x.ipynb, {out}2/y, <python>/lib/site.py"
    )
    elsewhere = runner_execute.machine_paths(
        out, tmp_path / "runs" / "r"
    )  # a run folder outside the output folder
    assert runner_execute.relative_paths(str(tmp_path / "runs" / "r"), elsewhere) == "../runs/r"
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                f"x = '{run}'",
                outputs=[
                    nbformat.v4.new_output(
                        "display_data", data={"text/plain": f"{out}/a", "image/png": f"{out}/keep"}
                    )
                ],
            )
        ]
    )
    nb = runner_execute._relative_everywhere(nb, paths)
    assert nb.cells[0].source == "x = 'runs/cpu-seed1'"
    assert nb.cells[0].outputs[0].data == {
        "text/plain": "a",
        "image/png": f"{out}/keep",
    }  # image data untouched


class _PastedText(HTMLParser):
    """The text of every <span class="pasted-text"> (glued into prose) of a page."""

    def __init__(self):
        super().__init__()
        self.depth, self.texts = 0, []

    def handle_starttag(self, tag, attrs):
        if self.depth:
            self.depth += tag == "span"
        elif tag == "span" and "pasted-text" in (dict(attrs).get("class") or "").split():
            self.depth = 1
            self.texts.append("")

    def handle_endtag(self, tag):
        if self.depth and tag == "span":
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.texts[-1] += data


@pytest.mark.slow
def test_glued_text_reads_as_the_prose_around_it(built):
    # not bold (myst-nb's own stylesheet makes it bold; ours comes later) and no Markdown shown
    # as such: a glued sentence's `code` is code (book/_ext/glued_text.py)
    html_dir = built / "_build" / "html"
    assert re.search(
        r"span\.pasted-text\s*\{\s*font-weight:\s*inherit", (html_dir / "_static" / "tables.css").read_text()
    )
    page = _page(built, "01_train")
    assert page.index("mystnb.") < page.index("tables.css")  # ours wins at equal specificity
    glued = 0
    for page in (html_dir / "book" / "_executed").glob("*.html"):
        parser = _PastedText()
        parser.feed(page.read_text())
        glued += len(parser.texts)
        assert not [t for t in parser.texts if "`" in t], page.name
    assert glued > 100


@pytest.mark.slow
def test_scorecard_page_opens_with_findings_and_states_the_rules(built):
    page = _page(built, "99_scorecard")
    assert (
        page.index("<caption>Findings, profile smoke")
        < page.index("<caption>The rules, one per kind of claim")
        < page.index("<caption>The scorecard:")
    )  # captions: the code (folded) names them too
    for rule in scorecard_rules.RULES.values():  # the rules' text is their docstrings, as the page shows them
        assert " ".join(rule.__doc__.split())[:50] in html.unescape(page), rule.__name__


def test_a_chapter_declaring_it_reads_the_scorecard_runs_again_when_it_changes(tmp_path):
    # the runner knows no page by name: a notebook's metadata says which run-folder files it reads
    run = tmp_path / "run"
    run.mkdir()
    reader, other = tmp_path / "reader.ipynb", tmp_path / "other.ipynb"
    nb = nbformat.v4.new_notebook()
    nbformat.write(nb, other)
    nb.metadata["mclib"] = {"reads": ["scorecard.json"]}
    nbformat.write(nb, reader)
    assert (
        runner_execute.declared_reads(reader) == ["scorecard.json"]
        and runner_execute.declared_reads(other) == []
    )
    keys = lambda: {t: runner_execute._key(t, {}, {}, run, "src") for t in (reader, other)}
    before = keys()
    scorecard.record(run, "E99", "a test number", 1.0, 1.0, reading="test")
    after = keys()
    assert after[reader] != before[reader] and after[other] == before[other]
    assert keys() == after  # the same file, the same key: reused
    assert runner_execute.declared_reads(book.REPO / "book" / "99_scorecard.ipynb") == ["scorecard.json"]


@pytest.mark.slow
def test_rerun_reuses_everything(built):
    m = book.build("smoke", out_dir=built, progress=False, specs=SPECS)
    assert {r["status"] for r in m["notebooks"]} == {"reused"} and m["site"]["status"] == "reused"


@pytest.mark.slow
def test_a_new_number_reruns_only_the_scorecard(built):
    run = built / "runs" / "smoke-seed1"
    n = len(scorecard_tables.paper_rows(scorecard.load(run)))
    scorecard.record(run, "E99", "a test number", 1.0, 1.0, reading="test")
    m = book.build("smoke", out_dir=built, progress=False, specs=SPECS)
    assert [r["status"] for r in m["notebooks"]] == ["reused"] * (len(m["notebooks"]) - 1) + ["executed"]
    assert m["site"]["status"] == "ok"
    page = _page(built, "99_scorecard")
    assert _scorecard_rows_on_page(page) == n + 1
    row = page[page.rindex("<tr>", 0, page.index("a test number")) :]
    assert "matches" in row[: row.index("</tr>")]  # 1.0 against the paper's 1.0


# --- failures ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "cell, why",
    [
        ("raise RuntimeError('boom')", "RuntimeError: boom"),
        ("import os; os._exit(1)", "DeadKernelError"),  # papermill would save it as if complete
        ("import time; time.sleep(60)", "CellTimeoutError"),  # likewise, after --timeout
    ],
)
def test_failing_chapter_stops_the_book(tmp_path, monkeypatch, capsys, cell, why):
    nb = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    )
    params = nbformat.v4.new_code_cell('profile = "smoke"\nseed = 1\nrun_dir = ""\ndevice = "auto"')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(cell)]
    bad = tmp_path / "50_broken.ipynb"
    nbformat.write(nb, bad)
    later = book.chapters()[0]  # the training chapter: the book's run is not trained yet
    monkeypatch.setattr(book, "chapters", lambda: [bad, later])

    rc = main(["book", "--profile", "smoke", "--out", str(tmp_path / "out"), "--timeout", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert "notebook 50_broken failed" in err[-1] and why in err[-1]
    m = _manifest(tmp_path / "out")
    assert [(r["name"], r["status"]) for r in m["notebooks"]] == [
        ("50_broken", "failed")
    ]  # nothing after it ran
    assert not (tmp_path / "out" / "_build" / "html").exists()


def test_git_revision_is_dirty_only_for_tracked_changes(tmp_path, monkeypatch):
    import subprocess

    run = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)
    run("init", "-q")
    (tmp_path / "a.txt").write_text("1")
    run("add", "a.txt")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    from mclib.core import repo

    monkeypatch.setattr(repo, "REPO", tmp_path)
    clean = repo.git_revision()
    assert re.fullmatch(r"[0-9a-f]{7,}", clean)
    (tmp_path / "untracked.txt").write_text("x")
    assert repo.git_revision() == clean
    (tmp_path / "a.txt").write_text("2")
    assert repo.git_revision() == clean + "-dirty"


def test_a_chapter_that_runs_again_leaves_no_stale_row(tmp_path):
    scorecard.record(
        tmp_path, "E2", "rank-2, MASK: L_obs", 1.0, 1.0, reading="old name", chapter="02_copying"
    )
    scorecard.record(tmp_path, "E3", "post L_mask", 1.0, 1.0, reading="other chapter", chapter="03_heads")
    scorecard.forget_chapter(tmp_path, "02_copying")  # what build() does before the chapter runs
    scorecard.record(
        tmp_path, "E2", "low-rank, MASK: L_obs", 1.0, 1.0, reading="new name", chapter="02_copying"
    )
    assert [r["quantity"] for r in scorecard.load(tmp_path)] == ["low-rank, MASK: L_obs", "post L_mask"]


def test_task_note_names_the_changed_task_keys_and_says_nothing_is_rescaled():
    assert "is the paper's" in scorecard_tables.task_note(load_profile(profile_path("cpu-7x7")))
    note = scorecard_tables.task_note(load_profile(profile_path("cpu")))
    assert "data.n, data.rank" in note and "E[X²] is 0.111, the paper's 0.222" in note
    assert "no number is multiplied across tasks" in note and "times 2" not in note


def _fake_run(folder: Path, steps: int, saved: list[int]) -> None:
    folder.mkdir(parents=True)
    profile = load_profile(profile_path("smoke")).replace(**{"train.steps": steps})
    (folder / "profile.yaml").write_text(yaml.safe_dump(profile.to_dict()))
    for s in saved:
        ck = folder / "checkpoints" / f"step_{s:06d}"
        ck.mkdir(parents=True)
        (ck / "train_state.pt").write_bytes(b"")


def test_training_status_names_the_runs_that_moved(tmp_path):
    since = time.time()
    _fake_run(tmp_path / "old-seed1", 100, [50, 100])  # e.g. a sweep's run, finished before the build
    _fake_run(tmp_path / "cpu-seed2", 14000, [500, 1000])
    _fake_run(tmp_path / "cpu-seed1" / "freeze" / "mlp", 1000, [500])
    for ck, t in [
        (tmp_path / "old-seed1" / "checkpoints" / "step_000100", since - 60),
        (tmp_path / "cpu-seed2" / "checkpoints" / "step_001000", since + 5),
        (tmp_path / "cpu-seed1" / "freeze" / "mlp" / "checkpoints" / "step_000500", since + 5),
    ]:
        os.utime(ck, (t, t))
    assert runner_progress.training_status(tmp_path, since) == [
        "cpu-seed1/freeze/mlp 500/1,000",
        "cpu-seed2 1,000/14,000",
    ]


def test_the_build_reports_training_while_a_chapter_runs(tmp_path, capsys):
    with runner_progress._report_training(tmp_path, every=0.05):
        _fake_run(tmp_path / "cpu-seed1", 200, [100])
        time.sleep(0.3)
        _fake_run(tmp_path / "cpu-seed2", 200, [100])
        time.sleep(0.3)
    lines = capsys.readouterr().out.splitlines()
    # each line names what moved since the one before: seed 1 once, then only seed 2
    assert lines == ["  training: cpu-seed1 100/200", "  training: cpu-seed2 100/200"]


# --- failures of the pipeline, with the chapters and the site faked (seconds) -------------


def _templates(folder: Path, names: list[str]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(f"# {name}")]
        nbformat.write(nb, folder / f"{name}.ipynb")
        out.append(folder / f"{name}.ipynb")
    return out


@pytest.fixture
def fake_chapters(monkeypatch):
    """book._execute copies the template (a chapter whose source says 'boom' fails);
    the site build succeeds unless `site["fail"]`. Returns (ran, site): the chapters run, in order."""
    ran, site = [], {"fail": False, "builds": 0}

    def execute(template, output, params, timeout, progress, paths=None):
        ran.append(template.stem)
        if "boom" in template.read_text():
            raise RuntimeError("boom in a cell")
        output.write_text(template.read_text())

    def build_site(out, toc=None, partial=False):
        site["builds"] += 1
        if site["fail"]:
            return {
                "status": "failed",
                "duration_s": 0.0,
                "log": str(out / "_build" / "jupyter-book.log"),
                "warnings": 1,
                "error": "exit 2, 1 warnings/errors",
            }
        (out / "_build" / "html").mkdir(parents=True, exist_ok=True)
        (out / "_build" / "html" / "index.html").write_text("<html></html>")
        return {"status": "ok", "duration_s": 0.0, "log": "", "warnings": 0}

    monkeypatch.setattr(book, "_execute", execute)
    monkeypatch.setattr(book, "_build_site", build_site)
    return ran, site


def test_a_chapter_failing_after_others_ran_keeps_their_work(tmp_path, fake_chapters):
    ran, site = fake_chapters
    out = tmp_path / "out"
    a, b, c, d = _templates(tmp_path / "t", ["10_a", "20_b", "30_c", "40_d"])
    build = lambda: book.build("smoke", out_dir=out, templates=[a, b, c, d], progress=False, specs=SPECS)
    build()
    c.write_text(c.read_text().replace("# 30_c", "# boom"))  # chapter c now fails
    ran.clear()
    with pytest.raises(book.BookError, match=r"notebook 30_c failed \(RuntimeError: boom in a cell\)"):
        build()
    assert ran == ["30_c"]  # a and b reused, d not started
    m = _manifest(out)
    assert [(r["name"], r["status"]) for r in m["notebooks"]] == [
        ("10_a", "reused"),
        ("20_b", "reused"),
        ("30_c", "failed"),
        ("40_d", "not run"),
    ]
    assert site["builds"] == 1  # no site after a failure
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("# 30_c fixed")]), c)
    ran.clear()
    m = build()
    # d kept its last record through the failed build, so it is reused, not run again
    assert ran == ["30_c"] and [r["status"] for r in m["notebooks"]] == [
        "reused",
        "reused",
        "executed",
        "reused",
    ]
    assert m["site"]["status"] == "ok" and site["builds"] == 2


def test_a_changed_data_table_runs_every_chapter_again(tmp_path, fake_chapters, monkeypatch):
    """The chapters read the shipped tables (docs/data/rounding.csv, ...): a book built before a
    table changed must not be reused after it, nor one rebuilt with the same tables be run again."""
    from mclib.core import packaged

    tables = tmp_path / "data"
    tables.mkdir()
    for name in packaged.DATA_FILES:
        (tables / name).write_bytes(packaged.data_file(name).read_bytes())
    monkeypatch.setattr(packaged, "data_file", lambda name: tables / name)
    ran, _ = fake_chapters
    out = tmp_path / "out"
    a, b = _templates(tmp_path / "t", ["10_a", "20_b"])
    build = lambda: book.build("smoke", out_dir=out, templates=[a, b], progress=False, specs=SPECS)
    build()
    ran.clear()
    build()
    assert ran == []  # the same tables: reused
    with open(tables / "rounding.csv", "a") as f:
        f.write("\n")  # the same rows, other bytes
    m = build()
    assert ran == ["10_a", "20_b"] and {r["status"] for r in m["notebooks"]} == {"executed"}


def test_a_failing_site_build_stops_the_book_and_is_retried(tmp_path, fake_chapters):
    ran, site = fake_chapters
    out = tmp_path / "out"
    templates = _templates(tmp_path / "t", ["10_a", "20_b"])
    site["fail"] = True
    with pytest.raises(
        book.BookError,
        match=r"jupyter-book build failed \(exit 2, 1 warnings/errors\); see .*jupyter-book.log",
    ):
        book.build("smoke", out_dir=out, templates=templates, progress=False, specs=SPECS)
    m = _manifest(out)
    assert [r["status"] for r in m["notebooks"]] == ["executed", "executed"]
    assert m["site"]["status"] == "failed" and "key" not in m["site"]
    site["fail"] = False
    ran.clear()
    m = book.build("smoke", out_dir=out, templates=templates, progress=False, specs=SPECS)
    assert (
        ran == [] and m["site"]["status"] == "ok" and site["builds"] == 2
    )  # chapters reused, site built again


def test_build_site_reports_a_failing_jupyter_book(tmp_path, monkeypatch):
    # the real _build_site, with jupyter-book's process replaced by one that fails
    import subprocess

    def fake_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 2, stdout="WARNING: a bad reference\n", stderr="ERROR: x\n")

    monkeypatch.setattr(runner_site.subprocess, "run", fake_run)
    rec = runner_site._build_site(tmp_path, tmp_path / "_toc.yml")
    assert rec["status"] == "failed" and rec["error"] == "exit 2, 2 warnings/errors" and rec["warnings"] == 2
    assert "a bad reference" in (tmp_path / "_build" / "jupyter-book.log").read_text()


# --- which runs a build trains (`plan`): --chapters trains only what its chapters read ------

TOC = [t.stem for t in book.chapters()]


def test_chapters_01_to_03_train_the_book_s_run_alone_and_say_what_they_leave_out(tmp_path):
    cfg = load_profile(profile_path("smoke"))
    run = tmp_path / "runs" / "smoke-seed1"
    p = book.plan(cfg, run, ["01_train", "02_copying", "03_heads"], tmp_path, specs=SPECS)
    assert p.train == {"seed 1": "01_train"} and p.error is None
    assert p.line == (
        "runs: training in 01_train: seed 1 (every chapter); left out, no chapter asked reads them: "
        "seed 2 (07_beyond), E15 positional, attention, mlp, token (05_freezing)"
    )
    whole = book.plan(cfg, run, TOC, tmp_path, specs=SPECS)
    assert set(whole.train) == {"seed 1", "seed 2", "E15 attention", "E15 mlp", "E15 positional", "E15 token"}
    assert set(whole.train.values()) == {"01_train"} and "left out" not in whole.line
    off = book.plan(cfg.replace(**{"analysis.freeze": False}), run, TOC, tmp_path, specs=SPECS)
    assert set(off.train) == {"seed 1", "seed 2"}  # E15 off: chapter 05 declares no run


def test_chapters_whose_runs_nothing_asked_trains_stop_in_one_line(tmp_path):
    cfg = load_profile(profile_path("smoke"))
    run = tmp_path / "runs" / "smoke-seed1"
    p = book.plan(cfg, run, ["02_copying", "03_heads"], tmp_path, specs=SPECS)
    assert p.error == (
        "02_copying, 03_heads: 1 run(s) read are not trained, and no chapter asked trains them "
        "(add 01_train): seed 1 (runs/smoke-seed1)"
    )
    p = book.plan(
        cfg, run, ["05_freezing"], tmp_path, specs=SPECS
    )  # chapter 05 trains E15, from the book's run
    assert p.error == (
        "05_freezing: 1 run(s) read are not trained, and no chapter asked trains them "
        "(add 01_train): seed 1 (runs/smoke-seed1)"
    )
    p = book.plan(cfg.replace(**{"analysis.train_in_book": False}), run, ["01_train"], tmp_path, specs=SPECS)
    assert p.error.endswith(
        "not trained, and this book does not train (analysis.train_in_book: false): seed 1 (runs/smoke-seed1)"
    )
    no_chapter = book.plan(cfg, run, ["10_a"], tmp_path, specs=SPECS)  # no chapter of the book
    assert no_chapter == runner_plan.Plan({}, [], "", None)


def test_with_the_book_s_run_trained_a_chapter_alone_trains_what_it_reads(smoke_run, tmp_path):
    cfg = load_profile(profile_path("smoke"))
    p = book.plan(cfg, smoke_run, ["02_copying"], tmp_path, specs=SPECS)
    assert (
        p.train == {}
        and p.error is None
        and p.line.startswith("runs: training: none; complete: seed 1 (every")
    )
    p = book.plan(cfg, smoke_run, ["05_freezing", "07_beyond"], tmp_path, specs=SPECS)
    assert p.error is None and p.train == {
        "seed 2": "07_beyond",
        **{f"E15 {g}": "05_freezing" for g in ("positional", "attention", "mlp", "token")},
    }
    assert p.line.startswith("runs: training in 07_beyond: seed 2 (07_beyond); training in 05_freezing: E15 ")
    assert p.line.endswith("; complete: seed 1 (every chapter)")


def test_a_set_whose_runs_are_missing_stops_before_any_chapter_runs(tmp_path, fake_chapters, capsys):
    ran, site = fake_chapters
    rc = main(["book", "--profile", "smoke", "--out", str(tmp_path / "out"), "--chapters", "02_copying"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and ran == [] and not (tmp_path / "out" / "book" / "_executed" / "manifest.json").exists()
    assert err == [
        "mclib: error: 02_copying: 1 run(s) read are not trained, and no chapter asked trains them "
        "(add 01_train): seed 1 (runs/smoke-seed1)"
    ]
    rc = main(
        ["book", "--profile", "smoke", "--out", str(tmp_path / "out"), "--chapters", "02_copying,2_heads"]
    )
    assert rc == 1 and ran == [] and "unknown chapter 2_heads; chapters: 01_train" in capsys.readouterr().err


def test_the_training_chapter_runs_again_while_a_run_it_trains_is_not_complete(
    tmp_path, fake_chapters, smoke_run, logged
):
    ran, site = fake_chapters
    templates = book.select_chapters("01_train,02_copying")
    build = lambda run_dir: book.build(
        "smoke",
        out_dir=tmp_path / "out",
        run_dir=run_dir,
        templates=templates,
        progress=False,
        site=False,
        specs=SPECS,
    )
    build(tmp_path / "out" / "runs" / "smoke-seed1")  # the fake chapter trains nothing
    ran.clear()
    build(tmp_path / "out" / "runs" / "smoke-seed1")
    assert ran == ["01_train"]  # chapter 02 reused, the training chapter not: seed 1 is still to train
    build(smoke_run)
    ran.clear()
    m = build(smoke_run)
    assert ran == [] and [r["status"] for r in m["notebooks"]] == ["reused", "reused"]
    assert "runs: training: none; complete: seed 1 (every chapter)" in logged.out()


def test_the_training_chapter_s_kernel_trains_and_hands_out_only_what_the_chapters_asked_read(
    smoke_profile, tmp_path, monkeypatch
):
    """train_runs and idle_tasks in a kernel of a build of chapters 01-03 ($MCLIB_BOOK_CHAPTERS):
    seed 2 (chapter 07's), E15 (chapter 05's), the solvers (06's) and the GPT runs (08's) are
    not theirs."""
    from mclib.book import chapter
    from mclib.chapters import ch06_baselines
    from mclib.core import train as train_module

    monkeypatch.setattr(ch06_baselines, "RESULTS", tmp_path / "results")  # no committed cache
    run_dir = tmp_path / "runs" / "smoke-seed1"
    seed2 = (smoke_profile.replace(seed=2), run_dir.parent / "smoke-seed2", None)
    monkeypatch.setattr(
        train_module, "seed_jobs", lambda profile, run_dir: [seed2]
    )  # seed 1 complete, seed 2 not

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr("mclib.core.jobs.cluster", no_cluster)
    monkeypatch.setenv(runner_plan.ASKED, "01_train,02_copying,03_heads")
    assert chapter.idle_tasks(smoke_profile, run_dir, specs=SPECS) == []
    assert list(
        chapter.train_runs(smoke_profile.replace(**{"analysis.freeze": False}), run_dir, specs=SPECS)
    ) == [1, 2]
    monkeypatch.setenv(runner_plan.ASKED, "01_train,07_beyond")
    with pytest.raises(AssertionError, match="a cluster was started"):
        chapter.train_runs(smoke_profile.replace(**{"analysis.freeze": False}), run_dir, specs=SPECS)
    monkeypatch.setenv(runner_plan.ASKED, "01_train,06_baselines")
    assert [name for _, _, name in chapter.idle_tasks(smoke_profile, run_dir, specs=SPECS)] == [
        "solvers-smoke"
    ]


# --- the progress line: each run's step out of its expected steps, the training left ------


def _timed(folder: Path, ms: float, last: int, drop_at: int | None = None) -> None:
    """metrics.csv with `wall` every 50 steps to `last`, `ms` a step; L_mask falls at `drop_at`."""
    import pandas as pd

    steps = list(range(50, last + 1, 50))
    pd.DataFrame(
        {
            "step": steps,
            "L_mask": [0.1 if drop_at and s >= drop_at else 1.0 for s in steps],
            "wall": [s * ms / 1000 for s in steps],
        }
    ).to_csv(folder / "metrics.csv", index=False)


def _drop_in_L_mask(metrics, rank=None, **kwargs):
    low = metrics[metrics["L_mask"] < 0.5]
    return int(low["step"].iloc[0]) if len(low) else None


def test_expected_steps_are_where_the_runs_rules_end_them(tmp_path, monkeypatch):
    import mclib.core.metrics

    monkeypatch.setattr(mclib.core.metrics, "find_drop", _drop_in_L_mask)
    cfg = load_profile(profile_path("smoke")).replace(**{"analysis.after_drop": 1000})
    main, seed2 = tmp_path / "smoke-seed1", tmp_path / "smoke-seed2"
    _fake_run(main, 30000, [500])
    _fake_run(seed2, 30000, [500])
    (seed2 / "profile.yaml").write_text((seed2 / "profile.yaml").read_text().replace("seed: 1", "seed: 2"))
    _fake_run(main / "freeze" / "mlp", 15000, [500])
    _timed(main, 50, 500)
    _timed(seed2, 50, 500)
    _timed(main / "freeze" / "mlp", 50, 500)
    assert [runner_progress.expected_steps(f, cfg) for f in (main, seed2, main / "freeze" / "mlp")] == [
        30000,
        30000,
        15000,
    ]
    _timed(main, 50, 11000, drop_at=9000)  # the main run dropped: an E15 run that has not stops there
    _timed(seed2, 50, 8500, drop_at=8000)  # seed 2 dropped: it stops analysis.after_drop later
    assert [runner_progress.expected_steps(f, cfg) for f in (main, seed2, main / "freeze" / "mlp")] == [
        30000,
        9000,
        9000,
    ]
    _timed(main / "freeze" / "mlp", 50, 600, drop_at=550)  # dropped: its rule (converged) or its cap ends it
    assert runner_progress.expected_steps(main / "freeze" / "mlp", cfg) == 15000
    (main / "end.json").write_text('{"step": 500, "ended": "converged"}')
    assert runner_progress.expected_steps(main, cfg) == 500  # it ended


def test_the_measured_step_and_the_training_left(tmp_path):
    cfg = load_profile(profile_path("smoke")).replace(**{"analysis.freeze_steps": 2000})
    main = tmp_path / "smoke-seed1"
    _fake_run(main, 10000, [4000])
    _timed(main, 40, 4000)
    assert runner_progress.step_ms(main) == pytest.approx(40)
    runs = {
        "seed 1": main,
        **{f"E15 {g}": main / "freeze" / g for g in ("attention", "mlp", "token", "positional")},
    }
    # seed 1: 6 000 steps at 40 ms; each E15 run (not started: at the main run's step) 2 000 steps after it
    assert runner_progress.time_left(runs, cfg, workers=2) == pytest.approx(6000 * 0.04 + 2000 * 0.04)
    assert runner_progress.time_left(runs, cfg, workers=1) == pytest.approx(
        (6000 + 4 * 2000) * 0.04
    )  # one worker: all of it
    assert (
        runner_progress.time_left({"seed 2": tmp_path / "smoke-seed2"}, cfg, workers=2) is None
    )  # nothing measured yet


@pytest.mark.parametrize(
    "until, left",
    [
        ("steps", "about 24 min"),
        # a run that converges by its rule ends before its cap, which the training left counts to
        ("converged", "at most about 24 min"),
    ],
)
def test_the_progress_line_says_each_run_s_step_and_the_training_left(tmp_path, capsys, until, left):
    cfg = load_profile(profile_path("smoke")).replace(**{"train.until": until})
    runs = runner_plan.Plan(
        {"seed 1": "01_train"}, ["01_train"], "", None, {"seed 1": tmp_path / "smoke-seed1"}
    )
    with runner_progress._report_training(tmp_path, every=0.05, runs=runs, cfg=cfg):
        _fake_run(tmp_path / "smoke-seed1", 30000, [1000])
        _timed(tmp_path / "smoke-seed1", 50, 1000)
        time.sleep(0.3)
    lines = capsys.readouterr().out.splitlines()
    # 29 000 steps left at 50 ms: 24 min
    assert lines == [f"  training: smoke-seed1 1,000/30,000 at 50 ms a step; {left} of training left"]


def test_the_training_left_is_at_most_while_a_run_may_end_sooner_by_its_rule(tmp_path):
    """Every E15 run converges by its rule; another run does where the profile says so; an ended
    run does not."""
    cfg = load_profile(profile_path("smoke"))
    run = tmp_path / "smoke-seed1"
    assert runner_progress.sooner({"E15 mlp": run / "freeze" / "mlp"}, cfg)
    assert not runner_progress.sooner({"seed 1": run}, cfg)
    assert runner_progress.sooner({"seed 1": run}, cfg.replace(**{"train.until": "converged"}))
    from mclib.core.runs import END

    _fake_run(run, 30000, [1000])
    (run / END).write_text("{}")
    assert not runner_progress.sooner({"seed 1": run}, cfg.replace(**{"train.until": "converged"}))


def test_the_progress_line_gives_no_training_left_beside_a_run_the_build_did_not_plan(tmp_path, capsys):
    """A default book of 2026-11-27 said "about 0 s of training left" while chapter 08's GPT runs,
    which the build's plan does not hold, were a third of the way."""
    cfg = load_profile(profile_path("smoke"))
    runs = runner_plan.Plan(
        {"seed 1": "01_train"}, ["01_train"], "", None, {"seed 1": tmp_path / "smoke-seed1"}
    )
    _fake_run(tmp_path / "smoke-seed1", 30000, [1000])
    _timed(tmp_path / "smoke-seed1", 50, 1000)
    from mclib.core.runs import checkpoint_dir

    old = time.time() - 60  # the book's run saved nothing since the line began: it is not among the moved
    os.utime(checkpoint_dir(tmp_path / "smoke-seed1", 1000), (old, old))
    with runner_progress._report_training(tmp_path, every=0.05, runs=runs, cfg=cfg):
        _fake_run(tmp_path / "gpt-smoke-seed3", 2000, [600])
        _timed(tmp_path / "gpt-smoke-seed3", 40, 600)
        time.sleep(0.3)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["  training: gpt-smoke-seed3 600/2,000 at 40 ms a step"]


def test_papermill_s_cell_bar_shows_no_remaining_time():
    import io

    from tqdm import tqdm

    shown = io.StringIO()
    bar = tqdm(
        total=12, unit="cell", desc="Executing", file=shown, **runner_execute.CELL_BAR
    )  # as papermill makes it
    bar.update(3)
    bar.close()
    text = shown.getvalue().strip().split("\r")[-1]
    assert text.startswith("Executing: 3/12 cells [00:0") and "<" not in text and "/s" not in text
