"""`ChapterSpec`: what a chapter declares to the machinery, in one typed record.

Each chapter module ends with `SPEC = ChapterSpec("NN_name", ...)`; mclib.chapters.registry
collects them (`Specs`, toc order) for the callers that hand them down. A field left out
declares nothing; an unknown or ill-typed field is refused in one line naming chapter and field.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.config import Profile
    from .runner_plan import Reads


class ChapterSpecError(ValueError):
    """A chapter's spec is wrong or missing; the message is one line naming the chapter and the field."""


@dataclass(frozen=True)
class ChapterSpec:
    """One chapter's declarations, each read by a part of the machinery:

    notebook     its template's stem, book/NOTEBOOK.ipynb ("01_train")
    runs_read    runs it reads besides the book's: `runs_read(cfg) -> Reads` (`runner.plan`)
    trains_runs  it is the training chapter: it trains what the chapters a build executes read
    idle_work    work for idle workers: `idle_work(cfg, run_dir) -> [(fn, args, name)]` (`chapter.idle_tasks`)
    site_part    a part of the site after the chapters: `site_part(out, ledger, *, specs) -> [page paths]`
    curve_rows   rows from a run's training curve: `curve_rows(cfg, run, metrics, end)`
    e15_rows     E15's rows from E15's runs: `e15_rows(runs, ends, cfg, end, main, *, read)`
    rejudged     a recorded row judged again: `rejudged(row, recorded) -> (row, reasons)`
    rule_of      what it judges a row by besides the numbers: `rule_of(row) -> dict`
    speaks_for   glue name -> the experiment id its sentence speaks for
    restated     a sentence worded again from re-judged rows: `restated(name, text, rows) -> str | None`

    curve_rows, e15_rows, rejudged, rule_of: `mclib.lease.reference`; speaks_for, restated:
    `mclib.lease.part`."""

    notebook: str
    _: KW_ONLY  # the declarations by name
    runs_read: Callable[[Profile], Reads] | None = None
    trains_runs: bool = False
    idle_work: Callable[[Profile, Path], list[tuple]] | None = None
    site_part: Callable[..., list[Path]] | None = None
    curve_rows: Callable[..., list[dict]] | None = None
    e15_rows: Callable[..., list[dict]] | None = None
    rejudged: Callable[[dict, Any], tuple[dict, list[str]]] | None = None
    rule_of: Callable[[dict], dict] | None = None
    speaks_for: Mapping[str, str] = field(default_factory=dict)
    restated: Callable[[str, str, list[dict]], str | None] | None = None

    def __post_init__(self):
        if not isinstance(self.notebook, str) or not self.notebook or "/" in self.notebook:
            raise ChapterSpecError(
                f'chapter spec: notebook {self.notebook!r} is not a template\'s stem ("01_train")'
            )
        for name, value in vars(self).items():  # the fields, as given
            if name == "trains_runs":
                ok = isinstance(value, bool)
            elif name == "speaks_for":
                ok = isinstance(value, Mapping) and all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()
                )
            else:
                ok = name == "notebook" or value is None or callable(value)
            if not ok:
                raise ChapterSpecError(
                    f"chapter {self.notebook}: field {name} = {value!r} is not what it declares "
                    "(see mclib.book.spec.ChapterSpec)"
                )


FIELDS = tuple(f.name for f in dataclasses.fields(ChapterSpec))


def _naming(init):
    """The dataclass's __init__, an unknown field refused in one line naming the chapter."""

    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        unknown = [k for k in kwargs if k not in FIELDS]
        if unknown:
            chapter = args[0] if args else kwargs.get("notebook", "?")
            raise ChapterSpecError(
                f"chapter {chapter}: ChapterSpec has no field {unknown[0]!r} (fields: {', '.join(FIELDS)})"
            )
        init(self, *args, **kwargs)

    return checked


ChapterSpec.__init__ = _naming(ChapterSpec.__init__)

Specs = Mapping[str, ChapterSpec]  # notebook stem -> its spec, in toc order (mclib.chapters.registry)


def among(specs: Specs, names: list[str] | None) -> list[ChapterSpec]:
    """The specs of the chapters `names` (None: all), in that order; a name without a spec is skipped."""
    return list(specs.values()) if names is None else [specs[n] for n in names if n in specs]
