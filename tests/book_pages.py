"""What the book tests read from the book: the glue names a chapter template's prose uses,
and, from a built book (OUT = `python -m mclib book --out-dir OUT`), the runner's manifest
and the rendered pages. Not a test module: the book and chapter tests import it."""
import json
import re
from pathlib import Path

BOOK = Path(__file__).resolve().parents[1] / "book"
# a glue role, {glue:text}`NAME` or {glue:text}`NAME:.2f`, or a glue directive, ```{glue:figure} NAME
GLUE = re.compile(r"\{glue(?::\w+)?\}`(\w+)|```\{glue(?::\w+)?\} (\w+)")


def glue_names(notebook: str) -> set[str]:
    """Every name the markdown cells of book/NOTEBOOK glue (any role or directive)."""
    cells = json.loads((BOOK / notebook).read_text())["cells"]
    text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return {role or directive for role, directive in GLUE.findall(text)}


def manifest(out: Path) -> dict:
    return json.loads((out / "book" / "_executed" / "manifest.json").read_text())


def page(out: Path, name: str) -> str:
    """The rendered HTML of chapter `name` (e.g. "01_train")."""
    return (out / "_build" / "html" / "book" / "_executed" / f"{name}.html").read_text()


def page_text(out: Path, name: str) -> str:
    """The page's text: tags removed, whitespace runs as one space."""
    return " ".join(re.sub(r"<[^>]+>", " ", page(out, name)).split())
