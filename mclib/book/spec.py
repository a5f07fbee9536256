"""What a chapter declares to the machinery, in one typed record: `ChapterSpec`.

Each chapter module (mclib/chapters/chNN_name.py) ends its declarations with
`SPEC = ChapterSpec("NN_name", ...)`; mclib.chapters.registry collects the specs of the toc's
chapters (`Specs`, toc order) and the rooms above hand that registry down: the command line to
the book's runner (`build`, `plan`), the training chapter's notebook to `open_chapter`, the
scorecard chapter to the GPU lease's part and reference. Nothing in this room or the lease's
imports a chapter or looks a declaration up by its name.

A field left out declares nothing: no runs besides the book's, no idle work, no rule. A
field that is not one of these is refused with one line naming the chapter and the field.
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
    """A chapter's spec is wrong or missing; the message is one line naming the chapter and
    the field."""


@dataclass(frozen=True)
class ChapterSpec:
    """One chapter's declarations, each read by a part of the machinery:

    notebook     its template's stem, book/NOTEBOOK.ipynb ("01_train")
    runs_read    runs it reads besides the book's: `runs_read(cfg) -> Reads` (`mclib.book.runner.plan`)
    trains_runs  it is the training chapter: it trains what the chapters a build executes read
    idle_work    work for workers the book's seeds leave idle: `idle_work(cfg, run_dir) -> [(fn, args, name)]`
                 (`mclib.book.chapter.idle_tasks`)
    site_part    a part of the site after the chapters: `site_part(out, ledger, *, specs) -> [page paths]`
    curve_rows   its rows from a run's training curve alone: `curve_rows(cfg, run, metrics, end)`
                 (`mclib.lease.reference.training_rows`)
    e15_rows     E15's rows from E15's runs: `e15_rows(runs, ends, cfg, end, main, *, read)`
                 (`mclib.lease.reference.freeze_rows`)
    rejudged     how it judges a recorded row again: `rejudged(row, recorded) -> (row, reasons)`
    rule_of      what it judges a row by besides the numbers: `rule_of(row) -> dict`
                 (both `mclib.lease.reference.rejudge`)
    speaks_for   glue name -> experiment id its sentence speaks for (`mclib.lease.part.restate`)
    restated     a sentence worded again from re-judged rows: `restated(name, text, rows) -> str | None`
    """
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
            raise ChapterSpecError(f"chapter spec: notebook {self.notebook!r} is not a template's stem (\"01_train\")")
        for name, value in vars(self).items():  # the fields, as given
            if name == "trains_runs":
                ok = isinstance(value, bool)
            elif name == "speaks_for":
                ok = isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in value.items())
            else:
                ok = name == "notebook" or value is None or callable(value)
            if not ok:
                raise ChapterSpecError(f"chapter {self.notebook}: field {name} = {value!r} is not what it declares "
                                       "(see mclib.book.spec.ChapterSpec)")


FIELDS = tuple(f.name for f in dataclasses.fields(ChapterSpec))


def _naming(init):
    """The dataclass's __init__, an unknown field refused in one line naming the chapter."""
    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        unknown = [k for k in kwargs if k not in FIELDS]
        if unknown:
            chapter = args[0] if args else kwargs.get("notebook", "?")
            raise ChapterSpecError(f"chapter {chapter}: ChapterSpec has no field {unknown[0]!r} "
                                   f"(fields: {', '.join(FIELDS)})")
        init(self, *args, **kwargs)
    return checked


ChapterSpec.__init__ = _naming(ChapterSpec.__init__)

Specs = Mapping[str, ChapterSpec]  # notebook stem -> its spec, in toc order (mclib.chapters.registry)


def among(specs: Specs, names: list[str] | None) -> list[ChapterSpec]:
    """The specs of the chapters `names` (None: every one), in the order of `names`; a name no
    chapter serves (a template outside the book) has none."""
    return list(specs.values()) if names is None else [specs[n] for n in names if n in specs]
