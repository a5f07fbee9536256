"""What the book tests read from a built book (OUT = `python -m mclib book --out-dir OUT`):
the runner's manifest and the rendered pages. Not a test module: test_book.py and
test_book_dropped.py import it."""
import json
import re
from pathlib import Path


def manifest(out: Path) -> dict:
    return json.loads((out / "book" / "_executed" / "manifest.json").read_text())


def page(out: Path, name: str) -> str:
    """The rendered HTML of chapter `name` (e.g. "01_train")."""
    return (out / "_build" / "html" / "book" / "_executed" / f"{name}.html").read_text()


def page_text(out: Path, name: str) -> str:
    """The page's text: tags removed, whitespace runs as one space."""
    return " ".join(re.sub(r"<[^>]+>", " ", page(out, name)).split())
