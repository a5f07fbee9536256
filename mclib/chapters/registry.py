"""The specs of the toc's chapters (`specs`), handed down by the rooms above to the machinery.

A chapter's module is imported when its spec is first read. A toc chapter whose module declares
no SPEC, or whose spec names another or a missing notebook, is refused in one line naming the
chapter and the field (`ChapterSpecError`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from ..book.runner import chapters
from ..book.spec import ChapterSpec, ChapterSpecError
from ..core.repo import REPO

HERE = Path(__file__).resolve().parent


def module_name(stem: str) -> str:
    """The naming rule: book/NN_name.ipynb is served by mclib.chapters.chNN_name."""
    return f"{__package__}.ch{stem}"


def served(stem: str) -> bool:
    """Whether a chapter module serves the template `stem`."""
    return "." not in stem and (HERE / f"ch{stem}.py").is_file()


def load(stem: str, book: Path = REPO / "book") -> ChapterSpec:
    """The spec of chapter `stem`, checked: its module's SPEC, naming this notebook, which exists."""
    module = importlib.import_module(module_name(stem))
    try:
        spec = module.SPEC
    except AttributeError:
        raise ChapterSpecError(
            f"chapter {stem}: {module.__name__} declares no SPEC (SPEC = ChapterSpec(...), mclib.book.spec)"
        ) from None
    if not isinstance(spec, ChapterSpec):
        raise ChapterSpecError(f"chapter {stem}: SPEC is a {type(spec).__name__}, not a ChapterSpec")
    if spec.notebook != stem:
        raise ChapterSpecError(
            f"chapter {stem}: field notebook = {spec.notebook!r}, but its module serves {stem}"
        )
    if not (book / f"{spec.notebook}.ipynb").is_file():
        raise ChapterSpecError(
            f"chapter {stem}: field notebook = {spec.notebook!r} names no notebook "
            f"({book.name}/{spec.notebook}.ipynb does not exist)"
        )
    return spec


class Registry(Mapping):
    """{stem: ChapterSpec} of the toc's served chapters, in toc order, each loaded when first read."""

    def __init__(self, names: list[str], book: Path = REPO / "book"):
        self._names = [n for n in names if served(n)]
        self._book = book
        self._specs: dict[str, ChapterSpec] = {}

    def __getitem__(self, stem: str) -> ChapterSpec:
        if stem not in self._names:
            raise KeyError(stem)
        if stem not in self._specs:
            self._specs[stem] = load(stem, self._book)
        return self._specs[stem]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"Registry({', '.join(self._names)})"


def specs(toc: Path = REPO / "_toc.yml") -> Registry:
    """The `Registry` of the chapters of `toc`."""
    return Registry([t.stem for t in chapters(toc)])
