"""What the book tests read from the book: the glue names a chapter template's prose uses,
and, from a built book (OUT = `python -m mclib book --out OUT`), the runner's manifest
and the rendered pages; and how the chapter tests read a scorecard row's verdict and the
sentence that speaks for it. Not a test module: the book and chapter tests import it."""

import json
import re
from pathlib import Path

from mclib.book import scorecard, scorecard_rules

BOOK = Path(__file__).resolve().parents[1] / "book"
# a glue role, {glue:text}`NAME` or {glue:text}`NAME:.2f`, or a glue directive, ```{glue:figure} NAME
GLUE = re.compile(r"\{glue(?::\w+)?\}`(\w+)|```\{glue(?::\w+)?\} (\w+)")


def prose(notebook: str) -> str:
    """The markdown cells of book/NOTEBOOK, one text: what a reader reads around the glue."""
    cells = json.loads((BOOK / notebook).read_text())["cells"]
    return "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def glue_names(notebook: str) -> set[str]:
    """Every name the markdown cells of book/NOTEBOOK glue (any role or directive)."""
    return {role or directive for role, directive in GLUE.findall(prose(notebook))}


def manifest(out: Path) -> dict:
    return json.loads((out / "book" / "_executed" / "manifest.json").read_text())


def page(out: Path, name: str) -> str:
    """The rendered HTML of chapter `name` (e.g. "01_train")."""
    return (out / "_build" / "html" / "book" / "_executed" / f"{name}.html").read_text()


def page_text(out: Path, name: str) -> str:
    """The page's text: tags removed, whitespace runs as one space."""
    return " ".join(re.sub(r"<[^>]+>", " ", page(out, name)).split())


def recorded_verdict(run_dir: Path, row: dict) -> str:
    """The verdict `scorecard.record` gives `row` (a chapter's `claim`) with its numbers as
    they stand: a test may change them, so the reading, written for the row's own numbers,
    is not recorded (`record` refuses a reading whose agreement phrase its verdict contradicts)."""
    return scorecard.record(run_dir, **{**row, "reading": ""}, chapter="test")["verdict"]


def speaks_for(sentence: str, row: dict) -> str:
    """Assert that `sentence` states the verdict `row` gets in the scorecard's words
    (`scorecard_rules.agreement`); returns that verdict."""
    verdict = scorecard_rules.row_verdict(row)
    assert scorecard_rules.agreement(verdict) in sentence, (verdict, sentence)
    return verdict


def sentences_turn(compute, flip, speaks: dict) -> None:
    """Each sentence states the verdict of the rows it speaks for, and turns when they turn.
    compute() -> (glue, rows) (a chapter's function on fixed numbers); flip: the
    `flip_verdicts` fixture; speaks: glue name -> the quantities of the rows its sentence
    speaks for. The numbers must give each row a verdict that can turn (not n/a)."""

    def check():
        glue, rows = compute()
        by = {r["quantity"]: r for r in rows}
        for name, quantities in speaks.items():
            for q in quantities:
                assert scorecard_rules.row_verdict(by[q]) not in ("n/a", "cannot fail"), q
                speaks_for(glue[name], by[q])
        return glue

    before = check()
    flip()
    after = check()
    for name in speaks:
        assert after[name] != before[name], name
