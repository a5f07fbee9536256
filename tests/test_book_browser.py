"""The smoke book as a reader's browser loads it: scripts/check_book_html.py opens pages in
headless Chromium and fails on any request to another host, any local 404 and any <img>
whose file is missing, and (--tables) on any table that overflows at a laptop's window.
Here: the built book passes, and a page broken on purpose fails, naming its problems. Needs
Debian's `chromium` (apt-get install -y chromium); skipped without it. The book is the test
run's smoke build (conftest.py); a few seconds a page."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,  # the smoke book, then a browser
    pytest.mark.skipif(
        shutil.which("chromium") is None,
        reason="needs Chromium for the browser check (Debian: apt-get install -y chromium)",
    ),
]

CHECKER = Path(__file__).resolve().parents[1] / "scripts" / "check_book_html.py"
PAGES = ["index.html", "book/_executed/01_train.html", "book/_executed/99_scorecard.html"]


def _check(site: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECKER), str(site), *args], capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def site(built):
    return built / "_build" / "html"


def test_built_book_loads_offline_with_every_figure(site, tmp_path):
    r = _check(site, "--screenshots", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [line.split()[:2] for line in r.stdout.splitlines()] == [["OK", p] for p in PAGES]
    for page in PAGES:
        png = tmp_path / (page.removesuffix(".html").replace("/", "-") + ".png")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, png


def test_checker_fails_on_a_remote_request_and_a_missing_figure(site, tmp_path):
    broken = tmp_path / "html"
    shutil.copytree(site, broken)
    page = broken / "book" / "_executed" / "01_train.html"
    html = page.read_text()
    assert "<h1>" in html
    page.write_text(
        html.replace(
            "<h1>", '<img src="https://example.com/x.png"><img src="../../_images/no-such-figure.png"><h1>', 1
        )
    )

    r = _check(broken)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "FAIL  book/_executed/01_train.html" in lines
    assert "request to another host: https://example.com/x.png" in r.stdout  # seen by the browser,
    assert "HTTP 404: /_images/no-such-figure.png" in r.stdout  # by the server,
    assert "missing file: ../../_images/no-such-figure.png" in r.stdout  # and in the HTML
    assert [line.split()[:2] for line in lines if line.startswith("OK")] == [
        ["OK", PAGES[0]],
        ["OK", PAGES[2]],
    ]


LAPTOP = "1366x768"


def test_no_table_overflows_at_a_laptop_width(site):
    # every page: no sideways scroll; each table fits the text column or scrolls inside its
    # own box, and a scrolling table's caption stays in view
    r = _check(site, "--all", "--tables", LAPTOP)
    assert r.returncode == 0, r.stdout + r.stderr
    measured = {
        line.split()[1]: int(line.split("all to 127.0.0.1, ")[1].split()[0]) for line in r.stdout.splitlines()
    }
    chapters = [
        p for p in measured if p.startswith("book/_executed/") and not p.startswith("book/_executed/paper/")
    ]
    from mclib.book.runner import chapters as templates

    assert len(chapters) == len(templates()) and all(measured[p] > 0 for p in chapters), (
        measured
    )  # tables on every chapter
    # the paper part's first page too: every table it holds (its slices, and its runs where a slice
    # recorded the book's run) was loaded and measured
    paper = "book/_executed/paper/index.html"
    held = (site / paper).read_text().count("<table")
    assert held >= 1 and measured[paper] == held, (held, measured)


def test_table_check_fails_on_a_table_past_the_text_column_and_a_caption_cut_off(site, tmp_path):
    broken = tmp_path / "html"
    shutil.copytree(site, broken)
    page = broken / "book" / "_executed" / "01_train.html"
    html = page.read_text()
    wide = '<table style="width: 2000px"><tr><td>wide</td></tr></table>'  # in no scrolling box
    cut = (
        '<div style="overflow-x: auto"><table style="width: 2000px"><caption style="position: static; '
        'max-width: none">a caption as wide as its table</caption><tr><td>x</td></tr></table></div>'
    )
    assert html.count('<article class="bd-article">') == 1
    page.write_text(html.replace('<article class="bd-article">', '<article class="bd-article">' + wide + cut))
    r = _check(broken, "--tables", LAPTOP)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL  book/_executed/01_train.html" in r.stdout
    assert "table 1 (wide) reaches" in r.stdout and "past the text column" in r.stdout
    assert "table 2 (a caption as wide as its table): its caption reaches" in r.stdout
